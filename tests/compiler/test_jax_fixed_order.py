"""JAX's row reductions in one order at every row count (`codegen_jax.fixed_order`): a row's norm
and softmax bitwise the same alone and beside other rows, at the row counts where XLA's CPU backend
hands a reduction to YNNPACK (about 4096 elements and up) and where it does not; and the values
those of float64 numpy's, within f32's rounding. Each is jitted, as the generated code runs it (eagerly,
every op of the tree compiles on its own at each shape)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linnet.codegen_jax import fixed_order, runtime as rt

ROW_COUNTS = [1, 2, 3, 16, 17, 32, 64]


def assert_rows_invariant(op, width: int, dtype=jnp.float32, seed: int = 0):
    """jit(op)(rows)[at] is op(probe)[0], bit for bit, with the probe at the first and the last of
    M rows, M in ROW_COUNTS."""
    rng = np.random.default_rng(seed)
    f = jax.jit(op)
    probe = (rng.standard_normal((1, width)) * 3).astype(np.float32)
    alone = np.asarray(f(jnp.asarray(probe, dtype)))[0]
    differ = []
    for m in ROW_COUNTS:
        others = (rng.standard_normal((m - 1, width)) * 3).astype(np.float32)
        for at in sorted({0, m - 1}):
            rows = np.concatenate([others[:at], probe, others[at:]])
            if not np.array_equal(np.asarray(f(jnp.asarray(rows, dtype)))[at], alone):
                differ.append((m, at))
    assert not differ, f"(rows, position) where the probe row's result differs from its own alone: {differ}"


@pytest.mark.parametrize("width", [1, 2, 3, 100, 128, 4097])
def test_row_sum_and_max_are_numpys(width):
    x = np.random.default_rng(width).standard_normal((5, width)).astype(np.float32)
    want = x.astype(np.float64).sum(-1)
    row_sum, row_max = jax.jit(fixed_order.row_sum), jax.jit(lambda a: fixed_order.row_max(a, keepdims=True))
    got = np.asarray(row_sum(jnp.asarray(x)))
    assert np.abs(got - want).max() <= 1e-6 * np.abs(x).sum(-1).max()
    assert np.array_equal(np.asarray(row_max(jnp.asarray(x))), x.max(-1, keepdims=True))
    ints = np.arange(width * 2, dtype=np.int32).reshape(2, width)
    assert np.array_equal(np.asarray(row_sum(jnp.asarray(ints))), ints.sum(-1))


def test_row_max_keeps_a_nan_as_jnp_max_does():
    x = jnp.asarray([[1.0, np.nan, 3.0], [-np.inf, -np.inf, -np.inf]], jnp.float32)
    got = np.asarray(fixed_order.row_max(x))
    assert np.isnan(got[0]) and got[1] == -np.inf


@pytest.mark.parametrize("width", [2, 128, 3000])
def test_softmax_and_log_softmax_are_numpys(width):
    x = (np.random.default_rng(1).standard_normal((4, width)) * 4).astype(np.float32)
    x64 = x.astype(np.float64)
    log_want = x64 - x64.max(-1, keepdims=True)
    log_want -= np.log(np.exp(log_want).sum(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(jax.jit(fixed_order.log_softmax)(x)), log_want, rtol=0, atol=2e-5)
    np.testing.assert_allclose(np.asarray(jax.jit(rt.softmax)(x)), np.exp(log_want), rtol=2e-5, atol=1e-9)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("width", [64, 1024])
def test_rmsnorm_rows_are_batch_invariant(width, dtype):
    weight = jnp.asarray(np.random.default_rng(2).standard_normal(width), dtype)
    assert_rows_invariant(lambda x: rt.rmsnorm(x, weight, 1e-5), width, dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("width", [64, 2560])
def test_layer_norm_rows_are_batch_invariant(width, dtype):
    rng = np.random.default_rng(5)
    weight, bias = (jnp.asarray(rng.standard_normal(width), dtype) for _ in range(2))
    assert_rows_invariant(lambda x: rt.layer_norm(x, weight, bias, 1e-5), width, dtype)


def test_rmsnorm_is_numpys():
    x = np.random.default_rng(3).standard_normal((3, 1000)).astype(np.float32)
    w = np.random.default_rng(4).standard_normal(1000).astype(np.float32)
    x64 = x.astype(np.float64)
    want = w * x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-5)
    got = jax.jit(lambda x, w: rt.rmsnorm(x, w, 1e-5))(x, w)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("width", [8, 128, 1000])
def test_softmax_rows_are_batch_invariant(width):
    assert_rows_invariant(rt.softmax, width)
    assert_rows_invariant(fixed_order.log_softmax, width)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_sum_and_mean_over_an_axis_are_numpys(axis, keepdims):
    """The language's `sum` and `mean` as the JAX generator writes them, types as jnp's."""
    x = np.random.default_rng(5).standard_normal((3, 4, 5)).astype(np.float32)
    sum_over = jax.jit(fixed_order.sum_over, static_argnums=(1, 2))
    for ours, theirs in ((sum_over, np.sum), (jax.jit(fixed_order.mean_over, static_argnums=(1, 2)), np.mean)):
        got = np.asarray(ours(jnp.asarray(x), axis, keepdims))
        want = theirs(x.astype(np.float64), axis=axis, keepdims=keepdims)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert sum_over(jnp.asarray(x, jnp.bfloat16), 1, False).dtype == jnp.bfloat16
    assert sum_over(jnp.asarray(x > 0), 1, False).dtype == jnp.sum(jnp.asarray(x > 0), 1).dtype
    assert sum_over(jnp.zeros((2, 0, 3)), 1, False).shape == (2, 3)


def test_a_moe_layers_weighted_sum_of_its_experts_is_batch_invariant():
    """gpt-oss's and Mixtral's `x + sum(out * weights, 1)` over k = 2 experts' outputs, as the JAX
    generator writes it. (Alone, jnp.sum here is invariant too; fused by XLA into a whole pass, it
    moved tiny-gpt-oss's f32 alternatives an ulp at 16 rows: `benchmarks/batch_invariance.py`.)"""
    def moe_sum(rows):  # a token's row: its residual, its 2 experts' outputs, their 2 weights
        x, out, w = rows[:, :64], rows[:, 64:192].reshape(-1, 2, 64), rows[:, 192:]
        return x + fixed_order.sum_over(out * jnp.expand_dims(w, 2), 1)

    assert_rows_invariant(moe_sum, 194)


def test_off_the_cpu_the_reductions_are_xlas_own(monkeypatch):
    """Compiled for a GPU (here: `in_one_order` answering as there), each reduction is XLA's one
    reduce, not the tree's passes, and gives jnp's own values."""
    monkeypatch.setattr(fixed_order, "in_one_order", lambda: False)
    x = jnp.asarray(np.random.default_rng(3).standard_normal((4, 1000)), jnp.float32)
    for ours, theirs in ((lambda a: fixed_order.row_sum(a, keepdims=True), lambda a: jnp.sum(a, -1, keepdims=True)),
                         (fixed_order.row_max, lambda a: jnp.max(a, -1)),
                         (lambda a: fixed_order.sum_over(a, 0), lambda a: jnp.sum(a, 0)),
                         (lambda a: fixed_order.mean_over(a, 1, keepdims=True), lambda a: jnp.mean(a, 1, keepdims=True))):
        text = str(jax.make_jaxpr(ours)(x))
        assert text.count("reduce_") == 1 and "concatenate" not in text and "reshape" not in text, text
        assert np.array_equal(np.asarray(ours(x)), np.asarray(theirs(x)))
    monkeypatch.undo()
    assert "reduce_" not in str(jax.make_jaxpr(fixed_order.row_sum)(x))  # on the CPU: the tree
