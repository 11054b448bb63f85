"""Both on-device samplers against a numpy statement of the same rules."""

import jax
import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from linnet.serve.request import Request
from linnet.serve.sampling import SamplingBatch
from linnet.serve import sampling_jax, sampling_torch

# as the sampler runs it, inside a compiled step (eager, each call traces and compiles its conds again)
jax_kept_weights = jax.jit(sampling_jax.kept_weights)


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
                                    None if adjustments is None else tuple(torch.from_numpy(a) for a in adjustments))
        return [None if x is None else (np.asarray(x) if not isinstance(x, tuple) else tuple(np.asarray(y) for y in x))
                for x in out]
    import jax.numpy as jnp

    out = sampling_jax.sample(jnp.asarray(logits), batch,
                              None if adjustments is None else tuple(jnp.asarray(a) for a in adjustments))
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


def vllm_adjusted(logits, prompt, output, r: Request) -> np.ndarray:
    """vLLM's (and llama.cpp's) order, in float64: the bias; then the repetition penalty on the
    prompt's and output's tokens; then the frequency and presence penalties on the output's."""
    z = logits.astype(np.float64)
    for t, b in (r.logit_bias or {}).items():
        z[t] += b
    seen = sorted(set(prompt) | set(output))
    z[seen] = np.where(z[seen] > 0, z[seen] / r.repetition_penalty, z[seen] * r.repetition_penalty)
    counts = np.bincount(output, minlength=len(z))
    return z - r.frequency_penalty * counts - r.presence_penalty * (counts > 0)


def bias_after(logits, prompt, output, r: Request) -> np.ndarray:
    """The order Linnet had: the repetition penalty on the raw logits, the bias after it."""
    unbiased = Request(r.prompt, repetition_penalty=r.repetition_penalty, presence_penalty=r.presence_penalty,
                       frequency_penalty=r.frequency_penalty)
    z = vllm_adjusted(logits, prompt, output, unbiased)
    for t, b in (r.logit_bias or {}).items():
        z[t] += b
    return z


def race(z, temperature, seed, step):
    """The exponential race over softmax(z / temperature), with the samplers' noise; argmax at 0."""
    if temperature == 0:
        return int(z.argmax())
    w = np.exp(z / temperature - (z / temperature).max())
    return int((w / -np.log(noise_reference(seed, step, len(z)))).argmax())


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_bias_comes_before_the_penalties(backend):
    """A row with a logit bias and a repetition penalty (and presence and frequency) draws as vLLM's
    order says, rep(logits + bias) - penalties, not rep(logits) + bias: its bias apart, before the
    repetition penalty (`sampling.SPLIT`). Rows with one or the other share the one shift (SHIFT),
    where the orders agree."""
    from linnet.serve.sampling import SHIFT, SPLIT

    rng = np.random.default_rng(9)
    vocab = 10
    crafted = np.full(vocab, -3.0, np.float32)
    crafted[[3, 5, 7]] = [-1.0, 0.3, 0.2]  # 3 biased to +1, halved to 0.5, less 0.15 of penalties: over 5's 0.3
    both = dict(repetition_penalty=2.0, presence_penalty=0.1, frequency_penalty=0.05)
    rows = [(crafted, Request([3], logit_bias={3: 2.0}, **both), [3, 7])]
    shift_rows = [(rng.normal(size=vocab).astype(np.float32), Request([1, 2], logit_bias={2: 1.5, 4: -0.5}), [2, 4]),
                  (rng.normal(size=vocab).astype(np.float32), Request([1, 2], **both), [2, 2, 6])]
    rows += shift_rows
    for i in range(32):  # sampled, the bias raising a seen token from far below
        logits = rng.normal(size=vocab).astype(np.float32)
        logits[4] = -5.0
        rows.append((logits, Request([4, 8], temperature=1.0, logit_bias={4: 9.0}, repetition_penalty=2.0,
                                     presence_penalty=0.2, frequency_penalty=0.1), [4, 8, 8] if i % 2 else []))

    def check(rows):
        logits = np.stack([z for z, _, _ in rows])
        reqs = [r for _, r, _ in rows]
        seeds, steps = list(range(len(rows))), [len(o) for _, _, o in rows]
        tokens = run(backend, logits, reqs, seeds, steps, [(r.prompt, o) for _, r, o in rows])[0]
        want = [race(vllm_adjusted(z, r.prompt, o, r), r.temperature, seed, step)
                for (z, r, o), seed, step in zip(rows, seeds, steps)]
        before = [race(bias_after(z, r.prompt, o, r), r.temperature, seed, step)
                  for (z, r, o), seed, step in zip(rows, seeds, steps)]
        assert tokens.tolist() == want
        return want, before

    assert SamplingBatch.of([r for _, r, _ in rows], [0] * len(rows), [0] * len(rows)).adjustment == SPLIT
    want, before = check(rows)
    assert want[0] == 3 and before[0] == 5  # the orders differ where the test means them to
    assert sum(a != b for a, b in zip(want[3:], before[3:])) >= 5  # 6 of these 32 draws
    assert SamplingBatch.of([r for _, r, _ in shift_rows], [0, 0], [0, 0]).adjustment == SHIFT
    check(shift_rows)


@pytest.mark.parametrize("backend", BACKENDS)
def test_logprobs_are_the_models_log_softmax(backend):
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(2, 20)).astype(np.float32)
    reqs = [Request([1], logprobs=4), Request([1], logprobs=2)]
    tokens, chosen, (values, ids), ranks = run(backend, logits, reqs, [0, 0], [0, 0])
    ref = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    assert tokens.tolist() == logits.argmax(-1).tolist()
    np.testing.assert_allclose(chosen, ref[[0, 1], tokens], atol=1e-5)
    np.testing.assert_allclose(values[:, :4], np.sort(ref, -1)[:, ::-1][:, :4], atol=1e-5)
    assert ids[0, 0] == tokens[0]


def numpy_rank(logits: np.ndarray, token: int) -> int:
    """vLLM's rank of a drawn token: 1 + how many tokens have a strictly larger logprob (plain numpy)."""
    logprobs = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    return int((logprobs > logprobs[token]).sum()) + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_drawn_token_has_its_rank_under_the_models_logits(backend):
    """The draw ranks every drawn token, greedy or sampled, among the alternatives or far from them:
    numpy's rank over the model's logits as they came (a bias that moves the draw moves no rank)."""
    rng = np.random.default_rng(11)
    vocab, n = 300, 24
    logits = rng.normal(size=(n, vocab)).astype(np.float32) * 3
    biased = int(np.argsort(logits[3])[vocab // 2])  # a middling token the bias makes row 3's draw
    reqs = ([Request([1], logprobs=1)] * 4 + [Request([1], temperature=1.5, logprobs=1)] * (n - 5)
            + [Request([1], temperature=1.0, logprobs=0, logit_bias={biased: 100.0})])
    reqs[3] = Request([1], logprobs=2, logit_bias={biased: 100.0})
    tokens, chosen, (values, ids), ranks = run(backend, logits, reqs, list(range(n)), [0] * n)
    want = [numpy_rank(row, t) for row, t in zip(logits, tokens)]
    assert ranks.tolist() == want
    assert ranks[:3].tolist() == [1, 1, 1] and tokens[3] == biased and ranks[3] == want[3] > 100
    assert sum(r > 1 for r in want[4:-1]) >= 10  # most sampled draws are not the likeliest
    for row, t in zip(logits, tokens):  # no near tie makes the exact comparison a rounding's
        assert np.abs(np.delete(row, t) - row[t]).min() > 1e-4
    greedy = Request([1], logprobs=3)
    t2, _, _, r2 = run(backend, logits[:2], [greedy] * 2, [0, 0], [0, 0])
    assert r2.tolist() == [1, 1] and t2.tolist() == logits[:2].argmax(-1).tolist()
    assert run(backend, logits[:2], [Request([1])] * 2, [0, 0], [0, 0])[3] is None  # no logprobs, no ranks


@pytest.mark.parametrize("backend", BACKENDS)
@given(st.lists(st.integers(-3, 3), min_size=12, max_size=1 + sampling_torch.TIE_ROOM), st.integers(1, 8))
@settings(max_examples=30, deadline=None, derandomize=True, database=None)
def test_tied_alternatives_come_lower_id_first(backend, levels, k):
    """Logits with many exact ties (up to torch's TIE_ROOM past the k-th): the top k alternatives
    are numpy's stable order (value down, then id up) on both backends, so the first is greedy's
    token (argmax takes the lowest id)."""
    logits = np.array([levels, levels[::-1]], np.float32)
    k = min(k, logits.shape[1])
    tokens, _, (values, ids), _ = run(backend, logits, [Request([1], logprobs=k)] * 2, [0, 0], [0, 0])
    order = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    assert tokens.tolist() == order[:, 0].tolist()
    assert ids[:, :k].tolist() == order.tolist(), (ids, order)
    ref = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(values[:, :k], np.take_along_axis(ref, order, -1), atol=1e-6)


# row lengths around the 128-value blocks (each new shape compiles JAX's ops anew: few shapes, many rows)
@given(rows=st.sampled_from([1, 3, 5]), n=st.sampled_from([1, 2, 127, 128, 129, 256, 257, 700]),
       levels=st.integers(1, 4), specials=st.integers(0, 3), seed=st.integers(0, 2 ** 32 - 1))
@settings(max_examples=40, deadline=None, derandomize=True, database=None)
def test_the_jax_argmax_is_the_first_largest(rows, n, levels, specials, seed):
    # found a block at a time (rows of any length: the last block short), ties to the lowest index as
    # numpy's; -inf and inf are values like others, and a NaN is the largest, as torch's argmax has it
    from linnet.serve.sampling_jax import _argmax

    rng = np.random.default_rng(seed)
    x = rng.integers(0, levels, size=(rows, n)).astype(np.float32)  # few levels: many ties
    for _ in range(specials):
        x[rng.integers(rows), rng.integers(n)] = rng.choice([np.inf, -np.inf, np.nan])
    if specials == 3:
        x[0] = np.nan
    want = torch.from_numpy(x).argmax(dim=-1).numpy()  # (numpy's argmax also takes the first NaN)
    assert np.asarray(jax.jit(_argmax)(x)).tolist() == want.tolist() == np.argmax(x, axis=-1).tolist()


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


@given(st.integers(1, 200), st.integers(0, 2 ** 32 - 1))
@settings(max_examples=25, deadline=None, derandomize=True, database=None)
def test_a_mask_bans_to_minus_inf_bit_for_bit_as_numpy_does(n, seed):
    """The torch draw's mask (int32 arithmetic on the logits' bits) against numpy's where: the
    same bits everywhere, NaNs and infinities, allowed or banned, too."""
    from linnet.serve.runners import mask_words

    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(3, n)).astype(np.float32)
    specials = rng.random((3, n)) < 0.2
    logits[specials] = rng.choice(np.array([np.nan, np.inf, -np.inf, -0.0], np.float32), size=specials.sum())
    allowed = rng.random((3, n)) < 0.5
    padded = np.zeros((3, mask_words(n) * 32), bool)
    padded[:, :n] = allowed
    words = np.packbits(padded, axis=1, bitorder="little").view(np.int32)
    got = sampling_torch.banned_to_minus_inf(torch.from_numpy(logits), torch.from_numpy(words)).numpy()
    want = np.where(allowed, logits, np.float32(-np.inf))
    assert got.dtype == np.float32 and np.array_equal(got.view(np.int32), want.view(np.int32))


@given(st.integers(1, 200), st.integers(0, 2 ** 32 - 1))
@settings(max_examples=25, deadline=None, derandomize=True, database=None)
def test_the_repetition_penalty_moves_seen_tokens_bit_for_bit_as_numpy_does(n, seed):
    """The torch draw's repetition penalty (a choice on the logits' bits) against vLLM's definition
    in numpy's f32: z / r where z > 0, z * r otherwise, on the seen tokens alone; the same bits
    everywhere, NaNs of either sign, infinities, zeros of either sign and extreme penalties too."""
    from linnet.serve.runners import mask_words

    rng = np.random.default_rng(seed)
    logits = (rng.normal(size=(4, n)) * 10).astype(np.float32)
    specials = rng.random((4, n)) < 0.2
    logits[specials] = rng.choice(np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38, -1e-45], np.float32),
                                  size=specials.sum())
    rep = np.array([[1.3], [0.5], [1e30], [1e-30]], np.float32)
    seen = rng.random((4, n)) < 0.5
    padded = np.zeros((4, mask_words(n) * 32), bool)
    padded[:, :n] = seen
    words = np.packbits(padded, axis=1, bitorder="little").view(np.int32)
    got = sampling_torch.repetition_penalized(torch.from_numpy(logits), torch.from_numpy(rep),
                                              torch.from_numpy(words)).numpy()
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        want = np.where(seen, np.where(logits > 0, logits / rep, logits * rep), logits)
    assert got.dtype == np.float32 and np.array_equal(got.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("adjust", ["penalties", "bias and penalties"])
def test_penalized_draws_over_a_large_vocabulary_are_the_numpy_definitions(adjust):
    """torch's SHIFT and SPLIT draws over 49152 tokens, greedy and seeded, against numpy's f32
    vLLM order (the bias, the repetition penalty on the prompt's and output's tokens, then
    frequency and presence on the output's) and its exponential race."""
    rng = np.random.default_rng(5)
    vocab, k = 49152, 6
    logits = (rng.normal(size=(k, vocab)) * 3).astype(np.float32)
    histories = [(rng.integers(0, vocab, 40).tolist(), rng.integers(0, vocab, 30).tolist()) for _ in range(k)]
    bias = {int(t): float(b) for t, b in zip(rng.integers(0, vocab, 50), rng.normal(size=50) * 4)}
    reqs = [Request([1], repetition_penalty=[1.0, 1.3, 0.7, 2.0, 1.1, 1.5][i], presence_penalty=0.5 * (i % 2),
                    frequency_penalty=0.25 * (i % 3), temperature=[0.0, 0.8][i % 2], seed=i,
                    logit_bias=bias if adjust != "penalties" and i != 1 else None) for i in range(k)]
    tokens = run("torch", logits, reqs, list(range(k)), [7] * k,
                 [(p, o, r.logit_bias) for (p, o), r in zip(histories, reqs)])[0]
    want = []
    for row, (prompt, output), r in zip(logits, histories, reqs):
        z = row.copy()
        for t, b in (r.logit_bias or {}).items():
            z[t] += np.float32(b)
        seen = sorted(set(prompt) | set(output))
        rep = np.float32(r.repetition_penalty)
        z[seen] = np.where(z[seen] > 0, z[seen] / rep, z[seen] * rep)
        ids, counts = np.unique(output, return_counts=True)
        z[ids] -= np.float32(r.frequency_penalty) * counts + np.float32(r.presence_penalty)
        want.append(race(z.astype(np.float64), r.temperature, r.seed, 7))
    assert tokens.tolist() == want


def test_the_adjustments_take_the_form_the_batch_asks_for():
    from linnet.serve.runners import logit_adjustments, packed_mask
    from linnet.serve.sampling import MASK, SHIFT, SPLIT
    from linnet.serve.structured import Structure

    plain, penalized = Request([1], temperature=0.5), Request([1, 4], presence_penalty=0.5, frequency_penalty=0.25)
    biased, structured = Request([1], logit_bias={3: 5.0, 6: -1.0}), Request([1], structure=Structure("regex", "a"))
    late = Request([1], min_tokens=2)
    bits = packed_mask([0, 2, 3], 40)
    assert SamplingBatch.of([plain, plain], [0, 0], [0, 0]).adjustment is None
    assert SamplingBatch.of([late, plain], [0, 0], [0, 0]).adjustment == SHIFT  # its enders banned: a bias
    # masks alone: rows without a structure allow every token
    batch = SamplingBatch.of([plain, structured], [0, 0], [0, 0])
    (allowed,) = logit_adjustments(batch, [([1], [], None, None), ([1], [], None, bits)], 40, 3, rows=[2, 0])
    assert batch.adjustment == MASK and allowed.shape == (3, 2)
    assert allowed[2].tolist() == [-1, -1] and allowed[0].tolist() == bits.tolist()
    # penalties, a bias and a mask in one shift, each row's by hand
    requests = [penalized, biased, structured]
    batch = SamplingBatch.of(requests, [0] * 3, [0] * 3)
    histories = [([1, 4], [7, 7, 9], None, None), ([1], [2], {3: 5.0, 6: -1.0}, None), ([1], [5], None, bits)]
    seen_bits, shift = logit_adjustments(batch, histories, 40, 3)
    assert batch.adjustment == SHIFT and seen_bits.shape == (3, 2) and shift.shape == (3, 40)
    seen = np.unpackbits(seen_bits.view(np.uint8), axis=1, bitorder="little")[:, :40].astype(bool)
    assert [np.flatnonzero(row).tolist() for row in seen] == [[1, 4, 7, 9], [1, 2], [1, 5]]
    want = np.zeros((3, 40), np.float32)
    want[0, 7], want[0, 9] = -(0.25 * 2 + 0.5), -(0.25 + 0.5)
    want[1, 3], want[1, 6] = 5.0, -1.0
    want[2, [t for t in range(40) if t not in (0, 2, 3)]] = -np.inf
    assert np.array_equal(shift, want)
    # a row with a bias and a repetition penalty: the bias and bans apart (before rep), the shift the penalties
    requests = [Request([1, 4], logit_bias={3: 5.0}, repetition_penalty=1.5, presence_penalty=0.5), structured]
    batch = SamplingBatch.of(requests, [0] * 2, [0] * 2)
    histories = [([1, 4], [3, 7, 7], {3: 5.0}, None), ([1], [], None, bits)]
    seen_bits, bias, shift = logit_adjustments(batch, histories, 40, 3, rows=[0, 2])
    assert batch.adjustment == SPLIT and seen_bits.shape == (3, 2) and bias.shape == shift.shape == (3, 40)
    want_bias, want_shift = np.zeros((3, 40), np.float32), np.zeros((3, 40), np.float32)
    want_bias[0, 3] = 5.0
    want_bias[2, [t for t in range(40) if t not in (0, 2, 3)]] = -np.inf
    want_shift[0, 3], want_shift[0, 7] = -0.5, -0.5
    assert np.array_equal(bias, want_bias) and np.array_equal(shift, want_shift)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([3, 257, 3000]), st.lists(  # few shapes: few JAX compiles
    st.tuples(st.sampled_from([0.3, 0.7, 1.0, 1.8]), st.sampled_from([0, 1, 2, 5, 40]),
              st.sampled_from([1.0, 0.95, 0.6, 0.2, 0.01, 0.0]), st.sampled_from([0.0, 0.05, 0.3])), min_size=4, max_size=4))
def test_the_kept_tokens_are_those_a_sorted_vocabulary_gives(seed, vocab, rows):
    """top-k, top-p and min-p as thresholds (no sort on JAX, no full sort on torch without top-p)
    keep what the rules say over the vocabulary sorted, row by row, whatever the others ask."""
    logits = np.random.default_rng(seed).normal(size=(len(rows), vocab)).astype(np.float32) * 3
    reqs = [Request([1], temperature=t, top_k=k, top_p=p, min_p=m) for t, k, p, m in rows]
    batch = SamplingBatch.of(reqs, [0] * len(reqs), [0] * len(reqs))
    wants = [allowed(row, r.temperature, r.top_k, r.top_p, r.min_p) for row, r in zip(logits, reqs)]
    for (keep, p), r in zip(wants, reqs):  # a tie with top_p would round either way: not what is tested here
        before = np.cumsum(np.sort(p)[::-1]) - np.sort(p)[::-1]
        assume(r.top_p == 0 or np.abs(before - r.top_p).min() > 1e-4)  # 0: the likeliest alone, no rounding
    scaled = logits / batch.temperature[:, None]
    got_torch = sampling_torch.kept_weights(torch.from_numpy(scaled), batch).numpy() > 0
    got_jax = np.asarray(jax_kept_weights(scaled, batch.top_k, batch.top_p, batch.min_p)) > 0
    for i, (keep, _) in enumerate(wants):
        assert np.array_equal(got_torch[i], keep), i
        assert np.array_equal(got_jax[i], keep), i


def test_both_backends_draw_the_same_tokens_from_the_same_seeds():
    """The noise is one hash of (seed, step, token) on both backends: equal logits and settings
    draw equal tokens, whichever backend draws them."""
    rng = np.random.default_rng(11)
    logits = rng.normal(size=(48, 500)).astype(np.float32) * 2
    reqs = [Request([1], temperature=[0.6, 1.0, 1.5][i % 3], top_k=[0, 20][i % 2], top_p=[1.0, 0.9, 0.8][i % 3],
                    min_p=[0.0, 0.02][i % 2]) for i in range(48)]
    seeds, steps = [i * 7919 + 3 for i in range(48)], [i % 5 for i in range(48)]
    u_torch = sampling_torch.uniform(torch.tensor(seeds), torch.tensor(steps), 500).numpy()
    u_jax = np.asarray(sampling_jax.uniform(np.array(seeds, np.uint32), np.array(steps, np.int32), 500))
    assert np.array_equal(u_torch, u_jax)
    assert 0 < u_torch.min() and u_torch.max() < 1 and abs(u_torch.mean() - 0.5) < 0.01
    a = run("torch", logits, reqs, seeds, steps)[0]
    b = run("jax", logits, reqs, seeds, steps)[0]
    assert a.tolist() == b.tolist()
    assert len(set(a.tolist())) > 30  # draws, not one greedy token


def noise_reference(seed: int, step: int, vocab: int) -> np.ndarray:
    """`sampling.NOISE` written out in Python integers, then the unit interval in float64."""
    from linnet.serve.sampling import NOISE, NOISE_BITS

    def mix(x):
        x ^= x >> 16
        x = (x * NOISE["M1"]) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * NOISE["M2"]) & 0xFFFFFFFF
        return x ^ (x >> 16)

    row = mix((mix(seed & 0xFFFFFFFF) + step * NOISE["STEP"]) & 0xFFFFFFFF)
    h = np.array([mix((row + t * NOISE["TOKEN"]) & 0xFFFFFFFF) for t in range(vocab)], np.uint64)
    return ((h >> (32 - NOISE_BITS)).astype(np.float64) + 0.5) / 2.0 ** NOISE_BITS


@pytest.mark.parametrize("seed, step", [(3, 7), (0, 0), (2**31 + 5, 40)])
def test_the_noise_is_the_hash_and_never_one(seed, step):
    """Both backends' noise against the hash in Python integers, on a SmolLM2-sized vocabulary:
    exact, and inside (0, 1). Seed 3's step 7 held a token whose f32 noise rounded to 1 when the
    noise took 24 bits: -log(u) was 0, and that token won the draw whatever its probability."""
    want = noise_reference(seed, step, 49152)
    u_torch = sampling_torch.uniform(torch.tensor([seed]), torch.tensor([step]), 49152).numpy()[0]
    u_jax = np.asarray(sampling_jax.uniform(np.array([seed], np.uint64).astype(np.uint32), np.array([step], np.int32),
                                            49152))[0]
    np.testing.assert_array_equal(u_torch.astype(np.float64), want)
    np.testing.assert_array_equal(u_jax.astype(np.float64), want)
    assert 0 < u_torch.min() and u_torch.max() < 1


def test_every_hash_maps_inside_the_unit_interval():
    """The extremes of the 32-bit hash and every value of its top bits: f32 noise in (0, 1), its
    -log positive, on both backends."""
    tops = np.arange(2**16, dtype=np.uint64) << 16
    h = np.concatenate([tops, tops | 0xFFFF, np.array([0, 1, 2**32 - 1, 2**32 - 2], np.uint64)]).astype(np.uint32)
    u_torch = sampling_torch.unit(torch.from_numpy(h.view(np.int32))).numpy()
    u_jax = np.asarray(sampling_jax.unit(h))
    np.testing.assert_array_equal(u_torch, u_jax)
    assert u_torch.dtype == np.float32 and 0 < u_torch.min() and u_torch.max() < 1
    assert np.all(-np.log(u_torch) > 0)


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_top_k_one_is_greedy_at_any_temperature(backend):
    """Only the kept token can win the draw: top_k=1 at temperature 1 gives the argmax, for the
    (seed, step) pairs of a vocabulary-sized batch, seed 3's step 7 among them."""
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(32, 49152)).astype(np.float32) * 3
    reqs = [Request([1], temperature=1.0, top_k=1) for _ in range(32)]
    seeds, steps = [3] * 16 + list(range(16)), list(range(16)) + [7] * 16
    tokens = run(backend, logits, reqs, seeds, steps)[0]
    assert np.asarray(tokens).tolist() == logits.argmax(axis=-1).tolist()


def test_a_top_p_of_1_keeps_every_token_beside_a_row_that_asks_for_a_nucleus():
    """transformers' TopPLogitsWarper at top_p 1 masks nothing, and neither may either backend where
    another row of the batch asks for a nucleus. Over a SmolLM2-sized vocabulary the f32 sum of a
    row's probabilities passes 1 by a rounding, and JAX's search cut its least likely tokens (26
    of this row's 49152 at scale 2, 1880 at scale 4): tokens the torch draw could give, JAX never."""
    from transformers import TopPLogitsWarper

    scales = np.array([[0.5], [1], [2], [4]], np.float32)
    logits = np.random.default_rng(0).normal(size=(4, 49152)).astype(np.float32) * scales
    reqs = [Request([1], temperature=1.0, top_p=p) for p in (1.0, 0.5, 1.0, 1.0)]
    batch = SamplingBatch.of(reqs, [0] * 4, [0] * 4)
    want = np.stack([np.isfinite(TopPLogitsWarper(r.top_p)(None, torch.from_numpy(row[None])).numpy()[0])
                     for row, r in zip(logits, reqs)])
    got_torch = sampling_torch.kept_weights(torch.from_numpy(logits), batch).numpy() > 0
    got_jax = np.asarray(jax_kept_weights(logits, batch.top_k, batch.top_p, batch.min_p)) > 0
    assert want[[0, 2, 3]].all() and want[1].sum() < 49152 / 4
    assert np.array_equal(got_torch, want)
    assert np.array_equal(got_jax, want)


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_a_temperature_below_1e_5_is_greedy_as_vllms(backend):
    # tied logits (bf16 makes many) go to the lowest id, whatever the seed; at 1e-5 itself the draw
    # is the tempered one, and the seeds then split between the tied tokens
    logits = np.tile(np.array([[1.0, 5.0, 5.0, 0.0, 5.0]], np.float32), (16, 1))
    for temperature, want in ((9e-6, {1}), (1e-5, {1, 2, 4})):
        reqs = [Request([1], temperature=temperature) for _ in range(16)]
        tokens = run(backend, logits, reqs, list(range(16)), [0] * 16)[0]
        assert set(np.asarray(tokens).tolist()) == want
    assert SamplingBatch.of([Request([1], temperature=9e-6)], [0], [0]).greedy_only
