"""copy_rows moves what the longest prefix holds, not whole rows (torch on the CPU: up to upto's
largest; JAX: a loop over blocks of positions, on the cache's bits): each runtime's copy against
numpy's statement of the entry, row dst[i] taking row src[i]'s first upto[i] positions, every row
read as it was before."""

from __future__ import annotations

import numpy as np
import pytest

LAYERS, ROWS, SEQ, HEADS, DIM = 2, 5, 10, 2, 3
# row 1 copied into row 2 while row 0 is copied into row 1 (a row both read and written), a prefix
# of no positions, and one of the whole row
SRC, DST, UPTO = [1, 0, 3, 4], [2, 1, 4, 0], [7, 10, 0, 4]


def reference(cache: np.ndarray, upto=UPTO) -> np.ndarray:
    out = cache.copy()
    for s, d, n in zip(SRC, DST, upto):
        out[:, d, :n] = cache[:, s, :n]
    return out


def noise(dtype) -> np.ndarray:
    return np.random.default_rng(0).normal(size=(LAYERS, ROWS, SEQ, HEADS, DIM)).astype(dtype)


@pytest.mark.parametrize("block", [3, 4, 256])  # blocks past the row's end, ending on it, one past all
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_jaxs_copy_by_blocks_is_the_whole_rows_copy(monkeypatch, block, dtype):
    jnp = pytest.importorskip("jax.numpy")
    from linnet.codegen_jax import runtime as rt

    monkeypatch.setattr(rt, "COPY_BLOCK", block)
    cache = jnp.asarray(noise(np.float32), dtype=dtype)
    got = rt.copy_rows(cache, *(jnp.asarray(a, jnp.int32) for a in (SRC, DST, UPTO)))
    want = reference(np.asarray(cache.astype(jnp.float32)))
    np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)), want)


@pytest.mark.parametrize("upto", [UPTO, [3, 1, 0, 2]])  # the longest prefix the whole row, and shorter
def test_torchs_copy_up_to_the_longest_prefix_is_the_whole_rows_copy(upto):
    import torch

    from linnet.codegen_torch import runtime as rt

    cache = torch.from_numpy(noise(np.float32))
    want = reference(cache.numpy(), upto)
    got = rt.copy_rows_(cache.clone(), torch.tensor(SRC), torch.tensor(DST), torch.tensor(upto))
    np.testing.assert_array_equal(got.numpy(), want)
