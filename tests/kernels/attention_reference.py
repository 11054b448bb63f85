"""Softmax attention of one query a cache row, in float64 and plain loops: the reference the CPU
attention kernel is checked against, through torch and through XLA."""

import numpy as np


def reference(q, k, v, rows, positions, window, sinks, scale, softcap=0.0):
    """Softmax attention of token i over row rows[i], positions max(0, p - window + 1) .. p, in float64.
    Arrays are numpy: q [n, H, D], k and v [B, S, KVH, D], sinks [H] or None. softcap > 0 caps each
    scaled score s as softcap * tanh(s / softcap) (Gemma 2's) before the softmax."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    n, heads, d = q.shape
    kv_heads, max_seq = k.shape[2], k.shape[1]
    group = heads // kv_heads
    out = np.zeros((n, heads, d))
    for i in range(n):
        p = int(positions[i])
        if p >= max_seq or not 0 <= rows[i] < k.shape[0]:
            continue  # padding, or no such row
        lo = max(0, p - window + 1) if window else 0
        for h in range(heads):
            keys = k[rows[i], lo:p + 1, h // group]
            values = v[rows[i], lo:p + 1, h // group]
            logits = keys @ q[i, h] * scale
            if softcap:
                logits = softcap * np.tanh(logits / softcap)
            extra = [] if sinks is None else [float(sinks[h])]
            top = max(list(logits) + extra)
            weights = np.exp(logits - top)
            total = weights.sum() + sum(np.exp(e - top) for e in extra)
            out[i, h] = weights @ values / total
    return out
