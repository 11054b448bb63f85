"""Tool calls in a model's own words: what `tool_choice: "auto"` needs to tell a call from text.

Each model family writes its calls its own way; a parser reads one way, by vLLM's name for it:

- "llama3_json" (Llama 3.1 to 3.3): the whole reply is one JSON object, or several joined by
  ";", each {"name": ..., "parameters": {...}} (Llama 3.1 may lead it with <|python_tag|>).
- "hermes" (Hermes, Qwen 2.5 and 3, SmolLM3): text, then calls each written
  <tool_call>{"name": ..., "arguments": {...}}</tool_call>.
- "mistral": text, then the special token [TOOL_CALLS] and either a JSON list of {"name": ...,
  "arguments": {...}} (Mistral 7B v0.3, Mixtral, Mistral Nemo) or, from Mistral's v11 tokenizers
  on (Mistral Small 3.2, Magistral, Devstral), one call per [TOOL_CALLS], written
  NAME[ARGS]{...} (special tokens too; [CALL_ID] and an id may come between). Mistral's chat
  templates take only call ids of 9 letters and digits, so this parser makes its ids so.
- "pythonic" (Llama 3.2 and 4 with their pythonic templates, ToolACE): the whole reply is a
  Python list of calls, [get_weather(city="Paris"), get_time()], arguments as literals.

`parse` reads a whole reply into its text and its calls. A streamed reply is sent as text until
`call_start` finds where a call may begin; from there it is held, and read whole at the end.
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


_DECODER = json.JSONDecoder()


def _call(value) -> dict | None:
    """{name, arguments (JSON text)} from a call's object, or None where it is not one."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("parameters", value.get("arguments", {}))
    if isinstance(arguments, str):  # some models write the arguments as JSON text already
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return {"name": value["name"], "arguments": json.dumps(arguments)}


def _whole_reply_start(text: str, opener: str, tag: str) -> int | None:
    """Where a call may begin in a family's reply that is its calls whole: at the first character
    past leading spaces, where that opens `opener`, or may be `tag` arriving a piece at a time."""
    stripped = text.lstrip()
    if stripped and (stripped.startswith(opener) or tag.startswith(stripped[:len(tag)])):
        return len(text) - len(stripped)
    return None


class Llama3Json:
    name = "llama3_json"
    PYTHON_TAG = "<|python_tag|>"

    def call_start(self, text: str) -> int | None:
        """Where a call may begin: a reply that opens with "{" (or the python tag) may be one."""
        return _whole_reply_start(text, "{", self.PYTHON_TAG)

    hold = 0  # text never waits for a marker: only the reply's first character decides

    def parse(self, text: str) -> tuple:
        body = text.strip()
        if body.startswith(self.PYTHON_TAG):
            body = body[len(self.PYTHON_TAG):].strip()
        if not body.startswith("{"):
            return text, []
        calls, at = [], 0
        while at < len(body):  # objects one after another, ";" between them (and maybe inside their strings)
            try:
                value, at = _DECODER.raw_decode(body, at)
            except ValueError:
                return text, []
            call = _call(value)
            if call is None:
                return text, []
            calls.append(call)
            at = len(body) - len(body[at:].lstrip().removeprefix(";").lstrip())
        return None, calls


class Hermes:
    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

    def call_start(self, text: str) -> int | None:
        at = text.find(self.OPEN)
        return None if at < 0 else at

    hold = len(OPEN) - 1  # a marker may be arriving a piece at a time

    def parse(self, text: str) -> tuple:
        at = text.find(self.OPEN)
        if at < 0:
            return text, []
        calls = []
        for match in self.CALL.finditer(text, at):
            try:
                call = _call(json.loads(match.group(1)))
            except ValueError:
                call = None
            if call is None:
                return text, []
            calls.append(call)
        content = text[:at].strip()
        return content or None, calls


class Mistral:
    name = "mistral"
    marker, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
    markers = (marker, ARGS, CALL_ID)
    CALLS = re.compile(r"\[\s*(\{|$)")  # a JSON list of calls opening, where the marker is not in the text

    def call_start(self, text: str) -> int | None:
        """At the marker; where it is not written, at a "[" that opens a list of objects or may be
        the marker's text arriving a piece at a time."""
        at = text.find(self.marker)
        if at >= 0:
            return at
        tail = text.rfind("[")
        if tail >= 0 and self.marker.startswith(text[tail:]):
            return tail
        found = self.CALLS.search(text)
        return None if found is None else found.start()

    hold = 0  # call_start itself holds what may be the marker arriving

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
        content = text[:at].strip()
        return content or None, calls

    @staticmethod
    def _listed(part: str) -> list:
        value = json.loads(part)
        return [_call(item) for item in (value if isinstance(value, list) else [value])]

    def _named(self, part: str) -> list:
        """v11's NAME[ARGS]{...} (or NAME[CALL_ID]ID[ARGS]{...}): the arguments one JSON object."""
        head, arguments = part.split(self.ARGS, 1)
        name = head.split(self.CALL_ID, 1)[0].strip()
        return [_call({"name": name, "arguments": json.loads(arguments)}) if name else None]

    @staticmethod
    def call_id() -> str:
        alphabet = string.ascii_letters + string.digits
        return "".join(random.SystemRandom().choice(alphabet) for _ in range(9))


class Pythonic:
    name = "pythonic"
    # Llama 4 wraps the list in these special tokens; dropped as special tokens are, they may stay as text
    WRAPPERS = ("<|python_start|>", "<|python_end|>")
    NAMES = {"true": True, "false": False, "null": None}  # models trained on JSON write these too

    def call_start(self, text: str) -> int | None:
        return _whole_reply_start(text, "[", self.WRAPPERS[0])

    hold = 0  # the reply's first character decides

    def parse(self, text: str) -> tuple:
        body = text.strip()
        for wrapper in self.WRAPPERS:
            body = body.replace(wrapper, "")
        body = body.strip()
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


def openai_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def call_ids(parser):
    """What makes a new tool call's id, in the form the model's chat template takes back (OpenAI's
    unless the parser says otherwise)."""
    return getattr(parser, "call_id", openai_call_id)


PARSERS = {p.name: p for p in (Llama3Json(), Hermes(), Mistral(), Pythonic())}


def tool_parser(name: str):
    if name not in PARSERS:
        raise ValueError(f"no tool-call parser {name!r}; there are {', '.join(sorted(PARSERS))}")
    return PARSERS[name]
