"""The OpenAI-compatible server over a real socket: responses, streaming, and errors with their statuses."""

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import uvicorn

from linnet.serve import Engine, Request
from linnet.serve.server import OpenAIServer

from .conftest import make_model
from .test_engine import word_tokenizer

TEMPLATE = "{% for m in messages %}t1 {{ m['content'] }} t2 {% endfor %}{% if add_generation_prompt %}t3{% endif %}"


@pytest.fixture(scope="module")
def server():
    model = make_model("torch", rows=4, max_seq=96)
    model.tokenizer = word_tokenizer(model.vocab)
    model.tokenizer.chat_template = TEMPLATE
    engine = Engine(model)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(OpenAIServer(engine, "tiny"), host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(200):
        if srv.started:
            break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", engine, model
    srv.should_exit = True
    thread.join(timeout=10)


def call(base, path, body=None, method=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(base + path, data=data, method=method or ("POST" if data else "GET"),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


_REFERENCE = {}


def engine_greedy(engine, ids, n):
    """The same request through an engine of its own, over a model of its own (same seed, same
    weights): the server's cache rows, which it reuses across requests, are left alone."""
    if "model" not in _REFERENCE:
        _REFERENCE["model"] = make_model("torch", rows=4, max_seq=96)
    done, _ = Engine(_REFERENCE["model"]).run([Request(prompt=ids, max_new_tokens=n)])
    return done[0].tokens


def test_models_and_health(server):
    base, _, _ = server
    status, body = call(base, "/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["id"] == "tiny"
    assert call(base, "/health")[0] == 200


def test_completion_matches_the_engine(server):
    base, engine, model = server
    status, body = call(base, "/v1/completions", {"model": "tiny", "prompt": "t5 t6 t7", "max_tokens": 6,
                                                   "temperature": 0})
    assert status == 200
    out = json.loads(body)
    ref = engine_greedy(engine, [5, 6, 7], 6)
    assert out["choices"][0]["text"].split() == [f"t{t}" for t in ref]
    assert out["usage"] == {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9}


def test_streamed_text_equals_the_whole(server):
    base, _, _ = server
    body = {"prompt": [9, 8, 7, 6], "max_tokens": 7, "temperature": 0}
    whole = json.loads(call(base, "/v1/completions", body)[1])["choices"][0]["text"]
    status, text = call(base, "/v1/completions", dict(body, stream=True))
    assert status == 200
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_uses_the_template(server):
    base, engine, _ = server
    status, body = call(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "t40 t41"}],
                                                       "max_tokens": 4, "temperature": 0})
    assert status == 200
    out = json.loads(body)
    ref = engine_greedy(engine, [1, 40, 41, 2, 3], 4)
    assert out["choices"][0]["message"]["content"].split() == [f"t{t}" for t in ref]
    assert out["object"] == "chat.completion"


@pytest.mark.parametrize("path,body,raw,method,status,needle", [
    ("/v1/completions", None, b"{not json", None, 400, "not valid JSON"),
    ("/v1/completions", {"prompt": [1, 2], "max_tokens": 500}, None, None, 400, "context"),
    ("/v1/completions", {"prompt": [1, 99999]}, None, None, 400, "outside the vocabulary"),
    ("/v1/completions", {"prompt": []}, None, None, 400, "prompt"),
    ("/v1/completions", {"prompt": [1], "temperature": "hot"}, None, None, 400, "temperature"),
    ("/v1/completions", {"prompt": [1], "n": 3}, None, None, 400, "n=1"),
    ("/v1/completions", {"model": "gpt-4", "prompt": [1]}, None, None, 404, "does not exist"),
    ("/v1/chat/completions", {"messages": "hi"}, None, None, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, None, None, 400, "role"),
    ("/v1/nothing", {}, None, None, 404, "no route"),
    ("/v1/completions", None, None, "GET", 405, "POST"),
])
def test_bad_requests_get_openai_errors(server, path, body, raw, method, status, needle):
    base, _, _ = server
    got, text = call(base, path, body, method=method, raw=raw)
    assert got == status
    err = json.loads(text)["error"]
    assert needle in err["message"] and err["type"]


def test_concurrent_requests_and_a_bad_one(server):
    base, engine, _ = server
    prompts = [[i + 1, i + 2, i + 3] for i in range(8)]

    def one(i):
        if i == 3:
            return call(base, "/v1/completions", {"prompt": [1, 2], "max_tokens": 1000})
        return call(base, "/v1/completions", {"prompt": prompts[i], "max_tokens": 5, "temperature": 0})

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    assert results[3][0] == 400
    for i, (status, body) in enumerate(results):
        if i != 3:
            assert status == 200
            assert json.loads(body)["choices"][0]["text"].split() == [f"t{t}" for t in engine_greedy(engine, prompts[i], 5)]
