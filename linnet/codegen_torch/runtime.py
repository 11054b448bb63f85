"""The small runtime that generated PyTorch modules import: the named high-level ops.

Each function is the reference semantics of its op (`numerics="exact"`) and,
with `fast=True`, the fused path: SDPA attention, compute in the model's
dtype with norms and softmax in f32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from linnet.rope_tables import inv_frequencies

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "i32": torch.int32,
          "i64": torch.int64, "bool": torch.bool}

def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def softmax(x: torch.Tensor, axis: int = -1) -> torch.Tensor:
    return torch.softmax(x.float(), dim=axis).to(x.dtype)


def rope_table(head_dim: int, max_seq: int, theta: float, scaling: str = "none", factor: float = 1.0,
               low_freq_factor: float = 1.0, high_freq_factor: float = 4.0, original_max: int = 8192,
               beta_fast: float = 32.0, beta_slow: float = 1.0) -> torch.Tensor:
    """cos and sin for every position: [max_seq, 2, head_dim // 2], f32."""
    inv_freq, attention_factor = inv_frequencies(head_dim, theta, scaling, factor, low_freq_factor,
                                                 high_freq_factor, original_max, beta_fast, beta_slow)
    angles = torch.outer(torch.arange(max_seq, dtype=torch.float64), torch.from_numpy(inv_freq))
    table = torch.stack([torch.cos(angles), torch.sin(angles)], dim=1) * attention_factor
    return table.to(torch.float32)


def rope(x: torch.Tensor, positions: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotates halves of x[n, heads, head_dim] (the Hugging Face Llama layout)."""
    cs = table[positions]  # [n, 2, head_dim // 2]
    cos, sin = cs[:, 0, None, :], cs[:, 1, None, :]
    h = x.float()
    x1, x2 = h.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor,
              rows: torch.Tensor | None = None, window: int = 0, sinks: torch.Tensor | None = None,
              scale: float | None = None, fast: bool = False) -> torch.Tensor:
    """Token i attends to cache row rows[i] (row i when rows is None) at positions <= positions[i]."""
    n, heads, head_dim = q.shape
    scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
    if rows is None:
        return _attend(q, k_cache[:n], v_cache[:n], positions, window, sinks, scale, fast)
    out = torch.empty(q.shape[:2] + v_cache.shape[-1:], dtype=q.dtype, device=q.device)
    singles, runs = _segments(rows, positions)
    if singles:  # one-token segments (decoding rows in a mixed pass): batched over their rows
        idx = torch.as_tensor(singles, device=q.device)
        r = rows[idx]
        out[idx] = _attend(q[idx], k_cache[r], v_cache[r], positions[idx], window, sinks, scale, fast)
    for start, end, row, top in runs:  # a prompt's tokens: its own row, up to its last position
        keys, values = k_cache[row, None, :top + 1], v_cache[row, None, :top + 1]
        out[start:end] = _attend_row(q[start:end], keys, values, positions[start:end], window, sinks, scale, fast)
    return out


_SEGMENTS_CACHE: dict = {}


def _segments(rows: torch.Tensor, positions: torch.Tensor):
    """Runs of equal rows in a pack: ([indices of one-token runs], [(start, end, row, last position)]).

    Read on the host once per pass; every layer's attention reuses it. `as_tensors`, which starts
    every entry call, empties the cache, so a key (the tensors' addresses) never outlives its pass.
    """
    key = (rows.data_ptr(), positions.data_ptr(), rows.shape[0])
    if key in _SEGMENTS_CACHE:
        return _SEGMENTS_CACHE[key]
    r, p = rows.tolist(), positions.tolist()
    singles, runs = [], []
    start = 0
    for i in range(1, len(r) + 1):
        if i == len(r) or r[i] != r[start]:
            if i - start == 1:
                singles.append(start)
            else:
                runs.append((start, i, r[start], max(p[start:i])))
            start = i
    _SEGMENTS_CACHE.clear()
    _SEGMENTS_CACHE[key] = (singles, runs)
    return singles, runs


def _attend_row(q, keys, values, positions, window, sinks, scale, fast):
    """q[m, h, d] of one row against keys/values[1, L, kvh, d] of that row."""
    m, heads, head_dim = q.shape
    kv_heads = keys.shape[2]
    visible = _visible(positions, keys.shape[1], window)
    if fast and sinks is None:
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], keys[0].transpose(0, 1)[None], values[0].transpose(0, 1)[None],
            attn_mask=visible[None, None], scale=scale, enable_gqa=kv_heads != heads)
        return out[0].transpose(0, 1)
    group = heads // kv_heads
    qg = q.reshape(m, kv_heads, group, head_dim).float()
    scores = torch.einsum("mkgd,skd->mkgs", qg, keys[0].float()) * scale
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    probs = _softmax_with_sinks(scores, sinks, kv_heads, group)
    out = torch.einsum("mkgs,skd->mkgd", probs, values[0].float())
    return out.reshape(m, heads, values.shape[-1]).to(q.dtype)


def _visible(positions: torch.Tensor, length: int, window: int) -> torch.Tensor:
    """[n, length] bool: key j is seen by token i when j <= positions[i] (and within the window)."""
    span = torch.arange(length, device=positions.device)
    pos = positions[:, None].long()
    visible = span[None, :] <= pos
    if window:
        visible &= span[None, :] > pos - window
    return visible


def _softmax_with_sinks(scores, sinks, kv_heads, group):
    """Softmax over the keys; a sink adds one more logit per head to the denominator only."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    sink = sinks.float().reshape(1, kv_heads, group, 1).expand(scores.shape[0], kv_heads, group, 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]


def _attend(q, keys, values, positions, window, sinks, scale, fast):
    """q[n, h, d] against keys/values[n, S, kvh, d], one cache row per token."""
    n, heads, head_dim = q.shape
    kv_heads = keys.shape[2]
    visible = _visible(positions, keys.shape[1], window)
    if fast and sinks is None:
        out = F.scaled_dot_product_attention(
            q[:, :, None, :], keys.transpose(1, 2), values.transpose(1, 2),
            attn_mask=visible[:, None, None, :], scale=scale, enable_gqa=kv_heads != heads)
        return out[:, :, 0, :]
    group = heads // kv_heads
    qg = q.reshape(n, kv_heads, group, head_dim).float()
    scores = torch.einsum("nkgd,nskd->nkgs", qg, keys.float()) * scale
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    probs = _softmax_with_sinks(scores, sinks, kv_heads, group)
    out = torch.einsum("nkgs,nskd->nkgd", probs, values.float())
    return out.reshape(n, heads, values.shape[-1]).to(q.dtype)


def copy_rows_(cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, upto: torch.Tensor) -> torch.Tensor:
    """In place: row dst[i] takes row src[i]'s first upto[i] positions, in every layer."""
    seq = cache.shape[2]
    keep = torch.arange(seq, device=cache.device)[None, :] < upto[:, None]  # [K, S]
    keep = keep.reshape((1,) + keep.shape + (1,) * (cache.dim() - 3))
    cache[:, dst] = torch.where(keep, cache[:, src], cache[:, dst])
    return cache


def as_tensors(device: torch.device, *arrays) -> tuple:
    """An entry's arguments as tensors on the model's device: numpy arrays are taken as well as tensors.

    Called first by every entry, it also ends the previous call's per-pass caches.
    """
    _SEGMENTS_CACHE.clear()
    return tuple(torch.as_tensor(a, device=device) for a in arrays)


def take(x: torch.Tensor, indices: torch.Tensor, axis: int = 0) -> torch.Tensor:
    flat = x.index_select(axis, indices.reshape(-1).long())
    return flat.reshape(x.shape[:axis] + indices.shape + x.shape[axis + 1:])


def topk(x: torch.Tensor, k: int):
    values, indices = torch.topk(x, k, dim=-1)
    return values, indices.to(torch.int32)


class TorchModel:
    """Base of generated models: binds and checks weights, allocates the cache."""

    params: dict = {}
    tied: dict = {}
    state: dict = {}

    def __init__(self, weights: dict, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        for name, (shape, dtype) in self.params.items():
            if name in self.tied:
                continue
            if name not in weights:
                raise KeyError(f"no weights for param `{name}` {list(shape)} {dtype}")
            t = torch.as_tensor(weights[name])
            if tuple(t.shape) != tuple(shape):
                raise ValueError(f"param `{name}` must be {list(shape)}, but the weights given are {list(t.shape)}")
            if t.dtype != DTYPES[dtype]:
                raise TypeError(f"param `{name}` must be {dtype}, but the weights given are {t.dtype}")
            setattr(self, name, t.to(self.device))
        for name, other in self.tied.items():
            setattr(self, name, getattr(self, other))
        self.reset_state()
        self.init_tables()

    def reset_state(self):
        for name, (shape, dtype) in self.state.items():
            setattr(self, name, torch.zeros(shape, dtype=DTYPES[dtype], device=self.device))

    def init_tables(self):
        pass
