"""Batch patch reads that decode each tile once: the primitive behind :meth:`wsitool.Slide.read_patches` (floor 4).

A per-patch reader decodes a tile once for every patch that touches it: on a
grid of 224 x 224 patches over 240 x 240 tiles most tiles feed two to four
patches.  Here the patches of a batch are grouped by the tiles they touch:

1. each patch's window (``read_size``, default ``size``, in pixels of the
   level) is placed on the level by the same nearest-pixel rule as
   :meth:`wsitool.Slide.read_region` (:func:`wsitool.geometry.level_rect`);
2. the tiles the windows touch are collected and cut into *runs*: tiles next to
   each other in one tile row (at most :data:`RUN_TILES` of them);
3. each run is decoded once into a per-thread buffer one tile high
   (:func:`wsitool.read.fill.fill_region`: the compiled JPEG loop with the
   GIL released where it applies, else the Python tile path; the decoded-tile
   cache, ``on_error`` and the per-thread decoders exactly as for a region), and
   its pixels are copied into every patch that needs them;
4. with ``read_size``, each window is then reduced to ``size`` by the exact area
   filter (:mod:`wsitool.areafilter`).

The runs are shared by the threads (each thread takes the next run when it has
finished its last one).  Runs that the next batch also touches are carried over
to it, decoded (:class:`PatchReader`): on a row-major grid two consecutive
batches share the tile rows of the patch row they split, and those tiles are
decoded once.  A patch equals :meth:`wsitool.Slide.read_region` of its location bit
for bit (with ``read_size``, the area filter of that read of the window), pixels
outside the slide and missing tiles included.

Memory: the batch's output; one run buffer (``RUN_TILES`` tiles) per thread
plus one per run carried to the next batch (at most the runs the next batch
touches); with ``read_size``, the batch's windows (``batch_size`` windows of
``ceil(read_size)`` pixels) until they are reduced.

Not to be confused with :func:`wsitool.distributed.read_regions`, which reads a
list of regions on a Dask cluster and writes each to a file.
"""

from __future__ import annotations

import math
import queue
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..areafilter import AreaFilter
from ..arguments import as_int
from ..codec.pool import get_pool
from ..errors import InvalidRegionError, ResourceLimitError
from ..geometry import level_rect
from ..model import Level
from ..settings import get_limits
from .cache import CacheScope
from .fill import fill_region
from .request import ReadRequest, check_out, check_threads, output_shape, validate_request
from .threads import run_jobs, thread_count

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
        level: the :class:`~wsitool.model.Level` read.
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
    level: Level
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
            if isinstance(a, bool) or isinstance(b, bool):
                raise TypeError
            pair = (float(a), float(b))
        except (TypeError, ValueError):
            raise InvalidRegionError(f"{path}: {what} must be two numbers, got {value!r}") from None
    if not all(math.isfinite(v) and v > 0 for v in pair):
        raise InvalidRegionError(f"{path}: {what} must be positive, got {value!r}")
    return pair


def check_patch_request(levels: Sequence[Level], path: str, locations: Any, size: Any, *, level: Any = 0,
                        read_size: Any = None, batch_size: Any = 64, mode: str = "rgb", threads: Any = None,
                        on_error: str = "raise", device: str = "cpu", channels: Any = None) -> PatchRequest:
    """Validate a batch request; see :meth:`wsitool.Slide.read_patches` for the arguments.

    ``channels`` selects channels of a multi-channel level (as ``read_region``'s);
    the request's ``level`` is then the selection (:meth:`wsitool.model.Level.select`).

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

    ``rect``: ``(x0, y0, x1, y1)`` in level pixels.  ``pieces``: this batch's copies,
    ``(patch, (dy0, dy1, dx0, dx1), (sy0, sy1, sx0, sx1))`` from the run's buffer
    into the patch's window.  ``buf``: the flat buffer once decoded (kept while
    the run is carried to the next batch).  ``keep``: the next batch needs it.
    """

    row: int
    c0: int
    c1: int
    rect: tuple[int, int, int, int]
    pieces: list = field(default_factory=list)
    buf: np.ndarray | None = None
    keep: bool = False


def _windows(lv: Level, locs: np.ndarray) -> np.ndarray:
    """``(n, 2)`` int64: each window's top-left corner in pixels of ``lv``
    (``floor(x / downsample + 0.5)``, as :func:`wsitool.geometry.level_rect`)."""
    if lv.downsample == 1.0:
        return locs
    return np.floor(locs / lv.downsample + 0.5).astype(np.int64)


@dataclass
class _Footprint:
    """Where the windows of one batch fall on the level's tile grid.

    ``idx``: the windows that overlap the level; for them ``box`` (clipped
    ``x0, x1, y0, y1`` in level pixels) and ``tiles`` (``c0, c1, r0, r1``,
    inclusive) as lists; ``partial``: ``(n,)`` bool, True for windows not wholly
    inside the level; ``rows``: tile row -> set of tile columns touched.
    """

    corners: np.ndarray
    idx: list
    box: list
    tiles: list
    partial: np.ndarray
    rows: dict


def footprint(lv: Level, corners: np.ndarray, window: tuple[int, int]) -> _Footprint:
    """The :class:`_Footprint` of windows of ``window`` pixels at ``corners`` (level pixels)."""
    ww, wh = window
    W, H, tw, th = lv.width, lv.height, lv.tile_width, lv.tile_height
    x0 = np.clip(corners[:, 0], 0, W)
    y0 = np.clip(corners[:, 1], 0, H)
    x1 = np.clip(corners[:, 0] + ww, 0, W)
    y1 = np.clip(corners[:, 1] + wh, 0, H)
    inside = (x1 > x0) & (y1 > y0)
    partial = ~inside | (x0 != corners[:, 0]) | (y0 != corners[:, 1]) | (x1 - x0 != ww) | (y1 - y0 != wh)
    idx = np.flatnonzero(inside)
    box = list(zip(x0[idx].tolist(), x1[idx].tolist(), y0[idx].tolist(), y1[idx].tolist(), strict=True))
    tiles = list(zip((x0[idx] // tw).tolist(), ((x1[idx] - 1) // tw).tolist(),
                     (y0[idx] // th).tolist(), ((y1[idx] - 1) // th).tolist(), strict=True))
    rows: dict[int, set[int]] = {}
    for c0, c1, r0, r1 in tiles:
        cols = range(c0, c1 + 1)
        for r in range(r0, r1 + 1):
            rows.setdefault(r, set()).update(cols)
    return _Footprint(corners, idx.tolist(), box, tiles, partial, rows)


def plan_runs(lv: Level, fp: _Footprint, carried: list[_Run], following: _Footprint | None) -> list[_Run]:
    """The runs of one batch and each window's pieces of them.

    Tiles already decoded in a run ``carried`` over from the previous batch are
    not decoded again; the other tiles the batch touches are cut into new runs
    (neighbours in a tile row, at most :data:`RUN_TILES`).  Every touched tile
    is in exactly one returned run.  A run is marked ``keep`` when the
    ``following`` batch (None: none) touches it.
    """
    tw, th, W, H = lv.tile_width, lv.tile_height, lv.width, lv.height
    by_row: dict[int, list[_Run]] = {}
    runs: list[_Run] = []
    for run in carried:
        if run.row in fp.rows and not fp.rows[run.row].isdisjoint(range(run.c0, run.c1 + 1)):
            run.pieces = []
            runs.append(run)
            by_row.setdefault(run.row, []).append(run)
    for r in sorted(fp.rows):
        done: set[int] = set()
        for run in by_row.get(r, ()):
            done.update(range(run.c0, run.c1 + 1))
        cols = sorted(fp.rows[r] - done)
        if not cols:
            continue
        start = prev = cols[0]
        for c in [*cols[1:], None]:
            if c is not None and c == prev + 1 and c - start < RUN_TILES:
                prev = c
                continue
            run = _Run(r, start, prev, (start * tw, r * th, min((prev + 1) * tw, W), min((r + 1) * th, H)))
            runs.append(run)
            by_row.setdefault(r, []).append(run)
            if c is not None:
                start = prev = c
    corners = fp.corners
    for i, (a0, a1, b0, b1), (c0, c1, r0, r1) in zip(fp.idx, fp.box, fp.tiles, strict=True):
        px, py = int(corners[i, 0]), int(corners[i, 1])
        for r in range(r0, r1 + 1):
            for run in by_row[r]:
                if run.c1 < c0 or run.c0 > c1:
                    continue
                rx0, ry0, rx1, ry1 = run.rect
                ix0, ix1 = max(a0, rx0), min(a1, rx1)
                iy0, iy1 = max(b0, ry0), min(b1, ry1)
                run.pieces.append((i, (iy0 - py, iy1 - py, ix0 - px, ix1 - px),
                                   (iy0 - ry0, iy1 - ry0, ix0 - rx0, ix1 - rx0)))
    for run in runs:
        touched = following.rows.get(run.row) if following is not None else None
        run.keep = touched is not None and bool(touched) and not touched.isdisjoint(range(run.c0, run.c1 + 1))
    return runs


# ------------------------------------------------------------------ filling


class _Buffers:
    """Flat run buffers, reused across the runs and batches of one call."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self._free: queue.SimpleQueue = queue.SimpleQueue()

    def take(self) -> np.ndarray:
        try:
            return self._free.get_nowait()
        except queue.Empty:
            return np.empty(self.nbytes, np.uint8)

    def give(self, buf: np.ndarray) -> None:
        self._free.put(buf)


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
        self._carried: list[_Run] = []
        self._next = 0  # index of the first patch of the batch expected next
        self._following: _Footprint | None = None  # its footprint, computed with the last batch
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

        Raises:
            TileDecodeError: a corrupt tile, with ``on_error="raise"``.
            OSError: a read of the slide's bytes failed.
        """
        req = self.req
        if j1 <= j0:
            return out
        if req.device != "cpu":
            return _fill_cuda(req, req.locations[j0:j1], out)
        runs, following, dest = self._plan(j0, j1, out)
        try:
            with req.level.source.reading():
                # longest decodes first, copy-only (carried) runs last: the threads finish the
                # batch together instead of one waiting on a long run taken at the end
                order = sorted(runs, key=lambda r: 0 if r.buf is not None else -(r.c1 - r.c0 + 1))
                run_jobs(order, thread_count(req.threads, len(runs)), self._worker(dest))
        except BaseException:
            self._release(runs)
            self._carried, self._next = [], -1
            raise
        self._carried = [r for r in runs if r.keep]
        self._next, self._following = j1, following
        if req.read is not None:
            _reduce(req, dest, out)
        return out

    def _plan(self, j0: int, j1: int, out: Any) -> tuple[list[_Run], _Footprint | None, np.ndarray]:
        """The runs of batch ``[j0, j1)``, the next batch's footprint and the array the
        windows are copied into (``out``, or the reused windows with ``read_size``), its
        windows not wholly inside the level zeroed; carried runs no longer needed are released."""
        req = self.req
        if j0 != self._next:
            self._release(self._carried)
            self._carried = []
        fp = self._following
        if fp is None or j0 != self._next or len(fp.corners) != j1 - j0:
            fp = self._footprint(j0, j1)
        n_next = min(j1 + req.batch_size, len(req.locations))
        following = self._footprint(j1, n_next) if n_next > j1 else None
        self._following = None
        runs = plan_runs(req.level, fp, self._carried, following)
        self._release([r for r in self._carried if r not in runs])
        if req.read is None:
            dest = out
        else:  # the windows, kept for the next batch (no fresh pages per batch)
            ww, wh = req.window
            if self._windows is None or len(self._windows) < j1 - j0:
                self._windows = np.empty((j1 - j0, wh, ww, req.shape[2]), req.dtype)
            dest = self._windows[:j1 - j0]
        if fp.partial.any():
            dest[fp.partial] = 0
        return runs, following, dest

    def _worker(self, dest: np.ndarray) -> Callable[[Iterable[_Run]], None]:
        """The work of one thread: decode each run it takes (once: carried runs are decoded
        already) into a run buffer and copy its pieces into the windows of ``dest``."""
        req, cache, buffers = self.req, self.cache, self._buffers
        lv, c, dtype = req.level, req.shape[2], req.dtype
        itemsize = dtype.itemsize
        pool = get_pool("cpu")

        def work(todo: Iterable[_Run]) -> None:
            for run in todo:
                x0, y0, x1, y1 = run.rect
                flat = run.buf
                fresh = flat is None
                if flat is None:
                    flat = run.buf = buffers.take()
                buf = flat[:(y1 - y0) * (x1 - x0) * c * itemsize].view(dtype).reshape(y1 - y0, x1 - x0, c)
                if fresh:
                    part = ReadRequest(path=req.path, level=lv, x=x0, y=y0, width=x1 - x0, height=y1 - y0,
                                       mode=req.mode, on_error=req.on_error, threads=1)
                    fill_region(part, buf, pool, cache)
                for i, (dy0, dy1, dx0, dx1), (sy0, sy1, sx0, sx1) in run.pieces:
                    dest[i, dy0:dy1, dx0:dx1] = buf[sy0:sy1, sx0:sx1]
                if not run.keep:
                    buffers.give(flat)
                    run.buf = None

        return work

    def _release(self, runs: Iterable[_Run]) -> None:
        for run in runs:
            if run.buf is not None:
                self._buffers.give(run.buf)
                run.buf = None


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
    for j0, j1 in reader.spans():
        yield reader.fill(j0, j1, _new_batch(req, j1 - j0))


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
    for j0, j1 in reader.spans():
        reader.fill(j0, j1, out[j0:j1])
    return out
