"""Reasoning in a reply: what a reasoning model thinks, apart from what it answers.

Reasoning models write their thinking between tags before the answer; the server gives the two
apart, as vLLM does: the thinking as the message's `reasoning_content`, the answer as its
`content`. A parser reads one family's tags, by vLLM's name for it:

- "deepseek_r1" (DeepSeek-R1 and its distills): the chat template opens the thinking, so the
  reply starts inside it (a leading <think> is dropped) and it runs to </think>, or to the end
  of a reply cut short.
- "qwen3" (Qwen3, QwQ): a reply that opens with <think> thinks until </think>, as does one whose
  prompt the template ended with <think> (Qwen3's Thinking-2507 models: their replies hold only
  </think>); any other is all answer.
- "openai_gptoss" (gpt-oss): harmony's channels, analysis the thinking, final the answer; it
  reads the tool calls too (`Harmony`).

The tags are dropped. A reply's text is [<think>] reasoning </think> content, in that order, so a
streamed reply is sent through one cursor: `sendable` says how far it may go (not into what may
be a tag still arriving), `divide` splits what it passes into its reasoning and content.
"""

from __future__ import annotations

import json
import re

from linnet.serve.structured import JSON_LAYOUT, Structure


def arriving(text: str, tags: tuple) -> int:
    """How long an end of `text` may be one of `tags` arriving a piece at a time (0 where none
    could be): only that is held back from a stream, the rest is sent as soon as written."""
    for k in range(min(len(text), max(map(len, tags)) - 1), 0, -1):
        if any(tag.startswith(text[-k:]) for tag in tags):
            return k
    return 0


class ThinkTags:
    OPEN, CLOSE = "<think>", "</think>"
    keeps_special = False  # the tags are plain text
    reads_whole_reply = False

    def __init__(self, name: str, starts_inside: bool):
        self.name = name
        self.starts_inside = starts_inside

    def regions(self, text: str) -> tuple:
        """(reasoning start, reasoning end, content start) in `text`: the ends None while the
        reasoning is still open; (0, 0, 0) for a reply with no reasoning."""
        lead = len(text) - len(text.lstrip())
        opened = text.startswith(self.OPEN, lead)
        if not opened and not self.starts_inside:
            return 0, 0, 0
        start = lead + len(self.OPEN) if opened else 0
        end = text.find(self.CLOSE, start)
        return (start, None, None) if end < 0 else (start, end, end + len(self.CLOSE))

    def split(self, text: str) -> tuple:
        """A whole reply's (reasoning, content), each None where empty."""
        start, end, content = self.regions(text)
        if end is None:  # cut short while thinking
            return text[start:] or None, None
        return text[start:end] or None, text[content:] or None

    def sendable(self, text: str) -> int:
        """How much of a reply's text so far can no longer turn out to be part of a tag."""
        stripped = text.lstrip()
        if len(stripped) < len(self.OPEN) and self.OPEN.startswith(stripped):
            return 0  # may be the opening tag (after whitespace; R1's, dropped, too), arriving a piece at a time
        _, end, _ = self.regions(text)
        return len(text) - arriving(text, (self.CLOSE,)) if end is None else len(text)

    def divide(self, text: str, start: int, stop: int) -> tuple:
        """text[start:stop], sent, as (its reasoning, its content), the tags left out."""
        r_start, r_end, c_start = self.regions(text)
        r_end = len(text) if r_end is None else r_end
        c_start = len(text) if c_start is None else c_start
        clip = lambda lo, hi: text[max(start, lo):min(stop, hi)] if min(stop, hi) > max(start, lo) else ""
        return clip(r_start, r_end), clip(c_start, len(text))

    def content_start(self, text: str) -> int | None:
        """Where the answer begins (None while the reply is still thinking)."""
        return self.regions(text)[2]

    def for_prompt(self, prompt: str) -> ThinkTags:
        """This reader for a reply to `prompt`: one whose template opened the thinking starts inside it."""
        if self.starts_inside or not prompt.rstrip().endswith(self.OPEN):
            return self
        return ThinkTags(self.name, starts_inside=True)

    def structure_after(self, prompt: str) -> str | None:
        """The text after which a structured answer begins: the end of the thinking, unless the
        prompt has closed it already (a template told not to think)."""
        return None if prompt.rstrip().endswith(self.CLOSE) else self.CLOSE


class Harmony:
    """gpt-oss's harmony format: a reply is messages, each a header then a body,

        <|channel|>analysis<|message|>thinking<|end|><|start|>assistant<|channel|>final<|message|>answer<|return|>

    with a tool call a commentary message to a function, its body the arguments:

        <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>

    The analysis channel is the reasoning; final (and commentary to no one: preambles) the content.
    The markers are special tokens, so the reply is read with them (`keeps_special`). This one
    parser also reads the calls, from the whole reply (`reads_whole_reply`), as a tool parser."""

    name = "openai_gptoss"
    keeps_special = True
    reads_whole_reply = True
    MESSAGE, ENDS = "<|message|>", ("<|end|>", "<|return|>", "<|call|>")
    HEADS = ("<|start|>", "<|channel|>", "<|message|>")  # what may open a message
    MARKS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")
    CHANNEL, RECIPIENT = re.compile(r"<\|channel\|>\s*(\w+)"), re.compile(r"\bto=([^\s<]+)")

    def messages(self, text: str) -> list:
        """[(kind, body start, body end, recipient, closed)]: kind "reasoning", "content" or "call".
        Text before the first marker is content: a reply the model began without a header (where
        the prompt ended with one, or the model strayed from its format) is kept, not dropped."""
        out = []
        at = min([i for i in (text.find(m) for m in self.HEADS) if i >= 0], default=len(text))
        if at:
            out.append(("content", 0, at, None, at < len(text)))
        while (head := text.find(self.MESSAGE, at)) >= 0:
            header, start = text[at:head], head + len(self.MESSAGE)
            ends = [(i, mark) for i, mark in ((text.find(m, start), m) for m in self.ENDS) if i >= 0]
            end, mark = min(ends) if ends else (len(text), "")
            channel = self.CHANNEL.search(header)
            to = self.RECIPIENT.search(header)
            recipient = to.group(1) if to else None
            kind = ("call" if recipient and recipient.startswith("functions.") else
                    "reasoning" if channel and channel.group(1) == "analysis" else "content")
            out.append((kind, start, end, recipient, bool(ends)))
            if not ends:
                break
            at = end + len(mark)
        return out

    def split(self, text: str) -> tuple:
        reasoning, content = self.divide(text, 0, len(text))
        return reasoning or None, content or None

    def _settled(self, text: str) -> int:
        """How much of `text` can no longer be part of a marker arriving a piece at a time."""
        return len(text) - arriving(text, self.MARKS)

    def sendable(self, text: str) -> int:
        """All but what may be a marker arriving, and a call's arguments (which go as its tool call)."""
        limit = self._settled(text)
        calls = [s for kind, s, _, _, _ in self.messages(text) if kind == "call"]
        return max(0, min([limit] + calls))

    def divide(self, text: str, start: int, stop: int) -> tuple:
        parts = {"reasoning": "", "content": "", "call": ""}
        for kind, s, e, _, _ in self.messages(text):
            lo, hi = max(start, s), min(stop, e)
            if hi > lo:
                parts[kind] += text[lo:hi]
        return parts["reasoning"], parts["content"]

    def content_start(self, text: str) -> int | None:
        return None  # calls are read here, from the whole reply: no answer for a tool parser to search

    def for_prompt(self, prompt: str) -> Harmony:
        return self  # (a reply's every message has its own header)

    def structure_after(self, prompt: str) -> str | None:
        return "<|channel|>final<|message|>"  # the answer's header

    def call_structure(self, functions: dict) -> Structure:
        """A reply that must call one of `functions` ({name: parameters' JSON schema}): thinking, as
        the model will, then a commentary message to the function, its arguments held to the
        schema. The headers are the model's own, so tool_choice keeps it in its format."""
        def text(s: str) -> str:
            return json.dumps(s)  # a Lark string literal

        calls = []
        for i, (name, schema) in enumerate(functions.items()):
            calls.append(f"call_{i}: <|channel|> {text(f'commentary to=functions.{name} ')} <|constrain|> "
                         f'{text("json")} <|message|> args_{i} <|call|>\n'
                         f"args_{i}: %json {json.dumps({**schema, 'x-guidance': JSON_LAYOUT})}")
        grammar = "\n".join([
            "start: thinking? (" + " | ".join(f"call_{i}" for i in range(len(functions))) + ")",
            f'thinking: <|channel|> {text("analysis")} <|message|> THOUGHT <|end|> <|start|> {text("assistant")}',
            r"THOUGHT: /(.|\n)*/",  # any text: the markers are special tokens, never text
            *calls])
        return Structure("grammar", grammar)

    def parse(self, text: str) -> tuple:
        """As a tool parser: (content, calls) of a whole reply; a call cut short is not one."""
        return self.split(text)[1], [self._call(text, s, e, to) for kind, s, e, to, closed in self.messages(text)
                                     if kind == "call" and closed]

    def partial(self, text: str) -> list:
        """As a tool parser: the calls written so far, [(name, arguments so far, closed)]; an open
        call's arguments stop short of what may be a marker arriving."""
        limit, calls = self._settled(text), []
        for kind, s, e, recipient, closed in self.messages(text):
            if kind == "call" and closed:
                call = self._call(text, s, e, recipient)
                calls.append((call["name"], call["arguments"], True))
            elif kind == "call":
                written = text[s:max(s, limit)].strip()
                calls.append((recipient.removeprefix("functions."), written if written[:1] in ("", "{") else None,
                              False))
        return calls

    @staticmethod
    def _call(text: str, s: int, e: int, recipient: str) -> dict:
        """The call whose arguments are text[s:e], as the model wrote them where they are an object
        or no JSON at all (kept, as vLLM's harmony parser keeps them and OpenAI's API may give them:
        the message says it is a call, and dropping it would lose what the model wrote)."""
        try:
            arguments = json.loads(text[s:e])
        except ValueError:
            arguments = None
        written = text[s:e].strip() if arguments is None or isinstance(arguments, dict) else \
            json.dumps(arguments, ensure_ascii=False)
        return {"name": recipient.removeprefix("functions."), "arguments": written}


PARSERS = {p.name: p for p in (ThinkTags("deepseek_r1", starts_inside=True), ThinkTags("qwen3", starts_inside=False),
                               Harmony())}


def reasoning_parser(name: str):
    if name not in PARSERS:
        raise ValueError(f"no reasoning parser {name!r}; there are {', '.join(sorted(PARSERS))}")
    return PARSERS[name]
