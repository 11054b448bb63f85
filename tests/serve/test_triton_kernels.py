"""The generated torch entries through Linnet's Triton kernels on a GPU: a decode step's attention
(`runtime.TritonKernels.attention`) and the small ops of every pass (`.ops`: RMSNorm, rope, the
cache write, silu(gate) * up). No GPU here: the entries run on a GPU's branches (`torch_on_gpu_branches`) and the
kernels in Triton's interpreter; they must give the logits and cache of the runtime's own ops
(SDPA, or its f32 softmax where there are sinks; torch's eager ops), eagerly and, for the
attention, compiled whole by torch.compile."""

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton")  # (in its interpreter without CUDA: tests/conftest.py)

from linnet.codegen_torch import runtime as rt  # noqa: E402
from linnet.kernels import triton_attention, triton_ops  # noqa: E402
from linnet.serve import runners  # noqa: E402
from tests.serve.conftest import noisy_cache, restore_cache, torch_on_gpu_branches  # noqa: E402


def test_the_kernels_are_taken_on_a_gpu_only(monkeypatch):
    q = torch.zeros(2, 4, 8)
    cache = torch.zeros(2, 3, 2, 8)
    with rt.using_triton(rt.TritonKernels(attention=True, ops=True)):
        assert not rt.triton_decodes(q, cache, cache)  # the CPU's tensors
        assert rt._triton_ops(q) is None


def test_each_flag_asks_for_its_kernels_or_leaves_them_to_be_measured(monkeypatch):
    monkeypatch.delenv("LINNET_TRITON_DECODE", raising=False)
    assert rt.triton_asked("LINNET_TRITON_DECODE", "triton_attention") is None  # "auto": the runner times them
    monkeypatch.setenv("LINNET_TRITON_DECODE", "0")
    assert rt.triton_asked("LINNET_TRITON_DECODE", "triton_attention") is False
    monkeypatch.setenv("LINNET_TRITON_DECODE", "1")
    assert rt.triton_asked("LINNET_TRITON_DECODE", "triton_attention") == triton_attention.available()


@pytest.mark.parametrize("card", ["tiny-llama", "tiny-mistral", "tiny-gpt-oss"])  # a window; sinks and windows
def test_decode_steps_through_the_kernel_give_the_runtimes_logits(card, monkeypatch):
    model = torch_on_gpu_branches(monkeypatch, card)
    start = noisy_cache(model)
    tokens = np.array([3, 9, 0, 27], np.int32)
    positions = np.array([5, 31, 32, 17], np.int32)  # row 2 idle: padding at MaxSeq
    want = model.decode(tokens, positions).clone()
    after = {name: getattr(model.runner, name).clone() for name in model.runner.state}
    restore_cache(model, start)
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
    start = noisy_cache(model)
    tokens = torch.tensor([3, 9, 0, 27], dtype=torch.int32)
    positions = torch.tensor([5, 31, 32, 0], dtype=torch.int32)
    want = model.decode(tokens, positions).clone()
    restore_cache(model, start)
    calls = []
    decode = triton_attention.decode
    monkeypatch.setattr(triton_attention, "decode", lambda *a, **k: calls.append(a[0].shape) or decode(*a, **k))
    counter = CompileCounterWithBackend("inductor")
    got = runners.fused_decode(model.runner, backend=counter)(tokens, positions)
    assert counter.frame_count == 1 and len(calls) == 2  # tiny-llama's two layers
    busy = [0, 1, 3]
    torch.testing.assert_close(got[busy], want[busy], rtol=1e-4, atol=1e-4)


class OpNames(TorchDispatchMode):
    """The names of the aten ops run under it."""

    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("card", ["tiny-llama", "tiny-qwen3", "tiny-gpt-oss", "tiny-gemma3", "tiny-olmo2",
                                  "tiny-granite", "tiny-phi3"])
def test_passes_through_the_small_ops_kernels_give_the_runtimes_logits(card, monkeypatch):
    # qwen3: q and k normed a head at a time; gpt-oss: biases, sinks; gemma3: norms after each half;
    # olmo2: q and k normed over whole projections; granite: scaled branches; phi3: q, k and v (and gate
    # and up) sliced from one projection, so rope reads a view whose rows are strided.
    # A decode step with a row idle, and a mixed pass (rows 3 and 0 decode, row 2 takes a prompt)
    model = torch_on_gpu_branches(monkeypatch, card)
    start = noisy_cache(model)
    step = (np.array([3, 9, 0, 27], np.int32), np.array([5, 31, 32, 17], np.int32))
    pack = (np.array([4, 8, 15, 16, 23, 42, 7], np.int32), np.array([18, 0, 1, 2, 3, 4, 6], np.int32),
            np.array([3, 2, 2, 2, 2, 2, 0], np.int32), np.array([0, 5, 6], np.int32))

    def run(kernels: bool) -> list:
        out = []
        for call in (lambda: model.decode(*step), lambda: model.prefill(*pack)):
            restore_cache(model, start)
            with monkeypatch.context() as m, OpNames() as ops:
                if kernels:
                    m.setattr(rt, "_triton_ops", lambda *tensors: triton_ops)
                logits = call().clone()
            out.append((logits, {name: getattr(model.runner, name).clone() for name in model.runner.state},
                        ops.names))
        return out
    torch_ops = {"rms_norm", "roll", "addcmul", "index_put_", "silu"}  # each a kernel of its own now
    for (want, want_cache, _), (got, got_cache, names) in zip(run(False), run(True)):
        torch.testing.assert_close(got[:3], want[:3], rtol=1e-4, atol=1e-4)
        for name in want_cache:  # the same cache writes, idle rows' and padding's dropped
            torch.testing.assert_close(got_cache[name], want_cache[name], rtol=1e-5, atol=1e-5)
        assert not names & torch_ops
        torch_ops.discard("index_put_")  # (SDPA's path for a mixed pass, here, writes its output with one)
