"""Numbers for the generics and the config: the step between a generic module and code.

`specialize(module, generics)` evaluates every config value (the card's, else
the default), binds `Batch`, `MaxSeq` and `T`, and checks what only numbers
can tell: every size positive, every division exact, heads a multiple of
kv_heads. The module's dims stay symbolic; codegen names them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from linnet.errors import LinnetError, Loc
from linnet.ir import nodes as ir
from linnet.ir.dims import Dim
from linnet.ir.index_ranges import check_index_ranges, position_ceiling
from linnet.ir.ops import ROPE_SCALING_READS, ROPE_SCALINGS
from linnet.ir.types import (FLOAT_DTYPE_NAMES, FLOAT_DTYPES, GENERIC_DTYPE, SIZE_GENERICS, ListType, ScalarType,
                             TensorType, TupleType, is_float, is_int)
from linnet.ir.walk import all_values, assigned_names, children as walk_children, stmt_values, values as tree_values

DEFAULT_GENERICS = {"Batch": 1, "MaxSeq": 256, "T": "f32"}
MAX_SIZE_GENERIC = 2 ** 31 - 1


def module_loc(module: ir.Module) -> Loc:
    """Where errors about the module as a whole point: its card line, else its arch line."""
    return module.loc or Loc(module.path, 1, 1, 1, 2, module.sources.get(module.path))


def generic_value(key: str, value):
    """A generic's value as specialize takes it (a size given as digits becomes an int); a
    ValueError saying why one cannot be (`linnet`'s --generic flag reports it as its own)."""
    if key not in DEFAULT_GENERICS:
        raise ValueError(f"unknown generic `{key}`; the generics are Batch, MaxSeq and T")
    if key in SIZE_GENERICS:
        v = int(value) if isinstance(value, str) and value.isascii() and value.isdigit() else value
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"generic `{key}` must be a positive integer, not {value!r}")
        if v > MAX_SIZE_GENERIC:
            # rows and positions are i32 (the entries contract), and the engine's padding sits at MaxSeq
            raise ValueError(f"generic `{key}` must be at most 2 ** 31 - 1 = {MAX_SIZE_GENERIC}, not {v}: "
                             f"the entries take rows and positions as i32")
        return v
    # (torch.bfloat16, numpy's dtype("float16") and its np.float32 too, by their names)
    named = value.__name__ if isinstance(value, type) else \
        str(value).removeprefix("torch.") if not isinstance(value, str) and hasattr(value, "itemsize") else value
    named = FLOAT_DTYPE_NAMES.get(named, named) if isinstance(named, str) else named
    if named not in FLOAT_DTYPES:
        raise ValueError(f"generic `T` must be a float type ({', '.join(FLOAT_DTYPES)}; or as torch names them: "
                         f"{', '.join(FLOAT_DTYPE_NAMES)}), not {value!r}")
    return named


def bind(module: ir.Module, generics: dict | None = None, numerics: str = "exact") -> ir.Module:
    """The module with its generics and config values bound as `specialize` binds them, after the
    checks that read no type (each generic's value, numerics, every size positive): what sizes
    alone need, such as `memory.footprint` weighing a MaxSeq before it is chosen (`nest.context`)."""
    try:
        return _bind(module, generics, numerics)
    except LinnetError as err:
        raise _where_the_card_sets(err, module) from None


def _bind(module: ir.Module, generics: dict | None, numerics: str) -> ir.Module:
    card_loc = module_loc(module)
    g = dict(DEFAULT_GENERICS)
    for key, value in (generics or {}).items():
        try:
            g[key] = generic_value(key, value)
        except ValueError as err:
            raise LinnetError(card_loc, str(err)) from None
    if numerics not in ("exact", "fast"):
        raise LinnetError(card_loc, f"numerics must be 'exact' or 'fast', not {numerics!r}")
    if numerics == "exact":
        g["T"] = "f32"  # exact computes and stores in f32, whatever T the caller asked for

    values = config_values(module)
    for name, v in _sizes(values, g).items():
        if name in module.config and module.config[name].type.kind == "int" and v < 1 and _used_as_dim(module, name):
            # at the card's value where the card set it: the line to change
            given = module.config_locs.get(name) if name in module.config_values else None
            raise LinnetError(given or module.config[name].loc, f"`{name}` is a size and must be positive, not {v}",
                              [f"`{name}` sizes dims of the model (declared at {module.config[name].loc})"]
                              if given else [])
    bindings = {**values, "Batch": g["Batch"], "MaxSeq": g["MaxSeq"], "T": g["T"], "numerics": numerics}
    return replace(module, bindings=bindings)


def specialize(module: ir.Module, generics: dict | None = None, numerics: str = "exact") -> ir.Module:
    try:
        return _specialize(module, generics, numerics)
    except LinnetError as err:
        raise _where_the_card_sets(err, module) from None


_NAMED_VALUE = re.compile(r"`(\w+)` is .*")


def _where_the_card_sets(err: LinnetError, module: ir.Module) -> LinnetError:
    """`err` with where the card sets it after each note naming a value the card gave (`` `sliding_window` is
    -4 ``): the error is at the architecture's line that reads it, which the card's writer did not write."""
    notes = []
    for note in err.notes:
        named = _NAMED_VALUE.fullmatch(note)
        given = named and named[1] in module.config_values and module.config_locs.get(named[1])
        notes.append(f"{note}, set at {given}" if given else note)
    return err if notes == err.notes else LinnetError(err.loc, err.message, notes)


def _specialize(module: ir.Module, generics: dict | None, numerics: str) -> ir.Module:
    bound = _bind(module, generics, numerics)  # (not `bind`: its errors pass `_where_the_card_sets` once, below)
    g = bound.bindings
    values = {name: g[name] for name in module.config}
    sizes = _sizes(values, g)

    def check_type(t, where: Loc, what: str):
        if isinstance(t, TupleType):  # topk's parts, a list's items
            for item in t.items:
                check_type(item, where, what)
        if not isinstance(t, TensorType):
            return
        for d in t.shape:
            bad = d.inexact_divisions(sizes)
            if bad:
                q, n, den = bad[0]
                raise LinnetError(where, f"{what}: {q} is not a whole number ({n} / {den})")
            try:
                if d.evaluate(sizes) < 0:
                    shown = str(d) if d.is_const() else f"`{d}`"  # (`dim - 40`, not "dim dim - 40")
                    raise LinnetError(where, f"{what}: dim {shown} is negative ({d.evaluate(sizes)})")
            except KeyError:
                pass  # a per-call size such as N
        try:
            count = math.prod(d.evaluate(sizes) for d in t.shape)
        except KeyError:
            return
        if count >= 2 ** INT_BITS:  # (it would fail only as the weights are laid out, an overflow in torch)
            named = sorted({n for d in t.shape for n in d.names() if n in module.config_values})
            raise LinnetError(where, f"{what}: {t} holds {count} elements, more than a tensor can (2 ** {INT_BITS})",
                              [f"`{n}` is {sizes[n]}" for n in named])

    for p in module.params.values():
        check_type(p.type, p.loc, f"param `{p.name}`")
    for s in module.state.values():
        check_type(s.type, s.loc, f"state `{s.name}`")
    static = {**values, "Batch": g["Batch"], "MaxSeq": g["MaxSeq"]}
    _check_static_indices(module, sizes, static)
    check_index_ranges(module, sizes, static)
    for fn in list(module.entries.values()) + list(module.fns.values()):
        for i, (name, t) in enumerate(fn.args):  # even one no value reads
            where = fn.arg_locs[i] if i < len(fn.arg_locs) else fn.loc
            check_type(t, where, f"argument `{name}` of {fn.kind} `{fn.name}`")
        for v in all_values(fn.body):
            if isinstance(v, ir.Op) and v.op == "topk":
                _check_topk(v, sizes)
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
                theta = v.kwargs.get("theta")
                try:
                    theta_value = evaluate(theta, values) if scaling == "yarn" and theta is not None else None
                except LinnetError:  # known only per call
                    theta_value = None
                if theta_value == 1:  # yarn's ramp divides by log(theta)
                    raise LinnetError(theta.loc or v.loc, "theta of `rope` must not be 1 under yarn scaling, whose "
                                                          "ramp divides by log(theta)",
                                      [f"`{theta.name}` is {theta_value!r}"] if isinstance(theta, ir.Var) else [])
            if isinstance(v, ir.Op):
                _check_bounds(v, values)
            if isinstance(v, ir.Op) and v.op == "attention":
                h, kvh = v.kwargs["q"].type.shape[1], v.kwargs["k_cache"].type.shape[2]
                try:
                    hv, kv = h.evaluate(sizes), kvh.evaluate(sizes)
                except KeyError:
                    continue
                if kv == 0 or hv % kv:
                    # (each count the card sets is named as `_where_the_card_sets` says where it sets it)
                    given = [f"`{n}` is {sizes[n]!r}" for n in dict.fromkeys([*sorted(h.names()), *sorted(kvh.names())])
                             if n in bound.config_values]
                    raise LinnetError(v.loc, f"{hv} query heads cannot share {kv} key/value heads evenly",
                                      [f"{_named(h, hv)} must be a multiple of {_named(kvh, kv)}", *given])
    return bound


def config_values(module: ir.Module) -> dict:
    """Every config value: the card's, else its default evaluated."""
    values: dict = {}
    for name, c in module.config.items():
        if name in module.config_values:
            values[name] = module.config_values[name]
        elif c.default is not None:
            try:
                values[name] = evaluate(c.default, values)
            except LinnetError as err:
                raise _with_card_values(err, module, c.default) from None
            if c.type.kind == "float":
                values[name] = float(values[name])
            elif c.type.kind == "int" and not _is_int(values[name]):
                raise LinnetError(c.default.loc, f"the default of `{name}` is {values[name]!r}, not an int")
            elif isinstance(c.type, ListType) and c.type.item == "float":
                values[name] = [float(x) for x in values[name]]
        else:
            where = module_loc(module) if module.card_path else c.loc
            raise LinnetError(where, f"config value `{name}` has no value",
                              [f"declared at {c.loc} without a default; the card must set `{name} = ...`"
                               if module.card_path else f"a card that imports `{module.name}` sets it "
                               f"(`{name} = ...`), or a default here does"])
        if isinstance(c.type, ListType):
            _check_list_length(module, c, values)
    return values


def _with_card_values(err: LinnetError, module: ir.Module, v: ir.Value) -> LinnetError:
    """`err`, raised computing the default `v`, with a note for each value of the card's that `v` reads,
    where the card sets it: the error points into the architecture, whose lines the card's writer did not
    write (llama's `head_dim = dim / heads` with a card's dim 30 and heads 4)."""
    named = {m[1] for m in map(_NAMED_VALUE.fullmatch, err.notes) if m}  # (said where set by `_where_the_card_sets`)
    read = dict.fromkeys(x.name for x in tree_values(v) if isinstance(x, ir.Var) and x.name in module.config_locs
                         and x.name in module.config_values and x.name not in named)
    notes = [f"`{n}` = {module.config_values[n]!r}, set at {module.config_locs[n]}"
             for n in sorted(read, key=lambda n: (module.config_locs[n].line, module.config_locs[n].col))]
    return LinnetError(err.loc, err.message, err.notes + notes)


def _check_list_length(module: ir.Module, c: ir.ConfigValue, values: dict) -> None:
    """A list config holds one item for each index below its length (`bool[layers]`: one per
    layer), whether the card gave it or its default made it."""
    want = c.type.length.evaluate({k: v for k, v in values.items() if _is_int(v)})
    got = len(values[c.name])
    if got != want:
        where = module.config_locs.get(c.name) if c.name in module.config_values else c.default.loc
        length = "" if c.type.length.is_const() else f" ({c.type.length} = {want})"
        raise LinnetError(where or c.loc, f"`{c.name}` is {c.type}: it needs {want} item{'s' * (want != 1)}{length}, "
                                          f"not {got}")


def _sizes(values: dict, generics: dict) -> dict:
    """The dims' values: the int config values and the size generics."""
    return {**{k: v for k, v in values.items() if isinstance(v, int) and not isinstance(v, bool)},
            "Batch": generics["Batch"], "MaxSeq": generics["MaxSeq"]}


def learned_positions(module: ir.Module) -> int | None:
    """The most positions a row may hold by the module's own tables (a learned position table's
    rows, less the offset it is read at), or None where only the cache bounds them: what MaxSeq
    may be at most (`index_ranges.position_ceiling`)."""
    values = config_values(module)
    sizes = _sizes(values, DEFAULT_GENERICS)
    return position_ceiling(module, sizes, {**values, "Batch": sizes["Batch"], "MaxSeq": sizes["MaxSeq"]})


# Static arguments whose values have a floor: (op, argument) -> (least, whether the least itself is allowed).
STATIC_FLOORS = {("attention", "window"): (0, True), ("rope", "theta"): (0, False), ("rope", "factor"): (0, False),
                 ("rmsnorm", "eps"): (0, True), ("attention", "softcap"): (0, True),
                 ("rope", "attention_factor"): (0, False),
                 ("layer_norm", "eps"): (0, True),
                 ("rope", "low_freq_factor"): (0, False), ("rope", "high_freq_factor"): (0, False),
                 ("rope", "original_max"): (0, False), ("rope", "beta_fast"): (0, False),
                 ("rope", "beta_slow"): (0, False)}

# rope's arguments that only some scalings read (`rope_tables`): each floor holds under those only, so
# that an architecture's unused default of 0 is no error. Under them a 0 divides or takes a log of it
# as the model is built.
ROPE_ARGS_OF_SCALING = {arg: tuple(s for s, reads in ROPE_SCALING_READS.items() if arg in reads)
                        for arg in ("low_freq_factor", "high_freq_factor", "original_max", "beta_fast", "beta_slow")}


def _check_bounds(v: ir.Op, values: dict, running: "_Running | None" = None) -> None:
    """A static argument below its floor (a negative sliding window, say) is an error at its use,
    with the value it took: otherwise it compiles and computes nonsense. `values` may hold loop
    variables and a fn's arguments (`running` names them: a list config's item, `windows[l]`)."""
    for (op, arg), (least, inclusive) in STATIC_FLOORS.items():
        if v.op != op or v.kwargs.get(arg) is None:
            continue
        given = v.kwargs[arg]
        try:
            value = evaluate(given, values)
            if op == "rope" and arg in ROPE_ARGS_OF_SCALING:
                scaling = v.kwargs.get("scaling")
                if scaling is None or evaluate(scaling, values) not in ROPE_ARGS_OF_SCALING[arg]:
                    continue
        except LinnetError:  # known only per call (a fn's argument): nothing to check here
            continue
        if value < least or (value == least and not inclusive):
            bound = f"at least {least}" if inclusive else f"greater than {least}"
            named = f"`{given.name}` is {value!r}" if isinstance(given, ir.Var) else f"it is {value!r}"
            raise LinnetError(given.loc or v.loc, f"{arg} of `{op}` must be {bound}",
                              [named] + (running.notes(given) if running else []))


def _named(d: Dim, value: int) -> str:
    """A dim with its value: `heads = 4`, or `4` where it is a number."""
    return str(value) if d.is_const() else f"{d} = {value}"


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_static_indices(module: ir.Module, sizes: dict, static: dict) -> None:
    """Every index and slice checked with the values it takes as the model runs: a loop variable
    over its loop's range, a fn's static argument at each call, a static local (`w[l + 1]` past the
    last layer would raise in torch and read the wrong layer in JAX); and every static value with
    them (`_check_static_values`)."""
    seen = set()

    def visit(fn: ir.Function, args: dict, call: Loc | None) -> None:
        key = (fn.name, tuple(sorted(args.items())))
        if key not in seen:
            seen.add(key)
            walk(fn.body, {**static, **args}, _Running(args, frozenset(args), fn.name, call))

    def walk(body: list, env: dict, running: "_Running") -> None:
        for s in body:
            if isinstance(s, ir.For):
                rebound = assigned_names(s.body)  # static locals the body rebinds: known in it only once rebound
                inner = {k: v for k, v in env.items() if k not in rebound}
                try:
                    count = evaluate(s.count, env)
                except LinnetError:  # a per-call size, a fn's argument: the body is checked without it
                    walk(s.body, inner, running)
                else:
                    for i in _loop_values(count):
                        walk(s.body, {**inner, s.var: i}, running.with_value(s.var, i))
                for name in rebound:
                    env.pop(name, None)
                continue
            if isinstance(s, ir.Store):
                _check_indices(module.state[s.state].type, s.indices, sizes, env, running)
            run = [x for top in stmt_values(s) for x in _values_run(top, env)]
            for v in run:
                if isinstance(v, ir.Op) and v.op == "list_item":  # a list config's item: its length is a dim
                    t = v.kwargs["x"].type
                    _check_indices(TensorType(t.item, (t.length,)), v.args, sizes, env, running, shown=t)
            for v in run:
                if isinstance(v, ir.Op):  # with this layer's values: a window read from a list at `l`
                    _check_bounds(v, env, running)
            for top in stmt_values(s):
                _check_static_values(top, env, running)
            if isinstance(s, ir.Assign):
                _bind_static(s, env)
            for v in run:
                if isinstance(v, ir.Op) and v.op == "index":
                    _check_indices(v.kwargs["x"].type, v.args, sizes, env, running)
                if isinstance(v, ir.Op) and v.op == "call":
                    callee = module.fns[v.attrs["fn"]]
                    known = {}
                    for name, t in callee.args:
                        if isinstance(t, ScalarType):
                            try:
                                known[name] = evaluate(v.kwargs[name], env)
                            except LinnetError:  # a local: the indices that use it go unchecked
                                pass
                    visit(callee, known, v.loc)

    for fn in list(module.entries.values()) + list(module.fns.values()):
        visit(fn, {}, None)


# How many values of a loop are tried one by one; past it, the first and the last, which suffice
# for an index affine in the loop variable (the usual `w[l]`, `w[l + 1]`).
LOOP_VALUES_TRIED = 512


def _loop_values(count: int):
    return range(count) if count <= LOOP_VALUES_TRIED else (0, count - 1)


@dataclass(frozen=True)
class _Running:
    """The loop variables and fn arguments known at a point of the walk, to name them in a message."""

    values: dict  # name -> value
    args: frozenset = frozenset()  # those of `values` that are arguments of `fn`, as called at `call`
    fn: str | None = None
    call: Loc | None = None

    def with_value(self, name: str, value) -> "_Running":
        return replace(self, values={**self.values, name: value})

    def notes(self, ix: ir.Value) -> list:
        used = [n for n in self.values if any(isinstance(x, ir.Var) and x.name == n for x in tree_values(ix))]
        if not used:
            return []
        when = "when " + ", ".join(f"`{n}` = {self.values[n]!r}" for n in used)
        called = self.call and self.args.intersection(used)
        return [when + (f", as `{self.fn}` is called at {self.call}" if called else "")]


# What `evaluate` computes; any other op (a fn's call, a tensor's) is known only as the model runs.
_EVALUATED = frozenset({"if", "neg", "not", "list_item"})  # with STATIC_BINARY and STATIC_UNARY, defined below
# A Python int beside a tensor is an i32 to JAX, which refuses one outside that range as it traces an
# entry (torch wraps it into an i32 tensor, or raises past 64 bits): so, on both backends, an i32's.
I32_RANGE = (-2 ** 31, 2 ** 31)


def _known(v: ir.Value, env: dict) -> bool:
    """Whether `evaluate` can compute the static value `v` with `env`."""
    return all(isinstance(x, ir.Const) or (isinstance(x, ir.Var) and x.name in env)
               or (isinstance(x, ir.Op) and isinstance(x.type, ScalarType)
                   and (x.op in _EVALUATED or x.op in STATIC_BINARY or x.op in STATIC_UNARY))
               for x in tree_values(v))


def _bind_static(s: ir.Assign, env: dict) -> None:
    """A local bound to a static value known here is that value from now on; one bound to anything
    else is not known (and not the value it may have had before)."""
    if len(s.targets) == 1 and isinstance(s.value.type, ScalarType) and _known(s.value, env):
        env[s.targets[0]] = evaluate(s.value, env)
    else:
        for name in s.targets:
            env.pop(name, None)


def taken_branch(x: ir.Value, env: dict) -> ir.Value | None:
    """Of an `if` whose condition `env` knows, the branch it takes; else None (a condition that cannot
    be computed too: the checks of its own values say why, naming the loop's values). The code
    generators emit that branch alone where `env` is the specialized module's bindings."""
    if not (isinstance(x, ir.Op) and x.op == "if" and _known(x.kwargs["cond"], env)):
        return None
    try:
        cond = evaluate(x.kwargs["cond"], env)
    except LinnetError:
        return None
    return x.kwargs["then"] if cond else x.kwargs["orelse"]


def _values_run(v: ir.Value, env: dict) -> list:
    """The values under `v` (`v` too) that are computed with `env`: of an `if` whose condition is
    known, its condition and the branch it takes only, as the generated code computes them (a
    dense first layer's `if l == 0 then x * first[l] else ...` indexes `first` at 0 only)."""
    out, stack = [], [v]
    while stack:
        x = stack.pop()
        out.append(x)
        taken = taken_branch(x, env)
        stack.extend(walk_children(x) if taken is None else (x.kwargs["cond"], taken))
    return out


def _check_static_values(v: ir.Value, env: dict, running: _Running) -> None:
    """Each static value in a body known with numbers is computed here, where an error names it: the
    generated code would raise as the model runs (`1 // 0`, `log(0.0)`, an int past 64 bits). A
    static int beside a tensor must be an i32's (I32_RANGE)."""
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x.type, ScalarType) and _known(x, env):
            evaluate(x, env)  # (an `if` computes the branch it takes only, as the generated code does)
            continue
        if isinstance(x, ir.Op) and x.op == "if":  # a tensor's: the branch it takes; not known here, neither
            taken = taken_branch(x, env)
            stack.extend([x.kwargs["cond"]] + ([] if taken is None else [taken]))
            continue
        if isinstance(x, ir.Op) and isinstance(x.type, TensorType) and (x.op in STATIC_BINARY or x.op == "where"):
            for a in x.kwargs.values():
                if isinstance(a.type, ScalarType) and a.type.kind == "int" and _known(a, env):
                    _check_i32(a, evaluate(a, env), x, running)
            _check_integer_tensor_operand(x, env, running)
        stack.extend(walk_children(x))


def _check_integer_tensor_operand(x: ir.Op, env: dict, running: _Running) -> None:
    """An integer tensor `// 0` or `% 0`, or to a negative power, by a static int known here: torch
    raises as the model runs, and JAX computes garbage."""
    b = x.kwargs.get("b")
    if x.op not in ("floordiv", "mod", "pow") or not isinstance(x.type, TensorType) or not is_int(x.type.dtype) \
            or b is None or not isinstance(b.type, ScalarType) or not _known(b, env):
        return
    value = evaluate(b, env)
    notes = running.notes(b) + ([f"`{b.name}` is {value}"] if isinstance(b, ir.Var) else [])
    if x.op != "pow" and value == 0:
        raise LinnetError(x.loc, f"an integer tensor {_SYMBOL[x.op]} 0: division by zero", notes)
    if x.op == "pow" and value < 0:
        raise LinnetError(x.loc, f"an integer tensor ** {value} is not a whole number: an int to a negative power",
                          notes + ["convert it with `as` first (`x as f32`)"])


def _check_i32(a: ir.Value, value: int, op: ir.Op, running: _Running) -> None:
    if I32_RANGE[0] <= value < I32_RANGE[1]:
        return
    tensor = next(t.type for k, t in op.kwargs.items() if isinstance(t.type, TensorType) and k != "cond")
    notes = running.notes(a) + ([f"`{a.name}` is {value}"] if isinstance(a, ir.Var) else [])
    notes.append(f"an i32 holds {I32_RANGE[0]} to {I32_RANGE[1] - 1} (JAX takes a Python int beside an array as one)")
    if is_float(tensor.dtype):
        notes.append(f"for a float, write {value}.0")
    raise LinnetError(a.loc, f"a static int beside a tensor is an i32, and {value} is outside its range", notes)


def _check_indices(t: TensorType, indices: list, sizes: dict, static: dict, running: _Running, shown=None) -> None:
    """Indices known with numbers stay inside the dims they index: torch would raise where JAX
    clamps (an index) or the result would not have its declared type (a slice). `shown`: the
    type a message names, where `t` stands for another (a list config's)."""
    for ix, d in zip(indices, t.shape):
        try:
            n = d.evaluate(sizes)
        except KeyError:  # a per-call size
            n = None
        if isinstance(ix, ir.Slice):
            _check_slice(ix, d, n, t, sizes)
        elif isinstance(ix.type, ScalarType) and n is not None:
            try:
                i = evaluate(ix, static)
            except LinnetError:  # a local, an argument not known at the call: known only as it runs
                continue
            if not -n <= i < n:
                what = f"a list of {n}" if shown else f"a dim of size {n}"
                raise LinnetError(ix.loc, f"index {i} is out of range for {what}", running.notes(ix) +
                                  [f"the value indexed is {shown or t}; an index counts from 0, or from -{n} at "
                                   f"the end"])


def _check_slice(ix: ir.Slice, d: Dim, n: int | None, t: TensorType, sizes: dict) -> None:
    bounds = []
    for end, bound, dim, default in (("start", ix.start, ix.start_dim, 0), ("end", ix.stop, ix.stop_dim, n)):
        try:
            value = dim.evaluate(sizes) if bound is not None else default
        except KeyError:  # a per-call size
            value = None
        if bound is not None and value is not None and value < 0:  # numpy would count from the end; a dim cannot
            raise LinnetError(bound.loc, f"a slice cannot {end} at {value}: its bounds are dims, counted from 0",
                              [f"to count from the end, write `{d} - {-value}`"])
        bounds.append(value)
    start, stop = bounds
    if start is None or stop is None:
        return
    if stop < start:
        raise LinnetError(ix.loc, f"the slice {start}:{stop} ends before it starts")
    if n is not None and stop > n:
        raise LinnetError(ix.loc, f"the slice {start}:{stop} runs past the end of a dim of size {n}",
                          [f"the value indexed is {t}"])


def _check_topk(v: ir.Op, sizes: dict) -> None:
    try:
        k = v.dims[0].evaluate(sizes)
    except KeyError:
        return
    if k < 1:
        raise LinnetError(v.loc, f"`topk` must take at least 1 value, not {k}", [] if v.dims[0].is_const() else
                          [f"k is {_named(v.dims[0], k)}"])
    try:
        n = v.kwargs["x"].type.shape[-1].evaluate(sizes)
    except KeyError:
        return
    if k > n:
        raise LinnetError(v.loc, f"`topk` cannot take the {k} largest of {n} values", [f"x is {v.kwargs['x'].type}"])


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
        if v.op == "list":
            return [evaluate(a, env) for a in v.args]
        if v.op == "list_comp":  # a list config's default, item by item
            count = evaluate(k["count"], env)
            if count > LIST_ITEMS:  # (a billion layers' list took Python an hour and gigabytes to lay out)
                raise LinnetError(v.loc, f"a list of {count} items is too long for a static list",
                                  [f"`{k['count'].name}` is {count}" if isinstance(k["count"], ir.Var) else
                                   f"its length is {count}", f"static lists hold at most {LIST_ITEMS} items"])
            return [evaluate(k["item"], {**env, v.attrs["var"]: i}) for i in range(count)]
        if v.op == "list_item":
            items, i = evaluate(k["x"], env), evaluate(v.args[0], env)
            if not -len(items) <= i < len(items):
                raise LinnetError(v.args[0].loc, f"index {i} is out of range for `{k['x'].name}`, a list of "
                                                 f"{len(items)} ({k['x'].type})")
            return items[i]
        if v.op in STATIC_UNARY:
            x = evaluate(k["x"], env)
            try:
                return STATIC_UNARY[v.op](x)
            except (ValueError, OverflowError, ZeroDivisionError) as err:
                raise LinnetError(v.loc, f"cannot evaluate {v.op}({x!r}): {err}") from None
        if v.op in STATIC_BINARY:
            a, b = evaluate(k["a"], env), evaluate(k["b"], env)
            compute = STATIC_BINARY[v.op]
            if v.op == "div" and isinstance(a, int) and isinstance(b, int):
                if b and a % b:
                    raise LinnetError(v.loc, f"{a} / {b} is not a whole number")
                compute = STATIC_BINARY["floordiv"]  # exact here; by zero, the error of `//` and `%`
            if v.op == "pow" and _is_int(a) and _is_int(b) and b < 0:
                raise LinnetError(v.loc, f"{a} ** {b} is not a whole number: an int to a negative power",
                                  [f"for a float, write {a}.0 ** {b}"])
            if v.op == "pow" and _is_int(a) and _is_int(b) and abs(a) > 1 and b >= INT_BITS:
                _too_large(v, a, b)  # before Python spends hours computing it
            named = [f"`{x.name}` is {value!r}" for x, value in ((k["a"], a), (k["b"], b)) if isinstance(x, ir.Var)]
            try:
                out = compute(a, b)
            except (ZeroDivisionError, OverflowError, TypeError) as err:
                reason = err.args[-1] if err.args else err
                raise LinnetError(v.loc, f"cannot evaluate {a!r} {_SYMBOL.get(v.op, v.op)} {b!r}: {reason}",
                                  named) from None
            if isinstance(out, complex):  # Python's negative number to a fractional power
                raise LinnetError(v.loc, f"cannot evaluate ({a!r}) ** {b!r}: a negative number to a fractional "
                                         f"power is not a real number", named)
            if _is_int(out) and not -2 ** INT_BITS <= out < 2 ** INT_BITS:
                _too_large(v, a, b)
            return out
    raise LinnetError(v.loc, "this must be known before the model runs (a config value, a literal)")


# A static list is a setting each layer (or expert) has: far fewer than this, which a list config's
# default (`[... for l in layers]`) is laid out item by item up to
LIST_ITEMS = 1 << 20

# Static ints are the model's sizes, indices and settings: past 64 bits they are a mistake, and
# a power such as 10 ** 10 ** 10 would take Python hours to compute.
INT_BITS = 63


def _too_large(v: ir.Op, a, b):
    raise LinnetError(v.loc, f"{a!r} {_SYMBOL.get(v.op, v.op)} {b!r} is too large for a static int",
                      [f"static ints are less than 2 ** {INT_BITS} in size"])


STATIC_BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
    "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b, "pow": lambda a, b: a ** b,
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "and": lambda a, b: a and b, "or": lambda a, b: a or b,
    "maximum": max, "minimum": min,
}


# The float ops on a static number, as the generated code computes them (`pyemit.STATIC_UNARY`).
STATIC_UNARY = {
    "exp": math.exp, "log": math.log, "sqrt": math.sqrt, "rsqrt": lambda x: 1 / math.sqrt(x), "tanh": math.tanh,
    "sigmoid": lambda x: _sigmoid(x), "silu": lambda x: x * _sigmoid(x),
    "gelu": lambda x: x * (1 + math.erf(x / math.sqrt(2))) / 2, "relu": lambda x: max(x, 0.0), "sin": math.sin,
    "cos": math.cos, "erf": math.erf, "abs": abs,
}

def _sigmoid(x: float) -> float:
    """exp of a number no larger than 0 only: 1 / (1 + exp(-x)) overflows for x below about -709."""
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%", "pow": "**"}


def dim_value(d: Dim, module: ir.Module) -> int:
    sizes = {k: v for k, v in module.bindings.items() if isinstance(v, int) and not isinstance(v, bool)}
    return d.evaluate(sizes)


def param_shape(module: ir.Module, name: str) -> tuple:
    return tuple(dim_value(d, module) for d in module.params[name].type.shape)


def concrete_dtype(dtype: str, module: ir.Module) -> str:
    return module.bindings["T"] if dtype == GENERIC_DTYPE else dtype
