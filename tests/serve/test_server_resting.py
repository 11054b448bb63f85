"""A server after many requests of every kind holds what it held at rest: what benchmarks/soak.py
looked for over thousands of requests (per-request state never dropped), here over a few hundred on
the tiny model, asserted on the structures themselves rather than on the process's memory."""

import http.client
import json
import random
import socket
import time
from concurrent.futures import ThreadPoolExecutor

from linnet.serve import Engine
from linnet.serve.server import OpenAIServer

from .conftest import TEMPLATE, make_model, running
from .test_engine import word_tokenizer

KEPT = 4  # the server's --stored-responses: fewer than the Responses stored below


def post(port: int, path: str, body, stream: bool = False, leave_after: int | None = None,
         timeout: float = 60) -> int:
    """The status; 0 where the client left on purpose: after `leave_after` streamed events, or
    after `timeout` seconds without the reply."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body if isinstance(body, bytes) else json.dumps(body).encode(),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if not (stream and leave_after) or resp.status != 200:
            resp.read()
            return resp.status
        events = 0
        for line in resp:
            events += line.startswith(b"data: ")
            if events >= leave_after:
                return 0
        return resp.status
    except (socket.timeout, TimeoutError):
        return 0
    finally:
        conn.close()


def one(port: int, rng: random.Random, i: int) -> tuple:
    words = " ".join(f"t{rng.randrange(5, 60)}" for _ in range(rng.randint(2, 12)))
    chat = [{"role": "user", "content": words}]
    kinds = [
        ("/v1/completions", {"prompt": words, "max_tokens": 4, "n": 2, "logprobs": 2, "seed": i}, False, None),
        ("/v1/completions", {"prompt": words, "max_tokens": 6, "stream": True, "stop": ["t7"],
                             "stream_options": {"include_usage": True}}, True, None),
        ("/v1/chat/completions", {"messages": chat, "max_tokens": 5, "logprobs": True, "top_logprobs": 2,
                                  "presence_penalty": 0.5, "temperature": 0.9}, False, None),
        ("/v1/chat/completions", {"messages": chat, "max_tokens": 75, "stream": True, "ignore_eos": True},
         True, 2),  # a client that leaves mid-stream
        ("/v1/responses", {"input": words, "max_output_tokens": 3, "store": i // 8 % 2 == 0}, False, None),
        ("/v1/completions", {"prompt": words, "max_tokens": 4, "echo": True, "logprobs": 1}, False, None),
        ("/v1/chat/completions", b'{"messages": [', False, None),  # bad JSON
        ("/v1/completions", {"prompt": words, "max_tokens": "four"}, False, None),  # a wrong type
    ]
    path, body, stream, leave = kinds[i % len(kinds)]
    return path, post(port, path, body, stream, leave)


def test_many_requests_of_every_kind_leave_the_server_as_at_rest():
    model = make_model("torch", rows=4, max_seq=96)
    model.tokenizer = word_tokenizer(model.vocab)
    model.tokenizer.chat_template = TEMPLATE
    engine = Engine(model)
    app = OpenAIServer(engine, "tiny", stored_responses=KEPT)
    with running(engine, app=app) as base:
        port = int(base.rsplit(":", 1)[1])
        rng = random.Random(0)
        with ThreadPoolExecutor(8) as pool:  # more at once than the 4 rows: some wait for a row
            statuses = list(pool.map(lambda i: one(port, rng, i), range(240)))
        # a client that gave up before the reply (its request cancelled), a few times
        for _ in range(6):
            assert post(port, "/v1/completions", {"prompt": "t5 t6", "max_tokens": 90, "ignore_eos": True},
                        timeout=0.05) in (0, 200)  # (200: it ended first)
        deadline = time.time() + 30
        while (engine.in_flight or engine.live or engine.waiting) and time.time() < deadline:
            time.sleep(0.01)  # (the last cancels reach the engine with the disconnects)
        kept = dict(app.responses.kept)
    by_kind = {}
    for path, status in statuses:
        by_kind.setdefault(path, set()).add(status)
    assert by_kind == {"/v1/completions": {200, 400}, "/v1/chat/completions": {200, 0, 400},
                       "/v1/responses": {200}}, by_kind
    assert engine.in_flight == {} and engine.cancelled == {} and engine.live == [] and engine.waiting == []
    assert engine._news == {} and sorted(engine.free_rows) == list(range(engine.rows))
    assert len(kept) == KEPT  # the newest KEPT of the 15 stored (store: true)
    assert engine.stats.finished.get("cancelled", 0) > 0  # (those that left before their request ended)
