"""The small runtime that generated PyTorch modules import: the named high-level ops.

Each function is the reference semantics of its op (`numerics="exact"`) and,
with `fast=True`, the fused path: SDPA attention, compute in the model's
dtype with norms and softmax in f32.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from linnet.kernels import cpu_attention, cpu_linear, cpu_ops, cpu_qlinear
from linnet.kernels.cpu_linear import PanelWeight
from linnet.kernels.cpu_qlinear import QuantBlocks, QuantTable, QuantWeight
from linnet.rope_tables import inv_frequencies

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "i32": torch.int32,
          "i64": torch.int64, "bool": torch.bool}

def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    kernels = _small_ops(x, weight)
    if kernels and weight.shape == x.shape[-1:]:
        return kernels.rmsnorm(x, weight, eps)
    # x * rsqrt(mean(x^2) + eps) in f32, rounded to x's type, as Hugging Face's RMSNorm: torch's
    # rms_norm computes a 16-bit x in f32 and rounds its output once (bit for bit those ops where it
    # has no kernel of its own), one fused kernel on CUDA, where the ops would be five
    return weight * F.rms_norm(x, x.shape[-1:], eps=eps)


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
               fast: bool = False) -> torch.Tensor:
    # Exact numerics: torch's kernel, as transformers' nn.LayerNorm calls it (a 16-bit x's mean and
    # variance in f32, the output rounded to x's type once), bit for bit. Fast, on the CPU: Linnet's C
    # call, which computes the same in its own order (within an f32 rounding of torch's, nearer the
    # exact norm where torch's x * rstd - mean * rstd cancels) and which a captured decode step replays.
    given = [t for t in (weight, bias) if t is not None]
    if fast and cpu_ops.serves(x, *given) and all(t.shape == x.shape[-1:] and t.dtype == given[0].dtype
                                                  for t in given):
        return cpu_ops.layer_norm(x, weight, bias, eps)
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def gelu_tanh(x: torch.Tensor, fast: bool) -> torch.Tensor:
    """GELU's tanh form, `gelu(x, approximate="tanh")`. Exact numerics: transformers' NewGELUActivation's
    formula, op by op (T is f32 there: the same values bit for bit). Fast: in f32, rounded once to
    x's type, as torch's F.gelu computes it (one kernel; on the CPU Linnet's C call, which a captured
    decode step replays)."""
    if not fast:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    if cpu_ops.serves(x):
        return cpu_ops.gelu_tanh(x)
    return F.gelu(x, approximate="tanh")


def _small_ops(*tensors: torch.Tensor):
    """The kernels that take these tensors in rmsnorm, rope, put_ and silu_mul, one call each: Linnet's CPU
    ones (`kernels.cpu_ops`), or on a GPU its Triton ones (`_triton_ops`); None: torch's own ops."""
    return cpu_ops if cpu_ops.serves(*tensors) else _triton_ops(*tensors)


def _triton_ops(*tensors: torch.Tensor):
    """`kernels.triton_ops` where the pass takes them (`using_triton`) and these are GPU tensors
    they take (imported only then: Triton's import takes a tenth of a second); else None."""
    if _TRITON[0].ops and tensors[0].is_cuda:
        from linnet.kernels import triton_ops

        if triton_ops.serves(*tensors):
            return triton_ops
    return None


def silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b, silu(a) rounded to a's type first (a gated MLP's two halves, as the generator
    writes `silu(x) * y`): one kernel over the two where `_small_ops` has one (Linnet's CPU ones,
    or on a GPU Triton's), reading a fused matmul's columns where they lie; else torch's two ops."""
    kernels = _small_ops(a, b) if a.shape == b.shape and a.dtype == b.dtype else None
    if kernels:
        return kernels.silu_mul(a, b)
    return F.silu(a) * b


def linear(x: torch.Tensor, w, bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x @ w.T (+ bias). A weight packed by `pack_linear_weight` runs the kernel for its layout;
    a `FusedPart` runs its group's one matmul on x (once for the group's members) and takes its columns.
    `out_dtype`: the result's type where the generated code widens the product (`linear(...) as f32`,
    a head's logits): the f32 sums as they are where the kernel keeps them (Linnet's CPU kernels, the
    widened matmul), else rounded to x's type first (torch's own 16-bit matmuls write their type)."""
    if isinstance(w, FusedPart):
        if torch.compiler.is_compiling():
            # torch.compile's trace (a plain weight: CUDA's): a memo the trace wrote fails its guards
            # at the next call (a recompile), and Inductor keeps repeated matmuls apart; each member
            # multiplies its own rows
            return linear(x, w.fused[w.start:w.stop], bias, out_dtype)
        x_last, fused, out = _FUSED.get(w.group, (None, None, None))
        if x_last is not x or fused is not w.fused:
            out = linear(x, w.fused)
            _FUSED[w.group] = (x, w.fused, out)
        y = out[..., w.start:w.stop]  # (in x's type: the group's one product serves every member)
        return _in_type(y if bias is None else y + bias, out_dtype)
    if isinstance(w, PanelWeight):
        return cpu_linear.matmul(x, w, bias, out_dtype)
    if isinstance(w, QuantWeight):
        return cpu_qlinear.matmul(x, w, bias, out_dtype)
    if w.is_mkldnn:
        return _in_type(torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], ""), out_dtype)
    # Over rows, f32 activations meet a 16-bit weight unrounded, whatever the CPU multiplies natively
    if x.numel() > x.shape[-1] and (computed_in_f32(w) or x.dtype != w.dtype):
        return _widened_linear(x, w, bias, out_dtype)
    if x.dtype != w.dtype:  # f32 activations (gather_rows) and a 16-bit weight at one row: in its type
        return F.linear(x.to(w.dtype), w, bias).to(out_dtype or x.dtype)
    return _in_type(F.linear(x, w, bias), out_dtype)


def _in_type(y: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return y if dtype is None else y.to(dtype)


WIDEN_SLICE = 1 << 22  # weight elements widened at a time: 16 MB of f32


def _widened_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                    out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """A bf16 / f16 linear on a CPU without instructions for the type, over more than one row:
    x and slices of w widened to f32 (exact), multiplied by MKL and rounded back to x's type,
    as a native kernel, which accumulates in f32, would. torch's own bf16 matmul there is a
    generic loop: 2x slower at 16 rows and 6x at 64 (SmolLM2's gate/up). One row keeps the
    native type, whose matrix-vector kernel reads half the bytes and runs faster than f32's.
    The slices bound the f32 copy (a 128k-vocabulary head would take 2 GB at once). `out_dtype` f32
    keeps the sums unrounded."""
    xf = x.float()
    step = max(1, WIDEN_SLICE // w.shape[1])
    parts = [F.linear(xf, w[i:i + step].float(), None if bias is None else bias[i:i + step].float())
             for i in range(0, w.shape[0], step)]
    return (parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)).to(out_dtype or x.dtype)


class FusedPart(NamedTuple):
    """One member's rows of a fused weight [sum of N, K], packed on the CPU, plain elsewhere: weights
    that multiply the same input (q, k and v; gate and up) run as one matmul, which reads them
    faster than three small ones (a single-token decode step on the CPU: 17 against 25 ms for
    SmolLM2's q/k/v and gate/up)."""

    fused: torch.Tensor
    start: int
    stop: int
    group: int  # the group's slot in `_FUSED`, which keeps its last input and output


_FUSED: dict = {}  # group -> (its last input, fused weight, output): one layer's at a time


def packs_linear_weights(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether linear weights are packed on this device: the one device check for it.

    On the CPU, libraries' matmuls read a plain [N, K] weight slowly when few rows multiply it
    (decode steps: one token a cache row). Linnet's own kernel (`cpu_linear`, on AVX2 CPUs) takes
    f32, bf16 and f16 weights in its panels; elsewhere oneDNN's prepacked layout runs about twice
    as fast as MKL's plain sgemm, for f32, and for bf16 where the CPU has bf16 instructions. On
    CUDA, cuBLAS takes the plain layout as it is.
    """
    return device.type == "cpu" and (_panels_for(dtype) or _onednn_packs(dtype))


def _onednn_packs(dtype: torch.dtype) -> bool:
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False  # an internal op: older or newer torch may lack it
    return dtype == torch.float32 or (dtype == torch.bfloat16 and multiplies_natively(dtype))


def _panels_for(dtype: torch.dtype, k: int | None = None) -> bool:
    """Linnet's kernel for weights of this type (and K, if given), unless the CPU has bf16's dot
    instructions (AVX-512 BF16, AMX) and the kernel cannot pair this K: there oneDNN's bf16 matmul
    runs many rows at twice the kernel's f32 arithmetic. With those instructions the kernel takes a
    bf16 weight of even K in pairs (`cpu_linear.pairs`) and multiplies it in bf16, as fast as
    oneDNN and packed in the weight's own memory (oneDNN's layout is a copy). Without them (AVX-512
    alone: Skylake to Ice Lake) oneDNN emulates bf16 and took twice the panels' time at 1 to 368
    rows (SmolLM2's linears, the instruction sets capped so: `build.isa_cap`)."""
    if not cpu_linear.available(dtype):
        return False
    if dtype == torch.float32 or not multiplies_natively(dtype):
        return True
    # a type oneDNN does not pack (f16: its plain matmul reads the whole weight per call) stays ours
    has_bf16_dots = cpu_linear.pairs(torch.bfloat16, 2)
    return not has_bf16_dots or cpu_linear.pairs(dtype, 2 if k is None else k) or not _onednn_packs(dtype)


def _packs_in_panels(w: torch.Tensor) -> bool:
    """A weight that `packs_linear_weights` packs goes to Linnet's panels, or to oneDNN's layout
    where `_panels_for` prefers it and oneDNN can."""
    return _panels_for(w.dtype, w.shape[1]) or not _onednn_packs(w.dtype)


def computed_in_f32(t: torch.Tensor) -> bool:
    """Whether ops on `t` run in f32 here: a bf16 / f16 tensor on a CPU without instructions for its type."""
    return t.device.type == "cpu" and not multiplies_natively(t.dtype)


# dtype -> multiplies_natively's answer. Asked at every linear, and the CPU does not change; a dict
# rather than functools.cache, which torch.compile warns of each time it traces a cached call.
_NATIVE: dict = {}


def multiplies_natively(dtype: torch.dtype) -> bool:
    """Whether this CPU has the instructions for `dtype`'s matmuls (bf16: AVX-512 or AVX-NE-CONVERT;
    f16: AVX-512 FP16 or AMX): without them torch's bf16 / f16 matmul and SDPA are generic loops,
    and the runtime widens to f32 around them (`cpu_linear`, `_widened_linear`, `_sdpa`)."""
    if dtype not in _NATIVE:
        _NATIVE[dtype] = (torch.ops.mkldnn._is_mkldnn_bf16_supported() if dtype == torch.bfloat16
                          else torch.ops.mkldnn._is_mkldnn_fp16_supported() if dtype == torch.float16 else True)
    return _NATIVE[dtype]


def pack_linear_weight(w: torch.Tensor, rows: int, in_place: bool = False):
    """w [N, K] packed for this CPU: Linnet's panels (in w's own memory with `in_place`), or a copy
    in oneDNN's blocked layout tuned for `rows` rows of input (it runs for any)."""
    if _packs_in_panels(w):
        return cpu_linear.pack(w, in_place)
    return torch.ops.mkldnn._reorder_linear_weight(w, rows)


def pack_linear_layers(w: torch.Tensor, rows: int, in_place: bool = False) -> list:
    """A stacked weight [layers, N, K] as `pack_linear_weight` packs each layer, a packed weight a
    layer; Linnet's panels for all the layers in one call where they can (`cpu_linear.pack_layers`)."""
    if _packs_in_panels(w[0]):
        return cpu_linear.pack_layers(w, in_place)
    return [torch.ops.mkldnn._reorder_linear_weight(layer, rows) for layer in w]


def pack_linear_group(members: list, rows: int, in_place: bool = False):
    """Weights [N_i, K] that multiply one input, packed as one: their outputs side by side. Linnet's
    panels join the members where they lie; oneDNN's layout needs them concatenated first."""
    if _packs_in_panels(members[0]):
        return PanelWeight.join([cpu_linear.pack(m, in_place) for m in members])
    return torch.ops.mkldnn._reorder_linear_weight(torch.cat(members), rows)


def gather_rows(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """table[ids]: a param's rows (an embedding's), where a pass's activations begin.

    A bf16 / f16 table on a CPU without instructions for its type gives f32 rows, and the pass
    then carries its activations in f32: every op there computes in f32 anyway, and rounding to
    the table's type between ops cost a conversion each (about 800 a SmolLM2 decode step). The
    weights and the cache keep their type; the linear kernel and attention read them as they are.

    An id past the table gives a row of zeros on the CPU's kernels and the table's last row
    elsewhere (JAX's gather clamps), where torch's own indexing would raise: a padding token sits
    at position MaxSeq, one past a learned position table of MaxSeq rows, and its row is dropped.
    Every real position is inside the table (`ir.index_ranges` holds MaxSeq to its size).
    """
    if isinstance(table, QuantTable):  # rows decoded from the panels of the head tied to the table
        return cpu_qlinear.gather(table, ids, table.dtype if multiplies_natively(table.dtype) else torch.float32)
    wanted = torch.float32 if computed_in_f32(table) else table.dtype
    if table.dim() == 2 and ids.dim() == 1 and table.is_contiguous() and cpu_ops.serves(table):
        return cpu_ops.gather_rows(table, ids, wanted)  # (recorded as it runs, where a decode step is captured)
    rows = table[ids.clamp(max=table.shape[0] - 1)]
    return rows.to(wanted)


def softmax(x: torch.Tensor, axis: int = -1) -> torch.Tensor:
    return torch.softmax(x.float(), dim=axis).to(x.dtype)


def rope_table(head_dim: int, max_seq: int, theta: float, **scaling) -> torch.Tensor:
    """cos and sin for every position: [max_seq, 2, head_dim // 2], f32."""
    inv_freq, attention_factor = inv_frequencies(head_dim, theta, **scaling)  # scaling: rope's static kwargs
    angles = torch.outer(torch.arange(max_seq, dtype=torch.float64), torch.from_numpy(inv_freq))
    table = torch.stack([torch.cos(angles), torch.sin(angles)], dim=1) * attention_factor
    return table.to(torch.float32)


def rope(x: torch.Tensor, positions: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotates halves of x[n, heads, head_dim] (the Hugging Face Llama layout):
    [x1 * cos - x2 * sin, x2 * cos + x1 * sin], written as x * cos + roll(x) * signed sin."""
    kernels = _small_ops(x, table)
    if kernels and x.dim() == 3 and table.dtype == torch.float32 and table.shape[-1] * 2 == x.shape[-1]:
        return kernels.rope(x, positions, table)
    cos, sin = per_pass("rope", (positions, table), lambda: _rope_factors(positions, table))
    # in f32, the tables' type: a 16-bit x is widened inside the ops (bit for bit as x.float() first,
    # one kernel and one f32 copy of x fewer: 64 kernels of a Llama decode step)
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin).to(x.dtype)


def _rope_factors(positions: torch.Tensor, table: torch.Tensor) -> tuple:
    """Each token's [cos, cos] and [-sin, sin], [n, 1, head_dim]: the same for every layer of a pass."""
    cs = table[positions.clamp(max=table.shape[0] - 1)]  # [n, 2, head_dim // 2]; padding past the table: any
    cos, sin = cs[:, 0], cs[:, 1]
    return torch.cat([cos, cos], dim=-1)[:, None], torch.cat([-sin, sin], dim=-1)[:, None]


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor,
              rows: torch.Tensor | None = None, window: int = 0, sinks: torch.Tensor | None = None,
              scale: float | None = None, softcap: float = 0.0, fast: bool = False) -> torch.Tensor:
    """Token i attends to cache row rows[i] (row i when rows is None) at positions <= positions[i].
    `softcap` (0: none) caps each score s as softcap * tanh(s / softcap) (Gemma 2's) before the softmax."""
    n, heads, head_dim = q.shape
    scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
    if fast and cpu_attention.available(k_cache, head_dim):
        # Linnet's kernel, a token at a time, each reading its own row up to its own position: prompts'
        # tokens too, whose keys the pass has written to the cache by now. A 480-token SmolLM2 f32
        # prefill: 1.57 s, against 1.67 with SDPA over each prompt.
        if rows is None:
            rows = per_pass("rows", (positions,), lambda: torch.arange(n, dtype=torch.int32))
        return cpu_attention.attend_rows(q, k_cache, v_cache, rows, positions, window, sinks, scale, softcap)
    if softcap:  # Linnet's CPU kernel caps scores; flash's, SDPA's and the Triton kernel do not: the f32 reference
        fast = False
    if rows is None:
        if fast and triton_decodes(q, k_cache, v_cache):
            return _triton_decode(q, k_cache, v_cache, positions, window, sinks, scale)
        if fast and sinks is None and flash_decodes(q, k_cache):
            return _flash_decode(q, k_cache, v_cache, positions, window, scale)
        span = _key_span(positions, k_cache.shape[1])
        return _attend(q, k_cache[:n, :span], v_cache[:n, :span], positions, window, sinks, scale, fast, softcap)
    if fast and sinks is None and flash_decodes(q, k_cache):
        seq = k_cache.shape[1]
        pack = per_pass(f"flash pack {seq}", (rows, positions), lambda: _flash_pack(rows, positions, seq, q.device))
        if pack is not None:  # every segment of the pack in one call
            starts_q, starts_k, used, longest = pack
            return _flash_rows(q, k_cache, v_cache, starts_q, starts_k, used, window, scale, longest)
    out = torch.empty(q.shape[:2] + v_cache.shape[-1:], dtype=q.dtype, device=q.device)
    singles, runs = per_pass("segments", (rows, positions), lambda: _segments(rows, positions))
    if singles is not None:  # one-token segments: batched over their rows
        idx, r, pos = singles
        span = _key_span(pos, k_cache.shape[1])
        # index_select of the span's view: 3x faster than k_cache[r, :span], which gathers element-wise
        keys, values = k_cache[:, :span].index_select(0, r), v_cache[:, :span].index_select(0, r)
        out[idx] = _attend(q[idx], keys, values, pos, window, sinks, scale, fast, softcap)
    for start, end, row, top, pos in runs:  # a prompt's tokens: its own row, up to its last position
        keys, values = k_cache[row, None, :top + 1], v_cache[row, None, :top + 1]
        out[start:end] = _attend_row(q[start:end], keys, values, pos, window, sinks, scale, fast, softcap)
    return out


def triton_decodes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether a decode step's tokens attend through Linnet's Triton kernel (`kernels.triton_attention`:
    the keys split for more programs than flash's kernel gives a step, sinks, f32 too): on a GPU,
    where the step takes it (`using_triton`)."""
    return (q.is_cuda and _TRITON[0].attention and k_cache.dtype == q.dtype == v_cache.dtype
            and q.shape[-1] == k_cache.shape[-1] == v_cache.shape[-1] <= 256)


class TritonKernels(NamedTuple):
    """Which of Linnet's Triton kernels a torch pass on a GPU takes in place of the runtime's own."""
    attention: bool = False  # a decode step's attention (`kernels.triton_attention`), in place of flash's or SDPA
    ops: bool = False  # RMSNorm, rope, the cache write, silu * up (`kernels.triton_ops`), in place of torch's ops
    MODULES = ("triton_attention", "triton_ops")  # each field's, in linnet.kernels

    def describe(self) -> str:
        names = [name for name, on in (("attention", self.attention), ("small ops", self.ops)) if on]
        return f"Triton {' and '.join(names)}" if names else "the runtime's kernels"


def triton_asked(flag: str, module: str) -> bool | None:
    """What `flag` asks of the Triton kernels of `linnet.kernels.<module>`: "1" them (where Triton is
    here), "0" not; unset ("auto"): None, the torch runner measures both where it captures a CUDA
    decode step (`TorchRunner`), and where it captures none the runtime's own are kept."""
    asked = os.environ.get(flag, "auto")
    if asked == "auto":
        return None
    return asked == "1" and triton_here(module)


def triton_here(module: str) -> bool:
    """Whether Triton, which `linnet.kernels.<module>` needs, is here (imported only when asked)."""
    import importlib

    return importlib.import_module(f"linnet.kernels.{module}").available()


TRITON_ASKED = TritonKernels(*(triton_asked(flag, module) for flag, module in
                               zip(("LINNET_TRITON_DECODE", "LINNET_TRITON_OPS"), TritonKernels.MODULES)))
# The kernels the pass being run takes: set by `using_triton`, read at each op (a torch.compile
# trace reads it as a constant, and cannot read a ContextVar)
_TRITON = [TritonKernels(TRITON_ASKED.attention is True, TRITON_ASKED.ops is True)]


@contextlib.contextmanager
def using_triton(kernels: TritonKernels):
    """Around a pass (or a step's capture): its ops take these of Linnet's Triton kernels."""
    before, _TRITON[0] = _TRITON[0], kernels
    try:
        yield
    finally:
        _TRITON[0] = before


def _triton_decode(q, k_cache, v_cache, positions, window: int, sinks, scale: float):
    """q [n, heads, d], token i of row i at positions[i], against its row's keys 0 .. positions[i]
    (the last `window` of them, if set), with `sinks`: [n, heads, d]."""
    from linnet.kernels import triton_attention

    used = per_pass(f"used {k_cache.shape[1]}", (positions,), lambda: _used_keys(positions, k_cache.shape[1]))
    return triton_attention.attend(q, k_cache, v_cache, used, window, sinks, scale)


def _used_keys(positions: torch.Tensor, seq: int) -> torch.Tensor:
    """int32: the keys each token attends to, positions + 1 (0 for a padding token, at MaxSeq)."""
    return torch.where(positions < seq, positions + 1, 0).to(torch.int32)


def flash_decodes(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether tokens attend through flash attention's variable-length kernel, which reads each
    row's keys only up to its position (a decode step: `_flash_decode`; a pack: `_flash_pack`): on
    CUDA, for the 16-bit types it takes, where this torch's kernel is told the keys each row uses
    (`seqused_k`).

    SDPA has no such length: a captured step's shapes are fixed, so it read all MaxSeq positions of
    every row (a Llama 3.1 8B step at 64 rows and MaxSeq 640: 5.4 GB of cache, 2.3 ms of its 10.7 on an H200)."""
    return (q.is_cuda and _FLASH_TAKES_USED_KEYS and q.dtype in (torch.float16, torch.bfloat16)
            and k_cache.dtype == q.dtype and q.shape[-1] % 8 == 0 and q.shape[-1] <= 256
            and _flash_runs_on(q.get_device()))


def _flash_runs_on(device: int) -> bool:
    """Whether flash attention's kernels run on this CUDA device: Ampere (compute capability 8) on.
    A torch.compile trace takes its answer as a constant (`before_torch_compile`)."""
    return _capability(device)[0] >= 8


def before_torch_compile() -> None:
    """Marks what a torch.compile trace of a generated entry takes as constant. Done here, not as
    a decorator where the function is defined: `torch.compiler.assume_constant_result` imports
    torch._dynamo, 1.5-3 s of every process's start, which only a compiled step needs."""
    torch.compiler.assume_constant_result(_flash_runs_on)  # marks the function itself, and returns it


@functools.cache  # asked by every layer of an eager pass; kept apart, as Dynamo would trace a cached function
def _capability(device: int) -> tuple:
    return torch.cuda.get_device_capability(device)


def _flash_takes_used_keys() -> bool:
    """Whether this torch's flash kernel takes `seqused_k` (and is CUDA's: ROCm's has no
    variable-length form), unless LINNET_FLASH_DECODE=0 keeps SDPA (to compare the two)."""
    if os.environ.get("LINNET_FLASH_DECODE", "1") == "0":
        return False
    op = getattr(torch.ops.aten, "_flash_attention_forward", None)
    return torch.version.hip is None and op is not None and "seqused_k" in str(op.default._schema)


_FLASH_TAKES_USED_KEYS = _flash_takes_used_keys()  # (read once: a torch.compile trace calls flash_decodes)


def _flash_decode(q, k_cache, v_cache, positions, window: int, scale: float):
    """q [n, heads, d], token i of row i at positions[i], against its row's keys 0 .. positions[i]
    (the last `window` of them, if set): [n, heads, d] (`_flash_rows`)."""
    n, seq = q.shape[0], k_cache.shape[1]
    starts_q, starts_k, used = per_pass(f"flash {seq}", (positions,), lambda: _flash_lengths(positions, n, seq))
    return _flash_rows(q, k_cache, v_cache, starts_q, starts_k, used, window, scale)


def _flash_rows(q, k_cache, v_cache, starts_q, starts_k, used, window: int, scale: float, longest: int = 1):
    """q [n, heads, d] in sequences, sequence i's queries from starts_q[i] (`longest` at most), against
    its keys: from starts_k[i] of the cache viewed as [Batch * MaxSeq, kv_heads, d] (no copy; a row's
    first position), used[i] of them, each query seeing those up to its own place at their end
    (flash attention's causal mask, bottom-right aligned: a row's tokens at its last positions)
    and the last `window` of them, if set. Grouped heads are the kernel's own. A sequence that
    uses no keys (a padding token) gets zeros."""
    batch, seq = k_cache.shape[:2]
    keys = k_cache.reshape((batch * seq,) + k_cache.shape[2:])
    values = v_cache.reshape((batch * seq,) + v_cache.shape[2:])
    window_left = window - 1 if window else None  # key j with positions[i] - j < window
    return _flash_varlen(q, keys, values, starts_q, starts_k, longest, seq, 0.0, longest > 1, False, scale=scale,
                         window_size_left=window_left, seqused_k=used)[0]


def _flash_pack(rows, positions, seq: int, device) -> tuple | None:
    """`_flash_rows`' arguments for a whole pack, read on the host: each run of one row's tokens a
    sequence, its keys the row's up to its last position (as written by now), where every run of
    more than one token holds consecutive positions (a prompt or its chunk, as the engine packs
    them); None otherwise. A prefill of four 512-token prompts made 4 SDPA calls a layer, each
    with copies of its queries in and its output out; a mixed pass, one for its decoding rows and
    one for each prompt."""
    r, p = rows.tolist(), positions.tolist()
    if not r:
        return None
    starts_q, starts_k, used, longest = [0], [], [], 1
    for start, end in _row_runs(r):
        top = p[end - 1]
        if end - start > 1 and (top >= seq or p[start:end] != list(range(p[start], top + 1))):
            return None
        starts_q.append(end)
        starts_k.append(r[start] * seq)
        used.append(top + 1 if top < seq else 0)  # a padding token (at MaxSeq or past it): no keys
        longest = max(longest, end - start)
    starts_k.append(starts_k[-1] + seq)  # (read where no `used` is given: the kernel's form asks for it)
    to = lambda values: torch.tensor(values, dtype=torch.int32, device=device)
    return to(starts_q), to(starts_k), to(used), longest


def _flash_lengths(positions, n: int, seq: int) -> tuple:
    """`_flash_rows`' int32 arguments for token i in row i: each query's start ([0, 1, ..., n]),
    each row's keys' ([0, seq, ..., n * seq]), and the keys each uses (0 for a padding token)."""
    at = torch.arange(n + 1, dtype=torch.int32, device=positions.device)
    return at, at * seq, _used_keys(positions, seq)


def _flash_varlen(*args, **kwargs):
    """torch's flash attention, variable-length form (a name of its own, so tests can put a
    reference in its place on the CPU)."""
    return torch.ops.aten._flash_attention_forward(*args, **kwargs)


def _key_span(positions: torch.Tensor, max_seq: int) -> int:
    """How many cache positions the tokens can see: up to the furthest one, read on the host.
    Padding tokens (positions >= MaxSeq: idle rows) do not count.

    On the CPU this read is free and saves attending over all MaxSeq positions of every row; on a
    GPU it would sync the stream and change shapes under a captured graph, so the span stays MaxSeq.
    Read once per pass: every layer asks it of the same positions.
    """
    if positions.device.type != "cpu":
        return max_seq
    furthest = lambda: int(torch.where(positions < max_seq, positions, 0).max()) + 1
    return per_pass(f"span {max_seq}", (positions,), furthest)


_PASS_MEMO: dict = {}


def per_pass(what: str, tensors: tuple, compute):
    """compute() once per entry call for these very tensors: every layer of a pass asks the same.

    Keys are the tensors' identities, and the memo holds the tensors, so no other tensor can take
    an address (or id) that is in it. `as_tensors`, which starts every entry call, empties it.
    """
    if torch.compiler.is_compiling():
        # torch.compile's trace: the graph's own common subexpressions take the memo's place, and a
        # memo the trace wrote would fail its guards at the next call (a recompile)
        return compute()
    key = (what,) + tuple(id(t) for t in tensors)
    hit = _PASS_MEMO.get(key)
    if hit is None:
        hit = _PASS_MEMO[key] = (tensors, compute())
    return hit[1]


def _row_runs(r: list) -> list:
    """[(start, end)] of each run of equal rows in a pack's rows (a host list), in pack order."""
    runs, start = [], 0
    for i in range(1, len(r) + 1):
        if i == len(r) or r[i] != r[start]:
            runs.append((start, i))
            start = i
    return runs


def _segments(rows: torch.Tensor, positions: torch.Tensor):
    """Runs of equal rows in a pack, read on the host: (singles, [(start, end, row, last position,
    the run's positions)]). singles: the one-token runs as tensors (indices, rows, positions), or None.

    The tensors are made once here, so the per-pass memo of their masks hits in every layer.
    """
    r, p = rows.tolist(), positions.tolist()
    singles, runs = [], []
    for start, end in _row_runs(r):
        if end - start == 1:
            singles.append(start)
        else:
            runs.append((start, end, r[start], max(p[start:end]), positions[start:end]))
    if not singles:
        return None, runs
    idx = torch.as_tensor(singles, device=rows.device)
    return (idx, rows[idx], positions[idx]), runs


def _attend_row(q, keys, values, positions, window, sinks, scale, fast, softcap=0.0):
    """q[m, h, d] of one row against keys/values[1, L, kvh, d] of that row."""
    m, heads, head_dim = q.shape
    kv_heads = keys.shape[2]
    visible = _visible(positions, keys.shape[1], window)
    if fast and sinks is None:
        out = _sdpa(q.transpose(0, 1)[None], keys[0].transpose(0, 1)[None], values[0].transpose(0, 1)[None],
                    visible, scale)
        return out[0].transpose(0, 1)
    group = heads // kv_heads
    qg = q.reshape(m, kv_heads, group, head_dim).float()
    scores = _capped(torch.einsum("mkgd,skd->mkgs", qg, keys[0].float()) * scale, softcap)
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    probs = _softmax_with_sinks(scores, sinks, kv_heads, group)
    out = torch.einsum("mkgs,skd->mkgd", probs, values[0].float())
    return out.reshape(m, heads, values.shape[-1]).to(q.dtype)


def _visible(positions: torch.Tensor, length: int, window: int) -> torch.Tensor:
    """[n, length] bool: key j is seen by token i when j <= positions[i] (and within the window)."""
    return per_pass(f"visible {length} {window}", (positions,), lambda: _visible_mask(positions, length, window))


def _visible_mask(positions: torch.Tensor, length: int, window: int) -> torch.Tensor:
    span = torch.arange(length, device=positions.device)
    pos = positions[:, None].long()
    visible = span[None, :] <= pos
    if window:
        visible &= span[None, :] > pos - window
    return visible


def _sdpa(q, keys, values, visible, scale):
    """SDPA over [b, heads, m, d] queries and [b, kv_heads, S, d] keys and values, in q's type, each
    query seeing the keys `visible` [m or b, S] says (a pass's `_visible`): [m, S] where b is 1 (one
    row's queries), [b, S] where m is 1 (a token a row).

    Grouped heads are folded into the query axis: the `heads / kv_heads` query heads of one KV head
    become that head's queries ([b, kv_heads, group * m, d], the mask repeated for each), so the
    call has as many query heads as KV heads. SDPA's fused CUDA kernels otherwise refuse it: flash
    attention takes no mask, memory-efficient attention no grouped heads, and the math fallback
    expands the keys and values to every query head (4x a Llama 3 8B decode step's cache reads).

    On a CPU without instructions for the cache's bf16 / f16 the inputs are widened to f32 and the
    output is given in q's type, f32 there too (`gather_rows`): bf16 SDPA there took 3x as long as
    f32 in a decode step, widening included."""
    dtype = q.dtype
    if computed_in_f32(keys):
        q, keys, values = q.float(), keys.float(), values.float()
    b, heads, m, d = q.shape
    kv_heads, length = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    if group > 1:
        q = q.reshape(b, kv_heads, group * m, d)
    # The mask as SDPA adds it, made once a pass for every layer: given as booleans, each call would
    # convert them anew (three kernels a layer, which a graph replays too)
    bias = per_pass(f"sdpa bias {b} {m} {length} {group} {q.dtype}", (visible,),
                    lambda: _sdpa_bias(visible, b, m, length, group, q.dtype))
    backends = _sdpa_backends(q)
    with sdpa_kernel(backends) if backends else contextlib.nullcontext():
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias, scale=scale)
    return out.reshape(b, heads, m, values.shape[-1]).to(dtype)


def _sdpa_backends(q) -> list | None:
    """The SDPA kernels a call may take, where not torch's own choice: an eager call on CUDA (a
    packed or mixed pass, whose shapes change with every prompt) leaves cuDNN's attention out, which
    builds a plan for each new shape, tens to hundreds of ms (the GPU check's load spent about 16 s
    of its 23.7 between passes whose kernels took 7). A decode step to be captured keeps it, in its
    warm-up runs as in its capture (`graph_step`): one shape, one plan, and there its kernel was
    the fastest. (A capture whose warm-up had left cuDNN out built the plan inside the capture,
    which failed it.)"""
    if q.is_cuda and not torch.compiler.is_compiling() and not _GRAPH_STEP[0] and \
            not torch.cuda.is_current_stream_capturing():
        return _EAGER_SDPA
    return None


_GRAPH_STEP = [False]  # inside `graph_step`


@contextlib.contextmanager
def graph_step():
    """Around a step to be captured as a CUDA graph and the runs that warm it up: its calls choose
    their kernels as the capture will (`_sdpa_backends`)."""
    before, _GRAPH_STEP[0] = _GRAPH_STEP[0], True
    try:
        yield
    finally:
        _GRAPH_STEP[0] = before


_EAGER_SDPA = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]  # no cuDNN


def _sdpa_bias(visible, b: int, m: int, length: int, group: int, dtype) -> torch.Tensor:
    """`_sdpa`'s `visible` as the additive mask SDPA makes of booleans (0 seen, -inf not), [b, 1, m,
    length] or broadcast to it, repeated for each query head of a KV head where `_sdpa` folds them
    into its queries."""
    mask = visible[None, None] if b == 1 else visible[:, None, None, :]
    if group > 1:
        mask = mask.expand(b, 1, m, length)[:, :, None].expand(b, 1, group, m, length).reshape(b, 1, group * m, length)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def _softmax_with_sinks(scores, sinks, kv_heads, group):
    """Softmax over the keys; a sink adds one more logit per head to the denominator only."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    sink = sinks.float().reshape(1, kv_heads, group, 1).expand(scores.shape[0], kv_heads, group, 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]


def _capped(scores: torch.Tensor, softcap: float) -> torch.Tensor:
    """softcap * tanh(scores / softcap), as Gemma 2 caps its attention scores; 0: the scores as they are."""
    return torch.tanh(scores / softcap) * softcap if softcap else scores


def _attend(q, keys, values, positions, window, sinks, scale, fast, softcap=0.0):
    """q[n, h, d] against keys/values[n, S, kvh, d], one cache row per token."""
    n, heads, head_dim = q.shape
    kv_heads = keys.shape[2]
    visible = _visible(positions, keys.shape[1], window)
    if fast and sinks is None:
        out = _sdpa(q[:, :, None, :], keys.transpose(1, 2), values.transpose(1, 2), visible, scale)
        return out[:, :, 0, :]
    group = heads // kv_heads
    qg = q.reshape(n, kv_heads, group, head_dim).float()
    scores = _capped(torch.einsum("nkgd,nskd->nkgs", qg, keys.float()) * scale, softcap)
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    probs = _softmax_with_sinks(scores, sinks, kv_heads, group)
    out = torch.einsum("nkgs,nskd->nkgd", probs, values.float())
    return out.reshape(n, heads, values.shape[-1]).to(q.dtype)


def put_(state: torch.Tensor, index: tuple, value: torch.Tensor) -> None:
    """state[index] = value, in place, except where an index falls outside `state`: those entries
    write nothing (JAX's scatter semantics). That is how padding tokens, at position MaxSeq, leave
    the cache alone (vLLM's slot -1).

    `index` holds ints, slices and index tensors (broadcast together), adjacent as the checker
    requires, and `value` has the shape numpy gives `state[index]`. On the CPU the entries outside
    are found on the host, once per pass for the same indices; on a GPU (no host reads under a
    captured graph) they are clamped into range and write back what is already there.
    """
    kernels = _small_ops(state, value)
    if kernels and kernels.put_rows(state, index, value):
        return
    value = value.to(state.dtype)  # f32 activations (gather_rows) into a bf16 / f16 cache
    tensors = [(axis, i) for axis, i in enumerate(index) if isinstance(i, torch.Tensor)]
    if not tensors:
        state[index] = value
    elif state.device.type == "cpu":
        _put_inside(state, index, value, tensors)
    else:
        _put_clamped(state, index, value, tensors)


def _put_inside(state, index, value, tensors):
    key = "fits " + " ".join(str(state.shape[axis]) for axis, _ in tensors)
    fits = per_pass(key, tuple(i for _, i in tensors), lambda: _fits(state.shape, tensors))
    if not per_pass(key + " all", (fits,), lambda: bool(fits.all())):
        at = _gathered_at(index)
        index = tuple(i.expand(fits.shape)[fits] if isinstance(i, torch.Tensor) else i for i in index)
        value = value[(slice(None),) * at + (fits,)]
    state[index] = value


def _put_clamped(state, index, value, tensors):
    # the clamped indices and what fits, once a pass: every layer's two cache writes take the same
    # (5 of a Llama decode step's 55 kernels a layer, each a launch a graph replays too)
    key = "clamped " + " ".join(f"{axis}:{state.shape[axis]}" for axis, _ in tensors)
    inside, fits = per_pass(key, tuple(i for _, i in tensors), lambda: _clamped(state.shape, tensors))
    clamped = list(index)
    for (axis, _), i in zip(tensors, inside):
        clamped[axis] = i
    clamped = tuple(clamped)
    at = _gathered_at(index)
    fits = fits.reshape((1,) * at + fits.shape + (1,) * (value.dim() - at - fits.dim()))
    state[clamped] = torch.where(fits, value, state[clamped])


def _clamped(shape, tensors) -> tuple:
    """([each index tensor clamped into `shape`'s axis], `_fits`)."""
    return [i.clamp(max=shape[axis] - 1) for axis, i in tensors], _fits(shape, tensors)


def _gathered_at(index: tuple) -> int:
    """The axis of `value` where the gathered dims stand: after the dims the slices before them
    keep (numpy's rule, the gathered indices being adjacent: `cache[:, rows, positions]` is
    [layers, n, ...])."""
    at = 0
    for i in index:
        if not isinstance(i, slice):
            break
        at += 1
    return at


def _fits(shape, tensors) -> torch.Tensor:
    """bool, of the index tensors' broadcast shape ([n] for a cache write): entries whose every index
    ((axis, indices)) falls inside `shape`."""
    fits = None
    for axis, i in tensors:
        inside = i < shape[axis]
        fits = inside if fits is None else fits & inside
    return fits


def copy_rows_(cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, upto: torch.Tensor) -> torch.Tensor:
    """In place: row dst[i] takes row src[i]'s first upto[i] positions, in every layer.

    On the CPU only the positions up to the longest prefix are read and written (`upto`'s largest,
    a free host read there): over whole rows, a server's prefix copies took time in proportion to
    MaxSeq (SmolLM2, 8 rows of 8192: 0.75 s a copy, most of a short run's time). On a GPU the copy
    keeps whole rows, as `_key_span` keeps MaxSeq, so that no copy waits on the stream."""
    span = cache.shape[2] if upto.device.type != "cpu" or not len(upto) else min(cache.shape[2], int(upto.max()))
    keep = torch.arange(span, device=cache.device)[None, :] < upto[:, None]  # [K, span]
    keep = keep.reshape((1,) + keep.shape + (1,) * (cache.dim() - 3))
    cache[:, dst, :span] = torch.where(keep, cache[:, src, :span], cache[:, dst, :span])
    return cache


def as_tensors(device: torch.device, *arrays) -> tuple:
    """An entry's arguments as tensors on the model's device: numpy arrays are taken as well as tensors.

    Called first by every entry, it also ends the previous call's per-pass memo.
    """
    _PASS_MEMO.clear()
    _FUSED.clear()
    return tuple(torch.as_tensor(a, device=device) for a in arrays)


def take(x: torch.Tensor, indices: torch.Tensor, axis: int = 0) -> torch.Tensor:
    """x gathered at `indices` along `axis`. An index past the end reads the last entry, where
    index_select would raise: a padding token's position, MaxSeq, one past a learned position table
    of MaxSeq rows (`gather_rows`); its result is dropped."""
    flat = x.index_select(axis, indices.reshape(-1).long().clamp(max=x.shape[axis] - 1))
    return flat.reshape(x.shape[:axis] + indices.shape + x.shape[axis + 1:])


def expert_linear(x: torch.Tensor, w: torch.Tensor, experts: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """y[i, j] = x[i] @ w[experts[i, j]].T (+ bias[experts[i, j]]): [n, k, out] for x [n, in] or [n, k, in].

    The n * k (token, expert) pairs are sorted by expert, so that each expert multiplies all of
    its rows at once and no weight is gathered per token (an 8B-class expert is tens of MB)."""
    n, k = experts.shape
    rows = x.reshape(n, -1, x.shape[-1]).expand(n, k, x.shape[-1]).reshape(n * k, x.shape[-1])
    chosen = experts.reshape(-1).long()
    order = torch.argsort(chosen, stable=True)
    # (bincount would read the largest id on the host, which a CUDA graph cannot hold)
    counts = torch.zeros(len(w), dtype=torch.int64, device=x.device).scatter_add_(0, chosen, torch.ones_like(chosen))
    grouped = rows.index_select(0, order)
    # a list: each expert's PanelWeight (`TorchModel.pack_expert_weights`), multiplied in the loop below
    out = _grouped_mm(grouped, w, counts) if not isinstance(w, list) and _grouped_mm_serves(grouped, w) else None
    if out is not None:  # one kernel over every group, no host read (graph-safe on CUDA)
        if bias is not None:
            out = out + bias.index_select(0, chosen.index_select(0, order))
    else:  # one matmul per expert that has rows; reads the counts on the host
        parts, start = [], 0
        for e, count in enumerate(counts.tolist()):
            if count:
                parts.append(linear(grouped[start:start + count], w[e], None if bias is None else bias[e]))
                start += count
        out = torch.cat(parts) if parts else grouped.new_zeros(0, _expert_outputs(w))
    result = torch.empty_like(out)
    result.index_copy_(0, order, out)  # back to (token, choice) order
    return result.reshape(n, k, _expert_outputs(w))


def _flat(value) -> list:
    """A param's tensors: itself, or those of its (nested) lists: layers, and experts a layer."""
    return [t for v in value for t in _flat(v)] if isinstance(value, list) else [value]


def _expert_outputs(w) -> int:
    return w[0].n if isinstance(w, list) else w.shape[1]


_GROUPED_MM = {"cpu": True, "cuda": True}  # False once torch refuses it there: the per-expert loop from then on


def _grouped_mm_serves(x: torch.Tensor, w: torch.Tensor) -> bool:
    """torch's grouped GEMM where it runs: on CUDA in bf16 from compute capability 9.0 (Hopper), and
    on the CPU, where recent torch has a fallback taking the same arguments (so the CUDA path's call
    is what the CPU tests run)."""
    if not (hasattr(torch, "_grouped_mm") and _GROUPED_MM.get(x.device.type, False) and x.dtype == w.dtype):
        return False
    if x.is_cuda:
        return x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device) >= (9, 0)
    return x.dtype.is_floating_point


def _grouped_mm(rows: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor | None:
    """rows (grouped by expert, counts[e] for expert e) times each group's w[e].T, or None where this
    torch refuses the call (a private op, whose layout rules may vary between versions)."""
    try:
        return torch._grouped_mm(rows, w.transpose(-2, -1), offs=torch.cumsum(counts, 0, dtype=torch.int32))
    except RuntimeError:
        if rows.is_cuda and torch.cuda.is_current_stream_capturing():
            raise  # a CUDA graph capture: the runner settles on running the step eagerly
        _GROUPED_MM[rows.device.type] = False
        return None


def topk(x: torch.Tensor, k: int):
    """The k largest along the last dim, ties lower index first, as XLA's top_k gives them: torch.topk
    leaves which tie it takes open (a router whose scores tie chose other experts than under JAX).
    A stable sort of each row, which a router's few experts make cheap."""
    values, indices = torch.sort(x, dim=-1, descending=True, stable=True)
    return values[..., :k], indices[..., :k].to(torch.int32)


class TorchModel:
    """Base of generated models: binds and checks weights, allocates the cache."""

    params: dict = {}
    tied: dict = {}
    state: dict = {}
    linear_weights: dict = {}
    linear_groups: list = []
    expert_weights: dict = {}  # params read only as expert_linear's weights: {name: stacked}
    gathered_tables: list = []  # params read only as gathered rows (`gather_rows`): an embedding's table
    fast = False
    pack_rows = 16  # input rows oneDNN tunes packed weights for (its layout only): a decode step's, typically

    def __init__(self, weights: dict, device: str | torch.device = "cpu", consume: bool = False):
        """`weights`: {param: tensor or numpy array, or a GGUF's `QuantBlocks`}. With `consume` the model
        takes the tensors as its own: each entry is popped from `weights`, and packing lays a linear
        weight out in its own memory rather than in a copy (`nest.load` does this: loading never holds
        two copies). Blocks a linear reads run in them (`_kept_in_blocks`); others are decoded to T."""
        self.device = torch.device(device)
        joined = {name for group in self._joined_groups() for name in group}
        kept = self._kept_in_blocks(weights)
        self.quant_blocks = {}  # {param: QuantBlocks} until `pack_linear_weights` packs them
        for name, (shape, dtype) in self.params.items():
            if name in self.tied:
                continue
            if name not in weights:
                raise KeyError(f"no weights for param `{name}` {list(shape)} {dtype}")
            t = weights.pop(name) if consume else weights[name]
            if isinstance(t, QuantBlocks):
                if tuple(t.shape) != tuple(shape):
                    raise ValueError(f"param `{name}` must be {list(shape)}, but the blocks given are {list(t.shape)}")
                if name in kept:
                    self.quant_blocks[name] = t
                if name in kept and (name in self.linear_weights or self._gathered_from_head(name)):
                    setattr(self, name, None)  # packed from its blocks (a table: read from its head's panels)
                    continue
                t = t.dequantized(DTYPES[dtype])
            t = torch.as_tensor(t)
            if tuple(t.shape) != tuple(shape):
                raise ValueError(f"param `{name}` must be {list(shape)}, but the weights given are {list(t.shape)}")
            if t.dtype != DTYPES[dtype]:
                raise TypeError(f"param `{name}` must be {dtype}, but the weights given are {t.dtype}")
            # a member of a group joined on the device goes there into its rows of the group's tensor
            setattr(self, name, t if name in joined else t.to(self.device))
        for name, other in self.tied.items():
            setattr(self, name, getattr(self, other))
        self.pack_linear_weights(in_place=consume)
        self.quant_blocks = {}
        self.pack_expert_weights(in_place=consume)
        self.reset_state()
        self.init_tables()

    def _kept_in_blocks(self, weights: dict) -> set:
        """The params given as `QuantBlocks` that stay in their blocks: linear weights (fast numerics, on the
        CPU, every layer of a type and K `cpu_qlinear` takes), a fused group only whole (its members joined
        in the layers where their types agree: `fuse_linear_groups`); and the targets of tied linears whose
        heads run in their blocks (an embedding: read from the head's panels where it is only gathered from,
        `_gathered_from_head`; otherwise decoded too)."""
        if not self.fast or self.device.type != "cpu":
            return set()

        def runs(name):
            w = weights.get(name)
            return isinstance(w, QuantBlocks) and w.runs()

        kept = {name for name in self.linear_weights if name not in self.tied and runs(name)}
        for group in self.linear_groups:
            if not all(name in kept for name in group):
                kept -= set(group)
        heads = [name for name in self.linear_weights if name in self.tied]  # a target that is a linear is shared
        return kept | {self.tied[h] for h in heads if self.tied[h] not in self.linear_weights and runs(self.tied[h])}

    def _gathered_from_head(self, name: str) -> bool:
        """Whether a table kept in its blocks for the head tied to it is gathered from the head's panels
        (`QuantTable`), not from a decoded copy: read only as gathered rows, each of its aliases a linear."""
        aliases = [alias for alias, target in self.tied.items() if target == name]
        return name in self.gathered_tables and len(self.params[name][0]) == 2 and bool(aliases) \
            and all(alias in self.linear_weights for alias in aliases)

    def pack_linear_weights(self, in_place: bool = False):
        """Fast numerics on the CPU: linear weights packed (`pack_linear_weight`), a stacked one layer
        by layer; `in_place` where the model owns them.

        A tied param shares its target's packed tensor when the target is packed too; otherwise (a
        head tied to an embedding that is gathered from) it gets a packed copy of its own: one more
        [vocab, dim] tensor, for a head that runs about twice as fast in decode steps. Params kept in
        a GGUF's blocks (`quant_blocks`) are packed from them for `cpu_qlinear`, a tied head from its
        target's blocks; a target only gathered from then reads its rows from the head's panels (`QuantTable`).
        """
        if not self.fast:
            return
        packed = self.fuse_linear_groups(in_place)
        packed |= self.join_linear_groups()
        for name in sorted(self.linear_weights, key=lambda n: n in self.tied):  # targets before their aliases
            if name in packed:
                continue
            if self.tied.get(name) in packed:
                setattr(self, name, getattr(self, self.tied[name]))
                continue
            blocks = self.quant_blocks.get(self.tied.get(name, name))
            if blocks is not None:
                setattr(self, name, blocks.packed())
                packed.add(name)
                target = self.tied.get(name)
                if target is not None and getattr(self, target) is None:  # (`_gathered_from_head`)
                    setattr(self, target, QuantTable(getattr(self, name), DTYPES[self.params[target][1]]))
                continue
            w = getattr(self, name)
            if not packs_linear_weights(w.device, w.dtype):
                continue
            stacked, rows = self.linear_weights[name], self.pack_rows
            own = in_place and name not in self.tied  # an alias's target is read otherwise too
            setattr(self, name, pack_linear_layers(w, rows, own) if stacked else pack_linear_weight(w, rows, own))
            packed.add(name)

    def pack_expert_weights(self, in_place: bool = False):
        """Fast numerics on the CPU: each expert's matrix of an expert weight [experts, out, in] in
        Linnet's panels, a list of them (a list a layer for a stacked param), where the kernel takes
        the type and K. An expert's matmul then sums each row in one order whatever rows share it:
        MKL's, and torch's grouped matmul, summed a token's row otherwise with the count of tokens
        routed to the expert (tiny-mixtral's f32 logprobs differed alone and beside others).
        f32 and bf16 (where the kernel takes them; f16 keeps torch's grouped matmul)."""
        if not self.fast:
            return
        for name, stacked in self.expert_weights.items():
            w = getattr(self, name)
            if name in self.tied or not isinstance(w, torch.Tensor) or w.dtype not in (torch.float32, torch.bfloat16) \
                    or not packs_linear_weights(w.device, w.dtype) or not _panels_for(w.dtype, w.shape[-1]):
                continue
            layers = [cpu_linear.pack(e, in_place) for e in w.unbind(0)] if not stacked else \
                [[cpu_linear.pack(e, in_place) for e in layer.unbind(0)] for layer in w.unbind(0)]
            setattr(self, name, layers)

    def fuse_linear_groups(self, in_place: bool = False) -> set:
        """Each of `linear_groups` (untied weights of one input, as the code generator found them),
        where all can be packed: packed as one layer by layer (`pack_linear_group`) and handed out
        as FusedParts. Returns the names fused."""
        fused = set()
        for slot, group in enumerate(self.linear_groups):
            if group[0] in self.quant_blocks:  # (`_kept_in_blocks`: the whole group)
                self._join_quant_group(slot, group)
                fused.update(group)
                continue
            weights = [getattr(self, name) for name in group]
            if not all(packs_linear_weights(self.device, w.dtype) for w in weights):
                continue
            stacked = self.linear_weights[group[0]]
            if stacked and _packs_in_panels(weights[0][0]):  # each member's layers in one call, then joined
                members = [pack_linear_layers(w, self.pack_rows, in_place) for w in weights]
                packed = [PanelWeight.join(layer) for layer in zip(*members)]
            else:
                layers = [list(layer) for layer in zip(*weights)] if stacked else [weights]
                packed = [pack_linear_group(members, self.pack_rows, in_place) for members in layers]
            self._hand_out_parts(slot, group, packed)
            fused.update(group)
        return fused

    def _join_quant_group(self, slot: int, group: tuple):
        """A group kept in its blocks, a layer at a time: joined as one `QuantWeight` (handed out as
        FusedParts) where its members' block types agree, each member its own QuantWeight in a layer
        where they differ (the kernel runs one type a call; a Q4_K_M file's v is Q6_K in some layers)."""
        stacked = self.linear_weights[group[0]]
        members = [self.quant_blocks[name].packed() for name in group]
        layers = [list(layer) for layer in zip(*members)] if stacked else [members]
        joined = [QuantWeight.join(layer) if len({w.qtype for w in layer}) == 1 else None for layer in layers]
        self._hand_out_parts(slot, group, joined)
        for i, layer in enumerate(layers):
            if joined[i] is not None:
                continue
            for name, w in zip(group, layer):
                if stacked:
                    getattr(self, name)[i] = w
                else:
                    setattr(self, name, w)

    def _joined_groups(self) -> list:
        """The `linear_groups` that fast numerics join by rows on this device: those of one type
        where weights are not packed (CUDA: cuBLAS reads the plain layout). One wider matmul in
        place of three (q, k, v) or two (gate, up): fewer kernels a step, each reading its weight
        at a better share of the memory's bandwidth."""
        if not self.fast:
            return []
        dtypes = [{self.params[name][1] for name in group} for group in self.linear_groups]
        return [group for group, types in zip(self.linear_groups, dtypes)
                if len(types) == 1 and not packs_linear_weights(self.device, DTYPES[next(iter(types))])]

    def join_linear_groups(self) -> set:
        """Each of `_joined_groups` as one tensor on the device, its members' rows one after another
        ([layers, sum of N, K] for stacked weights), handed out as FusedParts. Each member is copied
        from where it was given straight into its rows: weights on the host never stand on the
        device twice (an 8B model's gate and up, 7.5 GB, would otherwise be there twice at once).
        Returns the names joined."""
        joined = set()
        for group in self._joined_groups():
            shape, dtype = self.params[group[0]]
            rows = sum(self.params[name][0][-2] for name in group)
            whole = torch.empty(tuple(shape[:-2]) + (rows, shape[-1]), dtype=DTYPES[dtype], device=self.device)
            start = 0
            for name in group:
                member = getattr(self, name)
                whole[..., start:start + member.shape[-2], :].copy_(member)
                start += member.shape[-2]
                # the member's own memory goes now, unless the caller holds it (`consume=False`)
                setattr(self, name, None)
                del member
            stacked = self.linear_weights[group[0]]
            self._hand_out_parts(self.linear_groups.index(group), group, list(whole) if stacked else [whole])
            joined.update(group)
        return joined

    def _hand_out_parts(self, slot: int, group: tuple, layers: list):
        """Each member of `group` as its FusedParts of `layers` (the group's weight, a layer each;
        one for an unstacked group): a list of them for a stacked member, else the one. A layer given
        as None (not joined) is None in each member, for the caller to fill."""
        stacked = self.linear_weights[group[0]]
        parts = {name: [] for name in group}
        for whole in layers:
            start = 0
            for name in group:
                rows = self.params[name][0][-2]
                parts[name].append(None if whole is None else FusedPart(whole, start, start + rows, slot))
                start += rows
        for name in group:
            setattr(self, name, parts[name] if stacked else parts[name][0])

    def weight_bytes(self) -> int:
        """Bytes the params take on the device, each tensor counted once (ties share, packing copies)."""
        seen, total = set(), 0
        for name in self.params:
            for t in _flat(getattr(self, name)):
                t = t.fused if isinstance(t, FusedPart) else t.weight if isinstance(t, QuantTable) else t
                if id(t) not in seen:
                    seen.add(id(t))
                    total += t.nbytes if isinstance(t, (PanelWeight, QuantWeight)) else t.numel() * t.element_size()
        return total

    def reset_state(self):
        """Every state tensor zeroed, in place once it exists: a captured decode step (a CUDA graph,
        or a CPU graph: `serve.runners`) keeps the addresses it was captured with."""
        for name, (shape, dtype) in self.state.items():
            current = getattr(self, name, None)
            if isinstance(current, torch.Tensor):
                current.zero_()
            else:
                setattr(self, name, torch.zeros(shape, dtype=DTYPES[dtype], device=self.device))

    def init_tables(self):
        pass
