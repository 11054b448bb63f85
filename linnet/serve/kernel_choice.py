"""Which of Linnet's Triton kernels a torch model on a GPU takes, chosen by measuring them there.

The runtime's own kernels (flash attention or SDPA, torch's ops) and Linnet's Triton ones
(`kernels.triton_attention`, `kernels.triton_ops`) are each faster on some GPUs and shapes; which
is not known until both run. So where LINNET_TRITON_DECODE and LINNET_TRITON_OPS are left unset
("auto"), the torch runner times each choice where it captures a CUDA decode step: the step
captured with each, replayed over a cache of noise at positions spread over MaxSeq, and a packed
pass run eagerly with and without the small ops. The fastest is kept, among the choices whose
logits agree with the runtime's own kernels' (a kernel that computes wrongly on this GPU loses,
whatever its speed). "1" or "0" fixes a kernel either way.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

TOLERANCE = 0.05  # the largest relative error of a choice's logits against the runtime's own


class Trial(NamedTuple):
    kernels: object  # runtime.TritonKernels
    ms: float | None = None  # the median time of a step or pass with them
    error: float | None = None  # ||logits - the runtime's logits|| / ||the runtime's logits||
    failure: str | None = None  # why they could not be timed (a capture that failed)

    @property
    def agrees(self) -> bool:
        return self.failure is None and self.error is not None and self.error <= TOLERANCE


def choices(asked, here) -> list:
    """The kernel choices to time: `asked` a runtime.TritonKernels of True, False or None ("auto")
    per kernel; here(module) whether a kernel's module of Triton kernels can run. The runtime's own
    choice first (the others' reference), where it is among them."""
    kinds = type(asked)
    axes = [[value] if value is not None else ([False, True] if here(module) else [False])
            for module, value in zip(kinds.MODULES, asked)]
    return [kinds(*values) for values in itertools.product(*axes)]


def relative_error(got, want) -> float:
    """||got - want|| / ||want|| of two logit tensors, in f32; inf where got is not finite."""
    got, want = got.float(), want.float()
    if not bool(got.isfinite().all()):
        return float("inf")
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def fastest(trials: list) -> Trial:
    """The fastest trial whose logits agree with the reference's; the reference (the first trial)
    where none does, or where it is the fastest."""
    agreeing = [t for t in trials if t.agrees]
    return min(agreeing, key=lambda t: t.ms) if agreeing else trials[0]


def describe(trials: list, chosen: Trial) -> str:
    """One line: each choice's time (and why one was left out), the one kept marked."""
    parts = []
    for t in trials:
        if t.failure is not None:
            parts.append(f"{t.kernels.describe()}: failed ({t.failure})")
            continue
        mark = " (kept)" if t is chosen else "" if t.agrees else f" (left out: logits {t.error:.2g} apart)"
        parts.append(f"{t.kernels.describe()} {t.ms:.2f} ms{mark}")
    return "; ".join(parts)
