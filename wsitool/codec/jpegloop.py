"""The compiled tile loop for JPEG levels (``wsitool._jpegloop``) and its Python face (floor 3).

Why it exists: decoding a 240 x 240 JPEG tile takes about 300 us on one core,
and the Python path (:class:`wsitool.read.worker.TileWorker`) spends another
30-37 us a tile around it: nvImageCodec's Python objects for the code stream,
the sub-region stream and the destination image, the ``preadv``, and
wsitool's own checks.  ``wsitool._jpegloop`` does the same work for a range of
a region's tiles in one C call, against nvImageCodec's C API, with the GIL
released: read each tile behind the level's JPEG prefix, check it, decode up
to ``batch`` tiles per ``nvimgcodecDecoderDecode`` call straight into the
output (sub-code-streams with a region for partial tiles), check each tile's
processing status.  RGBA output is decoded into a per-decoder RGB scratch and
widened in C.

Hamamatsu NDPI levels (``jpeg_scan_segments``: each tile a restart interval of
the level's one JPEG scan) without chroma subsampling: the touched intervals of
each band of a call (the rest of a row of the region's tile grid, or whole rows)
are spliced into ONE code stream (the level's header with the SOF sized to the
band, the intervals' bytes as stored, their RSTn markers renumbered, the last
made EOI) and decoded once, with a region, straight into the output: one header
parse per band instead of one per interval.  A band that cannot be spliced, or
whose decode fails, is decoded interval by interval (so errors are the per-interval
ones); ``DecodeStats.tiles_spliced`` counts the intervals decoded in bands.  Calls
over such a level take whole rows of intervals (:meth:`RegionJobs._take`).

It is an accelerator, never a requirement:

* it is built from ``wsitool/_native/jpegloop.c`` at install time when a C
  compiler and the nvImageCodec header are there, and skipped otherwise;
* at run time it is used only when the loaded ``libnvimgcodec`` reports the
  version of the header the extension was compiled with (the structure
  layouts are that header's); :func:`status` says why it is not used;
* ``WSITOOL_NATIVE=0`` in the environment, or
  ``wsitool.codec.paths.decode_paths(native=False)``, keeps every read on the
  Python path.

The Python path stays the reference: ``tests/codec/test_jpegloop.py`` pins this loop
to it pixel for pixel, counter for counter and error message for error
message, and wsitool uses it only where the two do the same thing (JPEG
levels decoded by nvImageCodec without a colour transform after decoding, one
sample plane, ``rgb`` / ``raw`` / ``rgba`` output, no test hook forcing the
scratch path).
"""

from __future__ import annotations

import importlib
import os
import threading
import weakref
from typing import Any, cast

import numpy as np

from ..errors import TileDecodeError
from ..ground.bitstream import DCT_SOF_MARKERS, jpeg_frame_kind
from ..ground.geometry import plan_tiles
from ..model import PyramidLevel
from . import failures as reasons
from . import libjpeg, strictjpeg
from .failures import tile_failed
from .library import nv
from .paths import get_decode_paths
from .pool import DecodeStats
from .silence import stderr_silenced
from .tilebytes import jpeg_stream, read_tile_bytes

#: Most tiles one call of the compiled loop takes (``MAX_BATCH`` in jpegloop.c).
MAX_CHUNK = 64

_lock = threading.Lock()
_module: Any = None  # the compiled extension module once loaded (no type information)
_reason: str | None = None
_tried = False
_library: str | None = None  # the libjpeg-turbo the loop loaded


def _load():
    """Import and initialise ``wsitool._jpegloop`` once; None (with a reason) if unusable."""
    global _module, _reason, _tried, _library
    with _lock:
        if _tried:
            return _module
        _tried = True
        try:
            # the compiled extension is optional: absent when it was not built
            _jpegloop = importlib.import_module("wsitool._jpegloop")
        except ImportError as exc:
            why = libjpeg.build_reason()
            _reason = (f"not built: {why}" if why else
                       f"cannot be imported ({exc}); the build left no reason in wsitool/_build.json")
            _reason += "; JPEG reads take the Python path"
            return None
        if not hasattr(_jpegloop, "LIBJPEG_LOADED_AT_RUN_TIME"):  # pragma: no cover - an old build
            _reason = "the compiled loop is stale (built linked to libjpeg): rebuild it with `pip install -e .`"
            return None
        path, refused = libjpeg.load(_jpegloop)
        if path is None:
            _reason = (f"no libjpeg-turbo of API {_jpegloop.LIBJPEG_VERSION} could be loaded "
                       f"({'; '.join(refused)}); JPEG reads take the Python path")
            return None
        try:
            base = os.path.dirname(cast(str, nv().__file__))
        except ImportError as exc:  # the loop calls nvImageCodec's C API: nothing to call
            _reason = f"{exc}; JPEG reads take the imagecodecs path"
            return None
        lib = os.path.join(base, "libnvimgcodec.so.0")
        try:
            # Creating the instance loads nvImageCodec's extensions, which print
            # one line per missing GPU library; expected on CPU-only machines.
            with stderr_silenced():
                _jpegloop.load(lib, os.path.join(base, "extensions"))
        except (ImportError, OSError, RuntimeError) as exc:
            _reason = f"cannot use {lib} ({exc}); JPEG reads take the Python path"
            return None
        if (_jpegloop.MAX_BATCH != MAX_CHUNK or not hasattr(_jpegloop, "F_NO_MEMORY")
                or not hasattr(_jpegloop, "SCAN_SEGMENTS") or not hasattr(_jpegloop, "SCATTER")
                or not hasattr(_jpegloop, "SPLICE") or not hasattr(_jpegloop, "LIBJPEG")
                or not hasattr(_jpegloop, "SCATTER_KEEP") or not hasattr(_jpegloop, "EXTENTS")):  # pragma: no cover
            _reason = (f"the compiled loop is stale (MAX_BATCH {_jpegloop.MAX_BATCH}, expected {MAX_CHUNK}; "
                       "or built before F_NO_MEMORY / SCAN_SEGMENTS / SCATTER / SPLICE / LIBJPEG / SCATTER_KEEP / "
                       "EXTENTS): "
                       "rebuild it "
                       "with `pip install -e .`")
            return None
        _module = _jpegloop
        _library = path
        return _module


def status() -> str:
    """One line saying whether the compiled JPEG tile loop is in use, and if not, why."""
    paths = get_decode_paths()
    if not paths.native:
        return "off (WSITOOL_NATIVE=0 or wsitool.codec.paths.decode_paths(native=False))"
    if not paths.libjpeg:
        return "off (wsitool.codec.paths.decode_paths(libjpeg=False): nvImageCodec decodes JPEG tiles)"
    mod = _load()
    if mod is None:
        return f"not in use: {_reason}"
    return (f"in use (libjpeg-turbo {_library}, libjpeg API {mod.LIBJPEG_VERSION}; headers checked with "
            f"nvImageCodec {mod.HEADER_VERSION // 1000}.{mod.HEADER_VERSION % 1000 // 100}."
            f"{mod.HEADER_VERSION % 100})")


def library() -> str | None:
    """The path of the libjpeg-turbo the compiled loop loaded (:mod:`wsitool.codec.libjpeg`), or
    None where the loop is not in use."""
    return _library if _load() is not None else None


def applies(lv: PyramidLevel, mode: str, out: np.ndarray, hint: int | None = None, advised: bool = False) -> bool:
    """True when a region read of ``lv`` into ``out`` can take the compiled loop.

    That is: the loop is enabled and loaded; the level is JPEG decoded by
    nvImageCodec with no colour transform after decoding, one sample plane,
    an open file, or a source that gathers a region's tiles into memory for the loop
    (:attr:`wsitool.storage.ByteSource.gathers`) whose region the caller has advised
    (``advised``: else the Python path reads it, through the source's block cache);
    ``mode`` is ``rgb``, ``raw`` or ``rgba``; ``out`` is a
    C-contiguous ``(h, w, 3)`` (``rgba``: ``(h, w, 4)``) uint8 numpy array; and
    neither switch of :class:`wsitool.codec.paths.DecodePaths` forces the scratch path.
    ``hint``: the index of a tile the read needs, which :func:`libjpeg_decodes` may look
    at (for a remote slide, a tile already being fetched: no request of its own).
    """
    paths = get_decode_paths()
    enc = lv.encoding
    if not (paths.native and paths.libjpeg) or enc.codec != "nv" or enc.stream != "jpeg" or enc.ycbcr_after_decode:
        return False
    if lv.tiles.planes != 1 or mode not in ("rgb", "raw", "rgba"):
        return False
    if lv.source.fileno() is None and not (advised and lv.source.gathers):
        return False
    if not libjpeg_decodes(lv, hint):
        return False
    if paths.force_scratch or not paths.roi_decode:
        return False
    if type(out) is not np.ndarray or out.dtype != np.uint8 or out.ndim != 3:
        return False
    if out.shape[2] != (4 if mode == "rgba" else 3) or not out.flags.c_contiguous:
        return False
    return _module is not None or _load() is not None


def libjpeg_decoder(lv: PyramidLevel):
    """``wsitool._jpegloop.decode_jpeg`` when ``lv``'s tiles are JPEG decoded on the CPU by
    libjpeg-turbo's own API (:class:`wsitool.codec.paths.DecodePaths` ``libjpeg``, the extension
    built and loaded); None where nvImageCodec decodes them.

    ``decode_jpeg(stream, out, x0, y0, x1, y1)`` decodes the window ``[x0, x1) x [y0, y1)``
    of a complete JPEG code stream as RGB into ``out`` (a ``(y1 - y0, x1 - x0, 3)`` uint8
    view, rows may be padded), the GIL released, and returns None, or libjpeg-turbo's
    message when the data is corrupt or truncated (its warnings about corrupt data
    included).
    """
    enc = lv.encoding
    if enc.codec != "nv" or enc.stream != "jpeg":
        return None
    return libjpeg_decode()


_kinds: weakref.WeakKeyDictionary[PyramidLevel, bool] = weakref.WeakKeyDictionary()


def libjpeg_kind(kind: tuple[int, int, int] | None) -> bool:
    """Whether libjpeg-turbo's API decodes a JPEG of frame ``kind`` (:func:`wsitool.ground.bitstream.jpeg_frame_kind`)
    to RGB: a DCT process (ITU-T T.81 table B.1: SOF0-2, SOF9-10), 8-bit samples, 1 or 3
    components.  Lossless (SOF3, SOF11, ...), 12-bit and 4-component (CMYK, YCCK) JPEG stay
    with nvImageCodec, which decodes the lossless and the 4-component ones (libjpeg-turbo 2.1
    does neither).  True for None (no readable frame header: the decode reports it)."""
    return kind is None or (kind[0] in DCT_SOF_MARKERS and kind[1] == 8 and kind[2] in (1, 3))


def libjpeg_decodes(lv: PyramidLevel, hint: int | None = None) -> bool:
    """:func:`libjpeg_kind` of ``lv``'s first stored tile (or of tile ``hint`` where it is
    stored), read once per level: whether the compiled loop takes the level
    (:func:`applies`; a local file: one ``pread``; a remote one: a tile being fetched for
    the read).  The Python path looks at each tile's own frame header instead
    (:func:`wsitool.codec.nvdecode.decode_into`: no extra request for a remote slide), so a
    level mixing kinds of JPEG, which no known writer makes, could read differently on the
    two paths."""
    known = _kinds.get(lv)
    if known is None:
        known = _kinds[lv] = _probe_kind(lv, hint)
    return known


def _probe_kind(lv: PyramidLevel, hint: int | None) -> bool:
    offsets, counts = lv.tiles.offsets, lv.tiles.bytecounts
    n = min(len(offsets), len(counts))
    if hint is not None and 0 <= hint < n and offsets[hint] > 0 and counts[hint] > 0:
        index = hint
    else:
        stored = np.flatnonzero((offsets[:n] > 0) & (counts[:n] > 0))
        if not len(stored):
            return True
        index = int(stored[0])
    col, row = index % lv.tiles_across, index // lv.tiles_across
    try:
        data = read_tile_bytes(lv, index, col, row, DecodeStats())
        kind = None if data is None else jpeg_frame_kind(jpeg_stream(lv, bytes(data), col, row))
    except (TileDecodeError, OSError):
        return True
    return libjpeg_kind(kind)


def libjpeg_decode():
    """``wsitool._jpegloop.decode_jpeg`` (see :func:`libjpeg_decoder`; it also takes a 7th
    argument, ``scale_log2`` 0 to 3, for libjpeg's DCT scaling); where the extension is not
    loaded, :func:`wsitool.codec.strictjpeg.decode_jpeg` (libjpeg-turbo through simplejpeg, the
    same signature and errors); None where :class:`wsitool.codec.paths.DecodePaths` ``libjpeg``
    is off or neither is there (nvImageCodec then decodes JPEG, corrupt data undetected)."""
    if not get_decode_paths().libjpeg:
        return None
    mod = _module if _module is not None else _load()
    if mod is not None:
        return mod.decode_jpeg
    # the extension absent: libjpeg-turbo through simplejpeg, corrupt data an error all the same
    return strictjpeg.decode_jpeg if strictjpeg.available() else None


class RegionJobs:
    """The tiles of one region for the compiled loop, handed out in chunks.

    Jobs are numbered in row-major order over the region's tile grid, as in
    :func:`wsitool.ground.geometry.plan_tiles`; a chunk is ``[j0, j1)``.

    Args:
        lv: the level (see :func:`applies`).
        out: the output, ``(h, w, 3 or 4)`` uint8, C-contiguous.
        rx, ry: the region's top-left corner in level pixels.
        inside: ``(cx0, cy0, cx1, cy1)``, the part of the region inside the
            level in level pixels (from ``plan_tiles``).
        on_error: ``"raise"`` or ``"fill"`` (see :meth:`wsitool.Slide.read_region`).
    """

    def __init__(self, lv: PyramidLevel, out: np.ndarray, rx: int, ry: int, inside, on_error: str):
        self.lv = lv
        self.out = out
        self.region = (rx, ry, *inside)
        cx0, cy0, cx1, cy1 = inside
        tw, th = lv.tile_width, lv.tile_height
        self.c0, self.r0 = cx0 // tw, cy0 // th
        self.ncols = (cx1 - 1) // tw - self.c0 + 1
        self.nrows = (cy1 - 1) // th - self.r0 + 1
        self.count = self.ncols * self.nrows
        #: Tiles per call (and per nvImageCodec decode call), 1..MAX_CHUNK; set by the caller.
        self.chunk = 1
        #: Threads sharing the chunks; with more than one, the chunks shrink towards the end
        #: (at most the tiles left over twice the threads) so that the threads finish together.
        self.threads = 1
        self.on_error = on_error
        self.level = (tw, th, lv.width, lv.height, lv.tiles_across, lv.source.size)
        self.prefix = lv.encoding.jpeg_prefix or b""
        self.scan_segments = int(lv.encoding.jpeg_scan_segments)
        #: ``(dest, pieces, keep)`` or ``(dest, pieces, keep, dest2, pieces2)``, or None: after
        #: each tile (RGB) or call, the parts of the pieces that it decoded are copied into
        #: ``dest`` (and ``dest2``; see :func:`scatter`), while they are still in the cache;
        #: ``keep``: ``out`` must hold the pixels too (False: RGB tiles are decoded into a
        #: tile-sized scratch instead, and ``out`` is left unwritten but for the zeros of
        #: failed and missing tiles).
        self.scatter: tuple | None = None
        #: per job, the tile's ``(offsets, counts)`` (a remote slide's; :meth:`_ranges`)
        self._job_ranges: tuple[list[int], list[int]] | None = None
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
            size = self.chunk
            if self.threads > 1:
                size = max(1, min(size, (self.count - j0) // (2 * self.threads)))
            if self.scan_segments and size > self.ncols and j0 % self.ncols == 0:
                size -= size % self.ncols  # whole rows of NDPI restart intervals: one spliced band
            self._next = j1 = min(j0 + size, self.count)
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
        offsets, counts = lv.tiles.offsets, lv.tiles.bytecounts  # C-contiguous uint64 (model.TileIndex)
        fd = lv.source.fileno()
        scatter = tuple(self.scatter or ())
        scatter += (None, None, True, None, None)[len(scatter):]
        while True:
            span = self._take()
            if span is None:
                return
            # a remote slide: the chunk's tiles from the fetched ranges (waiting for them)
            extents = None if fd is not None else lv.source.gather(self._ranges(span, offsets, counts))
            with state.lock:
                dec = state.slot("jpegloop", new_decoder)
                # The Python path takes the tiles this loop leaves (a one-column window at a
                # tile's left edge, a tile to re-decode after a failure): its decoder is made
                # with this one, on the thread's first read, not at the first such tile
                # (which came at random all through a stress run, each a step of RSS).
                _ = state.decoder  # (the property creates it)
                direct, roi, scratch, missing, nbytes, decoded, allocs, spliced, failures = dec.decode_tiles(
                    -1 if fd is None else fd, self.prefix, self.out, offsets, counts, self.level, self.region,
                    span[0], span[1], self.chunk, self.scan_segments, *scatter, extents)
            st = state.stats
            st.tiles_direct += direct
            st.tiles_roi += roi
            st.tiles_scratch += scratch
            st.tiles_missing += missing
            st.bytes_read += nbytes
            st.tiles_decoded += decoded
            st.tiles_spliced += spliced
            st.scratch_allocations += allocs  # the decoder's tile-bytes and RGB buffers
            # (the C loop reports read-time failures before the decode failures
            # of earlier tiles of the same batch: report in tile order)
            for job, code, a, b, message in sorted(failures):
                self._failed(job, code, a, b, message, state)

    def _ranges(self, span: tuple[int, int], offsets: np.ndarray, counts: np.ndarray) -> list[tuple[int, int]]:
        """``(offset, count)`` of the stored tiles of jobs ``[j0, j1)`` (the region's list made
        on the first call: one numpy pass, not one per chunk)."""
        table = self._job_ranges
        if table is None:
            jobs = np.arange(self.count)
            index = (self.r0 + jobs // self.ncols) * self.lv.tiles_across + self.c0 + jobs % self.ncols
            known = index < min(len(offsets), len(counts))
            safe = np.where(known, index, 0)
            table = self._job_ranges = (np.where(known, offsets[safe], 0).tolist(),
                                        np.where(known, counts[safe], 0).tolist())
        return [(o, c) for o, c in zip(table[0][span[0]:span[1]], table[1][span[0]:span[1]], strict=True)
                if o and c]

    def _failed(self, job: int, code: int, a: int, b: int, message: str, state) -> None:
        """Raise or (``on_error="fill"``) count and warn for failure ``(job, code, a, b, message)``
        of the C loop, with the Python path's error and wording (the reason
        builders of :mod:`wsitool.codec.failures`)."""
        mod = _module
        lv = self.lv
        col, row = self.c0 + job % self.ncols, self.r0 + job // self.ncols
        if code == mod.F_IO_ERROR:
            raise OSError(a, os.strerror(a), lv.path)
        if code == mod.F_NO_MEMORY:
            raise MemoryError(f"{lv.path}: no memory for the bytes of tile ({col}, {row})")
        index = row * lv.tiles_across + col
        offset, count = int(lv.tiles.offsets[index]), int(lv.tiles.bytecounts[index])
        if code == mod.F_PAST_EOF:
            reason = reasons.past_eof_reason(offset, count, lv.source.size)
        elif code == mod.F_SHORT_READ:
            reason = reasons.short_read_reason(a, count, offset)
        elif code == mod.F_NOT_SOI:
            reason = reasons.not_soi_reason(a.to_bytes(2, "big")[-b:] if b else b"")
        elif code == mod.F_HEADER:
            reason = reasons.unreadable_header_reason(f"nvImageCodec status {a}")
        elif code == mod.F_GRID:
            reason = reasons.grid_reason(lv, a, b)
        elif code == mod.F_OUTSIDE:  # the job's source rectangle, as the Python path plans it
            rx, ry = self.region[:2]
            h, w = self.out.shape[:2]
            src = next(j.src for j in plan_tiles(lv, rx, ry, w, h)[1] if (j.col, j.row) == (col, row))
            reason = reasons.outside_reason(src, a, b)
        elif code == mod.F_SUBSTREAM:
            reason = reasons.unusable_stream_reason(f"nvImageCodec status {a}")
        elif code == mod.F_IMAGE:
            reason = f"decoder error: cannot describe the destination (nvImageCodec status {a})"
        elif code == mod.F_DECODE:
            reason = reasons.libjpeg_reason(message)
        else:
            reason = f"no tile segment {a} (the level has {b})"
        tile_failed(TileDecodeError(lv.path, lv.index, col, row, reason), self.on_error, state.stats)


def scatter(src: np.ndarray, dest: np.ndarray, pieces: np.ndarray) -> None:
    """Copy rectangles of ``src`` into ``dest`` in C, the GIL released (the loop must be loaded:
    :func:`applies` was true).

    Args:
        src: C-contiguous ``(h, w, c)`` uint8.
        dest: a C-contiguous writable numpy array (any shape; addressed in bytes).
        pieces: C-contiguous ``(n, 6)`` int64, one row a piece: ``(offset, stride, y0, y1, x0, x1)``,
            the rectangle ``[y0, y1) x [x0, x1)`` of ``src`` whose pixel ``(y0, x0)`` goes to byte
            ``offset`` of ``dest``, its rows ``stride`` bytes apart.

    Raises:
        ValueError: a piece outside ``src`` or ``dest`` (nothing copied), or a bad buffer.
        TypeError: ``pieces`` not of int64.
    """
    _module.scatter(src, dest, pieces)


def new_decoder():
    """A new ``wsitool._jpegloop.Decoder`` (CPU-only, one libjpeg-turbo thread); see :func:`applies`."""
    mod = _load()
    if mod is None:  # pragma: no cover - callers check applies() first
        raise RuntimeError(f"wsitool.codec.jpegloop: {_reason}")
    return mod.Decoder()
