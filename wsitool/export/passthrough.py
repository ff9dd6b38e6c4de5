"""Tile passthrough (``compression="copy"``): output levels made of the source's compressed tiles, byte for
byte (floor 6).

What is copied: every source level from the exported one down (its tile grid,
tile size and downsample step, whatever the factor) becomes an output level
whose tiles are the source's encoded bytes, never decoded.  The output page
gets the tags a reader needs to decode them as it decodes the source:

* Compression: the source's code, with one rename for the reader of each
  format: JPEG 2000 tiles that Aperio calls 33005 ("JP2K RGB", a raw code
  stream with the RGB colour transform) are written as 34712 in OME-TIFF
  (the code Bio-Formats and tifffile document for JPEG 2000), and 34712 tiles
  that are raw code streams (start with SOC ``ff4f``, ISO/IEC 15444-1 A.4.1)
  as 33005 in the Aperio layout (OpenSlide's Aperio driver decodes 33003 /
  33005 and refuses 34712).  The bytes are the same code stream either way.
  Aperio 33003 (YCbCr without the colour transform) stays 33003: only readers
  that know it convert its colours.
* PhotometricInterpretation: the source's.  Aperio's JPEG tiles are
  photometric RGB with no colour transform (OpenSlide's Aperio notes); a
  reader told YCbCr would convert colours that are not YCbCr, so RGB stays
  RGB and YCbCr stays YCbCr (TIFF 6.0 section 21, TIFF Technical Note 2).
* JPEGTables (tag 347): the source's, unchanged: abbreviated tiles need the
  tables they were coded with (TIFF Technical Note 2, "JPEGTables").
  YCbCrSubSampling: the source's (TIFF 6.0 section 21; default 2, 2), or for
  a container without tags (DICOM frames) the sampling factors of the
  stream's frame header (ITU-T T.81 B.2.2: luma H and V over chroma's).
* Predictor (TIFF 6.0 section 14; 3 = floating point, Adobe TN3): the
  source's, for the lossless codecs that take one (LZW, deflate, zstd...).

Validation: copying never decodes, so every copied tile goes through the
checks reads run before decoding: the byte range (segment inside the file, no
short read; :func:`wsitool.codec.tilebytes.read_tile_bytes`), the JPEG SOI,
and the header check of the level's codec (nvImageCodec levels:
:func:`wsitool.codec.headers.codestream`, which parses the header and checks
the declared size against the tile cell; others:
:func:`wsitool.codec.headers.check_header`).  ``verify=True`` also decodes
every copied tile through :meth:`Slide.read_region`.  A tile that fails
raises its :class:`~wsitool.errors.TileDecodeError` (``on_error="raise"``),
or with ``on_error="fill"`` is written as a missing tile (byte count 0,
which OpenSlide, tifffile and wsitool read as background / transparent) and
counted in ``tiles_failed``.  Missing source tiles (offset or byte count 0)
stay missing (byte count 0).

What cannot be copied raises a one-line error before anything is written:
a stripped level or a tile size that is not a multiple of 16 (TIFF 6.0
section 15), samples other than 3 x 8 bits interleaved (the computed levels
below are 8-bit RGB, and one OME pyramid has one pixel type), and a region
that is not on the level's tile grid (:func:`plan_copy`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from ..codec.headers import check_header, codestream
from ..codec.pool import DecodeStats
from ..codec.tilebytes import jpeg_stream, read_tile_bytes
from ..errors import InvalidOptionError, InvalidRegionError, TileDecodeError, UnsupportedFormatError
from ..ground.bitstream import SOI, jpeg_sof
from ..ground.geometry import level0_coordinate
from ..ground.naming import about
from ..model import PyramidLevel
from ..slide import pyramid_levels

JPEG = 7
J2K_CODES = frozenset({33003, 33005, 34712})
_NO_PREDICTOR = frozenset({1, 7, 33003, 33005, 34712, 34892, 50001, 34927, 50002})
_SOC = b"\xff\x4f"


@dataclasses.dataclass
class CopiedLevel:
    """One output level made of copied source tiles.

    Attributes:
        level: the source level.
        width, height: the output level's size in pixels.
        col0, row0: source tile column and row of the output's tile (0, 0).
        cols, rows: the output level's tile grid.
        page: tifffile ``TiffWriter.write`` keywords for the page (compression,
            photometric, tile, jpegtables, subsampling, predictor).
        kind: compression named in the Aperio ImageDescription.
    """

    level: PyramidLevel
    width: int
    height: int
    col0: int
    row0: int
    cols: int
    rows: int
    page: dict
    kind: str

    @property
    def tiles(self) -> int:
        return self.cols * self.rows

    def subgrid(self, values) -> np.ndarray:
        """The copied ``(rows, cols)`` part of a per-tile array of the source level
        (offsets or byte counts, in the level's row-major tile order)."""
        lv = self.level
        n = lv.tiles_across * lv.tiles_down
        grid = np.asarray(values[:n]).reshape(lv.tiles_down, lv.tiles_across)
        return grid[self.row0:self.row0 + self.rows, self.col0:self.col0 + self.cols]


@dataclasses.dataclass
class CopyPlan:
    """The copied levels and where the computed ones below them come from.

    Attributes:
        copied: output levels 0 .. len(copied) - 1.
        base: index of the source level the computed levels are made from
            (the last copied one); ``base_rect`` its ``(x, y, w, h)`` in its
            own pixels.
        tile: tile size of the computed levels (the base level's tile width,
            or 256 where that is not a multiple of 16 or tiles are not square).
        reencode: compression of the computed levels: ``"jpeg"`` for JPEG
            sources, ``"jpeg2000"`` for JPEG 2000, ``"none"`` for
            uncompressed, ``"deflate"`` for the other lossless codecs.
    """

    copied: list[CopiedLevel]
    base: int
    base_rect: tuple[int, int, int, int]
    tile: int
    reencode: str


def _refuse(lv: PyramidLevel, why: str) -> UnsupportedFormatError:
    return UnsupportedFormatError(f"{lv.path}: level {lv.index}: compression copy: {why}")


def _copyable(lv: PyramidLevel) -> None:
    """Raise :class:`UnsupportedFormatError` (one line) for a level whose tiles cannot be copied."""
    enc = lv.encoding
    if lv.mosaic is not None:
        raise _refuse(lv, "the level is placed images (MIRAX), not stored tiles")
    if not lv.tiled:
        raise _refuse(lv, "the level is stripped, not tiled (copy needs tiles)")
    if lv.tile_width % 16 or lv.tile_height % 16:
        raise _refuse(lv, f"tile size {lv.tile_width}x{lv.tile_height} is not a multiple of 16 "
                          "(TIFF 6.0 section 15)")
    if lv.samples != 3 or lv.dtype != np.uint8 or lv.tiles.planes != 1 or enc.extrasamples:
        raise _refuse(lv, f"{lv.samples} x {lv.dtype} samples{' planar' if lv.tiles.planes > 1 else ''}"
                          f"{' with extra samples' if enc.extrasamples else ''}; copy takes "
                          "3 interleaved 8-bit samples (RGB or YCbCr)")
    if enc.photometric_code not in (2, 6):
        raise _refuse(lv, f"photometric {enc.photometric} (copy takes RGB or YCbCr)")
    if enc.compression_problem:
        raise _refuse(lv, enc.compression_problem)
    if enc.jpeg_scan_segments:
        raise _refuse(lv, "the tiles are restart intervals of one JPEG scan (Hamamatsu NDPI), "
                          "not JPEG streams a TIFF reader can decode")


def _first_tile(lv: PyramidLevel, col0: int, row0: int, cols: int, rows: int) -> bytes | None:
    """Bytes of the first present tile of the sub-grid (for stream facts), or None."""
    offs, cnts = lv.tiles.offsets, lv.tiles.bytecounts
    for r in range(row0, row0 + rows):
        for c in range(col0, col0 + cols):
            i = r * lv.tiles_across + c
            if int(offs[i]) and int(cnts[i]) and int(offs[i]) + int(cnts[i]) <= lv.source.size:
                return lv.source.read(int(offs[i]), min(int(cnts[i]), 1 << 16))
    return None


def jpeg_sampling(data: bytes) -> tuple[int, int] | None:
    """Chroma subsampling ``(h, v)`` of a JPEG stream's frame header, or None.

    ITU-T T.81 B.2.2: the SOF body (:func:`wsitool.ground.bitstream.jpeg_sof`) is
    precision, Y, X, Nf, then per component ``Ci, Hi << 4 | Vi, Tqi``;
    subsampling is the first component's factors over the second's (``(1, 1)``
    for one component).
    """
    seg = jpeg_sof(data)
    if seg is None:
        return None
    if len(seg) < 12 or seg[5] < 2:
        return (1, 1) if len(seg) >= 6 else None
    h0, v0 = seg[7] >> 4, seg[7] & 15
    h1, v1 = seg[10] >> 4, seg[10] & 15
    if not (h1 and v1) or h0 % h1 or v0 % v1:
        return None
    return h0 // h1, v0 // v1


def page_for(lv: PyramidLevel, fmt: str, first: bytes | None) -> tuple[dict, str]:
    """tifffile page keywords for copied tiles of ``lv`` and the Aperio kind text (module docstring)."""
    enc = lv.encoding
    code = enc.compression_code
    if fmt == "ome-tiff" and code == 33005:
        code = 34712
    elif fmt == "tiff" and code == 34712 and first is not None and first.startswith(_SOC):
        code = 33005
    page = enc.page
    args: dict = {"compression": code, "photometric": enc.photometric_code,
                  "tile": (lv.tile_height, lv.tile_width), "planarconfig": 1}
    if code == JPEG:
        tables = getattr(page, "jpegtables", None)
        if tables:
            args["jpegtables"] = bytes(tables)
        sub = getattr(page, "subsampling", None)
        if sub is None and page is None and first is not None:
            sub = jpeg_sampling(first)
        args["subsampling"] = tuple(int(v) for v in sub) if sub else (2, 2)
        # tifffile writes PhotometricInterpretation = outcolorspace for JPEG pages (default YCbCr)
        args["compressionargs"] = {"outcolorspace": enc.photometric_code}
    elif code not in _NO_PREDICTOR and page is not None and int(page.predictor or 1) > 1:
        args["predictor"] = int(page.predictor)
    name = {7: "JPEG", 33003: "J2K/YCbCr", 33005: "J2K/RGB", 34712: "J2K"}.get(code, enc.compression)
    colour = "" if code in J2K_CODES else f"/{enc.photometric}"
    return args, f"{name}{colour} copied"


def reencode_for(lv: PyramidLevel) -> str:
    """Compression of the levels computed below the copied ones (see :class:`CopyPlan`)."""
    code = lv.encoding.compression_code
    if code == JPEG:
        return "jpeg"
    if code in J2K_CODES:
        return "jpeg2000"
    return "none" if code == 1 else "deflate"


def _aligned(v: int, step: int, end: int, size: int) -> bool:
    return v % step == 0 and (end == size or end % step == 0)


def plan_copy(slide, L: int, rx: int, ry: int, w: int, h: int, fmt: str) -> CopyPlan:
    """Which source levels are copied, for an export of level ``L``'s ``(rx, ry, w, h)``.

    The whole level (``rx = ry = 0``, ``w, h`` its size): level ``L`` and
    every smaller source level are copied as they are (any downsample step).
    A region: it must lie inside level ``L`` and on its tile grid (``rx``,
    ``ry`` multiples of the tile size, the right / bottom edge on the grid or
    at the level's edge); a smaller level ``k`` is copied too while its size
    is ``ceil`` of level ``L``'s by an integer factor ``f`` and the region, in
    its pixels, is on its grid as well; the levels below the last copied one
    are computed from it.

    Raises:
        InvalidRegionError: the region is not tile-aligned (one line saying how).
        UnsupportedFormatError: a level's tiles cannot be copied (module docstring).
        InvalidOptionError: ``fmt`` is ``dzi`` (a ``ValueError``).
    """
    if fmt == "dzi":
        raise InvalidOptionError("compression copy writes TIFF formats (tiff, ome-tiff); Deep Zoom tiles "
                         "are re-encoded")
    levels = pyramid_levels(slide)
    lv = levels[L]
    _copyable(lv)
    whole = (rx, ry, w, h) == (0, 0, lv.width, lv.height)
    if not whole:
        with about(slide.path):
            _check_copy_region(lv, L, (rx, ry, w, h))
    copied: list[CopiedLevel] = []
    base_rect = (rx, ry, w, h)
    for k in range(L, len(levels)):
        src = levels[k]
        rect = base_rect if k == L else _copied_rect(lv, src, whole, (rx, ry, w, h))
        if rect is None:
            break  # computed from the last copied level instead
        cx, cy, cw, ch = rect
        col0, row0 = cx // src.tile_width, cy // src.tile_height
        cols, rows = -(-cw // src.tile_width), -(-ch // src.tile_height)
        page, kind = page_for(src, fmt, _first_tile(src, col0, row0, cols, rows))
        copied.append(CopiedLevel(src, cw, ch, col0, row0, cols, rows, page, kind))
        base_rect = rect
    base = copied[-1].level
    tile = base.tile_width if base.tile_width == base.tile_height else 256
    return CopyPlan(copied, base.index, base_rect, tile, reencode_for(base))


def _check_copy_region(lv: PyramidLevel, L: int, rect: tuple[int, int, int, int]) -> None:
    """Raise :class:`InvalidRegionError` for a region (pixels of ``lv``, level ``L``) that is not inside
    the level or not on its tile grid."""
    rx, ry, w, h = rect
    tw, th = lv.tile_width, lv.tile_height
    if rx < 0 or ry < 0 or rx + w > lv.width or ry + h > lv.height:
        raise InvalidRegionError(
            f"compression copy: region {rx},{ry} {w}x{h} (level {L} pixels) is not "
            f"inside the {lv.width}x{lv.height} level")
    if not (_aligned(rx, tw, rx + w, lv.width) and _aligned(ry, th, ry + h, lv.height)):
        raise InvalidRegionError(
            f"compression copy: region {rx},{ry} {w}x{h} (level {L} pixels) is not "
            f"on the {tw}x{th} tile grid (x, y, and the right/bottom edge unless at the level's "
            "edge, must be multiples of the tile size)")


def _copied_rect(lv: PyramidLevel, src: PyramidLevel, whole: bool,
                 rect: tuple[int, int, int, int]) -> tuple[int, int, int, int] | None:
    """The part of the smaller level ``src`` copied for ``rect`` of ``lv`` (pixels of ``src``),
    or None when ``src`` cannot be copied (its tiles, or a size or grid the region does not
    divide: :func:`plan_copy`)."""
    try:
        _copyable(src)
    except UnsupportedFormatError:
        return None
    if whole:
        return 0, 0, src.width, src.height
    rx, ry, w, h = rect
    f = round(lv.width / src.width)
    if (f < 2 or src.width != -(-lv.width // f) or src.height != -(-lv.height // f)
            or not _aligned(rx, f * src.tile_width, rx + w, lv.width)
            or not _aligned(ry, f * src.tile_height, ry + h, lv.height)):
        return None
    cx, cy, cw, ch = rx // f, ry // f, -(-w // f), -(-h // f)
    if rx + w == lv.width:
        cw = src.width - cx
    if ry + h == lv.height:
        ch = src.height - cy
    return cx, cy, cw, ch


class TileChecker:
    """The pre-decode checks of the read path for one level's tiles (module docstring)."""

    def __init__(self, lv: PyramidLevel):
        self.lv = lv
        self.stats = DecodeStats()
        self.nv = lv.encoding.codec == "nv"
        self.jpeg = lv.encoding.stream == "jpeg"

    def read(self, col: int, row: int) -> bytes | None:
        """The checked bytes of tile ``(col, row)``; None for a missing tile.

        Raises:
            TileDecodeError: past the end of the file, short read, no SOI, a
                bad or mismatched header.
            OSError: the read failed (``filename``: the slide's path where the error named none).
        """
        lv = self.lv
        try:
            data = read_tile_bytes(lv, row * lv.tiles_across + col, col, row, self.stats)
        except OSError as exc:  # (EIO of a failing disk: the one line names the slide, not the output)
            if exc.filename is not None:
                raise
            raise OSError(exc.errno, exc.strerror, str(lv.path)) from exc
        if data is None:
            return None
        if self.nv:
            codestream(lv, data, col, row)  # SOI (JPEG), header parse, size against the cell
        else:
            if self.jpeg and not data.startswith(SOI):
                jpeg_stream(lv, data, col, row)  # raises the read path's "not a JPEG stream"
            check_header(lv, data, col, row)
        return data


def copied_tiles(slide, cl: CopiedLevel, *, on_error: str, verify: bool, threads: int,
                 failed: set, counter) -> Iterator[bytes]:
    """The output tiles of ``cl`` in row-major order, as checked source bytes.

    Missing and (with ``on_error="fill"``) failed tiles are ``b""`` (byte
    count 0).  ``failed`` collects ``(level, col, row)`` of the tiles that
    failed (source grid); ``counter.add()`` is called per tile.
    """
    lv = cl.level
    check = TileChecker(lv)
    for r in range(cl.rows):
        sr = cl.row0 + r
        row: list[bytes | None] = []
        for c in range(cl.cols):
            sc = cl.col0 + c
            try:
                row.append(check.read(sc, sr))
            except TileDecodeError:
                if on_error != "fill":
                    raise
                failed.add((lv.index, sc, sr))
                row.append(None)
        if verify:
            _verify_row(slide, cl, sr, row, on_error, threads, failed)
        for data in row:
            counter.add()
            yield data if data is not None else b""


def _verify_row(slide, cl: CopiedLevel, sr: int, row: list, on_error: str, threads: int,
                failed: set) -> None:
    """Decode the present tiles of source tile row ``sr`` through the read path."""
    lv = cl.level
    tw, th = lv.tile_width, lv.tile_height
    y0 = sr * th
    rows = min(th, lv.height - y0)
    present = [i for i, d in enumerate(row) if d is not None]
    if not present:
        return
    ds = lv.downsample

    def read(c0: int, c1: int) -> None:
        x0 = (cl.col0 + c0) * tw
        x1 = min((cl.col0 + c1) * tw, lv.width)
        slide.read_region((level0_coordinate(x0, ds), level0_coordinate(y0, ds)), lv.index,
                          (x1 - x0, rows), mode="rgb", threads=threads, on_error="raise")

    try:
        read(present[0], present[-1] + 1)
        return
    except TileDecodeError:
        if on_error != "fill":
            raise
    for i in present:  # find the tiles that fail
        try:
            read(i, i + 1)
        except TileDecodeError:
            failed.add((lv.index, cl.col0 + i, sr))
            row[i] = None
