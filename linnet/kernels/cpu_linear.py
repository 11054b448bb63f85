"""The CPU matmul for linear weights: `cpu_linear.c`, built once with the system C compiler and
called through ctypes.

A weight packed by `pack` (panels of 16 output columns, K-major, f32, bf16 or f16; in its own
memory when the caller gives it up) is multiplied by `matmul` in f32 arithmetic. SmolLM2-135M's
linears (2-core AVX2 EPYC), against oneDNN's prepacked f32: one row 22.0 against 30.1 ms, a
16-row decode step's 36.2 against 51.0, a 512-token prefill's 863 against 913; bf16 panels read
half the bytes, so one row takes 12.5. With AVX-512 BF16, a bf16 weight of even K is packed in
pairs of K (`pairs`) and multiplied in bf16 by VDPBF16PS, at twice f32's rate over many rows;
with AMX (`isa()`), those pairs are AMX's own operand, and at any row count (K a multiple of
32) 16 x 16 tiles multiply them: a 368-token pass's [368, 576] x [576, 1536] in 0.29 ms against
VDPBF16PS's 3.4 (2-core Xeon; oneDNN's AMX kernel 0.34).

Each row's result is bitwise the same whatever other rows x holds (batch invariance): every
path sums an output over K in one order at every row count (docs/design.md, Numerics).

`available()` is the one check: `build.runs_here()` (an AVX2 CPU, LINNET_CPU_KERNELS not 0) and
a C compiler with OpenMP. Where it fails the runtime keeps oneDNN's and MKL's kernels. The OpenMP
runtime is the one torch loaded (libgomp, by soname), so both share its threads.
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import torch

from linnet.kernels import build, pool
from linnet.kernels.torch_types import TYPES
from linnet.kernels.cpu_graph import call
from linnet.kernels.pages import back_with_huge_pages_later
from linnet.kernels.panels import PANEL, arranged



class PanelWeight:
    """Linear weights laid out for `matmul`: one [N, K] weight, or several of one K and type whose
    outputs sit side by side (`join`: a fused group, run in one call).

    Each weight's first N // 16 * 16 rows are panels in its own memory (K rows of 16 columns);
    its last N % 16 rows, if any, are one zero-padded panel of their own. `table` lists every
    panel's address, width and output column, as the kernel walks them; `buffers` keeps the
    memory behind those addresses alive.
    """

    __slots__ = ("n", "k", "dtype", "buffers", "table", "type_code", "panel_args")

    def __init__(self, n: int, k: int, dtype: torch.dtype, buffers: tuple, table: "PanelTable"):
        self.n, self.k, self.dtype, self.buffers, self.table = n, k, dtype, buffers, table
        self.type_code = TYPES[dtype]
        self.panel_args = (k, table.count, table.panels, table.cols, table.widths)  # as linnet_linear takes them

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)

    @staticmethod
    def join(weights) -> "PanelWeight":
        """The weights' panels as one: their outputs side by side, in the order given."""
        first = weights[0]
        if any(w.k != first.k or w.dtype != first.dtype for w in weights):
            raise ValueError(f"joined weights share K and type: {weights}")
        return PanelWeight(*joined_table(weights, first.k, first.dtype))

    def __repr__(self) -> str:
        return f"PanelWeight([{self.n}, {self.k}], {self.dtype})"


class PanelTable(NamedTuple):
    """What the kernel walks: `count` panels' addresses, widths and output columns, as the C arrays
    in `arrays` (kept alive here) and their addresses."""

    count: int
    panels: int
    widths: int
    cols: int
    arrays: tuple


def joined_table(weights, *kind) -> tuple:
    """Packed weights (`PanelWeight`s, or `cpu_qlinear.QuantWeight`s) as one weight's arguments: their N
    summed, `kind` (K and the type), their buffers, and one table of their panels, outputs side by side."""
    addresses, widths, cols, start = [], [], [], 0
    for w in weights:
        addresses.extend(w.table.arrays[0])
        widths.extend(w.table.arrays[1])
        cols.extend(c + start for c in w.table.arrays[2])
        start += w.n
    return (start, *kind, sum((w.buffers for w in weights), ()), _table(addresses, widths, cols))


def _table(addresses, widths, cols) -> PanelTable:
    count = len(addresses)
    arrays = ((ctypes.c_void_p * count)(*addresses), (ctypes.c_int * count)(*widths), (ctypes.c_long * count)(*cols))
    return PanelTable(count, *(ctypes.addressof(a) for a in arrays), arrays)


def _pack_panels(w: torch.Tensor, rows: int, k: int) -> None:
    """The first `rows` rows (whole panels) of w's memory, [rows, k], rearranged into panels in place."""
    if library().linnet_pack_panels(TYPES[w.dtype], w.data_ptr(), rows, k, pool.threads()):
        raise MemoryError(f"no memory for a {PANEL} x {k} block to pack a linear weight with")


def pack(w: torch.Tensor, in_place: bool = False) -> PanelWeight:
    """w [N, K] (f32, bf16 or f16, on the CPU) in panels of 16 of its rows, each laid out K-major.

    `in_place` rearranges w's own memory (no copy: the caller gives the tensor up, as a model
    loaded by `nest.load` does); otherwise the panels are a copy and w is left as it was."""
    n, k = w.shape
    full = n // PANEL * PANEL
    body = w[:full] if in_place and w.is_contiguous() else w[:full].clone(memory_format=torch.contiguous_format)
    if full:
        _pack_panels(body, full, k)
    back_with_huge_pages_later(body, body.data_ptr(), body.nbytes)  # a decode step streams through it (`pages`)
    buffers, addresses = [body], [body.data_ptr() + p * k * PANEL * w.element_size() for p in range(full // PANEL)]
    if full < n:
        tail = w.new_zeros(k, PANEL)
        tail[:, :n - full] = w[full:].T
        tail = arranged(tail, w.dtype, pairs(w.dtype, k)).contiguous()
        buffers.append(tail)
        addresses.append(tail.data_ptr())
    widths = [PANEL] * (full // PANEL) + ([n - full] if full < n else [])
    return PanelWeight(n, k, w.dtype, tuple(buffers), _table(addresses, widths, range(0, n, PANEL)))


def pack_layers(w: torch.Tensor, in_place: bool = False) -> list:
    """A stacked weight w [layers, N, K] as `pack` packs each layer, a PanelWeight a layer.

    Where N is whole panels and w is given up (`in_place`), the layers' panels are packed in one
    call: a layer's panels are N // 16 consecutive blocks of 16 rows, so [layers * N, K] packed at
    once is every layer packed apart, in the same memory. One thread team a weight, not one a
    layer: each team waited for a busy core (SmolLM2's 210 layer packs, 1.1 s here)."""
    layers, n, k = w.shape
    whole = in_place and w.is_contiguous() and layers > 1  # the layers' panels end to end in w's memory
    if whole and n % PANEL == 0:
        _pack_panels(w, layers * n, k)
        step = PANEL * k * w.element_size()
        packed = [PanelWeight(n, k, w.dtype, (layer,), _table([layer.data_ptr() + p * step for p in range(n // PANEL)],
                                                               [PANEL] * (n // PANEL), range(0, n, PANEL)))
                  for layer in w]
    else:
        packed = [pack(layer, in_place) for layer in w]
    if whole:  # the whole weight, not each layer: a layer alone may fill no 2 MB page (SmolLM2's bf16 ones)
        back_with_huge_pages_later(w, w.data_ptr(), w.nbytes)  # a decode step streams through it (`pages`)
    return packed


def matmul(x: torch.Tensor, w: PanelWeight, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [..., K] @ w.T (+ bias): f32 sums, rounded once to x's dtype (or `out_dtype`: f32 keeps them as
    they are), as a native bf16 kernel accumulating in f32 would. The products are f32's (a bf16 x is
    widened, exactly), or, for a weight in pairs (`pairs`), bf16's: x rounded to bf16, which a bf16
    model's activations are."""
    rows, out, dtype = matmul_operands(x, w.k, w.n, bias, out_dtype)
    if call("linear", w.type_code, TYPES[rows.dtype], rows.data_ptr(), rows.shape[0], *w.panel_args,
            TYPES[out.dtype], out.data_ptr(), w.n, pool.threads()):
        raise MemoryError(f"no memory for x's {rows.shape[0]} x {w.k} copy, f32 sums, or a {w.k} x {PANEL} f32 "
                          f"panel to widen {w.dtype} weights into")
    return matmul_result(out, x, w.n, bias, dtype)


def matmul_operands(x: torch.Tensor, k: int, n: int, bias: torch.Tensor | None, out_dtype: torch.dtype | None):
    """For a kernel's matmul (this one's, `cpu_qlinear`'s): x's rows [M, K] as the kernel reads them (f32
    or bf16, contiguous), the output [M, N] it writes, and the result's type (x's, or `out_dtype`). The
    kernel rounds its f32 sums to that type as it writes them, unless a bias is still to be added."""
    rows = x if x.dim() == 2 else x.reshape(-1, k)
    if rows.dtype not in _READS:
        rows = rows.float()
    if not rows.is_contiguous():
        rows = rows.contiguous()
    dtype = out_dtype or x.dtype
    out_type = dtype if bias is None and dtype in TYPES else torch.float32
    return rows, torch.empty(rows.shape[0], n, dtype=out_type), dtype


def matmul_result(out: torch.Tensor, x: torch.Tensor, n: int, bias: torch.Tensor | None,
                  dtype: torch.dtype) -> torch.Tensor:
    """A kernel's output (`matmul_operands`) plus the bias, in x's leading shape and `dtype`."""
    if bias is not None:
        out += bias.to(out.dtype)  # (a bf16 model's bias, widened: the sums stay f32 until rounded once)
    if x.dim() != 2:
        out = out.reshape(*x.shape[:-1], n)
    return out if out.dtype == dtype else out.to(dtype)


_READS = (torch.float32, torch.bfloat16)  # x's types the kernel reads as they are


def pairs(dtype: torch.dtype, k: int) -> bool:
    """Whether a weight of this type and K is packed in pairs of K here (cpu_linear.c: AVX-512 BF16,
    bf16, K even), which the kernel multiplies in bf16 at twice f32's rate."""
    return bool(library().linnet_panel_pairs(TYPES[dtype], k))


def isa() -> str | None:
    """The instruction sets the kernels take here (kernels.h's `linnet_isa`), as `build.ISA_CAPS`
    names them: "amx" where bf16 weights in pairs are multiplied with AMX tiles (an AMX-BF16 CPU
    whose OS lets this process use the tile registers; K a multiple of 32),
    "avx512_bf16" where in pairs by VDPBF16PS, ...; None without the kernels."""
    lib = library()
    level = lib.linnet_isa() if lib is not None else 0
    return build.ISA_CAPS[level - 1] if level else None


def available(dtype: torch.dtype) -> bool:
    """Whether `pack` / `matmul` serve this weight type here: the one check (see the module's doc)."""
    return dtype in TYPES and library() is not None


def library() -> ctypes.CDLL | None:
    return build.cpu_kernels()
