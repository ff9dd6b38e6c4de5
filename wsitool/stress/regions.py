"""The seeded workload of ``wsitool stress``: which region iteration i reads, and its digest (floor 6, consumers).

Regions are a pure function of ``(seed, iteration index)`` (:func:`region_for`),
so the parent, the child and the tests can reproduce any read; the child sends
the :func:`checksum` of every verified read and the parent's fresh reader
compares its own.
"""

from __future__ import annotations

import hashlib
import random

from ..ground.geometry import level0_coordinate

#: Placement kinds of a random region and their cumulative probabilities.
_KINDS = ((0.55, "inside"), (0.75, "edge"), (0.90, "top-left"), (1.0, "anywhere"))


def checksum(buf) -> str:
    """Hex BLAKE2b-128 digest of a C-contiguous buffer (any dtype)."""
    return hashlib.blake2b(memoryview(buf).cast("B"), digest_size=16).hexdigest()


def size_bounds(region_size: int) -> tuple[int, int]:
    """Smallest and largest region side drawn for ``region_size``: [size/2, 3*size/2]."""
    return max(1, region_size // 2), max(1, region_size + region_size // 2)


def region_for(seed: int, index: int, levels: list[dict], region_size: int):
    """The region read at iteration ``index``: ``(level, x0, y0, width, height)``.

    ``levels`` lists the candidate levels as dicts with ``index``, ``width``,
    ``height``, ``downsample``.  Width and height are drawn uniformly in
    :func:`size_bounds`; the position is inside the level (55 %), straddling
    its right/bottom edge (20 %), partly outside its top-left corner (15 %) or
    anywhere including wholly outside (10 %).  ``x0, y0`` are level-0 pixels.
    """
    rng = random.Random((seed << 40) ^ index)
    lv = levels[rng.randrange(len(levels))]
    lo, hi = size_bounds(region_size)
    w, h = rng.randint(lo, hi), rng.randint(lo, hi)
    lw, lh = lv["width"], lv["height"]
    u = rng.random()
    kind = next(name for p, name in _KINDS if u < p)
    if kind == "inside":
        x = rng.randint(0, max(0, lw - w))
        y = rng.randint(0, max(0, lh - h))
    elif kind == "edge":
        x = rng.randint(max(0, lw - w), lw - 1)
        y = rng.randint(max(0, lh - h), lh - 1)
    elif kind == "top-left":
        x = rng.randint(-w + 1, 0)
        y = rng.randint(-h + 1, 0)
    else:
        x = rng.randint(-w, lw + 32)
        y = rng.randint(-h, lh + 32)
    # the level-0 location that read_region maps back to level pixel (x, y)
    ds = lv["downsample"]
    return lv["index"], level0_coordinate(x, ds), level0_coordinate(y, ds), w, h
