"""The GPU scripts' first check: where they would run on CUDA and torch sees none, one line and exit 2
(as gpu_check.sh), not a traceback, nor a GPU-sized load run on the CPU for as long as it takes."""

from __future__ import annotations

import sys

import torch


def require_cuda(script: str, device: str = "cuda", cpu_flag: str | None = "--device cpu") -> None:
    """Exit 2 with one line on stderr where `device` is CUDA's and torch has no CUDA device; `cpu_flag`,
    where the script has one, is named as the way to try the script itself on the CPU."""
    if not device.startswith("cuda") or torch.cuda.is_available():
        return
    why = "this torch has no CUDA" if torch.version.cuda is None else "torch sees no CUDA device"
    hint = f"; {cpu_flag} runs the script itself on the CPU" if cpu_flag else ""
    print(f"{script}: no CUDA GPU here (torch {torch.__version__}: {why}){hint}", file=sys.stderr)
    sys.exit(2)
