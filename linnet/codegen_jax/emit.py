"""IR to the Python source of pure JAX functions over a params pytree.

Each entry becomes `entry(params, state, *args) -> (result, state)`; the state
(the cache) is threaded through and donated to XLA by the runtime's `JaxModel`.
"""

from __future__ import annotations

from linnet.codegen_common import (entry_dim_sources, fused_outputs, linear_groups, linear_weights, rope_key,
                                   rope_table_args, rope_tables, shard_plan)
from linnet.codegen_jax.loops import compiled_loop
from linnet.frontend.scope import RESERVED
from linnet.ir import nodes as ir
from linnet.ir.passes import inline_calls
from linnet.ir.types import SIZE_GENERICS, NoneType, ScalarType
from linnet.ir.walk import assigned_names
from linnet.pyemit import PythonEmitter

JNP_DTYPES = {"f32": "jnp.float32", "bf16": "jnp.bfloat16", "f16": "jnp.float16", "i32": "jnp.int32",
              "i64": "jnp.int64", "bool": "jnp.bool_"}
UNARY = {"exp": "jnp.exp", "log": "jnp.log", "sqrt": "jnp.sqrt", "rsqrt": "jax.lax.rsqrt", "tanh": "jnp.tanh",
         "sigmoid": "jax.nn.sigmoid", "silu": "jax.nn.silu", "gelu": "rt.gelu", "relu": "jax.nn.relu",
         "sin": "jnp.sin", "cos": "jnp.cos", "erf": "jax.scipy.special.erf", "abs": "jnp.abs"}


def generate(module: ir.Module) -> str:
    """The source of a module defining one pure function per entry and `Model(params)`."""
    return _JaxEmitter(inline_calls(module)).module_source()


class _JaxEmitter(PythonEmitter):
    backend = "jax"
    dtypes = JNP_DTYPES

    def __init__(self, module):
        super().__init__(module)
        self.ropes = rope_tables(module)

    def module_source(self) -> str:
        m = self.module
        self.header("JAX functions", [
            "Use: `model = Model(weights)`, `weights` a dict {param: array} named, shaped and typed as PARAMS says;",
            "then `model." + self.example_call() + "` returns the entry's result and keeps the new cache",
            "(STATE) for the next call, each entry jitted once. The functions below are the entries as pure",
            "functions of (params, state, arguments), returning (result, new state). The code needs jax and",
            "Linnet's runtime (`linnet.codegen_jax.runtime`)."])
        self.imports({"import math": "math"}, {"import jax": "jax", "import jax.numpy as jnp": "jnp"},
                     {"from linnet.codegen_jax import runtime as rt": "rt"})
        self.config_lines()
        self.line(f"FAST = {m.bindings['numerics'] == 'fast'}")
        self.line("")
        self.tables()
        if self.ropes:
            self.line("")
            self.line("# Rotary tables (cos, sin) for every position, computed once.")
        for table in self.ropes.values():
            self.comment_for(table.op.loc)
            self.line(f"{table.name.upper()} = rt.rope_table({rope_table_args(table, self.expr)})")
        for fn in m.entries.values():
            self.entry(fn)
        self.line("")
        self.line("")
        self.line("class Model(rt.JaxModel):")
        self.depth += 1
        self.line('"""Weights and cache as device arrays; entries jitted, the cache donated."""')
        self.line("")
        self.line("params, tied, state = PARAMS, TIED, STATE")
        self.line(f"entries = {{{', '.join(f'{n!r}: {n}' for n in m.entries)}}}")
        stacked = tuple(p.name for p in m.params.values() if p.loop_var)
        self.line(f"stacked = {stacked!r}  # params with one array per layer")
        self.line(f"linear_groups = {linear_groups(m)!r}  # weights of one input: with fast numerics, one matmul")
        self.line(f"linear_weights = {linear_weights(m)!r}  # name -> stacked: the runtime may hold these as panels")
        shard_params, shard_state = shard_plan(m)
        self.line(f"shard_params = {shard_params!r}  # on a mesh: the axis each param splits on (tensor parallel)")
        self.line(f"shard_state = {shard_state!r}  # the caches split over their kv heads")
        self.line(f"fused_parts = {fused_outputs(m)!r}  # weights holding several projections: their rows' parts")
        self.line("fast = FAST")
        self.depth -= 1
        return self.source()

    def entry(self, fn: ir.Function):
        m = self.module
        self.line("")
        self.line("")
        self.line(f"def {fn.name}(params, state, {', '.join(n for n, _ in fn.args)}):")
        self.depth += 1
        self.entry_docstring(fn, "({}, new state)")
        self.last_comment = None
        self.iota_rows = set()
        self.fn = fn
        written = [s for s in self.module.state]
        if written:  # an architecture without state has nothing to unpack
            self.line(f"{', '.join(written)} = {', '.join(f'state[{n!r}]' for n in written)}")
        for d, arg, axis in entry_dim_sources(fn):
            self.line(f"{d} = {arg}.shape[{axis}]", binds=d)
        self.state_dict = "{" + ", ".join(f"{n!r}: {n}" for n in written) + "}"
        # the names the entry's code reads or binds: a name made up here must be none of them
        self.taken = ({n for n, _ in fn.args} | set(fn.dims) | assigned_names(fn.body) | set(m.config) | set(m.state)
                      | set(m.entries) | set(SIZE_GENERICS) | RESERVED)
        self.body(fn.body)
        if isinstance(fn.ret, NoneType):
            self.line(f"return None, {self.state_dict}")
        self.depth -= 1

    def loop(self, s: ir.For):
        """A loop `loops.compiled_loop` admits, as a function of its index that `rt.loop` runs:
        XLA compiles its body once rather than once a turn, where the runtime can (see `rt.loop`)."""
        top = next((i for i, t in enumerate(self.fn.body) if t is s), None)
        state = {name: st.type for name, st in self.module.state.items()}
        plan = None if top is None else compiled_loop(s, self.fn, self.fn.body[:top], state)
        if plan is None:
            return super().loop(s)
        names = ", ".join(plan.carried) + ("," if len(plan.carried) == 1 else "")
        body, carry = self.fresh(f"loop_{s.var}"), self.fresh("carry")
        self.line(f"def {body}({s.var}, {carry}):  # one turn of the loop; rt.loop may compile it once for every turn")
        self.depth += 1
        self.line(f"{names} = {carry}")
        self.last_comment = None
        self.body(s.body)
        self.line(f"return {names}")
        self.depth -= 1
        self.last_comment = None
        self.comment_for(s.loc)
        self.line(f"{names} = rt.loop({self.expr(s.count)}, {body}, ({names}))")

    def fresh(self, name: str) -> str:
        """`name`, or `name_1`, `name_2`, ...: the first the entry does not use otherwise (two loops
        may share one: each is used just after it is defined)."""
        out, i = name, 0
        while out in self.taken:
            i += 1
            out = f"{name}_{i}"
        return out

    def var(self, v: ir.Var) -> str:
        return f'params["{v.name}"]' if v.kind == "param" else v.name

    def store(self, s: ir.Store):
        if not s.indices:
            self.line(f"{s.state} = {self.expr(s.value)}")
            return
        # rt.put is `{state}.at[indices].set(value, mode="drop")`: entries outside the state (padding tokens) write nothing
        self.line(f"{s.state} = rt.put({s.state}, {self.index_tuple(s.indices)}, {self.expr(s.value)})")

    def ret(self, s: ir.Return):
        self.line(f"return {self.expr(s.value)}, {self.state_dict}")

    # -- ops
    def op_cast(self, v, k):
        return f"{self.paren(k['x'], 89)}.astype({JNP_DTYPES[self.dtype_of(v.type)]})"

    def op_einsum(self, v, k):
        return f"jnp.einsum({self.expr(k['spec'])}, {', '.join(self.expr(a) for a in v.args)})"

    def op_where(self, v, k):
        return f"jnp.where({self.expr(k['cond'])}, {self.expr(k['a'])}, {self.expr(k['b'])})"

    def op_maximum(self, v, k):
        fn = "max" if isinstance(v.type, ScalarType) else "jnp.maximum"
        return f"{fn}({self.expr(k['a'])}, {self.expr(k['b'])})"

    def op_minimum(self, v, k):
        fn = "min" if isinstance(v.type, ScalarType) else "jnp.minimum"
        return f"{fn}({self.expr(k['a'])}, {self.expr(k['b'])})"

    def op_and(self, v, k):
        return f"jnp.logical_and({self.expr(k['a'])}, {self.expr(k['b'])})"

    def op_or(self, v, k):
        return f"jnp.logical_or({self.expr(k['a'])}, {self.expr(k['b'])})"

    def op_not(self, v, k):
        return f"jnp.logical_not({self.expr(k['x'])})"

    def _reduce(self, v, k, fn):
        keep = ", keepdims=True" if "keepdim" in k and k["keepdim"].value else ""
        return f"{fn}({self.expr(k['x'])}, axis={self.axis(k.get('axis'))}{keep})"

    # sums and means in one order at every row count (`fixed_order`): XLA's own vary with the shape
    def op_sum(self, v, k):
        return self._reduce(v, k, "rt.fixed_order.sum_over")

    def op_mean(self, v, k):
        return self._reduce(v, k, "rt.fixed_order.mean_over")

    def op_max(self, v, k):
        return self._reduce(v, k, "jnp.max")

    def op_min(self, v, k):
        return self._reduce(v, k, "jnp.min")

    def op_argmax(self, v, k):
        return self._reduce(v, k, "jnp.argmax") + ".astype(jnp.int32)"

    def rope_table(self, v) -> str:
        return self.ropes[rope_key(v, self.module)].name.upper()

    def op_transpose(self, v, k):
        axes = [str(a.value) for a in v.args]
        return f"jnp.transpose({self.expr(k['x'])}, ({', '.join(axes)}{',' if len(axes) == 1 else ''}))"

    def op_unsqueeze(self, v, k):
        return f"jnp.expand_dims({self.expr(k['x'])}, {self.axis(k['axis'])})"

    def op_concat(self, v, k):
        return f"jnp.concatenate({self.expr(k['items'])}, axis={self.axis(k.get('axis'))})"

    def op_take(self, v, k):
        return f"jnp.take({self.expr(k['x'])}, {self.expr(k['indices'])}, axis={self.axis(k.get('axis'), 0)})"

    def op_iota(self, v, k):
        return f"jnp.arange({self.dims(v.dims)}, dtype=jnp.int32)"

    def op_zeros(self, v, k):
        return f"jnp.zeros({self.shape(v.dims)}, dtype={JNP_DTYPES[self.dtype_of(v.type)]})"

    def cache_arg(self, c: ir.Value) -> str:
        # One layer of a stacked cache (`k_cache[l]`) goes to attention unsliced, as `rt.layer(k_cache, l)`:
        # its chunk walks read straight from the stack, where a slice would be copied whole first.
        if isinstance(c, ir.Op) and c.op == "index" and len(c.args) == 1 and isinstance(c.kwargs["x"], ir.Var):
            return f"rt.layer({self.expr(c.kwargs['x'])}, {self.expr(c.args[0])})"
        return self.expr(c)

    def op_copy_rows(self, v, k):
        return f"rt.copy_rows({self.expr(k['cache'])}, {self.expr(k['src'])}, {self.expr(k['dst'])}, {self.expr(k['upto'])})"

    def __getattr__(self, name):
        if name.startswith("op_") and name[3:] in UNARY:
            fn = UNARY[name[3:]]  # on a tensor (a static number is the shared emitter's: pyemit.STATIC_UNARY)
            return lambda v, k: f"{fn}({self.expr(k['x'])})"
        raise AttributeError(name)
