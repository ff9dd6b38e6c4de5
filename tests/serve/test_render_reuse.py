"""read_scaled(reuse=True), the render threads' own buffer: the same pixels as a new array, the
same memory for each exact read of a thread, a new array where it does not apply."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import wsitool
from wsitool.serve.render import REUSE_BYTES, plan_read, read_scaled

from helpers import REPO

SAMPLES = sorted((REPO / "samples").glob("sample-*"))

#: (level-0 region, output size): exact reads at ratio 1 and 2, an unaligned one, a reduced one
REQUESTS = [((0, 0, 512, 512), (512, 512)), ((256, 128, 1024, 512), (512, 256)),
            ((37, 11, 300, 200), (300, 200)), ((0, 0, 1000, 700), (333, 233))]


def _plan(slide, region, out):
    return plan_read(slide.level_dimensions, slide.level_downsamples, region, out)


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_reuse_gives_the_pixels_of_a_new_array(path):
    slide = wsitool.open_slide(path)
    for region, out in REQUESTS:
        plan = _plan(slide, region, out)
        a = read_scaled(slide, plan)
        b = read_scaled(slide, plan, reuse=True)
        assert b.shape == a.shape == (out[1], out[0], 3) and b.dtype == np.uint8
        assert np.array_equal(a, b), (region, out)


def test_exact_reads_of_a_thread_share_its_buffer_and_others_do_not():
    slide = wsitool.open_slide(SAMPLES[0])
    exact = _plan(slide, (0, 0, 512, 512), (512, 512))
    other = _plan(slide, (256, 256, 256, 128), (256, 128))
    reduced = _plan(slide, (0, 0, 1000, 700), (333, 233))
    assert exact.exact and other.exact and not reduced.exact
    first = read_scaled(slide, exact, reuse=True)
    kept = first.copy()
    second = read_scaled(slide, other, reuse=True)
    assert np.shares_memory(first, second)  # the next reuse read overwrites the first
    assert not np.array_equal(first, kept)
    assert not np.shares_memory(read_scaled(slide, exact), second)  # reuse=False: a new array
    assert not np.shares_memory(read_scaled(slide, reduced, reuse=True), second)
    theirs = []
    t = threading.Thread(target=lambda: theirs.append(read_scaled(slide, exact, reuse=True)))
    t.start()
    t.join()
    assert np.array_equal(theirs[0], kept) and not np.shares_memory(theirs[0], second)


def test_reads_larger_than_the_buffer_get_a_new_array():
    side = int((REUSE_BYTES // 3) ** 0.5) + 1
    dims, ds = [(4 * side, 4 * side)], [1.0]
    plan = plan_read(dims, ds, (0, 0, side, side), (side, side))
    assert plan.exact and side * side * 3 > REUSE_BYTES

    class Big:  # a slide stand-in: read_region fills what it is given, or a new array
        def __init__(self):
            self.levels = [type("L", (), {"downsample": 1.0})()]

        def read_region(self, location, level, size, *, mode, threads, out=None):
            self.out = out
            return np.zeros((size[1], size[0], 3), np.uint8) if out is None else out

    big = Big()
    assert read_scaled(big, plan, reuse=True).shape == (side, side, 3)
    assert big.out is None
