"""The grammar itself: Lark's strict mode proves no two terminals can match the same text (the
parser Linnet builds at run time skips that proof, which costs most of its build)."""

from pathlib import Path

import pytest

import linnet
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
        assert strict.parse(source) == plain.parse(source), path.name
