"""Building Linnet's C kernels: once per source, flags and compiler, into a user cache; and the one
check of whether this CPU should run them.

The libraries go to the user cache (`linnet.user_cache`: `~/.cache/linnet/kernels`), named by a
hash of what went into them, and are written atomically: processes racing to build each load a
whole file; one found cut short or damaged (a copy of the cache that stopped partway) is built
again. A failed build warns once and leaves the caller on its library's kernels.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from linnet import user_cache

HERE = Path(__file__).parent
TYPE_CODES = {"f32": 0, "bf16": 1, "f16": 2}  # kernels.h's type codes (torch_types.TYPES: by torch's types)
FLAGS = ["-O3", "-fPIC", "-shared", "-fopenmp"]
LIBS = ["-lm"]  # after the sources, where a linker that drops unused libraries still keeps it


@functools.cache
def cores() -> int:
    """The cores this process may run on (its affinity mask, where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@functools.cache
def runs_here() -> bool:
    """An x86-64 Linux CPU with AVX2, FMA and F16C, and LINNET_CPU_KERNELS not set to 0.

    AVX-512 CPUs run them too: their wider vectors make oneDNN's many-row products no faster than
    ours, while its few-row products and SDPA's one-query attention stay slow (a 2-core Zen 4
    with AVX-512 BF16: the benchmark load, torch f32 135 -> 162 tokens/s in one run each). There
    cpu_linear.c multiplies bf16 weights with AVX-512 BF16's own instructions (`linnet_panel_pairs`)."""
    if os.environ.get("LINNET_CPU_KERNELS", "1") == "0":
        return False
    isa_cap()
    if platform.machine().lower() not in ("x86_64", "amd64") or not sys.platform.startswith("linux"):
        return False
    flags = _cpu_flags()
    return {"avx2", "fma", "f16c"} <= flags


ISA_CAPS = ("avx2", "avx512", "avx512_bf16", "amx")  # kernels.h's levels, lowest first ("amx": no cap)


class KernelSettingError(ValueError):
    """An environment variable of the kernels' set to what they do not know (the command line
    prints it as one line)."""


def isa_cap() -> str | None:
    """LINNET_CPU_ISA, the highest instruction set the kernels may take (kernels.h's `linnet_isa`,
    which reads it in any case too; None where unset): the paths of an older CPU, run on this one,
    as the tests run them."""
    cap = (os.environ.get("LINNET_CPU_ISA") or "").lower() or None
    if cap is not None and cap not in ISA_CAPS:
        raise KernelSettingError(f"LINNET_CPU_ISA={os.environ['LINNET_CPU_ISA']!r}: not one of {', '.join(ISA_CAPS)}")
    return cap


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@functools.cache
def cpu_kernels() -> ctypes.CDLL | None:
    """cpu_linear.c, cpu_qlinear.c, cpu_attention.c, cpu_ops.c, cpu_graph.c and pool.c as one library, its
    functions typed for ctypes; None where they do not run (`runs_here`, a build that failed, a CPU that fails the
    library's own check)."""
    if not runs_here():
        return None
    lib = shared_library("cpu_kernels", ["cpu_linear.c", "cpu_qlinear.c", "cpu_attention.c", "cpu_ops.c", "cpu_graph.c",
                                         "pool.c"])
    if lib is None or not lib.linnet_cpu_supported():
        return None
    vp, long, i32 = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    lib.linnet_linear.argtypes = [i32, i32, vp, long, long, long, vp, vp, vp, i32, vp, long, i32]
    lib.linnet_pack_panels.argtypes = [i32, vp, long, long, i32]
    lib.linnet_qlinear.argtypes = lib.linnet_linear.argtypes
    lib.linnet_qgather.argtypes = [i32, long, long, vp, long, vp, long, i32, i32, vp, i32]
    lib.linnet_qpanel_block_bytes.argtypes = [i32]
    lib.linnet_qpanel_block_bytes.restype = long
    lib.linnet_panel_pairs.argtypes = [i32, long]
    lib.linnet_isa.argtypes = []
    lib.linnet_attention.argtypes = [i32, i32, vp, long, long, long, long, vp, vp, long, long, long, long, vp, vp,
                                     long, vp, ctypes.c_float, ctypes.c_float, vp, i32]
    lib.linnet_rmsnorm.argtypes = [i32, vp, long, long, long, i32, vp, ctypes.c_float, i32, vp, i32]
    lib.linnet_layer_norm.argtypes = [i32, vp, long, long, long, i32, vp, vp, ctypes.c_float, vp, i32]
    lib.linnet_rope.argtypes = [i32, vp, long, long, long, long, long, vp, vp, long, vp, i32]
    lib.linnet_put_rows.argtypes = [i32, vp, long, vp, long, long, vp, long, long, long, i32, vp, long, long, i32]
    lib.linnet_elementwise.argtypes = [i32, i32, vp, long, i32, vp, long, i32, vp, long, long, long, i32]
    lib.linnet_gather_rows.argtypes = [i32, vp, long, long, vp, long, i32, vp, i32]
    for f in (lib.linnet_rmsnorm, lib.linnet_layer_norm, lib.linnet_rope, lib.linnet_put_rows, lib.linnet_elementwise,
              lib.linnet_gather_rows):
        f.restype = None
    lib.linnet_replay.argtypes = [long, vp, vp]
    lib.linnet_replay.restype = long
    for f in (lib.linnet_linear, lib.linnet_qlinear, lib.linnet_qgather, lib.linnet_pack_panels, lib.linnet_attention,
              lib.linnet_panel_pairs, lib.linnet_isa):
        f.restype = i32
    return lib


# Built again with these where a build fails: AMX's tile instructions need an assembler that knows
# them (binutils 2.36), which a compiler new enough for their intrinsics may lack; without them the
# bf16 pairs keep VDPBF16PS (cpu_linear.c), rather than every kernel being lost.
WITHOUT_NEWEST = ("-DLINNET_NO_AMX",)


def shared_library(name: str, sources: list[str], extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """`sources` (files in this folder) built into one shared library and loaded; None, with a
    warning, when it cannot be built, even without the newest instructions (`WITHOUT_NEWEST`)."""
    paths = [HERE / s for s in sources]
    try:
        try:
            return _loaded(name, paths, [*FLAGS, *extra_flags])
        except subprocess.CalledProcessError:
            return _loaded(name, paths, [*FLAGS, *extra_flags, *WITHOUT_NEWEST])
    except (OSError, subprocess.CalledProcessError) as e:
        detail = _compiler_says(name, e.stderr) if isinstance(e, subprocess.CalledProcessError) and e.stderr else e
        warnings.warn(f"linnet: the CPU kernel {name} could not be built ({detail}); its work runs on the "
                      f"library's own kernels, slower in decode steps", stacklevel=3)
        return None


def _loaded(name: str, sources: list[Path], flags: list[str]) -> ctypes.CDLL:
    """The library `_built` gives, loaded; one in the cache that will not load (damaged: a copy of the
    cache that stopped partway, a disk that lost its end) is built again, once."""
    target = _built(name, sources, flags)
    try:
        return ctypes.CDLL(str(target))
    except OSError:
        target.unlink(missing_ok=True)
        return ctypes.CDLL(str(_built(name, sources, flags)))


def _whole_library(path: Path) -> bool:
    """Whether a cached library holds every byte its ELF headers place: loading one cut short maps
    pages past its end, and the process dies of SIGBUS (no error to catch) as the loader reads them.
    A file in another format is left to the loader to judge."""
    import struct

    try:
        with open(path, "rb") as f:
            head = f.read(64)
            size = os.fstat(f.fileno()).st_size
            if head[:4] != b"\x7fELF" or head[4] != 2:  # (Linnet builds 64-bit ELF libraries on Linux)
                return head[:4] != b"\x7fELF"
            order = "<" if head[5] == 1 else ">"
            phoff, shoff = struct.unpack_from(order + "QQ", head, 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", head, 0x36)
            if shoff + shentsize * shnum > size or phoff + phentsize * phnum > size:
                return False
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except (OSError, IndexError, struct.error):
        return False
    for i in range(phnum):  # each segment's bytes in the file (p_offset, p_filesz)
        offset, filesz = struct.unpack_from(order + "Q16xQ", table, i * phentsize + 8)
        if offset + filesz > size:
            return False
    return True


def _compiler_says(name: str, stderr: str) -> str:
    """A failed build's first error, and where the compiler's whole output was saved (the last line
    alone is often a caret under source the warning does not show)."""
    lines = stderr.strip().splitlines()
    said = lambda *marks: next((line.strip() for line in lines if any(m in line for m in marks)), None)
    first = said(": error:", ": fatal error:", "undefined reference") or said("error", "Error") or lines[-1].strip()
    try:
        log = user_cache.directory("kernels") / f"{name}-build.log"
        log.write_text(stderr)
    except OSError:
        return first
    return f"{first}; the compiler's output: {log}"


def _built(name: str, sources: list[Path], flags: list[str]) -> Path:
    """The shared library for these sources, flags and compiler, from the cache or compiled into it."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        raise FileNotFoundError("no C compiler (cc, gcc or clang) on PATH; set CC")
    digest = hashlib.sha256(compiler.encode() + " ".join(flags + LIBS).encode())
    for source in sorted(set(sources) | set(HERE.glob("*.h"))):
        digest.update(source.read_bytes())
    target = user_cache.directory("kernels") / f"{name}-{digest.hexdigest()[:16]}.so"
    if target.exists():
        if _whole_library(target):
            return target
        target.unlink(missing_ok=True)  # cut short: built again (loading it would kill the process)
    with user_cache.replacing(target) as tmp, tempfile.TemporaryDirectory(dir=target.parent,
                                                                          prefix=f".{name}-objects-") as objects:
        try:
            linked = _compiled_apart(compiler, sources, flags, Path(objects))
            _run(compiler, *flags, *linked, *LIBS, "-o", tmp)
        except OSError as e:  # not there, not a program
            whence = " (the CC environment variable)" if os.environ.get("CC") else ""
            raise OSError(f"the C compiler {compiler}{whence} does not run: {e.strerror or e}") from None
    return target


def _compiled_apart(compiler: str, sources: list[Path], flags: list[str], folder: Path) -> list[str]:
    """Each source compiled to an object in `folder`, as many at once as there are cores, largest first: one
    gcc over all of them compiles them one after another (cpu_kernels: 11.9-13.2 s, 6.2-7.1 on 2 cores;
    with more, down to its longest file's, cpu_linear.c's, about 5 s). The first failure raises, as the
    single compile's did."""
    compile_flags = [f for f in flags if f != "-shared"] + ["-c"]
    objects = [str(folder / f"{i}-{source.stem}.o") for i, source in enumerate(sources)]
    order = sorted(range(len(sources)), key=lambda i: -sources[i].stat().st_size)
    with ThreadPoolExecutor(max_workers=max(1, min(cores(), len(sources)))) as pool:
        for done in [pool.submit(_run, compiler, *compile_flags, str(sources[i]), "-o", objects[i]) for i in order]:
            done.result()
    return objects


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True)
