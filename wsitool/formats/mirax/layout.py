"""Where OpenSlide 4.0.1 places a MIRAX slide's camera images, level by level (floor 3).

The scanner photographs the slide at *camera positions* (the position record, or a nominal grid
where there is none); each photo is cut into ``d x d`` images (``CameraImageDivisionsPerSide``)
that lie edge to edge.  Photos overlap.  Each higher zoom level halves and concatenates 2 x 2
images of the level below (``IMAGE_CONCAT_FACTOR``: the exponent added at that level), per
image and regardless of the overlap, so once a level's image holds several photos it is cut
into *sub-tiles* again, each placed at its own photo's position.  This module reproduces
OpenSlide's arithmetic (``mirax_open``, ``process_hier_data_pages_from_indexfile``,
``get_tile_position``, ``insert_tile``) in wsitool's words:

* per level: ``concat = 2 ** (sum of the exponents so far)``; ``positions_per_image =
  max(1, concat / d)``; with position data or an overlap, ``tiles_per_image =
  positions_per_image``, ``tile_count_divisor = min(concat, d)`` and ``positions_per_tile = 1``;
  otherwise ``tiles_per_image = 1``, ``tile_count_divisor = concat`` and ``positions_per_tile =
  positions_per_image``; a sub-tile is ``image / tiles_per_image`` pixels;
* level size: level 0's (images across, each full except the last of each photo, which loses
  the overlap) divided by ``concat``; downsample ``concat / concat(level 0)``;
* a level-0 image marks its photo *active* (unless the photo's position is (0, 0) and it is
  not the first photo); a sub-tile of a higher level is placed only where its photo (or, without
  sub-tiles, one of the photos it holds) is active;
* a sub-tile is placed at ``(photo position + image size x its image's place in the photo) /
  concat`` (fractional where that does not divide), in the grid cell ``(x / divisor + xi, y /
  divisor + yi)``; a later sub-tile of the same cell replaces the earlier one;
* paint order: OpenSlide paints a region's cells from the last row up and the last column left
  with cairo's SATURATE operator, which leaves a pixel that is already opaque as it is: the
  first painted stays, so where images overlap the highest ``(row, column)`` is in front.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from ...errors import CorruptFileError

__all__ = ["ZoomLevel", "LevelParams", "Grid", "level_params", "base_size", "place_level", "Placed"]


@dataclasses.dataclass(frozen=True)
class ZoomLevel:
    """One ``Slide zoom level`` section of Slidedat.ini."""

    concat_exponent: int
    overlap_x: float
    overlap_y: float
    mpp_x: float
    mpp_y: float
    fill_bgr: int
    image_format: str  # "jpeg", "png" or "bmp" (a mosaic codec name)
    image_w: int
    image_h: int


@dataclasses.dataclass(frozen=True)
class LevelParams:
    """OpenSlide's per-level numbers (module docstring)."""

    concat: int
    tile_count_divisor: int
    tiles_per_image: int
    positions_per_tile: int
    tile_w: float
    tile_h: float
    advance_x: float
    advance_y: float


def level_params(zooms: list[ZoomLevel], divisions: int, has_positions: bool) -> list[LevelParams]:
    """Each level's :class:`LevelParams` (``has_positions``: a position record, or an overlap at
    level 0).

    Raises:
        CorruptFileError: a concatenation exponent sum beyond 30 (OpenSlide's limit).
    """
    out = []
    total = 0
    for z in zooms:
        total += z.concat_exponent
        if total > 30:
            raise CorruptFileError(f"Slidedat.ini: image_concat exponent too large: {total}")
        concat = 1 << total
        per_image = max(1, concat // divisions)
        if has_positions:
            divisor, tiles, per_tile = min(concat, divisions), per_image, 1
        else:
            divisor, tiles, per_tile = concat, 1, per_image
        tile_w, tile_h = z.image_w / tiles, z.image_h / tiles
        per_position = max(1, divisions // concat)
        out.append(LevelParams(concat, divisor, tiles, per_tile, tile_w, tile_h,
                               tile_w - z.overlap_x / per_position, tile_h - z.overlap_y / per_position))
    return out


def _side(count: int, divisions: int, image: int, overlap: float) -> int:
    """Level 0's size along one side: OpenSlide's sum (an int64 that each double step truncates)."""
    if float(overlap).is_integer():
        return count * image - int(overlap) * ((count - 1) // divisions)
    total = 0
    for i in range(count):
        full = i % divisions != divisions - 1 or i == count - 1
        total = int(total + (image if full else image - overlap))
    return total


def base_size(images_x: int, images_y: int, divisions: int, zero: ZoomLevel) -> tuple[int, int]:
    """Level 0's ``(width, height)``."""
    return (_side(images_x, divisions, zero.image_w, zero.overlap_x),
            _side(images_y, divisions, zero.image_h, zero.overlap_y))


@dataclasses.dataclass
class Placed:
    """One level's sub-tiles as OpenSlide keeps them (one per grid cell).

    ``cells``: ``(col, row) -> (record row, x, y, src_x, src_y)``: the image (a row of the level's
    records), its level position and the sub-tile's corner in it.  ``bounds``: ``(left, top,
    right, bottom)`` of every sub-tile inserted (replaced ones included, as OpenSlide's grid
    counts them), or None.
    """

    cells: dict[tuple[int, int], tuple[int, float, float, float, float]]
    bounds: tuple[float, float, float, float] | None


@dataclasses.dataclass(frozen=True)
class Grid:
    """The slide's camera grid: images across and down at level 0, divisions per photo side,
    level 0's section, the photos' positions (``position(photo) -> (x, y)``) and their count."""

    images_x: int
    images_y: int
    divisions: int
    zero: ZoomLevel
    position: Callable[[int], tuple[int, int]]
    npositions: int


def place_level(records: np.ndarray, lp: LevelParams, level: int, grid: Grid, active: set[int]) -> Placed:
    """Place the images of one level (``records``: its ``(n, 4)`` index records) as OpenSlide
    does; level 0 fills ``active`` (the photos that have an image), the others read it.

    Raises:
        CorruptFileError: an image index outside the level's grid or not a multiple of its
            concatenation, or a photo outside the position table.
    """
    images_x, images_y, divisions, zero = grid.images_x, grid.images_y, grid.divisions, grid.zero
    position, npositions = grid.position, grid.npositions
    room = -(-images_x // lp.concat) * -(-images_y // lp.concat)
    if len(records) > room:  # (bounds the work an index can ask for)
        raise CorruptFileError(f"Index.dat: zoom level {level} lists {len(records)} images, more than its "
                               f"grid of {room} holds")
    cells: dict[tuple[int, int], tuple[int, float, float, float, float]] = {}
    left = top = math.inf
    right = bottom = -math.inf
    positions_x = images_x // divisions
    for r, index in enumerate(records[:, 0].tolist()):
        x, y = index % images_x, index // images_x
        if y >= images_y:
            raise CorruptFileError(f"Index.dat: y ({y}) outside of bounds for zoom level ({level})")
        if x % lp.concat or y % lp.concat:
            raise CorruptFileError(f"Index.dat: image ({x}, {y}) not a multiple of zoom level {level}'s "
                                   f"concatenation ({lp.concat})")
        for yi in range(lp.tiles_per_image):
            yy = y + yi * divisions
            if yy >= images_y:
                break
            for xi in range(lp.tiles_per_image):
                xx = x + xi * divisions
                if xx >= images_x:
                    break
                xp, yp = xx // divisions, yy // divisions
                cp = yp * positions_x + xp
                if not 0 <= cp < npositions:
                    raise CorruptFileError(f"Index.dat: image ({xx}, {yy}) of zoom level {level} lies outside "
                                           f"the {npositions} camera positions")
                px, py = position(cp)
                if level == 0:
                    if px == 0 and py == 0 and (xp or yp):
                        continue
                    active.add(cp)
                elif not any((yq * positions_x + xq) in active for yq in range(yp, yp + lp.positions_per_tile)
                             for xq in range(xp, xp + lp.positions_per_tile)):
                    continue
                pos_x = (px + zero.image_w * (xx - xp * divisions)) / lp.concat
                pos_y = (py + zero.image_h * (yy - yp * divisions)) / lp.concat
                col, row = x // lp.tile_count_divisor + xi, y // lp.tile_count_divisor + yi
                cells[(col, row)] = (r, pos_x, pos_y, lp.tile_w * xi, lp.tile_h * yi)
                left, top = min(left, pos_x), min(top, pos_y)
                right, bottom = max(right, pos_x + lp.tile_w), max(bottom, pos_y + lp.tile_h)
    return Placed(cells, None if math.isinf(left) else (left, top, right, bottom))
