"""Tool calls in a model's own words: what `tool_choice: "auto"` needs to tell a call from text.

Each model family writes its calls its own way; a parser reads one way, by vLLM's name for it:

- "llama3_json" (Llama 3.1 to 3.3): the whole reply is one JSON object, or several joined by
  ";" (or listed, [{...}, {...}], as models tuned on other formats write them), each {"name":
  ..., "parameters": {...}} (Llama 3.1 may lead it with <|python_tag|>), or such objects after text; an object that says no arguments, or leads with another key, is an
  answer's JSON.
- "hermes" (Hermes, Qwen 2.5 and 3, SmolLM3): text, then calls each written
  <tool_call>{"name": ..., "arguments": {...}}</tool_call>.
- "mistral": text, then the special token [TOOL_CALLS] and either a JSON list of {"name": ...,
  "arguments": {...}} (Mistral 7B v0.3, Mixtral, Mistral Nemo) or, from Mistral's v11 tokenizers
  on (Mistral Small 3.2, Magistral, Devstral), one call per [TOOL_CALLS], written
  NAME[ARGS]{...} (special tokens too; [CALL_ID] and an id may come between). Mistral's chat
  templates take only call ids of 9 letters and digits, so this parser makes its ids so.
- "pythonic" (Llama 3.2 and 4 with their pythonic templates, ToolACE): the whole reply is a
  Python list of calls, [get_weather(city="Paris"), get_time()], arguments as literals (streamed
  once the reply ends: text after the list makes it no call).
- "qwen3_coder" (Qwen3-Coder): text, then calls written <tool_call><function=NAME>
  <parameter=KEY>VALUE</parameter>...</function></tool_call> (one or more functions a block, or
  one of the request's functions without the tag), each value bare text, read as the type the
  request's schema gives the parameter (`for_tools` binds a parser to the schemas).

`parse` reads a whole reply into its text and its calls. A streamed reply is sent as text until
`call_start` finds where a call may begin; from there `partial` reads the calls written so far,
[(name or None, arguments' text so far or None, whether the call is closed)], and the stream
sends each call's name once written and its arguments as they come (tool_stream.py). The
arguments are the model's own text, in `parse` as in `partial`, so a stream adds up to the whole.
A parser whose markers are special tokens names them (`markers`): `parse`, and the stream, get
the reply with those tokens written where they were drawn, where other text has special tokens
dropped.
"""

from __future__ import annotations

import ast
import json
import random
import re
import string
import uuid
from collections import OrderedDict

from linnet.serve.json_prefix import closed_string, object_fields, value_text

_DECODER = json.JSONDecoder()
ARGUMENT_KEYS = ("parameters", "arguments")  # the key a call's arguments go under, the first found


def _json_read(read, *args):
    """`read(*args)` (json.loads, or _DECODER.raw_decode) with nesting deeper than Python's recursion (a
    model's runaway "[[[[...") a ValueError, as any other text that is no JSON: no call, and the reply's
    text as it is (vLLM's parsers give it so), where the RecursionError failed the whole reply."""
    try:
        return read(*args)
    except RecursionError:
        raise ValueError("JSON nested deeper than Python reads") from None


def _call(value, written: str | None = None) -> dict | None:
    """{name, arguments (JSON text)} from a call's object, or None where it is not one: it says its
    name and its arguments (an object with neither "parameters" nor "arguments" may hold them under
    another key: no call, as vLLM's parsers read none). `written`: the arguments' own text, which
    they stay as where they were written as an object."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = next((value[k] for k in ARGUMENT_KEYS if k in value), None)
    if isinstance(arguments, str):  # some models write the arguments as JSON text already
        try:
            arguments, written = _json_read(json.loads, arguments), None
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return {"name": value["name"], "arguments": written.strip() if written else _json(arguments)}


def _json(value) -> str:
    """Arguments this parser writes as JSON (read as Python, say): characters as they are, not
    \\u escapes, as vLLM's parsers write them (json.dumps with ensure_ascii False). A ValueError for
    a value JSON has no number for (Python's 1e400 is inf): no call, where vLLM's wrote "Infinity"."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _arguments_span(fields) -> tuple | None:
    return next((fields[k] for k in ARGUMENT_KEYS if k in fields), None)


def _call_at(text: str, at: int, fields=None) -> tuple:
    """(the call whose object opens at text[at], or None; where the object ends). A ValueError
    where no JSON value is written there. `fields`: the object's, where already read."""
    value, end = _json_read(_DECODER.raw_decode, text, at)
    if not isinstance(value, dict):
        return _call(value), end
    return _call(value, value_text(text, _arguments_span(fields or object_fields(text, at)))), end


def partial_call(text: str, at: int) -> tuple:
    """(name or None, arguments' text so far or None, where the object ends or None) of a call
    being written as an object from text[at]. It is named once its arguments have begun as an
    object (before, it may turn out to be no call: arguments under another key, or not an object);
    arguments written as a string (some models do) are read when the call closes, as `parse` reads
    a closed call's."""
    fields = object_fields(text, at)
    if fields.end is not None:
        try:
            call = _call_at(text, at, fields)[0]
        except ValueError:
            call = None
        return (None, None, fields.end) if call is None else (call["name"], call["arguments"], fields.end)
    arguments = value_text(text, _arguments_span(fields))
    if not arguments or arguments[0] != "{":
        return None, None, None
    return closed_string(text, fields.get("name")), arguments, None


def _spaces_after(text: str, at: int) -> int:
    return len(text) - len(text[at:].lstrip())


def partial_list(text: str, at: int) -> list:
    """The calls of a JSON list of call objects opening at text[at] (or of one object), as far as
    written: [(name, arguments so far, closed)]."""
    if at >= len(text) or text[at] not in "[{":
        return []
    calls, at = [], at + 1 if text[at] == "[" else at
    while (at := _spaces_after(text, at)) < len(text) and text[at] == "{":
        name, arguments, end = partial_call(text, at)
        calls.append((name, arguments, end is not None))
        if end is None:
            break
        at = _spaces_after(text, end)
        if not text.startswith(",", at):
            break
        at += 1
    return calls


def read_list(text: str) -> list:
    """The calls of a whole JSON list of call objects (or of one object); a ValueError where the
    text is not one, a None for an item that is not a call."""
    at = _spaces_after(text, 0)
    if text.startswith("{", at):
        call, end = _call_at(text, at)
        calls = [call]
    else:
        value, end = _json_read(_DECODER.raw_decode, text, at)
        if not isinstance(value, list):
            raise ValueError("not a list of calls")
        calls, at = [], at + 1
        for _ in value:  # the list's items again, each read with its arguments' text
            at = _spaces_after(text, at)
            call, at = _call_at(text, at)
            calls.append(call)
            at = _spaces_after(text, at) + 1  # past the "," (or the "]")
    if text[end:].strip():
        raise ValueError("more than a list of calls")
    return calls


def _whole_reply_start(text: str, opener: str | tuple, tag: str) -> int | None:
    """Where a call may begin in a family's reply that is its calls whole: at its start (its leading
    spaces are the calls', no text), where its first character past them opens `opener` (or one of them) or may be
    `tag` arriving a piece at a time, or is not written yet."""
    stripped = text.lstrip()
    if not stripped or stripped.startswith(opener) or tag.startswith(stripped[:len(tag)]):
        return 0
    return None


# A stream asks where a call may begin at every step, of a text that only grows; an object found to
# be no call stays none, so what a step found dead is kept (per text, by its start, the least
# recently asked dropped first) and the next step reads on from there: a reply of many objects that
# are no calls (a JSON list of records with "name"s) costs a step what it adds, not all it holds.
_DEAD: OrderedDict = OrderedDict()  # {text's first characters: (text, where the candidates not known dead begin)}
_DEAD_KEY, _DEAD_KEPT = 256, 256


def _known_dead(text: str) -> int:
    """How far into `text` every place a call might begin is known to be no call (0: nothing known)."""
    known = _DEAD.get(text[:_DEAD_KEY])
    return known[1] if known is not None and text.startswith(known[0]) else 0


def _remember_dead(text: str, upto: int) -> None:
    """That every place a call might begin in text[:upto] is no call."""
    if upto > 0:
        key = text[:_DEAD_KEY]
        _DEAD[key] = (text[:upto], upto)
        _DEAD.move_to_end(key)
        while len(_DEAD) > _DEAD_KEPT:
            _DEAD.popitem(last=False)


class Llama3Json:
    name = "llama3_json"
    PYTHON_TAG = "<|python_tag|>"
    # a call after text: an object that opens with its "name" (vLLM's parser finds calls amid text too);
    # and what may be one arriving a piece at a time at the text's end
    NAMED = re.compile(r'\{\s*"name"')
    NAMED_ARRIVING = re.compile(r'\{\s*("(n(a(m(e)?)?)?)?)?$')
    # the keys a call says before it has said both its name and its arguments (Llama 3.2 may lead
    # with "type": "function"); any other key there says the object is an answer's JSON, not a call
    HEAD_KEYS = ("name", *ARGUMENT_KEYS, "type")
    PENDING_KEY = re.compile(r'\s*,?\s*(?:"([^"\\]*)("?)\s*(:?))?')

    def call_start(self, text: str) -> int | None:
        """Where a call may begin: the first place an object opens that is a call or may still turn
        out to be one (`_may_be_call`): at the reply's start (past spaces and the python tag), or an
        object after text that opens with its "name". Text that can no longer be a call is text,
        so a stream sends it at once rather than at the end."""
        dead = _known_dead(text)  # what an earlier step of the same stream found no call (never one again)
        if dead == 0 and _whole_reply_start(text, ("{", "["), self.PYTHON_TAG) == 0:
            body = self._body(text, 0)
            if self.PYTHON_TAG.startswith(text[body:]) or text.startswith("{", body) and self._may_be_call(text, body):
                return 0  # nothing past the spaces yet, the tag arriving, or an object that may be a call
        dead = max(dead, self._answer_end(text))
        found = self._named_call(text, dead)
        if found is not None:
            _remember_dead(text, found)
            return found
        arriving = self.NAMED_ARRIVING.search(text, dead)
        _remember_dead(text, len(text) if arriving is None else arriving.start())  # not what may yet be one
        return None if arriving is None else arriving.start()

    def _answer_end(self, text: str) -> int:
        """Where the JSON the reply opens with ends (the text's end while it is open), once it is no
        call: an object shaped as a call inside an answer's JSON is the answer's (vLLM's reads the
        outer value first); 0 for a reply that opens with no JSON."""
        at = _spaces_after(text, 0)
        at = _spaces_after(text, at + len(self.PYTHON_TAG)) if text.startswith(self.PYTHON_TAG, at) else at
        if not text.startswith(("{", "["), at):
            return 0
        fields = object_fields(text, at)  # (a list's end too: the scan counts its brackets)
        if fields.broken:
            return 0  # no JSON after all: text, where calls may follow
        return len(text) if fields.end is None else fields.end

    @staticmethod
    def held(text: str) -> int:
        return 0  # call_start itself holds what may be a call arriving

    def _may_be_call(self, text: str, at: int) -> bool:
        """Whether the object opening at text[at] is a call or may still become one as more is
        written: its keys, up to where it has said its name and its arguments, are a call's, its
        name a string and its arguments an object (or JSON text); once closed, it reads as a call
        (as vLLM's parser reads one: "name" and "parameters" or "arguments")."""
        fields = object_fields(text, at)
        if fields.end is not None or fields.broken:
            return fields.end is not None and self._closed_call(text, at, fields) is not None
        head, last = self._head(text, fields)
        if head is not None:
            return head != "no"
        pending = self.PENDING_KEY.match(text, at + 1 if last is None else last)  # the key after the last value
        rest = text[pending.end():]
        key, quoted, colon = pending.groups()
        if key is None:  # no key begun: nothing yet, or what is no key
            return not rest
        if not quoted:
            return not rest and any(k.startswith(key) for k in self.HEAD_KEYS)
        return key in self.HEAD_KEYS and bool(colon or not rest)

    def _head(self, text: str, fields) -> tuple:
        """("call" where the fields have said a call's name and arguments, "no" where a key or a
        value's first character says they are no call's, "open" where a call's value is being
        written, None where the next key decides; where the last field written ends)."""
        said, last = set(), None
        for key, (start, end) in fields.items():
            if said >= {"name", "arguments"}:
                return "call", last
            if key not in self.HEAD_KEYS or text[start] not in ('{"' if key in ARGUMENT_KEYS else '"'):
                return "no", last
            said.add("arguments" if key in ARGUMENT_KEYS else key)
            if end is None:
                return "open", last
            last = end
        return ("call" if said >= {"name", "arguments"} else None), last

    def _closed_call(self, text: str, at: int, fields=None) -> dict | None:
        """The call a closed object at text[at] makes, or None where it is not one."""
        fields = fields or object_fields(text, at)
        if self._head(text, fields)[0] != "call":
            return None
        try:
            return _call_at(text, at, fields)[0]
        except ValueError:
            return None

    def _body(self, text: str, start: int) -> int:
        """Where the calls begin, from `start`: past spaces, the python tag and a list's "["."""
        at = _spaces_after(text, start)
        at = _spaces_after(text, at + len(self.PYTHON_TAG)) if text.startswith(self.PYTHON_TAG, at) else at
        return _spaces_after(text, at + 1) if text.startswith("[", at) else at

    def _next(self, text: str, end: int) -> int:
        """Where the next call may begin after a call's object ending at `end`: past the spaces and
        the ";" (or a list's ",") that may follow it; past text, the next object that is or may yet
        be a call (as vLLM's, which reads calls with text between them); else the text's end."""
        at = _spaces_after(text, end)
        at = _spaces_after(text, at + 1) if text.startswith((";", ","), at) else at
        if text.startswith("{", at):
            return at
        found = self._named_call(text, at)
        return len(text) if found is None else found

    def _named_call(self, text: str, at: int) -> int | None:
        """Where the first object from `at` on opens that says its "name" first and is or may yet be a call."""
        return next((found.start() for found in self.NAMED.finditer(text, at) if self._may_be_call(text, found.start())),
                    None)

    def parse(self, text: str) -> tuple:
        """The calls from `call_start` on, objects one after another, ";" between them (or a list's
        ","), or text (`_next`); other text after them (a list's "]") is dropped (as vLLM drops it),
        but not one more object that does not read (a call cut short: the reply is then not all
        read). The text before the calls is the content."""
        start = self.call_start(text)
        if start is None:
            return text, []
        calls, at = [], self._body(text, start)
        while text.startswith("{", at):
            call = self._closed_call(text, at)
            if call is None:
                return text, []
            calls.append(call)
            at = self._next(text, object_fields(text, at).end)
        return (text[:start] or None, calls) if calls else (text, [])

    def partial(self, text: str) -> list:
        """The calls written so far; an object is named once it has said its arguments too (before,
        it may be an answer's JSON that has a "name")."""
        start = self.call_start(text)
        if start is None:
            return []
        calls, at = [], self._body(text, start)
        while text.startswith("{", at):
            name, arguments, end = partial_call(text, at)
            if _arguments_span(object_fields(text, at)) is None or not self._may_be_call(text, at):
                name = arguments = None
            calls.append((name, arguments, end is not None))
            if end is None:
                break
            at = self._next(text, end)
        return calls


class Hermes:
    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    markers = (OPEN, CLOSE)  # special tokens in some models' tokenizers (vLLM keeps them for this parser too)

    def call_start(self, text: str) -> int | None:
        at = text.find(self.OPEN)
        return None if at < 0 else at

    def held(self, text: str) -> int:
        """How much of the end of `text` may be the opening tag arriving a piece at a time (held
        back from the stream's text; all else is text as soon as written)."""
        return len(text) - len(_without_tail(text, self.OPEN))

    def parse(self, text: str) -> tuple:
        """Each <tool_call> opens one call's object, closed by </tool_call> or the reply's end; the
        object is read as JSON, so a "</tool_call>" in one of its strings is the string's."""
        first = text.find(self.OPEN)
        if first < 0:
            return text, []
        calls, at = [], first
        while at >= 0:
            try:
                call, end = _call_at(text, _spaces_after(text, at + len(self.OPEN)))
            except ValueError:
                return text, []
            after = _spaces_after(text, end)
            if call is None or not (after == len(text) or text.startswith(self.CLOSE, after)):
                return text, []
            calls.append(call)
            at = text.find(self.OPEN, end)
        return text[:first] or None, calls  # the text before the calls as written, as vLLM gives it

    def partial(self, text: str) -> list:
        calls, at = [], text.find(self.OPEN)
        while at >= 0:
            body = _spaces_after(text, at + len(self.OPEN))
            if body == len(text):
                break
            name, arguments, end = partial_call(text, body) if text[body] == "{" else (None, None, None)
            calls.append((name, arguments, end is not None))
            at = -1 if end is None else text.find(self.OPEN, end)
        return calls


class Mistral:
    name = "mistral"
    marker, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
    markers = (marker, ARGS, CALL_ID)

    def call_start(self, text: str) -> int | None:
        """At the marker, or where its text may be arriving a piece at a time (no call is read
        without it: a JSON list the model writes as its answer is text, streamed as it comes)."""
        at = text.find(self.marker)
        if at >= 0:
            return at
        tail = text.rfind("[")
        return tail if tail >= 0 and self.marker.startswith(text[tail:]) else None

    @staticmethod
    def held(text: str) -> int:
        return 0  # call_start itself holds what may be the marker arriving

    def parse(self, text: str) -> tuple:
        at = text.find(self.marker)
        if at < 0:
            return text, []
        calls = []
        for part in text[at:].split(self.marker)[1:]:  # each [TOOL_CALLS] opens a list, an object or NAME[ARGS]{...}
            try:
                found = self._named(part) if self.ARGS in part else self._listed(part)
            except ValueError:
                return text, []
            if None in found:
                return text, []
            calls += found
        return text[:at] or None, calls  # the text before the marker as written, as vLLM gives it

    @staticmethod
    def _listed(part: str) -> list:
        return read_list(part)

    def _named(self, part: str) -> list:
        """v11's NAME[ARGS]{...} (or NAME[CALL_ID]ID[ARGS]{...}): the arguments one JSON object."""
        head, arguments = part.split(self.ARGS, 1)
        name = head.split(self.CALL_ID, 1)[0].strip()
        start = _spaces_after(arguments, 0)
        value, end = _json_read(_DECODER.raw_decode, arguments, start)  # (text after them dropped, as vLLM's reads it)
        return [_call({"name": name, "arguments": value}, arguments[start:end]) if name else None]

    def partial(self, text: str) -> list:
        at = text.find(self.marker)
        if at < 0:
            return []
        calls, parts = [], text[at:].split(self.marker)[1:]
        for k, part in enumerate(parts):
            last = k == len(parts) - 1  # a part before another marker is closed
            if self.ARGS in part:
                head, arguments = part.split(self.ARGS, 1)
                start = _spaces_after(arguments, 0)
                end = object_fields(arguments, start).end if arguments.startswith("{", start) else None
                # arguments that are not an object are read whole, at the end
                written = arguments[start:end].rstrip() if arguments[start:start + 1] == "{" else None
                # named once its arguments have begun as an object: they may turn out to be none
                name = head.split(self.CALL_ID, 1)[0].strip() or None if written is not None else None
                calls.append((name, written, end is not None or not last))
            elif part.lstrip()[:1] in ("[", "{"):
                calls += [(n, a, closed or not last) for n, a, closed in partial_list(part, _spaces_after(part, 0))]
            else:
                calls.append((None, None, False))  # a name being written, or not a call
                break
        return calls

    @staticmethod
    def call_id() -> str:
        alphabet = string.ascii_letters + string.digits
        return "".join(random.SystemRandom().choice(alphabet) for _ in range(9))


class Pythonic:
    name = "pythonic"
    # Llama 4 wraps the list in these special tokens; dropped as special tokens are, they may stay as text
    WRAPPERS = ("<|python_start|>", "<|python_end|>")
    NAMES = {"true": True, "false": False, "null": None}  # models trained on JSON write these too
    # A list of calls with text after it is text, as vLLM reads the whole reply: a stream that sent
    # its calls at their ")" then read text in a reply that made none. So the text is held while
    # the reply may be calls, and the calls go once it is whole (usually just past its "]").
    sends_calls_at_end = True

    def call_start(self, text: str) -> int | None:
        """0 while the reply may still be a list of calls (`_may_be_calls`), else None: text that
        opens with "[" but is no call ("[1] ...", a markdown link) is text, streamed as it comes."""
        if _whole_reply_start(text, "[", self.WRAPPERS[0]) is None:
            return None
        body = self._body(text)
        return 0 if self.WRAPPERS[0].startswith(body) or self._may_be_calls(body) else None

    @staticmethod
    def held(text: str) -> int:
        return 0  # call_start itself holds what may be a call arriving

    # a string (closed, or open to the end), or a bracket or comma: what splits a list of calls
    TOKENS = re.compile(r"""'(?:[^'\\\n]|\\.)*'?|"(?:[^"\\\n]|\\.)*"?|[()\[\]{},]""", re.DOTALL)
    NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
    NAME_SO_FAR = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*\s*)?")  # a call's name being written

    def _may_be_calls(self, body: str) -> bool:
        """Whether `body` (a reply less its spaces and wrappers) is, or may still become, a list of
        calls: "[", then names each followed by its parenthesised arguments (read once closed),
        "," between them, "]" and nothing after."""
        if not body.startswith("["):
            return False
        depth, item, called = 0, 1, False  # called: the item at the list's level is a closed call
        for token in self.TOKENS.finditer(body):
            mark, at = token.group(), token.start()
            if depth == 1:  # between the list's items: a name, a call's "(", or after a call "," or "]"
                between = body[item:at]
                if called and between.strip() or not called and mark != "(" and (mark not in ",]" or between.strip()):
                    return False
                if mark == "(" and (called or not self.NAME.fullmatch(between.strip())):
                    return False
                if mark in ",]" and not called:
                    return False  # a "," or the "]" with no call before it ("[]" makes none)
            if mark in "([{":
                depth += 1
            elif mark in ")]}":
                depth -= 1
                if depth == 1 and mark == ")":
                    if self._read(body[item:at + 1]) is None:
                        return False  # arguments that are no literals
                    called, item = True, at + 1
                if depth == 0:
                    return not body[at + 1:].strip()
            elif mark == "," and depth == 1:
                called, item = False, at + 1
            if depth == 1 and mark == "[":
                item = at + 1
        rest = body[item:]
        return depth > 1 or (not rest.strip() if called else self.NAME_SO_FAR.fullmatch(rest) is not None)

    def _body(self, text: str) -> str:
        """The reply less its spaces and wrappers, and less the closing one arriving a piece at a time
        (where they stay as text: a request that keeps special tokens)."""
        body = text.strip()
        for wrapper in self.WRAPPERS:
            body = body.replace(wrapper, "")
        return _without_tail(body, self.WRAPPERS[1]).strip()

    def partial(self, text: str) -> list:
        """The calls written so far: each named once its "(" is written, its arguments given whole
        once its ")" closes it (they are read as Python, whole)."""
        body, calls, depth, item = self._body(text), [], 0, None
        if not body.startswith("["):
            return []
        for token in self.TOKENS.finditer(body):
            mark, at = token.group(), token.start()
            if mark in "([{":
                depth += 1
                if depth == 2 and mark == "(":  # a call's name, written whole
                    name = body[item:at].strip()
                    if not self.NAME.fullmatch(name):
                        return calls + [(None, None, False)]
                    calls.append((name, None, False))
                elif depth == 1:
                    item = at + 1
            elif mark in ")]}":
                depth -= 1
                if depth == 1 and mark == ")" and calls:  # the call closes: read it as Python
                    call = self._read(body[item:at + 1])
                    calls[-1] = (None, None, True) if call is None else (call["name"], call["arguments"], True)
                if depth == 0:
                    break
            elif mark == "," and depth == 1:
                item = at + 1
        return calls

    def _read(self, source: str) -> dict | None:
        try:
            return self._call(ast.parse(source.strip(), mode="eval").body)
        except (SyntaxError, ValueError, TypeError, RecursionError):
            return None

    def parse(self, text: str) -> tuple:
        body = self._body(text)
        if not body.startswith("["):
            return text, []
        try:
            tree = ast.parse(body, mode="eval").body
            calls = [self._call(node) for node in tree.elts] if isinstance(tree, ast.List) else [None]
        except (SyntaxError, ValueError, TypeError, RecursionError):  # not literals, or not JSON's
            return text, []
        if not calls or None in calls:
            return text, []
        return None, calls

    def _call(self, node) -> dict | None:
        """{name, arguments} of name(key=literal, ...), or None where the node is not such a call."""
        if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, ast.Name):
            return None
        arguments = {}
        for keyword in node.keywords:
            if keyword.arg is None:  # **kwargs
                return None
            arguments[keyword.arg] = self._value(keyword.value)
        return _call({"name": node.func.id, "arguments": arguments})

    def _value(self, node):
        if isinstance(node, ast.Name) and node.id in self.NAMES:
            return self.NAMES[node.id]
        if isinstance(node, ast.List):
            return [self._value(e) for e in node.elts]
        if isinstance(node, ast.Dict) and None not in node.keys:
            return {self._value(k): self._value(v) for k, v in zip(node.keys, node.values)}
        return ast.literal_eval(node)  # numbers, strings, tuples ...; a ValueError for anything else


class NamedFunction:
    """The reader of a reply that tool_choice made one function's call: the reply is its arguments,
    held to their schema by a structure."""

    def __init__(self, function: str):
        self.function = function

    def parse(self, text: str) -> tuple:
        try:
            call = _call({"name": self.function, "arguments": _json_read(json.loads, text)}, text)
        except ValueError:
            call = None
        return (text, []) if call is None else (None, [call])

    def partial(self, text: str) -> list:
        arguments = text.strip()
        return [(self.function, arguments if arguments[:1] in ("", "{") else None, False)]


class RequiredCalls:
    """The reader of a reply that tool_choice "required" held to a JSON list of {name, parameters}
    (vLLM's form)."""

    def parse(self, text: str) -> tuple:
        try:
            calls = read_list(text)
        except ValueError:
            return text, []
        return (text, []) if not calls or None in calls else (None, calls)

    def partial(self, text: str) -> list:
        return partial_list(text, _spaces_after(text, 0))


class FirstCall:
    """A parser's reading of a reply kept to its first call: `parallel_tool_calls: false` with a
    model that writes several (vLLM drops the rest, whole and streamed, as this does). Anything
    else is the parser's."""

    def __init__(self, parser):
        self.parser = parser

    def __getattr__(self, name):
        if name == "parser":  # not set yet (an object made without __init__): no recursion
            raise AttributeError(name)
        return getattr(self.parser, name)

    def parse(self, text: str) -> tuple:
        content, calls = self.parser.parse(text)
        return content, calls[:1]

    def partial(self, text: str) -> list:
        return self.parser.partial(text)[:1]


def forced_calls(tool_call: str):
    """The reader of a call tool_choice forces: "required", or the function it names."""
    return RequiredCalls() if tool_call == "required" else NamedFunction(tool_call)


class Qwen3Coder:
    name = "qwen3_coder"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    FUNCTION, PARAMETER = re.compile(r"<function=([^>\n]*)>"), re.compile(r"<parameter=([^>\n]*)>")
    VALUE_END, FUNCTION_OPEN, FUNCTION_END = "</parameter>", "<function=", "</function>"
    markers = Hermes.markers  # a block of calls opens with Hermes' tag

    def __init__(self, schemas: dict | None = None):
        self.schemas = schemas or {}  # {function name: its parameters' JSON schema}

    def for_tools(self, schemas: dict) -> Qwen3Coder:
        """The parser for one request: its functions' parameter schemas type the values."""
        return Qwen3Coder(schemas)

    def call_start(self, text: str, at: int = 0) -> int | None:
        """Where a call opens in text[at:]: its <tool_call>, or a <function=NAME> written without one."""
        found = [k for k in (text.find(self.OPEN, at), self._bare_function(text, at)) if k is not None and k >= 0]
        return min(found) if found else None

    def _bare_function(self, text: str, at: int) -> int | None:
        """Where a <function=NAME> the model wrote without its <tool_call> opens in text[at:] (vLLM's
        reads it): only one of the request's functions, while its name may still be one, as prose may
        write the tag too."""
        k = text.find(self.FUNCTION_OPEN, at)
        while k >= 0:
            close = text.find(">", k)
            name = text[k + len(self.FUNCTION_OPEN):close if close >= 0 else len(text)]
            if name.strip() in self.schemas if close >= 0 else any(n.startswith(name) for n in self.schemas):
                return k
            k = text.find(self.FUNCTION_OPEN, k + 1)
        return None

    def held(self, text: str) -> int:
        """How much of the end of `text` may be an opening arriving a piece at a time (the tag, or
        a <function= where the request offers functions)."""
        tags = (self.OPEN, self.FUNCTION_OPEN) if self.schemas else (self.OPEN,)
        return len(text) - min(len(_without_tail(text, tag)) for tag in tags)

    def parse(self, text: str) -> tuple:
        """The calls; the last one may end with the reply, its </function> unwritten (vLLM's reads
        it so), where the reply ends past a whole tag and its parameters are all closed."""
        at = self.call_start(text)
        if at is None:
            return text, []
        calls = self.partial(text + self.FUNCTION_END if text.rstrip().endswith(">") else text)
        if not calls or not all(name and closed for name, _, closed in calls):
            return text, []  # a call cut short, or one without a function
        return text[:at] or None, [{"name": n, "arguments": a} for n, a, _ in calls]

    def partial(self, text: str) -> list:
        """The calls of each <tool_call> block (one or more functions) in turn, as far as written."""
        calls, at = [], self.call_start(text)
        while at is not None:
            start = at + len(self.OPEN) if text.startswith(self.OPEN, at) else at
            body_end = text.find(self.CLOSE, start)
            body = text[start:] if body_end < 0 else text[start:body_end]
            read = 0
            while True:
                name, arguments, closed, read = self._call(body, read)
                if name is None and read > 0:  # no more functions in the block
                    break
                calls.append((name, arguments, closed))
                if not closed:
                    return calls
            if body_end < 0:
                break
            at = self.call_start(text, body_end + len(self.CLOSE))  # the next call opens after this one's </tool_call>
        return calls

    def _call(self, body: str, at: int) -> tuple:
        """(name or None, arguments' JSON text so far, closed, where it ends) of the function written
        in body[at:]: the arguments a parameter at a time, a string's value as it comes."""
        function = self.FUNCTION.search(body, at)
        if function is None:
            return None, None, False, at
        name, at, items = function.group(1).strip(), function.end(), []
        properties = (self.schemas.get(name) or {}).get("properties") or {}
        while (found := self.PARAMETER.search(body, at)) is not None and not self._ended(body, at, found.start()):
            key, start = found.group(1).strip(), found.end()
            end = body.find(self.VALUE_END, start)
            kind = _schema_type(properties.get(key))
            if end < 0:  # being written: a string goes as far as it can no longer be the tag
                if kind == "string":
                    written = _without_tail(_trimmed_start(body[start:]), "\n" + self.VALUE_END)
                    items.append(f"{_json(key)}: {_json(written)[:-1]}")
                return name, "{" + ", ".join(items), False, len(body)
            items.append(f"{_json(key)}: {_json(_typed(_trimmed(body[start:end]), kind))}")
            at = end + len(self.VALUE_END)
        end = body.find(self.FUNCTION_END, at)
        if end < 0:
            return name, "{" + ", ".join(items), False, len(body)
        return name, "{" + ", ".join(items) + "}", True, end + len(self.FUNCTION_END)

    def _ended(self, body: str, at: int, parameter: int) -> bool:
        end = body.find(self.FUNCTION_END, at)
        return 0 <= end < parameter


def _schema_type(schema) -> str:
    """A parameter's JSON schema type, the first of a list but null; "string" where none is given."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    return kind if isinstance(kind, str) else "string"


def _trimmed_start(value: str) -> str:
    return value[1:] if value.startswith("\n") else value


def _trimmed(value: str) -> str:
    """A value as written between its tags, less the line breaks that set it apart."""
    value = _trimmed_start(value)
    return value[:-1] if value.endswith("\n") else value


def _without_tail(value: str, tag: str) -> str:
    """`value` less any end of it that may be `tag` arriving a piece at a time."""
    for k in range(min(len(tag), len(value)), 0, -1):
        if tag.startswith(value[-k:]):
            return value[:-k]
    return value


def _typed(value: str, kind: str):
    """A value's text as the type its schema gives it; the text itself where it does not read so, or
    reads as no JSON value: nan, inf (JSON has no such number; vLLM keeps their text too)."""
    if kind == "string":
        return value
    typed = _read_typed(value.strip(), kind)
    if typed is _UNREAD:
        return value
    try:
        json.dumps(typed, allow_nan=False)
    except (ValueError, TypeError, RecursionError):  # nan, inf; a set or bytes of Python's literals
        return value
    return typed


_UNREAD = object()  # a value's text that does not read as its schema's type


def _read_typed(text: str, kind: str):
    if text.lower() == "null":
        return None
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            number = float(text)
            return int(number) if number.is_integer() and "." not in text and "e" not in text.lower() else number
        if kind == "boolean":
            return {"true": True, "false": False}[text.lower()]
        return _json_read(json.loads, text)  # object, array, or a type the schema does not name
    except (ValueError, KeyError):
        if kind in ("object", "array"):
            try:  # Python's literals, as some models write them
                return ast.literal_eval(text)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                pass
        return _UNREAD


def openai_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def call_ids(parser):
    """What makes a new tool call's id, in the form the model's chat template takes back (OpenAI's
    unless the parser says otherwise)."""
    return getattr(parser, "call_id", openai_call_id)


def parser_for_template(template: str | None) -> str | None:
    """The format a chat template shows its model for tool calls, where that says more than the
    architecture does: Qwen3-Coder is a Qwen3 (whose format is Hermes') taught its XML calls."""
    if template and "<function=" in template and "<parameter=" in template:
        return "qwen3_coder"
    return None


PARSERS = {p.name: p for p in (Llama3Json(), Hermes(), Mistral(), Pythonic(), Qwen3Coder())}


def tool_parser(name: str):
    if name not in PARSERS:
        raise ValueError(f"no tool-call parser {name!r}; there are {', '.join(sorted(PARSERS))}")
    return PARSERS[name]
