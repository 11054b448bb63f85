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

# Bounds the keys gathered at once in packed attention: [chunk, MaxSeq, kv_heads, head_dim].
_GATHER_ELEMENTS = 1 << 24


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
    seq = k_cache.shape[1]
    scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
    if rows is None:
        return _attend(q, k_cache[:n], v_cache[:n], positions, window, sinks, scale, fast)
    per_token = seq * k_cache.shape[2] * k_cache.shape[3]
    chunk = max(1, _GATHER_ELEMENTS // per_token)
    outs = []
    for start in range(0, n, chunk):
        r = rows[start:start + chunk]
        outs.append(_attend(q[start:start + chunk], k_cache[r], v_cache[r], positions[start:start + chunk],
                            window, sinks, scale, fast))
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _attend(q, keys, values, positions, window, sinks, scale, fast):
    """q[n, h, d] against keys/values[n, S, kvh, d], one cache row per token."""
    n, heads, head_dim = q.shape
    seq, kv_heads = keys.shape[1], keys.shape[2]
    span = torch.arange(seq, device=q.device)
    visible = span[None, :] <= positions[:, None].long()
    if window:
        visible &= span[None, :] > positions[:, None].long() - window
    if fast and sinks is None:
        out = F.scaled_dot_product_attention(
            q[:, :, None, :], keys.transpose(1, 2), values.transpose(1, 2),
            attn_mask=visible[:, None, None, :], scale=scale, enable_gqa=kv_heads != heads)
        return out[:, :, 0, :]
    group = heads // kv_heads
    qg = q.reshape(n, kv_heads, group, head_dim).float()
    scores = torch.einsum("nkgd,nskd->nkgs", qg, keys.float()) * scale
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    if sinks is not None:
        sink = sinks.float().reshape(1, kv_heads, group, 1).expand(n, kv_heads, group, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
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
    """An entry's arguments as tensors on the model's device: numpy arrays are taken as well as tensors."""
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
