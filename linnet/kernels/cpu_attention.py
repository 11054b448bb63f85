"""The CPU attention for tokens that each read one cache row (decode steps, the decoding rows of a
mixed pass, prompts' tokens once the pass has written their keys): `cpu_attention.c`, built and
loaded like `cpu_linear`.

SDPA's CPU flash-attention kernel blocks over queries, and with one query a row it is slow: a
16-row SmolLM2 layer took about 415 us of a decode step. `attend_rows` gives each token to one
thread, which, KV head by KV head, scores its query heads against the visible keys, takes the
softmax (with a sink logit per head, if any, and the scores capped if asked: Gemma 2's) and sums
the values, all in f32, reading an f32, bf16 or f16 cache.
"""

from __future__ import annotations

import ctypes

import torch

from linnet.kernels import build, pool
from linnet.kernels.torch_types import TYPES
from linnet.kernels.cpu_graph import call
from linnet.kernels.cpu_ops import as_int32


def available(cache: torch.Tensor, head_dim: int) -> bool:
    """Whether `attend_rows` serves this layer's cache [B, S, kv_heads, head_dim] here."""
    return (cache.device.type == "cpu" and cache.dtype in TYPES and head_dim % 8 == 0
            and cache.stride(-1) == 1 and cache.stride(-2) == head_dim and library() is not None)


def attend_rows(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: torch.Tensor,
                positions: torch.Tensor, window: int, sinks: torch.Tensor | None, scale: float,
                softcap: float = 0.0) -> torch.Tensor:
    """q [n, H, D]: token i against row rows[i] of the layer's cache [B, S, kv_heads, D] at positions
    up to positions[i] (the last `window` of them, if window); a position >= S (padding) or a row
    outside [0, B) gives zeros. softcap > 0 caps each scaled score s as softcap * tanh(s / softcap)
    (Gemma 2's) before the softmax. Returns [n, H, D] in q's type."""
    n, heads, head_dim = q.shape
    kv_heads, max_seq = k_cache.shape[2], k_cache.shape[1]
    if v_cache.stride() != k_cache.stride():
        raise ValueError("keys and values must share a layout")
    dtype = q.dtype
    if dtype not in TYPES:
        q = q.float()
    q = q.contiguous()
    rows, positions = as_int32(rows), as_int32(positions)
    sink = None if sinks is None else sinks.float().contiguous()
    out = torch.empty_like(q)
    if call("attention",
            TYPES[k_cache.dtype], TYPES[q.dtype], q.data_ptr(), n, heads, kv_heads, head_dim, k_cache.data_ptr(),
            v_cache.data_ptr(), k_cache.stride(0), k_cache.stride(1), k_cache.shape[0], max_seq, rows.data_ptr(),
            positions.data_ptr(), window, None if sink is None else sink.data_ptr(), scale, softcap, out.data_ptr(),
            pool.threads()):
        raise MemoryError(f"no memory for {max_seq} attention scores a thread")
    return out if out.dtype == dtype else out.to(dtype)


def library() -> ctypes.CDLL | None:
    return build.cpu_kernels()
