"""Linnet's CPU kernels inside XLA programs: `xla_kernels.c`, XLA FFI handlers over
`cpu_linear.c` and `cpu_attention.c`, called with `jax.ffi.ffi_call` on JAX's CPU backend.

- `linear`: XLA's CPU dot reads few rows against a weight slowly (decode steps) and widens a bf16
  weight to f32 in memory at every call. With weights held as panels (`pack`, the layout
  `cpu_linear` documents) a linear is one custom call. SmolLM2-135M's linears in a jitted chain,
  16 rows: 48-58 ms against XLA's dot at 72-87; one row on a par (22.6 / 21.5). Panels in pairs
  of K (`pairs`: bf16 on AVX-512 BF16) take x in bf16.
- `attention_rows`: tokens that each read one cache row (every token of a pass), reading
  the stacked cache's layer where it lies.

The handlers run on XLA's own thread pool.
"""

from __future__ import annotations

import functools
import mmap
from typing import Any, NamedTuple

import numpy as np

from linnet.kernels import build, pages
from linnet.kernels.panels import PANEL


class Panels(NamedTuple):
    """A linear weight [n, K] as panels [ceil(n / 16), K, 16] inside an entry's trace: `array`, or
    layer `layer` (an int or a traced index) of a stacked `array` [layers, ceil(n / 16), K, 16]."""

    array: Any
    n: int
    layer: int | None = None


def pack(w, out: np.ndarray | None = None) -> np.ndarray:
    """w [N, K] (a host array, f32 / bf16 / f16) as zero-padded panels [ceil(N / 16), K, 16], laid
    out as cpu_linear.c reads them (`panels.arranged`), written into `out` if given: rearranged in
    place by the library's own packer (`linnet_pack_panels`, the one torch's weights go through)."""
    w = np.asarray(w)
    n, k = w.shape
    shape = (-(-n // PANEL), k, PANEL)
    if out is None:
        out = pages.aligned_empty(shape, w.dtype)
    elif out.shape != shape or out.dtype != w.dtype or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous {w.dtype} {list(shape)}; got {out.dtype} {list(out.shape)}")
    _fill_and_pack(out.reshape(-1, k), [w])
    return out


def pack_side_by_side(members: list, owned: bool = False) -> np.ndarray:
    """Host arrays [N_i, K], or [L, N_i, K] (a stacked param, one L for all), of one type and K,
    as the panels of their rows side by side (a fused group: q, k and v), zero-padded:
    [(L,) ceil(sum N_i / 16), K, 16].

    `owned`: the caller gives the members up, each whole (nothing else reads their memory). Where
    each also holds memory of its own (`owns_its_memory`: writable, no file's map under it; a JAX
    array's host view is JAX's), a lone C-contiguous member whose N is a multiple of 16 is packed
    in its own memory (no copy); otherwise the panels are a new array, filled a layer at a time,
    and each member's layer gives its pages back to the system once it is copied
    (`pages.give_back`), so that packing never holds two copies of a whole weight."""
    owned = owned and all(owns_its_memory(m) for m in members)
    members = [np.asarray(m) for m in members]
    first = members[0]
    stacked, k = first.ndim == 3, first.shape[-1]
    n = sum(m.shape[-2] for m in members)
    lead = first.shape[:1] if stacked else ()
    if owned and len(members) == 1 and n % PANEL == 0 and first.flags.c_contiguous:
        _fill_and_pack(first.reshape(-1, k), [])
        return first.reshape(*lead, n // PANEL, k, PANEL)
    out = pages.aligned_empty((*lead, -(-n // PANEL), k, PANEL), first.dtype)  # placed without a copy
    # a layer packed while its copy is in cache; on this thread where it is small: a thread team a
    # layer waited each time for a busy core (SmolLM2's 60 fused layers, 0.6 s of a start here)
    threads = 1 if out[0].nbytes < ONE_THREAD_BYTES else build.cores()
    for layer in range(lead[0] if stacked else 1):
        parts = [m[layer] if stacked else m for m in members]
        _fill_and_pack((out[layer] if stacked else out).reshape(-1, k), parts, give_back=owned, threads=threads)
    return out


def owns_its_memory(a) -> bool:
    """Whether numpy array `a` holds memory of its own to rearrange and give back: writable, and
    no file's map (np.memmap, mmap) under it. A JAX array's host view is JAX's."""
    if not isinstance(a, np.ndarray) or not a.flags.writeable:
        return False
    while a is not None:
        if isinstance(a, (np.memmap, mmap.mmap)):
            return False
        a = getattr(a, "base", None)
    return True


ONE_THREAD_BYTES = 1 << 22  # a weight (or a stacked one's layer) smaller than this is packed on one thread


def _fill_and_pack(rows: np.ndarray, parts: list, give_back: bool = False, threads: int | None = None) -> None:
    """rows [whole panels x 16, K]: `parts`' rows one after another (none: rows already hold the
    weight), zeros after them, then rearranged into panels in place, on `threads` threads (default:
    every core). With `give_back`, each part's pages go back to the system once copied."""
    start = 0
    for part in parts:
        rows[start:start + part.shape[0]] = part
        start += part.shape[0]
        if give_back and part.flags.c_contiguous:
            pages.give_back(part.ctypes.data, part.nbytes)
    if parts:
        rows[start:] = 0
    if _library().linnet_pack_panels(_type_code(rows.dtype), rows.ctypes.data, len(rows), rows.shape[1],
                                     threads or build.cores()):
        raise MemoryError(f"no memory for a {PANEL} x {rows.shape[1]} block to pack a linear weight with")


def pairs(dtype, k: int) -> bool:
    """Whether panels of this type and K hold their values in pairs of K here (cpu_linear.c's
    `linnet_panel_pairs`): then the kernel takes x in bf16."""
    code = _type_code(dtype)
    return code is not None and bool(_library().linnet_panel_pairs(code, k))


def _type_code(dtype) -> int | None:
    """kernels.h's code for f32, bf16 and f16 (0, 1, 2); None for another type."""
    import jax.numpy as jnp

    names = {np.dtype(jnp.float32): "f32", np.dtype(jnp.bfloat16): "bf16", np.dtype(jnp.float16): "f16"}
    return build.TYPE_CODES.get(names.get(np.dtype(dtype)))


def linear(x, w: Panels, out_dtype=None):
    """x [..., K] @ w.T in f32 arithmetic, rounded to x's type (or `out_dtype`)."""
    import jax
    import jax.numpy as jnp

    lead, k = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, k).astype(jnp.bfloat16 if pairs(w.array.dtype, k) else jnp.float32)
    layer = jnp.asarray(0 if w.layer is None else w.layer, jnp.int32)
    y = jax.ffi.ffi_call("linnet_linear", jax.ShapeDtypeStruct((rows.shape[0], w.n), jnp.float32))(rows, w.array, layer)
    return y.reshape(lead + (w.n,)).astype(out_dtype or x.dtype)


def attention_rows(q, k_stack, v_stack, layer, rows, positions, window: int, sinks, scale: float,
                   softcap: float = 0.0):
    """q [n, H, D]: token i against row rows[i] of layer `layer` of the stacked caches [L, B, S, KVH, D]
    at positions up to positions[i] (the last `window`, if any), with a sink logit per head if
    `sinks`; a position >= S is padding and gives zeros. softcap > 0 caps each scaled score s as
    softcap * tanh(s / softcap) (Gemma 2's) before the softmax. f32 arithmetic; returns q's type."""
    import jax
    import jax.numpy as jnp

    sinks = jnp.zeros((0,), jnp.float32) if sinks is None else sinks.astype(jnp.float32)
    kind = _type_code(k_stack.dtype)
    if kind:  # a 16-bit cache goes as its bits: the state is held so, and XLA folds the two views away
        k_stack, v_stack = (jax.lax.bitcast_convert_type(a, jnp.uint16) for a in (k_stack, v_stack))
    scalars = jnp.stack([jnp.asarray(layer, jnp.int32), jnp.asarray(window, jnp.int32), jnp.asarray(kind, jnp.int32)])
    out = jax.ffi.ffi_call("linnet_attention", jax.ShapeDtypeStruct(q.shape, jnp.float32))(
        q.astype(jnp.float32), k_stack, v_stack, rows.astype(jnp.int32), positions.astype(jnp.int32), scalars,
        jnp.asarray([scale, softcap], jnp.float32), sinks)
    return out.astype(q.dtype)


def attends_here(stack, head_dim: int) -> bool:
    """Whether `attention_rows` serves a stacked cache of this type and head size here."""
    return head_dim % 8 == 0 and _on_cpu() and available(stack.dtype, "cpu")  # (no build where JAX runs elsewhere)


def _on_cpu() -> bool:
    import jax

    return jax.default_backend() == "cpu"


def available(dtype, platform: str) -> bool:
    """Whether arrays of `dtype` on a device of `platform` go to the kernels here."""
    return platform == "cpu" and _type_code(dtype) is not None and registered()


def registered() -> bool:
    """Builds the handlers and registers them with XLA, once: False where they cannot run."""
    return _library() is not None


@functools.cache
def _library():
    if not build.runs_here():
        return None
    import ctypes

    import jax

    ffi = getattr(jax, "ffi", None)
    if ffi is None or not hasattr(ffi, "include_dir"):
        return None  # a JAX older than its FFI module
    lib = build.shared_library("xla_kernels", ["cpu_linear.c", "cpu_attention.c", "pool.c", "xla_kernels.c"],
                               ("-I", ffi.include_dir()))
    if lib is None or not lib.linnet_cpu_supported():
        return None
    lib.linnet_panel_pairs.argtypes = [ctypes.c_int, ctypes.c_long]
    lib.linnet_pack_panels.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_int]
    lib.linnet_pack_panels.restype = ctypes.c_int
    for name in ("linear", "attention"):
        ffi.register_ffi_target(f"linnet_{name}", ffi.pycapsule(getattr(lib, f"linnet_xla_{name}")), platform="cpu")
    return lib
