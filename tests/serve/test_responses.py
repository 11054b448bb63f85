"""OpenAI's Responses API (/v1/responses), read by OpenAI's own client: a reply as the chat
endpoint gives it for the same conversation, streamed as typed events the client's stream helper
accepts, earlier tool calls and their outputs in the input, a forced function call as a
function_call item, a kept Response continued by a later one, and bad bodies refused."""

import json

import pytest

from .test_server import call

openai = pytest.importorskip("openai")


def client(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


def events_of(text: str) -> list:
    """A Responses stream's events, each named on its `event:` line as its type says; no [DONE]."""
    lines = text.splitlines()
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert [line[7:] for line in lines if line.startswith("event: ")] == [e["type"] for e in events]
    return events


def test_a_reply_is_the_chat_reply_for_the_same_conversation(server):
    base, _, _ = server
    messages = [{"role": "system", "content": "t9"}, {"role": "user", "content": "t5 t6"}]
    chat = json.loads(call(base, "/v1/chat/completions", {"messages": messages, "max_tokens": 6,
                                                          "temperature": 0})[1])
    out = client(base).responses.create(model="tiny", instructions="t9", input="t5 t6", max_output_tokens=6,
                                        temperature=0)
    assert out.output_text == chat["choices"][0]["message"]["content"]
    [item] = out.output
    # the word tokenizer has no end token: the reply ran to max_output_tokens, and its item says so (OpenAI's)
    assert item.type == "message" and item.role == "assistant" and item.status == "incomplete"
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    assert out.usage.input_tokens == chat["usage"]["prompt_tokens"] and out.usage.output_tokens == 6
    assert out.usage.total_tokens == out.usage.input_tokens + 6 and out.usage.output_tokens_details.reasoning_tokens == 0
    assert (out.temperature, out.top_p) == (0.0, 1.0)
    # a body that leaves them out: the sampling it ran with, OpenAI's defaults here (no generation config)
    free = client(base).responses.create(model="tiny", input="t5 t6", max_output_tokens=2)
    assert (free.temperature, free.top_p) == (1.0, 1.0)


def test_streamed_as_typed_events_the_clients_helper_accepts(server):
    base, _, _ = server
    whole = client(base).responses.create(model="tiny", input="t5 t7", max_output_tokens=8, temperature=0)
    with client(base).responses.stream(model="tiny", input="t5 t7", max_output_tokens=8, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert final.status == "incomplete"  # cut at max_output_tokens; the client's helper ends on "completed" only
    assert final.output[0].status == events[-2].item.status == "incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert final.output_text == whole.output_text and final.output[0].id == events[2].item.id


def test_earlier_calls_and_their_outputs_are_the_chat_turns_they_mean(server):
    """A function_call item is an assistant turn's tool call, a function_call_output a tool message:
    the prompt is the chat endpoint's for those messages (the template reads their content)."""
    base, _, _ = server
    items = [{"role": "user", "content": [{"type": "input_text", "text": "t4"}]},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
             {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"x\": 1}"},
             {"type": "function_call_output", "call_id": "c1", "output": "t11"},
             {"type": "function_call_output", "call_id": "c2", "output": "t12"},
             {"type": "reasoning", "id": "rs_1", "summary": []}]
    messages = [{"role": "user", "content": "t4"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{\"x\": 1}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "t11"},
                {"role": "tool", "tool_call_id": "c2", "content": "t12"}]
    chat = json.loads(call(base, "/v1/chat/completions", {"messages": messages, "max_tokens": 4, "temperature": 0})[1])
    out = json.loads(call(base, "/v1/responses", {"input": items, "max_output_tokens": 4, "temperature": 0})[1])
    assert out["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]
    assert out["output"][0]["content"][0]["text"] == chat["choices"][0]["message"]["content"]


@pytest.mark.parametrize("body, needle", [
    ({"input": "t1", "previous_response_id": "resp_1"}, "not found"),
    ({"input": "t1", "store": "yes"}, "'store' must be"),
    ({"input": []}, "'input' must be"),
    ({"input": [{"type": "image", "url": "x"}]}, "'input[0]' must be"),
    ({"input": "t1", "tools": [{"type": "web_search"}]}, "runs no built-in tools"),
    ({"input": "t1", "text": {"format": {"type": "yaml"}}}, "text.format"),
    ({"input": "t1", "truncation": "auto"}, "truncation"),
    ({"input": "t1", "top_logprobs": 21, "include": ["message.output_text.logprobs"]}, "top_logprobs"),
    ({"input": "t1", "top_logprobs": -1}, "top_logprobs"),
    ({"input": "t1", "include": "reasoning"}, "'include' must be"),
    ({"input": "t1", "model": "gpt-5"}, "does not exist"),
    ({"input": "t1", "reasoning": 5}, "'reasoning' must be an object"),
    ({"input": "t1", "reasoning": {"effort": "max"}}, "'reasoning.effort' must be one of"),
    # a named function in the Responses API's own form, told in that form (chat's was shown)
    ({"input": "t1", "tools": [{"type": "function", "name": "f", "parameters": {}}],
      "tool_choice": {"type": "function", "name": "g"}}, "{'type': 'function', 'name': ...} naming one of the tools"),
    ({"input": "t1", "tools": [{"type": "function", "name": "f", "parameters": {}}], "tool_choice": "any"},
     "{'type': 'function', 'name': ...}"),
])
def test_bad_bodies_are_refused_and_the_server_goes_on(server, body, needle):
    base, _, _ = server
    status, text = call(base, "/v1/responses", body)
    assert status in (400, 404) and needle in json.loads(text)["error"]["message"]
    assert call(base, "/v1/responses", {"input": "t1", "max_output_tokens": 2})[0] == 200


def test_a_refused_text_format_is_named_as_the_body_names_it(server):
    """Responses' `text.format` runs as chat's `response_format`: a structure the engine refuses (here
    for want of an end token) is the 400 of the field the body sent, as chat's is of its own."""
    base, _, _ = server
    fmt = {"type": "json_schema", "name": "x", "schema": {"type": "object"}}
    status, text = call(base, "/v1/responses", {"input": "t1", "text": {"format": fmt}})
    assert status == 400 and json.loads(text)["error"]["param"] == "text.format"
    chat = {"messages": [{"role": "user", "content": "t1"}], "response_format": {"type": "json_schema",
                                                                                 "json_schema": fmt}}
    status, text = call(base, "/v1/chat/completions", chat)
    assert status == 400 and json.loads(text)["error"]["param"] == "response_format"


def test_a_forced_function_call_is_a_function_call_item():
    """A named tool_choice holds the output to the function's parameters (a structured output, over
    a byte tokenizer): one function_call item, its arguments valid JSON for them, whole and streamed."""
    pytest.importorskip("llguidance")
    from linnet.serve import Engine

    from .conftest import make_model, running
    from .test_server_structured import TIME, byte_tokenizer

    model = make_model("torch", rows=2, max_seq=128)
    model.tokenizer = byte_tokenizer(model.vocab)
    model.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    tool = {"type": "function", **TIME["function"]}
    body = {"input": "Time?", "tools": [tool], "tool_choice": {"type": "function", "name": "get_time"},
            "max_output_tokens": 40, "seed": 2, "temperature": 1.0}  # seed: vLLM's extra field
    with running(Engine(model)) as base:
        out = client(base).responses.create(model="tiny", **{k: v for k, v in body.items() if k != "seed"},
                                            extra_body={"seed": 2})
        [item] = out.output
        assert item.type == "function_call" and item.name == "get_time" and item.call_id.startswith("call_")
        assert json.loads(item.arguments)["zone"] in ("UTC", "CET") and out.status == "completed"
        events = events_of(call(base, "/v1/responses", dict(body, stream=True))[1])
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [e["item"]["type"] for e in added] == ["function_call"]
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [json.loads(e["arguments"]) for e in done] == [json.loads(item.arguments)]  # the same seed
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) > 3 and "".join(deltas) == done[0]["arguments"]  # as the model writes them
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][0]["arguments"] == done[0]["arguments"]


def test_a_reasoning_models_thinking_text_and_call_are_three_items_in_order():
    """Qwen3's way (its <think> tags and Hermes' calls), forced whole: a reasoning item, a message
    item, a function_call item, whole and streamed; the thinking's tokens counted apart."""
    pytest.importorskip("llguidance")
    from linnet.serve import Engine

    from .conftest import make_model, running
    from .test_server_structured import TIME, byte_tokenizer, forced

    model = make_model("torch", rows=2, max_seq=160)
    model.tokenizer = byte_tokenizer(model.vocab)
    model.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    reply = '<think>Time?</think>Checking.<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>'
    body = dict({"input": "Time?", "tools": [{"type": "function", **TIME["function"]}], "max_output_tokens": 130},
                **forced(reply))
    with running(Engine(model), reasoning_parser="qwen3", tool_parser="hermes", structure_in_reasoning=True) as base:
        out = json.loads(call(base, "/v1/responses", body)[1])
        events = events_of(call(base, "/v1/responses", dict(body, stream=True))[1])
        # vLLM's include_reasoning false: no reasoning item, whole or streamed
        unthought = json.loads(call(base, "/v1/responses", dict(body, include_reasoning=False))[1])
        unthought_events = events_of(call(base, "/v1/responses", dict(body, include_reasoning=False, stream=True))[1])
    assert [i["type"] for i in unthought["output"]] == ["message", "function_call"]
    assert [i["type"] for i in unthought_events[-1]["response"]["output"]] == ["message", "function_call"]
    assert not any(e["type"].startswith("response.reasoning") for e in unthought_events)
    assert unthought["output"][0]["content"][0]["text"] == "Checking."
    assert [i["type"] for i in out["output"]] == ["reasoning", "message", "function_call"]
    assert out["output"][0]["content"][0]["text"] == "Time?"
    assert out["output"][1]["content"][0]["text"] == "Checking."
    assert out["output"][2]["name"] == "get_time" and json.loads(out["output"][2]["arguments"]) == {"zone": "UTC"}
    assert out["usage"]["output_tokens_details"]["reasoning_tokens"] == len("Time?")  # a byte a token
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == "Time?"
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Checking."
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call"]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [0, 1, 2]
    assert "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta") \
        == final["output"][2]["arguments"] == out["output"][2]["arguments"]


def test_logprobs_are_the_chat_logprobs_of_the_same_reply_whole_and_streamed(server):
    """include message.output_text.logprobs: the output_text's tokens with their top_logprobs, as
    chat completions gives them for the same conversation; streamed, each delta's tokens, which
    add up to the whole; top_logprobs alone asks for none (as OpenAI's)."""
    base, _, _ = server
    chat = json.loads(call(base, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "t5 t6"}], "max_tokens": 6, "temperature": 0, "logprobs": True,
        "top_logprobs": 2})[1])["choices"][0]
    body = {"input": "t5 t6", "max_output_tokens": 6, "temperature": 0, "top_logprobs": 2,
            "include": ["message.output_text.logprobs"]}
    out = client(base).responses.create(model="tiny", **body)
    [part] = out.output[0].content
    assert part.text == chat["message"]["content"] and out.top_logprobs == 2
    want = chat["logprobs"]["content"]
    assert [e.token for e in part.logprobs] == [e["token"] for e in want]
    assert [e.logprob for e in part.logprobs] == pytest.approx([e["logprob"] for e in want], abs=1e-4)
    assert [[t.token for t in e.top_logprobs] for e in part.logprobs] == \
        [[t["token"] for t in e["top_logprobs"]] for e in want]
    assert all(len(e.top_logprobs) == 2 and e.bytes == list(e.token.encode()) for e in part.logprobs)
    events = events_of(call(base, "/v1/responses", dict(body, stream=True))[1])
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [t["token"] for e in deltas for t in e["logprobs"]] == [e["token"] for e in want]
    [done] = [e for e in events if e["type"] == "response.output_text.done"]
    assert done["logprobs"] == [t for e in deltas for t in e["logprobs"]]
    assert events[-1]["response"]["output"][0]["content"][0]["logprobs"] == done["logprobs"]
    unasked = client(base).responses.create(model="tiny", input="t5 t6", max_output_tokens=2, top_logprobs=2)
    assert unasked.output[0].content[0].logprobs == []


def test_a_reasoning_models_logprobs_are_its_answers_tokens_only():
    """Thinking, then an answer, then a call (Qwen3's tags, Hermes' call), over a byte tokenizer: the
    output_text's logprobs are the answer's own tokens, whose texts make it up, whole and streamed;
    the thinking's, the tags' and the call's are on no item."""
    pytest.importorskip("llguidance")
    from linnet.serve import Engine

    from .conftest import make_model, running
    from .test_server_structured import TIME, byte_tokenizer, forced

    model = make_model("torch", rows=2, max_seq=160)
    model.tokenizer = byte_tokenizer(model.vocab, "é".encode())
    model.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    reply = '<think>Time?</think>Checking.<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>'
    body = dict({"input": "Time?", "tools": [{"type": "function", **TIME["function"]}], "max_output_tokens": 130,
                 "include": ["message.output_text.logprobs"], "top_logprobs": 1}, **forced(reply))
    with running(Engine(model), reasoning_parser="qwen3", tool_parser="hermes", structure_in_reasoning=True) as base:
        out = json.loads(call(base, "/v1/responses", body)[1])
        events = events_of(call(base, "/v1/responses", dict(body, stream=True))[1])
        plain = dict(body, tools=None, **forced("<think>Hm.</think>Noon, café."))
        noon = json.loads(call(base, "/v1/responses", plain)[1])
    [message] = [i for i in out["output"] if i["type"] == "message"]
    logprobs = message["content"][0]["logprobs"]
    assert "".join(e["token"] for e in logprobs) == "Checking." and all(e["logprob"] <= 0 for e in logprobs)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(t["token"] for e in deltas for t in e["logprobs"]) == "Checking."
    [final] = [i for i in events[-1]["response"]["output"] if i["type"] == "message"]
    assert [e["token"] for e in final["content"][0]["logprobs"]] == [e["token"] for e in logprobs]
    # the same draws, so the same scores (to float32 rounding: the passes are packed differently)
    assert [e["logprob"] for e in final["content"][0]["logprobs"]] == \
        pytest.approx([e["logprob"] for e in logprobs], abs=1e-4)
    # no call: the answer runs to the end, the end token (no text) on no item; é's two bytes are two
    # tokens, the first with no text of its own: both the answer's
    [answer] = [i for i in noon["output"] if i["type"] == "message"]
    assert b"".join(bytes(e["bytes"]) for e in answer["content"][0]["logprobs"]) == "Noon, café.".encode()


@pytest.mark.parametrize("parser,reply", [("llama3_json", "Use braces: {"), ("mistral", "A list: ["),
                                           ("hermes", "Soon <tool_c")])
def test_a_reply_ending_where_a_call_may_begin_has_every_tokens_logprobs(parser, reply):
    """A reply that ends on what may have opened a call ("{" for Llama 3, "[" for Mistral), and so
    makes none: its content is all of it, and so are its logprobs, whole and streamed (its last
    tokens were left out, as a call's)."""
    pytest.importorskip("llguidance")
    from linnet.serve import Engine

    from .conftest import make_model, running
    from .test_server_structured import TIME, byte_tokenizer, forced

    model = make_model("torch", rows=2, max_seq=96)
    model.tokenizer = byte_tokenizer(model.vocab)
    model.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    body = dict({"input": "Hi", "tools": [{"type": "function", **TIME["function"]}], "max_output_tokens": 40,
                 "include": ["message.output_text.logprobs"], "top_logprobs": 1}, **forced(reply))
    with running(Engine(model), tool_parser=parser) as base:
        out = json.loads(call(base, "/v1/responses", body)[1])
        events = events_of(call(base, "/v1/responses", dict(body, stream=True))[1])
    [message] = out["output"]
    assert message["content"][0]["text"] == reply
    assert "".join(e["token"] for e in message["content"][0]["logprobs"]) == reply
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(e["delta"] for e in deltas) == reply
    assert "".join(t["token"] for e in deltas for t in e["logprobs"]) == reply
    [final] = events[-1]["response"]["output"]
    assert [e["token"] for e in final["content"][0]["logprobs"]] == [e["token"] for e in message["content"][0]["logprobs"]]


def chat_reply(base, messages: list, max_tokens: int) -> dict:
    return json.loads(call(base, "/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens,
                                                         "temperature": 0})[1])


def test_a_later_response_continues_a_kept_one(server):
    """previous_response_id: the earlier input and output come first, then the new input, as the
    chat endpoint reads that conversation; the earlier instructions do not carry over. Streamed
    Responses are kept too."""
    base, _, _ = server
    api = client(base)
    first = api.responses.create(model="tiny", instructions="t9", input="t5 t6", max_output_tokens=3, temperature=0)
    assert first.store is True and first.previous_response_id is None
    second = api.responses.create(model="tiny", previous_response_id=first.id, input="t7", max_output_tokens=3,
                                  temperature=0)
    conversation = [{"role": "user", "content": "t5 t6"}, {"role": "assistant", "content": first.output_text},
                    {"role": "user", "content": "t7"}]
    chat = chat_reply(base, conversation, 3)
    assert second.output_text == chat["choices"][0]["message"]["content"] and second.previous_response_id == first.id
    assert second.usage.input_tokens == chat["usage"]["prompt_tokens"]
    with api.responses.stream(model="tiny", previous_response_id=second.id, input="t8", max_output_tokens=3,
                              temperature=0) as stream:
        list(stream)
        third = stream.get_final_response()
    conversation += [{"role": "assistant", "content": second.output_text}, {"role": "user", "content": "t8"}]
    assert third.output_text == chat_reply(base, conversation, 3)["choices"][0]["message"]["content"]
    fourth = api.responses.create(model="tiny", previous_response_id=third.id, input="t4", max_output_tokens=3,
                                  temperature=0)
    conversation += [{"role": "assistant", "content": third.output_text}, {"role": "user", "content": "t4"}]
    assert fourth.output_text == chat_reply(base, conversation, 3)["choices"][0]["message"]["content"]


def test_a_kept_response_is_read_and_deleted_and_store_false_keeps_none(server):
    base, _, _ = server
    made = json.loads(call(base, "/v1/responses", {"input": "t3", "max_output_tokens": 2})[1])
    status, text = call(base, f"/v1/responses/{made['id']}", method="GET")
    assert status == 200 and json.loads(text) == made
    listed = client(base).responses.input_items.list(made["id"])  # as OpenAI's client reads them
    assert [(i.type, i.role, i.content[0].text) for i in listed.data] == [("message", "user", "t3")]
    assert listed.data[0].id.startswith("msg_") and made["id"].startswith("resp_")  # OpenAI's forms
    status, text = call(base, f"/v1/responses/{made['id']}", method="DELETE")
    assert status == 200 and json.loads(text) == {"id": made["id"], "object": "response", "deleted": True}
    for method in ("GET", "DELETE"):
        status, text = call(base, f"/v1/responses/{made['id']}", method=method)
        assert status == 404 and "no response with id" in json.loads(text)["error"]["message"]
    status, text = call(base, "/v1/responses", {"input": "t3", "previous_response_id": made["id"]})
    error = json.loads(text)["error"]
    assert status == 400 and error["code"] == "previous_response_not_found" and error["param"] == "previous_response_id"
    unkept = json.loads(call(base, "/v1/responses", {"input": "t3", "max_output_tokens": 2, "store": False})[1])
    assert unkept["store"] is False and call(base, f"/v1/responses/{unkept['id']}", method="GET")[0] == 404
    # as Codex asks, keeping nothing: encrypted reasoning it may carry is none here, and nothing is refused
    assert call(base, "/v1/responses", {"input": "t3", "max_output_tokens": 2, "store": False,
                                        "include": ["reasoning.encrypted_content"]})[0] == 200
    assert call(base, f"/v1/responses/{made['id']}/other", method="GET")[0] == 404


def test_the_store_keeps_the_newest_and_a_turns_thinking_text_and_calls_are_one_assistant_turn():
    from linnet.serve.openai_api import ApiError
    from linnet.serve.responses_api import conversation_after, read_call
    from linnet.serve.responses_store import ResponseStore

    store = ResponseStore(limit=2)
    for k in range(3):
        store.put({"id": f"resp_{k}"}, [{"role": "user", "content": f"t{k}"}])
    assert list(store.kept) == ["resp_1", "resp_2"]
    with pytest.raises(ApiError, match="not found"):
        store.conversation("resp_0")
    call_ = read_call({"input": "t4", "previous_response_id": "resp_2"}, store)
    output = [{"type": "reasoning", "id": "rs", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
              {"type": "message", "id": "msg", "role": "assistant",
               "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
              {"type": "function_call", "id": "fc1", "call_id": "c1", "name": "f", "arguments": "{}"},
              {"type": "function_call", "id": "fc2", "call_id": "c2", "name": "g", "arguments": "{\"x\": 1}"}]
    assert conversation_after(call_, output) == [
        {"role": "user", "content": "t2"}, {"role": "user", "content": "t4"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "hm", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{\"x\": 1}"}}]}]
    assert conversation_after(read_call({"input": "t5"}, store), []) == [{"role": "user", "content": "t5"}]
    assert ResponseStore(limit=0).put({"id": "resp_9"}, []) is None


def test_a_reasoning_item_is_the_thinking_of_the_assistant_turn_after_it():
    """gpt-oss's template writes an earlier tool-calling turn's thinking back (as `thinking`; vLLM
    calls it reasoning_content): a reasoning item in the input goes to the turn that follows it."""
    from linnet.serve.openai_api import _message
    from linnet.serve.responses_api import _messages

    items = [{"role": "user", "content": "t4"},
             {"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": "short"}],
              "content": [{"type": "reasoning_text", "text": "Need "}, {"type": "reasoning_text", "text": "f."}]},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "t11"},
             {"type": "reasoning", "id": "rs2", "summary": [{"type": "summary_text", "text": "Done."}]},
             {"role": "assistant", "content": "t12"},
             {"type": "reasoning", "id": "rs3", "summary": [], "encrypted_content": "opaque"}]
    messages = _messages(items)
    assert [m.get("reasoning_content") for m in messages] == [None, "Need f.", None, "Done."]
    assert messages[1]["tool_calls"][0]["id"] == "c1" and messages[3]["content"] == "t12"
    assert _message(0, messages[1])["thinking"] == "Need f."  # the template's name for it, too
    assert _message(0, {"role": "assistant", "content": "x", "thinking": "y"})["reasoning_content"] == "y"
    # text beside calls is what gpt-oss's template writes as that turn's thinking: no second one
    both = _message(0, {"role": "assistant", "content": "x", "reasoning_content": "y",
                        "tool_calls": messages[1]["tool_calls"]})
    assert "thinking" not in both and both["reasoning_content"] == "y"


def test_a_call_cut_short_is_kept_and_a_later_response_goes_on_without_it():
    """tool_choice "required" with max_output_tokens inside the call's arguments: the Response is
    incomplete, its call listed as the model wrote it, and kept (store's default) without refusing
    its own half-written arguments as if a client had sent them; a later response continues from
    it, the call that was never made left out."""
    pytest.importorskip("llguidance")
    from linnet.serve import Engine

    from .conftest import make_model, running
    from .test_server_structured import TIME, byte_tokenizer

    model = make_model("torch", rows=2, max_seq=160)
    model.tokenizer = byte_tokenizer(model.vocab)
    model.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    body = {"input": "Time?", "tools": [{"type": "function", **TIME["function"]}], "tool_choice": "required",
            "max_output_tokens": 42, "temperature": 0}
    with running(Engine(model)) as base:
        status, text = call(base, "/v1/responses", body)
        assert status == 200, text
        out = json.loads(text)
        events = events_of(call(base, "/v1/responses", dict(body, stream=True))[1])
        status, later = call(base, "/v1/responses", {"previous_response_id": out["id"], "input": "Now?",
                                                     "max_output_tokens": 3, "temperature": 0})
    assert out["status"] == "incomplete" and out["output"][-1]["type"] == "function_call"
    with pytest.raises(ValueError):
        json.loads(out["output"][-1]["arguments"])
    assert not any("error" in e for e in events) and events[-1]["response"]["status"] == "incomplete"
    assert status == 200, later


@pytest.mark.parametrize("body", [{"input": "t1 " * 5000, "max_output_tokens": 2},  # longer than the context
                                  {"input": "a lone \ud800 surrogate"}])
def test_an_error_in_the_input_names_input(server, body):
    # the chat body the Responses body becomes holds it as messages: the error names the field sent
    base, _, _ = server
    status, text = call(base, "/v1/responses", body)
    assert status == 400 and json.loads(text)["error"]["param"] == "input", text
