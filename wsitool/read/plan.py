"""A region's tiles, planned once: what the fill reads, and what it tells the byte source (floor 4).

:class:`TilePlan` is the plan of one region of a level: the part of it inside the level (the
rest is filled with zeros), the block of tiles it touches, the :class:`~wsitool.ground.geometry.TileJob`
of each tile (made on first use: the compiled loop takes the block, the Python path the jobs)
and the ranges of its tiles' bytes.  The fill makes it once and hands it to a route
(:mod:`.fill`); the batch reader (:mod:`wsitool.read.patches`) advises its runs through
:func:`advise_blocks`.

Advice is one verb: the plan names the bytes it will read (:func:`segment_ranges`: the
``(offset, count)`` of the stored tiles as the level's index gives them, a tile row's as one
range where its tiles lie together) and the level's byte source decides what to do with them
(:meth:`wsitool.storage.ByteSource.advise`).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..ground.geometry import TileJob, inside_rect, tile_jobs
from ..model import PyramidLevel

__all__ = ["TilePlan", "segment_ranges", "advise_blocks", "advise_mosaic", "ends_one_column_into_a_tile"]


class TilePlan:
    """The tiles the region ``[x, x + width) x [y, y + height)`` of ``level`` (level pixels) touches.

    Attributes:
        level, x, y, width, height: the region.
        inside: ``(x0, y0, x1, y1)``, its part inside the level in level pixels, or None.
        c0, c1, r0, r1: the tile columns and rows it touches (inclusive; 0 where ``inside`` is None).
    """

    __slots__ = ("level", "x", "y", "width", "height", "inside", "c0", "c1", "r0", "r1", "_jobs")

    def __init__(self, level: PyramidLevel, x: int, y: int, width: int, height: int):
        self.level, self.x, self.y, self.width, self.height = level, x, y, width, height
        self.inside = inside_rect(level, x, y, width, height)
        self.c0 = self.c1 = self.r0 = self.r1 = 0
        if self.inside is not None:
            cx0, cy0, cx1, cy1 = self.inside
            tw, th = level.tile_width, level.tile_height
            self.c0, self.c1, self.r0, self.r1 = cx0 // tw, (cx1 - 1) // tw, cy0 // th, (cy1 - 1) // th
        self._jobs: list[TileJob] | None = None

    @property
    def count(self) -> int:
        """Tiles touched (0 where the region lies outside the level)."""
        return 0 if self.inside is None else (self.c1 - self.c0 + 1) * (self.r1 - self.r0 + 1)

    @property
    def first(self) -> int | None:
        """The index of the first tile touched (row-major), or None."""
        return None if self.inside is None else self.r0 * self.level.tiles_across + self.c0

    def jobs(self) -> list[TileJob]:
        """One :class:`~wsitool.ground.geometry.TileJob` per tile touched, row-major (made once)."""
        if self._jobs is None:
            self._jobs = [] if self.inside is None else tile_jobs(self.level, self.x, self.y, self.inside)
        return self._jobs

    def ends_one_column_into_a_tile(self) -> bool:
        """:func:`ends_one_column_into_a_tile` of the region."""
        return ends_one_column_into_a_tile(self.level, self.x, self.width)

    def advise(self, ahead: bool = False) -> None:
        """Tell the level's byte source the segments of every tile touched (:func:`advise_blocks`)."""
        if self.inside is not None:
            advise_blocks(self.level, [(self.c0, self.c1, self.r0, self.r1)], ahead)


def ends_one_column_into_a_tile(lv: PyramidLevel, rx: int, w: int) -> bool:
    """True when the region's last column (of a region at level column ``rx``, ``w`` wide) is
    the first column of a tile: that tile's window is one column at its left edge, which the
    Python path decodes whole and crops where the code stream is wider
    (:func:`wsitool.codec.nvdecode.narrow_jpeg_crop`); the compiled loop has no such route,
    so these regions take the Python path."""
    last = min(rx + w, lv.width) - 1
    return last >= max(rx, 0) and last % lv.tile_width == 0


def segment_ranges(lv: PyramidLevel, blocks: Iterable[tuple[int, int, int, int]]) -> list[tuple[int, int]]:
    """The ``(offset, count)`` ranges of the stored tiles of the ``(c0, c1, r0, r1)`` blocks
    (columns ``c0..c1`` and rows ``r0..r1`` of ``lv``'s grid, inclusive), block by block: a
    block row's tiles as one range where they lie close together in the index (the range at
    most twice their bytes), else one per tile (missing tiles left out).  The index's own
    entries, whatever they address: byte ranges of a file, or the frame addresses of a source
    of frames, whose rows join only where their frame numbers follow each other (a frame's
    count, :data:`wsitool.formats.dicom.web.series.NOMINAL`, is half its address stride)."""
    offsets, counts, across = lv.tiles.offsets, lv.tiles.bytecounts, lv.tiles_across
    ranges: list[tuple[int, int]] = []
    for c0, c1, r0, r1 in blocks:
        if r1 - r0 < _FEW_ROWS:
            for row in range(r0, r1 + 1):
                _row_ranges(ranges, offsets[row * across + c0:row * across + c1 + 1].tolist(),
                            counts[row * across + c0:row * across + c1 + 1].tolist())
            continue
        # the rows at once (an NDPI region has a hundred rows of restart intervals: numpy calls
        # row by row were a millisecond of each 1024 x 1024 read, under the GIL)
        n = r1 - r0 + 1
        offs = offsets[r0 * across:(r1 + 1) * across].reshape(n, across)[:, c0:c1 + 1]
        cnts = counts[r0 * across:(r1 + 1) * across].reshape(n, across)[:, c0:c1 + 1]
        ends = offs + cnts
        lo, hi = offs.min(1), ends.max(1)
        whole = ((lo > 0) & (hi - lo <= 2 * cnts.sum(1))).tolist()
        for r, (a, b, one) in enumerate(zip(lo.tolist(), hi.tolist(), whole, strict=True)):
            if one:
                ranges.append((a, b - a))
            else:
                ranges.extend((off, end - off) for off, end in zip(offs[r].tolist(), ends[r].tolist(), strict=True)
                              if off and end > off)
    return ranges


#: Blocks of fewer tile rows than this are cut into ranges row by row in Python (a few numpy
#: calls cost more than the loop: 20 us of a 0.9 ms read of 256 x 256 pixels).
_FEW_ROWS = 8


def _row_ranges(ranges: list[tuple[int, int]], offs: list[int], cnts: list[int]) -> None:
    """Append the ranges of one row's tiles (``offs``, ``cnts``) to ``ranges``, by the rule of
    :func:`segment_ranges`."""
    lo, hi = min(offs), max(o + c for o, c in zip(offs, cnts, strict=True))
    if lo > 0 and hi - lo <= 2 * sum(cnts):
        ranges.append((lo, hi - lo))
    else:
        ranges.extend((o, c) for o, c in zip(offs, cnts, strict=True) if o and c)


def advise_blocks(lv: PyramidLevel, blocks: Iterable[tuple[int, int, int, int]], ahead: bool = False) -> None:
    """Advise the byte source of the tiles of every ``(c0, c1, r0, r1)`` block in one call
    (:func:`segment_ranges`), so that a remote source merges the ranges of neighbouring blocks
    into one request and a source of frames asks for them in one (``ahead``: read-ahead for a
    later batch, which the source may skip).  Nothing for a level of several planes.  Advisory
    only."""
    if lv.tiles.planes != 1:
        return
    ranges = segment_ranges(lv, blocks)
    if ranges:
        lv.source.advise(ranges, ahead)


def advise_mosaic(lv: PyramidLevel, rects: Iterable[tuple[int, int, int, int]], ahead: bool = False) -> None:
    """Advise each byte source of mosaic level ``lv`` of the images the ``(x0, y0, x1, y1)``
    rectangles (level pixels) need and its decoded-image cache does not hold.  Advisory only."""
    mosaic = lv.mosaic
    found = [mosaic.images_in(*r) for r in rects]
    if not found:
        return
    images = [k for k in np.unique(np.concatenate(found)).tolist() if mosaic.cached(k) is None]
    for source, ranges in mosaic.ranges(np.asarray(images, np.int64)).items():
        mosaic.sources[source].advise(sorted(ranges), ahead)
