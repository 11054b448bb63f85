"""Without Linnet's CPU kernels (no compiler, no AVX2, LINNET_CPU_KERNELS=0, a GPU) the runtimes take
their libraries' paths: oneDNN, SDPA and aten's own ops under torch, XLA's dots and the chunked key walk under JAX.
Those paths must give what the kernels give: the same model, loaded both ways, on a packed prefill
and a decode step (one row idle)."""

import numpy as np
import pytest

from linnet import nest
from linnet.kernels import cpu_attention, cpu_linear, cpu_ops, xla_kernels

pytestmark = pytest.mark.skipif(cpu_linear.library() is None, reason="Linnet's CPU kernels do not run here")


def kernels_off(monkeypatch):
    monkeypatch.setattr(cpu_linear, "available", lambda dtype: False)
    monkeypatch.setattr(cpu_attention, "available", lambda cache, head_dim: False)
    monkeypatch.setattr(cpu_ops, "serves", lambda *tensors: False)
    monkeypatch.setattr(xla_kernels, "available", lambda dtype, platform: False)
    monkeypatch.setattr(xla_kernels, "attends_here", lambda stack, head_dim: False)


@pytest.mark.filterwarnings("ignore:T=bf16 on the CPU")  # nest.load says the fallback is slow: it is
@pytest.mark.parametrize("backend", ["torch", "jax"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_the_library_paths_agree_with_the_kernels(backend, dtype, monkeypatch):
    def run():
        model = nest.load("tiny-llama", backend=backend, numerics="fast", weights="random", tokenizer=False,
                          generics={"Batch": 3, "MaxSeq": 32, "T": dtype})
        head = 8  # the JAX runner's layout: one-token slots first; any layout is attended correctly
        tokens = np.r_[np.arange(head), np.arange(16) + 20].astype(np.int32)
        positions = np.r_[np.full(head, 32), np.arange(16)].astype(np.int32)
        rows = np.r_[np.zeros(head), np.full(16, 2)].astype(np.int32)
        last = np.array([head + 15, 0, 0], np.int32)
        prefill = np.asarray(model.runner.prefill(tokens, positions, rows, last), np.float32)
        decode = np.asarray(model.runner.decode(np.array([1, 2, 3], np.int32), np.array([32, 32, 16], np.int32)),
                            np.float32)
        return prefill[:1], decode[2:]  # the rows that hold a prompt

    with_kernels = run()
    kernels_off(monkeypatch)
    without = run()
    tol = 1e-4 if dtype == "f32" else 2 ** -5  # bf16: activations round in other places
    for got, want in zip(without, with_kernels):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
