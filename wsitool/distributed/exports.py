"""Batch exports: many slides exported with :func:`wsitool.export.export_pyramid`, one task per slide (floor 7).

Resume: without ``overwrite``, re-running a batch resumes it.  An output that
the manifest (:data:`MANIFEST_NAME` in the output folder, see :class:`Manifest`)
records as complete for the same source path, size and mtime, the same options
and the same output size is ``"skipped"``; a recorded output that is stale
(source or options changed, output altered) is exported again and replaced; an
existing output no batch recorded is ``"failed"`` with
:class:`~wsitool.errors.OutputExistsError`.  Partials that this host's dead
processes left in the output folder are removed first
(:func:`wsitool.ground.outputs.clean_stale_partials`).
"""

from __future__ import annotations

import dataclasses
import errno
import glob as _glob
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..errors import OutputExistsError
from ..export import ExportResult, export_pyramid
from ..ground import outputs as atomic
from ..opening import parse_location
from ..storage import is_url, redact
from .cluster import (
    BatchOptionError,
    ClientHandle,
    check_scheduler,
    dask_available,
    error_record,
    import_distributed,
    quiet_tifffile,
)
from .manifest import MANIFEST_NAME, Manifest, source_stamp

FORMAT_SUFFIX = {"tiff": ".tiff", "ome-tiff": ".ome.tiff", "dzi": ".dzi", "dicom": ""}


@dataclasses.dataclass
class SlideOutcome:
    """Result of one slide of :func:`export_many`.

    ``status``: ``"ok"`` (exported now), ``"skipped"`` (the output already
    existed, complete) or ``"failed"`` (``error`` holds the message and
    ``error_types`` the exception class names); ``seconds``: wall time of
    the task; ``result``: the :class:`wsitool.export.ExportResult` of an
    ``"ok"`` export; ``worker``: where it ran.
    """

    source: str
    output: str
    status: str
    seconds: float = 0.0
    error: str | None = None
    error_types: tuple[str, ...] = ()
    result: ExportResult | None = None
    worker: str | None = None


def expand_sources(sources: Iterable[str | os.PathLike] = (),
                   from_list: str | os.PathLike | None = None) -> list[str]:
    """Input slide paths from arguments, glob patterns and a list file.

    A source that does not exist as a path and contains ``*``, ``?`` or ``[``
    is expanded as a glob pattern (sorted; ``**`` is recursive).  A list file
    has one path per line; blank lines and lines starting with ``#`` are
    ignored; relative paths are relative to the list file's folder.
    Duplicates (same absolute path) are kept once, first position wins.

    Raises:
        FileNotFoundError: the list file is missing, or a glob pattern matches
            nothing.
    """
    items: list[str] = []
    for src in sources:
        s = os.fspath(src)
        if is_url(s):  # a URL is one slide (a presigned URL's "?" is no pattern)
            items.append(s)
        elif not os.path.exists(s) and any(ch in s for ch in "*?["):
            matches = sorted(_glob.glob(s, recursive=True))
            if not matches:
                raise FileNotFoundError(errno.ENOENT, "the pattern matches no file", s)
            items.extend(matches)
        else:
            items.append(s)
    if from_list is not None:
        base = os.path.dirname(os.path.abspath(os.fspath(from_list)))
        with open(from_list, "rb") as fh:  # paths are bytes to the OS: any encoding is kept
            data = fh.read()
        if data.startswith(b"\xef\xbb\xbf"):
            data = data[3:]
        for raw in data.splitlines():
            line = os.fsdecode(raw).strip()
            if line and not line.startswith("#"):
                items.append(line if os.path.isabs(line) else os.path.join(base, line))
    seen: set[str] = set()
    out = []
    for item in items:
        key = item if is_url(item) else os.path.abspath(item)
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


def export_output_path(source: str | os.PathLike, output_dir: str | os.PathLike,
                       format: str = "tiff") -> Path:
    """Output path of ``source`` in a batch export: ``<output_dir>/<stem><suffix>``.

    ``stem`` is the file name without its extension (and without ``.ome``
    for ``.ome.tif[f]``); ``suffix`` is ``.tiff``, ``.ome.tiff`` or ``.dzi``
    for the formats ``tiff``, ``ome-tiff`` and ``dzi``, and none for ``dicom`` (the
    series' folder is ``<output_dir>/<stem>``).
    """
    if format not in FORMAT_SUFFIX:
        raise BatchOptionError(f"format must be one of {tuple(FORMAT_SUFFIX)}, got {format!r}")
    return Path(output_dir) / (parse_location(source).stem + FORMAT_SUFFIX[format])


def _progress_forwarder(index: int, topic: str | None,
                        local: Callable[[int, int, int], None] | None):
    """A ``progress(done, total)`` callback for one export, or None.

    In this process it calls ``local(index, done, total)``; on a Dask worker it
    logs ``(index, done, total)`` events to ``topic`` (at most every 0.25 s,
    plus the first and last), which the client receives through
    ``Client.subscribe_topic``.
    """
    if local is not None:
        return lambda done, total: local(index, done, total)
    if topic is None:
        return None
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):
        return None
    last = [0.0]

    def forward(done: int, total: int) -> None:
        now = time.monotonic()
        if done in (0, total) or now - last[0] >= 0.25:
            last[0] = now
            worker.log_event(topic, (index, done, total))

    return forward


def _export_task(source: str, output: str, options: dict, index: int = 0,
                 topic: str | None = None,
                 local_progress: Callable[[int, int, int], None] | None = None) -> SlideOutcome:
    """Dask task: export one slide by path; never raises (failures are recorded)."""

    quiet_tifffile()
    worker = f"{socket.gethostname()}:{os.getpid()}"
    t0 = time.perf_counter()
    try:
        result = export_pyramid(source, output, progress=_progress_forwarder(index, topic, local_progress),
                                **options)
        return SlideOutcome(source, output, "ok", time.perf_counter() - t0, result=result,
                            worker=worker)
    except Exception as exc:
        msg, types = error_record(exc)
        if redact(source) not in msg:
            msg = f"{redact(source)}: {msg}"
        return SlideOutcome(source, output, "failed", time.perf_counter() - t0, error=msg,
                            error_types=types, worker=worker)


def export_many(sources: Sequence[str | os.PathLike], output_dir: str | os.PathLike, *, scheduler=None,
                format: str = "tiff", threads: int | None = None, overwrite: bool = False,
                progress: Callable[[SlideOutcome], None] | None = None,
                tile_progress: Callable[[int, int, int], None] | None = None, **export_options) -> list[SlideOutcome]:
    """Export several slides into ``output_dir``, one task per slide: each by
    :func:`wsitool.export.export_pyramid` to :func:`export_output_path` (``<stem>.tiff`` etc.).

    Args:
        sources: slide paths (see :func:`expand_sources` for globs/lists).
        output_dir: output folder (created if absent).
        scheduler: ``"local"`` (a ``LocalCluster`` of ``min(len(sources), CPU count)``
            single-threaded worker processes; the default for more than one slide when Dask
            is installed), ``"sequential"`` (this process, one slide after another; the
            default for one slide or without Dask), ``"tcp://HOST:PORT"`` or a ``distributed.Client``.
        format: ``"tiff"``, ``"ome-tiff"`` or ``"dzi"``.
        threads: encode/decode threads per export (default: in this process the CPU count; on
            a cluster twice the CPU count of this machine divided by the number of concurrent
            exports, between 1 and the CPU count, so that the last long export can use cores left idle).
        overwrite: re-export slides whose output exists (never over a
            source).  Without it, a batch run again resumes (module notes).
        progress: called with each :class:`SlideOutcome` as it finishes (in
            completion order).
        tile_progress: called as ``tile_progress(index, tiles_done, tiles_total)`` while slide
            ``sources[index]`` is written (forwarded from Dask workers as events of a per-batch
            topic, about 4 times a second per slide; called from the client's event-loop thread).
        **export_options: passed to ``export_pyramid`` (``tile_size``, ``compression``, ``quality``,
            ``region``, ``level``, ``overlap``, ``background``, ``max_pixels``, ...: the fields of
            :class:`~wsitool.export.ExportOptions`).  ``progress`` of a single export is not forwarded.

    Returns:
        One :class:`SlideOutcome` per source, in input order.  A slide whose export raises (corrupt
        file, unsupported format, crash of a worker) is ``"failed"`` with its message; the others run.

    Raises:
        BatchOptionError: bad format or scheduler, or two sources mapping to
            the same output name.
        DaskUnavailableError: a Dask scheduler without Dask installed.
        WsiError: the scheduler address cannot be reached.
    """
    srcs = [os.fspath(s) for s in sources]
    out_dir = Path(output_dir)
    outputs = _batch_outputs(srcs, out_dir, format)
    if scheduler is None:
        scheduler = "local" if len(srcs) > 1 and dask_available() else "sequential"
    check_scheduler(scheduler, ("sequential",))
    out_dir.mkdir(exist_ok=True)  # the output folder, in a folder that must exist
    # Resume (item: the manifest): skip only what an earlier batch recorded as
    # complete for the same source file and options; litter of dead runs goes.
    atomic.clean_stale_partials(out_dir)
    batch = _Batch(srcs, outputs, format, dict(export_options, format=format, overwrite=overwrite),
                   Manifest(out_dir), progress)
    batch.plan(overwrite)
    if scheduler == "sequential" or not batch.todo:
        _run_here(batch, threads, tile_progress)
    else:
        with ClientHandle(scheduler, len(batch.todo), partials_in=out_dir) as handle:
            _run_on_cluster(batch, handle, threads, tile_progress)
    return batch.outcomes()


def _batch_outputs(srcs: list[str], out_dir: Path, format: str) -> list[Path]:
    """The output path of each source (:func:`export_output_path`).

    Raises:
        BatchOptionError: a bad format, or two sources mapping to the same output.
    """
    outputs = [export_output_path(s, out_dir, format) for s in srcs]
    by_output: dict[Path, str] = {}
    for s, o in zip(srcs, outputs, strict=True):
        if o in by_output:
            raise BatchOptionError(
                f"{s} and {by_output[o]} would both be exported to {o}; rename one or export them "
                "to different folders"
            )
        by_output[o] = s
    return outputs


@dataclasses.dataclass
class _Batch:
    """The state of one :func:`export_many`: the slides, their outputs, the options (one dict,
    given to every task and recorded in the manifest), the plan of each slide (``"skip"``,
    ``"exists"``, ``"replace"`` or a fresh export: :meth:`Manifest.plan`), the slides left
    to export and the outcomes so far."""

    srcs: list[str]
    outputs: list[Path]
    format: str
    options: dict
    manifest: Manifest
    progress: Callable[[SlideOutcome], None] | None
    stamps: list = dataclasses.field(default_factory=list)
    plans: dict[int, str] = dataclasses.field(default_factory=dict)
    results: dict[int, SlideOutcome] = dataclasses.field(default_factory=dict)
    todo: list[int] = dataclasses.field(default_factory=list)

    def plan(self, overwrite: bool) -> None:
        """The outcome of the slides skipped (complete) or failed (an output no batch
        recorded) now, reported through ``progress``; the others go to ``todo``."""
        self.stamps = [source_stamp(s) for s in self.srcs]
        for i, (s, o) in enumerate(zip(self.srcs, self.outputs, strict=True)):
            self.plans[i] = self.manifest.plan(s, o, self.format, self.options, overwrite)
            if self.plans[i] == "skip":
                self.results[i] = SlideOutcome(s, str(o), "skipped")
            elif self.plans[i] == "exists":
                exc = OutputExistsError(o, "exists and no earlier batch recorded it as complete "
                                           f"(in {MANIFEST_NAME}); use --overwrite / overwrite=True")
                msg, types = error_record(exc)
                self.results[i] = SlideOutcome(s, str(o), "failed", error=msg, error_types=types)
            else:
                self.todo.append(i)
            if i in self.results and self.progress is not None:
                self.progress(self.results[i])

    def task_options(self, i: int) -> dict:
        """The export options of slide ``i`` (an output recorded stale is replaced)."""
        return dict(self.options, overwrite=self.plans[i] == "replace")

    def finished(self, i: int, outcome: SlideOutcome) -> None:
        """Slide ``i`` is done: its outcome kept, recorded complete if ok, reported."""
        self.results[i] = outcome
        if outcome.status == "ok":
            self.manifest.record(self.srcs[i], self.outputs[i], self.format, self.options, self.stamps[i])
        if self.progress is not None:
            self.progress(outcome)

    def outcomes(self) -> list[SlideOutcome]:
        """One outcome per source, in input order."""
        return [self.results[i] for i in range(len(self.srcs))]


def _run_here(batch: _Batch, threads: int | None,
              tile_progress: Callable[[int, int, int], None] | None) -> None:
    """Run the slides of ``batch.todo`` in this process, one after another."""
    batch.options["threads"] = threads
    for i in batch.todo:
        batch.finished(i, _export_task(batch.srcs[i], str(batch.outputs[i]), batch.task_options(i), i,
                                       local_progress=tile_progress))


def _run_on_cluster(batch: _Batch, handle: ClientHandle, threads: int | None,
                    tile_progress: Callable[[int, int, int], None] | None) -> None:
    """Run the slides of ``batch.todo`` as Dask tasks on ``handle``'s client, largest first;
    tile progress forwarded through a per-batch event topic."""
    cpus = os.cpu_count() or 1
    # Two threads per core in all: when one long export is the last one
    # running, it can still use the cores the idle workers left.
    running = min(len(batch.todo), handle.n_workers())
    batch.options["threads"] = threads or min(cpus, max(1, 2 * cpus // max(1, running)))
    topic = None
    finished: set[int] = set()
    if tile_progress is not None:
        topic = f"wsitool-export-progress-{os.getpid()}-{time.time_ns()}"

        def on_event(event) -> None:
            _ts, (index, done, total) = event
            if done == total:
                finished.add(index)
            tile_progress(index, done, total)

        handle.client.subscribe_topic(topic, on_event)
    futures = {_submit(batch, handle, i, topic): i for i in batch.todo}
    distributed = import_distributed()
    for fut in distributed.as_completed(list(futures)):
        i = futures[fut]
        src, out = batch.srcs[i], str(batch.outputs[i])
        try:
            outcome = fut.result()
            outcome.source, outcome.output = src, out
        except Exception as exc:  # worker died (KilledWorker), cancelled, ...
            msg, types = error_record(exc)
            outcome = SlideOutcome(src, out, "failed", error=f"{src}: {msg}", error_types=types)
        batch.finished(i, outcome)
    if topic is not None:
        # the last events may arrive just after the results: wait briefly for them
        ok = {i for i, o in batch.results.items() if o.status == "ok"}
        deadline = time.monotonic() + 2.0
        while not ok <= finished and time.monotonic() < deadline:
            time.sleep(0.02)
        handle.client.unsubscribe_topic(topic)


def _submit(batch: _Batch, handle: ClientHandle, i: int, topic: str | None) -> Any:
    """Submit the export of slide ``i`` (a Dask future)."""
    s, o = batch.srcs[i], batch.outputs[i]
    # Largest files first (higher priority runs earlier), so one big
    # slide does not start last and keep a single worker busy alone.
    try:
        priority = os.path.getsize(s)
    except OSError:
        priority = 0
    # (storage options for URL sources travel in the task's options, to every worker)
    return handle.client.submit(_export_task, s if is_url(s) else os.path.abspath(s),
                                str(o.resolve()), batch.task_options(i),
                                i, topic, pure=False, priority=priority,
                                key=f"wsitool-export-{i}-{os.path.basename(s)}-{time.time_ns()}")
