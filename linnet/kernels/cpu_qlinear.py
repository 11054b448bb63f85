"""The CPU matmul for a GGUF's quantized linear weights, run in their blocks (`cpu_qlinear.c`, built
into `cpu_linear`'s library).

`pack` repacks a weight's Q8_0 or Q4_1 blocks, as the file holds them ([N, K / 32] blocks), into
panels of 16 rows, block after block along K (the layout cpu_qlinear.c describes): the same bytes,
rearranged once at load; `QuantBlocks.packed` does so for a param, a weight a layer. `matmul` multiplies them, each block decoded in registers, in f32
arithmetic; x f32 or bf16, the output in x's type. `QuantWeight.join` lists several weights'
panels as one (a fused group: q, k and v; gate and up), as `PanelWeight.join` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from linnet.kernels import cpu_linear, pool
from linnet.kernels.cpu_graph import call
from linnet.kernels.cpu_linear import PanelTable, _table, joined_table
from linnet.kernels.panels import PANEL
from linnet.kernels.torch_types import TYPES

BLOCK = 32  # values a block holds along K
# the block types the kernel takes, by GGML's type codes (gguf's GGMLQuantizationType, not imported: a
# torch model's runtime imports this module), and the bytes of one block of each
READS = {8: "Q8_0", 3: "Q4_1"}
BLOCK_BYTES = {8: 34, 3: 20}
HALVES = {8: (0,), 3: (0, 2)}  # where in a block its f16 scales (and minimums) lie


class QuantWeight:
    """A quantized linear weight [N, K] laid out for `matmul` (or several of one K and block type whose
    outputs sit side by side: `join`). `table` lists every panel's address, width and output column;
    `buffers` keeps the memory behind them alive."""

    __slots__ = ("n", "k", "qtype", "buffers", "table", "panel_args")

    def __init__(self, n: int, k: int, qtype: int, buffers: tuple, table: PanelTable):
        self.n, self.k, self.qtype, self.buffers, self.table = n, k, qtype, buffers, table
        self.panel_args = (k, table.count, table.panels, table.cols, table.widths)  # as linnet_qlinear takes them

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)

    @staticmethod
    def join(weights) -> "QuantWeight":
        """The weights' panels as one: their outputs side by side, in the order given."""
        first = weights[0]
        if any(w.k != first.k or w.qtype != first.qtype for w in weights):
            raise ValueError(f"joined weights share K and block type: {weights}")
        return QuantWeight(*joined_table(weights, first.k, first.qtype))

    def __repr__(self) -> str:
        return f"QuantWeight([{self.n}, {self.k}], {READS[self.qtype]})"


@dataclass
class QuantBlocks:
    """A param [*layers, N, K] as a GGUF's blocks (`nest.quantized`): `layers` holds each layer's [N, row
    bytes] uint8 (one for an unstacked param), rows in the param's order (rope's rows unpermuted already)."""

    qtype: object  # gguf's GGMLQuantizationType
    shape: tuple
    layers: list

    @property
    def k(self) -> int:
        return self.shape[-1]

    def dequantized(self, dtype):
        """The param as a torch tensor of `dtype`, decoded as `GGUFCheckpoint.load` decodes."""
        from linnet.nest.checkpoint import dequantize

        out = torch.empty(self.shape, dtype=dtype)
        flat = out.reshape(-1, *self.shape[-2:])
        for i, rows in enumerate(self.layers):
            flat[i] = torch.from_numpy(dequantize(rows, self.qtype).reshape(self.shape[-2:]))
        return out

    def packed(self):
        """The param for `matmul`: a QuantWeight, or a list of them, one a layer."""
        weights = [pack(rows, self.qtype, self.shape[-2], self.k) for rows in self.layers]
        return weights if len(self.shape) == 3 else weights[0]


def takes(qtype, k: int) -> bool:
    """Whether `pack` / `matmul` serve weights of this block type and K here."""
    return qtype in READS and k % BLOCK == 0 and cpu_linear.library() is not None


def pack(blocks: np.ndarray, qtype, n: int, k: int) -> QuantWeight:
    """A weight [n, k] from its GGUF blocks (uint8, n * k / 32 blocks in the file's row order, any
    shape holding them), repacked into panels of 16 rows (a copy; the last panel's missing rows zero)."""
    if not takes(qtype, k):
        name = getattr(qtype, "name", f"type {qtype}")
        raise ValueError(f"the quantized CPU linear takes {' and '.join(READS.values())} blocks with K a multiple "
                         f"of {BLOCK} where Linnet's CPU kernels run; not {name} with K = {k}")
    qtype, size = int(qtype), BLOCK_BYTES[int(qtype)]
    rows = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(n, k // BLOCK, size)
    panels = -(-n // PANEL)
    if panels * PANEL != n:
        rows = np.concatenate([rows, np.zeros((panels * PANEL - n, k // BLOCK, size), np.uint8)])
    rows = rows.reshape(panels, PANEL, k // BLOCK, size).transpose(0, 2, 1, 3)  # [panel, block, row, bytes]
    if READS[qtype] == "Q8_0":  # d, then each k's 16 rows
        parts = [rows[..., 0:2], rows[..., 2:34].transpose(0, 1, 3, 2)]
    else:  # d, m, then each byte's 16 rows (k and k + 16 in its nibbles)
        parts = [rows[..., 0:2], rows[..., 2:4], rows[..., 4:20].transpose(0, 1, 3, 2)]
    packed = np.concatenate([p.reshape(panels, k // BLOCK, -1) for p in parts], axis=2)
    body = torch.from_numpy(np.ascontiguousarray(packed))
    step = body[0].numel()
    widths = [min(PANEL, n - p * PANEL) for p in range(panels)]
    return QuantWeight(n, k, qtype, (body,), _table([body.data_ptr() + p * step for p in range(panels)], widths,
                                                    range(0, n, PANEL)))


def matmul(x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ w.T (+ bias): f32 sums of the decoded blocks times x (a bf16 x widened, exactly),
    rounded once to x's type."""
    rows = x if x.dim() == 2 else x.reshape(-1, w.k)
    if rows.dtype not in (torch.float32, torch.bfloat16):
        rows = rows.float()
    if not rows.is_contiguous():
        rows = rows.contiguous()
    out_type = x.dtype if bias is None and x.dtype in TYPES else torch.float32
    out = torch.empty(rows.shape[0], w.n, dtype=out_type)
    status = call("qlinear", w.qtype, TYPES[rows.dtype], rows.data_ptr(), rows.shape[0], *w.panel_args,
                  TYPES[out_type], out.data_ptr(), w.n, pool.threads())
    if status:
        raise MemoryError(f"no memory for x's {rows.shape[0]} x {w.k} f32 copy or its block sums")
    if bias is not None:
        out += bias.to(out.dtype)
    if x.dim() != 2:
        out = out.reshape(*x.shape[:-1], w.n)
    return out if out.dtype == x.dtype else out.to(x.dtype)
