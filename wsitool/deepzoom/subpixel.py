"""Regions read as OpenSlide 4 paints them, sub-pixel offsets included (floor 6).

wsitool's ``Slide.read_region`` takes the nearest stored pixel of a level (its
documented rule).  OpenSlide instead maps a level-0 location ``x`` to the level
position ``x / downsample`` without rounding and paints the level's tiles at
that fractional offset with cairo, whose image backend samples them bilinearly
(pixman).  :func:`read_openslide_rgba` reproduces that painting step by step,
so the openslide-python drop-in's ``read_region`` and the Deep Zoom tiles
(:func:`wsitool.deepzoom.tiles.read_blended`) both give OpenSlide's pixels:

* **Pieces**: a region is painted in pieces of at most 4096 x 4096 level
  pixels; piece ``k`` starts at the level-0 coordinate ``trunc(x + 4096 k ds)``
  (so a piece of an integer-positioned region may itself be fractional).
* **Before the origin**: a negative coordinate is moved to 0 and the painting
  shifted by ``trunc(-x / ds)`` whole level pixels (the fraction is dropped).
* **Offset**: the level position's fraction, as cairo hands it to pixman in
  16.16 fixed point (rounded).  Within 1/512 of a whole pixel on both axes
  (cairo's 24.8 test) the stored pixels are copied, nearest.
* **Filter**: otherwise pixman samples bilinearly in float32 (its wide path):
  each 8-bit premultiplied sample times ``1/255``, the four neighbours weighted
  ``(1 - fx)(1 - fy)``, ``fx (1 - fy)``, ``(1 - fx) fy``, ``fx fy`` and summed in
  that order, stored back as ``trunc(v * 256)`` with 256 -> 255.  Pixels outside
  the level are transparent.
* **Seams**: each stored tile is painted on its own (bottom row of tiles first,
  right to left), so where the four neighbours lie in different tiles each
  tile's share is stored in 8 bits and added to what is there (cairo's
  SATURATE operator, in float).
* **Result**: premultiplied ARGB, which openslide-python un-premultiplies as
  ``255 * c // a``.

At whole-pixel positions (every level-0 region, exact downsamples at locations
that are multiples of them) the result is the plain read.

A mosaic level (:mod:`wsitool.mosaic`: MIRAX, overlapping Ventana tiles) is painted image
by image, each at its own offset from the piece (both may be fractional), the rule above per
image (:mod:`wsitool.codec.mosaic_blend`, set with :func:`set_mosaic_painter`); whole-pixel
regions of a level whose images all lie at whole pixels are the plain read.

A level that lists ``areas`` (a Leica SCN's main images, ``wsitool.Level.areas``) is
painted as OpenSlide's Leica reader paints it: each area on its own, in order, at the whole
level pixel ``trunc(x / ds - ax) + ax`` (``ax`` the area's offset: the fraction dropped toward
the area's origin, so a region starting before an area sees it one pixel later than one
starting inside it), never blended; where areas overlap the first painted stays (cairo's
SATURATE operator); pixels outside every area are transparent.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np

from ..ground.geometry import level0_coordinate

__all__ = ["read_openslide_rgba", "whole_pixel", "set_mosaic_painter", "PIECE", "BLEND_BYTES_PER_PIXEL"]

#: OpenSlide paints a region in pieces of at most PIECE x PIECE level pixels
PIECE = 4096
#: bytes a blended (fractional) pixel of a region holds at most while it is painted: the
#: RGBA read (4), its float32 copy (16), the sum and one product (16 each), the 8-bit result
#: and its conversion's temporaries (4 + 32)
BLEND_BYTES_PER_PIXEL = 96
#: level rows of a region read at once (rounded down to whole tile rows, at least one)
BAND_ROWS = 512
#: output rows whose float work (``BLEND_BYTES_PER_PIXEL`` a pixel at most) is done at once
BLEND_ROWS = 128
_INV255 = np.float32(1) / np.float32(255)   # pixman's 8-bit -> float factor (float32)


#: paints a mosaic level's piece: ``(level view, lx, ly, w, h) -> (h, w, 4) uint8 RGBA``
_mosaic_painter: Callable[..., np.ndarray] | None = None


def set_mosaic_painter(painter: Callable[..., np.ndarray] | None) -> None:
    """Set what paints a piece of a mosaic level with fractional placements:
    ``painter(level, lx, ly, w, h, margin)`` with ``level`` a :class:`~wsitool.model.Level` whose
    ``_mosaic`` is set, ``(lx, ly)`` the piece's level position (floats) and ``(w, h)`` its size,
    returning ``(h, w, 4)`` uint8 RGBA (:func:`wsitool.codec.mosaic_blend.paint_openslide`,
    set by :mod:`wsitool.slide`; the lower floors cannot import the decoders)."""
    global _mosaic_painter
    _mosaic_painter = painter


def _offset(t: float) -> tuple[int, int]:
    """``(pixel, fraction)``: the level pixel at or before ``t`` and the fraction past it
    in 1/65536 (16.16 fixed point, rounded, as cairo hands a translation to pixman)."""
    base = math.floor(t)
    fixed = int(np.rint((t - base) * 65536.0))
    if fixed >= 65536:
        base, fixed = base + 1, 0
    return base, fixed


def _exact(t: float) -> bool:
    """cairo samples without filtering (nearest) when a translation is whole in its
    24.8 fixed point: within 1/512 of an integer."""
    return int(np.rint(t * 256.0)) % 256 == 0


def whole_pixel(slide, location, level: int) -> bool:
    """Whether OpenSlide copies stored pixels (no blending) for a region at
    ``location`` on ``level`` no wider or taller than :data:`PIECE` (never on a mosaic level
    with images at fractional positions: each is blended)."""
    mosaic = getattr(slide.levels[level], "_mosaic", None)
    if mosaic is not None and mosaic.fractional:
        return False
    ds = slide.level_downsamples[level]
    return all(v < 0 or _exact(v / ds) for v in location[:2])


def read_openslide_rgba(slide, location, level: int, size, threads: int | None = None) -> np.ndarray:
    """``(h, w, 4)`` uint8 RGBA (not premultiplied): a region as OpenSlide 4 returns it
    through openslide-python (see the module docstring for the rule).

    Args:
        slide: an open :class:`~wsitool.slide.Slide`.
        location: ``(x, y)`` in level-0 pixels (integers; may lie outside the slide).
        level: a level index of ``slide``.
        size: ``(width, height)`` in pixels of ``level``, >= 0.
        threads: decode threads of the reads.

    Pixels outside the slide are ``(0, 0, 0, 0)``.

    Raises:
        as :meth:`wsitool.slide.Slide.read_region`.
    """
    ds = slide.level_downsamples[level]
    x, y = int(location[0]), int(location[1])
    w, h = int(size[0]), int(size[1])
    view = slide.levels[level]
    areas = view.areas
    mosaic = getattr(view, "_mosaic", None)
    rgb = mosaic is not None and mosaic.samples == 3 and mosaic.dtype == np.uint8
    # (a level with areas, a Leica SCN's main images, is painted by its areas' rule even where they
    # are a mosaic's tiles: OpenSlide never blends them)
    placed = _mosaic_painter if rgb and not areas else None
    if (w <= PIECE and h <= PIECE and whole_pixel(slide, (x, y), level) and x >= 0 and y >= 0
            and not areas and (mosaic is None or not mosaic.fractional or placed is None)):
        return slide.read_region((x, y), level, (w, h), mode="rgba", threads=threads)
    out = np.zeros((h, w, 4), np.uint8)
    tiles = slide.levels[level]
    grid = (tiles.tile_width, tiles.tile_height) if tiles.tiled else (0, 0)
    for row in range(-(-h // PIECE)):
        for col in range(-(-w // PIECE)):
            sx, sy = int(x + col * PIECE * ds), int(y + row * PIECE * ds)
            sw, sh = min(w - col * PIECE, PIECE), min(h - row * PIECE, PIECE)
            tx = ty = 0
            if sx < 0:
                tx, sx = int(-sx / ds), 0
                sw -= tx
            if sy < 0:
                ty, sy = int(-sy / ds), 0
                sh -= ty
            if sw > 0 and sh > 0:
                oy, ox = row * PIECE + ty, col * PIECE + tx
                if placed is not None:
                    paint = placed(view, sx / ds, sy / ds, sw, sh, (tx, ty))
                elif areas:
                    paint = _paint_areas(slide, sx / ds, sy / ds, level, sw, sh, areas, threads)
                else:
                    paint = _paint(slide, sx / ds, sy / ds, level, sw, sh, grid, threads)
                out[oy:oy + sh, ox:ox + sw] = paint
    return out


def _paint_areas(slide, lx: float, ly: float, level: int, w: int, h: int, areas, threads) -> np.ndarray:
    """``(h, w, 4)`` uint8 RGBA of a level painted area by area at whole pixels (module docstring)."""
    ds = slide.level_downsamples[level]
    out = np.zeros((h, w, 4), np.uint8)
    for ax, ay, aw, ah in areas:
        tx, ty = math.trunc(lx - ax) + ax, math.trunc(ly - ay) + ay  # (as C converts a double to int64)
        i0, i1 = max(0, ax - tx), min(w, ax + aw - tx)
        j0, j1 = max(0, ay - ty), min(h, ay + ah - ty)
        if i1 <= i0 or j1 <= j0:
            continue
        part = slide.read_region((level0_coordinate(tx + i0, ds), level0_coordinate(ty + j0, ds)), level,
                                 (i1 - i0, j1 - j0), mode="rgba", threads=threads)
        dest = out[j0:j1, i0:i1]
        painted = (part[..., 3] > 0) & (dest[..., 3] == 0)  # (cairo SATURATE: the first painted stays)
        dest[painted] = part[painted]
    return out


def _paint(slide, lx: float, ly: float, level: int, w: int, h: int, grid, threads) -> np.ndarray:
    """``(h, w, 4)`` uint8 RGBA of the level painted at level position ``(lx, ly)``."""
    ds = slide.level_downsamples[level]
    if _exact(lx) and _exact(ly):  # nearest: the stored pixels
        start = (level0_coordinate(math.floor(lx + 0.5), ds), level0_coordinate(math.floor(ly + 0.5), ds))
        return slide.read_region(start, level, (w, h), mode="rgba", threads=threads)
    (bx, fx), (by, fy) = _offset(lx), _offset(ly)
    # The level rows by .. by + h (one more than the output: the bottom neighbours) are read in
    # bands whose later starts fall on tile rows (each tile decoded once); a band's output rows
    # are painted once the band below has given their bottom neighbours, BLEND_ROWS at a time.
    # Peak memory: the output, one band's RGBA and the float work of BLEND_ROWS x (w + 1) pixels.
    th = grid[1] or 1
    step = max(th, BAND_ROWS // th * th)
    edges = [0, *range(step - by % step, h + 1, step), h + 1]
    out = np.empty((h, w, 4), np.uint8)
    carry: np.ndarray | None = None  # the last level row read, the top of the next block
    for r0, r1 in itertools.pairwise(edges):
        if r1 <= r0:
            continue
        band = slide.read_region((level0_coordinate(bx, ds), level0_coordinate(by + r0, ds)), level,
                                 (w + 1, r1 - r0), mode="rgba", threads=threads)
        block = band if carry is None else np.concatenate((carry, band))
        top = r0 - (0 if carry is None else 1)  # the output row of the block's first row
        carry = band[-1:]
        rows = min(r1 - 1, h) - top
        for i in range(0, rows, BLEND_ROWS):  # (the float work of BLEND_ROWS rows at a time)
            n = min(BLEND_ROWS, rows - i)
            out[top + i:top + i + n] = _blend(block[i:i + n + 1], bx, by + top + i, fx, fy, grid)
    return out


def _blend(src: np.ndarray, bx: int, by: int, fx: int, fy: int, grid) -> np.ndarray:
    """``(h - 1, w - 1, 4)`` uint8 RGBA: the ``(h, w, 4)`` level pixels ``src`` (whose top-left is
    level pixel ``(bx, by)``) sampled at the offset ``(fx, fy)`` / 65536, as pixman does."""
    h, w = src.shape[0] - 1, src.shape[1] - 1
    p = src.astype(np.float32)
    if src[..., 3].min() < 255:  # cairo's tiles are premultiplied
        p[..., :3] = np.floor(p[..., :3] * p[..., 3:] / 255 + 0.5)
    p *= _INV255
    # pixman's float bilinear weights (float32): top-left, top-right, bottom-left, bottom-right
    dx, dy = np.float32(fx / 65536), np.float32(fy / 65536)
    one = np.float32(1)
    weights = ((one - dx) * (one - dy), dx * (one - dy), (one - dx) * dy, dx * dy)
    quads = ((slice(None, -1), slice(None, -1)), (slice(None, -1), slice(1, None)),
             (slice(1, None), slice(None, -1)), (slice(1, None), slice(1, None)))
    s = p[quads[0]] * weights[0]
    tmp = np.empty_like(s)  # (one product at a time, in place: the band's memory is p, s and tmp)
    for q, wq in zip(quads[1:], weights[1:], strict=True):
        s += np.multiply(p[q], wq, out=tmp)
    del tmp
    out = _unorm(s, inplace=True)
    tw, th = grid
    # Where the four neighbours lie in different stored tiles, OpenSlide paints each
    # tile on its own (bottom row of tiles first, right to left): each tile's share is
    # stored in 8 bits, then added to what is there (cairo's SATURATE operator).
    cols = np.flatnonzero((bx + np.arange(w) + 1) % tw == 0) if tw and fx else np.empty(0, np.intp)
    rows = np.flatnonzero((by + np.arange(h) + 1) % th == 0) if th and fy else np.empty(0, np.intp)
    if cols.size:
        out[:, cols] = _shares(p, weights, np.arange(h)[:, None], cols[None, :], ((1, 3), (0, 2)))
    if rows.size:
        out[rows, :] = _shares(p, weights, rows[:, None], np.arange(w)[None, :], ((2, 3), (0, 1)))
    if cols.size and rows.size:
        out[np.ix_(rows, cols)] = _shares(p, weights, rows[:, None], cols[None, :], ((3,), (2,), (1,), (0,)))
    return _unpremultiply(out)


def _shares(p, weights, rows, cols, shares) -> np.ndarray:
    """uint8 premultiplied pixels at ``[rows, cols]`` (broadcast index arrays) painted one
    tile's share at a time: ``shares`` lists, in painting order, the neighbours
    (0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right) each tile holds.

    Each share is composited with pixman's float SATURATE (``s * min(1, (1 - da) / sa) + d``,
    clamped to 1) onto the 8-bit result so far."""
    dest = np.zeros((*np.broadcast_shapes(rows.shape, cols.shape), 4), np.uint8)
    one = np.float32(1)
    for share in shares:
        k = share[0]
        s = p[rows + (k >> 1), cols + (k & 1)] * weights[k]
        for k in share[1:]:
            s = s + p[rows + (k >> 1), cols + (k & 1)] * weights[k]
        d = dest.astype(np.float32) * _INV255
        sa, da = s[..., 3:], d[..., 3:]
        with np.errstate(divide="ignore", invalid="ignore"):
            fa = np.where(np.abs(sa) < np.finfo(np.float32).tiny, one, np.minimum(one, (one - da) / sa))
        dest = _unorm(np.minimum(one, s * fa + d))
    return dest


def _unorm(v: np.ndarray, inplace: bool = False) -> np.ndarray:
    """pixman's float -> 8 bits: clamp to [0, 1], ``u = trunc(v * 256)``, ``u - (u >> 8)``
    (``inplace``: ``v``, float32, is used as the scratch)."""
    if inplace:
        np.clip(v, 0, 1, out=v)
        v *= np.float32(256)
        u = v.astype(np.int32)
    else:
        u = (np.clip(v, 0, 1) * np.float32(256)).astype(np.int32)
    u -= u >> 8
    return u.astype(np.uint8)


def _unpremultiply(pm: np.ndarray) -> np.ndarray:
    """openslide-python's conversion of premultiplied pixels: ``255 * c // a`` (truncated)."""
    a = pm[..., 3:].astype(np.int32)
    if a.min() == 255:
        return pm
    rgb = np.where(a == 255, pm[..., :3], (255 * pm[..., :3].astype(np.int32)) // np.maximum(a, 1))
    out = np.empty(pm.shape, np.uint8)
    out[..., :3] = np.where(a == 0, 0, np.minimum(rgb, 255))
    out[..., 3:] = pm[..., 3:]
    return out
