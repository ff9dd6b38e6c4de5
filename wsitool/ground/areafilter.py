"""The area filter (floor 0): exact box averaging of a source window onto an output grid, strip by strip.

Each output pixel is the mean of the source over its footprint, the source
being piecewise constant (pixel ``k`` covers ``[k, k + 1)``): pixels cut by the
footprint's edge count by the fraction inside.  For an integer ratio this is
the plain ``f x f`` block mean; below 1 (upscaling) it repeats pixels,
blending at fractional edges.

The filter is separable and applied as weighted taps: along each axis output
pixel ``i`` is ``sum_t w[i, t] * src[start[i] + t]`` over the (at most
``ceil(ratio) + 1``) pixels its footprint touches.  Each strip of source rows is
reduced across first; the rows of the result wait (a few rows at most) until
every output row they feed is complete, so only one strip of the source is in
memory at a time, plus the output.  Integer ratios on pixel-aligned windows take
a faster exact path (sums of strided slices).

Memory: an upscaled output is wider than its source, so a strip reduced across
(float32, ``out_w`` wide) can be many times the strip: :meth:`AreaReducer.feed_rows`
says how many source rows to feed at once to keep those temporaries within a
budget, and output rows are finished :data:`_ROWS_AT_ONCE` at a time (fewer for a
wide output, within :data:`_CHUNK_BYTES`).  With ``sink=`` the reducer keeps no
output at all: each finished band of rows goes to the sink (a server writes
them, converted and rotated, into its final image).

Shapes: source strips ``(rows, src_w, channels)`` uint8; output
``(out_h, out_w, channels)`` uint8.  Coordinates are in source pixels of the
window the strips come from (row 0 is the window's first row).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["AreaFilter", "AreaReducer", "reduce_area", "taps"]


def taps(start: float, stop: float, count: int, limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Footprint taps of ``count`` output pixels over source ``[start, stop)`` (``limit`` pixels).

    Returns ``(first, last, weights)``: ``first`` and ``last`` ``(count,)`` int64,
    the first and one past the last source pixel of each footprint (both
    non-decreasing); ``weights`` ``(count, T)`` float32, the share of pixel
    ``first + t`` in the output pixel (rows sum to 1; taps at or past ``last``
    have weight 0 and are clamped to a valid index by the caller).
    """
    edges = start + (stop - start) * np.arange(count + 1, dtype=np.float64) / count
    lo, hi = edges[:-1], edges[1:]
    first = np.clip(np.floor(lo).astype(np.int64), 0, limit - 1)
    last = np.clip(np.ceil(hi).astype(np.int64), first + 1, limit)  # exclusive
    T = int((last - first).max())
    k = first[:, None] + np.arange(T)[None, :]
    w = np.minimum(hi[:, None], k + 1) - np.maximum(lo[:, None], k)
    w = np.where(k < last[:, None], np.maximum(w, 0.0), 0.0)
    w /= w.sum(axis=1, keepdims=True)
    return first, last, w.astype(np.float32)


def _block_mean(src: np.ndarray, fy: int, fx: int) -> np.ndarray:
    """Exact mean of ``fy x fx`` blocks of ``src`` (whose sides are multiples), rounded to uint8."""
    h, w = src.shape[:2]
    oh, ow = h // fy, w // fx
    n = fx * fy
    if n == 1:
        return src
    acc_t = np.uint16 if n <= 256 else np.uint32
    rows: np.ndarray[Any, np.dtype[np.unsignedinteger[Any]]] = src[0::fy].astype(acc_t)
    for dy in range(1, fy):
        rows += src[dy::fy]
    if fx == 1:
        acc = rows
    else:
        acc = rows[:, 0::fx].copy()
        for dx in range(1, fx):
            acc += rows[:, dx::fx]
    acc += n // 2
    acc //= n
    return acc.astype(np.uint8).reshape(oh, ow, *src.shape[2:])


class AreaReducer:
    """Reduce a ``src_w x src_h`` source window onto ``out_w x out_h`` pixels, fed strip by strip.

    Args:
        src_w, src_h: window size in source pixels.
        box: ``(x0, y0, x1, y1)``, the part of the window that maps onto the
            output, in source pixels (fractional; ``0 <= x0 < x1 <= src_w``).
        out_w, out_h: output size in pixels.
        channels: samples per pixel.
        sink: None (default: the result is kept in :attr:`out`), or a function
            ``sink(row, rows)`` given each band of finished output rows in order:
            ``rows`` ``(n, out_w, channels)`` uint8 are output rows ``row ..
            row + n - 1`` (valid during the call only); :attr:`out` is then empty.

    Feed the window's rows in order with :meth:`feed` (any strip heights, all
    ``src_h`` rows); then :attr:`out` holds the ``(out_h, out_w, channels)`` result.
    The pixels do not depend on how the rows are split into strips.
    """

    def __init__(self, src_w: int, src_h: int, box, out_w: int, out_h: int, channels: int,
                 sink: Callable[[int, np.ndarray], None] | None = None):
        x0, y0, x1, y1 = (float(v) for v in box)
        self._sink = sink
        self.out = np.empty((out_h if sink is None else 0, out_w, channels), np.uint8)
        self._out_h = out_h
        self._src_w = src_w
        self._src_h = src_h
        # exact integer ratio on a pixel-aligned box: block means
        fx, fy = (x1 - x0) / out_w, (y1 - y0) / out_h
        self._block: tuple[int, int, int, int] | None = None
        if (fx.is_integer() and fy.is_integer() and x0.is_integer() and y0.is_integer()):
            self._block = (int(fy), int(fx), int(x0), int(y0))
        self._xfirst, _, self._xw = taps(x0, x1, out_w, src_w)
        self._yfirst, self._ylast, self._yw = taps(y0, y1, out_h, src_h)
        T = self._xw.shape[1]
        self._xidx = np.minimum(self._xfirst[:, None] + np.arange(T)[None, :], src_w - 1)
        self._fed = 0           # window rows fed so far
        self._pending: np.ndarray | None = None    # rows kept for output rows not finished yet
        #: window row of the first kept row (or of the first row wanted, when none are kept)
        self._row = self._block[3] if self._block is not None else int(self._yfirst[0])
        self._next = 0          # next output row to finish
        #: output rows finished per vectorised step of the taps path
        self._chunk = max(1, min(_ROWS_AT_ONCE, _CHUNK_BYTES // (out_w * channels * 4)))

    def feed_rows(self, budget: int) -> int:
        """Source rows to :meth:`feed` at once so that the taps path's temporaries of
        one feed (the rows reduced across, float32, and their gathered samples: about 13
        bytes per output sample per row) stay within ``budget`` bytes; at least 1.  The
        block-mean path works on the strip itself (its temporaries are at most twice the
        rows given), so any height will do there: ``src_h``."""
        if self._block is not None:
            return max(1, self._src_h)
        return max(1, budget // (13 * self.out.shape[1] * self.out.shape[2]))

    def _put(self, row: int, rows: np.ndarray) -> None:
        """Output rows ``row ..`` finished: into :attr:`out`, or to the sink as uint8."""
        if self._sink is None:
            self.out[row:row + rows.shape[0]] = rows
        else:
            self._sink(row, rows if rows.dtype == np.uint8 else rows.astype(np.uint8))

    def _across(self, strip: np.ndarray) -> np.ndarray:
        """``(rows, out_w, channels)`` float32: the strip reduced across."""
        xw, xidx = self._xw, self._xidx
        acc = strip[:, xidx[:, 0]].astype(np.float32)
        acc *= xw[None, :, 0, None]
        for t in range(1, xw.shape[1]):
            acc += strip[:, xidx[:, t]] * xw[None, :, t, None]
        return acc

    def feed(self, strip: np.ndarray) -> None:
        """Add the next ``(rows, src_w, channels)`` strip of the window."""
        a = self._fed
        self._fed += strip.shape[0]
        if self._next >= self._out_h:
            return
        if self._pending is None:
            skip = self._row - a  # rows above the first one wanted
            if skip >= strip.shape[0]:
                return
            if skip > 0:
                strip = strip[skip:]
        if self._block is not None:
            self._feed_blocks(strip)
        else:
            self._feed_taps(strip)

    def _keep(self, rows: np.ndarray, base: int, row: int) -> None:
        """Keep ``rows`` (window rows from ``base``) from window row ``row`` on, for later strips."""
        self._row = row
        end = base + rows.shape[0]
        self._pending = rows[row - base:] if row < end and self._next < self._out_h else None

    def _feed_blocks(self, strip: np.ndarray) -> None:
        """The block-mean path: every output row whose ``fy`` rows are in now."""
        assert self._block is not None  # (this path is taken only with block means)
        fy, fx, x0, y0 = self._block
        ow = self._xfirst.shape[0]
        rows = strip[:, x0:x0 + fx * ow]
        if self._pending is not None:
            rows = np.concatenate((self._pending, rows))
        base = self._row
        j = self._next
        start = y0 + j * fy - base
        n = min(self._out_h - j, (rows.shape[0] - start) // fy)
        if n > 0:
            self._put(j, _block_mean(rows[start:start + n * fy], fy, fx))
            self._next = j + n
        self._keep(rows, base, y0 + self._next * fy)

    def _feed_taps(self, strip: np.ndarray) -> None:
        """The weighted-taps path: reduce across, then finish every output row whose rows are in."""
        h = self._across(strip)
        if self._pending is not None:
            h = np.concatenate((self._pending, h))
        base = self._row
        end = base + h.shape[0]
        j0 = self._next
        j1 = int(np.searchsorted(self._ylast, end, side="right"))  # rows complete now
        yfirst, yw = self._yfirst, self._yw
        for c0 in range(j0, j1, self._chunk):
            c1 = min(j1, c0 + self._chunk)
            first = yfirst[c0:c1] - base
            acc = h[first] * yw[c0:c1, 0, None, None]
            for t in range(1, yw.shape[1]):
                acc += h[np.minimum(first + t, end - 1 - base)] * yw[c0:c1, t, None, None]
            np.rint(acc, out=acc)
            np.clip(acc, 0, 255, out=acc)
            self._put(c0, acc)
        self._next = j1
        self._keep(h, base, int(yfirst[j1]) if j1 < self._out_h else end)


#: Output rows computed per vectorised step (bounds the float32 temporary).
_ROWS_AT_ONCE = 64
#: ... and fewer for a wide output: one float32 temporary of a step within this many bytes.
_CHUNK_BYTES = 2 << 20


def reduce_area(src: np.ndarray, box, out_w: int, out_h: int) -> np.ndarray:
    """The area filter of a whole ``(h, w, c)`` uint8 array: ``box`` (source pixels) onto ``out_w x out_h``."""
    h, w, c = src.shape
    r = AreaReducer(w, h, box, out_w, out_h, c)
    r.feed(src)
    return r.out


class AreaFilter:
    """The area filter of one geometry, applied to many whole windows (the batch reader's patches).

    The taps are computed once, not once per window as :func:`reduce_area` does;
    :meth:`apply` gives the same pixels as ``reduce_area(src, box, out_w, out_h)``.
    Safe to share between threads (each :meth:`apply` works on its own state).

    Args:
        src_w, src_h: window size in source pixels.
        box: ``(x0, y0, x1, y1)`` of the window mapped onto the output (as
            :class:`AreaReducer`).
        out_w, out_h: output size in pixels.
        channels: samples per pixel.
    """

    def __init__(self, src_w: int, src_h: int, box, out_w: int, out_h: int, channels: int):
        self._proto = AreaReducer(src_w, src_h, box, out_w, out_h, channels)
        self._start = dict(_fed=0, _pending=None, _row=self._proto._row, _next=0)
        self.shape = self._proto.out.shape

    def apply(self, src: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Reduce the ``(src_h, src_w, channels)`` uint8 window ``src`` into ``out``
        (``(out_h, out_w, channels)`` uint8, written in place); return ``out``."""
        r = copy.copy(self._proto)  # shares the taps; fresh feeding state below
        r.__dict__.update(self._start)
        r.out = out
        r.feed(src)
        return out
