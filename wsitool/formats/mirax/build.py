"""A MIRAX slide's pyramid from its parsed Slidedat.ini, index and data files (floor 3).

The order and the checks are OpenSlide 4.0.1's ``mirax_open`` / ``process_indexfile``
(:mod:`wsitool.formats.mirax` has the summary); what OpenSlide refuses is a
:class:`~wsitool.errors.CorruptFileError` here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import zlib
from collections.abc import Callable

import numpy as np

from ...errors import CorruptFileError, ResourceLimitError
from ...ground.bitstream import jpeg_frame_size
from ...model import AssociatedImage, Pyramid, TileEncoding, level_properties
from ...mosaic import DecodedImages, MosaicBuilder, mosaic_level
from ...storage import ByteSource
from ..deferred import DeferredProperties
from ..quickhash import KEY as QUICKHASH
from . import index as index_file
from .layout import Grid, ZoomLevel, base_size, level_params, place_level
from .slidedat import KeyFile, finite

__all__ = ["build_pyramid", "read_all", "MAX_POSITIONS", "MAX_LEVEL_PIXELS", "TILE"]

GENERAL, HIER, DATAFILE = "GENERAL", "HIERARCHICAL", "DATAFILE"
SLIDE_ZOOM_LEVEL = "Slide zoom level"
POSITION_BUFFER, STITCHING = "VIMSLIDE_POSITION_BUFFER", "StitchingIntensityLayer"
SCAN_DATA_LAYER = "Scan data layer"
#: name -> (Scan data layer value, its section's format key), OpenSlide's order
ASSOCIATED = {"macro": ("ScanDataLayer_SlideThumbnail", "THUMBNAIL_IMAGE_TYPE"),
              "label": ("ScanDataLayer_SlideBarcode", "BARCODE_IMAGE_TYPE"),
              "thumbnail": ("ScanDataLayer_SlidePreview", "PREVIEW_IMAGE_TYPE")}
FORMATS = {"JPEG": "jpeg", "PNG": "png", "BMP24": "bmp"}
#: Most camera positions (photos) a slide may declare (a large real slide has some 10,000).
MAX_POSITIONS = 1 << 22
#: Largest level 0 read (pixels): its virtual tile table stays within 64 MiB.
MAX_LEVEL_PIXELS = 1 << 40
#: Virtual tile size of the levels.
TILE = 512
#: Largest associated image record read (bytes).
MAX_ASSOCIATED_BYTES = 64 << 20

Sibling = Callable[[str, str], ByteSource]


def read_all(src: ByteSource, what: str) -> bytes:
    """All of ``src`` (``what`` names it in the error of a short read)."""
    data = src.read(0, src.size)
    if len(data) != src.size:
        raise CorruptFileError(f"{what}: short read ({len(data)} of {src.size} bytes)")
    return bytes(data)


def _positive(v: int, what: str, zero_ok: bool = False) -> int:
    if v < 0 or (v == 0 and not zero_ok):
        raise CorruptFileError(f"Slidedat.ini: {what} {'<' if zero_ok else '<='} 0: {v}")
    return v


def _nonhier_offset(kf: KeyFile, count: int, name: str, value: str | None = None) -> tuple[int, str | None]:
    """OpenSlide's record number of non-hierarchical ``name`` (and its ``value``), -1 where absent;
    with ``value``, also the value's section."""
    offset = 0
    for i in range(count):
        found = kf.value(HIER, f"NONHIER_{i}_NAME")
        n = kf.integer(HIER, f"NONHIER_{i}_COUNT")
        if n == 0:
            raise CorruptFileError("Slidedat.ini: Nonhier val count is zero")
        if found == name:
            if value is None:
                return offset, None
            for j in range(n):
                if kf.value(HIER, f"NONHIER_{i}_VAL_{j}") == value:
                    return offset + j, kf.value(HIER, f"NONHIER_{i}_VAL_{j}_SECTION")
            return -1, None
        offset += n
    return -1, None


def _zoom(kf: KeyFile, group: str, first: bool) -> ZoomLevel:
    if not kf.has(group):
        raise CorruptFileError(f"Slidedat.ini: Can't find {group} group")
    exp = kf.integer(group, "IMAGE_CONCAT_FACTOR")
    z = ZoomLevel(exp, finite(kf.double(group, "OVERLAP_X"), "OVERLAP_X"),
                  finite(kf.double(group, "OVERLAP_Y"), "OVERLAP_Y"),
                  kf.double(group, "MICROMETER_PER_PIXEL_X"), kf.double(group, "MICROMETER_PER_PIXEL_Y"),
                  kf.integer(group, "IMAGE_FILL_COLOR_BGR"), "", kf.integer(group, "DIGITIZER_WIDTH"),
                  kf.integer(group, "DIGITIZER_HEIGHT"))
    _positive(exp, f"{group} IMAGE_CONCAT_FACTOR", zero_ok=first)
    _positive(z.image_w, f"{group} DIGITIZER_WIDTH")
    _positive(z.image_h, f"{group} DIGITIZER_HEIGHT")
    fmt = kf.value(group, "IMAGE_FORMAT")
    if fmt not in FORMATS:
        raise CorruptFileError(f"Slidedat.ini: Unrecognized image format: {fmt[:40]}")
    if z.image_w > 1 << 16 or z.image_h > 1 << 16:
        raise ResourceLimitError(f"Slidedat.ini: camera images of {z.image_w}x{z.image_h} pixels (at most 65536)")
    return ZoomLevel(exp, z.overlap_x, z.overlap_y, z.mpp_x, z.mpp_y, z.fill_bgr, FORMATS[fmt], z.image_w, z.image_h)


@dataclasses.dataclass(frozen=True)
class Header:
    """What Slidedat.ini says, checked as OpenSlide checks it (:func:`read_header`)."""

    slide_id: str
    images_x: int
    images_y: int
    divisions: int
    index_name: str
    data_names: list[str]
    zooms: list[ZoomLevel]
    position_buffer: int      # non-hierarchical record numbers, -1 where absent
    stitching: int
    associated: dict[str, int]


def read_header(kf: KeyFile) -> Header:
    """The :class:`Header` of a parsed Slidedat.ini.

    Raises:
        CorruptFileError: a group, key or value OpenSlide needs is missing or bad.
        ResourceLimitError: camera images larger than 65536 pixels a side.
    """
    if not kf.has(GENERAL):
        raise CorruptFileError(f"Slidedat.ini: Can't find {GENERAL} group")
    slide_id = kf.value(GENERAL, "SLIDE_ID")
    images_x = kf.integer(GENERAL, "IMAGENUMBER_X")
    images_y = kf.integer(GENERAL, "IMAGENUMBER_Y")
    try:
        divisions = kf.integer(GENERAL, "CameraImageDivisionsPerSide")
    except CorruptFileError:
        divisions = 1
    for v, what in ((images_x, "images_x"), (images_y, "images_y"), (divisions, "image_divisions")):
        _positive(v, what)
    if not kf.has(HIER):
        raise CorruptFileError(f"Slidedat.ini: Can't find {HIER} group")
    hier_count = _positive(kf.integer(HIER, "HIER_COUNT"), "hier_count")
    nonhier_count = _positive(kf.integer(HIER, "NONHIER_COUNT"), "nonhier_count", zero_ok=True)
    zoom_hier = next((i for i in range(hier_count) if kf.value(HIER, f"HIER_{i}_NAME") == SLIDE_ZOOM_LEVEL), -1)
    if zoom_hier == -1:
        raise CorruptFileError("Slidedat.ini: Can't find slide zoom level")
    if zoom_hier != 0:
        raise CorruptFileError("Slidedat.ini: Slide zoom level not HIER_0")
    index_name = kf.value(HIER, "INDEXFILE")
    nlevels = _positive(kf.integer(HIER, "HIER_0_COUNT"), "zoom_levels")
    if nlevels > 64:
        raise CorruptFileError(f"Slidedat.ini: {nlevels} zoom levels")
    groups = [kf.value(HIER, f"HIER_0_VAL_{i}_SECTION") for i in range(nlevels)]
    if not kf.has(DATAFILE):
        raise CorruptFileError(f"Slidedat.ini: Can't find {DATAFILE} group")
    nfiles = _positive(kf.integer(DATAFILE, "FILE_COUNT"), "datafile_count")
    if nfiles > 1 << 16:
        raise CorruptFileError(f"Slidedat.ini: {nfiles} data files")
    names = [kf.value(DATAFILE, f"FILE_{i}") for i in range(nfiles)]
    zooms = [_zoom(kf, g, i == 0) for i, g in enumerate(groups)]
    vim, _ = _nonhier_offset(kf, nonhier_count, POSITION_BUFFER)
    stitch = _nonhier_offset(kf, nonhier_count, STITCHING)[0] if vim == -1 else -1
    assoc = {}
    for name, (value, key) in ASSOCIATED.items():
        rec, section = _nonhier_offset(kf, nonhier_count, SCAN_DATA_LAYER, value)
        if rec != -1:
            fmt = kf.value(section or "", key)
            if fmt != "JPEG":
                raise CorruptFileError(f"Slidedat.ini: Unsupported associated image format: {fmt[:40]}")
            assoc[name] = rec
    return Header(slide_id, images_x, images_y, divisions, index_name, names, zooms, vim, stitch, assoc)


def build_pyramid(kf: KeyFile, ini: bytes, sibling: Sibling) -> Pyramid:
    """The pyramid (module docstring); ``sibling(name, what)`` opens a file of the slide's folder.

    Raises:
        CorruptFileError, ResourceLimitError: see :func:`wsitool.formats.mirax.open_placed`.
    """
    hd = read_header(kf)
    images_x, images_y, divisions, zooms = hd.images_x, hd.images_y, hd.divisions, hd.zooms
    vim, stitch = hd.position_buffer, hd.stitching
    index_name, names, nfiles, slide_id = hd.index_name, hd.data_names, len(hd.data_names), hd.slide_id
    idx_src = sibling(index_name, "index file")
    if idx_src.size > index_file.MAX_BYTES:
        raise ResourceLimitError(f"Index.dat: {idx_src.size} bytes (at most {index_file.MAX_BYTES})")
    idx = index_file.Index(read_all(idx_src, "Index.dat"), slide_id, nfiles)
    idx_src.close()
    data = [sibling(n, "data file") for n in names]
    if images_x > 1 << 20 or images_y > 1 << 20:
        raise ResourceLimitError(f"Slidedat.ini: {images_x}x{images_y} camera images")
    npos = (images_x // divisions) * (images_y // divisions)
    if npos > MAX_POSITIONS:
        raise ResourceLimitError(f"Slidedat.ini: {npos} camera positions (at most {MAX_POSITIONS})")
    position = _positions(idx, data, vim, stitch, npos, zooms, divisions, images_x)
    has_positions = vim != -1 or stitch != -1 or zooms[0].overlap_x != 0 or zooms[0].overlap_y != 0
    params = level_params(zooms, divisions, has_positions)
    base_w, base_h = base_size(images_x, images_y, divisions, zooms[0])
    if base_w * base_h > MAX_LEVEL_PIXELS or base_w < 1 or base_h < 1:
        raise ResourceLimitError(f"MIRAX level 0 of {base_w}x{base_h} pixels")
    associated = {n: _associated(n, idx.nonhier(r), data) for n, r in hd.associated.items()}
    grid = Grid(images_x, images_y, divisions, zooms[0], position, npos)
    levels: list = []
    active: set[int] = set()
    bounds0, last = None, None
    decoded = DecodedImages()  # (one cache of decoded camera images for all the levels)
    for k, (z, lp) in enumerate(zip(zooms, params, strict=True)):
        recs = idx.level_records(k)
        placed = place_level(recs, lp, k, grid, active)
        b = MosaicBuilder(decoded=decoded)
        srcs = [b.source(s) for s in data]
        for (col, row), (r, x, y, sx, sy) in sorted(placed.cells.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            _idx, off, length, fileno = (int(v) for v in recs[r])
            img = b.image(srcs[fileno], off, length, z.image_w, z.image_h, z.image_format)
            isx, isy = int(sx), int(sy)
            w = min(math.ceil(lp.tile_w), z.image_w - isx)
            h = min(math.ceil(lp.tile_h), z.image_h - isy)
            # (in front where they overlap: the highest (row, column), layout's docstring)
            b.place(img, x, y, (isx, isy, w, h), z=row * float(1 << 24) + col)
        if k == 0:
            bounds0 = placed.bounds
        levels.append(mosaic_level(b.build(), index=k, width=base_w // lp.concat, height=base_h // lp.concat,
                                   downsample=float(lp.concat // params[0].concat), tile_width=TILE,
                                   tile_height=TILE))
        last = recs
    props = _properties(kf, zooms[0], levels, bounds0)
    assert last is not None
    hash_parts = [(data[int(f)], int(o), int(n)) for _i, o, n, f in last.tolist()]
    deferred = {QUICKHASH: lambda: _quickhash(ini, hash_parts)}
    return Pyramid(vendor="mirax", levels=tuple(levels), associated=associated,
                   properties=DeferredProperties(props, deferred))


def _positions(idx: index_file.Index, data: list[ByteSource], vim: int, stitch: int, npos: int,
               zooms: list[ZoomLevel], divisions: int, images_x: int) -> Callable[[int], tuple[int, int]]:
    """``photo -> (x, y)`` level-0 position: from the position record, else the nominal grid."""
    record = vim if vim != -1 else stitch
    if record == -1:
        across = images_x // divisions
        step_x = zooms[0].image_w * divisions - zooms[0].overlap_x
        step_y = zooms[0].image_h * divisions - zooms[0].overlap_y
        return lambda cp: (int((cp % across) * step_x), int((cp // across) * step_y))
    off, length, fileno = idx.nonhier(record)
    src = data[fileno]
    expected = 9 * npos
    if off + length > src.size:
        raise CorruptFileError(f"slide position record ({length} bytes at {off}) lies past the end of its data file")
    if record == vim and length != expected:
        raise CorruptFileError("Slide position file not of the expected size")
    raw = src.read(off, length)
    if record == stitch:
        try:
            z = zlib.decompressobj()
            raw = z.decompress(bytes(raw), expected + 1)
        except zlib.error as exc:
            raise CorruptFileError(f"Error decompressing position buffer: {exc}") from None
        if len(raw) != expected:
            raise CorruptFileError(f"Error decompressing position buffer: {len(raw)} bytes, {expected} expected")
    arr = np.frombuffer(bytes(raw), np.dtype([("flag", "u1"), ("x", "<i4"), ("y", "<i4")]), npos)
    bad = arr["flag"] & 0xFE
    if bad.any():
        raise CorruptFileError(f"Unexpected flag value ({int(arr['flag'][np.nonzero(bad)[0][0]])})")
    concat0 = 1 << zooms[0].concat_exponent
    xs = (arr["x"].astype(np.int64) * concat0).astype(np.int32).tolist()
    ys = (arr["y"].astype(np.int64) * concat0).astype(np.int32).tolist()
    return lambda cp: (xs[cp], ys[cp])


def _associated(name: str, where: tuple[int, int, int], data: list[ByteSource]) -> AssociatedImage:
    off, length, fileno = where
    src = data[fileno]
    if off + length > src.size or length > MAX_ASSOCIATED_BYTES:
        raise CorruptFileError(f"Cannot read {name} associated image: {length} bytes at {off} past the end "
                               "of its data file")
    size = jpeg_frame_size(bytes(src.read(off, min(length, 1 << 16)))) or jpeg_frame_size(bytes(src.read(off, length)))
    if not size or min(size) < 1:
        raise CorruptFileError(f"Cannot read {name} associated image: no JPEG frame header")
    w, h = size
    encoding = TileEncoding(compression="JPEG", compression_code=7, photometric="YCBCR", photometric_code=6,
                            bits=8, stream="jpeg", codec="generic", imagecodec="jpeg8")
    return AssociatedImage(name=name, width=w, height=h, samples=3, itemsize=1, planar=False, encoding=encoding,
                           offsets=(off,), bytecounts=(length,), max_segment=(w, h), source=src, tile_size=(w, h))


def _properties(kf: KeyFile, zero: ZoomLevel, levels: list, bounds: tuple[float, float, float, float] | None
                ) -> dict[str, str]:
    props = kf.properties()
    props["openslide.vendor"] = "mirax"
    lw, lh = levels[0].width, levels[0].height
    if bounds is not None:
        x, y = bounds[0], bounds[1]
        w, h = min(bounds[2] - x, lw - x), min(bounds[3] - y, lh - y)
        if not (x == 0 and y == 0 and w == lw and h == lh):
            props["openslide.bounds-x"] = str(math.floor(x))
            props["openslide.bounds-y"] = str(math.floor(y))
            props["openslide.bounds-width"] = str(math.ceil(x + w) - math.floor(x))
            props["openslide.bounds-height"] = str(math.ceil(y + h) - math.floor(y))
    bgr = zero.fill_bgr & 0xFFFFFFFF
    props["openslide.background-color"] = f"{bgr & 0xFF:02X}{(bgr >> 8) & 0xFF:02X}{(bgr >> 16) & 0xFF:02X}"
    objective = _objective(kf.get(GENERAL, "OBJECTIVE_MAGNIFICATION"))
    if objective > 0:
        props["openslide.objective-power"] = str(objective)
    props["openslide.mpp-x"] = repr(zero.mpp_x)
    props["openslide.mpp-y"] = repr(zero.mpp_y)
    props.update(level_properties(levels))
    return props


def _objective(text: str | None) -> int:
    """OBJECTIVE_MAGNIFICATION as OpenSlide reads it: a whole int64 (a trailing ``x`` dropped), else 0."""
    if text is None:
        return 0
    if text.endswith("x"):
        text = text[:-1]
    m = _INT64.fullmatch(text)
    v = int(m.group(1)) if m else 0
    return v if -(1 << 63) <= v < (1 << 63) else 0


_INT64 = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


def _quickhash(ini: bytes, parts: list[tuple[ByteSource, int, int]]) -> str:
    """SHA-256 of Slidedat.ini's bytes, then of each lowest-level image's bytes in index order.

    Raises:
        CorruptFileError: an image past the end of its data file.
    """
    h = hashlib.sha256(ini)
    for src, off, length in parts:
        if off + length > src.size:
            raise CorruptFileError(f"Can't hash images: {length} bytes at {off} lie past the end of a data file")
        h.update(bytes(src.read(off, length)))
    return h.hexdigest()
