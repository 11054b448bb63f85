"""The engine's sampling against transformers over a twin (tiny-llama's config, seeded random
weights, the checkpoint save_pretrained writes, loaded through nest.load in f32, as
test_engine_hf.py builds them): greedy runs with penalties, a logit bias, min_tokens,
stop_token_ids and ignore_eos, each request beside others of other settings, as transformers'
logits recomputed over the whole sequence at each step give them after the reference's
adjustments (test_sampling_references.reference: transformers' processors, vLLM's formulas);
sampled first tokens against the reference's distribution by a chi-square test; and seeds."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet import nest
from linnet.serve import Engine, Request
from tests.serve.conftest import running
from tests.serve.test_sampling_references import reference

transformers = pytest.importorskip("transformers")
scipy_stats = pytest.importorskip("scipy.stats")
import torch  # noqa: E402

from tests.compiler.conftest import CARDS, hf_reference, saved_state  # noqa: E402

GENERICS = {"Batch": 8, "MaxSeq": 48, "T": "f32"}
EOS = 3  # the twin's tokenizer's end token


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    """(transformers' model, its checkpoint directory)."""
    from linnet.compiler import check_file
    from linnet.ir.specialize import specialize

    spec = specialize(check_file(CARDS / "tiny-llama.linnet"), GENERICS, "exact")
    hf = hf_reference(spec, seed=77, max_seq=GENERICS["MaxSeq"])
    directory = tmp_path_factory.mktemp("tiny-llama")
    saved_state(hf, directory)
    return hf, directory


@pytest.fixture(scope="module", params=["torch", "jax"])
def model(request, twin):
    from linnet.nest.tokenizer import Tokenizer
    from tests.serve.test_engine import word_tokenizer

    model = nest.load("tiny-llama", backend=request.param, weights=twin[1], tokenizer=False, generics=GENERICS)
    words = word_tokenizer(model.vocab)
    model.tokenizer = Tokenizer(words.backend, eos_token_ids=[EOS])
    return model


def hf_logits(hf, tokens: list) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0, -1].numpy()


def hf_greedy(hf, r: Request, eos=(EOS,)) -> tuple[list, str]:
    """r's tokens as transformers' logits and the reference's adjustments give them, greedy, and
    its finish reason: an end token (eos unless ignore_eos, or a stop token id) ends it once
    min_tokens are out; before, eos and the stop token ids are banned, eos under ignore_eos too (vLLM's
    MinTokensLogitsProcessor bans all its stop token ids, the model's eos among them whatever ignore_eos)."""
    enders = set(r.stop_token_ids) | (set() if r.ignore_eos else set(eos))
    out = []
    while len(out) < r.max_new_tokens:
        bans = set(r.stop_token_ids) | set(eos) if len(out) < r.min_tokens else ()
        token = int(reference(hf_logits(hf, list(r.prompt) + out), list(r.prompt), out, r, sorted(bans)).argmax())
        out.append(token)
        if token in enders and len(out) > r.min_tokens:
            return out, "stop"
    return out, "length"


def greedy_request(rng, i: int, fields: dict) -> Request:
    prompt = [int(t) for t in rng.integers(4, 128, int(rng.integers(2, 12)))]
    return Request(prompt=prompt, max_new_tokens=8, id=f"r{i}", **fields)


GREEDY_MIXES = [
    dict(),
    dict(repetition_penalty=1.8),
    dict(repetition_penalty=0.6),
    dict(presence_penalty=1.5, frequency_penalty=0.7),
    dict(frequency_penalty=-1.0),
    dict(repetition_penalty=1.4, logit_bias={5: 2.5, 9: -100.0}),  # the bias before the penalty
    dict(logit_bias={17: 4.0}),
    # end tokens made likely by a bias: a stop token id or the end token ends the run, but not
    # before min_tokens nor, for the end token, with ignore_eos
    dict(min_tokens=5, stop_token_ids=[11, 12], logit_bias={11: 2.0, 12: 2.0}),
    dict(stop_token_ids=[11, 12], logit_bias={11: 2.0, 12: 2.0}),
    dict(logit_bias={EOS: 2.0}),
    dict(ignore_eos=True, logit_bias={EOS: 2.0}),
    dict(logit_bias={EOS: 6.0}, min_tokens=3),
    dict(ignore_eos=True, logit_bias={EOS: 6.0}, min_tokens=3),  # eos kept out until then, and drawn after
    dict(temperature=0.0, top_k=2, top_p=0.1, min_p=0.9, repetition_penalty=1.2),  # greedy: the limits draw nothing
]


def test_penalized_greedy_runs_equal_transformers_each_beside_the_others(model, twin):
    rng = np.random.default_rng(3)
    requests = [greedy_request(rng, i, fields) for i, fields in enumerate(GREEDY_MIXES)]
    done, _ = Engine(model).run(requests)
    for r, c in zip(requests, done):
        assert (c.tokens, c.finish_reason) == hf_greedy(twin[0], r), r


@settings(max_examples=4, deadline=None, derandomize=True, database=None)
@given(mixes=st.lists(st.sampled_from(range(len(GREEDY_MIXES))), min_size=2, max_size=10), seed=st.integers(0, 999))
def test_random_mixes_of_settings_give_each_row_its_run_alone(model, twin, mixes, seed):
    rng = np.random.default_rng(seed)
    requests = [greedy_request(rng, i, GREEDY_MIXES[m]) for i, m in enumerate(mixes)]
    done, _ = Engine(model).run(requests)
    for r, c in zip(requests, done):
        assert (c.tokens, c.finish_reason) == hf_greedy(twin[0], r), r


def chi_square_p(tokens: list, probs: np.ndarray) -> float:
    """The chi-square test's p-value for draws `tokens` from `probs`; tokens expected fewer than 5
    times pooled into one bin (the test's approximation needs 5 a bin). A draw outside the support
    is p = 0."""
    probs = probs / probs.sum()  # (f32's softmax sums to 1 within a rounding; the test asks for 1e-8)
    n, counts = len(tokens), np.bincount(tokens, minlength=len(probs))
    if counts[probs == 0].any():
        return 0.0
    big = probs * n >= 5
    observed = np.append(counts[big], counts[~big & (probs > 0)].sum())
    expected = np.append(probs[big] * n, probs[~big].sum() * n)
    if expected[-1] < 5:  # the pooled tail is itself small: into the least likely bin of the rest
        observed, expected = observed[:-1], expected[:-1]
        observed[-1] += counts[~big & (probs > 0)].sum()
        expected[-1] += probs[~big].sum() * n
    if len(expected) < 2:
        return 1.0
    return float(scipy_stats.chisquare(observed, expected).pvalue)


DRAWS = 800
SAMPLED = [dict(temperature=1.0), dict(temperature=0.6), dict(temperature=1.3, top_k=4),
           dict(temperature=0.9, top_p=0.7), dict(temperature=1.0, min_p=0.15),
           dict(temperature=1.1, top_k=10, top_p=0.9, min_p=0.05),
           dict(temperature=1.0, repetition_penalty=0.5, logit_bias={40: 1.0, 41: -100.0})]


def test_first_token_draws_follow_the_reference_distribution(model, twin):
    """DRAWS requests a setting, seeds 0..DRAWS-1, over one prompt: the first tokens' counts against
    the reference's distribution for transformers' logits. The seeds are fixed, so the test is
    deterministic; at p > 1e-3 a correct sampler fails one set of seeds in a thousand, and a
    wrong distribution (here: each setting's draws against the plain softmax) fails at p < 1e-6."""
    prompt = [40, 41, 7, 90, 12]
    logits = hf_logits(twin[0], prompt)
    requests = [Request(prompt, max_new_tokens=1, seed=s, id=f"{i}-{s}", **fields)
                for i, fields in enumerate(SAMPLED) for s in range(DRAWS)]
    done, _ = Engine(model).run(requests)
    plain = reference(logits, prompt, [], Request(prompt, temperature=1.0))
    for i, fields in enumerate(SAMPLED):
        tokens = [c.tokens[0] for c in done[i * DRAWS:(i + 1) * DRAWS]]
        want = reference(logits, prompt, [], Request(prompt, **fields))
        assert chi_square_p(tokens, want) > 1e-3, fields
        if i:  # the test tells this setting's distribution from the plain softmax's
            assert chi_square_p(tokens, plain) < 1e-6, fields


def test_second_token_draws_follow_the_reference_given_the_first(model, twin):
    """Presence and frequency penalties count the output, the repetition penalty the prompt too:
    DRAWS two-token requests, seeds 0..DRAWS-1; each second token's reference distribution is the
    reference's after its own first token. The counts against the sum of those by a chi-square
    test (draws from distributions that differ are less spread than a multinomial's, so it is
    conservative); and how often the second token repeats the first, which the penalties are
    about, within 4 standard deviations of the reference's expectation (37 against 32.7, sd 5.5),
    and more than 6 below what the same settings without presence and frequency penalties expect
    (121.9, sd 9.8)."""
    prompt = [40, 41, 7, 90, 12]
    # a bias makes token 17 likely, so that a first token is often one the penalties then move
    fields = dict(temperature=1.0, presence_penalty=1.0, frequency_penalty=0.5, repetition_penalty=1.3,
                  logit_bias={17: 5.0})
    done, _ = Engine(model).run([Request(prompt, max_new_tokens=2, seed=s, ignore_eos=True, **fields)
                                 for s in range(DRAWS)])
    logits = {t: hf_logits(twin[0], prompt + [t]) for t in {c.tokens[0] for c in done}}
    seconds = [c.tokens[1] for c in done]
    repeats = sum(c.tokens[1] == c.tokens[0] for c in done)

    def expected(r: Request):
        """The second token's reference distributions, summed over the draws, and each draw's
        chance of repeating its first token."""
        dists = [reference(logits[c.tokens[0]], prompt, c.tokens[:1], r) for c in done]
        return sum(dists) / DRAWS, np.array([d[c.tokens[0]] for d, c in zip(dists, done)])

    mean, repeat = expected(Request(prompt, **fields))
    assert chi_square_p(seconds, mean) > 1e-3
    assert abs(repeats - repeat.sum()) < 4 * np.sqrt((repeat * (1 - repeat)).sum()), (repeats, repeat.sum())
    _, unpenalized = expected(Request(prompt, **{**fields, "presence_penalty": 0.0, "frequency_penalty": 0.0}))
    assert unpenalized.sum() - repeats > 6 * np.sqrt((unpenalized * (1 - unpenalized)).sum()), \
        (repeats, unpenalized.sum())


SEEDED = dict(temperature=1.2, top_k=20, top_p=0.95, min_p=0.01, repetition_penalty=1.1, presence_penalty=0.3,
              frequency_penalty=0.2, logit_bias={7: 1.0})


@pytest.mark.parametrize("fields", [SEEDED, dict(temperature=0.9, top_k=30, top_p=0.9, min_p=0.02)],
                         ids=["penalized", "limits-alone"])
def test_a_seed_draws_the_same_tokens_alone_beside_others_after_others_and_anew(model, fields):
    """A seeded request's tokens: on a fresh engine; beside others of other settings and seeds (with
    penalties: where the request has none, JAX's steps go out ahead of the host alone, not beside
    them); on the same engine after those finished; again on a fresh engine. Other seeds (one past
    64 bits) draw others."""
    prompt = [5, 9, 22, 31, 8]
    target = lambda seed=1234: Request(prompt, max_new_tokens=10, seed=seed, **fields)
    alone = Engine(model).run([target()])[0][0].tokens
    engine = Engine(model)
    rng = np.random.default_rng(8)
    others = [Request([int(t) for t in rng.integers(4, 128, 6)], max_new_tokens=int(rng.integers(3, 14)),
                      temperature=float(rng.uniform(0.5, 1.5)), seed=int(rng.integers(0, 2**31)),
                      top_k=int(rng.integers(0, 30)), presence_penalty=float(rng.uniform(-1, 1))) for _ in range(9)]
    beside = engine.run(others[:4] + [target()] + others[4:])[0][4].tokens
    after = engine.run([target()])[0][0].tokens
    late = engine.run(others + [target()])[0][-1].tokens  # 9 others in 8 rows: it joins as one ends
    anew = Engine(model).run([target()])[0][0].tokens
    assert alone == beside == after == late == anew
    draws = [tuple(Engine(model).run([target(seed)])[0][0].tokens) for seed in (1, 2, 3, 2**40 + 1234)]
    assert len(set(draws + [tuple(alone)])) == 5, draws


def test_a_seed_in_the_body_draws_the_engines_tokens(model):
    """The server's seed, with vLLM's sampling fields in the body: the engine's tokens for the same
    request, whatever ran on the server before, streamed or not; another seed draws others."""
    prompt = [5, 9, 22, 31, 8]
    want = Engine(model).run([Request(prompt, max_new_tokens=10, seed=77, **SEEDED)])[0][0].tokens
    body = {"prompt": prompt, "max_tokens": 10, "seed": 77, **SEEDED,
            "logit_bias": {str(t): b for t, b in SEEDED["logit_bias"].items()}, "return_tokens_as_token_ids": True,
            "logprobs": 0}
    from tests.serve.test_server import call

    with running(Engine(model)) as base:
        got = []
        for extra in ({}, {"seed": 78}, {}):
            status, text = call(base, "/v1/completions", {**body, **extra})
            assert status == 200, text
            got.append([int(t.split(":")[1]) for t in json.loads(text)["choices"][0]["logprobs"]["tokens"]])
        status, text = call(base, "/v1/completions", {**body, "stream": True})
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    streamed = [int(t.split(":")[1]) for c in chunks for t in (c["choices"][0]["logprobs"] or {"tokens": []})["tokens"]]
    assert got[0] == got[2] == streamed == want and got[1] != want


def test_the_server_takes_any_repetition_penalty_above_0_as_vllm_does(model, twin):
    """vLLM refuses only a repetition penalty <= 0: 0.005 (which the server refused, under a floor
    of 0.01 that neither vLLM nor the engine has) draws transformers' greedy tokens; 0 and -1 are a
    400 naming the field, and the server goes on serving."""
    from tests.serve.test_server import call

    prompt = [5, 9, 22, 31, 8]
    want, _ = hf_greedy(twin[0], Request(prompt, max_new_tokens=6, repetition_penalty=0.005, ignore_eos=True))
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "logprobs": 0,
            "return_tokens_as_token_ids": True}
    with running(Engine(model)) as base:
        for bad in (0, -1):
            status, text = call(base, "/v1/completions", {**body, "repetition_penalty": bad})
            error = json.loads(text)["error"]
            assert (status, error["param"]) == (400, "repetition_penalty"), text
            assert error["message"] == f"'repetition_penalty' must be between 1e-30 and 1e+30, not {bad}"
        status, text = call(base, "/v1/completions", {**body, "repetition_penalty": 0.005})
    assert status == 200, text
    assert [int(t.split(":")[1]) for t in json.loads(text)["choices"][0]["logprobs"]["tokens"]] == want


def test_the_off_values_through_the_server_draw_as_none_set(model):
    """vLLM's "off": top_k -1 or 0, top_p 1, min_p 0, penalties 1 and 0, an empty logit_bias; a
    seeded request with them draws what one without them draws, and top_k 1 the greedy tokens."""
    from tests.serve.test_server import call

    body = {"prompt": [5, 9, 22, 31, 8], "max_tokens": 8, "seed": 5, "temperature": 1.0, "ignore_eos": True,
            "logprobs": 0, "return_tokens_as_token_ids": True}
    off = [{"top_k": -1}, {"top_k": 0}, {"top_p": 1}, {"min_p": 0}, {"repetition_penalty": 1},
           {"presence_penalty": 0, "frequency_penalty": 0}, {"logit_bias": {}},
           {"top_k": -1, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0}]
    with running(Engine(model)) as base:
        def tokens(extra):
            status, text = call(base, "/v1/completions", {**body, **extra})
            assert status == 200, text
            return [int(t.split(":")[1]) for t in json.loads(text)["choices"][0]["logprobs"]["tokens"]]
        plain = tokens({})
        assert all(tokens(extra) == plain for extra in off)
        assert tokens({"top_k": 1}) == tokens({"temperature": 0}) != plain
