"""A torch decode step on the CPU captured once and replayed as one C call (`cpu_graph.c`): the
CPU's counterpart of the CUDA graph the torch runner captures on a GPU.

Eager, a SmolLM2 one-row step spends about 4 ms of its 12 in Python and torch's dispatch around
423 small kernel calls and the aten ops between them. Captured, the step is a list of kernel
calls with their arguments; replayed, it is those calls in a C loop, and the Python is gone.

`with capture() as graph:` runs what it holds (a decode step) once, for real, while it records:
- every call of Linnet's CPU kernels (`call`, through which the kernels' wrappers go);
- every aten op, through a dispatch mode: views, allocations and constants (factory ops on no
  tensor) need no replay; elementwise add / mul / div (of two tensors, or a tensor and a Python
  number) / tanh / SiLU / dtype copies, a concatenation (a copy of each part) and an embedding
  gather become kernel calls of their own; any other op, or a read of a value on the host, means
  the step cannot be replayed (`CpuGraph.unsupported` says which), and the runner stays eager.
Every tensor the step made is kept, so each keeps its address. The caller copies each step's
inputs into the tensors the capture read, as for a CUDA graph, and must not reallocate what
the step reads or writes (the cache: `TorchModel.reset_state` zeroes it in place).
"""

from __future__ import annotations

import ctypes
import math
import struct
import threading
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from linnet.kernels import build, pool
from linnet.kernels.torch_types import TYPES

aten = torch.ops.aten
OP_ADD, OP_MUL, OP_SILU, OP_COPY, OP_SILU_MUL, OP_GELU_TANH, OP_DIV, OP_TANH = range(8)  # kernels.h's elementwise ops
_ELEMENTWISE = {aten.add.Tensor: OP_ADD, aten.add_.Tensor: OP_ADD, aten.mul.Tensor: OP_MUL,
                aten.mul_.Tensor: OP_MUL, aten.div.Tensor: OP_DIV, aten.silu.default: OP_SILU,
                aten.tanh.default: OP_TANH, aten._to_copy.default: OP_COPY}
_BINARY = (OP_ADD, OP_MUL, OP_DIV)
# ops that, when they do not return a view, copy their input (maybe to another type) in row order;
# under inference mode the dispatch mode sees them whole, not as the clone they decompose into
_COPIES = {aten.contiguous.default, aten.reshape.default, aten.clone.default, aten.to.dtype, aten.to.device,
           aten.to.dtype_layout, aten.to.other}
_ALLOCATES = {aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default, aten.new_empty.default}


class _Recording(threading.local):
    graph: "CpuGraph | None" = None  # the capture running on this thread, if any (a server steps on its own)


_recording = _Recording()


def call(name: str, *args):
    """linnet_<name>(*args) of the CPU kernel library; under `capture`, also recorded for replay."""
    result = getattr(build.cpu_kernels(), "linnet_" + name)(*args)
    if _recording.graph is not None:
        _recording.graph.record(name, args)
    return result


def available() -> bool:
    """Whether a step can be captured here: the kernel library built, with its replay."""
    return build.cpu_kernels() is not None


class CpuGraph:
    """The kernel calls of one captured step, and the tensors whose addresses they hold."""

    def __init__(self):
        self.tasks, self.words, self.keep = [], [], []
        self.unsupported: str | None = None  # the first op that cannot be replayed, if any
        self._arrays = None

    def record(self, name: str, args: tuple):
        words = (ctypes.c_int64 * len(args))(*(_word(a) for a in args))
        self.tasks.append(ctypes.cast(getattr(build.cpu_kernels(), "linnet_task_" + name), ctypes.c_void_p).value)
        self.words.append(words)
        self._arrays = None

    def replay(self):
        """Runs the captured calls again, in order, in one C call."""
        if self._arrays is None:
            count = len(self.tasks)
            self._arrays = (count, (ctypes.c_void_p * count)(*self.tasks),
                            (ctypes.c_void_p * count)(*(ctypes.addressof(w) for w in self.words)))
        failed = build.cpu_kernels().linnet_replay(*self._arrays)
        if failed >= 0:
            raise MemoryError(f"the replayed decode step's kernel {failed} ran out of memory")

    def __len__(self) -> int:
        return len(self.tasks)

    # What the dispatch mode sees.

    def note(self, func, args: tuple, kwargs: dict, out):
        self.keep.append(out)
        if self.unsupported is not None or func in _ALLOCATES:  # new memory: nothing to compute
            return
        tensors = [t for a in (*args, *kwargs.values()) for t in (a if isinstance(a, (list, tuple)) else [a])
                   if isinstance(t, torch.Tensor)]
        if not tensors:
            return  # a constant (arange, zeros): its values stay as the capture made them
        if any(t.is_mkldnn for t in tensors):
            replayed = False  # oneDNN's packed weights (`runtime.pack_linear_weight`): no address to replay
        elif func in _ELEMENTWISE:
            replayed = self._elementwise(_ELEMENTWISE[func], args, kwargs, out)
        elif func._schema.is_mutable:
            replayed = False  # an in-place op (index_put_, copy_) writes what a view of its output would hide
        elif _shares_memory(out, tensors):
            return  # a view (select, slice, a reshape or contiguous() that copied nothing)
        elif func in _COPIES:
            replayed = self._elementwise(OP_COPY, args[:1], {}, out)
        elif func is aten.cat.default:
            replayed = self._cat(args, out)
        else:
            replayed = func is aten.index.Tensor and self._gather(args, out)
        if not replayed:
            self.unsupported = str(func)

    def _elementwise(self, op, args, kwargs, out) -> bool:
        a = args[0]
        b = args[1] if op in _BINARY and len(args) > 1 else a
        if op == OP_COPY and set(kwargs) - {"dtype", "layout", "device", "memory_format"} or \
                op != OP_COPY and (kwargs.get("alpha", 1) != 1 or len(args) > 2):
            return False
        if not (isinstance(a, torch.Tensor) and isinstance(out, torch.Tensor)):
            return False
        if isinstance(b, (int, float)) and not isinstance(b, bool):
            b = self._number(b, torch.float32 if op in (OP_MUL, OP_DIV) else a.dtype, out)
        elif not (isinstance(b, torch.Tensor) and (a.dtype == b.dtype or out.dtype == torch.float32)):
            return False  # operands of two types: torch widens both to an f32 output, exactly, as the kernel does
        if op == OP_COPY:
            if a.shape != out.shape:  # a reshape that copied: the same values in row order, out dense
                if not (out.is_contiguous() and out.numel() == a.numel()):
                    return False
                out = out.view(a.shape)
        else:
            if a.shape != out.shape and op in (OP_ADD, OP_MUL):
                a, b = b, a  # both commute: the operand that broadcasts goes second
            if a.shape != out.shape:
                return False
            try:
                b = b.expand(out.shape)  # a bias over rows: its row stride is 0 (`_rows` refuses other broadcasts)
            except RuntimeError:
                return False
        if out.dim() == 1 and all(t.stride(0) == 1 for t in (a, b, out)):
            a, b, out = a[None], b[None], out[None]  # one row of them: a row a value took 35x as long (1.0 + w)
        views = [_rows(t) for t in (a, b, out)]
        if None in views or len({v[2:] for v in views}) != 1:
            return False  # a layout the kernel does not walk, or a copy that moves values across rows
        (ap, ast, rows, cols), (bp, bst, _, _), (op_, ost, _, _) = views
        self.record("elementwise", (op, TYPES[a.dtype], ap, ast, TYPES[b.dtype], bp, bst, TYPES[out.dtype], op_, ost,
                                    rows, cols, pool.threads()))
        return True

    def _number(self, number, dtype: torch.dtype, out: torch.Tensor) -> torch.Tensor:
        """A Python number operand (aten's wrapped scalar: `x * dim ** 0.5`, `1.0 + w`) as a row of it in
        `dtype`, every row of `out` reading it (stride 0; a 1-D out's row is all of it). torch multiplies
        and divides a 16-bit tensor by a number in f32, the number rounded to f32 (sqrt(640) is 25.298,
        not bf16's 25.25), but adds the number rounded to the tensor's type first
        (tests/kernels/test_cpu_number_ops.py holds it to both)."""
        row = torch.full(out.shape[1:] if out.dim() > 1 else out.shape, float(number), dtype=dtype)  # 1-D: dense
        self.keep.append(row)
        return row.expand(out.shape)

    def _cat(self, args, out) -> bool:
        """torch.cat as a copy of each part into its place in the output: rows over the axes before the
        joined one, each part's row dense from there (Phi-2's rotated part of each head beside the rest)."""
        parts, axis = args[0], (args[1] if len(args) > 1 else 0) % out.dim()
        start = 0
        for part in parts:
            if part.numel() == 0:
                continue  # (torch.cat skips an empty 1-D part whatever the axis)
            place = out.narrow(axis, start, part.shape[axis])
            start += part.shape[axis]
            width = math.prod(part.shape[axis:])
            try:
                part, place = part.view(-1, width), place.view(-1, width)  # fails where the leading axes do not merge
            except RuntimeError:
                return False
            if not self._elementwise(OP_COPY, (part,), {}, place):
                return False
        return True

    def _gather(self, args, out) -> bool:
        table, index = args
        ids = index[0] if len(index) == 1 else None
        if not (_dense(table) and _dense(out) and table.dim() == 2 and isinstance(ids, torch.Tensor)
                and ids.dtype == torch.int32 and ids.dim() == 1 and ids.is_contiguous()):
            return False
        self.record("gather_rows", (TYPES[table.dtype], table.data_ptr(), table.shape[0], table.shape[1],
                                    ids.data_ptr(), ids.shape[0], TYPES[out.dtype], out.data_ptr(),
                                    pool.threads()))
        return True


def _rows(t: torch.Tensor):
    """t as (address, row stride, rows, columns), as the elementwise kernel walks it: rows along its
    first axis, each dense (any tensor dense itself, or a view whose rows lie apart: the columns
    of a fused output); None for any other layout or type."""
    if t.device.type != "cpu" or t.dtype not in TYPES:
        return None
    if t.dim() == 0:
        return t.data_ptr(), 1, 1, 1
    rows, dense = t.shape[0], 1
    for size, stride in reversed(list(zip(t.shape[1:], t.stride()[1:]))):
        if size != 1 and stride != dense:
            return None
        dense *= size
    return t.data_ptr(), t.stride(0), rows, dense


def _shares_memory(out, tensors: list) -> bool:
    outs = out if isinstance(out, (list, tuple)) else [out]
    inputs = {t.untyped_storage().data_ptr() for t in tensors}
    return all(isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() in inputs for o in outs)


def _dense(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dtype in TYPES and t.is_contiguous()


def _word(a) -> int:
    if a is None:
        return 0
    if isinstance(a, float):
        return struct.unpack("<I", struct.pack("<f", a))[0]
    return int(a)


class _Recorder(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Recent torch wraps a mode's __torch_dispatch__ in dynamo.disable, whose first call imports
        # torch._dynamo: 2.3 s of every eager process's start, for a mode that never runs compiled.
        return False

    def __init__(self, graph: CpuGraph):
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)  # the capture runs the step for real
        self.graph.note(func, args, kwargs, out)  # a read on the host (_local_scalar_dense) is not replayable
        return out


@contextmanager
def capture():
    """Records, into the CpuGraph it yields, the kernel calls and aten ops of what runs inside."""
    graph = CpuGraph()
    _recording.graph = graph
    try:
        with _Recorder(graph):
            yield graph
    finally:
        _recording.graph = None
