"""Linnet's CPU linear kernel inside XLA programs: `xla_linear.c`, an XLA FFI handler over
`cpu_linear.c`, called with `jax.ffi.ffi_call` on JAX's CPU backend.

XLA's CPU dot reads few rows against a weight slowly (decode steps) and widens a bf16 weight to
f32 in memory at every call. With weights held as panels (`pack`, the layout `cpu_linear`
documents) a linear is one custom call that runs on XLA's own threads. SmolLM2-135M's linears
in a jitted chain, 16 rows: 48-58 ms against XLA's dot at 72-87; one row on a par (22.6 / 21.5).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from linnet.kernels import build

TARGET = "linnet_linear"
PANEL = 16


class Panels(NamedTuple):
    """A linear weight [n, K] as panels [ceil(n / 16), K, 16], inside an entry's trace."""

    array: Any
    n: int


def pack(w) -> np.ndarray:
    """w [N, K] (a host array, f32 / bf16 / f16) as zero-padded panels [ceil(N / 16), K, 16]."""
    w = np.asarray(w)
    n, k = w.shape
    if n % PANEL:
        w = np.concatenate([w, np.zeros((-n % PANEL, k), w.dtype)])
    return np.ascontiguousarray(w.reshape(-1, PANEL, k).transpose(0, 2, 1))


def linear(x, w: Panels):
    """x [..., K] @ w.T in f32 arithmetic, rounded to x's type."""
    import jax
    import jax.numpy as jnp

    lead, k = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, k).astype(jnp.float32)
    y = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((rows.shape[0], w.n), jnp.float32))(rows, w.array)
    return y.reshape(lead + (w.n,)).astype(x.dtype)


def available(dtype, platform: str) -> bool:
    """Whether weights of `dtype` on a device of `platform` can be held as panels here."""
    import jax.numpy as jnp

    return platform == "cpu" and np.dtype(dtype) in (np.dtype(jnp.float32), np.dtype(jnp.bfloat16),
                                                     np.dtype(jnp.float16)) and registered()


@functools.cache
def registered() -> bool:
    """Builds the handler and registers it with XLA, once: False where it cannot run."""
    if not build.runs_here():
        return False
    import jax

    ffi = getattr(jax, "ffi", None)
    if ffi is None or not hasattr(ffi, "include_dir"):
        return False  # a JAX older than its FFI module
    lib = build.shared_library("xla_linear", ["cpu_linear.c", "xla_linear.c"], ("-I", ffi.include_dir()))
    if lib is None or not lib.linnet_cpu_supported():
        return False
    ffi.register_ffi_target(TARGET, ffi.pycapsule(lib.linnet_xla_linear), platform="cpu")
    return True
