"""The small ops of a torch pass on a GPU, one Triton kernel each where torch's eager ops take
several: RMSNorm (torch's fused norm, then the weight: 2 kernels), rotary embedding (two products,
a roll and the rounding: 4), the cache write with its indices outside dropped (gather, select,
scatter: 3) and a gated MLP's silu(gate) * up (2). A Llama decode step launches about 22 such
kernels a layer, each a few microseconds even replayed from a CUDA graph (2.1 ms of a 64-row
Llama 3.1 8B step's 9.7 on an H200); with these, 9. In a packed pass they also leave out the
copies between torch's ops. Whether a GPU's passes take them is timed there (`serve.kernel_choice`).

The GPU's counterpart of `cpu_ops`: each function takes what the runtime's reference takes and
gives its values, rounded where it rounds (up to the order of f32 operations); `serves` is the one
check of whether it may. Not under torch.compile, whose Inductor fuses the same ops itself.
Under Triton's interpreter (TRITON_INTERPRET=1, the CPU: the tests) the kernels run on CPU tensors.
"""

from __future__ import annotations

import torch

from linnet.kernels.row_writes import dense_rows, row_write

try:
    import triton
    import triton.language as tl
except ImportError:  # (torch's CPU builds come without it)
    triton = None

TYPES = (torch.float32, torch.bfloat16, torch.float16)
WRITE_BLOCK = 1024  # elements a program of the cache write copies


def available() -> bool:
    return triton is not None


def serves(*tensors: torch.Tensor) -> bool:
    """Whether these tensors are ones the kernels take: of a type they read, on one GPU, outside a
    torch.compile trace."""
    return (not torch.compiler.is_compiling() and all(t.dtype in TYPES for t in tensors)
            and all(t.device == tensors[0].device for t in tensors))


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * round(x * rsqrt(mean(x^2) + eps)) over x's last axis, x rounded to its own type
    before the weight multiplies it (the runtime's `rmsnorm`). x's rows may lie apart (a view);
    its last axis and the weight are dense."""
    d = x.shape[-1]
    rows = dense_rows(x, d)
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    block = triton.next_power_of_2(d)
    _rmsnorm[(rows.shape[0],)](rows, weight.contiguous(), out, rows.stride(0), d, eps, BLOCK=block,
                               num_warps=min(16, max(4, block // 512)))
    return out


def rope(x: torch.Tensor, positions: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """x [n, heads, head_dim] rotated at each token's position by `table` [rows, 2, head_dim / 2]
    f32 (`runtime.rope_table`), in x's type: [x1 cos - x2 sin, x2 cos + x1 sin] of x's halves.
    x may be a view whose tokens and heads lie apart (the q or k columns of a fused matmul's
    output). A position past the table (padding) takes its last row."""
    n, heads, head_dim = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(n, heads, head_dim, dtype=x.dtype, device=x.device)
    half = head_dim // 2
    _rope[(n,)](x, positions.contiguous(), table.contiguous(), out, x.stride(0), x.stride(1), heads, half,
                table.shape[0], BLOCK_H=triton.next_power_of_2(heads), BLOCK_HALF=triton.next_power_of_2(half))
    return out


def silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b for a and b of one shape, silu(a) rounded to a's type first (as `F.silu(a) * b`).
    Their rows may lie apart (the gate and up columns of a fused matmul's output)."""
    n = a.shape[-1]
    rows_a, rows_b = dense_rows(a, n), dense_rows(b, n)
    out = torch.empty(a.shape, dtype=torch.promote_types(a.dtype, b.dtype), device=a.device)
    grid = (rows_a.shape[0], triton.cdiv(n, WRITE_BLOCK))
    _silu_mul[grid](rows_a, rows_b, out, rows_a.stride(0), rows_b.stride(0), n, BLOCK=WRITE_BLOCK)
    return out


def put_rows(state: torch.Tensor, index: tuple, value: torch.Tensor) -> bool:
    """state[index] = value in place, entries with an index outside `state` writing nothing (the
    runtime's `put_`), where index is ints then one or two 1-D index tensors (a cache write:
    layer, row, position), state is contiguous and value is [n, the axes after them]. Returns
    False, having written nothing, for any other index. value's rows may lie apart (the v
    columns of a fused matmul's output)."""
    w = row_write(state, index, value)
    if w is None or w.n == 0 or w.block == 0:
        return w is not None
    rows = dense_rows(value, w.block)
    b = w.a if w.b is None else w.b.contiguous()  # (never read without one)
    grid = (w.n, triton.cdiv(w.block, WRITE_BLOCK))
    _put_rows[grid](state, w.offset, w.a.contiguous(), w.a_stride, w.a_limit, b, w.b_stride, w.b_limit,
                    rows, rows.stride(0), w.block, HAS_B=w.b is not None, BLOCK=WRITE_BLOCK)
    return True


if triton is not None:
    @triton.jit
    def _rmsnorm(x_ptr, w_ptr, out_ptr, stride_x, dim, eps, BLOCK: tl.constexpr):
        """One program: one row."""
        row = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, BLOCK)
        ok = c < dim
        x = tl.load(x_ptr + row * stride_x + c, mask=ok, other=0.0).to(tl.float32)
        scale = tl.rsqrt(tl.sum(x * x, 0) / dim + eps)
        y = (x * scale).to(x_ptr.dtype.element_ty).to(tl.float32)  # rounded to x's type, as the reference
        w = tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * dim + c, (y * w).to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def _rope(x_ptr, pos_ptr, table_ptr, out_ptr, stride_xn, stride_xh, heads, half, table_rows,
              BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
        """One program: one token, all its heads."""
        i = tl.program_id(0).to(tl.int64)
        p = tl.minimum(tl.load(pos_ptr + i).to(tl.int64), table_rows - 1)
        h = tl.arange(0, BLOCK_H)[:, None]
        j = tl.arange(0, BLOCK_HALF)[None, :]
        ok = (h < heads) & (j < half)
        cos = tl.load(table_ptr + p * 2 * half + j, mask=j < half, other=0.0)
        sin = tl.load(table_ptr + (p * 2 + 1) * half + j, mask=j < half, other=0.0)
        at = x_ptr + i * stride_xn + h * stride_xh + j
        x1 = tl.load(at, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(at + half, mask=ok, other=0.0).to(tl.float32)
        to = out_ptr + (i * heads + h) * 2 * half + j
        tl.store(to, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=ok)
        tl.store(to + half, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def _silu_mul(a_ptr, b_ptr, out_ptr, stride_a, stride_b, n, BLOCK: tl.constexpr):
        """One program: a BLOCK of one row."""
        row = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = c < n
        x = tl.load(a_ptr + row * stride_a + c, mask=ok, other=0.0).to(tl.float32)
        silu = (x / (1.0 + tl.exp(-x))).to(a_ptr.dtype.element_ty).to(tl.float32)
        y = tl.load(b_ptr + row * stride_b + c, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * n + c, (silu * y).to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def _put_rows(state_ptr, offset, a_ptr, a_stride, a_limit, b_ptr, b_stride, b_limit, value_ptr, stride_v,
                  block, HAS_B: tl.constexpr, BLOCK: tl.constexpr):
        """One program: one entry's value, a BLOCK of it."""
        i = tl.program_id(0).to(tl.int64)
        a = tl.load(a_ptr + i).to(tl.int64)
        inside = (a >= 0) & (a < a_limit)
        at = offset + a * a_stride
        if HAS_B:
            b = tl.load(b_ptr + i).to(tl.int64)
            inside = inside & (b >= 0) & (b < b_limit)
            at += b * b_stride
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = c < tl.where(inside, block, 0)  # an entry outside: nothing
        v = tl.load(value_ptr + i * stride_v + c, mask=ok, other=0.0)
        tl.store(state_ptr + at + c, v.to(state_ptr.dtype.element_ty), mask=ok)
