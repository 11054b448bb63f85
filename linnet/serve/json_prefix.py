"""JSON as far as a model has written it: where an object's fields lie before it is closed.

A streamed tool call is sent argument by argument: its name once written, then its arguments'
text as it comes. These helpers find both in a JSON object that may still be open, without
decoding it: the arguments go out as the model wrote them, and a whole reply's calls are read
with the same spans, so what a stream sent adds up to what the whole response holds.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict

# a string (closed, or open to the end of the text), or one of JSON's structural characters;
# what lies between (spaces, numbers, true/false/null) is skipped by the regex, in C
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*(?:"|\\?\Z)|[{}\[\]:,]', re.DOTALL)
_STRING_REST = re.compile(r'(?:[^"\\]|\\.)*', re.DOTALL)  # a string's characters, up to its quote or a lone "\\"


class Fields(dict):
    """{key: (value start, value end or None while it is being written)} of an object's top level,
    its keys decoded; `end`: just past the object's closing brace, None while it is open; `broken`:
    the object is found to be no JSON (a key with no ":" after it, something other than "," or "}"
    after a value), so it never closes."""
    end: int | None = None
    broken: bool = False


def object_fields(text: str, at: int) -> Fields:
    """The fields of the object whose "{" is at text[at], as far as `text` goes. A long object's
    scan is kept and resumed when it is asked for again with more text after the same start (a
    stream's next step), so that a step costs what it adds, not all that was written."""
    if len(text) - at < _KEPT_FROM:
        return _Scan(at).advance(text)
    key = (at, text[at:at + _KEPT_FROM])
    scan = _SCANS.pop(key, None)
    if scan is None or not text.startswith(scan.text):  # another text with the same start: anew
        scan = _Scan(at)
    fields = scan.advance(text)
    _SCANS[key] = scan
    while len(_SCANS) > _KEPT:
        _SCANS.popitem(last=False)
    return fields


_KEPT_FROM = 512  # objects at least this long are scanned a step at a time
_KEPT = 256  # scans kept, the least recently used dropped first
_SCANS: OrderedDict = OrderedDict()


class _Scan:
    """One object's scan, resumable: `advance` reads on from where the last call stopped."""

    def __init__(self, at: int):
        self.text, self.at, self.resume = "", at, at
        self.fields, self.end = {}, None
        self.depth, self.key, self.start, self.expect_key, self.colon = 0, None, None, True, None
        self.value_end = None  # where the field being read ends, once its string or container has closed
        self.key_end = None  # where the key being read ends, until its ":"
        self.is_list = False  # (a list's items are values: no keys, no fields)
        self.broken = False  # something other than "," or "}" came after a value: the object never closes
        self.open_string, self.string_read = None, 0  # a string being written: where it opens, read up to

    def advance(self, text: str) -> Fields:
        if self.end is None and not self.broken:
            if not self.expect_key and self.start is None and self.colon is not None:
                self.start = _scalar_start(text, self.colon + 1)  # a number may have come since
            self._read(text)
        self.text = text
        out = Fields(self.fields)
        out.end, out.broken = self.end, self.broken
        if self.end is None and self.key is not None and self.start is not None:
            out[self.key] = (self.start, self.value_end)
        return out

    def _read(self, text: str) -> None:
        if self.open_string is not None:  # read on inside the string, from where the last read stopped
            stop = _STRING_REST.match(text, self.string_read).end()
            if stop >= len(text) or text[stop] != '"':
                self.string_read = stop
                return
            self._token(text, text[self.open_string:stop + 1], self.open_string)
            self.open_string, self.resume = None, stop + 1
        for token in _TOKENS.finditer(text, self.resume):
            if self.end is not None or self.broken:
                return
            mark, where = token.group(), token.start()
            if mark[0] == '"' and not _closed(mark):  # a string still being written
                if self.depth == 1 and not self.expect_key and self.start is None:
                    self.start = where
                self.open_string, self.string_read = where, _STRING_REST.match(text, where + 1).end()
                return
            self.resume = token.end()
            self._token(text, mark, where)

    def _token(self, text: str, mark: str, where: int) -> None:
        """One token read: a whole string, or a structural character."""
        if self.depth == 1 and not self.is_list:
            follows = (self.value_end, ",}") if self.value_end is not None else (self.key_end, ":")
            if follows[0] is not None and (mark not in follows[1] or text[follows[0]:where].strip()):
                self.broken = True  # (a call's "}" left out, say: what follows is not its arguments')
                return
        if self.depth == 1 and not self.expect_key and self.start is None and mark[0] in '"{[':
            self.start = where  # a value that is a string or a container
        if mark[0] == '"':
            if self.depth == 1 and self.expect_key:
                self.key, self.key_end = _key(mark), where + len(mark)
            elif self.depth == 1:
                self.value_end = where + len(mark)
        elif mark in "{[":
            self.is_list = self.is_list or self.depth == 0 and mark == "["
            self.depth += 1
        elif mark in "}]":
            self.depth -= 1
            if self.depth == 1:
                self.value_end = where + 1
            if self.depth == 0:
                _record(self.fields, text, self.key, self.start, where)
                self.end = where + 1
        elif self.depth == 1 and mark == ":":
            self.expect_key, self.colon, self.key_end = False, where, None
            self.start = _scalar_start(text, where + 1)
        elif self.depth == 1 and mark == ",":
            _record(self.fields, text, self.key, self.start, where)
            self.key, self.start, self.expect_key, self.colon, self.value_end = None, None, True, None, None


def _key(mark: str) -> str:
    """A key's text; a key that is not JSON (a model's slip, "\\u12" say) as written, quotes and
    all, which names no field anyone reads."""
    try:
        return json.loads(mark)
    except ValueError:
        return mark


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
