"""The CUDA capture's order of calls, with torch.cuda's stream and graph calls stood in for (no GPU
here): the decode step runs twice on a side stream, then once under the capture, plain or fused
(LINNET_TORCH_INDUCTOR); a fused step that fails to compile leaves the plain one warmed and captured;
the cache comes back as it was."""

import contextlib
import types

import pytest
import torch

from linnet import nest
from linnet.codegen_torch import runtime as rt
from linnet.serve import runners


class FakeCuda:
    """torch.cuda's stream and graph calls, recording whether a call runs under the capture."""

    def __init__(self):
        self.capturing = False

    def Stream(self):
        return types.SimpleNamespace(wait_stream=lambda other: None)

    def current_stream(self):
        return self.Stream()

    def stream(self, s):
        return contextlib.nullcontext()

    def CUDAGraph(self):
        return types.SimpleNamespace(replay=lambda: None)

    @contextlib.contextmanager
    def graph(self, g):
        self.capturing = True
        try:
            yield
        finally:
            self.capturing = False

    def synchronize(self):
        pass


@pytest.fixture
def capture(monkeypatch):
    model = nest.load("tiny-llama", backend="torch", numerics="fast", weights="random", tokenizer=False,
                      generics={"Batch": 2, "MaxSeq": 16, "T": "f32"})
    monkeypatch.setattr(rt, "TRITON_ASKED", rt.TritonKernels(False, False))  # one choice: nothing timed (test_kernel_choice)
    runner = runners.TorchRunner(model)
    cuda = FakeCuda()
    runner.torch = types.SimpleNamespace(cuda=cuda)
    calls = []

    def logged(name, step):
        def decode(tokens, positions):
            calls.append((name, cuda.capturing))
            assert rt._GRAPH_STEP[0]  # the warm-up and the capture choose kernels alike (`rt.graph_step`)
            return step(tokens, positions)
        return decode
    return runner, model, calls, logged


@pytest.mark.parametrize("fused", ["off", "on", "fails"])
def test_the_step_is_warmed_twice_then_captured(capture, monkeypatch, fused):
    runner, model, calls, logged = capture
    step = model.runner.decode
    # the generated model's step logged; `model.decode` stays a method, a new object at each look-up
    monkeypatch.setattr(model.runner, "decode", logged("plain", step))
    monkeypatch.setattr(runners, "fuses_decode", lambda: fused != "off")

    def fused_decode(model_runner):
        if fused == "fails":
            raise RuntimeError("inductor: no compiler\nmore")
        return logged("fused", step)
    monkeypatch.setattr(runners, "fused_decode", fused_decode)
    before = {name: getattr(model.runner, name).clone() for name in model.runner.state}
    runner._static_positions.copy_(torch.tensor([3, 16]))
    with pytest.warns(UserWarning, match="torch.compile failed \\(inductor: no compiler\\)") if fused == "fails" \
            else contextlib.nullcontext():
        runner._capture_cuda()
    name = "fused" if fused == "on" else "plain"
    assert calls == [(name, False), (name, False), (name, True)]
    assert runner.replays and runner.not_replayed is None and not rt._GRAPH_STEP[0]
    for key, value in before.items():  # the warmups' and the capture's writes undone
        assert torch.equal(getattr(model.runner, key), value)
