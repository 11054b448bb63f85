"""Fuzzing the frontend: a mutated model is either accepted or refused with a `LinnetError`.

The valid sources (the Llama architecture, every card, and every other
built-in architecture through the tiny card that imports it) are mutated at the
token level: a token deleted, duplicated, swapped with the next one, or
replaced by another token of the same file. Whatever comes out, parsing,
checking and specializing it (and, when that succeeds, writing the code of
both backends, which must compile as Python) must end in success or in a
`LinnetError` rendered as `path:line:col: error: ...`: never in any other exception.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import linnet
from linnet.compiler import generate
from linnet.errors import LinnetError
from linnet.frontend import load_source
from linnet.ir.specialize import specialize

CARDS = Path(linnet.__file__).parent / "nest" / "cards"
ARCH = CARDS / "arch" / "llama.linnet"
SOURCES = [ARCH] + sorted(CARDS.glob("*.linnet"))

# The tokens of the language, roughly as the lexer sees them; comments and
# whitespace stay with the token that follows them.
_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"'
                    r"|\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+(?:[eE][+-]?\d+)?"
                    r"|[A-Za-z_]\w*|->|\*\*|//|==|!=|<=|>=|[^\s#]")
_GAP = re.compile(r"(?:\s|#[^\n]*)*")


def split_tokens(text: str) -> tuple[list[list[str]], str]:
    """[[gap before, token], ...] and the text after the last token; joining them gives `text` back."""
    out, pos = [], 0
    while True:
        gap = _GAP.match(text, pos).end()
        m = _TOKEN.match(text, gap)
        if m is None:
            return out, text[pos:]
        out.append([text[pos:gap], m.group()])
        pos = m.end()


def join_tokens(tokens: list[list[str]], tail: str) -> str:
    return "".join(gap + tok for gap, tok in tokens) + tail


def test_split_and_join_give_the_source_back():
    for path in SOURCES:
        text = path.read_text()
        tokens, tail = split_tokens(text)
        assert len(tokens) > 20
        assert join_tokens(tokens, tail) == text


def _kind(tok: str) -> str:
    if tok[0].isalpha() or tok[0] == "_":
        return "name"
    if tok[0].isdigit() or (tok[0] == "." and len(tok) > 1):
        return "number"
    return "string" if tok[0] == '"' else "punctuation"


@st.composite
def mutations(draw, text: str) -> str:
    tokens, tail = split_tokens(text)
    vocabulary = sorted({tok for _, tok in tokens})
    by_kind: dict = {}
    for tok in vocabulary:
        by_kind.setdefault(_kind(tok), []).append(tok)
    for _ in range(draw(st.integers(1, 3))):
        if not tokens:
            break
        kind = draw(st.sampled_from(["delete", "duplicate", "swap", "replace"]))
        i = draw(st.integers(0, len(tokens) - 1))
        if kind == "delete":
            del tokens[i]
        elif kind == "duplicate":
            tokens.insert(i + 1, [" ", tokens[i][1]])
        elif kind == "swap" and i + 1 < len(tokens):
            tokens[i][1], tokens[i + 1][1] = tokens[i + 1][1], tokens[i][1]
        elif draw(st.booleans()):  # any token of the file
            tokens[i][1] = draw(st.sampled_from(vocabulary))
        else:  # a token of the same kind: more of these get past the parser
            tokens[i][1] = draw(st.sampled_from(by_kind[_kind(tokens[i][1])]))
    return join_tokens(tokens, tail)


# A mutated architecture is checked alone, then as this card imports it, so
# that specialization and code generation see it with numbers for its config.
ARCH_CARD = CARDS / "tiny-llama.linnet"


def check_source(text: str, path: Path, workdir: Path):
    """Parse, check and specialize with the default generics, then write both backends' code."""
    if path == ARCH:
        arch = workdir / ARCH.name
        arch.write_text(text)
        load_source(text, str(arch))
        module = load_source(ARCH_CARD.read_text(), str(ARCH_CARD), near=workdir)
    else:
        module = load_source(text, str(path), near=path.parent)
    specialize(module)
    for backend in ("torch", "jax"):
        compile(generate(module, backend), f"<{backend} code>", "exec")  # and the code is Python


def _error_start(paths) -> re.Pattern:
    names = "|".join(re.escape(str(p)) for p in paths)
    return re.compile(rf"^(?:{names}):[1-9]\d*:[1-9]\d*: error: \S")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_the_sources_are_valid(path, workdir):
    check_source(path.read_text(), path, workdir)


def _accepted_or_refused(text: str, path: Path, workdir: Path):
    # a card's error may lie in the architecture it imports (a default its values break)
    start = _error_start({path, ARCH, ARCH_CARD, workdir / ARCH.name, *CARDS.glob("arch/*.linnet")})
    try:
        check_source(text, path, workdir)
    except LinnetError as err:
        rendered = err.render()
        assert start.match(rendered), f"badly rendered error:\n{rendered}\n--- for source:\n{text}"
    # any other exception fails the test, with the source hypothesis drew


_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# The architecture has twenty times the tokens of a card, so it gets more examples. A card is a few lines
# of config over an architecture fuzzed on its own (here and below), and the cards share a few forms, so
# each card gets fifty.
@settings(max_examples=400, **_SETTINGS)
@given(data=st.data())
def test_mutated_architecture_is_accepted_or_refused_with_a_location(workdir, data):
    _accepted_or_refused(data.draw(mutations(ARCH.read_text()), label="source"), ARCH, workdir)


@pytest.mark.parametrize("path", SOURCES[1:], ids=lambda p: p.name)
@settings(max_examples=50, **_SETTINGS)
@given(data=st.data())
def test_mutated_card_is_accepted_or_refused_with_a_location(path, workdir, data):
    _accepted_or_refused(data.draw(mutations(path.read_text()), label="source"), path, workdir)


# Every other built-in architecture a tiny card imports, mutated in a folder that holds copies of all
# of them (its bases are looked for beside it), and checked through that card.
_IMPORT = re.compile(r"^import (\w+)$", re.M)
TINY_CARD_OF = {CARDS / "arch" / f"{_IMPORT.search(card.read_text())[1]}.linnet": card
                for card in sorted(CARDS.glob("tiny-*.linnet"))}
OTHER_ARCHS = sorted(path for path in TINY_CARD_OF if path != ARCH)


@pytest.fixture(scope="module")
def arch_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("archs")
    for path in CARDS.glob("arch/*.linnet"):
        (folder / path.name).write_text(path.read_text())
    return folder


def test_every_architecture_but_llamas_has_its_tiny_card():
    assert len(OTHER_ARCHS) >= 9 and all(p.exists() for p in OTHER_ARCHS)


@pytest.mark.parametrize("path", OTHER_ARCHS, ids=lambda p: p.name)
@settings(max_examples=60, **_SETTINGS)
@given(data=st.data())
def test_mutated_other_architecture_is_accepted_or_refused_with_a_location(path, arch_dir, data):
    text = data.draw(mutations(path.read_text()), label="source")
    card = TINY_CARD_OF[path]
    start = _error_start({card, *arch_dir.glob("*.linnet")})
    (arch_dir / path.name).write_text(text)
    try:
        module = load_source(card.read_text(), str(card), near=arch_dir)
        specialize(module)
        for backend in ("torch", "jax"):
            compile(generate(module, backend), f"<{backend} code>", "exec")
    except LinnetError as err:
        assert start.match(err.render()), f"badly rendered error:\n{err.render()}\n--- for source:\n{text}"
    finally:
        (arch_dir / path.name).write_text(path.read_text())
