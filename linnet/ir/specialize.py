"""Numbers for the generics and the config: the step between a generic module and code.

`specialize(module, generics)` evaluates every config value (the card's, else
the default), binds `Batch`, `MaxSeq` and `T`, and checks what only numbers
can tell: every size positive, every division exact, heads a multiple of
kv_heads. The module's dims stay symbolic; codegen names them.
"""

from __future__ import annotations

from dataclasses import replace

from linnet.errors import LinnetError, Loc
from linnet.ir import nodes as ir
from linnet.ir.dims import Dim
from linnet.ir.ops import ROPE_SCALINGS
from linnet.ir.types import FLOAT_DTYPES, GENERIC_DTYPE, SIZE_GENERICS, TensorType
from linnet.ir.walk import all_values

DEFAULT_GENERICS = {"Batch": 1, "MaxSeq": 256, "T": "f32"}


def module_loc(module: ir.Module) -> Loc:
    """Where errors about the module as a whole point: its card line, else its arch line."""
    return module.loc or Loc(module.path, 1, 1, 1, 2, module.sources.get(module.path))


def specialize(module: ir.Module, generics: dict | None = None, numerics: str = "exact") -> ir.Module:
    card_loc = module_loc(module)
    g = dict(DEFAULT_GENERICS)
    for key, value in (generics or {}).items():
        if key not in DEFAULT_GENERICS:
            raise LinnetError(card_loc, f"unknown generic `{key}`; the generics are Batch, MaxSeq and T")
        g[key] = value
    for key in SIZE_GENERICS:
        v = g[key]
        if isinstance(v, str) and v.isdigit():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise LinnetError(card_loc, f"generic `{key}` must be a positive integer, not {g[key]!r}")
        g[key] = v
    if g["T"] not in FLOAT_DTYPES:
        raise LinnetError(card_loc, f"generic `T` must be a float type ({', '.join(FLOAT_DTYPES)}), not {g['T']!r}")
    if numerics not in ("exact", "fast"):
        raise LinnetError(card_loc, f"numerics must be 'exact' or 'fast', not {numerics!r}")
    if numerics == "exact":
        g["T"] = "f32"  # exact computes and stores in f32, whatever T the caller asked for

    values: dict = {}
    for name, c in module.config.items():
        if name in module.config_values:
            values[name] = module.config_values[name]
        elif c.default is not None:
            values[name] = evaluate(c.default, values)
            if c.type.kind == "float":
                values[name] = float(values[name])
        else:
            raise LinnetError(card_loc if module.card_path else c.loc, f"config value `{name}` has no value",
                              [f"declared at {c.loc} without a default; the card must set `{name} = ...`"])
    sizes = {**{k: v for k, v in values.items() if isinstance(v, int) and not isinstance(v, bool)},
             "Batch": g["Batch"], "MaxSeq": g["MaxSeq"]}
    for name, v in sizes.items():
        if name in module.config and module.config[name].type.kind == "int" and v < 1 and _used_as_dim(module, name):
            raise LinnetError(module.config[name].loc, f"`{name}` is a size and must be positive, not {v}")

    def check_type(t, where: Loc, what: str):
        if not isinstance(t, TensorType):
            return
        for d in t.shape:
            bad = d.inexact_divisions(sizes)
            if bad:
                q, n, den = bad[0]
                raise LinnetError(where, f"{what}: {q} is not a whole number ({n} / {den})")
            try:
                if d.evaluate(sizes) < 0:
                    raise LinnetError(where, f"{what}: dim {d} is negative ({d.evaluate(sizes)})")
            except KeyError:
                pass  # a per-call size such as N

    for p in module.params.values():
        check_type(p.type, p.loc, f"param `{p.name}`")
    for s in module.state.values():
        check_type(s.type, s.loc, f"state `{s.name}`")
    for fn in list(module.entries.values()) + list(module.fns.values()):
        for v in all_values(fn.body):
            check_type(v.type, v.loc, "this value")
            if isinstance(v, ir.Op) and v.op == "rope":
                try:
                    head_dim = v.kwargs["x"].type.shape[2].evaluate(sizes)
                except KeyError:
                    head_dim = 0  # a per-call size: checked where the fn is called
                if head_dim % 2:
                    raise LinnetError(v.loc, f"`rope` rotates pairs of dims, so head_dim must be even, not {head_dim}",
                                      [f"x is {v.kwargs['x'].type}"])
            if isinstance(v, ir.Op) and v.op == "rope" and "scaling" in v.kwargs:
                scaling = evaluate(v.kwargs["scaling"], values)
                if scaling not in ROPE_SCALINGS:
                    raise LinnetError(v.kwargs["scaling"].loc, f"unknown rope scaling {scaling!r}; one of {', '.join(ROPE_SCALINGS)}",
                                      [f"`{v.kwargs['scaling'].name}` is {scaling!r}"] if isinstance(v.kwargs["scaling"], ir.Var) else [])
            if isinstance(v, ir.Op):
                _check_bounds(v, values)
            if isinstance(v, ir.Op) and v.op == "attention":
                h, kvh = v.kwargs["q"].type.shape[1], v.kwargs["k_cache"].type.shape[2]
                try:
                    hv, kv = h.evaluate(sizes), kvh.evaluate(sizes)
                except KeyError:
                    continue
                if kv == 0 or hv % kv:
                    raise LinnetError(v.loc, f"{hv} query heads cannot share {kv} key/value heads evenly",
                                      [f"heads ({h}) must be a multiple of kv_heads ({kvh})"])
    bindings = {**values, "Batch": g["Batch"], "MaxSeq": g["MaxSeq"], "T": g["T"], "numerics": numerics}
    return replace(module, bindings=bindings)


# Static arguments whose values have a floor: (op, argument) -> (least, whether the least itself is allowed).
STATIC_FLOORS = {("attention", "window"): (0, True), ("rope", "theta"): (0, False), ("rope", "factor"): (0, False),
                 ("rmsnorm", "eps"): (0, True)}


def _check_bounds(v: ir.Op, values: dict) -> None:
    """A static argument below its floor (a negative sliding window, say) is an error at its use,
    with the value it took: otherwise it compiles and computes nonsense."""
    for (op, arg), (least, inclusive) in STATIC_FLOORS.items():
        if v.op != op or v.kwargs.get(arg) is None:
            continue
        given = v.kwargs[arg]
        try:
            value = evaluate(given, values)
        except LinnetError:  # known only per call (a fn's argument): nothing to check here
            continue
        if value < least or (value == least and not inclusive):
            bound = f"at least {least}" if inclusive else f"greater than {least}"
            named = f"`{given.name}` is {value!r}" if isinstance(given, ir.Var) else f"it is {value!r}"
            raise LinnetError(given.loc or v.loc, f"{arg} of `{op}` must be {bound}", [named])


def _used_as_dim(module: ir.Module, name: str) -> bool:
    types = [p.type for p in module.params.values()] + [s.type for s in module.state.values()]
    return any(name in d.names() for t in types for d in t.shape)


def evaluate(v: ir.Value, env: dict):
    """The value of a static expression (config arithmetic, conditions) given config values."""
    if isinstance(v, ir.Const):
        return v.value
    if isinstance(v, ir.Var):
        if v.name not in env:
            raise LinnetError(v.loc, f"`{v.name}` has no value here")
        return env[v.name]
    if isinstance(v, ir.Op):
        k = v.kwargs
        if v.op == "if":
            return evaluate(k["then"], env) if evaluate(k["cond"], env) else evaluate(k["orelse"], env)
        if v.op in ("neg", "not"):
            x = evaluate(k["x"], env)
            return -x if v.op == "neg" else not x
        if v.op in STATIC_BINARY:
            a, b = evaluate(k["a"], env), evaluate(k["b"], env)
            if v.op == "div" and isinstance(a, int) and isinstance(b, int):
                if b == 0 or a % b:
                    raise LinnetError(v.loc, f"{a} / {b} is not a whole number")
                return a // b
            try:
                return STATIC_BINARY[v.op](a, b)
            except (ZeroDivisionError, OverflowError, TypeError) as err:
                reason = err.args[-1] if err.args else err
                raise LinnetError(v.loc, f"cannot evaluate {a!r} {_SYMBOL.get(v.op, v.op)} {b!r}: {reason}") from None
    raise LinnetError(v.loc, "this must be known before the model runs (a config value, a literal)")


STATIC_BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
    "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b, "pow": lambda a, b: a ** b,
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "and": lambda a, b: a and b, "or": lambda a, b: a or b,
    "maximum": max, "minimum": min,
}


_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%", "pow": "**"}


def dim_value(d: Dim, module: ir.Module) -> int:
    sizes = {k: v for k, v in module.bindings.items() if isinstance(v, int) and not isinstance(v, bool)}
    return d.evaluate(sizes)


def param_shape(module: ir.Module, name: str) -> tuple:
    return tuple(dim_value(d, module) for d in module.params[name].type.shape)


def concrete_dtype(dtype: str, module: ir.Module) -> str:
    return module.bindings["T"] if dtype == GENERIC_DTYPE else dtype
