"""Warnings: source that compiles but loads or allocates something it never uses. A param no entry reads, a
state buffer no entry touches, or one read but never stored into, is named where it is declared, with a caret,
as errors are, and the model still compiles."""

from __future__ import annotations

import glob
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import linnet
from linnet.errors import LinnetWarning
from linnet.frontend.load import load_file

ARCH = """\
arch mini

config {
  vocab: int
  dim: int
  tie: bool = true
}

params {
  embed: T[vocab, dim]
    from hf "embed.weight"
  w_in: T[dim, dim]
    from hf "w_in.weight"
  w_spare: T[dim, dim]
    from hf "w_spare.weight"
  head: T[vocab, dim] = embed if tie
    from hf "head.weight"
}

fn project(x: T[Batch, dim]) -> T[Batch, dim] {
  return linear(x, w_in)
}

fn unused(x: T[Batch, dim]) -> T[Batch, dim] {
  return linear(x, w_spare)
}

entry decode(tokens: i32[Batch]) -> T[Batch, vocab] {
  return linear(project(head[tokens]), head)
}
"""

CARD = 'card "mini-card"\nimport mini\n\nconfig {\n  vocab = 16\n  dim = 8\n}\n'


def _unread(path: Path) -> list[LinnetWarning]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        load_file(path)
    return [w.message for w in seen if issubclass(w.category, LinnetWarning)]


def test_a_param_read_by_no_entry_is_named_at_its_declaration(tmp_path):
    # `w_in` is read through a fn the entry calls, `embed` through the head tied to it; `w_spare` only by a fn
    # nothing calls
    path = tmp_path / "mini.linnet"
    path.write_text(ARCH)
    [w] = _unread(path)
    line = ARCH.splitlines().index("  w_spare: T[dim, dim]") + 1
    assert (w.loc.path, w.loc.line, w.loc.col) == (str(path), line, 3)
    assert w.message == "param `w_spare` is never read"
    assert "remove it, or use it where it was meant to be used" in w.notes


def test_the_command_line_prints_it_as_a_compiler_does_and_still_compiles(tmp_path):
    (tmp_path / "mini.linnet").write_text(ARCH)
    (tmp_path / "card.linnet").write_text(CARD)
    line = ARCH.splitlines().index("  w_spare: T[dim, dim]") + 1
    out = tmp_path / "mini.py"
    argv = [sys.executable, "-m", "linnet.cli", "compile", str(tmp_path / "card.linnet"), "--backend", "torch",
            "-o", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)  # Python's own warning filters
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr.splitlines()
    assert err[0] == f"{tmp_path / 'mini.linnet'}:{line}:3: warning: param `w_spare` is never read", proc.stderr
    assert err[1] == "    " + ARCH.splitlines()[line - 1].rstrip()
    assert err[2] == "      " + "^" * len("w_spare: T[dim, dim]")  # under the declaration
    assert len(err) == 5 and "Traceback" not in proc.stderr  # two notes, and nothing else
    assert "w_spare" in out.read_text()  # still a param of the model: warned, not refused


def test_reading_it_or_leaving_it_out_of_an_extension_silences_it(tmp_path):
    (tmp_path / "mini.linnet").write_text(ARCH)
    read = tmp_path / "read.linnet"
    read.write_text(ARCH.replace("linear(project(head[tokens]), head)", "linear(unused(project(head[tokens])), head)"))
    assert _unread(read) == []
    # an extension that replaces the entry so it stops reading `w_in` is told, at the base's line, how to drop it
    narrowed = tmp_path / "narrowed.linnet"
    narrowed.write_text("arch narrowed extends mini without unused, w_spare\n\n"
                        "entry decode(tokens: i32[Batch]) -> T[Batch, vocab] {\n"
                        "  return linear(head[tokens], head)\n}\n")
    [w] = _unread(narrowed)
    assert w.message == "param `w_in` is never read" and w.loc.path == str(tmp_path / "mini.linnet")
    assert "an extension leaves a base's param out with `extends ... without w_in`" in w.notes
    narrowed.write_text(narrowed.read_text().replace("without unused, w_spare", "without project, unused, w_in, "
                                                                                 "w_spare"))
    assert _unread(narrowed) == []


def test_no_built_in_card_or_example_loads_a_param_it_does_not_read():
    root = Path(linnet.__file__).parent
    files = sorted(glob.glob(str(root / "nest/cards/**/*.linnet"), recursive=True)
                   + glob.glob(str(root.parent / "examples/**/*.linnet"), recursive=True))
    assert len(files) > 30
    for path in files:
        assert _unread(Path(path)) == [], path


@pytest.mark.parametrize("tie", ["true", "false"])
def test_a_head_tied_either_way_reads_its_embedding(tmp_path, tie):
    path = tmp_path / "mini.linnet"
    path.write_text(ARCH.replace("tie: bool = true", f"tie: bool = {tie}")
                    .replace("linear(project(head[tokens]), head)", "linear(unused(project(embed[tokens])), head)"))
    assert _unread(path) == []


def test_a_state_buffer_no_entry_touches_is_named_and_one_only_written_is_not(tmp_path):
    path = tmp_path / "mini.linnet"
    with_state = ARCH.replace("fn project", "state {\n  seen: T[Batch, dim]\n  spare: T[Batch, MaxSeq, dim]\n}\n\n"
                                            "fn project")
    path.write_text(with_state.replace("  return linear(x, w_spare)", "  seen[iota(Batch)] = x\n  return x")
                    .replace("linear(project(head[tokens]), head)", "linear(unused(project(head[tokens])), head)"))
    warned = _unread(path)
    assert [w.message for w in warned] == ["param `w_spare` is never read", "state buffer `spare` is never used"]
    line = path.read_text().splitlines().index("  spare: T[Batch, MaxSeq, dim]") + 1
    assert (warned[1].loc.line, warned[1].loc.col) == (line, 3)
    assert warned[1].notes[0] == ("no entry reads or writes it, directly or through a fn it calls; it is allocated "
                                  "all the same")


def test_a_state_buffer_read_but_never_stored_into_is_named(tmp_path):
    # read by the entry and only moved by copy_rows: it holds zeros; a store into it silences the warning
    path = tmp_path / "mini.linnet"
    with_state = ARCH.replace("fn project", "state {\n  seen: T[1, Batch, MaxSeq, dim]\n}\n\nfn project").replace(
        "linear(project(head[tokens]), head)", "linear(unused(project(head[tokens])) + seen[0, iota(Batch), 0], head)") + (
        "\nentry copy_rows<K>(src: i32[K], dst: i32[K], upto: i32[K]) {\n"
        "  seen = copy_rows(seen, src, dst, upto)\n}\n")
    path.write_text(with_state)
    [w] = _unread(path)
    assert w.message == "state buffer `seen` is read but never written"
    assert (w.loc.line, w.loc.col) == (path.read_text().splitlines().index("  seen: T[1, Batch, MaxSeq, dim]") + 1, 3)
    # the copy inside a loop moves no more than outside one
    path.write_text(with_state.replace("  seen = copy_rows(seen, src, dst, upto)",
                                       "  for i in 2 {\n    seen = copy_rows(seen, src, dst, upto)\n  }"))
    assert [w.message for w in _unread(path)] == ["state buffer `seen` is read but never written"]
    path.write_text(with_state.replace("  return linear(x, w_spare)",
                                       "  seen[0, iota(Batch), 0] = x\n  return linear(x, w_spare)"))
    assert _unread(path) == []
