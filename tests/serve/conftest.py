import contextlib
import socket
import threading
import time

import pytest

from linnet import nest

TEMPLATE = "{% for m in messages %}t1 {{ m['content'] }} t2 {% endfor %}{% if add_generation_prompt %}t3{% endif %}"


def make_model(backend: str, rows: int = 16, max_seq: int = 96, numerics: str = "exact", compile: bool = False):
    return nest.load("tiny-llama", backend=backend, weights="random", seed=1, numerics=numerics, compile=compile,
                     generics={"Batch": rows, "MaxSeq": max_seq})


def torch_on_gpu_branches(monkeypatch, card: str = "tiny-llama"):
    """`card` in torch (fast, f32, 4 rows of 32) with the runtime's device checks turned to the
    branches a GPU takes: cache writes clamped, every key position attended, plain weights, no
    Linnet CPU kernel."""
    from linnet.codegen_torch import runtime as rt

    monkeypatch.setattr(rt, "_put_inside", rt._put_clamped)
    monkeypatch.setattr(rt, "_key_span", lambda positions, max_seq: max_seq)
    monkeypatch.setattr(rt, "packs_linear_weights", lambda device, dtype: False)
    monkeypatch.setattr(rt.cpu_ops, "serves", lambda *tensors: False)
    monkeypatch.setattr(rt.cpu_attention, "available", lambda cache, head_dim: False)
    return nest.load(card, backend="torch", numerics="fast", weights="random", tokenizer=False,
                     generics={"Batch": 4, "MaxSeq": 32, "T": "f32"})


def noisy_cache(model, seed: int = 0) -> dict:
    """The model's state (its cache) filled with noise, as rows holding prompts; returns a copy of
    it, for `restore_cache` to start each run of a comparison from."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return {name: getattr(model.runner, name).normal_(generator=g).clone() for name in model.runner.state}


def restore_cache(model, saved: dict) -> None:
    for name, value in saved.items():
        getattr(model.runner, name).copy_(value)


@pytest.fixture(scope="module", params=["torch", "torch-replayed", "jax"])
def model(request):
    """Each backend; and torch with its decode step captured and replayed (a CPU graph of Linnet's
    kernels here, a CUDA graph on a GPU), checked against the same model's eager entries."""
    if request.param == "torch-replayed":
        return make_model("torch", numerics="fast", compile=True)
    return make_model(request.param)


@contextlib.contextmanager
def running(engine, name: str = "tiny", app=None, **options):
    """The OpenAI server over `engine` on a real socket, in a thread (`app`, an `OpenAIServer` made
    by the caller, or one made here); yields its base url.

    While it runs, torch's own ops take one thread: a tiny model's exact steps are a few us of work each,
    and beside the server's threads and the client's, two-thread ops waited on each other's scheduling
    (the structured server tests: 42 s with two threads, 20 s with one, on 2 cores)."""
    from linnet.kernels.pool import one_torch_thread

    with one_torch_thread():
        yield from _running(engine, name, app, **options)


def _running(engine, name, app, **options):
    import uvicorn

    from linnet.serve.server import OpenAIServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = app if app is not None else OpenAIServer(engine, name, **options)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(200):
        if srv.started:
            break
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def server():
    """The OpenAI server over a tiny model with a word tokenizer (token i is `t{i}`), on a real socket;
    yields (base url, engine, model)."""
    from linnet.serve import Engine

    from .test_engine import word_tokenizer

    model = make_model("torch", rows=4, max_seq=96)
    model.tokenizer = word_tokenizer(model.vocab)
    model.tokenizer.chat_template = TEMPLATE
    engine = Engine(model)
    with running(engine) as base:
        yield base, engine, model
