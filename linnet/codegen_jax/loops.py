"""Which `for` loops of an entry the JAX backend may run as one XLA loop, and what they carry.

A layer loop unrolled in Python is traced and compiled once per layer: SmolLM2's 30 layers made
each packed-pass shape cost 1.6-1.9 s of XLA compilation on this CPU. Written as a function of
the layer index, `rt.loop` can hand it to `jax.lax.fori_loop`, compiled once. That needs the
index to be a traced value, so a loop qualifies only where it uses its index as the leading
index of a param or a state (`wq[l]`, `k_cache[l, rows, positions] = k`): never in arithmetic
that a static argument depends on (gpt-oss picks each layer's attention window by `l % 2`).
"""

from __future__ import annotations

from typing import NamedTuple

from linnet.ir import nodes as ir
from linnet.ir.types import TensorType
from linnet.ir.walk import all_statements, assigned_names, children, stmt_values, values


class CompiledLoop(NamedTuple):
    """A loop `rt.loop` may compile: the names its body carries from one turn to the next (and
    out), in a fixed order."""

    carried: tuple


def compiled_loop(loop: ir.For, fn: ir.Function, before: list, state: dict) -> CompiledLoop | None:
    """`loop`, a statement of `fn`'s top-level body after the statements `before`, as a
    `CompiledLoop`; None where it must stay a Python loop. `state`: {name: its type}.

    The checker has made sure that names made inside a loop stay there and that a name carried
    through it keeps its type; what is left to see is that every carry is a tensor (a number
    carried through an XLA loop would no longer be static)."""
    if not _index_only(loop):
        return None
    known = dict(state)
    known.update((name, t) for name, t in fn.args)
    for s in before:
        if isinstance(s, ir.Assign):
            for name in s.targets:
                known[name] = s.value.type if len(s.targets) == 1 else None
    written = assigned_names(loop.body) | {s.state for s in all_statements(loop.body) if isinstance(s, ir.Store)}
    carried = tuple(sorted(name for name in written if name in known))
    if not carried or not all(isinstance(known[name], TensorType) for name in carried):
        return None
    return CompiledLoop(carried)


def _index_only(loop: ir.For) -> bool:
    """Whether the loop's index appears only as the leading index of a param or a state."""
    def is_index(v) -> bool:
        return isinstance(v, ir.Var) and v.name == loop.var

    def indexes_by_layer(v) -> bool:  # `w[l, ...]`, `k_cache[l, ...]`
        return (isinstance(v, ir.Op) and v.op == "index" and is_index(v.args[0])
                and isinstance(v.kwargs.get("x"), ir.Var) and v.kwargs["x"].kind in ("param", "state"))

    for s in all_statements(loop.body):
        if isinstance(s, ir.Store) and any(is_index(i) for i in s.indices[1:]):
            return False
        for root in stmt_values(s):
            if is_index(root) and not (isinstance(s, ir.Store) and root is s.indices[0]):
                return False
            for v in values(root):
                uses = [c for c in children(v) if is_index(c)]
                if uses and not (indexes_by_layer(v) and uses == [v.args[0]]):
                    return False
    return True
