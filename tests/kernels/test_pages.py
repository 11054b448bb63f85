"""`pages.back_with_huge_pages` against what Linux reports of this process's memory
(/proc/self/smaps): the whole 2 MB pages of a range move onto huge pages, and no byte changes."""

import numpy as np
import pytest

from linnet.kernels.pages import HUGE_PAGE, back_with_huge_pages


def huge_bytes_of_mappings(start: int, stop: int) -> int:
    """AnonHugePages of the mappings that overlap [start, stop), from /proc/self/smaps. (Linux may
    split the array's mapping in more than one, around the advised range or later.)"""
    inside, total = False, 0
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo < stop and start < hi
            elif inside and head == "AnonHugePages:":
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
    assert huge_bytes_of_mappings(first, first + moved) >= moved


def test_a_range_without_a_whole_huge_page_is_left_alone():
    data = np.ones(HUGE_PAGE, dtype=np.uint8)
    start = data.ctypes.data
    assert back_with_huge_pages(start, HUGE_PAGE - (start % HUGE_PAGE or 1)) == 0
    assert back_with_huge_pages(start, 0) == 0
    assert np.all(data == 1)
