"""The distributions both samplers draw from against independent references: transformers'
LogitsProcessor classes (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
MinPLogitsWarper, and RepetitionPenaltyLogitsProcessor over the prompt and output tokens), and,
where transformers has none, vLLM's documented formulas (vllm/v1/sample: the logit bias and
min_tokens' bans first, then the repetition penalty, then frequency * count and presence *
[count > 0] over the output tokens alone). Rows of a batch each with settings of their own, each
against its own reference computed alone; `probabilities` is what the race draws from."""

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from linnet.serve import sampling_jax, sampling_torch
from linnet.serve.request import Request
from linnet.serve.runners import logit_adjustments
from linnet.serve.sampling import GREEDY_BELOW, SamplingBatch

BACKENDS = ["torch", "jax"]
VOCAB = 96  # one shape for every example: JAX compiles each once


def warped(scores: torch.Tensor, r: Request) -> torch.Tensor:
    """transformers' sampling warpers on f32 scores [1, vocab], in its generate()'s order."""
    ids = torch.zeros((1, 1), dtype=torch.long)  # (the warpers do not read them)
    scores = TemperatureLogitsWarper(r.temperature)(ids, scores)
    if r.top_k > 0:
        scores = TopKLogitsWarper(r.top_k)(ids, scores)
    if r.top_p < 1:
        scores = TopPLogitsWarper(r.top_p)(ids, scores)
    if r.min_p > 0:
        scores = MinPLogitsWarper(r.min_p)(ids, scores)
    return scores


def reference(logits: np.ndarray, prompt: list, output: list, r: Request, bans=()) -> np.ndarray:
    """The distribution a row's next token is drawn from, as vLLM's sampler orders the steps
    (vllm/v1/sample/sampler.py): min_tokens' bans (`bans`, -inf) and the logit bias; the repetition
    penalty over prompt and output (transformers' processor, which takes them as its input_ids);
    vLLM's frequency and presence penalties over the output alone; then greedy below a temperature
    of 1e-5, else transformers' warpers."""
    z = torch.tensor(logits, dtype=torch.float32)[None].clone()
    for t, b in (r.logit_bias or {}).items():
        z[0, t] += b
    z[0, list(bans)] = float("-inf")
    if r.repetition_penalty != 1:
        z = RepetitionPenaltyLogitsProcessor(r.repetition_penalty)(torch.tensor([prompt + output]), z)
    counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=z.shape[-1]).float()
    z = z - r.frequency_penalty * counts - r.presence_penalty * (counts > 0).float()
    if r.temperature < GREEDY_BELOW:
        return np.eye(z.shape[-1])[int(z.argmax())]
    return torch.softmax(warped(z, r), dim=-1)[0].double().numpy()


def linnet(backend: str, logits: np.ndarray, requests: list, histories: list) -> np.ndarray:
    """Each row's distribution as the backend's sampler has it; histories: (prompt, output, bans)."""
    batch = SamplingBatch.of(requests, [0] * len(requests), [len(o) for _, o, _ in histories])
    adjustments = None
    if batch.adjusted:
        biases = [{**(r.logit_bias or {}), **dict.fromkeys(bans, float("-inf"))} or None
                  for r, (_, _, bans) in zip(requests, histories)]
        adjustments = logit_adjustments(batch, [(p, o, b, None) for (p, o, _), b in zip(histories, biases)],
                                        logits.shape[-1], len(requests))
    if backend == "torch":
        return sampling_torch.probabilities(torch.from_numpy(logits), batch,
                                            adjustments and tuple(torch.from_numpy(a) for a in adjustments)).numpy()
    import jax.numpy as jnp

    return np.asarray(sampling_jax.probabilities(jnp.asarray(logits), batch,
                                                 adjustments and tuple(jnp.asarray(a) for a in adjustments)))


def assert_same_distribution(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """The same tokens kept, each with the same probability up to f32's rounding of a softmax."""
    kept, wanted = np.flatnonzero(got > 0), np.flatnonzero(want > 0)
    assert kept.tolist() == wanted.tolist(), f"{what}: keeps {kept.tolist()}, the reference {wanted.tolist()}"
    assert np.abs(got - want).max() < 2e-6, f"{what}: probabilities differ by {np.abs(got - want).max():.2e}"


def row_settings():
    """One request's sampling fields, and its history: a mix of every parameter, each often off."""
    token = st.integers(0, VOCAB - 1)
    return st.fixed_dictionaries({
        "temperature": st.sampled_from([0.0, 1e-6, 0.3, 0.7, 1.0, 1.6]),
        "top_k": st.sampled_from([0, 0, 1, 2, 7, 40, VOCAB + 5]),
        "top_p": st.sampled_from([1.0, 1.0, 0.3, 0.8, 0.95]),
        "min_p": st.sampled_from([0.0, 0.0, 0.02, 0.1, 0.5]),
        "repetition_penalty": st.sampled_from([1.0, 1.0, 0.7, 1.3, 2.5]),
        "presence_penalty": st.sampled_from([0.0, 0.0, -1.0, 0.6, 2.0]),
        "frequency_penalty": st.sampled_from([0.0, 0.0, -0.5, 0.4, 2.0]),
        "logit_bias": st.none() | st.dictionaries(token, st.sampled_from([-100.0, -3.5, 1.25, 8.0, 100.0]),
                                                  max_size=3),
        "prompt": st.lists(token, min_size=1, max_size=12),
        "output": st.lists(token, max_size=10),
        "bans": st.lists(token, max_size=2, unique=True),  # min_tokens' enders, as the engine bans them
    })


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(rows=st.lists(row_settings(), min_size=1, max_size=6), seed=st.integers(0, 2**32 - 1))
def test_each_rows_distribution_is_the_references_beside_any_rows(backend, rows, seed):
    """Every parameter and their mixes, a row's settings unlike its neighbours': each row's
    probabilities are the reference's for it alone, and bitwise what that row gets in a batch of
    its own."""
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((len(rows), VOCAB)) * rng.uniform(0.5, 4, (len(rows), 1))).astype(np.float32)
    requests = [Request(r["prompt"], **{k: v for k, v in r.items() if k not in ("prompt", "output", "bans")})
                for r in rows]
    histories = [(r["prompt"], r["output"], r["bans"]) for r in rows]
    together = linnet(backend, logits, requests, histories)
    for i, (r, (prompt, output, bans)) in enumerate(zip(requests, histories)):
        want = reference(logits[i], prompt, output, r, bans)
        assert_same_distribution(together[i], want, f"row {i} of {len(rows)}")
        alone = linnet(backend, logits[i:i + 1], [r], [histories[i]])[0]
        assert np.array_equal(alone, together[i]), f"row {i}: its distribution differs beside the others"


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_off_values_are_off_as_vllm_takes_them(backend):
    """top_p = 1, top_k = 0 (the server's -1 too), min_p = 0, penalties of 1 and 0: the plain
    softmax over the logits / temperature, where any other value moves it."""
    rng = np.random.default_rng(4)
    logits = (rng.standard_normal((1, VOCAB)) * 3).astype(np.float32)
    off = Request([1, 2], temperature=0.8, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0,
                  presence_penalty=0.0, frequency_penalty=0.0)
    z = logits[0].astype(np.float64) / 0.8
    softmax = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    history = ([1, 2], [3, 3], [])
    assert_same_distribution(linnet(backend, logits, [off], [history])[0], softmax, "off")
    for field, value in [("top_p", 0.999), ("top_k", VOCAB // 2), ("min_p", 1e-3), ("repetition_penalty", 1.01),
                         ("presence_penalty", 0.01), ("frequency_penalty", 0.01)]:
        moved = linnet(backend, logits, [dataclasses.replace(off, **{field: value})], [history])[0]
        assert np.abs(moved - softmax).max() > 1e-7, f"{field}={value} moved nothing"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("limits", [dict(top_k=3), dict(top_p=0.2), dict(min_p=0.9), dict(top_k=1, top_p=0.01)])
def test_greedy_is_the_argmax_whatever_the_limits_say(backend, limits):
    """A temperature of 0 (or below 1e-5) draws the argmax of the adjusted logits, however top-k,
    top-p and min-p are set, as vLLM's greedy path never reads them."""
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((4, VOCAB)) * 2).astype(np.float32)
    requests = [Request([1], temperature=t, **limits) for t in (0.0, 1e-6, 0.0, 9e-6)]
    got = linnet(backend, logits, requests, [([1], [], [])] * 4)
    assert got.argmax(axis=-1).tolist() == logits.argmax(axis=-1).tolist() and (got.max(axis=-1) == 1).all()
