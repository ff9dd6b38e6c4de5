"""Batch patch reads that decode each tile once: the primitive behind :meth:`wsitool.Slide.read_patches` (floor 4).

A per-patch reader decodes a tile once for every patch that touches it: on a
grid of 224 x 224 patches over 240 x 240 tiles most tiles feed two to four
patches.  Here the patches of a batch are grouped by the tiles they touch:

1. each patch's window (``read_size``, default ``size``, in pixels of the
   level) is placed on the level by the same nearest-pixel rule as
   :meth:`wsitool.Slide.read_region` (:func:`wsitool.geometry.level_rect`);
2. the tiles the windows touch are collected and cut into *runs*: tiles next to
   each other in one tile row (at most :data:`RUN_TILES` of them on one thread,
   half that with more);
3. each run is decoded once into a run buffer one tile high and its pixels are
   copied into every patch that needs them.  Where the compiled JPEG loop
   applies, both happen in C with the GIL released, the copies made every
   :data:`SCATTER_TILES` tiles while those tiles are still in the CPU cache
   (:func:`wsitool.codec.jpegloop.scatter`); else
   :func:`wsitool.read.fill.fill_region` (the Python tile path, or the decoded-tile
   cache) and numpy copies, the reference the compiled copy is tested against.
   ``on_error`` and the per-thread decoders work exactly as for a region;
4. with ``read_size``, each window is then reduced to ``size`` by the exact area
   filter (:mod:`wsitool.areafilter`).

The runs are shared by the threads (each thread takes the next run when it has
finished its last one, the longest first); the first thread free plans the next
batch before it takes a run, so that the plan is made while the others decode.
Runs that the next batch also touches are carried over to it, decoded
(:class:`PatchReader`): on a row-major grid two consecutive batches share the
tile rows of the patch row they split, and those tiles are decoded once.  A
patch equals :meth:`wsitool.Slide.read_region` of its location bit for bit
(with ``read_size``, the area filter of that read of the window), pixels
outside the slide and missing tiles included.

Memory: the batch's output; one run buffer (``RUN_TILES`` tiles) per thread
plus one per run carried to the next batch (at most the runs the next batch
touches); with ``read_size``, the batch's windows (``batch_size`` windows of
``ceil(read_size)`` pixels) until they are reduced.  The run buffers are kept
for the next call (at most :data:`SPARE_BYTES` in the process): fresh ones cost
page faults on every pass.

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

from ..areafilter import AreaFilter
from ..arguments import as_int
from ..codec import jpegloop
from ..codec.pool import get_pool
from ..errors import InvalidRegionError, ResourceLimitError
from ..geometry import level_rect
from ..model import PyramidLevel
from ..settings import get_limits
from .cache import CacheScope
from .fill import _PREFETCH_MIN_TILES, _ends_one_column_into_a_tile, _prefetch, fill_region
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
    """Tiles ``c0..c1`` (inclusive) of tile row ``row``, decoded together into one buffer.

    ``rect``: ``(x0, y0, x1, y1)`` in level pixels.  ``buf``: the flat buffer once
    decoded (kept while the run is carried to the next batch).
    """

    row: int
    c0: int
    c1: int
    rect: tuple[int, int, int, int]
    buf: np.ndarray | None = None


@dataclass(eq=False)
class _Task:
    """One batch's use of a run: its ``pieces``, the copies
    ``(patch, (dy0, dy1, dx0, dx1), (sy0, sy1, sx0, sx1))`` from the run's buffer into
    the patches' windows; ``keep``: the next batch needs the run (its buffer is kept)."""

    run: _Run
    pieces: list
    keep: bool


def _windows(lv: PyramidLevel, locs: np.ndarray) -> np.ndarray:
    """``(n, 2)`` int64: each window's top-left corner in pixels of ``lv``
    (``floor(x / downsample + 0.5)``, as :func:`wsitool.geometry.level_rect`)."""
    if lv.downsample == 1.0:
        return locs
    return np.floor(locs / lv.downsample + 0.5).astype(np.int64)


@dataclass
class _Footprint:
    """Where the windows of one batch fall on the level's tile grid.

    ``wins``: one list per window that overlaps the level, ``[i, x0, x1, y0, y1, c0,
    c1, r0, r1, px, py]``: its index in the batch, its clipped box in level pixels,
    the tiles it touches (inclusive) and its unclipped corner; ``partial``: ``(n,)``
    bool, True for windows not wholly inside the level; ``rows``: tile row -> set of
    tile columns touched.
    """

    corners: np.ndarray
    wins: list
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
    wins = np.stack([idx, x0, x1, y0, y1, x0 // tw, (x1 - 1) // tw, y0 // th, (y1 - 1) // th, cx, cy],
                    1).tolist()
    rows: dict[int, set[int]] = {}
    for _, _, _, _, _, c0, c1, r0, r1, _, _ in wins:
        for r in range(r0, r1 + 1):
            cols = rows.get(r)
            if cols is None:
                cols = rows[r] = set()
            if c0 == c1:
                cols.add(c0)
            else:
                cols.update(range(c0, c1 + 1))
    return _Footprint(corners, wins, partial, rows)


def _touches(rows: dict[int, set[int]] | None, run: _Run) -> bool:
    """True when the tile columns ``rows`` lists (row -> columns; None: none) meet ``run``."""
    cols = rows.get(run.row) if rows is not None else None
    return cols is not None and not cols.isdisjoint(range(run.c0, run.c1 + 1))


def _cut_runs(lv: PyramidLevel, fp: _Footprint, carried: list[_Run],
              most: int) -> tuple[list[_Run], dict[int, dict[int, _Run]]]:
    """The batch's runs (the ``carried`` ones it touches, then new ones for its other tiles:
    neighbours in a tile row, at most ``most``) and, per tile row, column -> run."""
    tw, th, W, H = lv.tile_width, lv.tile_height, lv.width, lv.height
    owner: dict[int, dict[int, _Run]] = {}
    runs: list[_Run] = []
    for run in carried:
        if _touches(fp.rows, run):
            runs.append(run)
            cols = owner.setdefault(run.row, {})
            for c in range(run.c0, run.c1 + 1):
                cols[c] = run
    for r in sorted(fp.rows):
        cols = owner.setdefault(r, {})
        todo = sorted(c for c in fp.rows[r] if c not in cols)
        i = 0
        while i < len(todo):
            start = prev = todo[i]
            i += 1
            while i < len(todo) and todo[i] == prev + 1 and todo[i] - start < most:
                prev = todo[i]
                i += 1
            run = _Run(r, start, prev, (start * tw, r * th, min((prev + 1) * tw, W), min((r + 1) * th, H)))
            runs.append(run)
            for c in range(start, prev + 1):
                cols[c] = run
    return runs, owner


def plan_runs(lv: PyramidLevel, fp: _Footprint, carried: list[_Run], following: _Footprint | None,
              most: int = RUN_TILES) -> list[_Task]:
    """The runs of one batch and each window's pieces of them, as one :class:`_Task` a run.

    Tiles already decoded in a run ``carried`` over from the previous batch are
    not decoded again; the other tiles the batch touches are cut into new runs
    (neighbours in a tile row, at most ``most``).  Every touched tile
    is in exactly one returned run.  A task is marked ``keep`` when the
    ``following`` batch (None: none) touches its run.  Nothing in ``carried`` is changed.
    """
    runs, owner = _cut_runs(lv, fp, carried, most)
    pieces: dict[_Run, list] = {run: [] for run in runs}
    for i, a0, a1, b0, b1, c0, c1, r0, r1, px, py in fp.wins:
        for r in range(r0, r1 + 1):
            cols = owner[r]
            last = None
            for c in range(c0, c1 + 1):
                run = cols[c]
                if run is last:
                    continue
                last = run
                rx0, ry0, rx1, ry1 = run.rect
                ix0, ix1 = (a0 if a0 > rx0 else rx0), (a1 if a1 < rx1 else rx1)
                iy0, iy1 = (b0 if b0 > ry0 else ry0), (b1 if b1 < ry1 else ry1)
                pieces[run].append((i, (iy0 - py, iy1 - py, ix0 - px, ix1 - px),
                                    (iy0 - ry0, iy1 - ry0, ix0 - rx0, ix1 - rx0)))
    rows = following.rows if following is not None else None
    return [_Task(run, pieces[run], _touches(rows, run)) for run in runs]


# ------------------------------------------------------------------ filling


#: Most bytes of run buffers kept between calls (:class:`_Buffers`): a one-thread read of
#: 240 x 240 tiles uses about five 2.7 MB buffers (one decoding, the others carried).
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

    Runs decoded for one batch that the next batch also touches are carried
    over (their buffers kept), so that a tile shared by two consecutive
    batches is decoded once: on a row-major grid consecutive batches share
    the tile rows of the patch row they split.  The carried buffers are at
    most the runs the next batch touches.

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
        self._carried: list[_Run] = []
        self._next = 0  # index of the first patch of the batch expected next
        # the plan of that batch, made while the last one decoded: (j0, j1, footprint, tasks, following)
        self._ahead: tuple[int, int, _Footprint, list[_Task], _Footprint | None] | None = None
        self._windows: np.ndarray | None = None    # read_size: the windows of a batch, reused

    def spans(self) -> Iterator[tuple[int, int]]:
        """``[j0, j1)`` of each batch."""
        n, b = len(self.req.locations), self.req.batch_size
        return ((j, min(j + b, n)) for j in range(0, n, b))

    def _footprint(self, j0: int, j1: int) -> _Footprint:
        req = self.req
        return footprint(req.level, _windows(req.level, req.locations[j0:j1]), req.window)

    def fill(self, j0: int, j1: int, out: Any) -> Any:
        """Fill ``out`` (``(j1 - j0,) + req.shape``) with patches ``j0 .. j1 - 1``; return it.

        The first thread free plans the next batch (``[j1, j1 + batch_size)``) before it
        starts on this one's runs, so that with several threads the plan is made while the
        others decode.

        Raises:
            TileDecodeError: a corrupt tile, with ``on_error="raise"``.
            OSError: a read of the slide's bytes failed.
        """
        req = self.req
        if j1 <= j0:
            return out
        if req.device != "cpu":
            return _fill_cuda(req, req.locations[j0:j1], out)
        tasks, following, dest = self._plan(j0, j1, out)
        ahead = Once(lambda: self._plan_ahead(j1, tasks, following))
        try:
            with req.level.source.reading():
                # longest decodes first, copy-only (carried) runs last: the threads finish the
                # batch together instead of one waiting on a long run taken at the end
                order = sorted(tasks, key=lambda t: 0 if t.run.buf is not None else t.run.c0 - t.run.c1 - 1)
                k = thread_count(req.threads, len(order))
                work = self._worker(dest)
                shared = SharedJobs(order) if k > 1 else None
                jobs: Iterable[_Task] = order if shared is None else shared

                def plan_then_work() -> None:
                    ahead()
                    work(jobs)

                run_threads(k, plan_then_work, _nothing if shared is None else shared.stop)
        except BaseException:
            self._release(t.run for t in tasks)
            self._carried, self._next, self._ahead = [], -1, None
            raise
        self._carried = [t.run for t in tasks if t.keep]
        self._next = j1
        if req.read is not None:
            _reduce(req, dest, out)
        return out

    def _plan_ahead(self, j1: int, tasks: list[_Task], following: _Footprint | None) -> None:
        """Plan batch ``[j1, j1 + batch_size)`` (``following``: its footprint; None: there is
        none), the runs ``tasks`` keeps carried into it; for the next :meth:`fill`."""
        if following is None:
            return
        req = self.req
        n = len(req.locations)
        j2 = min(j1 + req.batch_size, n)
        after = self._footprint(j2, min(j2 + req.batch_size, n)) if j2 < n else None
        carried = [t.run for t in tasks if t.keep]
        self._ahead = (j1, j2, following, plan_runs(req.level, following, carried, after, self._most), after)

    def _plan(self, j0: int, j1: int, out: Any) -> tuple[list[_Task], _Footprint | None, np.ndarray]:
        """The tasks of batch ``[j0, j1)``, the next batch's footprint and the array the
        windows are copied into (``out``, or the reused windows with ``read_size``), its
        windows not wholly inside the level zeroed; carried runs no longer needed are released."""
        req = self.req
        ahead, self._ahead = self._ahead, None
        if j0 != self._next:
            self._release(self._carried)
            self._carried = []
        if ahead is not None and j0 == self._next and ahead[:2] == (j0, j1):
            _, _, fp, tasks, following = ahead
        else:
            fp = self._footprint(j0, j1)
            n_next = min(j1 + req.batch_size, len(req.locations))
            following = self._footprint(j1, n_next) if n_next > j1 else None
            tasks = plan_runs(req.level, fp, self._carried, following, self._most)
        used = {t.run for t in tasks}
        self._release(r for r in self._carried if r not in used)
        self._carried = []
        if req.read is None:
            dest = out
        else:  # the windows, kept for the next batch (no fresh pages per batch)
            ww, wh = req.window
            if self._windows is None or len(self._windows) < j1 - j0:
                self._windows = np.empty((j1 - j0, wh, ww, req.shape[2]), req.dtype)
            dest = self._windows[:j1 - j0]
        if fp.partial.any():
            dest[fp.partial] = 0
        return tasks, following, dest

    def _worker(self, dest: np.ndarray) -> Callable[[Iterable[_Task]], None]:
        """The work of one thread: decode the run of each task it takes (once: carried runs
        are decoded already) into a run buffer and copy its pieces into the windows of ``dest``.

        Where the compiled JPEG loop applies (:func:`_native_scatter`) it decodes the run and
        copies each piece in C, the GIL released, a few tiles at a time while their pixels are
        still in the cache; else :func:`~wsitool.read.fill.fill_region` and numpy copies (the
        reference, pinned to the fast path by tests/read/test_patches.py)."""
        req, cache, buffers = self.req, self.cache, self._buffers
        lv, c, dtype = req.level, req.shape[2], req.dtype
        itemsize = dtype.itemsize
        pool = get_pool("cpu")
        native = _native_scatter(req, dest, cache)

        def work(todo: Iterable[_Task]) -> None:
            for task in todo:
                run = task.run
                x0, y0, x1, y1 = run.rect
                flat = run.buf
                fresh = flat is None
                if flat is None:
                    flat = run.buf = buffers.take()
                buf = flat[:(y1 - y0) * (x1 - x0) * c * itemsize].view(dtype).reshape(y1 - y0, x1 - x0, c)
                if native is None or not native(run, task.pieces, buf, fresh, pool):
                    if fresh:
                        part = ReadRequest(path=req.path, level=lv, x=x0, y=y0, width=x1 - x0, height=y1 - y0,
                                           mode=req.mode, on_error=req.on_error, threads=1)
                        fill_region(part, buf, pool, cache)
                    for i, (dy0, dy1, dx0, dx1), (sy0, sy1, sx0, sx1) in task.pieces:
                        dest[i, dy0:dy1, dx0:dx1] = buf[sy0:sy1, sx0:sx1]
                if not task.keep:
                    buffers.give(flat)
                    run.buf = None

        return work

    def close(self) -> None:
        """The end of the call: the carried runs released, the run buffers kept for the next
        call (at most :data:`SPARE_BYTES` of them in the process)."""
        self._release(self._carried)
        self._carried, self._next, self._ahead = [], -1, None
        self._buffers.close()

    def _release(self, runs: Iterable[_Run]) -> None:
        for run in runs:
            if run.buf is not None:
                self._buffers.give(run.buf)
                run.buf = None


def _nothing() -> None:
    pass


#: Tiles per call of the compiled loop when it also copies the pieces (:func:`_native_scatter`):
#: 4 tiles of 240 x 240 RGB (675 KiB) are still in a 1 MiB L2 cache when they are copied.
SCATTER_TILES = 4


def _native_scatter(req: PatchRequest, dest: Any,
                    cache: CacheScope | None) -> Callable[[_Run, list, np.ndarray, bool, Any], bool] | None:
    """The compiled path of one batch, or None where it does not apply (a decoded-tile cache,
    multi-channel or non-JPEG levels, the loop not loaded or switched off, ``dest`` not a
    C-contiguous uint8 numpy array).

    The function returned, ``(run, pieces, buf, fresh, pool) -> bool``, decodes ``run`` into
    ``buf`` (``(h, w, c)`` uint8) when ``fresh`` (else ``buf`` holds it already: a carried
    run) and copies ``pieces`` (as :class:`_Task`'s) into ``dest``; it returns False, having
    done nothing, for a fresh run the loop does not take (:func:`~wsitool.read.fill.fill_region`'s
    rule).  Raises as :meth:`wsitool.codec.jpegloop.RegionJobs.run`."""
    lv = req.level
    if (cache is not None or lv.planes is not None or type(dest) is not np.ndarray or dest.dtype != np.uint8
            or not dest.flags.c_contiguous):
        return None
    probe = np.empty((1, 1, req.shape[2]), np.uint8)
    if not jpegloop.applies(lv, req.mode, probe):
        return None
    stride = dest.strides[1]
    px = dest.strides[2]
    patch = dest.strides[0]

    def decode_and_copy(run: _Run, todo: list, buf: np.ndarray, fresh: bool, pool: Any) -> bool:
        x0, y0, x1, y1 = run.rect
        if fresh and _ends_one_column_into_a_tile(lv, x0, x1 - x0):
            return False
        pieces = np.array([(i * patch + dy0 * stride + dx0 * px, stride, sy0, sy1, sx0, sx1)
                           for i, (dy0, _, dx0, _), (sy0, sy1, sx0, sx1) in todo], np.int64).reshape(-1, 6)
        if not fresh:
            jpegloop.scatter(buf, dest, pieces)
            return True
        region = jpegloop.RegionJobs(lv, buf, x0, y0, (x0, y0, x1, y1), req.on_error)
        region.chunk = SCATTER_TILES
        region.scatter = (dest, pieces)
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
    """Yield the batches of ``req``: ``(b, h, w, c)`` arrays in input order, ``b <= batch_size``."""
    reader = PatchReader(req, cache)
    try:
        for j0, j1 in reader.spans():
            yield reader.fill(j0, j1, _new_batch(req, j1 - j0))
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
            reader.fill(j0, j1, out[j0:j1])
    finally:
        reader.close()
    return out
