"""Every `Request` field at submission (hypothesis): a value of an accepted form (a list, a tuple
or a 1-D integer numpy array of token ids; a numpy integer, float or bool where a number or a flag
is asked) is accepted and run as the plain Python value it stands for, and its request ends as
any does; any other is refused at once with a `RequestError` naming that field, nothing queued.
Never a failure inside a step, where it would take the step's other requests with it (a numpy
seed overflowed there; a uint64 max_new_tokens wrapped past the row's check, and a run of it did not end)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.serve import Engine, Request, RequestError

from .conftest import make_model
from .test_engine import prompts, reference_greedy, word_tokenizer

VOCAB, MAX_SEQ = 128, 96
NEW = 3  # the max_new_tokens of a request whose field under test is another
BAD = object()  # a value the field refuses

# The forms a list of token ids comes in: a tokenizer's arrays of any integer type, numpy integers.
ID_FORMS = [list, tuple, lambda x: np.array(x, np.int64), lambda x: np.array(x, np.int32),
            lambda x: np.array(x, np.uint8), lambda x: np.array(x, np.uint64), lambda x: [np.int64(t) for t in x]]
# Token id lists no field takes: bools, floats, other shapes, ids outside [0, VOCAB), not lists at all.
BAD_IDS = [[True], [3, 1.0], [2.5], np.array([1.0]), np.array([True, False]), np.array([[1, 2]]), np.array(4),
           [VOCAB], [-1], [10 ** 20], np.array([VOCAB], np.int64), np.array([-1], np.int8), "t1 t2", 3, {1, 2},
           {"a": 1}]


@pytest.fixture(scope="module")
def engine():
    model = make_model("torch", rows=4, max_seq=MAX_SEQ)
    model.tokenizer = word_tokenizer(model.vocab)  # (stop strings need one)
    yield Engine(model)
    model.tokenizer = None


def token_ids(min_size: int):
    """(a list of token ids in one of its forms, the Python list it stands for)."""
    return st.tuples(st.lists(st.integers(0, VOCAB - 1), min_size=min_size, max_size=5),
                     st.sampled_from(ID_FORMS)).map(lambda p: (p[1](p[0]), p[0]))


def ints(lo: int, hi: int):
    """(an integer in [lo, hi] as a Python int or a numpy integer that holds it, the int)."""
    def holding(x):
        return [int] + [t for t in (np.int32, np.int64, np.uint32, np.uint64)
                        if np.iinfo(t).min <= x <= np.iinfo(t).max]
    return st.integers(lo, hi).flatmap(lambda x: st.sampled_from(holding(x)).map(lambda t: (t(x), x)))


def numbers(lo: float, hi: float):
    """(a real number in [lo, hi] as a float, a numpy float or an int, the float it is)."""
    def form(x, kind):
        value = {"float": float, "f64": np.float64, "f32": np.float32, "int": lambda v: int(v)}[kind](x)
        return value, float(value)
    return st.tuples(st.floats(lo, hi), st.sampled_from(["float", "f64", "f32", "int"])).map(
        lambda p: form(*p)).filter(lambda p: lo <= p[1] <= hi)


def bad(*values):
    return st.sampled_from(values).map(lambda v: (v, BAD))


NO_NUMBER = (float("nan"), float("inf"), np.float32("nan"), True, None, "0.5", 1j, [0.5])
FLAGS = st.sampled_from([True, False, np.True_, np.False_]).map(lambda v: (v, bool(v))) | bad(1, 0, "false", None)
FIELDS = {
    "prompt": token_ids(1) | bad([], np.array([], np.int64), *BAD_IDS),
    "max_new_tokens": ints(0, 8) | bad(-1, 2.0, True, None, "3", np.uint64(2 ** 64 - 1), 10 ** 30, np.float64(3),
                                       MAX_SEQ),
    "temperature": numbers(0, 2) | bad(-0.1, 1e31, 10 ** 400, *NO_NUMBER),
    "top_p": numbers(0, 1) | bad(-0.1, 1.5, *NO_NUMBER),
    "min_p": numbers(0, 1) | bad(1.01, *NO_NUMBER),
    "repetition_penalty": numbers(0.5, 2) | bad(0, 1e-40, *NO_NUMBER),
    "presence_penalty": numbers(-2, 2) | bad(2.5, *NO_NUMBER),
    "frequency_penalty": numbers(-2, 2) | bad(-3, *NO_NUMBER),
    "top_k": ints(0, 200) | ints(2 ** 40, 2 ** 63 - 1) | bad(-1, 2.5, True, None, "5"),
    "seed": st.just((None, None)) | ints(-2 ** 63, 2 ** 64 - 1) | st.integers(-2 ** 80, 2 ** 80).map(lambda s: (s, s))
    | bad(1.5, "7", True, np.float64(3)),
    "min_tokens": ints(0, NEW) | bad(-1, NEW + 1, 1.0, True, None),
    "logprobs": st.just((None, None)) | ints(0, 20) | bad(21, -1, True, 1.0, "2"),
    "prompt_logprobs": st.just((None, None)) | ints(0, 20) | bad(21, -1, np.True_, 1.0),
    "stop_token_ids": token_ids(0) | bad(None, *BAD_IDS),
    "allowed_token_ids": st.just((None, None)) | token_ids(1) | bad([], np.array([], np.uint8), *BAD_IDS),
    "structure_after": st.just((None, None)) | token_ids(1) | bad([], *BAD_IDS),
    "bad_words": st.just((None, None)) | st.lists(token_ids(1), max_size=3).map(
        lambda words: ([form for form, _ in words], [ids for _, ids in words]))
    | bad([[]], [5], "t5", [[VOCAB]], [[1.5]], [[True]], np.array([3])),
    "logit_bias": st.just((None, None)) | st.lists(st.tuples(ints(0, VOCAB - 1), numbers(-100, 100)), max_size=3).map(
        lambda kv: ({k: v for (k, _), (v, _) in kv}, {k: v for (_, k), (_, v) in kv}))
    | bad([(3, 1.0)], {VOCAB: 1.0}, {-1: 1.0}, {True: 1.0}, {"3": 1.0}, {1.0: 1.0}, {3: float("nan")}, {3: 101},
          {3: True}, {3: None}),
    "stop": st.lists(st.integers(0, VOCAB - 1).map(lambda t: f"t{t}"), max_size=3).flatmap(
        lambda s: st.sampled_from([(s, s), (tuple(s), s), ([np.str_(x) for x in s], s)]))
    | bad("t5", [""], [1], None, ["t1", None]),
    "ignore_eos": FLAGS, "include_stop": FLAGS, "skip_special_tokens": FLAGS, "keeps_end_token": FLAGS,
    "structure": st.just((None, None)) | bad({"type": "object"}, "[a-z]+"),
    "id": st.text(max_size=8).map(lambda s: (s, s)) | bad(5, None, ["x"], b"x"),
    "cache_salt": st.just((None, None)) | st.text(min_size=1, max_size=8).flatmap(
        lambda s: st.sampled_from([(s, s), (np.str_(s), s)])) | bad("", 5, b"x", ["x"], True),
}


def plain_exactly(value, expected) -> bool:
    """Whether `value` is `expected` in its plain Python types too (no numpy integer or float)."""
    if type(value) is not type(expected):
        return False
    if isinstance(expected, (list, tuple)):
        return len(value) == len(expected) and all(plain_exactly(a, b) for a, b in zip(value, expected))
    if isinstance(expected, dict):
        return list(value) == list(expected) and all(plain_exactly(value[k], expected[k]) for k in expected) \
            and all(type(k) is int for k in value)
    return value == expected


@settings(max_examples=120, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_each_field_is_taken_in_its_forms_or_refused_by_name(engine, data):
    name = data.draw(st.sampled_from(sorted(FIELDS)), label="field")
    value, expected = data.draw(FIELDS[name], label="value")
    asks = {"prompt": [5, 6, 7], "max_new_tokens": NEW, "id": f"case-{name}", name: value}
    req = Request(**asks)
    if expected is BAD:
        with pytest.raises(RequestError) as err:
            engine.submit(req)
        assert err.value.field == name, str(err.value)
        assert not engine.has_work() and not engine.in_flight
        return
    assert plain_exactly(getattr(req.validate(VOCAB, MAX_SEQ), name), expected)
    comp = engine.submit(req)
    while engine.has_work():
        engine.step()
    assert comp.request is req and comp.error is None and comp.finish_reason in ("length", "stop")


@pytest.mark.parametrize("form", range(len(ID_FORMS)))
def test_token_id_fields_as_arrays_hold_the_draws_as_lists_do(engine, form):
    """A stop token id ends the greedy reply at its first draw of it (a plain greedy loop's
    tokens, cut there); a logit bias of +100 on a numpy integer key forces its token; allowed
    token ids keep the draws to them; a negative numpy seed draws as the same Python int does."""
    as_form, model = ID_FORMS[form], engine.model
    p = prompts(1, 5, 8, seed=90)[0]
    ref = reference_greedy(model, p, 8)
    stop = ref[3]
    allowed = sorted({ref[0], 7, 11})
    runs = [Request(prompt=as_form(p), max_new_tokens=8, stop_token_ids=as_form([stop])),
            Request(prompt=p, max_new_tokens=4, logit_bias={as_form([9])[0]: 100.0}),
            Request(prompt=p, max_new_tokens=6, temperature=1.0, seed=7, allowed_token_ids=as_form(allowed)),
            Request(prompt=p, max_new_tokens=6, temperature=1.0, seed=7, allowed_token_ids=allowed),
            Request(prompt=p, max_new_tokens=6, temperature=1.0, seed=np.int64(-5)),
            Request(prompt=p, max_new_tokens=6, temperature=1.0, seed=-5)]
    done, _ = engine.run(runs)
    assert [c.error for c in done] == [None] * len(runs)
    assert done[0].tokens == ref[:ref.index(stop) + 1] and done[0].stop_reason == stop
    assert done[1].tokens == [9] * 4
    assert set(done[2].tokens) <= set(allowed) and done[2].tokens == done[3].tokens
    assert done[4].tokens == done[5].tokens


def test_a_refused_field_leaves_the_others_running(engine):
    """A numpy field refused at submission (a float array of stop ids) is that request's error
    alone: the run's others end as a plain greedy loop has them."""
    good = prompts(2, 5, 8, seed=91)
    done, _ = engine.run([Request(prompt=good[0], max_new_tokens=3),
                          Request(prompt=[1, 2], stop_token_ids=np.array([1.0, 2.0])),
                          Request(prompt=good[1], max_new_tokens=3)])
    assert [c.finish_reason for c in done] == ["length", "error", "length"]
    assert "stop_token_ids must hold integer token ids, not a float64 array" in done[1].error
    assert [done[0].tokens, done[2].tokens] == [reference_greedy(engine.model, p, 3) for p in good]
