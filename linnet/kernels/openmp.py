"""The process's OpenMP runtime: torch's CPU ops' threads (Linnet's C kernels have their own, pool.c, but
for packing weights at load).

GNU OpenMP keeps a pool of worker threads for each thread that opens a parallel region. The thread
that loads a model (packing its weights, warming it up) keeps its pool after it hands the steps to
the engine's own thread, which then gets a second pool. With more pool threads than cores, libgomp
stops its workers spinning between parallel regions, and each of a step's hundreds of regions waits
for them to wake: SmolLM2 in bf16 on two cores ran at about 150 tokens/s on the engine's thread
against 240 on the thread that loaded it. `release_pool` frees the calling thread's pool (OpenMP 5's
`omp_pause_resource_all`), and a later region on that thread builds a new one.
"""

from __future__ import annotations

import ctypes
import functools
import os

OMP_PAUSE_SOFT = 1
_RUNTIMES = ("libgomp", "libiomp5", "libomp")


@functools.cache
def _runtime() -> ctypes.CDLL | None:
    """The OpenMP library this process has loaded (torch's own copy, which the kernels link to by
    its soname), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:  # not Linux
        return None
    for path in sorted(paths):
        if os.path.basename(path).startswith(_RUNTIMES):
            try:
                return ctypes.CDLL(path)  # already loaded: the same instance
            except OSError:
                continue
    return None


def release_pool() -> bool:
    """Frees the calling thread's OpenMP worker threads; False where there is no runtime that can
    (none loaded, or one older than OpenMP 5)."""
    lib = _runtime()
    pause = getattr(lib, "omp_pause_resource_all", None) if lib is not None else None
    if pause is None:
        return False
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    return pause(OMP_PAUSE_SOFT) == 0
