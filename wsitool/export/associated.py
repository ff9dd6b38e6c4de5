"""What an export carries besides the pyramid: the Aperio thumbnail, label and macro, and the count of
painted tiles (floor 6)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence

import numpy as np

from ..errors import TileWarning, WsiError

#: Name of the recorded count of undecodable source tiles painted over by an
#: ``on_error="fill"`` export: an Aperio ``key = value`` field of the first
#: ImageDescription (``tiff``), a ``MapAnnotation`` entry of the first OME
#: Image (namespace :data:`PAINTED_NAMESPACE`, ``ome-tiff``), an XML comment
#: in the ``.dzi`` (``dzi``).  See :func:`painted_tiles`.
PAINTED_KEY = "UndecodableTiles"


PAINTED_NAMESPACE = "wsitool"


def thumbnail_level(dims: Sequence[tuple[int, int]]) -> int:
    """Index of the pyramid level whose pixels make the Aperio thumbnail: the smallest.

    In the Aperio layout the thumbnail (IFD 1, stripped) is never larger than
    the smallest pyramid level: Bio-Formats' SVS reader sorts every IFD that
    is not a label or macro by size and drops the smallest if it is stripped,
    so a thumbnail larger than a level would push that level out of the
    pyramid (the level's pixels are then lost to Bio-Formats, QuPath and
    ``bfconvert``).  OpenSlide, tiffslide and tifffile take IFD 1 as the
    thumbnail whatever its size.  An export's smallest level fits in one tile.
    """
    if not dims:
        raise ValueError("no pyramid levels")
    return len(dims) - 1


class LevelImage:
    """The pixels of one output level, assembled from its tiles as they are made."""

    def __init__(self, level: int, width: int, height: int, tile: int):
        self.level = level
        self.tile = tile
        self.image = np.empty((height, width, 3), np.uint8)

    def add(self, col: int, row: int, tile: np.ndarray) -> None:
        T = self.tile
        y0, x0 = row * T, col * T
        h, w = self.image.shape[:2]
        y1, x1 = min(y0 + tile.shape[0], h), min(x0 + tile.shape[1], w)
        self.image[y0:y1, x0:x1] = tile[:y1 - y0, :x1 - x0]


def associated_for_export(slide, label: bool, associated: bool, on_error: str, *,
                          stacklevel: int = 3) -> list[tuple[str, np.ndarray]]:
    """The source's ``label`` and ``macro`` images to carry over, in that order.

    ``associated=False`` drops both, ``label=False`` the label (it often
    shows patient identifiers).  The source's thumbnail is never carried:
    the ``tiff`` output gets one made from its own pyramid.

    Raises:
        WsiError: (or a subclass) an associated image cannot be read, with
            ``on_error="raise"``; with ``"fill"`` it is left out with a
            :class:`~wsitool.errors.TileWarning` (``stacklevel`` as :func:`warnings.warn`'s,
            from this function: the frame it is attributed to).
    """
    if not associated:
        return []
    out = []
    for name in ("label", "macro"):
        if name == "label" and not label:
            continue
        if name not in slide.associated_images:
            continue
        try:
            arr = slide.associated_images[name]
        except WsiError as exc:
            if on_error != "fill":
                raise

            warnings.warn(f"{slide.path}: associated image {name!r} left out: {exc}", TileWarning,
                          stacklevel=stacklevel)
            continue
        out.append((name, np.ascontiguousarray(arr[..., :3], dtype=np.uint8)))
    return out


def painted_tiles(slide) -> int | None:
    """The count of undecodable source tiles that a wsitool export painted with
    the background (``on_error="fill"``), as recorded in ``slide`` (an open
    :class:`~wsitool.slide.Slide` of a ``tiff`` or ``ome-tiff`` export), or
    None when the file records none (not an ``on_error="fill"`` export of
    wsitool).  Where it is recorded: :data:`PAINTED_KEY`.
    """
    props = slide.properties
    value = props.get(f"aperio.{PAINTED_KEY}")
    if value is None and slide.vendor == "ome-tiff":
        xml = props.get("tiff.ImageDescription", "")

        m = re.search(r'<M\s+K="' + PAINTED_KEY + r'"\s*>\s*(\d+)\s*</M>', xml)
        value = m.group(1) if m else None
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


