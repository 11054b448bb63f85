"""The GPU scripts' first check: where they would run on CUDA and torch (or JAX, for a script run with it)
sees no GPU, one line and exit 2 (as gpu_check.sh), not a traceback, nor a GPU-sized load run on the CPU
for as long as it takes."""

from __future__ import annotations

import sys

import torch


def require_cuda(script: str, device: str = "cuda", cpu_flag: str | None = "--device cpu") -> None:
    """Exit 2 with one line on stderr where `device` is CUDA's and torch has no CUDA device; `cpu_flag`,
    where the script has one, is named as the way to try the script itself on the CPU."""
    if not device.startswith("cuda") or torch.cuda.is_available():
        return
    why = "this torch has no CUDA" if torch.version.cuda is None else "torch sees no CUDA device"
    _stop(script, f"no CUDA GPU here (torch {torch.__version__}: {why})", cpu_flag)


def require_jax_gpu(script: str, device: str = "cuda", cpu_flag: str | None = "--device cpu") -> None:
    """`require_cuda` for a script run with JAX: exit 2 with one line where `device` is CUDA's and JAX
    has no GPU device (a CPU-only jaxlib, or no GPU that it sees), whatever torch has."""
    if not device.startswith("cuda"):
        return
    import jax

    try:
        jax.devices("gpu")
        return
    except RuntimeError:  # (no GPU platform: JAX's own words say only that)
        pass
    _stop(script, f"no JAX GPU here (jax {jax.__version__}: its backend is {jax.default_backend()})", cpu_flag)


def _stop(script: str, why: str, cpu_flag: str | None) -> None:
    hint = f"; {cpu_flag} runs the script itself on the CPU" if cpu_flag else ""
    print(f"{script}: {why}{hint}", file=sys.stderr)
    sys.exit(2)
