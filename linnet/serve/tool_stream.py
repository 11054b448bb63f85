"""A streamed chat choice's tool calls, sent as the model writes them, as OpenAI streams them: a
call opens with its id and name once the name is written, then its arguments' text follows a
piece at a time; calls go in order, each opened once the one before is closed.

`news` takes what the tool parser reads of the reply so far (`partial`); `finish` takes the calls
the whole reply makes and sends what the stream has not: the rest of a call's arguments, and any
call read only at the end (one whose arguments are written as a JSON string, say).
"""

from __future__ import annotations


class CallStream:
    def __init__(self, new_id, names: frozenset = frozenset()):
        """`new_id`: makes a call's id; `names`: the request's functions: a call to any other is
        not streamed (a Llama 3 reply that is JSON may be an answer, not a call), only read at
        the end."""
        self.new_id, self.names = new_id, names
        self.sent: list = []  # per call opened: [id, name, arguments sent]

    def news(self, partial: list) -> list:
        """[("open", k, call) | ("arguments", k, text)] for what `partial` (a parser's
        [(name, arguments so far, closed)]) holds that was not sent."""
        events = []
        for k, (name, arguments, closed) in enumerate(partial):
            if k == len(self.sent):
                if name is None or name not in self.names:
                    break
                events.append(self._open(name))
            sent = self.sent[k]
            if sent[1] != name:
                break  # read otherwise than before: the end sorts it out
            if arguments is not None:
                events += self._more(k, arguments)
            if not closed:
                break
        return events

    def finish(self, calls: list) -> list:
        """What is left to send of `calls` (OpenAI's, ids and all, as the whole reply reads):
        their ids are the stream's where it opened them."""
        events = []
        for k, call in enumerate(calls):
            fn = call["function"]
            if k == len(self.sent):
                events.append(self._open(fn["name"], call["id"]))
            sent = self.sent[k]
            call["id"] = sent[0]  # the whole response, where one is built from these, says what was sent
            events += self._more(k, fn["arguments"])
        return events

    def _more(self, k: int, arguments: str) -> list:
        """The piece of call k's `arguments` past what was sent, where they go on from it."""
        sent = self.sent[k]
        if not arguments.startswith(sent[2]) or len(arguments) == len(sent[2]):
            return []
        piece, sent[2] = arguments[len(sent[2]):], arguments
        return [("arguments", k, piece)]

    def _open(self, name: str, call_id: str | None = None) -> tuple:
        call_id = call_id or self.new_id()
        self.sent.append([call_id, name, ""])
        k = len(self.sent) - 1
        return "open", k, {"id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
