"""The server through OpenAI's own Python client: what its users run against vLLM runs against Linnet."""

import pytest

from .test_server import engine_greedy, words

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def client(server):
    base, _, _ = server
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


def test_completions(client, server):
    _, engine, _ = server
    out = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=6, temperature=0, n=2)
    assert [c.index for c in out.choices] == [0, 1]
    assert all(c.text.split() == words(engine_greedy(engine, [5, 6, 7], 6)) for c in out.choices)
    assert out.usage.prompt_tokens == 3 and out.usage.completion_tokens == 12


def test_chat_streamed_with_usage(client):
    messages = [{"role": "system", "content": "t9"}, {"role": "user", "content": "t40 t41"}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0)
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 5
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_logprobs(client):
    out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "t3"}], max_tokens=3,
                                         temperature=0, logprobs=True, top_logprobs=2)
    content = out.choices[0].logprobs.content
    assert len(content) == 3 and all(len(c.top_logprobs) == 2 for c in content)
    assert all(c.logprob == c.top_logprobs[0].logprob for c in content)  # greedy: the chosen is the best


def test_errors_are_the_clients_exceptions(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt=[1, 2], max_tokens=5000)
    assert err.value.status_code == 400 and err.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt=[1])
    assert [m.id for m in client.models.list()] == ["tiny"]
