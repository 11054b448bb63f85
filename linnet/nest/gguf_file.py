"""A GGUF file (llama.cpp's format) opened for reading: its header parsed here, its tensors
read-only views of one memory map of the file.

gguf's own `GGUFReader` slices a numpy array once per value of the header: for a tokenizer of
49k token strings and 48k merges that is some 800k slices, 1.9 s of SmolLM2's 9.5 s start on
this CPU. Walking the header with `struct` takes a tenth of that. The package's enums and its
table of block sizes are still the reference for what each type code means.

A file cut short, or a header that does not add up, raises `GGUFFormatError` saying where: which
tensor runs past the end of the file, or at which byte the header stops making sense.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # version 1 stored lengths in 32 bits; llama.cpp has written 3 since 2023
DEFAULT_ALIGNMENT = 32

_SCALARS = {  # struct codes of the value types that are one number
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}
# tensor types stored as plain numbers; the others are blocks of bytes that `gguf.quants` decodes
PLAIN_TYPES = {
    GGMLQuantizationType.F32: "f4", GGMLQuantizationType.F16: "f2", GGMLQuantizationType.F64: "f8",
    GGMLQuantizationType.I8: "i1", GGMLQuantizationType.I16: "i2", GGMLQuantizationType.I32: "i4",
    GGMLQuantizationType.I64: "i8",
}


class GGUFFormatError(ValueError):
    """Not a GGUF file, or one cut short or damaged; the message says where."""


@dataclass(frozen=True)
class Field:
    """One key of the header's metadata."""

    name: str
    type: GGUFValueType
    value: Any  # str, int, float, bool, or a list of them (an array's)
    element_type: GGUFValueType | None = None  # an array's; for an array of arrays, the innermost


@dataclass(frozen=True)
class Tensor:
    """One tensor: where its bytes are, and a read-only view of them."""

    name: str
    type: GGMLQuantizationType
    shape: tuple[int, ...]  # slowest dim first, as numpy and torch list them (GGUF lists ggml's, fastest first)
    offset: int  # of its first byte in the file
    nbytes: int
    # plain types: the numbers, in `shape`; quantized ones: each row's blocks, as bytes ([*shape[:-1], row bytes])
    data: np.ndarray


class GGUFFile:
    """`fields` (name -> Field) and `tensors` (name -> Tensor), both in the file's order."""

    def __init__(self, path: str):
        self.path = str(path)
        with open(self.path, "rb") as f:
            try:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:  # mmap's word for an empty file
                raise GGUFFormatError("the file is empty") from None
        self.size = len(self._map)
        self.fields: dict[str, Field] = {}
        self.tensors: dict[str, Tensor] = {}
        self.version, self.alignment, self.byte_order = 0, DEFAULT_ALIGNMENT, "<"  # the header's, once read
        _HeaderReader(self).read()

    def value(self, name: str, default: Any = None) -> Any:
        field = self.fields.get(name)
        return default if field is None else field.value


class _HeaderReader:
    """One pass over the header, filling a GGUFFile's fields and tensors."""

    def __init__(self, file: GGUFFile):
        self.file, self.buf, self.pos = file, file._map, 0

    def read(self) -> None:
        file = self.file
        if self.buf[:4] != MAGIC:
            raise GGUFFormatError(f"not a GGUF file (it starts {bytes(self.buf[:4])!r}, not {MAGIC!r})")
        self.order, self.pos = "<", 4
        # A file written on a big-endian machine reads its small version number byte-swapped.
        if self.take("I") & 0xFFFF == 0:
            self.order = file.byte_order = ">"
        self.pos = 4
        file.version = self.take("I")
        if file.version not in VERSIONS:
            raise GGUFFormatError(f"GGUF version {file.version}; versions {', '.join(map(str, VERSIONS))} are read")
        n_tensors, n_fields = self.take("Q"), self.take("Q")
        for _ in range(n_fields):
            start = self.pos
            name, vtype = self.string(), self.value_type()
            value, element = self.value(vtype)
            if name in file.fields:
                raise GGUFFormatError(f"the key {name!r} at byte {start} appears twice")
            file.fields[name] = Field(name, vtype, value, element)
        infos = [self.tensor_info() for _ in range(n_tensors)]
        file.alignment = self.alignment()
        data_start = -(-self.pos // file.alignment) * file.alignment
        self.place(infos, data_start)

    # -- numbers and strings

    def take(self, code: str):
        try:
            (value,) = struct.unpack_from(self.order + code, self.buf, self.pos)
        except struct.error:
            raise self.cut_short() from None
        self.pos += struct.calcsize(self.order + code)  # standard sizes, as the order prefix sets them
        return value

    def string(self) -> str:
        n = self.take("Q")
        if self.pos + n > self.file.size:
            raise self.cut_short()
        text = str(self.buf[self.pos:self.pos + n], "utf-8", "replace")
        self.pos += n
        return text

    def value_type(self) -> GGUFValueType:
        at, code = self.pos, self.take("I")
        try:
            return GGUFValueType(code)
        except ValueError:
            raise GGUFFormatError(f"unknown value type {code} at byte {at}") from None

    def value(self, vtype: GGUFValueType, depth: int = 0) -> tuple[Any, GGUFValueType | None]:
        """(the value, its arrays' innermost element type or None)"""
        if vtype == GGUFValueType.STRING:
            return self.string(), None
        if vtype != GGUFValueType.ARRAY:
            return self.take(_SCALARS[vtype]), None
        etype, count = self.value_type(), self.take("Q")
        if etype in _SCALARS:  # numbers: one read of the lot
            dtype = np.dtype(_SCALARS[etype]).newbyteorder(self.order)
            if self.pos + count * dtype.itemsize > self.file.size:
                raise self.cut_short()
            values = np.frombuffer(self.buf, dtype, count, self.pos).tolist()
            self.pos += count * dtype.itemsize
            return values, etype
        if etype == GGUFValueType.STRING:  # a vocabulary: the loop that must be quick
            unpack_length, buf, pos, size = struct.Struct(self.order + "Q").unpack_from, self.buf, self.pos, self.file.size
            values = []
            for _ in range(count):
                if pos + 8 > size:
                    self.pos = pos
                    raise self.cut_short()
                (n,) = unpack_length(buf, pos)
                pos += 8
                if pos + n > size:
                    self.pos = pos
                    raise self.cut_short()
                values.append(str(buf[pos:pos + n], "utf-8", "replace"))
                pos += n
            self.pos = pos
            return values, etype
        if depth >= 8:  # arrays of arrays have a use; arrays nested this deep are a damaged header
            raise GGUFFormatError(f"arrays nested more than 8 deep at byte {self.pos}")
        values, inner = [], etype  # arrays of arrays
        for _ in range(count):
            value, inner = self.value(etype, depth + 1)
            values.append(value)
        return values, inner

    def cut_short(self) -> GGUFFormatError:
        return GGUFFormatError(f"the header is cut short at byte {self.pos} (the file has {self.file.size})")

    # -- tensors

    def tensor_info(self) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
        name = self.string()
        n_dims = self.take("I")
        if n_dims > 8:  # ggml has 4; anything past a few is a damaged header, not a tensor
            raise GGUFFormatError(f"tensor {name!r} has {n_dims} dims")
        dims = [self.take("Q") for _ in range(n_dims)]
        if any(d >= 2 ** 63 for d in dims):  # more than an array can index, even beside a dim of 0
            raise GGUFFormatError(f"tensor {name!r} has the dims {dims}")
        code = self.take("I")
        try:
            ttype = GGMLQuantizationType(code)
        except ValueError:
            raise GGUFFormatError(f"tensor {name!r} has the unknown type {code}") from None
        if ttype not in GGML_QUANT_SIZES:
            raise GGUFFormatError(f"tensor {name!r} has the type {ttype.name}, whose block size is not known")
        return name, tuple(reversed(dims)), ttype, self.take("Q")

    def alignment(self) -> int:
        field = self.file.fields.get("general.alignment")
        if field is None:
            return DEFAULT_ALIGNMENT
        if field.type != GGUFValueType.UINT32 or field.value <= 0 or field.value & (field.value - 1):
            raise GGUFFormatError(f"general.alignment is {field.value!r}, not a power of two (uint32)")
        return field.value

    def place(self, infos: list, data_start: int) -> None:
        """Each tensor's bytes, checked to lie within the file: the first (in the file's order) to
        run past its end is named, as a file cut short while copying loses its last tensors."""
        file, placed, names = self.file, [], set()
        for name, shape, ttype, relative in infos:
            if name in names:
                raise GGUFFormatError(f"tensor {name!r} appears twice")
            names.add(name)
            block, block_bytes = GGML_QUANT_SIZES[ttype]
            if shape and shape[-1] % block:
                raise GGUFFormatError(f"tensor {name!r} {list(shape)}: a row of {shape[-1]} is not whole "
                                      f"{ttype.name} blocks of {block}")
            nbytes = math.prod(shape) // block * block_bytes  # Python's integers: a damaged dim overflows nothing
            if ttype in PLAIN_TYPES:  # the numbers, in their shape
                view = np.dtype(PLAIN_TYPES[ttype]).newbyteorder(self.order), shape
            else:  # each row's blocks, as bytes
                view = np.dtype(np.uint8), (shape[:-1] + (shape[-1] // block * block_bytes,) if shape else (nbytes,))
            placed.append((name, shape, ttype, data_start + relative, nbytes, view))
        for name, shape, ttype, offset, nbytes, _ in sorted(placed, key=lambda p: p[3] + p[4]):
            if offset + nbytes > file.size:
                raise GGUFFormatError(f"tensor {name!r} {list(shape)} needs bytes up to {offset + nbytes}, "
                                      f"but the file has {file.size}")
        # Each tensor where the one before it in the header ends, padded to the alignment, as llama.cpp
        # requires: a type or a shape changed in a damaged header moves where a tensor's bytes would be,
        # and its weights would read another's (or a gap's) bytes. The last one ends where the file does.
        end, before = 0, None
        for name, shape, ttype, offset, nbytes, _ in placed:
            if offset - data_start != end:
                after = f" ({before})" if before else ""
                raise GGUFFormatError(f"tensor {name!r} ({ttype.name} {list(shape)}) is at byte {offset - data_start} "
                                      f"of the data, but the tensors before it end at byte {end}{after}: a type or "
                                      f"shape in the header is not the one its bytes were written in")
            end += -(-nbytes // file.alignment) * file.alignment
            before = f"{name!r}, {ttype.name} {list(shape)}: {nbytes} bytes"
        if file.size - (data_start + end) >= file.alignment:
            raise GGUFFormatError(f"the tensors end at byte {data_start + end}, but the file has {file.size} bytes: "
                                  f"a type or shape in the header (the last tensor's, {before}) is not the one "
                                  f"its bytes were written in")
        for name, shape, ttype, offset, nbytes, (dtype, view_shape) in placed:
            data = np.frombuffer(self.buf, dtype, nbytes // dtype.itemsize, offset).reshape(view_shape)
            file.tensors[name] = Tensor(name, ttype, shape, offset, nbytes, data)
