"""The downsampler: a box-filtered pyramid built row by row from level-0 strips, in bounded memory (floor 6).

Each lower level halves the one above with an area (box) average: every output
pixel of level ``k`` is the mean of the ``2**k x 2**k`` block of level-0 pixels it
covers, clipped to the image, computed incrementally from pairs of rows (see
:class:`PyramidBuilder`).  Lower levels hold integer sums of the level-0 pixels
(uint16 to level 4, then uint32), so halving is integer additions and the mean
is exact until it is rounded (half up) when a tile is cropped.  Each level
keeps only a sliding window of rows.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ..deepzoom import tile_span
from .plan import window_rows


def sum_dtype(k: int):
    """Sample type of level ``k``'s window: uint8 pixels at level 0, below it sums of
    ``4**k`` uint8 values: uint16 up to level 4 (``255 * 4**4 + 128 < 2**16``), uint32 below
    (exact up to level 11, ``255 * 4**11 < 2**32``; a pyramid of 2**12 x 2**12-pixel blocks
    would need a 2**24-pixel-wide image to reach it, which ``max_export_pixels`` refuses
    long before)."""
    if k == 0:
        return np.uint8
    if k <= 4:
        return np.uint16
    if k <= 11:
        return np.uint32
    return np.uint64


class LevelRows:
    """Sliding window of rows of one output level (RGB: uint8 pixels for level 0, integer sums below)."""

    def __init__(self, k: int, width: int, height: int, base: tuple[int, int], tile: int,
                 capacity: int, dtype):
        self.k = k
        self.width = width
        self.height = height
        self.base_w, self.base_h = base
        self.buf = np.empty((capacity, width, 3), dtype)
        self.start = 0  # level row held in buf[0]
        self.n = 0  # rows held
        self.paired = 0  # next row to be consumed by the 2:1 reduction
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
    """Turns composited level-0 strips into output tiles of every level."""

    def __init__(self, dims: list[tuple[int, int]], tile: int, overlap: int, pad_tiles: bool,
                 strip: int):
        self.dims = dims
        self.tile = tile
        self.overlap = overlap
        self.pad_tiles = pad_tiles
        base = dims[0]
        c0, ck = window_rows(tile, overlap, strip)
        self.levels = [
            LevelRows(k, w, h, base, tile, c0 if k == 0 else ck, sum_dtype(k))
            for k, (w, h) in enumerate(dims)
        ]

    # -- reduction -----------------------------------------------------------------
    def _halve(self, k: int) -> int:
        """Reduce complete row pairs of level ``k`` into level ``k + 1``; return rows made.

        Levels below 0 hold integer sums of the level-0 pixels each pixel
        covers (see :func:`sum_dtype`): a pixel of level ``k + 1`` is the sum
        of the (up to) 2 x 2 pixels of level ``k`` it covers, a last row or
        column without a partner is carried over alone.  Sums need no
        weights at the clipped edges: they add exactly the level-0 pixels
        that exist, and :meth:`_crop` divides by their count.
        """
        src, dst = self.levels[k], self.levels[k + 1]
        p = src.paired
        avail = src.end
        pairs = (avail - p) // 2
        single = 1 if (avail == src.height and avail - p - 2 * pairs == 1) else 0
        rows = pairs + single
        if rows == 0:
            return 0
        a = src.buf[p - src.start:avail - src.start]
        dt = dst.buf.dtype
        w = src.width
        v = np.empty((rows, w, 3), dt)  # vertical sums of 2 (a single last row alone)
        if pairs:
            np.add(a[0:2 * pairs:2], a[1:2 * pairs:2], out=v[:pairs], dtype=dt)
        if single:
            v[pairs] = a[2 * pairs]
        out = dst.tail(rows)
        half = w // 2
        if half:
            np.add(v[:, 0:2 * half:2], v[:, 1:2 * half:2], out=out[:, :half])
        if w % 2:
            out[:, half] = v[:, w - 1]
        del v
        dst.n += rows
        src.paired = p + 2 * pairs + single
        return rows

    # -- emission ------------------------------------------------------------------
    def _crop(self, lv: LevelRows, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """uint8 ``(y1 - y0, x1 - x0, 3)`` C-contiguous copy of level rows/columns.

        Level 0 is copied; a lower level's sums are divided by the count of
        level-0 pixels each covers, rounding half up: ``(S + n // 2) // n``
        (the exact box mean within 0.5), with a shift when every pixel of
        the crop covers the full ``4**k`` block.
        """
        part = lv.buf[y0 - lv.start:y1 - lv.start, x0:x1]
        if lv.k == 0:
            return np.ascontiguousarray(part)
        k = lv.k
        full = 1 << k
        cov_x = np.minimum(full, lv.base_w - np.arange(x0, x1) * full)
        cov_y = np.minimum(full, lv.base_h - np.arange(y0, y1) * full)
        if cov_x[-1] == full and cov_y[-1] == full:
            tmp = part + part.dtype.type(1 << (2 * k - 1))
            np.right_shift(tmp, 2 * k, out=tmp)
            return tmp.astype(np.uint8)
        n = (cov_y[:, None] * cov_x[None, :]).astype(part.dtype)[..., None]
        tmp = part + n // 2
        tmp //= n
        return tmp.astype(np.uint8)

    def _emit(self, k: int) -> Iterator[tuple[int, int, int, np.ndarray]]:
        lv = self.levels[k]
        T, O = self.tile, self.overlap
        while lv.next_row < lv.tiles_down:
            r = lv.next_row
            y0, y1 = tile_span(r, lv.tiles_down, T, O, lv.height)
            y1 = min(y1, lv.height)  # stored pixels end at the level's edge
            if y1 > lv.end:
                return
            for c in range(lv.tiles_across):
                x0, x1 = tile_span(c, lv.tiles_across, T, O, lv.width)
                x1 = min(x1, lv.width)
                tile = self._crop(lv, y0, y1, x0, x1)
                if self.pad_tiles and tile.shape[:2] != (T, T):
                    tile = np.pad(tile, ((0, T - tile.shape[0]), (0, T - tile.shape[1]), (0, 0)),
                                  mode="edge")
                yield k, c, r, tile
            lv.next_row += 1

    def advance(self, k: int = 0) -> Iterator[tuple[int, int, int, np.ndarray]]:
        """After rows were added to level ``k``: reduce, emit complete tile rows, trim."""
        lv = self.levels[k]
        if k + 1 < len(self.levels):
            if self._halve(k):
                yield from self.advance(k + 1)
        else:
            lv.paired = lv.end
        yield from self._emit(k)
        lv.trim(min(lv.paired, lv.end, max(0, lv.next_row * self.tile - self.overlap)))


