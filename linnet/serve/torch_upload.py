"""Host arrays onto a torch device without waiting on the device."""

from __future__ import annotations

import numpy as np
import torch


def upload(a, device: torch.device) -> torch.Tensor:
    """`a` (a numpy array, a list, a scalar) as a tensor on `device`.

    To a GPU through pinned memory, asynchronously: torch's copy from pageable memory waits for
    everything already queued on the stream, so an upload for the decode step sent ahead (the
    engine's look-ahead) would wait for the step before it to end, and the GPU would then idle
    through the host's work between the two. The pinned block is torch's cached one, kept from
    reuse until the copy has run. Elsewhere the array itself, as a tensor (shared, not copied).
    """
    if isinstance(a, np.ndarray) and a.ndim and not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    t = torch.as_tensor(a)  # (a scalar stays one, a Python float f32, as torch.as_tensor has them)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
