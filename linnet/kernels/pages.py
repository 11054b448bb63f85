"""Weights on huge pages: what a CPU decode step streams through, read with fewer TLB misses.

A one-row decode step reads every linear weight once, from memory. On 4 KB pages
the hardware prefetchers stop at each page's end and every page costs a TLB
miss: a 2-core Zen 4 read 268 MB in 9-10 ms so (a C read loop: 29-34 GB/s),
against 5.2-5.8 ms (47-54 GB/s) on 2 MB pages; SmolLM2's 121 one-row linears in
a jitted chain took 7.2 ms against 8.7, in the same process.

`back_with_huge_pages` asks Linux for them over memory that is already written
(`madvise` MADV_HUGEPAGE, then MADV_COLLAPSE, Linux 6.1 on, which moves the
pages over at once, the same addresses, the same contents, whatever the system's
transparent-huge-page setting). Where Linux cannot (an older kernel, no free
2 MB pages, another system) the memory stays as it is.

Moving a loaded model's weights over costs about 3 ms a 2 MB page here (SmolLM2's bf16 weights:
0.7-2.5 s, most of a start on a busy 2-core machine), so loading asks for it later:
`back_with_huge_pages_later` hands a range to one background thread, and the first tokens run on
small pages until it is done (it starts `LATER_DELAY` after the first range, so that the warm-up and
the first token do not share the machine with it). The kernel keeps the contents whatever reads or
writes them meanwhile (khugepaged moves any process's pages so, at any time); `huge_pages_settled`
waits for the queue.

`aligned_empty` makes host arrays that start on a 2 MB boundary (64 bytes, for
small ones): XLA's CPU client takes such an array as its device array without a
copy (it needs 64 bytes; numpy's large arrays start 16 bytes into a page, and
each was copied), and every one of its pages can go onto a huge page.

`give_back` returns the pages of memory whose contents are no longer wanted (a
weight already copied into its packed form) to the system before the memory is
freed: loading then never holds both forms of a whole weight.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import functools
import math
import mmap
import os
import queue
import sys
import threading

import numpy as np

HUGE_PAGE = 2 << 20
SMALL_PAGE = mmap.PAGESIZE
XLA_ALIGNMENT = 64  # what XLA's CPU client needs to take a host array as it is
_MADV_DONTNEED = 4
_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25


@functools.cache
def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    return libc.madvise


def back_with_huge_pages(address: int, nbytes: int) -> int:
    """Moves the whole 2 MB pages inside [address, address + nbytes) of this process's written,
    private memory onto huge pages; returns the bytes now on them (0 where none could be)."""
    madvise = _madvise()
    start = -(-address // HUGE_PAGE) * HUGE_PAGE
    end = (address + nbytes) // HUGE_PAGE * HUGE_PAGE
    if madvise is None or end <= start:
        return 0
    madvise(start, end - start, _MADV_HUGEPAGE)  # also where a later collapse (khugepaged's) may act
    return end - start if madvise(start, end - start, _MADV_COLLAPSE) == 0 else 0


_later: queue.Queue | None = None
_later_lock = threading.Lock()


def back_with_huge_pages_later(owner, address: int, nbytes: int) -> None:
    """`back_with_huge_pages(address, nbytes)` on a background thread (see the top), after the ranges
    handed over before it; `owner` (the array or tensor whose memory it is) is kept alive until then."""
    global _later
    if _madvise() is None or nbytes < HUGE_PAGE:
        return
    with _later_lock:
        if _later is None:
            _later = queue.Queue()
            worker = threading.Thread(target=_move_later, args=(_later,), name="linnet-huge-pages", daemon=True)
            worker.start()
            atexit.register(_stop_later, _later, worker)
    _later.put((owner, address, nbytes))


LATER_STEP = 4 * HUGE_PAGE  # moved a call at a time: see `_move_later`
# The thread starts moving this long after the first range is handed over: the work a start does next
# (the engine's warm-up, the first token: 0.1-0.5 s here) then runs without it (warm-up 0.11 s alone,
# 0.14-0.76 s beside the move, SmolLM2 on the 2-core machine)
LATER_DELAY = 1.0
_exiting = threading.Event()


def _move_later(ranges: queue.Queue) -> None:
    """Each range a few huge pages a call: a call holds the process's memory map, which the other
    threads' page faults and frees then wait on (a 54 MB range in one call held up the exit of
    `linnet generate` by 0.7 s). Once the interpreter is exiting, the rest is dropped. The thread
    runs at the lowest priority (Linux's nice 19, this thread only): the copying is the kernel's
    work on this thread's time, and the first tokens' should come first."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):  # (no such call, or not allowed: the thread runs as it is)
        pass
    _exiting.wait(LATER_DELAY)  # (`LATER_DELAY`; at once when the interpreter exits meanwhile)
    while True:
        item = ranges.get()
        if item is None:  # `_stop_later`
            ranges.task_done()
            return
        owner, address, nbytes = item
        try:
            start = -(-address // HUGE_PAGE) * HUGE_PAGE
            end = (address + nbytes) // HUGE_PAGE * HUGE_PAGE
            for at in range(start, end, LATER_STEP):
                if _exiting.is_set():
                    break
                back_with_huge_pages(at, min(LATER_STEP, end - at))  # (ctypes lets go of the GIL for the call)
        finally:
            del owner
            ranges.task_done()


def _stop_later(ranges: queue.Queue, worker: threading.Thread) -> None:
    """At exit: the ranges not yet moved are dropped, and the thread ends after its current call
    (a daemon thread stopped inside it, as the interpreter stops them, aborted the process)."""
    _exiting.set()
    ranges.put(None)
    worker.join()


def _forget_later() -> None:
    """In a forked child: the parent's thread is not there; a range handed over starts its own."""
    global _later, _later_lock
    _later, _later_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_later)


def huge_pages_settled() -> None:
    """Returns once every range handed to `back_with_huge_pages_later` has been moved (or could not be)."""
    if _later is not None:
        _later.join()


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array whose memory starts on a 2 MB boundary, or a 64-byte one
    if it is smaller than 2 MB (see the top). Pages it does not fill are never touched: the
    alignment costs addresses, not memory."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    align = HUGE_PAGE if nbytes >= HUGE_PAGE else XLA_ALIGNMENT
    buffer = np.empty(nbytes + align, np.uint8)
    start = -buffer.ctypes.data % align
    return buffer[start:start + nbytes].view(dtype).reshape(shape)


def give_back(address: int, nbytes: int) -> int:
    """Returns the whole pages (4 KB on x86-64) inside [address, address + nbytes) of this
    process's private memory to the system (MADV_DONTNEED): their contents are lost (anonymous
    memory reads as zeros after), the addresses stay valid. For memory the caller owns and will not
    read again; the bytes around it on its first and last pages are kept. Returns the bytes given
    back (0 where none could be)."""
    madvise = _madvise()
    start = -(-address // SMALL_PAGE) * SMALL_PAGE
    end = (address + nbytes) // SMALL_PAGE * SMALL_PAGE
    if madvise is None or end <= start:
        return 0
    return end - start if madvise(start, end - start, _MADV_DONTNEED) == 0 else 0
