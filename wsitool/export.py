"""Export a slide, or a region of it, as a new tiled pyramid: Aperio-style TIFF/SVS, OME-TIFF, Deep Zoom.

Entry point: :func:`export_pyramid` (CLI: ``wsitool export-pyramid``).

How the pyramid is built (streaming, never a whole level in memory):

1. **Level 0** of the output is the requested source level (``level``),
   cropped to ``region``.  It is read strip by strip, about one output tile
   row at a time (``R`` rows, the full region width, where ``R`` is the
   largest multiple of the source tile height up to ``tile_size``, or the
   source tile height if that is at most ``2 * tile_size``, so that strips
   follow the source tile rows and each source tile is decoded once; see
   :func:`strip_rows`), with
   :meth:`Slide.read_region` straight into the level-0 row window, as the
   ``"rgba"`` read composited onto ``background``:
   ``rgb = (src * a + bg * (255 - a) + 127) // 255``, so pixels outside the
   slide, missing tiles and tiles that failed to decode become background.
   (Sources without alpha are read in ``"rgb"`` mode and the would-be
   transparent pixels painted, which is the same result without the RGBA
   copy; see :class:`_Source`.)
2. **Each lower level** halves the one above with an area (box) average.
   Every output pixel of level ``k`` is the mean of the
   ``2**k x 2**k`` block of level-0 pixels it covers, clipped to the image;
   level sizes are ``ceil(W / 2**k) x ceil(H / 2**k)`` (the sizes Deep Zoom
   uses).  It is computed incrementally from pairs of rows as they arrive:
   a vertical then a horizontal 2:1 weighted mean, where the last row or
   column of a level gets the weight of the level-0 pixels it really covers,
   so the iterated result equals the direct block mean.  Levels 1 and below
   are kept in float32 and rounded to uint8 only when a tile is encoded, so
   the error against a float64 box filter of the source is at most 0.5 plus
   float32 rounding (well under 1 grey level).
3. Each level keeps only a sliding window of rows: the rows of the tile row
   it has not emitted yet (plus ``overlap`` rows either side for Deep Zoom)
   and one unpaired row.  As soon as a tile row is complete its tiles are
   cropped (uint8 copies) and handed to a thread pool that encodes them;
   results are consumed in submission order, so each level's tiles come out
   row by row, left to right.
4. TIFF and OME-TIFF pages must be written one after the other, but all
   levels are produced together.  Level-0 tiles stream straight into
   tifffile; encoded tiles of the lower levels go to an anonymous temporary
   file in the destination folder (deleted by the OS even on a crash) and are
   copied into their pages when level 0 is done.  Deep Zoom tiles are written
   as files immediately.
5. Output is written under a hidden temporary name in the destination folder
   and renamed into place only when complete; on any error or
   ``KeyboardInterrupt`` the temporary output is deleted, so nothing is left
   under the final name.

Memory bound (bytes of numpy buffers; see :func:`memory_bound`), with ``W``
the output width, ``T`` the tile size, ``O`` the overlap, ``N`` the number of
levels, ``R <= 2T`` the strip rows (above), ``Q = 4 * threads + 4`` tiles in
flight in the encoder pool, ``D`` decode threads (= ``threads``), ``S`` the
pixel count of one source tile (or strip) and ``s`` the source's bytes per
pixel::

    C0 = T + 2O + R                rows kept for level 0
    Ck = T + 2O + R // 2 + 3       rows kept for each lower level
    B  = 4*R*W                     RGBA strip (sources with alpha, or after a decode error)
       + 2*R*W                     alpha masks while compositing
       + 3*C0*W                    level-0 window, uint8 RGB
       + 12*Ck*(W + N)             lower-level windows, float32 RGB (sum of ceil(W / 2**k) <= W + N)
       + 12*(R // 2 + 1)*W         temporaries of one halving step (uint16 sums at level 0,
                                   float32 below)
       + 6*Q*(T + 2O)**2           tiles in flight: uint8 crop and encoded bytes
       + 16*(T + 2O)**2            the tile being cropped: float32 rounding, edge padding
       + 4*D*S*d                   per decode thread: decoded source tile and its RGB conversion,
                                   d = max(3, s) for 8-bit sources, 8 * samples for wider
                                   ones (converted through float64)
       + 3*P                       tiff only: the level kept for the Aperio thumbnail, P its
                                   pixels (at most max(1024, T)**2)
       + 6*A                       label and macro carried over (A their pixels): decoded,
                                   and while tifffile encodes them
       + 1 MiB                     bookkeeping (tile index, tifffile, Python objects)

It grows with the width and the tile size, never with the height: about
``36 * T * W`` bytes plus a few MB when ``R = T`` (57 T W at most, when
``R = 2T``), e.g. with 256-pixel tiles, 256-pixel source tiles and 2 threads
about 100 MB for a 10 000-pixel-wide export and 0.94 GB for a
100 000-pixel-wide one.

Format facts used here:

* Aperio SVS: the first IFD's ImageDescription starts with ``Aperio``; the
  text after the first line is ``|``-separated ``key = value`` fields, of
  which ``MPP`` (micrometres per pixel) and ``AppMag`` (objective power) give
  OpenSlide's ``openslide.mpp-x/y`` and ``openslide.objective-power``;
  pyramid levels are tiled IFDs (OpenSlide's Aperio format notes,
  openslide.org/formats/aperio).  Layout (the same notes, quoting Aperio's
  "Digital Slides and Third-party Data Interchange" p. 14): the first IFD
  is the full resolution, the second a stripped thumbnail, then the other
  levels, then the stripped label (NewSubfileType 1) and macro
  (NewSubfileType 9), named on the second line of their ImageDescription;
  tifffile and tiffslide take IFD 1 as the thumbnail whatever it holds.  JPEG 2000 tiles use compression 33005
  (Aperio "JP2K RGB": a raw JPEG 2000 code stream, ISO/IEC 15444-1 Annex A).
* OME-TIFF: OME-XML in the first ImageDescription with ``Pixels``
  ``PhysicalSizeX/Y`` in ``µm``; the reduced levels are SubIFDs (TIFF tag
  330) of the full-resolution IFD with NewSubfileType 1 (OME-TIFF
  specification, "Sub-resolutions").  JPEG 2000 tiles use compression 34712.
* TIFF 6.0: TileWidth and TileLength must be multiples of 16 (section 15);
  JPEG tiles are complete JPEG streams in YCbCr (photometric YCbCr; TIFF
  Technical Note 2), without chroma subsampling at quality >= 90 (as libvips
  does: it costs PSNR on stained tissue) and 2x2 below (YCbCrSubSampling);
  deflate tiles use compression 8 with the horizontal differencing predictor
  2 (section 14); both ResolutionUnit centimetre and X/YResolution are set
  from the MPP (section 8).  BigTIFF is used when the uncompressed pyramid
  could exceed 4 GiB.
* Deep Zoom: ``NAME.dzi`` (XML, namespace
  ``http://schemas.microsoft.com/deepzoom/2008``: ``Image`` with
  ``TileSize``, ``Overlap``, ``Format``; ``Size`` with ``Width``/``Height``)
  and ``NAME_files/<level>/<col>_<row>.<format>``, level 0 being 1 x 1 and
  the last the full image; level sizes halve with ``ceil``; a tile is
  ``TileSize`` plus ``Overlap`` on each side that has a neighbour, clipped to
  the level (the grid of OpenSlide's ``DeepZoomGenerator``, whose tiles this
  matches in number, size and, at full resolution, pixels; OpenSeadragon
  clips tile bounds to the image the same way).

Codecs: JPEG and JPEG 2000 tiles are encoded by nvImageCodec (one encoder per
thread, from :mod:`wsitool.decode`'s per-thread pool).  Its CPU JPEG 2000
encoder takes a target size ratio, not a quality: ``quality`` 100 means
lossless, below 100 a compressed size of ``quality / 300`` of the raw tile
(90 -> 30 %, about 3.3:1, which on dense H&E tissue gives about the PSNR of
JPEG at quality 90; 30 -> 10 %).  It writes a JP2 file; the code stream is taken out
of its ``jp2c`` box (ISO/IEC 15444-1 Annex I.5.4).  Deflate and uncompressed
TIFF tiles, and PNG tiles of Deep Zoom (``deflate`` / ``none``), are encoded
with imagecodecs.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import shutil
import struct
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator, Sequence
from xml.sax.saxutils import quoteattr

import imagecodecs
import numpy as np

from .codec.library import nv
from .codec.pool import get_pool
from .errors import InvalidRegionError, ResourceLimitError, TileDecodeError, WsiError
from .geometry import level0_coordinate, level_rect
from .read.request import level_index
from .settings import get_limits
from .slide import Slide, open_slide

__all__ = ["ExportResult", "export_pyramid", "pyramid_dimensions", "memory_bound", "strip_rows",
           "write_image", "check_image_extension", "IMAGE_EXTENSIONS",
           "FORMATS", "COMPRESSIONS", "ON_ERROR", "painted_tiles", "PAINTED_KEY"]

#: Output formats.
FORMATS = ("tiff", "ome-tiff", "dzi")
#: Tile compressions.
COMPRESSIONS = ("jpeg", "jpeg2000", "deflate", "none")
#: What an export does with an undecodable source tile: stop with its error, or paint it.
ON_ERROR = ("raise", "fill")

_SLACK = 1 << 20  # bookkeeping term of the memory bound


@dataclasses.dataclass
class ExportResult:
    """What :func:`export_pyramid` wrote.

    Attributes:
        output: the output file (for ``dzi`` the ``.dzi`` file; its tiles are
            in the ``<name>_files`` folder beside it).
        format: ``"tiff"``, ``"ome-tiff"`` or ``"dzi"``.
        level_dimensions: ``(width, height)`` in pixels of every output level,
            full resolution first (for Deep Zoom this is the reverse of its
            own numbering, which starts at 1 x 1).
        tiles_written: output tiles written, all levels.
        tiles_missing: source tiles inside the region that are absent from
            the file (offset or byte count 0); their pixels are background.
        tiles_failed: source tiles that could not be decoded, painted with
            the background (only with ``on_error="fill"``; by default the
            first one stops the export, so a returned result has 0).
        seconds: wall-clock duration of the export.
        tile_size: output tile size in pixels.
        compression: tile compression.
        bytes_written: size of the output in bytes (all tiles for ``dzi``).
        memory_bound: the documented bound on buffer memory for this export,
            in bytes (:func:`memory_bound`).
    """

    output: Path
    format: str
    level_dimensions: list[tuple[int, int]]
    tiles_written: int
    tiles_missing: int
    tiles_failed: int
    seconds: float
    tile_size: int = 0
    compression: str = ""
    bytes_written: int = 0
    memory_bound: int = 0


# --------------------------------------------------------------------------- geometry


def pyramid_dimensions(width: int, height: int, tile_size: int, format: str = "tiff") -> list[tuple[int, int]]:
    """``(width, height)`` of each output level, full resolution first.

    Level ``k`` is ``ceil(width / 2**k) x ceil(height / 2**k)``.  TIFF and
    OME-TIFF pyramids stop at the first level that fits in one tile; Deep Zoom
    goes on down to 1 x 1 (as ``DeepZoomGenerator`` does).

    Raises:
        ValueError: ``tile_size`` is not a positive integer.
    """
    if not isinstance(tile_size, int) or tile_size < 1:
        raise ValueError(f"tile_size must be a positive integer, got {tile_size!r}")
    dims = [(int(width), int(height))]
    while True:
        w, h = dims[-1]
        if format == "dzi":
            if w <= 1 and h <= 1:
                break
        elif w <= tile_size and h <= tile_size:
            break
        dims.append(((w + 1) // 2, (h + 1) // 2))
    return dims


def _queue_depth(threads: int) -> int:
    return 4 * threads + 4


def strip_rows(tile_size: int, source_tile_height: int) -> int:
    """Rows read from the source per strip.

    The largest multiple of the source tile (or strip) height that is at most
    ``tile_size``, or the source tile height itself if it lies between
    ``tile_size`` and ``2 * tile_size``: strips then start on source tile rows
    (the first one is shortened to reach the grid) and every source tile is
    decoded once.  Source tiles taller than ``2 * tile_size`` are read
    ``tile_size`` rows at a time (each decoded once per strip it touches).
    """
    T, th = int(tile_size), int(source_tile_height)
    if th > 2 * T:
        return T
    return th * max(1, T // th)


def memory_bound(width: int, tile_size: int, *, overlap: int = 0, levels: int = 1, threads: int = 1,
                 source_tile: tuple[int, int] = (0, 0), source_pixel_bytes: int = 3,
                 source_itemsize: int = 1, thumbnail_pixels: int = 0,
                 associated_pixels: int = 0) -> int:
    """Upper bound in bytes on the numpy buffers one export holds at once.

    Args:
        width: output level-0 width in pixels.
        tile_size: output tile size in pixels.
        overlap: Deep Zoom overlap in pixels (0 for TIFF).
        levels: number of output levels.
        threads: encoder and decoder threads.
        source_tile: ``(width, height)`` of one source tile (or strip) of the level read.
        source_pixel_bytes: bytes per pixel of the source level (samples x itemsize).
        source_itemsize: bytes per sample of the source level.
        thumbnail_pixels: pixels of the level kept for the thumbnail (``tiff``).
        associated_pixels: pixels of the associated images carried over.

    Returns:
        The bound ``B`` of the module docstring (bytes).  It does not depend
        on the height of the export.
    """
    W, T, O, N = int(width), int(tile_size), int(overlap), int(levels)
    q = _queue_depth(threads)
    stw, sth = (int(v) for v in source_tile)
    R = strip_rows(T, sth) if sth > 0 else T
    if source_itemsize > 1:
        decode_bytes = 8 * max(1, source_pixel_bytes // source_itemsize)
    else:
        decode_bytes = max(3, source_pixel_bytes)
    c0, ck = _window_rows(T, O, R)
    return int(
        4 * R * W
        + 2 * R * W
        + 3 * c0 * W
        + 12 * ck * (W + N)
        + 12 * (R // 2 + 1) * W
        + 6 * q * (T + 2 * O) ** 2
        + 16 * (T + 2 * O) ** 2
        + 4 * threads * stw * sth * decode_bytes
        + 3 * int(thumbnail_pixels)
        + 6 * int(associated_pixels)
        + _SLACK
    )


def _window_rows(T: int, O: int, R: int) -> tuple[int, int]:
    """Row capacity of the level-0 window and of the lower levels' windows.

    After a level emits and trims, it keeps fewer than ``T + 2 O`` rows (the
    unfinished tile row with its overlaps) or one unpaired row; then a strip
    of ``R`` rows arrives at level 0, and at most ``R // 2 + 1`` rows at the
    next level (pairs of the strip plus the unpaired row), fewer below.
    """
    return T + 2 * O + R, T + 2 * O + R // 2 + 3


# --------------------------------------------------------------------------- tile codecs


def _jp2_codestream(data: bytes) -> bytes:
    """The contiguous code stream of a JP2 file (the payload of its ``jp2c`` box).

    JP2 boxes (ISO/IEC 15444-1 Annex I.4): 4-byte big-endian length, 4-byte
    type; length 1 means an 8-byte length follows, 0 means "to the end".
    A raw code stream (starting with SOC ``ff4f``) is returned unchanged.
    """
    if data[:2] == b"\xff\x4f":
        return data
    i, n = 0, len(data)
    while i + 8 <= n:
        length, kind = struct.unpack(">I4s", data[i:i + 8])
        header = 8
        if length == 1:
            if i + 16 > n:
                break
            length = struct.unpack(">Q", data[i + 8:i + 16])[0]
            header = 16
        elif length == 0:
            length = n - i
        if length < header:
            break
        if kind == b"jp2c":
            return data[i + header:i + length]
        i += length
    raise WsiError("JPEG 2000 encoder output has no code stream (no jp2c box)")


class _TileCodec:
    """Encodes one output tile (``(h, w, 3)`` uint8, C-contiguous) to bytes.

    Runs on any thread.  nvImageCodec work uses the calling thread's own
    encoder from :func:`wsitool.decode.get_pool` under that thread's lock.
    """

    def __init__(self, fmt: str, compression: str, quality: int):
        self.fmt = fmt
        self.compression = compression
        self._params = None
        if compression == "jpeg":
            self._codec = "jpeg"
            self._params = nv().EncodeParams(
                quality_type=nv().QualityType.QUALITY, quality_value=float(quality),
                chroma_subsampling=(nv().ChromaSubsampling.CSS_444
                                    if _jpeg_subsampling(quality) == (1, 1)
                                    else nv().ChromaSubsampling.CSS_420),
            )
        elif compression == "jpeg2000":
            self._codec = "jpeg2k"
            if quality >= 100:
                self._params = nv().EncodeParams(quality_type=nv().QualityType.LOSSLESS)
            else:
                self._params = nv().EncodeParams(
                    quality_type=nv().QualityType.SIZE_RATIO, quality_value=quality / 300.0
                )

    def encode(self, tile: np.ndarray) -> bytes:
        """Encoded bytes of ``tile`` ((h, w, 3) uint8) for this format and compression.

        Raises:
            WsiError: the encoder produced nothing.
        """
        if self._params is not None:
            state = get_pool("cpu").state()
            with state.lock:
                encoder = state.encoder
                cs = encoder.encode(tile, self._codec, params=self._params)
            if cs is None:
                raise WsiError(
                    f"nvImageCodec could not encode a {tile.shape[1]}x{tile.shape[0]} "
                    f"{self.compression} tile"
                )
            data = bytes(cs)
            return _jp2_codestream(data) if self._codec == "jpeg2k" else data
        if self.fmt == "dzi":  # PNG tiles (deflate, or stored blocks for "none")
            return imagecodecs.png_encode(tile, level=6 if self.compression == "deflate" else 0)
        if self.compression == "deflate":
            diff = tile.copy()
            diff[:, 1:] -= tile[:, :-1]  # TIFF predictor 2, modulo 256
            return imagecodecs.deflate_encode(diff, level=6)
        return tile.tobytes()


# --------------------------------------------------------------------------- pyramid builder


class _Rows:
    """Sliding window of rows of one output level (RGB, uint8 for level 0, float32 below)."""

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

    def coverage(self, index: int, axis: int) -> int:
        """Level-0 pixels covered by column (axis 1) or row (axis 0) ``index`` of this level."""
        size = self.base_w if axis == 1 else self.base_h
        step = 1 << self.k
        return min(step, size - index * step)


class _Pyramid:
    """Turns composited level-0 strips into output tiles of every level."""

    def __init__(self, dims: list[tuple[int, int]], tile: int, overlap: int, pad_tiles: bool,
                 strip: int):
        self.dims = dims
        self.tile = tile
        self.overlap = overlap
        self.pad_tiles = pad_tiles
        base = dims[0]
        c0, ck = _window_rows(tile, overlap, strip)
        self.levels = [
            _Rows(k, w, h, base, tile, c0 if k == 0 else ck, np.uint8 if k == 0 else np.float32)
            for k, (w, h) in enumerate(dims)
        ]

    # -- reduction -----------------------------------------------------------------
    def _halve(self, k: int) -> int:
        """Reduce complete row pairs of level ``k`` into level ``k + 1``; return rows made."""
        src, dst = self.levels[k], self.levels[k + 1]
        p = src.paired
        avail = src.end
        pairs = (avail - p) // 2
        single = 1 if (avail == src.height and avail - p - 2 * pairs == 1) else 0
        rows = pairs + single
        if rows == 0:
            return 0
        a = src.buf[p - src.start:avail - src.start]
        if k == 0:
            self._halve_uint8(a, pairs, single, dst.tail(rows))
            dst.n += rows
            src.paired = p + 2 * pairs + single
            return rows
        v = np.empty((rows, src.width, 3), np.float32)
        if pairs:
            np.add(a[0:2 * pairs:2], a[1:2 * pairs:2], out=v[:pairs], dtype=np.float32)
            v[:pairs] *= 0.5
            last = p + 2 * pairs - 1
            cov = src.coverage(last, 0)
            full = 1 << k
            if cov < full:  # the level's last row covers fewer level-0 rows
                np.add(a[2 * pairs - 2] * np.float32(full), a[2 * pairs - 1] * np.float32(cov),
                       out=v[pairs - 1], dtype=np.float32)
                v[pairs - 1] /= np.float32(full + cov)
        if single:
            v[pairs] = a[2 * pairs]
        out = dst.tail(rows)
        w = src.width
        half = w // 2
        if half:
            np.add(v[:, 0:2 * half:2], v[:, 1:2 * half:2], out=out[:, :half])
            out[:, :half] *= 0.5
        if w % 2:
            out[:, half] = v[:, w - 1]
        elif half:
            cov = src.coverage(w - 1, 1)
            full = 1 << k
            if cov < full:
                out[:, half - 1] = (v[:, w - 2] * np.float32(full) + v[:, w - 1] * np.float32(cov)) / np.float32(full + cov)
        del v
        dst.n += rows
        src.paired = p + 2 * pairs + single
        return rows

    @staticmethod
    def _halve_uint8(a: np.ndarray, pairs: int, single: int, out: np.ndarray) -> None:
        """Level 0 -> 1 in integers: every level-0 pixel has weight 1, so sums of 2 or 4
        uint8 values (uint16) scaled once into the float32 output are exact."""
        rows, w = pairs + single, a.shape[1]
        v = np.empty((rows, w, 3), np.uint16)  # vertical sums of 2 (a single last row doubled)
        if pairs:
            np.add(a[0:2 * pairs:2], a[1:2 * pairs:2], out=v[:pairs], dtype=np.uint16)
        if single:
            np.multiply(a[2 * pairs], 2, out=v[pairs], dtype=np.uint16)
        half = w // 2
        if half:
            h = np.add(v[:, 0:2 * half:2], v[:, 1:2 * half:2], dtype=np.uint16)
            np.multiply(h, np.float32(0.25), out=out[:, :half])
            del h
        if w % 2:
            np.multiply(v[:, w - 1], np.float32(0.5), out=out[:, half])

    # -- emission ------------------------------------------------------------------
    def _crop(self, lv: _Rows, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """uint8 ``(y1 - y0, x1 - x0, 3)`` C-contiguous copy of level rows/columns."""
        part = lv.buf[y0 - lv.start:y1 - lv.start, x0:x1]
        if part.dtype != np.uint8:
            return np.rint(part).astype(np.uint8)
        return np.ascontiguousarray(part)

    def _emit(self, k: int) -> Iterator[tuple[int, int, int, np.ndarray]]:
        lv = self.levels[k]
        T, O = self.tile, self.overlap
        while lv.next_row < lv.tiles_down:
            r = lv.next_row
            y0 = r * T - (O if r > 0 else 0)
            y1 = min((r + 1) * T + (O if r < lv.tiles_down - 1 else 0), lv.height)
            if y1 > lv.end:
                return
            for c in range(lv.tiles_across):
                x0 = c * T - (O if c > 0 else 0)
                x1 = min((c + 1) * T + (O if c < lv.tiles_across - 1 else 0), lv.width)
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


# --------------------------------------------------------------------------- source reading


class _Source:
    """Reads region rows of the source level, composited on the background, as uint8 RGB.

    Sources without an alpha channel are read in ``"rgb"`` mode straight into
    the caller's buffer; the pixels ``"rgba"`` mode would make transparent
    (outside the level, missing tiles) are then painted with the background,
    which gives exactly the ``"rgba"`` composite without the RGBA copy.
    Sources with an alpha channel (ExtraSamples 1 or 2) are read in
    ``"rgba"`` mode and composited.  With ``on_error="raise"`` the first
    undecodable tile's :class:`TileDecodeError` ends the export; with
    ``"fill"`` a strip with an undecodable tile is read again tile by tile,
    and the tiles that fail stay background and are counted (``failed``,
    ``first_error``).
    """

    def __init__(self, slide, level: int, rx: int, ry: int, w: int, h: int, tile: int,
                 threads: int, background: np.ndarray, on_error: str = "raise"):
        lv = slide.levels[level]
        #: rows per strip, and the rows of the first strip (up to the source tile grid)
        self.strip = strip_rows(tile, lv.tile_height)
        aligned = self.strip % lv.tile_height == 0
        self.first = self.strip - (ry % self.strip) if aligned else self.strip
        self.slide = slide
        self.level = level
        self.lv = lv
        self.rx, self.ry, self.w, self.h = rx, ry, w, h
        self.threads = threads
        self.background = background
        self.on_error = on_error
        self.failed: set[tuple[int, int]] = set()
        self.first_error: str | None = None  # message of the first tile painted over
        self.alpha = any(code in (1, 2) for code in self.lv.encoding.extrasamples)
        self._rgba = np.empty((min(self.strip, h), w, 4), np.uint8) if self.alpha else None
        self._missing = self._missing_grid()

    def _loc(self, lx: int, ly: int) -> tuple[int, int]:
        ds = self.lv.downsample
        return level0_coordinate(lx, ds), level0_coordinate(ly, ds)

    def _missing_grid(self) -> np.ndarray:
        """Boolean (tiles_down, tiles_across): tile absent from the file (offset or count 0)."""
        lv = self.lv
        n = lv.tiles_across * lv.tiles_down
        planes = lv.tiles.planes
        shape = (planes, lv.tiles_down, lv.tiles_across)
        offs = np.asarray(lv.tiles.offsets[:planes * n]).reshape(shape)
        cnts = np.asarray(lv.tiles.bytecounts[:planes * n]).reshape(shape)
        return ((offs == 0) | (cnts == 0)).any(axis=0)

    def _tile_span(self, y0: int, y1: int):
        """Tile rows and columns of the level inside the region rows [y0, y1), or None."""
        lv = self.lv
        cx0, cy0 = max(self.rx, 0), max(y0, 0)
        cx1, cy1 = min(self.rx + self.w, lv.width), min(y1, lv.height)
        if cx0 >= cx1 or cy0 >= cy1:
            return None
        return ((cy0 // lv.tile_height, (cy1 - 1) // lv.tile_height + 1),
                (cx0 // lv.tile_width, (cx1 - 1) // lv.tile_width + 1), (cx0, cy0, cx1, cy1))

    def missing_tiles(self) -> int:
        """Source tiles inside the region whose offset or byte count is 0."""
        span = self._tile_span(self.ry, self.ry + self.h)
        if span is None:
            return 0
        (r0, r1), (c0, c1), _ = span
        return int(self._missing[r0:r1, c0:c1].sum())

    def read(self, sy: int, out: np.ndarray) -> None:
        """Fill ``out`` ((rows, w, 3) uint8, C-contiguous) with region rows ``sy ...``."""
        rows = out.shape[0]
        ly = self.ry + sy
        loc = self._loc(self.rx, ly)
        try:
            if self.alpha:
                rgba = self._rgba[:rows]
                self.slide.read_region(loc, self.level, (self.w, rows), out=rgba, mode="rgba",
                                       threads=self.threads, on_error="raise")
                _composite(rgba, out, self.background)
                return
            self.slide.read_region(loc, self.level, (self.w, rows), out=out, mode="rgb",
                                   threads=self.threads, on_error="raise")
        except TileDecodeError:
            if self.on_error != "fill":
                raise
            self._read_tilewise(ly, out)
            return
        self._paint_transparent(ly, out)

    def _paint_transparent(self, ly: int, out: np.ndarray) -> None:
        """Background where an ``"rgba"`` read would be transparent: outside, missing tiles."""
        lv, bg, rows = self.lv, self.background, out.shape[0]
        top = min(max(0, -ly), rows)
        bottom = min(max(0, lv.height - ly), rows)
        left = min(max(0, -self.rx), self.w)
        right = min(max(0, lv.width - self.rx), self.w)
        out[:top] = bg
        out[max(bottom, top):] = bg
        out[top:bottom, :left] = bg
        out[top:bottom, max(right, left):] = bg
        span = self._tile_span(ly, ly + rows)
        if span is None:
            return
        (r0, r1), (c0, c1), (cx0, cy0, cx1, cy1) = span
        holes = np.argwhere(self._missing[r0:r1, c0:c1])
        for dr, dc in holes:
            row, col = r0 + int(dr), c0 + int(dc)
            y0, y1 = max(row * lv.tile_height, cy0), min((row + 1) * lv.tile_height, cy1)
            x0, x1 = max(col * lv.tile_width, cx0), min((col + 1) * lv.tile_width, cx1)
            out[y0 - ly:y1 - ly, x0 - self.rx:x1 - self.rx] = bg

    def _read_tilewise(self, ly: int, out: np.ndarray) -> None:
        """Slow path after a decode error: read source tile by tile, keep what decodes."""
        rows = out.shape[0]
        rgba = np.zeros((rows, self.w, 4), np.uint8)
        span = self._tile_span(ly, ly + rows)
        if span is not None:
            lv = self.lv
            (r0, r1), (c0, c1), (cx0, cy0, cx1, cy1) = span
            for row in range(r0, r1):
                y0, y1 = max(row * lv.tile_height, cy0), min((row + 1) * lv.tile_height, cy1)
                for col in range(c0, c1):
                    x0, x1 = max(col * lv.tile_width, cx0), min((col + 1) * lv.tile_width, cx1)
                    try:
                        part = self.slide.read_region(self._loc(x0, y0), self.level,
                                                      (x1 - x0, y1 - y0), mode="rgba", threads=1,
                                                      on_error="raise")
                    except TileDecodeError as exc:
                        self.failed.add((col, row))
                        if self.first_error is None:
                            self.first_error = str(exc)
                        continue
                    rgba[y0 - ly:y1 - ly, x0 - self.rx:x1 - self.rx] = part
        _composite(rgba, out, self.background)


def _composite(rgba: np.ndarray, out: np.ndarray, background: np.ndarray) -> None:
    """``out[...] = rgb over background`` with alpha: ``(c * a + bg * (255 - a) + 127) // 255``."""
    out[...] = rgba[..., :3]
    alpha = rgba[..., 3]
    partial = alpha != 255
    if not partial.any():
        return
    bg = background.astype(np.uint16)
    for r in np.flatnonzero(partial.any(axis=1)):
        a = alpha[r].astype(np.uint16)[:, None]
        mix = rgba[r, :, :3].astype(np.uint16) * a + bg * (255 - a) + 127
        out[r] = mix // 255


# --------------------------------------------------------------------------- writers


def _aperio_description(width: int, height: int, tile: int, kind: str, mpp, mag,
                        painted: int | None = None) -> str:
    """First-IFD ImageDescription in the Aperio layout (header line, then ``|key = value``).

    ``painted``: with ``on_error="fill"``, the count of undecodable source
    tiles painted with the background, as the field ``UndecodableTiles``
    (OpenSlide shows it as ``aperio.UndecodableTiles``).
    """
    from .version import __version__

    fields = [f"Aperio Image Library wsitool {__version__}\r\n"
              f"{width}x{height} [0,0 {width}x{height}] ({tile}x{tile}) {kind}"]
    if mag is not None:
        fields.append(f"AppMag = {mag:g}")
    if mpp is not None:
        fields.append(f"MPP = {mpp:.6g}")
    fields.append("ScannedBy = wsitool export-pyramid")
    if painted is not None:
        fields.append(f"{PAINTED_KEY} = {int(painted)}")
    return "|".join(fields)


#: Name of the recorded count of undecodable source tiles painted over by an
#: ``on_error="fill"`` export: an Aperio ``key = value`` field of the first
#: ImageDescription (``tiff``), a ``MapAnnotation`` entry of the first OME
#: Image (namespace :data:`PAINTED_NAMESPACE`, ``ome-tiff``), an XML comment
#: in the ``.dzi`` (``dzi``).  See :func:`painted_tiles`.
PAINTED_KEY = "UndecodableTiles"
PAINTED_NAMESPACE = "wsitool"

#: Longest side (pixels) of the thumbnail written in the Aperio layout: the
#: largest pyramid level whose sides are all at most this (the last level if
#: none is).  Aperio's are "typically about 1024x768" (Aperio, "Digital Slides
#: and Third-party Data Interchange", p. 14, quoted in OpenSlide's Aperio notes).
THUMBNAIL_SIZE = 1024


def _thumbnail_level(dims: Sequence[tuple[int, int]]) -> int:
    """Index of the pyramid level kept as the Aperio thumbnail (see :data:`THUMBNAIL_SIZE`)."""
    for k, (w, h) in enumerate(dims):
        if w <= THUMBNAIL_SIZE and h <= THUMBNAIL_SIZE:
            return k
    return len(dims) - 1


class _LevelImage:
    """The pixels of one output level, assembled from its tiles as they are made."""

    def __init__(self, level: int, width: int, height: int, tile: int):
        self.level = level
        self.tile = tile
        self.image = np.empty((height, width, 3), np.uint8)

    def add(self, col: int, row: int, tile: np.ndarray) -> None:
        T = self.tile
        y0, x0 = row * T, col * T
        h, w = self.image.shape[:2]
        y1, x1 = min(y0 + tile.shape[0], h), min(x0 + tile.shape[1], w)
        self.image[y0:y1, x0:x1] = tile[:y1 - y0, :x1 - x0]


def _associated_for_export(slide, label: bool, associated: bool,
                           on_error: str) -> list[tuple[str, np.ndarray]]:
    """The source's ``label`` and ``macro`` images to carry over, in that order.

    ``associated=False`` drops both, ``label=False`` the label (it often
    shows patient identifiers).  The source's thumbnail is never carried:
    the ``tiff`` output gets one made from its own pyramid.

    Raises:
        WsiError (and subclasses): an associated image cannot be read, with
            ``on_error="raise"``; with ``"fill"`` it is left out with a
            :class:`~wsitool.region.TileWarning`.
    """
    if not associated:
        return []
    out = []
    for name in ("label", "macro"):
        if name == "label" and not label:
            continue
        if name not in slide.associated_images:
            continue
        try:
            arr = slide.associated_images[name]
        except WsiError as exc:
            if on_error != "fill":
                raise
            from .errors import TileWarning

            warnings.warn(f"{slide.path}: associated image {name!r} left out: {exc}", TileWarning,
                          stacklevel=3)
            continue
        out.append((name, np.ascontiguousarray(arr[..., :3], dtype=np.uint8)))
    return out


def painted_tiles(slide) -> int | None:
    """The count of undecodable source tiles that a wsitool export painted with
    the background (``on_error="fill"``), as recorded in ``slide`` (an open
    :class:`~wsitool.slide.Slide` of a ``tiff`` or ``ome-tiff`` export), or
    None when the file records none (not an ``on_error="fill"`` export of
    wsitool).  Where it is recorded: :data:`PAINTED_KEY`.
    """
    props = slide.properties
    value = props.get(f"aperio.{PAINTED_KEY}")
    if value is None and slide.vendor == "ome-tiff":
        xml = props.get("tiff.ImageDescription", "")
        import re

        m = re.search(r'<M\s+K="' + PAINTED_KEY + r'"\s*>\s*(\d+)\s*</M>', xml)
        value = m.group(1) if m else None
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _jpeg_subsampling(quality: int) -> tuple[int, int]:
    """Chroma subsampling of JPEG tiles: none at quality >= 90 (as libvips does), else 2x2."""
    return (1, 1) if quality >= 90 else (2, 2)


def _tiff_compression(fmt: str, compression: str, quality: int) -> tuple[dict, str]:
    """tifffile page keyword arguments for pre-encoded tiles, and the Aperio kind text."""
    if compression == "jpeg":
        sub = _jpeg_subsampling(quality)
        return ({"compression": "jpeg", "photometric": "ycbcr", "subsampling": sub},
                f"JPEG/YCbCr Q={quality}")
    if compression == "jpeg2000":
        code = 33005 if fmt == "tiff" else 34712
        return {"compression": code, "photometric": "rgb"}, f"J2K/RGB Q={quality}"
    if compression == "deflate":
        return {"compression": "adobe_deflate", "photometric": "rgb", "predictor": 2}, "Deflate"
    return {"compression": None, "photometric": "rgb"}, "Raw"


#: File types :func:`write_image` writes, by extension.
IMAGE_EXTENSIONS = (".png", ".tif", ".tiff", ".npy")


def check_image_extension(path: Path) -> None:
    """Refuse a ``path`` whose extension :func:`write_image` cannot write (call it
    before reading anything).

    Raises:
        ValueError: the extension is not one of :data:`IMAGE_EXTENSIONS`.
    """
    ext = path.suffix.lower()
    if ext not in IMAGE_EXTENSIONS:
        raise ValueError(f"{path}: unknown output extension {ext!r} (use .png, .tif, .tiff or .npy)")


def write_image(path: Path, array, *, overwrite: bool = True, sources=()) -> None:
    """Write one region, ``array`` (``(height, width, channels)`` numpy, e.g. uint8
    RGB/RGBA or the level's dtype for raw reads), to PNG, TIFF (zlib) or ``.npy``
    by the extension of ``path``, atomically (:mod:`wsitool.atomic`): the data
    goes to a new exclusive temporary file in the destination folder, renamed
    onto ``path`` only when complete.

    Args:
        path: the output file.
        array: the pixels.
        overwrite: replace an existing ``path`` (never one of ``sources``).
        sources: paths read to make ``array`` (the slide); ``path`` must not
            be one of them, also through a link.

    Raises:
        ValueError: unknown extension.
        OutputIsSourceError: ``path`` is one of ``sources`` (also a ValueError).
        OutputExistsError: ``path`` exists and ``overwrite`` is False (a FileExistsError).
        IsADirectoryError: ``path`` is an existing folder.
        FileNotFoundError: the destination folder does not exist.
        OSError: a write error (disk full, permission), naming ``path``.
    """
    from . import atomic

    path = Path(os.fspath(path))
    check_image_extension(path)
    ext = path.suffix.lower()
    atomic.check_output(path, sources, overwrite)
    if ext == ".png":
        arr = array
        if arr.ndim == 3 and arr.shape[2] not in (1, 2, 3, 4):
            arr = arr[..., :3]
        data = imagecodecs.png_encode(np.ascontiguousarray(arr))  # encode before creating the file
    partial, fh = atomic.open_file(path, sources)
    with partial:
        with fh:
            if ext == ".npy":
                np.save(fh, array)
            elif ext == ".png":
                fh.write(data)
            else:
                import tifffile

                photometric = "rgb" if array.ndim == 3 and array.shape[2] in (3, 4) else "minisblack"
                extrasamples = ("unassalpha",) if array.ndim == 3 and array.shape[2] == 4 else None
                tifffile.imwrite(fh, array, photometric=photometric, extrasamples=extrasamples,
                                 compression="zlib")
        partial.commit(overwrite)


def _dzi_paths(output: Path) -> tuple[Path, Path, str]:
    """``(NAME.dzi, NAME_files, NAME)`` for an output given with or without ``.dzi``."""
    if output.suffix.lower() == ".dzi":
        stem = output.stem
        dzi = output
    else:
        stem = output.name
        dzi = output.with_name(stem + ".dzi")
    return dzi, dzi.with_name(stem + "_files"), stem


# --------------------------------------------------------------------------- main entry


def export_pyramid(
    source,
    output,
    *,
    format: str = "tiff",
    tile_size: int = 256,
    compression: str = "jpeg",
    quality: int = 90,
    region: Sequence[int] | None = None,
    level: int = 0,
    overlap: int = 0,
    threads: int | None = None,
    overwrite: bool = False,
    background: Sequence[int] = (255, 255, 255),
    progress: Callable[[int, int], None] | None = None,
    max_pixels: int | None = None,
    on_error: str = "raise",
    label: bool = True,
    associated: bool = True,
) -> ExportResult:
    """Write a slide, or a region of it, as a new tiled pyramid.

    Args:
        source: path of a slide, or an open :class:`~wsitool.slide.Slide`
            (left open).
        output: output path.  ``tiff`` / ``ome-tiff``: the file (e.g.
            ``out.svs``, ``out.ome.tif``).  ``dzi``: ``NAME.dzi`` (or
            ``NAME``, to which ``.dzi`` is added); tiles go to ``NAME_files/``.
        format: ``"tiff"`` (Aperio-style SVS that OpenSlide reads with vendor
            ``aperio``), ``"ome-tiff"`` (levels in SubIFDs) or ``"dzi"``.
        tile_size: output tile size in pixels; a multiple of 16 for TIFF
            formats, any size >= 1 for Deep Zoom (254 with overlap 1 is the
            usual choice there).
        compression: ``"jpeg"``, ``"jpeg2000"`` (TIFF formats only),
            ``"deflate"`` or ``"none"``; Deep Zoom stores ``deflate`` and
            ``none`` tiles as PNG.
        quality: 1..100.  JPEG quality; for JPEG 2000 100 is lossless and
            below a target size of ``quality / 300`` of the raw tile.
            Ignored by ``deflate`` / ``none``.
        region: ``(x, y, w, h)``: ``x, y`` the top-left in level-0 pixels,
            ``w, h`` the size in pixels of ``level``; default the whole level.
            Parts outside the slide become background; it must overlap the slide.
        level: source level read; the output's full resolution is this
            level's (lower output levels are computed, never read from other
            source levels, whatever their downsample).
        overlap: Deep Zoom tile overlap in pixels, at most ``tile_size // 2``
            (0 for TIFF formats).
        threads: encoder threads and decoder threads per strip read
            (default: the CPU count).
        overwrite: replace an existing output; without it an existing output
            raises ``FileExistsError`` before any work.
        background: ``(r, g, b)`` 0..255 painted where the source is
            transparent (outside the slide, missing or undecodable tiles).
        progress: called as ``progress(tiles_done, tiles_total)`` from the
            calling thread as tiles are written.
        max_pixels: refuse exports of more than this many level-0 pixels
            (``w * h``); default: ``max_export_pixels`` of :mod:`wsitool.settings`
            (``2**33``).
        on_error: ``"raise"`` (default): the first undecodable source tile
            stops the export with its :class:`TileDecodeError` and nothing is
            left under the output name.  ``"fill"``: undecodable tiles are
            painted with ``background``, a :class:`~wsitool.region.TileWarning`
            gives their count, ``tiles_failed`` counts them, and the count is
            recorded in the output (:data:`PAINTED_KEY`; read it back with
            :func:`painted_tiles`; ``wsitool info`` shows it).
        label: carry the source's ``label`` image over (``tiff`` and
            ``ome-tiff``; labels often show patient identifiers: pass False
            to drop it).
        associated: carry the source's associated images (``label`` and
            ``macro``) over; False drops both.  The ``tiff`` output always
            gets a thumbnail made from its own pyramid (the Aperio layout has
            one); the source's thumbnail is not copied.  Deep Zoom has no
            associated images.

    Output layout of ``tiff`` (as Aperio writes SVS; OpenSlide's Aperio
    notes, openslide.org/formats/aperio, quoting Aperio's "Digital Slides
    and Third-party Data Interchange" p. 14): IFD 0 the full resolution
    (tiled); IFD 1 a stripped JPEG thumbnail (:data:`THUMBNAIL_SIZE`);
    then the other levels (tiled, NewSubfileType 0); then ``label`` (LZW,
    NewSubfileType 1) and ``macro`` (JPEG, NewSubfileType 9), stripped, each
    with ImageDescription ``Aperio Image Library ...`` and a second line
    ``label WxH`` / ``macro WxH``.  ``ome-tiff``: the pyramid is the first
    OME Image (levels in SubIFDs); ``label`` and ``macro`` follow as
    further Images with those ``Name`` s, as bioformats2raw / raw2ometiff
    write them.

    Returns:
        :class:`ExportResult`.

    Raises:
        ValueError: an invalid option (format, compression, tile size,
            quality, overlap, threads, background).
        OutputIsSourceError: the output is the source slide (same file, also
            through a link), whatever ``overwrite``; also a ``ValueError``.
        InvalidRegionError: bad level or region (also a ``ValueError``).
        ResourceLimitError: the exported area exceeds ``max_pixels`` (or the
            default export limit), checked before anything is read or written.
        OutputExistsError: the output (or a Deep Zoom ``_files`` folder)
            exists and ``overwrite`` is False; a ``FileExistsError``.
        IsADirectoryError: the output path (the ``.dzi`` file for Deep Zoom) is
            a directory and ``overwrite`` is True.
        FileNotFoundError: the source or the output folder does not exist.
        UnsupportedFormatError, CorruptFileError: the source is not readable.
        TileDecodeError: a source tile cannot be decoded (``on_error="raise"``).
        WsiError: an encoder failure; an associated image that cannot be
            read (``on_error="raise"``).
        Any error leaves nothing under the output name (nor a Deep Zoom
        ``_files`` folder); an existing output replaced with ``overwrite``
        is only replaced once the new one is complete.
    """
    t_start = time.perf_counter()
    fmt = str(format).lower()
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    compression = str(compression).lower()
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    if fmt == "dzi" and compression == "jpeg2000":
        raise ValueError("Deep Zoom tiles are JPEG or PNG: use compression jpeg, deflate or none")
    T = _int_option(tile_size, "tile_size")
    if fmt == "dzi":
        if T < 1:
            raise ValueError(f"tile_size must be >= 1, got {T}")
    elif T < 16 or T % 16:
        raise ValueError(f"tile_size must be a positive multiple of 16 for TIFF (TIFF 6.0 section 15), got {T}")
    if T * T > get_limits().max_tile_pixels:
        raise ResourceLimitError(f"tile_size {T} exceeds the max_tile_pixels limit {get_limits().max_tile_pixels}")
    q = _int_option(quality, "quality")
    if not 1 <= q <= 100:
        raise ValueError(f"quality must be 1..100, got {q}")
    O = _int_option(overlap, "overlap")
    if O < 0:
        raise ValueError(f"overlap must be >= 0, got {O}")
    if O and fmt != "dzi":
        raise ValueError("overlap applies to Deep Zoom (format dzi) only")
    if 2 * O > T:
        raise ValueError(f"overlap must be at most half the tile size ({T // 2}), got {O}")
    nthreads = (os.cpu_count() or 1) if threads is None else _int_option(threads, "threads")
    if nthreads < 1:
        raise ValueError(f"threads must be >= 1, got {nthreads}")
    bg = _background(background)
    if max_pixels is not None and _int_option(max_pixels, "max_pixels") <= 0:
        raise ValueError(f"max_pixels must be positive, got {max_pixels}")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")

    from . import atomic

    output = Path(os.fspath(output))
    if fmt == "dzi":
        final, files_dir, stem = _dzi_paths(output)
    else:
        final, files_dir, stem = output, None, output.name
    # One rule for every output (wsitool.atomic): never the source, an existing
    # output only with overwrite; checked before the slide is read.
    sources = [source.path if isinstance(source, Slide) else os.fspath(source)]
    atomic.check_output(final, sources, overwrite)
    if files_dir is not None:
        atomic.check_output(files_dir, sources, overwrite, kind="dir")
    atomic.clean_stale_partials(final.parent)

    own = not isinstance(source, Slide)
    slide = open_slide(source) if own else source
    try:
        sources.append(slide.path)
        atomic.check_output(final, sources, overwrite)
        L = level_index(level, slide.level_count, slide.path)
        lv = slide.levels[L]
        if region is None:
            x0, y0, w, h = 0, 0, lv.width, lv.height
        else:
            try:
                x0, y0, w, h = (_int_option(v, "region") for v in region)
            except (TypeError, ValueError) as exc:
                raise InvalidRegionError(f"{slide.path}: region must be 4 integers X Y W H ({exc})") from None
        if w <= 0 or h <= 0:
            raise InvalidRegionError(f"{slide.path}: region size must be positive, got {w}x{h}")
        rx, ry = level_rect(lv, x0, y0)
        if rx >= lv.width or ry >= lv.height or rx + w <= 0 or ry + h <= 0:
            raise InvalidRegionError(
                f"{slide.path}: region {x0},{y0} {w}x{h} (level {L}) lies outside the "
                f"{lv.width}x{lv.height} level"
            )
        limit = max_pixels if max_pixels is not None else get_limits().max_export_pixels
        if w * h > limit:
            raise ResourceLimitError(
                f"{slide.path}: export of {w}x{h} ({w * h} pixels) exceeds the limit of {limit} "
                "pixels (raise it with --max-pixels / max_pixels=)"
            )
        dims = pyramid_dimensions(w, h, T, fmt)
        src = _Source(slide, L, rx, ry, w, h, T, nthreads, bg, on_error)
        missing = src.missing_tiles()
        total = sum(-(-lw // T) * -(-lh // T) for lw, lh in dims)
        counter = _Counter(total, progress)
        extra = _associated_for_export(slide, label, associated, on_error) if fmt != "dzi" else []
        thumb = None
        if fmt == "tiff":
            kt = _thumbnail_level(dims)
            thumb = _LevelImage(kt, dims[kt][0], dims[kt][1], T)
        bound = memory_bound(w, T, overlap=O, levels=len(dims), threads=nthreads,
                             source_tile=(lv.tile_width, lv.tile_height),
                             source_pixel_bytes=lv.samples * lv.dtype.itemsize,
                             source_itemsize=lv.dtype.itemsize,
                             thumbnail_pixels=thumb.image.shape[0] * thumb.image.shape[1] if thumb else 0,
                             associated_pixels=sum(a.shape[0] * a.shape[1] for _, a in extra))
        codec = _TileCodec(fmt, compression, q)
        pyramid = _Pyramid(dims, T, O, pad_tiles=fmt != "dzi", strip=src.strip)
        tiles = _encoded_tiles(src, pyramid, codec, nthreads, keep=thumb)
        meta = _metadata(slide, L)
        meta["associated"] = extra
        meta["thumbnail"] = thumb
        # with "fill", the count of painted tiles is recorded in the output once known
        meta["painted"] = (lambda: len(src.failed)) if on_error == "fill" else None
        if fmt == "dzi":
            nbytes = _write_dzi(tiles, final, files_dir, stem, dims, T, O, compression, overwrite, counter,
                                sources=sources, painted=meta["painted"])
        else:
            nbytes = _write_tiff(tiles, final, fmt, dims, T, compression, q, meta, overwrite, counter,
                                 sources=sources)
        counter.finish()
        if src.failed:
            from .errors import TileWarning

            warnings.warn(f"{slide.path}: {len(src.failed)} undecodable source tile(s) painted with "
                          f"the background (first: {src.first_error})", TileWarning, stacklevel=2)
        return ExportResult(
            output=final, format=fmt, level_dimensions=[tuple(d) for d in dims],
            tiles_written=counter.done, tiles_missing=missing, tiles_failed=len(src.failed),
            seconds=time.perf_counter() - t_start, tile_size=T, compression=compression,
            bytes_written=nbytes, memory_bound=bound,
        )
    finally:
        if own:
            slide.close()


def _int_option(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return int(value)


def _background(value) -> np.ndarray:
    try:
        vals = [int(v) for v in value]
    except (TypeError, ValueError):
        raise ValueError(f"background must be three integers 0..255, got {value!r}") from None
    if len(vals) != 3 or not all(0 <= v <= 255 for v in vals):
        raise ValueError(f"background must be three integers 0..255, got {value!r}")
    return np.array(vals, np.uint8)


class _Counter:
    def __init__(self, total: int, progress):
        self.total = total
        self.done = 0
        self.progress = progress
        if progress is not None:
            progress(0, total)

    def add(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total)

    def finish(self) -> None:
        if self.done != self.total:  # pragma: no cover - internal consistency
            raise RuntimeError(f"wrote {self.done} tiles, expected {self.total}")


def _metadata(slide, L: int) -> dict:
    """MPP (µm per output level-0 pixel) and objective power of the output."""
    lv0, lv = slide.levels[0], slide.levels[L]
    fx, fy = lv0.width / lv.width, lv0.height / lv.height
    mpp = slide.mpp
    mag = slide.objective_power
    return {
        "mpp": (mpp[0] * fx, mpp[1] * fy) if mpp else None,
        "mag": (mag / ((fx + fy) / 2)) if mag else None,
    }


def _encoded_tiles(src: _Source, pyramid: _Pyramid, codec: _TileCodec, threads: int,
                   keep: "_LevelImage | None" = None) -> Iterator[tuple[int, int, int, bytes]]:
    """Every output tile as ``(level, col, row, bytes)``; each level in row-major order.

    ``keep``: the tiles of its level are also copied into it (the pixels of
    the Aperio thumbnail, :class:`_LevelImage`).
    """
    H = pyramid.dims[0][1]
    q = _queue_depth(threads)
    pending: collections.deque = collections.deque()
    executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="wsitool-encode")
    try:
        lv0 = pyramid.levels[0]
        sy = 0
        while sy < H:
            rows = min(src.first if sy == 0 else src.strip, H - sy)
            src.read(sy, lv0.tail(rows))
            lv0.n += rows
            sy += rows
            for k, c, r, tile in pyramid.advance(0):
                if keep is not None and k == keep.level:
                    keep.add(c, r, tile)
                pending.append((k, c, r, executor.submit(codec.encode, tile)))
                del tile
                while len(pending) >= q:
                    k2, c2, r2, fut = pending.popleft()
                    yield k2, c2, r2, fut.result()
        while pending:
            k2, c2, r2, fut = pending.popleft()
            yield k2, c2, r2, fut.result()
    finally:
        for *_, fut in pending:
            fut.cancel()
        executor.shutdown(wait=True, cancel_futures=True)


def _write_tiff(tiles, final: Path, fmt: str, dims, T: int, compression: str, quality: int,
                meta: dict, overwrite: bool, counter: _Counter, sources=()) -> int:
    import tifffile

    from . import atomic

    from .version import __version__

    page_args, kind = _tiff_compression(fmt, compression, quality)
    raw = sum(-(-w // T) * -(-h // T) * T * T * 3 for w, h in dims)
    bigtiff = raw + (raw >> 4) + (1 << 24) >= 2**32
    partial, out_fh = atomic.open_file(final, sources, read=True)
    try:
        spill = atomic.anonymous_file(final.parent, final)
    except BaseException:
        out_fh.close()
        partial.abort()
        raise
    index: list[list[tuple[int, int]]] = [[] for _ in dims]
    fd = spill.fileno()
    spill_pos = 0

    def level0() -> Iterator[bytes]:
        nonlocal spill_pos
        for k, _c, _r, data in tiles:
            if k == 0:
                counter.add()
                yield data
            else:
                os.pwrite(fd, data, spill_pos)
                index[k].append((spill_pos, len(data)))
                spill_pos += len(data)
                counter.add()

    def spilled(k: int) -> Iterator[bytes]:
        for off, n in index[k]:
            yield os.pread(fd, n, off)

    def resolution(k: int) -> dict:
        if not meta["mpp"]:
            return {}
        fx, fy = dims[0][0] / dims[k][0], dims[0][1] / dims[k][1]
        return {"resolution": (1e4 / (meta["mpp"][0] * fx), 1e4 / (meta["mpp"][1] * fy)),
                "resolutionunit": "CENTIMETER"}

    gen0 = level0()
    painted = meta.get("painted")  # callable giving the painted-tile count ("fill"), or None
    try:
        with out_fh:
            with tifffile.TiffWriter(out_fh, bigtiff=bigtiff, ome=(fmt == "ome-tiff")) as tw:
                w0, h0 = dims[0]
                common = dict(dtype=np.uint8, tile=(T, T), software=f"wsitool {__version__}", **page_args)
                if fmt == "tiff":
                    mpp = meta["mpp"][0] if meta["mpp"] else None
                    desc = _aperio_description(w0, h0, T, kind, mpp, meta["mag"],
                                               painted=0 if painted is not None else None)
                    tw.write(gen0, shape=(h0, w0, 3), description=desc, metadata=None,
                             **resolution(0), **common)
                else:
                    ome = {"axes": "YXS", "Name": final.name.split(".")[0]}
                    if meta["mpp"]:
                        ome.update(PhysicalSizeX=meta["mpp"][0], PhysicalSizeY=meta["mpp"][1],
                                   PhysicalSizeXUnit="µm", PhysicalSizeYUnit="µm")
                    if painted is not None:  # the count is put in once level 0 is done
                        ome["MapAnnotation"] = {"Namespace": PAINTED_NAMESPACE,
                                                "Value": {PAINTED_KEY: "0"}}
                    tw.write(gen0, shape=(h0, w0, 3), subifds=len(dims) - 1, metadata=ome,
                             **resolution(0), **common)
                for _ in gen0:  # run the pipeline to its end: the rest goes to the spill file
                    raise RuntimeError("level-0 tile after the level-0 page")  # pragma: no cover
                if fmt == "tiff":  # Aperio: the thumbnail is the second IFD
                    _write_thumbnail(tw, meta["thumbnail"].image, w0, h0)
                for k in range(1, len(dims)):
                    w, h = dims[k]
                    if len(index[k]) != -(-w // T) * -(-h // T):  # pragma: no cover
                        raise RuntimeError(f"level {k}: {len(index[k])} tiles spilled")
                    if fmt == "tiff":
                        desc = (f"Aperio Image Library wsitool {__version__}\r\n"
                                f"{w0}x{h0} -> {w}x{h} ({T}x{T}) {kind}")
                        tw.write(spilled(k), shape=(h, w, 3), description=desc, metadata=None,
                                 subfiletype=0, **resolution(k), **common)
                    else:
                        tw.write(spilled(k), shape=(h, w, 3), subfiletype=1, **resolution(k), **common)
                for name, image in meta.get("associated", ()):
                    _write_associated(tw, fmt, name, image)
            if painted is not None and painted():
                _record_painted(out_fh, painted())
        nbytes = partial.path.stat().st_size
        partial.commit(overwrite)
        return nbytes
    except BaseException as exc:
        gen0.close()
        tiles.close()
        out_fh.close()
        partial.abort()
        if isinstance(exc, OSError) and not isinstance(exc, WsiError):
            raise atomic.user_error(exc, final) from None
        raise
    finally:
        spill.close()


def _write_thumbnail(tw, image: np.ndarray, w0: int, h0: int) -> None:
    """The Aperio thumbnail IFD: stripped JPEG (RGB), NewSubfileType 0, ImageDescription
    ``Aperio Image Library ...`` then ``W0xH0 -> WxH - `` as Aperio writes it (OpenSlide's
    Aperio notes: "the thumbnail image is always stripped").  Quality 90 without chroma
    subsampling, as the JPEG tiles at that quality."""
    from .version import __version__

    h, w = image.shape[:2]
    tw.write(image, photometric="rgb", compression="jpeg", compressionargs={"level": 90},
             subsampling=_jpeg_subsampling(90), rowsperstrip=16, subfiletype=0, metadata=None, software=f"wsitool {__version__}",
             description=f"Aperio Image Library wsitool {__version__}\n{w0}x{h0} -> {w}x{h} - ")


def _write_associated(tw, fmt: str, name: str, image: np.ndarray) -> None:
    """Append associated image ``name`` (``label`` or ``macro``), stripped.

    ``tiff`` (OpenSlide's Aperio notes): NewSubfileType 1 for the label and 9
    for the macro; ImageDescription ``Aperio Image Library ...`` with the
    name and size on its second line (OpenSlide names associated images
    from it); the label LZW-compressed (lossless, as Aperio stores it), the
    macro JPEG.  ``ome-tiff``: a further OME Image with ``Name`` ``label`` /
    ``macro`` (as bioformats2raw / raw2ometiff write them), same compressions.
    """
    from .version import __version__

    h, w = image.shape[:2]
    comp = {"compression": "lzw"} if name == "label" else {
        "compression": "jpeg", "compressionargs": {"level": 90}, "subsampling": _jpeg_subsampling(90)}
    if fmt == "tiff":
        tw.write(image, photometric="rgb", rowsperstrip=16, metadata=None,
                 subfiletype=1 if name == "label" else 9, software=f"wsitool {__version__}",
                 description=f"Aperio Image Library wsitool {__version__}\n{name} {w}x{h}", **comp)
    else:
        tw.write(image, photometric="rgb", rowsperstrip=16, software=f"wsitool {__version__}",
                 metadata={"axes": "YXS", "Name": name}, **comp)


def _record_painted(fh, count: int) -> None:
    """Put ``count`` in place of the ``0`` written as :data:`PAINTED_KEY` in the first
    ImageDescription of the TIFF open read-write in ``fh`` (tifffile ``TiffTag.overwrite``)."""
    import re

    import tifffile

    fh.flush()
    fh.seek(0)  # tifffile reads a file object from its current position
    with tifffile.TiffFile(fh) as tf:
        tag = tf.pages[0].tags["ImageDescription"]
        text = tag.value
        new = re.sub(r"(\|" + PAINTED_KEY + r" = )0\b", lambda m: m.group(1) + str(count), text, count=1)
        if new == text:
            new = text.replace(f'<M K="{PAINTED_KEY}">0</M>', f'<M K="{PAINTED_KEY}">{count}</M>', 1)
        if new == text:  # pragma: no cover - the placeholder is always written
            raise RuntimeError("no place for the painted-tile count in the ImageDescription")
        tag.overwrite(new.encode("utf-8"))  # OME-XML is UTF-8 ("µm"), as tifffile wrote it
    fh.flush()


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _write_dzi(tiles, final: Path, files_dir: Path, stem: str, dims, T: int, O: int,
               compression: str, overwrite: bool, counter: _Counter, sources=(),
               painted: Callable[[], int] | None = None) -> int:
    from . import atomic

    ext = "jpeg" if compression == "jpeg" else "png"
    partial = atomic.create_dir(final, sources)  # the tiles folder and the .dzi are made in it
    tmpdir = partial.path
    try:
        tmp_files = tmpdir / files_dir.name
        n = len(dims)
        for k in range(n):
            (tmp_files / str(n - 1 - k)).mkdir(parents=True)
        nbytes = 0
        for k, c, r, data in tiles:
            with open(tmp_files / str(n - 1 - k) / f"{c}_{r}.{ext}", "wb") as fh:
                fh.write(data)
            nbytes += len(data)
            counter.add()
        w, h = dims[0]
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<Image xmlns="http://schemas.microsoft.com/deepzoom/2008" Format={quoteattr(ext)} '
            f'Overlap="{O}" TileSize="{T}">\n'
            f'  <Size Width="{w}" Height="{h}"/>\n'
            + (f"  <!-- wsitool: {PAINTED_KEY}={painted()} -->\n" if painted is not None else "")
            + "</Image>\n"
        )
        tmp_dzi = tmpdir / final.name
        tmp_dzi.write_text(xml, encoding="utf-8")
        nbytes += len(xml)
        # Commit: tiles folder first, the .dzi (what viewers open) last.
        atomic.check_output(final, sources, overwrite)
        atomic.check_output(files_dir, sources, overwrite, kind="dir")
        if not overwrite:  # neither name may appear meanwhile: no-replace renames
            atomic.commit(tmp_files, files_dir, sources=sources)
            try:
                atomic.commit(tmp_dzi, final, sources=sources)
            except BaseException:
                os.rename(files_dir, tmp_files)  # ours, just renamed: take it back
                raise
            partial.abort()
            return nbytes
        old = tmpdir / "old"
        old.mkdir()
        old_files, old_dzi = old / files_dir.name, old / final.name
        if files_dir.exists():
            os.replace(files_dir, old_files)
        if final.exists():
            os.replace(final, old_dzi)
        try:
            os.replace(tmp_files, files_dir)
            os.replace(tmp_dzi, final)
        except BaseException:  # take ours out again and put the previous output back
            if not tmp_files.exists() and files_dir.exists():
                shutil.rmtree(files_dir, ignore_errors=True)
            if not tmp_dzi.exists():
                _unlink(final)
            if old_files.exists():
                os.replace(old_files, files_dir)
            if old_dzi.exists():
                os.replace(old_dzi, final)
            raise
        partial.abort()
        return nbytes
    except BaseException as exc:
        tiles.close()
        partial.abort()
        if isinstance(exc, OSError) and not isinstance(exc, WsiError):
            raise atomic.user_error(exc, final) from None
        raise
