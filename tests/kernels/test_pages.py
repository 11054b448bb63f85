"""`pages.back_with_huge_pages` against what Linux reports of this process's memory
(/proc/self/smaps): the whole 2 MB pages of a range move onto huge pages, and no byte changes."""

import os
import threading

import numpy as np
import pytest

from linnet.kernels.pages import (HUGE_PAGE, XLA_ALIGNMENT, aligned_empty, back_with_huge_pages,
                                  back_with_huge_pages_later, give_back, huge_pages_settled)


def smaps_bytes(start: int, stop: int, field: str = "AnonHugePages") -> int:
    """`field` (AnonHugePages, Rss) summed over the mappings that overlap [start, stop), from
    /proc/self/smaps. (Linux may split the array's mapping in more than one, around the advised
    range or later.)"""
    inside, total = False, 0
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo < stop and start < hi
            elif inside and head == field + ":":
                total += int(line.split()[1]) * 1024
    return total


def test_a_written_array_moves_onto_huge_pages_unchanged():
    data = np.random.default_rng(0).integers(0, 255, size=9 * HUGE_PAGE, dtype=np.uint8)
    before = data.copy()
    moved = back_with_huge_pages(data.ctypes.data, data.nbytes)
    assert np.array_equal(data, before)
    assert moved % HUGE_PAGE == 0 and moved <= data.nbytes
    if not moved:
        pytest.skip("this system gives no huge pages on request (no Linux 6.1 MADV_COLLAPSE, THP off, or none free)")
    assert moved >= 8 * HUGE_PAGE  # every whole 2 MB page inside the array
    first = -(-data.ctypes.data // HUGE_PAGE) * HUGE_PAGE  # the advice splits the mapping there
    assert smaps_bytes(first, first + moved) >= moved


def test_a_range_handed_over_for_later_moves_while_this_thread_writes_beside_it():
    """The background thread moves the ranges onto huge pages as back_with_huge_pages would, while
    this thread goes on writing the bytes beside them; no byte of either changes."""
    data = np.random.default_rng(1).integers(0, 255, size=10 * HUGE_PAGE, dtype=np.uint8)
    before = data.copy()
    offset = -data.ctypes.data % HUGE_PAGE
    first = data.ctypes.data + offset
    back_with_huge_pages_later(data, first, 4 * HUGE_PAGE)
    back_with_huge_pages_later(data, first + 4 * HUGE_PAGE, 4 * HUGE_PAGE)
    beside = data[offset + 8 * HUGE_PAGE:]
    for i in range(0, beside.size, 4096):
        beside[i] = before[offset + 8 * HUGE_PAGE + i] = i % 251
    huge_pages_settled()
    assert np.array_equal(data, before)
    worker = next(t for t in threading.enumerate() if t.name == "linnet-huge-pages")
    assert os.getpriority(os.PRIO_PROCESS, worker.native_id) == 19  # the first tokens' work comes first
    moved = smaps_bytes(first, first + 8 * HUGE_PAGE)
    if not moved:
        pytest.skip("this system gives no huge pages on request (no Linux 6.1 MADV_COLLAPSE, THP off, or none free)")
    # Moving is the kernel's best effort, a call at a time: a page it finds no free 2 MB for stays small
    # (CI's machine once moved 7 of the 8), so what is asked is that the thread moved whole pages of the range
    assert moved % HUGE_PAGE == 0 and moved >= HUGE_PAGE


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_moves_its_own_ranges():
    """The background thread is not forked with the process: a child's ranges go to a thread of its own
    (the parent's queue, inherited without its thread, would never be emptied)."""
    data = np.ones(4 * HUGE_PAGE, np.uint8)
    back_with_huge_pages_later(data, data.ctypes.data, data.nbytes)
    huge_pages_settled()
    pid = os.fork()
    if pid == 0:  # the child: exits 0 only if its own ranges settle
        try:
            child = np.ones(4 * HUGE_PAGE, np.uint8)
            back_with_huge_pages_later(child, child.ctypes.data, child.nbytes)
            huge_pages_settled()
            os._exit(0 if child.all() else 1)
        finally:
            os._exit(2)
    assert os.waitpid(pid, 0)[1] == 0


def test_a_range_without_a_whole_huge_page_is_left_alone():
    data = np.ones(HUGE_PAGE, dtype=np.uint8)
    start = data.ctypes.data
    assert back_with_huge_pages(start, HUGE_PAGE - (start % HUGE_PAGE or 1)) == 0
    assert back_with_huge_pages(start, 0) == 0
    assert np.all(data == 1)


@pytest.mark.parametrize("shape, dtype", [((3, 5), np.float32), ((1000, 1000), np.float32), ((0, 4), np.float16),
                                          ((2, 4096, 576), np.uint16)])
def test_aligned_arrays_start_on_the_boundary_their_size_asks(shape, dtype):
    a = aligned_empty(shape, dtype)
    assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
    align = HUGE_PAGE if a.nbytes >= HUGE_PAGE else XLA_ALIGNMENT
    assert a.ctypes.data % align == 0 or a.size == 0  # (numpy points an empty array anywhere)
    a[...] = 3  # all of it is the array's own memory
    assert np.all(a == 3)


def test_an_aligned_array_is_jax_s_device_array_itself():
    jax = pytest.importorskip("jax")
    a = aligned_empty((4, HUGE_PAGE // 16), np.float32)
    a[...] = 1
    placed = jax.device_put(a, jax.devices("cpu")[0])
    assert placed.unsafe_buffer_pointer() == a.ctypes.data  # no copy


def test_given_back_pages_leave_the_process_and_the_bytes_around_them_stay():
    data = np.full(64 << 20, 5, dtype=np.uint8)
    start, stop = data.ctypes.data, data.ctypes.data + data.nbytes
    before = smaps_bytes(start, stop, "Rss")
    inner = data[1000:data.nbytes - 1000]
    given = give_back(inner.ctypes.data, inner.nbytes)
    assert given >= inner.nbytes - 2 * 4096 and given <= inner.nbytes
    assert smaps_bytes(start, stop, "Rss") <= before - given + HUGE_PAGE
    assert np.all(data[:1000] == 5) and np.all(data[-1000:] == 5)  # the first and last pages' other bytes
    assert give_back(data.ctypes.data + 1, 100) == 0  # no whole page inside
