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
        return _prefill(model, [(2, 0, 16)], [16, 0, 0])[:1], _decode(model, [32, 32, 16])[2:]  # the prompt's row

    _agree(run, monkeypatch, 1e-4 if dtype == "f32" else 2 ** -5)  # bf16: activations round in other places


def test_jax_walks_the_keys_of_a_long_cache_as_the_kernel_attends(monkeypatch):
    """Past two key chunks (MaxSeq > 2 * KEY_CHUNK), JAX without the kernels walks the cache in chunks of
    KEY_CHUNK keys, up to the furthest position: a prompt's own keys in the pass, a later pass's cached ones
    (136 of them, two chunks), and a decode step's, one of them into the last chunk, which ends at MaxSeq and
    so overlaps the one before it (row 0, never written: its keys and values are zeros but the token's own)."""
    def run():
        model = nest.load("tiny-llama", backend="jax", numerics="fast", weights="random", tokenizer=False,
                          generics={"Batch": 3, "MaxSeq": 260, "T": "f32"})
        fresh = _prefill(model, [(2, 0, 136)], [HEAD + 135, 0, 0])
        rest = _prefill(model, [(2, 136, 16)], [HEAD + 15, 0, 0])
        decode = _decode(model, [258, 260, 152])
        return fresh[:1], rest[:1], decode[0], decode[2]

    _agree(run, monkeypatch, 1e-4)


HEAD = 8  # the JAX runner's layout: one-token slots first (here padding); any layout is attended correctly


def _prefill(model, parts: list, last: list) -> np.ndarray:
    """A pass of HEAD padding slots, then parts (row, first position, count): tokens of tiny-llama's vocab."""
    seq = model.max_seq
    tokens = np.r_[np.arange(HEAD), *((np.arange(n) + 20 + p) % 128 for _, p, n in parts)].astype(np.int32)
    positions = np.r_[np.full(HEAD, seq), *(np.arange(p, p + n) for _, p, n in parts)].astype(np.int32)
    rows = np.r_[np.zeros(HEAD), *(np.full(n, r) for r, _, n in parts)].astype(np.int32)
    return np.asarray(model.runner.prefill(tokens, positions, rows, np.array(last, np.int32)), np.float32)


def _decode(model, positions: list) -> np.ndarray:
    return np.asarray(model.runner.decode(np.array([1, 2, 3], np.int32), np.array(positions, np.int32)), np.float32)


def _agree(run, monkeypatch, tol: float):
    """run()'s outputs with the kernels, and again without them, agree within tol."""
    with_kernels = run()
    kernels_off(monkeypatch)
    without = run()
    for got, want in zip(without, with_kernels):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
