"""Region reading: validate a request, plan the tiles it touches, decode them in parallel.

The path of one region read:

1. :func:`read_region` validates everything before any I/O: level index,
   integer location and positive integer size, mode, ``out`` buffer (shape,
   dtype, contiguity, writability) and the pixel/byte limits of
   :mod:`wsitool.settings` (raising :class:`ResourceLimitError` before any
   allocation).
2. The level-0 location is mapped to the level's frame by taking the nearest
   level pixel, ``floor(x / downsample + 0.5)`` (the pixel OpenSlide weights
   most: OpenSlide blends neighbouring pixels for sub-pixel positions, wsitool
   never resamples); the part of the region inside the level is
   computed, the parts outside are filled with transparent black (RGBA
   ``0, 0, 0, 0``; 0 in ``rgb`` and ``raw`` modes).
3. Every tile the inside part touches becomes one job with a source rectangle
   (in tile pixels) and a destination sub-view of the output.  The kernel is
   asked to read the tiles' bytes ahead (``posix_fadvise``), then the jobs are
   shared by ``threads`` workers (the calling thread plus workers of a shared
   pool), each taking the next job as soon as it is free.
4. Each job reads its bytes with one ``os.preadv`` into the thread's reusable
   buffer, behind the JPEG tables (:func:`~wsitool.decode.read_tile_stream`),
   and decodes through the calling thread's own decoder (:mod:`wsitool.decode`):
   whole interior tiles straight into the output sub-view, partial tiles as a
   sub-region of the code stream straight into the output, and only RGBA
   output or colour transforms go through a per-thread scratch buffer.

Output modes:

* ``"rgb"``: ``(height, width, 3)`` uint8 -- the fast path (decoded in place).
* ``"rgba"``: ``(height, width, 4)`` uint8, OpenSlide's layout; alpha is 255
  inside the slide and 0 outside it and on missing tiles.  nvImageCodec's CPU
  backend cannot decode into 4-channel strided buffers (we saw it write the
  wrong pixels), so RGBA decodes each tile into a per-thread RGB scratch buffer
  (hot in cache) and widens it to RGBA in one vectorised pass (:func:`_widen_rgba`);
  measured on 240 x 240 JPEG tiles that pass costs about a sixth of a tile
  decode, mostly the writing of the wider pixels to memory.
* ``"raw"``: ``(height, width, samples)`` in the level's native dtype (e.g.
  uint16, byte order native), values exactly as stored.

Conversion of non-RGB data to 8-bit RGB (``rgb`` / ``rgba`` modes), see
:func:`to_rgb8`: integer samples are scaled linearly,
``round(v * 255 / (2**BitsPerSample - 1))`` (so 16-bit 65535 -> 255); floats
are clipped to [0, 1] and scaled by 255; one-sample images (MinIsBlack) are
replicated to grey RGB, MinIsWhite is inverted; palette images go through
their ColorMap; CMYK (photometric Separated, InkSet CMYK, 4 samples) becomes
``R = 255 (1 - C)(1 - K)`` etc.; an ExtraSamples alpha channel becomes alpha.

CMYK sample convention: inside a TIFF the samples mean what TIFF 6.0
section 16 says (0 = no ink, 2**bits - 1 = full ink), whatever the codec.  For
JPEG-compressed CMYK tiles the decoder (libjpeg via imagecodecs) returns the
stored components; an Adobe APP14 marker with transform 2 (YCCK) is turned
into CMYK by the decoder, transform 0 means the components are CMYK as stored.
The "inverted CMYK" habit of stand-alone Adobe Photoshop JPEG files is *not*
applied: it is not signalled by any marker field (libjpeg writes the same
APP14 for plain CMYK) and it contradicts the TIFF definition of the samples.
Levels whose photometric interpretation has no RGB conversion (CIELab,
Separated inks other than CMYK, ...) are refused in ``rgb`` / ``rgba`` modes
with :class:`~wsitool.errors.UnsupportedFormatError`; ``raw`` reads them.
"""

from __future__ import annotations

import math
import numbers
import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from . import decode as _decode
from . import native
from .decode import (
    _decode_checked,
    _ThreadState,
    check_decoded,
    check_tile_limit,
    count_decoded,
    decode_array,
    decode_into,
    get_pool,
    nvimgcodec,
    plan_decode,
    read_tile_stream,
)
from .errors import (
    InvalidRegionError,
    ResourceLimitError,
    TileDecodeError,
    UnsupportedFormatError,
    WsiError,
    descriptors_exhausted,
)
from .settings import get_limits

if TYPE_CHECKING:  # pragma: no cover
    from .slide import Level, Slide

__all__ = ["read_region", "to_rgb8", "TileWarning", "output_shape"]

_MODES = ("rgba", "rgb", "raw")


class TileWarning(UserWarning):
    """Emitted when ``on_error="fill"`` replaced a corrupt tile by background."""


_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _forget_executor_after_fork() -> None:
    """In a forked child: the parent's worker threads do not exist there, so a
    read with ``threads > 1`` would wait for them forever; start afresh."""
    global _executor, _executor_lock
    _executor = None
    _executor_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_executor_after_fork)


def _get_executor() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(
                max_workers=max(4, os.cpu_count() or 1), thread_name_prefix="wsitool-decode"
            )
        return _executor


def _as_int(value, what: str, path: str) -> int:
    if type(value) is int:  # the common case, without the ABC checks below
        return value
    if isinstance(value, (bool, np.bool_)):
        raise InvalidRegionError(f"{path}: {what} must be an integer, got {value!r}")
    if not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and float(value).is_integer():
            return int(value)
        raise InvalidRegionError(f"{path}: {what} must be an integer, got {value!r}")
    return int(value)


def _pair(value, what: str, path: str) -> tuple[int, int]:
    try:
        a, b = value
    except (TypeError, ValueError):
        raise InvalidRegionError(f"{path}: {what} must be a pair of integers, got {value!r}") from None
    return _as_int(a, what, path), _as_int(b, what, path)


def output_shape(level: "Level", size: tuple[int, int], mode: str) -> tuple[tuple[int, int, int], np.dtype]:
    """``((height, width, channels), dtype)`` of a read of ``size`` in ``mode``."""
    w, h = size
    if mode == "raw":
        return (h, w, level.samples), level.dtype
    return (h, w, 4 if mode == "rgba" else 3), np.dtype(np.uint8)


def level_index(slide: "Slide", level) -> int:
    """``level`` as an int index of ``slide``'s levels.

    Raises:
        InvalidRegionError: not an integer, or not in ``0 .. level_count - 1``.
    """
    lvl = _as_int(level, "level", slide.path)
    if not 0 <= lvl < slide.level_count:
        raise InvalidRegionError(
            f"{slide.path}: level {lvl} out of range (the slide has {slide.level_count} level(s): "
            f"0..{slide.level_count - 1})"
        )
    return lvl


def validate_request(slide: "Slide", location, level, size, mode: str):
    """Check a region request; return ``(Level, x, y, w, h)``.

    Raises:
        InvalidRegionError: bad level, location, size or mode.
        UnsupportedFormatError: ``rgb`` / ``rgba`` requested for samples without
            an RGB conversion (see :func:`to_rgb8`), or the level's compression
            has no decoder (``Level.compression_problem``).
        ResourceLimitError: the output would exceed the configured limits.
        WsiError: the slide is closed.
    """
    path = slide.path
    if slide.closed:
        raise WsiError(f"{path}: slide is closed")
    if mode not in _MODES:
        raise InvalidRegionError(f"{path}: mode must be one of {_MODES}, got {mode!r}")
    lvl = level_index(slide, level)
    x, y = _pair(location, "location", path)
    w, h = _pair(size, "size", path)
    if w <= 0 or h <= 0:
        raise InvalidRegionError(f"{path}: size must be positive, got {w}x{h}")
    lv = slide.levels[lvl]
    if lv.compression_problem:
        raise UnsupportedFormatError(f"{path}: level {lvl}: {lv.compression_problem}")
    if mode != "raw" and lv._rgb_problem:
        raise UnsupportedFormatError(
            f"{path}: level {lvl}: {lv._rgb_problem} (read it with mode='raw')"
        )
    shape, dtype = output_shape(lv, (w, h), mode)
    lim = get_limits()
    pixels = w * h
    nbytes = pixels * shape[2] * dtype.itemsize
    if pixels > lim.max_region_pixels:
        raise ResourceLimitError(
            f"{path}: region {w}x{h} ({pixels} pixels) exceeds the max_region_pixels limit "
            f"{lim.max_region_pixels} (raise it with wsitool.set_limits or --max-pixels)"
        )
    if nbytes > lim.max_region_bytes:
        raise ResourceLimitError(
            f"{path}: region {w}x{h} needs {nbytes} bytes, over the max_region_bytes limit "
            f"{lim.max_region_bytes}"
        )
    check_tile_limit(lv)
    return lv, x, y, w, h


def _check_out(out, shape, dtype, path: str, array_type: type = np.ndarray,
               type_name: str = "numpy.ndarray"):
    """Check a caller's ``out`` buffer (numpy, or CuPy for ``device="cuda"``)."""
    if not isinstance(out, array_type):
        raise InvalidRegionError(f"{path}: out must be a {type_name}, got {type(out).__name__}")
    if out.shape != shape or out.dtype != dtype:
        raise InvalidRegionError(
            f"{path}: out has shape {out.shape} dtype {out.dtype}; expected {shape} {dtype}"
        )
    # CuPy arrays have no "writeable" flag (device memory is always writable).
    if not out.flags.c_contiguous or not getattr(out.flags, "writeable", True):
        raise InvalidRegionError(f"{path}: out must be C-contiguous and writeable")
    return out


def read_region(slide: "Slide", location, level, size, *, out=None, mode: str = "rgba",
                threads: int | None = None, on_error: str = "raise", device: str = "cpu"):
    """Read a region of a slide into a new or caller-provided array.

    Args:
        slide: an open :class:`~wsitool.slide.Slide`.
        location: ``(x, y)`` of the top-left pixel in the level-0 reference
            frame; may be negative or beyond the slide.
        level: level index, ``0 <= level < slide.level_count``.
        size: ``(width, height)`` in pixels of ``level``, both > 0.
        out: optional output array; must be C-contiguous, writeable, of the
            exact shape and dtype of the result (see ``mode``).  It is filled in
            place and returned; tiles are decoded straight into it.
        mode: ``"rgba"`` -> ``(height, width, 4)`` uint8 (default);
            ``"rgb"`` -> ``(height, width, 3)`` uint8 (fastest);
            ``"raw"`` -> ``(height, width, samples)`` in the level's dtype.
        threads: number of threads decoding this region (default: the CPU count).
        on_error: ``"raise"`` (default) raises :class:`TileDecodeError` for a
            corrupt tile; ``"fill"`` fills it with background (transparent),
            emits a :class:`TileWarning` and counts it in the decoder statistics
            (``tiles_failed``).
        device: ``"cpu"``; ``"cuda"`` returns a CuPy array (see :mod:`wsitool.gpu`).

    Returns:
        The region; pixels outside the slide and missing tiles (offset or byte
        count 0) are 0 with alpha 0.

    Raises:
        InvalidRegionError: malformed request or ``out`` (also a ``ValueError``).
        ResourceLimitError: output over the configured limits (before allocating).
        UnsupportedFormatError: ``rgb`` / ``rgba`` for samples without an RGB
            conversion (e.g. CIELab); use ``mode="raw"``.
        TileDecodeError: a corrupt tile, with ``on_error="raise"``.
        DeviceUnavailableError: ``device="cuda"`` without a usable GPU.
    """
    if on_error not in ("raise", "fill"):
        raise InvalidRegionError(f"{slide.path}: on_error must be 'raise' or 'fill', got {on_error!r}")
    lv, x, y, w, h = validate_request(slide, location, level, size, mode)
    if threads is not None:
        threads = _as_int(threads, "threads", slide.path)
        if threads < 1:
            raise InvalidRegionError(f"{slide.path}: threads must be >= 1, got {threads}")
    if device != "cpu":
        from .gpu import read_region_cuda

        with slide._reading():
            return read_region_cuda(slide, lv, x, y, w, h, out=out, mode=mode, threads=threads,
                                    on_error=on_error, device=device)
    shape, dtype = output_shape(lv, (w, h), mode)
    if out is None:
        out = np.empty(shape, dtype)
    else:
        _check_out(out, shape, dtype, slide.path)
    with slide._reading():
        _fill_region(lv, x, y, w, h, out, mode, threads, on_error, get_pool("cpu"))
    return out


def level_rect(lv: "Level", x: int, y: int) -> tuple[int, int]:
    """Map a level-0 location to the level's frame: ``floor(x / downsample + 0.5)``."""
    if lv.index == 0:
        return x, y
    return math.floor(x / lv.downsample + 0.5), math.floor(y / lv.downsample + 0.5)


def level0_coordinate(t: int, downsample: float) -> int:
    """Smallest level-0 coordinate that :func:`level_rect` maps to level coordinate ``t``.

    The inverse of ``floor(x / downsample + 0.5)``: ``ceil((t - 0.5) * downsample)``
    (exact for ``downsample >= 1``, which every level has).  Used to aim reads
    at a given level pixel (export strips, Dask chunks).
    """
    if downsample == 1.0:
        return t
    x = math.ceil((t - 0.5) * downsample)
    while math.floor((x - 1) / downsample + 0.5) >= t:  # guard float rounding
        x -= 1
    while math.floor(x / downsample + 0.5) < t:
        x += 1
    return x


def plan_tiles(lv: "Level", rx: int, ry: int, w: int, h: int, jobs: bool = True):
    """Tiles touched by the region ``[rx, rx + w) x [ry, ry + h)`` of level ``lv``.

    Returns ``(inside, jobs)``: ``inside`` is ``(cx0, cy0, cx1, cy1)``, the part
    of the region inside the level in level pixels (or None); ``jobs`` is a
    list of ``(col, row, (sx0, sy0, sx1, sy1), (dy0, dy1, dx0, dx1))`` with the
    source rectangle in tile pixels and the destination slice in output pixels
    (an empty list when called with ``jobs=False``).
    """
    cx0, cy0 = max(rx, 0), max(ry, 0)
    cx1, cy1 = min(rx + w, lv.width), min(ry + h, lv.height)
    if cx0 >= cx1 or cy0 >= cy1:
        return None, []
    if not jobs:
        return (cx0, cy0, cx1, cy1), []
    tw, th = lv.tile_width, lv.tile_height
    jobs = []
    for row in range(cy0 // th, (cy1 - 1) // th + 1):
        ty0 = row * th
        oy0, oy1 = max(ty0, cy0), min(ty0 + th, cy1)
        for col in range(cx0 // tw, (cx1 - 1) // tw + 1):
            tx0 = col * tw
            ox0, ox1 = max(tx0, cx0), min(tx0 + tw, cx1)
            jobs.append((col, row, (ox0 - tx0, oy0 - ty0, ox1 - tx0, oy1 - ty0),
                         (oy0 - ry, oy1 - ry, ox0 - rx, ox1 - rx)))
    return (cx0, cy0, cx1, cy1), jobs


def _fill_outside(out: np.ndarray, rx: int, ry: int, inside) -> None:
    if inside is None:
        out[...] = 0
        return
    cx0, cy0, cx1, cy1 = inside
    top, bottom = cy0 - ry, cy1 - ry
    left, right = cx0 - rx, cx1 - rx
    if top == 0 and left == 0 and bottom == out.shape[0] and right == out.shape[1]:
        return  # the region lies inside the level (the common case)
    out[:top] = 0
    out[bottom:] = 0
    out[top:bottom, :left] = 0
    out[top:bottom, right:] = 0


#: Regions touching fewer tiles are not prefetched (the first decode would
#: wait for its bytes anyway, and the advice calls cost more than they save).
_PREFETCH_MIN_TILES = 8


def _prefetch(lv: "Level", c0: int, c1: int, r0: int, r1: int) -> None:
    """Ask the kernel to start reading the tile bytes of columns ``c0..c1`` and
    rows ``r0..r1`` (inclusive) of ``lv``'s grid (``POSIX_FADV_WILLNEED``).

    The read-ahead runs while the first tiles decode, so a cold file's reads
    overlap the decodes; on a cached file it costs one cheap call per tile row
    of the region (the tiles of one grid row are usually adjacent in the file;
    when they are not, each tile gets its own call).  Advisory only: errors are
    ignored.
    """
    if lv._fd < 0 or lv._planes != 1:
        return
    offsets, counts, across = lv._offsets, lv._bytecounts, lv.tiles_across
    try:
        for row in range(r0, r1 + 1):
            i0, i1 = row * across + c0, row * across + c1 + 1
            offs = offsets[i0:i1]
            ends = offs + counts[i0:i1]
            lo, hi = int(offs.min()), int(ends.max())
            if lo > 0 and hi - lo <= 2 * int(counts[i0:i1].sum()):
                os.posix_fadvise(lv._fd, lo, hi - lo, os.POSIX_FADV_WILLNEED)
            else:
                for off, end in zip(offs.tolist(), ends.tolist()):
                    if off:
                        os.posix_fadvise(lv._fd, off, end - off, os.POSIX_FADV_WILLNEED)
    except (OSError, OverflowError):  # pragma: no cover - advisory only
        pass


def _fill_region(lv: "Level", x: int, y: int, w: int, h: int, out: np.ndarray, mode: str,
                 threads: int | None, on_error: str, pool) -> None:
    """Decode every tile of the region into ``out`` (already validated).

    Work distribution: the jobs sit in one shared iterator; each of the ``k``
    threads (the caller plus ``k - 1`` pool workers) takes the next job when it
    has finished its last one, so threads that drew cheap partial tiles do not
    wait idle for one that drew whole ones.  Where the compiled JPEG tile loop
    applies (:func:`wsitool.native.applies`) the same plan runs through it
    (:func:`_fill_region_native`); else on :class:`_TileWorker`, the reference.
    """
    rx, ry = level_rect(lv, x, y)
    if native.applies(lv, mode, out):
        _fill_region_native(lv, rx, ry, w, h, out, mode, threads, on_error, pool)
        return
    inside, jobs = plan_tiles(lv, rx, ry, w, h)
    _fill_outside(out, rx, ry, inside)
    if not jobs:
        return
    if len(jobs) >= _PREFETCH_MIN_TILES and hasattr(os, "posix_fadvise"):
        _prefetch(lv, jobs[0][0], jobs[-1][0], jobs[0][1], jobs[-1][1])
    k = _thread_count(threads, len(jobs))
    # JPEG 2000 tiles are not batched: each takes milliseconds to decode, so
    # one call per tile costs nothing measurable, and handing out single tiles
    # keeps the threads evenly loaded (2 threads, 1024 x 1024 regions of
    # 256 x 256 tiles: 25.4 MP/s with batches of 6, 29.0 MP/s tile by tile
    # even for RGBA).
    batch = 1 if lv._stream_kind == "j2k" else _batch_size(BATCH_TILES, k, len(jobs))
    worker = _TileWorker(lv, out, mode, on_error, pool, batch)
    if k == 1:
        worker.run(jobs)
        return
    shared = _SharedJobs(jobs)
    _run_threads(k, lambda: worker.run(shared), shared.stop)


def _thread_count(threads: int | None, njobs: int) -> int:
    """Threads for a region of ``njobs`` tiles: ``threads`` (default: the CPU count), at most one per tile."""
    nthreads = threads if threads is not None else (os.cpu_count() or 1)
    return max(1, min(nthreads, njobs))


def _batch_size(most: int, k: int, njobs: int, per_thread: int = 2) -> int:
    """Tiles per decode call: up to ``most``, but small enough that each of
    ``k`` threads gets about ``per_thread`` batches (so the shared queue still
    balances the work, also when the threads do not run equally fast)."""
    return most if k == 1 else max(1, min(most, njobs // (per_thread * k)))


def _run_threads(k: int, work, stop) -> None:
    """Run ``work()`` on the calling thread and ``k - 1`` pool threads; wait for
    all, call ``stop()`` after the first error and re-raise that error."""
    if k == 1:
        work()
        return
    executor = _get_executor()
    futures = [executor.submit(work) for _ in range(k - 1)]
    first_error: BaseException | None = None
    try:
        work()
    except BaseException as exc:  # wait for the others before raising
        first_error = exc
        stop()
    for fut in futures:
        exc = fut.exception()
        if exc is not None and first_error is None:
            first_error = exc
            stop()
    if first_error is not None:
        raise first_error


#: Tiles per call of the compiled loop (and per nvImageCodec decode call):
#: RGB decodes straight into the output; RGBA decodes into one RGB scratch per
#: tile of the batch and widens it, so a small batch keeps the scratch in cache
#: (1024 x 1024 regions, one thread: batch 4 at 1.06x the decode floor, 16 at 1.04x).
NATIVE_BATCH_RGB = 16
NATIVE_BATCH_RGBA = 4
#: Largest RGB tile (bytes) decoded in RGBA batches; bigger ones go one by one.
_NATIVE_RGBA_BATCH_BYTES = 1 << 20


def _fill_region_native(lv: "Level", rx: int, ry: int, w: int, h: int, out: np.ndarray,
                        mode: str, threads: int | None, on_error: str, pool) -> None:
    """:func:`_fill_region` through the compiled JPEG tile loop (see :mod:`wsitool.native`):
    the same tiles, threads, batches, checks and counters, one C call per batch."""
    inside, _ = plan_tiles(lv, rx, ry, w, h, jobs=False)
    _fill_outside(out, rx, ry, inside)
    if inside is None:
        return
    most = NATIVE_BATCH_RGB
    if mode == "rgba":
        # one RGB scratch per tile of a batch: big tiles go one at a time, so
        # the scratch stays one tile (peak memory near the output's size)
        most = NATIVE_BATCH_RGBA if lv.tile_width * lv.tile_height * 3 <= _NATIVE_RGBA_BATCH_BYTES else 1
    region = native.RegionJobs(lv, out, rx, ry, inside, on_error)
    if region.count >= _PREFETCH_MIN_TILES and hasattr(os, "posix_fadvise"):
        _prefetch(lv, region.c0, region.c0 + region.ncols - 1, region.r0, region.r0 + region.nrows - 1)
    k = _thread_count(threads, region.count)
    # A call of the compiled loop costs a few microseconds: smaller chunks than
    # the Python path's balance the threads better (2 threads, 1024 x 1024
    # regions of 240 x 240 tiles: 249 MP/s with about 4 chunks per thread, 241
    # with 2).
    region.chunk = min(_batch_size(most, k, region.count, per_thread=4), native.MAX_CHUNK)
    _run_threads(k, lambda: region.run(pool), region.stop)


class _SharedJobs:
    """Iterator over a job list shared by several threads (each job handed out once)."""

    def __init__(self, jobs):
        self._jobs = jobs
        self._next = 0
        self._lock = threading.Lock()

    def stop(self) -> None:
        """Hand out no more jobs (after an error: fail fast)."""
        with self._lock:
            self._next = len(self._jobs)

    def __iter__(self):
        return self

    def __next__(self):
        with self._lock:
            i = self._next
            if i >= len(self._jobs):
                raise StopIteration
            self._next = i + 1
        return self._jobs[i]


#: Most tiles one thread hands to nvImageCodec in one decode call.  One call per
#: batch instead of one per tile saves the per-call cost on both sides of the
#: Python/C++ boundary (measured here: about 8 % of a 1024 x 1024 read of
#: 240 x 240 JPEG tiles on one thread).
BATCH_TILES = 16

#: Alpha byte of an RGBA pixel read as a little-endian 32-bit word.
_OPAQUE = np.uint32(0xFF000000)


def tile_failed(exc: TileDecodeError, on_error: str, stats) -> None:
    """Count a failed tile in ``stats``; re-raise ``exc`` or, for ``on_error="fill"``,
    emit it as a :class:`TileWarning` (the caller then fills the tile with background).

    A decoder that failed because the process is out of file descriptors or
    memory is not a bad tile: that raises the OSError (EMFILE, ENOMEM, ...)
    instead, whatever ``on_error`` says (see :func:`wsitool.errors.descriptors_exhausted`).
    """
    exhausted = descriptors_exhausted(getattr(exc, "path", None))
    if exhausted is not None:
        raise exhausted from None
    stats.tiles_failed += 1
    if on_error != "fill":
        raise exc
    warnings.warn(str(exc), TileWarning, stacklevel=3)


class _TileWorker:
    """Decodes a list of tile jobs of one region (runs on any thread)."""

    def __init__(self, lv: "Level", out: np.ndarray, mode: str, on_error: str, pool,
                 batch: int = 1):
        self.lv = lv
        self.out = out
        self.mode = mode
        self.on_error = on_error
        self.pool = pool
        # Decode straight into the output: 3-channel uint8 output, no colour transform.
        self.in_place = mode in ("rgb", "raw") and not lv._ycbcr_after_decode
        # RGBA from an RGB decode: the tile is decoded into a per-thread RGB
        # scratch and widened to RGBA in one vectorised pass (see _widen_rgba).
        self.rgba = mode == "rgba" and not lv._ycbcr_after_decode and lv._codec == "nv"
        if self.rgba:
            h, w = out.shape[:2]
            self.out32 = out.view("<u4").reshape(h, w)
        # Batched decoding for tiles decoded straight into the output (RGBA
        # keeps one decode per tile: a batch would need one RGB scratch per
        # tile of the batch, megabytes per thread).  The test switches that
        # force the scratch path turn it off.
        self.batch = batch if (
            batch > 1 and lv._codec == "nv" and self.in_place
            and not _decode.FORCE_SCRATCH and _decode.USE_ROI_DECODE
        ) else 0

    def run(self, jobs) -> None:
        state = self.pool.state()
        if self.batch:
            self._run_batched(jobs, state)
            return
        for job in jobs:
            try:
                self._one(job, state)
            except TileDecodeError as exc:
                self._failed(exc, job, state)

    def _failed(self, exc: TileDecodeError, job, state: _ThreadState) -> None:
        tile_failed(exc, self.on_error, state.stats)
        dy0, dy1, dx0, dx1 = job[3]
        self.out[dy0:dy1, dx0:dx1] = 0

    def _run_batched(self, jobs, state: _ThreadState) -> None:
        """Same work and checks as :meth:`_one` per job, but the decodes of up to
        ``self.batch`` tiles go to nvImageCodec in one call (a list of code
        streams and a list of destination images).

        The destinations are described to nvImageCodec by :class:`_Block`
        objects (the output's address plus offsets) instead of numpy sub-views:
        wrapping a numpy view costs about 2 microseconds more per tile, for the
        ``__array_interface__`` dict numpy builds on each access."""
        lv = self.lv
        out = self.out
        base = out.__array_interface__["data"][0]
        typestr = out.dtype.str
        channels = out.shape[2]
        # The strides of the C-contiguous layout, computed rather than taken
        # from ``out.strides``: numpy calls an array C-contiguous whatever the
        # stride of a length-1 axis (a transposed (h, 1, 3) buffer, say), and
        # nvImageCodec refuses any pixel stride that is not packed.
        strides = (out.shape[1] * channels * out.itemsize, channels * out.itemsize, out.itemsize)
        s0, s1 = strides[0], strides[1]
        across = lv.tiles_across
        pending: list[tuple] = []
        for job in jobs:
            col, row, src, (dy0, dy1, dx0, dx1) = job
            try:
                data = read_tile_stream(lv, row * across + col, col, row, state, len(pending))
                if data is None:
                    _missing(out[dy0:dy1, dx0:dx1], state)
                    continue
                cs, how, _size = plan_decode(lv, col, row, data, src, complete=True)
            except TileDecodeError as exc:
                if pending and self.on_error != "fill":
                    # an earlier tile's decode error comes first (tile order)
                    self._flush(pending, state)
                    pending = []
                self._failed(exc, job, state)
                continue
            shape = (dy1 - dy0, dx1 - dx0, channels)
            pending.append((job, cs, how, shape,
                            _Block(out, base + dy0 * s0 + dx0 * s1, shape, strides, typestr)))
            if len(pending) == self.batch:
                self._flush(pending, state)
                pending = []
        if pending:
            self._flush(pending, state)

    def _flush(self, pending: list[tuple], state: _ThreadState) -> None:
        lv = self.lv
        as_image = nvimgcodec.as_image  # (one call per block: faster than as_images here)
        images = [None] * len(pending)
        with state.lock:
            try:
                images = [as_image(p[4]) for p in pending]
                results = state.decoder.decode([p[1] for p in pending], images=images,
                                                   params=_decode.TILE_DECODE_PARAMS)
            except Exception:  # one bad stream failed the call: decode one by one
                results = None
        if results is None or len(results) != len(pending):
            results = [None] * len(pending)
            retry = True
        else:
            retry = False
        stats = state.stats
        for (job, cs, how, shape, _block), image, result in zip(pending, images, results):
            try:
                if retry:
                    dy0, dy1, dx0, dx1 = job[3]
                    _decode_checked(lv, job[0], job[1], cs, self.out[dy0:dy1, dx0:dx1], state)
                else:
                    check_decoded(lv, job[0], job[1], result, image, shape)
            except TileDecodeError as exc:
                self._failed(exc, job, state)
                continue
            count_decoded(stats, how)

    def _one(self, job, state: _ThreadState) -> None:
        lv = self.lv
        col, row, src, (dy0, dy1, dx0, dx1) = job
        dst = self.out[dy0:dy1, dx0:dx1]
        if lv._codec == "nv":
            data = read_tile_stream(lv, row * lv.tiles_across + col, col, row, state)
            if data is None:
                _missing(dst, state)
                return
            if self.in_place:
                decode_into(lv, col, row, data, dst, src, state, complete=True)
                return
            if self.rgba:
                h, w = dy1 - dy0, dx1 - dx0
                flat, rgb, image = state.tile_rgb(lv.tile_height, lv.tile_width, h, w)
                decode_into(lv, col, row, data, rgb, src, state, caller_buffer=False,
                            complete=True, image=image)
                _widen_rgba(flat, h, w, self.out32[dy0:dy1, dx0:dx1])
                return
            scratch = state.scratch((lv.tile_height, lv.tile_width, 3))
            rgb = scratch[: dy1 - dy0, : dx1 - dx0]
            decode_into(lv, col, row, data, rgb, src, state, caller_buffer=False,
                        complete=True)
            if lv._ycbcr_after_decode:
                rgb = ycbcr_to_rgb(rgb)
            if self.mode == "raw":
                dst[...] = rgb
                return
            dst[..., :3] = rgb
            if self.mode == "rgba":
                dst[..., 3] = 255
            return
        arr = decode_array(lv, col, row, state)
        if arr is None:
            _missing(dst, state)
            return
        sx0, sy0, sx1, sy1 = src
        sub = arr[sy0:sy1, sx0:sx1]
        if self.mode == "raw":
            dst[...] = sub
            return
        rgb, alpha = to_rgb8(sub, lv._photometric_code, lv._bits, lv._colormap, lv._extrasamples)
        dst[..., :3] = rgb
        if self.mode == "rgba":
            dst[..., 3] = 255 if alpha is None else alpha


class _Block:
    """A strided block of a host array, described by ``__array_interface__``
    (numpy's array interface protocol, version 3) for ``nvimgcodec.as_image``.

    ``owner`` is the C-contiguous array the block lies in: the block keeps it
    alive, and the nvImageCodec image keeps the block alive.  ``address`` is the
    block's first byte; ``shape`` is ``(height, width, channels)``; ``strides``
    (bytes) are those of the owner's C-contiguous layout; ``typestr`` is the
    owner's dtype string (e.g. ``"|u1"``).
    """

    __slots__ = ("__array_interface__", "owner")

    def __init__(self, owner: np.ndarray, address: int, shape: tuple, strides: tuple,
                 typestr: str):
        self.owner = owner
        self.__array_interface__ = {"version": 3, "shape": shape, "typestr": typestr,
                                    "data": (address, False), "strides": strides}


def _missing(dst: np.ndarray, state: _ThreadState) -> None:
    """A missing tile (offset or byte count 0): transparent background, counted."""
    state.stats.tiles_missing += 1
    dst[...] = 0


def _widen_rgba(flat: np.ndarray, h: int, w: int, dst32: np.ndarray) -> None:
    """Write the ``(h, w, 3)`` RGB pixels at the start of ``flat`` as opaque RGBA.

    ``flat`` is a 1-D uint8 buffer holding the packed RGB pixels followed by at
    least one spare byte; ``dst32`` is the ``(h, w)`` little-endian uint32 view of
    the RGBA destination.  Pixel ``i`` is read as the 32-bit word at byte ``3 i``
    (its R, G, B and one byte of the next pixel) and OR-ed with ``0xFF000000``,
    which replaces that fourth byte by alpha 255: one vectorised pass instead
    of a 3-of-4-channel strided copy plus an alpha fill (about 9x faster).
    """
    src32 = np.ndarray((h, w), dtype="<u4", buffer=flat, strides=(w * 3, 3))
    np.bitwise_or(src32, _OPAQUE, out=dst32)


def array_module(arr):
    """The array library of ``arr``: ``numpy``, or ``cupy`` for a CuPy array.

    CuPy is only imported when ``arr`` already is a CuPy array.
    """
    if isinstance(arr, np.ndarray):
        return np
    if type(arr).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def ycbcr_to_rgb(ycc):
    """Full-range YCbCr -> RGB (ITU-R BT.601 / JFIF coefficients), uint8 in and out.

    ``ycc`` is an ``(h, w, 3)`` uint8 numpy or CuPy array; the result is a new
    ``(h, w, 3)`` uint8 array of the same library (on the GPU for CuPy).
    Used for Aperio JPEG 2000 compression 33003, whose code streams hold
    YCbCr components without the JPEG 2000 colour transform.
    """
    xp = array_module(ycc)
    f = ycc.astype(xp.float32)
    y, cb, cr = f[..., 0], f[..., 1] - 128.0, f[..., 2] - 128.0
    rgb = xp.empty(ycc.shape[:2] + (3,), xp.float32)
    rgb[..., 0] = y + 1.402 * cr
    rgb[..., 1] = y - 0.344136 * cb - 0.714136 * cr
    rgb[..., 2] = y + 1.772 * cb
    return xp.clip(xp.rint(rgb), 0, 255).astype(xp.uint8)


def _to_uint8(arr: np.ndarray, bits: int) -> np.ndarray:
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8) * 255
    if np.issubdtype(arr.dtype, np.floating):
        return np.clip(np.rint(np.nan_to_num(arr.astype(np.float64)) * 255.0), 0, 255).astype(np.uint8)
    if np.issubdtype(arr.dtype, np.signedinteger):
        info = np.iinfo(arr.dtype)
        f = (arr.astype(np.float64) - info.min) * (255.0 / (info.max - info.min))
        return np.clip(np.rint(f), 0, 255).astype(np.uint8)
    bits = bits if 0 < bits <= arr.dtype.itemsize * 8 else arr.dtype.itemsize * 8
    maxv = float((1 << bits) - 1)
    return np.clip(np.rint(arr.astype(np.float64) * (255.0 / maxv)), 0, 255).astype(np.uint8)


def to_rgb8(arr: np.ndarray, photometric: int, bits: int, colormap=None,
            extrasamples: tuple = ()) -> tuple[np.ndarray, np.ndarray | None]:
    """Convert ``(h, w, samples)`` native pixels to ``(h, w, 3)`` uint8 RGB and optional alpha.

    Args:
        arr: decoded samples, any integer or float dtype.
        photometric: TIFF PhotometricInterpretation code (TIFF 6.0 section 3-6):
            0 MinIsWhite, 1 MinIsBlack, 2 RGB, 3 Palette, 5 Separated (CMYK).
        bits: BitsPerSample, for the linear scaling of integer samples.
        colormap: ``(3, 2**bits)`` uint16 ColorMap of palette images.
        extrasamples: ExtraSamples codes; 1 (associated) or 2 (unassociated)
            alpha make the first extra sample the alpha channel.

    Returns:
        ``(rgb, alpha)``: ``(h, w, 3)`` uint8 and ``(h, w)`` uint8 or None.
    """
    samples = arr.shape[2]
    if photometric == 3 and colormap is not None:
        lut = np.asarray(colormap)
        lut8 = (lut >> 8).astype(np.uint8) if lut.max() > 255 else lut.astype(np.uint8)
        idx = np.clip(arr[..., 0].astype(np.intp), 0, lut8.shape[1] - 1)
        return np.ascontiguousarray(lut8[:, idx].transpose(1, 2, 0)), None
    a8 = _to_uint8(arr, bits)
    alpha = None
    if photometric == 5 and samples >= 4:
        cmyk = a8[..., :4].astype(np.float32) / 255.0
        k = 1.0 - cmyk[..., 3:4]
        rgb = np.rint(255.0 * (1.0 - cmyk[..., :3]) * k)
        if samples > 4 and extrasamples and extrasamples[0] in (1, 2):
            alpha = a8[..., 4]
        return rgb.astype(np.uint8), alpha
    if samples >= 3 and photometric not in (0, 1):
        rgb = a8[..., :3]
        n_color = 3
    else:
        gray = a8[..., 0]
        if photometric == 0:
            gray = 255 - gray
        rgb = np.repeat(gray[..., None], 3, axis=2)
        n_color = 1
    if samples > n_color and extrasamples and extrasamples[0] in (1, 2):
        alpha = a8[..., n_color]
    return rgb, alpha
