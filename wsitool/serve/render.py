"""Rendering a region of a slide at a scale, in bounded memory; rotation, quality, encoding.

A request for the level-0 region ``(x, y, w, h)`` at ``out_w x out_h`` pixels is
answered from the level whose downsample is the largest not above the
requested scale ``min(w / out_w, h / out_h)`` (with a relative slack,
``tolerance``, for pyramids that store downsamples such as 4.002 for 4), so a
thumbnail never reads level 0 of a pyramid.  The region's window on that level
is read through :meth:`wsitool.Slide.read_region` in strips of whole tile rows
(each source tile is decoded once per request) and reduced by the area filter
(:mod:`wsitool.areafilter`) strip by strip, so a request holds one strip of source
pixels (:data:`STRIP_BYTES`) plus its output, whatever the scale.

When the window's size is within one source pixel of an integer multiple of
the output (the common case: power-of-two scale factors on a 2x or 4x
pyramid), the window is snapped to that multiple and reduced by exact block
means (or copied, at ratio 1); the content then lies at most one source pixel
from where an exact resampling would put it.

Arrays are ``(height, width, 3)`` uint8 RGB (``gray`` / ``bitonal`` results
``(height, width)``).  Pixels of missing tiles are black.
"""

from __future__ import annotations

import dataclasses
import math
import threading

import numpy as np

from ..areafilter import AreaReducer
from ..deepzoom import best_level_for_downsample
from ..geometry import level0_coordinate

__all__ = ["ReadPlan", "plan_read", "read_scaled", "finish", "encode", "STRIP_BYTES",
           "REUSE_BYTES", "thumbnail_size"]

#: Most source bytes (RGB) one strip of a request holds.
STRIP_BYTES = 4 << 20

#: A window whose size is within this many source pixels of an integer
#: multiple of the output is snapped to it (block means instead of taps).
SNAP_PIXELS = 1.0

#: Largest result (bytes) that :func:`read_scaled` with ``reuse=True`` reads into
#: its thread's own buffer (a 1024 x 1024 RGB tile is 3 MiB).
REUSE_BYTES = 4 << 20

_threads = threading.local()


def _reusable(shape: tuple[int, int, int]) -> np.ndarray:
    """This thread's buffer of :data:`REUSE_BYTES` (made on first use), as a ``shape`` uint8 array."""
    buf = getattr(_threads, "buf", None)
    if buf is None:
        buf = _threads.buf = np.empty(REUSE_BYTES, np.uint8)
    return buf[:math.prod(shape)].reshape(shape)


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """Where a scaled read comes from.

    Attributes:
        level: the slide level read.
        window: ``(x, y, w, h)`` in pixels of ``level``, the pixels read.
        box: ``(x0, y0, x1, y1)``: the part of the window mapped onto the output
            (window pixels, fractional).
        out: ``(w, h)`` of the result, pixels.
    """

    level: int
    window: tuple[int, int, int, int]
    box: tuple[float, float, float, float]
    out: tuple[int, int]

    @property
    def exact(self) -> bool:
        """The window is the output (ratio 1, pixel-aligned): read straight into it."""
        _x, _y, w, h = self.window
        return self.box == (0, 0, w, h) and (w, h) == self.out


def choose_level(downsamples, scale: float, tolerance: float) -> int:
    """Largest level whose downsample is at most ``scale * (1 + tolerance)`` (level 0 at least):
    OpenSlide's rule (:func:`wsitool.deepzoom.best_level_for_downsample`) with a tolerance, so
    a level stored at 4.002 answers scale 4."""
    return best_level_for_downsample(downsamples, scale * (1 + tolerance))


def _axis(start: float, stop: float, n: int, limit: int) -> tuple[int, int, float, float]:
    """Window ``(first, count)`` and box ``(b0, b1)`` along one axis (level pixels)."""
    length = stop - start
    f = round(length / n)
    if f >= 1 and abs(length - f * n) <= SNAP_PIXELS and f * n <= limit:
        first = min(max(0, round(start)), limit - f * n)
        return first, f * n, 0.0, float(f * n)
    first = max(0, math.floor(start))
    last = min(limit, math.ceil(stop))
    if last <= first:
        last = first + 1
    return first, last - first, start - first, min(stop, last) - first


def plan_read(level_dimensions, level_downsamples, region, out, tolerance: float = 0.01) -> ReadPlan:
    """The :class:`ReadPlan` of level-0 ``region = (x, y, w, h)`` at ``out = (w, h)`` pixels."""
    x, y, w, h = region
    ow, oh = out
    level = choose_level(level_downsamples, min(w / ow, h / oh), tolerance)
    ds = level_downsamples[level]
    lw, lh = level_dimensions[level]
    x0, c, bx0, bx1 = _axis(x / ds, min((x + w) / ds, lw), ow, lw)
    y0, r, by0, by1 = _axis(y / ds, min((y + h) / ds, lh), oh, lh)
    return ReadPlan(level, (x0, y0, c, r), (bx0, by0, bx1, by1), (ow, oh))


def read_scaled(slide, plan: ReadPlan, threads: int | None = None, reuse: bool = False) -> np.ndarray:
    """Read and reduce ``plan`` from ``slide``: ``(out_h, out_w, 3)`` uint8 RGB.

    ``reuse``: an exact plan (:attr:`ReadPlan.exact`, a level read at ratio 1) of at
    most :data:`REUSE_BYTES` is read into a buffer that the calling thread keeps (one
    per thread, made on first use): the array returned is overwritten by the thread's
    next ``reuse=True`` read, so it must be used up (encoded) before.  The server's
    render threads read so: with :func:`wsitool.serve.runner.tune_malloc`'s mmap
    threshold a new 3 MiB array per request is a new memory map whose pages are
    faulted in and zeroed each time (3-4 ms of system time per 1024 x 1024 tile in a
    two-thread read-and-encode loop).  The pixels are the same either way.

    Raises what :meth:`wsitool.Slide.read_region` raises (e.g.
    :class:`~wsitool.errors.TileDecodeError` for a corrupt tile).
    """
    lv = slide.levels[plan.level]
    ds = lv.downsample
    wx, wy, ww, wh = plan.window
    lx = level0_coordinate(wx, ds)
    if plan.exact:
        out = _reusable((wh, ww, 3)) if reuse and ww * wh * 3 <= REUSE_BYTES else None
        return slide.read_region((lx, level0_coordinate(wy, ds)), plan.level, (ww, wh),
                                 mode="rgb", threads=threads, out=out)
    ow, oh = plan.out
    reducer = AreaReducer(ww, wh, plan.box, ow, oh, 3)
    th = lv.tile_height
    row_bytes = ww * 3
    if th * row_bytes <= STRIP_BYTES:
        step = th * max(1, STRIP_BYTES // (th * row_bytes))   # whole tile rows
    else:
        step = max(8, STRIP_BYTES // row_bytes)
    row = wy
    end = wy + wh
    while row < end:
        # strips end on tile-row boundaries of the level (each tile decoded once)
        stop = min(end, (row // step + 1) * step) if step % th == 0 else min(end, row + step)
        strip = slide.read_region((lx, level0_coordinate(row, ds)), plan.level, (ww, stop - row),
                                  mode="rgb", threads=threads)
        reducer.feed(strip)
        del strip
        row = stop
    return reducer.out


def finish(rgb: np.ndarray, mirror: bool, rotation: int, quality: str) -> np.ndarray:
    """IIIF §4.3 / §4.4 on a rendered ``(h, w, 3)`` uint8 image: mirror, rotate clockwise, quality.

    ``quality``: ``"color"`` keeps RGB; ``"gray"`` gives ``(h, w)`` luma (ITU-R
    BT.601 weights); ``"bitonal"`` ``(h, w)`` of 0 / 255 (luma threshold 128).
    """
    img = rgb
    if quality in ("gray", "bitonal"):
        c = img.astype(np.uint16)  # uint16 sums whatever numpy's scalar promotion rules
        luma = (c[..., 0] * 77 + c[..., 1] * 150 + c[..., 2] * 29 + 128) >> 8
        img = luma.astype(np.uint8)
        if quality == "bitonal":
            img = np.where(img >= 128, np.uint8(255), np.uint8(0))
    if mirror:
        img = img[:, ::-1]
    if rotation:
        img = np.rot90(img, k=-(rotation // 90))
    return np.ascontiguousarray(img)


def encode(img: np.ndarray, fmt: str, quality: int = 90) -> bytes:
    """Encode ``(h, w, 3)`` or ``(h, w)`` uint8 as ``"jpg"``, ``"png"`` or ``"webp"`` (imagecodecs)."""
    import imagecodecs

    if fmt == "jpg":
        return bytes(imagecodecs.jpeg8_encode(img, level=quality))
    if fmt == "png":
        return bytes(imagecodecs.png_encode(img, level=3))
    if fmt == "webp":
        if img.ndim == 2:
            img = np.repeat(img[..., None], 3, axis=2)
        return bytes(imagecodecs.webp_encode(img, level=quality))
    raise ValueError(f"unknown format {fmt!r}")


def thumbnail_size(size: tuple[int, int], box: tuple[int, int]) -> tuple[int, int]:
    """The size a ``size`` image gets when shrunk to fit ``box`` keeping its aspect ratio.

    The rule of Pillow's ``Image.thumbnail`` (which openslide-python's
    ``DeepZoomGenerator`` applies to each tile it reads), so that Deep Zoom tiles
    have exactly that generator's sizes: unchanged when it already fits; else
    the constrained side takes the box's size and the other the integer
    (floor or ceil, at least 1) whose ratio is nearest the original aspect.
    """
    w, h = size
    bw, bh = box
    if bw >= w and bh >= h:
        return (w, h)
    aspect = w / h
    if bw / bh >= aspect:
        y = bh
        cands = [math.floor(y * aspect), math.ceil(y * aspect)]
        x = max(min(cands, key=lambda n: abs(aspect - n / y)), 1)
        return (x, y)
    x = bw
    cands = [math.floor(x / aspect), math.ceil(x / aspect)]
    y = max(min(cands, key=lambda n: 0 if n == 0 else abs(aspect - x / n)), 1)
    return (x, y)
