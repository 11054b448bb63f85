"""Per-request sampling settings packed into arrays for the on-device samplers.

The samplers themselves (sampling_torch, sampling_jax) do the same math: the logit bias, then the
penalties, in vLLM's (and llama.cpp's) order: rep(logits + bias) - frequency * count - presence *
[count > 0], where rep(z) = z / r if z > 0 else z * r on the tokens of the prompt and output; then
temperature; then top-k, top-p and min-p as thresholds on each row's values, with no sort
of the vocabulary where the backend can help it (a sort of 49k logits costs a CPU more than a
small model's decode step); then an exponential race, the token with the largest kept
probability / -log(u), which draws as the softmax does. The noise u is a hash of
(seed, step, token) (`NOISE`), the same on both backends, so a seeded request gets the same
tokens whatever else shares its batch, and on either backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


# The three forms of the host's adjustments, each one array set and so one compiled draw (JAX):
# MASK, token masks alone (structured outputs, allowed_token_ids): the allowed tokens, packed bits;
# SHIFT, penalties or a bias, with any masks: the tokens each row has seen, packed bits (for the
# repetition penalty), and one array added after it (bias, presence and frequency penalties, a
# mask's bans as -inf). Adding the bias after the repetition penalty is adding it before where no
# row has both: rep is the identity at r = 1, and keeps -inf at -inf;
# SPLIT, SHIFT's arrays where some row has both, with the bias (and bans) apart in a second array
# added before the repetition penalty, the shift then holding the penalties alone. A second array
# of logits' size is sent only then, not for every penalized request.
# Three forms, not one per mix, so that a warmup can compile them all; and masks keep theirs,
# since a structure's is 32 times smaller than an array of logits.
MASK = "mask"
SHIFT = "shift"
SPLIT = "split"

# The noise: u(seed, step, token) = ((h >> 9) + 0.5) / 2^23, in (0, 1), where, in uint32 arithmetic,
# h = mix(mix(mix(seed) + step * STEP) + token * TOKEN) and mix is a 32-bit avalanche
# (x ^= x >> 16; x *= M1; x ^= x >> 15; x *= M2; x ^= x >> 16, Wellons' lowbias32).
# 23 bits, not 24: (h >> 9) + 0.5 is exact in f32, so u < 1 always. With 24, the largest value
# (2^24 - 0.5) rounded to 2^24, u was 1, -log(u) 0, and that token won the race whatever its
# probability (a masked one too): one draw in 2^24 per token, a third of a percent of a
# 49k-vocabulary model's steps.
NOISE_BITS = 23
TOP_K_MAX = 2**31 - 1
NOISE = {"M1": 0x7FEB352D, "M2": 0x846CA68B, "STEP": 0x9E3779B9, "TOKEN": 0x85EBCA6B}


def noise_key(seed: int) -> int:
    """The noise's 32-bit key for a request's seed: the seed itself in [0, 2^32), so that those
    draw as they always have; any other integer (negative, or wider: vLLM takes 64 bits) is
    hashed whole, 64 bits at a time (splitmix64's finalizer), so that seeds differing only past
    bit 31 do not draw alike."""
    if 0 <= seed < 1 << 32:
        return seed
    h, rest = (0x5851F42D4C957F2D if seed < 0 else 0x14057B7EF767814F), abs(seed)
    while True:
        h = (h ^ (rest & 0xFFFFFFFFFFFFFFFF)) + 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF
        h = (h ^ h >> 30) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h = (h ^ h >> 27) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
        rest >>= 64
        if not rest:
            return h >> 32


def adjustment_of(requests: list) -> str | None:
    """The form that moves these requests' logits, or None where nothing does."""
    if any(r.repetition_penalty != 1 and r.logit_bias for r in requests):  # the bias goes before rep
        return SPLIT
    if any(r.penalized or r.biased for r in requests):
        return SHIFT
    return MASK if any(r.restricted for r in requests) else None


# Temperatures below this draw greedily, as vLLM's do: the logits over it are so far apart that only
# ties are left to chance, and tied logits (common in bf16) are broken by the lowest id instead.
GREEDY_BELOW = 1e-5

@dataclass
class SamplingBatch:
    temperature: np.ndarray  # f32[K]
    top_k: np.ndarray  # i32[K], 0 = off
    top_p: np.ndarray  # f32[K]
    min_p: np.ndarray  # f32[K]
    repetition: np.ndarray  # f32[K]
    presence: np.ndarray  # f32[K]
    frequency: np.ndarray  # f32[K]
    seed: np.ndarray  # i64[K]
    step: np.ndarray  # i64[K]: index of the token being drawn in its request
    greedy_only: bool
    # How arrays the host makes (`runners.logit_adjustments`) move some row's logits: None, MASK, SHIFT or SPLIT.
    adjustment: str | None
    logprobs: int  # the most top alternatives any row asked for (0: none); -1: no logprobs at all

    @property
    def adjusted(self) -> bool:
        return self.adjustment is not None

    @staticmethod
    def of(requests: list, seeds: list, steps: list) -> "SamplingBatch":
        f = lambda attr: np.array([getattr(r, attr) for r in requests], dtype=np.float32)
        temp = f("temperature")
        temp[temp < GREEDY_BELOW] = 0.0
        rep, pres, freq = f("repetition_penalty"), f("presence_penalty"), f("frequency_penalty")
        asked = [r.logprobs for r in requests if r.logprobs is not None]
        return SamplingBatch(
            # a top_k past the vocabulary limits nothing, as past int32
            temperature=temp, top_k=np.array([min(r.top_k, TOP_K_MAX) for r in requests], dtype=np.int32),
            top_p=f("top_p"), min_p=f("min_p"), repetition=rep, presence=pres, frequency=freq,
            seed=np.array([noise_key(s) for s in seeds], dtype=np.int64), step=np.array(steps, dtype=np.int64),
            greedy_only=bool(np.all(temp == 0)),
            adjustment=adjustment_of(requests),
            logprobs=max(asked) if asked else -1)


def place(batch: SamplingBatch, rows: list, k: int) -> SamplingBatch:
    """A batch of k rows where row rows[i] holds request i's settings (for fixed-shape executables).

    The other rows repeat request 0's settings; what is drawn for them is thrown away.
    """
    n = len(batch.temperature)
    if list(rows) == list(range(k)) and n == k:
        return batch
    idx = np.zeros(k, dtype=np.int64)
    idx[np.asarray(rows, dtype=np.int64)] = np.arange(n)
    fields = {name: getattr(batch, name)[idx] for name in
              ("temperature", "top_k", "top_p", "min_p", "repetition", "presence", "frequency", "seed", "step")}
    return SamplingBatch(**fields, greedy_only=batch.greedy_only, adjustment=batch.adjustment, logprobs=batch.logprobs)
