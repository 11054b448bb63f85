"""Which values of a torch entry must be copied because they share memory with the state.

In the language a local is the value it was bound to, and so is an entry's result; JAX's arrays
are values, so the JAX backend needs nothing of this. torch writes state in place, and
`keys = self.k_cache[0]` is a view: a later `rt.put_(self.k_cache, ...)` would change `keys`
under its name. So the torch backend copies (`.clone()`)

- a local bound to (a view of) a state buffer, where it may be read after a write to that state:
  only there, so the usual "write the cache, then read it" copies nothing;
- an entry's result that is (a view of) state, which the next call would change under the caller;
- a stored value that is a view of the very state it is stored into (the two could overlap).

A forward pass over the inlined entry finds them: each binding of a local that may view state is
followed to the reads of that local, noting whether a write to the state it views comes between.
Loops are followed round until nothing new is found.
"""

from __future__ import annotations

from typing import NamedTuple

from linnet.errors import LinnetError
from linnet.ir import nodes as ir
from linnet.ir.specialize import evaluate
from linnet.ir.types import TensorType
from linnet.ir.walk import stmt_values, values

_NONE: frozenset = frozenset()
# ops whose torch result may be (a view of) their input `x`: views, and `.to` of the same type,
# which returns the tensor itself
_VIEWS = ("reshape", "transpose", "unsqueeze", "cast")


class Copies(NamedTuple):
    """What the torch emitter copies: {(id of an Assign, target): the state it views}, {id of a
    Return}, {id of a Store}."""

    bindings: dict
    results: set
    stores: set


def state_copies(fn: ir.Function, bindings: dict) -> Copies:
    """The copies `fn` (an inlined entry) needs. `bindings`: the specialized config, for loop counts."""
    first = _Pass(bindings, cloned={})
    first.block(fn.body, frozenset())
    # again, knowing which bindings are copies: those view no state, for the results and stores
    second = _Pass(bindings, cloned=first.clones)
    second.block(fn.body, frozenset())
    return Copies(first.clones, second.results, second.stores)


class _Binding(NamedTuple):
    """A local's current binding that may view `states`; `crossed` once one of them was written since."""

    stmt: int
    name: str
    states: frozenset
    crossed: bool


class _Pass:
    def __init__(self, bindings: dict, cloned: dict):
        self.bindings = bindings
        self.cloned = cloned
        self.clones: dict = {}
        self.results: set = set()
        self.stores: set = set()

    def views(self, v: ir.Value, live: frozenset) -> frozenset:
        """The state buffers whose memory `v` may share in torch."""
        if isinstance(v, ir.Var):
            if v.kind == "state":
                return frozenset({v.name})
            if v.kind in ("local", "arg"):
                return frozenset().union(*(b.states for b in live if b.name == v.name))
            return _NONE
        if not isinstance(v, ir.Op):
            return _NONE
        if v.op == "index":  # ints and slices view; an index tensor gathers a copy
            if any(isinstance(i.type, TensorType) for i in v.args):
                return _NONE
            return self.views(v.kwargs["x"], live)
        if v.op in _VIEWS:
            return self.views(v.kwargs["x"], live)
        if v.op == "einsum" and len(v.args) == 1:  # a permutation of one operand is a view
            return self.views(v.args[0], live)
        if v.op == "if":
            return self.views(v.kwargs["then"], live) | self.views(v.kwargs["orelse"], live)
        return _NONE

    def read(self, stmt, live: frozenset):
        names = {x.name for v in stmt_values(stmt) for x in values(v) if isinstance(x, ir.Var)}
        for b in live:
            if b.crossed and b.name in names:
                key = (b.stmt, b.name)
                self.clones[key] = self.clones.get(key, _NONE) | b.states

    def block(self, body: list, live: frozenset) -> frozenset:
        for s in body:
            if isinstance(s, ir.Assign):
                self.read(s, live)
                if len(s.targets) == 1:
                    parts = [s.value]
                elif isinstance(s.value, ir.Op) and s.value.op == "list":
                    parts = list(s.value.args)
                else:
                    parts = [None] * len(s.targets)  # topk: new tensors
                made = {(t, self.views(p, live) if p is not None else _NONE) for t, p in zip(s.targets, parts)}
                live = frozenset(b for b in live if b.name not in s.targets)
                live |= {_Binding(id(s), t, states, False) for t, states in made
                         if states and (id(s), t) not in self.cloned}
            elif isinstance(s, ir.Store):
                self.read(s, live)
                if s.state in self.views(s.value, live):
                    self.stores.add(id(s))
                live = frozenset(b._replace(crossed=True) if s.state in b.states else b for b in live)
            elif isinstance(s, ir.Return):
                self.read(s, live)
                if self.views(s.value, live):
                    self.results.add(id(s))
            elif isinstance(s, ir.For):
                self.read(s, live)
                count = self.count(s)
                if count == 0:
                    continue
                head = live
                while True:  # round the loop until the bindings at its head are all known
                    out = self.block(s.body, head)
                    if out <= head:
                        break
                    head = head | out
                live = out if count is not None else live | out  # an unknown count may be 0
        return live

    def count(self, s: ir.For) -> int | None:
        try:
            return evaluate(s.count, self.bindings)
        except LinnetError:  # a per-call size, a loop variable
            return None
