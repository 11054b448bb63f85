"""The IR: typed values, statements and the module that holds a model.

Values form expression trees (one tree per statement), so generated code can
keep the shape of the source: one statement, one line. Every node carries the
`Loc` of the source it came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from linnet.errors import Loc


# ---------------------------------------------------------------- values


@dataclass(eq=False)
class Value:
    type: Any
    loc: Loc


@dataclass(eq=False)
class Var(Value):
    """A local, an argument, a param, a state buffer or a config value, by `kind`."""

    name: str
    kind: str  # "local" | "arg" | "param" | "state" | "config" | "loop" | "dim"


@dataclass(eq=False)
class Const(Value):
    value: Any  # int | float | bool | str | None


@dataclass(eq=False)
class Slice(Value):
    """`start:stop` inside an index; None for an open end."""

    start: Value | None
    stop: Value | None
    start_dim: Any = None  # the bounds as Dims, for typing
    stop_dim: Any = None


@dataclass(eq=False)
class Op(Value):
    op: str
    args: list  # the values of the op's `*rest` parameter, if it has one
    kwargs: dict = field(default_factory=dict)  # every named parameter given, by name
    dims: tuple = ()  # sizes for ops that take them: reshape, iota, zeros, topk
    attrs: dict = field(default_factory=dict)  # static facts: a called fn's name, a cast's dtype


# ---------------------------------------------------------------- statements


@dataclass(eq=False)
class Assign:
    targets: list  # [name]
    value: Value
    loc: Loc


@dataclass(eq=False)
class Store:
    """`state[indices] = value`: a write into a state buffer."""

    state: str
    indices: list
    value: Value
    loc: Loc


@dataclass(eq=False)
class For:
    var: str
    count: Value  # a static int
    body: list
    loc: Loc


@dataclass(eq=False)
class Return:
    value: Value
    loc: Loc


# ---------------------------------------------------------------- the module


@dataclass
class ConfigValue:
    name: str
    type: Any  # ScalarType
    default: Value | None
    loc: Loc


@dataclass
class WeightSource:
    """Where a param comes from in one checkpoint format, and how it is transformed."""

    format: str  # "hf" | "gguf"
    pattern: str  # may name the param's loop variable: "model.layers.{l}.mlp.up_proj.weight"
    transforms: list  # [(name, [Value])]
    loc: Loc


@dataclass
class Param:
    name: str
    type: Any  # TensorType; stacked params have the loop count as first dim
    sources: list  # [WeightSource]
    loc: Loc
    loop_var: str | None = None  # params declared in `for l in layers` are stacked over l
    tie: tuple | None = None  # (other param name, static condition Value)


@dataclass
class State:
    name: str
    type: Any
    loc: Loc


@dataclass
class Function:
    """A `fn` or an `entry`; `dims` are the sizes bound per call (`<N, K>`)."""

    name: str
    kind: str  # "fn" | "entry"
    dims: list  # [name]
    args: list  # [(name, type)]
    ret: Any
    body: list
    loc: Loc


@dataclass
class Module:
    name: str
    path: str
    config: dict  # name -> ConfigValue, in declaration order
    params: dict  # name -> Param
    state: dict  # name -> State
    fns: dict  # name -> Function
    entries: dict  # name -> Function
    card: str | None = None
    meta: dict = field(default_factory=dict)  # name -> python value
    config_values: dict = field(default_factory=dict)  # values set by a card: name -> python value
    bindings: dict = field(default_factory=dict)  # set by specialize: name -> python value
    sources: dict = field(default_factory=dict)  # path -> text, for error messages

    def entry_names(self) -> list:
        return list(self.entries)
