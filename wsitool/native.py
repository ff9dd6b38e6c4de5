"""The compiled tile loop for JPEG levels (``wsitool._jpegloop``) and its Python face.

Why it exists: decoding a 240 x 240 JPEG tile takes about 300 us on one core,
and the Python path (:class:`wsitool.region._TileWorker`) spends another
30-37 us a tile around it: nvImageCodec's Python objects for the code stream,
the sub-region stream and the destination image, the ``preadv``, and
wsitool's own checks.  ``wsitool._jpegloop`` does the same work for a range of
a region's tiles in one C call, against nvImageCodec's C API, with the GIL
released: read each tile behind the level's JPEG prefix, check it, decode up
to ``batch`` tiles per ``nvimgcodecDecoderDecode`` call straight into the
output (sub-code-streams with a region for partial tiles), check each tile's
processing status.  RGBA output is decoded into a per-decoder RGB scratch and
widened in C.

It is an accelerator, never a requirement:

* it is built from ``wsitool/_native/jpegloop.c`` at install time when a C
  compiler and the nvImageCodec header are there, and skipped otherwise;
* at run time it is used only when the loaded ``libnvimgcodec`` reports the
  version of the header the extension was compiled with (the structure
  layouts are that header's); :func:`status` says why it is not used;
* ``WSITOOL_NATIVE=0`` in the environment, or :data:`ENABLED` set to False,
  keeps every read on the Python path.

The Python path stays the reference: ``tests/test_native.py`` pins this loop
to it pixel for pixel, counter for counter and error message for error
message, and wsitool uses it only where the two do the same thing (JPEG
levels decoded by nvImageCodec without a colour transform after decoding, one
sample plane, ``rgb`` / ``raw`` / ``rgba`` output, no test hook forcing the
scratch path).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

import numpy as np

from . import decode as _decode
from .errors import TileDecodeError

if TYPE_CHECKING:  # pragma: no cover
    from .slide import Level

#: Use the compiled loop where it applies (set False to force the Python path).
ENABLED = os.environ.get("WSITOOL_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")

# Failure codes of jpegloop.c.
_PAST_EOF, _SHORT_READ, _IO_ERROR, _NOT_SOI, _HEADER, _GRID, _OUTSIDE, _SUBSTREAM, _IMAGE, \
    _DECODE, _NO_SEGMENT, _NO_MEMORY = range(1, 13)

#: Most tiles one call of the compiled loop takes (``MAX_BATCH`` in jpegloop.c).
MAX_CHUNK = 64

_lock = threading.Lock()
_module = None
_reason: str | None = None
_tried = False


def _load():
    """Import and initialise ``wsitool._jpegloop`` once; None (with a reason) if unusable."""
    global _module, _reason, _tried
    with _lock:
        if _tried:
            return _module
        _tried = True
        try:
            from . import _jpegloop
        except ImportError:
            _reason = ("not built (was there a C compiler at install time? `pip install -v .` "
                       "shows the build log); JPEG reads take the Python path")
            return None
        base = os.path.dirname(_decode.nvimgcodec.__file__)
        lib = os.path.join(base, "libnvimgcodec.so.0")
        try:
            # Creating the instance loads nvImageCodec's extensions, which print
            # one line per missing GPU library; expected on CPU-only machines.
            with _decode._stderr_silenced():
                _jpegloop.load(lib, os.path.join(base, "extensions"))
        except (ImportError, OSError, RuntimeError) as exc:
            _reason = f"cannot use {lib} ({exc}); JPEG reads take the Python path"
            return None
        if _jpegloop.MAX_BATCH != MAX_CHUNK:  # pragma: no cover - a stale build
            _reason = f"the compiled loop is stale (MAX_BATCH {_jpegloop.MAX_BATCH}, expected {MAX_CHUNK})"
            return None
        _module = _jpegloop
        return _module


def status() -> str:
    """One line saying whether the compiled JPEG tile loop is in use, and if not, why."""
    if not ENABLED:
        return "off (WSITOOL_NATIVE=0 or wsitool.native.ENABLED = False)"
    mod = _load()
    if mod is None:
        return f"not in use: {_reason}"
    return f"in use (built against nvImageCodec {mod.HEADER_VERSION // 1000}.{mod.HEADER_VERSION % 1000 // 100}" \
           f".{mod.HEADER_VERSION % 100})"


def applies(lv: "Level", mode: str, out: np.ndarray) -> bool:
    """True when a region read of ``lv`` into ``out`` can take the compiled loop.

    That is: the loop is enabled and loaded; the level is JPEG decoded by
    nvImageCodec with no colour transform after decoding, one sample plane,
    an open file; ``mode`` is ``rgb``, ``raw`` or ``rgba``; ``out`` is a
    C-contiguous ``(h, w, 3)`` (``rgba``: ``(h, w, 4)``) uint8 numpy array; and
    neither test hook of :mod:`wsitool.decode` forces the scratch path.
    """
    if not ENABLED or lv._codec != "nv" or lv._stream_kind != "jpeg" or lv._ycbcr_after_decode:
        return False
    if lv._planes != 1 or lv._fd < 0 or mode not in ("rgb", "raw", "rgba"):
        return False
    if _decode.FORCE_SCRATCH or not _decode.USE_ROI_DECODE:
        return False
    if type(out) is not np.ndarray or out.dtype != np.uint8 or out.ndim != 3:
        return False
    if out.shape[2] != (4 if mode == "rgba" else 3) or not out.flags.c_contiguous:
        return False
    return _module is not None or _load() is not None


class RegionJobs:
    """The tiles of one region for the compiled loop, handed out in chunks.

    Jobs are numbered in row-major order over the region's tile grid, as in
    :func:`wsitool.region.plan_tiles`; a chunk is ``[j0, j1)``.

    Args:
        lv: the level (see :func:`applies`).
        out: the output, ``(h, w, 3 or 4)`` uint8, C-contiguous.
        rx, ry: the region's top-left corner in level pixels.
        inside: ``(cx0, cy0, cx1, cy1)``, the part of the region inside the
            level in level pixels (from ``plan_tiles``).
        on_error: ``"raise"`` or ``"fill"`` (see :func:`wsitool.read_region`).
    """

    def __init__(self, lv: "Level", out: np.ndarray, rx: int, ry: int, inside, on_error: str):
        self.lv = lv
        self.out = out
        self.region = (rx, ry) + tuple(inside)
        cx0, cy0, cx1, cy1 = inside
        tw, th = lv.tile_width, lv.tile_height
        self.c0, self.r0 = cx0 // tw, cy0 // th
        self.ncols = (cx1 - 1) // tw - self.c0 + 1
        self.nrows = (cy1 - 1) // th - self.r0 + 1
        self.count = self.ncols * self.nrows
        #: Tiles per call (and per nvImageCodec decode call), 1..MAX_CHUNK; set by the caller.
        self.chunk = 1
        self.on_error = on_error
        self.level = (tw, th, lv.width, lv.height, lv.tiles_across, lv._file_size)
        self.prefix = lv._jpeg_prefix or b""
        self._next = 0
        self._lock = threading.Lock()

    def stop(self) -> None:
        """Hand out no more chunks (after an error: fail fast)."""
        with self._lock:
            self._next = self.count

    def _take(self) -> tuple[int, int] | None:
        with self._lock:
            j0 = self._next
            if j0 >= self.count:
                return None
            self._next = j1 = min(j0 + self.chunk, self.count)
        return j0, j1

    def run(self, pool) -> None:
        """Decode chunks on the calling thread until none is left.

        Raises:
            TileDecodeError: the first failed tile of a chunk, with
                ``on_error="raise"`` (the other tiles of that chunk are
                decoded; failed ones are zero-filled).
            OSError: a read of the slide file failed (as ``os.preadv`` would).
            MemoryError: a tile's read buffer could not be allocated.
        """
        state = pool.state()
        lv = self.lv
        offsets, counts = lv._offsets, lv._bytecounts  # C-contiguous uint64 (slide.Level)
        while True:
            span = self._take()
            if span is None:
                return
            with state.lock:
                dec = state.native_decoder()
                direct, roi, scratch, missing, nbytes, decoded, allocs, failures = dec.decode_tiles(
                    lv._fd, self.prefix, self.out, offsets, counts, self.level, self.region,
                    span[0], span[1], self.chunk)
            st = state.stats
            st.tiles_direct += direct
            st.tiles_roi += roi
            st.tiles_scratch += scratch
            st.tiles_missing += missing
            st.bytes_read += nbytes
            st.tiles_decoded += decoded
            st.scratch_allocations += allocs  # the decoder's tile-bytes and RGB buffers
            # (the C loop reports read-time failures before the decode failures
            # of earlier tiles of the same batch: report in tile order)
            for job, code, a, b in sorted(failures):
                self._failed(job, code, a, b, state)

    def _failed(self, job: int, code: int, a: int, b: int, state) -> None:
        """Raise or (``on_error="fill"``) count and warn for failure ``(job, code, a, b)``
        of the C loop, with the Python path's error and wording (the reason
        builders of :mod:`wsitool.decode`)."""
        from .region import plan_tiles, tile_failed

        lv = self.lv
        col, row = self.c0 + job % self.ncols, self.r0 + job // self.ncols
        if code == _IO_ERROR:
            raise OSError(a, os.strerror(a), lv._path)
        if code == _NO_MEMORY:
            raise MemoryError(f"{lv._path}: no memory for the bytes of tile ({col}, {row})")
        index = row * lv.tiles_across + col
        offset, count = int(lv._offsets[index]), int(lv._bytecounts[index])
        if code == _PAST_EOF:
            reason = _decode.past_eof_reason(offset, count, lv._file_size)
        elif code == _SHORT_READ:
            reason = _decode.short_read_reason(a, count, offset)
        elif code == _NOT_SOI:
            reason = _decode.not_soi_reason(a.to_bytes(2, "big")[-b:] if b else b"")
        elif code == _HEADER:
            reason = _decode.unreadable_header_reason(f"nvImageCodec status {a}")
        elif code == _GRID:
            reason = _decode.grid_reason(lv, a, b)
        elif code == _OUTSIDE:  # the job's source rectangle, as the Python path plans it
            rx, ry = self.region[:2]
            h, w = self.out.shape[:2]
            src = next(j[2] for j in plan_tiles(lv, rx, ry, w, h)[1] if j[:2] == (col, row))
            reason = _decode.outside_reason(src, a, b)
        elif code == _SUBSTREAM:
            reason = _decode.unusable_stream_reason(f"nvImageCodec status {a}")
        elif code == _IMAGE:
            reason = f"decoder error: cannot describe the destination (nvImageCodec status {a})"
        elif code == _DECODE:
            reason = _decode.no_image_reason(f"nvImageCodec processing status {a:#x}, call status {b}")
        else:
            reason = f"no tile segment {a} (the level has {b})"
        tile_failed(TileDecodeError(lv._path, lv.index, col, row, reason), self.on_error, state.stats)


def new_decoder():
    """A new ``wsitool._jpegloop.Decoder`` (CPU-only, one libjpeg-turbo thread); see :func:`applies`."""
    mod = _load()
    if mod is None:  # pragma: no cover - callers check applies() first
        raise RuntimeError(f"wsitool.native: {_reason}")
    return mod.Decoder()
