"""Decode attention on a GPU, written in Triton: each row's one query against its own cache row,
up to the keys it uses, split over the keys (flash-decoding) and combined.

Why not flash attention's variable-length kernel (`runtime._flash_decode`): with one query a row it
gives each (row, KV head) one program that walks all of that row's keys in turn, so a step of few
rows (one request: 8 programs on an H200's 132 processors) or long rows waits on a few programs'
serial loops. Here the keys of a row are cut into `splits` pieces sized so that a step has a few
programs for every processor, and a second small kernel weighs the pieces together by their
log-sum-exp. The query heads of one KV head share a program (grouped-query attention), so the
keys and values are read once for the group.

Also unlike flash's kernel: f32 caches (with exact f32 products, not TF32) and attention sinks
(gpt-oss: one more logit a head, in the softmax's denominator only).

Under Triton's interpreter (TRITON_INTERPRET=1, the CPU: the tests) the same kernels run on CPU
tensors; only their 16-bit matrix products are widened to f32 first, which the interpreter needs
and which gives the same numbers (a 16-bit product is exact in f32, and the sums are f32 anyway).
"""

import functools
import math
import os
from typing import Optional

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # (torch's CPU builds come without it)
    triton = None

BLOCK_N = 64  # keys a loop iteration reads
PROGRAMS_A_PROCESSOR = 8  # how many programs a step aims for, per streaming multiprocessor


def available() -> bool:
    """Whether Triton is here (and torch can make its kernels an op of its own, opaque to torch.compile)."""
    return triton is not None and hasattr(torch.library, "custom_op")


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _processors(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (4 elsewhere: the interpreter, for the tests)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


@functools.cache
def _shared_bytes(device: torch.device) -> int:
    """The shared memory a program of a CUDA device may take (what Triton checks a kernel against
    at its first launch); elsewhere (the interpreter) no limit."""
    if device.type != "cuda":
        return 1 << 30
    props = torch.cuda.get_device_properties(device)
    return getattr(props, "shared_memory_per_block_optin", props.shared_memory_per_block)


def stages(shared_bytes: int, block_d: int, itemsize: int) -> int:
    """How many loop iterations' keys and values `_decode_split` keeps in flight (Triton's num_stages,
    3 by default): as many as fit `shared_bytes`, a program's shared memory (`_shared_bytes`).
    Triton's pipeline holds a block of keys and one of values a stage, so f32 caches do not fit
    at 3 for long heads (head_dim 256: 283 KB a program, past an H200's 227 KB; Triton refuses
    the launch)."""
    per_stage = 2 * BLOCK_N * block_d * itemsize
    return max(1, min(3, shared_bytes // per_stage))


def split_shape(rows: int, kv_heads: int, max_seq: int, processors: int) -> tuple[int, int]:
    """(splits, keys a split) for a step of `rows` rows of up to `max_seq` keys: enough programs
    (rows x KV heads x splits) for PROGRAMS_A_PROCESSOR a processor, a split at least BLOCK_N keys.
    Fixed by the step's shape (a captured step reads nothing of its positions on the host): a
    split past a row's last key returns at once."""
    blocks = -(-max_seq // BLOCK_N)
    wanted = -(-PROGRAMS_A_PROCESSOR * processors // (rows * kv_heads))
    splits = max(1, min(blocks, wanted))
    split_len = -(-blocks // splits) * BLOCK_N
    return -(-max_seq // split_len), split_len


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, used: torch.Tensor,
           window: int, sinks: torch.Tensor | None, scale: float) -> torch.Tensor:
    """`decode` as torch's op `linnet::triton_decode_attention`: a torch.compile trace of the step
    (LINNET_TORCH_INDUCTOR) takes it whole, its output's shape from `_decode_shape`."""
    return torch.ops.linnet.triton_decode_attention(q, k_cache, v_cache, used, sinks, window, scale)


def decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, used: torch.Tensor,
           window: int, sinks: torch.Tensor | None, scale: float, splits: int | None = None) -> torch.Tensor:
    """q [n, heads, d], row i's query against k_cache / v_cache [>= n, S, kv_heads, d] row i, its first
    used[i] keys (the last `window` of them, if set; none: zeros), heads grouped (head h reads KV
    head h // (heads / kv_heads)), with `sinks` [heads] (or None): [n, heads, d] in q's type.
    `splits` fixes the number of pieces a row's keys are cut in (tests); by default `split_shape`."""
    n, heads, d = q.shape
    seq, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    if splits is None:
        splits, split_len = split_shape(n, kv_heads, seq, _processors(q.device))
    else:
        split_len = -(-seq // splits)
    out = q.new_empty(n, heads, d)
    exact_dot = q.dtype == torch.float32 or _interpreted()
    block_g = max(16, triton.next_power_of_2(group))  # (tl.dot takes 16 rows at least)
    block_d = max(16, triton.next_power_of_2(d))  # (and 16 columns at least)
    sinks_arg = sinks if sinks is not None else q  # (a pointer the kernel never reads)
    common = dict(HEAD_DIM=d, BLOCK_D=block_d, SPLITS=splits, HAS_SINKS=sinks is not None)
    if splits == 1:
        partial, lse = out, out  # (written straight to `out`)
    else:
        partial = torch.empty(n, heads, splits, d, dtype=torch.float32, device=q.device)
        lse = torch.empty(n, heads, splits, dtype=torch.float32, device=q.device)
    _decode_split[(n, kv_heads, splits)](
        q, k_cache, v_cache, used, sinks_arg, out, partial, lse,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
        scale * math.log2(math.e), window or seq, split_len,  # no window: all S keys
        GROUP=group, BLOCK_G=block_g, BLOCK_N=BLOCK_N, EXACT_DOT=exact_dot,
        num_stages=stages(_shared_bytes(q.device), block_d, k_cache.element_size()), **common)
    if splits > 1:
        _decode_combine[(n, heads)](partial, lse, sinks_arg, out, out.stride(0), out.stride(1), heads,
                                    BLOCK_S=triton.next_power_of_2(splits), **common)
    return out


if triton is not None:
    @triton.jit
    def _dot(a, b, EXACT: tl.constexpr):
        """a @ b, summed in f32; EXACT: in f32 throughout (f32 inputs: no TF32; the interpreter)."""
        if EXACT:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a, b)

    @triton.jit
    def _sink_share(lse, sink):
        """The part of a head's softmax mass its keys keep beside its sink (a logit): 1 / (1 + e^(sink
        - lse)), lse the log (base 2) of the keys' sum of exponentials."""
        return 1.0 / (1.0 + tl.exp2(sink.to(tl.float32) * 1.4426950408889634 - lse))

    @triton.jit
    def _decode_split(q_ptr, k_ptr, v_ptr, used_ptr, sinks_ptr, out_ptr, partial_ptr, lse_ptr,
                      stride_qn, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                      stride_on, stride_oh, scale_log2, window, split_len,
                      GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                      BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, HAS_SINKS: tl.constexpr, EXACT_DOT: tl.constexpr):
        """One program: row, KV head, split. Its GROUP query heads against the split's keys, with an
        online softmax in base 2; the result normalised, with its log-sum-exp (one split: the output)."""
        row = tl.program_id(0).to(tl.int64)  # (a cache of 2^31 elements and more: offsets past int32)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        n_used = tl.load(used_ptr + row)
        first = tl.maximum(n_used - window, 0)
        lo = tl.maximum(split * split_len, first)
        hi = tl.minimum(split * split_len + split_len, n_used)

        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        heads = kv_head * GROUP + g
        g_ok = g < GROUP
        d_ok = d < HEAD_DIM
        q = tl.load(q_ptr + row * stride_qn + heads[:, None] * stride_qh + d[None, :],
                    mask=g_ok[:, None] & d_ok[None, :], other=0.0)
        k_row = k_ptr + row * stride_kb + kv_head * stride_kh
        v_row = v_ptr + row * stride_vb + kv_head * stride_vh
        top = tl.full([BLOCK_G], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            s = start + tl.arange(0, BLOCK_N)
            s_ok = s < hi
            kv_ok = s_ok[:, None] & d_ok[None, :]
            k = tl.load(k_row + s[:, None] * stride_ks + d[None, :], mask=kv_ok, other=0.0)
            scores = _dot(q, tl.trans(k), EXACT_DOT) * scale_log2
            scores = tl.where(s_ok[None, :], scores, float("-inf"))
            new_top = tl.maximum(top, tl.max(scores, 1))  # finite: the block has a key
            shrink = tl.exp2(top - new_top)
            p = tl.exp2(scores - new_top[:, None])
            total = total * shrink + tl.sum(p, 1)
            v = tl.load(v_row + s[:, None] * stride_vs + d[None, :], mask=kv_ok, other=0.0)
            acc = acc * shrink[:, None] + _dot(p.to(v.dtype), v, EXACT_DOT)
            top = new_top

        seen = total > 0.0
        result = acc / tl.where(seen, total, 1.0)[:, None]  # no keys: zeros
        lse = tl.where(seen, top + tl.log2(tl.where(seen, total, 1.0)), float("-inf"))
        if SPLITS == 1:
            if HAS_SINKS:
                result = result * _sink_share(lse, tl.load(sinks_ptr + heads, mask=g_ok, other=0.0))[:, None]
            tl.store(out_ptr + row * stride_on + heads[:, None] * stride_oh + d[None, :],
                     result.to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])
        else:
            at = (row * (GROUP * tl.num_programs(1)) + heads) * SPLITS + split  # [n, heads, SPLITS]
            tl.store(partial_ptr + at[:, None] * HEAD_DIM + d[None, :], result, mask=g_ok[:, None] & d_ok[None, :])
            tl.store(lse_ptr + at, lse, mask=g_ok)

    @triton.jit
    def _decode_combine(partial_ptr, lse_ptr, sinks_ptr, out_ptr, stride_on, stride_oh, heads,
                        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                        HAS_SINKS: tl.constexpr):
        """One program: row, head. Its splits' results weighed by their share of the softmax mass."""
        row = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        sp = tl.arange(0, BLOCK_S)
        d = tl.arange(0, BLOCK_D)
        sp_ok = sp < SPLITS
        d_ok = d < HEAD_DIM
        at = (row * heads + head) * SPLITS + sp
        lse = tl.load(lse_ptr + at, mask=sp_ok, other=float("-inf"))
        top = tl.max(lse, 0)
        top = tl.where(top > float("-inf"), top, 0.0)  # (no split has keys: no -inf - -inf below)
        weight = tl.where(lse > float("-inf"), tl.exp2(lse - top), 0.0)  # splits without keys weigh nothing
        total = tl.sum(weight, 0)
        parts = tl.load(partial_ptr + at[:, None] * HEAD_DIM + d[None, :], mask=sp_ok[:, None] & d_ok[None, :], other=0.0)
        result = tl.sum(parts * weight[:, None], 0) / tl.where(total > 0.0, total, 1.0)
        if HAS_SINKS:
            result = result * _sink_share(top + tl.log2(tl.where(total > 0.0, total, 1.0)), tl.load(sinks_ptr + head))
        tl.store(out_ptr + row * stride_on + head * stride_oh + d, result.to(out_ptr.dtype.element_ty), mask=d_ok)


if available():
    @torch.library.custom_op("linnet::triton_decode_attention", mutates_args=())
    def _decode_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, used: torch.Tensor,
                   sinks: Optional[torch.Tensor], window: int, scale: float) -> torch.Tensor:
        return decode(q, k_cache, v_cache, used, window, sinks, scale)

    @_decode_op.register_fake
    def _decode_shape(q, k_cache, v_cache, used, sinks, window, scale):
        return q.new_empty(q.shape)
