"""The downsampler: a box-filtered pyramid built row by row from level-0 strips, in bounded memory (floor 6).

Each lower level halves the one above with an area (box) average: every output
pixel of level ``k`` is the mean of the ``2**k x 2**k`` block of level-0 pixels it
covers, clipped to the image, computed incrementally from pairs of rows (see
:class:`PyramidBuilder`).  Lower levels hold integer sums of the level-0 pixels
(uint16 to level 4, then uint32) only until they are halved: as rows of sums
arrive at a level they are halved into the next level's sums and turned into
the level's uint8 pixels, the exact mean rounded half up, which is all the
level keeps (a sliding window of rows for its tiles, and at most one unpaired
row of sums).  The 2:1 sums and the means run in the compiled kernel
``wsitool._boxfilter`` (GIL released) when it was built; the numpy functions
here are its reference (``tests/export/test_boxfilter.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import numpy as np

from ..deepzoom.geometry import tile_span
from .plan import sum_dtype, window_rows

_boxfilter: ModuleType | None  # the compiled 2:1 sums (setup.py); the numpy code below is the reference
try:
    from .. import _boxfilter
except ImportError:  # pragma: no cover - built without a C compiler
    _boxfilter = None

#: use the compiled kernel when it was built; tests switch it off to compare
USE_NATIVE = _boxfilter is not None


def kernel_status() -> str:
    """Which 2:1 box-sum kernel exports use: ``"compiled"`` or ``"numpy"``."""
    return "compiled" if (USE_NATIVE and _boxfilter is not None) else "numpy"


def halve_rows(a: np.ndarray, out: np.ndarray) -> None:
    """2:1 box sums of RGB rows: ``out[r, x]`` is the sum of the (up to) 2 x 2 pixels of ``a``
    it covers; a last row or column without a partner is summed alone.

    Args:
        a: ``(rows, width, 3)`` unsigned integers (uint8 pixels or sums), C-contiguous.
        out: ``(ceil(rows / 2), ceil(width / 2), 3)``, C-contiguous, of a wider or equal
            unsigned type (:func:`sum_dtype`), written in place.

    Uses the compiled kernel (``wsitool._boxfilter``, GIL released) when built and
    :data:`USE_NATIVE`, else :func:`halve_rows_numpy`; both give the same integers.
    """
    rows, w = a.shape[0], a.shape[1]
    if (USE_NATIVE and _boxfilter is not None and a.flags.c_contiguous and out.flags.c_contiguous
            and out.shape == ((rows + 1) // 2, (w + 1) // 2, 3)):
        _boxfilter.halve(a, out, rows, w, a.dtype.itemsize, out.dtype.itemsize)
        return
    halve_rows_numpy(a, out)


def halve_rows_numpy(a: np.ndarray, out: np.ndarray) -> None:
    """The numpy reference of :func:`halve_rows` (same arguments, same result)."""
    rows, w = a.shape[0], a.shape[1]
    pairs, single = rows // 2, rows % 2
    dt = out.dtype
    v = np.empty((pairs + single, w, 3), dt)  # vertical sums of 2 (a single last row alone)
    if pairs:
        np.add(a[0:2 * pairs:2], a[1:2 * pairs:2], out=v[:pairs], dtype=dt)
    if single:
        v[pairs] = a[2 * pairs]
    half = w // 2
    if half:
        np.add(v[:, 0:2 * half:2], v[:, 1:2 * half:2], out=out[:, :half])
    if w % 2:
        out[:, half] = v[:, w - 1]


def means(S: np.ndarray, out: np.ndarray, k: int, cov_x: int, cov_y: int, last_row: bool) -> None:
    """Level-``k`` pixels from their sums: ``out = (S + n // 2) // n`` (the mean rounded half up).

    Args:
        S: ``(rows, width, 3)`` sums of level ``k >= 1`` (:func:`sum_dtype`), C-contiguous.
        out: ``(rows, width, 3)`` uint8, C-contiguous, written in place.
        k: the level; a sum covers ``n = 4**k`` level-0 pixels inside the image.
        cov_x: level-0 columns the last column covers (``1 .. 2**k``: the image edge).
        cov_y: level-0 rows the last row covers, used when ``last_row``.
        last_row: the last row of ``S`` is the level's last row.
    """
    rows, w = S.shape[0], S.shape[1]
    if rows == 0:
        return
    if (USE_NATIVE and _boxfilter is not None and S.flags.c_contiguous and out.flags.c_contiguous
            and out.shape == S.shape):
        _boxfilter.means(S, out, rows, w, S.dtype.itemsize, k, cov_x, cov_y, bool(last_row))
        return
    means_numpy(S, out, k, cov_x, cov_y, last_row)


def means_numpy(S: np.ndarray, out: np.ndarray, k: int, cov_x: int, cov_y: int, last_row: bool) -> None:
    """The numpy reference of :func:`means` (same arguments, same result)."""
    rows, w = S.shape[0], S.shape[1]
    full = 1 << k
    nx = np.full(w, full, np.uint64)
    nx[-1] = cov_x
    ny = np.full(rows, full, np.uint64)
    if last_row:
        ny[-1] = cov_y
    n = (ny[:, None] * nx[None, :]).astype(S.dtype)[..., None]
    out[...] = (S + n // 2) // n


class LevelRows:
    """Sliding window of uint8 rows of one output level: the rows its unfinished tile row needs."""

    def __init__(self, k: int, width: int, height: int, tile: int, capacity: int):
        self.k = k
        self.width = width
        self.height = height
        self.buf = np.empty((capacity, width, 3), np.uint8)
        self.start = 0  # level row held in buf[0]
        self.n = 0  # rows held
        self.next_row = 0  # next tile row to emit
        self.tiles_across = -(-width // tile)
        self.tiles_down = -(-height // tile)

    @property
    def end(self) -> int:
        return self.start + self.n

    def tail(self, rows: int) -> np.ndarray:
        if self.n + rows > self.buf.shape[0]:  # pragma: no cover - capacity is proven in the docs
            raise RuntimeError(f"level {self.k} row window overflow")
        return self.buf[self.n:self.n + rows]

    def trim(self, keep_from: int) -> None:
        """Drop rows before ``keep_from``, moving the rest to the front (no temporary)."""
        d = keep_from - self.start
        if d <= 0:
            return
        m = self.n - d
        for i in range(0, max(m, 0), d):  # blocks of d rows never overlap their source
            j = min(i + d, m)
            self.buf[i:j] = self.buf[i + d:j + d]
        self.start = keep_from
        self.n = max(m, 0)


class PyramidBuilder:
    """Turns composited level-0 strips into output tiles of every level.

    The caller writes each strip of level-0 rows (at most ``strip`` rows) into
    ``levels[0].tail(rows)``, adds ``rows`` to ``levels[0].n`` and runs
    :meth:`advance`, which yields every tile the new rows complete.
    """

    def __init__(self, dims: list[tuple[int, int]], tile: int, overlap: int, pad_tiles: bool,
                 strip: int):
        self.dims = dims
        self.tile = tile
        self.overlap = overlap
        self.pad_tiles = pad_tiles
        self.base_w, self.base_h = dims[0]
        c0, ck = window_rows(tile, overlap, strip)
        self.levels = [LevelRows(k, w, h, tile, c0 if k == 0 else ck)
                       for k, (w, h) in enumerate(dims)]
        self.paired0 = 0  # next level-0 row not yet halved into level 1
        # Sums of each lower level's newest rows: row 0 holds the carried unpaired row, rows
        # 1.. the rows that arrived from the level above (at most (strip >> k) + 2 a strip);
        # level 0 has none (an empty placeholder keeps the list indexed by level).
        self.sums: list[np.ndarray] = [np.empty((0, 0, 3), np.uint8)] + [
            np.empty(((strip >> k) + 3, w, 3), sum_dtype(k)) for k, (w, _h) in enumerate(dims) if k > 0]
        self.carry = [False] * len(dims)
        self.made = [0] * len(dims)  # rows of each level made so far

    def _coverage(self, k: int) -> tuple[int, int]:
        """Level-0 columns and rows covered by level ``k``'s last column and last row."""
        w, h = self.dims[k]
        return self.base_w - (w - 1) * (1 << k), self.base_h - (h - 1) * (1 << k)

    # -- reduction -----------------------------------------------------------------
    def _halve0(self) -> int:
        """Halve the complete row pairs of level 0 into level 1's sums; return rows made.

        A level-1 sum is the sum of the (up to) 2 x 2 level-0 pixels it
        covers; the image's last row or column without a partner is carried
        over alone.  Sums need no weights at the clipped edges: they add
        exactly the level-0 pixels that exist, and :func:`means` divides by
        their count.
        """
        lv = self.levels[0]
        p, avail = self.paired0, lv.end
        pairs = (avail - p) // 2
        single = 1 if (avail == lv.height and avail - p - 2 * pairs == 1) else 0
        rows = pairs + single
        if rows:
            a = lv.buf[p - lv.start:p - lv.start + 2 * pairs + single]
            halve_rows(a, self.sums[1][1:1 + rows])
            self.paired0 = p + 2 * pairs + single
        return rows

    def _arrive(self, k: int, rows: int) -> Iterator[tuple[int, int, int, np.ndarray]]:
        """``rows`` new sums of level ``k >= 1`` are in ``sums[k][1:1 + rows]``: make the
        level's pixels, halve complete pairs into level ``k + 1``, emit complete tile rows."""
        lv, S = self.levels[k], self.sums[k]
        new = S[1:1 + rows]
        last = self.made[k] + rows == lv.height
        cov_x, cov_y = self._coverage(k)
        means(new, lv.tail(rows), k, cov_x, cov_y, last)
        lv.n += rows
        self.made[k] += rows
        if k + 1 < len(self.levels):
            lo = 0 if self.carry[k] else 1
            avail = 1 + rows - lo
            pairs = avail // 2
            single = 1 if (last and avail % 2 == 1) else 0
            made = pairs + single
            if made:
                halve_rows(S[lo:lo + 2 * pairs + single], self.sums[k + 1][1:1 + made])
            self.carry[k] = avail - 2 * pairs - single == 1
            if self.carry[k]:
                S[0] = S[lo + 2 * pairs]  # the unpaired row waits for its partner
            if made:
                yield from self._arrive(k + 1, made)
        yield from self._emit(k)
        lv.trim(max(0, lv.next_row * self.tile - self.overlap))

    # -- emission ------------------------------------------------------------------
    def _emit(self, k: int) -> Iterator[tuple[int, int, int, np.ndarray]]:
        lv = self.levels[k]
        T, ov = self.tile, self.overlap
        while lv.next_row < lv.tiles_down:
            r = lv.next_row
            y0, y1 = tile_span(r, lv.tiles_down, T, ov, lv.height)
            y1 = min(y1, lv.height)  # stored pixels end at the level's edge
            if y1 > lv.end:
                return
            for c in range(lv.tiles_across):
                x0, x1 = tile_span(c, lv.tiles_across, T, ov, lv.width)
                x1 = min(x1, lv.width)
                # a copy, always: a full-width slice is contiguous already, and a view would
                # see the window's rows move while an encoder thread reads it
                tile = lv.buf[y0 - lv.start:y1 - lv.start, x0:x1].copy(order="C")
                if self.pad_tiles and tile.shape[:2] != (T, T):
                    tile = np.pad(tile, ((0, T - tile.shape[0]), (0, T - tile.shape[1]), (0, 0)),
                                  mode="edge")
                yield k, c, r, tile
            lv.next_row += 1

    def advance(self) -> Iterator[tuple[int, int, int, np.ndarray]]:
        """After rows were added to level 0: reduce, emit every complete tile row, trim.

        Yields ``(level, col, row, tile)``, ``tile`` a ``(h, w, 3)`` uint8 C-contiguous
        copy (``(T, T, 3)`` when tiles are padded); each level's tiles in row-major order.
        """
        lv = self.levels[0]
        if len(self.levels) > 1:
            rows = self._halve0()
            if rows:
                yield from self._arrive(1, rows)
        else:
            self.paired0 = lv.end
        yield from self._emit(0)
        lv.trim(min(self.paired0, lv.end, max(0, lv.next_row * self.tile - self.overlap)))
