"""`expert_linear` in both runtimes against a plain loop over (token, choice) pairs in float64."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from linnet.codegen_jax import runtime as jrt
from linnet.codegen_torch import runtime as trt
from linnet.kernels import cpu_linear


def reference(x, w, experts, bias):
    n, k = experts.shape
    out = np.zeros((n, k, w.shape[1]))
    for i in range(n):
        for j in range(k):
            row = x[i] if x.ndim == 2 else x[i, j]
            e = experts[i, j]
            out[i, j] = row.astype(np.float64) @ w[e].astype(np.float64).T + (0 if bias is None else bias[e])
    return out


def torch_expert_linear(x, w, experts, bias, grouped: bool):
    """torch's op through its grouped GEMM (the call CUDA makes; torch's CPU fallback here), or
    through its per-expert loop."""
    saved = trt._GROUPED_MM["cpu"]
    trt._GROUPED_MM["cpu"] = grouped
    try:
        return trt.expert_linear(x, w, experts, bias)
    finally:
        trt._GROUPED_MM["cpu"] = saved


def run_both(x, w, experts, bias):
    """(torch grouped, torch per expert, torch with each expert packed (fast numerics on a CPU
    with Linnet's kernels), JAX), each on numpy arrays."""
    args = (torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(experts),
            None if bias is None else torch.from_numpy(bias))
    ours_torch = [torch_expert_linear(*args, grouped=g).numpy() for g in (True, False)]
    if cpu_linear.available(torch.float32):
        ours_torch.append(trt.expert_linear(args[0], [cpu_linear.pack(e) for e in args[1]], *args[2:]).numpy())
    else:
        ours_torch.append(ours_torch[1])
    ours_jax = np.asarray(jrt.expert_linear(jnp.asarray(x), jnp.asarray(w), jnp.asarray(experts),
                                            None if bias is None else jnp.asarray(bias)))
    return ours_torch + [ours_jax]


def test_the_grouped_gemm_runs_on_this_torch():
    """Where torch has the grouped GEMM, the grouped path above is really taken (not its fallback)."""
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    x, w = torch.randn(4, 8), torch.randn(3, 5, 8)
    assert trt._grouped_mm_serves(x, w)
    counts = torch.tensor([1, 0, 3])
    out = trt._grouped_mm(x, w, counts)
    ref = torch.cat([x[:1] @ w[0].T, x[1:] @ w[2].T])
    torch.testing.assert_close(out, ref)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(n=st.integers(1, 9), k=st.integers(1, 4), experts=st.integers(1, 6), d_in=st.integers(1, 12),
       d_out=st.integers(1, 10), per_choice=st.booleans(), with_bias=st.booleans(), seed=st.integers(0, 2**16))
def test_each_token_through_its_experts(n, k, experts, d_in, d_out, per_choice, with_bias, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, k, d_in) if per_choice else (n, d_in)).astype(np.float32)
    w = rng.standard_normal((experts, d_out, d_in)).astype(np.float32)
    chosen = rng.integers(0, experts, (n, k)).astype(np.int32)  # repeats and unused experts both occur
    bias = rng.standard_normal((experts, d_out)).astype(np.float32) if with_bias else None
    ref = reference(x, w, chosen, bias)
    for name, out in zip(("torch grouped", "torch per expert", "torch packed", "jax"), run_both(x, w, chosen, bias)):
        assert out.shape == (n, k, d_out), name
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max(), err_msg=name)


def test_every_token_on_one_expert():
    """All pairs in one group, the others empty: the sort and the scatter back must still hold."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 8)).astype(np.float32)
    w = rng.standard_normal((4, 6, 8)).astype(np.float32)
    chosen = np.full((5, 2), 2, np.int32)
    for out in run_both(x, w, chosen, None):
        np.testing.assert_allclose(out, reference(x, w, chosen, None), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_types_round_once(dtype):
    """In the model's type, as `linear` is: within a few units of the last place of the f64 result."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 32)).astype(np.float32)
    w = (rng.standard_normal((3, 16, 32)) / 6).astype(np.float32)
    chosen = rng.integers(0, 3, (6, 2)).astype(np.int32)
    xt, wt = torch.from_numpy(x).to(dtype), torch.from_numpy(w).to(dtype)
    ref = reference(xt.float().numpy(), wt.float().numpy(), chosen, None)
    eps = torch.finfo(dtype).eps
    for grouped in (True, False):
        out = torch_expert_linear(xt, wt, torch.from_numpy(chosen), None, grouped)
        assert out.dtype == dtype
        assert np.abs(out.float().numpy() - ref).max() <= 4 * eps * np.abs(ref).max(), grouped


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_f32_rows_meet_a_16_bit_weight_unrounded(dtype):
    """The CPU carries activations in f32 over 16-bit weights (`gather_rows`): the rows are not
    rounded to the weight's type on the way in, in either runtime; f32's accuracy, on the weight's
    own values."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((7, 64)).astype(np.float32)
    w32 = (rng.standard_normal((4, 16, 64)) / 8).astype(np.float32)
    chosen = rng.integers(0, 4, (7, 2)).astype(np.int32)
    wt = torch.from_numpy(w32).to(getattr(torch, dtype))
    ref = reference(x, wt.float().numpy(), chosen, None)  # the weight's values, the rows' as they are
    tol = 1e-5 * np.abs(ref).max()
    outs = [torch_expert_linear(torch.from_numpy(x), wt, torch.from_numpy(chosen), None, g) for g in (True, False)]
    outs.append(jrt.expert_linear(jnp.asarray(x), jnp.asarray(wt.float().numpy()).astype(dtype), jnp.asarray(chosen)))
    for name, out in zip(("torch grouped", "torch per expert", "jax"), outs):
        out = np.asarray(out.float() if isinstance(out, torch.Tensor) else out, np.float32)
        assert np.abs(out - ref).max() <= tol, (name, np.abs(out - ref).max() / np.abs(ref).max())
