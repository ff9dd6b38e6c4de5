"""The decode threads of a read: which error a read that fails on several tiles raises."""

from __future__ import annotations

import threading

import pytest

from wsitool.errors import TileDecodeError
from wsitool.read.threads import run_jobs


def _tile(col, row):
    return TileDecodeError("s.tif", 0, col, row, "bad")


def test_the_first_failing_tile_in_row_major_order_is_raised_whichever_thread_meets_it_first():
    """Both jobs fail; job 0's thread is held until job 1's has failed, so the error met first
    in time is tile (1, 0)'s: the read still raises tile (0, 0)'s, as one thread would."""
    other_failed = threading.Event()
    both_taken = threading.Barrier(2, timeout=10)  # (bounded: a broken barrier fails the test)
    failed = []

    def work(shared):
        for col, row in shared:
            both_taken.wait()
            if (col, row) == (0, 0):
                assert other_failed.wait(10)
            failed.append((col, row))
            if (col, row) != (0, 0):
                other_failed.set()
            raise _tile(col, row)

    with pytest.raises(TileDecodeError) as info:
        run_jobs([(0, 0), (1, 0)], 2, work)
    assert failed == [(1, 0), (0, 0)]  # tile (1, 0) failed first in time
    assert (info.value.col, info.value.row) == (0, 0)


def test_an_error_that_is_not_a_tiles_wins():
    both_taken = threading.Barrier(2, timeout=10)

    def work(shared):
        for col, row in shared:
            both_taken.wait()
            if (col, row) == (1, 0):
                raise MemoryError("no room")
            raise _tile(col, row)

    with pytest.raises(MemoryError):
        run_jobs([(0, 0), (1, 0)], 2, work)
