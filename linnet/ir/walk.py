"""Generic traversal and rebuilding of IR values and statements."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterator

from linnet.ir import nodes as ir


def children(v: ir.Value) -> list:
    if isinstance(v, ir.Op):
        return list(v.args) + list(v.kwargs.values())
    if isinstance(v, ir.Slice):
        return [x for x in (v.start, v.stop) if x is not None]
    return []


def values(v: ir.Value) -> Iterator[ir.Value]:
    """Every value in the tree under `v`, `v` included."""
    stack = [v]
    while stack:
        x = stack.pop()
        yield x
        stack.extend(children(x))


def stmt_values(s) -> list:
    if isinstance(s, ir.Assign):
        return [s.value]
    if isinstance(s, ir.Store):
        return list(s.indices) + [s.value]
    if isinstance(s, ir.Return):
        return [s.value]
    if isinstance(s, ir.For):
        return [s.count]
    return []


def all_statements(body: list) -> Iterator:
    """Every statement of `body`, those inside loops too, each before its loop's body."""
    for s in body:
        yield s
        if isinstance(s, ir.For):
            yield from all_statements(s.body)


def all_values(body: list) -> Iterator[ir.Value]:
    for s in all_statements(body):
        for v in stmt_values(s):
            yield from values(v)


def reached(fns: dict, functions: list) -> Iterator:
    """`functions` and every fn they call, directly or through other fns (`fns`: name -> Function), each once."""
    seen, todo = set(), list(functions)
    while todo:
        f = todo.pop()
        yield f
        for v in all_values(f.body):
            if isinstance(v, ir.Op) and v.op == "call" and v.attrs["fn"] not in seen:
                seen.add(v.attrs["fn"])
                todo.append(fns[v.attrs["fn"]])


def written_state(body: list, state: dict, moved: bool = True) -> set:
    """The state buffers `body` writes: stored into (`cache[l, rows] = k`) or replaced whole
    (`cache = copy_rows(cache, ...)`; with `moved` False, a write of `copy_rows`, which only moves
    what the buffer holds, is left out)."""
    out = set()
    for s in all_statements(body):
        if not moved and isinstance(s, (ir.Assign, ir.Store)) and isinstance(s.value, ir.Op) and \
                s.value.op == "copy_rows":
            continue
        if isinstance(s, ir.Store):
            out.add(s.state)
        elif isinstance(s, ir.Assign):
            out.update(t for t in s.targets if t in state)
    return out


def rebuild(v: ir.Value, fn: Callable[[ir.Value], ir.Value | None]) -> ir.Value:
    """Bottom-up copy of `v`; `fn` may replace any rebuilt node (returning None keeps it)."""
    if isinstance(v, ir.Op):
        new = replace(v, args=[rebuild(a, fn) for a in v.args],
                      kwargs={k: rebuild(a, fn) for k, a in v.kwargs.items()})
    elif isinstance(v, ir.Slice):
        new = replace(v, start=rebuild(v.start, fn) if v.start is not None else None,
                      stop=rebuild(v.stop, fn) if v.stop is not None else None)
    else:
        new = replace(v)
    out = fn(new)
    return new if out is None else out


def assigned_names(body: list) -> set:
    out = set()
    for s in body:
        if isinstance(s, ir.Assign):
            out.update(s.targets)
        elif isinstance(s, ir.For):
            out.add(s.var)
            out |= assigned_names(s.body)
    return out


def reads_state(v: ir.Value) -> bool:
    return any(isinstance(x, ir.Var) and x.kind == "state" for x in values(v))
