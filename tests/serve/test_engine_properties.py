"""The engine's one promise, on random loads (hypothesis): whatever shares the batch (how many
requests, their lengths, shared prompts and prefixes, how the token budget cuts prompts into
chunks, penalties, biases, allowed tokens, stop tokens and min_tokens), each request's tokens are the ones it gets alone: greedy ones as
a plain prefill-then-decode loop with no engine gives them, seeded draws as the same request
alone in the engine."""

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.serve import Engine, Request

from .conftest import make_model
from .test_engine import reference_greedy

ROWS, MAX_SEQ, VOCAB = 4, 96, 128


@pytest.fixture(scope="module", params=["torch", "torch-replayed", "jax"])
def model(request):
    """Each backend; torch also with its decode step captured and replayed."""
    if request.param == "torch-replayed":
        return make_model("torch", rows=ROWS, max_seq=MAX_SEQ, numerics="fast", compile=True)
    return make_model(request.param, rows=ROWS, max_seq=MAX_SEQ)


@st.composite
def loads(draw):
    """Requests over a few base prompts, so that some are equal and some share long prefixes."""
    rng = random.Random(draw(st.integers(0, 2**16)))
    bases = [[rng.randrange(1, VOCAB) for _ in range(70)] for _ in range(3)]
    requests = []
    for _ in range(draw(st.integers(1, 9))):
        base, cut = draw(st.sampled_from(bases)), draw(st.integers(1, 70))
        tail = draw(st.lists(st.integers(1, VOCAB - 1), max_size=3))
        prompt = (base[:cut] + tail)[:MAX_SEQ - 10]
        sampled, new = draw(st.booleans()), draw(st.integers(1, 8))
        requests.append(Request(
            prompt=prompt, max_new_tokens=new, min_tokens=draw(st.integers(0, new)),
            logit_bias=draw(st.none() | st.dictionaries(st.integers(1, VOCAB - 1), st.sampled_from([-100.0, 5.0]),
                                                        max_size=2)),
            presence_penalty=draw(st.sampled_from([0.0, 0.5])),
            allowed_token_ids=draw(st.none() | st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=6,
                                                        unique=True)),
            temperature=1.0 if sampled else 0.0, seed=draw(st.integers(0, 3)) if sampled else None,
            top_k=draw(st.sampled_from([0, 5])) if sampled else 0,
            repetition_penalty=draw(st.sampled_from([1.0, 1.3])),
            stop_token_ids=draw(st.lists(st.integers(1, VOCAB - 1), max_size=4))))
    budget = draw(st.sampled_from([16, 24, 40, 128, 512]))
    return requests, budget, draw(st.sampled_from([8, 64]))


def alone(model, req: Request) -> list:
    """The request's tokens with nothing else in the engine; greedy ones without an engine at all."""
    plain = Request(prompt=req.prompt, max_new_tokens=req.max_new_tokens, id=req.id)
    if dataclasses.replace(req, min_tokens=0 if not req.stop_token_ids else req.min_tokens) == plain:
        return reference_greedy(model, req.prompt, req.max_new_tokens)
    model.reset()
    done, _ = Engine(model).run([dataclasses.replace(req, id=req.id + "-alone")])
    return done[0].tokens


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(load=loads())
def test_each_request_gets_the_tokens_it_gets_alone(model, load):
    requests, budget, prefix_min = load
    model.reset()
    engine = Engine(model, token_budget=max(budget, engine_floor(model)), prefix_min=prefix_min)
    done, stats = engine.run(requests)
    assert [c.request.id for c in done] == [r.id for r in requests]
    for req, comp in zip(requests, done):
        if comp.finish_reason == "error":  # allowed tokens that all end it, kept out by min_tokens: refused
            assert "nothing could be drawn" in comp.error and set(req.allowed_token_ids) <= set(req.stop_token_ids)
            continue
        assert comp.tokens == alone(model, req), req
        assert req.allowed_token_ids is None or set(comp.tokens) <= set(req.allowed_token_ids)
        assert comp.finish_reason == ("stop" if comp.tokens[-1:] and comp.tokens[-1] in req.stop_token_ids
                                      else "length")
    ran = [r for r, c in zip(requests, done) if c.finish_reason != "error"]
    assert stats.prefill_tokens + stats.copied_tokens == sum(len(r.prompt) for r in ran)


def engine_floor(model) -> int:
    """The smallest token budget the engine takes for this model's rows."""
    from linnet.serve.runners import make_runner

    return make_runner(model).overhead + 2 * model.batch


@st.composite
def schedules(draw):
    """Greedy requests over one base prompt (equal prompts, shared prefixes, some filling a cache
    row to MaxSeq exactly), each submitted at a random step while others run; some cancelled at
    a random step from their submission on (queued, mid chunked prefill, mid decode, or after they
    ended), some of those twice."""
    rng = random.Random(draw(st.integers(0, 2**16)))
    base = [rng.randrange(1, VOCAB) for _ in range(MAX_SEQ)]
    events = []
    for _ in range(draw(st.integers(1, 6))):
        new = draw(st.integers(1, 6))
        cut = MAX_SEQ - new if draw(st.booleans()) and draw(st.booleans()) else draw(st.integers(1, 60))
        req = Request(prompt=base[:cut] + draw(st.lists(st.integers(1, VOCAB - 1), max_size=2 if cut < 60 else 0)),
                      max_new_tokens=new)
        at = draw(st.integers(0, 8))
        cancels = draw(st.sampled_from([(), (0,), (1,), (3,), (6,), (2, 2), (1, 4)]))
        events.append((at, req, [at + c for c in cancels]))
    return events, draw(st.sampled_from([0, 24, 40, 128]))


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(schedule=schedules())
def test_requests_arriving_and_cancelled_at_any_step_get_their_tokens_alone(model, schedule):
    """The server's way in (submit and cancel between steps, not `run`): a request that was not
    cancelled before it ended gets the tokens a plain greedy loop gives it alone; one cancelled
    ends "cancelled" with the first of those; the rows stay each one request's, and the stats
    count what the completions hold."""
    events, budget = schedule
    model.reset()
    engine = Engine(model, token_budget=max(budget, engine_floor(model)), prefix_min=4)
    comps, step = {}, 0
    while step <= max(max([at] + cancels) for at, _, cancels in events) or engine.has_work():
        for at, req, cancels in events:
            if at == step:
                comps[req.id] = engine.submit(req)
            for _ in range(cancels.count(step)):
                engine.cancel(req.id)
        engine.step()
        rows = [x.row for x in engine.live]
        assert sorted(rows + engine.free_rows) == list(range(model.batch))
        step += 1
    for _, req, _ in events:
        comp, alone_tokens = comps[req.id], reference_greedy(model, req.prompt, req.max_new_tokens)
        if comp.finish_reason == "cancelled":
            assert comp.tokens == alone_tokens[:len(comp.tokens)] and len(comp.tokens) < req.max_new_tokens
        else:
            assert (comp.finish_reason, comp.tokens) == ("length", alone_tokens), req
    stats = engine.stats
    assert stats.generated_tokens == sum(len(c.tokens) for c in comps.values())
    assert stats.finished == {reason: sum(c.finish_reason == reason for c in comps.values())
                              for reason in {c.finish_reason for c in comps.values()}}
    assert stats.prompt_tokens == sum(len(req.prompt) for _, req, _ in events)
