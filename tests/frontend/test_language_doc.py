"""docs/language.md stays true to the compiler: its examples check, its op table is the compiler's."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import linnet
from linnet.cli import main
from linnet.compiler import check_file, import_source
from linnet.frontend.scope import JAX_ATTRIBUTES, TORCH_ATTRIBUTES
from linnet.ir.ops import OPS

DOC = Path(__file__).resolve().parents[2] / "docs" / "language.md"
LLAMA = Path(linnet.__file__).parent / "nest" / "cards" / "arch" / "llama.linnet"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


def op_signature(name: str) -> str:
    """How the doc writes an op: its parameters, `=…` for the optional ones."""
    spec = OPS[name]
    params = inspect.signature(spec.infer).parameters
    out = []
    for p in spec.params:
        bare = p.lstrip("*")
        optional = (bare in params and params[bare].default is not inspect.Parameter.empty) \
            or (name == "zeros" and bare == "dtype")
        out.append(p if p.startswith("*") else f"{bare}=…" if optional else bare)
    return f"{name}({', '.join(out)})"


def test_every_op_is_documented_with_its_signature():
    table = DOC.read_text().split("<!-- ops:begin -->")[1].split("<!-- ops:end -->")[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    documented = [re.match(r"\| `([^`]*)`", r).group(1) for r in rows]
    expected = [op_signature(name) for name in OPS]
    assert documented == expected, "the op table must list OPS in order:\n" + "\n".join(expected)


@pytest.mark.parametrize("index", range(len(_blocks("linnet"))))
def test_examples_check_and_compile(index, tmp_path, capsys):
    source = _blocks("linnet")[index]
    path = tmp_path / "example.linnet"
    path.write_text(source)
    assert source.startswith(("arch ", "card ", "#"))
    assert main(["check", str(path)]) == 0, capsys.readouterr().err
    module = check_file(path)
    if not all(n in module.config_values or c.default is not None for n, c in module.config.items()):
        return  # an architecture that leaves config values to its cards: nothing to compile alone
    for backend in ("torch", "jax"):
        out = tmp_path / f"{backend}.py"
        assert main(["compile", str(path), "--backend", backend, "-o", str(out)]) == 0, capsys.readouterr().err
        # the written code imports: its every line is Python, and the module's own code runs
        generated = import_source(out.read_text())
        assert issubclass(generated.Model, object) and set(generated.PARAMS) == set(module.params)


def test_the_worked_example_quotes_llama_linnet():
    """Every line the walk-through quotes is in llama.linnet, in the same order; a block without
    `...` quotes a whole run of it, leaving out only comment lines (so no config value is missed)."""
    section = DOC.read_text().split("## Worked example: llama.linnet")[1].split("\n## ")[0]
    llama = [line.rstrip() for line in LLAMA.read_text().splitlines()]
    blocks = re.findall(r"^```\n(.*?)^```", section, flags=re.S | re.M)
    assert len(blocks) >= 6
    for block in blocks:
        at = 0
        lines = block.rstrip("\n").splitlines()
        for line in lines:
            if line.strip() == "...":
                continue
            assert line.rstrip() in llama[at:], f"not in llama.linnet (after line {at}): {line!r}"
            at = llama.index(line.rstrip(), at) + 1
        if "..." not in (line.strip() for line in lines):
            start = llama.index(lines[0].rstrip())
            code = [line for line in llama[start:] if not line.lstrip().startswith("#")]
            assert [line.rstrip() for line in lines] == code[:len(lines)], f"the block from {lines[0]!r} leaves lines out"


def test_the_error_example_is_the_compilers(tmp_path, capsys):
    """The example under Errors is what `linnet check` prints for the card it describes (heads = 4,
    kv_heads = 3), line number, quoted line, caret and note."""
    section = DOC.read_text().split("## Errors")[1].split("\n## ")[0]
    shown = re.search(r"^```\n(.*?)^```", section, flags=re.S | re.M).group(1).rstrip("\n").splitlines()
    card = tmp_path / "gqa.linnet"
    card.write_text('card "gqa"\nimport llama\nconfig {\n  vocab = 128\n  dim = 48\n  layers = 1\n  heads = 4\n'
                    '  kv_heads = 3\n  ffn = 64\n}\n')
    assert main(["check", str(card)]) == 1
    printed = capsys.readouterr().err.rstrip("\n").splitlines()
    assert printed[0].startswith(str(LLAMA) + ":")
    assert [printed[0].replace(str(LLAMA), LLAMA.name)] + [line.replace(str(card), card.name)
                                                          for line in printed[1:]] == shown


def test_the_open_bracket_example_is_the_compilers(tmp_path, capsys):
    """The second example under Errors, a `(` left open on line 21 at column 16 (a fn's arguments, as
    `fn rotate<n, h>(` opens them) and a `}` on line 22, is what `linnet check` prints for such a file."""
    section = DOC.read_text().split("## Errors")[1].split("\n## ")[0]
    shown = re.findall(r"^```\n(.*?)^```", section, flags=re.S | re.M)[1].rstrip("\n").splitlines()
    lines = ["arch model", "config {", "  vocab: int = 16", "  dim: int = 8", "}"] + [""] * 15
    path = tmp_path / "model.linnet"
    path.write_text("\n".join(lines + ["fn rotate<n, h>(x: T[n, h, dim]", "}"]) + "\n")
    assert main(["check", str(path)]) == 1
    printed = capsys.readouterr().err.rstrip("\n").replace(str(path), path.name).splitlines()
    assert printed == shown


def test_the_tour_runs_alike_on_both_backends(tmp_path):
    """The tour of the ops, as the page says: both backends run it and agree (random weights, exact)."""
    import numpy as np

    from linnet.compiler import generate, import_source
    from linnet.ir.specialize import specialize
    from linnet.nest.random_weights import random_weights

    section = DOC.read_text().split("## A tour of the ops")[1]
    path = tmp_path / "tour.linnet"
    path.write_text(re.search(r"```linnet\n(.*?)```", section, flags=re.S).group(1))
    module = check_file(path)
    generics = {"Batch": 3, "MaxSeq": 16}
    weights = random_weights(specialize(module, generics, "exact"), seed=4)
    tokens, positions = np.array([1, 7, 30], np.int32), np.array([0, 3, 9], np.int32)
    out = {}
    for backend in ("torch", "jax"):
        model = import_source(generate(module, backend, generics, "exact")).Model(dict(weights))
        out[backend] = np.asarray(model.decode(tokens, positions), dtype=np.float64)
    assert out["torch"].shape == (3, 32)
    np.testing.assert_allclose(out["jax"], out["torch"], rtol=1e-5, atol=1e-5 * np.abs(out["torch"]).max())


GAP_DIVISION = """arch halves
config {
  vocab: int = 16
  dim: int = 4
}
params {
  embed: T[vocab, dim]
    from hf "e"
}
fn halve<n>(x: T[n, dim]) -> T[n, dim] {
  return x * (n / 2)
}
entry prefill<N, K>(tokens: i32[N], positions: i32[N], rows: i32[N], last: i32[K]) -> f32[K, vocab] {
  x = embed[tokens]
  for l in 3 {
    x = halve(x)
  }
  return linear(x[last], embed) as f32
}
"""


def test_the_known_gap_of_static_division_is_the_compilers(tmp_path, capsys):
    """Known gaps: a static `int / int` whose value is known only as the entry runs (a per-call
    size, `n / 2`) rounds down as Python's `//`; one known when the model is specialized (the loop
    variable's `l / 2`) is an error there when it does not divide."""
    import torch

    from linnet.compiler import generate

    path = tmp_path / "halves.linnet"
    path.write_text(GAP_DIVISION)
    model = import_source(generate(check_file(path), "torch", {"Batch": 1, "MaxSeq": 8}, "exact")).Model(
        {"embed": torch.ones(16, 4)})
    tokens = torch.tensor([1, 2, 3], dtype=torch.int32)  # n = 3: n / 2 is 1, so x is never scaled
    logits = model.prefill(tokens, tokens, torch.zeros(3, dtype=torch.int32), torch.tensor([2], dtype=torch.int32))
    assert logits.tolist() == [[4.0] * 16]  # ones . ones over dim 4; unrounded, 1.5 ** 3 * 4 = 13.5

    path.write_text(GAP_DIVISION.replace("halve(x)", "x * (l / 2)"))
    assert main(["check", str(path)]) == 1
    assert "1 / 2 is not a whole number" in capsys.readouterr().err


def test_the_without_example_is_phi3_linnets_header():
    """The `without` the doc shows is phi3.linnet's, as it stands."""
    text = DOC.read_text()
    start = text.index("```\narch phi3 extends llama\n") + len("```\n")
    block = text[start:text.index("```", start)]
    assert block.count("\n") >= 4 and block in (LLAMA.parent / "phi3.linnet").read_text()


def test_the_model_attributes_named_are_scope_pys():
    """The doc's lists of the names a generated model holds (which a param, state buffer or entry
    cannot take) are scope.py's public ones, torch's and JAX's: a name added there is added here."""
    text = DOC.read_text()
    paragraph = text[text.index("- The generated model classes hold"):text.index("## Config")]
    torch_list = re.search(r"attribute of the torch model\s*\(`([^`]*)`", paragraph).group(1).split()
    jax_list = re.search(r"the JAX\s+model's `([^`]*)`", paragraph).group(1).split()
    public_torch = sorted(n for n in TORCH_ATTRIBUTES if not n.startswith("_") and n not in ("params", "state"))
    assert sorted(torch_list) == public_torch
    public_jax = sorted(n for n in JAX_ATTRIBUTES - TORCH_ATTRIBUTES if not n.startswith("_"))
    assert sorted(jax_list) == public_jax
