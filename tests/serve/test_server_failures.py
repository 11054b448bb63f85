"""Requests that fail partway through the server, over a random tiny model whose tokens are bytes
(test_structured.byte_tokenizer): a choice the client's own fields corner, and a bug of ours met
mid-stream (a tokenizer whose decoder raises), each ending as OpenAI's and vLLM's replies end, the
rows freed for everyone else."""

import json
import logging
import time

import pytest

from linnet.serve import Engine

from .conftest import make_model, running
from .test_server import call, sse
from .test_structured import byte_tokenizer

pytest.importorskip("llguidance")

USER = [{"role": "user", "content": "Say:"}]


def serving(tokenizer_change=None):
    """A fixture's (server's address, engine), a tokenizer_change made to the model's tokenizer first."""
    model = make_model("torch", rows=4, max_seq=128)
    model.tokenizer = byte_tokenizer(model.vocab)
    model.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    if tokenizer_change is not None:
        tokenizer_change(model.tokenizer)
    engine = Engine(model)
    with running(engine) as base:
        yield base, engine


def ids(base, text: str) -> list:
    return json.loads(call(base, "/tokenize", {"prompt": text, "add_special_tokens": False})[1])["tokens"]


def settled(engine) -> dict:
    """The engine's requests ended, by finish reason, once none is in flight (a cancel is taken
    before its next pass)."""
    for _ in range(3000):
        if not engine.live and not engine.waiting:
            return dict(engine.stats.finished)
        time.sleep(0.01)
    raise AssertionError(f"requests still in flight after 30 s: {len(engine.live)} live, {len(engine.waiting)} waiting")


@pytest.fixture(scope="module")
def plain():
    yield from serving()


def test_a_failed_choice_cancels_its_siblings_at_once(plain):
    # n=4 over "no|y" then 60 "a": allowed_token_ids 'n', 'y', 'a' corner a choice that draws "n"
    # (its "o" is not allowed) after one token, while one that draws "y" has 60 tokens to go. The
    # request is the client's 400 either way; its other choices' rows are freed when the first one
    # fails, not held until they end by themselves ("stop" after 61 tokens).
    base, engine = plain
    before = settled(engine)
    body = {"prompt": "Say:", "max_tokens": 80, "temperature": 1.0, "seed": 3, "n": 4,
            "structured_outputs": {"regex": "no|ya{60}"}, "allowed_token_ids": ids(base, "nya")}
    status, text = call(base, "/v1/completions", body)
    assert status == 400 and json.loads(text)["error"]["param"] == "allowed_token_ids"
    after = settled(engine)
    ended = {reason: after.get(reason, 0) - before.get(reason, 0) for reason in after}
    assert ended.get("error", 0) >= 1 and ended.get("cancelled", 0) >= 1, ended  # (seed 3 draws both)
    assert ended["error"] + ended["cancelled"] == 4, ended
    assert call(base, "/v1/completions", {"prompt": "Say:", "max_tokens": 2})[0] == 200


def failing_on_third_token(tokenizer) -> None:
    """A bug of ours, met through a public seam: each incremental decoder (a stream's text) raises on
    the third token pushed to it; whole decodes (the engine's final text) still work."""
    make = tokenizer.incremental_decoder

    def decoder(**options):
        made = make(**options)
        push, pushed = made.push, []

        def failing_push(token):
            pushed.append(token)
            if len(pushed) == 3:
                raise RuntimeError("the decoder broke on its third token")
            return push(token)

        made.push = failing_push
        return made

    tokenizer.incremental_decoder = decoder


@pytest.fixture(scope="module")
def broken():
    yield from serving(failing_on_third_token)


def test_a_bug_mid_stream_sends_a_server_error_then_done(broken):
    # vLLM's streamed failure: an {"error": {...}} data line (a server_error: a client may retry), then
    # [DONE]; the text before it was sent, nothing after; the row is freed, the request cancelled (asked
    # for 100 tokens, past what the engine makes before the cancel reaches it: with 10, a step of about
    # a millisecond finished some first)
    base, engine = broken
    body = {"messages": USER, "max_tokens": 100, "min_tokens": 100, "allowed_token_ids": ids(base, "abc"),
            "stream": True}
    status, text = call(base, "/v1/chat/completions", body)
    assert status == 200
    chunks = sse(text)  # (ends with [DONE])
    error = chunks[-1]
    assert set(error) == {"error"} and error["error"]["type"] == "server_error", error
    assert "third token" in error["error"]["message"]
    assert all("choices" in c for c in chunks[:-1])
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])  # two tokens' text went
    assert settled(engine).get("cancelled", 0) >= 1 and not engine.live


def test_a_bug_mid_response_stream_fails_it_carrying_the_items_sent(broken):
    # the Responses API's failure (OpenAI's streaming reference): a typed "error" event, then
    # "response.failed" with its error; the message item already begun is closed as far as it got
    # and carried in the failed Response's output, as OpenAI's is; it is not kept
    base, engine = broken
    body = {"input": "Say:", "max_output_tokens": 10, "min_tokens": 10, "allowed_token_ids": ids(base, "abc"),
            "stream": True}
    status, text = call(base, "/v1/responses", body)
    assert status == 200
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    names = [line[7:] for line in text.splitlines() if line.startswith("event: ")]
    assert names == [e["type"] for e in events] and [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["error", "response.failed"], kinds
    assert events[-2]["code"] is None and "third token" in events[-2]["message"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    sent = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert sent
    [item] = failed["output"]
    assert item["type"] == "message" and item["status"] == "incomplete" and item["content"][0]["text"] == sent
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == [item]
    assert call(base, f"/v1/responses/{failed['id']}")[0] == 404


def failing_to_decode(tokenizer) -> None:
    """A bug of ours met before a reply's first token: every decode raises (the engine's final text,
    and the context an incremental decoder starts from)."""
    def decode(*args, **kwargs):
        raise RuntimeError("the decoder broke at once")

    tokenizer.decode = decode


def logged_bug(caplog, logger: str) -> bool:
    """Whether `logger` logged the decoder's error with its traceback."""
    return any(r.name == logger and r.exc_info and "decoder broke" in str(r.exc_info[1]) for r in caplog.records)


@pytest.fixture(scope="module")
def undecodable():
    yield from serving(failing_to_decode)


def test_a_bug_before_the_first_token_is_the_same_server_error_streamed_or_not(undecodable, caplog):
    # vLLM's and OpenAI's shape either way: {"error": {message, type, param, code}}, a server_error a
    # client may retry; unstreamed as a 500, streamed as the stream's one event before [DONE] (its 200
    # already sent, never a dropped connection); each request's row freed; the traceback in the
    # server's log each time (the engine's pass, then the stream's writer)
    base, engine = undecodable
    body = {"messages": USER, "max_tokens": 4}
    caplog.set_level(logging.ERROR, logger="linnet.serve")
    status, text = call(base, "/v1/chat/completions", body)
    plain = json.loads(text)
    assert status == 500 and "decoder broke" in plain["error"]["message"], text
    assert logged_bug(caplog, "linnet.serve.engine")
    status, text = call(base, "/v1/chat/completions", dict(body, stream=True))
    assert logged_bug(caplog, "linnet.serve.server")
    assert status == 200 and text.endswith("data: [DONE]\n\n"), text
    [streamed] = sse(text)
    assert "decoder broke" in streamed["error"]["message"], streamed
    for error in plain["error"], streamed["error"]:
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["param"], error["code"]) == ("server_error", None, None), error
    settled(engine)
    assert not engine.live and call(base, "/v1/models")[0] == 200
