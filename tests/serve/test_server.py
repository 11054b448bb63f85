"""The OpenAI-compatible server over a real socket: responses, streaming, and errors with their statuses."""

import asyncio
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from linnet.serve import Engine, Request
from linnet.serve.server import OpenAIServer

from .conftest import make_model


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
    assert call(base, "/health")[0] == 200 and call(base, "/ping")[0] == 200
    # vLLM's /ping takes a POST too (SageMaker's health check), whatever body and content type it sends
    with urllib.request.urlopen(urllib.request.Request(base + "/ping", data=b"", method="POST"), timeout=60) as resp:
        assert resp.status == 200 and json.loads(resp.read()) == {"status": "ok"}
    from linnet import __version__

    assert json.loads(call(base, "/version")[1]) == {"version": __version__}


def test_completion_matches_the_engine(server):
    base, engine, model = server
    status, body = call(base, "/v1/completions", {"model": "tiny", "prompt": "t5 t6 t7", "max_tokens": 6,
                                                   "temperature": 0})
    assert status == 200
    out = json.loads(body)
    ref = engine_greedy(engine, [5, 6, 7], 6)
    assert out["choices"][0]["text"].split() == [f"t{t}" for t in ref]
    assert {k: out["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == \
        {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9}


def test_sampling_fields_take_vllms_ranges(server):
    # wider than OpenAI's: a temperature past 2 and a repetition penalty past 10 run, as vLLM runs them,
    # up to what the step holds
    base, _, _ = server
    for extra in ({"temperature": 3.5}, {"repetition_penalty": 20}):
        assert call(base, "/v1/completions", {"prompt": [5, 6], "max_tokens": 2, **extra})[0] == 200, extra
    for extra in ({"temperature": 1e31}, {"repetition_penalty": 1e31}):
        status, body = call(base, "/v1/completions", {"prompt": [5, 6], "max_tokens": 2, **extra})
        assert status == 400 and json.loads(body)["error"]["param"] == next(iter(extra))


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
    ("/v1/completions", None, b'[{"prompt": [1]}]', None, 400, "the body must be a JSON object"),
    ("/v1/completions", {"prompt": [1, 2], "max_tokens": 500}, None, None, 400, "context"),
    ("/v1/completions", {"prompt": [1, 99999]}, None, None, 400, "outside the vocabulary"),
    ("/v1/completions", {"prompt": []}, None, None, 400, "prompt"),
    ("/v1/completions", {"prompt": [1], "temperature": "hot"}, None, None, 400, "temperature"),
    ("/v1/completions", None, b'{"prompt": [1], "temperature": NaN}', None, 400, "'temperature' must be a number"),
    ("/v1/completions", None, b'{"prompt": [1], "repetition_penalty": NaN}', None, 400, "repetition_penalty"),
    ("/v1/completions", None, b'{"prompt": [1], "presence_penalty": Infinity}', None, 400, "presence_penalty"),
    ("/v1/completions", {"prompt": [1], "n": 1000}, None, None, 400, "'n'"),
    ("/v1/completions", {"prompt": [[1], [2]], "n": 200}, None, None, 400, "choices"),
    ("/v1/completions", {"prompt": [1], "best_of": 3}, None, None, 400, "best_of"),
    ("/v1/completions", {"prompt": [1], "logit_bias": {"99999": 10}}, None, None, 400, "logit_bias"),
    ("/v1/completions", {"prompt": [1], "logit_bias": {"five": 10}}, None, None, 400, "logit_bias"),
    ("/v1/completions", {"prompt": [1], "logit_bias": {"5": 300}}, None, None, 400, "logit_bias"),
    ("/v1/completions", {"prompt": [1], "max_tokens": 4, "min_tokens": 5}, None, None, 400, "min_tokens"),
    ("/v1/completions", {"prompt": [1], "stop": ["t1", ""]}, None, None, 400, "stop"),
    ("/v1/completions", {"prompt": [1], "stop": [f"t{i}" for i in range(65)]}, None, None, 400, "stop"),
    ("/v1/completions", {"prompt": [1], "prompt_logprobs": 1, "stream": True}, None, None, 400, "prompt_logprobs"),
    ("/v1/completions", {"prompt": [1], "prompt_logprobs": 21}, None, None, 400, "prompt_logprobs"),
    ("/v1/completions", {"prompt": [1], "max_tokens": 0}, None, None, 400, "max_tokens"),
    ("/v1/completions", {"prompt": [1], "stream_options": {"include_usage": True}}, None, None, 400,
     "stream_options"),
    ("/v1/completions", {"prompt": [1], "use_beam_search": True}, None, None, 400, "'use_beam_search' is not"),
    ("/v1/completions", {"prompt": [1], "bad_words": [5]}, None, None, 400, "'bad_words' must be"),
    ("/v1/completions", {"prompt": [1], "priority": 3}, None, None, 400, "'priority' is not"),
    ("/v1/completions", {"prompt": [1], "logits_processors": ["x"]}, None, None, 400, "'logits_processors' is not"),
    ("/v1/completions", {"prompt": [1], "spaces_between_special_tokens": "x"}, None, None, 400,
     "spaces_between_special_tokens"),
    ("/v1/completions", {"prompt": [1], "allowed_token_ids": []}, None, None, 400, "allowed_token_ids"),
    ("/v1/completions", {"prompt": [1], "allowed_token_ids": [99999]}, None, None, 400, "allowed_token_ids"),
    ("/v1/completions", {"prompt": [1], "truncate_prompt_tokens": 0}, None, None, 400, "truncate_prompt_tokens"),
    ("/v1/completions", {"prompt": [1], "skip_special_tokens": "no"}, None, None, 400, "skip_special_tokens"),
    ("/v1/completions", {"prompt": [1], "cache_salt": 5}, None, None, 400, "cache_salt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "t1"}], "cache_salt": ""}, None, None, 400,
     "cache_salt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "t1"}], "tools": [{"type": "function"}]},
     None, None, 400, "tool"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "t1"}],
                              "response_format": {"type": "xml"}}, None, None, 400, "response_format"),
    ("/tokenize", {"prompt": 5}, None, None, 400, "prompt"),
    ("/detokenize", {"tokens": [1, -2]}, None, None, 400, "tokens"),
    ("/detokenize", {"tokens": [True]}, None, None, 400, "tokens"),  # JSON's true is no token id
    ("/v1/completions", {"model": "gpt-4", "prompt": [1]}, None, None, 404, "does not exist"),
    ("/v1/chat/completions", {"messages": "hi"}, None, None, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, None, None, 400, "role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "t1"}], "top_logprobs": 2}, None, None, 400,
     "'logprobs' must be set to true"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "t1"}], "max_completion_tokens": -1}, None,
     None, 400, "max_completion_tokens"),
    ("/v1/nothing", {}, None, None, 404, "no route"),
    ("/v1/completions", None, None, "GET", 405, "POST"),
    # bodies json reads with errors other than its own: nesting past Python's recursion, an integer of
    # more digits than Python reads, numbers past a float's range (a 500, which clients retry, before)
    ("/v1/completions", None, b"[" * 100_000 + b"]" * 100_000, None, 400, "not valid JSON"),
    ("/v1/completions", None, b'{"prompt": [1], "seed": ' + b"9" * 5000 + b"}", None, 400, "not valid JSON"),
    ("/v1/completions", {"prompt": [1], "temperature": 10 ** 400}, None, None, 400, "temperature"),
    ("/v1/completions", {"prompt": [1], "logit_bias": {"5": 10 ** 400}}, None, None, 400, "logit_bias"),
    ("/v1/completions", {"prompt": [1], "ignore_eos": "false"}, None, None, 400, "'ignore_eos' must be true or false"),
    ("/v1/completions", {"prompt": [1], "echo": "no"}, None, None, 400, "'echo' must be true or false"),
    ("/tokenize", {"prompt": "t1", "add_special_tokens": "no"}, None, None, 400, "add_special_tokens"),
    ("/tokenize", {"prompt": "t1", "return_token_strs": 1}, None, None, 400, "return_token_strs"),
    ("/v1/completions", {"prompt": [1], "model": 5}, None, None, 400, "'model' must be a string"),
    # the value as the client wrote it, in JSON
    ("/v1/completions", {"prompt": [1], "max_tokens": True}, None, None, 400, "'max_tokens' must be an integer, not true"),
    ("/v1/completions", {"prompt": [1], "echo": None, "ignore_eos": "yes"}, None, None, 400, 'not "yes"'),
])
def test_bad_requests_get_openai_errors(server, path, body, raw, method, status, needle):
    base, _, _ = server
    got, text = call(base, path, body, method=method, raw=raw)
    assert got == status
    err = json.loads(text)["error"]
    assert needle in err["message"] and err["type"]


USER = [{"role": "user", "content": "t1"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("path, body, param, needle", [
    ("/v1/chat/completions", {"messages": USER, "tools": TOOLS, "tool_choice": {"type": "function", "function": "f"}},
     "tool_choice", "tool_choice must be"),
    ("/v1/chat/completions", {"messages": USER, "tools": TOOLS, "tool_choice": {"type": "function", "function": None}},
     "tool_choice", "tool_choice must be"),
    ("/v1/chat/completions", {"messages": USER, "tools": {"a": 1}}, "tools", "'tools' must be a list"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages[0].content", "content is required"),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": None}, *USER]}, "messages[0].content",
     "content is required in a system message"),
    ("/v1/chat/completions", {"messages": [*USER, {"role": "tool", "content": "t2"}]}, "messages[1].tool_call_id",
     "tool_call_id is required"),
    ("/v1/chat/completions", {"messages": [*USER, {"role": "tool", "content": "t2", "tool_call_id": 5}]},
     "messages[1].tool_call_id", "the id of the call it answers, a string, not 5"),
    ("/v1/chat/completions", {"messages": USER, "logprobs": 5}, "logprobs", "'logprobs' must be true or false"),
    ("/v1/chat/completions", {"messages": USER, "modalities": ["text", "audio"]}, "modalities", "text only"),
    ("/v1/chat/completions", {"messages": USER, "seed": 2**63}, "seed", "'seed' must be between"),
    ("/v1/completions", {"prompt": [1], "seed": -2**63 - 1}, "seed", "'seed' must be between"),
    ("/v1/completions", {"prompt": [1], "allowed_token_ids": [99999]}, "allowed_token_ids", "allowed_token_ids"),
    ("/v1/completions", {"prompt": [1], "stop_token_ids": [99999]}, "stop_token_ids", "stop token id 99999"),
    ("/v1/completions", {"prompt": [1], "stop_token_ids": [True]}, "stop_token_ids", "must be a list of integers"),
    ("/v1/completions", {"prompt": [1, 99999]}, "prompt", "token id 99999 is outside"),
    # a lone surrogate (JSON's \ud800 escape) has no UTF-8 bytes to tokenize: the client's error, not a 500
    ("/v1/completions", {"prompt": "t1 \ud800"}, "prompt", "lone surrogate, U+D800, at character 3"),
    ("/v1/completions", {"prompt": ["t1", "\udc00 t2"]}, "prompt", "lone surrogate, U+DC00, at character 0"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "t1\udfff"}]}, "messages", "lone surrogate"),
    ("/tokenize", {"prompt": "t1\ud800"}, "prompt", "lone surrogate"),
    # logit_bias' values and keys quoted as JSON has them, as the other fields' are
    ("/v1/completions", {"prompt": [1], "logit_bias": {"5": None}}, "logit_bias",
     "'logit_bias' values must be numbers between -100 and 100, not null"),
    ("/v1/chat/completions", {"messages": USER, "logit_bias": {"5": "x"}}, "logit_bias", 'between -100 and 100, not "x"'),
    ("/v1/completions", {"prompt": [1], "logit_bias": {"5": 100.5}}, "logit_bias", "between -100 and 100, not 100.5"),
    ("/v1/completions", {"prompt": [1], "logit_bias": {"5.0": 1}}, "logit_bias",
     "'logit_bias' keys must be token ids, not \"5.0\""),
    # -1 is no limit, as 0 is; not -1.0, which was taken so while any other float was refused
    ("/v1/completions", {"prompt": [1], "top_k": -1.0}, "top_k", "'top_k' must be an integer, not -1.0"),
    ("/v1/completions", {"prompt": [1], "top_k": -2}, "top_k", "'top_k' must be at least -1, not -2"),
    ("/v1/completions", {"prompt": [1], "top_p": -0.1}, "top_p", "'top_p' must be between 0 and 1, not -0.1"),
    ("/v1/completions", {"prompt": [1], "top_p": 1.5}, "top_p", "'top_p' must be between 0 and 1, not 1.5"),
    ("/v1/chat/completions", {"messages": USER, "top_p": -1}, "top_p", "'top_p' must be between 0 and 1"),
    ("/v1/responses", {"input": "t1", "top_p": 2}, "top_p", "'top_p' must be between 0 and 1"),
    ("/v1/responses", {"input": "t1", "max_output_tokens": 0}, "max_output_tokens", "'max_output_tokens' must be"),
    ("/v1/responses", {"input": "t1", "text": "json"}, "text", "'text' must be an object"),
    ("/v1/responses", {"input": "t1", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format",
     "'text.format' must be"),
    ("/v1/responses", {"input": [{"type": "function_call_output", "call_id": "c9", "output": "t1"}]},
     "input[0].call_id", "no function_call with that id"),
    ("/v1/responses", {"input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{x"}]},
     "input[0].arguments", "is not JSON"),
    ("/v1/responses", {"input": [{"role": "wizard", "content": "t1"}]}, "input[0].role", "is not one of user"),
    # fields this server refuses rather than ignores, each named (function_call was named 'functions')
    ("/v1/chat/completions", {"messages": USER, "functions": [{"name": "f"}]}, "functions", "send 'tools'"),
    ("/v1/chat/completions", {"messages": USER, "function_call": "auto"}, "function_call", "send 'tool_choice'"),
    ("/v1/chat/completions", {"messages": USER, "audio": {"voice": "alloy"}}, "audio", "'audio' is not supported"),
    ("/v1/responses", {"input": "t1", "background": True}, "background", "'background' is not supported"),
    # a field of the wrong type, as OpenAI's 400s name it
    ("/v1/completions", {"prompt": [1], "stream": True, "stream_options": True}, "stream_options",
     "'stream_options' must be an object"),
    # a field inside another by its path, as OpenAI's 400 names it; each checked whatever the other says
    ("/v1/chat/completions", {"messages": USER, "stream": True, "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage", "'stream_options.include_usage' must be true or false, not \"yes\""),
    ("/v1/completions", {"prompt": [1], "stream": True, "stream_options": {"continuous_usage_stats": 1}},
     "stream_options.continuous_usage_stats", "'stream_options.continuous_usage_stats' must be true or false"),
    ("/v1/completions", {"prompt": [1], "logit_bias": [5]}, "logit_bias", "'logit_bias' must be an object"),
    ("/v1/chat/completions", {"messages": USER, "user": 5}, "user", "'user' must be a string, not 5"),
    ("/v1/completions", {"prompt": ["t1", ""]}, "prompt", "'prompt' must not be empty"),
    ("/v1/chat/completions", {"messages": [5]}, "messages[0]", "messages[0] must be an object with a 'role'"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content",
     "must be a string or a list of text parts"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "https://x.org/a.png"}}]}]}, "messages[0].content", "only text parts are supported"),
    # a text part whose text is not one: named to its field (it was told only text parts are supported)
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "t1"},
                                                                        {"type": "text", "text": 5}]}]},
     "messages[0].content[1].text", "messages[0].content[1].text must be a string, not 5"),
    ("/v1/chat/completions", {"messages": [*USER, {"role": "assistant", "tool_calls": {"id": "c1"}}]},
     "messages[1].tool_calls", "'messages[1].tool_calls' must be a list"),
    ("/v1/responses", {"input": ""}, "input", "'input' must not be empty"),
    ("/v1/responses", {"input": [{"role": "user", "content": 5}]}, "input[0].content",
     "must be a string or a list of text parts"),
])
def test_a_bad_field_is_named_as_the_body_named_it(server, path, body, param, needle):
    """The error's param is the body's own field (the engine's request ids stay out of the message),
    and the client gets a 400, never a 500 it would retry."""
    base, _, _ = server
    got, text = call(base, path, body)
    err = json.loads(text)["error"]
    assert (got, err["param"]) == (400, param) and needle in err["message"], err
    assert "req-" not in err["message"]


def test_a_model_without_a_tokenizer_refuses_what_needs_one_by_name():
    """A model served without a tokenizer (random weights on a test card) takes token ids; text in or
    out (a text prompt, bad words, stop strings, a chat, /tokenize, /detokenize) is each a 400 saying
    so, naming the field where one is at fault, and the token ids it takes are answered beside them."""
    from .conftest import running

    model = make_model("torch", rows=2, max_seq=32)
    assert model.tokenizer is None
    with running(Engine(model)) as base:
        for path, body, param in (("/v1/completions", {"prompt": "t1"}, "prompt"),
                                  ("/v1/completions", {"prompt": [1], "bad_words": ["t1"]}, "bad_words"),
                                  ("/v1/completions", {"prompt": [1], "stop": ["t1"]}, "stop"),
                                  ("/v1/chat/completions", {"messages": USER}, "messages"),
                                  ("/v1/responses", {"input": "t1"}, "input"),
                                  ("/tokenize", {"prompt": "t1"}, None),
                                  ("/detokenize", {"tokens": [1]}, None)):
            got, text = call(base, path, body)
            err = json.loads(text)["error"]
            assert (got, err["param"]) == (400, param) and "tokenizer" in err["message"], (path, err)
        got, text = call(base, "/v1/completions", {"prompt": [5, 6], "max_tokens": 3, "temperature": 0})
        assert got == 200 and json.loads(text)["usage"]["completion_tokens"] == 3


def test_every_response_names_its_request(server):
    base, _, _ = server
    ask = lambda headers: urllib.request.urlopen(urllib.request.Request(
        base + "/v1/completions", data=json.dumps({"prompt": [1], "max_tokens": 1}).encode(),
        headers={"Content-Type": "application/json", **headers}), timeout=60)
    with ask({"X-Request-Id": "mine-7"}) as resp:
        assert resp.headers["x-request-id"] == "mine-7"
    with ask({}) as first, ask({}) as second:
        assert first.headers["x-request-id"].startswith("req-") and \
            first.headers["x-request-id"] != second.headers["x-request-id"]


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


def sse(text: str) -> list:
    """The chunks of a server-sent event stream, checked to end with [DONE]."""
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def streamed_calls(deltas: list) -> list:
    """A streamed choice's tool calls put together as a client does: by index, the id, type and
    name from the piece that opens each call (once), its arguments the pieces' text joined."""
    calls: dict = {}
    for delta in deltas:
        for piece in delta.get("tool_calls") or []:
            fn = piece.get("function") or {}
            if piece["index"] not in calls:
                assert piece["id"] and piece["type"] == "function" and fn["name"], piece
                calls[piece["index"]] = {"id": piece["id"], "type": "function",
                                         "function": {"name": fn["name"], "arguments": ""}}
            else:
                assert "id" not in piece and "name" not in fn, piece
            calls[piece["index"]]["function"]["arguments"] += fn.get("arguments") or ""
    assert sorted(calls) == list(range(len(calls)))
    return [calls[k] for k in range(len(calls))]


def engine_sampled(ids, n, seed):
    if "model" not in _REFERENCE:
        _REFERENCE["model"] = make_model("torch", rows=4, max_seq=96)
    done, _ = Engine(_REFERENCE["model"]).run([Request(prompt=ids, max_new_tokens=n, temperature=1.0, seed=seed)])
    return done[0].tokens


def words(tokens):
    return [f"t{t}" for t in tokens]


def test_n_choices_sample_with_seed_plus_index_and_prefill_the_prompt_once(server):
    base, engine, _ = server
    prompt = [31, 32, 33, 34, 35, 36]
    before = engine.stats.prefill_tokens
    status, body = call(base, "/v1/completions", {"prompt": prompt, "n": 3, "max_tokens": 5, "seed": 11,
                                                   "temperature": 1.0})
    assert status == 200
    out = json.loads(body)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    for j, choice in enumerate(out["choices"]):
        assert choice["text"].split() == words(engine_sampled(prompt, 5, 11 + j))
    assert out["usage"] == {"prompt_tokens": 6, "completion_tokens": 15, "total_tokens": 21,
                            "prompt_tokens_details": {"cached_tokens": 0}}  # the copies' copying is not counted
    # One prefill; each copy computes only the last prompt token, whose logits it draws from.
    assert engine.stats.prefill_tokens - before == len(prompt) + 2


def test_a_list_of_prompts_gives_their_choices_in_order(server):
    base, engine, _ = server
    prompts = [[3, 4, 5], [6, 7]]
    status, body = call(base, "/v1/completions", {"prompt": prompts, "n": 2, "max_tokens": 4, "temperature": 0})
    assert status == 200
    out = json.loads(body)
    texts = [c["text"].split() for c in out["choices"]]
    assert texts == [words(engine_greedy(engine, p, 4)) for p in prompts for _ in range(2)]
    assert out["usage"]["prompt_tokens"] == 5 and out["usage"]["completion_tokens"] == 16


def test_streamed_choices_logprobs_and_usage_equal_the_whole(server):
    base, _, _ = server
    body = {"prompt": [[9, 8, 7], [1, 2]], "max_tokens": 6, "temperature": 0, "logprobs": 2}
    whole = json.loads(call(base, "/v1/completions", body)[1])
    status, text = call(base, "/v1/completions", dict(body, stream=True, stream_options={"include_usage": True}))
    assert status == 200
    chunks = sse(text)
    counts = lambda u: {k: u[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    assert chunks[-1]["choices"] == [] and counts(chunks[-1]["usage"]) == counts(whole["usage"])
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 2 + 1}  # the same prompts, again
    assert all(c["usage"] is None for c in chunks[:-1])
    for i, choice in enumerate(whole["choices"]):
        mine = [c["choices"][0] for c in chunks[:-1] if c["choices"][0]["index"] == i]
        assert "".join(c["text"] for c in mine) == choice["text"]
        assert [c["finish_reason"] for c in mine][-1] == "length"
        streamed = [(t, v) for c in mine if c["logprobs"] for t, v in zip(c["logprobs"]["tokens"],
                                                                         c["logprobs"]["token_logprobs"])]
        assert [t for t, _ in streamed] == choice["logprobs"]["tokens"]
        assert [v for _, v in streamed] == pytest.approx(choice["logprobs"]["token_logprobs"], abs=1e-4)
        offsets = [o for c in mine if c["logprobs"] for o in c["logprobs"]["text_offset"]]
        assert offsets == choice["logprobs"]["text_offset"]
        assert [choice["text"][o:].split()[0] for o in offsets] == choice["logprobs"]["tokens"]


def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(server):
    """vLLM's stream_options.continuous_usage_stats: each chunk carries the usage up to it, the
    completion tokens never fewer than the chunks' text holds, the last the whole count."""
    base, _, _ = server
    body = {"prompt": "t5 t6 t7", "max_tokens": 5, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = sse(call(base, "/v1/completions", body)[1])
    assert all(c["usage"]["prompt_tokens"] == 3 for c in chunks)
    seen = 0
    for c in chunks:
        seen += sum(len(ch["text"].split()) for ch in c["choices"])
        assert c["usage"]["completion_tokens"] >= seen
        assert c["usage"]["total_tokens"] == 3 + c["usage"]["completion_tokens"]
    assert chunks[-1]["usage"]["completion_tokens"] == 5 and seen == 5
    alone = dict(body, stream_options={"continuous_usage_stats": True})  # without include_usage: no usage at all
    assert all("usage" not in c for c in sse(call(base, "/v1/completions", alone)[1]))
    status, text = call(base, "/v1/completions", dict(body, stream_options={"include_usage": True,
                                                                            "continuous_usage_stats": "yes"}))
    assert status == 400 and "continuous_usage_stats" in json.loads(text)["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_continuous_usage_is_each_chunks_own_choices(server, path):
    """With n > 1 (and completions' several prompts) a chunk's continuous usage is its choice's, as
    vLLM's serving_completion and serving_chat make it: that choice's prompt and the tokens of it
    streamed so far (previous_num_tokens[i]); the last chunk sums every choice, each prompt once."""
    base, _, _ = server
    prompts = ["t5 t6 t7", "t8 t9"]
    body = {"max_tokens": 4, "temperature": 1.0, "seed": 3, "n": 2, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if path == "/v1/completions":
        body.update(prompt=prompts, logprobs=0)
        prompt_of = lambda i: len(prompts[i // 2].split())
    else:
        body.update(messages=[{"role": "user", "content": prompts[0]}], logprobs=True)
        prompt_of = lambda i: 6  # TEMPLATE's t1, the message's 3 words, t2 and t3
    chunks = sse(call(base, path, body)[1])
    streamed = {}
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        lps = choice["logprobs"]
        streamed[choice["index"]] = streamed.get(choice["index"], 0) + (
            0 if lps is None else len(lps["content"] if "content" in lps else lps["tokens"]))
        prompt = prompt_of(choice["index"])
        assert c["usage"] == {"prompt_tokens": prompt, "completion_tokens": streamed[choice["index"]],
                              "total_tokens": prompt + streamed[choice["index"]]}, c
    assert streamed == {i: 4 for i in range(len(streamed))} and len(streamed) == (4 if "prompt" in body else 2)
    last = chunks[-1]
    assert last["choices"] == []
    prompt = sum(prompt_of(i) for i in range(0, len(streamed), 2))
    assert {k: last["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == \
        {"prompt_tokens": prompt, "completion_tokens": 4 * len(streamed), "total_tokens": prompt + 4 * len(streamed)}


def test_streamed_chat_with_n_and_logprobs(server):
    base, _, _ = server
    body = {"messages": [{"role": "user", "content": "t40 t41"}], "max_tokens": 4, "temperature": 0, "n": 2,
            "logprobs": True, "top_logprobs": 3}
    whole = json.loads(call(base, "/v1/chat/completions", body)[1])
    chunks = sse(call(base, "/v1/chat/completions", dict(body, stream=True))[1])
    assert "usage" not in chunks[0]
    for i, choice in enumerate(whole["choices"]):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(c["delta"].get("content", "") for c in mine) == choice["message"]["content"]
        got = [e for c in mine if c["logprobs"] for e in c["logprobs"]["content"]]
        want = choice["logprobs"]["content"]
        # The same tokens; their logprobs to float32 rounding (the passes are packed differently).
        flat = lambda es: [(e["token"], e["logprob"]) for e in es] + [(t["token"], t["logprob"])
                                                                      for e in es for t in e["top_logprobs"]]
        assert [t for t, _ in flat(got)] == [t for t, _ in flat(want)]
        assert [v for _, v in flat(got)] == pytest.approx([v for _, v in flat(want)], abs=1e-4)
        assert all(len(e["top_logprobs"]) == 3 for e in got)
    assert whole["choices"][0]["message"] == whole["choices"][1]["message"]  # greedy: the same twice


def test_chat_echo_puts_the_assistants_last_message_before_its_continuation(server):
    # vLLM's echo for chat: the last message's content leads each reply where it is the assistant's
    base, _, _ = server
    turn = [{"role": "user", "content": "t40"}, {"role": "assistant", "content": "t7 t8"}]
    body = {"messages": turn, "continue_final_message": True, "add_generation_prompt": False, "max_tokens": 4,
            "temperature": 0, "n": 2}
    plain = json.loads(call(base, "/v1/chat/completions", body)[1])["choices"][0]["message"]["content"]
    echoed = json.loads(call(base, "/v1/chat/completions", dict(body, echo=True))[1])
    assert [c["message"]["content"] for c in echoed["choices"]] == ["t7 t8" + plain] * 2
    chunks = sse(call(base, "/v1/chat/completions", dict(body, echo=True, stream=True))[1])
    for i in range(2):
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"][0]["index"] == i]
        assert deltas[1] == {"content": "t7 t8"}  # after the role's opening, before the reply
        assert "".join(d.get("content") or "" for d in deltas) == "t7 t8" + plain
    # the last message the user's: nothing to continue, nothing put before the reply
    asked = {"messages": turn[:1], "max_tokens": 4, "temperature": 0}
    plain = json.loads(call(base, "/v1/chat/completions", asked)[1])["choices"][0]["message"]["content"]
    assert json.loads(call(base, "/v1/chat/completions", dict(asked, echo=True))[1])["choices"][0]["message"][
        "content"] == plain


def test_without_max_tokens_a_request_fills_what_its_row_has_left(server):
    base, _, model = server
    prompt = list(range(1, model.max_seq - 2))  # room for 3
    status, body = call(base, "/v1/completions", {"prompt": prompt, "temperature": 0, "ignore_eos": True})
    assert status == 200
    assert json.loads(body)["usage"]["completion_tokens"] == 3  # not a 400 for the default of 16
    status, body = call(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "t3"}],
                                                       "temperature": 0})
    out = json.loads(body)
    assert status == 200 and out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"] == model.max_seq


def test_more_stop_strings_than_openais_four(server):
    """vLLM takes any number of stop strings (OpenAI four): the sixth here ends the text."""
    base, engine, _ = server
    ref = words(engine_greedy(engine, [8, 9], 6))
    stops = [f"t{t}" for t in range(100, 105) if f"t{t}" not in ref] + [ref[3]]
    out = json.loads(call(base, "/v1/completions", {"prompt": [8, 9], "max_tokens": 6, "temperature": 0,
                                                     "stop": stops})[1])
    assert out["choices"][0]["finish_reason"] == "stop" and out["choices"][0]["stop_reason"] == ref[3]
    assert out["choices"][0]["text"].split() == ref[:ref.index(ref[3])]


def test_a_stop_string_kept_in_the_text_when_asked(server):
    """vLLM's include_stop_str_in_output: the text runs to the end of the stop string, whole and
    streamed. (The stop string sent alone, not in a list, as OpenAI's API takes it too.)"""
    base, engine, _ = server
    ref = words(engine_greedy(engine, [8, 9], 6))
    body = {"prompt": [8, 9], "max_tokens": 6, "temperature": 0, "stop": ref[3], "include_stop_str_in_output": True}
    out = json.loads(call(base, "/v1/completions", body)[1])["choices"][0]
    upto = ref.index(ref[3]) + 1
    assert out["finish_reason"] == "stop" and out["text"].split() == ref[:upto]
    streamed = sse(call(base, "/v1/completions", dict(body, stream=True))[1])
    assert "".join(c["choices"][0]["text"] for c in streamed if c["choices"]) == out["text"]


def test_a_stop_token_ends_the_text_before_it_unless_asked_for(server):
    """vLLM's stop_token_ids: the token is drawn (and counted) but its text is left out, whole and
    streamed; include_stop_str_in_output keeps it."""
    base, engine, _ = server
    ref = words(engine_greedy(engine, [8, 9], 6))
    upto = ref.index(ref[3])
    for keep in (False, True):
        body = {"prompt": [8, 9], "max_tokens": 6, "temperature": 0, "stop_token_ids": [int(ref[3][1:])],
                "include_stop_str_in_output": keep}
        out = json.loads(call(base, "/v1/completions", body)[1])
        choice = out["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["text"].split() == ref[:upto + keep]
        assert choice["stop_reason"] == int(ref[3][1:])  # vLLM's: the token that stopped it
        assert out["usage"]["completion_tokens"] == upto + 1
        streamed = sse(call(base, "/v1/completions", dict(body, stream=True))[1])
        assert "".join(c["choices"][0]["text"] for c in streamed if c["choices"]) == choice["text"]
        assert [c["choices"][0].get("stop_reason") for c in streamed if c["choices"]][-1] == choice["stop_reason"]


def test_a_prompt_too_long_names_its_own_field(server):
    base, _, model = server
    _, text = call(base, "/v1/completions", {"prompt": [5] * model.max_seq})
    assert json.loads(text)["error"]["param"] == "prompt"
    _, text = call(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "t5 " * model.max_seq}]})
    err = json.loads(text)["error"]
    assert err["param"] == "messages" and err["code"] == "context_length_exceeded"


def test_a_reply_too_long_for_the_row_names_the_field_the_body_used(server):
    """Chat's max_completion_tokens, the older max_tokens, the Responses API's max_output_tokens:
    the error names the one the client sent."""
    base, _, model = server
    messages = [{"role": "user", "content": "t3"}]
    for path, body, field in (
            ("/v1/completions", {"prompt": [5, 6], "max_tokens": model.max_seq}, "max_tokens"),
            ("/v1/chat/completions", {"messages": messages, "max_tokens": model.max_seq}, "max_tokens"),
            ("/v1/chat/completions", {"messages": messages, "max_completion_tokens": model.max_seq},
             "max_completion_tokens"),
            ("/v1/responses", {"input": "t3", "max_output_tokens": model.max_seq}, "max_output_tokens")):
        status, text = call(base, path, body)
        err = json.loads(text)["error"]
        assert status == 400 and err["param"] == field and field in err["message"], (path, err)
        assert err["code"] == "context_length_exceeded"


def test_a_top_k_past_the_vocabulary_limits_nothing(server):
    """vLLM takes any top_k: past the vocabulary (past int32, even) it is no limit, and the request
    draws as with none; nothing else in flight is touched."""
    base, _, _ = server
    body = {"prompt": [3, 4, 5], "max_tokens": 5, "temperature": 1.0, "seed": 11, "ignore_eos": True}
    without = json.loads(call(base, "/v1/completions", body)[1])["choices"][0]["text"]
    for k in (10 ** 6, 10 ** 12):
        status, text = call(base, "/v1/completions", dict(body, top_k=k))
        assert status == 200 and json.loads(text)["choices"][0]["text"] == without


def test_a_null_max_completion_tokens_leaves_max_tokens_in_force(server):
    """Clients that send every field send max_completion_tokens: null beside max_tokens (vLLM takes
    the first that is set)."""
    base, _, _ = server
    body = {"messages": [{"role": "user", "content": "t3"}], "temperature": 0, "ignore_eos": True}
    for extra, want in (({"max_tokens": 3, "max_completion_tokens": None}, 3),
                        ({"max_tokens": 3, "max_completion_tokens": 5}, 5)):
        out = json.loads(call(base, "/v1/chat/completions", dict(body, **extra))[1])
        assert out["usage"]["completion_tokens"] == want


def test_legacy_logprobs_always_hold_the_drawn_token(server):
    """OpenAI's completions logprobs: "the API will always return the logprob of the sampled token,
    so there may be up to logprobs+1 elements" (vLLM's too): with logprobs 0, the drawn token alone."""
    base, _, _ = server
    body = {"prompt": [8, 9], "max_tokens": 5, "temperature": 1.0, "seed": 2, "logprobs": 0}
    lp = json.loads(call(base, "/v1/completions", body)[1])["choices"][0]["logprobs"]
    assert [list(top) for top in lp["top_logprobs"]] == [[t] for t in lp["tokens"]]
    assert [list(top.values()) for top in lp["top_logprobs"]] == [[v] for v in lp["token_logprobs"]]
    lp = json.loads(call(base, "/v1/completions", dict(body, logprobs=2))[1])["choices"][0]["logprobs"]
    assert all(2 <= len(top) <= 3 and top[t] == v for t, v, top in zip(lp["tokens"], lp["token_logprobs"],
                                                                       lp["top_logprobs"]))


def test_the_allowed_tokens_are_the_only_ones_drawn(server):
    """vLLM's allowed_token_ids: sampled or greedy, every token is one of them; greedy picks the
    likeliest of them, as a -100 logit bias on every other token does."""
    base, _, model = server
    allowed = [7, 11, 40, 41, 90]
    sampled = json.loads(call(base, "/v1/completions", {"prompt": [3, 4], "max_tokens": 12, "temperature": 1.5,
                                                         "seed": 3, "n": 3, "allowed_token_ids": allowed})[1])
    for choice in sampled["choices"]:
        assert choice["text"].split() and {int(w[1:]) for w in choice["text"].split()} <= set(allowed)
    greedy = {"prompt": [3, 4], "max_tokens": 8, "temperature": 0}
    masked = json.loads(call(base, "/v1/completions", dict(greedy, allowed_token_ids=allowed))[1])
    banned = {str(t): -100 for t in range(model.vocab) if t not in allowed}
    biased = json.loads(call(base, "/v1/completions", dict(greedy, logit_bias=banned))[1])
    assert masked["choices"][0]["text"] == biased["choices"][0]["text"]


def test_a_prompt_truncated_to_its_last_tokens(server):
    """vLLM's truncate_prompt_tokens: the model sees the prompt's last k tokens, and the usage and
    an echo say so."""
    base, engine, _ = server
    prompt = list(range(20, 40))
    body = {"prompt": prompt, "max_tokens": 5, "temperature": 0, "truncate_prompt_tokens": 6, "echo": True}
    out = json.loads(call(base, "/v1/completions", body)[1])
    assert out["usage"]["prompt_tokens"] == 6
    echoed = words(prompt[-6:])
    assert out["choices"][0]["text"].split() == echoed + words(engine_greedy(engine, prompt[-6:], 5))
    whole = json.loads(call(base, "/v1/completions", dict(body, truncate_prompt_tokens=-1))[1])
    assert whole["usage"]["prompt_tokens"] == 20


def test_logit_bias_forces_a_token(server):
    base, _, _ = server
    out = json.loads(call(base, "/v1/completions", {"prompt": [4, 5], "max_tokens": 3, "temperature": 0.8,
                                                     "logit_bias": {"77": 100}})[1])
    assert out["choices"][0]["text"].split() == ["t77"] * 3


def test_echo_puts_the_prompt_before_the_text(server):
    base, engine, _ = server
    out = json.loads(call(base, "/v1/completions", {"prompt": "t5 t6", "max_tokens": 3, "temperature": 0,
                                                     "echo": True})[1])
    assert out["choices"][0]["text"].split() == ["t5", "t6"] + words(engine_greedy(engine, [5, 6], 3))


def engine_scores(ids, k):
    """The prompt's logprobs as the engine gives them (checked against transformers'), on its own model."""
    if "model" not in _REFERENCE:
        _REFERENCE["model"] = make_model("torch", rows=4, max_seq=96)
    done, _ = Engine(_REFERENCE["model"]).run([Request(prompt=ids, max_new_tokens=0, prompt_logprobs=k)])
    return done[0].prompt_logprobs


def test_echo_with_logprobs_scores_the_prompt_as_lm_eval_asks(server):
    """lm-evaluation-harness's loglikelihood: token-id prompts, echo, max_tokens 1, logprobs 1; it reads
    the prompt's token_logprobs and checks each against its top_logprobs for greediness."""
    base, engine, _ = server
    prompts = [[5, 6, 7, 8, 9], [30, 31]]
    out = json.loads(call(base, "/v1/completions", {"prompt": prompts, "echo": True, "max_tokens": 1,
                                                     "logprobs": 1, "temperature": 0})[1])
    for p, choice in zip(prompts, out["choices"]):
        lp = choice["logprobs"]
        ref = engine_scores(p, 1)
        generated = words(engine_greedy(engine, p, 1))
        assert choice["text"].split() == words(p) + generated
        assert lp["tokens"] == words(p) + generated
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert lp["token_logprobs"][1:len(p)] == pytest.approx([s.logprob for s in ref[1:]], abs=1e-5)
        # each token's alternatives: its top one and itself (OpenAI's "up to logprobs + 1"), as vLLM's
        assert [set(t) for t in lp["top_logprobs"][1:len(p)]] == [{f"t{s.token}", f"t{s.top[0][0]}"} for s in ref[1:]]
        greedy = [tok == max(top.values()) for tok, top in zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:])]
        assert greedy == [s.token == s.top[0][0] for s in ref[1:]] + [True]  # lm-eval's test; the draw is greedy
        assert [choice["text"][o:].split()[0] for o in lp["text_offset"]] == lp["tokens"]
    assert out["usage"]["completion_tokens"] == 2


def test_echo_with_no_tokens_to_generate_is_the_scored_prompt(server):
    base, _, _ = server
    body = {"prompt": "t11 t12 t13", "echo": True, "max_tokens": 0, "logprobs": 0}
    out = json.loads(call(base, "/v1/completions", body)[1])
    choice = out["choices"][0]
    assert choice["text"] == "t11 t12 t13" and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == ["t11", "t12", "t13"]
    assert choice["logprobs"]["token_logprobs"][1:] == pytest.approx(
        [s.logprob for s in engine_scores([11, 12, 13], 0)[1:]], abs=1e-5)
    assert out["usage"] == {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3,
                            "prompt_tokens_details": {"cached_tokens": 0}}  # a scored prompt reuses nothing
    chunks = sse(call(base, "/v1/completions", dict(body, stream=True))[1])
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    streamed = [v for c in chunks if c["choices"][0]["logprobs"] for v in c["choices"][0]["logprobs"]["token_logprobs"]]
    assert streamed[0] is None and streamed[1:] == pytest.approx(choice["logprobs"]["token_logprobs"][1:], abs=1e-6)


def test_an_echoed_prompts_offsets_index_the_echoed_text_special_tokens_and_all():
    """A prompt's tokens' text_offset index the text echoed before the reply (vLLM's, each token's
    text summed): a text prompt is echoed as written, a special token's text (`<s>`) with it; ids as
    the request decodes them (skip_special_tokens). The reply's offsets go on from the echo's end."""
    from tokenizers import AddedToken, Tokenizer as Backend, models, pre_tokenizers

    from linnet.nest.tokenizer import Tokenizer

    from .conftest import running

    model = make_model("torch", rows=2, max_seq=32)
    vocab = {f"t{i}": i for i in range(model.vocab)}
    vocab["<s>"] = vocab.pop("t1")
    backend = Backend(models.WordLevel(vocab, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens([AddedToken("<s>", special=True)])
    model.tokenizer = Tokenizer(backend, eos_token_ids=[])
    with running(Engine(model)) as base:
        for prompt, extra, echoed in [("<s> t5 t6", {}, "<s> t5 t6"), ([1, 5, 6], {"skip_special_tokens": False},
                                                                          "<s> t5 t6"), ([1, 5, 6], {}, "t5 t6")]:
            body = {"prompt": prompt, "echo": True, "max_tokens": 2, "logprobs": 0, "temperature": 0, **extra}
            for streamed in (False, True):
                status, text = call(base, "/v1/completions", dict(body, stream=streamed))
                assert status == 200, text
                if streamed:
                    pieces = [c["choices"][0] for c in sse(text)]
                    reply = "".join(p["text"] for p in pieces)
                    tokens = [t for p in pieces if p["logprobs"] for t in p["logprobs"]["tokens"]]
                    offsets = [o for p in pieces if p["logprobs"] for o in p["logprobs"]["text_offset"]]
                else:
                    choice = json.loads(text)["choices"][0]
                    reply, tokens, offsets = choice["text"], choice["logprobs"]["tokens"], choice["logprobs"]["text_offset"]
                assert reply.startswith(echoed) and tokens[:3] == ["<s>", "t5", "t6"], (prompt, extra, reply)
                shown = [t for t in tokens if t != "<s>" or "<s>" in echoed]  # a special token left out: no width
                at = [o for t, o in zip(tokens, offsets) if t in shown]
                assert [reply[o:].split()[0] for o in at] == shown, (prompt, extra, reply, offsets)
                assert offsets == sorted(offsets) and offsets[3] >= len(echoed)


def test_streamed_echo_with_logprobs_equals_the_whole(server):
    base, _, _ = server
    body = {"prompt": [[21, 22, 23], [24, 25]], "echo": True, "max_tokens": 3, "logprobs": 2, "temperature": 0,
            "n": 2}
    whole = json.loads(call(base, "/v1/completions", body)[1])
    chunks = sse(call(base, "/v1/completions", dict(body, stream=True))[1])
    for i, choice in enumerate(whole["choices"]):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
        assert "".join(c["text"] for c in mine) == choice["text"]
        for key in ("tokens", "text_offset"):
            assert [x for c in mine if c["logprobs"] for x in c["logprobs"][key]] == choice["logprobs"][key]
        got = [x for c in mine if c["logprobs"] for x in c["logprobs"]["token_logprobs"]]
        assert got[0] is None and got[1:] == pytest.approx(choice["logprobs"]["token_logprobs"][1:], abs=1e-4)
    # the copies of a prompt share its scores
    assert whole["choices"][0]["logprobs"]["token_logprobs"][:3] == whole["choices"][1]["logprobs"]["token_logprobs"][:3]


def test_vllm_prompt_logprobs_on_both_endpoints(server):
    base, _, _ = server
    out = json.loads(call(base, "/v1/completions", {"prompt": [40, 41, 42], "max_tokens": 2, "prompt_logprobs": 2,
                                                     "n": 2, "temperature": 0})[1])
    ref = engine_scores([40, 41, 42], 2)
    for choice in out["choices"]:
        got = choice["prompt_logprobs"]
        assert got[0] is None and len(got) == 3
        for entry, s in zip(got[1:], ref[1:]):
            assert entry[str(s.token)]["rank"] == s.rank and entry[str(s.token)]["decoded_token"] == f"t{s.token}"
            assert entry[str(s.token)]["logprob"] == pytest.approx(s.logprob, abs=1e-5)
            assert {int(t) for t in entry} == {s.token} | {t for t, _ in s.top}
        assert choice["logprobs"] is None  # the generated tokens' logprobs were not asked for
    chat = json.loads(call(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "t40"}],
                                                          "max_tokens": 2, "prompt_logprobs": 0})[1])
    ids = [1, 40, 2, 3]  # through the template
    assert [None if e is None else list(e) for e in chat["prompt_logprobs"]] == [None] + [[str(t)] for t in ids[1:]]
    assert [e[str(t)]["logprob"] for e, t in zip(chat["prompt_logprobs"][1:], ids[1:])] == pytest.approx(
        [s.logprob for s in engine_scores(ids, 0)[1:]], abs=1e-5)


def test_usage_counts_the_prompt_tokens_the_cache_held(server):
    """A prompt sent again finds its tokens still in the row it freed: all but the last, whose logits
    are recomputed, are reused, and the usage says so, as OpenAI's cached_tokens."""
    base, _, _ = server
    prompt = [91, 92, 93, 94, 95, 96, 97, 98]
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0}
    first = json.loads(call(base, "/v1/completions", body)[1])["usage"]
    again = json.loads(call(base, "/v1/completions", body)[1])["usage"]
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    assert again["prompt_tokens_details"] == {"cached_tokens": len(prompt) - 1}


def test_tokenize_detokenize_models_and_metrics(server):
    base, engine, model = server
    out = json.loads(call(base, "/tokenize", {"prompt": "t7 t8 t9"})[1])
    assert out == {"count": 3, "max_model_len": model.max_seq, "tokens": [7, 8, 9]}
    spelled = json.loads(call(base, "/tokenize", {"prompt": "t7 t8 t9", "return_token_strs": True})[1])
    assert spelled["tokens"] == [7, 8, 9] and spelled["token_strs"] == ["t7", "t8", "t9"]
    chat = json.loads(call(base, "/tokenize", {"messages": [{"role": "user", "content": "t7"}]})[1])
    assert chat["tokens"] == [1, 7, 2, 3]  # through the template
    assert json.loads(call(base, "/detokenize", {"tokens": [7, 8]})[1]) == {"prompt": "t7 t8"}
    assert json.loads(call(base, "/v1/models/tiny")[1])["id"] == "tiny"
    assert call(base, "/v1/models/other")[0] == 404
    call(base, "/v1/completions", {"prompt": [4, 4], "max_tokens": 2})
    status, text = call(base, "/metrics")
    assert status == 200
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert int(values["linnet_generation_tokens_total"]) == engine.stats.generated_tokens > 0
    assert int(values['linnet_requests_finished_total{reason="length"}']) > 0
    assert values["linnet_cache_rows"] == str(model.batch)
    # again under vLLM's names, for dashboards and autoscalers written for vLLM
    assert int(values['vllm:generation_tokens_total{model_name="tiny"}']) == engine.stats.generated_tokens
    assert int(values['vllm:request_success_total{model_name="tiny",finished_reason="length"}']) > 0
    assert values['vllm:num_requests_running{model_name="tiny"}'] == "0"
    assert float(values['vllm:kv_cache_usage_perc{model_name="tiny"}']) == 0.0


# ---------------------------------------------------------------- the ASGI app driven directly

def asgi(app, method, path, body=None, headers=(), disconnect=None, answer_headers=None):
    """One request through the app as an ASGI server would send it; `disconnect`, an asyncio.Event,
    makes the client go away once it is set; `answer_headers`, a dict, is given the answer's
    headers. Returns (status, body bytes)."""
    import asyncio

    async def go():
        sent, data = [], json.dumps(body).encode() if body is not None else b""
        messages = [{"type": "http.request", "body": data, "more_body": False}]

        async def receive():
            if messages:
                return messages.pop(0)
            if disconnect is not None:
                await disconnect.wait()
            else:
                await asyncio.Event().wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        json_body = [(b"content-type", b"application/json")] if body is not None else []  # as a client sends it
        scope = {"type": "http", "method": method, "path": path, "headers": [*json_body, *headers]}
        await app(scope, receive, send)
        start = next(m for m in sent if m["type"] == "http.response.start")
        if answer_headers is not None:
            answer_headers.update((k.decode(), v.decode("latin-1")) for k, v in start.get("headers", []))
        status = start["status"]
        return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")

    return go


def held_prefill(engine):
    """The engine's prefill held until the returned event is set (a client can leave while its first
    pass runs); (that event, the prefill as it was)."""
    import threading

    prefill, left = engine.runner.prefill, threading.Event()

    def held(*args):
        left.wait(30)
        return prefill(*args)
    engine.runner.prefill = held
    return left, prefill


async def leave_in_first_pass(app, engine, left, path: str, body: dict):
    """POSTs `body`, and leaves while its first pass is held (`held_prefill`'s `left`), then lets the
    pass go on: (the app's (status, body), the request's completion)."""
    left.clear()
    gone = asyncio.Event()
    task = asyncio.ensure_future(asgi(app, "POST", path, body, disconnect=gone)())
    while not engine.in_flight:
        await asyncio.sleep(0.01)
    comp = next(iter(engine.in_flight.values())).comp
    gone.set()
    for _ in range(500):  # the app's watcher cancels within a few loop turns
        if engine.cancelled:
            break
        await asyncio.sleep(0.01)
    assert engine.cancelled, "the client left and its request was not cancelled"
    left.set()
    return await asyncio.wait_for(task, 30), comp


def test_a_client_that_goes_away_frees_its_row():
    """The client leaves while its request's first pass runs (held here until it has left; the
    app's first stream started the engine's loop): the step after that pass ends the request as
    cancelled, its row free, with at most the one token the pass drew."""
    model = make_model("torch", rows=2, max_seq=64)
    engine = Engine(model)
    app = OpenAIServer(engine, "tiny")
    left, _ = held_prefill(engine)
    try:
        for stream in (False, True):
            _, comp = asyncio.run(leave_in_first_pass(app, engine, left, "/v1/completions",
                                                      {"prompt": [5, 6, 7], "max_tokens": 40, "stream": stream}))
            assert comp.finish_reason == "cancelled" and len(comp.tokens) <= 1
            assert not engine.live and not engine.waiting and len(engine.free_rows) == 2
    finally:
        left.set()
        engine.stop()
    assert engine.stats.finished == {"cancelled": 2}


def test_a_response_whose_client_went_away_is_not_kept():
    """A Response whose client leaves mid-reply (held in its first pass until it has left) is not
    kept, streamed or not: its request cancelled, its text cut there, it was kept as "completed",
    a turn a later Response would continue as if the model had ended it. One that ends is kept."""
    from linnet.serve.openai_api import ApiError

    from .conftest import TEMPLATE
    from .test_engine import word_tokenizer

    model = make_model("torch", rows=2, max_seq=64)
    model.tokenizer = word_tokenizer(model.vocab)
    model.tokenizer.chat_template = TEMPLATE
    engine = Engine(model)
    app = OpenAIServer(engine, "tiny")
    left, prefill = held_prefill(engine)
    try:
        for stream in (False, True):
            (status, body), _ = asyncio.run(leave_in_first_pass(
                app, engine, left, "/v1/responses", {"input": "t5 t6", "max_output_tokens": 40, "stream": stream}))
            sent = json.loads(body.split(b"data: ")[1].split(b"\n")[0])["response"] if stream else json.loads(body)
            with pytest.raises(ApiError, match="its client went away") as unknown:
                app.responses.response(sent["id"])
            assert unknown.value.status == 404
        assert engine.stats.finished == {"cancelled": 2}
        engine.runner.prefill = prefill
        status, body = asyncio.run(asgi(app, "POST", "/v1/responses", {"input": "t5 t6", "max_output_tokens": 2})())
        ended = json.loads(body)
        assert status == 200 and app.responses.response(ended["id"])["status"] == ended["status"] == "incomplete"
    finally:
        left.set()
        engine.stop()


def test_an_api_key_guards_the_v1_routes():
    app = OpenAIServer(Engine(make_model("torch", rows=2, max_seq=64)), "tiny", api_key="sesame")
    status, body = asyncio.run(asgi(app, "GET", "/v1/models")())
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    status, _ = asyncio.run(asgi(app, "GET", "/v1/models", headers=[(b"authorization", b"Bearer sesame")])())
    assert status == 200
    assert asyncio.run(asgi(app, "GET", "/health")())[0] == 200  # a load balancer's probe needs no key
    # without the key, nothing is told of the routes under /v1: which exist, what methods they take
    for method, path in (("GET", "/v1/nothing"), ("DELETE", "/v1/models"), ("GET", "/v1")):
        assert asyncio.run(asgi(app, method, path)())[0] == 401, (method, path)
    # the scheme in any case (RFC 9110); another key, or none after the scheme, is refused
    for given, status in ((b"bearer sesame", 200), (b"BEARER  sesame", 200), (b"Bearer sesam", 401),
                          (b"Bearer", 401), (b"Basic sesame", 401)):
        assert asyncio.run(asgi(app, "GET", "/v1/models", headers=[(b"authorization", given)])())[0] == status, given
    # a key past Latin-1 is matched by its UTF-8 bytes as sent, not by as many '?'; an environment's
    # undecodable bytes (surrogates in Python's str) by those bytes; spaces around a key by the key
    for key, right in (("€€€€", "€€€€".encode()), (b"k\xff".decode("utf-8", "surrogateescape"), b"k\xff"),
                       (" sesame ", b"sesame")):
        app = OpenAIServer(Engine(make_model("torch", rows=2, max_seq=64)), "tiny", api_key=key)
        for given, status in ((b"Bearer " + right, 200), (b"Bearer ????", 401), (b"Bearer " + right[:-1], 401)):
            assert asyncio.run(asgi(app, "GET", "/v1/models", headers=[(b"authorization", given)])())[0] == status, given


def _exchange(base, raw: bytes) -> tuple[bytes, bytes]:
    """`raw` sent on a socket of its own; the answer's head and body, read until the server closes
    the connection or the body's declared length has come (a timeout fails the test)."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(base)
    with socket.create_connection((url.hostname, url.port), timeout=20) as sock:
        sock.sendall(raw)
        data = b""
        while True:
            head, _, body = data.partition(b"\r\n\r\n")
            length = [line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")]
            if length and len(body) >= int(length[0]):
                return head, body
            piece = sock.recv(65536)
            if not piece:
                return head, body
            data += piece


def test_a_body_not_declared_json_is_refused_as_vllm_refuses_it(server):
    """vLLM's POST routes take a body whose media type is application/json (its parameters, a
    charset, allowed; the type's case is the client's, RFC 9110), and answer any other, or none,
    with a 400 before reading it: a form or text body is not parsed as if it were JSON."""
    import http.client
    from urllib.parse import urlparse

    base, _, _ = server
    url = urlparse(base)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    for path, sent in (("/v1/completions", {"prompt": [5, 6], "max_tokens": 2}), ("/tokenize", {"prompt": "t5"})):
        body = json.dumps(sent).encode()
        for media, status in ((None, 400), ("text/plain", 400), ("application/x-www-form-urlencoded", 400),
                              ("application/jsonl", 400), ("application/json", 200),
                              ("Application/JSON; charset=utf-8", 200)):
            connection.request("POST", path, body, {} if media is None else {"Content-Type": media})
            answer = connection.getresponse()  # (one connection throughout: each refusal leaves it usable)
            got = json.loads(answer.read())
            assert answer.status == status, (path, media, got)
            if status == 400:
                assert got["error"]["type"] == "invalid_request_error" and "application/json" in got["error"]["message"]
    connection.close()


def test_a_body_past_the_limit_is_a_413_without_waiting_for_it(server):
    """A body declared larger than any request may be (MAX_BODY) is answered 413 at once, though
    its bytes have not come, and its connection closed once its client goes (or the rest is drained,
    below); one sent in chunks, without a length, is answered once the limit is passed. The server
    then serves on."""
    from linnet.serve.server import MAX_BODY

    base, _, _ = server
    head, body = _exchange(base, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n{\"prompt\": " % (16 * MAX_BODY))
    assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "request_too_large"
    piece = b"x" * 65536
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(MAX_BODY // len(piece) + 2))
    head, body = _exchange(base, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and json.loads(body)["error"]["code"] == "request_too_large"
    assert call(base, "/v1/completions", {"prompt": [5, 6], "max_tokens": 2})[0] == 200


def test_a_413_reaches_a_client_that_sends_its_whole_body_before_reading(server):
    """http.client (as httpx, the openai client's) sends the whole body, then reads: the server's
    413 closed the connection with the body's bytes unread, and the kernel's reset reached the
    client in place of the answer (every try, at MAX_BODY + 1). The rest of the body is now read
    and dropped before the close (nginx's lingering close), declared or chunked."""
    import http.client
    from urllib.parse import urlparse

    from linnet.serve.server import MAX_BODY

    base, _, _ = server
    url = urlparse(base)
    body = b'{"prompt": "' + b"x" * (MAX_BODY - 13) + b'"}'
    for chunked in (False, True):
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        sent = [body[i:i + 65536] for i in range(0, len(body), 65536)] if chunked else body
        connection.request("POST", "/v1/completions", sent, {"Content-Type": "application/json"},
                           encode_chunked=chunked)
        answer = connection.getresponse()
        assert answer.status == 413 and answer.getheader("connection") == "close", chunked
        assert json.loads(answer.read())["error"]["code"] == "request_too_large"
        connection.close()
    assert call(base, "/v1/completions", {"prompt": [5, 6], "max_tokens": 2})[0] == 200


def test_a_413_whose_client_stalls_is_closed_after_the_drain_bound(server, monkeypatch):
    """The drain is bounded: a client that stops sending the rest of a refused body has its
    connection closed after DRAIN_SECONDS, and others are served meanwhile."""
    import socket
    from urllib.parse import urlparse

    from linnet.serve import server as served

    monkeypatch.setattr(served, "DRAIN_SECONDS", 0.3)
    base, _, _ = server
    url = urlparse(base)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        start = time.perf_counter()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n{\"prompt\": " % (2 * served.MAX_BODY))
        data = b""
        while b"request_too_large" not in data:
            data += sock.recv(65536)
        assert data.startswith(b"HTTP/1.1 413")
        assert call(base, "/v1/completions", {"prompt": [5, 6], "max_tokens": 2})[0] == 200
        while piece := sock.recv(65536):  # (the socket's timeout fails the test where it is never closed)
            data += piece
        # (less 10 ms: uvloop's timers run on libuv's clock, in whole milliseconds as of the loop's last turn,
        # which was seen to end the bound 0.04 ms before the client's own clock did)
        assert 0.29 <= time.perf_counter() - start < 5


def test_head_asks_a_gets_headers_and_a_wrong_method_is_told_the_right_one(server):
    import http.client
    from urllib.parse import urlparse

    base, _, _ = server
    url = urlparse(base)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    connection.request("HEAD", "/health")
    answer = connection.getresponse()
    assert answer.status == 200 and answer.read() == b"" and answer.getheader("content-type") == "application/json"
    connection.request("GET", "/v1/completions")
    answer = connection.getresponse()
    assert answer.status == 405 and answer.getheader("allow") == "POST" and b"takes POST" in answer.read()
    connection.request("DELETE", "/v1/models")
    answer = connection.getresponse()
    assert answer.status == 405 and answer.getheader("allow") == "GET, HEAD"
    answer.read()
    # a kept Response is read or deleted; its input items are only read
    for path, allow in (("/v1/responses/resp_x", "GET, DELETE, HEAD"), ("/v1/responses/resp_x/input_items", "GET, HEAD")):
        connection.request("POST", path)
        answer = connection.getresponse()
        takes = allow.removesuffix(", HEAD").replace(", ", " or ")
        assert answer.status == 405 and answer.getheader("allow") == allow
        assert f"takes {takes}, not POST".encode() in answer.read()
    connection.close()
    created = json.loads(call(base, "/v1/models")[1])["data"][0]["created"]
    assert abs(created - time.time()) < 3600  # when the server was started, as vLLM gives it


def test_streams_that_leave_early_free_their_rows_for_the_others(server):
    """Twelve streamed requests over four rows; half the clients hang up after their first chunk.
    Those requests end cancelled, and the rest finish with the text each gets alone."""
    import http.client
    from urllib.parse import urlparse

    base, engine, _ = server
    url = urlparse(base)
    before = engine.stats.finished.get("cancelled", 0)

    def one(i):
        prompt = [10 + i, 20 + i, 30 + i]
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
        body = {"prompt": prompt, "max_tokens": 90 if i % 2 else 8, "temperature": 0, "stream": True,
                "ignore_eos": True}
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if i % 2:  # read one event, then go away
            resp.fp.readline()
            conn.sock.close()
            return None
        return prompt, sse(resp.read().decode())

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(one, range(12)))
    for result in filter(None, results):
        prompt, chunks = result
        assert "".join(c["choices"][0]["text"] for c in chunks).split() == words(engine_greedy(engine, prompt, 8))
    deadline = time.time() + 30
    while (engine.live or engine.waiting) and time.time() < deadline:
        time.sleep(0.05)
    assert not engine.live and not engine.waiting and len(engine.free_rows) == engine.rows
    assert engine.stats.finished.get("cancelled", 0) - before == 6


def test_tools_shown_through_the_template_with_tool_choice_none():
    """With tool_choice "none" the tools go to the chat template (as transformers' apply_chat_template
    passes them), and a tool turn keeps what templates read of it; "auto" tool calls are refused."""
    from linnet.serve.openai_api import ApiError, chat_job

    from .test_engine import word_tokenizer

    tok = word_tokenizer(128)
    tok.chat_template = ("{% for t in tools or [] %}t9 {{ t['function']['name'] }} {% endfor %}"
                         "{% for m in messages %}{{ m['content'] }} {{ m.get('tool_call_id', '') }} {% endfor %}")
    tools = [{"type": "function", "function": {"name": "t50"}}]
    messages = [{"role": "user", "content": "t4"}, {"role": "tool", "content": "t5", "tool_call_id": "t6"}]
    job = chat_job({"messages": messages, "tools": tools, "tool_choice": "none"}, tok, 96)
    assert job.requests[0].prompt == [9, 50, 4, 5, 6]
    with pytest.raises(ApiError, match="--tool-call-parser"):
        chat_job({"messages": messages, "tools": tools}, tok, 96)


def test_a_jax_engine_behind_the_app():
    """The same app over the JAX backend (its decode and draw one executable): two streamed greedy
    choices and a biased one, each as the JAX engine gives it alone."""
    from .test_engine import word_tokenizer

    model = make_model("jax", rows=4, max_seq=64)
    model.tokenizer = word_tokenizer(model.vocab)
    prompt = [5, 6, 7]
    alone, _ = Engine(model).run([Request(prompt=prompt, max_new_tokens=5),
                                  Request(prompt=prompt, max_new_tokens=5, logit_bias={9: 100.0})])
    engine = Engine(model)
    engine.start()
    try:
        app = OpenAIServer(engine, "tiny")
        status, body = asyncio.run(asgi(app, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 5, "n": 2,
                                                                         "temperature": 0, "stream": True})())
        biased = asyncio.run(asgi(app, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 5, "temperature": 0,
                                                                   "logit_bias": {"9": 100}})())
    finally:
        engine.stop()
    assert status == 200
    chunks = sse(body.decode())
    for i in range(2):
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == i)
        assert text.split() == words(alone[0].tokens)
    assert json.loads(biased[1])["choices"][0]["text"].split() == words(alone[1].tokens) == ["t9"] * 5


def test_metrics_count_the_compiles_requests_waited_on(compiles_counted, caplog):
    """/metrics' linnet_compiles_total: what was compiled after the warmup, while requests waited.
    A JAX engine warmed up for one 3-token prompt: that prompt, greedy or sampled, compiles
    nothing; a 40-token prompt needs a pass of a size the warmup did not make, compiled then. The
    counter follows XLA's own compile events, counted here apart from the engine (JAX's monitoring).
    The server's log names each such compile once, when it happens (the pass it was for)."""
    import logging

    caplog.set_level(logging.WARNING, logger="linnet.serve.engine")
    from jax._src import monitoring

    from .test_engine import word_tokenizer

    model = make_model("jax", rows=4, max_seq=64)
    model.tokenizer = word_tokenizer(model.vocab)
    engine = Engine(model)
    engine.warmup([3])
    compiled = []

    def heard(event: str, seconds: float, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(event)
    monitoring.register_event_duration_secs_listener(heard)
    engine.start()
    try:
        app = OpenAIServer(engine, "tiny")

        def compiles_after(body):
            if body is not None:
                assert asyncio.run(asgi(app, "POST", "/v1/completions", body)())[0] == 200
            metrics = asyncio.run(asgi(app, "GET", "/metrics")())[1].decode()
            return int(dict(line.rsplit(" ", 1) for line in metrics.splitlines())["linnet_compiles_total"])

        assert "# TYPE linnet_compiles_total counter" in asyncio.run(asgi(app, "GET", "/metrics")())[1].decode()
        asks = {"prompt": [5, 6, 7], "max_tokens": 3}
        counts = [compiles_after(None), compiles_after(dict(asks, temperature=0)),
                  compiles_after(dict(asks, temperature=0.8, seed=1))]
        assert counts == [0, 0, 0] and compiled == []  # what the warmup covered
        told = lambda: [r.getMessage() for r in caplog.records if "compiled while serving" in r.getMessage()]  # noqa
        assert told() == []
        longer = dict(asks, prompt=list(range(1, 41)), temperature=0)
        counts.append(compiles_after(longer))
        assert counts[-1] == len(compiled) > 0
        # the pass of 40 tokens after the head's one-token slots (JAX's blocks of 8: at least 40 tokens)
        sizes = [int(m.split("a packed pass of ")[1].split()[0]) for m in told()]
        assert len(sizes) == 1 and sizes[0] >= 40, told()
        counts.append(compiles_after(dict(longer, prompt=list(range(2, 42)))))  # compiled once, then run
        assert counts[-1] == counts[-2] == len(compiled) and len(told()) == 1
    finally:
        engine.stop()
        monitoring.unregister_event_duration_listener(heard)


# A template in the way of Qwen3's: thinking left out when the caller says enable_thinking=false;
# the assistant's earlier reasoning (reasoning_content) shown in its turn.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


@pytest.mark.parametrize("body, final", [
    ({"chat_template_kwargs": {"enable_thinking": False}}, None),
    ({"chat_template_kwargs": {"enable_thinking": True}}, None),
    ({"continue_final_message": True, "add_generation_prompt": False}, "I would say "),
    ({"continue_final_message": True}, "I would say "),
    # a final text the template's own end-of-turn mark holds too (<|im_end|>), or none at all
    ({"continue_final_message": True}, "e"),
    ({"continue_final_message": True}, "end"),
    ({"continue_final_message": True}, ""),
    ({"continue_final_message": True}, "  "),
])
def test_chat_template_kwargs_and_continuing_the_final_message_render_as_transformers_does(body, final):
    """vLLM's chat_template_kwargs reach the template; continue_final_message ends the prompt inside
    the last assistant message, where its text ends (the prompt was cut inside <|im_end|> after a final
    "e"; an empty one was a 400). transformers' apply_chat_template, given the same template, is the
    reference."""
    from transformers import PreTrainedTokenizerFast

    from linnet.serve.openai_api import chat_job

    from .test_structured import byte_tokenizer

    tok = byte_tokenizer(128)
    tok.chat_template = THINKING_TEMPLATE
    messages = [{"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": "Red.", "reasoning_content": "Any will do."},
                {"role": "user", "content": "Another?"}]
    if body.get("continue_final_message"):
        messages = messages + [{"role": "assistant", "content": final}]
    reference = PreTrainedTokenizerFast(tokenizer_object=tok.backend)
    reference.chat_template = THINKING_TEMPLATE
    extend = body.get("continue_final_message", False)
    expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=not extend,
                                             continue_final_message=extend, **body.get("chat_template_kwargs", {}))
    job = chat_job({"messages": messages, **body}, tok, 512)
    assert tok.decode(job.requests[0].prompt) == expected
    assert ("<think>\n\n</think>" in expected) == (body.get("chat_template_kwargs") == {"enable_thinking": False})


def test_reasoning_effort_reaches_the_template_as_vllm_hands_it_over():
    """OpenAI's reasoning_effort is a variable of the template (gpt-oss's writes "Reasoning: high" in its
    system message); chat_template_kwargs' own wins; another word is a 400."""
    from linnet.serve.openai_api import ApiError, chat_job

    from .test_structured import byte_tokenizer

    tok = byte_tokenizer(128)
    tok.chat_template = ("Reasoning: {{ reasoning_effort | default('medium') }}\n"
                         "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    said = lambda body: tok.decode(chat_job({"messages": [{"role": "user", "content": "Hi"}], **body}, tok,
                                            512).requests[0].prompt)
    assert said({}) == "Reasoning: medium\nHi"
    assert said({"reasoning_effort": "high"}) == "Reasoning: high\nHi"
    assert said({"reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "low"}}) == "Reasoning: low\nHi"
    for bad in ("x", 3, ["high"]):
        with pytest.raises(ApiError, match="'reasoning_effort' must be one of 'minimal', 'low', 'medium', 'high'"):
            said({"reasoning_effort": bad})


@pytest.mark.parametrize("body, needle", [
    ({"chat_template_kwargs": ["enable_thinking"]}, "'chat_template_kwargs' must be an object"),
    ({"continue_final_message": True, "add_generation_prompt": True}, "cannot be sent with 'add_generation_prompt'"),
    ({"continue_final_message": "yes"}, "'continue_final_message' must be true or false"),
    ({"continue_final_message": True, "messages": [{"role": "user", "content": "Hi"}]},
     "the last message here is a user message"),
])
def test_bad_template_options_are_400s(body, needle):
    from linnet.serve.openai_api import ApiError, chat_job

    from .test_structured import byte_tokenizer

    tok = byte_tokenizer(128)
    tok.chat_template = THINKING_TEMPLATE
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    with pytest.raises(ApiError, match=needle) as err:
        chat_job({"messages": messages, **body}, tok, 512)
    assert err.value.status == 400


# Llama 3's way with a turn: `'tool_calls' in message` makes it a call (one, or the template refuses),
# and any role is a header, ipython (a tool's output) among them
HEADER_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'ipython' %}<|tool output|>{{ m.content }}"
    "{% elif 'tool_calls' in m %}{% if m.tool_calls | length != 1 %}"
    "{{ raise_exception('This model only supports single tool-calls at once!') }}{% endif %}"
    "<|call|>{{ m.tool_calls[0].function.name }}{% else %}<|{{ m.role }}|>{{ m.content }}"
    "{% if m.reasoning_content %} ({{ m.reasoning_content }}){% endif %}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.mark.parametrize("sent, seen", [
    # an empty tool_calls list is no call: the turn is a plain one (vLLM drops it; clients send [])
    ({"role": "assistant", "content": "Hello", "tool_calls": []}, {"role": "assistant", "content": "Hello"}),
    # a role past OpenAI's that the template names reaches it as it is (vLLM's custom roles, llama.cpp's server)
    ({"role": "ipython", "content": "{\"temp\": 20}"}, {"role": "ipython", "content": "{\"temp\": 20}"}),
    # vLLM's newer name for an earlier turn's thinking
    ({"role": "assistant", "content": "Hello", "reasoning": "greet"},
     {"role": "assistant", "content": "Hello", "reasoning_content": "greet"}),
])
def test_messages_reach_the_template_as_vllm_passes_them(sent, seen):
    """transformers' apply_chat_template over the messages as vLLM hands them to it is the reference."""
    from transformers import PreTrainedTokenizerFast

    from linnet.serve.openai_api import chat_job

    from .test_structured import byte_tokenizer

    tok = byte_tokenizer(128)
    tok.chat_template = HEADER_TEMPLATE
    first, last = {"role": "user", "content": "Hi"}, {"role": "user", "content": "And?"}
    reference = PreTrainedTokenizerFast(tokenizer_object=tok.backend)
    reference.chat_template = HEADER_TEMPLATE
    expected = reference.apply_chat_template([first, seen, last], tokenize=False, add_generation_prompt=True)
    job = chat_job({"messages": [first, sent, last]}, tok, 512)
    assert tok.decode(job.requests[0].prompt) == expected


# Gemma 3's way with content: a string trimmed, or each text part of a list trimmed, with nothing between
PARTS_TEMPLATE = (
    "{% for message in messages %}<start_of_turn>{{ message['role'] }}\n"
    "{%- if message['content'] is string %}{{ message['content'] | trim }}"
    "{%- else %}{%- for item in message['content'] %}{%- if item['type'] == 'text' %}{{ item['text'] | trim }}"
    "{%- endif %}{%- endfor %}{%- endif %}<end_of_turn>\n{% endfor %}"
    "{%- if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


@pytest.mark.parametrize("extend", [False, True])
def test_content_parts_reach_a_template_that_loops_over_them(extend):
    """A template that loops over a message's content gets its text parts as a list, as vLLM detects
    and passes them ("openai" content format), where others get them joined a line each; a tool's
    output is joined for every template (as vLLM's). transformers' apply_chat_template is the
    reference; with continue_final_message it cuts after the last part's text, as transformers does."""
    from transformers import PreTrainedTokenizerFast

    from linnet.serve.openai_api import chat_job

    from .test_structured import byte_tokenizer

    tok = byte_tokenizer(128)
    tok.chat_template = PARTS_TEMPLATE
    parts = [{"type": "text", "text": " Name "}, {"type": "text", "text": "a colour. "}]
    messages = [{"role": "user", "content": parts}, {"role": "tool", "tool_call_id": "c1", "content": parts}]
    seen = [messages[0], {"role": "tool", "tool_call_id": "c1", "content": " Name \na colour. "}]
    if extend:
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "Red, "},
                                                          {"type": "text", "text": "or "}]})
        seen.append(messages[-1])
    reference = PreTrainedTokenizerFast(tokenizer_object=tok.backend)
    reference.chat_template = PARTS_TEMPLATE
    expected = reference.apply_chat_template(seen, tokenize=False, add_generation_prompt=not extend,
                                             continue_final_message=extend)
    assert "Namea colour." in expected
    job = chat_job({"messages": messages, "continue_final_message": extend}, tok, 512)
    assert tok.decode(job.requests[0].prompt) == expected


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from linnet.nest.embedded import embedded_gguf_path
    from linnet.nest.tokenizer import Tokenizer

    return Tokenizer.from_gguf(embedded_gguf_path())


def test_a_prompt_no_tokenization_fits_is_refused_before_it_is_encoded(smollm2_tokenizer):
    """A text of more characters than the context's tokens could stand for (each at most the
    vocabulary's longest piece) is refused as too long unencoded: eight 4 MB prompts, each seconds
    of a thread's encoding, held every other request for a minute. The bound is the tokenizers
    library's: it encodes no text, even one of the longest pieces, into fewer tokens. A prompt whose
    tail is asked for (truncate_prompt_tokens) is still encoded whole."""
    from linnet.serve.openai_api import ApiError, chat_job, completion_job, longest_token

    tok = smollm2_tokenizer
    longest = longest_token(tok)
    pieces = sorted(tok.backend.get_vocab(with_added_tokens=True), key=len)[-40:]
    for text in (" " * 3000, "<|im_start|>" * 100, "\U0001f642" * 300, "1" * 500,
                 tok.decode([tok.backend.token_to_id(p) for p in pieces])):
        assert len(tok.encode(text, add_special_tokens=False)) >= -(-len(text) // longest), text[:40]
    max_seq = 8
    # one past the bound, with a lone surrogate at its end, which encoding it would name: too long, unencoded
    text = "a" * (max_seq * longest) + "\ud800"
    for make, param in ((lambda: completion_job({"prompt": text}, tok, max_seq), "prompt"),
                        (lambda: chat_job({"messages": [{"role": "user", "content": text}]}, tok, max_seq), "messages")):
        with pytest.raises(ApiError) as refused:
            make()
        err = refused.value.body["error"]
        assert (err["param"], err["code"]) == (param, "context_length_exceeded") and "at least" in err["message"], err
    with pytest.raises(ApiError, match="lone surrogate"):  # at the bound: encoded
        completion_job({"prompt": text[1:]}, tok, max_seq)
    whole = "hello world " * (max_seq * longest)
    job = completion_job({"prompt": whole, "truncate_prompt_tokens": 3, "max_tokens": 1}, tok, max_seq)
    assert job.requests[0].prompt == tok.backend.encode(whole).ids[-3:]


WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
UNICODE = "é 中文 🙂 עברית e\u0301 \u2028 end"


@pytest.mark.parametrize("body, seen", [
    ({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}, None),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                   {"role": "user", "content": UNICODE}]}, None),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
      "add_generation_prompt": False}, None),
    ({"messages": [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "One, two, "}],
      "continue_final_message": True}, None),
    ({"messages": [{"role": "developer", "content": ""}, {"role": "user", "content": ""}]},
     [{"role": "system", "content": ""}, {"role": "user", "content": ""}]),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
     [{"role": "user", "content": "a\nb"}]),
    ({"messages": [{"role": "user", "content": "Weather in Paris?"},
                   {"role": "assistant", "content": None, "tool_calls": [
                       {"id": "c1", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                   {"role": "tool", "tool_call_id": "c1", "content": "20 C"}], "tools": WEATHER},
     [{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [
          {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "20 C"}]),
])
def test_smollm2s_template_renders_as_transformers_does(smollm2_tokenizer, body, seen):
    """The one real card whose weights ship with Linnet: its GGUF's chat template through the server's
    path, against transformers' apply_chat_template with the same template over the messages as vLLM
    hands them over (content parts joined a line each, developer as system, calls' arguments as
    objects; `seen`, where they differ from the body's)."""
    from transformers import PreTrainedTokenizerFast

    from linnet.serve.openai_api import chat_prompt

    tok = smollm2_tokenizer
    reference = PreTrainedTokenizerFast(tokenizer_object=tok.backend)
    reference.chat_template = tok.chat_template
    extend = body.get("continue_final_message", False)
    expected = reference.apply_chat_template(seen or body["messages"], tools=body.get("tools"), tokenize=False,
                                             add_generation_prompt=body.get("add_generation_prompt", not extend),
                                             continue_final_message=extend)
    ids = chat_prompt(body, tok)
    assert tok.decode(ids) == expected
    assert ids == tok.encode(expected, add_special_tokens=False)


def test_a_template_sandbox_that_cannot_start_is_the_servers_500(monkeypatch):
    """Where no worker can start (its interpreter gone), a request's own template is the server's
    failure, not the client's: a 500 it may retry, not a 400 blaming its template."""
    import sys

    from linnet.nest.template_sandbox import TemplateSandbox
    from linnet.serve.openai_api import ApiError, chat_prompt

    from .test_structured import byte_tokenizer

    tok = byte_tokenizer(128)
    tok.chat_template = HEADER_TEMPLATE
    monkeypatch.setattr(sys, "executable", "/nonexistent/python3")
    body = {"messages": [{"role": "user", "content": "Hi"}], "chat_template": "{{ messages[0].content }}"}
    with pytest.raises(ApiError, match="could not be rendered") as err:
        chat_prompt(body, tok, TemplateSandbox())
    assert (err.value.status, err.value.body["error"]["type"]) == (500, "server_error")


def test_a_role_no_template_names_is_a_400():
    """A role past OpenAI's that the model's template never names (a typo) is the client's error, as
    OpenAI answers it; a template of the request's own takes any (its writer knows its roles)."""
    from linnet.nest.template_sandbox import TemplateSandbox
    from linnet.serve.openai_api import ApiError, chat_prompt

    from .test_structured import byte_tokenizer

    tok = byte_tokenizer(128)
    tok.chat_template = HEADER_TEMPLATE
    messages = [{"role": "user", "content": "Hi"}, {"role": "ipythn", "content": "out"}]
    with pytest.raises(ApiError, match="'ipythn' is not one of system, developer, user, assistant, tool") as err:
        chat_prompt({"messages": messages}, tok)
    assert (err.value.status, err.value.body["error"]["param"]) == (400, "messages[1].role")
    sandbox = TemplateSandbox()
    try:
        own = "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
        assert tok.decode(chat_prompt({"messages": messages, "chat_template": own}, tok, sandbox)) == \
            "user:Hi;ipythn:out;"
    finally:
        sandbox.close()


# A template in the way of Qwen2.5's and Llama 3.1's: an earlier turn's tool calls written back as
# JSON, their arguments through `tojson`, and the tool's answer after them.
TOOL_HISTORY_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
    "{% for c in m.tool_calls or [] %}<call>{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}</call>{% endfor %}"
    "{% if m.tool_call_id %} ({{ m.tool_call_id }}){% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_earlier_tool_calls_reach_the_template_as_transformers_documents_them():
    """OpenAI's clients send a call's arguments as JSON text; the template gets them as an object, as
    transformers' apply_chat_template takes them (and vLLM passes them), so `tojson` writes the call
    the model made, not a quoted string. Arguments that are not JSON are a 400."""
    from transformers import PreTrainedTokenizerFast

    from linnet.serve.openai_api import ApiError, chat_job

    from .test_structured import byte_tokenizer

    tok = byte_tokenizer(128)
    tok.chat_template = TOOL_HISTORY_TEMPLATE
    arguments = {"city": "Paris", "days": [1, 2]}

    def history(args, content=None):  # OpenAI's clients send no content with calls; templates read ""
        return [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": content, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
                {"role": "tool", "content": "Sunny", "tool_call_id": "call_1"}]

    reference = PreTrainedTokenizerFast(tokenizer_object=tok.backend)
    reference.chat_template = TOOL_HISTORY_TEMPLATE
    expected = reference.apply_chat_template(history(arguments, ""), tokenize=False, add_generation_prompt=True)
    assert '"arguments": {"city": "Paris"' in expected
    for sent in (json.dumps(arguments), arguments):  # as OpenAI's client sends them, and as an object
        job = chat_job({"messages": history(sent)}, tok, 512)
        assert tok.decode(job.requests[0].prompt) == expected
    for bad, needle in (("{city", "arguments' is not JSON"), (None, "must be {'id'")):
        messages = history(bad)
        if bad is None:
            messages[1]["tool_calls"] = [{"function": "get_weather"}]
        with pytest.raises(ApiError, match=needle) as err:
            chat_job({"messages": messages}, tok, 512)
        assert err.value.status == 400


# A template shaped as Qwen2.5's (Hermes' tags): tools listed in the system turn, each earlier call
# a <tool_call> of its arguments, consecutive tool results one user turn
QWEN_TOOL_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    '{%- else %}{{- \'You are Qwen.\' }}{%- endif %}{{- "\\n\\n# Tools\\n\\n<tools>" }}'
    '{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}'
    '{%- endfor %}{{- "\\n</tools><|im_end|>\\n" }}{%- endif %}\n{%- for message in messages %}'
    '{%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}{{- \'<|im_start|>\' + message.role + \'\\n\' + message.content + \'<|im_end|>\' + \'\\n\' }}'
    '{%- elif message.role == "assistant" %}{{- \'<|im_start|>\' + message.role }}'
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    '{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}'
    '{%- set tool_call = tool_call.function %}'
    '{%- endif %}{{- \'\\n<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}{{- tool_call.arguments | tojson }}{{- \'}\\n</tool_call>\' }}'
    '{%- endfor %}{{- \'<|im_end|>\\n\' }}{%- elif message.role == "tool" %}'
    '{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}{{- \'<|im_start|>user\' }}'
    "{%- endif %}{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    '{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- \'<|im_end|>\\n\' }}'
    '{%- endif %}{%- endif %}{%- endfor %}'
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def test_a_history_of_several_calls_and_their_results_renders_as_transformers_renders_it():
    """Two calls in one assistant turn (non-ASCII and escaped arguments, sent as OpenAI's clients
    send them, JSON text), their two tool results, then an answer and a new question, with the
    tools: the prompt is transformers' apply_chat_template's over the same conversation (the
    arguments as objects, as transformers documents them)."""
    from transformers import PreTrainedTokenizerFast

    from linnet.serve.openai_api import chat_job

    from .test_structured import byte_tokenizer

    tok = byte_tokenizer(300, bytes(range(128, 256)))  # every byte a token: the text is kept whole
    tok.chat_template = QWEN_TOOL_TEMPLATE
    reference = PreTrainedTokenizerFast(tokenizer_object=tok.backend)
    reference.chat_template = QWEN_TOOL_TEMPLATE
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather ü", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
    made = [("get_weather", {"city": 'Zürich "old town"'}), ("get_time", {})]

    def conversation(arguments):
        return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather and time?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": f"call_{k}", "type": "function", "function": {"name": n, "arguments": arguments(a)}}
                    for k, (n, a) in enumerate(made)]},
                {"role": "tool", "content": "Sunny", "tool_call_id": "call_0"},
                {"role": "tool", "content": "12:00", "tool_call_id": "call_1"},
                {"role": "assistant", "content": "Sunny at noon."}, {"role": "user", "content": "Thanks"}]

    expected = reference.apply_chat_template(conversation(lambda a: a), tools=tools, tokenize=False,
                                             add_generation_prompt=True)
    assert '{"city": "Zürich \\"old town\\""}' in expected and expected.count("<tool_response>") == 2
    job = chat_job({"messages": conversation(json.dumps), "tools": tools, "tool_choice": "none"}, tok, 4096)
    assert tok.decode(job.requests[0].prompt) == expected


def test_text_parts_are_a_line_each_as_vllm_and_llama_cpp_join_them():
    """A message's text parts reach the template as one text, a line each: vLLM's chat parser and
    llama.cpp's server join them with a newline (transformers would hand the template the list,
    which a template of strings cannot read); Responses' input_text parts as chat's. They were
    joined with nothing, which ran the last word of one part into the first of the next."""
    from transformers import PreTrainedTokenizerFast

    from linnet.serve.openai_api import chat_job
    from linnet.serve.responses_api import chat_body, read_call

    from .test_structured import byte_tokenizer

    tok = byte_tokenizer(128)
    tok.chat_template = TOOL_HISTORY_TEMPLATE
    reference = PreTrainedTokenizerFast(tokenizer_object=tok.backend)
    reference.chat_template = TOOL_HISTORY_TEMPLATE
    expected = reference.apply_chat_template([{"role": "user", "content": "Describe\nthis\n"}], tokenize=False,
                                             add_generation_prompt=True)
    texts = ["Describe", "this", ""]
    chat = chat_job({"messages": [{"role": "user", "content": [{"type": "text", "text": t} for t in texts]}]},
                    tok, 512)
    responses = chat_job(chat_body(read_call({"input": [
        {"role": "user", "content": [{"type": "input_text", "text": t} for t in texts]}]}, None)), tok, 512)
    assert tok.decode(chat.requests[0].prompt) == tok.decode(responses.requests[0].prompt) == expected


def test_a_requests_own_chat_template_and_documents(server):
    """vLLM's request-level chat_template, only where the server is started trusting it (a
    template runs sandboxed, but may run long); `documents` reach the template as transformers
    passes them."""
    from .conftest import TEMPLATE, running
    from .test_engine import word_tokenizer

    base, _, _ = server
    own = "t7 t8 {% for m in messages %}{{ m['content'] }}{% endfor %}"
    body = {"messages": [{"role": "user", "content": "t5 t6"}], "chat_template": own}
    status, text = call(base, "/tokenize", body)
    assert status == 400 and "--trust-request-chat-template" in json.loads(text)["error"]["message"]
    assert call(base, "/v1/chat/completions", dict(body, max_tokens=2))[0] == 400
    model = make_model("torch", rows=2, max_seq=64)
    model.tokenizer = word_tokenizer(model.vocab)
    model.tokenizer.chat_template = TEMPLATE
    with running(Engine(model), trust_request_chat_template=True) as trusted:
        assert json.loads(call(trusted, "/tokenize", body)[1])["tokens"] == [7, 8, 5, 6]
        reply = json.loads(call(trusted, "/v1/chat/completions", dict(body, max_tokens=2, temperature=0))[1])
        assert reply["usage"]["prompt_tokens"] == 4
        cited = {"messages": body["messages"], "documents": [{"title": "a", "text": "t9"}, {"text": "t3"}],
                 "chat_template": "{% for d in documents %}{{ d.text }} {% endfor %}{{ messages[0].content }}"}
        assert json.loads(call(trusted, "/tokenize", cited)[1])["tokens"] == [9, 3, 5, 6]
        turn = [*body["messages"], {"role": "assistant", "content": "t7"}]
        for bad, needle in (({"chat_template": 5}, "chat_template"), ({"chat_template": "{% for %}"}, "template"),
                            ({"documents": "t9"}, "documents"), ({"chat_template": " "}, "must be a Jinja template"),
                            ({"chat_template": "{{ raise_exception('no tools') }}"}, "'chat_template' failed: "
                                                                                       "chat template: no tools"),
                            # a template that does not keep the final message's text cannot be continued
                            ({"messages": turn, "continue_final_message": True,
                              "chat_template": "{% for m in messages %}{{ m.content | upper }}{% endfor %}"},
                             "does not keep the final message's text")):
            status, text = call(trusted, "/tokenize", dict(body, **bad))
            assert status == 400 and needle in json.loads(text)["error"]["message"], text


def test_a_hostile_request_template_gets_a_400_and_the_others_are_served():
    """A request's own template that would take the server's time or memory is stopped in its worker
    process (vLLM renders it in the server's own): its request gets a 400 naming the bound, while
    requests beside it, with the model's template or a template of their own, are answered. A flood
    of slow templates (more than asyncio's threads: 6 on 2 cores) holds up only templates of their own:
    the model's template's request is answered before the first of them."""
    from linnet.nest.template_sandbox import TemplateSandbox

    from .conftest import TEMPLATE, running
    from .test_engine import word_tokenizer

    model = make_model("torch", rows=2, max_seq=64)
    model.tokenizer = word_tokenizer(model.vocab)
    model.tokenizer.chat_template = TEMPLATE
    messages = [{"role": "user", "content": "t5 t6"}]
    hostile = {"slow": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
               "big": '{{ "x" * 10**10 }}'}
    bodies = [{"messages": messages, "max_tokens": 3, "temperature": 0, "chat_template": template}
              for template in [hostile["slow"]] * 7 + [hostile["big"]]]
    bodies += [{"messages": messages, "max_tokens": 3, "temperature": 0},
               {"messages": messages, "max_tokens": 3, "temperature": 0,
                "chat_template": "t7 {% for m in messages %}{{ m.content }}{% endfor %}"}]
    sandbox = TemplateSandbox(seconds=1)
    with running(Engine(model), trust_request_chat_template=True, template_sandbox=sandbox) as base:
        def timed(body):
            status, text = call(base, "/v1/chat/completions", body)
            return status, json.loads(text), time.monotonic()

        with ThreadPoolExecutor(len(bodies)) as pool:
            *slow, big, plain, own = pool.map(timed, bodies)
        for status, reply, _ in (*slow, big):
            assert status == 400 and reply["error"]["param"] == "chat_template"
            assert reply["error"]["type"] == "invalid_request_error"
        assert all("did not finish within 1 s" in reply["error"]["message"] for _, reply, _ in slow)
        assert "'*' would make 10000000000 items" in big[1]["error"]["message"]
        assert plain[0] == 200 and plain[1]["usage"]["prompt_tokens"] == 5  # t1 t5 t6 t2 t3
        assert own[0] == 200 and own[1]["usage"]["prompt_tokens"] == 3      # t7 t5 t6
        assert plain[2] < min(done for _, _, done in slow)  # answered while the hostile ones still rendered
        # and the sandbox serves on after its workers were killed
        own_body = {"messages": messages, "chat_template": bodies[-1]["chat_template"]}
        again = json.loads(call(base, "/tokenize", own_body)[1])
        assert again["tokens"] == [7, 5, 6]


def test_return_tokens_as_token_ids_names_logprob_tokens_by_id(server):
    """vLLM's return_tokens_as_token_ids: "token_id:ID" where the token's text would be (the word
    tokenizer's token ID is the text tID), whole and streamed, completions and chat."""
    base, _, _ = server
    body = {"prompt": "t5 t6", "max_tokens": 4, "temperature": 0, "logprobs": 2}
    named = json.loads(call(base, "/v1/completions", body)[1])["choices"][0]["logprobs"]
    by_id = json.loads(call(base, "/v1/completions", dict(body, return_tokens_as_token_ids=True))[1])["choices"][0]
    as_id = lambda text: f"token_id:{text[1:]}"
    assert by_id["logprobs"]["tokens"] == [as_id(t) for t in named["tokens"]]
    assert [list(d) for d in by_id["logprobs"]["top_logprobs"]] == [[as_id(t) for t in d] for d in named["top_logprobs"]]
    streamed = sse(call(base, "/v1/completions", dict(body, return_tokens_as_token_ids=True, stream=True))[1])
    assert [t for c in streamed if c["choices"][0]["logprobs"] for t in c["choices"][0]["logprobs"]["tokens"]] \
        == by_id["logprobs"]["tokens"]
    chat = {"messages": [{"role": "user", "content": "t5"}], "max_tokens": 3, "temperature": 0, "logprobs": True,
            "top_logprobs": 1, "return_tokens_as_token_ids": True}
    content = json.loads(call(base, "/v1/chat/completions", chat)[1])["choices"][0]["logprobs"]["content"]
    assert all(e["token"].startswith("token_id:") and e["top_logprobs"][0]["token"].startswith("token_id:")
               for e in content)
    assert call(base, "/v1/completions", dict(body, return_tokens_as_token_ids="yes"))[0] == 400


def test_a_web_page_on_another_origin_may_call_as_vllm_lets_it(server):
    """CORS, with vLLM's defaults: a browser's preflight (OPTIONS, before the API key is sent) is
    answered with what may be sent, and every answer to that origin, errors too, names it allowed;
    a request with no Origin (curl, SDKs) gets no CORS header."""
    import http.client
    from urllib.parse import urlparse

    base, _, _ = server
    url = urlparse(base)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    connection.request("OPTIONS", "/v1/chat/completions", headers={
        "Origin": "https://ui.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    answer = connection.getresponse()
    assert answer.status == 200 and answer.read() == b"" and answer.getheader("x-request-id")
    assert answer.getheader("access-control-allow-origin") == "*"
    assert "POST" in answer.getheader("access-control-allow-methods").split(", ")
    assert answer.getheader("access-control-allow-headers") == "authorization, content-type"
    for headers, allowed in (({"Origin": "https://ui.example"}, "*"), ({}, None)):
        connection.request("POST", "/v1/completions", body=json.dumps({"prompt": "t1", "max_tokens": 2}),
                           headers={"Content-Type": "application/json", **headers})
        answer = connection.getresponse()
        assert answer.status == 200 and answer.getheader("access-control-allow-origin") == allowed
        answer.read()
    connection.request("POST", "/v1/completions", body=b"{", headers={"Origin": "https://ui.example"})
    answer = connection.getresponse()
    assert answer.status == 400 and answer.getheader("access-control-allow-origin") == "*"  # the page reads why
    answer.read()
    connection.request("OPTIONS", "/v1/completions")  # not a preflight: a method the route does not take
    answer = connection.getresponse()
    assert answer.status == 405 and answer.getheader("allow") == "POST"
    answer.read()
    connection.close()


def test_cors_limited_to_named_origins_methods_and_headers():
    """--allowed-origins / --allowed-methods / --allowed-headers / --allow-credentials: another origin,
    method or header is refused at the preflight, naming which; with credentials the origin is named
    (a browser refuses "*" then) and the answer varies by it."""
    from linnet.serve.cors import CorsPolicy, parse_list

    assert parse_list('["https://a.example", "https://b.example"]') == parse_list("https://a.example, https://b.example")
    with pytest.raises(ValueError, match="every item must be a string"):  # (vLLM's flag takes a list of strings)
        parse_list('["https://a.example", 8000]')
    policy = CorsPolicy(["https://ui.example"], ["GET", "POST"], ["Authorization"], credentials=True)
    app = OpenAIServer(Engine(make_model("torch", rows=2, max_seq=64)), "tiny", api_key="sesame", cors=policy)

    def preflight(origin, method, asked=""):
        got = {}
        head = [(b"origin", origin.encode()), (b"access-control-request-method", method.encode())]
        if asked:
            head.append((b"access-control-request-headers", asked.encode()))
        status, body = asyncio.run(asgi(app, "OPTIONS", "/v1/models", headers=head, answer_headers=got)())
        return status, body, got

    # content-type, which a page's JSON POST asks for, is always allowed (as Starlette's, vLLM's)
    status, _, got = preflight("https://ui.example", "POST", "Authorization, Content-Type")
    assert status == 200 and got["access-control-allow-origin"] == "https://ui.example"
    assert got["access-control-allow-credentials"] == "true" and got["vary"] == "Origin"
    assert got["access-control-allow-methods"] == "GET, POST"
    for origin, method, asked, needle in (("https://evil.example", "POST", "", "origin 'https://evil.example'"),
                                          ("https://ui.example", "DELETE", "", "method 'DELETE'"),
                                          ("https://ui.example", "POST", "x-secret", "header 'x-secret'")):
        status, body, got = preflight(origin, method, asked)
        assert status == 400 and needle in json.loads(body)["error"]["message"]
        assert "access-control-allow-origin" not in got
    got = {}
    auth = [(b"origin", b"https://ui.example"), (b"authorization", b"Bearer sesame")]
    assert asyncio.run(asgi(app, "GET", "/v1/models", headers=auth, answer_headers=got)())[0] == 200
    assert got["access-control-allow-origin"] == "https://ui.example"
    got = {}
    other = [(b"origin", b"https://evil.example"), (b"authorization", b"Bearer sesame")]
    assert asyncio.run(asgi(app, "GET", "/v1/models", headers=other, answer_headers=got)())[0] == 200
    assert "access-control-allow-origin" not in got  # answered, but the browser keeps it from that page
