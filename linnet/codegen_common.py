"""What both code generators compute from a specialized module before writing code."""

from __future__ import annotations

from linnet.ir import nodes as ir
from linnet.ir.dims import Dim
from linnet.ir.specialize import concrete_dtype, evaluate
from linnet.ir.types import TensorType
from linnet.ir.walk import all_values
from linnet.pyemit import dim_py

ROPE_ARGS = ("theta", "scaling", "factor", "low_freq_factor", "high_freq_factor", "original_max", "beta_fast", "beta_slow")


def rope_tables(module: ir.Module) -> dict:
    """Each distinct rope configuration in the entries -> (table name, table arguments)."""
    tables: dict = {}
    for fn in module.entries.values():
        for v in all_values(fn.body):
            if isinstance(v, ir.Op) and v.op == "rope":
                key = rope_key(v, module)
                if key not in tables:
                    tables[key] = f"rope_{len(tables)}"
    return tables


def rope_key(v: ir.Op, module: ir.Module) -> tuple:
    head_dim = v.kwargs["x"].type.shape[2].evaluate(_sizes(module))
    args = tuple((name, evaluate(v.kwargs[name], module.bindings)) for name in ROPE_ARGS if name in v.kwargs)
    return (head_dim,) + args


def rope_table_args(key: tuple, module: ir.Module) -> str:
    head_dim, *named = key
    return ", ".join([str(head_dim), "MaxSeq"] + [f"{k}={v!r}" for k, v in named])


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
