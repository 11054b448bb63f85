"""Both on-device samplers against a numpy statement of the same rules."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.serve.request import Request
from linnet.serve.sampling import SamplingBatch
from linnet.serve import sampling_jax, sampling_torch


def run(backend, logits, requests, seeds, steps, histories=None):
    batch = SamplingBatch.of(requests, seeds, steps)
    adjustments = None
    if batch.adjusted:
        from linnet.serve.runners import logit_adjustments

        histories = histories or [(r.prompt, [], None) for r in requests]
        adjustments = logit_adjustments(batch, [(p, o, r.logit_bias, None) for (p, o, *_), r in zip(histories, requests)],
                                        logits.shape[-1], len(requests))
    if backend == "torch":
        out = sampling_torch.sample(torch.from_numpy(logits), batch,
                                    None if adjustments is None else tuple(None if a is None else torch.from_numpy(a)
                                                                          for a in adjustments))
        return [None if x is None else (np.asarray(x) if not isinstance(x, tuple) else tuple(np.asarray(y) for y in x))
                for x in out]
    import jax.numpy as jnp

    out = sampling_jax.sample(jnp.asarray(logits), batch,
                              None if adjustments is None else tuple(None if a is None else jnp.asarray(a) for a in adjustments))
    return [None if x is None else (np.asarray(x) if not isinstance(x, tuple) else tuple(np.asarray(y) for y in x))
            for x in out]


def allowed(logits, temperature, top_k, top_p, min_p):
    """The tokens the rules leave to draw from (numpy, one row)."""
    z = logits / temperature
    order = np.argsort(-z, kind="stable")
    keep = np.zeros(len(z), bool)
    p = np.exp(z[order] - z[order].max())
    k = top_k or len(z)
    p[k:] = 0
    p /= p.sum()
    before = np.cumsum(p) - p
    ok = (np.arange(len(z)) < k) & (before < top_p) & (p >= min_p * p[0])
    ok[0] = True
    keep[order[ok]] = True
    return keep, p


BACKENDS = ["torch", "jax"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("settings", [dict(top_k=3), dict(top_p=0.6), dict(min_p=0.2), dict(top_k=5, top_p=0.9, min_p=0.05)])
def test_draws_stay_inside_the_allowed_set_and_cover_it(backend, settings):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(1, 12)).astype(np.float32) * 2
    req = Request([1], temperature=0.7, **settings)
    n = 400
    tokens = run(backend, np.repeat(logits, n, 0), [req] * n, list(range(n)), [0] * n)[0]
    keep, _ = allowed(logits[0], 0.7, req.top_k, req.top_p, req.min_p)
    assert keep[tokens].all()
    assert set(np.flatnonzero(keep)) == set(tokens.tolist())


@pytest.mark.parametrize("backend", BACKENDS)
def test_draw_frequencies_follow_the_softmax(backend):
    logits = np.log(np.array([[0.5, 0.25, 0.15, 0.1]], np.float32))
    n = 4000
    req = Request([1], temperature=1.0)
    tokens = run(backend, np.repeat(logits, n, 0), [req] * n, list(range(n)), [0] * n)[0]
    freq = np.bincount(tokens, minlength=4) / n
    assert np.abs(freq - [0.5, 0.25, 0.15, 0.1]).max() < 0.03


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_seed_and_step_fix_the_draw(backend):
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(3, 50)).astype(np.float32)
    req = Request([1], temperature=1.0)
    a = run(backend, logits, [req] * 3, [7, 8, 9], [0, 0, 5])[0]
    # The same row in another batch, at another index: the same token.
    b = run(backend, np.concatenate([logits[2:], logits[:1]]), [req] * 2, [9, 7], [5, 0])[0]
    assert a[2] == b[0] and a[0] == b[1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_penalties_match_their_definition(backend):
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(2, 10)).astype(np.float32)
    histories = [([1, 2], [3, 3, 4]), ([5], [])]
    reqs = [Request([1, 2], repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.25),
            Request([5], repetition_penalty=2.0)]
    tokens = run(backend, logits, reqs, [0, 0], [3, 0], histories)[0]
    want = []
    for row, (prompt, output), r in zip(logits, histories, reqs):
        z = row.copy()
        for t in set(prompt) | set(output):
            z[t] = z[t] / r.repetition_penalty if z[t] > 0 else z[t] * r.repetition_penalty
        counts = np.bincount(output, minlength=10) if output else np.zeros(10)
        z -= r.frequency_penalty * counts + r.presence_penalty * (counts > 0)
        want.append(int(z.argmax()))
    assert tokens.tolist() == want


@pytest.mark.parametrize("backend", BACKENDS)
def test_logit_bias_bans_forces_and_shifts(backend):
    """OpenAI's logit_bias adds to the logits before the draw: -100 keeps a token out of every draw,
    +100 makes one the only draw, and a small bias moves the greedy choice as plain addition does."""
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(3, 12)).astype(np.float32)
    best = logits.argmax(axis=-1)
    second = np.argsort(-logits, axis=-1)[:, 1]
    nudge = float(logits[2, best[2]] - logits[2, second[2]]) + 0.01
    reqs = [Request([1], logit_bias={int(best[0]): -100.0}),
            Request([1], logit_bias={7: 100.0}, temperature=1.0),
            Request([1], logit_bias={int(second[2]): nudge})]
    tokens = run(backend, logits, reqs, [0, 1, 2], [0, 0, 0])[0]
    assert tokens.tolist() == [int(second[0]), 7, int(second[2])]
    banned = [Request([1], temperature=1.5, logit_bias={int(best[0]): -100.0}) for _ in range(64)]
    draws = run(backend, np.repeat(logits[:1], 64, axis=0), banned, list(range(64)), [0] * 64)[0]
    assert best[0] not in draws.tolist() and len(set(draws.tolist())) > 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_logprobs_are_the_models_log_softmax(backend):
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(2, 20)).astype(np.float32)
    reqs = [Request([1], logprobs=4), Request([1], logprobs=2)]
    tokens, chosen, (values, ids) = run(backend, logits, reqs, [0, 0], [0, 0])
    ref = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    assert tokens.tolist() == logits.argmax(-1).tolist()
    np.testing.assert_allclose(chosen, ref[[0, 1], tokens], atol=1e-5)
    np.testing.assert_allclose(values[:, :4], np.sort(ref, -1)[:, ::-1][:, :4], atol=1e-5)
    assert ids[0, 0] == tokens[0]


@given(st.integers(1, 200), st.integers(0, 2 ** 32 - 1))
@settings(max_examples=25, deadline=None, derandomize=True, database=None)
def test_packed_token_masks_unpack_on_either_backend_as_numpy_packs_them(n, seed):
    from linnet.serve.runners import mask_words
    from linnet.serve.sampling_jax import _unpack_bits

    mask = np.random.default_rng(seed).random((3, n)) < 0.5
    padded = np.zeros((3, mask_words(n) * 32), bool)
    padded[:, :n] = mask
    words = np.packbits(padded, axis=1, bitorder="little").view(np.int32)  # little-endian words, as llguidance's
    assert np.array_equal(sampling_torch.unpack_bits(torch.from_numpy(words), n).numpy(), mask)
    assert np.array_equal(np.asarray(_unpack_bits(words, n)), mask)


def test_only_the_adjustments_some_row_asks_for_are_made():
    from linnet.serve.runners import logit_adjustments
    from linnet.serve.structured import Structure

    plain, penalized = Request([1], temperature=0.5), Request([1], repetition_penalty=1.2)
    biased, structured = Request([1], logit_bias={3: 5.0}), Request([1], structure=Structure("regex", "a"))
    bits = np.full(1, 0b101, np.int32)
    for requests, made in [([plain, penalized], (True, True, False, False)), ([biased, plain], (False, False, True, False)),
                           ([plain, structured], (False, False, False, True)),
                           ([penalized, structured], (True, True, False, True))]:
        batch = SamplingBatch.of(requests, [0, 0], [0, 0])
        histories = [(r.prompt, [], r.logit_bias, bits if r.structure else None) for r in requests]
        arrays = logit_adjustments(batch, histories, 32, 2)
        assert tuple(a is not None for a in arrays) == made
        if made[3]:  # rows without a structure allow every token
            assert arrays[3][[r.structure is None for r in requests]].tolist() == [[-1]]
