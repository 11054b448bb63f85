"""Linnet's Triton decode attention (`kernels.triton_attention`), run here by Triton's interpreter on
CPU tensors (the kernels as written; only their 16-bit products widened to f32, which gives the same
numbers), against the float64 loops of `attention_reference`."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

pytest.importorskip("triton")  # (in its interpreter without CUDA: tests/conftest.py)

from linnet.kernels import triton_attention  # noqa: E402
from tests.kernels.attention_reference import reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def attend(q, k, v, positions, window, sinks, scale, splits):
    """The kernel over rows 0 .. n-1 of the caches, and the reference's answer (in float64, from
    the same, already rounded, inputs)."""
    seq = k.shape[1]
    used = torch.where(positions < seq, positions + 1, 0).to(torch.int32)
    on = lambda t: None if t is None else t.to(DEVICE)
    got = triton_attention.decode(on(q), on(k), on(v), on(used), window, on(sinks), scale, splits=splits)
    want = reference(q.double().numpy(), k.double().numpy(), v.double().numpy(), np.arange(len(q)),
                     positions.numpy(), window, None if sinks is None else sinks.double().numpy(), scale)
    return got.cpu(), torch.from_numpy(want)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), rows=st.integers(1, 4), kv_heads=st.integers(1, 3), group=st.integers(1, 5),
       head_dim=st.sampled_from([8, 16, 24]), seq=st.integers(1, 150), splits=st.sampled_from([None, 1, 2, 5]),
       with_sinks=st.booleans())
def test_f32_rows_match_the_reference(data, rows, kv_heads, group, head_dim, seq, splits, with_sinks):
    # any grouping of heads (5 query heads a KV head: padded to the kernel's 16), head sizes short of
    # a power of two, rows idle (position MaxSeq) or at any position, any window, keys split in
    # pieces that a row's keys may end before
    positions = torch.tensor(data.draw(st.lists(st.integers(0, seq), min_size=rows, max_size=rows)), dtype=torch.int32)
    window = data.draw(st.sampled_from([0, 1, 3, seq]))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    heads = kv_heads * group
    q = torch.randn(rows, heads, head_dim, generator=g)
    k, v = (torch.randn(rows + 1, seq, kv_heads, head_dim, generator=g) for _ in range(2))
    sinks = torch.randn(heads, generator=g) * 2 if with_sinks else None
    got, want = attend(q, k, v, positions, window, sinks, 0.7, splits)
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5)
    assert not got[positions == seq].any()  # an idle row: no keys, zeros


@pytest.mark.parametrize("dtype, tolerance", [(torch.bfloat16, 4e-3), (torch.float16, 5e-4)])
@pytest.mark.parametrize("splits", [None, 1, 4])
def test_16_bit_caches_match_the_reference(dtype, tolerance, splits):
    # Llama 3's grouping (4 query heads a KV head), a long row beside short ones; the probabilities
    # meet the values in 16 bits (as in flash attention), the output is rounded to the type once
    g = torch.Generator().manual_seed(1)
    rows, seq, kv_heads, group, head_dim = 3, 300, 2, 4, 64
    q = torch.randn(rows, kv_heads * group, head_dim, generator=g).to(dtype)
    k, v = (torch.randn(rows, seq, kv_heads, head_dim, generator=g).to(dtype) for _ in range(2))
    positions = torch.tensor([299, 0, 130], dtype=torch.int32)
    got, want = attend(q, k, v, positions, 0, None, head_dim ** -0.5, splits)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("rows, kv_heads, max_seq, processors, shape", [
    (64, 8, 640, 132, (3, 256)),   # Llama 3.1 8B at 64 rows, an H200: 1536 programs
    (1, 8, 640, 132, (10, 64)),    # one request: every 64 keys a program of their own
    (64, 8, 64, 132, (1, 64)),     # rows of one block of keys
    (8, 4, 4096, 4, (1, 4096)),    # rows enough for the processors: not split
])
def test_split_shape(rows, kv_heads, max_seq, processors, shape):
    assert triton_attention.split_shape(rows, kv_heads, max_seq, processors) == shape


@given(rows=st.integers(1, 256), kv_heads=st.integers(1, 16), max_seq=st.integers(1, 10000),
       processors=st.integers(1, 200))
def test_splits_cover_the_keys_in_whole_blocks(rows, kv_heads, max_seq, processors):
    splits, split_len = triton_attention.split_shape(rows, kv_heads, max_seq, processors)
    assert split_len % triton_attention.BLOCK_N == 0
    assert (splits - 1) * split_len < max_seq <= splits * split_len  # every key, and no split past them


def test_the_op_compiles_whole_and_gives_the_kernels_output():
    # the op as torch.compile takes it (`attend`: its shape from the registered fake): no graph break
    g = torch.Generator().manual_seed(2)
    q = torch.randn(3, 4, 16, generator=g)
    k, v = (torch.randn(3, 20, 2, 16, generator=g) for _ in range(2))
    used = torch.tensor([20, 0, 7], dtype=torch.int32)
    step = lambda q, k, v, used: triton_attention.attend(q, k, v, used, 0, None, 0.25) * 2
    got = torch.compile(step, fullgraph=True, dynamic=False)(q, k, v, used)
    torch.testing.assert_close(got, triton_attention.decode(q, k, v, used, 0, None, 0.25) * 2)
