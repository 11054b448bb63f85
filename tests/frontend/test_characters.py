"""A character the language lacks is an error at it, with a note that gives the language's way; and
following the note (the doc's spelling: docs/language.md, "Lexical matters" and the precedence table)
makes the file parse. A character outside ASCII is named as Unicode names it (`unicodedata`)."""

from __future__ import annotations

import unicodedata

import pytest

from linnet.errors import LinnetError
from linnet.frontend.parser import parse

HEAD = """\
arch mini
entry decode(tokens: i32[Batch], positions: i32[Batch]) -> i32[Batch] {
"""
TAIL = "\n  return tokens\n}\n"


@pytest.mark.parametrize("written, fixed, char, note", [
    ("s = 'abc'", 's = "abc"', "'", 'double quotes: "..."'),
    ("x = tokens;", "x = tokens", ";", "no separators"),
    ("b = true && false", "b = true and false", "&", "the word `and`"),
    ("b = true || false", "b = true or false", "|", "the word `or`"),
    ("b = !true", "b = not true", "!", "the word `not`"),
    ("b = ~true", "b = not true", "~", "the word `not`"),
    ("ü = tokens", "u = tokens", "ü", "a name is ASCII letters, digits and `_`"),
    ("名 = tokens", "n = tokens", "名", "a name is ASCII letters, digits and `_`"),
    ("x = tokens \u2212 1", "x = tokens - 1", "\u2212", "the language's characters are ASCII"),
    ("x\u00a0= tokens", "x = tokens", "\u00a0", "the language's characters are ASCII"),
    ("s = \u201cabc\u201d", 's = "abc"', "\u201c", "the language's characters are ASCII"),
])
def test_a_character_the_language_lacks_is_named_with_its_way(written, fixed, char, note):
    with pytest.raises(LinnetError) as err:
        parse(HEAD + "  " + written + TAIL, "model.linnet")
    e = err.value
    assert (e.loc.line, e.loc.col) == (3, 3 + written.index(char))
    assert e.message == f"unexpected character {char!r}"
    assert len(e.notes) == 1 and note in e.notes[0], e.notes
    if not char.isascii():
        assert e.notes[0].startswith(f"U+{ord(char):04X} {unicodedata.name(char)}: ")
    parse(HEAD + "  " + fixed + TAIL, "model.linnet")  # the way the note gives parses


def test_not_equal_is_no_logical_not():
    parse(HEAD + "  b = 1 != 2" + TAIL, "model.linnet")
    with pytest.raises(LinnetError) as err:
        parse(HEAD + "  b = 1 ! 2" + TAIL, "model.linnet")
    assert "the word `not`" in err.value.notes[0]


def test_outside_ascii_is_taken_in_strings_and_comments():
    assign, returned = parse(HEAD + '  s = "ü − “名”"  # ü − “名”' + TAIL, "model.linnet").entries[0].body
    assert assign.value.value == "ü − “名”"  # the string as written; the comment leaves nothing
    assert (returned.loc.line, returned.value.id) == (4, "tokens")


@pytest.mark.parametrize("op", ["+", "-", "*", "/", "//", "%", "**"])
def test_an_augmented_assignment_is_told_its_longhand(op):
    # Python's `x += y`: the note writes it as the language does, and that parses
    with pytest.raises(LinnetError) as err:
        parse(HEAD + f"  x = tokens\n  x {op}= tokens" + TAIL, "model.linnet")
    e = err.value
    assert (e.loc.line, e.loc.col) == (4, 5)
    assert e.notes == [f"Linnet has no `{op}=`: write `x = x {op} ...`"]
    parse(HEAD + f"  x = tokens\n  x = x {op} tokens" + TAIL, "model.linnet")


def test_a_walrus_is_told_to_bind_with_equals():
    with pytest.raises(LinnetError) as err:
        parse(HEAD + "  x := tokens" + TAIL, "model.linnet")
    assert err.value.notes == ["a local is bound with `=` (Linnet has no `:=`)"]
    parse(HEAD + "  x = tokens" + TAIL, "model.linnet")


def test_without_and_no_base_is_told_where_without_goes():
    source = HEAD.replace("arch mini", "arch mini without mlp") + "  return tokens\n}\n"
    with pytest.raises(LinnetError) as err:
        parse(source, "model.linnet")
    e = err.value
    assert (e.loc.line, e.loc.col, e.message) == (1, 11, "unexpected 'without'")
    assert "`arch NAME extends BASE without a, b`" in e.notes[0]
    parse(source.replace("arch mini without", "arch mini extends llama without"), "model.linnet")
