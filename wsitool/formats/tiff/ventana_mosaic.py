"""A Ventana BIF's levels where OpenSlide does not place its tiles on the stored grid (floor 3).

Overlapping tiles (``TileJointInfo`` overlaps), several areas of interest, or an area away
from the stored grid (:func:`.ventana.on_stored_grid` false): each level becomes a mosaic level
(:mod:`wsitool.mosaic`) whose images are the level's stored TIFF tiles, placed where OpenSlide
4.0.1 (``openslide-vendor-ventana.c`` with its tile-map grid) paints them, in wsitool's words:

- **Positions.** Every level-0 tile ``(col, row)`` of an area (columns and rows counted over
  the whole slide from the area's origin) lies at ``col * advance_x + offset_x``,
  ``row * advance_y + offset_y`` in level-0 pixels, with the mean tile step of
  :class:`.ventana.Bif` and the area's offset ``x - start_col * advance_x`` (``y`` likewise).
  A later area's tile at the same ``(col, row)`` replaces an earlier one's.
- **Other levels.** A level of downsample ``d`` divides those positions by ``d``; its share of
  level-0 tile ``(col, row)`` is the ``tile / d`` square at ``((col % d), (row % d))`` tiles of
  that size into its stored tile ``(col // d, row // d)``, cut where the stored image ends
  (OpenSlide clips a tile's pixels past the image edge to transparent).
- **Size.** A level is ``ceil`` of the right and bottom edges of its placed tiles.
- **Paint order.** OpenSlide paints the tiles of a read from the last row up and the last
  column left, each row in turn, with cairo's SATURATE operator, which keeps the pixel painted
  first: the tile of the highest row, then the highest column, is in front.
- **Fractional positions.** OpenSlide's cairo resamples a tile at a fractional position;
  wsitool paints it at the nearest pixel (the mosaic's rule), so pixels near such tiles differ
  slightly from OpenSlide's (positions, sizes and coverage are the same).

Only 8-bit RGB JPEG levels are placed this way (what BIF scanners write); the level's
JPEGTables are merged into each tile as the TIFF reader does.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import CorruptFileError, UnsupportedFormatError
from ...model import PyramidLevel
from ...mosaic import DECODED_CACHE_BYTES, DecodedImages, MosaicBuilder, mosaic_level
from .ventana import Bif

__all__ = ["mosaic_levels"]

_ROW = float(1 << 24)  # paint-order weight of a row (columns are fewer than this)


def mosaic_levels(levels: tuple[PyramidLevel, ...], downsamples: list[float], bif: Bif,
                  tile_w: int, tile_h: int) -> tuple[PyramidLevel, ...]:
    """The BIF's levels as mosaic levels of their stored tiles (module docstring).

    Args:
        levels: the stored levels (from their IFDs, largest first); downsamples: OpenSlide's
            (level 0's magnification over each level's).
        bif: level 0's tile map; tile_w, tile_h: the TIFF tile size (every level's).

    Raises:
        UnsupportedFormatError: a level that is not 8-bit RGB JPEG, a downsample that is not
            a whole number, or a share of a level-0 tile that is not whole pixels.
        CorruptFileError: an area reaching past a level's stored tiles (OpenSlide fails
            reading there), or areas holding more tiles together than level 0 stores (areas
            that overlap: the work they would cost is bounded by the stored tiles instead).
    """
    stored = levels[0].tiles_across * levels[0].tiles_down
    if sum(a.across * a.down for a in bif.areas) > stored:
        raise CorruptFileError(f"Ventana: the areas of interest hold more tiles than level 0 stores ({stored})")
    decoded = DecodedImages(DECODED_CACHE_BYTES)  # one decoded-tile cache for the slide
    return tuple(_level(lv, ds, bif, tile_w, tile_h, decoded) for lv, ds in zip(levels, downsamples, strict=True))


def _tiles(bif: Bif) -> dict[tuple[int, int], tuple[float, float]]:
    """``(col, row) -> (offset_x, offset_y)`` (level-0 pixels) of every placed level-0 tile."""
    out: dict[tuple[int, int], tuple[float, float]] = {}
    for a in bif.areas:
        ox, oy = a.x - a.start_col * bif.advance_x, a.y - a.start_row * bif.advance_y
        for row in range(a.start_row, a.start_row + a.down):
            for col in range(a.start_col, a.start_col + a.across):
                out[(col, row)] = (ox, oy)
    return out


def _check(lv: PyramidLevel, ds: float, bif: Bif, tile_w: int, tile_h: int) -> int:
    enc = lv.encoding
    if enc.stream != "jpeg" or enc.jpeg_scan_segments or lv.samples != 3 or lv.dtype != np.uint8:
        raise UnsupportedFormatError(f"Ventana BIF with overlapping tiles or several areas in "
                                     f"{lv.compression} level {lv.index} (only 8-bit RGB JPEG is read)")
    d = int(ds)
    if d != ds or d < 1 or tile_w % d or tile_h % d:
        raise UnsupportedFormatError(f"Ventana BIF level with downsample {ds:g} (not read yet)")
    for a in bif.areas:
        if (a.start_col < 0 or a.start_row < 0 or (a.start_col + a.across - 1) // d >= lv.tiles_across
                or (a.start_row + a.down - 1) // d >= lv.tiles_down):
            raise CorruptFileError(f"Ventana: an area of interest reaches past level {lv.index}'s stored tiles")
    return d


def _level(lv: PyramidLevel, ds: float, bif: Bif, tile_w: int, tile_h: int,
           decoded: DecodedImages) -> PyramidLevel:
    d = _check(lv, ds, bif, tile_w, tile_h)
    sub_w, sub_h = tile_w // d, tile_h // d
    adv_x, adv_y = bif.advance_x / d, bif.advance_y / d
    offsets, counts = lv.tiles.offsets, lv.tiles.bytecounts
    b = MosaicBuilder(decoded=decoded, jpeg_prefix=lv.encoding.jpeg_prefix)
    src = b.source(lv.source)
    images: dict[int, int] = {}
    left = top = math.inf
    right = bottom = -math.inf
    for (col, row), (ox, oy) in _tiles(bif).items():
        x, y = col * adv_x + ox / d, row * adv_y + oy / d
        left, top = min(left, x), min(top, y)
        right, bottom = max(right, x + sub_w), max(bottom, y + sub_h)
        tc, tr = col // d, row // d
        sx, sy = (col % d) * sub_w, (row % d) * sub_h
        w = min(sub_w, lv.width - tc * tile_w - sx)  # (pixels past the stored image: clipped)
        h = min(sub_h, lv.height - tr * tile_h - sy)
        k = tr * lv.tiles_across + tc
        if w < 1 or h < 1 or not int(counts[k]):
            continue
        if k not in images:
            images[k] = b.image(src, int(offsets[k]), int(counts[k]), tile_w, tile_h, "jpeg")
        b.place(images[k], x, y, (sx, sy, w, h), z=row * _ROW + col)
    width, height = math.ceil(left + (right - left)), math.ceil(top + (bottom - top))
    out = mosaic_level(b.build(), index=lv.index, width=width, height=height, downsample=ds)
    out.path = lv.path
    return out
