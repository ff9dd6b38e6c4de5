"""The Hamamatsu levels OpenSlide makes by scaled JPEG decoding, below each stored NDPI level (floor 3).

OpenSlide's rule (its Hamamatsu format notes, "libjpeg scaling"; checked
against ``create_scaled_jpeg_levels`` in OpenSlide 4.0's
``openslide-vendor-hamamatsu.c`` and against OpenSlide 4.0.1's levels of the
shared NDPI sample):

* every stored level (its tiles are the restart intervals of one JPEG scan,
  ``tile_width x tile_height`` pixels; a page without restart intervals is one
  tile) adds, for each ``d`` of 2, 4, 8 that divides both its tile width and
  its tile height, a level of ``floor(width / d) x floor(height / d)`` pixels
  with tiles of ``tile_width / d x tile_height / d``: the same restart
  intervals decoded at scale ``1/d`` (libjpeg ``scale_denom``);
* levels are keyed by width and visited largest stored level first, each
  stored level before its scaled ones: a level with the width of one already
  listed replaces it, so a stored level always wins over a scaled one of its
  width, and of two scaled levels of one width the one made from the smaller
  stored level (at the smaller scale) wins;
* the list is sorted by width, largest first; downsamples are computed as for
  any level, ``(W0 / w + H0 / h) / 2``.

On the shared sample (stored 3968x4864 ... 496x608 in steps of 2, restart
intervals one MCU row of 8 pixels) that gives the 4 stored levels and three
made from the smallest one: 248x304 (tiles 248x4), 124x152 (124x2) and 62x76
(62x1).  Slides whose stored levels are 4x apart get scaled levels between
them, made from the larger level.

What wsitool makes of a scaled level: a :class:`~wsitool.model.PyramidLevel` that
shares the stored level's byte source and segments, with an encoding whose
codec is :data:`~wsitool.model.SCALED_JPEG` and ``scale_log2 = log2 d``
(:mod:`wsitool.codec.scaled` decodes it with Pillow).  Stored levels are
scaled only where they are 8-bit 3-sample JPEG in one sample plane (OpenSlide
refuses NDPI JPEG of other than 3 components), and a scale only where the
scaled grid has the stored grid's columns (the segment index is ``row *
tiles_across + col`` in both; a stored width that ends less than ``d`` pixels
into its last interval column would lose that column, and that scale is
skipped).
"""

from __future__ import annotations

import dataclasses
from itertools import pairwise

import numpy as np
from tifffile import COMPRESSION

from ...model import SCALED_JPEG, PyramidLevel

__all__ = ["SCALE_DENOMS", "scaled_plan", "with_scaled_levels"]

#: libjpeg's DCT scale denominators OpenSlide adds levels for.
SCALE_DENOMS = (2, 4, 8)


def scaled_plan(stored: list[tuple[int, int, int, int, tuple[int, ...]]]) -> list[tuple[int, int]]:
    """Which levels OpenSlide shows for stored Hamamatsu levels (the rule of the module docstring).

    Args:
        stored: per stored level, largest first, ``(width, height, tile_width,
            tile_height, denoms)`` in pixels; ``denoms``: the scale
            denominators (of 2, 4, 8) wsitool can decode that level at, of which
            those dividing both tile sides are used (empty: no scaled levels).

    Returns:
        ``[(stored index, d)]``, one entry per level shown, largest width first;
        ``d`` is 1 for the stored level itself, else 2, 4 or 8 (decoded at
        ``1/d``).  The stored list unchanged (each with ``d`` 1) when the
        stored widths are not strictly decreasing: OpenSlide refuses such a
        slide ("Unexpected directory layout"), and keyed by width one stored
        level would hide another.
    """
    widths = [w for w, *_ in stored]
    if any(b >= a for a, b in pairwise(widths)):
        return [(i, 1) for i in range(len(stored))]
    by_width: dict[int, tuple[int, int]] = {}
    for i, (width, _height, tw, th, denoms) in enumerate(stored):
        by_width[width] = (i, 1)
        for d in SCALE_DENOMS:
            if d in denoms and tw % d == 0 and th % d == 0:
                by_width[width // d] = (i, d)
    return [by_width[w] for w in sorted(by_width, reverse=True)]


def _denoms(lv: PyramidLevel) -> tuple[int, ...]:
    """The scales ``1/d`` ``lv`` can be decoded at: none unless it is 8-bit, 3-sample,
    one-plane JPEG that a decoder reads (the JPEG OpenSlide accepts); then each ``d``
    dividing the tile whose scaled grid keeps ``lv``'s tile columns (same segment
    indices, ``row * tiles_across + col``)."""
    enc = lv.encoding
    if not (enc.stream == "jpeg" and enc.compression_code == COMPRESSION.JPEG and enc.compression_problem is None
            and lv.samples == 3 and lv.dtype == np.uint8 and lv.tiles.planes == 1
            and not enc.extrasamples):
        return ()
    return tuple(d for d in SCALE_DENOMS
                 if lv.tile_width % d == 0 and lv.tile_height % d == 0
                 and -(-(lv.width // d) // (lv.tile_width // d)) == lv.tiles_across)


def with_scaled_levels(levels: tuple[PyramidLevel, ...], base_size: tuple[int, int]) -> tuple[PyramidLevel, ...]:
    """The stored NDPI ``levels`` (largest first) with OpenSlide's scaled levels added.

    Args:
        levels: the stored levels, numbered 0, 1, ... largest first.
        base_size: ``(width, height)`` of level 0 in pixels (for downsamples).

    Returns:
        Every level OpenSlide 4 shows (:func:`scaled_plan`), numbered again in
        order of decreasing width: stored levels as given (renumbered where a
        scaled level comes before them), scaled ones with
        ``encoding.codec == "scaled-jpeg"``, their size ``floor(stored / d)``,
        tile ``stored tile / d``, and the stored level's segments.
    """
    plan = scaled_plan([(lv.width, lv.height, lv.tile_width, lv.tile_height, _denoms(lv))
                        for lv in levels])
    if len(plan) == len(levels):
        return levels
    return tuple(_level(levels[i], index, d, base_size) for index, (i, d) in enumerate(plan))


def _level(src: PyramidLevel, index: int, d: int, base_size: tuple[int, int]) -> PyramidLevel:
    """``src`` as level ``index``, decoded at ``1/d`` (``d`` 1: the stored level itself)."""
    if d == 1 and index == src.index:
        return src
    w0, h0 = base_size
    width, height = src.width // d, src.height // d
    encoding = src.encoding
    if d > 1:
        encoding = dataclasses.replace(encoding, codec=SCALED_JPEG, scale_log2=d.bit_length() - 1)
    return PyramidLevel(index=index, width=width, height=height,
                 downsample=src.downsample if d == 1 else (w0 / width + h0 / height) / 2.0,
                 tile_width=src.tile_width // d, tile_height=src.tile_height // d,
                 tiled=src.tiled, samples=src.samples, dtype=src.dtype, encoding=encoding,
                 tiles=src.tiles, source=src.source)  # (named by the opener)
