"""Regions at fractional level positions read as OpenSlide reads them (floor 6).

``read_region`` takes the nearest stored pixel of a level (a documented rule,
``docs/guides/reading.md``).  OpenSlide instead maps a level-0 location to
``location / downsample`` without rounding and paints the level's pixels at that
fractional offset (cairo, bilinear: :mod:`wsitool.deepzoom.subpixel`, the rule the
openslide-python drop-in's ``read_region`` follows too); openslide-python's
``DeepZoomGenerator`` then composites the RGBA result on the background colour.  The Deep Zoom tile
server and the openslide-python drop-in's generator, whose tiles are compared
with OpenSlide's, read through :func:`read_blended`, and make their tiles
with :func:`deepzoom_tile`.
"""

from __future__ import annotations

import numpy as np

from .subpixel import read_openslide_rgba

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

    The region is OpenSlide's RGBA pixels (:func:`~wsitool.deepzoom.subpixel.read_openslide_rgba`:
    blended at a fractional level position, the stored pixels at a whole one)
    composited on ``background`` as openslide-python's generator does it with
    Pillow (``Image.composite``: ``(c * a + bg * (255 - a)) / 255``, rounded).

    Raises:
        as :meth:`wsitool.slide.Slide.read_region`.
    """
    rgba = read_openslide_rgba(slide, location, level, size, threads=threads)
    if rgba.size == 0 or rgba[..., 3].min() == 255:
        return np.ascontiguousarray(rgba[..., :3])
    a = rgba[..., 3:].astype(np.int32)
    mixed = rgba[..., :3] * a + np.asarray(background, np.int32) * (255 - a) + 128
    return (((mixed >> 8) + mixed) >> 8).astype(np.uint8)


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
