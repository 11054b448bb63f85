"""The OpenAI server over the JAX backend under a mixed concurrent load, warmed up as `linnet serve`
warms it: a greedy request answers among the others as it does alone (f32: exactly), and nothing is
compiled while serving (counted apart from the engine, by JAX's own compile events). A random tiny
model whose tokens are bytes (test_structured.byte_tokenizer), so structures and tools run."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from linnet.serve import Engine

from .conftest import make_model, running
from .test_server import call, sse
from .test_structured import byte_tokenizer

pytest.importorskip("llguidance")

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city"],
    "properties": {"city": {"type": "string", "maxLength": 8}}}}}
PROMPTS = ["Hello", "The sky is", "Once upon a time", "1, 2, 3,"]


def chat(content: str, **fields) -> dict:
    return dict({"messages": [{"role": "user", "content": content}], "max_tokens": 12, "temperature": 0}, **fields)


# what a server's clients may ask for at once: n, seeds, logprobs, the prompt's, structures, forced
# tool calls, stop strings, penalties, a bias, min_tokens, streams
MIXED = [("/v1/chat/completions", chat("Tell", n=3, temperature=0.9, seed=5)),
         ("/v1/chat/completions", chat("Count", logprobs=True, top_logprobs=3)),
         ("/v1/completions", {"prompt": "Sky", "max_tokens": 4, "prompt_logprobs": 2, "logprobs": 2}),
         ("/v1/chat/completions", chat("Person", max_tokens=40, response_format={"type": "json_schema", "json_schema": {
             "name": "w", "schema": WEATHER["function"]["parameters"]}})),
         ("/v1/chat/completions", chat("Weather?", max_tokens=40, tools=[WEATHER], tool_choice="required")),
         ("/v1/chat/completions", chat("Weather?", max_tokens=40, tools=[WEATHER],
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})),
         ("/v1/chat/completions", chat("List", stop=["a", "e"], max_tokens=20)),
         ("/v1/chat/completions", chat("Pen", repetition_penalty=1.3, logit_bias={"70": 5}, min_tokens=8)),
         ("/v1/chat/completions", chat("Stream", stream=True, n=2, temperature=0.7, seed=1,
                                       stream_options={"include_usage": True}))]


def test_greedy_answers_alone_as_among_others_and_nothing_compiles_while_serving(compiles_counted):
    from jax._src import monitoring

    model = make_model("jax", rows=4, max_seq=96)
    model.tokenizer = byte_tokenizer(model.vocab)
    model.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    engine = Engine(model)
    engine.warmup(logprobs=True, structured=True, adjusted=True)  # as serve() does
    engine.warm_scoring_later().join()  # (serve() goes on meanwhile: a scored request might come first)
    compiled = []

    def heard(event: str, seconds: float, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(event)

    monitoring.register_event_duration_secs_listener(heard)
    try:
        with running(engine) as base:
            def text(prompt: str) -> str:
                status, body = call(base, "/v1/completions", {"prompt": prompt, "max_tokens": 16, "temperature": 0})
                assert status == 200, body
                return json.loads(body)["choices"][0]["text"]

            alone = [text(p) for p in PROMPTS]
            with ThreadPoolExecutor(16) as pool:  # more requests than the 4 rows
                greedy = [pool.submit(text, p) for p in PROMPTS * 2]
                others = [pool.submit(call, base, path, body) for path, body in MIXED * 2]
                together = [f.result() for f in greedy]
                answers = [f.result() for f in others]
            metrics = dict(line.rsplit(" ", 1) for line in call(base, "/metrics")[1].splitlines()
                           if not line.startswith("#"))
    finally:
        monitoring.unregister_event_duration_listener(heard)
    assert together == alone * 2
    for (path, body), (status, reply) in zip(MIXED * 2, answers):
        assert status == 200, (body, reply)
        if body.get("stream"):
            assert sse(reply)[-1]["usage"]["completion_tokens"] >= 2
            continue
        choice = json.loads(reply)["choices"][0]
        if "tools" in body:
            [made] = choice["message"]["tool_calls"]
            assert made["function"]["name"] == "get_weather"
            if choice["finish_reason"] != "length":  # (a call max_tokens cut is sent as far as it got)
                assert set(json.loads(made["function"]["arguments"])) == {"city"}
        elif "response_format" in body and choice["finish_reason"] == "stop":
            assert set(json.loads(choice["message"]["content"])) == {"city"}
    assert compiled == [] and metrics["linnet_compiles_total"] == "0"
