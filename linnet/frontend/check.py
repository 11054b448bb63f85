"""Syntax tree to typed IR: names resolved, element types and symbolic shapes checked.

One pass over an architecture (and the card that fills its config). Every
error is a `LinnetError` at the span of source that caused it.
"""

from __future__ import annotations

import difflib
import inspect
import json
import re
import warnings

from linnet.errors import LinnetError, LinnetWarning, Loc, source_lines
from linnet.frontend import ast
from linnet.frontend.scope import JAX_ATTRIBUTES, TORCH_ATTRIBUTES, reserved_reason, suggest
from linnet.ir import nodes as ir
from linnet.ir import walk
from linnet.ir.dims import Dim
from linnet.ir.ops import OPS, index_type
from linnet.ir.types import (BOOL, DTYPES, FLOAT, GENERIC_DTYPE, INT, SCALAR_KINDS, SIZE_GENERICS, STR, ListType,
                             NoneType, ScalarType, TensorType, TupleType)

_BINARY = {"+": "add", "-": "sub", "*": "mul", "/": "div", "//": "floordiv", "%": "mod", "@": "matmul",
           "**": "pow", "==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge", "and": "and",
           "or": "or"}
# name -> the argument counts it takes
TRANSFORMS = {"unpermute_rope": (1, 2), "transpose": (0, 2), "split_heads": (4,)}
DIM_OPS = {"reshape": "dims", "iota": "n", "zeros": "dims", "topk": "k"}
# What a PyTorch or NumPy habit writes, and Linnet's word for it (told where the habit is refused).
HABITS = {"view": "reshape", "permute": "transpose", "cat": "concat", "concatenate": "concat", "arange": "iota",
          "gather": "take", "index_select": "take", "dim": "axis", "keepdims": "keepdim", "float": "x as f32",
          "to": "x as f32", "astype": "x as f32", "type": "x as f32", "layernorm": "layer_norm",
          "LayerNorm": "layer_norm"}
# Habits with no word of Linnet's for them, and why none is needed (rather than a near name's spelling).
HABIT_NOTES = {"repeat_interleave": "Linnet has no `repeat_interleave`: `attention` takes fewer key/value heads than "
                                    "query heads itself (grouped-query), so a cache needs no repeating"}
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def check(arch: ast.File, card: ast.File | None = None) -> ir.Module:
    """Builds the typed module of `arch`; `card`, when given, fills its config."""
    return _Checker(arch, card).run()


class _Checker:
    def __init__(self, arch: ast.File, card: ast.File | None):
        self.arch = arch
        self.card = card
        self.config: dict[str, ir.ConfigValue] = {}
        self.params: dict[str, ir.Param] = {}
        self.state: dict[str, ir.State] = {}
        self.fns: dict[str, ast.FnDef] = {}
        self.signatures: dict[str, ir.Function] = {}
        self.module_names: dict[str, Loc] = {}
        self.config_locs: dict[str, Loc] = {}  # where the card sets each value
        self.defaulting: str | None = None  # the config value whose default is being checked

    # ------------------------------------------------------------ top level

    def run(self) -> ir.Module:
        a = self.arch
        if a.arch is None:
            raise LinnetError(Loc(a.path, 1, 1, 1, 2, a.source), "an architecture file must start with `arch NAME`")
        self._check_config()
        config_values = self._card_values()
        for p in a.params:
            self._check_param(p)
        for p in a.params:
            self._check_tie(p)
        for s in a.state:
            self._declare(s.name, s.loc, "state buffer")
            self.state[s.name] = ir.State(s.name, self._tensor_type(s.type, {}), s.loc)
        for f in a.fns + a.entries:
            if f.name in self.fns or f.name in self.signatures:
                raise LinnetError(f.loc, f"`{f.name}` is defined twice", [f"first defined at {self.fns[f.name].loc}"])
            self._declare(f.name, f.loc, "entry" if f.kind == "entry" else "")
            if f.kind == "fn" and f.name in OPS:
                raise LinnetError(f.loc, f"`{f.name}` is a built-in op; choose another name")
            self.fns[f.name] = f
            self.signatures[f.name] = self._signature(f)
        fns = {f.name: self._body(f) for f in a.fns}
        entries = {f.name: self._body(f) for f in a.entries}
        if not entries:
            raise LinnetError(a.arch.loc, f"architecture `{a.arch.name}` defines no entry",
                              ["the engine calls entries: prefill, decode, copy_rows"])
        self._warn_unused(fns, entries)
        for items in (self.card.meta if self.card else [], a.meta):  # each file sets an item once, as config
            first = {}
            for m in items:
                if m.name in first:
                    raise LinnetError(m.loc, f"meta `{m.name}` is set twice", [f"first set at {first[m.name]}"])
                first[m.name] = m.loc
        if self.card and self.card.card and not CARD_NAME.fullmatch(self.card.card.name):
            # a card's name names its weights' folders and files (`linnet cards`, the cache): a plain name
            raise LinnetError(self.card.card.loc, f"a card's name is letters, digits, '.', '_' and '-', starting "
                                                  f"with a letter or digit, not {_spelled(self.card.card.name)}")
        meta = {}
        for m in (self.card.meta if self.card else []) + a.meta:  # the card's values win
            if m.name not in meta:
                meta[m.name] = _meta_value(m, self._literal(m.value, "a meta value"))
        return ir.Module(
            name=a.arch.name, path=a.path, config=self.config, params=self.params, state=self.state,
            fns=fns, entries=entries, card=self.card.card.name if self.card and self.card.card else None,
            meta=meta, config_values=config_values, config_locs=self.config_locs,
            sources={a.path: a.source, **({self.card.path: self.card.source} if self.card else {}), **a.bases},
            card_path=self.card.path if self.card else None, bases=tuple(a.bases),
            loc=self.card.card.loc if self.card and self.card.card else a.arch.loc)

    def _warn_unused(self, fns: dict, entries: dict):
        """A param no entry reads, directly or through the fns it calls, is a weight loaded for nothing (its
        checkpoint must still hold it), and a state buffer no entry touches is memory allocated for nothing: a
        name misspelt where it is used, or one an extension stopped using. A state buffer read but never
        filled (stored into, or assigned other than by `copy_rows`, which only moves what is there) holds
        zeros: a store left out, or written to another buffer."""
        used, filled = set(), set()
        for f in walk.reached(fns, list(entries.values())):
            used.update(("state", name) for name in walk.written_state(f.body, self.state))
            used.update((v.kind, v.name) for v in walk.all_values(f.body)
                        if isinstance(v, ir.Var) and v.kind in ("param", "state"))
            filled.update(walk.written_state(f.body, self.state, moved=False))
        for p in self.params.values():  # (ties do not chain: _check_tie)
            if ("param", p.name) in used and p.tie is not None:
                used.add(("param", p.tie[0]))  # `lm_head = embed if ...`: reading the head may read the embedding
        unused = [("param", p.name, p.loc, "is never read", "no entry reads it, directly or through a fn it calls; "
                   "loading still looks for its weight") for p in self.params.values()]
        unused += [("state", s.name, s.loc, "is never used", "no entry reads or writes it, directly or through a "
                    "fn it calls; it is allocated all the same") for s in self.state.values()]
        for kind, name, loc, what, why in unused:
            if (kind, name) in used:
                continue
            base = loc.path != self.arch.path
            warnings.warn(LinnetWarning(loc, f"{'param' if kind == 'param' else 'state buffer'} `{name}` {what}", [
                why, f"an extension leaves a base's {kind} out with `extends ... without {name}`" if base else
                "remove it, or use it where it was meant to be used"]), stacklevel=2)
        for st in self.state.values():
            if ("state", st.name) in used and st.name not in filled:
                warnings.warn(LinnetWarning(st.loc, f"state buffer `{st.name}` is read but never written", [
                    "no entry stores into it, directly or through a fn it calls, so it holds zeros (`copy_rows` "
                    "only moves what is there)", f"store into it where its values are made: `{st.name}[...] = ...`"]),
                    stacklevel=2)

    def _declare(self, name: str, loc: Loc, what: str = ""):
        """A module-level name; `what` ("param", "state buffer", "entry") for those a generated model
        class holds as attributes."""
        if name in self.module_names:
            prev = self.module_names[name]
            raise LinnetError(loc, f"`{name}` is already defined", [f"first defined at {prev}"])
        _not_reserved(name, loc)
        if name in SIZE_GENERICS or name == GENERIC_DTYPE or name in DTYPES:
            raise LinnetError(loc, f"`{name}` is a built-in type or generic; choose another name")
        # a torch model holds its params, state and entries as attributes, a JAX model its entries
        holders = ["torch"] if what and name in TORCH_ATTRIBUTES else []
        holders += ["JAX"] if what == "entry" and name in JAX_ATTRIBUTES else []
        if holders:
            raise LinnetError(loc, f"`{name}` is an attribute of the generated {' and '.join(holders)} model "
                                   f"class{'es' if len(holders) > 1 else ''}; "
                                   f"{'an' if what[0] in 'aeiou' else 'a'} {what} cannot take its name",
                              ["a torch model holds its params, state and entries as attributes, a JAX model "
                               "its entries"])
        self.module_names[name] = loc

    # ------------------------------------------------------------ config

    def _check_config(self):
        for c in self.arch.config:
            if isinstance(c, ast.ConfigSet):
                raise LinnetError(c.loc, f"an architecture declares config values with a type: `{c.name}: int = ...`")
            self._declare(c.name, c.loc)
            if c.type_name not in SCALAR_KINDS:
                raise LinnetError(c.type_loc, f"unknown config type `{c.type_name}`; one of {', '.join(SCALAR_KINDS)}",
                                  ["a list of them takes its length in brackets: `bool[layers]`"])
            typ = ScalarType(c.type_name) if c.lengths is None else self._list_type(c)
            default = None
            if c.default is not None:
                self.defaulting = c.name
                default = self._config_default(c.default, typ)
                self.defaulting = None
                if not _assignable(default.type, typ):
                    raise LinnetError(c.default.loc, f"the default of `{c.name}` is {default.type}, not {typ}")
            self.config[c.name] = ir.ConfigValue(c.name, typ, default, c.loc)

    def _list_type(self, c: ast.ConfigDecl) -> ListType:
        """`bool[layers]`: one length, built from numbers and the int config values above (a card's list
        is checked against it as the config is evaluated, before any generic is bound)."""
        if len(c.lengths) != 1:
            raise LinnetError(c.type_loc, f"a list config has one length, as in `{c.type_name}[layers]`, "
                                          f"not {len(c.lengths)}")
        for n in _walk(c.lengths):
            if isinstance(n, ast.Name) and n.id in SIZE_GENERICS:
                raise LinnetError(n.loc, f"a list config's length is built from numbers and config values, not "
                                         f"`{n.id}`", ["the config is known before the generics are bound"])
        return ListType(c.type_name, self._dim(c.lengths[0], {}))

    def _config_default(self, e: ast.Node, typ) -> ir.Value:
        """A config value's default; a list's is a list of static values, or one made item by item
        (`[(l + 1) % 4 != 0 for l in layers]`), or another list config."""
        scope = _Scope(self, {}, {})
        if not isinstance(typ, ListType):
            return self._expr(e, scope)
        def item(x: ast.Node, in_scope: _Scope) -> ir.Value:
            v = self._expr(x, in_scope)
            if not _assignable(v.type, ScalarType(typ.item)):
                raise LinnetError(x.loc, f"an item of {_a(str(typ))} list must be a static {typ.item}, not {v.type}")
            return v

        if isinstance(e, ast.ListExpr):
            return ir.Op(ListType(typ.item, Dim.const(len(e.items))), e.loc, "list", [item(x, scope) for x in e.items])
        if isinstance(e, ast.ListComp):
            count, inner = self._counted(e.count, e.var, e.var_loc, scope, "a list is made")
            return ir.Op(ListType(typ.item, self._dim(e.count, {})), e.loc, "list_comp", [],
                         {"item": item(e.item, inner), "count": count}, attrs={"var": e.var})
        v = self._expr(e, scope)
        if not isinstance(v.type, ListType):
            raise LinnetError(e.loc, f"the default of {_a(str(typ))} list is a list: `[...]`, `[... for l in "
                                     f"{typ.length}]` or another list config, not {v.type}")
        return v

    def _card_values(self) -> dict:
        if self.card is None:
            return {}
        values = {}
        for c in self.card.config:
            if isinstance(c, ast.ConfigDecl):
                raise LinnetError(c.loc, "a card sets config values (`dim = 4096`); it does not declare them")
            if c.name not in self.config:
                gone = self.arch.left_out.get(c.name)
                raise LinnetError(c.loc, f"architecture `{self.arch.arch.name}` has no config value `{c.name}`",
                                  [f"the architecture leaves it out of the one it extends (`without`, at {gone})"] if gone else
                                  suggest(c.name, self.config))
            if c.name in values:
                raise LinnetError(c.loc, f"`{c.name}` is set twice")
            want = self.config[c.name].type
            value = self._literal(c.value, f"the value of `{c.name}`", want)
            self.config_locs[c.name] = c.value.loc
            if isinstance(want, ListType):
                values[c.name] = self._card_list(c, value, want)
                continue
            if not _assignable(_type_of_literal(value), want):
                raise LinnetError(c.value.loc, f"`{c.name}` is {want}, but is set to {_spelled(value)}")
            values[c.name] = float(value) if want.kind == "float" else value
        return values

    def _card_list(self, c: ast.ConfigSet, value, want: ListType) -> list:
        """A card's list: each item of the list's kind (its length is checked with numbers, by
        `specialize.config_values`)."""
        if not isinstance(c.value, ast.ListExpr):
            raise LinnetError(c.value.loc, f"`{c.name}` is {want}, a list, but is set to {_spelled(value)}",
                              [f"write one item for each of its {want.length}: `{c.name} = [...]`"])
        for i, (x, item) in enumerate(zip(c.value.items, value)):
            if not _assignable(_type_of_literal(item), ScalarType(want.item)):
                raise LinnetError(x.loc, f"item {i} of `{c.name}` is {_spelled(item)}, but `{c.name}` is {want}, "
                                         f"a list of {want.item} values")
        return [float(item) if want.item == "float" else item for item in value]

    def _literal(self, e: ast.Node, what: str, want=None):
        if isinstance(e, (ast.Number, ast.String, ast.Bool)):
            return e.value
        if isinstance(e, ast.Unary) and e.op == "-" and isinstance(e.operand, ast.Number):
            return -e.operand.value
        if isinstance(e, ast.ListExpr):
            return [self._literal(x, what, want) for x in e.items]
        raise LinnetError(e.loc, f"{what} must be a literal: a number, a string, true or false",
                          _literal_note(e, self.config, want, self._computed(e)))

    def _computed(self, e: ast.Node):
        """What a computation of literals alone comes to (`64 * 3`: 192), as the language computes it;
        None for another expression, or one that reads a name."""
        if not isinstance(e, (ast.Binary, ast.Unary)):
            return None
        from linnet.ir.specialize import evaluate

        try:
            value = evaluate(self._expr(e, _Scope(self, {}, {})), {})
        except LinnetError:
            return None
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    # ------------------------------------------------------------ params

    def _check_param(self, p: ast.ParamDecl):
        self._declare(p.name, p.loc, "param")
        typ = self._tensor_type(p.type, {})
        loop_vars = [var for var, _, _ in p.loops]
        for i, (var, _, loc) in enumerate(p.loops):
            if var in loop_vars[:i]:
                raise LinnetError(loc, f"`{var}` already names an enclosing loop's variable")
        counts = tuple(self._dim(count, {}) for _, count, _ in p.loops)
        typ = TensorType(typ.dtype, counts + typ.shape)
        sources = []
        seen_formats = set()
        for s in p.sources:
            if s.format not in ("hf", "gguf"):
                raise LinnetError(s.format_loc, f"unknown checkpoint format `{s.format}`; one of hf, gguf")
            if s.format in seen_formats:
                raise LinnetError(s.format_loc, f"`{p.name}` names two `{s.format}` sources")
            seen_formats.add(s.format)
            named = self._pattern_loop_vars(s, loop_vars)
            transforms = []
            for t in s.transforms:
                if t.name not in TRANSFORMS:
                    raise LinnetError(t.loc, f"unknown weight transform `{t.name}`", suggest(t.name, TRANSFORMS)
                                      or [f"known: {', '.join(TRANSFORMS)}"])
                if len(t.args) not in TRANSFORMS[t.name]:
                    counts = " or ".join(map(str, TRANSFORMS[t.name]))
                    raise LinnetError(t.loc, f"`{t.name}` takes {counts} argument(s), not {len(t.args)}")
                args = [self._dim(a, {}) for a in t.args]
                if t.name == "transpose":
                    self._check_transpose_axes(t, args, typ.rank - named)
                if t.name == "split_heads" and transforms:
                    raise LinnetError(t.loc, "`.split_heads` reads the stored tensor's rows: it comes first, before "
                                             f"`.{transforms[-1][0]}`")
                transforms.append((t.name, args))
            unnamed = next((v for v in loop_vars[named:] if v in p.loop_starts), None)
            if unnamed is not None:
                raise LinnetError(s.pattern_loc, f"the loop over `{unnamed}` starts past 0 (`for {unnamed} in a:b`), "
                                                 f"so the name pattern must name `{{{unnamed}}}`")
            sources.append(ir.WeightSource(s.format, s.pattern, transforms, s.loc, stacked=named))
        starts = {var: self._dim(start, {}) for var, start in p.loop_starts.items()}
        self.params[p.name] = ir.Param(p.name, typ, sources, p.loc, loops=tuple(loop_vars), starts=starts)

    @staticmethod
    def _pattern_loop_vars(s: ast.Source, loop_vars: list) -> int:
        """How many of the enclosing loops' variables a name pattern names: the outermost, in order
        (`{l}`, then `{e}`). Each stored tensor holds the dims of the loops it leaves out (a GGUF
        keeps a layer's experts in one tensor where a Hugging Face checkpoint has one per expert)."""
        if not s.pattern:
            raise LinnetError(s.pattern_loc, "a weight's name is empty",
                              ["write the tensor's name as the checkpoint stores it"])
        # a brace outside `{l}` would stay in the name looked up, which no checkpoint holds
        stray = re.search(r"[{}]", _PLACEHOLDER.sub(lambda m: " " * len(m.group(0)), s.pattern))
        if stray is not None:
            raise LinnetError(_pattern_part(s, stray.start(), 1),
                              "this `{` in the weight's name is not closed" if stray.group() == "{"
                              else "this `}` in the weight's name closes no `{`",
                              ["a name pattern names a loop variable as `{l}`; a tensor's name holds no other brace"])
        found = []
        for m in _PLACEHOLDER.finditer(s.pattern):
            if m.group(1) not in loop_vars:
                loc = _pattern_part(s, m.start(), len(m.group(0)))
                known = (f"the loop variables are {', '.join(f'`{v}`' for v in loop_vars)}" if loop_vars
                         else "this param is not in a loop")
                raise LinnetError(loc, f"the weight name pattern names `{{{m.group(1)}}}`, "
                                       f"which is not a loop variable", [known])
            if m.group(1) not in found:
                found.append(m.group(1))
        named = len(found)
        if loop_vars and "{" + loop_vars[0] + "}" not in s.pattern:
            raise LinnetError(s.pattern_loc,
                              f"a param stacked over `{loop_vars[0]}` needs `{{{loop_vars[0]}}}` in its name pattern")
        if set(found) != set(loop_vars[:named]):
            missing = next(v for v in loop_vars[:named] if v not in found)
            raise LinnetError(s.pattern_loc, f"the name pattern names `{{{found[-1]}}}` but not `{{{missing}}}`, "
                                             f"the loop around it: a pattern names the loops from the outermost in")
        return named

    @staticmethod
    def _check_transpose_axes(t: ast.Transform, args: list, rank: int):
        """`.transpose()` swaps the stored tensor's first two dims; `.transpose(a, b)` dims a and b."""
        axes = [a.value() if a.is_const() else None for a in args] if args else [0, 1]
        if None in axes or len(set(axes)) != 2 or not all(0 <= a < rank for a in axes):
            raise LinnetError(t.loc, f"`.transpose` needs two different dims of the stored tensor (rank {rank}) "
                                     f"as integer literals, not {', '.join(map(str, args))}")

    def _check_tie(self, p: ast.ParamDecl):
        if p.tie is None:
            if not p.sources:
                raise LinnetError(p.loc, f"param `{p.name}` says nowhere where its weights come from",
                                  ['add `from hf "checkpoint.name"`'])
            return
        other, loc, cond = p.tie
        if other not in self.params:
            raise LinnetError(loc, f"unknown param `{other}`", suggest(other, self.params))
        if other == p.name:
            raise LinnetError(loc, f"`{p.name}` is tied to itself",
                              ["a param is tied to another, which has weights of its own"])
        # a tie is followed once (the models alias a param to its target's tensor): no chains, so no circles
        target = next(q for q in self.arch.params if q.name == other)
        if target.tie is not None:
            raise LinnetError(loc, f"`{p.name}` is tied to `{other}`, which is itself tied to `{target.tie[0]}`",
                              [f"tie `{p.name}` to a param that is not tied: one with weights of its own"])
        mine, theirs = self.params[p.name].type, self.params[other].type
        if mine != theirs:
            raise LinnetError(loc, f"`{p.name}` is {mine} but `{other}` is {theirs}: a tied param must have the same type")
        c = self._expr(cond, _Scope(self, {}, {}))
        if c.type != BOOL:
            raise LinnetError(cond.loc, f"the condition of a tie must be a static bool, not {c.type}")
        if not p.sources and not _always(c):
            raise LinnetError(p.loc, f"param `{p.name}` has no source, and its tie to `{other}` does not "
                                     f"always hold",
                              ["where the condition is false the param is read from its own sources: "
                               'add `from hf "checkpoint.name"`, or tie it `if true`'])
        self.params[p.name].tie = (other, c)

    # ------------------------------------------------------------ types and dims

    def _tensor_type(self, t: ast.TypeExpr, dims: dict) -> TensorType:
        if t.dtype not in DTYPES and t.dtype != GENERIC_DTYPE:
            raise self._unknown_dtype(t.dtype, t.dtype_loc, dims)
        if t.dims is None:
            raise LinnetError(t.loc, f"a tensor type needs its dims: `{t.dtype}[...]`")
        return TensorType(t.dtype, tuple(self._dim(d, dims) for d in t.dims))

    def _unknown_dtype(self, name: str, loc: Loc, dims) -> LinnetError:
        """An element type that is none: what the name is instead, where it is something (a size, a
        static scalar's type), else the types there are."""
        types = f"T, {', '.join(DTYPES)}"
        if name in SIZE_GENERICS or name in dims or (name in self.config and self.config[name].type == INT):
            notes = [f"`{name}` is a size (a dim of a type, as in `T[{name}]`); an element type is one of {types}"]
        elif name in SCALAR_KINDS:
            notes = [f"`{name}` is the type of a static value (a config value, a fn's argument); a tensor's "
                     f"element type is one of {types}"]
        else:
            notes = suggest(name, DTYPES + (GENERIC_DTYPE,)) or [f"one of {types}"]
        return LinnetError(loc, f"unknown element type `{name}`", notes)

    def _type(self, t: ast.TypeExpr, dims: dict):
        if t.dims is None and t.dtype in SCALAR_KINDS:
            return ScalarType(t.dtype)
        return self._tensor_type(t, dims)

    def _dim(self, e: ast.Node, dims: dict, negative: str | None = None) -> Dim:
        """A size: literals, int config values, generics and call dims, with + - * / //; one
        built by arithmetic keeps how it was written, for the generated code. `negative`: the note for
        a negative one, by where it is written (a slice bound, a reshape's size)."""
        d = self._dim_value(e, dims, negative)
        return Dim(d.terms, _dim_spelling(e)) if isinstance(e, ast.Binary) else d

    def _dim_value(self, e: ast.Node, dims: dict, negative: str | None) -> Dim:
        if isinstance(e, ast.Number):
            if not isinstance(e.value, int) or e.value < 0:
                raise LinnetError(e.loc, f"a dim must be a non-negative integer, not {e.value}")
            return Dim.const(e.value)
        if isinstance(e, ast.Name):
            if e.id in dims or e.id in SIZE_GENERICS:
                return Dim.name(e.id)
            if e.id in self.config:
                kind = self.config[e.id].type.kind
                if kind != "int":
                    raise LinnetError(e.loc, f"`{e.id}` is a {kind} config value; a dim must be an int")
                return Dim.name(e.id)
            if e.id == GENERIC_DTYPE:
                raise LinnetError(e.loc, "`T` is the element type, not a size")
            raise LinnetError(e.loc, f"unknown dim `{e.id}`",
                              suggest(e.id, list(dims) + list(SIZE_GENERICS) + [c for c, v in self.config.items() if v.type == INT])
                              or ["a dim is a literal, an int config value, Batch, MaxSeq or a size declared as fn<n>"])
        if isinstance(e, ast.Binary) and e.op in ("+", "-", "*", "/", "//"):
            a, b = self._dim(e.left, dims, negative), self._dim(e.right, dims, negative)
            if e.op in ("/", "//") and not b.terms:
                raise LinnetError(e.loc, "division of a dim by zero")
            return {"+": a.__add__, "-": a.__sub__, "*": a.__mul__, "/": a.__floordiv__, "//": a.__floordiv__}[e.op](b)
        if isinstance(e, ast.Unary) and e.op == "-":
            raise LinnetError(e.loc, "a dim is never negative", [negative] if negative else [])
        raise LinnetError(e.loc, "a dim must be built from numbers, config values and generics with + - * /")

    # ------------------------------------------------------------ functions

    def _signature(self, f: ast.FnDef) -> ir.Function:
        dims = {}
        for name, loc in f.dim_params:
            if name in dims:
                raise LinnetError(loc, f"the size `{name}` is declared twice")
            _not_reserved(name, loc)
            if name in self.module_names or name in SIZE_GENERICS or name in DTYPES or name == GENERIC_DTYPE:
                raise LinnetError(loc, f"the size `{name}` hides another name; choose another")
            dims[name] = loc
        args, seen = [], set()
        for arg in f.args:
            if arg.name in seen:
                raise LinnetError(arg.loc, f"argument `{arg.name}` is declared twice")
            _not_reserved(arg.name, arg.loc)
            if arg.name in self.module_names or arg.name in dims \
                    or arg.name in SIZE_GENERICS or arg.name in DTYPES or arg.name == GENERIC_DTYPE:
                raise LinnetError(arg.loc, f"argument `{arg.name}` hides another name; choose another")
            seen.add(arg.name)
            typ = self._type(arg.type, dims)
            if f.kind == "entry" and not isinstance(typ, TensorType):
                raise LinnetError(arg.type.loc, "entry arguments must be tensors")
            args.append((arg.name, typ))
        for name, loc in dims.items():  # each call reads its sizes off its arguments' shapes
            if not any(isinstance(t, TensorType) and Dim.name(name) in t.shape for _, t in args):
                raise LinnetError(loc, f"the size `{name}` must be a dim of one of the arguments, so that each call binds it",
                                  [f"e.g. `x: T[{name}, dim]`"])
        if f.kind == "fn" and f.ret is None:
            raise LinnetError(f.loc, f"fn `{f.name}` declares no result; a fn is called for its value: `-> T[...]`",
                              ["state is written by entries, or by a fn that also returns a value"])
        ret = self._type(f.ret, dims) if f.ret is not None else NoneType()
        return ir.Function(f.name, f.kind, list(dims), args, ret, [], f.loc, [arg.type.loc for arg in f.args])

    def _body(self, f: ast.FnDef) -> ir.Function:
        sig = self.signatures[f.name]
        scope = _Scope(self, {n: t for n, t in sig.args}, {d: True for d in sig.dims}, fn=f)
        body = self._block(f.body, scope, top=True)
        if not isinstance(sig.ret, NoneType) and not (body and isinstance(body[-1], ir.Return)):
            raise LinnetError(f.loc, f"`{f.name}` must end with `return` of {sig.ret}")
        return ir.Function(sig.name, sig.kind, sig.dims, sig.args, sig.ret, body, sig.loc, sig.arg_locs)

    def _block(self, stmts: list, scope: "_Scope", top: bool = False) -> list:
        out = []
        for i, s in enumerate(stmts):
            if isinstance(s, ast.Return) and (not top or i != len(stmts) - 1):
                raise LinnetError(s.loc, "`return` must be the last statement of a fn or entry")
            if isinstance(s, ast.For):
                out.append(self._for(s, scope))
                continue
            try:
                out.append(self._return(s, scope) if isinstance(s, ast.Return) else
                           self._assign(s, scope) if isinstance(s, ast.Assign) else self._store(s, scope))
            except LinnetError as err:
                raise self._with_replaced_values(err, s) from None
        return out

    def _with_replaced_values(self, err: LinnetError, s: ast.Node) -> LinnetError:
        """`err`, raised at a statement a base wrote, with a note for each param or state buffer it reads
        that an extension declared again: the line was written for the base's own (an extension's `norm:
        T[2 * dim]` read by llama's `rmsnorm(x, norm)`)."""
        replaced = self.arch.replaced_values
        if s.loc.path == self.arch.path or not replaced:
            return err
        read = sorted({n.id for n in _walk([s]) if isinstance(n, ast.Name) and n.id in replaced})
        notes = [f"`{name}` is declared again at {(self.params.get(name) or self.state[name]).loc}; this line was "
                 f"written for the one declared at {replaced[name].loc}" for name in read
                 if name in self.params or name in self.state]
        return LinnetError(err.loc, err.message, err.notes + notes) if notes else err

    def _return(self, s: ast.Return, scope: "_Scope") -> ir.Return:
        want = self.signatures[scope.fn.name].ret
        if isinstance(want, NoneType):
            raise LinnetError(s.loc, f"`{scope.fn.name}` declares no result, but returns one")
        v = self._expr(s.value, scope)
        if v.type != want and not _assignable(v.type, want):
            same_shape = isinstance(v.type, TensorType) and isinstance(want, TensorType) and v.type.shape == want.shape
            raise LinnetError(s.value.loc, f"`{scope.fn.name}` returns {v.type}, but declares {want}",
                              [f"convert it: `return ... as {want.dtype}`"] if same_shape else [])
        return ir.Return(v, s.loc)

    def _assign(self, s: ast.Assign, scope: "_Scope"):
        if len(s.targets) == 1 and s.targets[0][0] in self.state:
            name, loc = s.targets[0]
            v = self._expr(s.value, scope)
            if v.type != self.state[name].type:
                raise LinnetError(s.value.loc, f"state `{name}` is {self.state[name].type}; cannot assign {v.type}")
            return ir.Store(name, [], v, s.loc)
        v = self._expr(s.value, scope)
        if len(s.targets) > 1:
            if not isinstance(v.type, TupleType) or len(v.type.items) != len(s.targets):
                n = len(v.type.items) if isinstance(v.type, TupleType) else 1
                raise LinnetError(s.loc, f"{len(s.targets)} names are assigned, but the value has {n} part(s)")
            types = list(v.type.items)
        else:
            if isinstance(v.type, TupleType):
                raise LinnetError(s.loc, f"the value has {len(v.type.items)} parts; assign them to as many names")
            types = [v.type]
        for (name, loc), t in zip(s.targets, types):
            scope.bind(name, t, loc)
        return ir.Assign([n for n, _ in s.targets], v, s.loc)

    def _store(self, s: ast.Store, scope: "_Scope") -> ir.Store:
        if s.target not in self.state:
            if scope.lookup(s.target) is not None or s.target in self.params:
                raise LinnetError(s.target_loc, f"only state can be written in place; `{s.target}` is not state")
            raise LinnetError(s.target_loc, f"unknown state `{s.target}`", suggest(s.target, self.state))
        st = self.state[s.target]
        indices = [self._index(i, scope) for i in s.indices]
        slot = index_type(st.type, indices, s.loc)
        v = self._expr(s.value, scope)
        if not isinstance(v.type, TensorType) or v.type.dtype != slot.dtype or v.type.shape != slot.shape:
            raise LinnetError(s.value.loc, f"cannot store {v.type} into `{s.target}[...]`, which is {slot}")
        return ir.Store(s.target, indices, v, s.loc)

    def _counted(self, count: ast.Node, var: str, var_loc: Loc, scope: "_Scope", what: str):
        """The count of `for VAR in COUNT` (a loop's, a list's made item by item), and the scope in
        which VAR is its read-only static int."""
        n = self._expr(count, scope)
        if n.type != INT:
            raise LinnetError(count.loc, f"{what} over a static int count, not {n.type}")
        inner = scope.child()
        inner.bind(var, INT, var_loc, loop=True)
        return n, inner

    def _for(self, s: ast.For, scope: "_Scope") -> ir.For:
        count, inner = self._counted(s.count, s.var, s.var_loc, scope, "a loop runs")
        body = self._block(s.body, inner)
        for name, (t, loc) in inner.assigned.items():
            outer = scope.lookup(name)
            if outer is not None and outer != t:
                raise LinnetError(loc, f"`{name}` is {outer} before the loop but {t} inside it",
                                  ["a value carried through a loop keeps its type"])
        return ir.For(s.var, count, body, s.loc)

    # ------------------------------------------------------------ expressions

    def _expr(self, e: ast.Node, scope: "_Scope") -> ir.Value:
        if isinstance(e, ast.Number):
            return ir.Const(INT if isinstance(e.value, int) else FLOAT, e.loc, e.value)
        if isinstance(e, ast.String):
            return ir.Const(STR, e.loc, e.value)
        if isinstance(e, ast.Bool):
            return ir.Const(BOOL, e.loc, e.value)
        if isinstance(e, ast.Name):
            return self._name(e, scope)
        if isinstance(e, ast.ListExpr):
            items = [self._expr(x, scope) for x in e.items]
            return ir.Op(TupleType(tuple(i.type for i in items)), e.loc, "list", items)
        if isinstance(e, ast.Binary):
            return self._op(_BINARY[e.op], [e.left, e.right], [], e.loc, scope)
        if isinstance(e, ast.Unary) and e.op == "-" and isinstance(e.operand, ast.Number):
            value = -e.operand.value  # a negative literal, so that `axis=-1` is an integer literal
            return ir.Const(INT if isinstance(value, int) else FLOAT, e.loc, value)
        if isinstance(e, ast.Unary):
            return self._op("neg" if e.op == "-" else "not", [e.operand], [], e.loc, scope)
        if isinstance(e, ast.IfExpr):
            return self._if(e, scope)
        if isinstance(e, ast.Cast):
            if e.dtype not in DTYPES and e.dtype != GENERIC_DTYPE:
                raise self._unknown_dtype(e.dtype, e.dtype_loc, scope.dims)
            x = self._expr(e.value, scope)
            spec = OPS["cast"]
            t = spec.infer(x, ir.Const(STR, e.dtype_loc, e.dtype), loc=e.loc)
            return ir.Op(t, e.loc, "cast", [], {"x": x, "dtype": ir.Const(STR, e.dtype_loc, e.dtype)})
        if isinstance(e, ast.Subscript) and self._list_config(e.value, scope) is not None:
            return self._list_item(e, scope)
        if isinstance(e, ast.ListComp):
            raise LinnetError(e.loc, "a list made item by item (`[x for l in n]`) is only a list config's default")
        if isinstance(e, ast.Subscript):
            x = self._expr(e.value, scope)
            indices = [self._index(i, scope) for i in e.indices]
            t = OPS["index"].infer(x, *indices, loc=e.loc)
            return ir.Op(t, e.loc, "index", indices, {"x": x})
        if isinstance(e, ast.Call):
            if e.func in self.fns and (self.fns[e.func].kind == "fn" or e.func not in OPS):
                return self._call_fn(e, scope)
            if e.func not in OPS or e.func in ("index", "list", "call"):
                if scope.lookup(e.func) is not None or e.func in self.params or e.func in self.config:
                    raise LinnetError(e.func_loc, f"`{e.func}` is a value, not a function")
                raise LinnetError(e.func_loc, f"unknown function `{e.func}`",
                                  suggest(e.func, self.fns) or _habit(e.func) or
                                  suggest(e.func, [o for o in OPS if o not in ("index", "list")]))
            return self._op(e.func, e.args, e.kwargs, e.loc, scope)
        if isinstance(e, ast.Slice):
            raise LinnetError(e.loc, "a slice `a:b` can only appear inside [...]")
        raise LinnetError(e.loc, "unsupported expression")

    def _list_config(self, e: ast.Node, scope: "_Scope") -> ir.ConfigValue | None:
        """The list config `e` names, where it names one (and no local hides it)."""
        if isinstance(e, ast.Name) and scope.lookup(e.id) is None and e.id in self.config \
                and isinstance(self.config[e.id].type, ListType):
            return self.config[e.id]
        return None

    def _list_item(self, e: ast.Subscript, scope: "_Scope") -> ir.Op:
        """`no_rope_layers[l]`: one item of a list config, at a static int (a loop variable, a fn's int
        argument, a literal); it is a static value of the list's kind."""
        c = self._list_config(e.value, scope)
        if len(e.indices) != 1 or isinstance(e.indices[0], ast.Slice):
            raise LinnetError(e.loc, f"`{c.name}` is a list ({c.type}): it is read one item at a time, at one "
                                     f"static int: `{c.name}[l]`")
        ix = self._expr(e.indices[0], scope)
        if ix.type != INT:
            notes = ([f"{_a(str(ix.type))} tensor is known only as the model runs; a list config is read while the code "
                      f"is written, at a loop variable or another static int"] if isinstance(ix.type, TensorType)
                     else [])
            raise LinnetError(e.indices[0].loc, f"`{c.name}` ({c.type}) is indexed by a static int, not {ix.type}",
                              notes)
        var = ir.Var(c.type, e.value.loc, c.name, "config")
        return ir.Op(ScalarType(c.type.item), e.loc, "list_item", [ix], {"x": var})

    def _name(self, e: ast.Name, scope: "_Scope") -> ir.Value:
        t = scope.lookup(e.id)
        if t is not None:
            return ir.Var(t, e.loc, e.id, scope.kind_of(e.id))
        if e.id in self.params:
            return ir.Var(self.params[e.id].type, e.loc, e.id, "param")
        if e.id in self.state:
            return ir.Var(self.state[e.id].type, e.loc, e.id, "state")
        if e.id in self.config:
            c = self.config[e.id]
            if isinstance(c.type, ListType) and scope.fn is not None:
                raise LinnetError(e.loc, f"`{e.id}` is a list ({c.type}): read one item at a static int, "
                                         f"`{e.id}[l]`")
            return ir.Var(c.type, e.loc, e.id, "config")
        if e.id in SIZE_GENERICS or e.id in scope.dims:
            return ir.Var(INT, e.loc, e.id, "dim")
        if e.id in self.fns or e.id in OPS:
            raise LinnetError(e.loc, f"`{e.id}` is a function; call it: `{e.id}(...)`")
        if e.id in ("True", "False"):
            raise LinnetError(e.loc, f"unknown name `{e.id}`", [f"Linnet's booleans are `{e.id.lower()}`"])
        if e.id in DTYPES or e.id == GENERIC_DTYPE:
            raise LinnetError(e.loc, f"`{e.id}` is an element type, not a value",
                              [f"a tensor is converted with `x as {e.id}`; zeros of it are `zeros(..., dtype={e.id})`"])
        if self.defaulting is not None:
            self._config_read_early(e)
        candidates = list(scope.names()) + list(self.params) + list(self.state) + list(self.config)
        raise LinnetError(e.loc, f"unknown name `{e.id}`", _after_slashes(e.loc) or suggest(e.id, candidates))

    def _config_read_early(self, e: ast.Name):
        """A default that reads its own config value, or one declared below it: defaults are evaluated
        in declaration order, so it is refused as such, not as a name that does not exist."""
        if e.id == self.defaulting:
            raise LinnetError(e.loc, f"the default of `{e.id}` cannot read `{e.id}` itself",
                              ["a default is computed from the config values declared above it"])
        below = next((c for c in self.arch.config if isinstance(c, ast.ConfigDecl) and c.name == e.id), None)
        if below is not None:
            raise LinnetError(e.loc, f"`{e.id}` is declared below `{self.defaulting}`, at {below.loc}: a default "
                                     f"reads only the config values declared above it",
                              [f"move `{e.id}` above `{self.defaulting}`"])

    def _index(self, e: ast.Node, scope: "_Scope") -> ir.Value:
        if isinstance(e, ast.Slice):
            start = self._expr(e.start, scope) if e.start is not None else None
            stop = self._expr(e.stop, scope) if e.stop is not None else None
            for b, src in ((start, e.start), (stop, e.stop)):
                if b is not None and b.type != INT:
                    raise LinnetError(src.loc, f"slice bounds must be static ints, not {b.type}")
            return ir.Slice(None, e.loc, start, stop,
                            self._dim(e.start, scope.dims, _FROM_THE_END) if e.start is not None else None,
                            self._dim(e.stop, scope.dims, _FROM_THE_END) if e.stop is not None else None)
        return self._expr(e, scope)

    def _if(self, e: ast.IfExpr, scope: "_Scope") -> ir.Value:
        c = self._expr(e.cond, scope)
        if c.type != BOOL:
            raise LinnetError(e.cond.loc, f"`if` needs a static bool condition, not {c.type}",
                              ["to choose elementwise between tensors, use where(cond, a, b)"])
        a, b = self._expr(e.then, scope), self._expr(e.orelse, scope)
        if a.type != b.type:
            if isinstance(a.type, ScalarType) and isinstance(b.type, ScalarType) and {a.type.kind, b.type.kind} == {"int", "float"}:
                return ir.Op(FLOAT, e.loc, "if", [], {"cond": c, "then": a, "orelse": b})
            raise LinnetError(e.loc, f"the branches of `if` differ: {a.type} vs {b.type}")
        return ir.Op(a.type, e.loc, "if", [], {"cond": c, "then": a, "orelse": b})

    def _op(self, name: str, args: list, kwargs: list, loc: Loc, scope: "_Scope") -> ir.Op:
        spec = OPS[name]
        dims = ()
        dim_param = DIM_OPS.get(name)
        pos = list(args)
        extra = {}
        if dim_param == "dims":  # reshape(x, a, b), zeros(a, b): every positional size after x
            first = 1 if name == "reshape" else 0
            dims = tuple(self._dim(a, scope.dims, _INFERRED if name == "reshape" else None) for a in pos[first:])
            if not dims:
                raise LinnetError(loc, f"`{name}` needs at least one size: `{name}({'x, ' if first else ''}n, d)`")
            pos = pos[:first]
        elif dim_param is not None:  # iota(n), topk(x, k): one size
            idx = 0 if name == "iota" else 1
            kw = [k for k in kwargs if k[0] == dim_param]
            if len(pos) > idx + 1:
                raise LinnetError(pos[idx + 1].loc, f"`{name}` takes at most {idx + 1} argument(s)")
            if len(pos) > idx and kw:
                raise LinnetError(kw[0][1], f"argument `{dim_param}` is given twice")
            src = pos[idx] if len(pos) > idx else (kw[0][2] if kw else None)
            if src is None:
                raise LinnetError(loc, f"`{name}` needs its size `{dim_param}`")
            dims = (self._dim(src, scope.dims),)
        if name == "zeros":
            kw = dict((k[0], k[2]) for k in kwargs)
            dt = kw.get("dtype")
            if dt is not None and not isinstance(dt, ast.Name):
                raise LinnetError(dt.loc, "the dtype of `zeros` is an element type, written as a name: dtype=f32")
            extra["dtype"] = dt.id if isinstance(dt, ast.Name) else GENERIC_DTYPE
            if extra["dtype"] not in DTYPES and extra["dtype"] != GENERIC_DTYPE:
                raise self._unknown_dtype(extra["dtype"], dt.loc, scope.dims)
            kwargs = [k for k in kwargs if k[0] != "dtype"]
        values = [self._expr(a, scope) for a in pos]
        named = {}
        for kname, kloc, kval in kwargs:
            if kname in named:
                raise LinnetError(kloc, f"argument `{kname}` is given twice")
            named[kname] = (kloc, self._expr(kval, scope))
        sig = inspect.signature(spec.infer)
        accepted = [p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        var = next((p for p in sig.parameters.values() if p.kind == p.VAR_POSITIONAL), None)
        for kname, (kloc, _) in named.items():
            if kname not in [p.name for p in accepted] and not (dim_param not in (None, "dims") and kname == dim_param):
                raise LinnetError(kloc, f"`{name}` has no argument `{kname}`",
                                  (_habit(kname) if HABITS.get(kname) in [p.name for p in accepted] else []) or
                                  suggest(kname, [p.name for p in accepted]) or
                                  [f"`{name}` takes {', '.join(p.name for p in accepted) or 'no named arguments'}"])
        if dim_param and dim_param not in ("dims",):
            named.pop(dim_param, None)
            if name in ("iota",):
                values = []
            if name == "topk":
                values = values[:1]
        bound: dict = {}
        rest: list = []
        for i, v in enumerate(values):
            if i < len(accepted):
                bound[accepted[i].name] = v
            elif var is not None:
                rest.append(v)
            else:
                raise LinnetError(v.loc, f"`{name}` takes at most {len(accepted)} argument(s)")
        for kname, (kloc, v) in named.items():
            if kname in bound:
                order = ", ".join(p.name for p in accepted)
                raise LinnetError(kloc, f"argument `{kname}` is given twice",
                                  (["`concat` takes a list of tensors: concat([a, b], axis=-1)"] if name == "concat"
                                   else []) + [f"`{name}` takes ({order}) in that order: a positional argument "
                                               f"already gave `{kname}`"])
            bound[kname] = v
        for p in accepted:
            if p.default is inspect.Parameter.empty and p.name not in bound:
                raise LinnetError(loc, f"`{name}` needs its argument `{p.name}`")
        extra_kw = {}
        if "dim_values" in sig.parameters:
            extra_kw["dim_values"] = dims
        if "dtype" in sig.parameters and name == "zeros":
            extra_kw["dtype"] = extra["dtype"]
        try:
            t = spec.infer(*[bound.get(p.name) for p in accepted], *rest, loc=loc, **extra_kw)
        except LinnetError as err:
            raise self._stacked_note(err, list(bound.values()) + rest) from None
        return ir.Op(t, loc, name, rest, bound, dims, extra)

    def _stacked_note(self, err: LinnetError, values: list) -> LinnetError:
        """`err` with a note where one of `values` is a param stacked over a loop read whole (`wq` for
        `wq[l]`): the likeliest cause of a weight of the wrong rank."""
        stacked = [self.params[v.name] for v in values if isinstance(v, ir.Var) and v.kind == "param"
                   and self.params[v.name].loops]
        if not stacked:
            return err
        p = stacked[0]
        return LinnetError(err.loc, err.message, err.notes + [
            f"`{p.name}` is declared in `for {p.loops[0]} in {p.type.shape[0]}`, so it is {p.type}: one "
            f"`{p.loops[0]}`'s is `{p.name}[{p.loops[0]}]`"])

    def _call_fn(self, e: ast.Call, scope: "_Scope") -> ir.Op:
        sig = self.signatures[e.func]
        if sig.kind == "entry":
            raise LinnetError(e.func_loc, f"`{e.func}` is an entry; entries are called by the engine, not by the model")
        cycle = [e.func] if e.func == scope.fn.name else self._call_path(e.func, scope.fn.name, set())
        if cycle:
            through = "" if len(cycle) == 1 else " through " + ", then ".join(f"`{n}`" for n in cycle[:-1])
            raise LinnetError(e.func_loc, f"`{scope.fn.name}` calls itself{through}: a model's functions cannot be "
                                          f"recursive")
        written_for = self.arch.replaced.get(e.func, {}).get(e.loc.path)
        if written_for is not None:
            self._check_replacement(e, sig, written_for, scope.fn.name)
        values = [self._expr(a, scope) for a in e.args]
        defined = [f"`{e.func}` is defined at {sig.loc}"]  # (an extension's override, maybe: not the base's)
        for kname, kloc, kval in e.kwargs:
            names = [n for n, _ in sig.args]
            if kname not in names:
                raise LinnetError(kloc, f"`{e.func}` has no argument `{kname}`", suggest(kname, names) + defined)
        kw = {k: (l, self._expr(v, scope)) for k, l, v in e.kwargs}
        if len(values) > len(sig.args):
            raise LinnetError(e.loc, f"`{e.func}` takes {len(sig.args)} argument(s), not {len(values) + len(kw)}",
                              defined)
        bound = {}
        for (name, _), v in zip(sig.args, values):
            bound[name] = v
        for k, (l, v) in kw.items():
            if k in bound:
                raise LinnetError(l, f"argument `{k}` is given twice")
            bound[k] = v
        missing = [n for n, _ in sig.args if n not in bound]
        if missing:
            raise LinnetError(e.loc, f"`{e.func}` needs its argument `{missing[0]}`", defined)
        sizes: dict = {}
        for _ in range(2):  # the first pass binds the sizes; the second checks dims built from them
            for name, want in sig.args:
                try:
                    _unify(want, bound[name], sizes, set(sig.dims), e.func, name)
                except LinnetError as err:
                    raise self._stacked_note(err, [bound[name]]) from None
        ret = sig.ret.substitute(sizes) if isinstance(sig.ret, TensorType) else sig.ret
        return ir.Op(ret, e.loc, "call", [], {n: bound[n] for n, _ in sig.args},
                     tuple(sizes.get(d, Dim.name(d)) for d in sig.dims), {"fn": e.func})

    def _check_replacement(self, e: ast.Call, sig: ir.Function, original: ast.FnDef, caller: str):
        """A call a base wrote to a fn an extension replaced: the replacement takes what the call was
        written to pass and gives what it was written to get (sizes and arguments may be renamed). If
        not, the error is at the replacement, which is what the extension wrote, naming the call,
        rather than a mismatch further on in a file the extension never wrote."""
        try:
            was = self._signature(original)
        except LinnetError:
            return  # (it reads a name left out: the call is checked against the replacement alone)
        renamed = dict(zip(was.dims, (Dim.name(d) for d in sig.dims))) if len(was.dims) == len(sig.dims) else {}
        def of(t):
            return t.substitute(renamed) if isinstance(t, TensorType) else t
        if len(was.args) == len(sig.args) and all(_assignable(of(a), b) for (_, a), (_, b) in zip(was.args, sig.args)) \
                and _assignable(sig.ret, of(was.ret)):
            return
        def shown(f: ir.Function) -> str:
            return f"{e.func}({', '.join(f'{n}: {t}' for n, t in f.args)}) -> {f.ret}"
        raise LinnetError(sig.loc, f"`{e.func}` replaces `{shown(was)}` with another signature, `{shown(sig)}`",
                          [f"{self.fns[caller].kind} `{caller}` calls it at {e.loc}, written for the one replaced "
                           f"(declared at {original.loc})",
                           f"keep its arguments and result, or declare `{caller}` again too"])

    def _call_path(self, caller: str, target: str, seen: set) -> list:
        """The fns from `caller` to `target` along calls, both included (to refuse recursion, naming
        the circle), or [] where `caller` does not reach `target`."""
        if caller in seen:
            return []
        seen.add(caller)
        for node in _walk(self.fns[caller].body):
            if isinstance(node, ast.Call) and node.func in self.fns:
                rest = [target] if node.func == target else self._call_path(node.func, target, seen)
                if rest:
                    return [caller] + rest
        return []


# Notes for a negative dim, by where it is written: numpy's ways that Linnet lacks.
_FROM_THE_END = "a slice bound does not count from the end, as numpy's does: write `size - k` (`x[:, dim - 1:]`)"
_INFERRED = "`reshape` takes every size by name, with no -1 to infer one: `x.reshape(n, heads, head_dim)`"

_DIM_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "//": 2}


def _dim_spelling(e: ast.Node) -> str:
    """A checked dim's source as Python over the generated module's names (`/` is `//`: a dim's
    division is exact, checked when specialized)."""
    def spell(e) -> tuple[str, int]:
        if isinstance(e, ast.Number):
            return str(e.value), 3
        if isinstance(e, ast.Name):
            return e.id, 3
        prec = _DIM_PRECEDENCE[e.op]
        (a, pa), (b, pb) = spell(e.left), spell(e.right)
        a = a if pa >= prec else f"({a})"
        b = b if pb > prec else f"({b})"
        return f"{a} {'//' if e.op == '/' else e.op} {b}", prec

    return spell(e)[0]


def _habit(name: str) -> list[str]:
    """A note for a name PyTorch or NumPy would take (`view`, `dim=`): Linnet's for it, or why it needs none."""
    if name in HABIT_NOTES:
        return [HABIT_NOTES[name]]
    if name not in HABITS:
        return []
    word = HABITS[name]
    return [f"Linnet writes this `{word}`" if " " in word else f"Linnet calls this `{word}`"]


def _not_reserved(name: str, loc: Loc):
    why = reserved_reason(name)
    if why is not None:
        raise LinnetError(loc, f"`{name}` is reserved ({why}); choose another name")


def _walk(nodes):
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if isinstance(n, list):
            stack.extend(n)
            continue
        if not isinstance(n, ast.Node):
            if isinstance(n, tuple):
                stack.extend(n)
            continue
        yield n
        for v in vars(n).values():
            if isinstance(v, (ast.Node, list, tuple)):
                stack.append(v)


def _unify(want, v: ir.Value, sizes: dict, free: set, fn: str, arg: str):
    got = v.type
    if isinstance(want, ScalarType):
        if not _assignable(got, want):
            raise LinnetError(v.loc, f"argument `{arg}` of `{fn}` is {want}, not {got}")
        return
    if not isinstance(got, TensorType) or got.rank != want.rank or (want.dtype != got.dtype):
        raise LinnetError(v.loc, f"argument `{arg}` of `{fn}` must be {want}, not {got}")
    for w, g in zip(want.shape, got.shape):
        names = w.names()
        if len(w.terms) == 1 and w.terms[0][1] == 1 and len(w.terms[0][0]) == 1 and w.terms[0][0][0][1] == 1 \
                and isinstance(w.terms[0][0][0][0], str) and w.terms[0][0][0][0] in free and w.terms[0][0][0][0] not in sizes:
            sizes[w.terms[0][0][0][0]] = g
            continue
        if names & free - set(sizes):
            continue  # checked once the simple sizes are bound
        if w.substitute(sizes) != g:
            raise LinnetError(v.loc, f"argument `{arg}` of `{fn}` must be {want.substitute(sizes)}, not {got}",
                              [f"dim {w.substitute(sizes)} vs {g}"])


def _a(word: str) -> str:
    """`word` with its article: "an int[layers]", "a bool[layers]"."""
    return ("an " if word[:1] in "aeiou" else "a ") + word


def _assignable(got, want) -> bool:
    if got == want:
        return True
    if isinstance(got, ListType) and isinstance(want, ListType):  # (lengths are compared with numbers)
        return _assignable(ScalarType(got.item), ScalarType(want.item))
    return isinstance(got, ScalarType) and isinstance(want, ScalarType) and got.kind == "int" and want.kind == "float"


def _type_of_literal(value) -> ScalarType:
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int):
        return INT
    if isinstance(value, float):
        return FLOAT
    if isinstance(value, str):
        return STR
    return ScalarType("list")


class _Scope:
    """Locals of a fn body; loops open a child scope whose new names end with the loop."""

    def __init__(self, checker: _Checker, args: dict, dims: dict, fn=None, parent=None):
        self.checker = checker
        self.vars: dict = dict(args)
        self.kinds: dict = {n: "arg" for n in args}
        self.dims = dims
        self.fn = fn
        self.parent = parent
        self.assigned: dict = {}

    def child(self) -> "_Scope":
        return _Scope(self.checker, {}, self.dims, self.fn, self)

    def lookup(self, name: str):
        if name in self.vars:
            return self.vars[name]
        return self.parent.lookup(name) if self.parent else None

    def kind_of(self, name: str) -> str:
        if name in self.kinds:
            return self.kinds[name]
        return self.parent.kind_of(name) if self.parent else "local"

    def names(self):
        yield from self.vars
        if self.parent:
            yield from self.parent.names()

    def bind(self, name: str, t, loc: Loc, loop: bool = False):
        c = self.checker
        _not_reserved(name, loc)
        if name in c.params or name in c.config or name in c.fns or name in OPS or name in self.dims \
                or name in c.state or name in SIZE_GENERICS or name in DTYPES or name == GENERIC_DTYPE:
            what = ("a param" if name in c.params else "a config value" if name in c.config else
                    "state" if name in c.state else
                    "a function" if name in c.fns or name in OPS else "a built-in type or generic")
            raise LinnetError(loc, f"`{name}` is {what}; a local cannot take its name")
        if self.kind_of(name) == "loop" and self.lookup(name) is not None:
            raise LinnetError(loc, f"`{name}` is a loop variable; it cannot be assigned")
        # Rebinding a name (an argument too) may change its type, except a value carried
        # through a loop: the loop checks `assigned` against the outer binding when it ends.
        if self.parent is not None and self.parent.lookup(name) is not None:
            self.assigned[name] = (t, loc)
        self.vars[name] = t
        self.kinds[name] = "loop" if loop else self.kinds.get(name, "local")


CARD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

# The meta items Linnet reads (the others are the card's own notes): what each must be.
META_ITEMS = {"hf_repo": (str, "a string (ORG/NAME)"),
              "max_context": (int, "a whole number of positions, above 0"),
              "tool_call_parser": (str, "a string (a parser's name)"),
              "reasoning_parser": (str, "a string (a parser's name)")}


def _pattern_part(s: ast.Source, start: int, length: int) -> Loc:
    """Where the characters `start` to `start + length` of a weight's name pattern stand in the file."""
    col = s.pattern_loc.col + 1 + start  # (past the opening quote)
    return Loc(s.pattern_loc.path, s.pattern_loc.line, col, s.pattern_loc.line, col + length, s.pattern_loc.source)


def _literal_note(e: ast.Node, config: dict, want=None, computed=None) -> list[str]:
    """What a card most likely meant by a value that is no literal: a string left unquoted, Python's
    `True` (or a bool said otherwise, `yes`), no value at all (`None`), another config value or a
    computation (a card gives its number: `computed`, where it reads only literals). `want`: the
    config value's type, where one is set."""
    kind = getattr(want, "kind", None) if not isinstance(want, ListType) else want.item
    if isinstance(e, ast.Name):
        if e.id in ("True", "False"):
            return [f"Linnet's booleans are `{e.id.lower()}`"]
        if e.id in ("None", "null", "nil"):
            return [f"Linnet has no `{e.id}`: leave the value out to take the architecture's default"]
        if e.id in config:
            return [f"a card gives values, not names: write the number `{e.id}` is (or leave this value out where "
                    f"its default follows `{e.id}`)"]
        if kind == "bool":
            return ["a bool is `true` or `false`"]
        if kind in ("int", "float"):
            return [f"a {kind} is written as a number"]
        return [f"a string is written in double quotes: `\"{e.id}\"`"]
    if computed is not None:
        return [f"a card gives values, not computations: write the number it comes to, `{_spelled(computed)}`"]
    if isinstance(e, (ast.Binary, ast.Unary, ast.Call, ast.IfExpr)):
        return ["a card gives values, not computations: write the number it comes to (an architecture's default "
                "may compute one from other config values)"]
    return []


def _after_slashes(loc: Loc) -> list[str]:
    """A note for an unknown name that follows `//` on its line: a comment written in C's way
    (`x as f32 // widened` divides by `widened`)."""
    if not loc.source or loc.line < 1:
        return []
    line = source_lines(loc.source)[loc.line - 1][:loc.col - 1]
    return ["a comment starts with `#` (`//` divides)"] if re.search(r"//[ \t]*$", line) else []


def _spelled(value) -> str:
    """A literal as Linnet writes it (`true`, `"none"`), not as Python does (`True`, `'none'`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(map(_spelled, value)) + "]"
    return repr(value)


def _always(cond: ir.Value) -> bool:
    """Whether a static condition is true whatever the config: it reads no config value and is true."""
    from linnet.ir.specialize import evaluate

    try:
        return evaluate(cond, {}) is True
    except LinnetError:  # it reads a config value: known only once the model is specialized
        return False


def _meta_value(m: ast.MetaItem, value):
    """A meta item's value, checked where Linnet reads it (load's max_context, serve's parsers)."""
    if m.name in META_ITEMS:
        kind, what = META_ITEMS[m.name]
        if isinstance(value, bool) or not isinstance(value, kind) or (kind is int and value < 1):
            raise LinnetError(m.value.loc, f"meta `{m.name}` must be {what}, not {_spelled(value)}")
        return value
    # Other items are the card's notes, but one spelled almost as an item Linnet reads is a typo that
    # would drop the setting without a word (`max_contxt`: no warning past the trained context)
    close = difflib.get_close_matches(m.name, list(META_ITEMS), n=1, cutoff=0.7)
    if close:
        raise LinnetError(m.loc, f"meta `{m.name}` is not an item Linnet reads; did you mean `{close[0]}`?",
                          [f"Linnet reads {', '.join(f'`{k}`' for k in META_ITEMS)}; other names are notes"])
    return value
