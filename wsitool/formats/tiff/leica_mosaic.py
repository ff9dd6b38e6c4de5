"""Leica SCN levels whose main images are off the stored tile grid, as mosaic levels (floor 3).

OpenSlide 4.0.1 paints each main image of a Leica level (:mod:`.leica`) on its own, in
image order, at its whole-pixel offset on the collection's canvas: its stored TIFF tiles are
a simple grid starting there, each edge tile clipped to the image's size, and where images
overlap the first painted stays (cairo's SATURATE operator).  Where that placement is not the
stored tile grid itself (an offset that is not whole tiles, a size that is not whole tiles
inside the canvas, overlapping images), wsitool describes the level as a mosaic
(:mod:`wsitool.mosaic`): every stored tile of every main image is a placed image at
``(offset + column * tile width, offset + row * tile height)``, cropped to the image's size,
the earlier main images in front.  A tile whose byte count is 0 is not placed (transparent).

Only 8-bit RGB JPEG tiles are read this way (what Leica scanners write); their shared
JPEGTables become part of each tile's stream (the stored level's ``jpeg_prefix``, the
mosaic's, as the tiled read path merges them), so a level's main images must share their
tables.  Other compressions off the grid, or main images of different tables at one level,
are refused (:class:`~wsitool.errors.UnsupportedFormatError`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...errors import UnsupportedFormatError
from ...model import PyramidLevel
from ...mosaic import DecodedImages, MosaicBuilder, mosaic_level

__all__ = ["mosaic_canvas_level", "MAX_PLACED_TILES"]

_JPEG = 7
#: Most stored tiles one mosaic level places: its image, placement and index arrays keep about
#: 130 bytes a tile (450 while they are built), so a file's tile tables set at most 140 MB.
#: (A 25 x 75 mm scan at 0.25 um per pixel is 115,000 tiles of 512 x 512, 460,000 of 256 x 256.)
MAX_PLACED_TILES = 1 << 20


def _jpeg_prefix(index: int, lv: PyramidLevel) -> bytes:
    """The JPEGTables prefix (``encoding.jpeg_prefix``) of a main image's stored JPEG level.

    Raises:
        UnsupportedFormatError: tiles that are not 8-bit RGB JPEG streams.
    """
    enc = lv.encoding
    if (enc.compression_code != _JPEG or enc.stream != "jpeg" or enc.jpeg_scan_segments
            or enc.compression_problem or lv.samples != 3 or lv.dtype != np.uint8):
        raise UnsupportedFormatError(
            f"Leica SCN level {index}: a main image off the tile grid stored as {enc.compression} "
            f"({lv.samples} x {lv.dtype} samples; only 8-bit RGB JPEG tiles are read off the grid)")
    return enc.jpeg_prefix or b""


def mosaic_canvas_level(index: int, width: int, height: int, areas: Sequence,
                        decoded: DecodedImages | None = None) -> PyramidLevel:
    """Level ``index`` (``width`` x ``height``) painted from the stored tiles of its main
    images (module docstring).

    Args:
        areas: the :class:`~wsitool.formats.tiff.leica.Area` of each main image (stored
            level, offset in level pixels), in image order.
        decoded: a decoded-image cache shared by the slide's levels (None: the level's own).

    Raises:
        UnsupportedFormatError: a main image stripped, planar or not JPEG, main images of
            different JPEG tables, or more stored tiles than :data:`MAX_PLACED_TILES`.
    """
    if sum(a.level.tiles_across * a.level.tiles_down for a in areas) > MAX_PLACED_TILES:
        raise UnsupportedFormatError(f"Leica SCN level {index}: main images of more tiles than wsitool's limit")
    prefixes = set()
    for area in areas:
        if not area.level.tiled or area.level.tiles.planes != 1:
            raise UnsupportedFormatError(f"Leica SCN level {index}: a stripped or planar main image")
        prefixes.add(_jpeg_prefix(index, area.level))
    if len(prefixes) > 1:
        raise UnsupportedFormatError(f"Leica SCN level {index}: main images off the tile grid with different "
                                     "JPEG tables (not read yet)")
    b = MosaicBuilder(decoded=decoded, jpeg_prefix=prefixes.pop())
    for n, area in enumerate(areas):
        lv = area.level
        src = b.source(lv.source)
        tw, th = lv.tile_width, lv.tile_height
        count = lv.tiles_across * lv.tiles_down
        # (a table entry past any file reads as past the end of this one: a truncated-file error)
        offsets = np.minimum(np.asarray(lv.tiles.offsets[:count], np.uint64), 1 << 62).astype(np.int64)
        lengths = np.minimum(np.asarray(lv.tiles.bytecounts[:count], np.uint64), 1 << 62).astype(np.int64)
        present = np.nonzero(lengths > 0)[0]
        rows, cols = np.divmod(present, lv.tiles_across)
        # edge tiles clipped to the image; SATURATE: the first image painted stays, so the
        # earlier images are placed in front (higher z)
        b.place_images(src, offsets[present], lengths[present], tw, th, "jpeg",
                       x=area.x + cols * tw, y=area.y + rows * th,
                       w=np.minimum(tw, lv.width - cols * tw), h=np.minimum(th, lv.height - rows * th),
                       z=-n)
    first = areas[0].level  # (decoded to RGB whatever the tiles' photometric)
    level = mosaic_level(b.build(), index=index, width=width, height=height, downsample=1.0,
                         tile_width=first.tile_width, tile_height=first.tile_height)
    level.areas = tuple((a.x, a.y, a.level.width, a.level.height) for a in areas)
    return level
