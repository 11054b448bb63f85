"""GGUF's quantized blocks decoded in C (`gguf_blocks.c`), bit for bit as gguf's numpy decoders.

`decode(rows, qtype)` gives float32 [rows, values] for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to Q6_K
and MXFP4, or None where this library does not decode the type, cannot be built here, or is turned
off (LINNET_CPU_KERNELS=0); the caller then uses gguf's own decoders. `round_to_bf16` rounds f32 to
bf16 as torch does, on the calling thread (False where the library is not here). The library is
plain C, so it is built on any platform with a C compiler, not only where `build.runs_here`.
"""

from __future__ import annotations

import ctypes
import functools
import os

import numpy as np

from linnet.kernels import build


@functools.cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("LINNET_CPU_KERNELS", "1") == "0":
        return None
    lib = build.shared_library("gguf_blocks", ["gguf_blocks.c"], ("-ffp-contract=off",))
    if lib is None:
        return None
    lib.linnet_gguf_block.argtypes = [ctypes.c_int]
    lib.linnet_gguf_block.restype = ctypes.c_long
    lib.linnet_gguf_decode.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p]
    lib.linnet_gguf_decode.restype = ctypes.c_int
    lib.linnet_gguf_decode_bf16.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p]
    lib.linnet_gguf_decode_bf16.restype = ctypes.c_int
    lib.linnet_round_to_bf16.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    lib.linnet_round_to_bf16.restype = None
    return lib


@functools.cache
def decodes(qtype) -> bool:
    """Whether `decode` takes this type here: the library is built and its block layout for the
    type is the one gguf's table gives."""
    from gguf.constants import GGML_QUANT_SIZES

    lib = _library()
    if lib is None or qtype not in GGML_QUANT_SIZES:
        return False
    packed = lib.linnet_gguf_block(int(qtype))
    return packed != 0 and (packed >> 16, packed & 0xFFFF) == tuple(GGML_QUANT_SIZES[qtype])


def decode(rows: np.ndarray, qtype, out: np.ndarray | None = None, bf16: bool = False) -> np.ndarray | None:
    """rows [n, row bytes] (uint8, whole blocks) as float32 [n, row values], written into `out` if
    given (C-contiguous); None where not `decodes`. `bf16`: the values rounded to bf16 instead
    (`round_to_bf16`'s bits of the float32 ones), as uint16 [n, row values], in one pass."""
    if not decodes(qtype):
        return None
    from gguf.constants import GGML_QUANT_SIZES

    values, nbytes = GGML_QUANT_SIZES[qtype]
    if rows.ndim != 2 or rows.dtype != np.uint8 or rows.shape[1] % nbytes:
        raise ValueError(f"{qtype.name} rows must be uint8 [n, a multiple of {nbytes} bytes]; got {rows.dtype} "
                         f"{list(rows.shape)}")
    shape = (rows.shape[0], rows.shape[1] // nbytes * values)
    kind = np.dtype(np.uint16 if bf16 else np.float32)
    if out is None:
        out = np.empty(shape, kind)
    elif out.shape != shape or out.dtype != kind or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous {kind} {list(shape)}; got {out.dtype} {list(out.shape)}")
    rows = np.ascontiguousarray(rows)
    call = _library().linnet_gguf_decode_bf16 if bf16 else _library().linnet_gguf_decode
    if call(int(qtype), rows.ctypes.data, rows.size // nbytes, out.ctypes.data):
        raise AssertionError(f"gguf_blocks.c has no decoder for {qtype.name}")  # `decodes` said it had
    return out


def round_to_bf16(src: np.ndarray, dst: np.ndarray) -> bool:
    """src (float32) rounded to bf16 into dst (a 16-bit array of src's shape, both C-contiguous: the
    bf16 bits): to nearest, ties to even, as torch's conversion; a NaN stays NaN. False, with dst
    untouched, where the library is not here."""
    lib = _library()
    if lib is None:
        return False
    if src.dtype != np.float32 or dst.itemsize != 2 or src.shape != dst.shape or not (
            src.flags.c_contiguous and dst.flags.c_contiguous and dst.flags.writeable):
        raise ValueError(f"round_to_bf16 takes C-contiguous float32 and a writable 16-bit array of its shape; got "
                         f"{src.dtype} {list(src.shape)} and {dst.dtype} {list(dst.shape)}")
    lib.linnet_round_to_bf16(src.ctypes.data, dst.ctypes.data, src.size)
    return True
