"""``DeepZoomGenerator`` for the drop-in (openslide-python's ``openslide.deepzoom``).

The geometry is :mod:`wsitool.deepzoom.geometry` (the project's one Deep Zoom
implementation, equal to openslide-python's generator tile for tile); this
class only reads each tile's region from the slide, composites it on the
slide's background colour and shrinks it with PIL's Lanczos ``thumbnail`` from
the best slide level, as openslide-python 1.4's generator does, so its tiles are
the ones OpenSlide code expects.  It works on :class:`wsitool.openslide.OpenSlide`,
:class:`wsitool.openslide.ImageSlide`, and anything with OpenSlide's slide
interface (``level_dimensions``, ``level_downsamples``, ``properties``,
``read_region`` returning PIL ``RGBA``), including ``openslide.OpenSlide``.
"""

from __future__ import annotations

from PIL import Image

from ..deepzoom.geometry import DeepZoomGeometry, bounds_from_properties
from ..deepzoom.tiles import deepzoom_tile
from . import (
    PROPERTY_NAME_BACKGROUND_COLOR,
    PROPERTY_NAME_BOUNDS_HEIGHT,
    PROPERTY_NAME_BOUNDS_WIDTH,
    PROPERTY_NAME_BOUNDS_X,
    PROPERTY_NAME_BOUNDS_Y,
)

__all__ = ["DeepZoomGenerator"]


class DeepZoomGenerator:
    """Deep Zoom tiles and ``.dzi`` metadata of a slide.

    Args:
        osr: the slide (see the module docstring).
        tile_size: tile width and height without overlap, pixels (254 default,
            so that 254 + 2 * 1 is a power of two).
        overlap: extra pixels on each interior tile edge.
        limit_bounds: tile only the non-empty area (``openslide.bounds-*``
            properties, where the slide has them).

    Raises:
        ValueError: ``tile_size < 1`` or ``overlap < 0``.
    """

    BOUNDS_OFFSET_PROPS = (PROPERTY_NAME_BOUNDS_X, PROPERTY_NAME_BOUNDS_Y)
    BOUNDS_SIZE_PROPS = (PROPERTY_NAME_BOUNDS_WIDTH, PROPERTY_NAME_BOUNDS_HEIGHT)

    def __init__(self, osr, tile_size: int = 254, overlap: int = 1, limit_bounds: bool = False):
        self._osr = osr
        self._limit_bounds = limit_bounds
        properties = osr.properties
        bounds = bounds_from_properties(properties) if limit_bounds else None
        self._geometry = DeepZoomGeometry(osr.level_dimensions, osr.level_downsamples,
                                          tile_size=tile_size, overlap=overlap, bounds=bounds)
        self._background = "#" + properties.get(PROPERTY_NAME_BACKGROUND_COLOR, "ffffff")
        self._background_rgb = _rgb(self._background)

    def __repr__(self) -> str:
        g = self._geometry
        return (f"{self.__class__.__name__}({self._osr!r}, tile_size={g.tile_size!r}, "
                f"overlap={g.overlap!r}, limit_bounds={self._limit_bounds!r})")

    @property
    def level_count(self) -> int:
        """Number of Deep Zoom levels."""
        return self._geometry.level_count

    @property
    def level_tiles(self) -> tuple[tuple[int, int], ...]:
        """``(columns, rows)`` of tiles in each Deep Zoom level."""
        return self._geometry.level_tiles

    @property
    def level_dimensions(self) -> tuple[tuple[int, int], ...]:
        """``(width, height)`` in pixels of each Deep Zoom level."""
        return self._geometry.level_dimensions

    @property
    def tile_count(self) -> int:
        """Total number of tiles."""
        return self._geometry.tile_count

    def get_tile(self, level: int, address) -> Image.Image:
        """Tile ``address = (col, row)`` of Deep Zoom ``level`` as a PIL ``RGB`` image.

        Raises:
            ValueError: ``"Invalid level"`` / ``"Invalid address"``.
            OpenSlideError: the slide's read failed.
        """
        tile = self._geometry.tile(level, address)
        slide = getattr(self._osr, "_slide", None)  # a wsitool slide behind an OpenSlide
        if slide is not None:  # read as OpenSlide does at fractional level positions
            flat = Image.fromarray(deepzoom_tile(slide, tile, background=self._background_rgb), "RGB")
            profile = slide.color_profile  # raw ICC bytes, as read_region puts them in .info
        else:
            region = self._osr.read_region(*tile.read_args)
            profile = region.info.get("icc_profile")
            flat = Image.composite(region, Image.new("RGB", region.size, self._background), region)
            if flat.size != tile.size:
                flat.thumbnail(tile.size, Image.Resampling.LANCZOS)
        if profile is not None:
            flat.info["icc_profile"] = profile
        return flat

    def get_tile_coordinates(self, level: int, address):
        """``(location, slide_level, size)``: the ``read_region`` arguments of a tile."""
        return self._geometry.tile(level, address).read_args

    def get_tile_dimensions(self, level: int, address) -> tuple[int, int]:
        """``(width, height)`` of a tile in pixels (overlap included)."""
        return self._geometry.tile(level, address).size

    def get_dzi(self, format: str) -> str:
        """The ``.dzi`` XML for tiles of ``format`` (``"jpeg"`` or ``"png"``)."""
        return self._geometry.dzi_xml(format)


def _rgb(color: str) -> tuple[int, int, int]:
    """``(r, g, b)`` of a ``#rrggbb`` colour."""
    value = color.lstrip("#")
    return int(value[0:2], 16), int(value[2:4], 16), int(value[4:6], 16)
