"""The Ventana layout (Roche/Ventana BIF and Ventana TIFF): its XMP, levels, associated images (floor 3).

Source: OpenSlide 4.0.1's Ventana reader (``openslide-vendor-ventana.c``), in wsitool's words:

- **Mark.** The first IFD's XMP packet (tag 700) contains ``iScan`` and is an XML document
  whose root is ``iScan``, or ``Metadata`` with an ``iScan`` child.
- **Levels.** The top-level IFDs whose ImageDescription contains ``level=``: the text is
  ``key=value`` pairs split at spaces, ``level`` (0, 1, 2, ... in file order) and ``mag``
  (falling from level to level) required; each such IFD tiled, with level 0's tile size.
  A level's downsample is level 0's ``mag`` over its own (not its size ratio).
- **Associated images.** ImageDescription exactly ``Label Image`` or ``Label_Image``:
  ``macro``; exactly ``Thumbnail``: ``thumbnail``.  Other IFDs are neither.
- **Properties.** Every non-empty attribute of the ``iScan`` element as ``ventana.<name>``;
  objective power from ``ventana.Magnification`` (an integer), MPP (both axes) from
  ``ventana.ScanRes``; no MPP from the TIFF resolution tags.  The ``tiff.*`` properties,
  and the text tags of ``openslide.quickhash-1``, are level 0's IFD's; the hash's tiles
  those of the smallest level.
- **BIF tile map.** Where level 0's IFD has an XMP packet of its own (a BIF), its
  ``EncodeInfo`` gives the areas of interest (``SlideStitchInfo/ImageInfo`` with
  ``AOIScanned`` not 0, paired with ``AoiOrigin``'s children) and the joints between
  neighbouring tiles (``TileJointInfo``: ``OverlapX``/``OverlapY`` weighted by
  ``Confidence``).  OpenSlide places every tile of an area at a step of the tile size less
  the mean overlap, which may be fractional, and sizes each level to cover them all; it
  reports each area as ``openslide.region[i].x|y|width|height`` and sets no
  ``openslide.bounds-*``.  Where that placement is the stored tile grid itself (tiles that
  abut, one area at the origin, every level's share of a level-0 tile whole and inside the
  stored image: :func:`on_stored_grid`), each level is its stored image cut to the area's
  extent (:func:`fix_levels`).  Other BIFs (overlapping tiles, several or offset areas)
  become mosaic levels of the stored tiles at OpenSlide's positions
  (:mod:`.ventana_mosaic`).
"""

from __future__ import annotations

import dataclasses
import math
import re
import xml.etree.ElementTree as ET

import tifffile

from ...errors import CorruptFileError, UnsupportedFormatError
from ...model import PyramidLevel
from .tags import description

__all__ = ["is_ventana", "xmp", "iscan_properties", "level_info", "associated_name", "Bif", "parse_bif",
           "fix_levels", "metadata"]

_SPACE = "[ \t\n\v\f\r]*"  # what C's strtod and strtoll skip before a number
_DOUBLE = re.compile(_SPACE + r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_INT = re.compile(_SPACE + r"[+-]?[0-9]+")
_ASSOCIATED = {"Label Image": "macro", "Label_Image": "macro", "Thumbnail": "thumbnail"}


def xmp(page: tifffile.TiffPage) -> str | None:
    """The XMP packet (tag 700) of ``page`` as text, or None where it has none."""
    tag = page.tags.get(700)
    if tag is None:
        return None
    value = tag.value
    if isinstance(value, bytes | bytearray):
        return bytes(value).split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(value)


def is_ventana(tiff: tifffile.TiffFile) -> bool:
    """True when the first IFD's XMP packet contains ``iScan`` (checked whole by :func:`iscan_properties`)."""
    packet = xmp(tiff.pages.first)
    return packet is not None and "iScan" in packet


def _parse(text: str, what: str) -> ET.Element:
    try:
        return ET.fromstring(text)
    except ET.ParseError as exc:
        raise CorruptFileError(f"Ventana: {what} is no XML: {exc}") from None


def iscan_properties(first: tifffile.TiffPage) -> dict[str, str]:
    """The ``ventana.*`` properties: the ``iScan`` element's non-empty attributes.

    Raises:
        CorruptFileError: the XMP is no XML, or holds no ``iScan`` element where OpenSlide looks.
    """
    root = _parse(xmp(first) or "", "the first IFD's XMP packet")
    iscan = root if root.tag == "iScan" else root.find("iScan") if root.tag == "Metadata" else None
    if iscan is None:
        raise CorruptFileError(f"Ventana: no iScan element in the XMP packet (root {root.tag!r})")
    return {f"ventana.{_local(k)}": v for k, v in iscan.attrib.items() if v}


def _local(name: str) -> str:
    return name.rsplit("}", 1)[-1]


def level_info(page: tifffile.TiffPage) -> tuple[int, float] | None:
    """``(level, mag)`` of a level IFD (its ImageDescription contains ``level=``), else None.

    Raises:
        CorruptFileError: a ``level`` or ``mag`` field missing or not a number.
    """
    desc = description(page)
    if "level=" not in desc:
        return None
    fields: dict[str, str] = {}
    for pair in desc.split(" "):
        key, sep, value = pair.partition("=")
        if sep:
            fields[key] = value
    if "level" not in fields or "mag" not in fields:
        raise CorruptFileError(f"Ventana: IFD {page.index}: a level field is missing in {desc[:80]!r}")
    try:
        level = int(fields["level"], 10)
        mag = float(fields["mag"])
    except ValueError:
        raise CorruptFileError(f"Ventana: IFD {page.index}: level or magnification does not parse") from None
    if not math.isfinite(mag):
        raise CorruptFileError(f"Ventana: IFD {page.index}: invalid magnification")
    return level, mag


def associated_name(page: tifffile.TiffPage) -> str | None:
    """``macro`` / ``thumbnail`` for those IFDs, None for a level, ``""`` for anything else."""
    desc = description(page)
    if "level=" in desc:
        return None
    return _ASSOCIATED.get(desc, "")


@dataclasses.dataclass(frozen=True)
class Area:
    """One scanned area of interest: its first tile column and row, tiles across and down, and
    (``x``, ``y``) its position in level-0 pixels (``Pos-X``, and ``Pos-Y`` turned to count
    from the top, as whole numbers as OpenSlide keeps them)."""

    start_col: int
    start_row: int
    across: int
    down: int
    x: int = 0
    y: int = 0


@dataclasses.dataclass(frozen=True)
class Bif:
    """A BIF's tile map (module docstring): its areas and the tile step (level-0 pixels)."""

    areas: tuple[Area, ...]
    advance_x: float
    advance_y: float


def _num(node: ET.Element, name: str, kind: type = int) -> float:
    """The attribute ``name`` of ``node`` as an integer (``kind`` int) or a float."""
    text = str(node.get(name))
    try:
        return float(text) if kind is float else int(text, 10)
    except ValueError:
        raise CorruptFileError(f"Ventana: EncodeInfo: attribute {name} missing or not a number") from None


def parse_bif(text: str, tile_w: int, tile_h: int) -> Bif:
    """The tile map of level 0's ``EncodeInfo`` XMP (module docstring).

    Raises:
        CorruptFileError: broken or inconsistent area metadata (OpenSlide refuses the file).
        UnsupportedFormatError: no tile joint in a direction (OpenSlide's tile step is no number).
    """
    root = _parse(text, "level 0's XMP packet")
    infos = root.findall("./SlideStitchInfo/ImageInfo") if root.tag == "EncodeInfo" else []
    origin = root.find("./AoiOrigin") if root.tag == "EncodeInfo" else None
    origins = list(origin) if origin is not None else []
    if origin is None or root.find("./SlideStitchInfo") is None or len(infos) != len(origins):
        raise CorruptFileError("Ventana: missing or inconsistent region metadata")
    areas: list[tuple[Area, float, float]] = []
    total = {"x": 0.0, "y": 0.0}
    weight = {"x": 0, "y": 0}
    for info, aoi in zip(infos, origins, strict=True):
        if not _num(info, "AOIScanned"):
            continue
        ox, oy = int(_num(aoi, "OriginX")), int(_num(aoi, "OriginY"))
        if (_num(info, "Width"), _num(info, "Height")) != (tile_w, tile_h):
            raise CorruptFileError("Ventana: the areas' tile size differs from level 0's")
        if ox % tile_w or oy % tile_h:
            raise CorruptFileError("Ventana: an area's origin is not a whole number of tiles")
        across, down = int(_num(info, "NumCols")), int(_num(info, "NumRows"))
        if across < 1 or down < 1:
            raise CorruptFileError(f"Ventana: an area of {across}x{down} tiles")
        area = Area(ox // tile_w, oy // tile_h, across, down)
        areas.append((area, float(_num(info, "Pos-X", float)), float(_num(info, "Pos-Y", float))))
        for joint in info.findall("TileJointInfo"):
            _joint(joint, area, total, weight)
    if not areas:
        raise CorruptFileError("Ventana: no scanned area of interest")
    if weight["x"] == 0 or weight["y"] == 0:
        # OpenSlide divides by the total confidence: no joint in a direction gives a tile step
        # that is no number, and no pixels where it would put them
        raise UnsupportedFormatError("Ventana BIF without tile joints in both directions")
    advance_x, advance_y = tile_w + total["x"] / weight["x"], tile_h + total["y"] / weight["y"]
    # OpenSlide keeps positions as whole numbers (C truncation); Pos-Y counts from below all
    # areas: turned to count from the top of the highest one
    heights = [int((a.down - 1) * advance_y + tile_h) for a, _, _ in areas]
    top = 0
    for (_, _, y), h in zip(areas, heights, strict=True):
        top = max(top, int(y) + h)
    placed = tuple(dataclasses.replace(a, x=int(x), y=top - int(y) - h)
                   for (a, x, y), h in zip(areas, heights, strict=True))
    return Bif(placed, advance_x, advance_y)


def _joint(joint: ET.Element, area: Area, total: dict[str, float], weight: dict[str, int]) -> None:
    (c1, r1), (c2, r2) = (_tile_position(area, int(_num(joint, name))) for name in ("Tile1", "Tile2"))
    direction = joint.get("Direction")
    if direction == "RIGHT":
        ok = (c2, r2) == (c1 + 1, r1)
    elif direction == "UP":
        ok = (c2, r2) == (c1, r1 - 1)
    else:
        raise CorruptFileError(f"Ventana: bad tile joint direction {direction!r}")
    if not ok:
        raise CorruptFileError(f"Ventana: unexpected tile joint {direction} of tiles at {(c1, r1)} and {(c2, r2)}")
    axis = "x" if direction == "RIGHT" else "y"
    overlap = _num(joint, "OverlapX" if axis == "x" else "OverlapY", float)
    _num(joint, "OverlapY" if axis == "x" else "OverlapX", float)
    confidence = int(_num(joint, "Confidence"))
    total[axis] -= confidence * overlap
    weight[axis] += confidence


def _tile_position(area: Area, number: int) -> tuple[int, int]:
    """``(column, row)`` in the area of a joint's 1-based tile number: numbered from the
    bottom row up, every second row (from the bottom) right to left."""
    if not 1 <= number <= area.across * area.down:
        raise CorruptFileError(f"Ventana: tile number out of bounds: {number}")
    row, col = divmod(number - 1, area.across)
    if row % 2:
        col = area.across - col - 1
    return col, area.down - row - 1


def on_stored_grid(bif: Bif, levels: tuple[PyramidLevel, ...], downsamples: list[float],
                   tile_w: int, tile_h: int) -> bool:
    """True where OpenSlide's placement of the BIF's tiles is the stored tile grid (module
    docstring): tiles that abut, one area at the origin, and on every level a whole share of
    a level-0 tile and the area inside the stored image."""
    if bif.advance_x != tile_w or bif.advance_y != tile_h or len(bif.areas) != 1:
        return False
    area = bif.areas[0]
    if (area.start_col, area.start_row, area.x, area.y) != (0, 0, 0, 0):
        return False
    for level, ds in zip(levels, downsamples, strict=True):
        sub_w, sub_h = tile_w / ds, tile_h / ds
        if not (sub_w.is_integer() and sub_h.is_integer() and float(ds).is_integer()):
            return False
        if math.ceil(area.across * sub_w) > level.width or math.ceil(area.down * sub_h) > level.height:
            return False
    return True


def region_properties(bif: Bif, tile_w: int, tile_h: int) -> dict[str, str]:
    """``openslide.region[i].x|y|width|height`` of each area, as OpenSlide computes them."""
    props: dict[str, str] = {}
    for i, a in enumerate(bif.areas):
        props[f"openslide.region[{i}].x"] = str(int(bif.advance_x * a.start_col))
        props[f"openslide.region[{i}].y"] = str(int(bif.advance_y * a.start_row))
        props[f"openslide.region[{i}].width"] = str(math.ceil(bif.advance_x * (a.across - 1) + tile_w))
        props[f"openslide.region[{i}].height"] = str(math.ceil(bif.advance_y * (a.down - 1) + tile_h))
    return props


def check_levels(pages: list[tifffile.TiffPage]) -> list[tuple[tifffile.TiffPage, float]]:
    """``(page, downsample)`` of each level IFD (in file order), checked as OpenSlide checks them.

    Raises:
        CorruptFileError: levels out of order, magnification not falling, an untiled level,
            a tile size other than level 0's, or no level.
    """
    out: list[tuple[tifffile.TiffPage, float]] = []
    prev = math.inf
    mag0 = 0.0
    for expected, page in enumerate(pages):
        info = level_info(page)
        assert info is not None
        level, mag = info
        if level != expected:
            raise CorruptFileError(f"Ventana: unexpected level {level} in IFD {page.index}")
        if mag >= prev:
            raise CorruptFileError(f"Ventana: unexpected magnification in level {level}")
        prev = mag
        if level == 0:
            mag0 = mag
        if not page.is_tiled:
            raise CorruptFileError(f"Ventana: level {level} (IFD {page.index}) is not tiled")
        if (page.tilewidth, page.tilelength) != (pages[0].tilewidth, pages[0].tilelength):
            raise CorruptFileError("Ventana: inconsistent TIFF tile sizes")
        out.append((page, mag0 / mag))
    if not out:
        raise CorruptFileError("Ventana: no pyramid levels in slide")
    return out


def fix_levels(levels: tuple[PyramidLevel, ...], downsamples: list[float], bif: Bif | None,
               tile_w: int, tile_h: int) -> tuple[PyramidLevel, ...]:
    """The levels with OpenSlide's downsamples (from the magnifications) and, for a BIF, its
    sizes: the areas' extent at the level, the stored image cut to it.

    Raises:
        UnsupportedFormatError: a BIF level whose share of a level-0 tile is fractional, or
            whose extent is larger than its stored image (module docstring).
    """
    for level, ds in zip(levels, downsamples, strict=True):
        level.downsample = ds
        if bif is None:
            continue
        sub_w, sub_h = tile_w / ds, tile_h / ds
        if not (sub_w.is_integer() and sub_h.is_integer() and float(ds).is_integer()):
            raise UnsupportedFormatError(f"Ventana BIF level with downsample {ds:g} (not read yet)")
        right = max((a.start_col + a.across) * sub_w for a in bif.areas)
        bottom = max((a.start_row + a.down) * sub_h for a in bif.areas)
        width, height = math.ceil(right), math.ceil(bottom)
        first = bif.areas[0]
        if (width > level.width or height > level.height or len(bif.areas) != 1
                or first.start_col or first.start_row):
            raise UnsupportedFormatError("Ventana BIF whose areas reach past the stored image (not read yet)")
        across, down = level.tiles_across, level.tiles_down
        level.width, level.height = width, height
        level.tiles_across, level.tiles_down = across, down
    return levels


def metadata(props: dict[str, str]) -> tuple[float | None, float | None, float | None]:
    """``(mpp_x, mpp_y, objective power)`` from the ``ventana.*`` properties (module docstring)."""
    mag = props.get("ventana.Magnification", "")
    objective = float(int(mag)) if _INT.fullmatch(mag) else None
    res = props.get("ventana.ScanRes", "")
    mpp = float(res) if _DOUBLE.fullmatch(res) else None
    return mpp, mpp, objective
