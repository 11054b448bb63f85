"""The values run-time integer indices take, and the check that each stays inside what it indexes.

A static index is checked with its numbers (`specialize._check_static_indices`); an integer
tensor is known only as the model runs, but the entries contract bounds some: `prefill`'s and
`decode`'s positions are cache positions (0 to MaxSeq - 1), prefill's rows and `iota(n)` lie
in 0 to n - 1. Followed through locals, fn calls and static arithmetic (`positions + 2`,
`positions % window`), such a range is held against the dim it gathers from or stores into:
a learned position table `wpe: T[max_pos, dim]` read at `wpe[positions]` with MaxSeq above
max_pos would raise in torch and read a clamped row in JAX, so it is an error at the index.
"""

from __future__ import annotations

from dataclasses import dataclass

from linnet.errors import LinnetError, Loc
from linnet.ir import nodes as ir
from linnet.ir.types import ScalarType, TensorType, is_int
from linnet.ir.walk import assigned_names, stmt_values, values as tree_values

# The contract's arguments that hold cache positions and cache rows: {entry: {argument index: generic}}
BOUNDED_ARGUMENTS = {"prefill": {1: "MaxSeq", 2: "Batch"}, "decode": {1: "MaxSeq"}}
_MEANING = {"MaxSeq": "a position in a cache row", "Batch": "a cache row"}


@dataclass(frozen=True)
class Range:
    """lo <= every element <= hi; `why` says where the bound comes from. `past_generic`: hi is
    that generic - 1 + `offset` (a position plus a constant), so a message can say which
    value of the generic fits."""

    lo: int
    hi: int
    why: str
    past_generic: str | None = None
    offset: int = 0

    def shifted(self, by: int) -> "Range":
        return Range(self.lo + by, self.hi + by, self.why, self.past_generic, self.offset + by)


def check_index_ranges(module: ir.Module, sizes: dict, static: dict, overrun=None) -> None:
    """Raises a `LinnetError` at an index whose known range runs past the dim it indexes; with
    `overrun`, calls `overrun(range, dim size)` at each such index instead (`position_ceiling`)."""
    seen = set()

    def visit(fn: ir.Function, ranges: dict, call: Loc | None) -> None:
        key = (fn.name, tuple(sorted((n, r.lo, r.hi) for n, r in ranges.items())))
        if key in seen:
            return
        seen.add(key)
        walk(fn.body, dict(ranges), fn, call)

    def walk(body: list, env: dict, fn: ir.Function, call: Loc | None) -> None:
        for s in body:
            if isinstance(s, ir.For):
                inner = dict(env)
                for name in assigned_names(s.body):  # carried from one iteration to the next: unknown
                    inner.pop(name, None)
                walk(s.body, inner, fn, call)
                for name in assigned_names(s.body):
                    env.pop(name, None)
                continue
            for top in stmt_values(s):
                for v in tree_values(top):
                    if isinstance(v, ir.Op) and v.op == "index":
                        _check(v.kwargs["x"], v.args, 0, env, sizes, static, fn, call, overrun)
                    elif isinstance(v, ir.Op) and v.op == "take":
                        axis = v.kwargs.get("axis")
                        at = axis.value if isinstance(axis, ir.Const) else 0
                        rank = v.kwargs["x"].type.rank
                        _check(v.kwargs["x"], [v.kwargs["indices"]], at % rank, env, sizes, static, fn, call,
                               overrun)
                    elif isinstance(v, ir.Op) and v.op == "call":
                        callee = module.fns[v.attrs["fn"]]
                        known = {}
                        for name, t in callee.args:
                            r = range_of(v.kwargs[name], env, sizes, static)
                            if isinstance(t, TensorType) and r is not None:
                                known[name] = r
                        visit(callee, known, call or v.loc)
            if isinstance(s, ir.Store):
                state = module.state[s.state]
                target = ir.Var(state.type, s.loc, s.state, "state")
                _check(target, s.indices, 0, env, sizes, static, fn, call, overrun)
            if isinstance(s, ir.Assign):
                r = range_of(s.value, env, sizes, static) if len(s.targets) == 1 else None
                for name in s.targets:
                    env.pop(name, None)
                if r is not None:
                    env[s.targets[0]] = r

    for fn in module.entries.values():
        ranges = {}
        for i, generic in BOUNDED_ARGUMENTS.get(fn.name, {}).items():
            if i < len(fn.args):
                name, t = fn.args[i]
                if isinstance(t, TensorType) and is_int(t.dtype) and t.rank == 1:
                    n = sizes[generic]
                    ranges[name] = Range(0, n - 1, f"`{name}` of entry `{fn.name}` is {_MEANING[generic]}, "
                                         f"0 to {generic} - 1 = {n - 1} (the entries contract)", generic)
        visit(fn, ranges, None)


def range_of(v: ir.Value, env: dict, sizes: dict, static: dict) -> Range | None:
    """The range of an integer tensor's elements where it is known; None where it is not."""
    from linnet.ir.specialize import evaluate  # (specialize imports this module)

    def number(x: ir.Value):
        if isinstance(x.type, ScalarType) and x.type.kind == "int":
            try:
                return evaluate(x, static)
            except LinnetError:  # a fn's int argument, known per call: no range here
                return None
        return None

    if isinstance(v, ir.Var) and v.kind in ("arg", "local"):
        return env.get(v.name)
    if not isinstance(v, ir.Op):
        return None
    k = v.kwargs
    if v.op == "iota":
        try:
            n = v.dims[0].evaluate(sizes)
        except KeyError:  # a per-call size
            return None
        return Range(0, n - 1, f"`iota({v.dims[0]})` is 0 to {n - 1}")
    if v.op == "cast" and isinstance(v.type, TensorType) and is_int(v.type.dtype):
        return range_of(k["x"], env, sizes, static)
    if v.op in ("add", "sub"):
        a, b = range_of(k["a"], env, sizes, static), number(k["b"])
        if v.op == "add" and a is None:  # 2 + positions
            a, b = range_of(k["b"], env, sizes, static), number(k["a"])
        if a is None or b is None:
            return None
        return a.shifted(b if v.op == "add" else -b)
    if v.op == "mod":
        a, m = range_of(k["a"], env, sizes, static), number(k["b"])
        if a is None or m is None or m <= 0 or a.lo < 0:
            return None
        return a if a.hi < m else Range(0, m - 1, f"{a.why}, taken modulo {m}")
    if v.op in ("minimum", "maximum"):
        a, b = range_of(k["a"], env, sizes, static), number(k["b"])
        if a is None or b is None:
            return None
        if v.op == "minimum":
            return a if a.hi <= b else Range(min(a.lo, b), b, f"{a.why}, at most {b}")
        if a.lo >= b:
            return a
        if a.hi >= b:  # (the top, and what it follows from, stay a's)
            return Range(b, a.hi, a.why, a.past_generic, a.offset)
        return Range(b, b, f"{a.why}, at least {b}")
    return None


def position_ceiling(module: ir.Module, sizes: dict, static: dict) -> int | None:
    """The largest MaxSeq the run-time positions' indices allow: a learned position table's rows, less
    the offset it is read at (`wpe[positions + 2]`: 2 fewer); None where only the cache bounds them.
    Found by following positions of an unbounded MaxSeq: an index past a dim that does not grow
    with it is such a table."""
    unbounded = 1 << 40
    ceilings = []

    def overrun(r: Range, n: int) -> None:
        if r.past_generic == "MaxSeq" and n < unbounded // 2:
            ceilings.append(n - r.offset)

    check_index_ranges(module, {**sizes, "MaxSeq": unbounded}, {**static, "MaxSeq": unbounded}, overrun)
    return min(ceilings) if ceilings else None


def _check(x: ir.Value, indices: list, first: int, env: dict, sizes: dict, static: dict,
           fn: ir.Function, call: Loc | None, overrun=None) -> None:
    t = x.type
    if not isinstance(t, TensorType):
        return
    for axis, ix in enumerate(indices, start=first):
        if isinstance(ix, ir.Slice) or not isinstance(ix.type, TensorType) or axis >= t.rank:
            continue
        r = range_of(ix, env, sizes, static)
        try:
            n = t.shape[axis].evaluate(sizes)
        except KeyError:  # a per-call size
            continue
        if r is None or r.hi < n:
            continue
        if overrun is not None:
            overrun(r, n)
            continue
        d = t.shape[axis]
        named = f"`{x.name}`" if isinstance(x, ir.Var) else "the value indexed"
        size = str(n) if d.is_const() else f"{d} = {n}"
        notes = [r.why, f"{named} is {t}: its dim {axis} has {size} entries"]
        if fn.kind == "fn" and call is not None:
            notes.append(f"in fn `{fn.name}`, as called at {call}")
        if r.past_generic is not None and str(d) in _FLAG and str(d) != r.past_generic:
            # (a position where a row goes, say: binding MaxSeq below Batch is no fix)
            notes.append(f"dim {axis} counts {d}, not {r.past_generic}: are the indices in the order of "
                         f"{named}'s dims?")
        elif r.past_generic is not None:
            most = n - r.offset
            if most >= 1:
                notes.append(f"bind {r.past_generic} to at most {most} (`--generic {r.past_generic}={most}`; "
                             f"`linnet generate` and `linnet serve`: {_FLAG[r.past_generic]} {most}), "
                             f"or give {named} more entries")
        raise LinnetError(ix.loc, f"this index reaches {r.hi}, past the end of a dim of size {n}", notes)


_FLAG = {"MaxSeq": "--max-seq", "Batch": "--batch"}
