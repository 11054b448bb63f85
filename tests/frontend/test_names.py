"""A name the checker accepts compiles and runs on both backends, whatever the generated code calls
its own things; a name it refuses is refused at its declaration, saying why.

Every reserved word, every name of the generated modules and model classes, and the names the
code generators make up (a JAX loop's body function and its carry, rope tables, the locals of an
inlined fn) are declared in every role a name can have: config value, param, state buffer, fn,
entry, argument, size, local and loop variable.
"""

from __future__ import annotations

import keyword
import re

import numpy as np
import pytest
import torch

from linnet.cli import main
from linnet.compiler import generate, import_source
from linnet.errors import LinnetError
from linnet.frontend import load_source, parser
from linnet.frontend.scope import JAX_ATTRIBUTES, RESERVED, TORCH_ATTRIBUTES

# names the code generators make up for themselves, which must dodge the model's
MADE_UP = {"loop_l", "loop_l_1", "carry", "carry_1", "rope_0", "ROPE_0", "rope_1", "N", "K", "PARAMS_"}
# the locals an inlined fn makes (`keep` below): its argument and its own local, and their next names;
# declared where only a local can be (a module-level `kept` would clash with `keep`'s argument)
INLINED = {"kept", "kept_1", "half", "half_1"}
LOCAL_ROLES = ("arg", "size", "local", "loop")
PYTHON_SPECIAL = {"__init__", "__getattr__", "__class__", "__name__"}
NAMES = sorted(RESERVED | TORCH_ATTRIBUTES | JAX_ATTRIBUTES | MADE_UP | PYTHON_SPECIAL
               | parser._KEYWORDS | {"Batch", "MaxSeq", "T", "f32", "i32", "bool"})
ROLES = ("config", "param", "state", "fn", "entry", "arg", "size", "local", "loop")

X = np.array([1.0, 2.0, 3.0, 4.0], np.float32)


def source(role: str, names: list) -> tuple[str, float]:
    """An architecture declaring each of `names` in `role`, and what its entries add to x.

    The entry `f` (or each entry, for that role) returns x plus a number the names contribute,
    rotated at position 0 (which changes nothing, and makes a rope table) and run through a loop
    that JAX compiles (so that its body function and carry are named)."""
    config, params, state, fns, sizes, args, body = [], [], [], [], [], [], []
    added = 0.0
    for i, n in enumerate(names):
        if role == "config":
            config.append(f"  {n}: int = 2")
            body.append(f"  y = y + {n}")
            added += 2
        elif role == "param":
            params.append(f"  {n}: f32[dim]\n    from hf \"p{i}\"")
            body.append(f"  y = y + {n}")
            added += 1  # weights of ones
        elif role == "state":
            state.append(f"  {n}: f32[dim]")
            body.append(f"  {n} = {n} + 3.0")
            body.append(f"  y = y + {n}")
            added += 3
        elif role == "fn":
            fns.append(f"fn {n}(a: f32[dim]) -> f32[dim] {{\n  b = a + 1.0\n  return b * 1.0\n}}")
            body.append(f"  y = {n}(y)")
            added += 1
        elif role == "arg":
            args.append(f"{n}: f32[dim]")
            body.append(f"  y = y + {n}")
            added += 1  # called with ones
        elif role == "size":
            sizes.append(n)
            args.append(f"z{i}: f32[{n}]")
            body.append(f"  y = y + {n} + z{i}.sum()")
            added += 2 + 2  # called with two ones
        elif role == "local":
            body.append(f"  {n} = y + 1.0")
            body.append(f"  y = {n}")
            added += 1
        elif role == "loop":
            body.append(f"  for {n} in 2 {{\n    y = y + w[0]\n  }}")
            added += 2
    head = "arch names\n\nconfig {\n  dim: int = 4\n" + "\n".join(config) + "\n}\n\n"
    head += "params {\n  w: f32[2, dim]\n    from hf \"w\"\n" + "\n".join(params) + "\n}\n\n"
    head += "state {\n  s: f32[dim]\n" + "\n".join(state) + "\n}\n\n" + "\n\n".join(fns) + "\n\n"
    # inlined, `keep` makes locals for its argument (read twice) and its own `b`
    head += "fn keep(kept: f32[dim]) -> f32[dim] {\n  half = kept * 0.5\n  return half + kept * 0.5\n}\n\n"
    tail = ("  y = keep(y + 0.0)\n  for l in 2 {\n    y = y + w[l] - w[l]\n  }\n"
            "  return rope(y.reshape(1, 1, dim), iota(1), theta=10000.0).reshape(dim)\n}\n")
    if role == "entry":
        entries = [f"entry {n}(x: f32[dim]) -> f32[dim] {{\n  y = x + 1.0\n{tail}" for n in names]
        return head + "\n".join(entries), 1.0
    sig = f"entry f{'<' + ', '.join(sizes) + '>' if sizes else ''}({', '.join(['x: f32[dim]'] + args)}) -> f32[dim]"
    return head + f"{sig} {{\n  y = x\n" + "\n".join(body) + "\n" + tail, added


def declared_at(text: str, name: str, role: str) -> int:
    """The line that declares `name` in `role` in `text`."""
    pattern = {"fn": rf"^fn {name}\(", "entry": rf"^entry {name}\(", "loop": rf"for {name} in",
               "local": rf"^  {name} = ", "size": r"^entry f<", "arg": r"^entry f"}.get(role, rf"^  {name}:")
    return next(i for i, line in enumerate(text.splitlines(), 1) if re.search(pattern, line))


def run(text: str, entries: list, backend: str, role: str, count: int) -> list:
    module = load_source(text, "names.linnet")
    m = import_source(generate(module, backend, {"Batch": 1, "MaxSeq": 4}))
    weights = {p: np.ones(tuple(int(d) for d in m.PARAMS[p][0]), np.float32) for p in m.PARAMS if p not in m.TIED}
    model = m.Model(weights if backend == "jax" else {k: torch.from_numpy(v) for k, v in weights.items()})
    extra = [np.ones(4, np.float32)] * count if role == "arg" else [np.ones(2, np.float32)] * count if role == "size" else []
    return [np.asarray(getattr(model, e)(X, *extra)) for e in entries]


@pytest.mark.parametrize("role", ROLES)
def test_each_name_is_refused_clearly_or_works(role, tmp_path, capsys):
    accepted = []
    for name in NAMES + (sorted(INLINED) if role in LOCAL_ROLES else []):
        text, _ = source(role, [name])
        try:
            load_source(text, "names.linnet")
        except LinnetError as err:
            first = str(err).splitlines()[0]
            assert re.match(rf"names\.linnet:{declared_at(text, name, role)}:\d+: error: ", first), first
            # it says why, naming the name (a word of the language may just not parse there: `for: f32[dim]`)
            assert f"`{name}`" in first or name in parser._KEYWORDS, first
            continue
        accepted.append(name)
    # what must be refused is
    refused = set(NAMES) - set(accepted)
    assert {n for n in NAMES if keyword.iskeyword(n) or n in parser._KEYWORDS} <= refused
    assert RESERVED <= refused and {"Batch", "MaxSeq", "T", "f32"} <= refused
    if role in ("param", "state", "entry"):
        assert TORCH_ATTRIBUTES <= refused
    if role == "entry":
        assert JAX_ATTRIBUTES <= refused
    assert MADE_UP <= set(accepted) and (role not in LOCAL_ROLES or INLINED <= set(accepted))
    # ... and the rest run on both backends, all in one architecture (one entry per name for entries)
    text, added = source(role, accepted)
    path = tmp_path / "names.linnet"
    path.write_text(text)
    for command in (["check", str(path)], ["compile", str(path), "--backend", "torch"]):
        assert main(command) == 0, capsys.readouterr().err
    capsys.readouterr()
    entries = accepted if role == "entry" else ["f"]
    for backend in ("torch", "jax"):
        for got in run(text, entries, backend, role, len(accepted)):
            np.testing.assert_allclose(got, X + added, rtol=1e-6, err_msg=f"{role} on {backend}")


def test_the_attribute_lists_cover_the_model_classes():
    """TORCH_ATTRIBUTES and JAX_ATTRIBUTES name everything a generated model holds besides its
    params, state, entries and rope tables: its class's attributes and what its constructor sets."""
    text, _ = source("config", [])
    module = load_source(text, "names.linnet")
    for backend, listed in (("torch", TORCH_ATTRIBUTES), ("jax", JAX_ATTRIBUTES)):
        m = import_source(generate(module, backend, {"Batch": 1, "MaxSeq": 4}))
        model = m.Model({"w": np.ones((2, 4), np.float32)})
        own = {n for n in dir(type(model)) if not (n.startswith("__") and n.endswith("__"))} | set(vars(model))
        own -= {"w", "s", "f", "rope_0"}
        assert own <= listed, sorted(own - listed)
