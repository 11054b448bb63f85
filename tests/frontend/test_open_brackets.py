"""A syntax error where a bracket is left open names that bracket: the file's end, a closer that
could have come, or another closer, with the `(`, `[` or `{` still open.

The reference is Python's own tokenizer, whose brackets, strings and comments are Linnet's: the
source up to where the error points, with its strings and comments blanked (Python's `tokenize`
finds them) and every other character but brackets and line feeds made a space, is compiled as
Python inside one more `(`; Python then says which bracket "was never closed", and where.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import linnet
from linnet.errors import LinnetError
from linnet.frontend.parser import parse

ARCHS = sorted((Path(linnet.__file__).parent / "nest" / "cards" / "arch").glob("*.linnet"))
NOTE = re.compile(r"^  the `([(\[{])` at (.+):(\d+):(\d+) is (never|not) closed$", re.M)
AT = re.compile(r"^(.+?):(\d+):(\d+): error: ")


def blank_strings_and_comments(source: str) -> str:
    """`source` with each string and comment, as Python's tokenizer reads them, made spaces."""
    lines = source.split("\n")
    spans = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in (tokenize.STRING, tokenize.COMMENT):
                spans.append((tok.start, tok.end))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # the text is cut short or is not Python past here: what was read before is what counts
    for (line, col), (end_line, end_col) in spans:
        assert line == end_line  # Linnet's strings and comments are one line each
        text = lines[line - 1]
        lines[line - 1] = text[:col] + " " * (end_col - col) + text[end_col:]
    return "\n".join(lines)


def python_open_bracket(source: str, line: int, col: int):
    """(bracket, line, col) of the innermost bracket open before `line:col`, as Python names it; None
    when none is."""
    lines = blank_strings_and_comments(source).split("\n")
    before = "\n".join(lines[:line - 1] + [lines[line - 1][:col - 1]])
    skeleton = "(" + _separated(re.sub(r"[^()\[\]{}\n]", " ", before))  # in one `(`: no line starts an indent
    with pytest.raises(SyntaxError) as err:
        compile(skeleton, "skeleton", "exec")
    found = re.fullmatch(r"'(.)' was never closed", err.value.msg)
    assert found, err.value.msg
    if (err.value.lineno, err.value.offset) == (1, 1):
        return None  # only the wrapper's own `(`
    return found[1], err.value.lineno, err.value.offset - (err.value.lineno == 1)


def _separated(skeleton: str) -> str:
    """The first space after each closer made a comma, so that Python reads `] {` as two items of a
    display and not as a syntax error of its own; the columns stay where they were."""
    out, after_closer = [], False
    for c in skeleton:
        if c == " " and after_closer:
            c, after_closer = ",", False
        elif c in "([{":
            after_closer = False
        elif c in ")]}":
            after_closer = True
        out.append(c)
    return "".join(out)


def refusal(source: str, path: str = "model.linnet") -> str:
    with pytest.raises(LinnetError) as err:
        parse(source, path)
    return err.value.render()


def check_note(source: str) -> tuple | None:
    """The bracket the error's note names, held against Python's at the place the error points."""
    text = refusal(source)
    at = AT.match(text)
    line, col = int(at[2]), int(at[3])
    notes = NOTE.findall(text)
    assert len(notes) <= 1, text
    if not notes:
        return None
    char, path, note_line, note_col, _ = notes[0]
    assert path == "model.linnet"
    if "unexpected end of file" in text:  # Python's cut is the end: the whole file
        lines = source.split("\n")
        line, col = len(lines), len(lines[-1]) + 1
    assert python_open_bracket(source, line, col) == (char, int(note_line), int(note_col)), text
    return char, int(note_line), int(note_col)


HEAD = """\
arch mini
config {
  dim: int = 8
}
params {
  embed: T[16, dim]
    from hf "embed.weight"  # the (one) table
}
"""


@pytest.mark.parametrize("body, expected, says", [
    # a call left open before the block's `}`: Python names the `(` on its line, not the `}` after it
    ("entry decode(tokens: i32[Batch]) -> f32[Batch, dim] {\n  return exp(embed[tokens] as f32\n}\n",
     ("(", 10, 13), "unexpected '}'"),
    # the file ends inside the call: the `(` is never closed
    ("entry decode(tokens: i32[Batch]) -> f32[Batch, dim] {\n  return exp(embed[tokens]\n   \n\n",
     ("(", 10, 13), "unexpected end of file"),
    # the file ends inside the entry's body
    ("entry decode(tokens: i32[Batch]) -> f32[Batch, dim] {\n  return embed[tokens] as f32\n",
     ("{", 9, 53), "unexpected end of file"),
    # an index left open, with a `(` in a string and a comment before it that opens nothing
    ('entry decode(tokens: i32[Batch]) -> f32[Batch, dim] {  # ( [\n  x = "(["\n'
     "  return embed[tokens as f32\n}\n", ("[", 11, 15), "unexpected '}'"),
    # tabs and wide characters before the bracket: columns count characters
    ("entry decode(tokens: i32[Batch]) -> f32[Batch, dim] {\n\t# 漢字\n\treturn\texp(embed[tokens] as f32\n}\n",
     ("(", 11, 12), "unexpected '}'"),
])
def test_an_open_bracket_is_named_where_python_names_it(body, expected, says):
    source = HEAD + body
    assert check_note(source) == expected
    assert says in refusal(source)


def test_a_closer_of_the_right_kind_is_no_bracket_error():
    # `x.T)`: the `)` closes its `(`; the attribute is the fault, and only it is noted
    text = refusal(HEAD + "entry decode(tokens: i32[Batch]) -> f32[Batch, dim] {\n"
                          "  return exp(embed[tokens].T) as f32\n}\n")
    assert "Linnet has no attributes" in text and not NOTE.search(text)


@pytest.mark.parametrize("statement", [
    "@x = 1",  # a stray token where a statement goes: a block's `}` could come there, but was not forgotten
    "return exp(embed[tokens] embed) as f32",  # inside a call on its own line: the token is the fault
])
def test_a_bracket_that_holds_the_fault_is_not_said_to_be_open(statement):
    # as Python, which for `f(a b)` says "Perhaps you forgot a comma?" and nothing of the `(`
    text = refusal(HEAD + "entry decode(tokens: i32[Batch]) -> f32[Batch, dim] {\n  " + statement + "\n}\n")
    assert not NOTE.search(text), text


def test_with_every_bracket_closed_nothing_is_said_of_brackets():
    text = refusal(HEAD + "entry decode(tokens: i32[Batch]) -> f32[Batch, dim] {\n  return\n}\n")
    assert "unexpected '}'" in text and not NOTE.search(text)


@st.composite
def a_bracket_removed(draw):
    """A built-in architecture with one bracket (an opener or a closer) taken out, and its text."""
    path = draw(st.sampled_from(ARCHS))
    source = path.read_text()
    blanked = blank_strings_and_comments(source)
    spots = [m.start() for m in re.finditer(r"[()\[\]{}]", blanked)]
    at = draw(st.sampled_from(spots))
    return source[:at] + source[at + 1:]


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(source=a_bracket_removed())
def test_with_a_bracket_taken_out_the_bracket_named_is_pythons(source):
    try:
        parse(source, "model.linnet")
    except LinnetError:
        check_note(source)
        return
    # it still parses (a `(` and its `)` around one term both gone leaves valid text): nothing to name
