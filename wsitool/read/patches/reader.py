"""The batch reader: the patches of a request filled batch by batch, each tile decoded once (floor 4)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from ...codec.pool import get_pool
from ...errors import TileDecodeError
from ...ground.areafilter import AreaFilter
from ...ground.geometry import level_rect
from ..cache import CacheScope
from ..fill import fill_region
from ..plan import advise_blocks
from ..request import ReadRequest, check_out
from ..threads import Once, SharedJobs, run_jobs, run_threads, thread_count
from .buffers import RunBuffers
from .request import PatchRequest
from .runs import RUN_TILES, Footprint, Run, Task, consecutive_spans, footprint, plan_runs, window_corners
from .scatter import native_scatter

__all__ = ["PatchReader", "read_patch_batches", "fill_all"]


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
        self._buffers = RunBuffers(lv.tile_height * lv.tile_width * min(RUN_TILES, lv.tiles_across)
                                 * req.shape[2] * req.dtype.itemsize)
        # runs of at most RUN_TILES tiles on one thread; with more, half that: the threads
        # share a batch's runs, and smaller ones let them finish the batch closer together
        self._most = RUN_TILES if thread_count(req.threads, 2) == 1 else RUN_TILES // 2
        self._done: list[Task] = []  # the tasks of the batch filled last
        self._next = -1  # the first patch of the batch expected next (-1: none)
        self._next_at: Any = None  # where its output is (the pieces of _done were copied there)
        self._ahead: tuple[int, list[Task]] | None = None  # its plan, made while the last one decoded
        self._fps: dict[int, Footprint] = {}  # footprints of batches by first patch
        self._windows: list[np.ndarray] = []  # read_size: the windows of this batch and the next
        self._redo: set[int] = set()  # patches of the next batch fed by a run that failed

    def spans(self) -> Iterator[tuple[int, int]]:
        """``[j0, j1)`` of each batch."""
        n, b = len(self.req.locations), self.req.batch_size
        return ((j, min(j + b, n)) for j in range(0, n, b))

    def _footprint(self, j0: int) -> Footprint | None:
        """The footprint of the batch starting at patch ``j0`` (None past the end)."""
        req = self.req
        n = len(req.locations)
        if j0 >= n:
            return None
        fp = self._fps.get(j0)
        if fp is None:
            j1 = min(j0 + req.batch_size, n)
            fp = self._fps[j0] = footprint(req.level, window_corners(req.level, req.locations[j0:j1]), req.window)
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
                jobs: Iterable[Task] = order if shared is None else shared

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
                         tasks: list[Task]) -> None:
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
            one = ReadRequest(level=req.level, x=x, y=y, width=ww, height=wh, mode=req.mode,
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

    def _plan(self, j0: int, j1: int, dest: np.ndarray, dest_next: np.ndarray | None) -> list[Task]:
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

    def _plan_ahead(self, j1: int, tasks: list[Task]) -> None:
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

    def _advise(self, tasks: list[Task], then: Footprint | None = None, ahead: bool = False) -> None:
        """Tell the byte source the tiles of ``tasks``' fresh runs and of footprint ``then`` (a
        later batch's), all in one advice (:func:`~wsitool.read.plan.advise_blocks`); the source
        decides.  A remote one merges neighbouring runs into one request, up to ``concurrency``
        in flight, and asks for no range an earlier advice holds
        (:meth:`wsitool.storage.remote.RemoteSource.advise`): each run's decode would otherwise
        fetch its bytes when it starts, one round trip after another on each thread (batches of
        64 patches of 224 pixels over a link of 20 ms: 480 patches/s; 1,221 with the batch's runs
        advised at once and the next batch's ahead; 1,402 with the tiles of the one after too;
        scripts/bench_remote_patches.py).  A local file applies its ``fadvise`` rule (nothing
        ahead); a source of frames asks for them in one request.  Not with a decoded-tile cache
        (its hits need no bytes).  ``ahead``: for the next batches (skipped by a source whose
        read-ahead budget is spent)."""
        lv = self.req.level
        if self.cache is None:
            blocks = [(t.run.c0, t.run.c1, t.run.row, t.run.row) for t in tasks if t.fresh]
            if then is not None:
                for row, cols in sorted(then.rows.items()):
                    blocks.extend((a, b, row, row) for a, b in consecutive_spans(sorted(cols)))
            advise_blocks(lv, blocks, ahead)

    def _worker(self, dest: np.ndarray, dest_next: np.ndarray | None) -> Callable[[Iterable[Task]], None]:
        """The work of one thread: decode the run of each fresh task it takes into a run
        buffer and copy its pieces into the windows of ``dest`` (``next_pieces``: of
        ``dest_next``); a carried run's buffer holds it already.

        Where the compiled JPEG loop applies (:func:`native_scatter`) it decodes the run and
        copies each piece in C, the GIL released, each tile while its pixels are still in the
        cache; else :func:`~wsitool.read.fill.fill_region` and numpy copies (the reference,
        pinned to the fast path by tests/read/test_patches.py)."""
        req, cache, buffers = self.req, self.cache, self._buffers
        lv, c, dtype = req.level, req.shape[2], req.dtype
        itemsize = dtype.itemsize
        pool = get_pool("cpu")
        native = native_scatter(req, dest, dest_next, cache)

        def decode_and_copy(task: Task, buf: np.ndarray) -> None:
            if native is not None and native(task, buf, pool):
                return
            if task.fresh:
                x0, y0, x1, y1 = task.run.rect
                part = ReadRequest(level=lv, x=x0, y=y0, width=x1 - x0, height=y1 - y0,
                                   mode=req.mode, on_error="raise", threads=1)
                fill_region(part, buf, pool, cache)
            for pieces, into in ((task.pieces, dest), (task.next_pieces, dest_next)):
                for i, dy0, dy1, dx0, dx1, sy0, sy1, sx0, sx1 in pieces.tolist():
                    assert into is not None  # (no next pieces without a next batch)
                    into[i, dy0:dy1, dx0:dx1] = buf[sy0:sy1, sx0:sx1]

        def work(todo: Iterable[Task]) -> None:
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

    def _forget(self, tasks: list[Task]) -> None:
        """Nothing of the last call is carried on: ``tasks``' buffers released, no plan ahead."""
        self._release(t.run for t in tasks)
        self._done, self._next, self._next_at, self._ahead = [], -1, None, None
        self._redo = set()

    def _release(self, runs: Iterable[Run]) -> None:
        for run in runs:
            if run.buf is not None:
                self._buffers.give(run.buf)
                run.buf = None


def _address(a: Any) -> Any:
    """Where array ``a``'s data starts (None for None)."""
    return None if a is None else a.__array_interface__["data"][0]


def _nothing() -> None:
    pass


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
    from ..cuda import read_region_cuda

    w, h = req.size
    for i, (x, y) in enumerate(locs.tolist()):
        rx, ry = level_rect(req.level, x, y)
        one = ReadRequest(level=req.level, x=rx, y=ry, width=w, height=h, mode=req.mode,
                          on_error=req.on_error, threads=req.threads, device=req.device)
        read_region_cuda(one, out=out[i])
    return out


def _new_batch(req: PatchRequest, n: int) -> Any:
    if req.device == "cpu":
        return np.empty((n, *req.shape), req.dtype)
    import cupy  # optional dependency: device="cuda" only

    from ..cuda import device_index

    with cupy.cuda.Device(device_index(req.device)):
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
        check_out(out, (n, *req.shape), req.dtype)
    else:
        import cupy  # optional dependency: device="cuda" only

        check_out(out, (n, *req.shape), req.dtype, cupy.ndarray, "cupy.ndarray")
    reader = PatchReader(req, cache)
    try:
        for j0, j1 in reader.spans():
            j2 = min(j1 + req.batch_size, n)
            reader.fill(j0, j1, out[j0:j1], out[j1:j2] if j2 > j1 else None)
    finally:
        reader.close()
    return out
