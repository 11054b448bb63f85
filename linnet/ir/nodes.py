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
    # the `return` statements of the fns inlined whose result this op is, outermost first (layers_forward's
    # `return rmsnorm(x, norm)`): what the generated code's comment names as where a value comes from
    returned_at: tuple = ()


# ---------------------------------------------------------------- statements


@dataclass(eq=False)
class Assign:
    targets: list  # [name]
    value: Value
    loc: Loc
    via: tuple | None = None  # (fn, Loc of its call): the first statement of an inlined fn's body


@dataclass(eq=False)
class Store:
    """`state[indices] = value`: a write into a state buffer."""

    state: str
    indices: list
    value: Value
    loc: Loc
    via: tuple | None = None


@dataclass(eq=False)
class For:
    var: str
    count: Value  # a static int
    body: list
    loc: Loc
    via: tuple | None = None


@dataclass(eq=False)
class Return:
    value: Value
    loc: Loc


# ---------------------------------------------------------------- the module


@dataclass
class ConfigValue:
    name: str
    type: Any  # ScalarType, or ListType for a list (`bool[layers]`)
    default: Value | None
    loc: Loc


@dataclass
class WeightSource:
    """Where a param comes from in one checkpoint format, and how it is transformed."""

    format: str  # "hf" | "gguf"
    pattern: str  # names the param's loop variables: "model.layers.{l}.mlp.up_proj.weight"
    transforms: list  # [(name, [Value])]
    loc: Loc
    stacked: int = 0  # how many of the param's loops the pattern names (outermost first); each stored
    # tensor holds the dims of the rest: "blk.{l}.ffn_up_exps.weight" is all of layer l's experts


@dataclass
class Param:
    name: str
    type: Any  # TensorType; stacked params have the loop counts as first dims
    sources: list  # [WeightSource]
    loc: Loc
    loops: tuple = ()  # the variables of the `for` loops the param is declared in, outermost first
    tie: tuple | None = None  # (other param name, static condition Value)
    starts: dict = field(default_factory=dict)  # {loop var: Dim} where a loop `for l in a:b` starts past 0:
    # its stored tensors are named from `{l}` = a up, the stacked param's index 0 is a

    @property
    def loop_var(self) -> str | None:
        """The outermost loop's variable: `w[l]` is one layer's weight (all its experts, say)."""
        return self.loops[0] if self.loops else None


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
    arg_locs: list = field(default_factory=list)  # each argument's type, where it is written


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
    config_locs: dict = field(default_factory=dict)  # name -> Loc of the card's value, for errors found with numbers
    bindings: dict = field(default_factory=dict)  # set by specialize: name -> python value
    sources: dict = field(default_factory=dict)  # path -> text, for error messages
    card_path: str | None = None  # the card's file, when a card filled the config
    bases: tuple = ()  # the files of the architectures `path` extends, the nearest last
    loc: Loc | None = None  # where errors about the whole module point: the card's `card` line, else `arch`
