"""Array rewrites between checkpoint layouts.

llama.cpp's HF-to-GGUF converter reorders the rows of every llama q and k
projection: Hugging Face rotates a head's two *halves* against each other
(rotate_half), llama.cpp rotates *adjacent pairs*. Inside one head of D rows,
HF row  s * D/2 + i  (s in {0, 1}: which half, i < D/2)  is stored in the GGUF
at row  2 * i + s.  Both functions below work on numpy arrays and torch
tensors alike, and on weights (rows, in) as well as biases (rows,).
"""

from __future__ import annotations


def _head_rows(w, heads: int) -> int:
    rows = w.shape[0]
    if heads <= 0 or rows % (2 * heads):
        raise ValueError(
            f"cannot split {rows} rows into {heads} heads of an even size; "
            "pass the number of heads of this projection (kv heads for k)"
        )
    return rows // heads


def permute_rope(w, heads: int, rotated: int | None = None):
    """HF layout -> GGUF layout: what llama.cpp's converter does to q and k.

    Per head, view the rows as (2, D/2) [half, index] and transpose to
    (D/2, 2), so the two halves interleave. With `rotated`, only each head's
    last `rotated` rows are rotary ones and move (the inverse of `unpermute_rope`'s).
    """
    if rotated is not None:
        return w[_tail_order(w, heads, rotated, inverse=True)]
    d = _head_rows(w, heads)
    rest = tuple(w.shape[1:])
    return w.reshape(heads, 2, d // 2, *rest).swapaxes(1, 2).reshape(tuple(w.shape))


def unpermute_rope(w, heads: int, rotated: int | None = None):
    """GGUF layout -> HF layout: the exact inverse of `permute_rope`.

    Per head, view the rows as (D/2, 2) [index, half] and transpose back to
    (2, D/2). Use `heads` = attention heads for q, kv heads for k. With
    `rotated`, only the last `rotated` rows of each head are rotary ones, stored
    as adjacent pairs, and are put into halves; the rows before them stay (DeepSeek's
    multi-head latent attention rotates 64 of each query head's 192 rows, and the
    last 64 of its shared key's latent, in pairs as complex numbers).
    """
    if rotated is not None:
        return w[_tail_order(w, heads, rotated, inverse=False)]
    d = _head_rows(w, heads)
    rest = tuple(w.shape[1:])
    return w.reshape(heads, d // 2, 2, *rest).swapaxes(1, 2).reshape(tuple(w.shape))


def split_heads(w, heads: int, head_rows: int, start: int, stop: int):
    """The stored [heads * head_rows, ...] as [heads, stop - start, ...]: rows start..stop-1 of each
    head's head_rows. DeepSeek's kv_b_proj holds each head's key rows then its value rows; MLA reads
    them as two params of per-head matrices, each taking its own rows (a view where it can be)."""
    if heads <= 0 or head_rows <= 0 or w.shape[0] != heads * head_rows or not 0 <= start < stop <= head_rows:
        raise ValueError(f"cannot take rows {start} to {stop} of each of {heads} heads of {head_rows} rows from a "
                         f"tensor of {w.shape[0]} rows")
    return w.reshape(heads, head_rows, *w.shape[1:])[:, start:stop]


def _tail_order(w, heads: int, rotated: int, inverse: bool) -> list:
    """Row indices that take each head's last `rotated` rows from pairs to halves (or back)."""
    d = w.shape[0] // heads if heads > 0 and w.shape[0] % heads == 0 else 0
    if not 0 < rotated <= d or rotated % 2:
        raise ValueError(f"cannot rotate the last {rotated} rows of each of {heads} heads of {w.shape[0]} rows; "
                         "pass an even number of rows, at most a head's")
    half = rotated // 2
    order = []
    for h in range(heads):
        kept, tail = h * d, h * d + d - rotated
        order.extend(range(kept, tail))
        # halves[s * half + i] = pairs[2 * i + s]; the inverse reads halves back into pairs
        order.extend(tail + (s * half + i if inverse else 2 * i + s)
                     for s, i in ((j % 2, j // 2) if inverse else (j // half, j % half) for j in range(rotated)))
    return order
