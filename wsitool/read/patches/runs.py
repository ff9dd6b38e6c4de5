"""The runs of tiles a batch of patches decodes, and the pieces each run gives the windows (floor 4).

The windows of a batch (:func:`footprint`) touch tiles; those the previous batch did not already
copy into them are cut into runs (:func:`plan_runs`: neighbours in a tile row, at most
:data:`RUN_TILES`), each a :class:`Task` of the batch with the copies of its pixels into this
batch's windows and the next one's.  Planning only: nothing is read or decoded here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ...model import PyramidLevel

__all__ = ["RUN_TILES", "Run", "Task", "Footprint", "NO_PIECES", "footprint", "plan_runs", "window_corners",
           "consecutive_spans"]

#: Most tiles decoded by one call (one run: neighbours in a tile row).  16 keeps a
#: run's buffer small (16 tiles of 240 x 240 RGB: 2.7 MB a thread) and matches the
#: compiled loop's batch of 16 tiles per decoder call.
RUN_TILES = 16


@dataclass(eq=False)
class Run:
    """Tiles ``c0..c1`` (inclusive) of tile row ``row``, decoded together.

    ``rect``: ``(x0, y0, x1, y1)`` in level pixels.  ``buf``: the flat buffer holding the
    run's pixels while it is carried to a later batch, else None.  ``failed``: a tile of
    the run failed to decode (its patches are read one by one instead: :class:`PatchReader`).
    """

    row: int
    c0: int
    c1: int
    rect: tuple[int, int, int, int]
    buf: np.ndarray | None = None
    failed: bool = False


@dataclass(eq=False)
class Task:
    """One batch's use of a run.

    ``pieces`` and ``next_pieces``: the copies of the run's pixels into the windows of
    this batch and of the next one, ``(k, 9)`` int64 arrays of ``(patch, dy0, dy1, dx0,
    dx1, sy0, sy1, sx0, sx1)``: rows ``sy0:sy1`` and columns ``sx0:sx1`` of the run go to
    ``[dy0:dy1, dx0:dx1]`` of window ``patch`` of that batch.  ``fresh``: the run is
    decoded here (else it was carried over, decoded, and has no ``pieces``: they were
    copied a batch ago).  ``keep``: the batch after the next one touches the run too (its
    pixels are kept in ``run.buf`` and it is carried over to the next batch)."""

    run: Run
    pieces: np.ndarray
    next_pieces: np.ndarray
    fresh: bool
    keep: bool


def window_corners(lv: PyramidLevel, locs: np.ndarray) -> np.ndarray:
    """``(n, 2)`` int64: each window's top-left corner in pixels of ``lv``
    (``floor(x / downsample + 0.5)``, as :func:`wsitool.ground.geometry.level_rect`)."""
    if lv.downsample == 1.0:
        return locs
    return np.floor(locs / lv.downsample + 0.5).astype(np.int64)


@dataclass
class Footprint:
    """Where the windows of one batch fall on the level's tile grid.

    ``boxes``: ``(k, 7)`` int64, one row per window that overlaps the level, ``(i, x0,
    x1, y0, y1, px, py)``: its index in the batch, its clipped box in level pixels and
    its unclipped corner; ``partial``: ``(n,)`` bool, True for windows not wholly inside
    the level; ``rows``: tile row -> set of tile columns touched.
    """

    corners: np.ndarray
    boxes: np.ndarray
    partial: np.ndarray
    rows: dict


def footprint(lv: PyramidLevel, corners: np.ndarray, window: tuple[int, int]) -> Footprint:
    """The :class:`Footprint` of windows of ``window`` pixels at ``corners`` (level pixels)."""
    ww, wh = window
    W, H, tw, th = lv.width, lv.height, lv.tile_width, lv.tile_height
    cx, cy = corners[:, 0], corners[:, 1]
    x0 = np.minimum(np.maximum(cx, 0), W)
    y0 = np.minimum(np.maximum(cy, 0), H)
    x1 = np.minimum(np.maximum(cx + ww, 0), W)
    y1 = np.minimum(np.maximum(cy + wh, 0), H)
    inside = (x1 > x0) & (y1 > y0)
    partial = ~inside | (x0 != cx) | (y0 != cy) | (x1 - x0 != ww) | (y1 - y0 != wh)
    idx = np.flatnonzero(inside)
    if len(idx) < len(corners):
        x0, x1, y0, y1, cx, cy = x0[idx], x1[idx], y0[idx], y1[idx], cx[idx], cy[idx]
    boxes = np.stack([idx, x0, x1, y0, y1, cx, cy], 1)
    rows: dict[int, set[int]] = {}
    for c0, c1, r0, r1 in np.stack([x0 // tw, (x1 - 1) // tw, y0 // th, (y1 - 1) // th], 1).tolist():
        for r in range(r0, r1 + 1):
            cols = rows.get(r)
            if cols is None:
                cols = rows[r] = set()
            if c0 == c1:
                cols.add(c0)
            else:
                cols.update(range(c0, c1 + 1))
    return Footprint(corners, boxes, partial, rows)


def _touches(fp: Footprint | None, run: Run) -> bool:
    """True when the windows of ``fp`` (None: none) touch a tile of ``run``."""
    cols = fp.rows.get(run.row) if fp is not None else None
    return cols is not None and not cols.isdisjoint(range(run.c0, run.c1 + 1))


def _cut_runs(lv: PyramidLevel, fp: Footprint, done: list[Run], most: int) -> list[Run]:
    """New runs for the tiles of ``fp`` outside the runs ``done``: neighbours in a tile row,
    at most ``most``."""
    tw, th, W, H = lv.tile_width, lv.tile_height, lv.width, lv.height
    taken: dict[int, set[int]] = {}
    for run in done:
        taken.setdefault(run.row, set()).update(range(run.c0, run.c1 + 1))
    runs: list[Run] = []
    for r in sorted(fp.rows):
        gone = taken.get(r)
        todo = sorted(fp.rows[r] if gone is None else fp.rows[r] - gone)
        i = 0
        while i < len(todo):
            start = prev = todo[i]
            i += 1
            while i < len(todo) and todo[i] == prev + 1 and todo[i] - start < most:
                prev = todo[i]
                i += 1
            runs.append(Run(r, start, prev, (start * tw, r * th, min((prev + 1) * tw, W), min((r + 1) * th, H))))
    return runs


NO_PIECES = np.empty((0, 9), np.int64)


def _pieces(fp: Footprint | None, runs: list[Run]) -> list[np.ndarray]:
    """Each run's pieces of the windows of ``fp`` (see :class:`Task`; None: no windows), in
    window order."""
    if fp is None or not runs or not len(fp.boxes):
        return [NO_PIECES] * len(runs)
    w = fp.boxes
    r = np.array([run.rect for run in runs], np.int64)  # (m, 4): x0, y0, x1, y1
    ix0 = np.maximum(r[:, None, 0], w[None, :, 1])  # (m, k): run, window
    ix1 = np.minimum(r[:, None, 2], w[None, :, 2])
    iy0 = np.maximum(r[:, None, 1], w[None, :, 3])
    iy1 = np.minimum(r[:, None, 3], w[None, :, 4])
    ri, wi = np.nonzero((ix0 < ix1) & (iy0 < iy1))
    ix0, ix1, iy0, iy1 = ix0[ri, wi], ix1[ri, wi], iy0[ri, wi], iy1[ri, wi]
    px, py, rx, ry = w[wi, 5], w[wi, 6], r[ri, 0], r[ri, 1]
    every = np.stack([w[wi, 0], iy0 - py, iy1 - py, ix0 - px, ix1 - px, iy0 - ry, iy1 - ry, ix0 - rx, ix1 - rx], 1)
    return np.split(every, np.searchsorted(ri, np.arange(1, len(runs))))


def plan_runs(lv: PyramidLevel, fp: Footprint, done: list[Task], following: Footprint | None,
              after: Footprint | None, most: int = RUN_TILES) -> list[Task]:
    """The work of one batch, one :class:`Task` a run.

    ``done``: the tasks of the previous batch (empty: none); their runs' pixels are in
    this batch's windows already, and those marked ``keep`` are carried over.  The tiles
    of ``fp`` outside ``done`` are cut into new runs (neighbours in a tile row, at most
    ``most``), each copied into the windows of this batch (``pieces``) and of the
    ``following`` one (``next_pieces``; None: no next batch); a carried run is copied into
    the following batch's windows only.  A task is marked
    ``keep`` when the batch ``after`` the following one touches its run.  Every tile of
    ``fp`` is then in this batch's windows once, and every tile of ``following`` that
    this batch's runs hold.  Nothing in ``done`` is changed.
    """
    fresh = _cut_runs(lv, fp, [t.run for t in done], most)
    carried = [t.run for t in done if t.keep and _touches(following, t.run)]
    now = _pieces(fp, fresh)
    ahead = _pieces(following, fresh + carried)
    tasks = [Task(run, now[k], ahead[k], True, _touches(after, run)) for k, run in enumerate(fresh)]
    tasks += [Task(run, NO_PIECES, ahead[len(fresh) + k], False, _touches(after, run))
              for k, run in enumerate(carried)]
    for task in tasks:
        if task.fresh and not task.keep:
            _shrink(task)
    return tasks


def _shrink(task: Task) -> None:
    """Cut a run that no later batch needs down to the box its pieces cover: the decoder then
    skips the rows above (no colour conversion) and the columns beside it, and stops after
    its last row (whole tiles where a grid's patches cover only part of them: at its edges)."""
    run = task.run
    x0, y0, x1, y1 = run.rect
    src = np.concatenate([task.pieces, task.next_pieces])[:, 5:]
    by0, by1, bx0, bx1 = src[:, 0].min(), src[:, 1].max(), src[:, 2].min(), src[:, 3].max()
    if by0 == 0 and bx0 == 0 and by1 == y1 - y0 and bx1 == x1 - x0:
        return
    run.rect = (x0 + int(bx0), y0 + int(by0), x0 + int(bx1), y0 + int(by1))
    shift = np.array([0, 0, 0, 0, 0, by0, by0, bx0, bx0], np.int64)
    task.pieces, task.next_pieces = task.pieces - shift, task.next_pieces - shift


def consecutive_spans(cols: list[int]) -> Iterator[tuple[int, int]]:
    """``(first, last)`` of each run of consecutive numbers of the sorted ``cols``."""
    i = 0
    while i < len(cols):
        j = i
        while j + 1 < len(cols) and cols[j + 1] == cols[j] + 1:
            j += 1
        yield cols[i], cols[j]
        i = j + 1
