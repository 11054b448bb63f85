"""The readers of reasoning models' thinking: whole replies split as each family writes them, and
the same replies streamed in any pieces, through the one cursor the server moves."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.serve.reasoning import reasoning_parser

from .call_streams import stream

plain = st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=30)


def streamed(parser, reply: str, cuts: list) -> tuple:
    """The reply sent as the server sends it, its text growing at `cuts`: (reasoning, content)."""
    reasoning = content = ""
    sent = 0
    for end in sorted(set(cuts)) + [len(reply)]:
        text = reply[:end]
        stop = len(text) if end == len(reply) else max(sent, min(parser.sendable(text), len(text)))
        r, c = parser.divide(text, sent, stop)
        reasoning, content, sent = reasoning + r, content + c, stop
    return reasoning or None, content or None


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(name=st.sampled_from(["deepseek_r1", "qwen3"]), thought=plain, answer=plain, lead=st.sampled_from(["", "\n"]),
       data=st.data())
def test_a_reply_thinks_then_answers_whole_and_streamed(name, thought, answer, lead, data):
    parser = reasoning_parser(name)
    reply = f"{lead}<think>{thought}</think>{answer}"
    want = (thought or None, answer or None)
    assert parser.split(reply) == want
    cuts = data.draw(st.lists(st.integers(0, len(reply)), max_size=8))
    assert streamed(parser, reply, cuts) == want


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(text=plain, data=st.data())
def test_without_tags_r1_is_all_thinking_and_qwen3_all_answer(text, data):
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=6))
    r1, qwen3 = reasoning_parser("deepseek_r1"), reasoning_parser("qwen3")
    assert r1.split(text) == streamed(r1, text, cuts) == (text or None, None)  # its template opened the thinking
    assert qwen3.split(text) == streamed(qwen3, text, cuts) == (None, text or None)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(thought=plain, answer=plain, data=st.data())
def test_a_qwen3_reply_whose_template_opened_the_thinking_thinks_until_its_end(thought, answer, data):
    """Qwen3's Thinking-2507 templates end the prompt with <think>: the reply holds only </think>
    (vLLM's qwen3 reader reads it so). A template that opened and closed it (thinking off) leaves all answer."""
    opened = reasoning_parser("qwen3").for_prompt("<|im_start|>assistant\n<think>\n")
    reply = f"{thought}</think>\n\n{answer}"
    want = (thought or None, f"\n\n{answer}")
    cuts = data.draw(st.lists(st.integers(0, len(reply)), max_size=8))
    assert opened.split(reply) == streamed(opened, reply, cuts) == want
    assert opened.split(thought) == (thought or None, None)  # cut short while thinking
    closed = reasoning_parser("qwen3").for_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert closed.split(answer) == streamed(closed, answer, cuts) == (None, answer or None)


def test_edges():
    r1, qwen3 = reasoning_parser("deepseek_r1"), reasoning_parser("qwen3")
    assert r1.split("hmm</think>\n\nFour.") == ("hmm", "\n\nFour.")
    assert qwen3.split("<think>cut short") == ("cut short", None)
    assert qwen3.split("a <think> later is text") == (None, "a <think> later is text")
    assert qwen3.sendable("<thi") == 0 and qwen3.sendable("<b>") == 3  # the opening tag may be arriving
    # only what may be "</think>" arriving is held: the thinking goes out as written
    assert r1.sendable("so</thi") == len("so") and r1.sendable("so far <") == len("so far ")
    assert r1.sendable("so far") == len("so far") and r1.sendable("<thi") == 0  # R1's leading <think> is dropped
    harmony, head = reasoning_parser("openai_gptoss"), "<|channel|>analysis<|message|>"
    assert harmony.sendable(head + "so far") == len(head + "so far")  # no marker may be arriving
    assert harmony.sendable(head + "so far<|e") == len(head + "so far")
    with pytest.raises(ValueError, match="no reasoning parser"):
        reasoning_parser("granite")


def harmony_reply(thought: str, answer: str, call: str | None = None) -> str:
    reply = f"<|channel|>analysis<|message|>{thought}<|end|>"
    if call is not None:
        return reply + f"<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{call}<|call|>"
    return reply + f"<|start|>assistant<|channel|>final<|message|>{answer}<|return|>"


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(thought=plain, answer=plain, data=st.data())
def test_harmony_channels_whole_and_streamed(thought, answer, data):
    parser = reasoning_parser("openai_gptoss")
    reply = harmony_reply(thought, answer)
    assert parser.split(reply) == (thought or None, answer or None)
    cuts = data.draw(st.lists(st.integers(0, len(reply)), max_size=8))
    assert streamed(parser, reply, cuts) == (thought or None, answer or None)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(lead=plain.filter(bool), answer=plain, data=st.data())
def test_a_harmony_reply_begun_without_a_header_keeps_that_text_as_content(lead, answer, data):
    """Text before the first marker (a reply written with no header: the model strayed from its
    format) is content, read whole and streamed alike; it was dropped, the reply empty."""
    parser = reasoning_parser("openai_gptoss")
    assert parser.split(lead) == streamed(parser, lead, data.draw(st.lists(st.integers(0, len(lead))))) == (None, lead)
    reply = lead + f"<|channel|>final<|message|>{answer}<|return|>"
    cuts = data.draw(st.lists(st.integers(0, len(reply)), max_size=8))
    assert parser.split(reply) == streamed(parser, reply, cuts) == (None, lead + answer)
    assert parser.parse(lead) == (lead, [])


def test_harmony_calls_are_read_from_the_whole_reply_and_never_streamed_as_text():
    parser = reasoning_parser("openai_gptoss")
    reply = harmony_reply("Need the time.", "", call='{"zone": "UTC"}')
    content, calls = parser.parse(reply)
    assert content is None and calls == [{"name": "f", "arguments": '{"zone": "UTC"}'}]
    assert streamed(parser, reply, list(range(len(reply)))) == ("Need the time.", None)
    assert parser.parse(reply[:-len("<|call|>") - 2])[1] == []  # cut short: no call
    preamble = "<|channel|>commentary<|message|>One moment.<|end|>"  # commentary to no one is shown
    assert parser.split(preamble) == (None, "One moment.")


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(thought=plain, arguments=st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=6), max_size=3),
       tight=st.booleans())
def test_harmony_calls_stream_as_they_are_written(thought, arguments, tight):
    """As a tool parser, harmony's calls go argument by argument, as the model writes them; read a
    character at a time, what is sent never holds part of a marker."""
    parser = reasoning_parser("openai_gptoss")
    written = json.dumps(arguments, separators=(",", ":") if tight else None)
    reply = harmony_reply(thought, "", call=written)
    two = reply + "<|start|>assistant<|channel|>commentary to=functions.g <|constrain|>json<|message|>{}<|call|>"
    got = stream(parser, two, {"f", "g"})
    assert [(n, a) for _, n, a in got] == [("f", written), ("g", "{}")] and all(i.startswith("call_") for i, *_ in got)
    for end in range(len(reply)):
        assert all("<|" not in (a or "") for _, a, _ in parser.partial(reply[:end]))


def test_parallel_tool_calls_false_keeps_harmonys_first_call_whole_and_streamed():
    """gpt-oss writes each call as a commentary message: with parallel_tool_calls false the first is
    kept (vLLM drops the rest), read whole and streamed alike; the parser's other readings are its own."""
    from linnet.serve.tool_parsers import FirstCall

    parser = FirstCall(reasoning_parser("openai_gptoss"))
    reply = harmony_reply("Two calls.", "", call='{"zone": "UTC"}')
    two = reply + "<|start|>assistant<|channel|>commentary to=functions.g <|constrain|>json<|message|>{}<|call|>"
    assert parser.parse(two) == (None, [{"name": "f", "arguments": '{"zone": "UTC"}'}])
    assert [(n, a) for _, n, a in stream(parser, two, {"f", "g"})] == [("f", '{"zone": "UTC"}')]
    assert parser.reads_whole_reply and parser.split(two) == reasoning_parser("openai_gptoss").split(two)


def test_a_reasoning_models_structured_answer_waits_for_the_end_of_its_thinking():
    """The server asks the engine to hold a structure only after the thinking's end (the engine's
    side: test_structured); a template that has closed the thinking already leaves it from the start."""
    from linnet.serve.openai_api import chat_job

    from .test_structured import byte_tokenizer

    tok = byte_tokenizer(128)
    body = {"messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": "json_object"}}
    tok.chat_template = "{{ messages[0]['content'] }}\n<think>\n"
    job = chat_job(body, tok, 96, reasoning=reasoning_parser("deepseek_r1"))
    assert job.requests[0].structure_after == tok.encode("</think>", add_special_tokens=False)
    job = chat_job(body, tok, 96, reasoning=reasoning_parser("qwen3"))  # (Qwen3's Thinking-2507 templates')
    assert job.requests[0].structure_after == tok.encode("</think>", add_special_tokens=False)
    assert job.reasoning.split('Hmm.</think>{"a": 1}') == ("Hmm.", '{"a": 1}')  # its reply starts thinking
    tok.chat_template = "{{ messages[0]['content'] }}\n<think>\n\n</think>\n\n"  # thinking switched off
    assert chat_job(body, tok, 96, reasoning=reasoning_parser("qwen3")).requests[0].structure_after is None
    assert chat_job(body, tok, 96).requests[0].structure_after is None  # no reasoning parser: from the first token
