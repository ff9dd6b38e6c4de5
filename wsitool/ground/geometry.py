"""Geometry shared by reads, exports and Dask chunks: level <-> level-0 coordinates and tile planning.

Ground floor (standard library only).  Frames: a *location* is ``(x, y)`` in
level-0 pixels; a *region* is ``[rx, rx + w) x [ry, ry + h)`` in pixels of one
level; a *tile* is addressed by ``(col, row)`` in the level's tile grid.

The functions take any object with the attributes of a tile grid
(:class:`TileGrid`: ``width``, ``height``, ``tile_width``, ``tile_height``,
``downsample``), such as :class:`wsitool.model.PyramidLevel`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple, Protocol

__all__ = ["best_level_for_downsample", "TileGrid", "TileJob", "level_rect", "level0_coordinate", "plan_tiles",
           "tile_jobs", "inside_rect", "ScaledGrid", "scaled_grid"]


class TileGrid(Protocol):
    """What geometry needs of a level: its size, tile size (pixels of the level) and downsample
    (read-only: the public, frozen :class:`wsitool.Level` views match too)."""

    @property
    def width(self) -> int: ...
    @property
    def height(self) -> int: ...
    @property
    def tile_width(self) -> int: ...
    @property
    def tile_height(self) -> int: ...
    @property
    def downsample(self) -> float: ...


class TileJob(NamedTuple):
    """One tile a region touches.

    ``col``, ``row``: the tile in the level's grid.  ``src``: ``(x0, y0, x1, y1)``,
    the wanted part in pixels of the tile.  ``dst``: ``(x0, y0, x1, y1)``, where
    it lands in pixels of the output.  Both rectangles are half-open and have
    the same size.
    """

    col: int
    row: int
    src: tuple[int, int, int, int]
    dst: tuple[int, int, int, int]

    def view(self, out):
        """The ``(y1 - y0, x1 - x0, ...)`` sub-array of ``out`` this tile fills."""
        x0, y0, x1, y1 = self.dst
        return out[y0:y1, x0:x1]


def inside_rect(grid: TileGrid, rx: int, ry: int, w: int, h: int) -> tuple[int, int, int, int] | None:
    """``(cx0, cy0, cx1, cy1)``: the part of the region inside the level (level pixels), or None."""
    cx0, cy0 = max(rx, 0), max(ry, 0)
    cx1, cy1 = min(rx + w, grid.width), min(ry + h, grid.height)
    if cx0 >= cx1 or cy0 >= cy1:
        return None
    return cx0, cy0, cx1, cy1


def level_rect(grid: TileGrid, x: int, y: int) -> tuple[int, int]:
    """Map a level-0 location to the level's frame: ``floor(x / downsample + 0.5)``
    (the level pixel OpenSlide weights most; wsitool never resamples)."""
    lv = grid
    if lv.downsample == 1.0:
        return x, y
    return math.floor(x / lv.downsample + 0.5), math.floor(y / lv.downsample + 0.5)


def level0_coordinate(t: int, downsample: float) -> int:
    """Smallest level-0 coordinate that :func:`level_rect` maps to level coordinate ``t``.

    The inverse of ``floor(x / downsample + 0.5)``: ``ceil((t - 0.5) * downsample)``
    (exact for ``downsample >= 1``, which every level has).  Used to aim reads
    at a given level pixel (export strips, Dask chunks).
    """
    if downsample == 1.0:
        return t
    x = math.ceil((t - 0.5) * downsample)
    while math.floor((x - 1) / downsample + 0.5) >= t:  # guard float rounding
        x -= 1
    while math.floor(x / downsample + 0.5) < t:
        x += 1
    return x


def plan_tiles(grid: TileGrid, rx: int, ry: int, w: int, h: int,
               jobs: bool = True) -> tuple[tuple[int, int, int, int] | None, list[TileJob]]:
    """Tiles touched by the region ``[rx, rx + w) x [ry, ry + h)`` of a level (level pixels).

    Returns ``(inside, jobs)``: ``inside`` is :func:`inside_rect` of the region
    (or None); ``jobs`` lists one :class:`TileJob` per tile touched, in
    row-major order (an empty list when called with ``jobs=False``).
    """
    inside = inside_rect(grid, rx, ry, w, h)
    if inside is None or not jobs:
        return inside, []
    return inside, tile_jobs(grid, rx, ry, inside)


def tile_jobs(grid: TileGrid, rx: int, ry: int, inside: tuple[int, int, int, int]) -> list[TileJob]:
    """One :class:`TileJob` per tile of ``grid`` that ``inside`` (the part inside the level of
    the region whose top-left corner is ``(rx, ry)``: :func:`inside_rect`) touches, in
    row-major order."""
    cx0, cy0, cx1, cy1 = inside
    tw, th = grid.tile_width, grid.tile_height
    planned = []
    for row in range(cy0 // th, (cy1 - 1) // th + 1):
        ty0 = row * th
        oy0, oy1 = max(ty0, cy0), min(ty0 + th, cy1)
        for col in range(cx0 // tw, (cx1 - 1) // tw + 1):
            tx0 = col * tw
            ox0, ox1 = max(tx0, cx0), min(tx0 + tw, cx1)
            planned.append(TileJob(col, row, (ox0 - tx0, oy0 - ty0, ox1 - tx0, oy1 - ty0),
                                   (ox0 - rx, oy0 - ry, ox1 - rx, oy1 - ry)))
    return planned


class ScaledGrid(NamedTuple):
    """A level seen at ``1 / factor`` scale (a virtual level for reduced-resolution reads).

    Virtual pixel ``u`` stands for level pixels ``[factor * u, factor * u + factor)``
    (clipped to the level); the virtual level is ``ceil(width / factor) x
    ceil(height / factor)`` pixels, its tiles ``tile_width / factor`` (the caller
    makes sure ``factor`` divides the tile size) and its downsample the level's
    times ``factor``.  This is the grid of a JPEG 2000 tile-component at
    resolution level ``N_L - log2(factor)`` (ITU-T T.800 B.5, equation B-14, for
    tiles at multiples of the tile size from origin 0).
    """

    width: int
    height: int
    tile_width: int
    tile_height: int
    downsample: float
    factor: int


def scaled_grid(grid: TileGrid, factor: int) -> ScaledGrid:
    """The :class:`ScaledGrid` of ``grid`` at ``1 / factor`` scale (``factor`` >= 1)."""
    return ScaledGrid(-(-grid.width // factor), -(-grid.height // factor),
                      max(1, grid.tile_width // factor), max(1, grid.tile_height // factor),
                      grid.downsample * factor, factor)


def best_level_for_downsample(level_downsamples: Sequence[float], downsample: float) -> int:
    """Index of the largest level whose downsample is <= ``downsample``.

    OpenSlide's rule (``openslide_get_best_level_for_downsample``, openslide.c):
    below level 0's downsample gives 0; past the last level's gives the last.

    Args:
        level_downsamples: downsample of each level, level 0 first, increasing.
        downsample: the wanted downsample (level-0 pixels per output pixel).
    """
    ds = level_downsamples
    if not ds or downsample < ds[0]:
        return 0
    for i in range(1, len(ds)):
        if downsample < ds[i]:
            return i - 1
    return len(ds) - 1
