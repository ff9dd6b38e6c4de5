"""Deep Zoom routes: ``/dz/{id}.dzi`` and ``/dz/{id}_files/{level}/{col}_{row}.{jpeg|png}``.

The levels, tile grid, overlap and the region behind each tile are
:class:`wsitool.deepzoom.geometry.DeepZoomGeometry`'s (the same as openslide-python's
``DeepZoomGenerator`` and ``export-pyramid --format dzi``).  Each tile is read
from the slide level that geometry names and shrunk to the size the generator
gives it (:func:`wsitool.serve.render.thumbnail_size`, the rule of Pillow's
``Image.thumbnail``).

The filter: ``"lanczos"`` (default) shrinks as ``DeepZoomGenerator`` does
(Pillow's ``thumbnail`` with Lanczos), so tiles equal the generator's up to
JPEG re-encoding.  ``"area"`` uses wsitool's area filter (:mod:`wsitool.ground.areafilter`), as
the IIIF routes do; it is smoother than Lanczos, and on three real slides its
tiles differed from the generator's by a mean absolute difference of up to 3.5
on textured tissue at 2x and up to 20 on the 1 x 1 to 3 x 3 levels (Pillow's
``thumbnail`` reduces those in integer steps before its Lanczos pass, not as an
exact mean), over the tolerance of 2 that the parity test holds the default to.
"""

from __future__ import annotations

import re

import numpy as np

from ..deepzoom.geometry import DeepZoomGeometry
from ..deepzoom.tiles import deepzoom_tile, read_blended
from ..ground.areafilter import reduce_area
from .iiif import IIIFError, check_numbers
from .render import thumbnail_size

__all__ = ["DZ_MEDIA_TYPES", "parse_dz_path", "geometry_for", "render_dz_tile"]

DZ_MEDIA_TYPES = {"jpeg": "image/jpeg", "png": "image/png"}
_TILE = re.compile(r"^(.+)_files/([0-9]+)/([0-9]+)_([0-9]+)\.(jpeg|png)\Z")  # ASCII digits only


def parse_dz_path(rest: str):
    """``("dzi", id)`` or ``("tile", id, level, col, row, format)`` for the path after ``/dz/``.

    Raises:
        IIIFError: 404 for any other path (no such resource); 400 for a level, column or
            row of more than 20 digits (:data:`~wsitool.serve.iiif.MAX_DIGITS`).
    """
    if rest.endswith(".dzi") and "/" not in rest:
        return ("dzi", rest[:-4])
    m = _TILE.match(rest)
    if not m or "/" in m.group(1):
        raise IIIFError(404, "no such Deep Zoom resource")
    for what, text in zip(("level", "column", "row"), m.group(2, 3, 4), strict=True):
        check_numbers(what, text)  # (int() of 4,300 digits raised: a 500)
    return ("tile", m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), m.group(5))


def geometry_for(slide, tile_size: int, overlap: int) -> DeepZoomGeometry:
    """The Deep Zoom geometry of ``slide`` (whole slide: DeepZoomGenerator's ``limit_bounds=False``)."""
    return DeepZoomGeometry(slide.level_dimensions, slide.level_downsamples, tile_size=tile_size,
                            overlap=overlap)


def render_dz_tile(slide, geom: DeepZoomGeometry, level: int, col: int, row: int,
                   threads: int | None = None, filter: str = "lanczos") -> np.ndarray:
    """Tile ``(col, row)`` of Deep Zoom level ``level``: ``(h, w, 3)`` uint8 RGB.

    ``filter``: ``"lanczos"`` (DeepZoomGenerator's) or ``"area"`` (see the module docstring).

    Raises:
        IIIFError: 404 for a level or address outside the grid.
        TileDecodeError: a corrupt source tile.
    """
    try:
        t = geom.tile(level, (col, row))
    except ValueError as exc:
        raise IIIFError(404, str(exc)) from None
    if filter == "lanczos":  # DeepZoomGenerator's tile, as the drop-in makes it
        return deepzoom_tile(slide, t, threads=threads)
    rgb = read_blended(slide, *t.read_args, threads=threads)
    tw, th = thumbnail_size(t.read_size, t.size)
    rw, rh = t.read_size
    if (tw, th) == (rw, rh):
        return rgb
    return reduce_area(rgb, (0, 0, rw, rh), tw, th)
