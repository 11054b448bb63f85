"""A decode step whose tokens attend through Linnet's Triton kernel (LINNET_TRITON_DECODE=1 on a
GPU). No GPU here: the generated entries run on a GPU's branches (`torch_on_gpu_branches`) and the
kernel in Triton's interpreter; the step must give the logits of the runtime's own attention
(SDPA, or its f32 softmax where there are sinks), eagerly and compiled whole by torch.compile."""

import numpy as np
import pytest
import torch

pytest.importorskip("triton")  # (in its interpreter without CUDA: tests/conftest.py)

from linnet.codegen_torch import runtime as rt  # noqa: E402
from linnet.kernels import triton_attention  # noqa: E402
from linnet.serve import runners  # noqa: E402
from tests.serve.conftest import torch_on_gpu_branches  # noqa: E402


def test_the_kernel_is_asked_for_on_a_gpu_only(monkeypatch):
    q = torch.zeros(2, 4, 8)
    cache = torch.zeros(2, 3, 2, 8)
    monkeypatch.setattr(rt, "_TRITON_DECODE", True)
    assert not rt.triton_decodes(q, cache, cache)  # the CPU's tensors
    monkeypatch.delenv("LINNET_TRITON_DECODE", raising=False)
    assert not rt._triton_wanted()
    monkeypatch.setenv("LINNET_TRITON_DECODE", "1")
    assert rt._triton_wanted() == triton_attention.available()


def noisy(model) -> dict:
    """The model's cache filled with noise (rows holding prompts); returns it, to start each run from."""
    g = torch.Generator().manual_seed(0)
    return {name: getattr(model.runner, name).normal_(generator=g).clone() for name in model.runner.state}


def restore(model, start: dict) -> None:
    for name, value in start.items():
        getattr(model.runner, name).copy_(value)


@pytest.mark.parametrize("card", ["tiny-llama", "tiny-mistral", "tiny-gpt-oss"])  # a window; sinks and windows
def test_decode_steps_through_the_kernel_give_the_runtimes_logits(card, monkeypatch):
    model = torch_on_gpu_branches(monkeypatch, card)
    start = noisy(model)
    tokens = np.array([3, 9, 0, 27], np.int32)
    positions = np.array([5, 31, 32, 17], np.int32)  # row 2 idle: padding at MaxSeq
    want = model.decode(tokens, positions).clone()
    after = {name: getattr(model.runner, name).clone() for name in model.runner.state}
    restore(model, start)
    calls = []
    monkeypatch.setattr(rt, "triton_decodes", lambda q, k_cache, v_cache: calls.append(q.shape) or True)
    got = model.decode(tokens, positions)
    assert len(calls) == model.runner.k_cache.shape[0]  # every layer's attention
    busy = [0, 1, 3]
    torch.testing.assert_close(got[busy], want[busy], rtol=1e-4, atol=1e-4)
    for name, value in after.items():  # the same cache writes
        torch.testing.assert_close(getattr(model.runner, name), value)


def test_the_fused_decode_step_takes_the_kernel_whole(monkeypatch):
    # LINNET_TORCH_INDUCTOR's step with the kernel inside: the op is one node of torch.compile's
    # graph (no break, one compile), called once a layer, and the step gives the eager logits
    from torch._dynamo.testing import CompileCounterWithBackend

    model = torch_on_gpu_branches(monkeypatch)
    monkeypatch.setattr(rt, "triton_decodes", lambda q, k_cache, v_cache: True)
    start = noisy(model)
    tokens = torch.tensor([3, 9, 0, 27], dtype=torch.int32)
    positions = torch.tensor([5, 31, 32, 0], dtype=torch.int32)
    want = model.decode(tokens, positions).clone()
    restore(model, start)
    calls = []
    decode = triton_attention.decode
    monkeypatch.setattr(triton_attention, "decode", lambda *a, **k: calls.append(a[0].shape) or decode(*a, **k))
    counter = CompileCounterWithBackend("inductor")
    got = runners.fused_decode(model.runner, backend=counter)(tokens, positions)
    assert counter.frame_count == 1 and len(calls) == 2  # tiny-llama's two layers
    busy = [0, 1, 3]
    torch.testing.assert_close(got[busy], want[busy], rtol=1e-4, atol=1e-4)
