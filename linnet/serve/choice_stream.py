"""One streamed choice, a step at a time: what each batch of tokens adds to its text, its thinking
and its tool calls, and what its end adds. Pure (no I/O): the server sends what it returns as
chunks, and the tests drive it over a reply cut at any token boundary.

Text goes out as far as it can no longer turn out to be a stop string, part of a reasoning tag,
or part of a tool call (`sendable`); a call goes as its tool call (tool_stream.py). At the end
the whole reply is read as the response would read it, and what the stream has not sent of it
goes: so the pieces add up to the whole response's message.
"""

from __future__ import annotations

from typing import NamedTuple

from linnet.serve.openai_api import Job
from linnet.serve.openai_replies import (answer_start, calls_after, chat_message, choice_stream, divide_reply,
                                         finish_reason, partial_calls, reply_text)
from linnet.serve.tool_stream import CallStream


class Delta(NamedTuple):
    thought: str  # new reasoning_content ("" without, or where include_reasoning is false)
    text: str  # new content (chat) or text (completions)
    calls: list  # tool-call events, tool_stream's ("open", k, call) | ("arguments", k, text)
    offsets: list  # where each of the step's tokens' text starts
    out: int  # how far the reply's text is out, for Responses to place the logprobs
    why: str | None = None  # the finish_reason, at the end


class ChoiceDeltas:
    def __init__(self, job: Job, comp, tokenizer, chat: bool, start: int = 0, markers: dict | None = None):
        """`comp`: the choice's Completion (its request, and at the end its text); `start`: where its
        text begins in the response's (past an echoed prompt); `markers`: `marker_ids`, if known."""
        self.job, self.comp, self.tokenizer, self.chat = job, comp, tokenizer, chat
        self.stream = choice_stream(job, comp, tokenizer, start, markers)
        self.calls = CallStream(job.call_id, job.tool_names)

    def step(self, tokens: list) -> Delta:
        """What `tokens`, just drawn, let the stream send."""
        job, stream = self.job, self.stream
        offsets = stream.add(tokens)
        before = stream.sent
        stream.ready(sendable(job, stream.text))
        thought, text = divide_reply(job, stream.text, before, stream.sent)
        # calls as far as the text can no longer turn out to be a stop string
        calls = self.calls.news(partial_calls(job, stream.text, len(stream.text) - stream.hold))
        return self._delta(thought, text, calls, offsets, stream.sent)

    def end(self, tokens: list) -> Delta:
        """The last tokens and the rest of the reply, read whole as the response reads it."""
        job, comp, stream = self.job, self.comp, self.stream
        offsets = stream.add(tokens)
        before = stream.sent
        message, why = chat_message(job, comp, self.tokenizer) if self.chat else (None, finish_reason(comp))
        made = None if message is None else message.get("tool_calls")
        if made:  # the rest of the calls, after any text before them
            thought = divide_reply(job, stream.text, before, len(stream.text))[0]
            text = (message["content"] or "")[len(divide_reply(job, stream.text, 0, before)[1]):]
            out = len(stream.text)
        else:
            stream.finish(reply_text(job, comp, self.tokenizer) if self.chat else comp.text)  # as parsed
            thought, text = divide_reply(job, stream.text, before, stream.sent)
            if message is not None and message["content"] is None:  # (a forced call cut before it reads)
                text = ""
            out = stream.sent
        return self._delta(thought, text, self.calls.finish(made or []), offsets, out, why)

    def _delta(self, thought: str, text: str, calls: list, offsets: list, out: int, why: str | None = None) -> Delta:
        if not self.job.include_reasoning:
            thought = ""  # vLLM's include_reasoning false: the thinking is read apart and left out
        return Delta(thought, text, calls, offsets, out, why)


def sendable(job: Job, text: str) -> int | None:
    """How much of a choice's text may be streamed as text now: all of it (None), but where a tool
    call may be being written (a forced call is the whole answer; with "auto", text stops where one
    may begin: the calls go as tool calls) or a reasoning model's tag may be arriving."""
    limit = None if job.reasoning is None else job.reasoning.sendable(text)
    if job.tool_call is None or getattr(job.tool_parser, "reads_whole_reply", False):
        return limit  # harmony holds back calls itself
    answer = answer_start(job, text)
    if answer is None:  # still thinking: no call yet
        return limit
    calls = calls_after(job, text, answer)
    if calls is None:  # none yet: all but what may be the start of one arriving, in the answer (not the thinking)
        calls = len(text) - job.tool_parser.held(text[answer:])
    return calls if limit is None else min(limit, calls)
