"""The engine's Python API at its edges: request ids (one a request in flight, as vLLM has them),
stop() with streams open, prompts as numpy arrays, and the samples a hand-stepped engine keeps.
Tokens are checked against a plain greedy loop over the model's entries (`reference_greedy`)."""

import asyncio
import dataclasses
import gc
import threading

import numpy as np
import pytest

from linnet.serve import Engine, Request, RequestError
from linnet.serve import engine as engine_module
from tests.serve.conftest import make_model
from tests.serve.test_engine import prompts, reference_greedy, word_tokenizer
from tests.serve.test_server import held_prefill


@pytest.fixture(scope="module", params=["torch", "jax"])
def model(request):
    # JAX's runner looks ahead (a decode step out before the last is read): stop() and cancel() meet one there
    return make_model(request.param)


def test_an_id_in_flight_is_refused_and_the_request_running_goes_on(model):
    """vLLM refuses a request whose id is in flight; so does submit: the same Request object again,
    or another with its id. The one in flight is untouched, and its id is free once it has ended."""
    p, q = prompts(2, 6, 9, seed=71)
    engine = Engine(model)
    first = Request(prompt=p, max_new_tokens=6)
    comp = engine.submit(first)
    engine.step()
    for again in (first, Request(prompt=q, max_new_tokens=3, id=first.id)):
        with pytest.raises(RequestError, match=f"{first.id}: a request with this id is already in flight") as err:
            engine.submit(again)
        assert err.value.field == "id"
    while engine.has_work():
        engine.step()
    assert (comp.finish_reason, comp.tokens) == ("length", reference_greedy(model, p, 6))
    assert engine.stats.finished == {"length": 1} and engine.stats.prompt_tokens == len(p)  # the refused: nothing
    again = engine.submit(first)  # ended: its id may be used again
    while engine.has_work():
        engine.step()
    assert again is not comp and (again.finish_reason, again.tokens) == ("length", reference_greedy(model, p, 6))


def test_cancel_stops_the_request_in_flight_then_not_a_later_one_with_its_id(model):
    """cancel(id) ends the request in flight under that id; an id not in flight is ignored (as
    vLLM's abort): the request submitted after it under the same id runs to its end."""
    p = prompts(1, 6, 9, seed=72)[0]
    engine = Engine(model)
    req = Request(prompt=p, max_new_tokens=8)
    comp = engine.submit(req)
    engine.step()
    engine.cancel(req.id)
    engine.step()
    assert comp.finish_reason == "cancelled" and len(engine.free_rows) == model.batch
    engine.cancel(req.id)  # ended: nothing to cancel
    engine.cancel("no-such-request")
    later = engine.submit(req)
    while engine.has_work():
        engine.step()
    assert (later.finish_reason, later.tokens) == ("length", reference_greedy(model, p, 8))
    assert engine.stats.finished == {"cancelled": 1, "length": 1}


def test_a_cancelled_request_has_the_text_of_its_tokens(model):
    """As a request that ends otherwise (and as vLLM's aborted output): the text of the tokens it
    got, which was None."""
    p = prompts(1, 6, 9, seed=77)[0]
    model.tokenizer = word_tokenizer(model.vocab)
    try:
        engine = Engine(model)
        comp = engine.submit(Request(prompt=p, max_new_tokens=8))
        queued = engine.submit(Request(prompt=p, max_new_tokens=8))
        engine.cancel(queued.id)  # before any step: it never had a row
        for _ in range(3):
            engine.step()
        engine.cancel(comp.id)
        engine.step()
    finally:
        model.tokenizer = None
    assert comp.finish_reason == "cancelled" and 0 < len(comp.tokens) < 8
    assert comp.tokens == reference_greedy(model, p, 8)[:len(comp.tokens)]
    assert comp.text.split() == [f"t{t}" for t in comp.tokens]
    assert (queued.finish_reason, queued.tokens, queued.text) == ("cancelled", [], "")


def test_run_given_a_request_n_times_runs_it_n_times(model):
    """run([req] * n), as vLLM's LLM.generate([prompt] * n): n requests, each on its own, the
    later under the id and "#2", "#3"; two requests with one explicit id alike."""
    p, q = prompts(2, 5, 9, seed=73)
    req = Request(prompt=p, max_new_tokens=5)
    done, stats = Engine(model).run([req] * 3)
    assert [c.id for c in done] == [req.id, f"{req.id}#2", f"{req.id}#3"]
    assert done[0].request is req and [dataclasses.replace(c.request, id=req.id) for c in done[1:]] == [req] * 2
    assert [(c.finish_reason, c.tokens) for c in done] == [("length", reference_greedy(model, p, 5))] * 3
    assert stats.generated_tokens == 15 and stats.finished == {"length": 3}

    given = [Request(prompt=p, max_new_tokens=4, id="x"), Request(prompt=q, max_new_tokens=4, id="x#2"),
             Request(prompt=q, max_new_tokens=4, id="x")]
    done, _ = Engine(model).run(given)
    assert [c.id for c in done] == ["x", "x#2", "x#3"]
    assert [c.tokens for c in done] == [reference_greedy(model, x, 4) for x in (p, q, q)]


def test_run_refuses_what_is_no_request_up_front(model):
    engine = Engine(model)
    with pytest.raises(TypeError, match="run takes a list of linnet.serve.Request, not one holding a dict"):
        engine.run([Request(prompt=[1, 2]), {"prompt": [1, 2]}])
    assert not engine.has_work()  # the good one was not left queued
    with pytest.raises(TypeError, match="submit takes a linnet.serve.Request, not dict"):
        engine.submit({"prompt": [1, 2]})
    with pytest.raises(TypeError, match=r"run takes a list of linnet.serve.Request, not one: run\(\[request\]\)"):
        engine.run(Request(prompt=[1, 2]))
    with pytest.raises(TypeError, match=r"warmup takes a list of prompt lengths, not one: warmup\(\[5\]\)"):
        engine.warmup(5)
    with pytest.raises(TypeError, match="warmup takes a list of prompt lengths, not a string: '12'"):
        engine.warmup("12")  # (its characters were read as the lengths: "'1' is no length")
    for given in (None, "smollm2-135m-instruct"):  # (vLLM's LLM takes a model's name)
        with pytest.raises(TypeError, match=r"Engine takes a model that linnet.nest.load gave, not "):
            Engine(given)
    assert not engine.has_work() and not engine.in_flight


def test_run_returns_a_refused_request_with_the_field_at_fault_and_runs_the_rest(model):
    """A request run() cannot submit comes back as the error submit() raises, its field named as
    `Completion.error_field` has it for the client's doing (None is the engine's failure)."""
    p, = prompts(1, 5, 9, seed=11)
    done, stats = Engine(model).run([Request(prompt=[3, 100000], max_new_tokens=2),
                                     Request(prompt=p, max_new_tokens=3)])
    assert (done[0].finish_reason, done[0].error_field) == ("error", "prompt")
    assert "token id 100000 is outside the vocabulary" in done[0].error
    assert (done[1].finish_reason, done[1].tokens) == ("length", reference_greedy(model, p, 3))
    assert stats.finished == {"error": 1, "length": 1}


def test_stop_ends_open_streams_with_an_error(model):
    """Engine.stop() with streams open (a server shutting down): each ends, with finish_reason
    "error" and the engine's reason, as vLLM's abort ends a request; before, each waited for a
    start() that might never come. Those queued without a row end too. What each got is the start
    of a plain greedy loop's tokens, and the engine runs on afterwards from rows it can reuse."""
    ps = prompts(model.batch + 3, 6, 10, seed=74)  # more than the rows: some wait in the queue
    engine = Engine(model)
    engine.warmup([10])

    async def main():
        streams = [engine.stream(Request(prompt=p, max_new_tokens=60)) for p in ps]
        iterators = [s.__aiter__() for s in streams]
        new, reason = await asyncio.wait_for(iterators[0].__anext__(), 60)  # the engine is under way
        assert new and reason is None
        engine.stop()

        async def rest(it):
            return [item async for item in it]
        ends = await asyncio.wait_for(asyncio.gather(*(rest(it) for it in iterators)), 10)  # none hangs
        return streams, [e[-1][1] for e in ends]

    engine.start()
    streams, reasons = asyncio.run(main())
    assert reasons == ["error"] * len(ps)
    for p, s in zip(ps, streams):
        c = s.completion
        assert (c.finish_reason, c.error) == ("error", engine_module.STOPPED)
        assert len(c.tokens) < 60 and (not c.tokens or c.tokens == reference_greedy(model, p, len(c.tokens)))
    assert any(not s.completion.tokens for s in streams)  # those still queued
    assert engine.stats.finished == {"error": len(ps)} and not engine.has_work() and not engine.in_flight
    assert sorted(engine.free_rows) == list(range(model.batch))
    done, _ = engine.run([Request(prompt=ps[0], max_new_tokens=5)])
    assert done[0].tokens == reference_greedy(model, ps[0], 5)


@pytest.mark.parametrize("kind", ["int64 array", "int32 array", "uint16 array", "tuple", "list of numpy ints"])
def test_a_prompt_as_a_numpy_array_or_tuple_runs_as_a_list(model, kind):
    """A tokenizer's numpy output as the prompt: the tokens and text a list of ints gives (here
    with a stop string, decoded with the prompt as its context)."""
    p = prompts(1, 8, 8, seed=75)[0]
    make = {"int64 array": lambda: np.array(p), "int32 array": lambda: np.array(p, np.int32),
            "uint16 array": lambda: np.array(p, np.uint16), "tuple": lambda: tuple(p),
            "list of numpy ints": lambda: [np.int64(t) for t in p]}[kind]
    ref = reference_greedy(model, p, 8)
    model.tokenizer = word_tokenizer(model.vocab)
    try:
        (as_list,), _ = Engine(model).run([Request(prompt=p, max_new_tokens=8, stop=[f"t{ref[5]}"])])
        done, stats = Engine(model).run([Request(prompt=make(), max_new_tokens=8, stop=[f"t{ref[5]}"])])
    finally:
        model.tokenizer = None
    assert as_list.finish_reason == "stop" and as_list.tokens == ref[:len(as_list.tokens)]
    assert (done[0].finish_reason, done[0].tokens, done[0].text) == ("stop", as_list.tokens, as_list.text)
    assert stats.prompt_tokens == len(p)


@pytest.mark.parametrize("prompt, needle", [
    (np.array([1.0, 2.0]), "the prompt must hold integer token ids, not a float64 array"),
    (np.array([True, False]), "the prompt must hold integer token ids, not a bool array"),
    (np.array([[1, 2, 3]]), r"the prompt must be a list of token ids \(a 1-D array\), not an array of shape \(1, 3\)"),
    (np.array(3), r"not an array of shape \(\)"),
    (np.array([], np.int64), "the prompt is empty"),
    (np.array([3, 100000]), r"token id 100000 is outside the vocabulary \[0, 128\)"),
    ([1, 2.0], "token id 2.0 is not an integer"), ([True], "token id True is not an integer"),
])
def test_a_prompt_of_other_numbers_or_shapes_is_refused(model, prompt, needle):
    with pytest.raises(RequestError, match=needle) as err:
        Engine(model).submit(Request(prompt=prompt))
    assert err.value.field == "prompt"


def test_latency_quantiles_of_no_samples_are_none_not_zero(model):
    """A run whose requests drew no token (max_new_tokens 0) has no latency: its quantiles are None,
    and /metrics gives Prometheus' NaN for them, not a latency of 0 s."""
    from linnet.serve.metrics import prometheus_text

    engine = Engine(model)
    _, stats = engine.run([Request(prompt=[1, 2, 3], max_new_tokens=0)])
    assert stats.summary()["ttft_s"] == stats.summary()["token_latency_s"] == {"p50": None, "p90": None, "p99": None}
    assert 'linnet_time_to_first_token_seconds{quantile="0.50"} NaN' in prometheus_text(engine)


def test_an_engine_stepped_by_hand_keeps_a_window_of_samples(model, monkeypatch):
    """Stepped by hand (submit, step), as a server's loop steps it, the engine keeps the latest
    SERVING_WINDOW latency samples, not every one (about 100 bytes a request, without end); run()
    keeps its own run's, all of them. The window's samples are the completions' own times."""
    monkeypatch.setattr(engine_module, "SERVING_WINDOW", 3)
    ps = prompts(6, 4, 8, seed=76)
    engine = Engine(model)  # every prompt fits one pass: the first tokens come in submission order
    comps = [engine.submit(Request(prompt=p, max_new_tokens=4)) for p in ps]
    while engine.has_work():
        engine.step()
    ttft = [c.first_token_at - c.submitted_at for c in comps]
    assert list(engine.stats.ttft) == ttft[3:]
    assert list(engine.stats.token_latency) == [c.token_times[-1] - c.token_times[-2] for c in comps[3:]]
    assert len(engine.stats.occupancy) == 3
    assert engine.stats.summary()["ttft_s"]["p50"] == float(np.median(ttft[3:]))
    assert engine.stats.generated_tokens == 24  # counters count everything
    _, stats = engine.run([Request(prompt=p, max_new_tokens=4) for p in ps])
    assert len(stats.ttft) == 6 and len(stats.token_latency) == 6 * 3


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_an_engine_stepped_by_hand_after_its_warmup_counts_no_compile(backend):
    """What a warmup compiles is not the steps' (a server's loop steps by hand): JAX's first reset of a
    model, the warmup's last act, compiles the program that zeroes its cache where it lies, and counts
    as the warmup's. A model of its own: one reset before would have compiled it already."""
    ps = prompts(2, 4, 8, seed=79)
    engine = Engine(make_model(backend, rows=2, max_seq=32))
    engine.warmup(len(p) for p in ps)
    for p in ps:
        engine.submit(Request(prompt=p, max_new_tokens=3))
    while engine.has_work():
        engine.step()
    assert (engine.stats.compiles, engine.stats.compiled) == (0, [])


def test_a_stream_outside_a_coroutine_says_how_to_run_the_request(model):
    engine = Engine(model)
    with pytest.raises(RuntimeError, match=r"Engine.stream\(\) is called from a coroutine.*submit\(\) the request"):
        engine.stream(Request(prompt=[1, 2]))
    assert not engine.has_work() and not engine.in_flight  # nothing left queued


def test_a_warmup_is_refused_while_requests_hold_rows_and_queued_ones_run_after_it(model):
    """A warmup empties the cache (`model.reset()`): a request holding a row went on from a row
    without its tokens, and drew other tokens than a plain greedy loop's, silently. Now the warmup
    is refused, and the request ends as the loop has it; one queued without a row runs after one."""
    p, q = prompts(2, 6, 9, seed=78)
    engine = Engine(model)
    held = engine.submit(Request(prompt=p, max_new_tokens=8))
    engine.step()
    engine.step()
    with pytest.raises(RuntimeError, match=r"Engine.warmup\(\) while 1 request\(s\) hold cache rows"):
        engine.warmup([4])
    while engine.has_work():
        engine.step()
    queued = engine.submit(Request(prompt=q, max_new_tokens=8))
    engine.warmup([4])
    while engine.has_work():
        engine.step()
    assert [(c.finish_reason, c.tokens) for c in (held, queued)] == [("length", reference_greedy(model, x, 8))
                                                                    for x in (p, q)]


def test_requests_submitted_before_a_run_run_with_it_and_its_stats_count_them_whole(model):
    """They end in the run, and its stats count their generated tokens and ends: their prompt
    tokens too (counted at submission, before the run's stats began, they were left out)."""
    p, q = prompts(2, 5, 9, seed=79)
    engine = Engine(model)
    before = engine.submit(Request(prompt=p, max_new_tokens=4))
    done, stats = engine.run([Request(prompt=q, max_new_tokens=3)])
    assert [(c.finish_reason, c.tokens) for c in (before, done[0])] == [("length", reference_greedy(model, p, 4)),
                                                                       ("length", reference_greedy(model, q, 3))]
    assert (stats.prompt_tokens, stats.generated_tokens, stats.finished) == (len(p) + len(q), 7, {"length": 2})


def test_a_stream_starts_the_background_loop_itself(model):
    """An asyncio caller, as one of vLLM's AsyncLLMEngine, streams without starting a loop by
    hand: the first stream() starts it (its tokens waited for ever before), and its tokens are a
    plain greedy loop's. A request refused at submission starts nothing."""
    p = prompts(1, 6, 9, seed=80)[0]
    engine = Engine(model)

    async def main():
        with pytest.raises(RequestError):
            engine.stream(Request(prompt=[]))
        assert not engine.running
        stream = engine.stream(Request(prompt=p, max_new_tokens=6))
        return await asyncio.wait_for(_drain(stream), 30)

    try:
        got = asyncio.run(main())
        assert engine.running
    finally:
        engine.stop()
    assert not engine.running
    assert got == (reference_greedy(model, p, 6), "length")


def test_a_stream_left_early_frees_its_row_and_is_iterated_once(model):
    """A consumer that breaks out after its first tokens: its request is cancelled (the iterator's
    close, on the event loop's next turn) and its row freed by the next step; a request queued
    for want of a row then runs, to a plain greedy loop's tokens. Iterating the stream again is
    refused (it waited for ever on the queue the first iteration had emptied)."""
    ps = prompts(model.batch + 1, 6, 9, seed=81)
    engine = Engine(model)

    async def main():
        streams = [engine.stream(Request(prompt=p, max_new_tokens=60)) for p in ps[:-1]]
        queued = engine.stream(Request(prompt=ps[-1], max_new_tokens=4))  # every row is taken
        async for new, reason in streams[0]:
            assert new and reason is None
            break
        with pytest.raises(RuntimeError, match="a stream is iterated once"):
            async for _ in streams[0]:
                pass
        last = await asyncio.wait_for(_drain(queued), 30)  # it had a row only once the first's was freed
        for s in streams[1:]:
            engine.cancel(s.completion.id)
        return streams[0].completion, last

    try:
        left, last = asyncio.run(main())
    finally:
        engine.stop()
    assert left.finish_reason == "cancelled" and 0 < len(left.tokens) < 60
    assert left.tokens == reference_greedy(model, ps[0], 60)[:len(left.tokens)]
    assert last == (reference_greedy(model, ps[-1], 4), "length")


def test_two_event_loops_streaming_from_one_engine(model):
    """Two threads, each with its own event loop, streaming at once from one engine that nobody
    started: one background loop steps it (two would step one cache), and each stream hears its
    own tokens, a plain greedy loop's."""
    import threading

    ps = prompts(2, 6, 9, seed=82)
    engine = Engine(model)
    both = threading.Barrier(2)
    got = {}

    def consumer(i):
        async def main():
            both.wait()
            return await asyncio.wait_for(_drain(engine.stream(Request(prompt=ps[i], max_new_tokens=8))), 30)
        got[i] = asyncio.run(main())

    threads = [threading.Thread(target=consumer, args=(i,)) for i in range(2)]
    before = set(threading.enumerate())
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert [t for t in set(threading.enumerate()) - before if t.name == "linnet-engine"] == [engine._thread]
    finally:
        engine.stop()
    assert [got[i] for i in range(2)] == [(reference_greedy(model, p, 8), "length") for p in ps]


async def _drain(stream) -> tuple:
    """A stream's tokens, gathered as they come, and its finish reason."""
    tokens, reason = [], None
    async for new, reason in stream:
        tokens += new
    return tokens, reason


def test_stop_twice_then_submit_or_stream_serves_anew(model):
    """vLLM's AsyncLLMEngine starts its loop again on the request after a shutdown: so does a
    stream() after stop() (twice, the second a no-op), and a request submitted after stop() runs
    when stepped by hand. Each, a plain greedy loop's tokens."""
    p, q = prompts(2, 6, 9, seed=83)
    engine = Engine(model)
    engine.start()
    engine.stop()
    engine.stop()
    assert not engine.running and not engine.has_work()
    comp = engine.submit(Request(prompt=p, max_new_tokens=5))
    while engine.has_work():
        engine.step()

    async def main():
        return await asyncio.wait_for(_drain(engine.stream(Request(prompt=q, max_new_tokens=5))), 30)

    try:
        streamed = asyncio.run(main())
    finally:
        engine.stop()
    assert (comp.finish_reason, comp.tokens) == ("length", reference_greedy(model, p, 5))
    assert streamed == (reference_greedy(model, q, 5), "length")


def test_a_stream_dropped_unread_is_cancelled(model):
    """A stream made and dropped without being iterated (its consumer gone before reading): its
    request is cancelled, as one left early, and its row goes to the request queued for it. It ran
    to its end before, holding the row."""
    import gc

    ps = prompts(model.batch + 1, 6, 9, seed=84)
    engine = Engine(model)

    async def main():
        kept = [engine.stream(Request(prompt=p, max_new_tokens=60)) for p in ps[1:-1]]
        dropped = engine.stream(Request(prompt=ps[0], max_new_tokens=60))
        comp = dropped.completion
        del dropped
        gc.collect()
        last = await asyncio.wait_for(_drain(engine.stream(Request(prompt=ps[-1], max_new_tokens=4))), 30)
        for s in kept:
            engine.cancel(s.completion.id)
        return comp, last

    try:
        comp, last = asyncio.run(main())
    finally:
        engine.stop()
    assert comp.finish_reason == "cancelled" and len(comp.tokens) < 60
    assert last == (reference_greedy(model, ps[-1], 4), "length")


@pytest.mark.parametrize("listener", [(None, None), "loop", ("loop", "queue", 3)])
def test_a_listener_that_is_no_loop_and_queue_is_refused_at_submission(model, listener):
    """Found only when the step told it, it failed every request in the step."""
    engine = Engine(model)
    with pytest.raises(TypeError, match=r"a listener is an \(event loop, asyncio.Queue\) pair"):
        engine.submit(Request(prompt=[1, 2]), listener=listener)
    assert not engine.has_work() and not engine.in_flight


def test_a_stream_read_on_another_event_loop_is_refused(model):
    """Made in one asyncio.run and read in the next: its tokens are told on the first loop, which
    has closed, and the read waited for ever. It is refused at once; the request, unread, is
    cancelled when the stream goes."""
    engine = Engine(model)
    left, _ = held_prefill(engine)  # (its first pass held until the stream has gone: it could end first)

    async def make():
        return engine.stream(Request(prompt=[3, 4, 5], max_new_tokens=40))

    async def read(stream):
        async for _ in stream:
            pass

    try:
        stream = asyncio.run(make())
        with pytest.raises(RuntimeError, match="a stream is read on the event loop it was made on"):
            asyncio.run(asyncio.wait_for(read(stream), 10))
        comp = stream.completion
        del stream  # (its finalizer cancels the request, whose first pass waits)
        gc.collect()  # (the refused read's exception holds it in a cycle, through its task's frame)
        left.set()
        for _ in range(500):
            if comp.finish_reason is not None:
                break
            threading.Event().wait(0.01)
    finally:
        left.set()
        engine.stop()
    assert comp.finish_reason == "cancelled" and engine.stats.finished == {"cancelled": 1}


def test_a_second_engine_over_a_model_another_engine_serves_is_refused(model):
    """Two engines over one model, both stepping it (a stream to each started both loops): their
    passes mixed in the one cache, and every request's tokens came out wrong, silently. While
    one's loop runs, the other's start, stream, step and run are refused, nothing queued; once it
    stops, the other serves. Each engine's tokens, a plain greedy loop's."""
    p, q = prompts(2, 20, 30, seed=85)
    first, second = Engine(model), Engine(model)

    async def main(engine, prompt):
        return await asyncio.wait_for(_drain(engine.stream(Request(prompt=prompt, max_new_tokens=12))), 30)

    async def stream_to_second():
        second.stream(Request(prompt=q))

    first.start()
    try:
        for call in (second.start, second.step, lambda: second.run([Request(prompt=q)]), lambda: asyncio.run(stream_to_second())):
            with pytest.raises(RuntimeError, match="another Engine's background loop steps this model"):
                call()
        assert not second.running and not second.has_work() and not second.in_flight
        served = asyncio.run(main(first, p))
    finally:
        first.stop()
    try:
        after = asyncio.run(main(second, q))
    finally:
        second.stop()
    assert (served, after) == ((reference_greedy(model, p, 12), "length"), (reference_greedy(model, q, 12), "length"))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # (the dead loop's, raised on)
def test_a_loop_that_dies_ends_its_requests_and_the_next_stream_starts_another(model):
    """The background loop's own error path raising (a pass fails, then so does ending its
    requests: here by hand, nothing fails so on its own) kills the loop's thread. vLLM's
    AsyncLLMEngine then fails its requests as dead: so does this one's, with the loop's error;
    `running` says the loop is gone, and the next stream starts another, to a plain greedy loop's
    tokens (before, `running` stayed True and every later stream waited for ever)."""
    p, q = prompts(2, 6, 9, seed=83)
    engine = Engine(model)
    runner_prefill, end_all = engine.runner.prefill, engine._end_all
    failing = {"end_all": 1}

    def prefill(*args):
        raise RuntimeError("the device went away")

    def end_all_that_fails_once(error):
        if failing["end_all"]:
            failing["end_all"] -= 1
            raise MemoryError("while ending the requests")
        end_all(error)
    engine.runner.prefill, engine._end_all = prefill, end_all_that_fails_once

    async def first():
        return await asyncio.wait_for(_drain(engine.stream(Request(prompt=p, max_new_tokens=4))), 30)

    async def second():
        return await asyncio.wait_for(_drain(engine.stream(Request(prompt=q, max_new_tokens=5))), 30)

    try:
        died = asyncio.run(first())
        engine._thread.join(10)
        assert not engine.running
        engine.runner.prefill = runner_prefill
        served = asyncio.run(second())
        assert engine.running
    finally:
        engine.stop()
    assert died == ([], "error")
    assert served == (reference_greedy(model, q, 5), "length")


def test_while_run_steps_on_another_thread_only_submit_and_cancel_are_taken(model):
    """run() on one thread, paused inside its first pass: stop() from another thread ended run()'s
    requests under it, and start(), step(), warmup(), run() or a stream (on this engine, or a second
    over the same model) stepped the cache beside it; each is refused, nothing queued. A request
    submitted meanwhile runs with run()'s, one cancelled ends; once run() returns, the engine serves
    anew. Tokens: a plain greedy loop's."""
    p, q, r = prompts(3, 6, 12, seed=87)
    engine, second = Engine(model), Engine(model)
    in_pass, go_on = threading.Event(), threading.Event()
    prefill = engine.runner.prefill

    def paused_prefill(*args, **kwargs):
        in_pass.set()
        assert go_on.wait(30)
        return prefill(*args, **kwargs)
    engine.runner.prefill = paused_prefill
    ran = {}
    thread = threading.Thread(target=lambda: ran.update(out=engine.run([Request(prompt=p, max_new_tokens=6)])))
    thread.start()
    try:
        assert in_pass.wait(30)

        async def stream(to):
            to.stream(Request(prompt=q))
        refused = {"stop": engine.stop, "start": engine.start, "step": engine.step, "warmup": lambda: engine.warmup([4]),
                   "run": lambda: engine.run([Request(prompt=q)]), "stream": lambda: asyncio.run(stream(engine))}
        for what, call in refused.items():
            with pytest.raises(RuntimeError, match=rf"Engine\.{what}\(\) while run\(\) steps the engine on another"):
                call()
        for call in (second.start, lambda: second.run([Request(prompt=q)]), lambda: asyncio.run(stream(second))):
            with pytest.raises(RuntimeError, match=r"another Engine's run\(\) steps this model"):
                call()
        assert not engine.running and not second.running and not second.in_flight
        joined = engine.submit(Request(prompt=q, max_new_tokens=5))
        dropped = engine.submit(Request(prompt=r, max_new_tokens=5))
        engine.cancel(dropped.request.id)
    finally:
        go_on.set()
        thread.join(60)
    (done,), stats = ran["out"]
    assert (done.tokens, done.finish_reason) == (reference_greedy(model, p, 6), "length")
    assert (joined.tokens, joined.finish_reason) == (reference_greedy(model, q, 5), "length")
    assert dropped.finish_reason == "cancelled"
    assert stats.finished == {"length": 2, "cancelled": 1}
    (after,), _ = second.run([Request(prompt=r, max_new_tokens=4)])
    assert after.tokens == reference_greedy(model, r, 4)
