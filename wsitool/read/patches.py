"""Batch patch reads that decode each tile once: the primitive behind :meth:`wsitool.Slide.read_patches` (floor 4).

A per-patch reader decodes a tile once for every patch that touches it: on a
grid of 224 x 224 patches over 240 x 240 tiles most tiles feed two to four
patches.  Here the patches of a batch are grouped by the tiles they touch:

1. each patch's window (``read_size``, default ``size``, in pixels of the
   level) is placed on the level by the same nearest-pixel rule as
   :meth:`wsitool.Slide.read_region` (:func:`wsitool.ground.geometry.level_rect`);
2. the tiles the windows touch that the previous batch did not already copy
   into them are cut into *runs*: tiles next to each other in one tile row (at
   most :data:`RUN_TILES` of them on one thread, half that with more);
3. each run is decoded once and its pixels copied into every window of this
   batch *and of the next one* that needs them (the next batch's output is made
   a batch ahead): on a row-major grid consecutive batches share the tile rows
   of the patch row they split.  A run that no later batch needs is first cut to
   the box its windows cover (the decoder skips the rest of its tiles); one that
   the batch after the next needs too is kept decoded in a run buffer and copied
   into that batch's windows a batch later.  Where the compiled JPEG loop applies
   the decode and the copies happen in C with the GIL released, each RGB tile
   decoded into a tile-sized scratch that is still in the CPU cache when its
   pieces are copied from it (:func:`wsitool.codec.jpegloop.scatter`, the
   ``keep`` and ``dest2`` arguments of the loop); else
   :func:`wsitool.read.fill.fill_region` (the Python tile path, or the
   decoded-tile cache) into a run buffer and numpy copies, the reference the
   compiled copy is tested against.  The per-thread decoders work as for a
   region.  A run whose decode fails (a corrupt tile) feeds nothing: the windows
   it feeds are read one by one as :meth:`wsitool.Slide.read_region` reads them,
   with the ``on_error`` asked (a tile corrupt only below the rows a window needs
   fails the run, which decodes more of it, but not the window);
4. with ``read_size``, each window is then reduced to ``size`` by the exact area
   filter (:mod:`wsitool.ground.areafilter`).

The runs are shared by the threads (each thread takes the next run when it has
finished its last one, the longest first); the first thread free plans the next
batch before it takes a run, so that the plan is made while the others decode
(:class:`PatchReader`).  A patch equals :meth:`wsitool.Slide.read_region` of its
location bit for bit (with ``read_size``, the area filter of that read of the
window), pixels outside the slide and missing tiles included.

Memory: the outputs of two batches (this one's and the next one's, which it
fills in part); one run buffer (``RUN_TILES`` tiles) per thread plus one per run
kept for the batch after the next; with ``read_size``, the windows of two
batches (``batch_size`` windows of ``ceil(read_size)`` pixels each).  The run
buffers are kept for the next call (at most :data:`SPARE_BYTES` in the
process): fresh ones cost page faults on every pass.

Not to be confused with :func:`wsitool.distributed.read_regions`, which reads a
list of regions on a Dask cluster and writes each to a file.
"""

from __future__ import annotations

import collections
import math
import numbers
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..codec import jpegloop
from ..codec.pool import get_pool
from ..errors import InvalidRegionError, ResourceLimitError, TileDecodeError
from ..ground.areafilter import AreaFilter
from ..ground.geometry import level_rect
from ..ground.integers import as_int
from ..ground.limits import get_limits
from ..model import PyramidLevel
from .cache import CacheScope
from .fill import _PREFETCH_MIN_TILES, _ends_one_column_into_a_tile, _prefetch, advise_tiles, fill_region
from .request import ReadRequest, check_out, check_threads, output_shape, validate_request
from .threads import Once, SharedJobs, run_jobs, run_threads, thread_count

__all__ = ["RUN_TILES", "PatchRequest", "PatchReader", "check_patch_request", "read_patch_batches",
           "fill_all", "footprint", "plan_runs"]

#: Most tiles decoded by one call (one run: neighbours in a tile row).  16 keeps a
#: run's buffer small (16 tiles of 240 x 240 RGB: 2.7 MB a thread) and matches the
#: compiled loop's batch of 16 tiles per decoder call.
RUN_TILES = 16


@dataclass(frozen=True)
class PatchRequest:
    """A validated batch request (everything checked before any tile is read).

    Attributes:
        path: the slide's path, named in messages.
        level: the :class:`~wsitool.model.PyramidLevel` read.
        locations: ``(n, 2)`` int64, level-0 ``(x, y)`` of each patch's top-left corner.
        size: ``(width, height)`` of each output patch, pixels.
        read: ``(width, height)`` of the window read at ``level`` before the area
            filter (floats allowed), or None (the window is the patch).
        window: ``(width, height)`` of the window decoded, ``ceil(read)`` (or ``size``).
        mode: ``"rgb"``, ``"rgba"`` or ``"raw"``.
        shape: ``(height, width, channels)`` of one output patch.
        dtype: the output's dtype (uint8, or the level's for ``raw``).
        batch_size: patches per batch.
        threads: decode threads, or None (the CPU count).
        on_error: ``"raise"`` or ``"fill"``.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    """

    path: str
    level: PyramidLevel
    locations: np.ndarray
    size: tuple[int, int]
    read: tuple[float, float] | None
    window: tuple[int, int]
    mode: str
    shape: tuple[int, int, int]
    dtype: np.dtype
    batch_size: int
    threads: int | None
    on_error: str
    device: str


def _locations(locations: Any, path: str) -> np.ndarray:
    """``locations`` as an ``(n, 2)`` int64 array (integral floats allowed)."""
    try:
        arr = np.asarray(locations)
    except (TypeError, ValueError) as exc:
        raise InvalidRegionError(f"{path}: locations must be (x, y) pairs: {exc}") from None
    if arr.size == 0:
        return np.empty((0, 2), np.int64)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise InvalidRegionError(f"{path}: locations must be a sequence of (x, y) pairs or an (n, 2) array, "
                                 f"got shape {arr.shape}")
    if arr.dtype.kind in "iu":
        if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
            raise InvalidRegionError(f"{path}: locations beyond the int64 range")
        return arr.astype(np.int64, copy=False)
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all() or (arr != np.floor(arr)).any():
            raise InvalidRegionError(f"{path}: locations must be whole level-0 pixels")
        if np.abs(arr).max() >= 2.0**62:
            raise InvalidRegionError(f"{path}: locations beyond the int64 range")
        return arr.astype(np.int64)
    raise InvalidRegionError(f"{path}: locations must be integers, got dtype {arr.dtype}")


def _positive_pair(value: Any, what: str, path: str, whole: bool) -> tuple[Any, Any]:
    try:
        a, b = value
    except (TypeError, ValueError):
        raise InvalidRegionError(f"{path}: {what} must be a (width, height) pair, got {value!r}") from None
    pair: tuple[float, float]
    if whole:
        pair = (as_int(a, what, path), as_int(b, what, path))
    else:
        try:
            if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in (a, b)):
                raise TypeError  # text and bytes too, which float() would take
            pair = (float(a), float(b))
        except (TypeError, ValueError):
            raise InvalidRegionError(f"{path}: {what} must be two numbers, got {value!r}") from None
    if not all(math.isfinite(v) and v > 0 for v in pair):
        raise InvalidRegionError(f"{path}: {what} must be positive, got {value!r}")
    return pair


def check_patch_request(levels: Sequence[PyramidLevel], path: str, locations: Any, size: Any, *, level: Any = 0,
                        read_size: Any = None, batch_size: Any = 64, mode: str = "rgb", threads: Any = None,
                        on_error: str = "raise", device: str = "cpu", channels: Any = None) -> PatchRequest:
    """Validate a batch request; see :meth:`wsitool.Slide.read_patches` for the arguments.

    ``channels`` selects channels of a multi-channel level (as ``read_region``'s);
    the request's ``level`` is then the selection (:meth:`wsitool.model.PyramidLevel.select`).

    Raises:
        InvalidRegionError: a malformed argument (also a ``ValueError``).
        UnsupportedFormatError: ``rgb``/``rgba`` of samples without an RGB conversion,
            or a level whose compression has no decoder.
        ResourceLimitError: one window, or one batch of outputs (or of windows),
            over the configured limits.
    """
    if on_error not in ("raise", "fill"):
        raise InvalidRegionError(f"{path}: on_error must be 'raise' or 'fill', got {on_error!r}")
    if device != "cpu":
        from .cuda import device_index  # InvalidRegionError / DeviceUnavailableError before any decode

        device_index(path, device)
    w, h = _positive_pair(size, "size", path, whole=True)
    read = None if read_size is None else _positive_pair(read_size, "read_size", path, whole=False)
    window = (w, h) if read is None else (math.ceil(read[0]), math.ceil(read[1]))
    if read is not None and window[0] * window[1] > get_limits().max_region_pixels:
        raise ResourceLimitError(f"{path}: read_size {read[0]:g}x{read[1]:g} exceeds the max_region_pixels "
                                 f"limit {get_limits().max_region_pixels}")
    # level, mode, decoder and per-window limits: the checks of a region read of one window
    lv = validate_request(levels, path, (0, 0), level, window, mode, channels)[0]
    if lv.planes is not None and device != "cpu":
        raise InvalidRegionError(f"{path}: multi-channel levels read on the CPU only (device='cpu')")
    shape, dtype = output_shape(lv, (w, h), mode)
    if read is not None:
        if dtype != np.uint8:
            raise InvalidRegionError(f"{path}: read_size needs 8-bit samples (the area filter is for uint8); "
                                     f"level {lv.index} is {dtype}")
        if device != "cpu":
            raise InvalidRegionError(f"{path}: read_size reads only on the CPU (device='cpu')")
    b = as_int(batch_size, "batch_size", path)
    if b < 1:
        raise InvalidRegionError(f"{path}: batch_size must be >= 1, got {b}")
    threads = check_threads(threads, path)
    locs = _locations(locations, path)
    b_eff = max(1, min(b, len(locs)))
    per_patch = shape[0] * shape[1] * shape[2] * dtype.itemsize
    per_window = 0 if read is None else window[0] * window[1] * shape[2]
    need = b_eff * (per_patch + per_window)
    if need > get_limits().max_region_bytes:
        raise ResourceLimitError(f"{path}: a batch of {b_eff} patches needs {need} bytes, over the "
                                 f"max_region_bytes limit {get_limits().max_region_bytes} (lower batch_size)")
    return PatchRequest(path, lv, locs, (w, h), read, window, mode, shape, dtype, b, threads, on_error, device)


# ------------------------------------------------------------------ planning


@dataclass(eq=False)
class _Run:
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
class _Task:
    """One batch's use of a run.

    ``pieces`` and ``next_pieces``: the copies of the run's pixels into the windows of
    this batch and of the next one, ``(k, 9)`` int64 arrays of ``(patch, dy0, dy1, dx0,
    dx1, sy0, sy1, sx0, sx1)``: rows ``sy0:sy1`` and columns ``sx0:sx1`` of the run go to
    ``[dy0:dy1, dx0:dx1]`` of window ``patch`` of that batch.  ``fresh``: the run is
    decoded here (else it was carried over, decoded, and has no ``pieces``: they were
    copied a batch ago).  ``keep``: the batch after the next one touches the run too (its
    pixels are kept in ``run.buf`` and it is carried over to the next batch)."""

    run: _Run
    pieces: np.ndarray
    next_pieces: np.ndarray
    fresh: bool
    keep: bool


def _windows(lv: PyramidLevel, locs: np.ndarray) -> np.ndarray:
    """``(n, 2)`` int64: each window's top-left corner in pixels of ``lv``
    (``floor(x / downsample + 0.5)``, as :func:`wsitool.ground.geometry.level_rect`)."""
    if lv.downsample == 1.0:
        return locs
    return np.floor(locs / lv.downsample + 0.5).astype(np.int64)


@dataclass
class _Footprint:
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


def footprint(lv: PyramidLevel, corners: np.ndarray, window: tuple[int, int]) -> _Footprint:
    """The :class:`_Footprint` of windows of ``window`` pixels at ``corners`` (level pixels)."""
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
    return _Footprint(corners, boxes, partial, rows)


def _touches(fp: _Footprint | None, run: _Run) -> bool:
    """True when the windows of ``fp`` (None: none) touch a tile of ``run``."""
    cols = fp.rows.get(run.row) if fp is not None else None
    return cols is not None and not cols.isdisjoint(range(run.c0, run.c1 + 1))


def _cut_runs(lv: PyramidLevel, fp: _Footprint, done: list[_Run], most: int) -> list[_Run]:
    """New runs for the tiles of ``fp`` outside the runs ``done``: neighbours in a tile row,
    at most ``most``."""
    tw, th, W, H = lv.tile_width, lv.tile_height, lv.width, lv.height
    taken: dict[int, set[int]] = {}
    for run in done:
        taken.setdefault(run.row, set()).update(range(run.c0, run.c1 + 1))
    runs: list[_Run] = []
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
            runs.append(_Run(r, start, prev, (start * tw, r * th, min((prev + 1) * tw, W), min((r + 1) * th, H))))
    return runs


_NO_PIECES = np.empty((0, 9), np.int64)


def _pieces(fp: _Footprint | None, runs: list[_Run]) -> list[np.ndarray]:
    """Each run's pieces of the windows of ``fp`` (see :class:`_Task`; None: no windows), in
    window order."""
    if fp is None or not runs or not len(fp.boxes):
        return [_NO_PIECES] * len(runs)
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


def plan_runs(lv: PyramidLevel, fp: _Footprint, done: list[_Task], following: _Footprint | None,
              after: _Footprint | None, most: int = RUN_TILES) -> list[_Task]:
    """The work of one batch, one :class:`_Task` a run.

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
    tasks = [_Task(run, now[k], ahead[k], True, _touches(after, run)) for k, run in enumerate(fresh)]
    tasks += [_Task(run, _NO_PIECES, ahead[len(fresh) + k], False, _touches(after, run))
              for k, run in enumerate(carried)]
    for task in tasks:
        if task.fresh and not task.keep:
            _shrink(task)
    return tasks


def _shrink(task: _Task) -> None:
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


# ------------------------------------------------------------------ filling


#: Most bytes of run buffers kept between calls (:class:`_Buffers`): a one-thread read of
#: 240 x 240 tiles uses one 2.7 MB buffer a thread plus one per run carried (a few at most).
SPARE_BYTES = 32 << 20

_spare: list[np.ndarray] = []  # run buffers between calls, the one given back last at the end
_spare_lock = threading.Lock()


def _forget_spare() -> None:
    """In a forked child: a fresh lock (another thread may have held the parent's), no buffers."""
    global _spare_lock
    _spare_lock = threading.Lock()
    _spare.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_spare)


class _Buffers:
    """Flat run buffers, reused across the runs and batches of one call: the one given back
    last is taken first (its pages most likely still in the cache).

    A call's buffers are kept for the next call when it ends (:meth:`close`; at most
    :data:`SPARE_BYTES` in all, process-wide): a fresh buffer's pages are faulted in and
    zeroed by the kernel on first write, a cost each pass of a patch grid paid again
    (about 4,700 page faults a pass on the 1,296-patch benchmark grid)."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self._free: collections.deque = collections.deque()  # append / pop: atomic

    def take(self) -> np.ndarray:
        try:
            return self._free.pop()
        except IndexError:
            pass
        with _spare_lock:
            for i in range(len(_spare) - 1, -1, -1):
                if _spare[i].nbytes == self.nbytes:
                    return _spare.pop(i)
        return np.empty(self.nbytes, np.uint8)

    def give(self, buf: np.ndarray) -> None:
        self._free.append(buf)

    def close(self) -> None:
        """Hand the free buffers on to later calls (the oldest kept ones dropped beyond
        :data:`SPARE_BYTES`); this object keeps none."""
        with _spare_lock:
            _spare.extend(reversed(self._free))  # the one given back last ends up last
            self._free.clear()
            total = sum(b.nbytes for b in _spare)
            while _spare and total > SPARE_BYTES:
                total -= _spare.pop(0).nbytes


class PatchReader:
    """Reads the patches of a :class:`PatchRequest` batch by batch, in input order.

    Each batch is filled together with the part of the next batch's output that its tiles
    give, where the caller passes that output (``fill(j0, j1, out, following)``): a tile
    that two consecutive batches touch is decoded once and copied into the patches of both
    while it is still in the CPU cache; a run that the batch after the next one touches as
    well is kept decoded (carried over) and copied into that batch's patches a batch later.
    On a row-major grid consecutive batches share the tile rows of the patch row they split.

    Args:
        req: the validated request.
        cache: the slide's :class:`~wsitool.read.cache.CacheScope`, or None.
    """

    def __init__(self, req: PatchRequest, cache: CacheScope | None = None):
        self.req = req
        self.cache = cache
        lv = req.level
        self._buffers = _Buffers(lv.tile_height * lv.tile_width * min(RUN_TILES, lv.tiles_across)
                                 * req.shape[2] * req.dtype.itemsize)
        # runs of at most RUN_TILES tiles on one thread; with more, half that: the threads
        # share a batch's runs, and smaller ones let them finish the batch closer together
        self._most = RUN_TILES if thread_count(req.threads, 2) == 1 else RUN_TILES // 2
        self._done: list[_Task] = []  # the tasks of the batch filled last
        self._next = -1  # the first patch of the batch expected next (-1: none)
        self._next_at: Any = None  # where its output is (the pieces of _done were copied there)
        self._ahead: tuple[int, list[_Task]] | None = None  # its plan, made while the last one decoded
        self._fps: dict[int, _Footprint] = {}  # footprints of batches by first patch
        self._windows: list[np.ndarray] = []  # read_size: the windows of this batch and the next
        self._redo: set[int] = set()  # patches of the next batch fed by a run that failed

    def spans(self) -> Iterator[tuple[int, int]]:
        """``[j0, j1)`` of each batch."""
        n, b = len(self.req.locations), self.req.batch_size
        return ((j, min(j + b, n)) for j in range(0, n, b))

    def _footprint(self, j0: int) -> _Footprint | None:
        """The footprint of the batch starting at patch ``j0`` (None past the end)."""
        req = self.req
        n = len(req.locations)
        if j0 >= n:
            return None
        fp = self._fps.get(j0)
        if fp is None:
            j1 = min(j0 + req.batch_size, n)
            fp = self._fps[j0] = footprint(req.level, _windows(req.level, req.locations[j0:j1]), req.window)
        return fp

    def fill(self, j0: int, j1: int, out: Any, following: Any = None) -> Any:
        """Fill ``out`` (``(j1 - j0,) + req.shape``) with patches ``j0 .. j1 - 1``; return it.

        ``following``: the output of the next batch (``[j1, j1 + batch_size)``), or None: its
        windows get their pixels of the tiles decoded here now (the rest when it is filled
        next, by a call with ``out`` that same array).  The first thread free plans that
        batch before it starts on this one's runs, so that with several threads the plan is
        made while the others decode.

        Raises:
            TileDecodeError: with ``on_error="raise"``, a patch whose window meets corrupt
                tile data (the first in input order; :meth:`_read_one_by_one`).
            OSError: a read of the slide's bytes failed.
        """
        req = self.req
        if j1 <= j0:
            return out
        if req.device != "cpu":
            return _fill_cuda(req, req.locations[j0:j1], out)
        dest, dest_next = self._dests(j0, j1, out, following)
        tasks = self._plan(j0, j1, dest, dest_next)
        self._advise(tasks)  # (a remote slide: its runs in flight at once; advised a batch ago if planned then)
        ahead = Once(lambda: self._plan_ahead(j1, tasks) if dest_next is not None else None)
        try:
            with req.level.source.reading():
                # longest decodes first, copy-only (carried) runs last: the threads finish the
                # batch together instead of one waiting on a long run taken at the end
                order = sorted(tasks, key=lambda t: t.run.c0 - t.run.c1 - 1 if t.fresh else 0)
                k = thread_count(req.threads, len(order))
                work = self._worker(dest, dest_next)
                shared = SharedJobs(order) if k > 1 else None
                jobs: Iterable[_Task] = order if shared is None else shared

                def plan_then_work() -> None:
                    ahead()
                    work(jobs)

                run_threads(k, plan_then_work, _nothing if shared is None else shared.stop)
                self._read_one_by_one(j0, dest, dest_next, tasks)
        except BaseException:
            self._forget(tasks)
            raise
        self._done = tasks if dest_next is not None else []
        self._next, self._next_at = (j1, _address(following)) if dest_next is not None else (-1, None)
        if req.read is not None:
            _reduce(req, dest, out)
        return out

    def _read_one_by_one(self, j0: int, dest: np.ndarray, dest_next: np.ndarray | None,
                         tasks: list[_Task]) -> None:
        """Where a tile of a run failed to decode, the windows that run feeds are read one by
        one, each as :meth:`wsitool.Slide.read_region` reads it (``on_error`` as asked): a
        tile corrupt only in rows a window does not need fails the run, which decodes the
        box of all its windows (whole tiles where a later batch needs them), but not that
        window's own read.  This batch's windows now, the next batch's when it is filled.

        Raises:
            TileDecodeError: with ``on_error="raise"``, the first such window (in input
                order) whose own read meets the corrupt data.
        """
        now, self._redo = self._redo, set()
        for task in tasks:
            if task.run.failed:
                now.update(task.pieces[:, 0].tolist())
                if dest_next is not None:
                    self._redo.update(task.next_pieces[:, 0].tolist())
        if not now:
            return
        req = self.req
        fp = self._footprint(j0)
        assert fp is not None  # (this batch's)
        ww, wh = req.window
        pool = get_pool("cpu")
        for i in sorted(now):
            x, y = fp.corners[i].tolist()
            one = ReadRequest(path=req.path, level=req.level, x=x, y=y, width=ww, height=wh, mode=req.mode,
                              on_error=req.on_error, threads=1)
            fill_region(one, dest[i], pool, self.cache)

    def _dests(self, j0: int, j1: int, out: Any, following: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """The arrays the windows of this batch and of the next one are copied into:
        ``out`` and ``following`` (None where there is no next batch, or it does not fit);
        with ``read_size``, the reused windows (those of this batch filled in part a call ago)."""
        req = self.req
        n = len(req.locations)
        j2 = min(j1 + req.batch_size, n)
        if following is not None and (j2 <= j1 or len(following) != j2 - j1):
            following = None
        if req.read is None:
            return out, following
        ww, wh = req.window
        if len(self._windows) < 2:
            self._windows = [np.empty((req.batch_size if n > req.batch_size else n, wh, ww, req.shape[2]),
                                      req.dtype) for _ in range(2)]
        if j0 != self._next:
            self._windows.reverse()  # (either: nothing of the last call is wanted)
        cur, nxt = self._windows[1], self._windows[0]
        self._windows = [cur, nxt]  # the next call's current ones are nxt
        return cur[:j1 - j0], None if following is None else nxt[:j2 - j1]

    def _plan(self, j0: int, j1: int, dest: np.ndarray, dest_next: np.ndarray | None) -> list[_Task]:
        """The tasks of batch ``[j0, j1)``.  Where it is not the batch the last call
        expected (another ``j0``, or ``out`` elsewhere) nothing of that call is used; the
        windows not wholly inside the level are zeroed before anything is copied into them
        (``dest_next``'s now too)."""
        req = self.req
        ahead, self._ahead = self._ahead, None
        continued = j0 == self._next and (req.read is not None or _address(dest) == self._next_at)
        for old in [k for k in self._fps if k < j0]:
            del self._fps[old]
        fp = self._footprint(j0)
        assert fp is not None  # (j0 < j1 <= n)
        if not continued:
            self._forget(self._done)
            ahead = None
            if fp.partial.any():
                dest[fp.partial] = 0
        following = self._footprint(j1) if dest_next is not None else None
        if ahead is not None and ahead[0] == j0 and following is not None:
            tasks = ahead[1]
        else:
            after = self._footprint(min(j1 + req.batch_size, len(req.locations))) if following else None
            tasks = plan_runs(req.level, fp, self._done, following, after, self._most)
        carried = {id(t.run) for t in tasks}
        self._release(t.run for t in self._done if id(t.run) not in carried)
        self._done = []
        if following is not None and dest_next is not None and following.partial.any():
            dest_next[following.partial] = 0
        return tasks

    def _plan_ahead(self, j1: int, tasks: list[_Task]) -> None:
        """Plan the batch starting at ``j1``, this batch's ``tasks`` done; for the next :meth:`fill`."""
        req = self.req
        fp = self._footprint(j1)
        if fp is None:
            return
        j2 = min(j1 + req.batch_size, len(req.locations))
        following = self._footprint(j2)
        after = self._footprint(min(j2 + req.batch_size, len(req.locations))) if following else None
        self._ahead = (j1, plan_runs(req.level, fp, tasks, following, after, self._most))
        # fetched while this batch decodes and while its caller works on it: the next batch's
        # runs, and the tiles of the one after (those it shares with earlier batches: no request)
        self._advise(self._ahead[1], following, ahead=True)

    def _advise(self, tasks: list[_Task], then: _Footprint | None = None, ahead: bool = False) -> None:
        """A remote slide: start fetching the tiles of ``tasks``' fresh runs and of footprint
        ``then`` (a later batch's), all in one advice (neighbouring runs merged into one
        request, up to ``concurrency`` requests in flight; ranges already advised are not
        asked for again: :meth:`wsitool.storage.remote.RemoteSource.advise`).  Each run's
        decode would otherwise fetch its bytes when it starts: one round trip after another
        on each thread (batches of 64 patches of 224 pixels over a link of 20 ms: 480
        patches/s; 1,221 with the batch's runs advised at once and the next batch's ahead;
        1,402 with the tiles of the one after too; scripts/bench_remote_patches.py).  Not with a
        decoded-tile cache (its hits need no bytes) nor for a local file (the decode's own
        read-ahead of each run serves it).  ``ahead``: for the next batches (skipped by a
        remote source whose read-ahead budget is spent)."""
        lv = self.req.level
        if self.cache is None and lv.source.remote:
            blocks = [(t.run.c0, t.run.c1, t.run.row, t.run.row) for t in tasks if t.fresh]
            if then is not None:
                for row, cols in sorted(then.rows.items()):
                    blocks.extend((a, b, row, row) for a, b in _spans(sorted(cols)))
            advise_tiles(lv, blocks, ahead)

    def _worker(self, dest: np.ndarray, dest_next: np.ndarray | None) -> Callable[[Iterable[_Task]], None]:
        """The work of one thread: decode the run of each fresh task it takes into a run
        buffer and copy its pieces into the windows of ``dest`` (``next_pieces``: of
        ``dest_next``); a carried run's buffer holds it already.

        Where the compiled JPEG loop applies (:func:`_native_scatter`) it decodes the run and
        copies each piece in C, the GIL released, each tile while its pixels are still in the
        cache; else :func:`~wsitool.read.fill.fill_region` and numpy copies (the reference,
        pinned to the fast path by tests/read/test_patches.py)."""
        req, cache, buffers = self.req, self.cache, self._buffers
        lv, c, dtype = req.level, req.shape[2], req.dtype
        itemsize = dtype.itemsize
        pool = get_pool("cpu")
        native = _native_scatter(req, dest, dest_next, cache)

        def decode_and_copy(task: _Task, buf: np.ndarray) -> None:
            if native is not None and native(task, buf, pool):
                return
            if task.fresh:
                x0, y0, x1, y1 = task.run.rect
                part = ReadRequest(path=req.path, level=lv, x=x0, y=y0, width=x1 - x0, height=y1 - y0,
                                   mode=req.mode, on_error="raise", threads=1)
                fill_region(part, buf, pool, cache)
            for pieces, into in ((task.pieces, dest), (task.next_pieces, dest_next)):
                for i, dy0, dy1, dx0, dx1, sy0, sy1, sx0, sx1 in pieces.tolist():
                    assert into is not None  # (no next pieces without a next batch)
                    into[i, dy0:dy1, dx0:dx1] = buf[sy0:sy1, sx0:sx1]

        def work(todo: Iterable[_Task]) -> None:
            for task in todo:
                run = task.run
                x0, y0, x1, y1 = run.rect
                if task.fresh:
                    run.buf = buffers.take()
                flat = run.buf
                assert flat is not None  # (a carried run keeps its buffer)
                buf = flat[:(y1 - y0) * (x1 - x0) * c * itemsize].view(dtype).reshape(y1 - y0, x1 - x0, c)
                if not run.failed:  # (a carried run that failed: its windows are read one by one)
                    try:
                        decode_and_copy(task, buf)
                    except TileDecodeError:  # its windows are read one by one (_read_one_by_one)
                        run.failed = True
                if not task.keep or dest_next is None:  # the next run of this thread takes it
                    buffers.give(flat)
                    run.buf = None

        return work

    def close(self) -> None:
        """The end of the call: the carried runs released, the run buffers kept for the next
        call (at most :data:`SPARE_BYTES` of them in the process)."""
        self._forget(self._done)
        self._buffers.close()

    def _forget(self, tasks: list[_Task]) -> None:
        """Nothing of the last call is carried on: ``tasks``' buffers released, no plan ahead."""
        self._release(t.run for t in tasks)
        self._done, self._next, self._next_at, self._ahead = [], -1, None, None
        self._redo = set()

    def _release(self, runs: Iterable[_Run]) -> None:
        for run in runs:
            if run.buf is not None:
                self._buffers.give(run.buf)
                run.buf = None


def _spans(cols: list[int]) -> Iterator[tuple[int, int]]:
    """``(first, last)`` of each run of consecutive numbers of the sorted ``cols``."""
    i = 0
    while i < len(cols):
        j = i
        while j + 1 < len(cols) and cols[j + 1] == cols[j] + 1:
            j += 1
        yield cols[i], cols[j]
        i = j + 1


def _address(a: Any) -> Any:
    """Where array ``a``'s data starts (None for None)."""
    return None if a is None else a.__array_interface__["data"][0]


def _nothing() -> None:
    pass


#: Tiles per call of the compiled loop when it also copies the pieces (:func:`_native_scatter`)
#: of RGBA patches: 4 tiles of 240 x 240 (900 KiB) decoded into the run buffer are still in a
#: 1 MiB L2 cache when they are copied.  RGB tiles are decoded one at a time into the loop's
#: tile scratch and their pieces copied from it at once, a whole run a call.
SCATTER_TILES = 4


def _pieces_array(pieces: np.ndarray, into: np.ndarray) -> np.ndarray:
    """``pieces`` (as :class:`_Task`'s) as :func:`wsitool.codec.jpegloop.scatter` takes them,
    ``(k, 6)`` int64, for windows in ``into`` (``(b, h, w, c)`` uint8, C-contiguous)."""
    patch, stride, px = into.strides[:3]
    out = np.empty((len(pieces), 6), np.int64)
    out[:, 0] = pieces[:, 0] * patch + pieces[:, 1] * stride + pieces[:, 3] * px
    out[:, 1] = stride
    out[:, 2:] = pieces[:, 5:]
    return out


def _native_scatter(req: PatchRequest, dest: Any, dest_next: Any,
                    cache: CacheScope | None) -> Callable[[_Task, np.ndarray, Any], bool] | None:
    """The compiled path of one batch, or None where it does not apply (a decoded-tile cache,
    multi-channel or non-JPEG levels, the loop not loaded or switched off, ``dest`` or
    ``dest_next`` not a C-contiguous uint8 numpy array).

    The function returned, ``(task, buf, pool) -> bool``, decodes a fresh task's run and
    copies its pieces into ``dest`` and ``dest_next``; the run's pixels land in ``buf``
    (``(h, w, c)`` uint8) only where the task keeps the run (``task.keep``: RGB tiles are
    otherwise decoded into the loop's tile scratch and copied from there).  For a carried
    task (its pixels in ``buf``) it copies the next pieces.  It returns False, having done
    nothing, for a fresh run the loop does not take (:func:`~wsitool.read.fill.fill_region`'s
    rule).  Raises as :meth:`wsitool.codec.jpegloop.RegionJobs.run`."""
    lv = req.level
    if cache is not None or lv.planes is not None:
        return None
    for a in (dest, dest_next):
        if a is not None and (type(a) is not np.ndarray or a.dtype != np.uint8 or not a.flags.c_contiguous):
            return None
    probe = np.empty((1, 1, req.shape[2]), np.uint8)
    if not jpegloop.applies(lv, req.mode, probe):
        return None

    def decode_and_copy(task: _Task, buf: np.ndarray, pool: Any) -> bool:
        x0, y0, x1, y1 = task.run.rect
        if task.fresh and _ends_one_column_into_a_tile(lv, x0, x1 - x0):
            return False
        ahead = () if not len(task.next_pieces) else (dest_next, _pieces_array(task.next_pieces, dest_next))
        if not task.fresh:
            if ahead:
                jpegloop.scatter(buf, *ahead)
            return True
        region = jpegloop.RegionJobs(lv, buf, x0, y0, (x0, y0, x1, y1), "raise")  # (failures: one by one)
        region.chunk = SCATTER_TILES if buf.shape[2] != 3 else min(region.count, jpegloop.MAX_CHUNK)
        region.scatter = (dest, _pieces_array(task.pieces, dest), task.keep, *ahead)
        if region.count >= _PREFETCH_MIN_TILES:
            _prefetch(lv, region.c0, region.c0 + region.ncols - 1, region.r0, region.r0)
        region.run(pool)
        return True

    return decode_and_copy


def _reduce(req: PatchRequest, windows: np.ndarray, out: np.ndarray) -> None:
    """Reduce each ``(wh, ww, c)`` window onto its ``(h, w, c)`` patch by the area filter."""
    assert req.read is not None  # (the caller's test)
    rw, rh = req.read
    ww, wh = req.window
    filt = AreaFilter(ww, wh, (0.0, 0.0, rw, rh), req.size[0], req.size[1], req.shape[2])

    def work(todo: Iterable[int]) -> None:
        for i in todo:
            filt.apply(windows[i], out[i])

    idx = list(range(len(out)))
    run_jobs(idx, thread_count(req.threads, len(idx)), work)


def _fill_cuda(req: PatchRequest, locs: np.ndarray, out: Any) -> Any:
    """``device="cuda"``: each patch by a GPU region read into its slot of ``out``.

    Not yet grouped by tile (a shared tile is decoded once per patch); the GPU
    decoder batches the tiles of each patch.
    """
    from .cuda import read_region_cuda

    w, h = req.size
    for i, (x, y) in enumerate(locs.tolist()):
        rx, ry = level_rect(req.level, x, y)
        one = ReadRequest(path=req.path, level=req.level, x=rx, y=ry, width=w, height=h, mode=req.mode,
                          on_error=req.on_error, threads=req.threads, device=req.device)
        read_region_cuda(one, out=out[i])
    return out


def _new_batch(req: PatchRequest, n: int) -> Any:
    if req.device == "cpu":
        return np.empty((n, *req.shape), req.dtype)
    import cupy  # optional dependency: device="cuda" only

    from .cuda import device_index

    with cupy.cuda.Device(device_index(req.path, req.device)):
        return cupy.empty((n, *req.shape), req.dtype)


def read_patch_batches(req: PatchRequest, cache: CacheScope | None = None) -> Iterator[Any]:
    """Yield the batches of ``req``: ``(b, h, w, c)`` arrays in input order, ``b <= batch_size``.

    Each batch's array is made one batch ahead (the tiles a batch shares with the next are
    copied into both at once: :class:`PatchReader`)."""
    reader = PatchReader(req, cache)
    try:
        spans = list(reader.spans())
        ahead = _new_batch(req, spans[0][1] - spans[0][0]) if spans else None
        for k, (j0, j1) in enumerate(spans):
            out = ahead
            ahead = _new_batch(req, spans[k + 1][1] - spans[k + 1][0]) if k + 1 < len(spans) else None
            yield reader.fill(j0, j1, out, ahead)
    finally:
        reader.close()


def fill_all(req: PatchRequest, out: Any, cache: CacheScope | None = None) -> Any:
    """Fill a caller's ``(n, h, w, c)`` array with every patch of ``req``, batch by batch.

    Raises:
        InvalidRegionError: ``out`` of the wrong type, shape, dtype or layout.
    """
    n = len(req.locations)
    if req.device == "cpu":
        check_out(out, (n, *req.shape), req.dtype, req.path)
    else:
        import cupy  # optional dependency: device="cuda" only

        check_out(out, (n, *req.shape), req.dtype, req.path, cupy.ndarray, "cupy.ndarray")
    reader = PatchReader(req, cache)
    try:
        for j0, j1 in reader.spans():
            j2 = min(j1 + req.batch_size, n)
            reader.fill(j0, j1, out[j0:j1], out[j1:j2] if j2 > j1 else None)
    finally:
        reader.close()
    return out
