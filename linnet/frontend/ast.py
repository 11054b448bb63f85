"""The syntax tree of a `.linnet` file: what was written, with where it was written."""

from __future__ import annotations

from dataclasses import dataclass, field

from linnet.errors import Loc


@dataclass
class Node:
    loc: Loc


# ---------------------------------------------------------------- expressions


@dataclass
class Number(Node):
    value: int | float


@dataclass
class String(Node):
    value: str


@dataclass
class Bool(Node):
    value: bool


@dataclass
class Name(Node):
    id: str


@dataclass
class ListExpr(Node):
    items: list


@dataclass
class ListComp(Node):
    """`[item for var in count]`: a list config's default, one item for each of 0 .. count - 1."""

    item: Node
    var: str
    var_loc: Loc
    count: Node


@dataclass
class Binary(Node):
    op: str  # + - * / // % @ ** == != < <= > >= and or
    left: Node
    right: Node


@dataclass
class Unary(Node):
    op: str  # - not
    operand: Node


@dataclass
class IfExpr(Node):
    cond: Node
    then: Node
    orelse: Node


@dataclass
class Call(Node):
    """`f(a, b, k=c)`; a method call `a.f(b)` is the call `f(a, b)`."""

    func: str
    func_loc: Loc
    args: list
    kwargs: list  # [(name, Loc, expr)]


@dataclass
class Subscript(Node):
    value: Node
    indices: list


@dataclass
class Slice(Node):
    start: Node | None
    stop: Node | None


@dataclass
class Cast(Node):
    value: Node
    dtype: str
    dtype_loc: Loc


# ---------------------------------------------------------------- statements


@dataclass
class Assign(Node):
    targets: list  # [(name, Loc)]
    value: Node


@dataclass
class Store(Node):
    """`cache[l, rows, positions] = k`: a write into state."""

    target: str
    target_loc: Loc
    indices: list
    value: Node


@dataclass
class For(Node):
    var: str
    var_loc: Loc
    count: Node
    body: list


@dataclass
class Return(Node):
    value: Node


# ---------------------------------------------------------------- declarations


@dataclass
class TypeExpr(Node):
    dtype: str
    dtype_loc: Loc
    dims: list | None  # None: a scalar type such as `int`


@dataclass
class ArchDecl(Node):
    name: str
    base: str | None = None  # `arch qwen3_moe extends qwen3`
    base_loc: Loc | None = None
    without: list = field(default_factory=list)  # [(name, Loc)]: the base's declarations left out


@dataclass
class CardDecl(Node):
    name: str


@dataclass
class ImportDecl(Node):
    name: str


@dataclass
class ConfigDecl(Node):
    name: str
    type_name: str
    type_loc: Loc
    default: Node | None
    lengths: list | None = None  # `bool[layers]`: a list's length (one dim); None for a scalar


@dataclass
class ConfigSet(Node):
    name: str
    value: Node


@dataclass
class MetaItem(Node):
    name: str
    value: Node


@dataclass
class Transform(Node):
    name: str
    args: list


@dataclass
class Source(Node):
    format: str
    format_loc: Loc
    pattern: str
    pattern_loc: Loc
    transforms: list


@dataclass
class ParamDecl(Node):
    name: str
    type: TypeExpr
    tie: tuple | None  # (name, Loc, condition expr)
    sources: list
    loops: list = field(default_factory=list)  # [(var, count expr, Loc)] of the enclosing loops, outermost first
    loop_starts: dict = field(default_factory=dict)  # {var: first index expr} of a loop written `for l in a:b`


@dataclass
class StateDecl(Node):
    name: str
    type: TypeExpr


@dataclass
class Arg(Node):
    name: str
    type: TypeExpr


@dataclass
class FnDef(Node):
    kind: str  # "fn" or "entry"
    name: str
    dim_params: list  # [(name, Loc)]
    args: list
    ret: TypeExpr | None
    body: list


@dataclass
class File:
    path: str
    source: str
    arch: ArchDecl | None = None
    card: CardDecl | None = None
    imports: list = field(default_factory=list)
    config: list = field(default_factory=list)  # ConfigDecl | ConfigSet
    meta: list = field(default_factory=list)
    params: list = field(default_factory=list)
    state: list = field(default_factory=list)
    fns: list = field(default_factory=list)
    entries: list = field(default_factory=list)
    bases: dict = field(default_factory=dict)  # path -> text of the architectures this one extends
    left_out: dict = field(default_factory=dict)  # name -> Loc in `without`: the bases' declarations left out
    replaced: dict = field(default_factory=dict)  # fn name -> {path: FnDef}: each base's own fn that one replaced
    # param or state name -> the base's declaration one replaced (a base's line written for the one it declared)
    replaced_values: dict = field(default_factory=dict)
