"""The Leica SCN layout (SCN400 and Versa BigTIFFs): its XML, levels, macro, bounds (floor 3).

Source: OpenSlide 4.0.1's Leica reader (``openslide-vendor-leica.c``), in wsitool's words:

- **Mark.** The first IFD is tiled and its ImageDescription is an XML document whose root
  element ``scn`` is in the namespace ``http://www.leica-microsystems.com/scn/2010/03/10`` or
  ``.../2010/10/01``.  The root's ``collection`` (``sizeX``/``sizeY``: the slide's extent in
  nanometres) holds ``image`` elements; each has a ``view`` (``sizeX``, ``sizeY``,
  ``offsetX``, ``offsetY``: its extent and place in the collection, nanometres) and
  ``pixels/dimension`` elements (``ifd``: the top-level IFD, ``sizeX``/``sizeY``; only those
  whose ``z`` is absent or ``0``), ordered largest width first.  Every integer attribute
  named is required and a whole number.
- **Macro and main images.** An image whose view is the whole collection (offset 0, same
  extent) is a macro image; the others are main images.  Only images whose
  ``scanSettings/illuminationSettings/illuminationSource`` is ``brightfield`` are read.
  The brightfield macro's largest dimension is the associated image ``macro`` (two
  brightfield macros: refused).  OpenSlide composites every brightfield main image: they
  must agree in illumination, objective and number of dimensions, and a dimension's
  resolution (view width over pixel width, nm per pixel) within 2% of the first image's.
- **Levels.** Level ``k`` has the smallest nm per pixel of the main images' ``k``-th
  dimensions; its size is the collection's extent at that resolution, rounded up.  Each
  main image is an *area* of the level: its stored IFD placed at its view offset over the
  level's nm per pixel (truncated), painted in image order; the rest is transparent.
  Level 0's areas are ``openslide.region[i].x|y|width|height`` (the IFD's own size), their
  union ``openslide.bounds-*``.
- **Properties.** ``leica.barcode`` and ``openslide.barcode`` (the ``collection/barcode``
  element's text, base64-decoded, else the collection's ``barcode`` attribute as it is); from
  the first main image ``leica.aperture``, ``leica.creation-date``, ``leica.device-model``,
  ``leica.device-version``, ``leica.illumination-source``, ``leica.objective``, and
  ``openslide.objective-power`` where the objective is an integer.  MPP from level 0's first
  IFD's resolution tags; its ``tiff.*`` tags are the slide's, without the XML.  No ICC profile,
  for the slide or the macro, whatever the IFDs carry.
- **Quickhash.** With one brightfield main image, at most one macro and no other image: the
  main image's smallest dimension; otherwise the brightfield macro's smallest dimension
  (none: OpenSlide refuses the slide).  The text tags hashed are level 0's first IFD's.

wsitool reads every such placement.  Where it is the stored tile grid itself (every area's
offset at a level a whole number of tiles, its width and height whole tiles or reaching the
level's edge, the areas apart) the level is one tile grid in which the tiles outside the areas
are missing (transparent), read as any tiled level.  Elsewhere (a main image at any other
offset, of a size not whole tiles, overlapping another) the level is a mosaic of the areas'
stored tiles, each at its whole-pixel place and clipped to its image, the first image in front
where they overlap (:mod:`.leica_mosaic`; JPEG tiles only).  Both keep the areas
(:attr:`wsitool.model.PyramidLevel.areas`) for the drop-in, which paints each at OpenSlide's
whole pixel.

**Fluorescence.** OpenSlide reads no slide without a brightfield main image.  wsitool reads
the first main image of another illumination as a fluorescence slide, as Bio-Formats lists
it: its dimensions grouped by the ``r`` attribute (resolution, 0 largest), each level the
``c`` attribute's IFDs (channels ``C0``, ``C1``, ..., single-sample, of one size) at the
image's own size (no collection canvas).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
import xml.etree.ElementTree as ET

import numpy as np
import tifffile

from ...errors import CorruptFileError, UnsupportedFormatError
from ...model import PyramidLevel, TileIndex
from ...mosaic import DecodedImages
from .leica_mosaic import mosaic_canvas_level
from .tags import description

__all__ = ["NAMESPACES", "Dimension", "Image", "Collection", "is_leica", "parse", "hashed_ifds",
           "properties", "canvas_level", "bounds_properties", "MAX_CANVAS_TILES"]

NAMESPACES = ("http://www.leica-microsystems.com/scn/2010/03/10",
              "http://www.leica-microsystems.com/scn/2010/10/01")
BRIGHTFIELD = "brightfield"
#: Most tiles the levels' canvas grids may hold together (their tables: 16 bytes a tile); a
#: collection claiming more is refused, so no file sets how much memory the tables take.
MAX_CANVAS_TILES = 1 << 22


@dataclasses.dataclass(frozen=True)
class Dimension:
    """One ``pixels/dimension``: its IFD, its size, and its ``c`` and ``r`` attributes (0 when absent)."""

    ifd: int
    width: int
    height: int
    c: int = 0
    r: int = 0


@dataclasses.dataclass
class Image:
    """One ``image`` of the collection (module docstring); ``dims`` those of z-plane 0,
    largest width first."""

    text: dict[str, str | None]
    nm_across: int
    nm_down: int
    offset_x: int
    offset_y: int
    dims: list[Dimension]
    is_macro: bool = False

    @property
    def brightfield(self) -> bool:
        return self.text["illumination"] == BRIGHTFIELD


@dataclasses.dataclass
class Collection:
    """The parsed ``collection``: barcode, extent (nm) and images in document order."""

    barcode: str | None
    nm_across: int
    nm_down: int
    images: list[Image]

    def main_images(self) -> list[Image]:
        """The brightfield main images OpenSlide composites, in document order."""
        return [i for i in self.images if not i.is_macro and i.brightfield]

    def macro(self) -> Image | None:
        """The brightfield macro image, or None.

        Raises:
            CorruptFileError: more than one (OpenSlide refuses the slide).
        """
        macros = [i for i in self.images if i.is_macro and i.brightfield]
        if len(macros) > 1:
            raise CorruptFileError("Leica SCN: several macro images")
        return macros[0] if macros else None

    def fluorescence(self) -> Image | None:
        """The first main image that is not brightfield, or None."""
        return next((i for i in self.images if not i.is_macro and not i.brightfield), None)


def is_leica(first_desc: str) -> bool:
    """True when the first ImageDescription names a Leica SCN namespace (checked whole by :func:`parse`)."""
    return any(ns in first_desc for ns in NAMESPACES)


def _int(node: ET.Element, name: str) -> int:
    """An integer attribute as OpenSlide parses one: present, a whole decimal number (leading
    white space allowed, nothing after), in the int64 range."""
    value = node.get(name)
    text = (value or "").lstrip(" \t\n\v\f\r")
    digits = text[1:] if text[:1] in "+-" else text
    if value is None or not digits.isascii() or not digits.isdigit():
        raise CorruptFileError(f"Leica SCN: {_local(node.tag)} attribute {name} missing or not an integer")
    out = int(text, 10)
    if not -(1 << 63) <= out < (1 << 63):
        raise CorruptFileError(f"Leica SCN: {_local(node.tag)} attribute {name} out of range")
    return out


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _text(node: ET.Element | None) -> str | None:
    """The text of an element as XPath's string() gives it (all descendant text), None for no element."""
    return None if node is None else "".join(node.itertext())


def parse(first_desc: str) -> Collection:
    """The collection of the first IFD's SCN XML (module docstring).

    Raises:
        CorruptFileError: no XML, another root or namespace, no collection, an image without a
            view, or a required integer attribute missing or malformed.
    """
    try:
        root = ET.fromstring(first_desc)
    except ET.ParseError as exc:
        raise CorruptFileError(f"Leica SCN: the ImageDescription is no XML: {exc}") from None
    ns = root.tag[1:].split("}", 1)[0] if root.tag.startswith("{") else ""
    if ns not in NAMESPACES:
        raise CorruptFileError(f"Leica SCN: unexpected XML namespace {ns!r}")
    if _local(root.tag) != "scn":
        raise CorruptFileError("Leica SCN: can't find collection element")
    d = f"{{{ns}}}"
    coll = root.find(f"{d}collection")
    if coll is None:
        raise CorruptFileError("Leica SCN: can't find collection element")
    barcode_text = _text(coll.find(f"{d}barcode"))
    if barcode_text is not None:
        try:
            barcode: str | None = base64.b64decode(barcode_text.encode("ascii", "ignore")).decode(
                "utf-8", "replace").split("\0", 1)[0]
        except (binascii.Error, ValueError):
            barcode = ""
    else:
        barcode = coll.get("barcode")
    nm_across, nm_down = _int(coll, "sizeX"), _int(coll, "sizeY")
    images = [_image(node, d, nm_across, nm_down) for node in coll.findall(f"{d}image")]
    return Collection(barcode, nm_across, nm_down, images)


def _image(node: ET.Element, d: str, coll_across: int, coll_down: int) -> Image:
    view = node.find(f"{d}view")
    if view is None:
        raise CorruptFileError("Leica SCN: an image has no view element")
    illum = f"{d}scanSettings/{d}illuminationSettings/"
    text = {
        "creation-date": _text(node.find(f"{d}creationDate")),
        "illumination": _text(node.find(f"{illum}{d}illuminationSource")),
        "objective": _text(node.find(f"{d}scanSettings/{d}objectiveSettings/{d}objective")),
        "aperture": _text(node.find(f"{illum}{d}numericalAperture")),
    }
    device = node.find(f"{d}device")
    text["device-model"] = device.get("model") if device is not None else None
    text["device-version"] = device.get("version") if device is not None else None
    across, down = _int(view, "sizeX"), _int(view, "sizeY")
    ox, oy = _int(view, "offsetX"), _int(view, "offsetY")
    dims = []
    for dim in node.findall(f"{d}pixels/{d}dimension"):
        if dim.get("z") not in (None, "0"):
            continue  # other z-planes: not read (OpenSlide)
        dims.append(Dimension(_int(dim, "ifd"), _int(dim, "sizeX"), _int(dim, "sizeY"),
                              _opt_int(dim, "c"), _opt_int(dim, "r")))
    dims.sort(key=lambda x: -x.width)  # (stable: equal widths keep their order)
    is_macro = ox == 0 and oy == 0 and across == coll_across and down == coll_down
    return Image(text, across, down, ox, oy, dims, is_macro)


def _opt_int(node: ET.Element, name: str) -> int:
    return 0 if node.get(name) is None else _int(node, name)


def _legacy_hash(coll: Collection) -> bool:
    main = [i for i in coll.images if not i.is_macro]
    macros = len(coll.images) - len(main)
    return all(i.brightfield for i in main) and len(main) == 1 and macros <= 1


def hashed_ifds(coll: Collection) -> tuple[int, int] | None:
    """``(IFD whose tiles OpenSlide hashes, IFD whose text tags it hashes)``, or None where
    OpenSlide reads no slide (no brightfield main image, or no IFD to hash)."""
    main = coll.main_images()
    if not main or not main[0].dims:
        return None
    if _legacy_hash(coll):
        return main[0].dims[-1].ifd, main[0].dims[0].ifd
    macros = [i for i in coll.images if i.is_macro and i.brightfield]
    if len(macros) != 1 or not macros[0].dims:
        return None
    return macros[0].dims[-1].ifd, main[0].dims[0].ifd


def properties(coll: Collection, image: Image) -> tuple[dict[str, str], float | None]:
    """``(leica.* and openslide.barcode properties, objective power)`` of the slide whose first
    main image is ``image``."""
    props: dict[str, str] = {}
    if coll.barcode is not None:
        props["leica.barcode"] = props["openslide.barcode"] = coll.barcode
    keys = (("aperture", "aperture"), ("creation-date", "creation-date"), ("device-model", "device-model"),
            ("device-version", "device-version"), ("illumination-source", "illumination"),
            ("objective", "objective"))
    for key, field in keys:
        value = image.text[field]
        if value is not None:
            props[f"leica.{key}"] = value
    objective = _c_int(image.text["objective"])
    return props, None if objective is None else float(objective)


def _c_int(text: str | None) -> int | None:
    """``text`` as an integer where OpenSlide's int64 parser takes it whole, else None."""
    if text is None:
        return None
    body = text.lstrip(" \t\n\v\f\r")
    digits = body[1:] if body[:1] in "+-" else body
    if not digits or not digits.isascii() or not digits.isdigit():
        return None
    value = int(body, 10)
    return value if -(1 << 63) <= value < (1 << 63) else None


@dataclasses.dataclass(frozen=True)
class Area:
    """One main image at one level: its IFD's stored level and its offset (level pixels)."""

    level: PyramidLevel
    x: int
    y: int


def check_main_images(main: list[Image]) -> None:
    """Refuse main images OpenSlide does not composite (module docstring).

    Raises:
        CorruptFileError: dissimilar main images, or inconsistent resolutions.
    """
    first = main[0]
    if not first.dims:
        raise CorruptFileError("Leica SCN: the main image has no dimension")
    for image in main[1:]:
        if (image.text["objective"] != first.text["objective"]
                or len(image.dims) != len(first.dims)):
            raise CorruptFileError("Leica SCN: slides with dissimilar main images are not supported")
        for mine, theirs in zip(image.dims, first.dims, strict=True):
            a, b = nm_per_pixel(image, mine), nm_per_pixel(first, theirs)
            if not 1 - abs(a - b) / b >= 0.98:
                raise CorruptFileError("Leica SCN: inconsistent main image resolutions")


def nm_per_pixel(image: Image, dim: Dimension) -> float:
    """Nanometres per pixel of a dimension: the view's width over the dimension's.

    Raises:
        CorruptFileError: a width or view width of 0 or less.
    """
    if dim.width <= 0 or image.nm_across <= 0:
        raise CorruptFileError(f"Leica SCN: IFD {dim.ifd}: dimension width {dim.width}, view width "
                               f"{image.nm_across} nm")
    return image.nm_across / dim.width


def level_geometry(coll: Collection, main: list[Image], k: int) -> tuple[float, int, int, list[tuple[int, int]]]:
    """``(nm per pixel, width, height, [(x, y) offset of each main image])`` of level ``k``.

    Raises:
        CorruptFileError: a level of no positive size, or one larger than any TIFF holds.
    """
    nm = min(nm_per_pixel(image, image.dims[k]) for image in main)
    width, height = math.ceil(coll.nm_across / nm), math.ceil(coll.nm_down / nm)
    if not (0 < width < (1 << 40) and 0 < height < (1 << 40)):
        raise CorruptFileError(f"Leica SCN: level {k} of {width}x{height} pixels")
    offsets = [(int(image.offset_x / nm), int(image.offset_y / nm)) for image in main]
    return nm, width, height, offsets


def canvas_level(index: int, width: int, height: int, areas: list[Area],
                 decoded: DecodedImages | None = None) -> PyramidLevel:
    """Level ``index``, ``width`` x ``height``, of the main images' areas (module docstring).

    Where every area lies on the stored tile grid (offsets whole tiles, sizes whole tiles or
    reaching the level's edge, the areas apart, one tile size and encoding), the level is one
    tile grid of the areas' stored tiles placed at their offsets, tiles elsewhere missing; its
    tables are composed when first read.  Otherwise it is a mosaic of the areas' stored tiles
    (:func:`.leica_mosaic.mosaic_canvas_level`, sharing ``decoded``).

    Raises:
        UnsupportedFormatError: a planar or stripped area, an off-grid level whose tiles are
            not JPEG, or a grid too large.
    """
    first = areas[0].level
    tw, th = first.tile_width, first.tile_height
    across, down = -(-width // tw), -(-height // th)
    if across * down > MAX_CANVAS_TILES:
        raise UnsupportedFormatError(f"Leica SCN level {index} of {across}x{down} tiles (over wsitool's limit)")
    cells = _grid_cells(index, width, height, areas)
    if cells is None:
        return mosaic_canvas_level(index, width, height, areas, decoded)

    def load() -> tuple[np.ndarray, np.ndarray]:
        offsets = np.zeros(across * down, np.uint64)
        counts = np.zeros(across * down, np.uint64)
        grid_o, grid_c = offsets.reshape(down, across), counts.reshape(down, across)
        for c0, r0, n_cols, n_rows, tiles, stored_across in cells:
            n = stored_across * n_rows
            src_o = np.asarray(tiles.offsets[:n], np.uint64).reshape(n_rows, stored_across)[:, :n_cols]
            src_c = np.asarray(tiles.bytecounts[:n], np.uint64).reshape(n_rows, stored_across)[:, :n_cols]
            grid_o[r0:r0 + n_rows, c0:c0 + n_cols] = src_o
            grid_c[r0:r0 + n_rows, c0:c0 + n_cols] = src_c
        return offsets, counts

    return PyramidLevel(index=index, width=width, height=height, downsample=1.0, tile_width=tw,
                        tile_height=th, tiled=True, samples=first.samples, dtype=first.dtype,
                        encoding=first.encoding, tiles=TileIndex(None, None, load=load), source=first.source,
                        areas=tuple((a.x, a.y, a.level.width, a.level.height) for a in areas))


def _grid_cells(index: int, width: int, height: int,
                areas: list[Area]) -> list[tuple[int, int, int, int, TileIndex, int]] | None:
    """Where each area's stored tiles go on the canvas's grid (``(first column, first row,
    columns, rows, tile index, stored tiles across)``), or None where the areas are off that
    grid (an offset not whole tiles, a size not whole tiles inside the level, overlapping
    areas, another tile size or encoding than the first's).

    Raises:
        UnsupportedFormatError: a stripped or planar area.
    """
    first = areas[0].level
    tw, th = first.tile_width, first.tile_height
    across, down = -(-width // tw), -(-height // th)
    cells: list[tuple[int, int, int, int, TileIndex, int]] = []
    seen: set[tuple[int, int]] = set()
    for area in areas:
        lv = area.level
        if not lv.tiled or lv.tiles.planes != 1:
            raise UnsupportedFormatError(f"Leica SCN level {index}: a stripped or planar main image")
        if ((lv.tile_width, lv.tile_height, lv.samples, lv.dtype) != (tw, th, first.samples, first.dtype)
                or _encoding_key(lv) != _encoding_key(first)):
            return None
        whole_x = lv.width % tw == 0 or area.x + lv.width >= width
        whole_y = lv.height % th == 0 or area.y + lv.height >= height
        if area.x % tw or area.y % th or area.x < 0 or area.y < 0 or not (whole_x and whole_y):
            return None
        c0, r0 = area.x // tw, area.y // th
        n_cols, n_rows = min(lv.tiles_across, across - c0), min(lv.tiles_down, down - r0)
        mine = {(c0 + col, r0 + row) for row in range(n_rows) for col in range(n_cols)}
        if mine & seen:
            return None
        seen |= mine
        cells.append((c0, r0, n_cols, n_rows, lv.tiles, lv.tiles_across))
    return cells


def _encoding_key(lv: PyramidLevel) -> tuple:
    enc = lv.encoding
    return tuple(getattr(enc, f.name) for f in dataclasses.fields(enc) if f.name not in ("page", "colormap"))


def bounds_properties(areas: list[Area]) -> dict[str, str]:
    """``openslide.region[i].*`` of level 0's areas (the IFDs' own sizes) and ``openslide.bounds-*``."""
    props: dict[str, str] = {}
    for i, a in enumerate(areas):
        props[f"openslide.region[{i}].x"] = str(a.x)
        props[f"openslide.region[{i}].y"] = str(a.y)
        props[f"openslide.region[{i}].width"] = str(a.level.width)
        props[f"openslide.region[{i}].height"] = str(a.level.height)
    x0 = min(a.x for a in areas)
    y0 = min(a.y for a in areas)
    props["openslide.bounds-x"], props["openslide.bounds-y"] = str(x0), str(y0)
    props["openslide.bounds-width"] = str(max(a.x + a.level.width for a in areas) - x0)
    props["openslide.bounds-height"] = str(max(a.y + a.level.height for a in areas) - y0)
    return props


def page(pages: list[tifffile.TiffPage], ifd: int) -> tifffile.TiffPage:
    """Top-level IFD ``ifd`` that a dimension names.

    Raises:
        CorruptFileError: no such IFD, or one that is not an image.
    """
    if not 0 <= ifd < len(pages) or not isinstance(pages[ifd], tifffile.TiffPage):
        raise CorruptFileError(f"Leica SCN: a dimension names IFD {ifd}, which the file does not hold")
    return pages[ifd]


def check_dimension(p: tifffile.TiffPage, dim: Dimension) -> None:
    """Refuse an IFD OpenSlide cannot read as a level (untiled).

    Raises:
        CorruptFileError: the IFD is not tiled.
    """
    if not p.is_tiled:
        raise CorruptFileError(f"Leica SCN: IFD {dim.ifd} is not tiled")


def first_description(pages: list[tifffile.TiffPage]) -> str:
    """The first IFD's ImageDescription ("" where there is none)."""
    return description(pages[0]) if pages else ""
