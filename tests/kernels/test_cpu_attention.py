"""Linnet's CPU attention for one query a cache row against a float64 reference written here:
any grouping of query heads to KV heads, head sizes (multiples of 16 take 16-float vectors on
AVX-512 CPUs, others 8), windows, sink logits, capped scores (Gemma 2's softcap: 2 saturates
random scores, 50 barely bends them), cache types, rows read in any order, and padding tokens."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_reference import reference
from linnet.kernels import cpu_attention

pytestmark = pytest.mark.skipif(cpu_attention.library() is None, reason="Linnet's CPU kernels do not run here")


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 6), kv_heads=st.integers(1, 3), group=st.sampled_from([1, 2, 3, 4, 5, 8]),
       head_dim=st.sampled_from([8, 16, 64, 72, 80, 128]), max_seq=st.integers(1, 40), window=st.sampled_from([0, 1, 5]),
       with_sinks=st.booleans(), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       softcap=st.sampled_from([0.0, 2.0, 5.0, 50.0]), seed=st.integers(0, 2 ** 31 - 1))
def test_attend_rows_is_softmax_attention(n, kv_heads, group, head_dim, max_seq, window, with_sinks, dtype, softcap,
                                          seed):
    g = torch.Generator().manual_seed(seed)
    batch, heads = 4, kv_heads * group
    k = torch.randn(batch, max_seq, kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(batch, max_seq, kv_heads, head_dim, generator=g).to(dtype)
    q = torch.randn(n, heads, head_dim, generator=g) * 3  # scores of a few units, which a cap of 2 saturates
    rows = torch.randint(0, batch + 1, (n,), generator=g)  # row `batch` does not exist: zeros, like padding
    positions = torch.randint(0, max_seq + 2, (n,), generator=g, dtype=torch.int32)  # some are padding
    sinks = torch.randn(heads, generator=g) if with_sinks else None
    scale = head_dim ** -0.5
    got = cpu_attention.attend_rows(q, k, v, rows, positions, window, sinks, scale, softcap)
    want = reference(*(a.float().numpy() for a in (q, k, v)), rows, positions, window,
                     None if sinks is None else sinks.numpy(), scale, softcap)
    assert got.shape == (n, heads, head_dim) and got.dtype == torch.float32
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-5, atol=1e-5)


def test_a_layer_of_a_stacked_cache_and_a_bf16_query():
    k, v = torch.randn(2, 3, 10, 2, 16), torch.randn(2, 3, 10, 2, 16)  # [layers, rows, positions, kv heads, d]
    q = torch.randn(3, 4, 16).to(torch.bfloat16)
    rows, positions = torch.tensor([2, 0, 1]), torch.tensor([9, 3, 0])
    got = cpu_attention.attend_rows(q, k[1], v[1], rows, positions, 0, None, 0.25)
    assert got.dtype == torch.bfloat16
    want = reference(q.float().numpy(), k[1].numpy(), v[1].numpy(), rows, positions, 0, None, 0.25)
    np.testing.assert_allclose(got.double().numpy(), want, rtol=2 ** -8, atol=2 ** -8)


def test_no_token_attends_to_nothing():
    # a pass of no token: its parts were counted dividing by its units (0), a SIGFPE that took the process down
    k = v = torch.randn(2, 10, 2, 16)
    got = cpu_attention.attend_rows(torch.randn(0, 4, 16), k, v, torch.zeros(0, dtype=torch.int32),
                                    torch.zeros(0, dtype=torch.int32), 0, None, 0.25)
    assert got.shape == (0, 4, 16)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 5), kv_heads=st.integers(1, 3), group=st.sampled_from([1, 3, 4, 5]),
       head_dim=st.sampled_from([16, 32, 64, 96, 128]), max_seq=st.integers(1, 40), window=st.sampled_from([0, 6]),
       with_sinks=st.booleans(), softcap=st.sampled_from([0.0, 2.0, 5.0, 50.0]), seed=st.integers(0, 2 ** 31 - 1))
def test_bf16_queries_against_a_bf16_cache(n, kv_heads, group, head_dim, max_seq, window, with_sinks, softcap, seed):
    # a bf16 model's pass: queries and cache in bf16, scored as they are where the CPU has AVX-512
    # BF16 and head_dim is a multiple of 32 (the products exact, the sums f32), else widened
    g = torch.Generator().manual_seed(seed)
    batch, heads = 3, kv_heads * group
    k, v = (torch.randn(batch, max_seq, kv_heads, head_dim, generator=g).bfloat16() for _ in range(2))
    q = torch.randn(n, heads, head_dim, generator=g).bfloat16()
    rows = torch.randint(0, batch, (n,), generator=g)
    positions = torch.randint(0, max_seq, (n,), generator=g, dtype=torch.int32)
    sinks = torch.randn(heads, generator=g) if with_sinks else None
    scale = head_dim ** -0.5
    got = cpu_attention.attend_rows(q, k, v, rows, positions, window, sinks, scale, softcap)
    assert got.dtype == torch.bfloat16
    want = reference(*(a.float().numpy() for a in (q, k, v)), rows, positions, window,
                     None if sinks is None else sinks.numpy(), scale, softcap)
    # one bf16 rounding of the output, and the f32 sums' own error
    np.testing.assert_allclose(got.double().numpy(), want, rtol=2 ** -8, atol=2 ** -8)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 5), kv_heads=st.integers(1, 3), group=st.sampled_from([1, 3, 4, 5]),
       head_dim=st.sampled_from([16, 64, 72, 128]), span=st.integers(520, 1400), window=st.sampled_from([0, 700]),
       with_sinks=st.booleans(), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       threads=st.integers(1, 3), softcap=st.sampled_from([0.0, 2.0, 5.0, 50.0]), seed=st.integers(0, 2 ** 31 - 1))
def test_a_long_span_split_among_threads_is_softmax_attention(n, kv_heads, group, head_dim, span, window,
                                                               with_sinks, dtype, threads, softcap, seed):
    """Rows decoding over a long prompt: each KV head's positions are attended in parts of 256 and
    merged (`token_parts`), the parts spread over the threads where the call's KV heads are fewer
    than twice the threads (one or two rows), else taken in turn by one."""
    g = torch.Generator().manual_seed(seed)
    batch, heads, max_seq = 2, kv_heads * group, span + 8
    k = torch.randn(batch, max_seq, kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(batch, max_seq, kv_heads, head_dim, generator=g).to(dtype)
    q = (torch.randn(n, heads, head_dim, generator=g) * 2).to(dtype)  # sharper softmaxes: a part's top matters
    rows = torch.arange(n) % batch
    positions = torch.tensor([span - 1 - 3 * i for i in range(n)], dtype=torch.int32)
    sinks = torch.randn(heads, generator=g) if with_sinks else None
    scale = head_dim ** -0.5
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = cpu_attention.attend_rows(q, k, v, rows, positions, window, sinks, scale, softcap)
    finally:
        torch.set_num_threads(before)
    want = reference(*(a.float().numpy() for a in (q, k, v)), rows, positions, window,
                     None if sinks is None else sinks.numpy(), scale, softcap)
    tolerance = 1e-5 if dtype == torch.float32 else 2 ** -8
    np.testing.assert_allclose(got.double().numpy(), want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_long_spans_bits_do_not_depend_on_the_threads(dtype):
    """Its parts follow from its span alone: 1, 2 or 3 threads (its parts spread over them or
    taken in turn) give the same bits."""
    g = torch.Generator().manual_seed(3)
    k, v = (torch.randn(2, 1300, 3, 64, generator=g).to(dtype) for _ in range(2))
    q = torch.randn(2, 9, 64, generator=g).to(dtype)
    rows, positions = torch.tensor([0, 1]), torch.tensor([1290, 700], dtype=torch.int32)
    before, outs = torch.get_num_threads(), []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs += [cpu_attention.attend_rows(q, k, v, rows, positions, 0, None, 0.125),
                     cpu_attention.attend_rows(q[:1], k, v, rows[:1], positions[:1], 0, None, 0.125)]
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(out[0], outs[0][0]) for out in outs)
    assert all(torch.equal(out[1], outs[0][1]) for out in outs[::2])
