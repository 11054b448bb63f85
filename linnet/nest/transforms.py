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


def permute_rope(w, heads: int):
    """HF layout -> GGUF layout: what llama.cpp's converter does to q and k.

    Per head, view the rows as (2, D/2) [half, index] and transpose to
    (D/2, 2), so the two halves interleave.
    """
    d = _head_rows(w, heads)
    rest = tuple(w.shape[1:])
    return w.reshape(heads, 2, d // 2, *rest).swapaxes(1, 2).reshape(tuple(w.shape))


def unpermute_rope(w, heads: int):
    """GGUF layout -> HF layout: the exact inverse of `permute_rope`.

    Per head, view the rows as (D/2, 2) [index, half] and transpose back to
    (2, D/2). Use `heads` = attention heads for q, kv heads for k.
    """
    d = _head_rows(w, heads)
    rest = tuple(w.shape[1:])
    return w.reshape(heads, d // 2, 2, *rest).swapaxes(1, 2).reshape(tuple(w.shape))
