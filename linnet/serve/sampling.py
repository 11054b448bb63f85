"""Per-request sampling settings packed into arrays for the on-device samplers.

The samplers themselves (sampling_torch, sampling_jax) do the same math:
penalties and logit bias, temperature, top-k, top-p, min-p, then a draw made with Gumbel
noise that depends only on (seed, token index), so a seeded request gets the
same tokens whatever else shares its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
    # Which of the host's arrays move some row's logits: (penalties, bias, token mask);
    # `runners.logit_adjustments` makes those, and only those.
    adjusting: tuple
    logprobs: int  # the most top alternatives any row asked for (0: none); -1: no logprobs at all

    @property
    def adjusted(self) -> bool:
        return any(self.adjusting)

    @staticmethod
    def of(requests: list, seeds: list, steps: list) -> "SamplingBatch":
        f = lambda attr: np.array([getattr(r, attr) for r in requests], dtype=np.float32)
        temp = f("temperature")
        rep, pres, freq = f("repetition_penalty"), f("presence_penalty"), f("frequency_penalty")
        asked = [r.logprobs for r in requests if r.logprobs is not None]
        return SamplingBatch(
            temperature=temp, top_k=np.array([r.top_k for r in requests], dtype=np.int32), top_p=f("top_p"),
            min_p=f("min_p"), repetition=rep, presence=pres, frequency=freq,
            seed=np.array(seeds, dtype=np.int64), step=np.array(steps, dtype=np.int64),
            greedy_only=bool(np.all(temp == 0)),
            adjusting=(any(r.penalized for r in requests), any(r.biased for r in requests),
                       any(r.restricted for r in requests)),
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
    return SamplingBatch(**fields, greedy_only=batch.greedy_only, adjusting=batch.adjusting, logprobs=batch.logprobs)
