"""The plan of an export: output formats and levels, strip rows, the memory bound, the result (floor 6).

Memory bound (bytes of numpy buffers; see :func:`memory_bound`), with ``W``
the output width, ``T`` the tile size, ``ov`` the overlap, ``N`` the number of
levels, ``R <= 2T`` the strip rows (above), ``Q = 4 * threads + 4`` tiles in
flight in the encoder pool, ``D`` decode threads (= ``threads``), ``S`` the
pixel count of one source tile (or strip) and ``s`` the source's bytes per
pixel::

    C0 = T + 2O + R                rows kept for level 0
    Ck = T + 2O + R // 2 + 3       rows kept for each lower level
    B  = 4*R*W                     RGBA strip (sources with alpha, or after a decode error)
       + 2*R*W                     alpha masks while compositing
       + 3*R*W                     the strip read one ahead (the reader thread's staging)
       + 3*C0*W                    level-0 window, uint8 RGB
       + 3*Ck*(W + N)              lower-level windows, uint8 RGB (sum of ceil(W / 2**k) <= W + N)
       + 6*(R // 2 + 3)*(W + N)    lower levels' newest sums of level-0 pixels, uint16 ...
       + 12*(R // 32 + 3)*(W // 16 + N)  ... and uint32 from level 5 on
       + 6*(R // 2 + 2)*(W + 2)    temporaries of one halving or rounding step (numpy
                                   reference path only; the compiled kernel has none)
       + 6*Q*(T + 2O)**2           tiles in flight: uint8 crop and encoded bytes
       + 6*(T + 2O)**2             the tile being cropped: its uint8 copy and edge padding
       + 4*D*S*d                   per decode thread: decoded source tile and its RGB conversion,
                                   d = max(3, s) for 8-bit sources, 8 * samples for wider
                                   ones (converted through float64)
       + 3*P                       tiff only: the level kept for the Aperio thumbnail, P its
                                   pixels (at most max(1024, T)**2)
       + 6*A                       label and macro carried over (A their pixels): decoded,
                                   and while tifffile encodes them
       + 1 MiB                     bookkeeping (tile index, tifffile, Python objects)

It grows with the width and the tile size, never with the height: about
``26 * T * W`` bytes plus a few MB when ``R = T`` (50 T W at most, when
``R = 2T``), e.g. with 256-pixel tiles, 256-pixel source tiles and 2 threads
about 74 MB for a 10 000-pixel-wide export and 0.67 GB for a
100 000-pixel-wide one.  Most of it is the RGBA strip that only sources with
alpha (or a strip read again after a decode error) use: an RGB JPEG export
30 000 pixels wide peaks at about 132 MB above its imports against a bound
of 195 MB (``scripts/bench_export.py``).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from ..deepzoom.geometry import deepzoom_level_dimensions
from ..errors import InvalidOptionError
from . import omexml

#: Output formats (``dicom``: a folder holding one DICOM WSI series, :mod:`wsitool.export.dicom`).
FORMATS = ("tiff", "ome-tiff", "dzi", "dicom")


#: Tile compressions; ``"copy"`` copies the source's compressed tiles (:mod:`.passthrough`);
#: ``"jpeg2000-lossless"`` is ``"jpeg2000"`` with ``psnr=0``.
COMPRESSIONS = ("jpeg", "jpeg2000", "jpeg2000-lossless", "deflate", "none", "copy")

#: The compressions of a DICOM export's frames.
DICOM_COMPRESSIONS = ("jpeg", "jpeg2000", "jpeg2000-lossless", "copy")


#: What an export does with an undecodable source tile: stop with its error, or paint it.
ON_ERROR = ("raise", "fill")


SLACK = 1 << 20  # bookkeeping term of the memory bound


@dataclasses.dataclass
class ExportResult:
    """What :func:`export_pyramid` wrote.

    Attributes:
        output: the output file (for ``dzi`` the ``.dzi`` file; its tiles are
            in the ``<name>_files`` folder beside it).
        format: ``"tiff"``, ``"ome-tiff"``, ``"dzi"`` or ``"dicom"`` (``output`` is then the
            series' folder).
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
            in bytes (:func:`memory_bound`, plus :func:`copy_memory_bound`
            with ``compression="copy"``).
        tiles_copied: output tiles that are source tiles copied byte for
            byte (``compression="copy"``; missing and failed ones included,
            written with byte count 0); part of ``tiles_written``.
        source_levels: for each output level, the source level it was made
            from: read (or copied) from it, or halved from the output level
            read from it (all ``level`` unless ``from_source_levels`` or
            ``compression="copy"``).
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
    tiles_copied: int = 0
    source_levels: list[int] = dataclasses.field(default_factory=list)


def pyramid_dimensions(width: int, height: int, tile_size: int, format: str = "tiff") -> list[tuple[int, int]]:
    """``(width, height)`` of each output level, full resolution first.

    Level ``k`` is ``ceil(width / 2**k) x ceil(height / 2**k)``.  TIFF and
    OME-TIFF pyramids stop at the first level that fits in one tile; Deep Zoom
    goes on down to 1 x 1 (as ``DeepZoomGenerator`` does).

    Raises:
        InvalidOptionError: ``tile_size`` is not a positive integer (a ``ValueError``).
    """
    if not isinstance(tile_size, int) or tile_size < 1:
        raise InvalidOptionError(f"tile_size must be a positive integer, got {tile_size!r}")
    if format == "dzi":  # the Deep Zoom levels, one geometry for the project (wsitool.deepzoom.geometry)
        return list(reversed(deepzoom_level_dimensions(width, height)))
    dims = [(int(width), int(height))]
    while True:
        w, h = dims[-1]
        if w <= tile_size and h <= tile_size:
            break
        dims.append(((w + 1) // 2, (h + 1) // 2))
    return dims


@dataclasses.dataclass(frozen=True)
class Segment:
    """Output levels made from one source level (``from_source_levels``).

    Attributes:
        level: source level read (its pixels are the segment's first output level).
        rect: ``(x, y, w, h)`` read from it, in pixels of that level (parts
            outside the level are background).
        first: output level index of the segment's first level.
        dims: ``(width, height)`` of the segment's output levels, its first level
            ``(w, h)`` and each next one halved (``ceil``), as :func:`pyramid_dimensions`.
    """

    level: int
    rect: tuple[int, int, int, int]
    first: int
    dims: list


#: how far a source level's downsample (relative to the level exported) may be from a
#: power of two and still stand for that output level: Aperio levels are 4.0001 / 16.0004
#: apart (integer level sizes), never more than a pixel in the level's size
SOURCE_LEVEL_TOLERANCE = 0.02


def source_level_segments(levels, L: int, rect, tile: int, fmt: str) -> list[Segment]:
    """Split the output pyramid of level ``L``'s ``rect`` into segments read from source levels.

    Output level ``k`` (downsample ``2**k`` against level ``L``) is read from the
    source level ``j > L`` whose downsample relative to level ``L`` is ``2**k``
    within :data:`SOURCE_LEVEL_TOLERANCE`, and the output levels below it are
    halved from it, down to the next such level; levels with other steps (3x,
    non-power-of-two) are not used, nor is a level for a ``rect`` whose start
    is not a multiple of ``2**k`` (its pixels would sit up to ``2**k - 1``
    level-``L`` pixels off the grid halving gives).  The segment's first level
    covers ``x / 2**k .. ceil((x + w) / 2**k)`` of its source level (the size
    halving gives), and where ``rect`` ends exactly at the edge of level ``L``
    it ends at the source level's own edge if that comes first: scanners round
    level sizes down (CMU-1's 32914 rows give 8228 at 4x, not 8229), and that
    row is then left out rather than painted.  So an output level is the size
    halving gives, or a pixel less.

    Args:
        levels: the slide's levels (:class:`wsitool.model.PyramidLevel`).
        L: level exported (output level 0).
        rect: ``(x, y, w, h)`` on level ``L``, in its pixels.
        tile: output tile size.
        fmt: ``"tiff"`` or ``"ome-tiff"``.

    Returns:
        The segments, first (level ``L``) to last; their ``dims`` concatenated are
        the output pyramid.
    """
    rx, ry, w, h = rect
    base = levels[L]
    cur = Segment(L, (rx, ry, w, h), 0, pyramid_dimensions(w, h, tile, fmt))
    out = []
    for j in range(L + 1, len(levels)):
        lv = levels[j]
        ratio = lv.downsample / base.downsample
        if ratio < 1.5:
            continue
        k = int(round(math.log2(ratio)))
        if abs(ratio / (1 << k) - 1) > SOURCE_LEVEL_TOLERANCE:
            continue
        local = k - cur.first
        if local < 1 or local >= len(cur.dims):
            continue  # not coarser than the segment's start, or past the pyramid's end
        f = 1 << k
        if rx % f or ry % f:
            continue  # off the source level's grid
        x0, y0 = rx // f, ry // f
        x1, y1 = -(-(rx + w) // f), -(-(ry + h) // f)
        if rx + w == base.width:
            x1 = min(x1, lv.width)
        if ry + h == base.height:
            y1 = min(y1, lv.height)
        if x1 <= x0 or y1 <= y0:
            continue
        out.append(dataclasses.replace(cur, dims=cur.dims[:local]))
        cur = Segment(j, (x0, y0, x1 - x0, y1 - y0), k,
                      pyramid_dimensions(x1 - x0, y1 - y0, tile, fmt))
    out.append(cur)
    return out


def queue_depth(threads: int) -> int:
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
    W, T, ov, N = int(width), int(tile_size), int(overlap), int(levels)
    q = queue_depth(threads)
    stw, sth = (int(v) for v in source_tile)
    R = strip_rows(T, sth) if sth > 0 else T
    if source_itemsize > 1:
        decode_bytes = 8 * max(1, source_pixel_bytes // source_itemsize)
    else:
        decode_bytes = max(3, source_pixel_bytes)
    c0, ck = window_rows(T, ov, R)
    return int(
        4 * R * W
        + 2 * R * W
        + 3 * R * W
        + 3 * c0 * W
        + 3 * ck * (W + N)
        + 6 * (R // 2 + 3) * (W + N)
        + 12 * (R // 32 + 3) * (W // 16 + N)
        + 6 * (R // 2 + 2) * (W + 2)
        + 6 * q * (T + 2 * ov) ** 2
        + 6 * (T + 2 * ov) ** 2
        + 4 * threads * stw * sth * decode_bytes
        + 3 * int(thumbnail_pixels)
        + 6 * int(associated_pixels)
        + SLACK
    )




def sum_dtype(k: int):
    """Sample type of level ``k``'s sums (uint8 pixels at level 0), below it sums of
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


def window_rows(T: int, ov: int, R: int) -> tuple[int, int]:
    """Row capacity of the level-0 window and of the lower levels' windows.

    After a level emits and trims, it keeps fewer than ``T + 2 ov`` rows (the
    unfinished tile row with its overlaps) or one unpaired row; then a strip
    of ``R`` rows arrives at level 0, and at most ``R // 2 + 1`` rows at the
    next level (pairs of the strip plus the unpaired row), fewer below.
    """
    return T + 2 * ov + R, T + 2 * ov + R // 2 + 3


def background_color(value) -> np.ndarray:
    """``(3,)`` uint8 ``(r, g, b)`` from any three integers 0..255 (strings of them too).

    Raises:
        InvalidOptionError: not three integers, or one outside 0..255 (a ``ValueError``).
    """
    try:
        vals = [int(v) for v in value]
    except (TypeError, ValueError):
        raise InvalidOptionError(f"background must be three integers 0..255, got {value!r}") from None
    if len(vals) != 3 or not all(0 <= v <= 255 for v in vals):
        raise InvalidOptionError(f"background must be three integers 0..255, got {value!r}")
    return np.array(vals, np.uint8)


def output_metadata(slide, L: int) -> dict:
    """MPP (µm per output level-0 pixel), objective power, ICC profile (raw bytes or
    None, carried unchanged), acquisition date and instrument (:mod:`.omexml`) of the
    output made from level ``L`` of ``slide``."""
    lv0, lv = slide.levels[0], slide.levels[L]
    fx, fy = lv0.width / lv.width, lv0.height / lv.height
    mpp = slide.mpp
    mag = slide.objective_power
    return {
        "mpp": (mpp[0] * fx, mpp[1] * fy) if mpp else None,
        "mag": (mag / ((fx + fy) / 2)) if mag else None,
        "icc": slide.color_profile,
        "acquired": omexml.acquisition_date(slide.properties),
        "instrument": omexml.instrument_from(slide.properties,
                                             (mag / ((fx + fy) / 2)) if mag else None),
    }




def copy_memory_bound(copied_rows: list[tuple[int, int, int, int]], verify: bool, threads: int) -> int:
    """Buffers of the copy itself (``compression="copy"``), on top of :func:`memory_bound`
    of the computed levels, in bytes.

    ``copied_rows``: ``(tile columns, width, tile_height, largest tile
    bytes)`` of each copied level.  A copied level holds one tile row of encoded bytes
    (``cols`` tiles at most the largest each, plus the one tifffile is
    writing); with ``verify`` one tile row is also decoded, ``3 * width *
    tile_height`` bytes of RGB plus the decoders' ``4 * threads`` tiles.
    The largest level counts (levels are copied one after the other).
    """
    best = 0
    for cols, width, th, tile_bytes in copied_rows:
        b = (cols + 2) * tile_bytes
        if verify:
            b += 3 * width * th + 4 * threads * th * th * 3
        best = max(best, b)
    return int(best)
