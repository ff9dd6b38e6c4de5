"""Deep Zoom geometry: levels, tile grids and the region behind each tile (ground floor).

The one implementation of Deep Zoom (DZI) geometry in wsitool: the DZI exporter,
the tile server and :mod:`wsitool.openslide.deepzoom` all use it.  It works on
plain numbers (the slide's level dimensions and downsamples, optional bounds),
never on a slide object, and decodes nothing.

The numbers are those of openslide-python's ``openslide.deepzoom.DeepZoomGenerator``
(openslide-python 1.4, ``openslide/deepzoom.py``), computed with the same
floating-point operations in the same order so that every tile's read
arguments are bit-identical to that generator's (tests/test_deepzoom.py compares
them over many slide sizes and bounds):

* Deep Zoom level ``n - 1`` (the last) is the slide (or the bounds) at full
  resolution; each level below halves both sides, rounding up, down to ``1 x 1``
  (level 0).  The Deep Zoom file format specification (Microsoft, "Deep Zoom
  File Format Overview") defines level ``k`` as the image scaled by
  ``2 ** -(n - 1 - k)``.
* Each level is cut into ``tile_size`` squares (the last row / column is
  smaller); every interior tile edge carries ``overlap`` extra pixels.
* A tile is read from the best slide level for the level's downsample
  (OpenSlide's ``openslide_get_best_level_for_downsample``: the largest level
  whose downsample is <= the wanted one) and scaled to its Deep Zoom size.
* With bounds (OpenSlide's ``openslide.bounds-x|y|width|height`` properties,
  level-0 pixels), only that rectangle is tiled: its offset is added to every
  read location, and every slide level's size is scaled by
  ``bounds size / level-0 size`` and rounded up.

Coordinates: ``(x, y)`` / ``(width, height)`` pairs; tile addresses ``(col, row)``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from io import BytesIO
from xml.etree.ElementTree import Element, ElementTree, SubElement

from ..errors import InvalidOptionError, InvalidRegionError
from ..ground.geometry import best_level_for_downsample

__all__ = [
    "tile_span",
    "DZI_NAMESPACE",
    "DeepZoomTile",
    "DeepZoomGeometry",
    "best_level_for_downsample",
    "bounds_from_properties",
    "deepzoom_level_dimensions",
]

#: XML namespace of a ``.dzi`` file (Deep Zoom File Format, 2008 schema).
DZI_NAMESPACE = "http://schemas.microsoft.com/deepzoom/2008"

_BOUNDS_KEYS = ("openslide.bounds-x", "openslide.bounds-y",
                "openslide.bounds-width", "openslide.bounds-height")


def bounds_from_properties(properties: Mapping[str, str]) -> tuple[int | None, int | None,
                                                                   int | None, int | None]:
    """``(x, y, width, height)`` from OpenSlide's ``openslide.bounds-*`` properties.

    Each entry is the property as an int, or None where the slide lacks it
    (:class:`DeepZoomGeometry` then uses 0 for an offset, the level-0 size for
    a size, as openslide-python's generator does).

    Raises:
        ValueError: a present property is not an integer.
    """
    x, y, w, h = (int(properties[k]) if k in properties else None for k in _BOUNDS_KEYS)
    return x, y, w, h


def deepzoom_level_dimensions(width: int, height: int) -> tuple[tuple[int, int], ...]:
    """``(width, height)`` of every Deep Zoom level of a ``width x height`` image, smallest first.

    Level 0 is ``1 x 1``; each level above doubles (the last is the image itself):
    going down, both sides halve rounding up, and never below 1.
    """
    w, h = int(width), int(height)
    dims = [(w, h)]
    while w > 1 or h > 1:
        w, h = max(1, -(-w // 2)), max(1, -(-h // 2))
        dims.append((w, h))
    return tuple(reversed(dims))


def tile_span(index: int, count: int, tile_size: int, overlap: int, extent: int) -> tuple[int, int]:
    """``[start, end)`` in Deep Zoom pixels of tile ``index`` of ``count`` along one axis of a
    level ``extent`` pixels long: ``tile_size`` pixels (fewer for the last tile) plus
    ``overlap`` on each side that has a neighbour, as ``DeepZoomGenerator`` computes it.
    (With ``overlap`` wider than the last tile, ``end`` can pass ``extent``; a writer of
    stored pixels clips it there.)"""
    before = overlap if index != 0 else 0
    after = overlap if index != count - 1 else 0
    return tile_size * index - before, min(tile_size * (index + 1), extent) + after


@dataclasses.dataclass(frozen=True)
class DeepZoomTile:
    """The region behind one Deep Zoom tile.

    Attributes:
        location: ``(x, y)`` top-left in level-0 pixels of the slide (bounds
            offset included), as ``read_region`` takes it.
        slide_level: the slide level to read from.
        read_size: ``(width, height)`` to read, in pixels of ``slide_level``.
        size: ``(width, height)`` of the finished tile (overlap included): the
            read is scaled to fit this size.
    """

    location: tuple[int, int]
    slide_level: int
    read_size: tuple[int, int]
    size: tuple[int, int]

    @property
    def read_args(self) -> tuple[tuple[int, int], int, tuple[int, int]]:
        """``(location, slide_level, read_size)``: OpenSlide ``read_region`` arguments."""
        return (self.location, self.slide_level, self.read_size)


class DeepZoomGeometry:
    """Deep Zoom levels and tiles of one slide.

    Args:
        level_dimensions: ``(width, height)`` of each slide level in pixels, level 0 first.
        level_downsamples: downsample of each slide level relative to level 0
            (OpenSlide's ``(W0 / w + H0 / h) / 2``).
        tile_size: width and height of a tile without overlap, pixels (>= 1).
        overlap: extra pixels on each interior tile edge (>= 0).
        bounds: None to tile the whole slide (``limit_bounds=False``), or
            ``(x, y, width, height)`` in level-0 pixels, any entry None for
            "not known" (0 for an offset, the level-0 size for a size); see
            :func:`bounds_from_properties`.

    Raises:
        InvalidOptionError: bad tile size, overlap or level lists (also a ValueError).
    """

    def __init__(self, level_dimensions: Sequence[Sequence[int]], level_downsamples: Sequence[float],
                 *, tile_size: int = 254, overlap: int = 1,
                 bounds: Sequence[int | None] | None = None):
        dims = tuple((int(w), int(h)) for w, h in level_dimensions)
        ds = tuple(float(d) for d in level_downsamples)
        if not dims or len(dims) != len(ds):
            raise InvalidOptionError("level_dimensions and level_downsamples must be non-empty and equally long")
        if int(tile_size) != tile_size or tile_size < 1:
            raise InvalidOptionError(f"tile_size must be an integer >= 1, got {tile_size!r}")
        if int(overlap) != overlap or overlap < 0:
            raise InvalidOptionError(f"overlap must be an integer >= 0, got {overlap!r}")
        self.tile_size = int(tile_size)
        self.overlap = int(overlap)
        self.bounds = None if bounds is None else tuple(bounds)
        self.slide_downsamples = ds
        if bounds is None:
            self.offset = (0, 0)
            self.slide_dimensions = dims
        else:
            bx, by, bw, bh = bounds
            self.offset = (int(bx or 0), int(by or 0))
            w0, h0 = dims[0]
            # scale per axis, then every slide level's active size rounded up
            sx = (int(bw) if bw is not None else w0) / w0
            sy = (int(bh) if bh is not None else h0) / h0
            self.slide_dimensions = tuple((math.ceil(w * sx), math.ceil(h * sy)) for w, h in dims)
        #: ``(width, height)`` of the tiled area at full resolution
        self.dimensions = self.slide_dimensions[0]
        self.level_dimensions = deepzoom_level_dimensions(*self.dimensions)
        n = len(self.level_dimensions)
        T = self.tile_size
        self.level_tiles = tuple((-(-w // T), -(-h // T)) for w, h in self.level_dimensions)
        #: level-0 pixels per Deep Zoom pixel of each Deep Zoom level (powers of two)
        self.level_downsamples = tuple(2 ** (n - 1 - k) for k in range(n))
        #: slide level each Deep Zoom level reads from
        self.slide_levels = tuple(best_level_for_downsample(ds, d) for d in self.level_downsamples)
        # slide-level pixels per Deep Zoom pixel
        self._scale = tuple(self.level_downsamples[k] / ds[self.slide_levels[k]] for k in range(n))

    @property
    def level_count(self) -> int:
        """Number of Deep Zoom levels (level 0 is ``1 x 1``)."""
        return len(self.level_dimensions)

    @property
    def tile_count(self) -> int:
        """Total number of tiles over all levels."""
        return sum(c * r for c, r in self.level_tiles)

    def tile(self, level: int, address: Sequence[int]) -> DeepZoomTile:
        """The region behind tile ``address = (col, row)`` of Deep Zoom level ``level``.

        The tile covers Deep Zoom pixels ``[col * T - o_l, min((col + 1) * T, W) + o_r)``
        (``o_l``/``o_r`` = overlap except on the first/last column; rows alike).
        Its read location is that start times the level's scale, converted to
        level 0 and truncated, plus the bounds offset; the read size is the tile
        size times the scale rounded up, clipped at the slide level's (active)
        edge.

        Raises:
            InvalidRegionError: ``"Invalid level"`` / ``"Invalid address"`` (openslide-python's
                messages; also a ValueError, as openslide-python raises).
        """
        if not 0 <= level < self.level_count:
            raise InvalidRegionError("Invalid level")
        cols_rows = self.level_tiles[level]
        addr = tuple(address)
        if len(addr) != 2 or any(not 0 <= t < lim for t, lim in zip(addr, cols_rows, strict=True)):
            raise InvalidRegionError("Invalid address")
        T, ov = self.tile_size, self.overlap
        slide_level = self.slide_levels[level]
        scale = self._scale[level]
        ds = self.slide_downsamples[slide_level]
        location, read, size = [], [], []
        for t, lim, z_lim, l_lim, off in zip(addr, cols_rows, self.level_dimensions[level],
                                             self.slide_dimensions[slide_level], self.offset, strict=True):
            z_start, z_end = tile_span(t, lim, T, ov, z_lim)
            z_size = z_end - z_start
            l_start = scale * z_start                    # slide-level pixels (float)
            location.append(int(ds * l_start + off))
            read.append(int(min(math.ceil(scale * z_size), l_lim - math.ceil(l_start))))
            size.append(z_size)
        return DeepZoomTile((location[0], location[1]), slide_level, (read[0], read[1]), (size[0], size[1]))

    def dzi_xml(self, format: str) -> str:
        """The ``.dzi`` XML: ``<Image TileSize Overlap Format xmlns><Size Width Height/></Image>``.

        Byte-identical to openslide-python's ``get_dzi``: an XML declaration with
        single quotes, attributes in that order, UTF-8.

        Args:
            format: tile format name written as ``Format`` (``"jpeg"``, ``"png"``).
        """
        image = Element("Image", TileSize=str(self.tile_size), Overlap=str(self.overlap),
                        Format=format, xmlns=DZI_NAMESPACE)
        w, h = self.dimensions
        SubElement(image, "Size", Width=str(w), Height=str(h))
        buf = BytesIO()
        ElementTree(image).write(buf, encoding="UTF-8")
        return buf.getvalue().decode("UTF-8")

    def __repr__(self) -> str:
        return (f"DeepZoomGeometry({self.dimensions[0]}x{self.dimensions[1]}, tile_size={self.tile_size}, "
                f"overlap={self.overlap}, levels={self.level_count})")
