"""Rendering a region of a slide at a scale, in bounded memory; rotation, quality, encoding.

A request for the level-0 region ``(x, y, w, h)`` at ``out_w x out_h`` pixels is
answered from the level whose downsample is the largest not above the
requested scale ``min(w / out_w, h / out_h)`` (with a relative slack,
``tolerance``, for pyramids that store downsamples such as 4.002 for 4), so a
thumbnail never reads level 0 of a pyramid.  The region's window on that level
is read through :meth:`wsitool.Slide.read_region` in strips (:data:`STRIP_BYTES`
of source pixels; whole tile rows where they fit, so each source tile is decoded
once per request) and reduced by the area filter (:mod:`wsitool.ground.areafilter`)
strip by strip, fed in chunks whose float temporaries stay within
:data:`FEED_BYTES` whatever the output width (an upscaled output is wider than
its source).

Memory: a request holds its final image (``out_w x out_h`` x 3 bytes, or x 1
for ``gray`` / ``bitonal`` encoded as JPEG or PNG) plus the working set of one
strip (:func:`work_bytes`), then the encoder's own memory.  Quality, mirroring
and rotation are applied band by band as the rows come (:class:`Finisher`), so
they add no full-size copy.  :func:`render_bytes` is that bound, which the
server reserves from its render budget before it starts a render
(:mod:`wsitool.serve.bounds`).

Cancellation: :func:`read_scaled` given a ``cancel`` event checks it between
strips and raises :class:`RenderCancelled` once it is set (the server sets it
when the client has gone).

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
from collections.abc import Callable, Iterator

import numpy as np

from ..ground.areafilter import AreaReducer
from ..ground.geometry import best_level_for_downsample, level0_coordinate

__all__ = ["ReadPlan", "plan_read", "read_scaled", "read_rows", "finish", "Finisher", "encode",
           "RenderCancelled", "check_cancel", "render_bytes", "work_bytes", "STRIP_BYTES", "FEED_BYTES", "REUSE_BYTES",
           "WEBP_BYTES_PER_PIXEL", "thumbnail_size"]

#: Most source bytes (RGB) one strip of a request holds (at least 8 rows, or one
#: tile row where a tile row fits).
STRIP_BYTES = 4 << 20

#: Most bytes of float temporaries one chunk fed to the area filter's weighted taps makes
#: (:meth:`wsitool.ground.areafilter.AreaReducer.feed_rows`).
FEED_BYTES = 4 << 20

#: Output pixels the quality conversion of :class:`Finisher` handles at once (its
#: uint16 temporaries: about 20 bytes a pixel).
FINISH_PIXELS = 1 << 18

#: A window whose size is within this many source pixels of an integer
#: multiple of the output is snapped to it (block means instead of taps).
SNAP_PIXELS = 1.0

#: Largest result (bytes) that :func:`read_scaled` with ``reuse=True`` reads into
#: its thread's own buffer (a 1024 x 1024 RGB tile is 3 MiB).
REUSE_BYTES = 4 << 20

#: Bytes a pixel that lossless WebP encoding holds at its peak (imagecodecs with
#: ``method=0``, the RGB input excluded): 17-18 on tissue, 24 on noise, measured.
WEBP_BYTES_PER_PIXEL = 24

_threads = threading.local()


class RenderCancelled(Exception):
    """A render stopped between two strips because its ``cancel`` event was set."""


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
    OpenSlide's rule (:func:`wsitool.ground.geometry.best_level_for_downsample`) with a tolerance, so
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


def _strip_rows(tile_height: int, width: int) -> int:
    """Source rows per strip of a ``width``-pixel window: whole tile rows within
    :data:`STRIP_BYTES` where one fits, else :data:`STRIP_BYTES` of rows (at least 8)."""
    row_bytes = width * 3
    if tile_height * row_bytes <= STRIP_BYTES:
        return tile_height * max(1, STRIP_BYTES // (tile_height * row_bytes))
    return max(8, STRIP_BYTES // row_bytes)


def _strips(first: int, count: int, step: int, tile_height: int) -> Iterator[tuple[int, int]]:
    """``(row, stop)`` of the strips of rows ``first .. first + count`` (level pixels): strips
    of whole tile rows end on the level's tile-row boundaries (each tile decoded once)."""
    row, end = first, first + count
    while row < end:
        stop = min(end, (row // step + 1) * step) if step % tile_height == 0 else min(end, row + step)
        yield row, stop
        row = stop


def check_cancel(cancel: threading.Event | None) -> None:
    """Raise :class:`RenderCancelled` if ``cancel`` is set."""
    if cancel is not None and cancel.is_set():
        raise RenderCancelled("the render was cancelled")


def read_scaled(slide, plan: ReadPlan, threads: int | None = None, reuse: bool = False,
                cancel: threading.Event | None = None) -> np.ndarray:
    """Read and reduce ``plan`` from ``slide``: ``(out_h, out_w, 3)`` uint8 RGB.

    ``reuse``: an exact plan (:attr:`ReadPlan.exact`, a level read at ratio 1) of at
    most :data:`REUSE_BYTES` is read into a buffer that the calling thread keeps (one
    per thread, made on first use): the array returned is overwritten by the thread's
    next ``reuse=True`` read, so it must be used up (encoded) before.  The server's
    render threads read so: with :func:`wsitool.serve.runner.tune_malloc`'s mmap
    threshold a new 3 MiB array per request is a new memory map whose pages are
    faulted in and zeroed each time (3-4 ms of system time per 1024 x 1024 tile in a
    two-thread read-and-encode loop).  The pixels are the same either way.

    ``cancel``: checked before each strip (an exact read larger than a strip is read
    in strips of whole tile rows then).

    Raises:
        RenderCancelled: ``cancel`` was set.
        TileDecodeError: a corrupt tile; and whatever else :meth:`wsitool.Slide.read_region`
            raises.
    """
    wx, wy, ww, wh = plan.window
    if plan.exact:
        lv = slide.levels[plan.level]
        if cancel is None or ww * wh * 3 <= STRIP_BYTES:
            check_cancel(cancel)
            out = _reusable((wh, ww, 3)) if reuse and ww * wh * 3 <= REUSE_BYTES else None
            return slide.read_region((level0_coordinate(wx, lv.downsample), level0_coordinate(wy, lv.downsample)),
                                     plan.level, (ww, wh), mode="rgb", threads=threads, out=out)
        image = np.empty((wh, ww, 3), np.uint8)
        th = lv.tile_height  # (reading into the image: strips of whole tile rows, however wide)
        for row, stop in _strips(wy, wh, th * max(1, STRIP_BYTES // (th * ww * 3)), th):
            _read(slide, plan, row, stop, threads, cancel, image[row - wy:stop - wy])
        return image
    ow, oh = plan.out
    reducer = AreaReducer(ww, wh, plan.box, ow, oh, 3)
    _reduce(slide, plan, reducer, threads, cancel)
    return reducer.out


def read_rows(slide, plan: ReadPlan, rows: Callable[[int, np.ndarray], None], threads: int | None = None,
              cancel: threading.Event | None = None) -> None:
    """Read and reduce ``plan`` as :func:`read_scaled` does, giving the result band by band.

    ``rows(row, band)`` receives each band of output rows in order: ``band``
    ``(n, out_w, 3)`` uint8 RGB holds rows ``row .. row + n - 1`` (valid during the call
    only).  Nothing of the output is kept here: a request holds one strip (and, for a
    reduced plan, the area filter's few pending rows).

    Raises:
        as :func:`read_scaled`.
    """
    _wx, wy, ww, wh = plan.window
    if plan.exact:
        th = slide.levels[plan.level].tile_height
        for row, stop in _strips(wy, wh, _strip_rows(th, ww), th):
            rows(row - wy, _read(slide, plan, row, stop, threads, cancel))
        return
    ow, oh = plan.out
    _reduce(slide, plan, AreaReducer(ww, wh, plan.box, ow, oh, 3, sink=rows), threads, cancel)


def _read(slide, plan: ReadPlan, row: int, stop: int, threads: int | None, cancel: threading.Event | None,
          out: np.ndarray | None = None) -> np.ndarray:
    """Rows ``row .. stop`` of ``plan``'s window (level pixels), RGB, after checking ``cancel``."""
    check_cancel(cancel)
    ds = slide.levels[plan.level].downsample
    wx, _wy, ww, _wh = plan.window
    return slide.read_region((level0_coordinate(wx, ds), level0_coordinate(row, ds)), plan.level,
                             (ww, stop - row), mode="rgb", threads=threads, out=out)


def _reduce(slide, plan: ReadPlan, reducer: AreaReducer, threads: int | None,
            cancel: threading.Event | None) -> None:
    """Feed ``plan``'s window to ``reducer`` strip by strip, each strip in chunks of
    :meth:`~wsitool.ground.areafilter.AreaReducer.feed_rows` rows (:data:`FEED_BYTES`)."""
    _wx, wy, ww, wh = plan.window
    th = slide.levels[plan.level].tile_height
    feed = reducer.feed_rows(FEED_BYTES)
    for row, stop in _strips(wy, wh, _strip_rows(th, ww), th):
        strip = _read(slide, plan, row, stop, threads, cancel)
        for k in range(0, strip.shape[0], feed):
            if k:
                check_cancel(cancel)
            reducer.feed(strip[k:k + feed])
        del strip


def work_bytes(plan: ReadPlan, tile_height: int, banded: bool) -> int:
    """Most bytes :func:`read_scaled` (``banded=False``) or :func:`read_rows` with a
    :class:`Finisher` (``banded=True``) holds for ``plan`` beyond the final image: one
    strip, the area filter's temporaries and pending rows, the finisher's band.

    An upper estimate, from the sizes the code uses (tests/serve/test_render_bounds.py
    checks it against what numpy allocates): the strip (``rows x width x 3``); on the
    block-mean path up to 3 times the strip and its pending rows again (their
    concatenation and the uint16 / uint32 sums); on the taps path the float32 rows of
    one feed and the pending rows (twice: their concatenation) and one chunk of output
    rows (three float32 temporaries); the finisher's conversion of
    :data:`FINISH_PIXELS` (20 bytes each) and the band it is given.
    """
    _wx, _wy, ww, wh = plan.window
    ow, oh = plan.out
    if plan.exact:
        return _strip_rows(tile_height, ww) * ww * 3 + 20 * FINISH_PIXELS if banded else 0
    strip = min(wh, _strip_rows(tile_height, ww)) * ww * 3
    x0, y0, x1, y1 = plan.box
    fy = math.ceil((y1 - y0) / oh) + 2         # window rows an output row needs
    fx, fyr = (x1 - x0) / ow, (y1 - y0) / oh
    if fx.is_integer() and fyr.is_integer() and float(x0).is_integer() and float(y0).is_integer():
        pending = fy * ww * 3
        work = strip + 3 * (strip + pending)
        band = strip // max(1, int(fyr) * int(fx))      # a band of block means
    else:
        sample = ow * 3
        feed = max(1, FEED_BYTES // (13 * sample))
        chunk = max(1, min(64, (2 << 20) // (sample * 4)))
        work = strip + 13 * feed * sample + 2 * 4 * (feed + fy) * sample + 3 * 4 * chunk * sample
        band = chunk * sample
    return work + ((20 * FINISH_PIXELS + band) if banded else 0)


def render_bytes(plan: ReadPlan, tile_height: int, quality: str, fmt: str, mirror: bool = False,
                 rotation: int = 0) -> int:
    """The memory bound of one IIIF render (bytes): final image + strip working set + encoder.

    The final image is ``out_w x out_h x c`` bytes, ``c`` = 3 (``color``, or any
    quality as WebP, which encodes RGB only) or 1 (``gray`` / ``bitonal`` as JPEG or
    PNG).  The encoder: JPEG and PNG at most twice their output, which is at most about
    the image's size (noise; ``2 c`` bytes a pixel; tissue takes 0.25-1 c);
    lossless WebP :data:`WEBP_BYTES_PER_PIXEL`.  The working set: :func:`work_bytes`
    (``banded``: a quality other than color, mirroring or rotation, applied by a
    :class:`Finisher`).
    """
    ow, oh = plan.out
    pixels = ow * oh
    c = 3 if quality == "color" or fmt == "webp" else 1
    encoder = pixels * (WEBP_BYTES_PER_PIXEL if fmt == "webp" else 2 * c)
    banded = quality != "color" or mirror or bool(rotation)
    return pixels * c + encoder + work_bytes(plan, tile_height, banded)


def _quality(rgb: np.ndarray, quality: str) -> np.ndarray:
    """``rgb`` ``(..., 3)`` uint8 as ``quality``: itself (``color``), luma or 0 / 255."""
    if quality not in ("gray", "bitonal"):
        return rgb
    c = rgb.astype(np.uint16)  # uint16 sums whatever numpy's scalar promotion rules
    luma = (c[..., 0] * 77 + c[..., 1] * 150 + c[..., 2] * 29 + 128) >> 8
    img = luma.astype(np.uint8)
    if quality == "bitonal":
        img = np.where(img >= 128, np.uint8(255), np.uint8(0))
    return img


def finish(rgb: np.ndarray, mirror: bool, rotation: int, quality: str) -> np.ndarray:
    """IIIF §4.3 / §4.4 on a rendered ``(h, w, 3)`` uint8 image: mirror, rotate clockwise, quality.

    ``quality``: ``"color"`` keeps RGB; ``"gray"`` gives ``(h, w)`` luma (ITU-R
    BT.601 weights); ``"bitonal"`` ``(h, w)`` of 0 / 255 (luma threshold 128).
    Makes whole-image copies: the server applies :class:`Finisher` band by band
    instead (the same pixels).
    """
    img = _quality(rgb, quality)
    if mirror:
        img = img[:, ::-1]
    if rotation:
        img = np.rot90(img, k=-(rotation // 90))
    return np.ascontiguousarray(img)


class Finisher:
    """:func:`finish`, applied band by band as the rows of the image come, into its final array.

    Args:
        width, height: the rendered image's size before rotation (pixels).
        mirror, rotation, quality: as :func:`finish`.
        rgb_out: keep gray and bitonal results as 3 equal channels (for WebP, which
            encodes RGB only) instead of ``(h, w)``.

    :meth:`put` each band of the ``(height, width, 3)`` uint8 image (any order, any
    heights); then :attr:`image` holds ``finish(rgb, mirror, rotation, quality)``
    (repeated to 3 channels with ``rgb_out``), C-contiguous: ``(height, width[, 3])``,
    or ``(width, height[, 3])`` rotated by 90 or 270.  Its conversion handles
    :data:`FINISH_PIXELS` at a time.
    """

    def __init__(self, width: int, height: int, mirror: bool, rotation: int, quality: str,
                 rgb_out: bool = False):
        self.height = height
        self.mirror = mirror
        self.turns = rotation // 90
        self.quality = quality
        channels = 3 if quality not in ("gray", "bitonal") or rgb_out else 1
        size = (width, height) if self.turns % 2 else (height, width)
        self.image = np.empty(size + ((3,) if channels == 3 else ()), np.uint8)
        self._chunk = max(1, FINISH_PIXELS // max(1, width))

    def put(self, row: int, rgb: np.ndarray) -> None:
        """Rows ``row .. row + n - 1`` of the image: ``rgb`` ``(n, width, 3)`` uint8."""
        for k in range(0, rgb.shape[0], self._chunk):
            self._put(row + k, rgb[k:k + self._chunk])

    def _put(self, row: int, rgb: np.ndarray) -> None:
        img = _quality(rgb, self.quality)
        if img.ndim == 2 and self.image.ndim == 3:
            img = img[..., None]  # broadcast to the 3 channels
        if self.mirror:
            img = img[:, ::-1]
        part = np.rot90(img, k=-self.turns) if self.turns else img
        top, end = row, row + rgb.shape[0]
        flip = self.height - end, self.height - top    # where the rows go when turned over
        if self.turns == 0:
            self.image[top:end] = part
        elif self.turns == 1:       # 90 clockwise: rows become columns, the first rightmost
            self.image[:, flip[0]:flip[1]] = part
        elif self.turns == 2:
            self.image[flip[0]:flip[1]] = part
        else:                       # 270: rows become columns, the first leftmost
            self.image[:, top:end] = part


def encode(img: np.ndarray, fmt: str, quality: int = 90) -> bytes:
    """Encode ``(h, w, 3)`` or ``(h, w)`` uint8 as ``"jpg"``, ``"png"`` or ``"webp"`` (imagecodecs).

    ``quality``: JPEG quality (1..100); WebP is lossless (``quality`` its effort), at
    most 16382 pixels a side (imagecodecs refuses 16383, libwebp's own limit).
    """
    import imagecodecs

    if fmt == "jpg":
        return bytes(imagecodecs.jpeg8_encode(img, level=quality))
    if fmt == "png":
        return bytes(imagecodecs.png_encode(img, level=3))
    if fmt == "webp":
        if img.ndim == 2:
            img = np.repeat(img[..., None], 3, axis=2)
        # lossless (imagecodecs' default when ``lossless`` is not given; ``level`` is then its
        # effort); method 0: the same pixels as the default 4 with half the memory, 6x faster
        return bytes(imagecodecs.webp_encode(img, level=quality, method=0))
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
