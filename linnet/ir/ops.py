"""The ops of the IR and their typing rules.

Each op is registered once with the function that computes its result type
from its arguments' types (or raises a `LinnetError` saying why the call is
wrong). Both code generators map every op here; nothing else is an op.
"""

from __future__ import annotations

from typing import Callable

from linnet.errors import LinnetError, Loc
from linnet.ir.dims import Dim
from linnet.ir.nodes import Const, Slice, Value
from linnet.ir.types import (BOOL, DTYPES, FLOAT, INT, ScalarType, TensorType, TupleType, is_float, is_int,
                             shape_str)

Infer = Callable[..., object]


class OpSpec:
    def __init__(self, name: str, infer: Infer, params: tuple, doc: str):
        self.name = name
        self.infer = infer
        self.params = params  # positional parameter names; "*name" takes the rest
        self.doc = doc


OPS: dict[str, OpSpec] = {}


def op(name: str, params: tuple = (), doc: str = ""):
    def register(fn: Infer) -> Infer:
        OPS[name] = OpSpec(name, fn, params, doc)
        return fn

    return register


# ---------------------------------------------------------------- helpers


def _err(loc: Loc, msg: str, *notes: str) -> LinnetError:
    return LinnetError(loc, msg, list(notes))


def _tensor(v: Value, what: str, loc: Loc) -> TensorType:
    if not isinstance(v.type, TensorType):
        raise _err(v.loc or loc, f"{what} must be a tensor, not {v.type}")
    return v.type


def _static(v: Value | None, kind: str, what: str, loc: Loc):
    if v is None:
        return None
    if not (isinstance(v.type, ScalarType) and (v.type.kind == kind or (kind == "float" and v.type.kind == "int"))):
        raise _err(v.loc or loc, f"{what} must be a static {kind}, not {v.type}")
    return v


def _axis(v: Value | None, rank: int, loc: Loc, default: int = -1) -> int:
    if v is None:
        return default % rank if rank else 0
    if not isinstance(v, Const) or not isinstance(v.value, int):
        raise _err(v.loc or loc, "an axis must be an integer literal")
    if not -rank <= v.value < rank:
        raise _err(v.loc, f"axis {v.value} is out of range for a tensor of rank {rank}")
    return v.value % rank


def broadcast(a: tuple, b: tuple, loc: Loc, what: str, ta=None, tb=None) -> tuple:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        da = a[-i] if i <= len(a) else Dim.const(1)
        db = b[-i] if i <= len(b) else Dim.const(1)
        if da == db or db == Dim.const(1):
            out.append(da)
        elif da == Dim.const(1):
            out.append(db)
        else:
            raise _err(loc, f"cannot {what} {ta} and {tb}",
                       f"axis {-i}: {da} vs {db} (dims broadcast when equal, or when one is 1)")
    return tuple(reversed(out))


def same_dtype(a: TensorType, b: TensorType, loc: Loc, what: str) -> str:
    if a.dtype != b.dtype:
        raise _err(loc, f"cannot {what} {a} and {b}: element types differ",
                   f"convert one with `as`, e.g. `x as {b.dtype}`")
    return a.dtype


def numel_equal(a: tuple, b: tuple) -> bool:
    pa, pb = Dim.const(1), Dim.const(1)
    for d in a:
        pa = pa * d
    for d in b:
        pb = pb * d
    return pa == pb


# ---------------------------------------------------------------- elementwise

_ARITH_VERBS = {"add": "add", "sub": "subtract", "mul": "multiply", "div": "divide", "floordiv": "divide",
                "mod": "take the remainder of", "pow": "raise", "lt": "compare", "le": "compare",
                "gt": "compare", "ge": "compare", "eq": "compare", "ne": "compare", "and": "combine",
                "or": "combine", "maximum": "take the maximum of", "minimum": "take the minimum of"}
COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")
_ARITHMETIC = ("add", "sub", "mul", "div", "floordiv", "mod", "pow")
_ORDERS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _binary(name):
    def infer(a: Value, b: Value, *, loc: Loc):
        verb = _ARITH_VERBS[name]
        ta, tb = a.type, b.type
        if isinstance(ta, ScalarType) and isinstance(tb, ScalarType):
            if name == "pow":
                _negative_int_power(a, b, loc)
            return _static_binary(name, ta, tb, loc)
        if isinstance(ta, TensorType) and isinstance(tb, TensorType):
            shape = broadcast(ta.shape, tb.shape, loc, verb, ta, tb)
            dtype = same_dtype(ta, tb, loc, verb)
        else:
            t = ta if isinstance(ta, TensorType) else tb
            s = tb if t is ta else ta
            if not isinstance(t, TensorType) or not isinstance(s, ScalarType):
                raise _err(loc, f"cannot {verb} {ta} and {tb}")
            if s.kind == "str":
                raise _err(loc, f"cannot {verb} {t} and a string")
            if s.kind == "float" and not is_float(t.dtype):
                raise _err(loc, f"cannot {verb} {t} and a float: convert with `as`")
            if s.kind == "bool" and name in _ARITHMETIC:
                raise _err(loc, f"cannot {verb} {t} and a bool")
            shape, dtype = t.shape, t.dtype
        if name in ("and", "or") and dtype != "bool":
            raise _err(loc, f"`{name}` needs bool tensors, not {ta} and {tb}")
        if name in _ARITHMETIC and dtype == "bool":  # (torch and JAX would count them as ints, or refuse)
            raise _err(loc, f"cannot {verb} bool tensors: convert them with `as` first (`mask as i32`)")
        if name == "div" and is_int(dtype):  # (the backends divide into floats, which the type would not say)
            raise _err(loc, "`/` of integer tensors makes fractions: divide whole numbers with `//`, or convert "
                            "with `as` first")
        if name in ("floordiv", "mod") and not is_int(dtype):
            raise _err(loc, f"`{'//' if name == 'floordiv' else '%'}` needs integer tensors, not {dtype}")
        return TensorType("bool" if name in COMPARISONS else dtype, shape)

    return infer


def _static_binary(name: str, ta: ScalarType, tb: ScalarType, loc: Loc) -> ScalarType:
    if name in COMPARISONS:
        numbers = ta.kind in ("int", "float") and tb.kind in ("int", "float")
        if not numbers and ta.kind != tb.kind:
            raise _err(loc, f"cannot compare {ta} and {tb}")
        if not numbers and name not in ("eq", "ne"):  # Python's order of strings or bools means nothing here
            raise _err(loc, f"cannot order {ta} values with `{_ORDERS[name]}`: only == and != compare them")
        return BOOL
    if name in ("and", "or"):
        if ta.kind != "bool" or tb.kind != "bool":
            raise _err(loc, f"`{name}` needs bools, not {ta} and {tb}")
        return BOOL
    if "str" in (ta.kind, tb.kind) or "bool" in (ta.kind, tb.kind):
        raise _err(loc, f"cannot {_ARITH_VERBS[name]} {ta} and {tb}")
    if name in ("floordiv", "mod") and (ta.kind != "int" or tb.kind != "int"):
        raise _err(loc, f"`{'//' if name == 'floordiv' else '%'}` needs ints, not {ta} and {tb}")
    return INT if ta.kind == tb.kind == "int" else FLOAT


def _negative_int_power(a: Value, b: Value, loc: Loc):
    """`2 ** -1` between static ints is not an int (one known only with numbers is refused when
    specialized)."""
    if isinstance(b, Const) and isinstance(b.value, int) and not isinstance(b.value, bool) and b.value < 0 \
            and a.type == INT:
        raise _err(loc, f"an int to a negative power is not a whole number: write a float, such as 2.0 ** {b.value}")


for _name in _ARITH_VERBS:
    op(_name, ("a", "b"))(_binary(_name))


def _unary(name: str, float_only: bool):
    shown = "-" if name == "neg" else name  # as the source writes it

    def infer(x: Value, *, loc: Loc):
        if isinstance(x.type, ScalarType):
            if name == "not":
                if x.type.kind != "bool":
                    raise _err(loc, f"`not` needs a bool, not {x.type}")
                return BOOL
            if name in ("neg", "abs") and x.type.kind in ("int", "float"):
                return x.type
            if x.type.kind in ("int", "float") and name in UNARY_FLOAT:  # a static number: Python's math
                return FLOAT
            raise _err(loc, f"`{shown}` needs a tensor or a number, not {x.type}")
        t = _tensor(x, f"the argument of `{shown}`", loc)
        if name == "not" and t.dtype != "bool":
            raise _err(loc, f"`not` needs a bool tensor, not {t}")
        if name in ("neg", "abs") and t.dtype == "bool":
            raise _err(loc, f"`{shown}` needs a number tensor, not {t}: convert it with `as` first")
        if float_only and not is_float(t.dtype):
            raise _err(loc, f"`{name}` needs a float tensor, not {t}", "convert it first: `x as f32`")
        return t

    return infer


UNARY_FLOAT = ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "silu", "gelu", "relu", "sin", "cos", "erf")
for _name in UNARY_FLOAT:
    op(_name, ("x",))(_unary(_name, True))
GELU_FORMS = ("none", "tanh")  # torch's F.gelu `approximate`: the erf form, or the tanh one (transformers' gelu_new)


@op("gelu", ("x", "approximate"), "GELU: the exact (erf) form, or with approximate=\"tanh\" the tanh form")
def _gelu(x: Value, approximate: Value | None = None, *, loc: Loc):
    if approximate is not None:
        if not (isinstance(approximate, Const) and approximate.value in GELU_FORMS):
            got = approximate.value if isinstance(approximate, Const) else approximate.type
            raise _err(approximate.loc or loc, f"`approximate` of `gelu` is one of {', '.join(map(repr, GELU_FORMS))}, "
                                               f"not {got!r}")
        if isinstance(x.type, ScalarType) and approximate.value != "none":
            raise _err(loc, "`gelu` of a static number is the exact (erf) form: `approximate` takes a tensor's")
    return _unary("gelu", True)(x, loc=loc)
op("neg", ("x",))(_unary("neg", False))
op("abs", ("x",))(_unary("abs", False))
op("not", ("x",))(_unary("not", False))


@op("cast", ("x", "dtype"), "x converted to another element type")
def _cast(x: Value, dtype: Value, *, loc: Loc):
    t = _tensor(x, "a value converted with `as`", loc)
    if not isinstance(dtype, Const) or dtype.value not in DTYPES + ("T",):
        raise _err(dtype.loc or loc, f"cannot convert to {getattr(dtype, 'value', dtype.type)!r}: "
                                     f"the element type is one of T, {', '.join(DTYPES)}")
    return TensorType(dtype.value, t.shape)


@op("where", ("cond", "a", "b"), "elementwise choice")
def _where(cond: Value, a: Value, b: Value, *, loc: Loc):
    c = cond
    tc = _tensor(c, "the condition of `where`", loc)
    if tc.dtype != "bool":
        raise _err(c.loc, f"the condition of `where` must be bool, not {tc}")
    ta, tb = a.type, b.type
    if isinstance(ta, TensorType) and isinstance(tb, TensorType):
        same_dtype(ta, tb, loc, "choose between")
        shape = broadcast(ta.shape, tb.shape, loc, "choose between", ta, tb)
        dtype = ta.dtype
    else:
        t = ta if isinstance(ta, TensorType) else tb
        if not isinstance(t, TensorType):
            raise _err(loc, "`where` needs at least one tensor to choose from")
        shape, dtype = t.shape, t.dtype
    return TensorType(dtype, broadcast(tc.shape, shape, loc, "choose with", tc, TensorType(dtype, shape)))


# ---------------------------------------------------------------- contraction


@op("matmul", ("a", "b"), "a @ b over the last two dims, batch dims equal")
def _matmul(a: Value, b: Value, *, loc: Loc):
    ta, tb = _tensor(a, "the left side of `@`", loc), _tensor(b, "the right side of `@`", loc)
    dtype = same_dtype(ta, tb, loc, "multiply")
    if ta.rank < 1 or tb.rank < 1:
        raise _err(loc, f"cannot multiply {ta} and {tb}: `@` needs tensors of rank >= 1")
    ka = ta.shape[-1]
    kb = tb.shape[-2] if tb.rank >= 2 else tb.shape[-1]
    if ka != kb:
        raise _err(loc, f"cannot multiply {ta} and {tb}", f"contracted dims differ: {ka} vs {kb}")
    batch = broadcast(ta.shape[:-2], tb.shape[:-2], loc, "multiply", ta, tb)
    out = batch + (ta.shape[-2:-1] if ta.rank >= 2 else ()) + (tb.shape[-1:] if tb.rank >= 2 else ())
    return TensorType(dtype, out)


@op("linear", ("x", "w", "bias"), "x @ w.T (+ bias): w is [out, in], as checkpoints store it")
def _linear(x: Value, w: Value, bias: Value | None = None, *, loc: Loc):
    tx, tw = _tensor(x, "the input of `linear`", loc), _tensor(w, "the weight of `linear`", loc)
    dtype = same_dtype(tx, tw, loc, "multiply")
    if tw.rank != 2:
        raise _err(w.loc, f"the weight of `linear` must be [out, in], not {tw}")
    if tx.rank < 1 or tx.shape[-1] != tw.shape[1]:
        last = tx.shape[-1] if tx.rank else "()"
        notes = [f"`linear(x, w)` is x @ w.T, with w [out, in] as checkpoints store it: x's last dim ({last}) "
                 f"must be w's last ({tw.shape[1]})"]
        if tx.rank and tx.shape[-1] == tw.shape[0]:  # GPT-2's Conv1D weights are stored [in, out]
            notes.append(f"a weight stored [in, out] is declared [out, in] ([{tw.shape[1]}, {tw.shape[0]}] here) "
                         f"and read with `.transpose()` after its checkpoint name")
        raise _err(loc, f"cannot apply {tw} to {tx}: the input's last dim is not the weight's `in` dim", *notes)
    if bias is not None:
        tb = _tensor(bias, "the bias of `linear`", loc)
        same_dtype(tx, tb, loc, "add")
        if tb.shape != (tw.shape[0],):
            raise _err(bias.loc, f"the bias must be [{tw.shape[0]}], not {tb}")
    return TensorType(dtype, tx.shape[:-1] + (tw.shape[0],))


@op("expert_linear", ("x", "w", "experts", "bias"),
    "each token through its chosen experts: y[i, j] = x[i] @ w[experts[i, j]].T (+ bias[experts[i, j]])")
def _expert_linear(x: Value, w: Value, experts: Value, bias: Value | None = None, *, loc: Loc):
    tx = _tensor(x, "the input of `expert_linear`", loc)
    tw = _tensor(w, "the weights of `expert_linear`", loc)
    te = _tensor(experts, "the experts of `expert_linear`", loc)
    dtype = same_dtype(tx, tw, loc, "multiply")
    if tw.rank != 3:
        raise _err(w.loc, f"the weights of `expert_linear` must be [experts, out, in], not {tw}")
    if te.dtype != "i32" or te.rank != 2:
        raise _err(experts.loc, f"the experts of `expert_linear` must be i32[n, k], not {te}")
    n, k = te.shape
    if tx.rank not in (2, 3) or tx.shape[0] != n or (tx.rank == 3 and tx.shape[1] != k):
        raise _err(x.loc, f"the input of `expert_linear` must be [{n}, in] or [{n}, {k}, in] for experts {te}, not {tx}")
    if tx.shape[-1] != tw.shape[2]:
        raise _err(loc, f"cannot apply {tw} to {tx}",
                   f"the input's last dim ({tx.shape[-1]}) must equal the weights' `in` dim ({tw.shape[2]})")
    if bias is not None:
        tb = _tensor(bias, "the bias of `expert_linear`", loc)
        same_dtype(tx, tb, loc, "add")
        if tb.shape != tw.shape[:2]:
            raise _err(bias.loc, f"the bias must be [{tw.shape[0]}, {tw.shape[1]}] (one row per expert), not {tb}")
    return TensorType(dtype, (n, k, tw.shape[1]))


@op("einsum", ("spec", "*operands"), "einsum with a literal spec such as \"nhd,hkd->nhk\"")
def _einsum(spec: Value, *operands: Value, loc: Loc):
    if not isinstance(spec, Const) or not isinstance(spec.value, str):
        raise _err(spec.loc, "the first argument of `einsum` must be a string literal")
    text = spec.value.replace(" ", "")
    if "->" not in text:
        raise _err(spec.loc, "an einsum spec needs an explicit output: \"ab,bc->ac\"")
    ins, out = text.split("->", 1)
    ins = ins.split(",")
    if out and not out.isalpha():
        raise _err(spec.loc, f"the output `{out}` of an einsum spec must be letters, one per dim")
    repeated = next((ch for ch in out if out.count(ch) > 1), None)
    if repeated:
        raise _err(spec.loc, f"output index `{repeated}` appears twice in `{out}`: each output dim has its own letter")
    if len(ins) != len(operands):
        raise _err(loc, f"the spec names {len(ins)} operands but {len(operands)} were given")
    sizes: dict = {}
    dtype = None
    for letters, v in zip(ins, operands):
        t = _tensor(v, "an einsum operand", loc)
        dtype = dtype or t.dtype
        if t.dtype != dtype:
            raise _err(v.loc, f"einsum operands must share an element type: {dtype} vs {t.dtype}")
        if len(letters) != t.rank or not letters.isalpha():
            raise _err(v.loc, f"`{letters}` does not fit {t}: one letter per dim")
        for ch, d in zip(letters, t.shape):
            if ch in sizes and sizes[ch] != d:
                raise _err(v.loc, f"einsum index `{ch}` is {sizes[ch]} in one operand and {d} in another")
            sizes[ch] = d
    for ch in out:
        if ch not in sizes:
            raise _err(spec.loc, f"output index `{ch}` appears in no operand")
    return TensorType(dtype, tuple(sizes[ch] for ch in out))


# ---------------------------------------------------------------- reductions and norms


def _reduction(name):
    def infer(x: Value, axis: Value | None = None, keepdim: Value | None = None, *, loc: Loc):
        t = _tensor(x, f"the argument of `{name}`", loc)
        if name in ("sum", "mean") and (t.dtype == "bool" or name == "mean" and is_int(t.dtype)):
            # (a bool's sum is a count, an int's mean a fraction: neither the type the argument has)
            raise _err(loc, f"`{name}` of {t} is no {t.dtype}: convert it with `as` first (`x as f32`)")
        ax = _axis(axis, t.rank, loc)
        if keepdim is not None and not (isinstance(keepdim, Const) and isinstance(keepdim.value, bool)):
            raise _err(keepdim.loc or loc, "keepdim must be true or false, written as such")
        keep = keepdim is not None and keepdim.value
        shape = t.shape[:ax] + ((Dim.const(1),) if keep else ()) + t.shape[ax + 1:]
        return TensorType("i32" if name == "argmax" else t.dtype, shape)

    return infer


for _name in ("sum", "mean", "max", "min", "argmax"):
    op(_name, ("x", "axis", "keepdim"))(_reduction(_name))


@op("softmax", ("x", "axis"), "softmax, computed in f32")
def _softmax(x: Value, axis: Value | None = None, *, loc: Loc):
    t = _tensor(x, "the argument of `softmax`", loc)
    if not is_float(t.dtype):
        raise _err(loc, f"`softmax` needs a float tensor, not {t}")
    _axis(axis, t.rank, loc)
    return t


@op("rmsnorm", ("x", "weight", "eps"), "x / rms(x) * weight over the last dim, in f32")
def _rmsnorm(x: Value, weight: Value, eps: Value | None = None, *, loc: Loc):
    tx, tw = _tensor(x, "the input of `rmsnorm`", loc), _tensor(weight, "the weight of `rmsnorm`", loc)
    same_dtype(tx, tw, loc, "normalize")
    if tw.rank != 1 or tx.shape[-1:] != tw.shape:
        raise _err(loc, f"cannot normalize {tx} with a weight {tw}", f"the weight must be [{tx.shape[-1]}]")
    _static(eps, "float", "eps", loc)
    return tx


@op("layer_norm", ("x", "weight", "bias", "eps"), "(x - mean) / sqrt(var + eps) * weight + bias over the last dim")
def _layer_norm(x: Value, weight: Value | None = None, bias: Value | None = None, eps: Value | None = None, *,
                loc: Loc):
    tx = _tensor(x, "the input of `layer_norm`", loc)
    if not is_float(tx.dtype):
        raise _err(x.loc or loc, f"`layer_norm` needs a float tensor, not {tx}", "convert it first: `x as T`")
    # weight and bias are each optional, as torch's F.layer_norm takes them
    for v, what in ((weight, "weight"), (bias, "bias")):
        if v is None:
            continue
        t = _tensor(v, f"the {what} of `layer_norm`", loc)
        same_dtype(tx, t, v.loc or loc, "normalize")
        if t.rank != 1 or tx.shape[-1:] != t.shape:
            raise _err(v.loc or loc, f"cannot normalize {tx} with a {what} {t}",
                       f"the {what} must be [{tx.shape[-1]}]: layer_norm normalizes over the last dim")
    _static(eps, "float", "eps", loc)
    return tx


# ---------------------------------------------------------------- positions and attention

# Each scaling rope takes, and the arguments it reads beside theta (`attention_factor` too, where given,
# whatever the scaling): `rope_tables.inv_frequencies` computes them. The generated code passes a table
# only these, and `specialize` checks their floors only where they are read.
ROPE_SCALING_READS = {"none": (), "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max"),
                      "yarn": ("factor", "original_max", "beta_fast", "beta_slow", "truncate"), "linear": ("factor",)}
ROPE_SCALINGS = tuple(ROPE_SCALING_READS)


@op("rope", ("x", "positions", "theta", "scaling", "factor", "low_freq_factor", "high_freq_factor",
             "original_max", "beta_fast", "beta_slow", "truncate", "attention_factor"),
    "rotary position embedding of x[n, heads, head_dim] at positions[n]")
def _rope(x: Value, positions: Value, theta: Value, scaling=None, factor=None, low_freq_factor=None,
          high_freq_factor=None, original_max=None, beta_fast=None, beta_slow=None, truncate=None,
          attention_factor=None, *, loc: Loc):
    t = _tensor(x, "the input of `rope`", loc)
    tp = _tensor(positions, "the positions of `rope`", loc)
    if t.rank != 3:
        raise _err(x.loc, f"`rope` takes x as [n, heads, head_dim], not {t}")
    if tp.dtype != "i32" or tp.shape != t.shape[:1]:
        raise _err(positions.loc, f"the positions of `rope` must be i32[{t.shape[0]}], not {tp}")
    for v, name in ((theta, "theta"), (factor, "factor"), (low_freq_factor, "low_freq_factor"),
                    (high_freq_factor, "high_freq_factor"), (beta_fast, "beta_fast"), (beta_slow, "beta_slow"),
                    (attention_factor, "attention_factor")):
        _static(v, "float", name, loc)
    _static(original_max, "int", "original_max", loc)
    _static(scaling, "str", "scaling", loc)
    _static(truncate, "bool", "truncate", loc)
    if isinstance(scaling, Const) and scaling.value not in ROPE_SCALINGS:
        raise _err(scaling.loc, f"unknown rope scaling {scaling.value!r}; one of {', '.join(ROPE_SCALINGS)}")
    return t


@op("attention", ("q", "k_cache", "v_cache", "positions", "rows", "window", "sinks", "scale", "softcap"),
    "causal attention of q[n, heads, d] over the cache rows of each token (GQA, window, sinks, soft-capped scores)")
def _attention(q: Value, k_cache: Value, v_cache: Value, positions: Value, rows: Value | None = None,
               window: Value | None = None, sinks: Value | None = None, scale: Value | None = None,
               softcap: Value | None = None, *, loc: Loc):
    tq = _tensor(q, "the queries", loc)
    tk, tv = _tensor(k_cache, "the key cache", loc), _tensor(v_cache, "the value cache", loc)
    tp = _tensor(positions, "the positions", loc)
    if tq.rank != 3:
        raise _err(q.loc, f"queries must be [n, heads, head_dim], not {tq}")
    if tk.rank != 4 or tv.rank != 4:
        raise _err(k_cache.loc, f"caches must be [rows, positions, kv_heads, head_dim], not {tk} and {tv}",
                   *(["a cache stacked over layers is read a layer at a time: `k_cache[l]`"]
                     if tk.rank == 5 or tv.rank == 5 else []))
    same_dtype(tq, tk, loc, "attend with")
    same_dtype(tq, tv, loc, "attend with")
    if tk.shape[:3] != tv.shape[:3]:
        raise _err(loc, f"the key and value caches disagree: {tk} vs {tv}")
    if tq.shape[2] != tk.shape[3]:
        raise _err(loc, f"queries {tq} and keys {tk} differ in head_dim: {tq.shape[2]} vs {tk.shape[3]}")
    n = tq.shape[0]
    if tp.dtype != "i32" or tp.shape != (n,):
        raise _err(positions.loc, f"positions must be i32[{n}], not {tp}")
    if rows is None:
        if n != tk.shape[0]:
            raise _err(loc, f"without `rows`, token i attends to cache row i, so n ({n}) must equal the cache's rows ({tk.shape[0]})",
                       "pass rows=... to say which row each token belongs to")
    else:
        tr = _tensor(rows, "rows", loc)
        if tr.dtype != "i32" or tr.shape != (n,):
            raise _err(rows.loc, f"rows must be i32[{n}], not {tr}")
    _static(window, "int", "window", loc)
    _static(scale, "float", "scale", loc)
    _static(softcap, "float", "softcap", loc)
    if sinks is not None:
        ts = _tensor(sinks, "sinks", loc)
        if ts.shape != (tq.shape[1],):
            raise _err(sinks.loc, f"sinks must be one per head, [{tq.shape[1]}], not {ts}")
    return TensorType(tq.dtype, (n, tq.shape[1], tv.shape[3]))


# ---------------------------------------------------------------- shapes


@op("reshape", ("x", "*dims"), "the same elements in another shape")
def _reshape(x: Value, *dims: Value, loc: Loc, dim_values: tuple = ()):
    t = _tensor(x, "the input of `reshape`", loc)
    if not numel_equal(t.shape, dim_values):
        raise _err(loc, f"cannot reshape {t} to {shape_str(dim_values)}: the element counts differ",
                   "dims are compared as products of names, whatever the card's numbers: a config value's default "
                   "is not looked into (`dim` is not `heads * head_dim`, though head_dim = dim / heads), so write "
                   "a width as the product it is split into")
    return TensorType(t.dtype, tuple(dim_values))


@op("transpose", ("x", "*perm"), "dims permuted: transpose(x, 1, 0)")
def _transpose(x: Value, *perm: Value, loc: Loc):
    t = _tensor(x, "the input of `transpose`", loc)
    axes = [_axis(p, t.rank, loc) for p in perm]
    if sorted(axes) != list(range(t.rank)):
        raise _err(loc, f"transpose of {t} needs a permutation of 0..{t.rank - 1}, not {axes}")
    return TensorType(t.dtype, tuple(t.shape[a] for a in axes))


@op("unsqueeze", ("x", "axis"), "a new dim of size 1")
def _unsqueeze(x: Value, axis: Value, *, loc: Loc):
    t = _tensor(x, "the input of `unsqueeze`", loc)
    ax = _axis(axis, t.rank + 1, loc)
    return TensorType(t.dtype, t.shape[:ax] + (Dim.const(1),) + t.shape[ax:])


@op("concat", ("items", "axis"), "tensors joined along one dim")
def _concat(items: Value, axis: Value | None = None, *, loc: Loc):
    if not isinstance(items.type, TupleType) or not items.type.items:
        raise _err(items.loc, "`concat` takes a list of tensors: concat([a, b], axis=-1)")
    types = list(items.type.items)
    for t in types:
        if not isinstance(t, TensorType):
            raise _err(items.loc, f"`concat` takes tensors, not {t}")
    first = types[0]
    ax = _axis(axis, first.rank, loc)
    total = Dim.const(0)
    for t in types:
        same_dtype(first, t, loc, "concatenate")
        if t.rank != first.rank or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != ax):
            raise _err(loc, f"cannot concatenate {first} and {t} along dim {ax}")
        total = total + t.shape[ax]
    return TensorType(first.dtype, first.shape[:ax] + (total,) + first.shape[ax + 1:])


@op("take", ("x", "indices", "axis"), "x gathered at integer indices along one dim")
def _take(x: Value, indices: Value, axis: Value | None = None, *, loc: Loc):
    t = _tensor(x, "the input of `take`", loc)
    ti = _tensor(indices, "the indices of `take`", loc)
    if not is_int(ti.dtype):
        raise _err(indices.loc, f"indices must be integers, not {ti}")
    ax = _axis(axis, t.rank, loc, default=0)
    return TensorType(t.dtype, t.shape[:ax] + ti.shape + t.shape[ax + 1:])


@op("iota", ("n",), "i32[n]: 0, 1, ..., n - 1")
def _iota(*, loc: Loc, dim_values: tuple = ()):
    return TensorType("i32", tuple(dim_values))


@op("zeros", ("*dims", "dtype"), "a tensor of zeros")
def _zeros(*dims: Value, loc: Loc, dim_values: tuple = (), dtype: str = "T"):
    return TensorType(dtype, tuple(dim_values))


@op("topk", ("x", "k"), "the k largest values along the last dim and their indices")
def _topk(x: Value, *, loc: Loc, dim_values: tuple = ()):
    t = _tensor(x, "the input of `topk`", loc)
    (kd,) = dim_values
    return TupleType((TensorType(t.dtype, t.shape[:-1] + (kd,)), TensorType("i32", t.shape[:-1] + (kd,))))


@op("copy_rows", ("cache", "src", "dst", "upto"),
    "cache with row dst[i] taking row src[i]'s first upto[i] positions (dims: [layers, rows, positions, ...])")
def _copy_rows(cache: Value, src: Value, dst: Value, upto: Value, *, loc: Loc):
    t = _tensor(cache, "the cache of `copy_rows`", loc)
    one_layer = "a cache of one layer is declared `T[1, Batch, MaxSeq, ...]` and read as `k_cache[0]`"
    if t.rank < 3:
        raise _err(cache.loc, f"`copy_rows` needs a cache [layers, Batch, MaxSeq, ...], not {t}", one_layer)
    # It copies along dims 1 and 2 whatever they hold: a cache [Batch, MaxSeq, ...] would have its
    # positions copied as rows. Checked where the dims are still named (a card's numbers: nothing to tell).
    for i, want in ((1, "Batch"), (2, "MaxSeq")):
        if not t.shape[i].is_const() and t.shape[i] != Dim.name(want):
            raise _err(cache.loc, f"`copy_rows` copies the rows of a cache [layers, Batch, MaxSeq, ...]: this one "
                                  f"is {t}, whose dim {i} is {t.shape[i]}, not {want}", one_layer)
    ts = _tensor(src, "src", loc)
    for v in (dst, upto):
        tv = _tensor(v, "an argument of `copy_rows`", loc)
        if tv.dtype != "i32" or tv.shape != ts.shape or ts.rank != 1:
            raise _err(v.loc, f"src, dst and upto must be i32 vectors of one length, not {ts} and {tv}")
    return t


# ---------------------------------------------------------------- indexing


@op("index", ("x", "*indices"), "x[i, j:k, idx]: numbers and slices pick, integer tensors gather")
def _index(x: Value, *indices: Value, loc: Loc):
    if isinstance(x.type, TupleType):  # `topk(x, k)[1]`, as Python would index its pair
        names = ", ".join(f"p{i}" for i in range(len(x.type.items)))
        raise _err(x.loc or loc, f"cannot index {x.type}: a value of {len(x.type.items)} parts is no tensor",
                   f"assign its parts to as many names and index the one meant: `{names} = ...`")
    t = _tensor(x, "an indexed value", loc)
    return index_type(t, list(indices), loc)


def index_type(t: TensorType, indices: list, loc: Loc) -> TensorType:
    """numpy's rule, restricted: static ints and integer tensors are gathered together and must be adjacent."""
    if len(indices) > t.rank:
        raise _err(loc, f"too many indices for {t}: {len(indices)} for rank {t.rank}")
    advanced = []
    out_before, out_after = [], []
    gather_shape: tuple = ()
    for i, ix in enumerate(indices):
        d = t.shape[i]
        if isinstance(ix, Slice):
            start = ix.start_dim if ix.start is not None else Dim.const(0)
            stop = ix.stop_dim if ix.stop is not None else d
            (out_after if advanced else out_before).append(stop - start)
        elif isinstance(ix.type, ScalarType):
            if ix.type.kind != "int":
                raise _err(ix.loc, f"an index must be an int or an integer tensor, not {ix.type}")
            if advanced and advanced[-1] != i - 1:
                raise _err(ix.loc, "gathered indices must be adjacent")
            advanced.append(i)
        elif isinstance(ix.type, TensorType):
            if not is_int(ix.type.dtype):
                raise _err(ix.loc, f"an index tensor must hold integers, not {ix.type}")
            if advanced and advanced[-1] != i - 1:
                raise _err(ix.loc, "gathered indices must be adjacent")
            advanced.append(i)
            gather_shape = broadcast(gather_shape, ix.type.shape, ix.loc, "index with", None, ix.type)
        else:
            raise _err(ix.loc, f"cannot index with {ix.type}")
    rest = list(t.shape[len(indices):])
    return TensorType(t.dtype, tuple(out_before) + gather_shape + tuple(out_after) + tuple(rest))
