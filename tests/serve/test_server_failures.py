"""Requests that fail partway through the server, over a random tiny model whose tokens are bytes
(test_structured.byte_tokenizer): a choice the client's own fields corner ends as OpenAI's and
vLLM's replies end, the rows freed for everyone else."""

import json
import time

import pytest

from linnet.serve import Engine

from .conftest import make_model, running
from .test_server import call
from .test_structured import byte_tokenizer

pytest.importorskip("llguidance")

USER = [{"role": "user", "content": "Say:"}]


def served(tokenizer_change=None):
    model = make_model("torch", rows=4, max_seq=128)
    model.tokenizer = byte_tokenizer(model.vocab)
    model.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    if tokenizer_change is not None:
        tokenizer_change(model.tokenizer)
    engine = Engine(model)
    return engine, running(engine)


def ids(base, text: str) -> list:
    return json.loads(call(base, "/tokenize", {"prompt": text, "add_special_tokens": False})[1])["tokens"]


def settled(engine) -> dict:
    """The engine's requests ended, by finish reason, once none is in flight (a cancel is taken
    before its next pass)."""
    for _ in range(400):
        if not engine.live and not engine.waiting:
            break
        time.sleep(0.01)
    return dict(engine.stats.finished)


@pytest.fixture(scope="module")
def plain():
    engine, server = served()
    with server as base:
        yield base, engine


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
