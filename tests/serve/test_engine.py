"""The engine against the simplest reference: each request run alone, greedy, one row."""

import random
import re

import numpy as np
import pytest

from linnet.serve import Engine, EngineSettingError, Request, RequestError
from tests.serve.conftest import make_model


def prompts(n, lo, hi, seed=0, vocab=128):
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def reference_greedy(model, prompt, new, pad_to=128):
    """Plain prefill of the prompt in row 0, then decode one token at a time: no engine at all.

    The prefill is padded to `pad_to` tokens (padding goes to row 1's last position, which no
    token reads), so that the JAX model compiles one shape for every prompt; None: no padding.
    It asks for a row of logits for each cache row (all the prompt's last token's), as the engine's
    passes do: a JAX engine warmed up for a pass of `pad_to` tokens has compiled it already.
    """
    model.reset()
    n = len(prompt)
    pad = 0 if pad_to is None else pad_to - n
    tokens = np.array(prompt + [0] * pad, np.int32)
    positions = np.concatenate([np.arange(n), np.full(pad, model.max_seq - 1)]).astype(np.int32)
    rows = np.concatenate([np.zeros(n), np.ones(pad)]).astype(np.int32)
    logits = np.asarray(model.prefill(tokens, positions, rows, np.full(model.batch, n - 1, np.int32)))
    out = [int(logits[0].argmax())]
    tokens = np.zeros(model.batch, np.int32)
    positions = np.full(model.batch, model.max_seq - 1, np.int32)
    while len(out) < new:
        tokens[0], positions[0] = out[-1], n + len(out) - 1
        logits = np.asarray(model.decode(tokens, positions))
        out.append(int(logits[0].argmax()))
    model.reset()
    return out


def test_64_mixed_requests_equal_each_alone(model):
    ps = prompts(64, 4, 40)
    engine = Engine(model, token_budget=128)
    engine.warmup(len(p) for p in ps)
    done, stats = engine.run([Request(prompt=p, max_new_tokens=12) for p in ps])
    assert all(c.finish_reason == "length" for c in done)
    for p, c in zip(ps, done):
        assert c.tokens == reference_greedy(model, p, 12)
    assert stats.generated_tokens == 64 * 12
    assert stats.passes["mixed"] > 0  # prompts joined passes while others decoded
    assert stats.passes["decode"] > 0


def test_shared_prompts_prefill_once(model):
    base = prompts(3, 60, 62, seed=3)
    shared_prefix = base[0][:58]
    ps = [base[0], base[0], base[1], base[0], shared_prefix + [5, 6, 7], base[2], base[1]]
    requests = [Request(prompt=p, max_new_tokens=6) for p in ps]
    engine = Engine(model, token_budget=256, prefix_min=32)
    done, stats = engine.run(requests)
    for p, c in zip(ps, done):
        assert c.tokens == reference_greedy(model, p, 6)
    total = sum(len(p) for p in ps)
    assert stats.prefill_tokens < total
    assert stats.copied_tokens + stats.prefill_tokens == total
    # base[0] and base[1] are computed once (but for the last token of each copy); base[2] once.
    assert stats.prefill_tokens <= len(base[0]) + len(base[1]) + len(base[2]) + 3 + 4


def test_a_prefix_too_short_to_reuse_leaves_the_row_holding_it_alone(model):
    """A prompt sharing only a short prefix with a cached one (a chat's system prompt, under
    prefix_min) reuses nothing, so it takes the free row holding the least: it took the cached
    prompt's row, for the prefix, and cut it short, so that the prompt asked again was computed anew."""
    system = prompts(1, 20, 20, seed=7)[0]
    x, b = system + prompts(1, 40, 40, seed=8)[0], system + prompts(1, 10, 10, seed=9)[0]
    engine = Engine(model, token_budget=256, prefix_min=32)
    engine.run([Request(prompt=x, max_new_tokens=2)])
    shorter, _ = engine.run([Request(prompt=b, max_new_tokens=2)])
    again, _ = engine.run([Request(prompt=x, max_new_tokens=2)])
    assert shorter[0].cached_tokens == 0 and again[0].cached_tokens == len(x) - 1
    assert again[0].tokens == reference_greedy(model, x, 2)


def test_prompts_share_cached_tokens_only_within_their_cache_salt(model):
    """vLLM's cache_salt: a prompt is copied from a row or a request of its own salt only (None is
    one salt too), whether they run together or one after the other; the tokens are the same."""
    p = prompts(1, 60, 60, seed=41)[0]
    ref = reference_greedy(model, p, 4)
    engine = Engine(model, token_budget=256, prefix_min=32)
    salts = [None, "a", "b", "a", None]
    done, stats = engine.run([Request(prompt=p, max_new_tokens=4, cache_salt=s) for s in salts])
    assert all(c.tokens == ref for c in done)
    assert stats.prefill_tokens == 3 * len(p) + 2  # once a salt; each copy computes its last token
    assert [c.cached_tokens for c in done] == [0, 0, 0, len(p) - 1, len(p) - 1]
    again, stats = engine.run([Request(prompt=p, max_new_tokens=4, cache_salt="c"),
                               Request(prompt=p, max_new_tokens=4, cache_salt="b")])
    assert [c.tokens for c in again] == [ref, ref]
    assert [c.cached_tokens for c in again] == [0, len(p) - 1]  # "b"'s row still holds its prompt


@pytest.mark.parametrize("backend", ["torch", "jax"])
@pytest.mark.parametrize("late_salt", ["a", "b"])
def test_a_cancelled_leaders_row_is_reused_only_within_its_cache_salt(backend, late_salt):
    """Two rows. A prompt waits on its leader (salt "a") to prefill it; the leader is cancelled after
    its first chunk, and a third request for the same prompt takes its row. Of salt "a", it reuses the
    chunk in place and the follower copies it (it used to start over: a cancelled leader's followers were
    let go); of salt "b", it reuses nothing, and the row it emptied gives the follower nothing to copy.
    The tokens are the same either way."""
    model = make_model(backend, rows=2)
    p = prompts(1, 60, 60, seed=47)[0]
    ref = reference_greedy(model, p, 3)
    engine = Engine(model, token_budget=40, prefix_min=16)
    leader, follower, late = (engine.submit(Request(prompt=p, max_new_tokens=3, cache_salt=s))
                              for s in ("a", "a", late_salt))
    engine.step()
    chunk = engine.stats.prefill_tokens
    assert 0 < chunk < len(p) and follower.cached_tokens == 0
    engine.cancel(leader.id)
    while engine.has_work():
        engine.step()
    assert leader.finish_reason == "cancelled"
    assert [follower.tokens, late.tokens] == [ref, ref]
    shared = chunk if late_salt == "a" else 0
    assert [follower.cached_tokens, late.cached_tokens] == [shared, shared]
    assert engine.stats.prefill_tokens == chunk + 2 * len(p) - 2 * shared


def test_seeded_sampling_is_independent_of_the_batch(model):
    ps = prompts(8, 5, 20, seed=5)
    target = Request(prompt=ps[0], max_new_tokens=10, temperature=0.9, top_p=0.9, top_k=40, seed=1234)
    alone, _ = Engine(model).run([target])
    crowd = [Request(prompt=p, max_new_tokens=10, temperature=1.0, seed=i) for i, p in enumerate(ps[1:])]
    again = Request(prompt=ps[0], max_new_tokens=10, temperature=0.9, top_p=0.9, top_k=40, seed=1234)
    mixed, _ = Engine(model).run(crowd[:3] + [again] + crowd[3:])
    assert mixed[3].tokens == alone[0].tokens
    other_seed, _ = Engine(model).run([Request(prompt=ps[0], max_new_tokens=10, temperature=0.9, seed=99)])
    assert other_seed[0].tokens != alone[0].tokens


def test_temperature_zero_is_greedy(model):
    p = prompts(1, 10, 10, seed=7)[0]
    done, _ = Engine(model).run([Request(prompt=p, max_new_tokens=8, temperature=0.0, seed=3, top_k=5)])
    assert done[0].tokens == reference_greedy(model, p, 8)


def test_a_logit_bias_moves_its_own_row_only(model):
    """One request forced to a token (+100) and one with its greedy first token banned (-100), in a
    batch with plain greedy ones: those get the tokens they get alone."""
    ps = prompts(4, 6, 14, seed=41)
    refs = [reference_greedy(model, p, 6) for p in ps]
    forced = Request(prompt=ps[0], max_new_tokens=6, logit_bias={42: 100.0})
    banned = Request(prompt=ps[1], max_new_tokens=6, logit_bias={refs[1][0]: -100.0})
    done, _ = Engine(model).run([forced, banned] + [Request(prompt=p, max_new_tokens=6) for p in ps[2:]])
    assert done[0].tokens == [42] * 6
    assert refs[1][0] not in done[1].tokens
    assert [c.tokens for c in done[2:]] == refs[2:]


def test_min_tokens_keeps_the_enders_out_until_then(model):
    """A stop token id the greedy run draws second ends the run there; with min_tokens = 5 it is kept
    from being drawn for the first five tokens, and the request goes on; the first token is the same."""
    p = next(q for q in prompts(20, 8, 8, seed=43) if len(set(reference_greedy(model, q, 2))) == 2)
    ref = reference_greedy(model, p, 2)
    plain, _ = Engine(model).run([Request(prompt=p, max_new_tokens=12, stop_token_ids=[ref[1]])])
    assert plain[0].tokens == ref and plain[0].finish_reason == "stop"
    held, _ = Engine(model).run([Request(prompt=p, max_new_tokens=12, stop_token_ids=[ref[1]], min_tokens=5)])
    tokens = held[0].tokens
    assert tokens[0] == ref[0] and ref[1] not in tokens[:5] and len(tokens) >= 5


def test_cancel_frees_the_row_and_others_finish(model):
    ps = prompts(20, 5, 15, seed=9)
    engine = Engine(model)
    comps = [engine.submit(Request(prompt=p, max_new_tokens=10)) for p in ps]
    victim = comps[2]
    for _ in range(3):
        engine.step()
    engine.cancel(victim.id)
    while engine.has_work():
        engine.step()
    assert victim.finish_reason == "cancelled"
    assert len(victim.tokens) < 10
    assert len(engine.free_rows) == model.batch
    for p, c in zip(ps, comps):
        if c is not victim:
            assert c.finish_reason == "length"
            assert c.tokens == reference_greedy(model, p, 10)


def test_a_run_stopped_partway_leaves_nothing_for_the_next(model):
    """Ctrl-C inside a pass (here raised from the third packed pass, as a signal lands): run()
    raises it, and the next run() runs its own requests alone, to the tokens a plain greedy loop
    gives, its stats theirs. The stopped run's requests stayed in flight, and the next run took
    them to their end beside its own (558 tokens counted for a 3-token request)."""
    engine = Engine(model, token_budget=64)
    ps = prompts(24, 28, 32, seed=61)
    passes = engine.runner.prefill

    def interrupted(*args, calls=[]):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return passes(*args)
    engine.runner.prefill = interrupted
    with pytest.raises(KeyboardInterrupt):
        engine.run([Request(prompt=p, max_new_tokens=40) for p in ps])
    assert not engine.has_work() and engine.stats.finished == {"error": len(ps)}
    engine.runner.prefill = passes
    done, stats = engine.run([Request(prompt=ps[0], max_new_tokens=5), Request(prompt=[7, 8, 9], max_new_tokens=3)])
    assert [c.tokens for c in done] == [reference_greedy(model, ps[0], 5), reference_greedy(model, [7, 8, 9], 3)]
    assert stats.generated_tokens == 8 and stats.finished == {"length": 2}
    assert stats.prefill_tokens == len(ps[0]) + 3  # the rows were forgotten: no prefix claimed from them


def test_a_failed_pass_of_the_background_loop_fails_its_requests_and_serving_goes_on(model):
    """A server's loop (`start`): a pass that raises ends every request in flight or queued with
    the error, and the next request runs alone on rows forgotten, to a plain greedy loop's tokens."""
    import time

    engine = Engine(model, token_budget=64)
    passes = engine.runner.prefill

    def failing(*args, calls=[]):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("the device went away")
        return passes(*args)
    engine.runner.prefill = failing
    ps = prompts(20, 28, 32, seed=62)
    comps = [engine.submit(Request(prompt=p, max_new_tokens=30)) for p in ps]
    engine.start()
    try:
        deadline = time.monotonic() + 60
        while any(c.finish_reason is None for c in comps) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert {(c.finish_reason, c.error) for c in comps} == {("error", "engine error: the device went away")}
        after = engine.submit(Request(prompt=ps[0], max_new_tokens=4))
        while after.finish_reason is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        engine.stop()
    assert after.finish_reason == "length" and after.tokens == reference_greedy(model, ps[0], 4)
    assert after.cached_tokens == 0 and engine.stats.finished == {"error": len(ps), "length": 1}


def test_a_failed_admission_ends_the_request_it_held(model):
    """An admission that raises between taking a request from the queue and giving it a row: the
    step's failure ends every request in flight, that one too. It was in neither the queue nor
    the rows, so it was left unended (its stream waiting for ever), though its id was freed."""
    engine = Engine(model)
    p = prompts(1, 6, 9, seed=64)[0]
    held = engine.submit(Request(prompt=p, max_new_tokens=4, id="held"))
    find_source = engine._find_source

    def failing(item):
        raise RuntimeError("no row")
    engine._find_source = failing
    with pytest.raises(RuntimeError, match="no row"):
        engine.run([])
    assert (held.finish_reason, held.error) == ("error", "the run was stopped: RuntimeError('no row')")
    assert engine.stats.finished == {"error": 1} and not engine.in_flight and not engine.has_work()
    engine._find_source = find_source
    done, _ = engine.run([Request(prompt=p, max_new_tokens=4, id="held")])
    assert (done[0].finish_reason, done[0].tokens) == ("length", reference_greedy(model, p, 4))


def test_a_listener_whose_event_loop_closed_fails_nothing(model):
    """A stream left open when its event loop closed (asyncio.run returning after the first
    token; the cancel its exit sends lands a step later): the step telling that loop of new
    tokens raised 'Event loop is closed', which failed every request in flight, and raised
    again while failing them, ended the server's loop. Now the step goes on, and each request
    gets a plain greedy loop's tokens."""
    import asyncio

    ps = prompts(2, 10, 14, seed=63)
    engine = Engine(model)
    loop = asyncio.new_event_loop()
    gone = engine.submit(Request(prompt=ps[0], max_new_tokens=5), listener=(loop, asyncio.Queue()))
    loop.close()
    other = engine.submit(Request(prompt=ps[1], max_new_tokens=5))
    while engine.has_work():
        engine.step()
    assert [(c.finish_reason, c.tokens) for c in (gone, other)] == [("length", reference_greedy(model, p, 5))
                                                                    for p in ps]


def test_bad_requests_are_rejected_and_others_run(model):
    good = prompts(2, 5, 8, seed=11)
    bad = [Request(prompt=[], max_new_tokens=4), Request(prompt=[1, 2, 999999], max_new_tokens=4),
           Request(prompt=[1] * 90, max_new_tokens=10), Request(prompt=[1, 2], max_new_tokens=-1),
           Request(prompt="t1 t2", max_new_tokens=4)]
    done, stats = Engine(model).run([Request(prompt=good[0], max_new_tokens=4)] + bad +
                                    [Request(prompt=good[1], max_new_tokens=4), Request(prompt=[3, 4], max_new_tokens=0)])
    assert [c.finish_reason for c in done] == ["length", "error", "error", "error", "error", "error", "length", "length"]
    assert stats.finished == {"length": 3, "error": 5}  # every request the run was given, refused ones too
    assert done[-1].tokens == []  # max_new_tokens 0: the prompt is prefilled, nothing drawn
    assert "empty" in done[1].error
    assert "outside the vocabulary" in done[2].error
    assert "MaxSeq" in done[3].error
    assert "max_new_tokens" in done[4].error
    assert "the prompt must be a list of token ids, not str" in done[5].error
    with pytest.raises(RequestError, match="MaxSeq = 96") as caught:
        Engine(model).submit(Request(prompt=[1] * 90, max_new_tokens=10))
    assert caught.value.field == "max_new_tokens"
    # a prompt no max_new_tokens would fit, even 0, is the prompt's fault (vLLM: "longer than the maximum model length")
    with pytest.raises(RequestError, match=r"the prompt \(97 tokens\) is longer than a cache row holds \(MaxSeq = 96\)") \
            as caught:
        Engine(model).submit(Request(prompt=[1] * 97, max_new_tokens=0))
    assert caught.value.field == "prompt"


def test_top_k_minus_1_is_vllms_no_limit_as_0_is(model):
    p = prompts(1, 5, 5, seed=13)[0]
    done, _ = Engine(model).run([Request(prompt=p, max_new_tokens=8, temperature=1.0, seed=5, top_k=k) for k in (-1, 0)])
    assert done[0].finish_reason == "length" and done[0].tokens == done[1].tokens


def test_allowed_token_ids_as_a_tuple_hold_the_draws_as_a_list_does(model):
    p = prompts(1, 5, 5, seed=13)[0]
    done, _ = Engine(model).run([Request(prompt=p, max_new_tokens=6, temperature=1.0, seed=s, allowed_token_ids=kind)
                                 for s in (1, 2) for kind in ([3, 4], (3, 4))])
    assert [c.finish_reason for c in done] == ["length"] * 4 and all(set(c.tokens) <= {3, 4} for c in done)
    assert done[0].tokens == done[1].tokens and done[2].tokens == done[3].tokens


def test_run_and_warmup_are_refused_while_the_background_loop_steps_the_engine(model):
    # two threads stepping one model's cache would mix their passes (the tokens came out wrong)
    engine = Engine(model)
    engine.start()
    try:
        for call in (lambda: engine.run([Request(prompt=[1, 2])]), lambda: engine.warmup([4]), engine.step):
            with pytest.raises(RuntimeError, match="background loop runs"):
                call()
    finally:
        engine.stop()
    assert engine.run([Request(prompt=[1, 2], max_new_tokens=2)])[0][0].finish_reason == "length"  # stopped: runs


@pytest.mark.parametrize("lengths", [[0], [5, 0], [-3], [2.5]])
def test_a_warmup_for_an_empty_or_odd_prompt_length_is_refused(model, lengths):
    with pytest.raises(ValueError, match="a prompt length must be a whole number of at least 1"):
        Engine(model).warmup(lengths)


def test_a_warmup_for_a_prompt_no_row_holds_is_refused(model):
    # MaxSeq 96: a 97-token prompt is refused at every submission, so its passes are no warmup's
    with pytest.raises(ValueError, match=re.escape("at most MaxSeq (96, a cache row's positions), not 97")):
        Engine(model).warmup([5, 97])
    engine = Engine(model)
    engine.warmup([96])  # (a prompt filling the row, with max_new_tokens 0)
    done, _ = engine.run([Request(prompt=[3] * 96, max_new_tokens=0)])
    assert done[0].finish_reason == "length" and done[0].tokens == []


@pytest.mark.parametrize("budget", [0, 1, -5])
def test_a_token_budget_too_small_is_refused_0_too(budget):
    with pytest.raises(EngineSettingError, match=f"token_budget \\({budget}\\) is too small for 2 rows"):
        Engine(make_model("torch", rows=2), token_budget=budget)


@pytest.mark.parametrize("setting, value, needle", [
    ("token_budget", 20.5, "token_budget must be an integer, not 20.5"),
    ("token_budget", "64", "token_budget must be an integer, not '64'"),
    ("token_budget", True, "token_budget must be an integer, not True"),
    ("prefix_min", None, "prefix_min must be an integer, not None"),
    ("prefix_min", 2.5, "prefix_min must be an integer, not 2.5"),
    ("prefix_min", -1, "prefix_min must be >= 0"),
    ("seed", "x", "seed must be an integer, not 'x'"),
])
def test_an_engine_setting_that_is_no_count_is_refused_up_front(setting, value, needle):
    """As a request's fields are: refused when the engine is made, not inside a step, where a float
    budget cut a 40-token prompt's chunk to 20.5 tokens (a TypeError slicing it) and a prefix_min
    of None failed the admission of every request."""
    model = make_model("torch", rows=2)
    with pytest.raises(EngineSettingError, match=re.escape(needle)):
        Engine(model, **{setting: value})
    done, _ = Engine(model, token_budget=20, prefix_min=0, seed=3).run([Request(prompt=[1] * 40, max_new_tokens=2)] * 2)
    assert [c.tokens for c in done] == [reference_greedy(model, [1] * 40, 2)] * 2


def test_an_eager_torch_model_counts_no_capture():
    # compile=False: the decode step is run as it is, nothing captured, and no compile is counted
    engine = Engine(make_model("torch", rows=2))
    _, stats = engine.run([Request(prompt=[1, 2, 3], max_new_tokens=3)])
    assert stats.compiles == 0 and engine.runner.compiles == 0 and not engine.runner.replays


def test_an_engine_stepped_by_hand_counts_its_time_and_compiles(model):
    """As a server steps it (submit, then step until done; no `run`): the stats hold the steps'
    time, and what they compiled or captured, which a warmup would have done before."""
    engine = Engine(model)
    ps = prompts(3, 5, 9, seed=21)
    for p in ps:
        engine.submit(Request(prompt=p, max_new_tokens=4))
    compiled_before = engine.runner.compiles
    while engine.has_work():
        engine.step()
    assert engine.stats.generated_tokens == 12 and engine.stats.seconds > 0
    assert engine.stats.compiles == engine.runner.compiles - compiled_before
    assert engine.stats.summary()["tokens_per_second"] > 0


@pytest.mark.parametrize("field, value, needle", [
    ("temperature", None, "temperature must be a number"), ("temperature", float("nan"), "temperature"),
    ("top_k", None, "top_k must be an integer"), ("top_k", 2.5, "top_k"), ("seed", "7", "seed must be an integer"),
    ("top_k", -2, "top_k must be an integer >= -1 (-1 or 0: no limit)"),
    ("logit_bias", {"5": 1.0}, "logit_bias's keys are token ids, integers, not '5'"),
    ("presence_penalty", float("inf"), "presence_penalty"), ("frequency_penalty", 3.0, "frequency_penalty"),
    ("repetition_penalty", float("nan"), "repetition_penalty"), ("stop", "t5", "stop must be a list"),
    ("stop", [""], "non-empty strings"), ("stop_token_ids", None, "stop_token_ids must be a list"),
    ("allowed_token_ids", 5, "allowed_token_ids must be a list"), ("logit_bias", [(3, 1.0)], "logit_bias must be a dict"),
    ("top_p", -0.5, "top_p must be a number in [0, 1]"),
    # an int no float holds (the step would raise), or a scale whose reciprocal f32 cannot hold
    ("temperature", 10 ** 400, "temperature must be a number in [0, 1e+30]"), ("temperature", 1e35, "temperature"),
    ("repetition_penalty", 10 ** 400, "repetition_penalty must be a number in [1e-30, 1e+30]"),
    ("repetition_penalty", 1e-40, "repetition_penalty"),  # 0 in f32: a seen token's logit over it is infinite
    # flags ('false' is true to Python; an int failed inside the step, taking its rows with it)
    ("skip_special_tokens", 1, "skip_special_tokens must be True or False"),
    ("ignore_eos", "false", "ignore_eos must be True or False"), ("include_stop", None, "include_stop"),
    ("structure", {"type": "object"}, "structure must be a linnet.serve.structured.Structure"),
    ("structure_after", (True,), "structure_after token id True is not an integer"), ("structure_after", 3, "structure_after must be"),
])
def test_a_field_of_the_wrong_type_fails_its_request_alone(model, field, value, needle):
    """Checked at submission: a field that would fail inside a step (a NaN, None, a string for a
    list) is that request's error, and the run's other requests finish; the engine serves on."""
    good = prompts(2, 5, 8, seed=12)
    engine = Engine(model)
    done, _ = engine.run([Request(prompt=good[0], max_new_tokens=3), Request(prompt=[1, 2], **{field: value}),
                          Request(prompt=good[1], max_new_tokens=3)])
    assert [c.finish_reason for c in done] == ["length", "error", "length"]
    assert needle in done[1].error
    assert [c.tokens for c in (done[0], done[2])] == [reference_greedy(model, p, 3) for p in good]
    assert not engine.has_work() and len(engine.free_rows) == model.batch


@pytest.mark.parametrize("top_p, ok", [(0, True), (0.0, True), (-0.25, False), (1.5, False), (float("nan"), False),
                                       (1e-9, True), (1, True)])
def test_top_p_is_in_0_1_as_openai_takes_it(top_p, ok):
    """OpenAI's API takes a top_p of 0 (llama.cpp's server too: the likeliest token alone; vLLM
    refuses it): so does `Request.validate`; past [0, 1] it names the field."""
    req = Request([1, 2], top_p=top_p)
    if ok:
        req.validate(vocab=8, max_seq=32)
        return
    with pytest.raises(RequestError, match=r"top_p must be a number in \[0, 1\]") as err:
        req.validate(vocab=8, max_seq=32)
    assert err.value.field == "top_p"


def test_a_huge_temperature_still_holds_its_masks(model):
    """The largest temperature taken draws near uniformly, but never a token its allowed ids or
    min_tokens keep out (past it, the banned tokens' logits over it were NaN)."""
    engine = Engine(model)
    ends = model.tokenizer.eos_token_ids if model.tokenizer is not None else []
    done, _ = engine.run([Request(prompt=[1, 2], max_new_tokens=6, temperature=1e30, seed=s, allowed_token_ids=[3, 4, 5])
                          for s in range(4)]
                         + [Request(prompt=[1, 2], max_new_tokens=4, temperature=1e30, seed=9, min_tokens=4,
                                    stop_token_ids=[0, 1, 2], ignore_eos=not ends)])
    assert all(set(c.tokens) <= {3, 4, 5} and len(c.tokens) == 6 for c in done[:4])
    assert len({tuple(c.tokens) for c in done[:4]}) > 1  # drawn, not a collapse onto one token
    assert not {0, 1, 2} & set(done[4].tokens) and len(done[4].tokens) == 4


def test_a_top_p_of_0_draws_the_likeliest_token(model):
    """top_p 0 keeps the likeliest token alone, at any temperature and seed: greedy's tokens."""
    ps = prompts(3, 5, 12, seed=21)
    engine = Engine(model)
    done, _ = engine.run([Request(prompt=p, max_new_tokens=6, temperature=1.5, top_p=0.0, seed=i)
                          for i, p in enumerate(ps)])
    assert [c.tokens for c in done] == [reference_greedy(model, p, 6) for p in ps]


def test_a_seed_past_64_bits_and_a_top_k_past_int32_run(model):
    """Any integer is a seed (a uint64 hash of a user's id is a fine one): one past 32 bits draws
    as its 32-bit key (`noise_key`), not as its low bits do; a top_k past the vocabulary limits
    nothing."""
    from linnet.serve.sampling import noise_key

    p = prompts(1, 6, 6, seed=14)[0]
    base = dict(prompt=p, max_new_tokens=6, temperature=1.0)
    wide = (1 << 64) + 5
    done, _ = Engine(model).run([Request(**base, seed=wide, top_k=10 ** 12), Request(**base, seed=noise_key(wide)),
                                 Request(**base, seed=5)])
    assert done[0].finish_reason == "length" and done[0].tokens == done[1].tokens
    assert done[0].tokens != done[2].tokens


def test_seeds_that_share_their_low_bits_have_keys_of_their_own():
    from linnet.serve.sampling import noise_key

    assert [noise_key(s) for s in (0, 7, 2**32 - 1)] == [0, 7, 2**32 - 1]  # as they always drew
    for low in (0, 1, 2**31 + 3):
        wide = [low + k * 2**32 for k in range(1, 2000)] + [-low - k * 2**32 for k in range(1, 2000)]
        keys = [noise_key(s) for s in wide]
        assert all(0 <= k < 2**32 for k in keys) and len(set(keys + [low])) == len(wide) + 1


def test_stop_token_ids_and_logprobs(model):
    p = prompts(1, 12, 12, seed=13)[0]
    ref = reference_greedy(model, p, 8)
    done, _ = Engine(model).run([Request(prompt=p, max_new_tokens=8, stop_token_ids=[ref[3]], logprobs=3)])
    c = done[0]
    stop_at = ref.index(ref[3])
    assert c.tokens == ref[:stop_at + 1] and c.finish_reason == "stop"
    assert len(c.logprobs) == len(c.tokens)
    for lp in c.logprobs:
        assert lp.logprob <= 0 and len(lp.top) == 3
        assert lp.top[0][0] == lp.token  # greedy: the chosen token is the most likely
        assert abs(lp.top[0][1] - lp.logprob) < 1e-5


def test_every_drawn_token_has_its_rank_under_the_models_own_logits(model):
    """Greedy and sampled draws through the engine (the decode step's own draw, and the one after a
    prefill) each carry vLLM's rank, 1 + how many tokens have a strictly larger logprob: numpy's,
    over the logits of the model's prefill run apart over the prompt and the tokens drawn."""
    p = prompts(2, 9, 14, seed=21)
    reqs = [Request(prompt=p[0], max_new_tokens=10, logprobs=0),
            Request(prompt=p[1], max_new_tokens=10, temperature=2.0, seed=5, logprobs=1)]
    done, _ = Engine(model).run(reqs)
    far = 0
    for c in done:
        seen = c.request.prompt + c.tokens
        n = len(seen)
        model.reset()
        pad = 128 - n  # one prefill shape for the JAX model, as `reference_greedy` pads
        logits = np.asarray(model.prefill(np.array(seen + [0] * pad, np.int32),
                                          np.concatenate([np.arange(n), np.full(pad, model.max_seq - 1)]).astype(np.int32),
                                          np.concatenate([np.zeros(n), np.ones(pad)]).astype(np.int32),
                                          np.arange(len(c.request.prompt) - 1, n - 1, dtype=np.int32)))
        model.reset()
        logprobs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
            - logits.max(-1, keepdims=True)
        for lp, row in zip(c.logprobs, logprobs):
            v, others = row[lp.token], np.delete(row, lp.token)  # a bracket as wide as the two runs'
            assert int((others > v + 1e-4).sum()) + 1 == lp.rank == int((others > v - 1e-4).sum()) + 1  # rounding
            far += lp.rank > 2
    assert [lp.rank for lp in done[0].logprobs] == [1] * 10  # greedy draws the likeliest
    assert far >= 3  # sampled at temperature 2, several draws rank past the one alternative asked for


def test_no_compilation_after_warmup(model):
    ps = prompts(24, 5, 40, seed=17)
    engine = Engine(model, token_budget=256)  # JAX buckets 16 ... 128, 192, 256
    engine.warmup(len(p) for p in ps)
    done, stats = engine.run([Request(prompt=p, max_new_tokens=5, temperature=0.5 * (i % 2), seed=i)
                              for i, p in enumerate(ps)])
    assert all(c.finish_reason == "length" for c in done)
    assert stats.compiles == 0
    # a server's warmup also compiles the draws that give logprobs: any k, greedy or sampled
    engine.warmup((len(p) for p in ps), logprobs=True)
    done, stats = engine.run([Request(prompt=p, max_new_tokens=3, temperature=0.5 * (i % 2), seed=i,
                                      logprobs=i % 21) for i, p in enumerate(ps)])
    assert [len(c.logprobs[-1].top) for c in done] == [i % 21 for i in range(len(ps))]
    assert stats.compiles == 0
    # and a server's, everything its requests may mix: masks (structured outputs, allowed_token_ids),
    # penalties, logit bias and min_tokens, with and without logprobs, greedy or sampled
    engine.warmup((len(p) for p in ps), logprobs=True, structured=True, adjusted=True)
    asks = [{}, {"allowed_token_ids": [3, 5, 7]}, {"presence_penalty": 0.5}, {"repetition_penalty": 1.3},
            {"logit_bias": {3: 2.0}}, {"min_tokens": 2}, {"frequency_penalty": 0.2, "allowed_token_ids": [3, 5]},
            {"repetition_penalty": 1.3, "logit_bias": {3: 2.0}, "min_tokens": 1}]  # the bias apart: sampling.SPLIT
    for mix in ([0, 1], [2, 3], [0, 4], [5, 1], [6], [1, 3, 4], [7, 1], [7]):
        done, stats = engine.run([Request(prompt=p, max_new_tokens=3, temperature=0.5 * (i % 2), seed=i,
                                          logprobs=2 if i % 3 == 0 else None, **asks[mix[i % len(mix)]])
                                  for i, p in enumerate(ps[:8])])
        assert all(c.finish_reason == "length" for c in done), mix
        assert stats.compiles == 0, mix


def test_an_engine_stepped_by_hand_after_its_warmup_counts_no_compile(model):
    """As a server, or `linnet generate`, steps it: warmed up, then submit and step. `stats.compiles`
    is what the steps compiled (0 after a complete warmup, as `Stats` says), not the warmup's own
    executables too (they were counted into it: a JAX engine reported 20 compiles for a load its
    warmup covered). The load mixes what the warmup compiles for: prompts past the budget, a shared
    prefix, prompt logprobs, logprobs, seeds, penalties with a bias, a mask and a cancel."""
    base = prompts(1, 70, 70, seed=51)[0]
    asks = [{"prompt_logprobs": 2}, {"logprobs": 3, "temperature": 0.8, "seed": 5},
            {"repetition_penalty": 1.2, "logit_bias": {3: 1.0}, "min_tokens": 2}, {"allowed_token_ids": [3, 5, 7]},
            {}]
    engine = Engine(model, token_budget=64)
    engine.warmup(logprobs=True, structured=True, adjusted=True, prompt_logprobs=True)
    comps = [engine.submit(Request(prompt=base + [i + 1], max_new_tokens=6, **ask)) for i, ask in enumerate(asks)]
    engine.step()
    engine.cancel(comps[-1].id)
    while engine.has_work():
        engine.step()
    assert [c.finish_reason for c in comps] == ["length"] * 4 + ["cancelled"]
    assert engine.stats.compiles == 0


def test_one_prompts_warmup_compiles_the_passes_it_makes_alone():
    """JAX: a warmup for one prompt length compiles that prompt's passes (its chunks, past the
    budget), not every bucket up to it; a run of it, and of it again with its row kept, compile
    nothing more."""

    model = make_model("jax", rows=4, max_seq=96)
    engine = Engine(model, token_budget=48)  # a head of 8 one-token slots, then 40 tokens of prompt
    assert engine._packs_of(70) == [8, 8 + 40, 8 + 32]  # chunks of 40 and 30 (32 in blocks of 8)
    for n in (5, 70):
        prompt = prompts(1, n, n + 1, seed=n)[0]
        expected = reference_greedy(model, prompt, 4)
        engine.warmup([len(prompt)])
        for computed in (len(prompt), 1):  # the second time, its row kept: its last token alone, in the head
            done, stats = engine.run([Request(prompt=prompt, max_new_tokens=4)])
            assert done[0].tokens == expected and stats.compiles == 0
            assert stats.prefill_tokens == computed


def test_a_run_past_its_warmup_says_what_it_compiled(compiles_counted):
    """JAX: a warmup for a 63-token prompt (budget 64: a pass of 8 head slots and 56 tokens, then
    one of the 7 left, 8 + 8) compiles passes of 64 and 16 tokens. A 9-token prompt then packs
    8 + 16 = 24 tokens, a pass of 32 (the next power of two): `stats.compiled` names it, and a
    penalized request the draws of its form, where the count alone said only how many."""
    model = make_model("jax", rows=4, max_seq=96)
    engine = Engine(model, token_budget=64)
    engine.warmup([63])
    prompt, short = prompts(1, 63, 64, seed=41)[0], prompts(1, 9, 10, seed=42)[0]
    done, stats = engine.run([Request(prompt=prompt, max_new_tokens=2)])
    assert (stats.compiles, stats.compiled) == (0, [])
    done, stats = engine.run([Request(prompt=short, max_new_tokens=2)])
    assert (stats.compiles, stats.compiled) == (1, ["a packed pass of 32 tokens"])
    assert stats.summary()["compiled"] == ["a packed pass of 32 tokens"]
    done, stats = engine.run([Request(prompt=short, max_new_tokens=2, presence_penalty=0.5)])
    assert stats.compiles == 2 and stats.compiled == [
        "the draw after a packed pass, with penalties or a logit bias",
        "the decode step alone (its draw apart, after the host's masks or counts)"]  # (the same draw after it)


def test_one_requests_warmup_covers_its_form(model):
    """What `linnet generate` warms up: one pack size and the draw of its one request, mask and
    penalties included (`Engine.sampling_mode`): its run then compiles nothing."""
    prompt = prompts(1, 12, 13, seed=23)[0]
    engine = Engine(model)
    for asks in ({"allowed_token_ids": [3, 5, 9]}, {"presence_penalty": 0.4, "allowed_token_ids": [3, 5]},
                 {"repetition_penalty": 1.2, "logit_bias": {5: 1.0}, "allowed_token_ids": [3, 5]}):
        req = Request(prompt=prompt, max_new_tokens=4, temperature=0.8, seed=1, **asks)
        engine.runner.warmup([min(engine.token_budget, engine.runner.overhead + engine.runner.chunk_cost(len(prompt)))],
                             [engine.sampling_mode(req)])
        model.reset()
        done, stats = engine.run([req])
        assert done[0].finish_reason == "length" and set(done[0].tokens) <= set(asks["allowed_token_ids"])
        assert stats.compiles == 0, asks


def test_prompts_longer_than_the_budget_are_chunked(model):
    ps = prompts(6, 50, 80, seed=19)
    engine = Engine(model, token_budget=64)
    done, stats = engine.run([Request(prompt=p, max_new_tokens=5) for p in ps])
    for p, c in zip(ps, done):
        assert c.tokens == reference_greedy(model, p, 5)
    assert stats.passes["prefill"] + stats.passes["mixed"] >= sum(len(p) for p in ps) // 64


def word_tokenizer(vocab: int):
    """A real `tokenizers` word-level tokenizer over the tiny model's ids: token i is the word `t{i}`."""
    from tokenizers import Tokenizer as Backend, models, pre_tokenizers

    from linnet.nest.tokenizer import Tokenizer

    backend = Backend(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return Tokenizer(backend, eos_token_ids=[])


def test_an_end_token_other_than_the_models_own_is_named_as_the_stop_reason(model):
    """As vLLM's: the model's own end token (the tokenizer's eos_token) ends a reply with stop_reason None;
    another its generation config lists (Llama 3's <|eom_id|> beside <|eot_id|>), which vLLM makes a stop
    token id, ends it with stop_reason that id."""
    from tokenizers import Tokenizer as Backend, models, pre_tokenizers

    from linnet.nest.tokenizer import Tokenizer

    for seed in range(23, 60):  # a prompt whose greedy third token is not among the first two, nor is one token
        p = prompts(1, 12, 12, seed=seed)[0]
        ref = reference_greedy(model, p, 6)
        if ref[2] not in ref[:2] and len(set(ref)) < model.vocab:
            break
    unused = next(t for t in range(model.vocab) if t not in ref)
    backend = Backend(models.WordLevel({f"t{i}": i for i in range(model.vocab)}, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    reasons = []
    for own in (ref[2], unused):
        model.tokenizer = Tokenizer(backend, eos_token=f"t{own}", eos_token_ids=[ref[2], unused])
        try:
            (done,), _ = Engine(model).run([Request(prompt=p, max_new_tokens=6)])
        finally:
            model.tokenizer = None
        assert done.finish_reason == "stop" and done.tokens == ref[:3]
        reasons.append(done.stop_reason)
    assert reasons == [None, ref[2]]


@pytest.mark.parametrize("include_stop", [False, True])
def test_stop_strings_end_the_text_before_them_or_after_when_asked(model, include_stop):
    p = prompts(1, 12, 12, seed=23)[0]
    ref = reference_greedy(model, p, 10)
    model.tokenizer = word_tokenizer(model.vocab)
    try:
        stop = f"t{ref[4]}"
        done, _ = Engine(model).run([Request(prompt=p, max_new_tokens=10, stop=[stop], include_stop=include_stop)])
    finally:
        model.tokenizer = None
    c = done[0]
    first = [f"t{t}" for t in ref].index(stop)
    assert c.finish_reason == "stop"
    assert c.tokens == ref[:first + 1]
    assert c.text.strip() == " ".join(f"t{t}" for t in ref[:first + include_stop])


@pytest.mark.parametrize("include_stop", [False, True])
def test_a_stop_token_s_text_is_left_out_unless_asked_for(model, include_stop):
    """As vLLM's: the text ends before the stop token that ends it (counted, and with its logprob,
    among the tokens), or after it with include_stop_str_in_output."""
    p = prompts(1, 12, 12, seed=23)[0]
    ref = reference_greedy(model, p, 10)
    model.tokenizer = word_tokenizer(model.vocab)
    try:
        done, _ = Engine(model).run([Request(prompt=p, max_new_tokens=10, stop_token_ids=[ref[4]], logprobs=0,
                                             include_stop=include_stop)])
    finally:
        model.tokenizer = None
    c = done[0]
    first = ref.index(ref[4])
    assert c.finish_reason == "stop" and c.tokens == ref[:first + 1] and len(c.logprobs) == first + 1
    assert c.text.strip() == " ".join(f"t{t}" for t in ref[:first + include_stop])


@pytest.mark.parametrize("ender", ["end token", "stop token id"])
def test_a_reply_that_stops_inside_a_character_ends_before_it(ender):
    """A reply whose last token before its stop token is the first byte of a character (of 😀) ends
    before that character, as a streaming UTF-8 decoder, and vLLM's detokenizer, leave it: it
    ended in U+FFFD (a reply cut there by max_tokens already did not)."""
    import codecs

    from .test_structured import EOS, byte_tokenizer

    model = make_model("torch", rows=2, max_seq=32)
    model.tokenizer = tok = byte_tokenizer(model.vocab, more="😀".encode()[:1])
    lead, stop = tok.vocab_size - 1, EOS if ender == "end token" else 5  # lead: the byte 0xF0, the last token
    # min_tokens keeps the ender from the first draw, which is the lead byte; the bias then forces the ender
    req = Request(prompt=[10, 11, 12], max_new_tokens=8, allowed_token_ids=[lead, stop], logit_bias={stop: 100.0},
                  min_tokens=1, stop_token_ids=[] if stop == EOS else [stop])
    done, _ = Engine(model).run([req])
    assert done[0].tokens == [lead, stop] and done[0].finish_reason == "stop"
    assert tok.token_bytes(lead) == b"\xf0"
    assert done[0].text == codecs.getincrementaldecoder("utf-8")().decode(b"\xf0") == ""


def test_the_earliest_of_several_stop_strings_ends_the_text(model):
    """Stop strings are looked for as the text grows; the one that appears first wins, whatever
    their order in the request, including one that spans two tokens."""
    p = prompts(1, 9, 9, seed=31)[0]
    ref = reference_greedy(model, p, 12)
    full = "".join(f" t{t}" for t in ref)  # the word tokenizer's text after a prompt
    spanning = f"{ref[6]} t{ref[7]}"[1:]  # the end of token 6's word, the space, and token 7's word
    late, early = f"t{ref[9]}", spanning
    model.tokenizer = word_tokenizer(model.vocab)
    try:
        done, _ = Engine(model).run([Request(prompt=p, max_new_tokens=12, stop=[late, early])])
    finally:
        model.tokenizer = None
    at, stop = min((full.find(s), s) for s in (late, early))
    assert done[0].finish_reason == "stop" and done[0].text == full[:at]
    assert done[0].tokens == ref[:len(full[:at + len(stop)].split())]  # up to the token completing it


@pytest.mark.parametrize("backend, rows", [("torch", 1), ("jax", 1), ("jax", 3)])
def test_the_least_token_budget_still_moves_a_prompt_on(backend, rows):
    """A pass holds every row's decode token and still a piece of a prompt: JAX packs prompts in
    blocks of 8, so a budget with fewer left never prefilled anything, and the engine stepped
    forever. Below the least it is refused, naming the least; at it, prompts finish."""

    model = make_model(backend, rows=rows, max_seq=48)
    with pytest.raises(EngineSettingError, match="is too small for") as err:
        Engine(model, token_budget=Engine(model).runner.overhead + 2 * rows - (backend == "torch"))
    least = int(str(err.value).rsplit(" ", 1)[1])
    engine = Engine(model, token_budget=least)
    ps = prompts(2 * rows, 3, 20, seed=17)
    done, stats = engine.run([Request(prompt=p, max_new_tokens=3) for p in ps])
    reference = make_model(backend, rows=2, max_seq=48)  # the same weights; the reference pads into row 1
    assert [c.tokens for c in done] == [reference_greedy(reference, p, 3) for p in ps]


def test_a_stop_string_passed_while_min_tokens_held_stays_passed(model):
    """A stop string wholly inside the text drawn before min_tokens is not found once the hold ends
    (vLLM looks only at what ends in new text), whatever other, longer stop strings the request has."""
    for seed in range(40, 80):  # a prompt whose greedy text has a word among its first 3 that occurs once
        p = prompts(1, 9, 9, seed=seed)[0]
        ref = reference_greedy(model, p, 8)
        words = [f"t{t}" for t in ref]
        once = [w for w in words[:3] if words.count(w) == 1]
        if once:
            break
    stop = once[0]
    model.tokenizer = word_tokenizer(model.vocab)
    try:
        for stops in ([stop], [stop, "a stop string that never appears"]):
            done, _ = Engine(model).run([Request(prompt=p, max_new_tokens=8, min_tokens=3, stop=stops)])
            assert done[0].finish_reason == "length" and done[0].tokens == ref, stops
    finally:
        model.tokenizer = None


def test_a_stop_string_counts_from_the_token_after_min_tokens(model):
    """As vLLM's: a stop string the min_tokens-th token completes does not stop the request (that token's
    text is the request's, whole); one the token after completes does."""
    for seed in range(40, 80):  # a prompt whose greedy text's third word occurs once
        p = prompts(1, 9, 9, seed=seed)[0]
        ref = reference_greedy(model, p, 8)
        words = [f"t{t}" for t in ref]
        if words.count(words[2]) == 1:
            break
    model.tokenizer = word_tokenizer(model.vocab)
    try:
        held, passed = Engine(model).run([Request(prompt=p, max_new_tokens=8, min_tokens=3, stop=[words[2]]),
                                          Request(prompt=p, max_new_tokens=8, min_tokens=2, stop=[words[2]])])[0]
    finally:
        model.tokenizer = None
    assert held.finish_reason == "length" and held.tokens == ref
    assert passed.finish_reason == "stop" and passed.tokens == ref[:3] and passed.stop_reason == words[2]


def test_jax_walking_keys_through_the_engine_matches_exact_numerics():
    """Past two key chunks, fast JAX on the CPU walks the cache in chunks: prompts packed in
    blocks, chunked after a cached prefix, sharing a long prefix, with idle rows padded. Greedy
    tokens agree with exact numerics (which read whole rows), each prompt prefilled plainly."""

    fast = make_model("jax", rows=4, max_seq=320, numerics="fast")
    exact = make_model("jax", rows=1, max_seq=320, numerics="exact")
    base = prompts(4, 130, 250, seed=23)
    ps = base + [base[0][:200] + [9, 8, 7], base[1][:90]]
    engine = Engine(fast, token_budget=96, prefix_min=64)
    done, stats = engine.run([Request(prompt=p, max_new_tokens=6) for p in ps])
    for p, c in zip(ps, done):
        assert c.tokens == reference_greedy(exact, p, 6, pad_to=None)
    assert stats.copied_tokens >= 200  # the shared prefix was reused, not prefilled again


def test_a_compiled_torch_model_replays_its_decode_step(model):
    """compile=True on torch: decode is captured once, at warmup, and every later step replays it
    (a CPU graph here: `kernels.cpu_graph`), with the outputs the eager tests above compare."""
    if model.backend != "torch" or not model.compile:
        pytest.skip("only a compiled torch model captures its decode step")
    from linnet.kernels import cpu_graph

    if model.device != "cpu" or not cpu_graph.available():
        pytest.skip("no CPU graph here")
    engine = Engine(model)
    engine.warmup([10])
    assert engine.runner.compiles == 1 and engine.runner.not_replayed is None
    assert engine.runner.compiled == ["the decode step's capture (a CPU graph)"]
    assert isinstance(engine.runner._graph, cpu_graph.CpuGraph) and len(engine.runner._graph) > 0
    ps = prompts(5, 5, 20, seed=23)
    done, stats = engine.run([Request(prompt=p, max_new_tokens=6) for p in ps])
    assert stats.compiles == 0 and stats.compiled == [] and engine.runner.compiles == 1
    for p, c in zip(ps, done):
        assert c.tokens == reference_greedy(model, p, 6)


OTHER_ARCHITECTURES = ["tiny-gpt-oss", "tiny-qwen3-moe", "tiny-mixtral", "tiny-gemma3", "tiny-olmo2", "tiny-granite",
                       "tiny-phi3", "tiny-smollm3", "tiny-gemma2", "tiny-deepseek-v2", "tiny-phi2", "tiny-gpt2"]
# JAX compiles each family's passes anew (5-18 s a case here): one family for each kind of state and pass the
# engine drives there (sinks and a window, experts, caps with windows, a latent cache, learned positions, a
# loop of Python's over layers); Gemma 3 holds Gemma 2's caches, Qwen3-MoE Mixtral's, and OLMo 2, Granite,
# Phi-3 and Phi-2 Llama's (the `model` fixture's), and test_batch_invariant_engine runs six families on JAX
JAX_ARCHITECTURES = ["tiny-gpt-oss", "tiny-mixtral", "tiny-gemma2", "tiny-deepseek-v2", "tiny-gpt2", "tiny-smollm3"]


@pytest.mark.parametrize("backend, card", [("torch", card) for card in OTHER_ARCHITECTURES] +
                         [("jax", card) for card in JAX_ARCHITECTURES])
def test_other_architectures_through_the_engine_equal_each_alone(backend, card):
    """gpt-oss (routed experts, sinks, a sliding window shorter than most prompts), Qwen3-MoE and
    Mixtral (experts stored one by one), Gemma 3 (windowed and full layers, each with its own rope),
    OLMo 2 (norms after each half), Granite (µP's multipliers), Phi-3 (fused projections, a window), SmolLM3 (a
    NoPE layer), Gemma 2 (capped scores and logits, windowed layers), Phi-2 (LayerNorms, attention and MLP side by
    side, rotary over part of each head), GPT-2 (learned positions, LayerNorms):
    the engine knows nothing of the architecture, so its outputs must equal each request run alone."""
    from linnet import nest

    model = nest.load(card, backend=backend, weights="random", seed=3, generics={"Batch": 4, "MaxSeq": 64})
    ps = prompts(10, 4, 30, seed=5)
    engine = Engine(model, token_budget=64)
    engine.warmup(len(p) for p in ps)
    done, stats = engine.run([Request(prompt=p, max_new_tokens=10) for p in ps])
    for p, c in zip(ps, done):
        assert c.tokens == reference_greedy(model, p, 10, pad_to=64)
    assert stats.passes["mixed"] > 0 and stats.passes["decode"] > 0
    assert stats.compiles == 0


def test_a_model_reset_between_runs_is_seen_by_the_engine(model):
    """`model.reset()` empties the cache (benchmarks do so between repeats): the engine must not
    then reuse the rows it remembers holding a prompt, and prefills it again, to the same tokens."""
    prompt = prompts(1, 30, 31, seed=31)[0]
    engine = Engine(model)
    first, _ = engine.run([Request(prompt=prompt, max_new_tokens=6)])
    again, stats = engine.run([Request(prompt=prompt, max_new_tokens=6)])
    assert again[0].tokens == first[0].tokens and stats.prefill_tokens == 1  # the row kept: its last token only
    model.reset()
    cold, stats = engine.run([Request(prompt=prompt, max_new_tokens=6)])
    assert cold[0].tokens == first[0].tokens == reference_greedy(model, prompt, 6)
    assert stats.prefill_tokens == len(prompt) and cold[0].cached_tokens == 0


def test_an_engine_forgets_its_rows_once_another_engine_has_run_the_model(model):
    """Two engines over one model share its cache: each pass of one overwrites rows the other
    remembers holding a prompt, so an engine run again after another prefills its prompt again."""
    prompt, others = prompts(1, 30, 31, seed=32)[0], prompts(model.batch, 20, 40, seed=33)
    first_engine, second_engine = Engine(model), Engine(model)
    first, _ = first_engine.run([Request(prompt=prompt, max_new_tokens=6)])
    second_engine.run([Request(prompt=p, max_new_tokens=2) for p in others])  # every row rewritten
    again, stats = first_engine.run([Request(prompt=prompt, max_new_tokens=6)])
    assert again[0].tokens == first[0].tokens and stats.prefill_tokens == len(prompt)


def test_rows_forgotten_under_a_request_in_flight_claim_no_prefix(model):
    """A reset with a request in flight is a misuse (its cache is gone too), but what the engine
    then remembers of that row must not claim the request's later tokens as a prefix from 0."""
    prompt = prompts(1, 30, 31, seed=34)[0]
    engine = Engine(model)
    comp = engine.submit(Request(prompt=prompt, max_new_tokens=8))
    for _ in range(3):
        engine.step()
    model.reset()
    while engine.has_work():
        engine.step()
    held = [tokens for tokens in engine.row_tokens if tokens]
    whole = prompt + comp.tokens
    assert all(tokens == whole[:len(tokens)] for tokens in held)


def test_a_torch_cpu_models_steps_leave_the_cores_to_its_kernels():
    # torch's own ops on the stepping thread alone, Linnet's kernels on the threads torch had
    # (kernels.pool), in run() and in start()'s loop; torch's count is back after
    import threading

    import torch

    from linnet.kernels import pool

    model = make_model("torch", rows=2, max_seq=32, numerics="fast")
    engine = Engine(model)
    seen = []
    prefill = engine.runner.prefill

    def watched(*args):
        seen.append((threading.current_thread().name, torch.get_num_threads(), pool.threads()))
        return prefill(*args)
    engine.runner.prefill = watched
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        engine.run([Request(prompt=[3, 4, 5], max_new_tokens=2)])
        engine.start()
        try:
            engine.submit(Request(prompt=[6, 7], max_new_tokens=2))
            for _ in range(500):
                if len(seen) == 2:
                    break
                threading.Event().wait(0.01)
        finally:
            engine.stop()
        assert torch.get_num_threads() == 2
        with engine.stepping():  # steps taken by hand (linnet generate's)
            engine.submit(Request(prompt=[8, 9], max_new_tokens=1))
            while engine.has_work():
                engine.step()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert [(torch_threads, kernels) for _, torch_threads, kernels in seen] == [(1, 2)] * 3
    assert seen[1][0] == "linnet-engine"
