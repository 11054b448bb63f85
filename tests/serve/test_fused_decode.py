"""LINNET_TORCH_INDUCTOR's decode step: the generated step compiled whole by torch.compile, as a
CUDA capture would take it. No GPU here: the runtime's device checks are turned to the branches a
GPU takes (cache writes clamped, every key position attended, no Linnet CPU kernel, plain weights),
and the compiled step must trace without a graph break and give the eager step's logits and cache."""

import pytest
import torch

from linnet.codegen_torch import runtime as rt
from linnet.serve import runners
from tests.conftest import imports_dynamo
from tests.serve.conftest import noisy_cache, restore_cache, torch_on_gpu_branches


def test_the_flag_is_off_unless_set_to_1(monkeypatch):
    monkeypatch.delenv("LINNET_TORCH_INDUCTOR", raising=False)
    assert not runners.fuses_decode()
    monkeypatch.setenv("LINNET_TORCH_INDUCTOR", "1")
    assert runners.fuses_decode()


def test_the_fused_decode_step_compiles_once_for_the_runners_buffers(monkeypatch):
    # the capture calls it three times (two warmups, then under the capture), and steps write new
    # values into the same static buffers: one compile (the per-pass memo stays out of the trace)
    from torch._dynamo.testing import CompileCounter

    model = torch_on_gpu_branches(monkeypatch)
    counter = CompileCounter()
    step = runners.fused_decode(model.runner, backend=counter)
    tokens, positions = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)
    for i in range(4):
        tokens.copy_(torch.tensor([i, 2 * i, 5, 7])), positions.copy_(torch.tensor([i, i + 3, 32, 1]))
        step(tokens, positions)
    assert counter.frame_count == 1


def test_the_fused_decode_step_is_the_eager_one_on_a_gpus_branches(monkeypatch):
    model = torch_on_gpu_branches(monkeypatch)
    runner = model.runner
    start = noisy_cache(model)
    tokens = torch.tensor([3, 9, 0, 27], dtype=torch.int32)
    positions = torch.tensor([5, 31, 32, 0], dtype=torch.int32)  # row 2 idle: padding at MaxSeq

    want = model.decode(tokens, positions).clone()
    after = {name: getattr(runner, name).clone() for name in runner.state}
    restore_cache(model, start)
    got = runners.fused_decode(runner)(tokens, positions)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for name, value in after.items():
        torch.testing.assert_close(getattr(runner, name), value, rtol=1e-5, atol=1e-6)


@pytest.fixture
def flash_on_the_cpu():
    """aten's flash attention given a CPU kernel for this test: FA2's varlen forward as
    test_flash_decode states it, so that the GPU's flash decode branch runs here as the op it is
    (traced by Dynamo through its own fake implementation, called by Inductor as an extern kernel)."""
    from tests.serve.test_flash_decode import varlen_reference

    calls = []

    def kernel(q, k, v, starts_q, starts_k, max_q, max_k, dropout, causal, debug, *, scale=None,
               window_size_left=None, window_size_right=None, seqused_k=None, alibi_slopes=None, block_table=None,
               num_splits=None):
        calls.append(q.shape)
        out = varlen_reference(q, k, v, starts_q, starts_k, max_q, max_k, dropout, causal, debug, scale=scale,
                               window_size_left=window_size_left, window_size_right=window_size_right,
                               seqused_k=seqused_k)[0]
        return (out, torch.zeros(q.shape[1], q.shape[0]), torch.zeros(2, dtype=torch.uint64),
                torch.zeros((), dtype=torch.uint64), torch.zeros(0, dtype=q.dtype))
    library = torch.library.Library("aten", "IMPL")
    library.impl("_flash_attention_forward", kernel, "CPU")
    yield calls
    library._destroy()


def test_the_fused_decode_step_takes_flash_decode_whole(monkeypatch, flash_on_the_cpu):
    # the GPU's decode attention (`rt._flash_decode`: aten's flash attention, each row's used keys
    # made on the device) inside torch.compile's one graph: no break, one compile, the eager logits
    model = torch_on_gpu_branches(monkeypatch)
    monkeypatch.setattr(rt, "flash_decodes", lambda q, k_cache: True)
    runner = model.runner
    start = noisy_cache(model)
    tokens = torch.tensor([3, 9, 0, 27], dtype=torch.int32)
    positions = torch.tensor([5, 31, 32, 0], dtype=torch.int32)  # row 2 idle: padding at MaxSeq
    want = model.decode(tokens, positions).clone()
    restore_cache(model, start)
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("inductor")
    flash_on_the_cpu.clear()
    got = runners.fused_decode(runner, backend=counter)(tokens, positions)
    assert counter.frame_count == 1 and len(flash_on_the_cpu) == 2  # a call for each of tiny-llama's layers
    busy = [0, 1, 3]
    torch.testing.assert_close(got[busy], want[busy], rtol=1e-5, atol=1e-5)


def test_a_model_that_is_not_compiled_never_imports_dynamo():
    """torch._dynamo is 1.5-3 s of a process's start on this CPU: only a step torch.compile fuses
    may import it (the runtime marks its compile-time constants then, `before_torch_compile`).
    A fresh process loads a model, serves two requests, and shows whether it was imported."""
    script = (
        "from linnet import nest\n"
        "from linnet.serve import Engine, Request\n"
        "model = nest.load('tiny-llama', backend='torch', weights='random', numerics='fast',\n"
        "                  generics={'Batch': 2, 'MaxSeq': 64, 'T': 'f32'})\n"
        "done, _ = Engine(model).run([Request(prompt=[1, 2, 3], max_new_tokens=3), Request(prompt=[4, 5], max_new_tokens=2)])\n"
        "assert [len(c.tokens) for c in done] == [3, 2]\n"
    )
    assert not imports_dynamo(script)
