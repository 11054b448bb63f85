"""JSON as far as a model has written it: where an object's fields lie before it is closed.

A streamed tool call is sent argument by argument: its name once written, then its arguments'
text as it comes. These helpers find both in a JSON object that may still be open, without
decoding it: the arguments go out as the model wrote them, and a whole reply's calls are read
with the same spans, so what a stream sent adds up to what the whole response holds.
"""

from __future__ import annotations

import json
import re

# a string (closed, or open to the end of the text), or one of JSON's structural characters;
# what lies between (spaces, numbers, true/false/null) is skipped by the regex, in C
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*(?:"|\\?\Z)|[{}\[\]:,]', re.DOTALL)


class Fields(dict):
    """{key: (value start, value end or None while it is being written)} of an object's top level,
    its keys decoded; `end`: just past the object's closing brace, None while it is open."""
    end: int | None = None


def object_fields(text: str, at: int) -> Fields:
    """The fields of the object whose "{" is at text[at], as far as `text` goes."""
    fields, depth, key, start, expect_key = Fields(), 0, None, None, True
    for token in _TOKENS.finditer(text, at):
        mark, where = token.group(), token.start()
        if depth == 1 and not expect_key and start is None and mark[0] in '"{[':
            start = where  # a value that is a string or a container
        if mark[0] == '"':
            if depth == 1 and expect_key:
                if not _closed(mark):
                    break  # a key still being written
                key = json.loads(mark)
        elif mark in "{[":
            depth += 1
        elif mark in "}]":
            depth -= 1
            if depth == 0:
                _record(fields, text, key, start, where)
                fields.end = where + 1
                return fields
        elif depth == 1 and mark == ":":
            expect_key, start = False, _scalar_start(text, where + 1)
        elif depth == 1 and mark == ",":
            _record(fields, text, key, start, where)
            key, start, expect_key = None, None, True
    if key is not None and start is not None:
        fields[key] = (start, None)
    return fields


def _closed(mark: str) -> bool:
    """Whether a string token ends with its closing quote (not an escaped one)."""
    if len(mark) < 2 or not mark.endswith('"'):
        return False
    slashes = len(mark[1:-1]) - len(mark[1:-1].rstrip("\\"))
    return slashes % 2 == 0


def _scalar_start(text: str, after: int) -> int | None:
    """Where a value begins past its ":" when it is a number or a literal (strings and containers
    are found as tokens); None where nothing but spaces is written yet."""
    rest = text[after:]
    stripped = rest.lstrip()
    if not stripped or stripped[0] in '"{[':
        return None
    return after + len(rest) - len(stripped)


def _record(fields: Fields, text: str, key, start, end: int):
    if key is not None and start is not None:
        fields[key] = (start, start + len(text[start:end].rstrip()))


def value_text(text: str, span: tuple | None) -> str | None:
    """A field's text as written so far (whole once it ends), trailing spaces held back: they may
    turn out to lie outside the value."""
    if span is None:
        return None
    start, end = span
    return text[start:end] if end is not None else text[start:].rstrip()


def closed_string(text: str, span: tuple | None) -> str | None:
    """A string field's value, once its closing quote is written; None before (or for a non-string)."""
    if span is None or span[1] is None or text[span[0]] != '"':
        return None
    try:
        value = json.loads(text[span[0]:span[1]])
    except ValueError:
        return None
    return value if isinstance(value, str) else None
