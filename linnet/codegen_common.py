"""What both code generators compute from a specialized module before writing code."""

from __future__ import annotations

from dataclasses import dataclass

from linnet.ir import nodes as ir
from linnet.ir.dims import Dim
from linnet.ir.ops import ROPE_SCALING_READS
from linnet.ir.specialize import concrete_dtype, evaluate
from linnet.ir.types import TensorType
from linnet.ir.walk import all_values, assigned_names, stmt_values, values
from linnet.pyemit import dim_py, gathers_param_rows

ROPE_ARGS = ("theta", "scaling", "factor", "low_freq_factor", "high_freq_factor", "original_max", "beta_fast", "beta_slow",
             "truncate", "attention_factor")


@dataclass(frozen=True)
class RopeTable:
    """One rotary table the generated code computes once: its name, and the first rope op that reads it
    (where its arguments are spelled, and the line its comment names)."""

    name: str
    op: ir.Op
    key: tuple  # `rope_key`: the head width, then (argument, value) of each argument given


def rope_tables(module: ir.Module) -> dict:
    """Each distinct rope configuration in the entries (`rope_key`) -> its `RopeTable`."""
    tables: dict = {}
    # named apart from the model's own names: torch holds a table as `self.rope_0` beside the params
    # and state, JAX as a module constant `ROPE_0`, which no config value, entry or local may hide
    taken = {n.lower() for n in (*module.config, *module.params, *module.state, *module.fns, *module.entries)}
    for fn in module.entries.values():
        taken |= {n.lower() for n in (*(a for a, _ in fn.args), *fn.dims, *assigned_names(fn.body))}
    count = 0
    for fn in module.entries.values():
        for v in all_values(fn.body):
            if isinstance(v, ir.Op) and v.op == "rope":
                key = rope_key(v, module)
                if key not in tables:
                    while f"rope_{count}" in taken:
                        count += 1
                    tables[key] = RopeTable(f"rope_{count}", v, key)
                    count += 1
    return tables


def rope_key(v: ir.Op, module: ir.Module) -> tuple:
    head_dim = v.kwargs["x"].type.shape[2].evaluate(_sizes(module))
    args = tuple((name, evaluate(v.kwargs[name], module.bindings)) for name in ROPE_ARGS if name in v.kwargs)
    return (head_dim,) + args


def rope_table_args(table: RopeTable, spell) -> str:
    """A table's arguments as the card spells them where a config value or a number gives one (`theta=rope_theta`),
    else its value (DeepSeek's attention factor, folded from mscales); only those its scaling reads.
    `spell`: the emitter's source of a value."""
    v, values = table.op, dict(table.key[1:])
    scaling = values.get("scaling", "none")
    reads = {"theta", "attention_factor", *ROPE_SCALING_READS[scaling], *(("scaling",) if scaling != "none" else ())}
    args = [dim_py(v.kwargs["x"].type.shape[2]), "MaxSeq"]
    for name in ROPE_ARGS:
        if name in values and name in reads:
            given = v.kwargs[name]
            args.append(f"{name}={spell(given) if isinstance(given, (ir.Var, ir.Const)) else repr(values[name])}")
    return ", ".join(args)


def _sizes(module: ir.Module) -> dict:
    return {k: v for k, v in module.bindings.items() if isinstance(v, int) and not isinstance(v, bool)}


def entry_dim_sources(fn: ir.Function) -> list:
    """How each per-call size (`N`, `K`) is read off the arguments: [(size, arg, axis)]."""
    out = []
    for d in fn.dims:
        for name, t in fn.args:
            if isinstance(t, TensorType):
                axis = next((i for i, s in enumerate(t.shape) if s == Dim.name(d)), None)
                if axis is not None:
                    out.append((d, name, axis))
                    break
    return out


def param_table(module: ir.Module) -> list:
    """[(name, shape source text, dtype)] for the PARAMS dict of generated code."""
    return [(p.name, "(" + ", ".join(dim_py(d) for d in p.type.shape) + ("," if p.type.rank == 1 else "") + ")",
             concrete_dtype(p.type.dtype, module)) for p in module.params.values()]


def state_table(module: ir.Module) -> list:
    return [(s.name, "(" + ", ".join(dim_py(d) for d in s.type.shape) + ("," if s.type.rank == 1 else "") + ")",
             concrete_dtype(s.type.dtype, module)) for s in module.state.values()]


def tied_params(module: ir.Module) -> dict:
    """Params that are another param under this config: {name: other}."""
    return {p.name: p.tie[0] for p in module.params.values() if p.tie and evaluate(p.tie[1], module.bindings)}


def linear_weights(module: ir.Module) -> dict:
    """Params read only as the weight of `linear`, whole or one layer at a time: {name: stacked}.

    A backend may keep these in the layout its matmul prefers (torch on the CPU packs them for
    oneDNN). A tied param counts on its own uses: a head tied to an embedding that is also
    gathered from is listed, and the backend then packs a copy of the shared tensor for it.
    `module` must have its fns inlined, so that every use is in an entry.
    """
    return _weights_of(module, "linear")


def expert_weights(module: ir.Module) -> dict:
    """Params read only as the weights of `expert_linear` ([experts, out, in]), whole or one layer
    at a time: {name: stacked}. torch on the CPU packs each expert's matrix as a linear weight."""
    return _weights_of(module, "expert_linear")


def _weights_of(module: ir.Module, op: str) -> dict:
    """Params read only as the `w` of `op`, whole or one layer of a stacked param: {name: stacked}."""
    def weight(v: ir.Op):
        if v.op != op:
            return None
        w, layer = v.kwargs["w"], False
        if isinstance(w, ir.Op) and w.op == "index" and len(w.args) == 1 and isinstance(w.args[0], ir.Var) \
                and w.args[0].kind == "loop":
            w, layer = w.kwargs["x"], True
        # one layer of a stacked param, or a whole unstacked one
        if isinstance(w, ir.Var) and w.kind == "param" and layer == (module.params[w.name].loop_var is not None):
            return w.name
        return None

    return {name: module.params[name].loop_var is not None for name in _read_only_by(module, weight)}


def gathered_tables(module: ir.Module) -> list:
    """Params read only as gathered rows, `param[ids]` (an embedding's table): their names, sorted. torch on
    the CPU keeps such a table in the quantized blocks of the head tied to it, decoding only the rows a
    pass gathers (`TorchModel._kept_in_blocks`)."""
    return sorted(_read_only_by(module, lambda v: v.kwargs["x"].name if v.op == "index" and gathers_param_rows(v)
                                else None))


def _read_only_by(module: ir.Module, reader) -> list:
    """The params every use of which is an op `reader` names them for (reader(op): a param's name, or None),
    in the order first read so."""
    uses: dict = {}
    read: dict = {}
    for fn in module.entries.values():
        for v in all_values(fn.body):
            if isinstance(v, ir.Var) and v.kind == "param":
                uses[v.name] = uses.get(v.name, 0) + 1
            name = reader(v) if isinstance(v, ir.Op) else None
            if name is not None:
                read[name] = read.get(name, 0) + 1
    return [name for name, n in read.items() if n == uses[name]]


def linear_groups(module: ir.Module) -> list:
    """Linear weights that multiply the very same input, to be fused into one matmul: [(name, ...)].

    Two `linear` ops share an input when it is the same local, not reassigned between them (q, k
    and v of one norm's output; gate and up). Only weights from `linear_weights`, untied, without
    a bias, stacked alike and of one input width are grouped, and a weight in two different groups
    (across entries) is left out of both. A wrong guess costs speed only: the runtime computes a
    group's matmul per input tensor and hands each member its columns.
    """
    listed = linear_weights(module)
    ties = tied_params(module)
    tied = set(ties) | set(ties.values())
    found: dict = {}
    for entry, fn in module.entries.items():
        generation: dict = {}

        def visit(body):
            for s in body:
                for top in stmt_values(s):
                    for v in values(top):
                        if not (isinstance(v, ir.Op) and v.op == "linear" and "bias" not in v.kwargs):
                            continue
                        x, w = v.kwargs["x"], v.kwargs["w"]
                        if isinstance(w, ir.Op) and w.op == "index":
                            w = w.kwargs["x"]
                        if not (isinstance(x, ir.Var) and x.kind == "local" and isinstance(w, ir.Var)):
                            continue
                        if w.name in listed and w.name not in tied:
                            members = found.setdefault((entry, x.name, generation.get(x.name, 0)), [])
                            if w.name not in members:
                                members.append(w.name)
                if isinstance(s, ir.Assign):
                    for name in s.targets:
                        generation[name] = generation.get(name, 0) + 1
                if isinstance(s, ir.For):
                    visit(s.body)

        visit(fn.body)
    groups = {tuple(sorted(m)) for m in found.values() if len(m) > 1}
    shape = lambda n: module.params[n].type
    groups = {g for g in groups
              if len({(listed[n], str(shape(n).shape[-1]), concrete_dtype(shape(n).dtype, module)) for n in g}) == 1}
    counts: dict = {}
    for g in groups:
        for n in g:
            counts[n] = counts.get(n, 0) + 1
    return sorted(g for g in groups if all(counts[n] == 1 for n in g))


def fused_outputs(module: ir.Module) -> dict:
    """Linear weights that hold several projections by rows (Phi-3's q/k/v and gate/up): those whose
    every product (no bias) goes to a local read only through slices of its last axis that tile
    it, in every entry. {param: ((start, stop), ...)}, the parts in row order, in numbers (the
    module is specialized). On a mesh each part splits over the devices on its own
    (`JaxModel`), so that a device computes its own heads and its own share of gate and up."""
    found: dict = {}
    for fn in module.entries.values():
        for name, (weight, parts) in _fused_locals(fn, module).items():
            if found.setdefault(weight, parts) != parts:
                found[weight] = None  # sliced otherwise elsewhere: not one layout
    return {w: parts for w, parts in found.items() if parts}


def _fused_locals(fn: ir.Function, module: ir.Module) -> dict:
    """{local: (param, parts)} for `fused_outputs`, in one entry."""
    products: dict = {}  # local -> the weight of every linear assigned to it (None: something else)
    for st in _statements(fn.body):
        if isinstance(st, ir.Assign):
            v = st.value
            w = v.kwargs["w"] if isinstance(v, ir.Op) and v.op == "linear" and "bias" not in v.kwargs else None
            if isinstance(w, ir.Op) and w.op == "index":
                w = w.kwargs["x"]
            weight = w.name if isinstance(w, ir.Var) and w.kind == "param" and len(st.targets) == 1 else None
            for t in st.targets:
                products[t] = weight if products.get(t, weight) == weight else None
    slices: dict = {name: set() for name, w in products.items() if w is not None}
    for v in all_values(fn.body):
        if not isinstance(v, ir.Op):
            continue
        for key, child in list(v.kwargs.items()) + list(enumerate(v.args)):
            if not (isinstance(child, ir.Var) and child.kind == "local" and child.name in slices):
                continue
            bounds = _last_axis_slice(v, child, module) if key == "x" else None
            if bounds is None:
                slices.pop(child.name)  # read whole, or otherwise than by its features
            else:
                slices[child.name].add(bounds)
    out = {}
    for name, parts in slices.items():
        parts = tuple(sorted(parts))
        total = module.params[products[name]].type.shape[-2].evaluate(module.bindings)
        if len(parts) > 1 and parts[0][0] == 0 and parts[-1][1] == total and \
                all(a[1] == b[0] for a, b in zip(parts, parts[1:])):
            out[name] = (products[name], parts)
    return out


def _statements(body: list):
    for st in body:
        yield st
        if isinstance(st, ir.For):
            yield from _statements(st.body)


def _last_axis_slice(v: ir.Op, x: ir.Var, module: ir.Module):
    """(start, stop) where `v` is `x[:, ..., start:stop]` (numbers), else None."""
    if v.op != "index" or len(v.args) != x.type.rank or not all(isinstance(a, ir.Slice) for a in v.args):
        return None
    if any(a.start is not None or a.stop is not None for a in v.args[:-1]):
        return None
    last, width = v.args[-1], x.type.shape[-1].evaluate(module.bindings)
    if (last.start is not None and last.start_dim is None) or (last.stop is not None and last.stop_dim is None):
        return None
    start = 0 if last.start is None else Dim.of(last.start_dim).evaluate(module.bindings)
    stop = width if last.stop is None else Dim.of(last.stop_dim).evaluate(module.bindings)
    return (start, stop) if 0 <= start < stop <= width else None


# ops whose result is whole even when an input is split (they reduce over, or regather, the features);
# any other op (elementwise, shapes, rope) is split when one of its inputs is
_REDUCING = {"rmsnorm", "layer_norm", "sum", "mean", "max", "min", "argmax", "softmax", "topk", "einsum", "matmul",
             "index", "take", "concat", "expert_linear"}


def shard_plan(module: ir.Module) -> tuple[dict, dict]:
    """Tensor parallelism, Megatron's way, read off the dataflow: ({param: axis}, {state: axis}).

    A `linear` whose input is whole (a norm's output) splits its weight's output rows over the
    devices (column parallel: each device computes its share of the features); one whose input is
    already split (attention's heads, or a column-parallel output through elementwise ops) splits
    its weight's input columns (row parallel: XLA sums the partial products once). A column-
    parallel bias splits with its rows. Experts split over the expert axis. A cache handed to
    `attention` splits over its kv heads. Every other param is replicated. Axes count the stacked
    layer dim. A backend places each array so (where the axis divides evenly) and XLA's
    partitioner inserts the collectives; the plan costs speed when wrong, never correctness.
    A slice of a fused projection's output (`fused_outputs`) stays split: the runtime splits each
    part of such a weight on its own, so a device's share of the product holds its share of each.
    `module` must have its fns inlined.
    """
    params: dict = {}
    states: dict = {}
    fused_weights = fused_outputs(module)
    fused: set = set()  # the current entry's locals holding a fused projection's output

    def weight_of(w):
        if isinstance(w, ir.Op) and w.op == "index" and w.args and isinstance(w.kwargs.get("x"), ir.Var):
            w = w.kwargs["x"]
        return w.name if isinstance(w, ir.Var) and w.kind == "param" else None

    def split(v, env) -> bool:
        if isinstance(v, ir.Var):
            return env.get(v.name, False) if v.kind == "local" else False
        if not isinstance(v, ir.Op):
            return False
        if v.op == "linear":
            name, inner = weight_of(v.kwargs["w"]), split(v.kwargs["x"], env)
            if name is not None:
                stacked = module.params[name].loop_var is not None
                params.setdefault(name, int(stacked) + (1 if inner else 0))
                bias = weight_of(v.kwargs["bias"]) if "bias" in v.kwargs else None
                if bias is not None and not inner:
                    params.setdefault(bias, int(module.params[bias].loop_var is not None))
            return not inner
        if v.op == "attention":
            for cache in (v.kwargs["k_cache"], v.kwargs["v_cache"]):
                c = cache.kwargs["x"] if isinstance(cache, ir.Op) and cache.op == "index" else cache
                if isinstance(c, ir.Var) and c.kind == "state":
                    states[c.name] = module.state[c.name].type.rank - 2  # [..., kv_heads, head_dim]
            for child in v.kwargs.values():
                split(child, env)
            return True
        if v.op == "index" and isinstance(v.kwargs.get("x"), ir.Var) and v.kwargs["x"].name in fused:
            return split(v.kwargs["x"], env)  # (every read of such a local is a slice of its features)
        if v.op == "expert_linear":
            for key in ("w", "bias"):
                name = weight_of(v.kwargs[key]) if key in v.kwargs else None
                if name is not None:
                    params.setdefault(name, int(module.params[name].loop_var is not None))
        parts = [split(c, env) for c in list(v.kwargs.values()) + list(v.args) if isinstance(c, ir.Value)]
        return any(parts) and v.op not in _REDUCING

    def visit(body, env):
        for s in body:
            if isinstance(s, ir.Assign):
                value = split(s.value, env)
                for t in s.targets:
                    env[t] = value
            elif isinstance(s, ir.For):
                visit(s.body, env)
            else:
                for v in stmt_values(s):
                    split(v, env)

    for fn in module.entries.values():
        fused = {name for name, (w, _) in _fused_locals(fn, module).items() if w in fused_weights}
        visit(fn.body, {})
    return params, states
