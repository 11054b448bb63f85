"""Any body at all, on every route that takes one: an answer (200) or OpenAI's error object with a 4xx
status and a message, never a 500, a hang or a dropped connection; and the server serves the
next request as before. Bodies are drawn near valid ones: each field of the API, given a value
of any JSON type (or of its own), so that the checks behind every field are reached."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .test_server import call

# a JSON value of any type, small; NaN and the infinities too (Python's json writes and reads them)
scalars = (st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.sampled_from([-1, 0, 1, 2, 3, 97, 4096])
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6) | st.sampled_from(["t1", "t5 t6", ""]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                           max_size=3), max_leaves=5)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]),
                                           "content": st.sampled_from(["t1 t2", "", None]) | values}),
                    min_size=1, max_size=3) | values
tools = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["function", "web"]), "function": st.fixed_dictionaries(
    {"name": st.sampled_from(["f", ""]) | values, "parameters": st.just({"type": "object"}) | values})}), max_size=2)

SHARED = ["model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stop", "seed", "stream",
          "stream_options", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "min_tokens",
          "ignore_eos", "stop_token_ids", "allowed_token_ids", "skip_special_tokens", "include_stop_str_in_output",
          "truncate_prompt_tokens", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
          "guided_grammar", "user", "prompt_logprobs", "spaces_between_special_tokens"]
ROUTES = {
    "/v1/completions": ["prompt", "echo", "logprobs", "suffix", "best_of"],
    "/v1/chat/completions": ["messages", "logprobs", "top_logprobs", "tools", "tool_choice", "response_format",
                             "parallel_tool_calls", "max_completion_tokens", "chat_template_kwargs",
                             "add_generation_prompt", "continue_final_message", "reasoning_effort"],
    "/v1/responses": ["input", "instructions", "max_output_tokens", "tools", "tool_choice", "text", "reasoning",
                      "store", "previous_response_id", "truncation", "metadata", "parallel_tool_calls"],
    "/tokenize": ["prompt", "messages", "add_special_tokens", "add_generation_prompt", "chat_template_kwargs"],
    "/detokenize": ["tokens"],
}
VALID = {"/v1/completions": {"prompt": "t1 t2", "max_tokens": 2},
         "/v1/chat/completions": {"messages": [{"role": "user", "content": "t1 t2"}], "max_tokens": 2},
         "/v1/responses": {"input": "t1 t2", "max_output_tokens": 2},
         "/tokenize": {"prompt": "t1 t2"}, "/detokenize": {"tokens": [1, 2]}}
GENERATING = ("/v1/completions", "/v1/chat/completions", "/v1/responses")
OWN = {"messages": messages, "input": messages | values, "tools": tools | values, "prompt": values}


@st.composite
def bodies(draw):
    route = draw(st.sampled_from(sorted(ROUTES)))
    body = dict(VALID[route])
    fields = SHARED + ROUTES[route] if route in GENERATING else ["model"] + ROUTES[route]
    for name in draw(st.lists(st.sampled_from(fields), min_size=1, max_size=4, unique=True)):
        body[name] = draw(OWN.get(name, values))
    if body.get("model") is not None and draw(st.booleans()):
        body["model"] = "tiny"  # the served model: the other fields' checks are reached
    for cap in ("max_tokens", "max_output_tokens", "max_completion_tokens", "n"):  # keep each draw quick
        if isinstance(body.get(cap), int) and not isinstance(body[cap], bool) and body[cap] > 4:
            body[cap] = 4
    return route, body


def test_any_body_gets_an_answer_or_an_openai_error(server):
    base, _, _ = server

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(drawn=bodies())
    def answered(drawn):
        route, body = drawn
        status, text = call(base, route, body)
        assert status == 200 or 400 <= status < 500, (status, text[:400])
        if status != 200:
            error = json.loads(text)["error"]
            assert isinstance(error["message"], str) and error["message"] and error["type"], error
        elif body.get("stream") is True:
            assert "data: " in text and "internal error" not in text, text[-400:]
        else:
            answer = json.loads(text)
            assert ("usage" if route in GENERATING else "tokens" if route == "/tokenize" else "prompt") in answer

    answered()


def test_after_the_fuzz_the_server_serves_as_before(server):
    base, _, _ = server
    status, text = call(base, "/v1/completions", {"prompt": "t5 t6 t7", "max_tokens": 3, "temperature": 0})
    assert status == 200 and json.loads(text)["usage"]["completion_tokens"] == 3


@pytest.fixture(scope="module")
def tooled():
    """A server that reads tool calls (Hermes') and thinking (Qwen3's), over a byte tokenizer with an
    end token: structured outputs and tool calls are reached."""
    from linnet.serve import Engine

    from .conftest import make_model, running
    from .test_structured import byte_tokenizer

    model = make_model("torch", rows=4, max_seq=128)
    model.tokenizer = byte_tokenizer(model.vocab)
    model.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    with running(Engine(model), tool_parser="hermes", reasoning_parser="qwen3") as url:
        yield url


schemas = st.just({"type": "object", "properties": {"x": {"type": "integer"}}}) | values
chat_bodies = st.fixed_dictionaries(
    {"messages": st.just([{"role": "user", "content": "hi"}]), "max_tokens": st.integers(1, 6),
     "seed": st.integers(0, 3)},
    optional={"tools": st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
                  {"name": st.sampled_from(["f", "g"]) | values, "parameters": schemas})}), max_size=2) | values,
              "tool_choice": st.sampled_from(["auto", "none", "required"]) | st.fixed_dictionaries(
                  {"type": st.just("function"), "function": st.fixed_dictionaries({"name": st.sampled_from(["f", "h"])})})
              | values,
              "response_format": st.fixed_dictionaries({"type": st.sampled_from(["json_object", "json_schema", "text"]),
                                                        "json_schema": st.fixed_dictionaries({"name": st.just("s"),
                                                                                              "schema": schemas})})
              | values,
              "parallel_tool_calls": values, "stream": st.booleans(), "n": st.integers(1, 2)})


def test_any_tool_or_format_body_gets_an_answer_or_an_openai_error(tooled):
    @settings(max_examples=120, deadline=None, derandomize=True, database=None)
    @given(body=chat_bodies)
    def answered(body):
        status, text = call(tooled, "/v1/chat/completions", body)
        assert status == 200 or 400 <= status < 500, (status, text[:400])
        if status != 200:
            assert json.loads(text)["error"]["message"]
        elif body.get("stream"):
            assert "internal error" not in text, text[-400:]
        else:
            assert all(c["finish_reason"] for c in json.loads(text)["choices"])

    answered()
