"""Regions at fractional level positions read as OpenSlide reads them (floor 6).

``read_region`` takes the nearest stored pixel of a level (a documented rule,
``docs/guides/reading.md``).  OpenSlide instead maps a level-0 location to
``location / downsample`` without rounding and paints the level's pixels at that
fractional offset (cairo, bilinear); openslide-python's ``DeepZoomGenerator``
then composites the RGBA result on the background colour.  The Deep Zoom tile
server and the openslide-python drop-in's generator, whose tiles are compared
with OpenSlide's, read through :func:`read_blended`, and make their tiles
with :func:`deepzoom_tile`.
"""

from __future__ import annotations

import math

import numpy as np

from ..ground.geometry import level0_coordinate

__all__ = ["read_blended"]


def read_blended(slide, location, level: int, size, background=(255, 255, 255),
                 threads: int | None = None) -> np.ndarray:
    """``(h, w, 3)`` uint8: a region read as OpenSlide reads it, on ``background``.

    Args:
        slide: an open :class:`~wsitool.slide.Slide`.
        location: ``(x, y)`` in level-0 pixels; level: level index; size:
            ``(width, height)`` in pixels of ``level``.
        background: ``(r, g, b)`` 0..255 under transparent pixels (outside the slide).
        threads: decode threads of the read.

    The region is read one pixel larger from the level pixel below the
    fractional offset and interpolated bilinearly to that offset, in
    premultiplied RGBA (pixels outside the slide are transparent), then
    composited on ``background``.  At integer offsets (level 0, exact
    downsamples) this is the plain read composited.

    Raises:
        as :meth:`wsitool.slide.Slide.read_region`.
    """
    ds = slide.level_downsamples[level]
    w, h = size
    lx, ly = location[0] / ds, location[1] / ds
    x0, y0 = math.floor(lx), math.floor(ly)
    fx, fy = lx - x0, ly - y0
    start = (level0_coordinate(x0, ds), level0_coordinate(y0, ds))
    bg = np.asarray(background, np.float32)
    if fx < 1 / 512 and fy < 1 / 512:
        rgba = slide.read_region(start, level, (w, h), mode="rgba", threads=threads)
        if rgba[..., 3].min() == 255:
            return np.ascontiguousarray(rgba[..., :3])
        mixed = rgba.astype(np.float32)
        alpha = mixed[..., 3:] / 255.0
        out = mixed[..., :3] * alpha + bg * (1 - alpha)
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)
    rgba = slide.read_region(start, level, (w + 1, h + 1), mode="rgba", threads=threads).astype(np.float32)
    alpha = rgba[..., 3:] / 255.0
    rgba[..., :3] *= alpha            # premultiply
    rgba[..., 3:] = alpha
    top = rgba[:-1] * (1 - fy) + rgba[1:] * fy
    mixed = top[:, :-1] * (1 - fx) + top[:, 1:] * fx
    out = mixed[..., :3] + bg * (1 - mixed[..., 3:])
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def deepzoom_tile(slide, tile, background=(255, 255, 255), threads: int | None = None) -> np.ndarray:
    """One Deep Zoom tile as openslide-python's ``DeepZoomGenerator`` makes it.

    Args:
        slide: an open :class:`~wsitool.slide.Slide`.
        tile: a :class:`~wsitool.deepzoom.geometry.DeepZoomTile` (``DeepZoomGeometry.tile``).
        background: ``(r, g, b)`` 0..255 under transparent pixels.
        threads: decode threads of the read.

    Returns:
        ``(h, w, 3)`` uint8 RGB, ``(w, h) = tile.size``: the region read by
        :func:`read_blended`, shrunk to ``tile.size`` with Pillow's Lanczos
        ``thumbnail`` where the read is larger (needs Pillow then).

    Raises:
        as :meth:`wsitool.slide.Slide.read_region`.
    """
    location, slide_level, read_size = tile.read_args
    rgb = read_blended(slide, location, slide_level, read_size, background=background, threads=threads)
    if tuple(tile.read_size) == tuple(tile.size):
        return rgb
    from PIL import Image  # the serve and openslide extras

    image = Image.fromarray(rgb, "RGB")
    image.thumbnail(tile.size, Image.Resampling.LANCZOS)
    return np.asarray(image)
