"""The grammar itself: Lark's strict mode proves no two terminals can match the same text (the
parser Linnet builds at run time skips that proof, which costs most of its build); and the run-time
parser read back from the user cache parses as the one built from the grammar."""

from pathlib import Path

import lark
import pytest

import linnet
from linnet.errors import LinnetError
from linnet.frontend import parser
from linnet.frontend.parser import build_parser

SOURCES = sorted((Path(linnet.__file__).parent / "nest" / "cards").rglob("*.linnet"))


def test_terminals_never_collide():
    pytest.importorskip("interegular")
    build_parser(strict=True)  # raises lark's LexError on a collision


def test_strict_and_run_time_parsers_agree():
    """Every shipped card and architecture parses to the same tree either way."""
    pytest.importorskip("interegular")
    strict, plain = build_parser(strict=True), build_parser()
    assert SOURCES
    for path in SOURCES:
        source = path.read_text()
        assert spans(strict.parse(source)) == spans(plain.parse(source)), path.name


def spans(tree) -> list:
    """Every subtree and token with its place in the source, in order: what error messages and the
    AST's locations are made of (a Tree's own `==` compares no positions)."""
    if isinstance(tree, lark.Token):
        return [(tree.type, str(tree), tree.line, tree.column, tree.end_line, tree.end_column)]
    if tree is None:
        return [None]
    m = tree.meta
    here = (tree.data, *((m.line, m.column, m.end_line, m.end_column) if not m.empty else ()))
    return [here] + [s for child in tree.children for s in spans(child)]


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """An empty user cache, and the run-time parser built again in it (and again after the test)."""
    monkeypatch.setenv("LINNET_CACHE", str(tmp_path))
    parser._parser.cache_clear()
    yield tmp_path / "parser"
    parser._parser.cache_clear()


def test_the_parser_is_read_back_from_the_cache(own_cache, monkeypatch):
    built = parser._parser()
    assert len(list(own_cache.iterdir())) == 1
    parser._parser.cache_clear()
    monkeypatch.setattr(parser, "build_parser", lambda: pytest.fail("built again, not read back"))
    cached = parser._parser()
    assert cached is not built
    with pytest.raises(LinnetError, match="`then` is a keyword"):  # read back with its lexer's callbacks
        parser.parse("arch m\nconfig {\n  then: int\n}\n")
    for path in SOURCES:
        source = path.read_text()
        assert spans(cached.parse(source)) == spans(built.parse(source)), path.name
    broken = SOURCES[0].read_text().replace("]", "", 1)  # a bracket left open: the same error at the same place
    errors = []
    for p in (built, cached):
        with pytest.raises(lark.exceptions.UnexpectedInput) as err:
            p.parse(broken)
        errors.append((type(err.value), err.value.line, err.value.column, sorted(err.value.expected)))
    assert errors[0] == errors[1]


def test_an_unreadable_cache_entry_is_built_again(own_cache):
    parser._parser()
    (entry,) = own_cache.iterdir()
    entry.write_bytes(b"not a parser")
    parser._parser.cache_clear()
    assert parser._parser().parse(SOURCES[0].read_text())
    assert entry.read_bytes() != b"not a parser"  # and written again whole


def test_a_cache_that_cannot_be_written_still_parses(own_cache, monkeypatch):
    (own_cache.parent / "a-file").write_text("")  # a folder beneath a file cannot be made, even by root
    monkeypatch.setenv("LINNET_CACHE", str(own_cache.parent / "a-file" / "cache"))
    assert parser._parser().parse(SOURCES[0].read_text())


def test_without_a_home_for_the_cache_the_parser_is_built(own_cache, no_home):
    assert parser._parser().parse(SOURCES[0].read_text())
