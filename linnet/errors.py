"""Errors in Linnet source, reported as `path:line:col: error: message` with a caret.

Every stage that reads source raises `LinnetError`; the CLI prints `str(err)`
and exits 1, so bad source never shows a Python traceback.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass


@dataclass(frozen=True)
class Loc:
    """A span of source text: 1-based line and column, end exclusive."""

    path: str
    line: int
    col: int
    end_line: int
    end_col: int
    source: str | None = None  # the whole file, kept so errors can quote it

    def __str__(self) -> str:
        if self.line <= 0:  # a whole file (one that cannot be read), or no place at all
            return self.path
        return f"{self.path}:{self.line}:{self.col}"

    def __repr__(self) -> str:
        return f"Loc({self})"

    def __eq__(self, other) -> bool:  # the source text is not part of a location's identity
        return isinstance(other, Loc) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def key(self):
        return (self.path, self.line, self.col, self.end_line, self.end_col)


UNKNOWN = Loc("<unknown>", 0, 0, 0, 0)


class LinnetError(Exception):
    """An error in a model's source: where, what, and notes that explain it."""

    def __init__(self, loc: Loc | None, message: str, notes: list[str] | tuple[str, ...] = ()):
        self.loc = loc or UNKNOWN
        self.message = message
        self.notes = list(notes)
        super().__init__(self.render())

    def render(self) -> str:
        return _render(self.loc, "error", self.message, self.notes)


class LinnetWarning(UserWarning):
    """Source that compiles but likely says something other than meant (a param nothing reads): where, what,
    and notes, quoted with a caret as an error is."""

    def __init__(self, loc: Loc | None, message: str, notes: list[str] | tuple[str, ...] = ()):
        self.loc = loc or UNKNOWN
        self.message = message
        self.notes = list(notes)
        super().__init__(_render(self.loc, "warning", message, self.notes))


def _render(loc: Loc, severity: str, message: str, notes: list[str]) -> str:
    lines = [f"{loc}: {severity}: {message}"]
    text = _source_line(loc)
    if text is not None:
        end = loc.end_col - 1 if loc.end_line == loc.line else len(text)
        text, start, end = _window(text, loc.col - 1, end)
        lines.append("    " + text)
        lead, marked = text[:start], text[start:end]
        lines.append("    " + " " * _columns(lead) + "^" * max(1, _columns(marked)))
    lines.extend("  " + note for note in notes)
    return "\n".join(lines)


# How much of a long line is quoted: a generated file, or a deep expression, can put thousands of
# characters on one line, and a caret line as long under it.
QUOTED_BEFORE, QUOTED_WIDTH = 40, 160


def _window(text: str, start: int, end: int) -> tuple[str, int, int]:
    """`text` cut to QUOTED_WIDTH characters from QUOTED_BEFORE before `start` (`...` where it was
    cut), with `start` and `end` (character offsets, end exclusive) moved into the cut text."""
    if len(text) <= QUOTED_WIDTH:
        return text, start, end
    first = max(0, min(start - QUOTED_BEFORE, len(text) - QUOTED_WIDTH))
    last = first + QUOTED_WIDTH
    lead, tail = ("..." if first else ""), ("..." if last < len(text) else "")
    shift = len(lead) - first
    return lead + text[first:last] + tail, start + shift, min(end, last) + shift


def _columns(text: str) -> int:
    """How many terminal columns `text` takes: a wide (CJK) character two, a combining mark none, so
    that the caret stands under what it marks (columns in the message count characters, as Python's)."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
               for c in text)


def source_lines(source: str) -> list[str]:
    """The lines of `source` as the parser counts them: split at line feeds only (`str.splitlines`
    also splits at form feeds, U+2028 and others, which would shift every line after one), each
    without a carriage return before its end; a final line feed ends the last line."""
    lines = [line.removesuffix("\r") for line in source.split("\n")] if source else []
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()
    return lines


def _source_line(loc: Loc) -> str | None:
    if loc.source is None or loc.line <= 0:
        return None
    lines = source_lines(loc.source)
    if loc.line > len(lines):
        return None
    return lines[loc.line - 1].rstrip().expandtabs(1)
