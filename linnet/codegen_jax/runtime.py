"""The small runtime that generated JAX modules import: the named high-level ops and `JaxModel`.

Exact numerics use plain attention in f32 and the highest matmul precision;
fast numerics use `jax.nn.dot_product_attention`, compute in the model's dtype,
norms and softmax in f32 (on the CPU, activations in f32 throughout: `gather_rows`).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import functools
import inspect
import math
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from linnet.codegen_jax import fixed_order
from linnet.kernels import pages, xla_kernels
from linnet.kernels.xla_kernels import Panels
from linnet.rope_tables import inv_frequencies

DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16, "i32": jnp.int32, "i64": jnp.int64,
          "bool": jnp.bool_}

# True while an entry over arrays spread on a mesh is traced: Linnet's CPU kernels (XLA custom calls,
# which the partitioner cannot split) give way to XLA's own ops.
_SHARDED = contextvars.ContextVar("linnet_sharded", default=False)
MESH_AXIS = "model"  # the mesh axis tensor parallelism splits over
# True while an entry whose stacked weights are each one array read by layer is traced: `loop` then
# compiles its body once, as an XLA loop (see JaxModel's `compiles_loops`).
_COMPILED_LOOPS = contextvars.ContextVar("linnet_compiled_loops", default=False)
# True while an entry of a model on one GPU is traced (`cudnn_attends`): the model's device, not
# JAX's default one, decides (a model placed on the CPU of a machine with a GPU).
_ON_GPU = contextvars.ContextVar("linnet_on_gpu", default=False)

COMPILE_THREADS = 8  # most compiles `JaxModel.compile_ahead` runs at once


def loops_over_stacks(platform: str, mesh) -> bool:
    """Whether a model keeps each stacked linear weight one array [layers, ...] and compiles its
    layer loops as XLA loops that read a layer of it at a traced index: on one GPU, unless
    LINNET_JAX_UNROLL_LAYERS=1 (each layer's weights an array of their own and the loops unrolled,
    each layer traced and compiled apart: to compare). Unrolled, an 8B model's pass shape took
    8.5 s to compile alone on an H200 and 68-117 s beside the warmup's other shapes, so that no
    JAX run of the GPU check got past its warmup. (The CPU's panels loop on their own terms.)"""
    return mesh is None and platform == "gpu" and os.environ.get("LINNET_JAX_UNROLL_LAYERS", "0") != "1"


# XLA's options for every entry compiled for a GPU, each where this jaxlib knows it and XLA_FLAGS does
# not name it (a user's own flag wins): `compiler_options`.
GPU_COMPILER_OPTIONS = {
    # cuBLAS for every matmul. XLA otherwise autotunes Triton GEMM kernels for each matmul fusion,
    # compiling dozens of candidates: an 8B model's packed-pass shape took 47-50 s to compile on an
    # H200, and a warmup compiles ten of them. cuBLAS alone reads a decode step's weights at the
    # memory's pace (torch's steps run on it).
    "xla_gpu_enable_triton_gemm": False,
}

# Bounds the keys gathered at once in packed attention: [chunk, MaxSeq, kv_heads, head_dim].
_GATHER_ELEMENTS = 1 << 24


def linear(x, w, bias=None, out_dtype=None):
    """x @ w.T (+ bias). `out_dtype`: the result's type where the generated code widens the product
    (`linear(...) as f32`, a head's logits): the f32 sums as they are (the dot's preferred type,
    Linnet's kernel's output), but for a fused group's member, whose product is the group's, in x's type."""
    if isinstance(w, DeviceMajorRows):  # (fused_outputs: never with a bias)
        return DeviceMajorProduct(linear(x, w.rows, out_dtype=out_dtype), w.parts, w.shards)
    if isinstance(w, FusedPart):  # the group's whole matmul; XLA's CSE leaves one for all members
        y = linear(x, w.fused)[..., w.start:w.stop]
    elif isinstance(w, Panels):
        y = xla_kernels.linear(x, w, out_dtype)
    elif _reduces_narrow_weight(x, w):
        y = _multiply_and_sum(x, w, out_dtype)
    else:
        if x.dtype != w.dtype:  # f32 activations and a 16-bit weight (`gather_rows`): in f32, as XLA's CPU dot does
            w = w.astype(x.dtype)
        y = jax.lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ())), preferred_element_type=out_dtype)
    y = y if bias is None else y + bias
    return y if out_dtype is None else y.astype(out_dtype)


class FusedPart(NamedTuple):
    """One member's rows of a fused weight [sum of N, K] (q, k and v; gate and up): made inside an
    entry's trace from the one array the group is held as (`JaxModel.fuse_linear_groups`). Its
    members' matmuls are the same op on the same operands, which XLA merges into one. A 16-row
    SmolLM2 decode step in bf16 took 96-115 ms so against 177-200 as five products; in f32 the
    two were within the machine's noise."""

    fused: Any
    start: int
    stop: int


class DeviceMajorRows(NamedTuple):
    """A weight that holds several projections by rows (a class's `fused_parts`: Phi-3's q/k/v,
    its gate/up) as it lies on a mesh of `shards` devices (`device_major_order`): device d's
    block of rows is its share of each part, in part order. `linear` over it gives a
    `DeviceMajorProduct`."""

    rows: Any
    parts: tuple  # ((start, stop), ...) of the rows as the checkpoint orders them
    shards: int


class DeviceMajorProduct:
    """x @ a `DeviceMajorRows`.T: its features device by device. The generated code reads it only
    through slices of one part (`qkv[:, start:stop]`), each read from every device's share, so
    each device keeps its own heads, its own gate and up, and nothing is gathered."""

    def __init__(self, y, parts: tuple, shards: int):
        self.y, self.parts, self.shards = y, parts, shards

    def __getitem__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        y, n = self.y, self.shards
        *lead, last = index
        if len(index) != y.ndim or any(s != slice(None) for s in lead) or not isinstance(last, slice) or \
                last.step not in (None, 1):
            raise TypeError(f"a fused projection's product is read by slices of its last axis, not {index!r}")
        span = last.indices(y.shape[-1])[:2]
        if span not in self.parts:
            raise ValueError(f"a fused projection's product is read by its parts {self.parts}, not {span}")
        by_device = y.reshape(y.shape[:-1] + (n, y.shape[-1] // n))
        return by_device[..., span[0] // n:span[1] // n].reshape(y.shape[:-1] + (span[1] - span[0],))


def device_major_order(parts: tuple, shards: int) -> np.ndarray:
    """The checkpoint's rows of a fused weight in `DeviceMajorRows` order: for each device in
    turn, its 1 / shards of each part."""
    return np.concatenate([np.arange(start + d * (stop - start) // shards, start + (d + 1) * (stop - start) // shards)
                           for d in range(shards) for start, stop in parts])


NARROW_REDUCE_ROWS = 64
HALF_FLOATS = (jnp.bfloat16, jnp.float16)  # the 16-bit floats XLA's CPU backend widens: see `linear`, `put`


def _reduces_narrow_weight(x, w) -> bool:
    """Whether a bf16 / f16 linear is written as a multiply and a sum rather than a dot: on the
    CPU, up to NARROW_REDUCE_ROWS rows (decode steps, short passes). XLA's CPU dot widens a bf16
    weight to f32 in memory at every call, while the multiply-and-sum goes to a fused kernel
    (YNNPACK's, in jaxlib 0.10) that reads the weight as it is. SmolLM2's tied head, cold,
    2 rows: 7 ms against the dot's 67 (f32's dot: 13); 64 rows: 31 against 90; by 256 rows the
    dot wins. Products are exact in f32 and summed in f32, as the dot does."""
    rows = math.prod(x.shape[:-1])
    return (w.dtype in HALF_FLOATS and rows <= NARROW_REDUCE_ROWS
            and jax.default_backend() == "cpu")


def _multiply_and_sum(x, w, out_dtype=None):
    """x [..., K] @ w[N, K].T in f32, rounded to x's type (or `out_dtype`). One row is summed as a vector against
    w: XLA lowered the [1, N, K] form of it to a slow loop (SmolLM2's head: 100 ms against 7)."""
    lead, k = x.shape[:-1], x.shape[-1]
    xf = x.reshape(-1, k).astype(jnp.float32)
    if xf.shape[0] == 1:
        y = jnp.sum(xf[0] * w.astype(jnp.float32), axis=-1)[None]
    else:
        y = jnp.sum(xf[:, None, :] * w.astype(jnp.float32), axis=-1)
    return y.reshape(lead + (w.shape[0],)).astype(out_dtype or x.dtype)


def gather_rows(table, ids):
    """table[ids]: a param's rows (an embedding's), where a pass's activations begin.

    On the CPU a bf16 / f16 table gives f32 rows, and the pass then carries its activations in f32,
    as torch's runtime does where the CPU has no instructions for the type: XLA's CPU backend
    computes a 16-bit elementwise op in f32 anyway (x86 has no bf16 arithmetic but dot products),
    and rounding after each op cost precision for nothing: SmolLM2's bf16 logits drifted from
    f32's by 0.93 (transformers' bf16: 0.87), and its answer to "What is the capital of France?"
    began "L'Étoile"; in f32, 0.20, and "The capital of France is Paris." No slower on an AVX2 CPU
    (a 512-token pass and a 16-row decode step, alternated). The weights and the cache keep their
    type; the kernels read them as they are."""
    rows = _gather(table, ids)
    return rows.astype(jnp.float32) if rows.dtype in HALF_FLOATS and jax.default_backend() == "cpu" else rows


def gelu(x):
    return jax.nn.gelu(x, approximate=False)


def gelu_tanh(x, fast: bool):
    """GELU's tanh form, `gelu(x, approximate="tanh")`: exact numerics, transformers' NewGELUActivation's
    formula op by op (in f32, T's type there); fast, in f32 and rounded once to x's type (torch's
    runtime computes the same)."""
    if not fast:
        return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * jnp.power(x, 3.0))))
    return jax.nn.gelu(x.astype(jnp.float32), approximate=True).astype(x.dtype)


def rmsnorm(x, weight, eps: float):
    h = x.astype(jnp.float32)
    # the mean's sum in one order at every row count (`fixed_order`): XLA's own varies with the pass's rows
    h = h * jax.lax.rsqrt(fixed_order.row_sum(h * h, keepdims=True) / h.shape[-1] + eps)
    return weight * h.astype(x.dtype)


def layer_norm(x, weight, bias, eps: float, fast: bool = False):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis, in f32 and rounded to x's type
    once, as torch's F.layer_norm computes a 16-bit x (flax's LayerNorm takes its statistics in f32
    too). The variance is the mean of (x - mean)^2, both sums in one order at every row count; the
    same in either numerics (`fast` is the torch runtime's choice of kernel)."""
    h = x.astype(jnp.float32)
    h = h - fixed_order.row_sum(h, keepdims=True) / h.shape[-1]
    h = h * jax.lax.rsqrt(fixed_order.row_sum(h * h, keepdims=True) / h.shape[-1] + eps)
    if weight is not None:
        h = h * weight.astype(jnp.float32)
    if bias is not None:
        h = h + bias.astype(jnp.float32)
    return h.astype(x.dtype)


def softmax(x, axis: int = -1):
    p = fixed_order.softmax(jnp.moveaxis(x.astype(jnp.float32), axis, -1))
    return jnp.moveaxis(p, -1, axis).astype(x.dtype)


def rope_table(head_dim: int, max_seq: int, theta: float, **scaling) -> np.ndarray:
    """cos and sin for every position: [max_seq, 2, head_dim // 2], f32 (a constant of the program)."""
    inv_freq, attention_factor = inv_frequencies(head_dim, theta, **scaling)  # scaling: rope's static kwargs
    angles = np.outer(np.arange(max_seq, dtype=np.float64), inv_freq)
    return (np.stack([np.cos(angles), np.sin(angles)], axis=1) * attention_factor).astype(np.float32)


def rope(x, positions, table):
    cs = jnp.asarray(table)[positions]
    cos, sin = cs[:, 0, None, :], cs[:, 1, None, :]
    h = x.astype(jnp.float32)
    x1, x2 = jnp.split(h, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class CacheLayer(NamedTuple):
    """Layer `index` of a stacked cache [layers, Batch, MaxSeq, ...], not sliced out: what
    generated code hands `attention` (`rt.layer(k_cache, l)`). The chunk walks read their keys
    straight from the stack; a slice handed to a loop would first be copied whole (about 1 ms a
    layer and a cache at Batch 16, MaxSeq 640)."""

    stack: jax.Array
    index: Any

    @property
    def shape(self) -> tuple:
        return self.stack.shape[1:]

    def whole(self):
        return self.stack[self.index]

    def at(self, rows, positions):
        """[n, ...]: the entries at (rows[i], positions[i])."""
        return self.stack[self.index, rows, positions]

    def chunk(self, rows, start, size: int, nb: int):
        """[b, size, ...]: positions start .. start + size of rows[b] (rows 0 .. nb - 1 when None)."""
        if rows is None:
            starts = (self.index, 0, start) + (0,) * (self.stack.ndim - 3)
            return jax.lax.dynamic_slice(self.stack, starts, (1, nb, size) + self.stack.shape[3:])[0]
        batch, seq = self.stack.shape[1:3]
        flat = self.stack.reshape((-1,) + self.stack.shape[3:])
        return _gather(flat, ((self.index * batch + rows) * seq + start)[:, None] + jnp.arange(size))


def _gather(a, index):
    """a[index]; a 16-bit float array is gathered as its bits. XLA otherwise moves the f32 convert
    that follows the gather in front of it: a bf16 prefill converted each layer's whole stacked
    cache to f32, twice (2.7 ms each, a third of SmolLM2's 512-token pass)."""
    if a.dtype not in HALF_FLOATS:
        return a[index]
    return jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(a, jnp.uint16)[index], a.dtype)


def loop(count: int, body, carry):
    """`for i in range(count): carry = body(i, carry)`; returns the last carry. Generated code
    writes a layer loop so where its index only picks layers (`codegen_jax.loops`).

    Where the model's stacked weights are each one array read a layer at a time (the CPU's panels,
    which Linnet's kernels read in place; a GPU's stacked arrays), an XLA while loop: the body is
    traced and compiled once. SmolLM2's 30 layers compiled in 1.6-1.9 s per packed-pass shape
    unrolled on this CPU, 0.3-0.5 s so. Elsewhere (a CPU's exact numerics, which hold each layer's
    weight as an array of its own that a traced index cannot pick; a mesh; a GPU under
    LINNET_JAX_UNROLL_LAYERS) the loop is unrolled as Python's."""
    if _COMPILED_LOOPS.get():
        types = [a.dtype for a in carry]

        def on_bits(i, bits):  # 16-bit floats carried as their bits, as the state is held (`_on_bits`)
            out = body(i, tuple(_unbits(a, t) for a, t in zip(bits, types)))
            return tuple(_bits(a) for a in out)
        out = jax.lax.fori_loop(0, count, on_bits, tuple(_bits(a) for a in carry))
        return tuple(_unbits(a, t) for a, t in zip(out, types))
    for i in range(count):
        carry = body(i, carry)
    return carry


class LayerStack:
    """A stacked param as generated code reads it, a layer at a time (`params["wq"][l]`), where
    `l` is a Python int or a traced index: `layer(l)` makes that layer's view inside the trace."""

    def __init__(self, layer):
        self.layer = layer

    def __getitem__(self, index):
        return self.layer(index)


def layer(stack, index) -> CacheLayer:
    return CacheLayer(stack, index)


def attention(q, k_cache, v_cache, positions, rows=None, window: int = 0, sinks=None, scale=None, softcap: float = 0.0,
              fast: bool = False):
    """Token i attends to cache row rows[i] (row i when rows is None) at positions <= positions[i].
    The caches are [Batch, MaxSeq, kv_heads, head_dim] arrays or `CacheLayer`s of a stack.

    Any pack is attended correctly. A pack laid out as the engine's JAX runner lays it out is
    attended cheaply: its first HEAD tokens (one per row at most: decoding rows, one-token
    prompt rests) each read their own row, and the tokens after them come in blocks of BLOCK
    tokens of one row, each block reading one row. A pack that is not laid out so (checked on
    the device) falls back to reading one row per token. Padding tokens, at positions >= MaxSeq,
    get some output and widen no walk. `softcap` (0: none) caps each score s as softcap * tanh(s /
    softcap) (Gemma 2's) before the softmax: Linnet's CPU kernel does; where it does not run (no walk
    of the keys caps), such a call reads whole rows and computes in f32, as exact numerics do.
    """
    n, heads, head_dim = q.shape
    scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
    if not isinstance(k_cache, CacheLayer):
        k_cache, v_cache = CacheLayer(jnp.asarray(k_cache)[None], 0), CacheLayer(jnp.asarray(v_cache)[None], 0)
    batch, seq = k_cache.shape[:2]
    if fast and not _SHARDED.get() and xla_kernels.attends_here(k_cache.stack, head_dim):
        # Linnet's kernel, a token at a time, each reading its own row up to its own position: a
        # prompt's tokens too, whose keys the pass has written to the cache by now. A 480-token
        # prefill of SmolLM2 (f32): 1.70 s, against 2.10 with prompts in the blocked path below.
        rows = jnp.arange(n, dtype=jnp.int32) if rows is None else rows
        return xla_kernels.attention_rows(q, k_cache.stack, v_cache.stack, k_cache.index, rows, positions,
                                          window, sinks, scale, softcap)
    if softcap:  # Linnet's CPU kernel caps scores; no walk of the keys, cuDNN's or XLA's, does: the f32 reference
        fast = False
    if not (fast and _walks_keys(seq)):
        return _attend_reading_rows(q, k_cache.whole(), v_cache.whole(), positions, rows, window, sinks, scale, fast,
                                    softcap)

    def one_per_row(q, positions, rows):  # token i reads row rows[i] (row i when rows is None)
        return _attend_walking(q[:, None], k_cache, v_cache, positions[:, None], rows, window, sinks, scale)

    head = head_tokens(batch)
    if rows is None or n <= head or n % BLOCK:
        return one_per_row(q, positions, rows)
    first = one_per_row(q[:head], positions[:head], rows[:head])
    q2, p2, r2 = q[head:], positions[head:], rows[head:]
    blocks = r2.reshape(-1, BLOCK)
    own = _own_keys(r2, p2, seq)
    start = jnp.min(jnp.where(own, p2[None, :], seq), axis=1)  # each token's row's first position in the pass
    laid_out = jnp.all(blocks == blocks[:, :1]) & _runs_are_whole(own, p2, start, seq)
    # Both paths, the fallback walking no chunk unless needed: a select rather than a lax.cond.
    rest = jnp.where(laid_out, _attend_pass(q2, k_cache, v_cache, p2, r2, own, start, window, sinks, scale),
                     _attend_walking(q2[:, None], k_cache, v_cache, p2[:, None], r2, window, sinks, scale,
                                     needed=~laid_out))
    return jnp.concatenate([first, rest])


def _attend_reading_rows(q, k_cache, v_cache, positions, rows, window, sinks, scale, fast, softcap=0.0):
    """`attention` reading whole cache rows: GPUs (fused attention over fixed shapes), exact numerics
    and capped scores where Linnet's kernel does not run."""
    n = q.shape[0]
    if rows is None:
        return _attend(q, k_cache[:n], v_cache[:n], positions, window, sinks, scale, fast, softcap)
    head = head_tokens(k_cache.shape[0])
    if n <= head or n % BLOCK:
        return _attend_gathered(q, k_cache, v_cache, positions, rows, window, sinks, scale, fast, softcap)
    first = _attend_gathered(q[:head], k_cache, v_cache, positions[:head], rows[:head], window, sinks, scale, fast,
                             softcap)
    q2, p2, r2 = q[head:], positions[head:], rows[head:]
    blocks = r2.reshape(-1, BLOCK)
    per_block = lambda: _attend_blocks(q2, k_cache, v_cache, p2, blocks[:, 0], window, sinks, scale, fast, softcap)
    per_token = lambda: _attend_gathered(q2, k_cache, v_cache, p2, r2, window, sinks, scale, fast, softcap)
    return jnp.concatenate([first, jax.lax.cond(jnp.all(blocks == blocks[:, :1]), per_block, per_token)])


BLOCK = 8


def head_tokens(rows: int) -> int:
    """Tokens at the start of a pack that read one row each: the cache rows, rounded up to BLOCK."""
    return -(-rows // BLOCK) * BLOCK


def _attend_gathered(q, k_cache, v_cache, positions, rows, window, sinks, scale, fast, softcap=0.0):
    n = q.shape[0]
    per_token = k_cache.shape[1] * k_cache.shape[2] * k_cache.shape[3]
    chunk = max(1, _GATHER_ELEMENTS // per_token)
    outs = [_attend(q[s:s + chunk], k_cache[rows[s:s + chunk]], v_cache[rows[s:s + chunk]],
                    positions[s:s + chunk], window, sinks, scale, fast, softcap) for s in range(0, n, chunk)]
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs)


def _attend_blocks(q, k_cache, v_cache, positions, block_rows, window, sinks, scale, fast, softcap=0.0):
    """Each block of BLOCK queries against the one cache row it belongs to."""
    n, heads, head_dim = q.shape
    nb = n // BLOCK
    keys, values = k_cache[block_rows], v_cache[block_rows]  # [nb, S, kvh, d]
    seq, kv_heads = keys.shape[1], keys.shape[2]
    pos = positions.reshape(nb, BLOCK)
    visible = _visible(jnp.arange(seq)[None, None, :], pos[:, :, None], window)  # [nb, BLOCK, S]
    qb = q.reshape(nb, BLOCK, heads, head_dim)
    if fast and sinks is None:
        keys, values = _like(keys, qb), _like(values, qb)
        out = jax.nn.dot_product_attention(qb, keys, values, mask=visible[:, None], scale=scale)
        return out.reshape(n, heads, values.shape[-1])
    group = heads // kv_heads
    qg = qb.reshape(nb, BLOCK, kv_heads, group, head_dim).astype(jnp.float32)
    scores = _capped(jnp.einsum("btkgd,bskd->bkgts", qg, keys.astype(jnp.float32),
                                precision=jax.lax.Precision.HIGHEST) * scale, softcap)
    scores = jnp.where(visible[:, None, None], scores, -jnp.inf)
    probs = _softmax_with_sinks(scores, sinks, kv_heads, group)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, values.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    return out.reshape(n, heads, values.shape[-1]).astype(q.dtype)


def _like(cache_part, q):
    """Keys or values in q's type, for the fused attention, which takes one type: a 16-bit cache
    read by f32 activations (the CPU's, `gather_rows`) is widened, exactly."""
    return cache_part if cache_part.dtype == q.dtype else cache_part.astype(q.dtype)


def _visible(key_positions, positions, window: int):
    """Key at key_positions seen by a token at positions (broadcast together): at or before it, and
    within the window when there is one."""
    visible = key_positions <= positions
    if window:
        visible = visible & (key_positions > positions - window)
    return visible


def _softmax_with_sinks(scores, sinks, kv_heads, group):
    """Softmax over the last axis; a sink adds one more logit per head to the denominator only."""
    if sinks is None:
        return jax.nn.softmax(scores, axis=-1)
    shape = (1, kv_heads, group) + (1,) * (scores.ndim - 3)
    sink = jnp.broadcast_to(sinks.astype(jnp.float32).reshape(shape), scores.shape[:-1] + (1,))
    return jax.nn.softmax(jnp.concatenate([scores, sink], axis=-1), axis=-1)[..., :-1]


def _capped(scores, softcap: float):
    """softcap * tanh(scores / softcap), as Gemma 2 caps its attention scores; 0: the scores as they are."""
    return jnp.tanh(scores / softcap) * softcap if softcap else scores


def _attend(q, keys, values, positions, window, sinks, scale, fast, softcap=0.0):
    n, heads, head_dim = q.shape
    seq, kv_heads = keys.shape[1], keys.shape[2]
    if fast and sinks is None and not window and cudnn_attends(q.dtype, heads, kv_heads, head_dim):
        # cuDNN's fused attention, each row's keys up to its position given as its length (a padding
        # token, at MaxSeq, as one key: some output, thrown away)
        used = jnp.where(positions < seq, positions + 1, 1).astype(jnp.int32)
        out = jax.nn.dot_product_attention(q[:, None], _like(keys, q), _like(values, q), scale=scale,
                                           key_value_seq_lengths=used, implementation="cudnn")
        return out[:, 0]
    visible = _visible(jnp.arange(seq)[None, :], positions[:, None], window)  # [n, S]
    if fast and sinks is None:
        keys, values = _like(keys, q), _like(values, q)
        out = jax.nn.dot_product_attention(q[:, None], keys, values, mask=visible[:, None, None, :], scale=scale)
        return out[:, 0]
    group = heads // kv_heads
    qg = q.reshape(n, kv_heads, group, head_dim).astype(jnp.float32)
    scores = _capped(jnp.einsum("nkgd,nskd->nkgs", qg, keys.astype(jnp.float32),
                                precision=jax.lax.Precision.HIGHEST) * scale, softcap)
    scores = jnp.where(visible[:, None, None, :], scores, -jnp.inf)
    probs = _softmax_with_sinks(scores, sinks, kv_heads, group)
    out = jnp.einsum("nkgs,nskd->nkgd", probs, values.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    return out.reshape(n, heads, values.shape[-1]).astype(q.dtype)


def cudnn_attends(dtype, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether one query a row (decode steps, a pack's one-token segments) attends through cuDNN's
    fused attention (`jax.nn.dot_product_attention(implementation="cudnn")`), told each row's length:
    on one GPU (`_ON_GPU`), for 16-bit types, where a small call of these heads compiles (the one
    device check; LINNET_JAX_CUDNN=0 keeps XLA's own attention, to compare). XLA's reads every
    MaxSeq position of every row through unfused products, its scores in memory between them."""
    return (dtype in HALF_FLOATS and _ON_GPU.get() and os.environ.get("LINNET_JAX_CUDNN", "1") != "0"
            and _cudnn_compiles(np.dtype(dtype).name, heads, kv_heads, head_dim))


@functools.cache
def _cudnn_compiles(dtype: str, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether cuDNN's attention takes these heads and type here (a jaxlib and a cuDNN that may
    not): a small call compiled once; a refusal keeps XLA's attention rather than failing the model."""
    t = jnp.dtype(dtype)
    shapes = [jax.ShapeDtypeStruct((2, 1, heads, head_dim), t), jax.ShapeDtypeStruct((2, 256, kv_heads, head_dim), t),
              jax.ShapeDtypeStruct((2, 256, kv_heads, head_dim), t), jax.ShapeDtypeStruct((2,), jnp.int32)]

    def call(q, k, v, used):
        return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=used, implementation="cudnn")
    try:
        jax.jit(call).lower(*shapes).compile()
    except Exception:  # (a jaxlib's or cuDNN's refusal: its type has moved between versions)
        return False
    return True


KEY_CHUNK = 128


def _walks_keys(max_seq: int) -> bool:
    """Whether attention walks the keys chunk by chunk, up to the furthest position only: on the
    CPU, where attending over all MaxSeq keys of every row grew a SmolLM2 decode step from 105 ms
    at MaxSeq 160 to 256 ms at 640. The one device check for it; GPUs keep the fused attention.
    Up to two chunks the walk does not pay: one request at MaxSeq 256 decoded in 29-32 ms reading
    every key against 33-34 ms walking; 16 rows at MaxSeq 160 ran the same either way."""
    return max_seq > 2 * KEY_CHUNK and jax.default_backend() == "cpu"


def _attend_walking(q, k_cache, v_cache, positions, rows, window, sinks, scale, needed=True):
    """Groups of queries, each group reading one cache row, against the keys in KEY_CHUNK steps,
    stopping after the chunk that holds the furthest position: the work follows the tokens'
    positions instead of MaxSeq, and only the chunks walked are read.

    q[b, t, h, d] and positions[b, t]: group b's t tokens read row rows[b] (row b when rows is
    None). Padding tokens (positions >= MaxSeq) do not extend the walk. Returns [b * t, h, d];
    zeros, having walked nothing, where `needed` (on the device) is false.
    """
    nb, t, heads, head_dim = q.shape
    seq, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    qk = (q.reshape(nb, t, kv_heads, group, head_dim).transpose(0, 2, 1, 3, 4)
          .reshape(nb, kv_heads, t * group, head_dim).astype(jnp.float32) * scale)
    pos = jnp.repeat(positions, group, axis=1)[:, :, None]  # [b, t * g, 1]: a query per head of a token
    furthest = jnp.max(jnp.where(positions < seq, positions, 0))
    chunks = jnp.where(needed, furthest // KEY_CHUNK + 1, 0)
    carry = _walk(qk, k_cache, v_cache, rows, lambda span: _visible(span, pos, window), chunks)
    out = _finish(carry, None if sinks is None else jnp.tile(sinks.reshape(kv_heads, group), (1, t)))
    out = out.reshape(nb, kv_heads, t, group, head_dim).transpose(0, 2, 1, 3, 4)
    return out.reshape(nb * t, heads, head_dim).astype(q.dtype)


def _own_keys(rows, positions, seq: int):
    """[m, m] bool: key j of the pass is in query i's row (and is no padding token)."""
    return (rows[:, None] == rows[None, :]) & (positions < seq)[None, :]


def _runs_are_whole(own, positions, start, seq: int):
    """Whether each token's row holds, in this pass, every position from the row's first one in
    the pass (`start`) up to the token's own: what `_attend_pass` assumes of a pack."""
    count = jnp.sum(own & (positions[None, :] <= positions[:, None]), axis=1)
    return jnp.all((count == positions - start + 1) | (positions >= seq))


def _attend_pass(q, k_cache, v_cache, positions, rows, own, start, window, sinks, scale):
    """Runs of a packed pass (blocks of BLOCK tokens of one row; each row's positions in the pass
    consecutive) in two parts joined by one softmax: the pass's own keys, all against all with a
    mask (dense matmuls, the bulk of a fresh prompt's attention), and the keys cached before each
    row's first position in the pass, walked in chunks (none for a fresh prompt).

    q[m, h, d]; own: `_own_keys(rows, positions, MaxSeq)`; start: each token's row's first position
    in the pass. Queries are laid out a KV head at a
    time ([kvh, m * g, d]), so that every matmul has its batch axis first: XLA's CPU dots run
    about three times faster so than with the batch axis in the middle.
    """
    m, heads, head_dim = q.shape
    seq, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group, nb = heads // kv_heads, m // BLOCK
    qk = q.reshape(m, kv_heads, group, head_dim).transpose(1, 0, 2, 3).reshape(kv_heads, m * group, head_dim)
    qk = qk.astype(jnp.float32) * scale
    pos = jnp.repeat(positions, group).reshape(nb, BLOCK * group, 1)
    before = jnp.repeat(start, group).reshape(nb, BLOCK * group, 1)
    cached = lambda span: _visible(span, pos, window) & (span < before)
    furthest = jnp.max(jnp.where(positions < seq, start, 0))  # keys below it come from the cache
    carry = _walk(qk.reshape(kv_heads, nb, BLOCK * group, head_dim).transpose(1, 0, 2, 3), k_cache, v_cache,
                  rows.reshape(nb, BLOCK)[:, 0], cached, (furthest + KEY_CHUNK - 1) // KEY_CHUNK)
    carry = tuple(c.transpose((1, 0) + tuple(range(2, c.ndim))).reshape((kv_heads, m * group) + c.shape[3:])
                  for c in carry)
    at = jnp.minimum(positions, seq - 1)  # this pass's keys, where it has just written them
    keys = k_cache.at(rows, at).astype(jnp.float32).transpose(1, 0, 2)  # [kvh, m, d]
    values = v_cache.at(rows, at).astype(jnp.float32).transpose(1, 0, 2)
    visible = jnp.repeat(own & _visible(positions[None, :], positions[:, None], window), group, axis=0)
    scores = jnp.where(visible[None], jnp.einsum("kqd,kjd->kqj", qk, keys), -jnp.inf)
    carry = _merge(carry, _part(scores, lambda w: jnp.einsum("kqj,kjd->kqd", w, values)))
    out = _finish(carry, None if sinks is None else jnp.tile(sinks.reshape(kv_heads, group), (1, m)))
    return out.reshape(kv_heads, m, group, head_dim).transpose(1, 0, 2, 3).reshape(m, heads, head_dim).astype(q.dtype)


def _walk(qk, k_cache, v_cache, rows, visible, chunks):
    """A running softmax over KEY_CHUNK-key chunks 0 .. chunks - 1 of each group's cache row.

    qk[b, kvh, q, d] (scaled, f32); rows[b] (row b when None); visible(span[C]) -> [b, q, C].
    Returns (best, total, acc): [b, kvh, q] twice and [b, kvh, q, d]. The last chunk is aligned
    to end at MaxSeq, overlapping its predecessor, whose keys are masked out of it.
    """
    nb = qk.shape[0]
    seq = k_cache.shape[1]

    def read(cache, start):
        return cache.chunk(rows, start, KEY_CHUNK, nb).astype(jnp.float32).transpose(0, 2, 1, 3)  # [b, kvh, C, d]

    def step(c, carry):
        start = jnp.minimum(c * KEY_CHUNK, seq - KEY_CHUNK)
        span = start + jnp.arange(KEY_CHUNK)
        seen = visible(span) & (span >= c * KEY_CHUNK)  # not the overlap again
        scores = jnp.where(seen[:, None], jnp.einsum("bkqd,bksd->bkqs", qk, read(k_cache, start)), -jnp.inf)
        return _merge(carry, _part(scores, lambda w: jnp.einsum("bkqs,bksd->bkqd", w, read(v_cache, start))))

    shape = qk.shape[:-1]
    init = (jnp.full(shape, -jnp.inf, jnp.float32), jnp.zeros(shape, jnp.float32),
            jnp.zeros(shape + (v_cache.shape[-1],), jnp.float32))
    return jax.lax.fori_loop(0, chunks, step, init)


def _part(scores, weigh):
    """The softmax of one set of keys as (best logit, total weight, weighted values): scores[..., s],
    -inf where not visible; weigh(weights[..., s]) -> [..., d]. Kept apart from any running state
    until `_merge`: folded straight into one, XLA's CPU fusion ran the dense part 2-3x slower."""
    best = scores.max(axis=-1)
    weights = jnp.exp(scores - jnp.where(jnp.isfinite(best), best, 0.0)[..., None])  # no key seen: all 0
    return best, weights.sum(axis=-1), weigh(weights)


def _merge(a, b):
    """Two softmax parts over disjoint keys as one."""
    top = jnp.maximum(a[0], b[0])
    safe = jnp.where(jnp.isfinite(top), top, 0.0)
    wa, wb = jnp.exp(a[0] - safe), jnp.exp(b[0] - safe)
    return top, a[1] * wa + b[1] * wb, a[2] * wa[..., None] + b[2] * wb[..., None]


def _finish(carry, sinks):
    """The running softmax's output [..., d]; sinks (broadcast against the totals) add one logit
    per head to the denominator only. A padding token may have seen no key: 0, not NaN."""
    best, total, acc = carry
    if sinks is not None:
        top = jnp.maximum(best, sinks)
        total = total * jnp.exp(best - top) + jnp.exp(sinks - top)
        acc = acc * jnp.exp(best - top)[..., None]
    return acc / jnp.where(total > 0, total, 1.0)[..., None]


COPY_BLOCK = 256  # positions a step of copy_rows' loop moves


def copy_rows(cache, src, dst, upto):
    """Row dst[i] takes row src[i]'s first upto[i] positions, in every layer.

    A loop over blocks of positions up to the longest prefix (its trip count read on the device:
    one executable whatever it is), on the cache's bits (`_bits`) from start to end. Over whole
    rows (the runner pads src and dst to Batch rows), with `put`'s bitcasts at each write, a copy
    read and wrote every row: SmolLM2's 8 bf16 rows of 8192, 0.45 s a cache, against 6 ms so.
    Positions past the row (in the last block) are read clipped and their writes dropped; each
    block is read before it is written and no two share a position, so a row both copied from
    and into gives what it held, as a copy of whole rows does."""
    bits = _bits(cache)
    block = min(COPY_BLOCK, bits.shape[2])

    def step(b, c):
        positions = b * block + jnp.arange(block)
        keep = positions[None, :] < upto[:, None]  # [K, block]
        keep = keep.reshape((1,) + keep.shape + (1,) * (c.ndim - 3))
        at = (slice(None), dst[:, None], positions[None, :])
        moved = c.at[:, src[:, None], positions[None, :]].get(mode="clip")
        return c.at[at].set(jnp.where(keep, moved, c.at[at].get(mode="clip")), mode="drop")

    return _unbits(jax.lax.fori_loop(0, (jnp.max(upto) + block - 1) // block, step, bits), cache.dtype)


def put(state, index: tuple, value):
    """`state.at[index].set(value, mode="drop")`: a functional write that drops the entries whose
    index falls outside `state` (padding tokens, at position MaxSeq: vLLM's slot -1).

    A 16-bit float state is written as its bits. XLA's CPU backend has no bf16 / f16 scatter: it
    widens the whole operand to f32, scatters and narrows it back, which for a KV cache is two
    passes over every layer's cache at each layer's write (a 16-row bf16 SmolLM2 decode step took
    750 ms, and 389 written as bits). The same bits scattered as uint16 are the same write.
    """
    written = _bits(state).at[index].set(_bits(jnp.asarray(value, state.dtype)), mode="drop")
    return _unbits(written, state.dtype)


def _bits(a):
    """A 16-bit float array as its uint16 bits; others as they are."""
    return jax.lax.bitcast_convert_type(a, jnp.uint16) if a.dtype in HALF_FLOATS else a


def _bits_type(dtype):
    """The type `_bits` gives an array of `dtype`."""
    return jnp.uint16 if dtype in HALF_FLOATS else dtype


def _unbits(a, dtype):
    return jax.lax.bitcast_convert_type(a, dtype) if a.dtype != dtype else a


# [m, in] rows grouped by expert, times [experts, out, in]: contract `in`, ragged over the rows.
_BY_EXPERT = jax.lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(([1], [2]), ([], [])),
                                                lhs_ragged_dimensions=[0], rhs_group_dimensions=[0])


def expert_linear(x, w, experts, bias=None):
    """y[i, j] = x[i] @ w[experts[i, j]].T (+ bias[experts[i, j]]): [n, k, out] for x [n, in] or [n, k, in].

    The n * k (token, expert) pairs are sorted by expert and multiplied as one ragged dot, whose
    groups are the experts' row counts: static shapes, no weight gathered per token. (XLA's CPU
    backend lowers a ragged dot to a masked dense one over every expert: right, not fast.)"""
    n, k = experts.shape
    rows = jnp.broadcast_to(x.reshape(n, -1, x.shape[-1]), (n, k, x.shape[-1])).reshape(n * k, x.shape[-1])
    chosen = experts.reshape(-1)
    order = jnp.argsort(chosen, stable=True)
    counts = jnp.bincount(chosen, length=w.shape[0]).astype(jnp.int32)
    # f32 activations meet a 16-bit weight on the CPU (`gather_rows`): the weight widens, as in `linear`'s
    # XLA-dot fallback, rather than the rows rounding (the CPU's ragged dot is a dense one over every expert)
    w_dot = w.astype(rows.dtype) if rows.dtype != w.dtype else w
    out = jax.lax.ragged_dot_general(rows[order], w_dot, counts, _BY_EXPERT, preferred_element_type=x.dtype)
    y = jnp.zeros_like(out).at[order].set(out, unique_indices=True)
    if bias is not None:
        y = y + bias[chosen]
    return y.reshape(n, k, w.shape[1])


def topk(x, k: int):
    values, indices = jax.lax.top_k(x, k)
    return values, indices.astype(jnp.int32)


class JaxModel:
    """Base of generated models: params and state as device arrays, each entry jitted once.

    Calls look like the torch model's: `model.decode(tokens, positions)` returns
    the logits and keeps the new cache, whose old buffers XLA reuses (donation).
    """

    params: dict = {}
    tied: dict = {}
    state: dict = {}
    entries: dict = {}
    stacked: tuple = ()  # params declared in a loop: kept as one array per layer (see below)
    linear_groups: list = []  # weights of one input, fused with fast numerics (see fuse_linear_groups)
    linear_weights: dict = {}  # params read only as linear's weight: {name: stacked} (see pack_linear_weights)
    shard_params: dict = {}  # tensor parallelism: {param: the axis it splits on} (codegen_common.shard_plan)
    shard_state: dict = {}  # {state: axis}
    fused_parts: dict = {}  # {param: its rows' parts} (codegen_common.fused_outputs)
    fast: bool = False

    def __init__(self, weights: dict, device=None, consume: bool = False, mesh=None):
        """`weights`: {param: torch tensor, numpy or jax array}. With `consume`, each entry is
        popped from `weights` as it is placed, so that the caller's copy of the model is freed
        one param at a time and loading never holds two copies (`nest.load` does this).
        `mesh`: a `jax.sharding.Mesh` with an axis named "model" to spread the model over (tensor
        parallel, as `shard_params` says); then `device` is ignored."""
        self.mesh = mesh
        self.device = mesh.devices.flat[0] if mesh is not None else (device or jax.devices()[0])
        self.device_major: dict = {}  # {param: (parts, shards)} held as `DeviceMajorRows`
        self.whole = self._placement(None, ())  # on a mesh: a copy on every device (the entries' other arguments)
        for alias, target in self.tied.items():  # a tied pair is one array: the alias's split, if only it has one
            if alias in self.shard_params and target not in self.shard_params:
                self.shard_params = {**self.shard_params, target: self.shard_params[alias]}
        arrays = {}
        # With fast numerics on one CPU, where Linnet's kernels run, linear weights stay host arrays
        # until they are packed into panels (`pack_linear_weights`): packed from the host, in their
        # own memory where they can be, never as a device array and its panels at once.
        packs = (self.fast and mesh is None and self.device.platform == "cpu" and xla_kernels.registered())
        kept = {}  # name -> host array, packed by `pack_linear_weights`
        loops_on_stacks = loops_over_stacks(self.device.platform, mesh)
        # a linear weight tied to by a param that is not one (gathered from) stays as it is
        gathered_targets = {t for alias, t in self.tied.items() if alias not in self.linear_weights}
        for name, (shape, dtype) in self.params.items():
            if name in self.tied:
                continue
            if name not in weights:
                raise KeyError(f"no weights for param `{name}` {list(shape)} {dtype}")
            a = weights.pop(name) if consume else weights[name]
            if dtype == "f32" and hasattr(a, "detach") and a.is_floating_point():
                a = a.float()
            host = _to_numpy(a)
            del a
            if tuple(host.shape) != tuple(shape):
                raise ValueError(f"param `{name}` must be {list(shape)}, but the weights given are {list(host.shape)}")
            if host.dtype != DTYPES[dtype]:
                raise TypeError(f"param `{name}` must be {dtype}, but the weights given are {host.dtype}")
            axis = self.shard_params.get(name)
            if self._splits_by_part(name, axis, shape):  # each device's rows: its share of every part
                host = np.take(host, device_major_order(self.fused_parts[name], self.mesh.shape[MESH_AXIS]), axis=-2)
                self.device_major[name] = (self.fused_parts[name], self.mesh.shape[MESH_AXIS])
            if packs and name in self.linear_weights and name not in gathered_targets and \
                    xla_kernels.available(host.dtype, "cpu"):
                kept[name] = host
            elif name in self.stacked and name in self.linear_weights and axis != 0 and not loops_on_stacks:
                # XLA's CPU backend copies a static slice of a parameter (`wq[l]`) before a dot,
                # which costs a pass over every weight per step; a list of per-layer arrays
                # reads the same in the generated code (`params["wq"][l]`) and is not copied.
                # Other stacked params (norms' weights) stay one array, sliced inside the fusion
                # that reads them: each array is an argument the executable's dispatch walks.
                # Each layer is placed from its slice of the host array (one dispatch, not one a layer).
                where = self._placement(None if axis is None else axis - 1, tuple(shape[1:]))
                arrays[name] = jax.device_put([host[i] if consume else _copy(host[i]) for i in range(shape[0])],
                                              where)
            else:
                # On the CPU, device_put keeps an aligned host array as it is (no copy): right when the
                # caller hands its weights over (consume), while a caller who keeps them gets a copy.
                # Elsewhere it copies to the device, and the host array is dropped with it.
                arrays[name] = jax.device_put(host if consume else _copy(host), self._placement(axis, shape))
            del host
        self.weights = arrays
        # Fused groups and panels serve one device; on a mesh each weight stays as it was split.
        if packs:
            parts, panels = self.pack_linear_weights(kept, owned=consume)
        else:
            for name, other in self.tied.items():
                arrays[name] = arrays[other]
            parts, panels = self.fuse_linear_groups() if self.fast and mesh is None else {}, {}
        self.reset_state()
        types = {name: DTYPES[dtype] for name, (_, dtype) in self.state.items()}
        # Layer loops compile as loops on one device where no weight is held a layer per array (`loop`).
        self.compiles_loops = ((self.device.platform == "cpu" and mesh is None) or loops_on_stacks) and \
            not any(isinstance(a, list) for a in self.weights.values())
        flags = [flag for flag, on in ((_COMPILED_LOOPS, self.compiles_loops), (_SHARDED, mesh is not None),
                                       (_ON_GPU, mesh is None and self.device.platform == "gpu")) if on]
        self.traced = {name: _traced_with(_on_bits(_on_panels(_on_parts(_on_device_major(fn, self.device_major), parts),
                                                              panels), types), flags)
                       for name, fn in self.entries.items()}
        self.compiled = {name: self._jit(fn) for name, fn in self.traced.items()}
        self.compiled_then: dict = {}
        self.ahead: dict = {}  # id of a jitted entry -> {its arguments' `_shapes`: `compile_ahead`'s executable}

    def _splits_by_part(self, name: str, axis, shape) -> bool:
        """Whether param `name` is held as `DeviceMajorRows`: a fused weight split by its rows on a
        mesh that divides each of its parts."""
        if self.mesh is None or name not in self.fused_parts or axis != len(shape) - 2:
            return False
        return all((stop - start) % self.mesh.shape[MESH_AXIS] == 0 for start, stop in self.fused_parts[name])

    def _placement(self, axis, shape):
        """Where an array goes: the model's device; on a mesh, split on `axis` when the mesh divides
        that dim evenly, else a copy on every device."""
        if self.mesh is None:
            return self.device
        from jax.sharding import NamedSharding, PartitionSpec

        parts = self.mesh.shape[MESH_AXIS]
        if axis is None or shape[axis] % parts:
            return NamedSharding(self.mesh, PartitionSpec())
        return NamedSharding(self.mesh, PartitionSpec(*([None] * axis), MESH_AXIS))

    def _jit(self, fn):
        """fn jitted with the state donated, XLA's options for the device (`compiler_options`) and
        its arguments placed (`_placements`)."""
        return jax.jit(fn, donate_argnums=(1,), compiler_options=compiler_options(self.device.platform) or None,
                       **self._placements(fn))

    def _placements(self, fn) -> dict:
        """jax.jit's shardings for fn: every argument placed on the model's device, so that a host
        array and an array another executable left there (a decode step's tokens, fed to the next)
        meet one executable; unplaced, the second compiled one of its own. On a mesh, the params
        and the state keep their splits, in and out, and the other arguments and the results are
        whole on every device."""
        if self.mesh is None:
            return {"in_shardings": jax.sharding.SingleDeviceSharding(self.device)}
        params = jax.tree.map(lambda a: a.sharding, self.weights)
        state = jax.tree.map(lambda a: a.sharding, self.state_bits)
        others = len(inspect.signature(fn).parameters) - 2
        return {"in_shardings": (params, state) + (self.whole,) * others, "out_shardings": (self.whole, state)}

    def fuse_linear_groups(self) -> dict:
        """Each of `linear_groups` (untied weights of one input, as the code generator found them)
        held as one array, layer by layer: `weights["wk+wq+wv"]` in place of its members.
        Returns {member: (that key, first row, row past the last, stacked)} for `_on_parts`."""
        parts = {}
        for group in self.linear_groups:
            key, members = "+".join(group), [self.weights.pop(name) for name in group]
            listed = isinstance(members[0], list)  # a layer an array (else one array, stacked or not)
            layers = zip(*members) if listed else [members]
            fused = [jnp.concatenate(layer, axis=-2) for layer in layers]  # rows: [..., N, K]
            del members[:], layers
            self.weights[key] = fused if listed else fused[0]
            start = 0
            for name in group:
                shape = self.params[name][0]
                parts[name] = (key, start, start + shape[-2], self.linear_weights.get(name, False))
                start += shape[-2]
        return parts

    def pack_linear_weights(self, kept: dict, owned: bool) -> tuple[dict, dict]:
        """On one CPU, where Linnet's kernels run (`xla_kernels.available`): `kept`, the linear
        weights' host arrays, as panels for `linear` to call the kernel on. A fused group (each of
        `linear_groups` whose members are all kept) is one panel array, its members' rows side by
        side; a stacked weight is one array [layers, P, K, 16] that the kernel indexes by layer (a
        few arrays per param rather than one a layer: the executable's arguments are what each
        call's dispatch walks). `kept`: each name's host array; `owned`: the caller handed them over
        whole (`consume`), so that `xla_kernels.pack_side_by_side` packs those holding memory of
        their own in place, or gives their pages back as it copies them.
        Tied aliases: one of a packed target shares its panels; a linear weight tied to a param
        that is not one (a head tied to an embedding that is gathered from) gets panels of its own.
        Returns ({member: (group key, first row, row past the last, stacked)} for `_on_parts`,
        {weights key: (the weight's N, its layers or None)} for `_on_panels`)."""
        targets = set(self.tied.values())  # packed alone, for their aliases to share
        groups = [group for group in self.linear_groups if all(n in kept and n not in targets for n in group)]
        grouped = {name for group in groups for name in group}
        jobs = [("+".join(group), list(group)) for group in groups]
        jobs += [(name, [name]) for name in list(kept) if name not in grouped]
        parts, panels = {}, {}
        for key, names in jobs:
            members = [kept.pop(name) for name in names]
            stacked = members[0].ndim == 3
            start = 0
            for name, m in zip(names, members):
                if len(names) > 1:
                    parts[name] = (key, start, start + m.shape[-2], stacked)
                start += m.shape[-2]
            packed = xla_kernels.pack_side_by_side(members, owned=owned)
            del members
            self.weights[key] = _on_huge_pages(jax.device_put(packed, self.device))
            panels[key] = (start, packed.shape[0] if stacked else None)
            del packed
        for alias, target in self.tied.items():
            if target in panels:  # (a linear weight's: targets of others are not kept)
                self.weights[alias], panels[alias] = self.weights[target], panels[target]
                continue
            value = self.weights[alias] = self.weights[target]
            if alias in self.linear_weights and not isinstance(value, list) and xla_kernels.available(value.dtype,
                                                                                                      "cpu"):
                host = np.asarray(value)  # the target's own array: packed as a copy
                packed = xla_kernels.pack_side_by_side([host])
                self.weights[alias] = _on_huge_pages(jax.device_put(packed, self.device))
                panels[alias] = (host.shape[-2], packed.shape[0] if host.ndim == 3 else None)
        return parts, panels

    def reset_state(self):
        # Donated at every call, each buffer is the one the next call writes: read where it lies.
        # Zeros are zeros in any type: made as their bits, where they go (no conversion to compile).
        if getattr(self, "state_bits", None) is not None:
            # zeroed in the buffers it has (donated, each kept where it lies): a new cache made beside the
            # old one held both at once, twice the cache at each warmup's end (SmolLM2 bf16, 16 rows of 8192)
            if getattr(self, "_zero_state", None) is None:
                # (kept though unread: an argument pruned is no buffer to write the zeros to)
                self._zero_state = jax.jit(_zeros_like, donate_argnums=0, keep_unused=True,
                                           out_shardings=jax.tree.map(lambda a: a.sharding, self.state_bits))
            self.state_bits = self._zero_state(self.state_bits)
            return
        self.state_bits = {name: _on_huge_pages(jnp.zeros(shape, _bits_type(DTYPES[dtype]),
                                                          device=self._placement(self.shard_state.get(name), shape)))
                           for name, (shape, dtype) in self.state.items()}

    @property
    def cache(self) -> dict:
        """The state as the card declares it (a copy of a 16-bit float one: for reading, not the hot path)."""
        return {name: _unbits(a, DTYPES[self.state[name][1]]) for name, a in self.state_bits.items()}

    def call(self, entry: str, *args):
        return self._run(self.compiled[entry], *args)

    def _arguments(self, args):
        args = jax.tree.map(_to_numpy, args)  # host arrays go to the executable as they are: no eager transfer op
        if self.mesh is not None:
            # On a mesh an array's type names the mesh: a host array and one a step left on the mesh
            # (a decode step's tokens) would trace twice. Both go in as arrays on the mesh.
            args = jax.tree.map(lambda a: a if isinstance(a, jax.Array) else jax.device_put(a, self.whole), args)
        return args

    def _run(self, executable, *args):
        """Runs an executable over the params and the state, keeping the state it returns: the one
        `compile_ahead` made for arguments of these shapes, if any."""
        args = self._arguments(args)
        table = self.ahead.get(id(executable))  # (only an entry compiled ahead pays for the look-up)
        ahead = table.get(_shapes(args)) if table else None
        with jax.default_matmul_precision("default" if self.fast else "highest"):
            result, self.state_bits = (ahead or executable)(self.weights, self.state_bits, *args)
        return result

    def compile_ahead(self, entry: str, calls: list, workers: int | None = None) -> list:
        """Compiles `entry` for each of `calls` (argument tuples, as `call` takes them) at once, on
        threads; calls of those shapes then run these executables. XLA compiles without holding
        Python's lock, so the compiles overlap where tracing does not: an 8B model's pass shape took
        47-50 s to compile on an H200, one after another, and a warmup ten of them. Returns each
        call's executable (its `out_info`: what it gives back, for compiling what takes that)."""
        jitted = self.compiled[entry]
        precision = "default" if self.fast else "highest"
        state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), self.state_bits)

        def compile_one(args):
            with jax.default_matmul_precision(precision):  # (a thread's own setting)
                return _shapes(args), jitted.lower(self.weights, state, *args).compile()
        table = self.ahead.setdefault(id(jitted), {})
        given = [self._arguments(tuple(c)) for c in calls]
        keys = [_shapes(args) for args in given]
        todo = [args for key, args in dict(zip(keys, given)).items() if key not in table]
        if todo:
            # a thread a core, up to COMPILE_THREADS: each compile of a large model holds gigabytes
            workers = workers or min(len(todo), os.cpu_count() or 1, COMPILE_THREADS)
            # each compile in the caller's context (its ContextVars: whether its compiles are counted)
            jobs = [(contextvars.copy_context(), args) for args in todo]
            with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                for key, executable in pool.map(lambda job: job[0].run(compile_one, job[1]), jobs):
                    table[key] = executable
        return [table[key] for key in keys]

    def call_then(self, entry: str, then, args: tuple, then_args: tuple):
        """`then(entry(*args), *then_args)` as one executable, compiled once per (entry, then): a
        sampler run inside the decode step, whose logits never leave it. `then` must be the same
        function object from call to call (a cached one), as it keys the executable."""
        key = (entry, then)
        if key not in self.compiled_then:
            traced = self.traced[entry]

            @functools.wraps(traced)
            def entry_then(params, state_bits, args, then_args):
                result, state_bits = traced(params, state_bits, *args)
                return then(result, *then_args), state_bits
            self.compiled_then[key] = self._jit(entry_then)
        return self._run(self.compiled_then[key], tuple(args), tuple(then_args))

    def __getattr__(self, name):
        entries = type(self).entries
        if name in entries:
            return lambda *args: self.call(name, *args)
        raise AttributeError(name)


def compiler_options(platform: str) -> dict:
    """XLA's options for entries compiled for `platform`: `GPU_COMPILER_OPTIONS` on a GPU, less those
    XLA_FLAGS names and those this jaxlib does not know (an unknown one fails the compile)."""
    if platform != "gpu":
        return {}
    named = {flag.split("=", 1)[0].lstrip("-") for flag in os.environ.get("XLA_FLAGS", "").split()}
    return {name: value for name, value in GPU_COMPILER_OPTIONS.items()
            if name not in named and _knows_option(name, value)}


@functools.cache
def _knows_option(name: str, value) -> bool:
    """Whether XLA takes this compile option: a one-op program compiled with it, on the default backend
    (XLA's options are one list for every backend; a GPU's on the CPU are taken and left unused)."""
    try:
        jax.jit(lambda x: x + 1, compiler_options={name: value}).lower(np.float32(0)).compile()
    except Exception:  # (jaxlib's error type for it has moved between versions)
        return False
    return True


def _with_views(entry, views: dict):
    """`entry` over params of which some are seen through views made inside the trace:
    views[name](params) gives param `name`'s, from the params as this wrapper is given them."""
    if not views:
        return entry

    @functools.wraps(entry)  # (jitted under the entry's name, as profiles and dumps show it)
    def viewed(params, state, *args):
        seen = dict(params)
        for name, view in views.items():
            seen[name] = view(params)
        return entry(seen, state, *args)
    return viewed


def _on_parts(entry, parts: dict):
    """`entry` over params whose linear groups are held fused (`JaxModel.fuse_linear_groups`): it
    sees each member as its `FusedPart`s of the group's array."""
    def member(params, key, part, stacked):
        return _seen_as(params[key], part, stacked)
    return _with_views(entry, {name: functools.partial(member, key=key, stacked=stacked,
                                                       part=functools.partial(FusedPart, start=start, stop=stop))
                               for name, (key, start, stop, stacked) in parts.items()})


def _seen_as(whole, view, stacked: bool):
    """A param as `view` shows it: each layer's where the layers are a list or stacked (`stacked`,
    or a `LayerStack`: the view of its layer at a traced index), else the whole array's."""
    if isinstance(whole, list):
        return [view(a) for a in whole]
    if isinstance(whole, LayerStack) or stacked:
        return LayerStack(lambda i: view(whole[i]))
    return view(whole)


def _on_device_major(entry, held: dict):
    """`entry` over params held device by device on a mesh (`JaxModel.device_major`): it sees each
    as `DeviceMajorRows` (a layer at a time for a stacked one)."""
    def rows(params, name, part):
        whole = params[name]
        return _seen_as(whole, part, not isinstance(whole, list) and whole.ndim == 3)
    return _with_views(entry, {name: functools.partial(rows, name=name, part=functools.partial(
        DeviceMajorRows, parts=parts, shards=shards)) for name, (parts, shards) in held.items()})


def _on_panels(entry, panels: dict):
    """`entry` over params of which some are held as panels (`JaxModel.pack_linear_weights`): it
    sees each as `Panels` (a `LayerStack` of them for a stacked param)."""
    def panelled(params, key, n, layers):
        a = params[key]
        return Panels(a, n) if layers is None else LayerStack(lambda i: Panels(a, n, i))
    return _with_views(entry, {key: functools.partial(panelled, key=key, n=n, layers=layers)
                               for key, (n, layers) in panels.items()})


def _on_bits(entry, types: dict):
    """`entry` over a state held as bits (`_bits`): it sees and returns the declared types inside.

    `put` writes a 16-bit cache as bits; a state donated and returned as bf16 made XLA copy the
    whole cache at each boundary between the two views. Held as bits, the views meet inside one
    program, where XLA folds each pair of bitcasts away."""
    @functools.wraps(entry)  # jitted under the entry's name, as profiles and dumps show it
    def on_bits(params, state_bits, *args):
        result, state = entry(params, {n: _unbits(a, types[n]) for n, a in state_bits.items()}, *args)
        return result, {n: _bits(a) for n, a in state.items()}
    return on_bits


def _traced_with(entry, flags: list):
    """`entry` traced with each of `flags` set: `_COMPILED_LOOPS` (layer loops compiled as XLA
    loops, `loop`), `_SHARDED` (Linnet's CPU kernels off, the arrays spread on a mesh), `_ON_GPU`
    (`cudnn_attends`)."""
    if not flags:
        return entry

    @functools.wraps(entry)
    def traced_with(*args):
        tokens = [flag.set(True) for flag in flags]
        try:
            return entry(*args)
        finally:
            for flag, token in zip(reversed(flags), reversed(tokens)):
                flag.reset(token)
    return traced_with


def _zeros_like(state: dict) -> dict:
    return jax.tree.map(jnp.zeros_like, state)


def _on_huge_pages(a):
    """`a` with its memory moved onto huge pages where it lies in this process's memory (the CPU
    backend's buffers): the panels a decode step streams through, the caches it reads (`pages`, on
    its background thread: the move took a second of a start, before the first token)."""
    if len(a.devices()) == 1 and next(iter(a.devices())).platform == "cpu":
        a.block_until_ready()
        pages.back_with_huge_pages_later(a, a.unsafe_buffer_pointer(), a.nbytes)
    return a


def _copy(a):
    """A copy of a host or device array, where it is."""
    return np.array(a) if isinstance(a, np.ndarray) else jnp.array(a, copy=True)


def _shapes(args) -> tuple:
    """What an executable is compiled for, of these arguments: their structure, shapes, types and,
    for arrays already on a device, where they lie (an executable compiled ahead takes its arguments
    where it was told to, where a jitted entry moves them)."""
    leaves, structure = jax.tree.flatten(args)
    return (structure,) + tuple((a.shape, a.dtype, getattr(a, "sharding", None)) for a in leaves)


def _to_numpy(a):
    """A host array for a torch tensor (no copy on the CPU; bf16 as ml_dtypes' bfloat16), numpy or jax array."""
    if hasattr(a, "detach"):
        import torch

        t = a.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:  # numpy has no bf16: reinterpret the bits
            return t.contiguous().view(torch.int16).numpy().view(jnp.bfloat16)
        return t.numpy()
    if isinstance(a, jax.Array):
        return a
    return np.asarray(a)
