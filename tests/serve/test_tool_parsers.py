"""The readers of models' own tool-call formats, on replies written as each family writes them
(Llama 3's JSON, Hermes' <tool_call> tags), and on text that makes no call."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.serve.tool_parsers import PARSERS, tool_parser

names = st.from_regex(r"[a-z_][a-z0-9_]{0,15}", fullmatch=True)
values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                      max_leaves=6)
arguments = st.dictionaries(st.text(min_size=1, max_size=6), values, max_size=4)
calls = st.lists(st.tuples(names, arguments), min_size=1, max_size=3)


def written(parser: str, made: list, before: str = "") -> str:
    if parser == "llama3_json":
        return "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in made)
    return before + "".join(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in made)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(parser=st.sampled_from(sorted(PARSERS)), made=calls, before=st.sampled_from(["", "Let me look. "]))
def test_calls_written_as_the_family_writes_them_read_back(parser, made, before):
    before = before if parser == "hermes" else ""  # Llama 3 writes a call as the whole reply
    content, got = tool_parser(parser).parse(written(parser, made, before))
    assert [(c["name"], json.loads(c["arguments"])) for c in got] == made
    assert content == (before.strip() or None)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(parser=st.sampled_from(sorted(PARSERS)), text=st.text(max_size=40).filter(lambda t: "<tool_call>" not in t))
def test_text_without_a_call_is_text(parser, text):
    content, got = tool_parser(parser).parse(text)
    if got:  # only a reply that is one whole JSON call may read as one
        assert parser == "llama3_json" and text.strip().startswith("{")
    else:
        assert content == text


@pytest.mark.parametrize("parser,text,content,made", [
    ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {"x": 1}}', None, [("f", {"x": 1})]),
    ("llama3_json", '{"name": "f", "arguments": "{\\"x\\": 2}"}', None, [("f", {"x": 2})]),
    ("llama3_json", '{"name": "f", "parameters": {"x": 1', '{"name": "f", "parameters": {"x": 1', []),  # cut short
    ("llama3_json", '{"answer": 42}', '{"answer": 42}', []),  # JSON, but no call
    ("hermes", 'Sure.<tool_call>{"name": "g", "arguments": {}}</tool_call>', "Sure.", [("g", {})]),
    ("hermes", '<tool_call>{"name": "g", "arguments": {"a": [1]}}', None, [("g", {"a": [1]})]),  # unclosed at the end
    ("hermes", '<tool_call>not json</tool_call>', '<tool_call>not json</tool_call>', []),
])
def test_edges(parser, text, content, made):
    got_content, got = tool_parser(parser).parse(text)
    assert got_content == content
    assert [(c["name"], json.loads(c["arguments"])) for c in got] == made


def test_where_a_streamed_call_may_begin():
    llama, hermes = tool_parser("llama3_json"), tool_parser("hermes")
    assert llama.call_start("  {\"na") == 2 and llama.call_start("Hello") is None and llama.call_start("<|py") == 0
    assert hermes.call_start("Sure.<tool_call>{") == 5 and hermes.call_start("Sure.<tool") is None
    assert hermes.hold == len("<tool_call>") - 1
    with pytest.raises(ValueError, match="no tool-call parser"):
        tool_parser("mistral")
