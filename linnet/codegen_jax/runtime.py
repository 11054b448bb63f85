"""The small runtime that generated JAX modules import: the named high-level ops and `JaxModel`.

Exact numerics use plain attention in f32 and the highest matmul precision;
fast numerics use `jax.nn.dot_product_attention`, compute in the model's dtype,
norms and softmax in f32.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from linnet.rope_tables import inv_frequencies

DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16, "i32": jnp.int32, "i64": jnp.int64,
          "bool": jnp.bool_}

# Bounds the keys gathered at once in packed attention: [chunk, MaxSeq, kv_heads, head_dim].
_GATHER_ELEMENTS = 1 << 24


def linear(x, w, bias=None):
    y = jax.lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ())))
    return y if bias is None else y + bias


def gelu(x):
    return jax.nn.gelu(x, approximate=False)


def rmsnorm(x, weight, eps: float):
    h = x.astype(jnp.float32)
    h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps)
    return weight * h.astype(x.dtype)


def softmax(x, axis: int = -1):
    return jax.nn.softmax(x.astype(jnp.float32), axis=axis).astype(x.dtype)


def rope_table(head_dim: int, max_seq: int, theta: float, scaling: str = "none", factor: float = 1.0,
               low_freq_factor: float = 1.0, high_freq_factor: float = 4.0, original_max: int = 8192,
               beta_fast: float = 32.0, beta_slow: float = 1.0) -> np.ndarray:
    """cos and sin for every position: [max_seq, 2, head_dim // 2], f32 (a constant of the program)."""
    inv_freq, attention_factor = inv_frequencies(head_dim, theta, scaling, factor, low_freq_factor,
                                                 high_freq_factor, original_max, beta_fast, beta_slow)
    angles = np.outer(np.arange(max_seq, dtype=np.float64), inv_freq)
    return (np.stack([np.cos(angles), np.sin(angles)], axis=1) * attention_factor).astype(np.float32)


def rope(x, positions, table):
    cs = jnp.asarray(table)[positions]
    cos, sin = cs[:, 0, None, :], cs[:, 1, None, :]
    h = x.astype(jnp.float32)
    x1, x2 = jnp.split(h, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def attention(q, k_cache, v_cache, positions, rows=None, window: int = 0, sinks=None, scale=None, fast: bool = False):
    """Token i attends to cache row rows[i] (row i when rows is None) at positions <= positions[i].

    Any pack is attended correctly. A pack laid out as the engine's JAX runner lays it out is
    attended cheaply: its first HEAD tokens (one per row at most: decoding rows, one-token
    prompt rests) each read their own row, and the tokens after them come in blocks of BLOCK
    tokens of one row, each block reading one row. A pack that is not laid out so (checked on
    the device) falls back to reading one row per token.
    """
    n, heads, head_dim = q.shape
    scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
    if rows is None:
        if fast and _walks_keys(k_cache.shape[1]):
            return _attend_walking(q, k_cache[:n], v_cache[:n], positions, window, sinks, scale)
        return _attend(q, k_cache[:n], v_cache[:n], positions, window, sinks, scale, fast)
    head = head_tokens(k_cache.shape[0])
    if n <= head or n % BLOCK:
        return _attend_gathered(q, k_cache, v_cache, positions, rows, window, sinks, scale, fast)
    first = _attend_gathered(q[:head], k_cache, v_cache, positions[:head], rows[:head], window, sinks, scale, fast)
    q2, p2, r2 = q[head:], positions[head:], rows[head:]
    blocks = r2.reshape(-1, BLOCK)
    per_block = lambda: _attend_blocks(q2, k_cache, v_cache, p2, blocks[:, 0], window, sinks, scale, fast)
    per_token = lambda: _attend_gathered(q2, k_cache, v_cache, p2, r2, window, sinks, scale, fast)
    rest = jax.lax.cond(jnp.all(blocks == blocks[:, :1]), per_block, per_token)
    return jnp.concatenate([first, rest])


BLOCK = 8


def head_tokens(rows: int) -> int:
    """Tokens at the start of a pack that read one row each: the cache rows, rounded up to BLOCK."""
    return -(-rows // BLOCK) * BLOCK


def _attend_gathered(q, k_cache, v_cache, positions, rows, window, sinks, scale, fast):
    n = q.shape[0]
    per_token = k_cache.shape[1] * k_cache.shape[2] * k_cache.shape[3]
    chunk = max(1, _GATHER_ELEMENTS // per_token)
    outs = [_attend(q[s:s + chunk], k_cache[rows[s:s + chunk]], v_cache[rows[s:s + chunk]],
                    positions[s:s + chunk], window, sinks, scale, fast) for s in range(0, n, chunk)]
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs)


def _attend_blocks(q, k_cache, v_cache, positions, block_rows, window, sinks, scale, fast):
    """Each block of BLOCK queries against the one cache row it belongs to."""
    n, heads, head_dim = q.shape
    nb = n // BLOCK
    keys, values = k_cache[block_rows], v_cache[block_rows]  # [nb, S, kvh, d]
    seq, kv_heads = keys.shape[1], keys.shape[2]
    pos = positions.reshape(nb, BLOCK)
    visible = _visible(jnp.arange(seq)[None, None, :], pos[:, :, None], window)  # [nb, BLOCK, S]
    qb = q.reshape(nb, BLOCK, heads, head_dim)
    if fast and sinks is None:
        out = jax.nn.dot_product_attention(qb, keys, values, mask=visible[:, None], scale=scale)
        return out.reshape(n, heads, values.shape[-1])
    group = heads // kv_heads
    qg = qb.reshape(nb, BLOCK, kv_heads, group, head_dim).astype(jnp.float32)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, keys.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST) * scale
    scores = jnp.where(visible[:, None, None], scores, -jnp.inf)
    probs = _softmax_with_sinks(scores, sinks, kv_heads, group)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, values.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    return out.reshape(n, heads, values.shape[-1]).astype(q.dtype)


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


def _attend(q, keys, values, positions, window, sinks, scale, fast):
    n, heads, head_dim = q.shape
    seq, kv_heads = keys.shape[1], keys.shape[2]
    visible = _visible(jnp.arange(seq)[None, :], positions[:, None], window)  # [n, S]
    if fast and sinks is None:
        out = jax.nn.dot_product_attention(q[:, None], keys, values, mask=visible[:, None, None, :], scale=scale)
        return out[:, 0]
    group = heads // kv_heads
    qg = q.reshape(n, kv_heads, group, head_dim).astype(jnp.float32)
    scores = jnp.einsum("nkgd,nskd->nkgs", qg, keys.astype(jnp.float32),
                        precision=jax.lax.Precision.HIGHEST) * scale
    scores = jnp.where(visible[:, None, None, :], scores, -jnp.inf)
    probs = _softmax_with_sinks(scores, sinks, kv_heads, group)
    out = jnp.einsum("nkgs,nskd->nkgd", probs, values.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    return out.reshape(n, heads, values.shape[-1]).astype(q.dtype)


KEY_CHUNK = 128


def _walks_keys(max_seq: int) -> bool:
    """Whether decode walks the keys chunk by chunk, up to the furthest position only: on the CPU,
    where attending over all MaxSeq keys of every row grew a SmolLM2 decode step from 105 ms at
    MaxSeq 160 to 256 ms at 640. The one device check for it; GPUs keep the fused attention."""
    return max_seq > KEY_CHUNK and jax.default_backend() == "cpu"


def _attend_walking(q, keys, values, positions, window, sinks, scale):
    """`_attend` in KEY_CHUNK-key steps with an online softmax, stopping after the chunk that holds
    the furthest position: the work follows the tokens' positions instead of MaxSeq.

    q[n, h, d] against keys/values[n, S, kvh, d], token i reading row i. The last chunk is
    aligned to end at S (overlapping its predecessor; overlapped keys are masked out of it).
    """
    n, heads, head_dim = q.shape
    seq, kv_heads = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    qg = q.reshape(n, kv_heads, group, head_dim).astype(jnp.float32) * scale
    pos = positions[:, None]

    def step(c, carry):
        best, total, acc = carry
        start = jnp.minimum(c * KEY_CHUNK, seq - KEY_CHUNK)
        k = jax.lax.dynamic_slice_in_dim(keys, start, KEY_CHUNK, axis=1).astype(jnp.float32)
        v = jax.lax.dynamic_slice_in_dim(values, start, KEY_CHUNK, axis=1).astype(jnp.float32)
        span = start + jnp.arange(KEY_CHUNK)
        visible = _visible(span[None, :], pos, window) & (span[None, :] >= c * KEY_CHUNK)  # not the overlap again
        scores = jnp.einsum("nkgd,nskd->nkgs", qg, k)
        scores = jnp.where(visible[:, None, None, :], scores, -jnp.inf)
        new_best = jnp.maximum(best, scores.max(axis=-1))
        safe = jnp.where(jnp.isfinite(new_best), new_best, 0.0)  # no key seen yet: nothing to rescale
        weights = jnp.exp(scores - safe[..., None])
        rescale = jnp.exp(best - safe)
        return (new_best, total * rescale + weights.sum(axis=-1),
                acc * rescale[..., None] + jnp.einsum("nkgs,nskd->nkgd", weights, v))

    chunks = jnp.max(positions) // KEY_CHUNK + 1
    init = (jnp.full((n, kv_heads, group), -jnp.inf, jnp.float32), jnp.zeros((n, kv_heads, group), jnp.float32),
            jnp.zeros((n, kv_heads, group, values.shape[-1]), jnp.float32))
    best, total, acc = jax.lax.fori_loop(0, chunks, step, init)
    if sinks is not None:  # one more logit per head, in the denominator only
        sink = sinks.astype(jnp.float32).reshape(1, kv_heads, group)
        top = jnp.maximum(best, sink)
        total = total * jnp.exp(best - top) + jnp.exp(sink - top)
        acc = acc * jnp.exp(best - top)[..., None]
    return (acc / total[..., None]).reshape(n, heads, values.shape[-1]).astype(q.dtype)


def copy_rows(cache, src, dst, upto):
    """Row dst[i] takes row src[i]'s first upto[i] positions, in every layer."""
    seq = cache.shape[2]
    keep = jnp.arange(seq)[None, :] < upto[:, None]
    keep = keep.reshape((1,) + keep.shape + (1,) * (cache.ndim - 3))
    return cache.at[:, dst].set(jnp.where(keep, cache[:, src], cache[:, dst]))


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
    fast: bool = False

    def __init__(self, weights: dict, device=None, consume: bool = False):
        """`weights`: {param: torch tensor, numpy or jax array}. With `consume`, each entry is
        popped from `weights` as it is placed, so that the caller's copy of the model is freed
        one param at a time and loading never holds two copies (`nest.load` does this)."""
        self.device = device or jax.devices()[0]
        arrays = {}
        for name, (shape, dtype) in self.params.items():
            if name in self.tied:
                continue
            if name not in weights:
                raise KeyError(f"no weights for param `{name}` {list(shape)} {dtype}")
            a = weights.pop(name) if consume else weights[name]
            if dtype == "f32" and hasattr(a, "detach") and a.is_floating_point():
                a = a.float()
            host = _to_numpy(a)
            # On the CPU, device_put keeps an aligned host array as it is (no copy): right when the
            # caller hands its weights over (consume), while a caller who keeps them gets a copy.
            # Elsewhere it copies to the device, and the host array is dropped with `a`.
            a = jax.device_put(host if consume else jnp.array(host, copy=True), self.device)
            del host
            if tuple(a.shape) != tuple(shape):
                raise ValueError(f"param `{name}` must be {list(shape)}, but the weights given are {list(a.shape)}")
            if a.dtype != DTYPES[dtype]:
                raise TypeError(f"param `{name}` must be {dtype}, but the weights given are {a.dtype}")
            if name in self.stacked:
                # XLA's CPU backend copies a static slice of a parameter (`wq[l]`) before a dot,
                # which costs a pass over every weight per step; a list of per-layer arrays
                # reads the same in the generated code (`params["wq"][l]`) and is not copied.
                a = [a[i] for i in range(a.shape[0])]
            arrays[name] = a
        for name, other in self.tied.items():
            arrays[name] = arrays[other]
        self.weights = arrays
        self.reset_state()
        self.compiled = {name: jax.jit(fn, donate_argnums=(1,)) for name, fn in self.entries.items()}

    def reset_state(self):
        self.cache = {name: jax.device_put(jnp.zeros(shape, DTYPES[dtype]), self.device)
                      for name, (shape, dtype) in self.state.items()}

    def call(self, entry: str, *args):
        args = tuple(jnp.asarray(_to_numpy(a)) for a in args)
        with jax.default_matmul_precision("default" if self.fast else "highest"):
            result, self.cache = self.compiled[entry](self.weights, self.cache, *args)
        return result

    def __getattr__(self, name):
        entries = type(self).entries
        if name in entries:
            return lambda *args: self.call(name, *args)
        raise AttributeError(name)


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
