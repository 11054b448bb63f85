"""The CPU matmul for a GGUF's quantized linear weights, run in their blocks (`cpu_qlinear.c`, built
into `cpu_linear`'s library).

`pack` repacks a weight's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL or IQ4_XS blocks, as the file
holds them ([N, K / 32] blocks, or [N, K / 256] super-blocks), into panels of 16 rows, block of 32 after block along
K (the layout cpu_qlinear.c describes), once at load: Q8_0's and Q4_1's bytes rearranged, Q4_0's as a Q4_K
sub-block's (d and -8 d as f32), Q5_1's as a Q5_K one's (d and m as f32), IQ4_NL's indices into its table as they
are (the kernel looks them up) with d as f32, IQ4_XS's as IQ4_NL's, a K-quant's sub-blocks each given its f32 scale
(and minimum) worked out exactly, 5-bit quants as nibbles and a plane of fifth bits (`_fifth_bit_plane`), 3- and
6-bit ones as int8 (Q3_K's in Q6_K's panels); `QuantBlocks.packed` does so for a param, a weight a layer. `matmul`
multiplies them, each block decoded in registers, in f32 arithmetic; x f32 or bf16, the output in x's type (or f32).
`QuantWeight.join` lists several weights' panels as one (a fused group: q, k and v; gate and up), as
`PanelWeight.join` does. `gather` decodes rows of one weight's panels (an embedding's, `QuantTable`, read from the
head tied to it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from linnet.kernels import build, cpu_linear, pool
from linnet.kernels.cpu_graph import call
from linnet.kernels.cpu_ops import as_int32
from linnet.kernels.pages import aligned_empty, back_with_huge_pages_later
from linnet.kernels.cpu_linear import PanelTable, _table, joined_table, matmul_operands, matmul_result
from linnet.kernels.panels import PANEL
from linnet.kernels.torch_types import TYPES

BLOCK = 32  # values a panel's block holds along K
# the block types the kernel takes, by GGML's type codes (gguf's GGMLQuantizationType, not imported: a
# torch model's runtime imports this module), the values (along K) and bytes of one block of each
READS = {2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K",
         20: "IQ4_NL", 23: "IQ4_XS"}
BLOCK_VALUES = {2: 32, 3: 32, 6: 32, 7: 32, 8: 32, 11: 256, 12: 256, 13: 256, 14: 256, 20: 32, 23: 256}
BLOCK_BYTES = {2: 18, 3: 20, 6: 22, 7: 24, 8: 34, 11: 110, 12: 144, 13: 176, 14: 210, 20: 18, 23: 136}
HALVES = {2: (0,), 3: (0, 2), 6: (0,), 7: (0, 2), 8: (0,), 11: (108,), 12: (0, 2), 13: (0, 2), 14: (208,), 20: (0,),
          23: (0,)}  # its f16 d, m, dmin
# the type a weight's panels are in, where it is not the file's: Q5_1's d q + m is a Q5_K sub-block's (d and m as
# f32), Q4_0's d (q - 8) a Q4_K sub-block's d q + m with m = -8 d (f32: exact, where an f16 m, Q4_1's, overflows
# from d = 8188); Q3_K's d (sc - 32) q, a scale a 16 values, a Q6_K block's; IQ4_XS's d (sc - 32) table[i], a scale
# a 32 values, an IQ4_NL block's d table[i] (its d f32 in the panel, as IQ4_NL's is)
PANEL_TYPES = {7: 13, 2: 12, 11: 14, 23: 20}
FIFTH_BITS = (6, 13)  # the panel types whose 5-bit quants are nibbles and a plane of fifth bits: Q5_0's, Q5_K's


class QuantWeight:
    """A quantized linear weight [N, K] laid out for `matmul` (or several of one K and block type whose
    outputs sit side by side: `join`). `qtype` is the type its panels are in (`PANEL_TYPES`: a Q5_1
    weight's are Q5_K's, and join a Q5_K one's; a Q4_0 weight's Q4_K's; a Q5_0 one's its own); `table`
    lists every panel's address, width and output column; `buffers` keeps the memory behind them alive."""

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


class QuantTable(NamedTuple):
    """An embedding's table [N, K] of `dtype` (the param's type) read from the panels of the head tied to it
    (`gather`): its rows decoded only when gathered, where a decoded copy of the table would be kept."""

    weight: QuantWeight
    dtype: torch.dtype


@dataclass
class QuantBlocks:
    """A param [*layers, N, K] as a GGUF's blocks (`nest.quantized`): `layers` holds each layer's [N, row
    bytes] uint8 (one for an unstacked param), rows in the param's order (rope's rows unpermuted already),
    and `types` each layer's block type (gguf's GGMLQuantizationType): a Q4_K_M file's attn_v is Q6_K in
    some layers and Q4_K in the others, and each layer runs in its own."""

    types: tuple
    shape: tuple
    layers: list

    @property
    def k(self) -> int:
        return self.shape[-1]

    def runs(self) -> bool:
        """Whether `matmul` takes every layer's blocks here (`takes`)."""
        return all(takes(qtype, self.k) for qtype in self.types)

    def dequantized(self, dtype):
        """The param as a torch tensor of `dtype`, decoded as `GGUFCheckpoint.load` decodes."""
        from linnet.nest.checkpoint import dequantize

        out = torch.empty(self.shape, dtype=dtype)
        flat = out.reshape(-1, *self.shape[-2:])
        for i, (rows, qtype) in enumerate(zip(self.layers, self.types)):
            flat[i] = torch.from_numpy(dequantize(rows, qtype).reshape(self.shape[-2:]))
        return out

    def packed(self):
        """The param for `matmul`: a QuantWeight, or a list of them, one a layer (each in its layer's type),
        all its layers' panels in one buffer on huge pages (`pages`): a decode step streams through them, and a
        layer's alone may fill no 2 MB page (SmolLM2's are under 1 MB)."""
        n, k = self.shape[-2], self.k
        ends = np.cumsum([0] + [panel_bytes(qtype, n, k) for qtype in self.types])
        whole = aligned_empty((int(ends[-1]),), np.uint8)
        weights = [pack(rows, qtype, n, k, into=whole[ends[i]:ends[i + 1]])
                   for i, (rows, qtype) in enumerate(zip(self.layers, self.types))]
        back_with_huge_pages_later(whole, whole.ctypes.data, whole.nbytes)
        return weights if len(self.shape) == 3 else weights[0]


def takes(qtype, k: int) -> bool:
    """Whether `pack` / `matmul` serve weights of this block type and K here."""
    return qtype in READS and k % BLOCK_VALUES[int(qtype)] == 0 and cpu_linear.library() is not None


def panel_bytes(qtype, n: int, k: int) -> int:
    """The bytes of a weight [n, k]'s panels from blocks of `qtype` (`pack`'s `into`)."""
    form = PANEL_TYPES.get(int(qtype), int(qtype))
    return -(-n // PANEL) * (k // BLOCK) * build.cpu_kernels().linnet_qpanel_block_bytes(form)


def pack(blocks: np.ndarray, qtype, n: int, k: int, into: np.ndarray | None = None) -> QuantWeight:
    """A weight [n, k] from its GGUF blocks (uint8, in the file's row order, any shape holding them),
    repacked into panels of 16 rows (a copy, into `into` where given: uint8 of `panel_bytes`; the last
    panel's missing rows zero)."""
    if not takes(qtype, k):
        name = getattr(qtype, "name", f"type {qtype}")
        kinds = ", ".join(f"{t} (K a multiple of {BLOCK_VALUES[c]})" for c, t in READS.items())
        raise ValueError(f"the quantized CPU linear takes {kinds} blocks where Linnet's CPU kernels run; "
                         f"not {name} with K = {k}")
    qtype = int(qtype)
    rows = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(n, k // BLOCK_VALUES[qtype], BLOCK_BYTES[qtype])
    scales, quants = _panel_fields(READS[qtype], rows, n, k)
    panels = -(-n // PANEL)
    fifth = None
    if PANEL_TYPES.get(qtype, qtype) in FIFTH_BITS:  # 5-bit quants: nibbles as Q4_1's, a plane of fifth bits after
        quants, fifth = (quants[..., :16] & 15) | (quants[..., 16:] << 4), quants >> 4
    fields = []
    for f, is_quants in [(f, False) for f in scales] + [(quants, True)]:
        f = np.ascontiguousarray(f).view(np.uint8).reshape(n, k // BLOCK, -1)
        if panels * PANEL != n:
            f = np.concatenate([f, np.zeros((panels * PANEL - n, *f.shape[1:]), np.uint8)])
        f = f.reshape(panels, PANEL, k // BLOCK, -1).transpose(0, 2, 1, 3)  # [panel, block, row, bytes]
        if is_quants:  # a line of the 16 rows' bytes for each byte of the block
            f = f.transpose(0, 1, 3, 2)
        fields.append(f.reshape(panels, k // BLOCK, -1))
    if fifth is not None:
        fields.append(_fifth_bit_plane(fifth, n, panels, k))
    shape = (panels, k // BLOCK, sum(f.shape[2] for f in fields))
    body = torch.from_numpy(np.concatenate(fields, axis=2, out=np.empty(shape, np.uint8) if into is None else
                                           into.reshape(shape)))
    step = body[0].numel()
    widths = [min(PANEL, n - p * PANEL) for p in range(panels)]
    table = _table([body.data_ptr() + p * step for p in range(panels)], widths, range(0, n, PANEL))
    return QuantWeight(n, k, PANEL_TYPES.get(qtype, qtype), (body,), table)


def _panel_fields(kind: str, rows: np.ndarray, n: int, k: int) -> tuple:
    """A weight's blocks [n, blocks, bytes] as a panel block holds them, for each block of 32 along K: its scales (and
    minimums) [n, k / 32, ...] one array each, and its quants [n, k / 32, bytes] (cpu_qlinear.c's layout before the
    16 rows are put side by side). Q8_0's and Q4_1's are the file's own bytes, Q5_0's q (0 .. 31, a byte each) with
    its f16 d, Q5_1's with d and m as f32 (a Q5_K sub-block; `pack` splits 5-bit quants into nibbles and fifth
    bits), Q4_0's its nibbles with d and -8 d as f32 (a Q4_K sub-block); a K-quant's sub-block scale d sc and
    minimum -dmin mn are f32 (exact: 11 by at most 8 significant bits), Q5_K's quants q (a byte each, as Q5_0's),
    Q6_K's int8 (q - 32), Q3_K's int8 (q - 4, two scales a block as Q6_K's), Q4_K's nibbles arranged as Q4_1's (q_i
    low, q_{i+16} high); IQ4_NL's and IQ4_XS's 4-bit indices into their table as the file holds them (as Q4_1's
    nibbles), with IQ4_NL's d and IQ4_XS's d (sc - 32) as f32."""
    if kind == "Q8_0":
        return [rows[..., 0:2]], rows[..., 2:34]
    if kind == "Q4_1":
        return [rows[..., 0:2], rows[..., 2:4]], rows[..., 4:20]
    if kind == "IQ4_NL":  # d (f16), 16 bytes of indices into the table (value i low nibble, i + 16 high)
        return [_half(rows, 0)], rows[..., 2:18]
    if kind == "Q4_0":  # d (f16), 16 bytes of nibbles arranged as Q4_1's
        d = _half(rows, 0)
        return [d, -8 * d], rows[..., 2:18]
    if kind in ("Q5_0", "Q5_1"):  # d (Q5_1: and m, f16), 4 bytes of fifth bits (bit i: value i's), 16 of nibbles
        at = 2 if kind == "Q5_0" else 4  # (value i low, i + 16 high)
        high = (rows[..., at:at + 4].copy().view("<u4") >> np.arange(32, dtype=np.uint32)) & 1
        low = np.concatenate([rows[..., at + 4:] & 15, rows[..., at + 4:] >> 4], axis=-1)
        q = low | (high.astype(np.uint8) << 4)
        return ([_half(rows, 0), _half(rows, 2)] if kind == "Q5_1" else [rows[..., 0:2]]), q
    supers = k // 256
    if kind == "IQ4_XS":  # d (f16), the 6-bit scales' high 2 bits (u16; sub-block s's at bit 2s), low 4 bits
        low = rows[..., 4:8]  # (4 bytes: sub-block 2i's low nibble, 2i + 1's high), 128 bytes of indices
        sc = np.concatenate([low[..., None] & 15, low[..., None] >> 4], axis=-1).reshape(n, supers, 8)
        sc = sc | ((rows[..., 2:4].copy().view("<u2") >> 2 * np.arange(8, dtype=np.uint16) & 3) << 4).astype(np.uint8)
        scale = (_half(rows, 0) * (sc.astype(np.float32) - 32)).reshape(n, k // BLOCK)  # exact: 11 by 6 bits
        qs = rows[..., 8:].reshape(n, supers, 8, 16)  # a sub-block's 16 bytes: value i low nibble, i + 16 high
        return [scale], qs.reshape(n, k // BLOCK, 16)
    if kind == "Q3_K":  # 32 bytes of high bits, 64 of 2-bit lows, 12 of 6-bit scales, d (f16)
        # scale j (of 16): its low 4 bits byte j % 8's nibble j // 8, its high 2 byte 8 + j % 4's bits 2 (j // 4)
        low, high = rows[..., 96:104], rows[..., 104:108]
        sc = np.concatenate([low & 15, low >> 4] + [high >> shift & 3 for shift in (0, 2, 4, 6)], axis=-1)
        sc = sc[..., :16] | (sc[..., 16:] << 4)
        scales = (_half(rows, 108) * (sc.astype(np.float32) - 32)).reshape(n, k // BLOCK, 2)  # exact, as Q6_K's
        # value 128 h + 32 s + l: bits 2s of byte 32 h + l of the lows, and bit 2 h + s of byte l of the highs,
        # the high bit 0 meaning less 4; a run of 32 a block, its two halves' scales sub-blocks 2b and 2b + 1
        lows = rows[..., 32:96].reshape(n, supers, 2, 1, 32) >> np.arange(0, 8, 2, dtype=np.uint8).reshape(4, 1) & 3
        highs = rows[..., 0:32].reshape(n, supers, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(8, 1) & 1
        q = lows.reshape(n, supers, 8, 32).astype(np.int8) - ((highs ^ 1) << 2).astype(np.int8)
        return [scales[..., 0], scales[..., 1]], q.reshape(n, k // BLOCK, 32)
    if kind in ("Q4_K", "Q5_K"):  # d, dmin (f16), 12 bytes of 6-bit scales and minimums, (Q5_K: 32 of fifth bits,)
        from gguf.quants import Q4_K  # 128 of nibbles (the file's reader: GGUF blocks come with gguf installed)

        d, dmin = _half(rows, 0), _half(rows, 2)
        packed = np.ascontiguousarray(rows[..., 4:16]).reshape(-1, 12)  # 6-bit scales and minimums, 8 of each
        sc, mn = (a.reshape(n, supers, 8) for a in Q4_K.get_scale_min(packed))
        scales = [d * sc.astype(np.float32), -(dmin * mn.astype(np.float32))]
        qs = rows[..., -128:].reshape(n, supers, 4, 1, 32)  # 64 values a run: sub-block 2c low nibbles, 2c+1 high
        q = np.concatenate([qs & 15, qs >> 4], axis=3).reshape(n, supers, 8, 32)
        if kind == "Q4_K":
            q = q.reshape(n, k // BLOCK, 32)
            return scales, q[..., :16] | (q[..., 16:] << 4)
        high = rows[..., 16:48].reshape(n, supers, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(8, 1) & 1
        return scales, (q | (high << 4)).reshape(n, k // BLOCK, 32)  # (bit s of byte l: value 32s + l)
    # Q6_K: 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales, d (f16)
    ql = rows[..., 0:128].reshape(n, supers, 2, 1, 64)
    qh = rows[..., 128:192].reshape(n, supers, 2, 1, 32)
    low = np.concatenate([ql[..., :32] & 15, ql[..., 32:] & 15, ql[..., :32] >> 4, ql[..., 32:] >> 4], axis=3)
    high = np.concatenate([(qh >> shift) & 3 for shift in (0, 2, 4, 6)], axis=3)
    q = ((low | (high << 4)).astype(np.int16) - 32).astype(np.int8).reshape(n, k // BLOCK, 32)
    sc = (_half(rows, 208) * rows[..., 192:208].view(np.int8).astype(np.float32)).reshape(n, k // BLOCK, 2)
    return [sc[..., 0], sc[..., 1]], q


def _fifth_bit_plane(fifth: np.ndarray, n: int, panels: int, k: int) -> np.ndarray:
    """The fifth bits [n, k / 32, 32] (0 or 1) of 5-bit quants as each panel block holds them after its nibbles
    [panels, k / 32, 64]: 16 little-endian words of 32 bits, word 2s + h's bit 2j + e row j's value 2s + e + 16 h
    (cpu_qlinear.c's FIFTH_BITS: the lanes of a pairs step, one mask)."""
    if panels * PANEL != n:
        fifth = np.concatenate([fifth, np.zeros((panels * PANEL - n, *fifth.shape[1:]), np.uint8)])
    # [panel, row j, block, h, s, e] -> [panel, block, s, h, j, e]
    bits = fifth.reshape(panels, PANEL, k // BLOCK, 2, 8, 2).transpose(0, 2, 4, 3, 1, 5)
    packed = np.packbits(bits.reshape(panels, k // BLOCK, -1, 8), axis=-1, bitorder="little")
    return packed.reshape(panels, k // BLOCK, 64)


def _half(rows: np.ndarray, at: int) -> np.ndarray:
    """The f16 at byte `at` of each block [n, blocks, bytes], as f32 [n, blocks, 1] (exact)."""
    return rows[..., at:at + 2].copy().view(np.float16).astype(np.float32)


def matmul(x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [..., K] @ w.T (+ bias): f32 sums of the decoded blocks times x (a bf16 x widened, exactly),
    rounded once to x's type (or `out_dtype`: f32 keeps them as they are)."""
    rows, out, dtype = matmul_operands(x, w.k, w.n, bias, out_dtype)
    status = call("qlinear", w.qtype, TYPES[rows.dtype], rows.data_ptr(), rows.shape[0], *w.panel_args,
                  TYPES[out.dtype], out.data_ptr(), w.n, pool.threads())
    if status:
        raise MemoryError(f"no memory for x's {rows.shape[0]} x {w.k} f32 copy or its block sums")
    return matmul_result(out, x, w.n, bias, dtype)


def gather(table: QuantTable, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """table's rows ids (1-D) in `dtype`: each value as gguf's decoder gives it, rounded to the table's
    type (the decoded table's value), then to `dtype`; an id outside the table gives a row of zeros."""
    w = table.weight
    if len(w.buffers) != 1:  # a joined group's panels do not hold one weight's rows in order
        raise ValueError(f"rows are gathered from one weight's panels, not a joined group's: {w}")
    ids = as_int32(ids)
    out = torch.empty(ids.shape[0], w.k, dtype=dtype)
    status = call("qgather", w.qtype, w.k, w.table.count, w.table.panels, w.n, ids.data_ptr(), ids.shape[0],
                  TYPES[table.dtype], TYPES[dtype], out.data_ptr(), pool.threads())
    if status:
        raise ValueError(f"the quantized gather does not take {w}")
    return out
