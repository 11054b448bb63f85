"""Whether a specialized model fits the memory of the device it is loaded onto.

A cache of Batch rows by MaxSeq positions grows with their product: `--batch 4000
--max-seq 100000` asks for terabytes. Allocated as it stands, that is an allocator's
message at best and, on a CPU whose kernel overcommits, the process killed part way
through. `check_fits` says it before a weight is read, in the user's terms: how
much the cache and the weights need, how much is free, and how many rows would fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from linnet.ir.nodes import Module
from linnet.ir.specialize import concrete_dtype, dim_value, evaluate
from linnet.nest.errors import DeviceError

ITEM_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "i32": 4, "i64": 8, "bool": 1}


class DeviceMemoryError(DeviceError):
    """The model, its cache included, needs more memory than its device has free."""


@dataclass(frozen=True)
class Footprint:
    weights: int  # bytes, tied params counted once
    state: int  # bytes: the KV cache and any other state
    rows: int  # Batch, the state's rows

    @property
    def total(self) -> int:
        return self.weights + self.state


def footprint(spec: Module) -> Footprint:
    """The bytes a specialized module's weights and state take in their element types."""

    def size(t) -> int:
        n = ITEM_BYTES[concrete_dtype(t.dtype, spec)]
        for d in t.shape:
            n *= dim_value(d, spec)
        return n

    weights = sum(size(p.type) for p in spec.params.values() if not (p.tie and evaluate(p.tie[1], spec.bindings)))
    state = sum(size(s.type) for s in spec.state.values())
    return Footprint(weights, state, spec.bindings["Batch"])


def check_fits(spec: Module, card: str, where: str, free: int | None) -> None:
    """A `DeviceMemoryError` when the model needs more than the `free` bytes of `where` (None:
    unknown, nothing checked), naming what needs it and how many rows would fit."""
    need = footprint(spec)
    if free is None or need.total <= free:
        return
    b = spec.bindings
    per_row = need.state / max(1, need.rows)
    rows = int((free - need.weights) // per_row) if per_row and free > need.weights else 0
    # (in the generics' names: a command's flags for them are its own, `linnet serve`'s --batch and --max-seq)
    hint = (f"at most {rows} rows of MaxSeq {b['MaxSeq']} would fit (a smaller Batch)" if rows >= 1 else
            "the weights alone do not fit (a 16-bit T, or a device with more memory)" if free <= need.weights else
            "fewer positions per row would (a smaller MaxSeq)")
    raise DeviceMemoryError(
        f"{card} with Batch={b['Batch']}, MaxSeq={b['MaxSeq']}, T={b['T']} needs {human_bytes(need.total)} "
        f"(cache {human_bytes(need.state)}, weights {human_bytes(need.weights)}), but {where} has {human_bytes(free)} free: "
        f"{hint}")


def free_cpu_bytes() -> int | None:
    """The memory the kernel says a new allocation can have without swapping (MemAvailable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def free_torch_bytes(device: str) -> int | None:
    import torch

    where = torch.device(device)
    if where.type == "cuda":
        return torch.cuda.mem_get_info(where)[0]
    return free_cpu_bytes() if where.type == "cpu" else None


def free_jax_bytes(device) -> int | None:
    """What JAX's allocator has left on `device` (a GPU's pool), else the host's for the CPU."""
    if device.platform == "cpu":
        return free_cpu_bytes()
    try:
        stats = device.memory_stats() or {}
    except Exception:  # a runtime that keeps no statistics
        return None
    if "bytes_limit" not in stats:
        return None
    return stats["bytes_limit"] - stats.get("bytes_in_use", 0)


def human_bytes(n: float) -> str:
    """1.2 GB: decimal units, as `linnet cards` and the errors print sizes."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if n >= 100 or unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)
