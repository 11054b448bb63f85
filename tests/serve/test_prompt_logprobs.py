"""Prompt logprobs (`Request.prompt_logprobs`) against transformers: a random tiny Llama saved by
save_pretrained and loaded through nest.load, its prompts scored by the engine in packed, chunked
passes beside requests that only generate, and by transformers run on each prompt alone."""

import random

import numpy as np
import pytest

from linnet import nest
from linnet.serve import Engine, Request

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402

CONFIG = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=96, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
              tie_word_embeddings=False, hidden_act="silu")
K = 3


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    torch.manual_seed(5)
    config = transformers.LlamaConfig(**CONFIG)
    config._attn_implementation = "eager"
    hf_model = transformers.LlamaForCausalLM(config).float().eval()
    path = tmp_path_factory.mktemp("tiny-hf") / "Tiny-Llama"
    hf_model.save_pretrained(path)
    return hf_model, path


def hf_prompt_logprobs(hf_model, prompt: list) -> np.ndarray:
    """log_softmax of transformers' logits at every prompt position, in float64: [len - 1, vocab]."""
    with torch.no_grad():
        logits = hf_model(input_ids=torch.tensor([prompt])).logits[0, :-1].double()
    return torch.log_softmax(logits, dim=-1).numpy()


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_prompt_logprobs_equal_transformers_in_packed_chunked_passes(reference, backend):
    hf_model, path = reference
    model = nest.load(path, backend=backend, generics={"Batch": 4, "MaxSeq": 96}, tokenizer=False)
    rng = random.Random(11)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (9, 70, 33, 2, 51, 17)]
    scored = [Request(prompt=p, max_new_tokens=4, prompt_logprobs=K) for p in prompts]
    scored[3].max_new_tokens = 0  # scoring only
    plain = [Request(prompt=p, max_new_tokens=4) for p in prompts]
    # Budget 48: the long prompts are prefilled in chunks; 12 requests through 4 rows, mixed passes.
    engine = Engine(model, token_budget=48, prefix_min=8)
    done, stats = engine.run([r for pair in zip(scored, plain) for r in pair])
    scored_done, plain_done = done[0::2], done[1::2]
    for p, comp, twin in zip(prompts, scored_done, plain_done):
        assert len(comp.prompt_logprobs) == len(p) and comp.prompt_logprobs[0] is None
        ref = hf_prompt_logprobs(hf_model, p)
        for j, lp in enumerate(comp.prompt_logprobs[1:]):
            assert lp.token == p[j + 1]
            assert abs(lp.logprob - ref[j, p[j + 1]]) < 1e-4
            assert lp.rank == 1 + int(np.sum(ref[j] > ref[j, p[j + 1]]))
            best = np.argsort(-ref[j])[:K]
            assert [t for t, _ in lp.top] == best.tolist()
            assert np.allclose([v for _, v in lp.top], ref[j, best], atol=1e-4)
        if comp.request.max_new_tokens == 0:
            assert comp.tokens == [] and comp.finish_reason == "length"
        else:
            assert comp.tokens == twin.tokens  # scoring a prompt does not change what follows it
        assert twin.prompt_logprobs == []
    # Each scored prompt is prefilled whole: its twin may copy it, never the other way round.
    assert stats.prefill_tokens >= sum(len(p) for p in prompts)


def test_scoring_only_requests_need_no_room_to_generate(reference):
    hf_model, path = reference
    model = nest.load(path, backend="torch", generics={"Batch": 2, "MaxSeq": 32}, tokenizer=False)
    prompt = list(range(3, 35))  # fills the row: nothing could be generated after it
    done, _ = Engine(model).run([Request(prompt=prompt, max_new_tokens=0, prompt_logprobs=0)])
    ref = hf_prompt_logprobs(hf_model, prompt)
    got = [lp.logprob for lp in done[0].prompt_logprobs[1:]]
    assert np.allclose(got, ref[np.arange(31), prompt[1:]], atol=1e-4)
    assert all(lp.top == [] for lp in done[0].prompt_logprobs[1:])


@pytest.mark.parametrize("later", [False, True], ids=["warmup", "warm_scoring_later"])
def test_a_warmup_for_prompt_logprobs_leaves_nothing_to_compile(reference, later):
    """JAX: a pass that scores prompt tokens has its own executables (a row of logits for each token
    of the pass, its scores, the first rows its draws take), one set a pass size:
    `warmup(prompt_logprobs=True)` compiles them all, and so does `warm_scoring_later`'s thread
    after a warmup without them, as a server's does, so scored prompts of any length mixed into a
    run compile nothing. The thread's compiles are not counted as the engine's."""
    hf_model, path = reference
    model = nest.load(path, backend="jax", generics={"Batch": 4, "MaxSeq": 96}, tokenizer=False)
    rng = random.Random(12)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (40, 5, 90, 23, 61, 12, 3)]
    engine = Engine(model, token_budget=128)  # passes 16 ... 128 tokens, the longest chunked
    if later:
        engine.warmup(logprobs=True)
        before = engine.runner.compiles
        took = []  # (its `then`: told once, when done, as the server prints it)
        engine.warm_scoring_later(then=took.append).join()
        assert engine.runner.compiles == before and len(took) == 1 and took[0] > 0
    else:
        engine.warmup(prompt_logprobs=True, logprobs=True)
    requests = [Request(prompt=p, max_new_tokens=3, prompt_logprobs=i % 3 if i % 2 == 0 else None, logprobs=i % 2)
                for i, p in enumerate(prompts)]
    short, short_stats = engine.run(requests[-1:])  # alone: a pass scoring fewer tokens than Batch
    done, stats = engine.run(requests[:-1])
    done += short
    assert stats.compiles == 0 and short_stats.compiles == 0
    for p, comp in zip(prompts, done):
        if comp.request.prompt_logprobs is None:
            continue
        ref = hf_prompt_logprobs(hf_model, p)
        assert np.allclose([lp.logprob for lp in comp.prompt_logprobs[1:]], ref[np.arange(len(p) - 1), p[1:]],
                           atol=1e-4)


def test_a_server_holds_scored_requests_while_their_passes_compile_ahead(reference, compiles_counted):
    """JAX: while `warm_scoring_later`'s thread compiles the passes that score prompt tokens, a
    serving engine leaves a request that asks for them queued, rather than compile its pass on the
    engine's thread while every request in flight waits (the soak's server: 5 such compiles in its
    first 40 s). The others run meanwhile; once the thread is done the held one runs, compiling
    nothing, its scores transformers'; nothing is left queued or in flight."""
    import threading
    import time

    hf_model, path = reference
    model = nest.load(path, backend="jax", generics={"Batch": 4, "MaxSeq": 96}, tokenizer=False)
    engine = Engine(model, token_budget=128)
    engine.warmup(logprobs=True)  # as serve() warms up: the scoring passes left to the thread
    gate = threading.Event()
    thread = engine.warm_scoring_later(then=lambda seconds: gate.wait(60))  # (its compiles done, it waits here)
    engine.start()
    try:
        rng = random.Random(3)
        scored_prompt = [rng.randrange(256) for _ in range(37)]
        scored = engine.submit(Request(prompt=scored_prompt, max_new_tokens=2, prompt_logprobs=1))
        others = [engine.submit(Request(prompt=[rng.randrange(256) for _ in range(n)], max_new_tokens=4))
                  for n in (5, 30, 61)]
        deadline = time.time() + 120
        while any(c.finish_reason is None for c in others) and time.time() < deadline:
            time.sleep(0.01)
        assert [c.finish_reason for c in others] == ["length"] * 3
        assert scored.finish_reason is None and scored.tokens == [] and thread.is_alive()
        assert [x.comp for x in engine.waiting] == [scored] and engine.live == []
        gate.set()
        while scored.finish_reason is None and time.time() < deadline:
            time.sleep(0.01)
        thread.join(10)
    finally:
        gate.set()
        engine.stop()
    assert scored.finish_reason == "length" and engine.stats.compiles == 0, engine.stats.compiled
    assert engine.waiting == [] and engine.live == [] and engine.in_flight == {}
    ref = hf_prompt_logprobs(hf_model, scored_prompt)
    assert np.allclose([lp.logprob for lp in scored.prompt_logprobs[1:]],
                       ref[np.arange(len(scored_prompt) - 1), scored_prompt[1:]], atol=1e-4)
