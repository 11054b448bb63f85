"""How many threads Linnet's CPU kernels share their work on (`pool.c`), and torch's own ops kept
to one thread while a model's steps run, so that the two do not take turns on the cores.

torch's ops run on OpenMP's threads, whose workers spin for milliseconds after each parallel op,
waiting for the next. A kernel's helper then waits for a core they hold: a 16-row SmolLM2 linear
took 56 us just after a softmax over the logits (the engine's draw between steps) against 20 us
otherwise. With torch's ops on the stepping thread alone, no worker spins, and the kernels take
every thread torch had (28-31 us after the softmax; the ops torch keeps in a step, residual adds
and the draw, are small).
"""

from __future__ import annotations

import contextlib
import threading

import torch

_lock = threading.Lock()
_held = {"depth": 0, "threads": None}  # while a model's steps run: the kernels' thread count


def threads() -> int:
    """The kernels' thread count: torch's, or what it was before `kernels_take_the_cores`."""
    return _held["threads"] or torch.get_num_threads()


@contextlib.contextmanager
def kernels_take_the_cores():
    """Around a model's steps on this thread: torch's own ops on one thread, Linnet's kernels on
    the threads torch had. Nested or on several threads at once, the first sets and the last
    restores."""
    with _lock:
        if _held["depth"] == 0:
            _held["threads"] = torch.get_num_threads()
        _held["depth"] += 1
    try:
        with one_torch_thread():
            yield
    finally:
        with _lock:
            _held["depth"] -= 1
            if _held["depth"] == 0:
                _held["threads"] = None


@contextlib.contextmanager
def one_torch_thread():
    """torch's ops on one thread while the block runs, then as many as before."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
