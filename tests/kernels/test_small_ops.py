"""Linnet's small ops (RMSNorm, rotary embedding, the cache write), its CPU kernels (`cpu_ops`) and
their GPU counterparts in Triton (`triton_ops`; here in Triton's interpreter, on the GPU where there
is one), against float64 references written here: any row count and width, every activation /
weight / cache type, strided inputs (the columns of a fused matmul's output), padding tokens and
rows outside the cache."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.kernels import cpu_ops, triton_ops

OPS = [pytest.param(cpu_ops, id="cpu", marks=pytest.mark.skipif(cpu_ops.library() is None,
                                                                reason="Linnet's CPU kernels do not run here")),
       pytest.param(triton_ops, id="triton", marks=pytest.mark.skipif(not triton_ops.available(),
                                                                      reason="Triton is not installed"))]
pytestmark = pytest.mark.parametrize("ops", OPS)


def on(ops, *tensors):
    """The tensors where `ops` runs: Triton's on the GPU where there is one (else its interpreter's CPU)."""
    device = "cuda" if ops is triton_ops and torch.cuda.is_available() else "cpu"
    return [t.to(device) if isinstance(t, torch.Tensor) else t for t in tensors]

TYPES = [torch.float32, torch.bfloat16, torch.float16]
ULP = {torch.float32: 2 ** -22, torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}  # two units in the last place


def close(got: torch.Tensor, want: np.ndarray, dtype: torch.dtype, rounded_in: torch.dtype | None = None):
    """got equals want rounded to dtype, up to a unit or two in its last place (of `rounded_in`'s, if
    a value was rounded to that type on the way): the f32 sums inside differ from float64's in their
    last bits, which a rounding can carry up."""
    assert got.dtype == dtype
    tol = max(ULP[dtype], ULP[rounded_in or dtype])
    np.testing.assert_allclose(got.double().numpy(), want, rtol=tol, atol=tol)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(n=st.integers(1, 70), d=st.integers(1, 80), x_type=st.sampled_from(TYPES), w_type=st.sampled_from(TYPES),
       gap=st.integers(0, 9), seed=st.integers(0, 2 ** 31 - 1))
def test_rmsnorm_is_the_normalized_row_times_the_weight(ops, n, d, x_type, w_type, gap, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, d + gap, generator=g) * 3).to(x_type)[:, :d]  # rows `gap` apart
    w = torch.randn(d, generator=g).to(w_type)
    got = ops.rmsnorm(*on(ops, x, w), 1e-5).cpu()
    xd = x.double().numpy()
    h = xd / np.sqrt((xd * xd).mean(-1, keepdims=True) + 1e-5)
    h = torch.from_numpy(h).to(x_type).double().numpy()  # the reference rounds to x's type before the weight
    assert got.shape == x.shape
    close(got, w.double().numpy() * h, torch.promote_types(x_type, w_type), rounded_in=x_type)


def test_rmsnorm_of_a_large_pack_runs_on_the_threads_and_keeps_leading_axes(ops):
    x, w = torch.randn(3, 300, 256), torch.randn(256)  # past the CPU kernel's single-thread size
    got = ops.rmsnorm(*on(ops, x, w), 1e-6).cpu()
    xd = x.double().numpy()
    close(got, w.double().numpy() * xd / np.sqrt((xd * xd).mean(-1, keepdims=True) + 1e-6), torch.float32)


def rope_table(head_dim: int, rows: int) -> torch.Tensor:
    angles = np.outer(np.arange(rows), 10000.0 ** (-np.arange(0, head_dim, 2) / head_dim))
    return torch.from_numpy(np.stack([np.cos(angles), np.sin(angles)], axis=1)).float()


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(n=st.integers(1, 20), heads=st.integers(1, 5), half=st.integers(1, 40), dtype=st.sampled_from(TYPES),
       extra=st.integers(0, 3), seed=st.integers(0, 2 ** 31 - 1))
def test_rope_rotates_each_half_pair_by_its_position(ops, n, heads, half, dtype, extra, seed):
    g = torch.Generator().manual_seed(seed)
    head_dim, rows = 2 * half, 12
    fused = torch.randn(n, (heads + extra) * head_dim, generator=g).to(dtype)  # q's columns of a wider output
    x = fused[:, extra * head_dim:].reshape(n, heads, head_dim)
    positions = torch.randint(0, rows + 3, (n,), generator=g, dtype=torch.int32)  # past the table: its last row
    table = rope_table(head_dim, rows)
    got = ops.rope(*on(ops, x, positions, table)).cpu()
    cs = table.double().numpy()[np.minimum(positions.numpy(), rows - 1)]  # [n, 2, half]
    cos, sin = cs[:, None, 0], cs[:, None, 1]
    x1, x2 = x.double().numpy()[..., :half], x.double().numpy()[..., half:]
    want = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    assert got.shape == x.shape and got.is_contiguous()
    # a difference of two products can cancel: its f32 error is relative to the products, not to it
    tol = ULP[dtype] * max(1.0, 2 * float(x.double().abs().max()))
    assert got.dtype == dtype
    np.testing.assert_allclose(got.double().numpy(), want, rtol=ULP[dtype], atol=tol)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(layers=st.integers(1, 3), batch=st.integers(1, 4), seq=st.integers(1, 9), n=st.integers(1, 8),
       state_type=st.sampled_from(TYPES), value_type=st.sampled_from(TYPES), two=st.booleans(),
       apart=st.booleans(), seed=st.integers(0, 2 ** 31 - 1))
def test_put_rows_writes_each_entry_inside_and_drops_the_rest(ops, layers, batch, seq, n, state_type, value_type,
                                                              two, apart, seed):
    g = torch.Generator().manual_seed(seed)
    state = torch.randn(layers, batch, seq, 2, 3, generator=g).to(state_type)
    before = state.clone()
    layer = int(torch.randint(0, layers, (), generator=g))
    # distinct (row, position) targets, so that no two entries write one place: row `batch` is
    # outside the cache and position `seq` is padding, both dropped
    if two:
        positions = torch.randperm(seq + 1, generator=g)[:n].to(torch.int32)
        rows = torch.randint(0, batch + 1, (len(positions),), generator=g)
        index = (layer, rows, positions)
    else:
        rows = torch.randperm(batch + 1, generator=g)[:n].to(torch.int32)
        index = (layer, rows)
    shape = state.shape[len(index):]
    value = torch.randn(len(rows), 2 * shape.numel(), generator=g).to(value_type)
    # apart: each entry's values in the second half of a wider row (the v columns of a fused output)
    value = value[:, shape.numel():] if apart else value[:, :shape.numel()].contiguous()
    value = value.reshape(len(rows), *shape)
    state, value, *where = on(ops, state, value, *index)
    assert ops.put_rows(state, tuple(where), value)
    state = state.cpu()
    want = before.clone()
    for i in range(len(rows)):
        if rows[i] < batch and (not two or positions[i] < seq):
            want[tuple(int(a[i]) if isinstance(a, torch.Tensor) else a for a in index)] = value[i].to(state_type)
    assert torch.equal(state, want)  # rounded as torch rounds


def test_put_rows_declines_what_it_does_not_take(ops):
    state, value, idx = on(ops, torch.zeros(2, 4, 3), torch.ones(2, 3), torch.tensor([0, 1]))
    assert not ops.put_rows(state.transpose(0, 1), (idx, idx), value)  # not contiguous
    assert not ops.put_rows(state, (idx, idx, idx), torch.ones_like(idx))  # three index tensors
    assert not ops.put_rows(state, (5, idx), value)  # an int outside its axis
    assert not ops.put_rows(state, (idx, idx), torch.ones_like(state[0]))  # a value of the wrong shape
    assert not state.any()


@pytest.mark.parametrize("width", [7, 8, 13])  # the CPU kernel's tail, one vector of eight, both
def test_silu_mul_keeps_nan_and_the_limits_as_torch(ops, width):
    # -inf: torch's silu is -inf / (1 + inf), NaN (not the capped exponential's -inf); a large negative x's
    # value is a tiny one (x / e^88 on the CPU) where torch's is tinier still
    a = torch.tensor([float("nan"), float("inf"), 0.0, -1e4, 1e4, -100.0, -float("inf")] * 2)[:width]
    b = torch.full_like(a, 2.0)
    got, want = ops.silu_mul(*on(ops, a[None], b[None]))[0].cpu(), F.silu(a) * b
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.allclose(got[~want.isnan()], want[~want.isnan()], rtol=1e-6, atol=1e-30)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(n=st.integers(1, 20), width=st.integers(1, 2100), a_type=st.sampled_from(TYPES), b_type=st.sampled_from(TYPES),
       seed=st.integers(0, 2 ** 31 - 1))
def test_silu_mul_is_the_rounded_silu_times_the_other(ops, n, width, a_type, b_type, seed):
    # a gated MLP's gate and up columns of one fused output: rows apart; wider than a program's block.
    # The CPU's kernel takes halves of one type (the runtime calls it for those alone)
    b_type = a_type if ops is cpu_ops else b_type
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(n, 2 * width, generator=g) * 4).to(a_type)[:, :width]
    b = (torch.randn(n, width + 3, generator=g) * 4).to(b_type)[:, 3:]
    got = ops.silu_mul(*on(ops, a, b)).cpu()
    ad = a.double().numpy()
    silu = torch.from_numpy(ad / (1 + np.exp(-ad))).to(a_type).double().numpy()  # rounded to a's type first
    close(got, silu * b.double().numpy(), torch.promote_types(a_type, b_type), rounded_in=a_type)
