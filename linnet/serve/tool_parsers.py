"""Tool calls in a model's own words: what `tool_choice: "auto"` needs to tell a call from text.

Each model family writes its calls its own way; a parser reads one way, by vLLM's name for it:

- "llama3_json" (Llama 3.1 to 3.3): the whole reply is one JSON object, or several joined by
  ";", each {"name": ..., "parameters": {...}} (Llama 3.1 may lead it with <|python_tag|>).
- "hermes" (Hermes, Qwen 2.5 and 3, SmolLM3): text, then calls each written
  <tool_call>{"name": ..., "arguments": {...}}</tool_call>.

`parse` reads a whole reply into its text and its calls. A streamed reply is sent as text until
`call_start` finds where a call may begin; from there it is held, and read whole at the end.
"""

from __future__ import annotations

import json
import re


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


class Llama3Json:
    name = "llama3_json"
    PYTHON_TAG = "<|python_tag|>"

    def call_start(self, text: str) -> int | None:
        """Where a call may begin: a reply that opens with "{" (or the python tag) may be one."""
        stripped = text.lstrip()
        if not stripped:
            return None
        at = len(text) - len(stripped)
        if stripped.startswith("{") or self.PYTHON_TAG.startswith(stripped[:len(self.PYTHON_TAG)]):
            return at
        return None

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


PARSERS = {p.name: p for p in (Llama3Json(), Hermes())}


def tool_parser(name: str):
    if name not in PARSERS:
        raise ValueError(f"no tool-call parser {name!r}; there are {', '.join(sorted(PARSERS))}")
    return PARSERS[name]
