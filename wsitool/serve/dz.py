"""Deep Zoom routes: ``/dz/{id}.dzi`` and ``/dz/{id}_files/{level}/{col}_{row}.{jpeg|png}``.

The levels, tile grid, overlap and the region behind each tile are
:class:`wsitool.deepzoom.DeepZoomGeometry`'s (the same as openslide-python's
``DeepZoomGenerator`` and ``export-pyramid --format dzi``).  Each tile is read
from the slide level that geometry names and shrunk to the size the generator
gives it (:func:`wsitool.serve.render.thumbnail_size`, the rule of Pillow's
``Image.thumbnail``).

The filter: ``"lanczos"`` (default) shrinks as ``DeepZoomGenerator`` does
(Pillow's ``thumbnail`` with Lanczos), so tiles equal the generator's up to
JPEG re-encoding.  ``"area"`` uses wsitool's area filter (:mod:`.resample`), as
the IIIF routes do; it is smoother than Lanczos, and on three real slides its
tiles differed from the generator's by a mean absolute difference of up to 3.5
on textured tissue at 2x and up to 20 on the 1 x 1 to 3 x 3 levels (Pillow's
``thumbnail`` reduces those in integer steps before its Lanczos pass, not as an
exact mean), over the tolerance of 2 that the parity test holds the default to.
"""

from __future__ import annotations

import math
import re

import numpy as np

from ..deepzoom import DeepZoomGeometry
from ..geometry import level0_coordinate
from .iiif import IIIFError
from .resample import reduce_area
from .render import thumbnail_size

__all__ = ["DZ_MEDIA_TYPES", "parse_dz_path", "geometry_for", "render_dz_tile", "read_like_openslide"]

DZ_MEDIA_TYPES = {"jpeg": "image/jpeg", "png": "image/png"}
_TILE = re.compile(r"^(.+)_files/(\d+)/(\d+)_(\d+)\.(jpeg|png)$")


def parse_dz_path(rest: str):
    """``("dzi", id)`` or ``("tile", id, level, col, row, format)`` for the path after ``/dz/``.

    Raises:
        IIIFError: 404 for any other path (no such resource).
    """
    if rest.endswith(".dzi") and "/" not in rest:
        return ("dzi", rest[:-4])
    m = _TILE.match(rest)
    if not m or "/" in m.group(1):
        raise IIIFError(404, "no such Deep Zoom resource")
    return ("tile", m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), m.group(5))


def geometry_for(slide, tile_size: int, overlap: int) -> DeepZoomGeometry:
    """The Deep Zoom geometry of ``slide`` (whole slide: DeepZoomGenerator's ``limit_bounds=False``)."""
    return DeepZoomGeometry(slide.level_dimensions, slide.level_downsamples, tile_size=tile_size,
                            overlap=overlap)


def read_like_openslide(slide, location, level: int, size, threads: int | None = None) -> np.ndarray:
    """``(h, w, 3)`` uint8: a region read the way OpenSlide reads it, on a white background.

    OpenSlide maps a level-0 location to ``location / downsample`` on the level
    without rounding and paints the level's pixels at that fractional offset
    (cairo, bilinear), then ``DeepZoomGenerator`` puts the RGBA result on the
    background colour (white).  wsitool's ``read_region`` starts at the nearest
    level pixel instead, which on levels with downsamples such as 2.0005 moves
    the content by up to half a pixel (a mean absolute difference of 5-8 on
    textured tissue).  Here the region is read one pixel larger from the pixel
    below the fractional offset and interpolated bilinearly to that offset, in
    premultiplied RGBA (pixels outside the slide are transparent), then
    composited on white.  At integer offsets (level 0, exact downsamples) this
    is the plain read.
    """
    ds = slide.level_downsamples[level]
    w, h = size
    lx, ly = location[0] / ds, location[1] / ds
    x0, y0 = math.floor(lx), math.floor(ly)
    fx, fy = lx - x0, ly - y0
    if fx < 1 / 512 and fy < 1 / 512:
        return slide.read_region((level0_coordinate(x0, ds), level0_coordinate(y0, ds)), level,
                                 (w, h), mode="rgb", threads=threads)
    rgba = slide.read_region((level0_coordinate(x0, ds), level0_coordinate(y0, ds)), level,
                             (w + 1, h + 1), mode="rgba", threads=threads).astype(np.float32)
    alpha = rgba[..., 3:] / 255.0
    rgba[..., :3] *= alpha            # premultiply
    rgba[..., 3:] = alpha
    top = rgba[:-1] * (1 - fy) + rgba[1:] * fy
    mixed = top[:, :-1] * (1 - fx) + top[:, 1:] * fx
    out = mixed[..., :3] + 255.0 * (1 - mixed[..., 3:])
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


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
    rgb = read_like_openslide(slide, t.location, t.slide_level, t.read_size, threads)
    if t.read_size == t.size:
        return rgb
    if filter == "lanczos":
        from PIL import Image

        image = Image.fromarray(rgb)
        image.thumbnail(t.size, Image.Resampling.LANCZOS)
        return np.asarray(image)
    tw, th = thumbnail_size(t.read_size, t.size)
    rw, rh = t.read_size
    if (tw, th) == (rw, rh):
        return rgb
    return reduce_area(rgb, (0, 0, rw, rh), tw, th)
