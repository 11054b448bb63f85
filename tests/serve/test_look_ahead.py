"""Decode steps dispatched ahead (`Engine._look_ahead`): step t + 1 goes out from step t's draws,
still on the device, before the host reads them. Whatever ends, frees or joins meanwhile, every
request gets the tokens it gets alone, with the engine reading each step before the next.

JAX runs ahead on every device; torch only on CUDA, so here the torch runner is told to, which
runs the CUDA path's Python (tokens fed from a `Pending`) on the CPU.
"""

import random

import pytest

from linnet.serve import Engine, Request
from linnet.serve.runners import Pending
from tests.serve.conftest import make_model


@pytest.fixture(scope="module", params=["torch", "jax"])
def model(request):
    return make_model(request.param, rows=4)


def engine_for(model, ahead: bool) -> Engine:
    engine = Engine(model, token_budget=64)
    engine.runner.looks_ahead = ahead
    return engine


def alone(model, req: Request) -> list:
    """The request's tokens with nothing else in flight and no step dispatched ahead."""
    model.reset()
    done, _ = engine_for(model, False).run([Request(**vars(req) | {"id": req.id + "-alone"})])
    return done[0].tokens


def spied_engine(model):
    """An engine that runs ahead, and a list telling, for each decode step, whether its tokens
    came from the previous step's draws on the device."""
    engine = engine_for(model, True)
    fed = []
    decode_sample = engine.runner.decode_sample

    def spy(tokens, *args, **kwargs):
        fed.append(isinstance(tokens, Pending))
        return decode_sample(tokens, *args, **kwargs)
    engine.runner.decode_sample = spy
    return engine, fed


def mixed_requests(model, n: int) -> list:
    """Greedy and seeded requests, of 1 to 9 new tokens, some ending on a stop token they draw."""
    rng = random.Random(5)
    reqs = []
    for i in range(n):
        prompt = [rng.randrange(1, model.vocab) for _ in range(rng.randint(3, 20))]
        sampled = i % 3 == 1
        reqs.append(Request(prompt=prompt, max_new_tokens=rng.randint(1, 9), temperature=0.9 if sampled else 0.0,
                            top_k=20 if sampled else 0, seed=100 + i if sampled else None,
                            logprobs=2 if i % 4 == 0 else None))
    for req in reqs[::2]:  # stop on the token it draws third, whichever that is
        tokens = alone(model, req)
        if len(tokens) >= 3:
            req.stop_token_ids = [tokens[2]]
    return reqs


def test_requests_ending_freeing_and_joining_get_their_tokens_alone(model):
    reqs = mixed_requests(model, 14)
    want = [alone(model, r) for r in reqs]
    model.reset()
    engine, fed = spied_engine(model)
    done, stats = engine.run(reqs)
    assert [c.tokens for c in done] == want
    for c, r in zip(done, reqs):
        assert c.finish_reason == ("stop" if r.stop_token_ids and c.tokens[-1] in r.stop_token_ids else "length")
        if r.logprobs:
            assert [lp.token for lp in c.logprobs] == c.tokens
    assert any(fed), "no decode step was fed from the previous step's draws"
    assert stats.generated_tokens == sum(len(w) for w in want)
    assert len(engine.free_rows) == model.batch


def test_penalties_keep_each_step_read_before_the_next(model):
    # the host counts output tokens into the penalties: such a batch's draws never run ahead (JAX
    # sends the next decode alone, before the step is read: `test_a_decode_sent_ahead_alone...`)
    rng = random.Random(8)
    reqs = [Request(prompt=[rng.randrange(1, model.vocab) for _ in range(6)], max_new_tokens=6,
                    repetition_penalty=1.5 if i == 0 else 1.0, frequency_penalty=0.5 if i == 1 else 0.0)
            for i in range(3)]
    want = [alone(model, r) for r in reqs]
    model.reset()
    engine, fed = spied_engine(model)
    done, _ = engine.run(reqs)
    assert [c.tokens for c in done] == want
    assert not any(fed)


def test_a_decode_sent_ahead_alone_draws_as_each_step_read_first(model):
    """JAX: where penalties or min_tokens keep a batch's draws waiting on the host's counts, the
    next decode goes out alone from the step's draws on the device, before the host reads them,
    and its draw after: whatever ends (length, stop token), frees or joins meanwhile, each request
    gets the tokens it gets alone, read step by step."""
    if not hasattr(Engine(model, token_budget=64).runner, "decode_alone"):
        pytest.skip("JAX's runner sends a decode alone (torch's draw follows its step's replay)")
    reqs = mixed_requests(model, 10)
    for i, req in enumerate(reqs):
        if i % 3 == 0:
            req.repetition_penalty, req.presence_penalty = 1.4, 0.3
        elif i % 3 == 1:
            req.frequency_penalty, req.min_tokens = 0.5, min(2, req.max_new_tokens)
    want = [alone(model, r) for r in reqs]
    model.reset()
    engine = engine_for(model, True)
    fed, sampling = [], [False]  # (whether each decode alone took a Pending, whether decode_sample sent it)
    decode_alone, decode_sample = engine.runner.decode_alone, engine.runner.decode_sample

    def spy(tokens, positions):
        fed.append((isinstance(tokens, Pending), sampling[0]))
        return decode_alone(tokens, positions)

    def step_spy(*args, **kwargs):  # a penalized step the host has read goes alone too, from host tokens
        sampling[0] = True
        try:
            return decode_sample(*args, **kwargs)
        finally:
            sampling[0] = False
    engine.runner.decode_alone, engine.runner.decode_sample = spy, step_spy
    done, stats = engine.run(reqs)
    assert [c.tokens for c in done] == want
    assert any(ahead for ahead, _ in fed), "no decode went out alone from the previous step's draws"
    assert all(ahead or sent for ahead, sent in fed)
    assert stats.generated_tokens == sum(len(w) for w in want) and len(engine.free_rows) == model.batch


def test_a_request_cancelled_while_a_step_is_ahead_frees_its_row(model):
    rng = random.Random(3)
    reqs = [Request(prompt=[rng.randrange(1, model.vocab) for _ in range(8)], max_new_tokens=10) for _ in range(3)]
    want = [alone(model, r) for r in reqs]
    model.reset()
    engine = engine_for(model, True)
    comps = [engine.submit(r) for r in reqs]
    for _ in range(4):
        engine.step()
    assert engine._ahead is not None
    engine.cancel(comps[1].id)
    while engine.has_work():
        engine.step()
    assert comps[1].finish_reason == "cancelled" and comps[1].tokens == want[1][:len(comps[1].tokens)]
    assert [comps[0].tokens, comps[2].tokens] == [want[0], want[2]]
    assert len(engine.free_rows) == model.batch
