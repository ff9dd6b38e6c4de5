"""OpenSlide's thumbnail rule: the level best suited to the size asked, laid over the background
colour and shrunk with Lanczos resampling (what ``openslide.OpenSlide.get_thumbnail`` does)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..errors import InvalidOptionError
from ..ground.geometry import best_level_for_downsample

__all__ = ["thumbnail_level", "compose_thumbnail", "thumbnail_background"]


def thumbnail_level(size: Sequence[int], dimensions: tuple[int, int],
                    downsamples: Sequence[float]) -> tuple[tuple[int, int], int]:
    """``((width, height), level)``: the largest thumbnail asked for and the level to read for it,
    the one best suited to ``max(W0 / width, H0 / height)`` (OpenSlide's rule).

    Args:
        size: ``(width, height)``, pixels, positive.
        dimensions: ``(W0, H0)``, level 0's size in pixels.
        downsamples: each level's downsample, level 0 first.

    Raises:
        InvalidOptionError: ``size`` is not two positive integers (also ``ValueError``).
    """
    try:
        w, h = (int(v) for v in size)
    except (TypeError, ValueError):
        raise InvalidOptionError(f"thumbnail size must be (width, height), got {size!r}") from None
    if w <= 0 or h <= 0:
        raise InvalidOptionError(f"thumbnail size must be positive, got {w}x{h}")
    downsample = max(d / s for d, s in zip(dimensions, (w, h), strict=True))
    return (w, h), best_level_for_downsample(downsamples, downsample)


def compose_thumbnail(rgba: np.ndarray, background: tuple[int, int, int], size: tuple[int, int]) -> np.ndarray:
    """``rgba`` (``(h, w, 4)`` uint8) laid over ``background`` and shrunk with Lanczos resampling
    to fit within ``size`` = ``(width, height)`` (Pillow's ``Image.thumbnail``: aspect ratio
    kept, never enlarged); returns ``(height, width, 3)`` uint8."""
    from PIL import Image

    region = Image.fromarray(rgba, "RGBA")
    thumb = Image.new("RGB", region.size, background)
    thumb.paste(region, None, region)
    thumb.thumbnail(size, Image.Resampling.LANCZOS)
    return np.asarray(thumb)


def thumbnail_background(properties: Mapping[str, str]) -> tuple[int, int, int]:
    """The ``(r, g, b)`` behind a thumbnail's transparent pixels: the
    ``openslide.background-color`` property (``RRGGBB`` hex), else white.

    Raises:
        ValueError: a property value Pillow cannot read as a colour.
    """
    from PIL import ImageColor

    rgb = ImageColor.getcolor("#" + properties.get("openslide.background-color", "ffffff"), "RGB")
    assert isinstance(rgb, tuple)  # an "RGB" colour is a triple (Pillow types it int | tuple)
    return (rgb[0], rgb[1], rgb[2])
