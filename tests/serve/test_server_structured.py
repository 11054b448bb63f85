"""Structured outputs and tool calls through the server, over a random tiny model whose tokens are
bytes (test_structured.byte_tokenizer): each answer is read back by an independent reader (json, re)
and held to what the body asked; OpenAI's client reads the tool calls."""

import json
import re
import time

import pytest

from linnet.serve import Engine

from .conftest import make_model, running
from .test_server import call, sse, streamed_calls
from .test_structured import byte_tokenizer, nested

pytest.importorskip("llguidance")

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city", "days"],
    "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["zone"],
    "properties": {"zone": {"enum": ["UTC", "CET"]}}}}}
USER = [{"role": "user", "content": "Weather?"}]


@pytest.fixture(scope="module")
def base():
    model = make_model("torch", rows=4, max_seq=128)
    model.tokenizer = byte_tokenizer(model.vocab)
    model.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    with running(Engine(model)) as url:
        yield url


def chat(base, **body):
    status, text = call(base, "/v1/chat/completions", dict({"messages": USER, "max_tokens": 60, "seed": 1}, **body))
    assert status == 200, text
    return json.loads(text)


def test_response_format_json_schema_and_json_object(base):
    schema = WEATHER["function"]["parameters"]
    out = chat(base, response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}, n=3)
    for choice in out["choices"]:
        value = json.loads(choice["message"]["content"])
        assert set(value) == {"city", "days"} and len(value["city"]) <= 8 and 1 <= value["days"] <= 7
        assert choice["finish_reason"] == "stop"
    anything = chat(base, response_format={"type": "json_object"}, max_tokens=40)["choices"][0]
    assert anything["message"]["content"].startswith("{")
    if anything["finish_reason"] == "stop":
        assert isinstance(json.loads(anything["message"]["content"]), dict)


def test_the_responses_apis_text_format_json_schema(base):
    """The Responses API's form of response_format: text.format, the schema beside its name."""
    schema = WEATHER["function"]["parameters"]
    status, text = call(base, "/v1/responses", {"input": "Weather?", "max_output_tokens": 60, "seed": 1, "text": {
        "format": {"type": "json_schema", "name": "w", "schema": schema, "strict": True}}})
    reply = json.loads(text)
    assert status == 200 and reply["status"] == "completed", text
    value = json.loads(reply["output"][0]["content"][0]["text"])
    assert set(value) == {"city", "days"} and len(value["city"]) <= 8 and 1 <= value["days"] <= 7


def test_allowed_token_ids_that_corner_a_structure_partway_are_the_clients_400(base):
    # "n" of "yes|no" is allowed and "o" is not: the request ends partway with the client's error (a
    # 400 at allowed_token_ids), not the server's 500
    n = json.loads(call(base, "/tokenize", {"prompt": "n", "add_special_tokens": False})[1])["tokens"]
    body = {"prompt": "Say:", "max_tokens": 6, "temperature": 1.0, "seed": 2,
            "structured_outputs": {"regex": "yes|no"}, "allowed_token_ids": n}
    status, text = call(base, "/v1/completions", body)
    error = json.loads(text)["error"]
    assert status == 400 and error["param"] == "allowed_token_ids" and error["type"] == "invalid_request_error"
    assert "fits the structure after 1 token" in error["message"]
    assert call(base, "/v1/completions", {"prompt": "Say:", "max_tokens": 2})[0] == 200


def test_a_structure_slow_to_compile_holds_no_other_request():
    """A structure's matcher is compiled as its request is submitted, which is done off the event
    loop, on threads of the structures' own: a large one (60,000 choices with a 49k vocabulary,
    8 s) held every other request, /health too, while it was compiled on the loop. Here the compile
    is held on an event until the others have been answered."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from linnet.serve.server import OpenAIServer

    model = make_model("torch", rows=2, max_seq=128)
    model.tokenizer = byte_tokenizer(model.vocab)
    engine = Engine(model)
    guide, entered, gate = engine.guide(), threading.Event(), threading.Event()
    compile_matcher = guide.matcher

    def held(structure, request_id):
        entered.set()
        gate.wait(60)
        return compile_matcher(structure, request_id)

    guide.matcher = held
    body = {"prompt": "Say:", "max_tokens": 4, "guided_choice": ["yes", "no"]}
    with running(engine, app=OpenAIServer(engine, "tiny")) as url, ThreadPoolExecutor(1) as pool:
        heavy = pool.submit(call, url, "/v1/completions", body)
        try:
            assert entered.wait(60)
            assert call(url, "/health")[0] == 200
            assert call(url, "/v1/completions", {"prompt": "Say:", "max_tokens": 1})[0] == 200
            assert not heavy.done()  # (its matcher still compiling)
        finally:
            gate.set()
        status, text = heavy.result(60)
    assert status == 200 and json.loads(text)["choices"][0]["text"] in ("yes", "no"), text[:300]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_streamed_choice_cornered_partway_sends_the_error_the_request_gets_unstreamed(base, path):
    # the same request as above, streamed with n=2: once its response has begun, each failed choice's
    # event is the body it gets unstreamed (the client's 400 at allowed_token_ids, not a 500), and
    # the stream still ends with [DONE]
    n = json.loads(call(base, "/tokenize", {"prompt": "n", "add_special_tokens": False})[1])["tokens"]
    body = {"max_tokens": 6, "temperature": 1.0, "seed": 2, "n": 2, "structured_outputs": {"regex": "yes|no"},
            "allowed_token_ids": n, **({"prompt": "Say:"} if path == "/v1/completions" else {"messages": USER})}
    status, text = call(base, path, body)
    assert status == 400
    status, streamed = call(base, path, dict(body, stream=True))
    assert status == 200
    errors = [c for c in sse(streamed) if "error" in c]
    assert errors == [json.loads(text)] * 2


def test_a_streamed_response_cornered_partway_fails_as_openais_do(base):
    # the Responses API's own events (OpenAI's streaming reference): an "error" event with the error
    # the request gets unstreamed, then "response.failed", its Response's status "failed", kept for
    # no previous_response_id
    body = {"input": "Weather?", "max_output_tokens": 6, "temperature": 1.0, "seed": 2,
            "text": {"format": {"type": "json_object"}},
            "allowed_token_ids": json.loads(call(base, "/tokenize", {"prompt": "{", "add_special_tokens": False})[1])[
                "tokens"]}
    status, text = call(base, "/v1/responses", body)
    assert status == 400
    unstreamed = json.loads(text)["error"]
    status, streamed = call(base, "/v1/responses", dict(body, stream=True))
    assert status == 200
    events = [json.loads(line[6:]) for line in streamed.splitlines() if line.startswith("data: ")]
    names = [line[7:] for line in streamed.splitlines() if line.startswith("event: ")]
    assert names == [e["type"] for e in events] and [e["sequence_number"] for e in events] == list(range(len(events)))
    errors = [e for e in events if e["type"] == "error"]
    assert [(e["code"], e["message"], e["param"]) for e in errors] == \
        [(unstreamed["code"], unstreamed["message"], unstreamed["param"])]
    last = events[-1]
    assert last["type"] == "response.failed" and last["response"]["status"] == "failed"
    assert last["response"]["error"] == {"code": "invalid_prompt", "message": unstreamed["message"]}
    status, text = call(base, f"/v1/responses/{last['response']['id']}")
    assert status == 404


def test_vllm_structured_outputs_and_guided_fields_on_completions(base):
    for body in ({"structured_outputs": {"regex": "[0-9]{2}-[a-c]{3}"}}, {"guided_regex": "[0-9]{2}-[a-c]{3}"}):
        out = json.loads(call(base, "/v1/completions", dict(body, prompt="Code:", max_tokens=20, n=2, seed=4))[1])
        assert all(re.fullmatch("[0-9]{2}-[a-c]{3}", c["text"]) for c in out["choices"])
    out = json.loads(call(base, "/v1/completions", {"prompt": "Pick:", "max_tokens": 20, "temperature": 0,
                                                     "structured_outputs": {"choice": ["alpha", "beta"]}})[1])
    assert out["choices"][0]["text"] in ("alpha", "beta")
    streamed = sse(call(base, "/v1/completions", {"prompt": "Pick:", "max_tokens": 20, "temperature": 0,
                                                   "guided_choice": ["alpha", "beta"], "stream": True})[1])
    assert "".join(c["choices"][0]["text"] for c in streamed) == out["choices"][0]["text"]
    grammar = 'root ::= "(" [a-z] ")" | "[" [0-9] "]"'
    out = json.loads(call(base, "/v1/completions", {"prompt": "G:", "max_tokens": 10, "guided_grammar": grammar})[1])
    assert re.fullmatch(r"\([a-z]\)|\[[0-9]\]", out["choices"][0]["text"])


def test_a_named_tool_choice_calls_that_function_with_valid_arguments(base):
    body = dict(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    out = chat(base, **body)
    choice = out["choices"][0]
    # a named function's call ends as "stop" ("tool_calls" for "auto" and "required"), as OpenAI's and vLLM's
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] is None
    [tool_call] = choice["message"]["tool_calls"]
    assert tool_call["type"] == "function" and tool_call["function"]["name"] == "get_weather"
    args = json.loads(tool_call["function"]["arguments"])
    assert set(args) == {"city", "days"} and 1 <= args["days"] <= 7
    chunks = sse(call(base, "/v1/chat/completions", dict({"messages": USER, "max_tokens": 60, "seed": 1},
                                                          stream=True, **body))[1])
    deltas = [c["choices"][0]["delta"] for c in chunks]
    [streamed] = streamed_calls(deltas)
    assert streamed["function"] == tool_call["function"]  # the same seed
    # the arguments go as the model writes them (a byte tokenizer: a character a token), not whole at the end
    assert sum("tool_calls" in d for d in deltas) > 10
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"


def test_a_call_cut_short_reads_the_same_whole_and_streamed(base):
    """A forced call cut by max_tokens is the call as far as written, as OpenAI gives one, with
    finish_reason "length": what the stream sent of it, nothing more, nothing as text."""
    body = dict({"messages": USER, "max_tokens": 9, "seed": 3, "tools": [WEATHER, TIME]},
                tool_choice={"type": "function", "function": {"name": "get_time"}})
    choice = chat(base, **body)["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
    [cut] = choice["message"]["tool_calls"]
    assert cut["function"]["name"] == "get_time" and cut["function"]["arguments"].startswith("{")
    with pytest.raises(ValueError):
        json.loads(cut["function"]["arguments"])
    chunks = sse(call(base, "/v1/chat/completions", dict(body, stream=True))[1])
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert [c["function"] for c in streamed_calls(deltas)] == [cut["function"]]  # the same seed
    assert not any(d.get("content") for d in deltas) and chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_required_calls_any_of_the_tools_and_parallel_false_calls_one(base):
    out = chat(base, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False, n=4,
               max_tokens=100)
    for choice in out["choices"]:
        [tool_call] = choice["message"]["tool_calls"]
        args = json.loads(tool_call["function"]["arguments"])
        if tool_call["function"]["name"] == "get_time":
            assert args["zone"] in ("UTC", "CET")
        else:
            assert tool_call["function"]["name"] == "get_weather" and set(args) == {"city", "days"}


def test_openais_client_reads_the_tool_calls(base):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    out = client.chat.completions.create(model="tiny", messages=USER, tools=[TIME], max_tokens=40, seed=2,
                                         tool_choice={"type": "function", "function": {"name": "get_time"}})
    call_ = out.choices[0].message.tool_calls[0]
    assert call_.function.name == "get_time" and json.loads(call_.function.arguments)["zone"] in ("UTC", "CET")
    # streamed, as the client's own stream helper puts the pieces together
    with client.chat.completions.stream(model="tiny", messages=USER, tools=[TIME], max_tokens=40, seed=2,
                                        tool_choice={"type": "function", "function": {"name": "get_time"}}) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    assert [(c.function.name, c.function.arguments) for c in final.choices[0].message.tool_calls] \
        == [(call_.function.name, call_.function.arguments)]
    assert sum(e.type == "tool_calls.function.arguments.delta" for e in events) > 3


@pytest.mark.parametrize("body,needle", [
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "one structure"),
    ({"guided_regex": "(unclosed"}, "cannot be used"),
    ({"guided_json": "{not json"}, "Expecting"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}}, "cannot be used"),
    ({"structured_outputs": {"grammar": "start: ("}}, "grammar"),
    ({"structured_outputs": {"yaml": "a"}}, "structured_outputs"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": [1]}}}, "response_format"),
    ({"tools": [WEATHER]}, "needs the server started with --tool-call-parser"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "naming one of"),
    ({"tools": [{"type": "function"}], "tool_choice": "required"}, "tools[0]"),
    ({"tool_choice": "required"}, "needs 'tools'"),
    ({"tools": [WEATHER], "tool_choice": "required", "guided_regex": "a"}, "no other structure"),
    ({"guided_regex": ""}, "a regex must be a non-empty string"),
    ({"guided_regex": "abc\\"}, "lone backslash"),
    ({"guided_regex": "[^\\s\\S]"}, "no text this model can write matches the regex"),
    ({"guided_json": nested({"type": "integer"}, 400)}, "nested too deeply"),
    # every token allowed is an end token, which min_tokens keeps out: the engine's refusal, as a 400
    ({"allowed_token_ids": [0], "min_tokens": 1}, "nothing could be drawn"),
])
def test_bad_structures_get_a_400_and_the_server_goes_on(base, body, needle):
    status, text = call(base, "/v1/chat/completions", dict({"messages": USER, "max_tokens": 5}, **body))
    assert status == 400, text
    err = json.loads(text)["error"]
    assert needle in err["message"] and "req-" not in err["message"]
    # the param is the body's field the structure came from
    assert err["param"].split("[")[0].split(".")[0] in (*body, "tool_choice"), err
    assert chat(base, max_tokens=3)["choices"][0]["finish_reason"] in ("length", "stop")


def _tool(parameters) -> dict:
    return {"type": "function", "function": {"name": "broken", "parameters": parameters}}


@pytest.mark.parametrize("parameters,field", [
    ({"type": "object", "properties": [1]}, "properties"),
    ({"type": "object", "properties": {"x": "string"}}, "properties"),
    ({"type": "object", "required": "x"}, "required"),
    ({"type": "object", "required": [1]}, "required"),
    ({"type": "nonsense"}, "type"),
    ({"type": ["object", 3]}, "type"),
    # a schema, but not an object's: a call's arguments were empty, or "required" gave no call at all
    ({"type": "array", "items": {"type": "integer"}}, "type"), ({"type": "string"}, "type"),
])
@pytest.mark.parametrize("tool_choice", ["none", "required", {"type": "function", "function": {"name": "broken"}}])
def test_a_tool_whose_parameters_are_no_schema_is_a_400_naming_its_field(base, parameters, field, tool_choice):
    """OpenAI's 400 for a tool's parameters that are no JSON schema names the field, whatever
    tool_choice says (the parameters reach the template and the parsers all the same)."""
    body = {"messages": USER, "max_tokens": 5, "tools": [TIME, _tool(parameters)], "tool_choice": tool_choice}
    status, text = call(base, "/v1/chat/completions", body)
    assert status == 400, text
    assert json.loads(text)["error"]["param"] == f"tools[1].function.parameters.{field}"
    assert chat(base, max_tokens=3)["choices"][0]["finish_reason"] in ("length", "stop")


def test_a_forced_call_to_a_schema_that_cannot_hold_it_is_a_400_naming_the_tool(base):
    """A schema of the right shape that cannot be followed (a $ref to nothing) is refused where a
    call is held to it, naming the tool's parameters, not tool_choice; with "none" nothing holds to
    it, as vLLM's does."""
    broken = _tool({"type": "object", "properties": {"x": {"$ref": "#/$defs/nothing"}}})
    for tool_choice in ("required", {"type": "function", "function": {"name": "broken"}}):
        body = {"messages": USER, "max_tokens": 5, "tools": [TIME, broken], "tool_choice": tool_choice}
        status, text = call(base, "/v1/chat/completions", body)
        assert status == 400, text
        err = json.loads(text)["error"]
        assert err["param"] == "tools[1].function.parameters" and "'broken'" in err["message"] and "$defs" in err["message"]
    # a call forced to the other, sound tool is not refused for this one
    forced_time = {"type": "function", "function": {"name": "get_time"}}
    assert chat(base, tools=[TIME, broken], tool_choice=forced_time)["choices"][0]["message"]["tool_calls"]
    assert chat(base, tools=[TIME, broken], tool_choice="none", max_tokens=3)["choices"][0]["message"]["content"]


@pytest.fixture(scope="module", params=["hermes", "llama3_json", "mistral", "pythonic", "qwen3_coder"])
def auto_base(request):
    """A server that reads tool_choice "auto" replies in one family's format (Mistral's marker a
    special token of the tokenizer, as it is in Mistral's)."""
    from tokenizers import AddedToken

    model = make_model("torch", rows=4, max_seq=256)
    model.tokenizer = byte_tokenizer(model.vocab)
    model.tokenizer.backend.add_special_tokens([AddedToken(m, special=True) for m in MISTRAL])
    assert [model.tokenizer.token_to_id(m) for m in MISTRAL] == list(MISTRAL.values())  # as `forced` names them
    model.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    with running(Engine(model), tool_parser=request.param) as url:
        yield url, request.param


# Mistral's special tokens, as `auto_base` adds them: byte_tokenizer's 97 tokens, then these
MISTRAL = {"[TOOL_CALLS]": 97, "[ARGS]": 98}


def forced(text: str) -> dict:
    """A body field making the random model write `text` (a regex matching it alone); with Mistral's
    special tokens in it, a grammar naming them by id."""
    parts = [p for p in re.split(r"(\[TOOL_CALLS\]|\[ARGS\])", text) if p]
    if not any(p in MISTRAL for p in parts):
        return {"guided_regex": re.escape(text)}
    return {"guided_grammar": "start: " + " ".join(f"<[{MISTRAL[p]}]>" if p in MISTRAL else json.dumps(p) for p in parts)}


def test_auto_tells_a_call_from_text_in_the_models_own_format(auto_base):
    base, parser = auto_base
    name, args = "get_time", {"zone": "CET"}
    if parser == "qwen3_coder":  # values bare, typed by the request's schema: "days" is an integer
        name, args = "get_weather", {"city": "Paris", "days": 3}
        reply = ("Let me see.<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>"
                 "<parameter=days>3</parameter></function></tool_call>")
        content = "Let me see."
    elif parser == "hermes":
        reply = 'Let me see.<tool_call>{"name": "get_time", "arguments": ' + json.dumps(args) + "}</tool_call>"
        content = "Let me see."
    elif parser == "mistral":  # the marker is a special token, drawn as one: a grammar names it by id
        reply = 'Let me see.[TOOL_CALLS][{"name": "get_time", "arguments": ' + json.dumps(args) + "}]"
        content = "Let me see."
    elif parser == "pythonic":
        reply = '[get_time(zone="CET")]'
        content = None
    else:
        reply = '{"name": "get_time", "parameters": ' + json.dumps(args) + "}"
        content = None
    replies = [reply]
    if parser == "mistral":  # and as Mistral's v11 tokenizers write it: the name, then [ARGS], special too
        replies.append("Let me see.[TOOL_CALLS]get_time[ARGS]" + json.dumps(args))
    for reply in replies:
        body = dict({"messages": USER, "max_tokens": 140, "tools": [TIME, WEATHER]}, **forced(reply))
        choice = json.loads(call(base, "/v1/chat/completions", body)[1])["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == content
        [tool_call] = choice["message"]["tool_calls"]
        assert tool_call["function"]["name"] == name and json.loads(tool_call["function"]["arguments"]) == args
        assert (len(tool_call["id"]) == 9) == (parser == "mistral")  # Mistral's templates take back only such ids
        chunks = sse(call(base, "/v1/chat/completions", dict(body, stream=True))[1])
        deltas = [c["choices"][0]["delta"] for c in chunks]
        assert "".join(d.get("content") or "" for d in deltas) == (content or "")  # the call's text is never streamed
        [streamed] = streamed_calls(deltas)
        assert streamed["function"] == tool_call["function"] and (len(streamed["id"]) == 9) == (parser == "mistral")
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    plain = dict({"messages": USER, "max_tokens": 40, "tools": [TIME]}, **forced("It is noon {UTC}."))
    choice = json.loads(call(base, "/v1/chat/completions", plain)[1])["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "It is noon {UTC}."} and choice["finish_reason"] == "stop"
    chunks = sse(call(base, "/v1/chat/completions", dict(plain, stream=True))[1])
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "It is noon {UTC}."


# Answers that open like a call of the family but are none: each goes out as the model writes it
LOOKS_LIKE_A_CALL = {"llama3_json": '{"answer": 42, "note": "forty-two, as asked, in plain JSON"}',
                     "pythonic": "[1] See the note: forty-two, as asked, in plain text.",
                     "mistral": '[{"answer": 42}] is the list, in plain JSON, as asked.',
                     "hermes": "<tool> is no tag of ours: forty-two, as asked, in plain text.",
                     "qwen3_coder": "<tool> is no tag of ours: forty-two, as asked, in plain text."}


def test_an_answer_that_opens_like_a_call_streams_as_it_is_written(auto_base):
    """Streamed, an answer that merely opens like a call (JSON, "[1]", "<tool>") goes out as it is
    written once it can no longer be one, not in one piece at the reply's end; whole, it is text."""
    base, parser = auto_base
    answer = LOOKS_LIKE_A_CALL[parser]
    body = dict({"messages": USER, "max_tokens": 120, "tools": [TIME]}, **forced(answer))
    choice = json.loads(call(base, "/v1/chat/completions", body)[1])["choices"][0]
    assert choice["message"]["content"] == answer and choice["finish_reason"] == "stop"
    pieces = [c["choices"][0]["delta"].get("content") for c in sse(call(base, "/v1/chat/completions",
                                                                         dict(body, stream=True))[1])]
    pieces = [p for p in pieces if p]
    assert "".join(pieces) == answer
    assert len("".join(pieces[:-1])) >= len(answer) - 16, pieces  # all but the last few characters before the end


@pytest.fixture(scope="module", params=["hermes", "qwen3_coder"])
def special_tags_base(request):
    """A tokenizer whose <tool_call> tags are special tokens, as some Hermes models' are (vLLM's
    hermes parser keeps special tokens for them): ids 97 and 98, after byte_tokenizer's."""
    from tokenizers import AddedToken

    model = make_model("torch", rows=2, max_seq=200)
    model.tokenizer = byte_tokenizer(model.vocab)
    model.tokenizer.backend.add_special_tokens([AddedToken(t, special=True) for t in ("<tool_call>", "</tool_call>")])
    assert [model.tokenizer.token_to_id(t) for t in ("<tool_call>", "</tool_call>")] == [97, 98]
    model.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    with running(Engine(model), tool_parser=request.param) as url:
        yield url, request.param


def test_tool_call_tags_that_are_special_tokens_still_mark_the_calls(special_tags_base):
    """Special tokens are dropped from a reply's text, but these tags are the parser's markers: the
    call reads, whole and streamed, where it came out as text with its tags gone."""
    base, parser = special_tags_base
    if parser == "hermes":
        body = '{"name": "get_time", "arguments": {"zone": "CET"}}'
    else:
        body = "\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n</function>\n"
    grammar = f'start: "Sure." <[97]> {json.dumps(body)} <[98]>'
    request = {"messages": USER, "max_tokens": 120, "tools": [TIME], "guided_grammar": grammar}
    choice = json.loads(call(base, "/v1/chat/completions", request)[1])["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Sure."
    [made] = choice["message"]["tool_calls"]
    assert made["function"]["name"] == "get_time" and json.loads(made["function"]["arguments"]) == {"zone": "CET"}
    deltas = [c["choices"][0]["delta"] for c in sse(call(base, "/v1/chat/completions", dict(request, stream=True))[1])]
    assert "".join(d.get("content") or "" for d in deltas) == "Sure."
    assert [c["function"] for c in streamed_calls(deltas)] == [made["function"]]
    # without tools the tags are special tokens like any other: dropped
    plain = json.loads(call(base, "/v1/chat/completions", {"messages": USER, "max_tokens": 120,
                                                           "guided_grammar": grammar})[1])["choices"][0]
    assert plain["message"]["content"] == "Sure." + body


# Replies with spaces around their calls, and the content vLLM's parser of the family gives each: the
# text before the first call as written (hermes, mistral, qwen3_coder: model_output[:start], None
# where empty); a reply that is its calls whole has none (the spaces before them are no answer).
SPACED = {
    "hermes": ('Let me see.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>\n',
               "Let me see.\n"),
    "qwen3_coder": ("Let me see.\n\n<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n"
                    "</function>\n</tool_call>", "Let me see.\n\n"),
    "mistral": ('Let me see. [TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "CET"}}]', "Let me see. "),
    "llama3_json": ('  {"name": "get_time", "parameters": {"zone": "CET"}}', None),
    "pythonic": ('\n[get_time(zone="CET")]', None),
}


def test_the_text_around_a_call_is_the_same_whole_and_streamed(auto_base):
    """The content is what vLLM's parsers give (`SPACED`), and the stream's text adds up to it: it
    sent the spaces before a call as text where the whole reply dropped them, and held none back
    that the whole reply gave."""
    base, parser = auto_base
    reply, content = SPACED[parser]
    body = dict({"messages": USER, "max_tokens": 150, "tools": [TIME]}, **forced(reply))
    choice = json.loads(call(base, "/v1/chat/completions", body)[1])["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == content
    [made] = choice["message"]["tool_calls"]
    assert made["function"]["name"] == "get_time" and json.loads(made["function"]["arguments"]) == {"zone": "CET"}
    chunks = sse(call(base, "/v1/chat/completions", dict(body, stream=True))[1])
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content") or "" for d in deltas) == (content or "")
    assert [c["function"] for c in streamed_calls(deltas)] == [made["function"]]
    # a reply of spaces alone is text, whole and streamed
    body = dict({"messages": USER, "max_tokens": 10, "tools": [TIME]}, **forced("  \n "))
    assert json.loads(call(base, "/v1/chat/completions", body)[1])["choices"][0]["message"]["content"] == "  \n "
    chunks = sse(call(base, "/v1/chat/completions", dict(body, stream=True))[1])
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "  \n "


def test_a_llama3_call_amid_text_reads_the_same_whole_and_streamed(auto_base):
    """vLLM's llama3_json reads a call with text before and after it (its tests' reply): the call,
    finish_reason tool_calls, the text before it the content whole and streamed, the text after
    dropped as vLLM drops it."""
    base, parser = auto_base
    if parser != "llama3_json":
        pytest.skip("Llama 3's JSON calls")
    reply = 'Here is the result: {"name": "get_time", "parameters": {"zone": "CET"}} Would you like more?'
    body = dict({"messages": USER, "max_tokens": 150, "tools": [TIME]}, **forced(reply))
    choice = json.loads(call(base, "/v1/chat/completions", body)[1])["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Here is the result: "
    [made] = choice["message"]["tool_calls"]
    assert made["function"] == {"name": "get_time", "arguments": '{"zone": "CET"}'}
    chunks = sse(call(base, "/v1/chat/completions", dict(body, stream=True))[1])
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content") or "" for d in deltas) == "Here is the result: "
    assert [c["function"] for c in streamed_calls(deltas)] == [made["function"]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


# Two calls in each family's format: the time's, then the weather's
TWO_CALLS = {
    "hermes": 'Both.<tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>\n<tool_call>'
              '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}</tool_call>',
    "qwen3_coder": "Both.<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n</function>\n"
                   "</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
                   "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
    "mistral": 'Both.[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "CET"}}, '
               '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}]',
    "llama3_json": '{"name": "get_time", "parameters": {"zone": "CET"}}; '
                   '{"name": "get_weather", "parameters": {"city": "Oslo", "days": 2}}',
    "pythonic": '[get_time(zone="CET"), get_weather(city="Oslo", days=2)]',
}


def test_parallel_tool_calls_false_keeps_the_first_call_whole_and_streamed(auto_base):
    """vLLM's rule for parallel_tool_calls false (OpenAI's: at most one call): a model that writes
    several under "auto" gets its first, whole and streamed; by default every call it writes."""
    base, parser = auto_base
    body = dict({"messages": USER, "max_tokens": 240, "tools": [TIME, WEATHER]}, **forced(TWO_CALLS[parser]))
    for parallel, names in ((None, ["get_time", "get_weather"]), (True, ["get_time", "get_weather"]),
                            (False, ["get_time"])):
        asked = body if parallel is None else dict(body, parallel_tool_calls=parallel)
        choice = json.loads(call(base, "/v1/chat/completions", asked)[1])["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == names
        assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"zone": "CET"}
        chunks = sse(call(base, "/v1/chat/completions", dict(asked, stream=True))[1])
        deltas = [c["choices"][0]["delta"] for c in chunks]
        assert [c["function"] for c in streamed_calls(deltas)] == [c["function"] for c in choice["message"]["tool_calls"]]
        assert "".join(d.get("content") or "" for d in deltas) == (choice["message"]["content"] or "")
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    status, text = call(base, "/v1/chat/completions", dict(body, parallel_tool_calls="no"))
    assert status == 400 and json.loads(text)["error"]["param"] == "parallel_tool_calls"


@pytest.fixture(scope="module", params=[("deepseek_r1", None), ("qwen3", "hermes")])
def thinking_base(request):
    """A server for a reasoning model: its thinking given apart, and with Qwen3 its tool calls read."""
    model = make_model("torch", rows=4, max_seq=160)
    model.tokenizer = byte_tokenizer(model.vocab)
    model.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    reasoning, tools = request.param
    # The replies here are forced whole, thinking included: the structure holds the thinking too.
    with running(Engine(model), reasoning_parser=reasoning, tool_parser=tools, structure_in_reasoning=True) as url:
        yield url, reasoning


def test_a_reasoning_models_thinking_is_given_apart_whole_and_streamed(thinking_base):
    base, reasoning = thinking_base
    opening = "" if reasoning == "deepseek_r1" else "<think>"  # R1's template opens the thinking itself
    body = dict({"messages": USER, "max_tokens": 100}, **forced(opening + "Two and two.</think>It is 4."))
    message = json.loads(call(base, "/v1/chat/completions", body)[1])["choices"][0]["message"]
    assert message == {"role": "assistant", "reasoning_content": "Two and two.", "content": "It is 4."}
    deltas = [c["choices"][0]["delta"] for c in sse(call(base, "/v1/chat/completions", dict(body, stream=True))[1])]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Two and two."
    assert "".join(d.get("content") or "" for d in deltas) == "It is 4."
    if reasoning == "qwen3":  # thinking, then text and a call in Hermes' tags
        reply = '<think>Time?</think>Checking.<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>'
        body = dict({"messages": USER, "max_tokens": 130, "tools": [TIME]}, **forced(reply))
        choice = json.loads(call(base, "/v1/chat/completions", body)[1])["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["reasoning_content"] == "Time?" and choice["message"]["content"] == "Checking."
        assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_time"
        chunks = sse(call(base, "/v1/chat/completions", dict(body, stream=True))[1])
        deltas = [c["choices"][0]["delta"] for c in chunks]
        assert "".join(d.get("reasoning_content", "") for d in deltas) == "Time?"
        assert "".join(d.get("content") or "" for d in deltas) == "Checking."
        assert [c["function"] for c in streamed_calls(deltas)] == [choice["message"]["tool_calls"][0]["function"]]


def test_include_reasoning_false_leaves_the_thinking_out(thinking_base):
    """vLLM's include_reasoning (true by default): false gives the answer alone, whole and streamed,
    the thinking still read apart from it (never the answer's); with Qwen3's tools too."""
    base, reasoning = thinking_base
    opening = "" if reasoning == "deepseek_r1" else "<think>"
    body = dict({"messages": USER, "max_tokens": 100, "include_reasoning": False},
                **forced(opening + "Two and two.</think>It is 4."))
    choice = json.loads(call(base, "/v1/chat/completions", body)[1])["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "It is 4."}
    chunks = sse(call(base, "/v1/chat/completions", dict(body, stream=True))[1])
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert not any("reasoning_content" in d for d in deltas)
    assert "".join(d.get("content") or "" for d in deltas) == "It is 4."
    assert json.loads(call(base, "/v1/chat/completions", dict(body, include_reasoning=True))[1])[
        "choices"][0]["message"]["reasoning_content"] == "Two and two."
    status, text = call(base, "/v1/chat/completions", dict(body, include_reasoning="no"))
    assert status == 400 and json.loads(text)["error"]["param"] == "include_reasoning"
    if reasoning == "qwen3":
        reply = '<think>Time?</think><tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>'
        body = dict({"messages": USER, "max_tokens": 130, "tools": [TIME], "include_reasoning": False}, **forced(reply))
        choice = json.loads(call(base, "/v1/chat/completions", body)[1])["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and "reasoning_content" not in choice["message"]
        assert choice["message"]["content"] is None
        deltas = [c["choices"][0]["delta"] for c in sse(call(base, "/v1/chat/completions", dict(body, stream=True))[1])]
        assert not any("reasoning_content" in d or d.get("content") for d in deltas)
        assert [c["function"] for c in streamed_calls(deltas)] == [choice["message"]["tool_calls"][0]["function"]]


HARMONY = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]


@pytest.fixture(scope="module")
def harmony_base():
    """gpt-oss's way: harmony's markers are special tokens of the tokenizer."""
    from tokenizers import AddedToken

    model = make_model("torch", rows=4, max_seq=200)
    model.tokenizer = byte_tokenizer(model.vocab)
    model.tokenizer.backend.add_special_tokens([AddedToken(m, special=True) for m in HARMONY])
    model.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}<|start|>assistant"
    with running(Engine(model), reasoning_parser="openai_gptoss", structure_in_reasoning=True) as url:
        yield url, model.tokenizer


def harmony(*parts) -> dict:
    """A body field making the model write these strings and special tokens (a Lark grammar)."""
    return {"guided_grammar": "start: " + " ".join(p if p in HARMONY else json.dumps(p) for p in parts)}


def test_gpt_oss_channels_and_calls_through_the_server(harmony_base):
    base, _ = harmony_base
    body = dict({"messages": USER, "max_tokens": 150}, **harmony(
        "<|channel|>", "analysis", "<|message|>", "Two and two.", "<|end|>", "<|start|>", "assistant", "<|channel|>",
        "final", "<|message|>", "It is 4.", "<|return|>"))
    message = json.loads(call(base, "/v1/chat/completions", body)[1])["choices"][0]["message"]
    assert message == {"role": "assistant", "reasoning_content": "Two and two.", "content": "It is 4."}
    deltas = [c["choices"][0]["delta"] for c in sse(call(base, "/v1/chat/completions", dict(body, stream=True))[1])]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Two and two."
    assert "".join(d.get("content") or "" for d in deltas) == "It is 4."
    body = dict({"messages": USER, "max_tokens": 150, "tools": [TIME]}, **harmony(
        "<|channel|>", "analysis", "<|message|>", "Time?", "<|end|>", "<|start|>", "assistant", "<|channel|>",
        "commentary to=functions.get_time ", "<|constrain|>", "json", "<|message|>", '{"zone": "CET"}', "<|call|>"))
    choice = json.loads(call(base, "/v1/chat/completions", body)[1])["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["reasoning_content"] == "Time?"
    assert choice["message"]["content"] is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]] \
        == [("get_time", {"zone": "CET"})]
    deltas = [c["choices"][0]["delta"] for c in sse(call(base, "/v1/chat/completions", dict(body, stream=True))[1])]
    assert not any(d.get("content") for d in deltas)  # the arguments never leak as text
    assert [c["function"] for c in streamed_calls(deltas)] == [choice["message"]["tool_calls"][0]["function"]]


def test_a_forced_call_on_harmony_is_written_in_harmony(harmony_base):
    """tool_choice naming a function (or "required"): the reply may think in the analysis channel,
    then must be a commentary message to one of the functions, headers and all, its arguments held
    to the schema. A bias on <|end|> ends the random model's thinking as soon as it may."""
    from linnet.serve.reasoning import Harmony

    HOUR = {"type": "function", "function": {"name": "get_hour", "parameters": {
        "type": "object", "properties": {"am": {"type": "boolean"}}, "required": ["am"], "additionalProperties": False}}}
    base, tokenizer = harmony_base
    end = tokenizer.token_to_id("<|end|>")
    for choice, names in (({"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
                          ("required", {"get_time", "get_hour"})):
        body = {"messages": USER, "max_tokens": 120, "tools": [TIME, HOUR], "tool_choice": choice, "seed": 4,
                "logit_bias": {str(end): 30}}
        response = json.loads(call(base, "/v1/chat/completions", body)[1])
        choice_ = response["choices"][0]
        assert choice_["finish_reason"] == ("tool_calls" if choice == "required" else "stop"), choice_
        (made,) = choice_["message"]["tool_calls"]
        assert made["function"]["name"] in names and choice_["message"]["content"] is None
        arguments = json.loads(made["function"]["arguments"])
        assert arguments in ({"zone": "UTC"}, {"zone": "CET"}, {"am": True}, {"am": False})
        message = (f"<|channel|>commentary to=functions.{made['function']['name']} <|constrain|>json<|message|>"
                   f"{made['function']['arguments']}<|call|>")  # the call's own message: headers, not bare JSON
        assert response["usage"]["completion_tokens"] >= len(tokenizer.encode(message, add_special_tokens=False))
        chunks = sse(call(base, "/v1/chat/completions", dict(body, stream=True))[1])
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert not any(d.get("content") for d in deltas)
        assert [c["function"] for c in streamed_calls(deltas)] == [made["function"]]
    # the grammar itself: the model's own headers, the thinking optional
    grammar = Harmony().call_structure({"get_time": TIME["function"]["parameters"]}).spec
    assert '"commentary to=functions.get_time "' in grammar and "start: thinking? (call_0)" in grammar


def test_a_harmony_reply_is_cut_at_a_stop_string(harmony_base):
    """The engine finds the stop string in the reply's text, markers and all, and the channels are
    read from what is left: whole and streamed, the answer ends before it."""
    base, _ = harmony_base
    body = dict({"messages": USER, "max_tokens": 150, "stop": [" 4"]}, **harmony(
        "<|channel|>", "analysis", "<|message|>", "Two and two.", "<|end|>", "<|start|>", "assistant", "<|channel|>",
        "final", "<|message|>", "It is 4. Or four.", "<|return|>"))
    choice = json.loads(call(base, "/v1/chat/completions", body)[1])["choices"][0]
    assert choice["message"] == {"role": "assistant", "reasoning_content": "Two and two.", "content": "It is"}
    assert choice["finish_reason"] == "stop"
    chunks = sse(call(base, "/v1/chat/completions", dict(body, stream=True))[1])
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Two and two."
    assert "".join(d.get("content") or "" for d in deltas) == "It is"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    kept = json.loads(call(base, "/v1/chat/completions", dict(body, include_stop_str_in_output=True))[1])
    assert kept["choices"][0]["message"]["content"] == "It is 4"


def test_a_reasoning_models_structure_holds_its_answer_only():
    """By default the structure waits for the thinking's end. "</think>" is one token here, and a
    logit bias draws it first (the structure then bans it): the thinking is empty, and the answer
    after it is held to the regex; with "</think>" banned instead, the thinking never ends, and
    the structure never holds: the second request runs to its length, freely."""
    from tokenizers import AddedToken

    model = make_model("torch", rows=4, max_seq=96)
    model.tokenizer = byte_tokenizer(model.vocab)
    model.tokenizer.backend.add_tokens([AddedToken("</think>", special=False)])
    end = model.tokenizer.backend.token_to_id("</think>")
    model.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}<think>\n"
    with running(Engine(model), reasoning_parser="deepseek_r1") as base:
        body = {"messages": USER, "max_tokens": 30, "guided_regex": "It is [0-9]\\.", "seed": 3}
        message = chat(base, **dict(body, logit_bias={str(end): 100}))["choices"][0]["message"]
        assert message["reasoning_content"] is None and re.fullmatch(r"It is [0-9]\.", message["content"])
        free = chat(base, **dict(body, logit_bias={str(end): -100}, ignore_eos=True))["choices"][0]
        assert free["finish_reason"] == "length" and free["message"]["content"] is None  # still thinking, freely


def test_special_tokens_kept_in_the_text_when_asked(base):
    """vLLM's skip_special_tokens: false keeps them in the text, whole and streamed (but for the end
    token that ends it); by default they are left out. A bias draws the byte tokenizer's one special token, <eos>, which ignore_eos lets
    go on."""
    body = {"prompt": "Hi", "max_tokens": 3, "temperature": 0, "ignore_eos": True, "logit_bias": {"0": 100}}
    kept = dict(body, skip_special_tokens=False)
    assert json.loads(call(base, "/v1/completions", kept)[1])["choices"][0]["text"] == "<eos>" * 3
    assert json.loads(call(base, "/v1/completions", body)[1])["choices"][0]["text"] == ""
    streamed = sse(call(base, "/v1/completions", dict(kept, stream=True))[1])
    assert "".join(c["choices"][0]["text"] for c in streamed) == "<eos>" * 3
    # The end token that ends the text is left out even so, as vLLM's stop tokens are, unless
    # include_stop_str_in_output keeps it
    ended = dict(kept, ignore_eos=False)
    for extra, text in (({}, ""), ({"include_stop_str_in_output": True}, "<eos>")):
        choice = json.loads(call(base, "/v1/completions", dict(ended, **extra))[1])["choices"][0]
        assert (choice["text"], choice["finish_reason"]) == (text, "stop")
        streamed = sse(call(base, "/v1/completions", dict(ended, stream=True, **extra))[1])
        assert "".join(c["choices"][0]["text"] for c in streamed) == text


def test_a_structured_request_ended_while_its_matcher_compiles_is_cancelled_once_submitted():
    """A structure's request is submitted on a thread of its own (its matcher compiled there). Ended
    meanwhile (the server shutting down: `end_requests`), it answers with its 503 at once; what the thread
    then submits is cancelled, its row freed, rather than run for every token it asked with nobody to read
    them. The engine's submission is held on an event here, as a large matcher's compile holds it."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from linnet.serve.server import OpenAIServer

    model = make_model("torch", rows=2, max_seq=128)
    model.tokenizer = byte_tokenizer(model.vocab)
    engine = Engine(model)
    app = OpenAIServer(engine, "tiny")
    entered, gate, made = threading.Event(), threading.Event(), []
    submit = engine.stream

    def held(req, loop=None):
        entered.set()
        gate.wait(60)
        made.append(submit(req, loop))
        return made[-1]

    engine.stream = held
    body = {"prompt": "Say:", "max_tokens": 100, "ignore_eos": True, "structured_outputs": {"regex": "[ab]{100}"}}
    with running(engine, app=app) as url, ThreadPoolExecutor(1) as pool:
        reply = pool.submit(call, url, "/v1/completions", body)
        assert entered.wait(60)
        (task,) = app._answering
        task.get_loop().call_soon_threadsafe(app.end_requests)
        status, text = reply.result(60)
        assert status == 503 and json.loads(text)["error"]["code"] == "server_shutting_down"
        gate.set()
        for _ in range(600):
            if made and made[0].completion.finish_reason is not None:
                break
            time.sleep(0.05)
        assert made[0].completion.finish_reason == "cancelled"
        assert len(made[0].completion.tokens) < 100


@pytest.mark.parametrize("max_tokens", [1, 8, 30])
def test_a_required_call_cut_before_it_reads_sends_no_content(base, max_tokens):
    """tool_choice "required" holds the reply to a JSON list of calls; cut by max_tokens before a call is read
    from it (`[{"name": "get_ti`), it has no answer of the model's: no content, streamed or whole, and no call
    (the forced JSON's opening had been sent as the assistant's text); a named call so cut is its arguments so
    far, as before. The Responses API's output likewise holds no text."""
    body = {"messages": USER, "max_tokens": max_tokens, "seed": 1, "tools": [WEATHER, TIME], "tool_choice": "required"}
    out = chat(base, **{k: v for k, v in body.items() if k != "messages"})
    assert out["choices"][0]["message"]["content"] is None and not out["choices"][0]["message"].get("tool_calls")
    assert out["choices"][0]["finish_reason"] == "length"
    status, streamed = call(base, "/v1/chat/completions", dict(body, stream=True))
    deltas = [c["choices"][0]["delta"] for c in sse(streamed) if c.get("choices")]
    assert status == 200 and not any(d.get("content") or d.get("tool_calls") for d in deltas)
    named = chat(base, max_tokens=max_tokens, tools=[WEATHER, TIME],
                 tool_choice={"type": "function", "function": {"name": "get_time"}})["choices"][0]["message"]
    assert named["content"] is None and named["tool_calls"][0]["function"]["arguments"].startswith("{")
    status, text = call(base, "/v1/responses", {"input": "Weather?", "max_output_tokens": max_tokens, "tools": [
        {"type": "function", **TIME["function"]}], "tool_choice": "required"})
    assert status == 200, text
    reply = json.loads(text)
    assert not [part for item in reply["output"] if item["type"] == "message" for part in item["content"]
                if part.get("text")], reply["output"]
