"""Reductions over a row's last axis in one order whatever the array's other rows: batch invariance.

XLA's CPU backend (jaxlib 0.10) hands a reduction over an array of about 4096 elements or more, with
the elementwise ops that consume it, to YNNPACK, and computes smaller ones itself: `jnp.sum` of a
row of 2048 gave other bits alone than beside a second row, and of 128 at 32 rows than at 16, and
YNNPACK's exp in a softmax's fusion differed from XLA's by a unit in the last place. A pass's rows
are its requests' tokens, so a request's norms, softmaxes and logprobs moved in their last bits
with what shared its pass. These reductions are written as pairwise trees of elementwise ops over
neighbours in the row, with no reduce for XLA to hand over: each output element is the same expression
of its own row whatever the shape, which XLA neither reorders (no fast math) nor splits.

Only where XLA compiles for the CPU (decided as a function is traced): on a GPU the trees would be
log2(n) passes through memory where XLA's reduce is one fused kernel, for nothing, since a GPU
pass is not batch-invariant anyway (cuBLAS chooses its matmul kernels by the rows' count).
"""

import jax
import jax.numpy as jnp


def in_one_order() -> bool:
    """Whether reductions are written as trees: for the CPU (above)."""
    return jax.default_backend() == "cpu"


def row_sum(x, keepdims: bool = False):
    """x summed over its last axis, pairwise: each step adds neighbours (0 + 1, 2 + 3, ...), a row of
    odd width first taking a zero at its end (adding 0 is exact)."""
    if not in_one_order():
        return jnp.sum(x, axis=-1, keepdims=keepdims)
    return _tree(jnp.add, x, 0, keepdims)


def row_max(x, keepdims: bool = False):
    """x's largest value over its last axis (a NaN wins, as jnp.max's), by the same tree."""
    if not in_one_order():
        return jnp.max(x, axis=-1, keepdims=keepdims)
    return _tree(jnp.maximum, x, -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min,
                 keepdims)


def _tree(combine, x, pad, keepdims: bool):
    # Neighbours rather than halves, and a pad only at an odd step rather than to a power of two up
    # front: SmolLM2's 16 x 49152 logits summed in 0.46 ms so, 1.15 with halves of a padded row
    # (XLA's reduce: 0.28)
    while x.shape[-1] > 1:
        if x.shape[-1] % 2:
            x = jnp.concatenate([x, jnp.full(x.shape[:-1] + (1,), pad, x.dtype)], axis=-1)
        pairs = x.reshape(x.shape[:-1] + (x.shape[-1] // 2, 2))
        x = combine(pairs[..., 0], pairs[..., 1])
    return x if keepdims else x[..., 0]


def sum_over(x, axis: int, keepdims: bool = False):
    """`jnp.sum(x, axis)` in `row_sum`'s order: the language's `sum` (a MoE layer's weighted sum of
    its k experts' outputs, which YNNPACK's fusion computed otherwise at other row counts). A
    16-bit float sums in f32, a bool as int32, as jnp.sum does."""
    if not in_one_order():
        return jnp.sum(x, axis=axis, keepdims=keepdims)
    kind = x.dtype
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.int32)
    elif jnp.issubdtype(kind, jnp.floating) and jnp.finfo(kind).bits < 32:
        x = x.astype(jnp.float32)
    if x.shape[axis] == 0:
        y = jnp.zeros(x.shape[:axis % x.ndim] + x.shape[axis % x.ndim + 1:], x.dtype)
    else:
        y = row_sum(jnp.moveaxis(x, axis, -1))
    y = y.astype(kind) if kind != jnp.bool_ else y
    return jnp.expand_dims(y, axis) if keepdims else y


def mean_over(x, axis: int, keepdims: bool = False):
    """`jnp.mean(x, axis)` as `sum_over` sums: an integer x's mean in f32, as jnp.mean's."""
    if not in_one_order():
        return jnp.mean(x, axis=axis, keepdims=keepdims)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.float32)
    return (sum_over(x.astype(jnp.float32), axis, keepdims) / x.shape[axis]).astype(x.dtype)


def softmax(x):
    """jax.nn.softmax over the last axis, its max and sum as `row_max` and `row_sum` take them."""
    e = jnp.exp(x - row_max(x, keepdims=True))
    return e / row_sum(e, keepdims=True)


def log_softmax(x):
    """jax.nn.log_softmax over the last axis, its max and sum as `row_max` and `row_sum` take them."""
    shifted = x - row_max(x, keepdims=True)
    return shifted - jnp.log(row_sum(jnp.exp(shifted), keepdims=True))
