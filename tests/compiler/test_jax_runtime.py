"""JAX runtime pieces the parity tests reach only as a whole: the cache store that drops padding and
writes 16-bit floats as their bits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linnet.codegen_jax import runtime as rt


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_put_drops_entries_past_the_state(dtype):
    """Padding tokens at position MaxSeq write nothing; written values land bit for bit."""
    rng = np.random.default_rng(5)
    cache = rng.normal(size=(2, 3, 6, 4)).astype(dtype)  # [layers, rows, MaxSeq, dim]
    rows = np.array([0, 2, 1, 2, 0])
    positions = np.array([1, 6, 5, 3, 6])  # two at MaxSeq
    value = rng.normal(size=(5, 4)).astype(dtype)
    want = cache.copy()
    for r, p, v in zip(rows, positions, value):
        if p < 6:
            want[1, r, p] = v
    got = jax.jit(rt.put)(jnp.asarray(cache), (1, jnp.asarray(rows), jnp.asarray(positions)), jnp.asarray(value))
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8))


def test_a_bf16_put_widens_nothing():
    # XLA's CPU backend widens a bf16 scatter's whole operand to f32 and back: put must not let it.
    cache = jnp.zeros((2, 3, 6, 4), jnp.bfloat16)
    index = (1, jnp.array([0, 2]), jnp.array([1, 6]))
    hlo = jax.jit(rt.put).lower(cache, index, jnp.ones((2, 4), jnp.bfloat16)).compile().as_text()
    assert "f32[2,3,6,4]" not in hlo
