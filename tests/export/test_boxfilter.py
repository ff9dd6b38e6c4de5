"""The export pyramid's 2:1 box sums and means: the compiled kernel (``wsitool._boxfilter``)
pinned to its numpy reference, and the pyramid they build pinned to a float64 box filter."""

from __future__ import annotations

import numpy as np
import pytest

from wsitool.export import downsample
from wsitool.export.downsample import PyramidBuilder, halve_rows, halve_rows_numpy, means, means_numpy
from wsitool.export.plan import sum_dtype

native = pytest.mark.skipif(downsample._boxfilter is None,
                            reason="wsitool._boxfilter was not built (no C compiler at install)")

PAIRS = [(np.uint8, np.uint16), (np.uint16, np.uint16), (np.uint16, np.uint32),
         (np.uint32, np.uint32), (np.uint32, np.uint64), (np.uint64, np.uint64)]


def _no_numpy(*_args):
    raise AssertionError("the numpy reference ran where the compiled kernel should have")


def _compiled(fn, *args):
    """Run ``fn`` with the compiled kernel on, and the numpy references made to fail, so that
    a dispatch that fell back to numpy cannot pass for the kernel."""
    saved = downsample.USE_NATIVE, downsample.halve_rows_numpy, downsample.means_numpy
    downsample.USE_NATIVE = True
    downsample.halve_rows_numpy = downsample.means_numpy = _no_numpy
    try:
        fn(*args)
    finally:
        downsample.USE_NATIVE, downsample.halve_rows_numpy, downsample.means_numpy = saved


@native
@pytest.mark.parametrize("src_t,dst_t", PAIRS)
@pytest.mark.parametrize("rows,width", [(1, 1), (1, 2), (2, 1), (2, 2), (3, 5), (4, 7), (5, 4),
                                        (7, 9), (16, 33), (31, 64)])
def test_halve_compiled_equals_numpy(src_t, dst_t, rows, width):
    rng = np.random.default_rng(rows * 100 + width)
    top = np.iinfo(src_t).max // 4 if src_t != np.uint8 else 255  # sums that the pyramid can hold
    a = rng.integers(0, top, (rows, width, 3), dtype=np.uint64, endpoint=True).astype(src_t)
    a[0, 0] = top  # the largest value in the corner
    shape = ((rows + 1) // 2, (width + 1) // 2, 3)
    ref = np.full(shape, 7, dst_t)
    got = np.full(shape, 9, dst_t)
    halve_rows_numpy(a, ref)
    _compiled(halve_rows, a, got)
    assert np.array_equal(got, ref)
    # the reference itself: each output sums the 2 x 2 block it covers, clipped
    wide = a.astype(np.uint64)
    y, x = shape[0] - 1, shape[1] - 1
    assert got[y, x].astype(np.uint64).tolist() == wide[2 * y:2 * y + 2, 2 * x:2 * x + 2].sum(axis=(0, 1)).tolist()


@native
@pytest.mark.parametrize("k", [1, 2, 4, 5, 8, 12])
@pytest.mark.parametrize("last_row", [False, True])
def test_means_compiled_equals_numpy(k, last_row):
    rng = np.random.default_rng(k)
    t = sum_dtype(k)
    full = 1 << k
    for cov_x, cov_y in [(full, full), (1, full), (full, 1), (max(1, full - 1), max(1, full // 2 + 1))]:
        rows, width = 6, 11
        nx = np.full(width, full)
        nx[-1] = cov_x
        ny = np.full(rows, full)
        if last_row:
            ny[-1] = cov_y
        n = (ny[:, None] * nx[None, :])[..., None]
        S = (rng.integers(0, 256, (rows, width, 3)) * n).astype(t)  # exact multiples ...
        S[1:3] += (n[1:3] // 2).astype(t)  # ... and exact halves, where rounding goes up
        S[0, 0] = 255 * n[0, 0, 0]  # the largest sum
        ref = np.zeros((rows, width, 3), np.uint8)
        got = np.ones((rows, width, 3), np.uint8)
        means_numpy(S, ref, k, cov_x, cov_y, last_row)
        _compiled(means, S, got, k, cov_x, cov_y, last_row)
        assert np.array_equal(got, ref), (k, cov_x, cov_y)
        exact = np.floor(S.astype(np.float64) / n + 0.5)  # half up
        assert np.array_equal(ref, exact.astype(np.uint8))


@native
def test_kernel_refuses_bad_buffers():
    a = np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(ValueError, match="too small"):
        downsample._boxfilter.halve(a, np.zeros((1, 1, 3), np.uint16), 4, 4, 1, 2)
    with pytest.raises(ValueError, match="no 2:1 sum"):
        downsample._boxfilter.halve(a, np.zeros((2, 2, 3), np.uint8), 4, 4, 1, 1)
    with pytest.raises(ValueError, match="contiguous"):
        downsample._boxfilter.halve(np.zeros((4, 8, 3), np.uint8)[:, ::2], np.zeros((2, 2, 3), np.uint16),
                                    4, 4, 1, 2)
    for rows, width in [(2**30, 2**30), (2**62, 1), (-1, 4)]:  # byte counts must not overflow
        with pytest.raises(ValueError):
            downsample._boxfilter.halve(a, np.zeros((2, 2, 3), np.uint16), rows, width, 1, 2)
    with pytest.raises(ValueError, match="coverage"):
        downsample._boxfilter.means(np.zeros((2, 2, 3), np.uint16), np.zeros((2, 2, 3), np.uint8),
                                    2, 2, 2, 1, 3, 1, False)


def _box(img: np.ndarray, k: int) -> np.ndarray:
    """float64 mean of each 2**k x 2**k block, blocks clipped to the image."""
    f = 1 << k
    h, w = img.shape[:2]
    out = np.empty((-(-h // f), -(-w // f), 3))
    for y in range(out.shape[0]):
        for x in range(out.shape[1]):
            out[y, x] = img[y * f:(y + 1) * f, x * f:(x + 1) * f].reshape(-1, 3).mean(axis=0)
    return out


def _pyramid(img: np.ndarray, T: int, strip: int, overlap: int = 0, pad: bool = True):
    h, w = img.shape[:2]
    dims = [(w, h)]
    while dims[-1] != (1, 1):
        dims.append((-(-dims[-1][0] // 2), -(-dims[-1][1] // 2)))
    pyr = PyramidBuilder(dims, T, overlap, pad, strip)
    tiles = {}
    lv0 = pyr.levels[0]
    y = 0
    while y < h:
        rows = min(strip, h - y)
        lv0.tail(rows)[...] = img[y:y + rows]
        lv0.n += rows
        y += rows
        for k, c, r, tile in pyr.advance():
            assert (k, c, r) not in tiles
            tiles[(k, c, r)] = tile
    return dims, tiles


@pytest.mark.parametrize("h,w,T,strip", [(37, 53, 16, 6), (64, 64, 16, 16), (45, 29, 8, 5),
                                         (100, 3, 32, 17), (1, 70, 16, 1)])
def test_pyramid_is_the_box_filter_on_both_kernels(h, w, T, strip):
    rng = np.random.default_rng(h * w)
    img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    img[: h // 2, : w // 3] = 255  # a flat block: sums at their largest
    old = downsample.USE_NATIVE
    try:
        downsample.USE_NATIVE = False
        dims, ref = _pyramid(img, T, strip)
        if downsample._boxfilter is not None:
            got = {}
            _compiled(lambda: got.update(_pyramid(img, T, strip)[1]))
            assert got.keys() == ref.keys()
            for key in ref:
                assert np.array_equal(got[key], ref[key]), key
    finally:
        downsample.USE_NATIVE = old
    for k, (lw, lh) in enumerate(dims):
        across, down = -(-lw // T), -(-lh // T)
        assert sum(1 for key in ref if key[0] == k) == across * down
        level = np.zeros((down * T, across * T, 3), np.uint8)
        for (kk, c, r), tile in ref.items():
            if kk == k:
                assert tile.shape == (T, T, 3)
                level[r * T:(r + 1) * T, c * T:(c + 1) * T] = tile
        diff = np.abs(level[:lh, :lw].astype(np.float64) - _box(img, k))
        assert diff.max() <= 0.5, (k, diff.max())
