"""The readers of models' own tool-call formats, on replies written as each family writes them
(Llama 3's JSON, Hermes' <tool_call> tags, Mistral's [TOOL_CALLS] list or NAME[ARGS], Python calls), and on text
that makes no call."""

import json
import keyword

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.serve.tool_parsers import PARSERS, tool_parser

from .call_streams import stream

names = st.from_regex(r"[a-z_][a-z0-9_]{0,15}", fullmatch=True)
values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                      max_leaves=6)
arguments = st.dictionaries(st.text(min_size=1, max_size=6), values, max_size=4)
calls = st.lists(st.tuples(names, arguments), min_size=1, max_size=3)
# Python's calls name their arguments with identifiers
python_calls = st.lists(st.tuples(names, st.dictionaries(names.filter(lambda n: not keyword.iskeyword(n)), values,
                                                         max_size=4)), min_size=1, max_size=3)
TAKES_TEXT_BEFORE = ("hermes", "mistral")  # the others write a call as the whole reply
# the families `written` writes (Qwen3-Coder's has tests of its own)
WRITTEN = sorted(set(PARSERS) - {"qwen3_coder"})


def written(parser: str, made: list, before: str = "", dumps=json.dumps) -> str:
    """The reply a model of the family writes to make these calls (Mistral's with its special token
    as text, as the server gives it to the parser); `dumps` writes JSON as the model spaces it."""
    if parser == "llama3_json":
        return "; ".join(dumps({"name": n, "parameters": a}) for n, a in made)
    if parser == "mistral":
        return before + "[TOOL_CALLS] " + dumps([{"name": n, "arguments": a} for n, a in made])
    if parser == "mistral-v11":  # Mistral's v11 tokenizers: a marker, the name and [ARGS] for each call
        return before + "".join(f"[TOOL_CALLS]{n}[ARGS]{dumps(a)}" for n, a in made)
    if parser == "pythonic":
        return "[" + ", ".join(f"{n}({', '.join(f'{k}={v!r}' for k, v in a.items())})" for n, a in made) + "]"
    return before + "".join(f"<tool_call>\n{dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in made)


# how models space their JSON: as json.dumps does, tight, or over lines
SPACINGS = {"default": json.dumps, "tight": lambda v: json.dumps(v, separators=(",", ":")),
            "lines": lambda v: json.dumps(v, indent=1, ensure_ascii=False)}


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(parser=st.sampled_from(WRITTEN + ["mistral-v11"]), data=st.data(),
       before=st.sampled_from(["", "Let me look. "]))
def test_calls_written_as_the_family_writes_them_read_back(parser, data, before):
    made = data.draw(python_calls if parser == "pythonic" else calls)
    before = before if parser.split("-")[0] in TAKES_TEXT_BEFORE else ""
    content, got = tool_parser(parser.split("-")[0]).parse(written(parser, made, before))
    assert [(c["name"], json.loads(c["arguments"])) for c in got] == made
    assert content == (before or None)  # the text before the calls as written, as vLLM's parsers give it


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(parser=st.sampled_from(sorted(PARSERS)),
       text=st.text(max_size=40).filter(lambda t: "<tool_call>" not in t and "[TOOL_CALLS]" not in t))
def test_text_without_a_call_is_text(parser, text):
    content, got = tool_parser(parser).parse(text)
    if got:  # only a reply that is one whole JSON call, or one whole list of Python calls, may read as one
        assert (parser, text.strip()[:1]) in (("llama3_json", "{"), ("llama3_json", "["), ("pythonic", "["))
    else:
        assert content == text


@pytest.mark.parametrize("parser,text,content,made", [
    ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {"x": 1}}', None, [("f", {"x": 1})]),
    ("llama3_json", '{"name": "f", "arguments": "{\\"x\\": 2}"}', None, [("f", {"x": 2})]),
    ("llama3_json", '{"name": "f", "parameters": {"x": 1', '{"name": "f", "parameters": {"x": 1', []),  # cut short
    ("llama3_json", '{"answer": 42}', '{"answer": 42}', []),  # JSON, but no call
    ("llama3_json", 'See: {"name": "f", "parameters": {"x": 1}, "id": "c1"}', "See: ", [("f", {"x": 1})]),  # keys after
    # no arguments, a name that is no string, arguments that are no object: no call (vLLM's reads none)
    ("llama3_json", '{"name": "f"}', '{"name": "f"}', []),
    ("llama3_json", '{"name": 3, "parameters": {}}', '{"name": 3, "parameters": {}}', []),
    ("llama3_json", '{"name": "f", "parameters": [1]}', '{"name": "f", "parameters": [1]}', []),
    ("llama3_json", '{"name": "f", "arguments": "no json"}', '{"name": "f", "arguments": "no json"}', []),
    ("hermes", 'Sure.<tool_call>{"name": "g", "arguments": {}}</tool_call>', "Sure.", [("g", {})]),
    ("hermes", '<tool_call>{"name": "g", "arguments": {"a": [1]}}', None, [("g", {"a": [1]})]),  # unclosed at the end
    ("hermes", '<tool_call>not json</tool_call>', '<tool_call>not json</tool_call>', []),
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {}}]', None,
     [("f", {"x": 1}), ("g", {})]),
    ("mistral", '[TOOL_CALLS]{"name": "f", "arguments": {}}[TOOL_CALLS]{"name": "g", "arguments": {}}', None,
     [("f", {}), ("g", {})]),  # a marker before each call
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"x": 1', '[TOOL_CALLS][{"name": "f", "arguments": {"x": 1',
     []),  # cut short
    ("mistral", '[{"name": "f", "arguments": {}}]', '[{"name": "f", "arguments": {}}]', []),  # no marker: text
    ("mistral", 'Sure.[TOOL_CALLS]get_time[ARGS]{"zone": "UTC"}', "Sure.", [("get_time", {"zone": "UTC"})]),  # v11
    ("mistral", '[TOOL_CALLS]f[CALL_ID]a1B2c3D4e[ARGS]{"x": 1}', None, [("f", {"x": 1})]),  # with the call's id
    ("mistral", '[TOOL_CALLS]f[ARGS]{"x": 1', '[TOOL_CALLS]f[ARGS]{"x": 1', []),  # cut short
    ("mistral", '[TOOL_CALLS][ARGS]{}', '[TOOL_CALLS][ARGS]{}', []),  # no name
    ("mistral", '[TOOL_CALLS]f[ARGS][1]', '[TOOL_CALLS]f[ARGS][1]', []),  # arguments not an object
    ("pythonic", '[get_weather(city="Paris", days=3), now()]', None, [("get_weather", {"city": "Paris", "days": 3}),
                                                                     ("now", {})]),
    ("pythonic", '<|python_start|>[f(flag=true, none=null, xs=[1, (2, 3)])]<|python_end|>', None,
     [("f", {"flag": True, "none": None, "xs": [1, [2, 3]]})]),
    ("pythonic", '[f(x=1), "text"]', '[f(x=1), "text"]', []),  # not all calls
    ("pythonic", '[f(1)]', '[f(1)]', []),  # positional: no names for the arguments
    ("pythonic", '[f(x=g())]', '[f(x=g())]', []),  # not a literal
    ("pythonic", '[os.system(x="ls")]', '[os.system(x="ls")]', []),  # not a plain name
    ("pythonic", '[f(x={1, 2})]', '[f(x={1, 2})]', []),  # a set: no JSON for it
    ("pythonic", '[f(x=1)', '[f(x=1)', []),  # cut short
])
def test_edges(parser, text, content, made):
    got_content, got = tool_parser(parser).parse(text)
    assert got_content == content
    assert [(c["name"], json.loads(c["arguments"])) for c in got] == made


# JSON nested deeper than Python's json reads (a RecursionError), as a model stuck repeating "[" writes it
DEEP = "[" * 5000 + "]" * 5000


@pytest.mark.parametrize("parser,reply", [
    ("hermes", '<tool_call>{"name": "f", "arguments": {"x": ' + DEEP + "}}</tool_call>"),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"x": ' + DEEP[:5000]),
    ("llama3_json", '{"name": "f", "parameters": {"x": ' + DEEP + "}}"),
    ("mistral", '[TOOL_CALLS]f[ARGS]{"x": ' + DEEP + "}"),
    ("mistral", "[TOOL_CALLS]" + DEEP),
], ids=["hermes", "hermes-unclosed", "llama3_json", "mistral-v11", "mistral-list"])
def test_json_nested_past_pythons_recursion_is_text(parser, reply):
    """No call, the reply's text as it is (vLLM's parsers catch json's error so); the error failed
    the whole reply, streamed or not, before."""
    with pytest.raises(RecursionError):
        json.loads(DEEP)
    reader = tool_parser(parser)
    assert reader.parse(reply) == (reply, [])
    assert reader.call_start(reply) in (0, None)
    # no call closed while written (v11's NAME[ARGS] streams its arguments as written: its end reads them)
    closed = [name for name, _, done in reader.partial(reply) if name and done]
    assert closed == (["f"] if "[ARGS]" in reply else [])


# vLLM's llama3_json tests' replies (tests/entrypoints/openai/tool_parsers/test_llama3_json_tool_parser.py)
# and the calls it reads from them: a call amid text, ";" with spaces around it, nested and escaped values
LLAMA3_VLLM = [
    ('Here is the result: {"name": "getOpenIncidentsTool", "parameters": {}} Would you like to know more?',
     [("getOpenIncidentsTool", {})], "Here is the result: "),
    ('{"name": "searchTool", "parameters": {"query": "test1"}} ; {"name": "getOpenIncidentsTool", "parameters": {}} ; '
     '{"name": "searchTool", "parameters": {"query": "test2"}}',
     [("searchTool", {"query": "test1"}), ("getOpenIncidentsTool", {}), ("searchTool", {"query": "test2"})], None),
    ('Here are the results: {"name": "searchTool", "parameters": {"query": "test1"}}; '
     '{"name": "getOpenIncidentsTool", "parameters": {}}; {"name": "searchTool", "parameters": {"query": "test2"}} '
     "Would you like to know more?",
     [("searchTool", {"query": "test1"}), ("getOpenIncidentsTool", {}), ("searchTool", {"query": "test2"})],
     "Here are the results: "),
    ('{"name": "complexTool", "parameters": {"level1": {"level2": {"level3": {"level4": {"value": "deep"}}}}}}',
     [("complexTool", {"level1": {"level2": {"level3": {"level4": {"value": "deep"}}}}})], None),
    ('{"name": "searchTool", "parameters": {"query": "test {value} [complex]","nested": {"inner": "more {brackets}"}}}',
     [("searchTool", {"query": "test {value} [complex]", "nested": {"inner": "more {brackets}"}})], None),
    ('{"name": "parserTool", "parameters": {"text": "He said \\"Hello {world}\\""}}',
     [("parserTool", {"text": 'He said "Hello {world}"'})], None),
    ('{"name": "invalidTool", "parameters": {invalid json}', [], None),
    ("This is just some text without any tool calls", [], None),
]


@pytest.mark.parametrize("reply,made,before", LLAMA3_VLLM)
def test_llama3_json_reads_the_calls_vllms_tests_read(reply, made, before):
    """The calls vLLM's llama3_json parser reads from its tests' replies, text around them too (the
    text after the calls dropped, as vLLM drops it). The content is the text before the calls:
    vLLM's whole reply gives none there, but its stream sends that text as content, and a stream
    cannot take back what it sent; so here both give it. Streamed, the calls add up to the whole's."""
    reader = tool_parser("llama3_json")
    content, got = reader.parse(reply)
    assert [(c["name"], json.loads(c["arguments"])) for c in got] == made
    assert content == (before if made else reply)
    names = {n for n, _ in made}
    for step in (1, 4):
        assert [(n, a) for _, n, a in stream(reader, reply, names, step)] == [(c["name"], c["arguments"]) for c in got]
        if made:  # the stream's text stops where the calls begin, before or at the first character of their object
            assert reply[:reader.call_start(reply)] == (before or "")


@pytest.mark.parametrize("reply,made", [
    ('[{"name": "f", "parameters": {"x": 1}}]', [("f", {"x": 1})]),
    ('<|python_tag|>[ {"name": "f", "parameters": {"x": 1}} ,{"name": "g", "arguments": {}} ]', [("f", {"x": 1}), ("g", {})]),
    ('[{"id": 1, "name": "f"}]', []),  # a list of records, no calls
    ('[{"name": "f", "parameters": {}}, {"id": 2}]', []),  # as for ";": one object that is no call, no calls
    ("[1, 2]", []),
])
def test_llama3_json_reads_a_list_of_calls_as_its_calls(reply, made):
    """A reply that lists its calls, as models taught other formats write them, makes each call,
    no content; whole and streamed alike. A list that holds anything but calls is text."""
    reader = tool_parser("llama3_json")
    content, got = reader.parse(reply)
    assert [(c["name"], json.loads(c["arguments"])) for c in got] == made
    assert content == (None if made else reply)
    if made:
        streamed = stream(reader, reply, {"f", "g"}, 1)
        assert [(n, a) for _, n, a in streamed] == [(c["name"], c["arguments"]) for c in got]
        assert all(reader.call_start(reply[:end]) == 0 for end in range(1, len(reply) + 1))  # held from the "["


def test_llama3_json_text_with_an_object_that_is_no_call_is_text():
    """After text, an object is a call only with its name first and its arguments written: an
    answer's JSON that names something is text, and waits (streamed) only while it may be a call."""
    reader = tool_parser("llama3_json")
    for reply in ('The user is {"name": "Bob", "age": 3}', "Use {x} in the template.", 'Say {"nam" and go'):
        assert reader.parse(reply) == (reply, [])
        assert [(n, a) for _, n, a in stream(reader, reply, {"Bob"}, 1)] == []
    assert reader.call_start("Use {x} in") is None and reader.call_start('Use { "na') == 4
    assert reader.call_start("Use {") == 4 and reader.call_start('Say {"nam" and') is None


# Replies that make no call, and the prefix after which each can no longer be one: a call is an
# object whose keys, until it has said its name and its arguments, are "name", "parameters",
# "arguments" (or "type"), as vLLM's llama3_json reads one ("name" and the arguments both).
LLAMA3_NO_CALL = [
    ('{"answer": 42, "why": "' + "x" * 200 + '"}', '{"an'),  # an answer's JSON: its first key says so
    ('{"arguments_for": [1]}', '{"arguments_'),
    ('{"name": "Bob", "age": 3, "bio": "' + "y" * 200 + '"}', '{"name": "Bob", "ag'),
    ('{"name": "Bob"}', '{"name": "Bob"}'),  # no arguments: closed, no call
    ('{"name": 7, "parameters": {}}', '{"name": 7'),  # a name that is no string
    ('{"name": "f", "parameters": 5, "z": "' + "z" * 100 + '"}', '{"name": "f", "parameters": 5'),
    ('{ this is prose, in braces, ' + "w" * 100 + "}", "{ t"),
    ('<|python_tag|>brave_search.call(query="x")', "<|python_tag|>b"),  # Llama 3.1's built-in tools: no JSON
    ("Use {x} or {y} in the template, " + "v" * 100, "Use {x"),
    ('The user is {"name": "Bob", "age": 3} and ' + "u" * 100, 'The user is {"name": "Bob", "ag'),
]


@pytest.mark.parametrize("reply,decided", LLAMA3_NO_CALL)
def test_llama3_json_streams_text_once_it_can_no_longer_be_a_call(reply, decided):
    """Streamed, text is held only while it may still be a call: from the prefix where it can no
    longer be one (`decided`), call_start finds none, and so all of it goes out as content; before,
    it holds from the object's "{" (vLLM's stream holds a reply opening with "{" to its end and
    never sends it as content)."""
    reader = tool_parser("llama3_json")
    assert reader.parse(reply) == (reply, [])
    brace = reply.find("{") if reply.find("{") > 0 else 0
    for end in range(brace + 1, len(reply) + 1):
        start = reader.call_start(reply[:end])
        if end < len(decided):
            assert start == brace, reply[:end]  # may still be a call: held from where it would begin
        else:  # text, but for a later "{" just written, which may open a call
            assert start is None or start > brace and len(reply[start:end]) <= len('{"name'), reply[:end]
    assert [(n, a) for _, n, a in stream(reader, reply, {"Bob", "f"}, 1)] == []


def test_llama3_json_holds_a_call_from_its_first_character():
    """Every prefix of a call, at the reply's start or after text, holds from where it begins."""
    reader = tool_parser("llama3_json")
    for reply, start in (('{"name": "f", "parameters": {"x": 1}}', 0),
                         ('{"type": "function", "name": "f", "parameters": {}}', 0),
                         ('  <|python_tag|>{"parameters": {"x": [1]}, "name": "f"}', 0),
                         ('Let me check. {"name": "f", "arguments": {"q": "{a}"}}', 14)):
        for end in range(start + 1, len(reply) + 1):
            assert reader.call_start(reply[:end]) == start, reply[:end]
        assert reader.parse(reply)[1] and reader.parse(reply)[0] == (reply[:start] or None)


# Pythonic replies that make no call, and the prefix after which each can no longer be a list of calls.
PYTHONIC_NO_CALL = [
    ("[1] See the note below. " + "n" * 100, "[1"),
    ("[see below] for the details " + "d" * 100, "[see b"),
    ("[link](https://x.org) is the page " + "p" * 100, "[link]"),
    ("[] is an empty list " + "e" * 100, "[]"),
    ("['a', 'b'] are strings " + "s" * 100, "['"),
    ("[f(x=g())] runs nothing " + "g" * 100, "[f(x=g())"),  # arguments that are no literals
    ("[f(x=1)] and then text " + "t" * 100, "[f(x=1)] a"),  # a list of calls, then text: no call (vLLM's)
]


@pytest.mark.parametrize("reply,decided", PYTHONIC_NO_CALL)
def test_pythonic_streams_text_once_it_can_no_longer_be_a_call(reply, decided):
    """A reply opening with "[" was held to its end; now only while it may still be a list of calls."""
    reader = tool_parser("pythonic")
    assert reader.parse(reply) == (reply, [])
    for end in range(1, len(reply) + 1):
        assert reader.call_start(reply[:end]) == (0 if end < len(decided) else None), reply[:end]


NON_ASCII = {"city": "Zürich", "note": "naïve \"quoted\" 東京 🌧", "tags": ["ü", {"é": None}]}


@pytest.mark.parametrize("parser,reply", [
    ("pythonic", "[f(city='Zürich', note='naïve \"quoted\" 東京 🌧', tags=['ü', {'é': None}])]"),
    ("llama3_json", '{"name": "f", "parameters": ' + json.dumps(json.dumps(NON_ASCII)) + "}"),  # arguments as a string
    ("hermes", '<tool_call>{"name": "f", "arguments": ' + json.dumps(json.dumps(NON_ASCII)) + "}</tool_call>"),
    ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=city>\nZürich\n</parameter>\n<parameter=note>\n"
                    'naïve "quoted" 東京 🌧\n</parameter>\n<parameter=tags>\n["ü", {"é": null}]\n</parameter>\n'
                    "</function>\n</tool_call>"),
])
def test_arguments_a_parser_writes_keep_their_characters_as_vllms_do(parser, reply):
    """Where the arguments are not the model's own JSON text (Python's literals, a JSON string,
    Qwen3-Coder's bare values), the parser writes them as vLLM's parsers do, json.dumps with
    ensure_ascii False: "Zürich", not "Z\\u00fcrich"; streamed, the pieces add up to the same."""
    reader = tool_parser(parser)
    if parser == "qwen3_coder":
        reader = reader.for_tools({"f": {"type": "object", "properties": {"tags": {"type": "array"}}}})
    _, [call] = reader.parse(reply)
    assert call["arguments"] == json.dumps(NON_ASCII, ensure_ascii=False)
    for step in (1, 3):
        assert [(n, a) for _, n, a in stream(reader, reply, {"f"}, step)] == [("f", call["arguments"])]


def test_where_a_streamed_call_may_begin():
    llama, hermes = tool_parser("llama3_json"), tool_parser("hermes")
    # a reply that is its calls whole: the spaces before them are theirs, not text (held while only spaces)
    assert llama.call_start("  {\"na") == 0 and llama.call_start("Hello") is None and llama.call_start("<|py") == 0
    assert llama.call_start(" \n") == 0 and llama.call_start("  Hi") is None
    assert hermes.call_start("Sure.<tool_call>{") == 5 and hermes.call_start("Sure.<tool") is None
    # held back from the text: only what may be the tag arriving (a short answer is not held at all)
    assert hermes.held("Sure.<tool") == 5 and hermes.held("Sure.") == 0 and hermes.held("a < b <") == 1
    mistral, pythonic = tool_parser("mistral"), tool_parser("pythonic")
    # Mistral's markers are special tokens, written into the streamed text: a call begins at one, or
    # where the marker's text may be arriving; a list of objects without it is text (no call is read
    # without the marker, and vLLM streams such text as content)
    assert mistral.call_start("Sure.[TOOL_CALLS]get") == 5 and mistral.call_start("Sure. [TOOL_CA") == 6
    assert mistral.call_start('Sure. [{"name"') is None and mistral.call_start("Sure. [") == 6
    assert mistral.call_start("See [1] and [link](x)") is None and mistral.held("Sure. [") == 0
    assert pythonic.call_start(" [get_") == 0 and pythonic.call_start("<|python") == 0
    assert pythonic.call_start("Here") is None
    with pytest.raises(ValueError, match="no tool-call parser"):
        tool_parser("llama4_json")


def test_mistral_call_ids_are_what_its_chat_template_takes_back():
    """Mistral's templates refuse an earlier call whose id is not 9 letters and digits."""
    from linnet.serve.tool_parsers import call_ids

    ids = {call_ids(tool_parser("mistral"))() for _ in range(50)}
    assert len(ids) == 50 and all(len(i) == 9 and i.isalnum() and i.isascii() for i in ids)
    assert call_ids(tool_parser("hermes"))().startswith("call_") and call_ids(None)().startswith("call_")


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(parser=st.sampled_from(WRITTEN + ["mistral-v11"]), data=st.data(),
       before=st.sampled_from(["", "Let me look. "]), spacing=st.sampled_from(sorted(SPACINGS)),
       step=st.integers(1, 4))
def test_a_streamed_call_adds_up_to_the_whole_replys(parser, data, before, spacing, step):
    """Read a prefix at a time (as a stream is), each call's name goes once written and its
    arguments as they come: put together, the same calls `parse` reads from the whole reply, the
    arguments the model's own text (Python's: read whole as each call closes); every call is
    opened before the reply ends."""
    made = data.draw(python_calls if parser == "pythonic" else calls)
    before = before if parser.split("-")[0] in TAKES_TEXT_BEFORE else ""
    reply = written(parser, made, before, SPACINGS[spacing])
    reader = tool_parser(parser.split("-")[0])
    _, whole = reader.parse(reply)
    got = stream(reader, reply, {n for n, _ in made}, step)
    assert [(name, arguments) for _, name, arguments in got] == [(c["name"], c["arguments"]) for c in whole]
    assert [(n, json.loads(a)) for _, n, a in got] == made
    streamed = [i for i, _, _ in got if i.startswith("call_")]
    assert len(streamed) == len(made)  # each opened before the reply ended
    if parser != "pythonic" and spacing != "default":  # the arguments as written, not re-spaced
        assert all(a in reply for _, _, a in got)


def test_calls_to_functions_not_offered_are_read_whole_at_the_end():
    """A Llama 3 reply that is JSON may be an answer: only a call to one of the request's functions
    is streamed as it is written."""
    reader = tool_parser("llama3_json")
    reply = '{"name": "Ada", "parameters": {"born": 1815}}'
    [(call_id, name, arguments)] = stream(reader, reply, {"get_time"})
    assert call_id == "end_0" and (name, arguments) == ("Ada", '{"born": 1815}')
    [(call_id, _, _)] = stream(reader, reply, {"Ada"})
    assert call_id == "call_0"


@pytest.mark.parametrize("reply", [
    '{"name": "f", "parameters": {"s": "a \\" }, \\\\ ] {"}}',  # brackets and escapes inside a string
    '{"parameters": {"x": [1, {"y": 2}]}, "name": "f"}',  # the arguments before the name
    '{"name": "f", "parameters": "{\\"x\\": 1}"}',  # the arguments written as a string
    '{"type": "function", "name": "f", "parameters": {"x": 1}}',  # Llama 3.2's lead
])
def test_partial_reads_what_is_written_so_far(reply):
    reader = tool_parser("llama3_json")
    _, whole = reader.parse(reply)
    [(_, name, arguments)] = stream(reader, reply, {"f"})
    assert [(name, arguments)] == [(c["name"], c["arguments"]) for c in whole]
    for end in range(len(reply)):  # every prefix: the name once closed, the arguments a prefix of the whole's
        for n, a, closed in reader.partial(reply[:end]):
            assert n in (None, "f") and not closed
            assert a is None or whole[0]["arguments"].startswith(a)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(made=calls, spacing=st.sampled_from(sorted(SPACINGS)), step=st.integers(1, 3), named=st.booleans())
def test_forced_calls_stream_as_they_are_written(made, spacing, step, named):
    """tool_choice naming a function: the reply is its arguments; "required": a JSON list of
    {name, parameters} (vLLM's form)."""
    from linnet.serve.tool_parsers import forced_calls

    dumps = SPACINGS[spacing]
    if named:
        made, reader, reply = made[:1], forced_calls(made[0][0]), dumps(made[0][1])
    else:
        reader, reply = forced_calls("required"), dumps([{"name": n, "parameters": a} for n, a in made])
    got = stream(reader, reply, {n for n, _ in made}, step)
    assert [(n, json.loads(a)) for _, n, a in got] == made and all(i.startswith("call_") for i, _, _ in got)
    assert reader.parse(reply[:-1]) == (reply[:-1], [])  # cut short: no call


def schema_of(value) -> dict:
    kinds = {str: "string", bool: "boolean", int: "integer", type(None): "null", list: "array", dict: "object"}
    return {"type": kinds[type(value)]}


def written_as_xml(made: list, before: str = "") -> str:
    """Qwen3-Coder's calls: each value on lines of its own, strings bare, the rest as JSON."""
    def value(v):
        return v if isinstance(v, str) else json.dumps(v)
    return before + "".join(
        "<tool_call>\n<function=" + name + ">\n"
        + "".join(f"<parameter={k}>\n{value(v)}\n</parameter>\n" for k, v in arguments.items())
        + "</function>\n</tool_call>" for name, arguments in made)


xml_keys = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
xml_values = st.none() | st.booleans() | st.integers() | st.text(max_size=12).filter(lambda t: "</parameter>" not in t) \
    | st.lists(st.integers(), max_size=3) | st.dictionaries(st.text(max_size=4), st.integers(), max_size=2)
xml_calls = st.lists(st.tuples(names, st.dictionaries(xml_keys, xml_values, max_size=4)), min_size=1, max_size=3,
                     unique_by=lambda call: call[0])  # a function, one schema


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(made=xml_calls, before=st.sampled_from(["", "I'll look.\n"]), step=st.integers(1, 5))
def test_qwen3_coder_calls_read_back_typed_by_their_schemas_whole_and_streamed(made, before, step):
    """Each value's text is read as the type the request's schema gives its parameter; streamed, a
    string's value goes as it is written, the others once closed, and the pieces add up to the
    whole reply's calls."""
    schemas = {}
    for name, arguments in made:
        schemas.setdefault(name, {"type": "object", "properties": {}})["properties"].update(
            {k: schema_of(v) for k, v in arguments.items()})
    reply = written_as_xml(made, before)
    reader = tool_parser("qwen3_coder").for_tools(schemas)
    content, whole = reader.parse(reply)
    assert content == (before or None)
    assert [(c["name"], json.loads(c["arguments"])) for c in whole] == made
    got = stream(reader, reply, set(schemas), step)
    assert [(n, a) for _, n, a in got] == [(c["name"], c["arguments"]) for c in whole]
    assert all(i.startswith("call_") for i, _, _ in got)  # each opened before the reply ended


@pytest.mark.parametrize("reply,made", [
    ("<tool_call>\n<function=f>\n</function>\n</tool_call>", [("f", {})]),  # no parameters
    ("<tool_call><function=f><parameter=n>three</parameter></function></tool_call>", [("f", {"n": "three"})]),
    ("<tool_call><function=f><parameter=o>{'a': (1, 2)}</parameter></function></tool_call>", [("f", {"o": {"a": [1, 2]}})]),
    ("<tool_call><function=f><parameter=x>\n  two lines\nand more\n\n</parameter></function></tool_call>",
     [("f", {"x": "  two lines\nand more\n"})]),  # only the line breaks that set a value apart are dropped
    # the reply ends before </function>, its parameters closed: a call, as vLLM's reads it (its regex
    # takes "<function=...$"); cut inside a parameter, or its name, none
    ("<tool_call><function=f><parameter=x>1</parameter>", [("f", {"x": "1"})]),
    ("<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n", [("f", {"x": "1"})]),
    ("<tool_call><function=f><parameter=x>1</param", []),
    ("<tool_call><function=f><parameter=x>1", []),
    ("<tool_call><function=f><parame", []),
    ("<tool_call><function=f", []),
    ("<tool_call>\n<parameter=x>1</parameter></tool_call>", []),  # no function
    ("<tool_call><function=f><parameter=r>2.5</parameter><parameter=n>7</parameter></function></tool_call>",
     [("f", {"r": 2.5, "n": 7})]),
    # what reads as no JSON value stays the text it was, as vLLM's parser keeps it: a number JSON has
    # none for (NaN in the arguments before, which a strict reader refuses), Python code no literal,
    # nesting past Python's recursion (a RecursionError that failed the whole reply before)
    ("<tool_call><function=f><parameter=r>nan</parameter><parameter=n>-inf</parameter></function></tool_call>",
     [("f", {"r": "nan", "n": "-inf"})]),
    ("<tool_call><function=f><parameter=o>{'a': f()}</parameter></function></tool_call>", [("f", {"o": "{'a': f()}"})]),
    pytest.param("<tool_call><function=f><parameter=o>" + DEEP + "</parameter></function></tool_call>",
                 [("f", {"o": DEEP})], id="nested-past-recursion"),
])
def test_qwen3_coder_edges(reply, made):
    reader = tool_parser("qwen3_coder").for_tools({"f": {"properties": {"n": {"type": "integer"},
                                                                       "o": {"type": "object"},
                                                                       "r": {"type": ["null", "number"]}}}})
    _, got = reader.parse(reply)
    assert [(c["name"], json.loads(c["arguments"])) for c in got] == made


def test_a_template_that_teaches_xml_calls_picks_qwen3_coder():
    from linnet.serve.tool_parsers import parser_for_template

    coder = "{% for tool in tools %}...{% endfor %}<tool_call>\n<function=example>\n<parameter=p>\nvalue\n</parameter>"
    assert parser_for_template(coder) == "qwen3_coder"
    assert parser_for_template("<tool_call>{{ tool_call | tojson }}</tool_call>") is None
    assert parser_for_template(None) is None


long_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                           | st.text(max_size=300),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=4), max_leaves=12)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(value=st.dictionaries(st.text(max_size=10), long_values, min_size=1, max_size=5), data=st.data(),
       lead=st.sampled_from(["", "<tool_call>\n"]))
def test_a_long_objects_scan_resumed_step_by_step_reads_as_a_fresh_one(value, data, lead):
    """object_fields keeps a long object's scan and reads on from where it stopped as the text
    grows: at every step, what a fresh scan of the same text reads; two texts that share a long
    start but part later, read in turns, do not mix."""
    from linnet.serve.json_prefix import _Scan, object_fields

    indent = data.draw(st.sampled_from([None, 1]))
    text = lead + json.dumps({"pad": "x" * 600, **value}, indent=indent)
    other = lead + json.dumps({"pad": "x" * 600, "parted": [1, 2, 3]}, indent=indent)  # the same long start
    at, cut = len(lead), 0
    while cut < len(text):
        cut = min(len(text), cut + data.draw(st.integers(1, 60)))
        for t in (text[:cut], other[:cut]):
            got, fresh = object_fields(t, at), _Scan(at).advance(t)
            assert got == fresh and got.end == fresh.end, t[-80:]
    assert object_fields(text, at).end == len(text)


def test_a_kept_scan_resumed_after_a_colon_and_one_dropped_read_what_json_reads():
    """A long object's step that ends just past a key's colon, the next bringing a number: the number
    is the field's value from its first digit; and a scan dropped from those kept (as many other long
    objects after it as are kept) is read anew: each field's span holds what json reads there."""
    from linnet.serve.json_prefix import _KEPT, object_fields

    value = {"pad": "x" * 600, "n": 12345, "m": [-7]}
    text = json.dumps(value)
    colon = text.index('"n":') + len('"n":')
    assert "n" not in object_fields(text[:colon], 0)
    assert object_fields(text[:colon + 3], 0)["n"] == (colon + 1, None)  # ' 12': from the "1"
    for k in range(_KEPT):
        object_fields(json.dumps({"pad": f"{k:04d}" * 150}), 0)
    fields = object_fields(text, 0)
    assert fields.end == len(text) and {k: json.loads(text[a:b]) for k, (a, b) in fields.items()} == value


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(value=st.dictionaries(st.text(max_size=6), long_values, min_size=1, max_size=4), data=st.data())
def test_an_open_objects_last_string_or_container_ends_where_json_says(value, data):
    """A field whose string or container has closed ends there, though the object is still open: its
    text is json's for it, and what follows ("</tool_call>" where a model left out the call's "}") is
    not read as more of it, nor as more fields."""
    from linnet.serve.json_prefix import object_fields, value_text

    text = json.dumps(value)[:-1]  # the object's "}" left out
    last = list(value)[-1]
    fields = object_fields(text, 0)
    if isinstance(value[last], (str, list, dict)):
        assert json.loads(value_text(text, fields[last])) == value[last]
    junk = data.draw(st.sampled_from(["\n</tool_call>", " Done.", '\n<tool_call>\n{"name": "g", "arguments": {}}']))
    for cut in range(len(text), len(text + junk) + 1):
        later = object_fields((text + junk)[:cut], 0)
        assert later.end is None and later.keys() == fields.keys()
        if isinstance(value[last], (str, list, dict)):
            assert value_text((text + junk)[:cut], later[last]) == value_text(text, fields[last])


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(value=st.dictionaries(st.text(max_size=6), long_values, max_size=4) | st.lists(long_values, max_size=4),
       indent=st.sampled_from([None, 0, 2]), junk=st.text(alphabet='{}[]:,"\\a1 x', max_size=12))
def test_a_scan_calls_no_json_broken_and_json_closes_where_it_ends(value, indent, junk):
    """JSON, at every point of being written, is never found broken (the scan's "broken" is sound:
    of any text, see the test below), and closes where it ends, whatever text follows it."""
    from linnet.serve.json_prefix import object_fields

    text = json.dumps(value, indent=indent)
    for cut in range(1, len(text) + 1):
        assert not object_fields(text[:cut], 0).broken, text[:cut]
    assert object_fields(text + junk, 0).end == len(text)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(text=st.text(alphabet='{}[]:,"\\u0a1 x', max_size=40))
def test_a_scan_of_anything_a_model_writes_never_raises(text):
    """Broken JSON (an escape cut short, a stray quote) reads as far as it goes, without an error."""
    from linnet.serve.json_prefix import object_fields

    from linnet.serve.reasoning import reasoning_parser

    for parser in [*PARSERS.values(), reasoning_parser("openai_gptoss")]:
        parser.partial("{" + text)
        parser.partial('<tool_call>{"name": "f", "arguments": {' + text)
        parser.partial("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{" + text)
        parser.parse("[TOOL_CALLS]f[ARGS]{" + text)
    if object_fields("{" + text, 0).broken:  # (never said of JSON)
        with pytest.raises(ValueError):
            json.JSONDecoder().raw_decode("{" + text)


def test_qwen3_coder_partial_call_closed_before_its_tool_call_closes():
    """A streamed call whose </function> is out and whose </tool_call> is not yet: one call, closed,
    its arguments whole; the next call can only open after the </tool_call>."""
    reader = tool_parser("qwen3_coder").for_tools({"f": {"properties": {"n": {"type": "integer"}}}})
    text = "<tool_call>\n<function=f>\n<parameter=n>\n3\n</parameter>\n</function>\n"
    assert reader.partial(text) == [("f", '{"n": 3}', True)]
    assert reader.partial(text + "</tool_call>\n<tool_call>\n<function=f>") == [("f", '{"n": 3}', True),
                                                                                ("f", "{", False)]


def test_llama3_json_a_stream_of_objects_that_are_no_calls_costs_a_step_what_it_adds(monkeypatch):
    """An answer that is a JSON list of records with "name"s holds hundreds of places a call might
    begin, each no call: a stream's step does not read them all again (it did, 2 ms a step at 300
    records, where a step now takes 20 µs): the objects read over the whole stream are about one a
    step, not one per record per step. The reply stays text, and a call after it is still read."""
    import linnet.serve.tool_parsers as parsers

    reader = tool_parser("llama3_json")
    records = json.dumps([{"name": f"user{i}", "age": i} for i in range(300)])
    reply = "Here are the users: " + records + ' {"name": "f", "parameters": {"x": 1}}'
    scans = []
    real = parsers.object_fields
    monkeypatch.setattr(parsers, "object_fields", lambda text, at: scans.append(at) or real(text, at))
    steps = range(1, len(reply) + 1, 4)
    starts = [reader.call_start(reply[:end]) for end in steps]
    assert len(scans) < 4 * len(steps)  # without what earlier steps found: ~300 times that
    assert starts[-1] == reply.index('{"name": "f"') and all(s in (None, starts[-1]) or reply[:e][s:].startswith("{")
                                                               for s, e in zip(starts, steps))
    assert reader.parse(reply) == ("Here are the users: " + records + " ", [{"name": "f", "arguments": '{"x": 1}'}])
