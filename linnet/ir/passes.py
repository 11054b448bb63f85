"""IR passes: inlining of `fn` calls into entries.

Backends emit entries only, each as one straight-line function with its
loops, so a call to a `fn` is replaced by the fn's body. Arguments used once
and free of state reads are substituted in place; others (a bare state name
too: the body may write it, and an argument is the value it had at the call)
are bound to a name first, so the generated code still reads like the source.
"""

from __future__ import annotations

from dataclasses import replace

from linnet.frontend.scope import RESERVED
from linnet.ir import nodes as ir
from linnet.ir.dims import Dim
from linnet.ir.types import SIZE_GENERICS, TensorType, TupleType
from linnet.ir.walk import assigned_names, rebuild, reads_state, stmt_values, values


def inline_calls(module: ir.Module) -> ir.Module:
    entries = {name: _Inliner(module).entry(fn) for name, fn in module.entries.items()}
    return replace(module, entries=entries, fns={})


def substitute_type(t, sizes: dict):
    if isinstance(t, TensorType):
        return t.substitute(sizes)
    if isinstance(t, TupleType):
        return TupleType(tuple(substitute_type(x, sizes) for x in t.items))
    return t


class _Inliner:
    def __init__(self, module: ir.Module):
        self.module = module
        self.taken: set = set()

    def entry(self, fn: ir.Function) -> ir.Function:
        # A local made here must not hide a name the entry's generated code reads: its arguments
        # and sizes, module names (config values are the generated module's constants; JAX binds
        # the state as locals) and the names the code generators use.
        m = self.module
        self.taken = ({n for n, _ in fn.args} | set(fn.dims) | set(m.config) | set(m.params) | set(m.state)
                      | set(m.fns) | set(m.entries) | set(SIZE_GENERICS) | RESERVED)
        body = self.block(fn.body)
        return replace(fn, body=body)

    def block(self, stmts: list) -> list:
        out: list = []
        for s in stmts:
            if isinstance(s, ir.Assign):
                v = self.expr(s.value, out)
                out.append(replace(s, value=v))
                self.taken.update(s.targets)
            elif isinstance(s, ir.Store):
                indices = [self.expr(i, out) for i in s.indices]
                out.append(replace(s, indices=indices, value=self.expr(s.value, out)))
            elif isinstance(s, ir.Return):
                out.append(replace(s, value=self.expr(s.value, out)))
            elif isinstance(s, ir.For):
                self.taken.add(s.var)
                out.append(replace(s, body=self.block(s.body)))
        return out

    def expr(self, v: ir.Value, out: list) -> ir.Value:
        def visit(node):
            if isinstance(node, ir.Op) and node.op == "call":
                return self.call(node, out)
            return None

        return rebuild(v, visit)

    def call(self, call: ir.Op, out: list) -> ir.Value:
        fn = self.module.fns[call.attrs["fn"]]
        sizes = dict(zip(fn.dims, call.dims))
        uses = _use_counts(fn.body)
        reassigned = assigned_names(fn.body)
        bound: dict = {}
        renames: dict = {}
        for name, _ in fn.args:
            arg = call.kwargs[name]
            # Arguments are values: one that reads state (a bare state name too) is bound before the
            # body runs, which may write that state.
            direct = not reads_state(arg) and (isinstance(arg, ir.Var) or uses.get(name, 0) <= 1)
            if direct and name not in reassigned:
                bound[name] = arg
                continue
            # Evaluated once, into a local of its own (the callee may also reassign it).
            fresh = self.local_of(fn, name)
            self.taken.add(fresh)
            out.append(ir.Assign([fresh], arg, call.loc))  # (where the call binds it, whatever computes it)
            bound[name] = ir.Var(arg.type, arg.loc, fresh, "local")
            renames[name] = fresh
        for name in sorted(reassigned - set(bound)):
            renames[name] = self.local_of(fn, name)
            self.taken.add(renames[name])

        def subst(node):
            node.type = substitute_type(node.type, sizes)
            if isinstance(node, ir.Op) and node.dims:
                node.dims = tuple(d.substitute(sizes) for d in node.dims)
            if isinstance(node, ir.Slice):
                node.start_dim = node.start_dim.substitute(sizes) if node.start_dim is not None else None
                node.stop_dim = node.stop_dim.substitute(sizes) if node.stop_dim is not None else None
            if isinstance(node, ir.Var):
                if node.name in renames and node.kind in ("local", "loop", "arg"):
                    return replace(node, name=renames[node.name], kind="loop" if node.kind == "loop" else "local")
                if node.kind == "arg" and node.name in bound:
                    return rebuild(bound[node.name], lambda x: None)
                if node.kind == "dim" and node.name in sizes:
                    return _dim_value(sizes[node.name], node)
            return None

        stmts = _rename_body(fn.body, subst, renames)
        if len(stmts) > 1:  # the generated code says where an inlined body begins, and whose it is
            stmts[0] = replace(stmts[0], via=(fn.name, call.loc))
        out.extend(self.block(stmts[:-1]))
        result = self.expr(stmts[-1].value, out)
        if isinstance(result, ir.Op):
            return replace(result, returned_at=(stmts[-1].loc, *result.returned_at))
        return result

    def local_of(self, fn: ir.Function, name: str) -> str:
        """The local an inlined fn's argument or local `name` becomes: its own name, or where that is taken,
        named as whose it is (`rotate_x`, not `x_1`)."""
        return self.fresh(name if name not in self.taken else f"{fn.name}_{name}")

    def fresh(self, name: str) -> str:
        if name not in self.taken:
            return name
        i = 1
        while f"{name}_{i}" in self.taken:
            i += 1
        return f"{name}_{i}"


def _rename_body(body: list, subst, renames: dict) -> list:
    out = []
    for s in body:
        if isinstance(s, ir.Assign):
            out.append(ir.Assign([renames.get(t, t) for t in s.targets], rebuild(s.value, subst), s.loc))
        elif isinstance(s, ir.Store):
            out.append(ir.Store(s.state, [rebuild(i, subst) for i in s.indices], rebuild(s.value, subst), s.loc))
        elif isinstance(s, ir.Return):
            out.append(ir.Return(rebuild(s.value, subst), s.loc))
        elif isinstance(s, ir.For):
            out.append(ir.For(renames.get(s.var, s.var), rebuild(s.count, subst), _rename_body(s.body, subst, renames), s.loc))
    return out


def _dim_value(d: Dim, like: ir.Var) -> ir.Value:
    if d.is_const():
        return ir.Const(like.type, like.loc, d.value())
    names = d.names()
    if len(d.terms) == 1 and d.terms[0][1] == 1 and len(d.terms[0][0]) == 1 and d.terms[0][0][0][1] == 1:
        return ir.Var(like.type, like.loc, next(iter(names)), "dim")
    return ir.Op(like.type, like.loc, "dim_expr", [], {}, (d,))


def _use_counts(body: list, weight: int = 1, counts: dict | None = None) -> dict:
    """How often each name is read; a read inside a loop counts as many."""
    counts = {} if counts is None else counts
    for s in body:
        for v in stmt_values(s):
            for x in values(v):
                if isinstance(x, ir.Var):
                    counts[x.name] = counts.get(x.name, 0) + weight
        if isinstance(s, ir.For):
            _use_counts(s.body, 2, counts)
    return counts
