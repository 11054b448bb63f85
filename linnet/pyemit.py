"""The Python source writer both code generators share.

It walks an inlined, specialized module and writes one line per statement,
preceded by a comment naming the `.linnet` line it came from. Backends
subclass it and say how each op is spelled in their library.
"""

from __future__ import annotations

import ast
import os
import textwrap

from linnet.ir import nodes as ir
from linnet.ir.dims import Dim
from linnet.ir.specialize import taken_branch
from linnet.ir.types import GENERIC_DTYPE, NoneType, ScalarType, TensorType
from linnet.ir.walk import children

ATOM, POSTFIX, POWER, UNARY, MUL, ADD, CMP, NOT, AND, OR, IF = 100, 90, 80, 70, 60, 50, 40, 30, 20, 10, 5

BINARY_SYNTAX = {"add": ("+", ADD), "sub": ("-", ADD), "mul": ("*", MUL), "div": ("/", MUL), "floordiv": ("//", MUL),
                 "mod": ("%", MUL), "matmul": ("@", MUL), "pow": ("**", POWER), "lt": ("<", CMP), "le": ("<=", CMP),
                 "gt": (">", CMP), "ge": (">=", CMP), "eq": ("==", CMP), "ne": ("!=", CMP)}


# sigmoid taking exp of a number no larger than 0 only, which cannot overflow (sigmoid(-800.0) is 0.0)
SIGMOID = "(1 / (1 + math.exp(-{x})) if {x} >= 0 else math.exp({x}) / (1 + math.exp({x})))"
# The float ops on a static number (a config value), in Python's math rather than the tensor
# library's; `specialize.STATIC_UNARY` computes the same where a config default uses one.
STATIC_UNARY = {
    "exp": "math.exp({x})", "log": "math.log({x})", "sqrt": "math.sqrt({x})", "rsqrt": "(1 / math.sqrt({x}))",
    "tanh": "math.tanh({x})", "sigmoid": SIGMOID, "silu": "({x} * " + SIGMOID + ")",
    "gelu": "({x} * (1 + math.erf({x} / math.sqrt(2))) / 2)", "relu": "max({x}, 0.0)", "sin": "math.sin({x})",
    "cos": "math.cos({x})", "erf": "math.erf({x})", "abs": "abs({x})",
}


def dim_py(d: Dim) -> str:
    """A dim as a Python int expression over the generated module's names: as the source wrote
    it, where it is the source's still."""
    if d.spelling is not None:
        return d.spelling
    if not d.terms:
        return "0"
    parts = []
    for m, c in d.terms:
        factors = []
        for a, p in m:
            s = a if isinstance(a, str) else f"({_paren_dim(a.num)} // {_paren_dim(a.den)})"
            factors.extend([s] * p)
        body = " * ".join(([str(abs(c))] if abs(c) != 1 or not factors else []) + factors)
        parts.append(("- " if c < 0 else "+ ") + body)
    text = " ".join(parts)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]


def _names_read(tree: ast.AST) -> set:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _paren_dim(d: Dim) -> str:
    s = dim_py(d)
    return s if s.isidentifier() or s.isdigit() else f"({s})"


def _value_lines(value: ir.Value, loc) -> list:
    """The source lines, other than `loc`'s, of the `return` statements of the fns inlined into a
    statement whose results make its value, outermost first; not those of the arguments a call passes
    in, nor a statement's own continuation lines."""
    seen, out, stack = {(loc.path, loc.line)}, [], [value]
    while stack:
        v = stack.pop()
        for at in v.returned_at if isinstance(v, ir.Op) else ():
            if (at.path, at.line) not in seen:
                seen.add((at.path, at.line))
                out.append(at)
        stack.extend(reversed(children(v)))
    return out


class PythonEmitter:
    backend = "python"
    dtypes: dict = {}  # an element type's spelling in the backend's library ("f32": "torch.float32")

    def __init__(self, module: ir.Module):
        self.module = module
        self.lines: list[str] = []
        self.unread_goes: dict = {}  # line index -> the name it binds: the line goes where nothing reads it
        self.imports_at: tuple | None = None  # (line index, import groups) for `imports`
        self.depth = 0
        self.last_comment = None
        self.iota_rows: set = set()  # locals known to hold iota(Batch): token i is row i

    # ------------------------------------------------------------ writing

    def line(self, text: str = "", binds: str | None = None):
        """One line; `binds`: the name it binds, where it may go unread (an entry's `K`): `source`
        then leaves it out, so the generated code binds nothing it does not use."""
        if binds is not None:
            self.unread_goes[len(self.lines)] = binds
        self.lines.append(("    " * self.depth + text) if text else "")

    def imports(self, *groups: dict):
        """The module's imports, each group {statement: the name it binds}: `source` writes those the
        code reads (`math` only where a static op needs it), a blank line after each group."""
        self.imports_at = (len(self.lines), groups)

    def where(self, loc) -> str:
        path = os.path.basename(loc.path)
        return f"{path}:{loc.line}"

    def comment_for(self, loc, value=None, via=None):
        """`# card:line` above the statements of one source line; where the statement's value is an
        inlined function's result (`x = layers_forward(...)` ending in its `rmsnorm`), that line too,
        and those of the fns inlined within it (qwen3's `rotate(query_heads(h, l))`: both lines);
        above an inlined fn's first statement, the fn and the line that calls it."""
        ref = self.where(loc)
        inner = _value_lines(value, loc) if isinstance(value, ir.Value) else []
        if inner:
            ref += f" (value from {', '.join(self.where(at) for at in inner)})"
        if via is not None:
            ref += f" ({via[0]}, called at {self.where(via[1])})"
        if ref != self.last_comment:
            self.line(f"# {ref}")
            self.last_comment = ref

    def source(self) -> str:
        lines = list(self.lines)
        tree = ast.parse("\n".join(lines))
        read_in_module = _names_read(tree)
        scopes = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]
        for at, name in sorted(self.unread_goes.items(), reverse=True):
            scope = min((f for f in scopes if f.lineno <= at + 1 <= f.end_lineno), key=lambda f: f.end_lineno - f.lineno)
            if name not in _names_read(scope):
                del lines[at]
        if self.imports_at is not None:
            at, groups = self.imports_at
            block = []
            for group in groups:
                kept = [statement for statement, name in group.items() if name in read_in_module]
                block += kept + [""] * bool(kept)
            lines[at:at] = block
        return "\n".join(lines).rstrip() + "\n"

    # ------------------------------------------------------------ expressions

    def expr(self, v: ir.Value) -> str:
        return self.emit(v)[0]

    def paren(self, v: ir.Value, prec: int) -> str:
        text, p = self.emit(v)
        return text if p > prec or (p == prec and p == ATOM) else f"({text})"

    def emit(self, v: ir.Value) -> tuple[str, int]:
        if isinstance(v, ir.Const):
            if isinstance(v.value, (int, float)) and not isinstance(v.value, bool) and v.value < 0:
                return repr(v.value), UNARY  # `(-1) ** 2` keeps its parentheses
            return repr(v.value), ATOM
        if isinstance(v, ir.Var):
            return self.var(v), ATOM
        if isinstance(v, ir.Slice):
            a = self.expr(v.start) if v.start is not None else ""
            b = self.expr(v.stop) if v.stop is not None else ""
            return f"{a}:{b}", ATOM
        assert isinstance(v, ir.Op)
        k = v.kwargs
        if v.op in BINARY_SYNTAX:
            sym, prec = BINARY_SYNTAX[v.op]
            if v.op == "div" and isinstance(v.type, ScalarType) and v.type.kind == "int":
                sym = "//"  # static ints divide exactly (checked when specialized)
            if prec == POWER:  # right-associative
                return f"{self.paren(k['a'], prec)} {sym} {self.paren(k['b'], prec - 1)}", prec
            if prec == CMP:  # Python chains comparisons (`a > b == c` is `a > b and b == c`): none goes bare
                return f"{self.paren(k['a'], prec)} {sym} {self.paren(k['b'], prec)}", prec
            return f"{self.paren(k['a'], prec - 1)} {sym} {self.paren(k['b'], prec)}", prec
        if v.op in ("and", "or") and isinstance(v.type, ScalarType):
            prec = AND if v.op == "and" else OR
            return f"{self.paren(k['a'], prec)} {v.op} {self.paren(k['b'], prec + 1)}", prec
        if v.op == "neg":
            return f"-{self.paren(k['x'], UNARY - 1)}", UNARY
        if v.op == "not" and isinstance(v.type, ScalarType):
            return f"not {self.paren(k['x'], NOT - 1)}", NOT
        if v.op == "if":
            # a condition on config values alone (Gemma 2's `if final_softcap > 0.0 then ... else logits`) is
            # known as the module is specialized: the code is its one branch
            taken = taken_branch(v, self.module.bindings)
            if taken is not None:
                return self.emit(taken)
            return f"{self.paren(k['then'], IF)} if {self.paren(k['cond'], IF)} else {self.paren(k['orelse'], IF - 1)}", IF
        if v.op == "dim_expr":
            return f"({dim_py(v.dims[0])})", ATOM
        if v.op == "list":
            return "[" + ", ".join(self.expr(a) for a in v.args) + "]", ATOM
        if v.op == "list_item":  # a list config's item: the module's list, indexed as Python runs (a static int)
            return f"{self.var(k['x'])}[{self.expr(v.args[0])}]", POSTFIX
        if v.op == "index" and gathers_param_rows(v):
            # where a pass's activations begin (an embedding): the runtime picks their type
            return f"rt.gather_rows({self.expr(k['x'])}, {self.expr(v.args[0])})", POSTFIX
        if v.op == "index":
            return f"{self.paren(k['x'], POSTFIX - 1)}[{', '.join(self.expr(i) for i in v.args)}]", POSTFIX
        if v.op in STATIC_UNARY and isinstance(v.type, ScalarType):
            whole = STATIC_UNARY[v.op].count("{x}") == 1 and "({x})" in STATIC_UNARY[v.op]  # a call's one argument
            x = self.expr(k["x"]) if whole else self.paren(k["x"], UNARY - 1)
            return STATIC_UNARY[v.op].format(x=x), POSTFIX
        if v.op == "cast" and (product := self.widened_product(v)) is not None:
            return self.op_linear(product, product.kwargs, out_dtype="f32"), POSTFIX
        method = getattr(self, "op_" + v.op, None)
        if method is None:
            raise NotImplementedError(f"{self.backend} has no spelling for op `{v.op}`")
        return method(v, k), POSTFIX

    def index_tuple(self, indices: list) -> str:
        """Indices as a Python tuple, for a runtime call that stores through them: a slice is
        `slice(a, b)` there, as `a:b` is only valid inside brackets."""
        parts = []
        for i in indices:
            if isinstance(i, ir.Slice):
                bounds = [self.expr(b) if b is not None else "None" for b in (i.start, i.stop)]
                parts.append("slice(None)" if bounds == ["None", "None"] else f"slice({', '.join(bounds)})")
            else:
                parts.append(self.expr(i))
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"

    def dims(self, dims) -> str:
        return ", ".join(dim_py(d) for d in dims)

    def shape(self, dims) -> str:
        """A tuple of dims as Python writes one: `(n,)`, `(n, dim)`."""
        return f"({self.dims(dims)}{',' if len(dims) == 1 else ''})"

    def axis(self, v: ir.Value | None, default: int = -1) -> int:
        return default if v is None else v.value

    def dtype_of(self, t) -> str:
        d = t.dtype if isinstance(t, TensorType) else t
        return self.module.bindings["T"] if d == GENERIC_DTYPE else d

    def widened_product(self, v: ir.Op) -> ir.Op | None:
        """The linear a cast widens to f32 from a 16-bit T (`linear(x, lm_head) as f32`: a head's
        logits, a router's scores), which the runtime then gives as its f32 sums rather than rounded
        to T and widened back (`rt.linear`'s out_dtype): logits a bf16 ulp apart (0.125 at 25) stay apart."""
        x = v.kwargs["x"]
        if isinstance(x, ir.Op) and x.op == "linear" and self.dtype_of(v.type) == "f32" and \
                self.dtype_of(x.type) in ("bf16", "f16"):
            return x
        return None

    def is_iota_rows(self, v: ir.Value | None) -> bool:
        return isinstance(v, ir.Var) and v.name in self.iota_rows

    # ------------------------------------------------------------ statements

    def body(self, stmts: list):
        for s in stmts:
            self.comment_for(s.loc, getattr(s, "value", None), getattr(s, "via", None))
            if isinstance(s, ir.Assign):
                if (len(s.targets) == 1 and isinstance(s.value, ir.Op) and s.value.op == "iota"
                        and isinstance(s.value.type, TensorType)):
                    self.iota_rows.add(s.targets[0])
                else:
                    self.iota_rows.difference_update(s.targets)
                self.line(f"{', '.join(s.targets)} = {self.assigned(s)}{self.assign_note(s)}")
            elif isinstance(s, ir.Store):
                self.store(s)
            elif isinstance(s, ir.For):
                self.loop(s)
            elif isinstance(s, ir.Return):
                self.ret(s)

    def assigned(self, s: ir.Assign) -> str:
        """The source of an assignment's value (a backend may copy it)."""
        return self.expr(s.value)

    def assign_note(self, s: ir.Assign) -> str:
        """A comment at the end of an assignment's line ("" for none)."""
        return ""

    def loop(self, s: ir.For):
        """`for` as Python's (a backend may compile some loops as loops: see the JAX emitter)."""
        self.line(f"for {s.var} in range({self.expr(s.count)}):")
        self.depth += 1
        self.last_comment = None
        self.body(s.body)
        self.depth -= 1
        self.last_comment = None

    # ------------------------------------------------------------ the module header

    def config_lines(self):
        b = self.module.bindings
        self.line("# Config values and generics, as specialized.")
        for name in self.module.config:
            self.line(f"{name} = {b[name]!r}")
        self.line(f"Batch = {b['Batch']}")
        self.line(f"MaxSeq = {b['MaxSeq']}")

    def tables(self):
        """PARAMS, TIED and STATE: what the runtime's model class binds and allocates."""
        from linnet.codegen_common import param_table, state_table, tied_params

        m = self.module
        self.line("# Each param's shape and element type; stacked params lead with their loops' counts.")
        self.line("PARAMS = {")
        for name, shape, dtype in param_table(m):
            self.line(f"    {name!r}: ({shape}, {dtype!r}),")
        self.line("}")
        self.line(f"TIED = {tied_params(m)!r}")
        self.line("STATE = {")
        for name, shape, dtype in state_table(m):
            self.line(f"    {name!r}: ({shape}, {dtype!r}),")
        self.line("}")

    # ------------------------------------------------------------ ops both runtimes spell alike (rt.*)

    def op_softmax(self, v, k):
        return f"rt.softmax({self.expr(k['x'])}, {self.axis(k.get('axis'))})"

    def op_rmsnorm(self, v, k):
        return f"rt.rmsnorm({self.expr(k['x'])}, {self.expr(k['weight'])}, {self.expr(k['eps']) if 'eps' in k else '1e-6'})"

    def op_layer_norm(self, v, k):
        # torch's F.layer_norm's default eps; an absent weight or bias is None, as F.layer_norm takes it
        parts = [self.expr(k[name]) if name in k else "None" for name in ("x", "weight", "bias")]
        return f"rt.layer_norm({', '.join(parts)}, {self.expr(k['eps']) if 'eps' in k else '1e-5'}, fast=FAST)"

    def op_gelu(self, v, k):
        if "approximate" in k and k["approximate"].value == "tanh":  # the runtimes' own: its numerics differ by mode
            return f"rt.gelu_tanh({self.expr(k['x'])}, fast=FAST)"
        return self.__getattr__("op_gelu")(v, k)  # the erf form: the backend's unary op

    def op_rope(self, v, k):
        return f"rt.rope({self.expr(k['x'])}, {self.expr(k['positions'])}, {self.rope_table(v)})"

    def cache_arg(self, c: ir.Value) -> str:
        """How a backend spells a cache handed to attention."""
        return self.expr(c)

    def op_attention(self, v, k):
        args = [self.expr(k["q"]), self.cache_arg(k["k_cache"]), self.cache_arg(k["v_cache"]), self.expr(k["positions"])]
        if "rows" in k and not self.is_iota_rows(k["rows"]):
            args.append(f"rows={self.expr(k['rows'])}")
        for name in ("window", "sinks", "scale", "softcap"):
            if name in k:
                args.append(f"{name}={self.expr(k[name])}")
        args.append("fast=FAST")
        return f"rt.attention({', '.join(args)})"

    def op_reshape(self, v, k):
        return f"{self.paren(k['x'], POSTFIX - 1)}.reshape({self.dims(v.dims)})"

    def op_linear(self, v, k, out_dtype: str | None = None):
        out = f", out_dtype={self.dtypes[out_dtype]}" if out_dtype else ""
        return f"rt.linear({self.expr(k['x'])}, {self.expr(k['w'])}{self._bias(k)}{out})"

    def op_expert_linear(self, v, k):
        return f"rt.expert_linear({self.expr(k['x'])}, {self.expr(k['w'])}, {self.expr(k['experts'])}{self._bias(k)})"

    def _bias(self, k) -> str:
        """A linear's optional bias, as its call's last argument."""
        return f", {self.expr(k['bias'])}" if "bias" in k else ""

    def op_topk(self, v, k):
        return f"rt.topk({self.expr(k['x'])}, {self.dims(v.dims)})"

    def header(self, what: str, use: list):
        """The module's docstring: what it is, from which files, as specialized; `use`, the backend's lines on
        how to call it."""
        m = self.module
        # (a card written from a checkpoint's config is named as a whole, `<card for ./Llama-3.2-1B>`)
        files = [p if p.startswith("<") else os.path.basename(p) for p in (m.card_path, m.path, *reversed(m.bases)) if p]
        b = m.bindings
        named = _in_docstring(f"{what} of `{m.card or m.name}`, generated by Linnet from {_listed(files)}.")
        self.line(f'"""{named}')
        self.line("")
        self.line(f"Generics: Batch={b['Batch']}, MaxSeq={b['MaxSeq']}, T={b['T']}; numerics: {b['numerics']}.")
        self.line("")
        for text in use:
            self.line(_in_docstring(text))
        self.line("")
        self.line("Regenerate with `linnet compile` rather than editing by hand.")
        self.line('"""')

    def example_call(self) -> str:
        """The first entry's call, as a use line shows it: `prefill(tokens, positions, rows, last)`."""
        fn = next(iter(self.module.entries.values()))
        return f"{fn.name}({', '.join(n for n, _ in fn.args)})"

    def entry_docstring(self, fn: ir.Function, result: str = ""):
        """An entry's docstring: the comment the card writes above it, where it says what the entry does,
        and its arguments' and result's types (`result`: how the backend returns it, where it wraps it)."""
        said = _comment_above(fn.loc, self.module.sources.get(fn.loc.path))
        ret = "None" if isinstance(fn.ret, NoneType) else str(fn.ret)
        typed = f"({', '.join(f'{n}: {t}' for n, t in fn.args)}) -> {result.format(ret) if result else ret}"
        first, *rest = textwrap.wrap(f"{self.where(fn.loc)}: {said}" if said else self.where(fn.loc), 100)
        self.line(f'"""{_in_docstring(first)}')
        for text in rest:
            self.line(_in_docstring(text))
        self.line("")
        self.line(_in_docstring(typed))
        self.line('"""')


def _comment_above(loc, text: str | None) -> str:
    """The comment lines written just above a source line, joined ("" where there are none); `text`: the
    source as it was parsed, else read from its file ("" where it is none: a card made from a config)."""
    if text is None:
        try:
            with open(loc.path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            return ""
    lines = text.splitlines()
    said, i = [], loc.line - 2
    while i >= 0 and lines[i].lstrip().startswith("#"):
        said.insert(0, lines[i].lstrip()[1:].strip())
        i -= 1
    return " ".join(said)


def gathers_param_rows(v: ir.Op) -> bool:
    """`param[ids]`: a param's rows gathered by a tensor of ids."""
    x = v.kwargs["x"]
    return (len(v.args) == 1 and isinstance(x, ir.Var) and x.kind == "param"
            and isinstance(v.args[0].type, TensorType))


def _in_docstring(text: str) -> str:
    """Text (a card's name, file names) safe inside a triple-quoted docstring: its backslashes and
    quotes escaped."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _listed(names: list) -> str:
    """"a", "a and b", "a, b and c"."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
