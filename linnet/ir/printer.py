"""The IR as text: what `linnet ir FILE` prints."""

from __future__ import annotations

import os

from linnet.ir import nodes as ir
from linnet.ir.types import NoneType
from linnet.pyemit import dim_py


def print_module(module: ir.Module) -> str:
    out = [f"module {module.name}" + (f"  # card {module.card}" if module.card else "")]
    if module.config:
        out.append("config:")
        for name, c in module.config.items():
            value = module.config_values.get(name)
            shown = f" = {value!r}" if value is not None else (f" = {_v(c.default)}" if c.default is not None else "")
            out.append(f"  {name}: {c.type}{shown}")
    out.append("params:")
    for p in module.params.values():
        srcs = "; ".join(f"{s.format} {s.pattern!r}" + "".join(f" .{t}({', '.join(dim_py(a) for a in args)})" for t, args in s.transforms)
                         for s in p.sources)
        tie = f" = {p.tie[0]} if {_v(p.tie[1])}" if p.tie else ""
        loop = f"  (stacked over {', '.join(p.loops)})" if p.loops else ""
        out.append(f"  {p.name}: {p.type}{tie}{loop}" + (f"  <- {srcs}" if srcs else ""))
    out.append("state:")
    for s in module.state.values():
        out.append(f"  {s.name}: {s.type}")
    for fn in list(module.fns.values()) + list(module.entries.values()):
        dims = f"<{', '.join(fn.dims)}>" if fn.dims else ""
        args = ", ".join(f"{n}: {t}" for n, t in fn.args)
        ret = "" if isinstance(fn.ret, NoneType) else f" -> {fn.ret}"
        out.append(f"{fn.kind} {fn.name}{dims}({args}){ret}  # {_where(fn.loc)}")
        _body(fn.body, out, 1)
    return "\n".join(out) + "\n"


def _where(loc) -> str:
    return f"{os.path.basename(loc.path)}:{loc.line}"


def _body(body, out, depth):
    pad = "  " * depth
    for s in body:
        if isinstance(s, ir.Assign):
            out.append(f"{pad}{', '.join(s.targets)} = {_v(s.value)} : {s.value.type}  # {_where(s.loc)}")
        elif isinstance(s, ir.Store):
            idx = f"[{', '.join(_v(i) for i in s.indices)}]" if s.indices else ""
            out.append(f"{pad}{s.state}{idx} <- {_v(s.value)}  # {_where(s.loc)}")
        elif isinstance(s, ir.For):
            out.append(f"{pad}for {s.var} in {_v(s.count)}:  # {_where(s.loc)}")
            _body(s.body, out, depth + 1)
        elif isinstance(s, ir.Return):
            out.append(f"{pad}return {_v(s.value)} : {s.value.type}  # {_where(s.loc)}")


def _v(v) -> str:
    if isinstance(v, ir.Const):
        return repr(v.value)
    if isinstance(v, ir.Var):
        return v.name
    if isinstance(v, ir.Slice):
        return f"{_v(v.start) if v.start else ''}:{_v(v.stop) if v.stop else ''}"
    if v.op == "list_comp":  # a list config's default
        return f"[{_v(v.kwargs['item'])} for {v.attrs['var']} in {_v(v.kwargs['count'])}]"
    if v.op in ("list_item", "index"):  # as the source writes it: `wq[l]`, not `index(l, x=wq)`
        return f"{_v(v.kwargs['x'])}[{', '.join(_v(i) for i in v.args)}]"
    args = [_v(a) for a in v.args] + [f"{k}={_v(a)}" for k, a in v.kwargs.items()]
    if v.dims:
        args.append("dims=[" + ", ".join(dim_py(d) for d in v.dims) + "]")
    name = v.attrs.get("fn", v.op) if v.op == "call" else v.op
    return f"{name}({', '.join(args)})"
