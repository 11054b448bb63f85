"""List-valued config (`bool[layers]`, `int[layers]`, `float[layers]`): declared with a length,
given by a card as a list or made by a default item by item, read one item at a static int.

Errors are real `.linnet` files broken in one place (`linnet check` and `linnet compile` both exit 1
with `path:line:col: error:`, the line, a caret); the values a card or a default gives are
compared with Python's own list of them; the compiled code is run on both backends against
numpy computing the same layers.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_specialize_checks import LLAMA, TINY_LLAMA, Case, _edit, assert_refused

from linnet.cli import main
from linnet.compiler import BACKENDS, build, check_file
from linnet.ir.specialize import specialize

# Three layers, each its own kind: whether it adds or subtracts its update (`adds`, made item by item),
# how much it scales that update (`scales`, floats given as ints too) and a factor of the
# subtracted one (`factors`).
LISTS = """\
arch lists

config {
  vocab: int = 16
  dim: int = 8
  layers: int = 3
  every: int = 2
  adds: bool[layers] = [l % every == 0 for l in layers]
  factors: int[layers] = [3, 1, 2]
  scales: float[layers] = [1, 0.5, 2]
}

params {
  embed: T[vocab, dim]
    from hf "embed.weight"
  for l in layers {
    w: T[dim, dim]
      from hf "layers.{l}.weight"
  }
}

fn update<n>(x: T[n, dim], l: int) -> T[n, dim] {
  scale = scales[l]
  return linear(x, w[l]) * scale
}

entry decode(tokens: i32[Batch], positions: i32[Batch]) -> f32[Batch, vocab] {
  x = embed[tokens]
  for l in layers {
    y = update(x, l)
    x = if adds[l] then x + y else x - y * factors[l]
  }
  return linear(x, embed) as f32
}
"""

CARD = """\
card "three-lists"
import lists

config {
  layers = 3
}
"""


def arch(id: str, old: str, new: str, token: str, message: str, note: str | None = None, *,
         line_text: str | None = None) -> Case:
    return Case(id, {"lists.linnet": _edit(LISTS, old, new)}, "lists.linnet", line_text or new, token, message, note)


def card(id: str, line: str, token: str, message: str, note: str | None = None, *, at: str = "card.linnet",
         line_text: str | None = None) -> Case:
    """The card with `line` in its config, checked against the architecture beside it."""
    files = {"card.linnet": _edit(CARD, "  layers = 3\n", f"  {line}\n"), "lists.linnet": LISTS}
    return Case(id, files, at, line_text or line, token, message, note)


CASES = [
    # a card's list: its length is the declared one, its items of the declared kind
    card("a-card-list-too-short", "layers = 3\n  factors = [1, 2]", "[1, 2]",
         "`factors` is int[layers]: it needs 3 items (layers = 3), not 2", line_text="factors ="),
    card("a-card-list-too-long", "layers = 3\n  adds = [true, false, true, true]", "[true",
         "`adds` is bool[layers]: it needs 3 items (layers = 3), not 4", line_text="adds ="),
    card("a-card-list-item-of-another-kind", "factors = [1, 2, 2.5]", "2.5",
         "item 2 of `factors` is 2.5, but `factors` is int[layers], a list of int values"),
    card("a-card-bool-list-given-ints", "adds = [1, 0, 1]", "1,",
         "item 0 of `adds` is 1, but `adds` is bool[layers], a list of bool values"),
    card("a-card-list-nested", "factors = [[1], 2, 3]", "[1]", "item 0 of `factors` is [1]"),
    card("a-card-scalar-for-a-list", "factors = 3", "3", "`factors` is int[layers], a list, but is set to 3",
         "write one item for each of its layers"),
    card("a-card-list-for-a-scalar", "every = [2]", "[2]", "`every` is int, but is set to [2]"),
    # a default's list, with the card's numbers: the literal's length follows no card's `layers`
    card("a-default-list-of-the-wrong-length", "layers = 4", "[3, 1, 2]",
         "`factors` is int[layers]: it needs 4 items (layers = 4), not 3", at="lists.linnet",
         line_text="factors: int[layers]"),
    # the declaration: one length, of config values and numbers, a kind of static scalar
    arch("a-list-of-two-lengths", "factors: int[layers]", "factors: int[layers, 2]", "int[",
         "a list config has one length, as in `int[layers]`, not 2"),
    arch("a-list-as-long-as-a-generic", "factors: int[layers]", "factors: int[Batch]", "Batch",
         "a list config's length is built from numbers and config values, not `Batch`"),
    arch("a-list-of-an-unknown-kind", "factors: int[layers]", "factors: i32[layers]", "i32",
         "unknown config type `i32`; one of int, float, bool, str", "a list of them takes its length in brackets"),
    arch("a-default-item-of-another-kind", "[3, 1, 2]", "[3, true, 2]", "true",
         "an item of an int[layers] list must be a static int, not bool"),
    arch("a-made-item-of-another-kind", "[l % every == 0 for l in layers]", "[l % every for l in layers]",
         "l % every", "an item of a bool[layers] list must be a static bool, not int"),
    arch("a-list-default-that-is-no-list", "[3, 1, 2]", "3", "3",
         "the default of an int[layers] list is a list", line_text="factors: int[layers] = 3"),
    arch("a-list-made-item-by-item-in-a-body", "x = embed[tokens]", "x = embed[tokens] * [1.0 for l in 3][0]",
         "[1.0", "a list made item by item (`[x for l in n]`) is only a list config's default"),
    # reading it: one item, at a static int inside the list
    arch("a-list-read-whole", "scale = scales[l]", "scale = scales", "scales",
         "`scales` is a list (float[layers]): read one item at a static int, `scales[l]`"),
    arch("a-list-sliced", "scale = scales[l]", "scale = scales[0:2]", "scales[",
         "`scales` is a list (float[layers]): it is read one item at a time"),
    arch("a-list-indexed-by-a-tensor", "then x + y", "then x + y * factors[tokens]", "tokens",
         "`factors` (int[layers]) is indexed by a static int, not i32[Batch]",
         "known only as the model runs"),
    arch("a-list-indexed-past-its-end", "adds[l]", "adds[l + 1]", "l + 1",
         "index 3 is out of range for a list of 3", "when `l` = 2"),
    arch("a-list-indexed-past-its-end-through-a-fn", "update(x, l)", "update(x, l + 2)", "l]",
         "index 3 is out of range for a list of 3", "as `update` is called at",
         line_text="scale = scales[l]"),
]


# Llama with a window for each layer, read from a list at the loop variable (tiny-llama has 2 layers)
WINDOWED = _edit(_edit(LLAMA, "  sliding_window: int = 0 ", "  windows: int[layers] = [0 for l in layers]\n"
                                                         "  sliding_window: int = 0 "),
                 "window=sliding_window)", "window=windows[l])")
CASES.append(Case("a-window-from-a-list-below-0",
                  {"tiny-llama.linnet": _edit(TINY_LLAMA, "  layers = 2\n", "  layers = 2\n  windows = [4, -1]\n"),
                   "llama.linnet": WINDOWED}, "llama.linnet", "window=windows[l])", "windows[l]",
                  "window of `attention` must be at least 0", "when `l` = 1"))


def test_a_window_for_each_layer_checks_and_compiles(tmp_path, capsys):
    """Windows of 0 and above, one a layer, read from a list as `attention`'s static window."""
    (tmp_path / "llama.linnet").write_text(WINDOWED)
    (tmp_path / "tiny-llama.linnet").write_text(_edit(TINY_LLAMA, "  layers = 2\n", "  layers = 2\n  windows = [3, 0]\n"))
    for backend in BACKENDS:
        assert main(["compile", str(tmp_path / "tiny-llama.linnet"), "--backend", backend,
                     "-o", str(tmp_path / f"{backend}.py")]) == 0, capsys.readouterr().err
        source = (tmp_path / f"{backend}.py").read_text()
        assert "windows = [3, 0]" in source and "window=windows[l]" in source


def test_a_list_of_strings_is_compared_item_by_item(tmp_path, capsys):
    """`str[layers]`, as transformers' `layer_types` is: an item compares with `==` in a static `if`, and a
    card's item of another kind is refused at it."""
    kinds = _edit(_edit(LISTS, "  scales: float[layers] = [1, 0.5, 2]\n",
                        '  scales: float[layers] = [1, 0.5, 2]\n  kinds: str[layers] = ["add", "sub", "add"]\n'),
                  "if adds[l] then", 'if kinds[l] == "add" then')
    (tmp_path / "lists.linnet").write_text(kinds)
    assert main(["compile", str(tmp_path / "lists.linnet"), "--backend", "torch", "-o", str(tmp_path / "out.py")]) == 0
    assert "kinds = ['add', 'sub', 'add']" in (tmp_path / "out.py").read_text()
    (tmp_path / "card.linnet").write_text(_edit(CARD, "  layers = 3\n", '  kinds = ["add", 1, "sub"]\n'))
    assert main(["check", str(tmp_path / "card.linnet")]) == 1
    assert "item 1 of `kinds` is 1, but `kinds` is str[layers], a list of str values" in capsys.readouterr().err


def test_the_ids_are_unique_and_the_bases_check(tmp_path, capsys):
    assert len({c.id for c in CASES}) == len(CASES)
    (tmp_path / "lists.linnet").write_text(LISTS)
    (tmp_path / "card.linnet").write_text(CARD)
    for name in ("lists.linnet", "card.linnet"):
        assert main(["check", str(tmp_path / name)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("command", ["check", "compile"])
def test_error(case: Case, command: str, tmp_path, capsys):
    assert_refused(case, command, tmp_path, capsys)


def _card_module(tmp_path, lines: list):
    (tmp_path / "lists.linnet").write_text(LISTS)
    (tmp_path / "card.linnet").write_text(_edit(CARD, "  layers = 3\n", "".join(f"  {x}\n" for x in lines)))
    return check_file(tmp_path / "card.linnet")


def _spelled(items: list) -> str:
    return "[" + ", ".join(("true" if x else "false") if isinstance(x, bool) else repr(x) for x in items) + "]"


@settings(max_examples=25, deadline=None)
@given(layers=st.integers(1, 12), every=st.integers(1, 13), data=st.data())
def test_a_cards_lists_and_a_made_default_are_pythons(tmp_path_factory, layers, every, data):
    """Any length: the card's lists are the bindings, item for item (its ints as floats where the list is
    float's); the default made item by item is Python's list comprehension of the same expression."""
    factors = data.draw(st.lists(st.integers(-5, 5), min_size=layers, max_size=layers))
    scales = data.draw(st.lists(st.integers(-3, 3) | st.floats(-4, 4, allow_nan=False), min_size=layers,
                                max_size=layers))
    module = _card_module(tmp_path_factory.mktemp("lists"), [f"layers = {layers}", f"every = {every}",
                                                             f"factors = {_spelled(factors)}",
                                                             f"scales = {_spelled(scales)}"])
    b = specialize(module).bindings
    assert b["factors"] == factors and all(isinstance(x, int) for x in b["factors"])
    assert b["scales"] == [float(x) for x in scales] and all(isinstance(x, float) for x in b["scales"])
    assert b["adds"] == [i % every == 0 for i in range(layers)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_layer_computes_with_its_own_items(backend, tmp_path):
    """The compiled decode, on both backends, against numpy running the layers with the card's lists."""
    adds, factors, scales = [False, True, True, False], [2, -1, 3, 1], [0.5, 2.0, 1.0, -1.5]
    module = _card_module(tmp_path, ["layers = 4", f"adds = {_spelled(adds)}", f"factors = {_spelled(factors)}",
                                     f"scales = {_spelled(scales)}"])
    rng = np.random.default_rng(3)
    embed = rng.standard_normal((16, 8)).astype(np.float32)
    w = rng.standard_normal((4, 8, 8)).astype(np.float32) / 8 ** 0.5
    tokens = np.array([3, 11], dtype=np.int32)
    x = embed[tokens].astype(np.float64)
    for l in range(4):
        y = x @ w[l].T.astype(np.float64) * scales[l]
        x = x + y if adds[l] else x - y * factors[l]
    want = x @ embed.T.astype(np.float64)

    generated = build(module, backend, {"Batch": 2})
    if backend == "torch":
        import torch

        model = generated.Model({"embed": torch.tensor(embed), "w": torch.tensor(w)})
        got = model.decode(torch.tensor(tokens), torch.zeros(2, dtype=torch.int32)).numpy()
    else:
        import jax.numpy as jnp

        model = generated.Model({"embed": jnp.asarray(embed), "w": jnp.asarray(w)})
        got = np.asarray(model.decode(jnp.asarray(tokens), jnp.zeros(2, dtype=jnp.int32)))
    assert np.abs(got - want).max() / np.abs(want).max() <= 1e-5
    assert (generated.adds, generated.factors, generated.scales) == (adds, factors, scales)  # the module's lists
