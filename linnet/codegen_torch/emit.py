"""IR to the Python source of a PyTorch module."""

from __future__ import annotations

from linnet.codegen_torch.aliases import state_copies
from linnet.codegen_common import (entry_dim_sources, expert_weights, gathered_tables, linear_groups, linear_weights,
                                   rope_key, rope_table_args, rope_tables)
from linnet.ir import nodes as ir
from linnet.ir.passes import inline_calls
from linnet.ir.types import NoneType, ScalarType, TensorType
from linnet.pyemit import CMP, POSTFIX, PythonEmitter

TORCH_DTYPES = {"f32": "torch.float32", "bf16": "torch.bfloat16", "f16": "torch.float16", "i32": "torch.int32",
                "i64": "torch.int64", "bool": "torch.bool"}
UNARY = {"exp": "torch.exp", "log": "torch.log", "sqrt": "torch.sqrt", "rsqrt": "torch.rsqrt", "tanh": "torch.tanh",
         "sigmoid": "torch.sigmoid", "silu": "F.silu", "gelu": "F.gelu", "relu": "F.relu", "sin": "torch.sin",
         "cos": "torch.cos", "erf": "torch.erf", "abs": "torch.abs"}


def generate(module: ir.Module) -> str:
    """The source of a module defining `Model(params, device)` with one method per entry."""
    return _TorchEmitter(inline_calls(module)).module_source()


class _TorchEmitter(PythonEmitter):
    backend = "torch"
    dtypes = TORCH_DTYPES

    def __init__(self, module):
        super().__init__(module)
        self.ropes = rope_tables(module)

    def module_source(self) -> str:
        m = self.module
        self.header("PyTorch module", [
            "Use: `model = Model(weights, device=\"cpu\")`, `weights` a dict {param: tensor or numpy array} named,",
            "shaped and typed as PARAMS says; then one method per entry, `model." + self.example_call() + "`,",
            "tensors or numpy arrays in. The cache (STATE) lives in the model from call to call. The code needs",
            "torch and Linnet's runtime (`linnet.codegen_torch.runtime`)."])
        self.imports({"import math": "math"}, {"import torch": "torch", "import torch.nn.functional as F": "F"},
                     {"from linnet.codegen_torch import runtime as rt": "rt"})
        self.config_lines()
        self.line(f"FAST = {m.bindings['numerics'] == 'fast'}")
        self.line("")
        self.tables()
        self.line("")
        self.line("")
        self.line("class Model(rt.TorchModel):")
        self.depth += 1
        self.line('"""Weights and cache on one device; each entry runs under inference mode."""')
        self.line("")
        self.line("params, tied, state = PARAMS, TIED, STATE")
        self.line(f"linear_weights = {linear_weights(m)!r}  # name -> stacked: the runtime may pack these")
        self.line(f"linear_groups = {linear_groups(m)!r}  # weights of one input: with fast numerics, one matmul")
        if expert_weights(m):
            self.line(f"expert_weights = {expert_weights(m)!r}  # name -> stacked: the runtime may pack each expert")
        if gathered_tables(m):
            self.line(f"gathered_tables = {gathered_tables(m)!r}  # params read only as gathered rows")
        self.line("fast = FAST")
        if "Batch" in m.bindings:
            self.line("pack_rows = Batch  # a decode step's rows")
        self.line("")
        self.line("def init_tables(self):")
        self.depth += 1
        if not self.ropes:
            self.line("pass")
        for table in self.ropes.values():
            self.comment_for(table.op.loc)
            self.line(f"self.{table.name} = rt.rope_table({rope_table_args(table, self.expr)}).to(self.device)")
        self.depth -= 1
        for fn in m.entries.values():
            self.entry(fn)
        self.depth -= 1
        return self.source()

    def entry(self, fn: ir.Function):
        m = self.module
        self.line("")
        self.line("@torch.inference_mode()")
        self.line(f"def {fn.name}(self, {', '.join(n for n, _ in fn.args)}):")
        self.depth += 1
        self.entry_docstring(fn)
        self.last_comment = None
        self.iota_rows = set()
        tensors = [n for n, t in fn.args if isinstance(t, TensorType)]
        if tensors:  # numpy arrays and tensors on another device are taken too
            self.line(f"{', '.join(tensors)}{',' * (len(tensors) == 1)} = rt.as_tensors(self.device, {', '.join(tensors)})")
        for d, arg, axis in entry_dim_sources(fn):
            self.line(f"{d} = {arg}.shape[{axis}]", binds=d)
        self.copies = state_copies(fn, m.bindings)
        self.body(fn.body)
        if isinstance(fn.ret, NoneType):
            self.line("return None")
        self.depth -= 1

    # -- names and statements
    def var(self, v: ir.Var) -> str:
        return f"self.{v.name}" if v.kind in ("param", "state") else v.name

    def copied(self, v: ir.Value) -> str:
        # a view of state, copied: the state is written in place, and this must keep its value (`aliases`)
        return f"{self.paren(v, 89)}.clone()"

    def assign_note(self, s: ir.Assign) -> str:
        states = sorted(set().union(*(self.copies.bindings.get((id(s), t), ()) for t in s.targets)))
        if not states:
            return ""
        return f"  # copied: {' and '.join(f'self.{n}' for n in states)} changes before this is read"

    def assigned(self, s: ir.Assign) -> str:
        copy = [(id(s), t) in self.copies.bindings for t in s.targets]
        if not any(copy):
            return self.expr(s.value)
        if len(s.targets) == 1:
            return self.copied(s.value)
        return "[" + ", ".join(self.copied(p) if c else self.expr(p) for p, c in zip(s.value.args, copy)) + "]"

    def store(self, s: ir.Store):
        if not s.indices:
            value = s.value
            if isinstance(value, ir.Op) and value.op == "copy_rows" and \
                    isinstance(value.kwargs["cache"], ir.Var) and value.kwargs["cache"].name == s.state:
                k = value.kwargs
                self.line(f"rt.copy_rows_(self.{s.state}, {self.expr(k['src'])}, {self.expr(k['dst'])}, {self.expr(k['upto'])})")
            else:
                self.line(f"self.{s.state}.copy_({self.stored(s)})")
            return
        # rt.put_ is `self.{state}[indices] = value` that drops entries outside the state (padding tokens)
        self.line(f"rt.put_(self.{s.state}, {self.index_tuple(s.indices)}, {self.stored(s)})")

    def stored(self, s: ir.Store) -> str:
        # a view of the very state written: copied first, as the two may overlap
        return self.copied(s.value) if id(s) in self.copies.stores else self.expr(s.value)

    def ret(self, s: ir.Return):
        if id(s) in self.copies.results:
            self.line(f"return {self.copied(s.value)}  # a copy: the next call writes this state")
        else:
            self.line(f"return {self.expr(s.value)}")

    # -- ops
    def emit(self, v: ir.Value) -> tuple[str, int]:
        gated = _gated(v)
        if gated is not None:  # silu(x) * y: the runtime's one call (one kernel on a GPU, with Triton's ops)
            x, y = gated
            return f"rt.silu_mul({self.expr(x)}, {self.expr(y)})", POSTFIX
        return super().emit(v)

    def op_cast(self, v, k):
        return f"{self.paren(k['x'], 89)}.to({TORCH_DTYPES[self.dtype_of(v.type)]})"

    def op_einsum(self, v, k):
        return f"torch.einsum({self.expr(k['spec'])}, {', '.join(self.expr(a) for a in v.args)})"

    def op_where(self, v, k):
        return f"torch.where({self.expr(k['cond'])}, {self.expr(k['a'])}, {self.expr(k['b'])})"

    def op_maximum(self, v, k):
        return self._extremum(v, k, "max", "maximum", "min")

    def op_minimum(self, v, k):
        return self._extremum(v, k, "min", "minimum", "max")

    def _extremum(self, v, k, python, tensors, bound):
        a, b = k["a"], k["b"]
        if isinstance(v.type, ScalarType):
            return f"{python}({self.expr(a)}, {self.expr(b)})"
        if isinstance(a.type, ScalarType) or isinstance(b.type, ScalarType):  # torch.maximum takes tensors only
            t, s = (b, a) if isinstance(a.type, ScalarType) else (a, b)
            return f"torch.clamp({self.expr(t)}, {bound}={self.expr(s)})"
        return f"torch.{tensors}({self.expr(a)}, {self.expr(b)})"

    def op_and(self, v, k):
        return self._logical(k, "logical_and", "&")

    def op_or(self, v, k):
        return self._logical(k, "logical_or", "|")

    def _logical(self, k, function, operator):
        a, b = k["a"], k["b"]
        if isinstance(a.type, ScalarType) or isinstance(b.type, ScalarType):  # torch.logical_* takes tensors only
            return f"({self.paren(a, CMP)} {operator} {self.paren(b, CMP)})"  # (& binds tighter than a comparison)
        return f"torch.{function}({self.expr(a)}, {self.expr(b)})"

    def op_not(self, v, k):
        return f"torch.logical_not({self.expr(k['x'])})"

    def _reduce(self, v, k, method, more=""):
        keep = ", keepdim=True" if "keepdim" in k and k["keepdim"].value else ""
        return f"{self.paren(k['x'], 89)}.{method}(dim={self.axis(k.get('axis'))}{keep}{more})"

    def op_sum(self, v, k):
        # (torch sums an i32 tensor into an i64 one; JAX, and the type, keep i32)
        return self._reduce(v, k, "sum", ", dtype=torch.int32" if v.type.dtype == "i32" else "")

    def op_mean(self, v, k):
        return self._reduce(v, k, "mean")

    def op_max(self, v, k):
        return self._reduce(v, k, "amax")

    def op_min(self, v, k):
        return self._reduce(v, k, "amin")

    def op_argmax(self, v, k):
        return self._reduce(v, k, "argmax") + ".to(torch.int32)"

    def rope_table(self, v) -> str:
        return f"self.{self.ropes[rope_key(v, self.module)].name}"

    def op_transpose(self, v, k):
        return f"{self.paren(k['x'], 89)}.permute({', '.join(str(a.value) for a in v.args)})"

    def op_unsqueeze(self, v, k):
        return f"{self.paren(k['x'], 89)}.unsqueeze({self.axis(k['axis'])})"

    def op_concat(self, v, k):
        return f"torch.cat({self.expr(k['items'])}, dim={self.axis(k.get('axis'))})"

    def op_take(self, v, k):
        return f"rt.take({self.expr(k['x'])}, {self.expr(k['indices'])}, {self.axis(k.get('axis'), 0)})"

    def op_iota(self, v, k):
        return f"torch.arange({self.dims(v.dims)}, dtype=torch.int32, device=self.device)"

    def op_zeros(self, v, k):
        return f"torch.zeros({self.shape(v.dims)}, dtype={TORCH_DTYPES[self.dtype_of(v.type)]}, device=self.device)"

    def op_copy_rows(self, v, k):
        return f"rt.copy_rows_({self.expr(k['cache'])}.clone(), {self.expr(k['src'])}, {self.expr(k['dst'])}, {self.expr(k['upto'])})"

    def __getattr__(self, name):
        if name.startswith("op_") and name[3:] in UNARY:
            fn = UNARY[name[3:]]  # on a tensor (a static number is the shared emitter's: pyemit.STATIC_UNARY)
            return lambda v, k: f"{fn}({self.expr(k['x'])})"
        raise AttributeError(name)


def _gated(v: ir.Value) -> tuple | None:
    """(x, y) where v is the tensor product silu(x) * y (or y * silu(x)) of one shape: a gated MLP."""
    if not (isinstance(v, ir.Op) and v.op == "mul" and isinstance(v.type, TensorType)):
        return None
    a, b = v.kwargs["a"], v.kwargs["b"]
    for gate, other in ((a, b), (b, a)):
        if (isinstance(gate, ir.Op) and gate.op == "silu" and isinstance(other.type, TensorType)
                and gate.type == other.type == v.type):
            return gate.kwargs["x"], other
    return None
