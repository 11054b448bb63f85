"""The sampler for the JAX backend: the math of `sampling`, jitted per shape and mode."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from linnet.codegen_jax import fixed_order
from linnet.serve.request import MAX_LOGPROBS
from linnet.serve.sampling import MASK, NOISE, NOISE_BITS, SHIFT, SPLIT, SamplingBatch


_U32 = jnp.uint32


def _mix(x):
    x = x ^ (x >> 16)
    x = x * _U32(NOISE["M1"])
    x = x ^ (x >> 15)
    x = x * _U32(NOISE["M2"])
    return x ^ (x >> 16)


def uniform(seed, step, vocab: int):
    """U(0, 1) noise f32[K, vocab] from (seed u32[K], step i32[K]): `sampling.NOISE`'s hash."""
    row = _mix(_mix(seed.astype(_U32)) + step.astype(_U32) * _U32(NOISE["STEP"]))
    token = jax.lax.broadcasted_iota(_U32, (seed.shape[0], vocab), 1)
    h = _mix(row[:, None] + token * _U32(NOISE["TOKEN"]))
    return unit(h)


def unit(h):
    """32-bit hashes (uint32) as f32 in (0, 1): `sampling.NOISE_BITS` of them, and a half."""
    return ((h >> (32 - NOISE_BITS)).astype(jnp.float32) + 0.5) * (1.0 / (1 << NOISE_BITS))


def _argmax(x, block: int = 128):
    """The first index of each row's largest value, a NaN counting as largest (as torch's argmax
    has it: a pass that overflowed draws the same token on both backends, inside the vocabulary),
    found through each block's largest: XLA's CPU backend runs argmax's (value, index) reduction an
    element at a time, and one index pass over the whole row widens its max to the row's shape
    first. SmolLM2's 16 x 49152 logits on this CPU: 1.5 ms as argmax, 1.2 as max and index, 0.45 so."""
    rows, n = x.shape
    blocks = -(-n // block)
    if blocks * block != n:  # a row ends short of a block: filled with -inf, never the first largest
        x = jnp.pad(x, ((0, 0), (0, blocks * block - n)), constant_values=-jnp.inf)
    x = x.reshape(rows, blocks, block)
    tops = jnp.max(x, axis=-1)  # [rows, blocks]: NaN where a block holds one (max keeps NaNs)
    top = jnp.max(tops, axis=-1, keepdims=True)
    largest = lambda v: (v == top) | jnp.isnan(v)  # (a row's top is NaN where any of it is)
    first = _first_index(largest(tops))  # the first block holding the row's largest
    inside = jnp.take_along_axis(x, first[:, None, None], axis=1)[:, 0]
    return first * block + _first_index(largest(inside))


def _first_index(mask):
    """Each row's first True column, or the row's length where none is."""
    index = jax.lax.broadcasted_iota(jnp.int32, mask.shape, mask.ndim - 1)
    return jnp.min(jnp.where(mask, index, mask.shape[-1]), axis=-1)


def _unpack_bits(words, n: int):
    """bool[K, n] from int32[K, ceil(n / 32)]: bit j of word w is element 32 w + j."""
    bits = jnp.right_shift(words[:, :, None], jnp.arange(32, dtype=jnp.int32)) & 1
    return bits.astype(bool).reshape(words.shape[0], -1)[:, :n]


def _order_keys(x):
    """uint32 keys in the order of x's f32 values."""
    bits = jax.lax.bitcast_convert_type(x, _U32)
    return jnp.where(bits >> 31 == 1, ~bits, bits | _U32(0x80000000))


def _largest_threshold(keys, weights, goal):
    """Each row's largest key t with sum(weights where keys >= t) >= goal, found a bit at a time
    from the top: 32 masked sums over the row, exact, where a sort costs a CPU ten times more."""
    def settle(bit, t):
        trial = t | (_U32(1) << (31 - bit).astype(_U32))
        mass = fixed_order.row_sum(jnp.where(keys >= trial[:, None], weights, 0))
        return jnp.where(mass >= goal, trial, t)
    return jax.lax.fori_loop(0, 32, settle, jnp.zeros(keys.shape[0], _U32))


def kept_weights(scaled, top_k, top_p, min_p):
    """Each token's unnormalized probability under scaled logits [K, vocab], 0 where top-k, top-p
    or min-p leave it out: top-k keeps the k largest values (ties with the k-th too), top-p the
    likeliest tokens whose mass before them is under p (of what top-k keeps), min-p those at least
    min_p times the likeliest. Each search runs only where some row asks for it."""
    vocab = scaled.shape[-1]
    nothing = jnp.zeros(scaled.shape[0], _U32)
    keys = _order_keys(scaled)
    kth = jax.lax.cond(jnp.any(top_k > 0), lambda: _largest_threshold(keys, 1, jnp.where(top_k > 0, top_k, vocab)),
                       lambda: nothing)
    weights = jnp.where(keys >= kth[:, None], jnp.exp(scaled - fixed_order.row_max(scaled, keepdims=True)), 0)
    probs = weights / fixed_order.row_sum(weights, keepdims=True)
    likeliest = fixed_order.row_max(probs, keepdims=True)
    prob_keys = jax.lax.bitcast_convert_type(probs, _U32)  # a non-negative f32's bits are in its order
    nucleus = jax.lax.cond(jnp.any(top_p < 1), lambda: _largest_threshold(prob_keys, probs, top_p), lambda: nothing)
    # a top_p of 1 keeps every token: the f32 sum of a row's probabilities can pass 1 by a rounding,
    # and the search then finds a nucleus short of its least likely tokens
    inside = (prob_keys >= nucleus[:, None]) | (top_p >= 1)[:, None]
    keep = inside & (probs >= min_p[:, None] * likeliest)
    return jnp.where(keep | (probs == likeliest), weights, 0)


def _adjusted(logits, rep, adjustments, adjustment):
    """f32 logits [K, vocab] as the host's arrays move them: a mask's bans (MASK); or the bias
    (SPLIT's own array), the repetition penalty, then the shift (`sampling`'s order)."""
    if adjustment == MASK:
        (allowed_bits,) = adjustments
        return jnp.where(_unpack_bits(allowed_bits, logits.shape[-1]), logits, -jnp.inf)
    if adjustment in (SHIFT, SPLIT):
        if adjustment == SPLIT:
            seen_bits, bias, shift = adjustments
            logits = logits + bias
        else:
            seen_bits, shift = adjustments
        penalized = jnp.where(logits > 0, logits / rep[:, None], logits * rep[:, None])
        return jnp.where(_unpack_bits(seen_bits, logits.shape[-1]), penalized, logits) + shift
    return logits


@functools.partial(jax.jit, static_argnames="adjustment")
def _probabilities(logits, temp, top_k, top_p, min_p, rep, *adjustments, adjustment):
    logits = _adjusted(logits.astype(jnp.float32), rep, adjustments, adjustment)
    weights = kept_weights(logits / jnp.maximum(temp, 1e-5)[:, None], top_k, top_p, min_p)
    greedy = jax.nn.one_hot(_argmax(logits), logits.shape[-1], dtype=jnp.float32)
    return jnp.where((temp > 0)[:, None], weights / fixed_order.row_sum(weights, keepdims=True), greedy)


def probabilities(logits, batch: SamplingBatch, adjustments=None):
    """f32[K, vocab]: the distribution each row's token is drawn from, as `sample` draws it (its
    race picks token i with probability weight_i / sum): the adjusted logits over the temperature,
    what top-k, top-p and min-p keep, normalized; a greedy row's (temperature below 1e-5) all on its
    argmax. For checking the sampler against other implementations' definitions."""
    return _probabilities(logits, batch.temperature, batch.top_k, batch.top_p, batch.min_p, batch.repetition,
                          *(adjustments or ()), adjustment=mode(batch, adjustments))


def _draw(logits, temp, top_k, top_p, min_p, rep, seed, step, want_logprobs, *adjustments, adjustment):
    """-> (tokens i32[K], each one's logprob f32[K], the top MAX_LOGPROBS (values, ids), each one's
    rank i32[K] (vLLM's: 1 + how many tokens are strictly likelier)); the last four zeros unless
    `want_logprobs`. Logprobs and ranks are the logits' as the model gave them. Whether any row samples and whether logprobs are
    wanted are decided on the device (`lax.cond`), so one executable a form serves every batch."""
    logits = logits.astype(jnp.float32)
    raw = logits
    logits = _adjusted(logits, rep, adjustments, adjustment)
    greedy = _argmax(logits)

    def sampled():
        weights = kept_weights(logits / jnp.maximum(temp, 1e-5)[:, None], top_k, top_p, min_p)
        return jnp.where(temp > 0, _argmax(weights / -jnp.log(uniform(seed, step, logits.shape[-1]))), greedy)
    tokens = jax.lax.cond(jnp.any(temp > 0), sampled, lambda: greedy).astype(jnp.int32)
    k = min(MAX_LOGPROBS, logits.shape[-1])
    nothing = lambda: (jnp.zeros(tokens.shape, jnp.float32), jnp.zeros((tokens.shape[0], k), jnp.float32),
                       jnp.zeros((tokens.shape[0], k), jnp.int32), jnp.zeros(tokens.shape, jnp.int32))

    def picked():
        logprobs = fixed_order.log_softmax(raw)
        chosen, values, ids = _picked(logprobs, tokens, k)
        return chosen, values, ids, _ranks(logprobs, chosen)
    return (tokens, *jax.lax.cond(want_logprobs, picked, nothing))


def _ranks(logprobs, chosen):
    """Each row's rank of the logprob `chosen` holds for it: 1 + how many of the row's are larger
    (a count: the same in any order of summing)."""
    return (jnp.sum(logprobs > chosen[:, None], axis=-1) + 1).astype(jnp.int32)


def _picked(logprobs, tokens, k: int):
    """Each row's logprob of its token, and its k best values and ids (None, None for k = 0)."""
    chosen = jnp.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]
    if k == 0:
        return chosen, None, None
    values, ids = jax.lax.top_k(logprobs, min(k, logprobs.shape[-1]))
    return chosen, values, ids.astype(jnp.int32)


@functools.partial(jax.jit, static_argnames="k")
def _score(logits, targets, k: int):
    logprobs = fixed_order.log_softmax(logits.astype(jnp.float32))
    chosen, values, ids = _picked(logprobs, targets, k)
    return chosen, _ranks(logprobs, chosen), values, ids


def score(logits, targets, k: int):
    """Prompt tokens as the model saw them: row i's logprob of targets[i], with no penalty or bias,
    its rank among the vocabulary (1: the likeliest) and the row's k best; jitted per (rows, k).
    -> (logprobs f32[M], ranks i32[M], (top values, top ids) or None)"""
    chosen, ranks, values, ids = _score(logits, targets, k)
    return chosen, ranks, (values, ids) if values is not None else None


def compile_score(logits, k: int) -> None:
    """Compiles `score` for logits of this abstract shape, type and placement (a ShapeDtypeStruct),
    without running it: a later call over such logits runs that executable (JAX keeps it; k given
    as `score` gives it, by position: given by name, it keys another)."""
    _score.lower(logits, jax.ShapeDtypeStruct(logits.shape[:1], jnp.int32), k).compile()


@functools.partial(jax.jit, static_argnums=1)
def first_rows(logits, n: int):
    """logits[:n], jitted per (shape, n), so that `compile_first_rows` can make it ahead (an eager
    slice compiles on first use, for each shape)."""
    return logits[:n]


def compile_first_rows(logits, n: int) -> None:
    """Compiles `first_rows` for logits of this abstract shape, type and placement, without running it."""
    first_rows.lower(logits, n).compile()


def mode(batch: SamplingBatch, adjustments=None) -> str | None:
    """What a batch's draw compiles for: the form of its adjustments (None, MASK, SHIFT or SPLIT). Greedy
    or sampled, with logprobs or without, is decided inside; logprobs always list the most
    alternatives any request may ask for (the host keeps each request's k)."""
    return batch.adjustment if adjustments is not None else None


@functools.cache
def sampler(adjustment):
    """The draw for one form (`mode`), as a function of (logits, *`arguments`): one object per
    form, so that it can key an executable that runs it after the model's decode
    (`JaxModel.call_then`)."""
    return functools.partial(_draw, adjustment=adjustment)


def arguments(batch: SamplingBatch, adjustments=None) -> tuple:
    """The batch's settings as the arrays `sampler`'s functions take after the logits;
    `adjustments`: runners.logit_adjustments' arrays, in the batch's form."""
    return (batch.temperature, batch.top_k, batch.top_p, batch.min_p, batch.repetition,
            batch.seed.astype("uint32"), batch.step.astype("int32"), np.bool_(batch.logprobs >= 0),
            *(adjustments or ()))


@functools.cache
def _jitted(key):
    return jax.jit(sampler(key))


def sample(logits, batch: SamplingBatch, adjustments=None):
    """Draws over logits that are already on the device, in an executable of their own.
    -> (tokens, chosen logprobs or None, (top values, top ids) or None, ranks or None)"""
    tokens, chosen, values, ids, ranks = _jitted(mode(batch, adjustments))(logits, *arguments(batch, adjustments))
    return (tokens, None, None, None) if batch.logprobs < 0 else (tokens, chosen, (values, ids), ranks)
