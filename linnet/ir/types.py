"""Element types and the types of IR values: tensors, static scalars, tuples."""

from __future__ import annotations

from dataclasses import dataclass

from linnet.ir.dims import Dim

GENERIC_DTYPE = "T"
FLOAT_DTYPES = ("f32", "bf16", "f16")
# The float types as torch, numpy and vLLM's --dtype name them, which T takes too (`generics={"T": "bfloat16"}`)
FLOAT_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "f16", "half": "f16", "float32": "f32", "float": "f32"}
INT_DTYPES = ("i32", "i64")
DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)
SCALAR_KINDS = ("int", "float", "bool", "str")
SIZE_GENERICS = ("Batch", "MaxSeq")


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES or dtype == GENERIC_DTYPE


def is_int(dtype: str) -> bool:
    return dtype in INT_DTYPES


@dataclass(frozen=True)
class TensorType:
    dtype: str  # one of DTYPES or the generic "T"
    shape: tuple  # of Dim

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"

    def substitute(self, values) -> "TensorType":
        return TensorType(self.dtype, tuple(d.substitute(values) for d in self.shape))


@dataclass(frozen=True)
class ScalarType:
    """A value known when the model is specialized: a config value, a loop index, a literal."""

    kind: str  # one of SCALAR_KINDS

    def __str__(self) -> str:
        return self.kind


@dataclass(frozen=True)
class ListType:
    """A config value that is a list of static scalars, one per index below `length` (`bool[layers]`):
    read only one item at a time, at a static int (`no_rope_layers[l]`), which is an `item`."""

    item: str  # the items' kind: one of SCALAR_KINDS
    length: Dim

    @property
    def kind(self) -> str:
        return "list"

    def __str__(self) -> str:
        return f"{self.item}[{self.length}]"


@dataclass(frozen=True)
class TupleType:
    items: tuple

    def __str__(self) -> str:
        return "(" + ", ".join(str(t) for t in self.items) + ")"


@dataclass(frozen=True)
class NoneType:
    """The type of an entry that returns nothing (it only updates state)."""

    def __str__(self) -> str:
        return "()"


INT = ScalarType("int")
FLOAT = ScalarType("float")
BOOL = ScalarType("bool")
STR = ScalarType("str")


def tensor(dtype: str, *shape) -> TensorType:
    return TensorType(dtype, tuple(Dim.of(d) for d in shape))


def shape_str(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"
