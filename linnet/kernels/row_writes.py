"""How a cache write `state[ints..., a, (b)] = value` lies in memory, for the kernels that do it in
one pass (Linnet's CPU kernel, `cpu_ops.put_rows`; its Triton one, `triton_ops.put_rows`); and an
operand's rows as both kernels of the small ops read them (`dense_rows`)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


class RowWrite(NamedTuple):
    offset: int  # where the leading int indices put the write, in elements of `state`
    a: torch.Tensor  # the first index tensor, [n]
    a_stride: int
    a_limit: int  # its axis' size: an index outside it writes nothing
    b: torch.Tensor | None  # the second, if any (a cache's position after its row)
    b_stride: int
    b_limit: int
    n: int
    block: int  # elements each index writes: value is [n, block]


def row_write(state: torch.Tensor, index: tuple, value: torch.Tensor) -> RowWrite | None:
    """The layout of state[index] = value where index is ints then one or two 1-D index tensors
    (layer, row, position), state is contiguous and value is [n, the axes after them]; None for
    any other index."""
    ints = 0
    while ints < len(index) and isinstance(index[ints], int):
        ints += 1
    tensors = index[ints:]
    if not 1 <= len(tensors) <= 2 or not state.is_contiguous():
        return None
    shape, strides = state.shape, state.stride()
    offset = 0
    for axis in range(ints):
        if not 0 <= index[axis] < shape[axis]:
            return None
        offset += index[axis] * strides[axis]
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.dim() != 1:
            return None
    n, rest = tensors[0].shape[0], shape[ints + len(tensors):]
    if tensors[-1].shape[0] != n or value.shape != (n, *rest):
        return None
    b = tensors[-1] if len(tensors) == 2 else None
    return RowWrite(offset, tensors[0], strides[ints], shape[ints], b, strides[-len(rest) - 1],
                    shape[-len(rest) - 1], n, math.prod(rest))


def dense_rows(t: torch.Tensor, width: int) -> torch.Tensor:
    """t as rows of `width` elements, each dense, the rows as far apart as t has them (a view where
    it can be: the columns of a fused matmul's output stay where they are), for a kernel that
    takes a row stride."""
    rows = t.reshape(-1, width)
    return rows if rows.stride(-1) == 1 else rows.contiguous()
