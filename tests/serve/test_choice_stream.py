"""A streamed chat choice against the same reply read whole, for every tool-call parser and every
reasoning parser: replies written in each family's format (text, thinking and calls, cut short
or not), drawn a few tokens at a time at any boundary, through the server's own step
(`ChoiceDeltas`) over a byte-level tokenizer whose markers are special tokens where the family's
are. What a client puts together from the deltas is what the whole response says, and that is
what the reply was written to say; and no content waits longer than its format makes it wait."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linnet.serve.choice_stream import ChoiceDeltas
from linnet.serve.openai_api import chat_job
from linnet.serve.openai_replies import chat_message
from linnet.serve.reasoning import reasoning_parser
from linnet.serve.request import Completion
from linnet.serve.tool_parsers import PARSERS, tool_parser

from .test_structured import byte_tokenizer

MISTRAL_MARKERS = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")  # special tokens in Mistral's tokenizers
HARMONY_MARKERS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")


def _tokenizer():
    from tokenizers import AddedToken

    tok = byte_tokenizer(256, more=bytes(range(128, 256)))  # UTF-8's bytes too
    tok.backend.add_special_tokens([AddedToken(m, special=True) for m in MISTRAL_MARKERS + HARMONY_MARKERS])
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    return tok


TOKENIZER = _tokenizer()
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "tags": {"type": "array"}}}}}
    for n in ("get_weather", "get_time")]
NAMES = ["get_weather", "get_time", "not_offered"]  # a call to a function not in `tools` is still a call (vLLM's)

# How far past a character of the answer (or the thinking) the stream may have read before that
# character goes out: the longest text that may still turn out to be a marker or a call (a
# "<tool_call>" arriving; Llama 3's `{"name": "Bob", "ag` decided at its second key; harmony's
# "<|constrain|>"), where the text drawn below stays within it.
LOOKAHEAD = {"hermes": 10, "qwen3_coder": 10, "mistral": 11, "llama3_json": 22, "pythonic": 14, "openai_gptoss": 12}
TAG_LOOKAHEAD = len("</think>") - 1

# Text a reply may hold that looks like the start of a call or a tag, for each family.
DISTRACTORS = {
    "llama3_json": ['{"answer": 42}', "{ see below }", "{x}", '{"name": "Bob", "age": 3}', '{"nam" ', "{", '"name"'],
    "pythonic": ["[1] ", "[see below] ", "[link](x) ", "[] ", "[f "],
    "mistral": ['[{"a": 1}] ', "[TOOL] ", "[1]", "[", "[{"],
    "hermes": ["<tool> ", "<b>x</b> ", "<tool_cal ", "<", "</tool_call>"],
    "qwen3_coder": ["<tool> ", "<function=f>", "<", "<parameter=x>"],
    "openai_gptoss": ["<| ", "<|x|> ", "|>", "<"],
}
FORBIDDEN = ("<tool_call>", "<think>", "</think>") + MISTRAL_MARKERS + HARMONY_MARKERS

prose = st.text(st.sampled_from(list("abc xyz.,:;!?0123\n{}[]()<>\"'=/|")), max_size=24)


def text_for(family: str):
    pieces = st.lists(st.sampled_from(DISTRACTORS[family]) | prose, max_size=5).map("".join)
    return pieces.filter(lambda t: not any(m in t for m in FORBIDDEN))


values = st.text(st.sampled_from(list("ab zü\"\\{}<>[]\n")), max_size=8)
call_arguments = st.fixed_dictionaries({}, optional={"city": values, "days": st.integers(-5, 400),
                                                     "tags": st.lists(values, max_size=2)})
calls = st.lists(st.tuples(st.sampled_from(NAMES), call_arguments), max_size=3)


def xml_value(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def written_calls(family: str, made: list, mistral_v11: bool) -> str:
    """The calls as each family's chat template teaches its model to write them."""
    if not made:
        return ""
    if family == "llama3_json":  # Llama 3.1-3.3: {"name": ..., "parameters": ...}, ";" between calls
        return "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in made)
    if family == "hermes":  # Hermes, Qwen2.5, Qwen3: <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>
        return "".join(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in made)
    if family == "mistral" and mistral_v11:  # v11 tokenizers: [TOOL_CALLS]NAME[ARGS]{...} for each call
        return "".join(f"[TOOL_CALLS]{n}[ARGS]{json.dumps(a)}" for n, a in made)
    if family == "mistral":  # Mistral 7B v0.3: [TOOL_CALLS] [{"name": ..., "arguments": ...}, ...]
        return "[TOOL_CALLS] " + json.dumps([{"name": n, "arguments": a} for n, a in made])
    if family == "pythonic":  # Llama 3.2's pythonic template: [f(a=1), g()]
        return "[" + ", ".join(f"{n}({', '.join(f'{k}={v!r}' for k, v in a.items())})" for n, a in made) + "]"
    if family == "qwen3_coder":  # Qwen3-Coder: <tool_call><function=NAME><parameter=KEY>\nVALUE\n</parameter>...
        return "".join("<tool_call>\n<function=" + n + ">\n" + "".join(
            f"<parameter={k}>\n{xml_value(v)}\n</parameter>\n" for k, v in a.items()) + "</function>\n</tool_call>"
            for n, a in made)
    # gpt-oss: each call a commentary message to functions.NAME
    return "".join(f"<|start|>assistant<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>"
                   f"{json.dumps(a)}<|call|>" for n, a in made)


@st.composite
def replies(draw):
    """(family, reasoning parser, reply text, (where its thinking and its answer begin in it), what it
    was written to say: thinking, content, calls)."""
    family = draw(st.sampled_from(sorted(PARSERS) + ["openai_gptoss"]))
    reasoning = "openai_gptoss" if family == "openai_gptoss" else draw(st.sampled_from([None, "deepseek_r1", "qwen3"]))
    made = draw(calls) if draw(st.booleans()) else []
    text = draw(text_for(family))
    if made and family in ("pythonic", "openai_gptoss"):
        text = ""  # a pythonic reply is its calls whole; gpt-oss's answer is a message of its own
    if family == "llama3_json" and made and text and not text.strip():
        text = ""  # spaces before a reply of JSON calls are the calls' (vLLM's reads a reply opening with them)
    thought = draw(st.none() | prose.filter(lambda t: not any(m in t for m in FORBIDDEN)))
    body = text + written_calls(family, made, draw(st.booleans()))
    if family == "openai_gptoss":
        head = "" if thought is None else f"<|channel|>analysis<|message|>{thought}<|end|>"
        answer = f"<|start|>assistant<|channel|>final<|message|>{text}<|return|>" if not made else body
        reply, text_at = head + answer, len(head) + len("<|start|>assistant<|channel|>final<|message|>")
        thought_at = len("<|channel|>analysis<|message|>")
    elif reasoning is None or (reasoning == "qwen3" and thought is None):
        reply, text_at, thought, thought_at = body, 0, None, 0
    else:
        opening = "<think>" if reasoning == "qwen3" else ""
        reply = f"{opening}{thought or ''}</think>{body}"
        text_at, thought_at = len(reply) - len(body), len(opening)
    return family, reasoning, reply, (thought_at, text_at), thought or None, text, made


def read_whole_and_streamed(family, reasoning, reply, cuts, cut_at, tool_choice="auto", finish=None):
    """The reply's tokens (the first `cut_at` of them, finish "length"; all, "stop"; or as `finish`
    says) streamed in the groups `cuts` makes, through `ChoiceDeltas`: (the whole response's message
    and finish_reason, the deltas put together as a client does, [(text read, content sent,
    thinking sent)] after each step)."""
    parser = reasoning_parser(reasoning) if family == "openai_gptoss" else tool_parser(family)
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "tool_choice": tool_choice}
    job = chat_job(body, TOKENIZER, 4096, tool_parser=parser,
                   reasoning=None if reasoning is None else reasoning_parser(reasoning))
    comp = Completion(request=job.requests[0])
    tokens = TOKENIZER.encode(reply, add_special_tokens=False)
    cut = cut_at is not None and cut_at < len(tokens)
    tokens = tokens[:cut_at] if cut else tokens
    bounds = sorted({0, len(tokens), *(c % (len(tokens) + 1) for c in cuts)})
    groups = [tokens[a:b] for a, b in zip(bounds, bounds[1:])] or [[]]
    choice = ChoiceDeltas(job, comp, TOKENIZER, chat=True)
    content, thinking, called, seen = "", "", {}, []

    def take(delta):
        nonlocal content, thinking
        content, thinking = content + delta.text, thinking + delta.thought
        for kind, k, value in delta.calls:
            if kind == "open":
                assert k == len(called) and value["function"]["arguments"] == ""
                called[k] = [value["id"], value["function"]["name"], ""]
            else:
                called[k][2] += value

    for group in groups[:-1]:
        take(choice.step(group))
        seen.append((len(choice.stream.text), len(content), len(thinking)))
    comp.tokens = list(tokens)
    request = comp.request
    comp.text = TOKENIZER.without_cut_character(
        TOKENIZER.decode_after(request.prompt, tokens, skip_special_tokens=request.skip_special_tokens), tokens)
    comp.finish_reason = finish or ("length" if cut else "stop")
    message, finish = chat_message(job, comp, TOKENIZER)
    last = choice.end(groups[-1])
    take(last)
    return message, finish, (content, thinking, [called[k] for k in sorted(called)], last.why), seen


def assert_reads(family: str, reply: str, content, calls: list) -> None:
    """That `reply` reads as `content` and `calls` [(name, arguments)], whole and streamed (at once,
    and a character at a time), with the finish_reason those make."""
    for cuts in ([], list(range(len(reply)))):
        message, finish, (got, _, called, why), _ = read_whole_and_streamed(family, None, reply, cuts, None)
        made = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]
        assert made == calls == [(n, json.loads(a)) for _, n, a in called]
        assert message["content"] == content and got == (content or "")
        assert why == finish == ("tool_calls" if calls else "stop")


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(drawn=replies(), cuts=st.lists(st.integers(0, 10**4), max_size=12), cut_at=st.none() | st.integers(1, 400))
def test_a_streamed_reply_adds_up_to_the_whole_and_its_content_is_not_held(drawn, cuts, cut_at):
    family, reasoning, reply, (thought_at, text_at), thought, text, made = drawn
    message, finish, (content, thinking, called, why), seen = read_whole_and_streamed(family, reasoning, reply, cuts,
                                                                                      cut_at)
    # streamed as the whole response reads, whatever the cuts
    assert content == (message["content"] or "")
    assert thinking == (message.get("reasoning_content") or "")
    assert [(n, a) for _, n, a in called] == [(c["function"]["name"], c["function"]["arguments"])
                                              for c in message.get("tool_calls") or []]
    assert why == finish
    if cut_at is not None and cut_at < len(TOKENIZER.encode(reply, add_special_tokens=False)):
        # cut short: "length", its calls as far as written; but where its calls read whole all the same
        # (a Hermes call whose closing tag was cut), "tool_calls", as vLLM says for calls it read
        assert finish == "length" or finish == "tool_calls" and message.get("tool_calls")
        return
    # the whole response says what the reply was written to say
    if family == "qwen3_coder":  # bare values, typed by the function's schema: a function not offered has none
        made = [(n, a if n in NAMES[:2] else {k: xml_value(v) for k, v in a.items()}) for n, a in made]
    assert message.get("reasoning_content") == thought
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []] \
        == made
    # an empty answer is "" (vLLM's tool parsers give the text as it is), None past a reasoning parser (as vLLM's)
    assert message["content"] == (text or None if made or reasoning else text)
    assert finish == ("tool_calls" if made else "stop")
    # and no answer (nor thinking) waits past what may still be a marker or a call
    for read, content_out, thinking_out in seen:
        assert content_out >= min(len(text), read - LOOKAHEAD[family] - text_at), (reply[:read], content_out)
        if thought:
            tags = LOOKAHEAD[family] if family == "openai_gptoss" else TAG_LOOKAHEAD
            assert thinking_out >= min(len(thought), read - tags - thought_at), reply[:read]


@pytest.mark.parametrize("family,reply", [
    ("llama3_json", '{"answer": 42, "detail": "' + "d" * 300 + '"}'),
    ("llama3_json", "Use {x} or {y} in the template: " + "t" * 300),
    ("llama3_json", '{"name": "Bob", "age": 3, "bio": "' + "b" * 300 + '"}'),
])
def test_a_llama3_reply_that_is_json_but_no_call_streams_as_it_is_written(family, reply):
    """The defect: a reply opening with "{" (or a "{" in prose) was held to the end of the reply.
    Drawn a token at a time, its content now goes out within a few characters of being written."""
    _, _, _, seen = read_whole_and_streamed(family, None, reply, list(range(len(reply))), None)
    assert all(out >= read - LOOKAHEAD[family] for read, out, _ in seen)


def test_the_end_of_the_thinking_is_not_held_for_a_call_marker_in_the_answer():
    """A tool parser's hold (what may be "<tool_call>" arriving) is the answer's: the thinking's
    last characters go out once "</think>" is read, not once the answer has as many characters."""
    reply = "<think>ponder</think>Sunny."
    _, _, (_, thinking, _, _), seen = read_whole_and_streamed("hermes", "qwen3", reply, list(range(len(reply))), None)
    assert thinking == "ponder"
    assert [out for read, _, out in seen if read == len("<think>ponder</think>")] == [len("ponder")]


CALL = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'


@pytest.mark.parametrize("tool_choice,reply,engine,finish", [
    ("auto", "Sure." + CALL, "stop", "tool_calls"),
    ("auto", "Sure." + CALL[:-len("</tool_call>")], "length", "tool_calls"),  # calls read whole: vLLM's auto_tools_called
    ("auto", "Sure." + CALL[:30], "length", "length"),  # cut inside a call's JSON: as far as written, "length"
    ("auto", "No call.", "stop", "stop"),
    ("auto", "No call, cut", "length", "length"),
    ("required", '[{"name": "get_time", "parameters": {"zone": "CET"}}]', "stop", "tool_calls"),
    # "required" says "tool_calls" only where the reply ended by itself (vLLM's rule), else the engine's reason
    ("required", '[{"name": "get_time", "parameters": {"zone": "CET"}}]', "length", "length"),
    ("required", '[{"name": "get_time", "parameters": {"zone": "C', "length", "length"),
    ({"type": "function", "function": {"name": "get_time"}}, '{"zone": "CET"}', "stop", "stop"),  # named: OpenAI's "stop"
    ({"type": "function", "function": {"name": "get_time"}}, '{"zone": "C', "length", "length"),
])
def test_finish_reason_is_vllms_whole_and_streamed(tool_choice, reply, engine, finish):
    """finish_reason as vLLM's chat sets it: "tool_calls" where "auto" read calls (or "required" made
    them and the reply ended by itself), "stop" for a named function's call, else the engine's; the
    stream's last chunk says the same as the whole response."""
    for cuts in ([], list(range(len(reply)))):
        message, whole, (_, _, _, streamed), _ = read_whole_and_streamed("hermes", None, reply, cuts, None,
                                                                         tool_choice, engine)
        assert whole == streamed == finish, (cuts, message)


# A call each family writes wrongly: its arguments under another key, arguments that are no object,
# a name that is no string, JSON that does not read. vLLM's parsers read none of them as a call: the
# reply is text.
MALFORMED = [
    ('"name": "get_time", "params": {"zone": "CET"}', "wrong key"),
    ('"name": "get_time", "ARGS": [1, 2]', "arguments not an object"),
    ('"name": 7, "ARGS": {"zone": "CET"}', "name not a string"),
    ('"name": "get_time", "ARGS": {"zone": "CET",}', "JSON that does not read"),
    ('"name": "get_time", "ARGS": "not json"', "arguments a string of no JSON"),
]


def malformed_call(family: str, fields: str, v11: bool) -> str:
    key = "parameters" if family == "llama3_json" else "arguments"
    obj = "{" + fields.replace('"ARGS"', json.dumps(key)) + "}"
    if family == "llama3_json":
        return obj
    if family == "hermes":
        return f"<tool_call>\n{obj}\n</tool_call>"
    if v11:  # [TOOL_CALLS]NAME[ARGS]...: the arguments part alone can be wrong
        return "[TOOL_CALLS]get_time[ARGS]" + obj[obj.index('"ARGS"') + 8:-1] if '"ARGS"' in obj else obj
    return f"[TOOL_CALLS] [{obj}]"


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(family=st.sampled_from(["llama3_json", "hermes", "mistral"]), data=st.data(), v11=st.booleans(),
       malformed=st.sampled_from(MALFORMED), cuts=st.lists(st.integers(0, 10**4), max_size=12))
def test_a_malformed_call_is_text_whole_and_streamed(family, data, v11, malformed, cuts):
    text = data.draw(text_for(family))
    fields = malformed[0] if not (v11 and family == "mistral") else malformed[0].replace('"ARGS"', '"arguments"')
    reply = text + malformed_call(family, fields, v11)
    message, finish, (content, _, called, why), _ = read_whole_and_streamed(family, None, reply, cuts, None)
    assert message == {"role": "assistant", "content": reply} and finish == "stop", malformed[1]
    assert (content, why) == (reply, "stop"), malformed[1]
    if malformed[1] == "JSON that does not read":
        # known to be a call, and streamed as one, until its JSON stopped reading (a stream cannot
        # take back what it sent: vLLM's sends those pieces too); the text then goes whole
        assert all(n == "get_time" and reply.find(a) >= 0 for _, n, a in called)
    else:
        assert called == [], malformed[1]


@pytest.mark.parametrize("body", ['{"zone": "CET",}', "zone=CET", '{"zone": "CE'])
def test_a_harmony_call_whose_arguments_are_no_json_is_kept_as_written(body):
    """gpt-oss's call is a message to functions.NAME: where its body does not read as JSON, the call
    is still the model's, its arguments the text it wrote (vLLM's harmony parser keeps it so; OpenAI's
    arguments may be invalid JSON), not dropped with the text lost; streamed, the same call."""
    reply = ("<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary "
             "to=functions.get_time <|constrain|>json<|message|>" + body + "<|call|>")
    for cuts in ([], list(range(len(reply)))):
        message, finish, (content, thinking, called, why), _ = read_whole_and_streamed(
            "openai_gptoss", "openai_gptoss", reply, cuts, None)
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] \
            == [("get_time", body)] and finish == "tool_calls"
        assert ([(n, a) for _, n, a in called], content, thinking, why) == ([("get_time", body)], "", "think",
                                                                          "tool_calls")


@pytest.mark.parametrize("family", ["hermes", "qwen3_coder"])
def test_text_that_cannot_be_a_tag_arriving_is_not_held(family):
    """Only what may be "<tool_call>" arriving is held: each step of a short answer goes out whole
    (the last 10 characters were held whatever they were, so "Hi, it is 12." came only at the end)."""
    reply = "Hi, it is 12. a <b> c"
    _, _, _, seen = read_whole_and_streamed(family, None, reply, list(range(len(reply))), None)
    held = [(reply[:read], reply[out:read]) for read, out, _ in seen if out < read]
    assert held == [("Hi, it is 12. a <", "<")]  # "<" may open the tag; "<b" cannot


@pytest.mark.parametrize("reply,content,calls", [
    ("[get_time(zone='UTC')] then some text", "[get_time(zone='UTC')] then some text", []),
    ("[get_time(zone='UTC'), get_weather(city='Oslo')]", None,
     [("get_time", {"zone": "UTC"}), ("get_weather", {"city": "Oslo"})]),
    # Llama 4's wrappers kept as text (a request that keeps special tokens): its closing one arriving is the calls'
    ("<|python_start|>[get_time(zone='UTC')]<|python_end|>", None, [("get_time", {"zone": "UTC"})]),
])
def test_a_pythonic_list_of_calls_with_text_after_it_is_text_whole_and_streamed(reply, content, calls):
    """vLLM reads a pythonic list of calls followed by text as text: the stream sent each call at its
    ")", then the whole reply as its content as well. Now its calls go once the reply is whole, so
    a client gets the text alone, or the calls alone, as the whole response says."""
    assert_reads("pythonic", reply, content, calls)


GET_TIME = ("get_time", {"zone": "CET"})


@pytest.mark.parametrize("family,reply,calls", [
    # a "</tool_call>" inside a string is the string's: the object is read as JSON (vLLM's regex cut it there)
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {"zone": "</tool_call>"}}\n</tool_call>',
     [("get_time", {"zone": "</tool_call>"})]),
    # v11's NAME[ARGS]{...} and text after it: the call (vLLM's reads it so), the text dropped as after others'
    ("mistral", '[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}\n\nI called the tool.', [GET_TIME]),
    # calls that ended by themselves but do not read are text, as vLLM gives them, not calls of no JSON
    ("pythonic", '[get_time(zone="a\nb")]', []),
    ("pythonic", "[get_time(zone=1e400)]", []),  # Python's inf, which JSON has no number for (vLLM's: Infinity)
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}\n</tool_call>', []),
    ("llama3_json", '{"name": "get_time", "parameters": {"zone": "CET"}\nLet me know.', []),
    # a marker the model drew last is in the text, as the stream sent it (no stop string cut it off)
    ("mistral", "Hi [ARGS]", []),
])
def test_calls_that_ended_by_themselves_are_read_whole_or_are_text(family, reply, calls):
    message, finish, (content, _, called, why), _ = read_whole_and_streamed(family, None, reply, [], None)
    made = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]
    assert made == calls and finish == why == ("tool_calls" if calls else "stop")
    assert message["content"] == (None if calls else reply) == (content or None)
    for cuts in ([], list(range(len(reply)))):  # a call's "}" left out: streamed, it is the call as far as it read
        _, _, (_, _, called, _), _ = read_whole_and_streamed(family, None, reply, cuts, None)
        assert all(json.loads(a) == GET_TIME[1] for _, _, a in called) if not calls else called


WEATHER_XML = "<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n"


@pytest.mark.parametrize("reply,content,calls", [
    # several functions in one block: each a call (vLLM's reads them all)
    ("<tool_call>\n" + WEATHER_XML + "<function=get_time>\n</function>\n</tool_call>", None,
     [("get_weather", {"city": "Oslo"}), ("get_time", {})]),
    # a function the model wrote without its <tool_call> (vLLM's reads it), where the request offers it
    ("Let me check.\n" + WEATHER_XML, "Let me check.\n", [("get_weather", {"city": "Oslo"})]),
    # prose that writes the tag of a function not offered is text
    ("Write <function=f> then </function>.", "Write <function=f> then </function>.", []),
])
def test_qwen3_coder_reads_every_function_of_a_block_and_one_without_its_tag(reply, content, calls):
    assert_reads("qwen3_coder", reply, content, calls)


TIME_CALL = '{"name": "get_time", "parameters": {"zone": "CET"}}'


@pytest.mark.parametrize("reply,content,calls", [
    # an object shaped as a call inside the answer's JSON is the answer's (vLLM's reads the outer value first)
    ('{"plan": [' + TIME_CALL + '], "note": "done"}', '{"plan": [' + TIME_CALL + '], "note": "done"}', []),
    ('[{"x": 1}, ' + TIME_CALL + "]", '[{"x": 1}, ' + TIME_CALL + "]", []),
    # after the answer's JSON closes, a call may follow
    ('{"answer": 42} then ' + TIME_CALL, '{"answer": 42} then ', [GET_TIME]),
    # text that only looks like JSON at first ("{" then a key with no ":") is text, and a call may follow it
    ('{"nam" ' + TIME_CALL, '{"nam" ', [GET_TIME]),
    # calls with text between them are each a call (as vLLM's reads them), the text between dropped, as after
    # the last; an object after the text that is no call is the text's
    (TIME_CALL + "\nAnd for Oslo:\n" + TIME_CALL.replace("CET", "UTC"), None, [GET_TIME, ("get_time", {"zone": "UTC"})]),
    (TIME_CALL + ' as {"name": "Bob", "age": 3} says', None, [GET_TIME]),
])
def test_a_llama3_call_is_not_looked_for_inside_the_answers_json(reply, content, calls):
    assert_reads("llama3_json", reply, content, calls)
