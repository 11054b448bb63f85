"""The `layer_norm` op through both code generators, against independent LayerNorms: float64 numpy's
definition, torch's `nn.LayerNorm` (what transformers' LayerNorm models call, in f32 and in bf16) and
flax's `nn.LayerNorm`; with a weight and a bias, with neither, and with the weight alone, on random
shapes and values (hypothesis). In bf16 the statistics are f32's: a row whose mean is large beside its
spread (where bf16 statistics would lose it) normalizes as in f32, rounded once."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from linnet.compiler import BACKENDS, check_file

SOURCE = """arch layer_norms

config {
  dim: int = 8
  eps: float = 1e-5
}

params {
  w: T[dim]
    from hf "w"
  b: T[dim]
    from hf "b"
}

entry affine(x: T[Batch, dim]) -> T[Batch, dim] {
  return layer_norm(x, weight=w, bias=b, eps=eps)
}

entry plain(x: T[Batch, dim]) -> T[Batch, dim] {
  return layer_norm(x)
}

entry scaled(x: T[Batch, dim]) -> T[Batch, dim] {
  return x.layer_norm(w, eps=eps)
}
"""


@pytest.fixture(scope="module")
def source_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("layer_norm") / "layer_norms.linnet"
    path.write_text(SOURCE)
    return path


@functools.lru_cache(maxsize=None)
def _model_class(path: str, backend: str, rows: int, dim: int, eps: float, dtype: str):
    from linnet.compiler import generate, import_source
    from linnet.ir.specialize import specialize

    text = SOURCE.replace("dim: int = 8", f"dim: int = {dim}").replace("eps: float = 1e-5", f"eps: float = {eps!r}")
    shaped = f"{path}.{dim}.{eps!r}.linnet"
    with open(shaped, "w") as f:
        f.write(text)
    module = check_file(shaped)
    generics = {"Batch": rows, "MaxSeq": 8, "T": dtype}
    numerics = "exact" if dtype == "f32" else "fast"
    assert specialize(module, generics, numerics).bindings["T"] == dtype
    return import_source(generate(module, backend, generics, numerics)).Model


def _run(path, backend: str, entry: str, x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float, dtype: str):
    """The entry's output on x (rounded to dtype first, as w and b), as float32 numpy."""
    torch_type = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    Model = _model_class(str(path), backend, x.shape[0], x.shape[1], eps, dtype)
    if backend == "torch":
        model = Model({"w": torch.from_numpy(w).to(torch_type), "b": torch.from_numpy(b).to(torch_type)})
        return getattr(model, entry)(torch.from_numpy(x).to(torch_type)).float().numpy()
    import jax.numpy as jnp

    jax_type = {"f32": jnp.float32, "bf16": jnp.bfloat16}[dtype]
    model = Model({"w": jnp.asarray(w, jax_type), "b": jnp.asarray(b, jax_type)})
    return np.asarray(getattr(model, entry)(jnp.asarray(x, jax_type)), dtype=np.float32)


def _numpy_layer_norm(x, w, b, eps):
    x = x.astype(np.float64)
    y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
    return y * (1.0 if w is None else w.astype(np.float64)) + (0.0 if b is None else b.astype(np.float64))


def _torch_layer_norm(x, w, b, eps, dtype):
    """torch's nn.LayerNorm (transformers' LayerNorm) over x, w and b rounded to dtype."""
    t = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    norm = torch.nn.LayerNorm(x.shape[-1], eps=eps, elementwise_affine=w is not None, bias=b is not None, dtype=t)
    with torch.no_grad():
        if w is not None:
            norm.weight.copy_(torch.from_numpy(w))
        if b is not None:
            norm.bias.copy_(torch.from_numpy(b))
        return norm(torch.from_numpy(x).to(t)).float().numpy()


ENTRIES = {"affine": (True, True), "plain": (False, False), "scaled": (True, False)}


@st.composite
def cases(draw):
    rows, dim = draw(st.integers(1, 5)), draw(st.sampled_from([1, 2, 3, 7, 8, 64, 100, 257]))
    seed = draw(st.integers(0, 2 ** 31))
    eps = draw(st.sampled_from([1e-5, 1e-6, 0.1]))
    rng = np.random.default_rng(seed)
    # a mean far from 0 beside the spread of some rows: what bf16 statistics would lose
    shift = draw(st.sampled_from([0.0, 3.0, -40.0]))
    x = (rng.standard_normal((rows, dim)) * draw(st.sampled_from([0.1, 1.0, 10.0])) + shift).astype(np.float32)
    w = (1.0 + 0.5 * rng.standard_normal(dim)).astype(np.float32)
    b = rng.standard_normal(dim).astype(np.float32)
    return x, w, b, eps


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("entry", list(ENTRIES))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_f32_is_numpys_and_torchs_layer_norm(source_path, backend, entry, case):
    x, w, b, eps = case
    has_w, has_b = ENTRIES[entry]
    got = _run(source_path, backend, entry, x, w, b, eps, "f32")
    w, b_used = (w if has_w else None), (b if has_b else None)  # what the entry reads
    eps = eps if has_w else 1e-5  # `plain` passes no eps: torch's default
    want = _numpy_layer_norm(x, w, b_used, eps)
    tol = _f32_tolerance(x, want, eps)
    assert np.abs(got - want).max() <= tol, (got, want)
    torchs = _torch_layer_norm(x, w, b_used, eps, "f32")
    if backend == "torch":  # exact numerics call torch's kernel, transformers' LayerNorm, bit for bit
        assert np.array_equal(got, torchs)
    assert np.abs(got - torchs).max() <= tol


def _f32_tolerance(x, want, eps) -> float:
    """f32's rounding of the mean moves x - mean by about 2^-24 |mean|, which the normalization scales by
    1 / std: a row far from 0 beside its spread is that much less certain in any f32 LayerNorm."""
    x = x.astype(np.float64)
    condition = float((np.abs(x.mean(-1)) / np.sqrt(x.var(-1) + eps)).max())
    return 2e-5 * max(1.0, float(np.abs(want).max())) * (1.0 + condition)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_bf16_is_torchs_bf16_layer_norm_with_f32_statistics(source_path, backend, case):
    """torch's LayerNorm over a bf16 x computes in f32 and rounds once. Fast numerics compute the same in
    f32 (JAX; torch on the CPU through Linnet's C call, which a decode step's replay runs), in their own
    order, so within one bf16 rounding of it; all are the f32 (numpy) norm of the rounded inputs within a
    rounding, however far the mean is from 0 (torch's own x * rstd - mean * rstd cancels there: a row of
    one value -39.97 with bias 0.3304 gave torch 0.328125, where the norm is the bias, 0.330078 in bf16)."""
    x, w, b, eps = case
    rounded = [torch.from_numpy(a).bfloat16().float().numpy() for a in (x, w, b)]
    got = _run(source_path, backend, "affine", x, w, b, eps, "bf16")
    torchs = _torch_layer_norm(*rounded, eps, "bf16")
    want = _numpy_layer_norm(*rounded, eps)
    # one bf16 rounding of each value, beside what f32's statistics may move it by (where a value near
    # 0 is a difference of larger ones, w * y + b, that is more than its own rounding)
    tol = 2.0 ** -7 * np.abs(want) + _f32_tolerance(rounded[0], want, eps)
    assert (np.abs(got - torchs) <= tol).all()
    assert (np.abs(got - want) <= tol).all()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_jax_is_flaxs_layer_norm(source_path, case):
    """flax's LayerNorm with its variance taken as the mean of (x - mean)^2, as ours and torch's: its
    default (`use_fast_variance`, mean(x^2) - mean^2) loses a row far from 0 beside its spread (x near -40
    with a spread of 0.01 gave 4.85 where float64 says 0.747)."""
    import flax.linen as nn
    import jax.numpy as jnp

    x, w, b, eps = case
    norm = nn.LayerNorm(epsilon=eps, use_fast_variance=False)
    want = np.asarray(norm.apply({"params": {"scale": jnp.asarray(w), "bias": jnp.asarray(b)}}, jnp.asarray(x)))
    got = _run(source_path, "jax", "affine", x, w, b, eps, "f32")
    assert np.abs(got - want).max() <= _f32_tolerance(x, want, eps)
