"""The sampler for the JAX backend: the same math as sampling_torch, jitted per shape and mode."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from linnet.serve.request import MAX_LOGPROBS
from linnet.serve.sampling import SamplingBatch


def _noise(seed, step, vocab):
    key = jax.random.fold_in(jax.random.PRNGKey(seed), step)
    return jax.random.uniform(key, (vocab,), minval=1e-12, maxval=1 - 1e-12)


def _argmax(x):
    """The first index of each row's largest value, as two plain reductions: XLA's CPU backend
    runs argmax's (value, index) reduction an element at a time, 0.2 ms over SmolLM2's 49152
    logits, a fiftieth of its one-row decode step."""
    top = jnp.max(x, axis=-1, keepdims=True)
    index = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.min(jnp.where(x == top, index, x.shape[-1]), axis=-1)


def _unpack_bits(words, n: int):
    """bool[K, n] from int32[K, ceil(n / 32)]: bit j of word w is element 32 w + j."""
    bits = jnp.right_shift(words[:, :, None], jnp.arange(32, dtype=jnp.int32)) & 1
    return bits.astype(bool).reshape(words.shape[0], -1)[:, :n]


def _draw(logits, temp, top_k, top_p, min_p, rep, pres, freq, seed, step, seen, counts, bias, allowed_bits, *,
          greedy_only, adjusted, top_logprobs, want_logprobs):
    logits = logits.astype(jnp.float32)
    logprobs = jax.nn.log_softmax(logits, axis=-1)
    if adjusted:  # each array None where no row needs it: a trace of its own
        if seen is not None:
            penalized = jnp.where(logits > 0, logits / rep[:, None], logits * rep[:, None])
            logits = jnp.where(seen, penalized, logits)
            c = counts.astype(jnp.float32)
            logits = logits - freq[:, None] * c - pres[:, None] * (c > 0)
        if bias is not None:
            logits = logits + bias
        if allowed_bits is not None:
            logits = jnp.where(_unpack_bits(allowed_bits, logits.shape[-1]), logits, -jnp.inf)
    greedy = _argmax(logits)
    if greedy_only:
        tokens = greedy
    else:
        vocab = logits.shape[-1]
        scaled = logits / jnp.maximum(temp, 1e-5)[:, None]
        order = jnp.argsort(-scaled, axis=-1)
        sorted_logits = jnp.take_along_axis(scaled, order, axis=-1)
        ranks = jnp.arange(vocab)[None, :]
        k = jnp.where(top_k > 0, top_k, vocab)[:, None]
        keep = ranks < k
        probs = jax.nn.softmax(jnp.where(keep, sorted_logits, -jnp.inf), axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs
        keep = keep & (before < top_p[:, None]) & (probs >= min_p[:, None] * probs[:, :1])
        keep = keep.at[:, 0].set(True)
        masked_sorted = jnp.where(keep, sorted_logits, -jnp.inf)
        rows = jnp.arange(logits.shape[0])[:, None]
        masked = jnp.full_like(scaled, -jnp.inf).at[rows, order].set(masked_sorted)
        noise = jax.vmap(_noise, in_axes=(0, 0, None))(seed, step, vocab)
        drawn = _argmax(masked - jnp.log(-jnp.log(noise)))
        tokens = jnp.where(temp > 0, drawn, greedy)
    tokens = tokens.astype(jnp.int32)
    if not want_logprobs:
        return tokens, None, None, None
    return (tokens, *_picked(logprobs, tokens, top_logprobs))


def _picked(logprobs, tokens, k: int):
    """Each row's logprob of its token, and its k best values and ids (None, None for k = 0)."""
    chosen = jnp.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]
    if k == 0:
        return chosen, None, None
    values, ids = jax.lax.top_k(logprobs, min(k, logprobs.shape[-1]))
    return chosen, values, ids.astype(jnp.int32)


@functools.partial(jax.jit, static_argnames="k")
def _score(logits, targets, k: int):
    logprobs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    chosen, values, ids = _picked(logprobs, targets, k)
    return chosen, jnp.sum(logprobs > chosen[:, None], axis=-1) + 1, values, ids


def score(logits, targets, k: int):
    """Prompt tokens as the model saw them: row i's logprob of targets[i], with no penalty or bias,
    its rank among the vocabulary (1: the likeliest) and the row's k best; jitted per (rows, k).
    -> (logprobs f32[M], ranks i32[M], (top values, top ids) or None)"""
    chosen, ranks, values, ids = _score(logits, targets, k)
    return chosen, ranks, (values, ids) if values is not None else None


def mode(batch: SamplingBatch, adjustments=None) -> tuple:
    """What a batch's draw compiles for: (greedy only, logits adjusted, top logprobs, logprobs at all).
    Logprobs always list the most alternatives any request may ask for (the host keeps each
    request's k), so that one executable serves every k and a warmup can compile it."""
    wanted = batch.logprobs >= 0
    return batch.greedy_only, bool(batch.adjusted and adjustments is not None), MAX_LOGPROBS if wanted else 0, wanted


@functools.cache
def sampler(greedy_only: bool, adjusted: bool, top_logprobs: int, want_logprobs: bool):
    """The draw for one mode (`mode`), as a function of (logits, *`arguments`): one object per mode,
    so that it can key an executable that runs it after the model's decode (`JaxModel.call_then`)."""
    return functools.partial(_draw, greedy_only=greedy_only, adjusted=adjusted, top_logprobs=top_logprobs,
                             want_logprobs=want_logprobs)


def arguments(batch: SamplingBatch, adjustments=None) -> tuple:
    """The batch's settings as the arrays `sampler`'s functions take after the logits;
    `adjustments`: runners.logit_adjustments' (seen, counts, bias, allowed bits)."""
    k = len(batch.temperature)
    if adjustments is None:  # host arrays: eager jnp.zeros would dispatch ops every step
        adjustments = (np.zeros((k, 1), bool), np.zeros((k, 1), np.int32), np.zeros((k, 1), np.float32),
                       np.full((k, 1), -1, np.int32))
    return (batch.temperature, batch.top_k, batch.top_p, batch.min_p, batch.repetition, batch.presence,
            batch.frequency, batch.seed.astype("uint32"), batch.step.astype("int32"), *adjustments)


@functools.cache
def _jitted(key: tuple):
    return jax.jit(sampler(*key))


def sample(logits, batch: SamplingBatch, adjustments=None):
    """Draws over logits that are already on the device, in an executable of their own."""
    tokens, chosen, values, ids = _jitted(mode(batch, adjustments))(logits, *arguments(batch, adjustments))
    return tokens, chosen, (values, ids) if values is not None else None
