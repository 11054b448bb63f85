"""What only numbers can tell, reported where the source says it: negative slice bounds, indices
built from loop variables, run-time positions past a learned table (MaxSeq above its size), `topk` of fewer than one value, static ints too large to compute,
division by zero in a config default, negative dims in an entry's arguments; and what the
checker refuses before numbers (einsum specs, comparisons of unlike static values).

Each case is a real `.linnet` file (the doc's bigram, or the built-in Llama with the tiny-llama
card beside it), broken in one place; `linnet check` and `linnet compile --backend torch` must
both exit 1 with `path:line:col: error: message`, the line and a caret under the place.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from linnet.cli import main

CARDS = Path(__file__).resolve().parents[2] / "linnet" / "nest" / "cards"
LLAMA = (CARDS / "arch" / "llama.linnet").read_text()
TINY_LLAMA = (CARDS / "tiny-llama.linnet").read_text()

# The doc's first model ("A first model" in docs/language.md).
BIGRAM = """\
arch bigram

config {
  vocab: int = 256
  dim: int = 32
}

params {
  embed: T[vocab, dim]
    from hf "model.embed_tokens.weight"
  head: T[vocab, dim]
    from hf "lm_head.weight"
}

entry decode(tokens: i32[Batch], positions: i32[Batch]) -> f32[Batch, vocab] {
  x = embed[tokens]                  # T[Batch, dim]: one row per token
  return linear(x, head) as f32      # x @ head.T, as f32
}
"""


@dataclass(frozen=True)
class Case:
    id: str
    files: dict  # file name -> source; the first is the one checked and compiled
    at: str  # the file the error points into
    line_text: str  # a piece of the line the error points at
    token: str  # what the caret starts under, in that line
    message: str  # a substring of the error's first line
    note: str | None = None  # a substring of the notes

    def __str__(self) -> str:
        return self.id


def _edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def bigram(id: str, statement: str | None, token: str, message: str, note: str | None = None, *,
           config: str | None = None, source: str = BIGRAM, line_text: str | None = None) -> Case:
    """`source` with `statement` before its return, or `config` at the end of its config block."""
    text = source
    if statement is not None:
        text = _edit(text, "  return linear", f"  {statement}\n  return linear")
    if config is not None:
        text = _edit(text, "  dim: int = 32\n", f"  dim: int = 32\n  {config}\n")
    return Case(id, {"model.linnet": text}, "model.linnet", line_text or statement or config, token, message, note)


def llama(id: str, old: str, new: str, token: str, message: str, note: str | None = None, *,
          card: tuple = (), line_text: str | None = None) -> Case:
    """llama.linnet with `old` replaced by `new`, checked through the tiny-llama card beside it."""
    files = {"tiny-llama.linnet": _edit(TINY_LLAMA, *card) if card else TINY_LLAMA,
             "llama.linnet": _edit(LLAMA, old, new)}
    return Case(id, files, "llama.linnet", line_text or new, token, message, note)


# The bigram with a learned position table, as GPT-2 has (MaxSeq is 256 by default), and a fn that
# reads it at the positions it is given.
POSITIONED = _edit(_edit(BIGRAM, "  dim: int = 32\n", "  dim: int = 32\n  max_pos: int = 64\n"),
                   "  head: T[vocab, dim]", '  wpe: T[max_pos, dim]\n    from hf "wpe"\n  head: T[vocab, dim]') + """
fn placed<n>(x: T[n, dim], p: i32[n]) -> T[n, dim] {
  return x + take(wpe, p)
}
"""
RING = _edit(POSITIONED, "params {", "state {\n  ring: T[Batch, 8, dim]\n}\n\nparams {")


CASES = [
    # a slice bound below 0 does not count from the end (it used to pass, typed T[Batch, 1 + dim])
    bigram("slice-starting-below-0", "z = x[:, 0 - 1:]", "0 - 1",
           "a slice cannot start at -1: its bounds are dims, counted from 0", "write `dim - 1`"),
    bigram("slice-starting-at-a-negative-config-value", "z = x[:, off:]", "off:",
           "a slice cannot start at -4", config="off: int = 0 - 4"),
    bigram("slice-ending-below-0", "z = x[:, 0:0 - 2]", "0 - 2", "a slice cannot end at -2"),
    # an index built from a loop variable, over the loop's range (layers = 2 in the card)
    llama("layer-index-past-the-last-layer", "attn_norm[l]", "attn_norm[l + 1]", "l + 1",
          "index 2 is out of range for a dim of size 2", "when `l` = 1"),
    llama("layer-index-below-the-first-layer", "attn_norm[l]", "attn_norm[l - 3]", "l - 3",
          "index -3 is out of range for a dim of size 2", "when `l` = 0"),
    llama("layer-index-through-a-fn-argument", "q = rotate(query_heads(h, l), positions)",
          "q = rotate(query_heads(h, l + 1), positions)", "l]", "index 2 is out of range for a dim of size 2",
          "when `l` = 2, as `query_heads` is called at", line_text="linear(h, wq[l])"),
    # of an `if` whose condition is known, the branch it takes is checked (a static division in it was
    # not, and raised as the model ran) and the other is not (below)
    llama("layer-index-in-the-branch-an-if-takes", "attn_norm[l]", "(if l == 1 then attn_norm[l + 1] else attn_norm[l])",
          "l + 1", "index 2 is out of range for a dim of size 2", "when `l` = 1"),
    llama("division-by-zero-in-the-branch-an-if-takes", "attn_norm[l]",
          "(if l == 0 then attn_norm[l] else attn_norm[l] * (1 / (l - 1)))", "1 / (l - 1)",
          "cannot evaluate 1 / 0"),
    # a run-time index the entries contract bounds (decode's positions: 0 to MaxSeq - 1) past a table
    bigram("learned-positions-past-the-table", "x = x + wpe[positions]", "positions",
           "this index reaches 255, past the end of a dim of size 64", "bind MaxSeq to at most 64", source=POSITIONED),
    bigram("learned-positions-with-an-offset", "x = x + wpe[positions + 2]", "positions + 2",
           "this index reaches 257, past the end of a dim of size 64", "bind MaxSeq to at most 62", source=POSITIONED),
    bigram("learned-positions-through-a-fn", "x = placed(x, positions)", "p)",
           "this index reaches 255, past the end of a dim of size 64", "in fn `placed`, as called at",
           source=POSITIONED, line_text="take(wpe, p)"),
    bigram("a-store-past-a-ring-of-positions", "ring[iota(Batch), positions] = x", "positions]",
           "this index reaches 255, past the end of a dim of size 8", "`ring` is T[Batch, 8, dim]", source=RING),
    # topk of fewer than one value
    bigram("topk-of-a-negative-count", "v, i = topk(x, 0 - 1)", "topk",
           "`topk` must take at least 1 value, not -1"),
    bigram("topk-of-no-value", "v, i = topk(x, 0)", "topk", "`topk` must take at least 1 value, not 0"),
    # einsum specs
    bigram("einsum-output-letter-repeated", 'z = einsum("bd,vd->bb", x, head)', '"bd',
           "output index `b` appears twice in `bb`"),
    bigram("einsum-output-letter-in-no-operand", 'z = einsum("bd,vd->bz", x, head)', '"bd',
           "output index `z` appears in no operand"),
    bigram("einsum-with-two-arrows", 'z = einsum("bd,vd->bv->b", x, head)', '"bd',
           "the output `bv->b` of an einsum spec must be letters"),
    bigram("einsum-with-too-few-specs", 'z = einsum("bd->bd", x, head)', "einsum",
           "the spec names 1 operands but 2 were given"),
    # comparisons of static values of unlike kinds, and orders of strings
    bigram("comparing-a-string-with-an-int", 'b = "a" < 3', '"a"', "cannot compare str and int"),
    bigram("ordering-strings", 'b = "a" < "b"', '"a"', "cannot order str values with `<`: only == and != compare them"),
    bigram("comparing-a-bool-with-an-int", None, "true",
           "cannot compare bool and int", config="big: bool = true == 1"),
    # static ints too large, division by zero
    bigram("an-int-past-64-bits", None, "2 ** 70", "2 ** 70 is too large for a static int",
           config="big: int = 2 ** 70"),
    llama("division-by-zero-in-a-default", "sliding_window: int = 0 ", "sliding_window: int = dim / 0 ",
          "dim / 0", "cannot evaluate 64 / 0: integer division or modulo by zero"),
    llama("division-by-a-card-value-of-zero", "head_dim: int = dim / heads", "head_dim: int = dim / heads",
          "dim / heads", "cannot evaluate 64 / 0: integer division or modulo by zero", "`heads` is 0",
          card=("heads = 4", "heads = 0")),
    # a card's value that breaks an architecture's default: the error is in the architecture, the notes say
    # where the card sets what it read
    llama("a-card-value-a-default-divides-with-a-remainder", "head_dim: int = dim / heads",
          "head_dim: int = dim / heads", "dim / heads", "30 / 4 is not a whole number",
          "`dim` = 30, set at ", card=("dim = 64", "dim = 30")),
    # a card's value an op of the architecture refuses: the note says where the card sets it
    llama("a-card-value-an-op-refuses", "window=sliding_window)", "window=sliding_window)", "sliding_window)",
          "window of `attention` must be at least 0", "`sliding_window` is -4, set at ",
          card=("ffn = 96", "ffn = 96\n  sliding_window = -4")),
    bigram("a-product-past-64-bits", "z = 2 ** 40 * 2 ** 40", "2 ** 40",
           "1099511627776 * 1099511627776 is too large for a static int", "less than 2 ** 63"),
    # a list config's item past its end, read by a default; a dim that divides with a remainder
    bigram("list-item-past-its-end-in-a-default", None, "2]",
           "index 2 is out of range for `adds`, a list of 2 (bool[2])",
           config="adds: bool[2] = [true, false]\n  last: bool = adds[2]", line_text="last: bool = adds[2]"),
    bigram("dim-divided-with-a-remainder", "z = zeros(Batch, dim / 3)", "zeros",
           "this value: dim / 3 is not a whole number (32 / 3)"),
    # a negative dim in an entry's argument that nothing reads
    bigram("negative-dim-in-an-entry-argument", None, "i32[0 - 2]",
           "argument `positions` of entry `decode`: dim -2 is negative",
           source=_edit(BIGRAM, "positions: i32[Batch]", "positions: i32[0 - 2]"), line_text="entry decode("),
]


def _write(case: Case, tmp_path: Path) -> tuple[Path, Path]:
    for name, text in case.files.items():
        (tmp_path / name).write_text(text)
    return tmp_path / next(iter(case.files)), tmp_path / case.at


def _assert_rendered(err: str, case: Case, at: Path):
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) >= 3, err
    source = at.read_text().split("\n")
    line = next(i for i, text in enumerate(source, 1) if case.line_text in text)
    col = source[line - 1].index(case.token) + 1
    assert lines[0].startswith(f"{at}:{line}:{col}: error: "), err
    assert case.message in lines[0], err
    assert lines[1] == "    " + source[line - 1].rstrip(), err
    assert set(lines[2].strip()) == {"^"} and lines[2].index("^") == 4 + col - 1, err
    if case.note:
        assert any(case.note in note for note in lines[3:]), err
    assert all(note.count(", set at ") <= 1 for note in lines[3:]), err  # where the card sets a value: said once


def test_the_ids_are_unique_and_the_bases_valid(tmp_path, capsys):
    assert len({c.id for c in CASES}) == len(CASES)
    (tmp_path / "bigram.linnet").write_text(BIGRAM)
    (tmp_path / "llama.linnet").write_text(LLAMA)
    (tmp_path / "tiny-llama.linnet").write_text(TINY_LLAMA)
    for name in ("bigram.linnet", "tiny-llama.linnet"):
        assert main(["check", str(tmp_path / name)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{tmp_path / 'bigram.linnet'}: ok (2 params, 1 entry)",  # (it said "1 entries")
                   f"{tmp_path / 'tiny-llama.linnet'}: ok (12 params, 3 entries)"]


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("command", ["check", "compile"])
def test_error(case: Case, command: str, tmp_path, capsys):
    assert_refused(case, command, tmp_path, capsys)


def assert_refused(case: Case, command: str, tmp_path, capsys):
    """`linnet check` or `linnet compile` of the case's first file exits 1 with its error rendered."""
    target, at = _write(case, tmp_path)
    argv = [command, str(target)] + (["--backend", "torch"] if command == "compile" else [])
    status = main(argv)
    captured = capsys.readouterr()
    assert status == 1, captured.err
    _assert_rendered(captured.err, case, at)


def test_a_huge_power_is_refused_at_once(tmp_path):
    """`10 ** 10 ** 10` is refused before Python computes it (it would take hours): in a
    subprocess, so that a regression fails on its timeout instead of hanging the suite."""
    case = llama("an-int-too-large-to-compute", "sliding_window: int = 0 ", "sliding_window: int = 10 ** 10 ** 10 ",
                 "10 ** 10 ** 10", "10 ** 10000000000 is too large for a static int", "less than 2 ** 63")
    target, at = _write(case, tmp_path)
    proc = subprocess.run([sys.executable, "-m", "linnet.cli", "check", str(target)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    _assert_rendered(proc.stderr, case, at)


@pytest.mark.parametrize("statement", [
    "z = x[:, dim - 1:]",  # the last column, counted from the end as a dim
    "z = embed[0 - 256]",  # negative ints count from the end: the first row
    "z = x[:, 0:0]",
    "v, i = topk(x, dim)",
    'b = "a" == "b" and true != false and 1 < 2.5',
    'z = einsum("bd,vd->vb", x, head)',
    "z = embed[2 ** 8 - 1]",
])
def test_valid_statements_still_check_and_compile(statement: str, tmp_path, capsys):
    path = tmp_path / "model.linnet"
    path.write_text(_edit(BIGRAM, "  return linear", f"  {statement}\n  return linear"))
    assert main(["check", str(path)]) == 0, capsys.readouterr().err
    assert main(["compile", str(path), "--backend", "torch", "-o", str(tmp_path / "out.py")]) == 0, \
        capsys.readouterr().err


@pytest.mark.parametrize("statement, source, generics", [
    ("x = x + wpe[positions]", POSITIONED, ["--generic", "MaxSeq=64"]),  # the table's size
    ("x = x + wpe[positions + 2]", POSITIONED, ["--generic", "MaxSeq=62"]),
    ("x = placed(x, positions % max_pos)", POSITIONED, []),
    ("x = x + wpe[minimum(positions, max_pos - 1)]", POSITIONED, []),
    ("x = x + wpe[iota(Batch)]", POSITIONED, ["--generic", "Batch=64"]),
    ("ring[iota(Batch), positions % 8] = x", RING, []),
    ("x = x + wpe[tokens]", POSITIONED, []),  # a token's range is no part of the contract
])
def test_run_time_indices_inside_their_dims_still_check(statement, source, generics, tmp_path, capsys):
    """Positions held inside a learned table or a ring of positions by MaxSeq, an offset, `%` or
    `minimum` check and compile; where nothing bounds an index, nothing is claimed."""
    path = tmp_path / "model.linnet"
    path.write_text(_edit(source, "  return linear", f"  {statement}\n  return linear"))
    assert main(["check", str(path), *generics]) == 0, capsys.readouterr().err
    assert main(["compile", str(path), *generics, "-o", str(tmp_path / "out.py")]) == 0, capsys.readouterr().err
    with_one_more = {"MaxSeq=64": "MaxSeq=65", "MaxSeq=62": "MaxSeq=63", "Batch=64": "Batch=65"}
    if generics:  # one more position (or row) than the table holds is refused
        assert main(["check", str(path), "--generic", with_one_more[generics[1]]]) == 1
        assert "past the end of a dim of size 64" in capsys.readouterr().err


@pytest.mark.parametrize("index", ["attn_norm[layers - 1 - l]", "attn_norm[l - layers]",
                                   "attn_norm[if l == 0 then 0 else l - 3]",
                                   "(if l == 0 then attn_norm[l + 1] else attn_norm[l - 1])",
                                   "(if l == 1 then attn_norm[l] else attn_norm[l] * (1 / (l - 1)))"])
def test_layer_indices_inside_the_range_still_check(index: str, tmp_path, capsys):
    """Indices from a loop variable that stay inside the dim for every value: reversed, counted from
    the end, chosen per layer (-2 is the first of 2 layers); in the branch of an `if` each layer takes,
    whatever the branch it does not take would compute (a dense first layer's weights read at 0 only)."""
    (tmp_path / "llama.linnet").write_text(_edit(LLAMA, "attn_norm[l]", index))
    (tmp_path / "tiny-llama.linnet").write_text(TINY_LLAMA)
    assert main(["check", str(tmp_path / "tiny-llama.linnet")]) == 0, capsys.readouterr().err
