"""The IR verifier: checks the module's invariants (it does not re-derive op types).

Every name read is bound (a local before its use, a param, state or fn that
exists), every op is known, params are tensors, a tie names a param, and a
body with a result ends in `return`. The frontend builds IR that holds them;
the verifier guards passes and hand-built IR against breaking them, failing
at the source location of what breaks one (tests/compiler/test_verify.py).
"""

from __future__ import annotations

from linnet.errors import LinnetError
from linnet.ir import nodes as ir
from linnet.ir.ops import OPS
from linnet.ir.types import NoneType, TensorType
from linnet.ir.walk import values

_STRUCTURAL = {"call", "list", "if", "dim_expr", "list_item"}


def verify(module: ir.Module) -> None:
    for p in module.params.values():
        if not isinstance(p.type, TensorType):
            raise LinnetError(p.loc, f"param `{p.name}` must be a tensor")
        if p.tie and p.tie[0] not in module.params:
            raise LinnetError(p.loc, f"param `{p.name}` is tied to unknown `{p.tie[0]}`")
    for fn in list(module.fns.values()) + list(module.entries.values()):
        _block(module, fn, fn.body, set(n for n, _ in fn.args))
        if not isinstance(fn.ret, NoneType) and not (fn.body and isinstance(fn.body[-1], ir.Return)):
            raise LinnetError(fn.loc, f"`{fn.name}` does not end with return")


def _block(module, fn, body, defined: set):
    for s in body:
        if isinstance(s, ir.For):
            _values(module, s.count, defined)
            _block(module, fn, s.body, defined | {s.var})
            continue
        for v in ([s.value] + (list(s.indices) if isinstance(s, ir.Store) else [])):
            _values(module, v, defined)
        if isinstance(s, ir.Store) and s.state not in module.state:
            raise LinnetError(s.loc, f"store into unknown state `{s.state}`")
        if isinstance(s, ir.Assign):
            defined.update(s.targets)


def _values(module, root, defined):
    for v in values(root):
        if isinstance(v, ir.Var):
            if v.kind in ("local", "arg", "loop") and v.name not in defined:
                raise LinnetError(v.loc, f"`{v.name}` is used before it is defined")
            if v.kind == "param" and v.name not in module.params:
                raise LinnetError(v.loc, f"unknown param `{v.name}`")
            if v.kind == "state" and v.name not in module.state:
                raise LinnetError(v.loc, f"unknown state `{v.name}`")
        elif isinstance(v, ir.Op):
            if v.op not in OPS and v.op not in _STRUCTURAL:
                raise LinnetError(v.loc, f"unknown op `{v.op}`")
            if v.op == "call" and v.attrs.get("fn") not in module.fns:
                raise LinnetError(v.loc, f"call of unknown fn `{v.attrs.get('fn')}`")
