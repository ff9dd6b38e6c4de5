"""Batch region reads: many regions of one slide on a thread pool or a Dask cluster (floor 7).

:func:`read_regions` checks every request (names, levels, sizes, limits) and every
output before it reads anything, then runs :class:`_RegionTask` on batches of
requests: one region per task on the local thread pool (each in a copy of the
caller's context), or batches on Dask.  Only the slide's location (a path, or a
URL with its storage options) and identity (a worker never reads another
version) go into a task.

Outputs:

* one file per region, ``<output_dir>/<name>.<format>``: ``png`` (default;
  raw samples only as 1 to 4 x uint8), ``tif``/``tiff`` or ``npy``, each
  written atomically by :func:`wsitool.export.write_image` (on Dask, by the
  workers);
* with ``pack``, one store ``<output_dir>/<slide stem>-regions.<npz|zarr>``:
  ``npz`` (default; one uncompressed ``.npy`` member per region, key = name)
  or ``zarr`` (a Zarr group, one array per region), written by this process
  (the arrays travel back from the workers) under a temporary name and
  renamed when complete; only the regions that were read are in it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidRegionError, WsiError
from ..export import write_image
from ..ground import outputs as atomic
from ..opening import Location
from ..read.request import validate_request
from ..slide import Slide, open_slide, pyramid_levels
from ..types import Mode, OnError
from .cluster import BatchOptionError, ClientHandle, check_scheduler, error_record, import_distributed, quiet_tifffile
from .held import cached_slide
from .pack import PackWriter
from .regions_csv import RegionRequest, check_name, load_regions_csv


@dataclasses.dataclass
class RegionOutcome:
    """Result of one region of :func:`read_regions`.

    ``status`` is ``"ok"`` or ``"failed"``; ``path`` is the file written (or
    the pack store); ``shape`` the array shape ``(height, width, channels)``;
    ``error`` / ``error_types`` the message and exception class names of a
    failure.
    """

    request: RegionRequest
    status: str
    path: str | None = None
    shape: tuple[int, ...] | None = None
    error: str | None = None
    error_types: tuple[str, ...] = ()


FILE_FORMATS = ("png", "tif", "tiff", "npy")


PACK_FORMATS = ("npz", "zarr")


@dataclasses.dataclass(frozen=True)
class _RegionTask:
    """One task of :func:`read_regions`, called with a batch of requests (picklable: the
    slide's location, its identity and numbers, never an open slide).

    ``location`` and ``stamp`` as :func:`~wsitool.distributed.held.cached_slide`; ``output_dir``
    and ``fmt``: the files written (``return_arrays``: none, the arrays come back for a pack);
    ``mode``, ``on_error``, ``threads``: as :meth:`Slide.read_region`; ``overwrite``:
    replace an existing file (never the slide's own).
    """

    location: Location
    stamp: Any
    output_dir: str
    fmt: str | None
    mode: Mode
    on_error: OnError
    threads: int = 1
    return_arrays: bool = False
    overwrite: bool = False

    def __call__(self, requests: Sequence[RegionRequest]) -> list[tuple[RegionOutcome, np.ndarray | None]]:
        """One ``(outcome, array or None)`` per request, in order; a failure is recorded, not raised."""
        quiet_tifffile()
        try:
            slide = cached_slide(self.location, self.stamp)
        except Exception as exc:
            msg, types = error_record(exc)
            return [(RegionOutcome(r, "failed", error=msg, error_types=types), None) for r in requests]
        results: list[tuple[RegionOutcome, np.ndarray | None]] = []
        for req in requests:
            try:
                results.append(self._one(slide, req))
            except Exception as exc:
                msg, types = error_record(exc)
                results.append((RegionOutcome(req, "failed", error=msg, error_types=types), None))
        return results

    def _one(self, slide: Slide, req: RegionRequest) -> tuple[RegionOutcome, np.ndarray | None]:
        arr = slide.read_region((req.x, req.y), req.level, (req.width, req.height),
                                mode=self.mode, threads=self.threads, on_error=self.on_error)
        if self.return_arrays:
            return RegionOutcome(req, "ok", shape=arr.shape), arr
        dest = Path(self.output_dir) / f"{req.name}.{self.fmt}"
        write_image(dest, arr, overwrite=self.overwrite,
                    sources=() if self.location.remote else (self.location.target,))
        return RegionOutcome(req, "ok", path=str(dest), shape=arr.shape), None


def read_regions(slide: Slide | str | os.PathLike, regions: Iterable[RegionRequest] | str | os.PathLike,
                 output_dir: str | os.PathLike, *, format: str | None = None, pack: bool = False,
                 mode: Mode = "rgba", on_error: OnError = "raise", scheduler: Any = None, workers: int | None = None,
                 batch_size: int | None = None, progress: Callable[[RegionOutcome], None] | None = None,
                 overwrite: bool = False, storage_options: dict | None = None) -> list[RegionOutcome]:
    """Read many regions of one slide and write them to ``output_dir`` (see the module docstring).

    Each region is read exactly as one :meth:`Slide.read_region` call with the same
    ``mode`` and ``on_error`` (its pixels equal a single read).  Every request and
    every output is checked before any region is read.

    Args:
        slide: an open :class:`~wsitool.slide.Slide`, a path, a slide URL or a
            :class:`~wsitool.opening.Location`.
        regions: :class:`RegionRequest` objects, or a CSV file (:func:`load_regions_csv`).
        output_dir: folder for the outputs (created if absent; its parent must exist).
        format: ``"png"`` (default), ``"tif"``/``"tiff"`` or ``"npy"``; with ``pack``:
            ``"npz"`` (default) or ``"zarr"`` (needs the ``zarr`` package).
        pack: one store ``<output_dir>/<slide stem>-regions.<npz|zarr>`` instead of one file per region.
        mode: ``"rgba"`` (default), ``"rgb"`` or ``"raw"``, as :meth:`Slide.read_region`.
        on_error: ``"raise"`` (a corrupt tile fails its region) or ``"fill"``.
        scheduler: ``None`` or ``"threads"`` (default: a local pool of ``workers`` threads,
            default CPU count), ``"local"``, ``"tcp://HOST:PORT"`` or a ``distributed.Client``.
        workers: threads of the local pool (ignored on Dask).
        batch_size: regions per Dask task (default: ~4 tasks per worker thread, at most 64).
        progress: called with each :class:`RegionOutcome` as it completes.
        overwrite: replace outputs that exist (never the slide); without it an existing
            output refuses the whole batch before anything is read or written.
        storage_options: for a slide URL, as :func:`~wsitool.slide.open_slide`; carried in
            every task on the slide's location (an open Slide's own location is used).

    Returns:
        One :class:`RegionOutcome` per request, in request order; a region that fails
        (a bad tile) is reported there with its error and does not stop the others.

    Raises:
        BatchOptionError: unknown ``format`` or ``scheduler``.
        InvalidRegionError: a bad request (level, mode, name), the region named.
        ResourceLimitError: a region over the configured size limits.
        DaskUnavailableError: a Dask scheduler without Dask installed.
        FileNotFoundError, UnsupportedFormatError, CorruptFileError: the slide cannot be opened.
        OutputIsSourceError, OutputExistsError: an output would be the slide, or exists
            without ``overwrite`` (the first one named).
    """
    fmt = _output_format(format, pack, on_error)
    check_scheduler(scheduler, ("threads",))
    requests = load_regions_csv(regions) if isinstance(regions, (str, os.PathLike)) else list(regions)
    src = _checked_source(slide, requests, fmt, mode, storage_options)
    out_dir = Path(output_dir)
    dests = _prepare_outputs(src, requests, out_dir, fmt, pack=pack, overwrite=overwrite)
    task = _RegionTask(src.location, src.stamp, str(out_dir.resolve()), None if pack else fmt, mode, on_error,
                       return_arrays=pack, overwrite=overwrite)
    with _Collector(PackWriter(dests[0], fmt, src.sources, overwrite) if pack else None, progress) as collect:
        if scheduler in (None, "threads"):
            _run_on_threads(task, requests, workers, collect)
        else:
            _run_on_dask(task, requests, scheduler, batch_size, out_dir, collect)
    return [collect.outcomes[r.name] for r in requests]


# ------------------------------------------------------------------ steps of read_regions


@dataclasses.dataclass(frozen=True)
class _Source:
    """The slide as the tasks open it: its location (a local path made absolute) and identity;
    ``sources``: the local files no output may be."""

    location: Location
    stamp: Any
    sources: tuple[str, ...]


def _output_format(format: str | None, pack: bool, on_error: str) -> str:
    """The checked, lower-case output format (``pack``: npz by default, else png)."""
    if on_error not in ("raise", "fill"):
        raise InvalidRegionError(f"on_error must be 'raise' or 'fill', got {on_error!r}")
    if pack:
        fmt = (format or "npz").lower()
        if fmt not in PACK_FORMATS:
            raise BatchOptionError(f"pack format must be one of {PACK_FORMATS}, got {format!r}")
    else:
        fmt = (format or "png").lower()
        if fmt not in FILE_FORMATS:
            raise BatchOptionError(f"format must be one of {FILE_FORMATS}, got {format!r}")
    return fmt


def _checked_source(slide: Slide | str | os.PathLike, requests: list[RegionRequest], fmt: str, mode: str,
                    storage_options: dict | None) -> _Source:
    """Open ``slide`` (unless open: then its own location, options included, is used), check every
    request against it, and say how the tasks open it."""
    own = not isinstance(slide, Slide)
    s = slide if isinstance(slide, Slide) else open_slide(slide, storage_options=storage_options)
    try:
        location = s.location.resolved()
        _check_requests(s, requests, fmt, mode, str(location))
    finally:
        if own:
            s.close()
    local = () if location.remote else (location.target, s.path)
    return _Source(location, s.identity, local)


def _check_requests(s: Slide, requests: list[RegionRequest], fmt: str, mode: str, shown: str) -> None:
    """Every request valid for ``s`` (the message names the region), names unique, raw PNG possible."""
    names: set[str] = set()
    for i, r in enumerate(requests):
        where = f"region {r.name!r}"
        check_name(r.name, where)
        if r.name in names:
            raise InvalidRegionError(f"{shown}: duplicate region name {r.name!r}")
        names.add(r.name)
        try:
            lv, *_ = validate_request(pyramid_levels(s), (r.x, r.y), r.level, (r.width, r.height), mode)
        except WsiError as exc:
            raise type(exc)(f"{s.path}: {exc} ({where}, #{i + 1})") from None
        if fmt == "png" and mode == "raw" and (lv.dtype != np.uint8 or lv.samples > 4):
            raise InvalidRegionError(
                f"{shown}: level {lv.index} has {lv.samples} x {lv.dtype} samples; PNG cannot "
                f"hold them in raw mode (use --format npy or tif) ({where})"
            )


def _prepare_outputs(src: _Source, requests: list[RegionRequest], out_dir: Path, fmt: str, *, pack: bool,
                     overwrite: bool) -> list[Path]:
    """The output paths, every one checked before anything is read or written (:mod:`wsitool.ground.outputs`):
    none may be the slide, existing ones only with ``overwrite``; the folder made, stale partials removed."""
    dests = ([out_dir / f"{src.location.stem}-regions.{fmt}"] if pack
             else [out_dir / f"{r.name}.{fmt}" for r in requests])
    if out_dir.is_dir():
        for dest in dests:
            atomic.check_output(dest, src.sources, overwrite, kind="dir" if fmt == "zarr" else "file")
    out_dir.mkdir(exist_ok=True)  # the output folder, in a folder that must exist
    atomic.clean_stale_partials(out_dir)
    return dests


class _Collector:
    """Takes the results of the tasks as they complete: the outcomes by name, the arrays into the
    pack store (if any), ``progress`` per outcome.  As a context manager: the store is committed
    when the block ends normally, removed when it ends by an exception."""

    def __init__(self, writer: PackWriter | None, progress: Callable[[RegionOutcome], None] | None):
        self.writer = writer
        self.progress = progress
        self.outcomes: dict[str, RegionOutcome] = {}

    def __call__(self, batch_results: list[tuple[RegionOutcome, np.ndarray | None]]) -> None:
        for outcome, arr in batch_results:
            if self.writer is not None and outcome.status == "ok":
                assert arr is not None  # a pack task returns the arrays
                self.writer.add(outcome.request.name, arr)
                outcome.path = str(self.writer.dest)
            self.outcomes[outcome.request.name] = outcome
            if self.progress is not None:
                self.progress(outcome)

    def __enter__(self) -> _Collector:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        writer, self.writer = self.writer, None
        if writer is None:
            return
        if exc_type is not None:
            writer.abort()
            return
        try:
            writer.commit()
        except BaseException:
            writer.abort()
            raise


def _run_on_threads(task: _RegionTask, requests: list[RegionRequest], workers: int | None,
                    collect: _Collector) -> None:
    """One region per thread-pool task, at most 4 per thread queued; each runs in a copy of the caller's
    context (its limits)."""
    n = max(1, workers or os.cpu_count() or 1)
    window = 4 * n
    it = iter(requests)
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="wsitool-regions") as pool:
        pending: set[Future] = set()
        while True:
            while len(pending) < window:
                req = next(it, None)
                if req is None:
                    break
                pending.add(pool.submit(contextvars.copy_context().run, task, [req]))
            if not pending:
                break
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                collect(fut.result())


def _run_on_dask(task: _RegionTask, requests: list[RegionRequest], scheduler: Any, batch_size: int | None,
                 out_dir: Path, collect: _Collector) -> None:
    """Batches of regions as Dask tasks, at most 2 per worker thread in flight."""
    with ClientHandle(scheduler, max(1, len(requests)), partials_in=out_dir) as handle:
        distributed = import_distributed()
        nthreads = handle.n_workers()
        bs = batch_size or max(1, min(64, len(requests) // (4 * nthreads) or 1))
        batches = [requests[i:i + bs] for i in range(0, len(requests), bs)]
        it = iter(batches)
        ac = distributed.as_completed()
        for _ in range(2 * nthreads):
            b = next(it, None)
            if b is None:
                break
            ac.add(handle.client.submit(task, b, pure=False))
        for fut in ac:
            collect(fut.result())
            fut.release()
            b = next(it, None)
            if b is not None:
                ac.add(handle.client.submit(task, b, pure=False))
