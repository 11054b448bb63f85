"""The small ops of a pass on the CPU, one C call each (`cpu_ops.c`): RMSNorm, LayerNorm, rotary
embedding, the cache write, a gated MLP's silu(gate) * up and GELU's tanh form, built and loaded
with `cpu_linear`'s library.

Eager torch spends about 20 us in each of them at one decode row (several aten ops and dtype
conversions apiece) for well under a microsecond of arithmetic; a SmolLM2 decode step calls
them 241 times. Each function here takes what the runtime's reference takes and gives the
same values, rounded where the reference rounds; `serves` is the one check of whether it may.
"""

from __future__ import annotations

import ctypes

import torch

from linnet.kernels import build, pool
from linnet.kernels.torch_types import TYPES
from linnet.kernels.cpu_graph import OP_GELU_TANH, OP_SILU_MUL, call
from linnet.kernels.row_writes import dense_rows, row_write


def serves(*tensors: torch.Tensor) -> bool:
    """Whether these tensors are ones the kernels take: on the CPU, of a type they read, and the
    library built and loaded here."""
    for t in tensors:
        if t.device.type != "cpu" or t.dtype not in TYPES:
            return False
    return library() is not None


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * round(x * rsqrt(mean(x^2) + eps)) over x's last axis, x rounded to its own type
    before the weight multiplies it (the runtime's `rmsnorm`). x's rows may lie apart (a view);
    its last axis and the weight are dense."""
    d = x.shape[-1]
    rows = x.reshape(-1, d) if x.dim() != 2 else x
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    weight = weight.contiguous()
    out = _empty(x, torch.promote_types(weight.dtype, x.dtype))
    call("rmsnorm", TYPES[x.dtype], rows.data_ptr(), rows.stride(0), rows.shape[0], d, TYPES[weight.dtype],
         weight.data_ptr(), eps, TYPES[out.dtype], out.data_ptr(), pool.threads())
    return out


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """F.layer_norm over x's last axis, in x's type: the statistics in f32, the weight and bias (each
    optional, of one type) applied there, one rounding. x's rows may lie apart (a view); its last
    axis is dense."""
    d = x.shape[-1]
    rows = dense_rows(x, d)
    weight, bias = (None if t is None else t.contiguous() for t in (weight, bias))
    w_type = TYPES[(weight if weight is not None else bias if bias is not None else x).dtype]
    out = _empty(x, x.dtype)
    call("layer_norm", TYPES[x.dtype], rows.data_ptr(), rows.stride(0), rows.shape[0], d, w_type,
         None if weight is None else weight.data_ptr(), None if bias is None else bias.data_ptr(), eps,
         out.data_ptr(), pool.threads())
    return out


def rope(x: torch.Tensor, positions: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """x [n, heads, head_dim] rotated at each token's position by `table` [rows, 2, head_dim / 2]
    f32 (`runtime.rope_table`), in x's type. x may be a view whose tokens and heads lie apart
    (the q, k or v columns of a fused matmul's output)."""
    n, heads, head_dim = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    positions = as_int32(positions)
    table = table.contiguous()
    out = torch.empty(n, heads, head_dim, dtype=x.dtype)
    call("rope", TYPES[x.dtype], x.data_ptr(), n, heads, head_dim, x.stride(0), x.stride(1), positions.data_ptr(),
         table.data_ptr(), table.shape[0], out.data_ptr(), pool.threads())
    return out


def put_rows(state: torch.Tensor, index: tuple, value: torch.Tensor) -> bool:
    """state[index] = value in place, entries with an index outside `state` writing nothing (the
    runtime's `put_`), where index is ints then one or two 1-D index tensors (a cache write:
    layer, row, position), state is contiguous and value is [n, the axes after them]. Returns
    False, having written nothing, for any other index."""
    w = row_write(state, index, value)
    if w is None:
        return False
    if w.n == 0 or w.block == 0:
        return True
    a, b = as_int32(w.a), None if w.b is None else as_int32(w.b)
    rows = dense_rows(value, w.block)
    call("put_rows", TYPES[state.dtype], state.data_ptr(), w.offset, a.data_ptr(), w.a_stride, w.a_limit,
         None if b is None else b.data_ptr(), w.b_stride, w.b_limit, w.n, TYPES[value.dtype],
         rows.data_ptr(), rows.stride(0), w.block, pool.threads())
    return True


def silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b for a and b of one shape and type, silu(a) rounded to their type first (as
    `F.silu(a) * b`). Their rows may lie apart (the gate and up columns of a fused matmul's output):
    read where they are, where torch would copy the view first."""
    return _rowwise(OP_SILU_MUL, a, b)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh form of x in f32, rounded once to x's type (as F.gelu(x, approximate="tanh")).
    x's rows may lie apart; its last axis is dense."""
    return _rowwise(OP_GELU_TANH, x, x)


def _rowwise(op: int, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`linnet_elementwise`'s op over a and b of one shape (b is a again for a unary op), into a new
    dense tensor of a's type; each may be a view whose rows lie apart, its last axis dense."""
    n = a.shape[-1]
    rows_a = dense_rows(a, n)
    rows_b = rows_a if b is a else dense_rows(b, n)  # (a unary op's one copy, where its rows are not dense)
    out = torch.empty(a.shape, dtype=a.dtype)
    call("elementwise", op, TYPES[a.dtype], rows_a.data_ptr(), rows_a.stride(0), TYPES[b.dtype],
         rows_b.data_ptr(), rows_b.stride(0), TYPES[out.dtype], out.data_ptr(), n, rows_a.shape[0], n, pool.threads())
    return out


def gather_rows(table: torch.Tensor, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """table[ids] in `dtype` for a dense 2-D table and 1-D ids (an embedding's rows), an id outside
    the table giving a row of zeros (a padding token's position past a learned position table)."""
    ids = as_int32(ids)
    out = torch.empty(ids.shape[0], table.shape[1], dtype=dtype)
    call("gather_rows", TYPES[table.dtype], table.data_ptr(), table.shape[0], table.shape[1], ids.data_ptr(),
         ids.shape[0], TYPES[dtype], out.data_ptr(), pool.threads())
    return out


def _empty(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A dense tensor of like's shape: empty_like, when it can, takes a third of torch.empty's time."""
    if dtype == like.dtype and like.is_contiguous():
        return torch.empty_like(like)
    return torch.empty(like.shape, dtype=dtype)


def as_int32(t: torch.Tensor) -> torch.Tensor:
    """t as a dense i32 tensor, as the kernels read index arrays (itself when it is one)."""
    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()


def library() -> ctypes.CDLL | None:
    return build.cpu_kernels()
