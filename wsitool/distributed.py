"""Scale-out: lazy Dask arrays of levels, batch region reads and batch exports.

Three ways to spread slide work over many cores or machines, all through
Dask (``dask.distributed`` for clusters) rather than a scheduler of our own:

* :func:`level_to_dask` (``Slide.to_dask``): a level as a lazy
  ``dask.array.Array`` of shape ``(height, width, 3)`` uint8.  Each chunk is
  one :meth:`Slide.read_region` call (``mode="rgb"``).
* :func:`read_regions`: many regions of one slide (e.g. from a CSV file, see
  :func:`load_regions_csv`) read on a local thread pool or on a Dask cluster,
  written one file per region or packed into one ``.npz`` / Zarr store.
* :func:`export_many`: many slides exported with
  :func:`wsitool.export.export_pyramid`, one Dask task per slide, on a
  ``LocalCluster`` sized to the machine or on an existing cluster; one slide's
  failure is recorded and does not stop the others; completed outputs are
  skipped on a re-run (resume).

Pickling rule: task graphs carry slide *paths* and plain numbers only, never an
open :class:`~wsitool.slide.Slide`, file handle or decoder, so they run on
remote workers.  Each worker process opens a slide once and keeps it in a
small cache keyed by ``(path, mtime_ns, size)`` (:func:`cached_slide`); a task
built for one version of a file refuses to read a file changed since
(:class:`~wsitool.errors.WsiError`).

Dask is an optional extra (``pip install "wsitool[dask]"``, i.e.
``dask[array]`` and ``distributed``); this module imports it only when a
function needs it.  Without it, :func:`read_regions` runs on threads,
:func:`export_many` runs the slides one after another in this process, and
asking for a cluster (``scheduler="local"`` or ``"tcp://..."``) raises
:class:`DaskUnavailableError`.

Scheduler values accepted by :func:`read_regions` and :func:`export_many`:

* ``None``: the default of each function (see there).
* ``"threads"`` (regions) / ``"sequential"`` (exports): this process only.
* ``"local"``: a new ``dask.distributed.LocalCluster`` of worker *processes*,
  one thread each, at most one worker per CPU core (and per task), closed at
  the end.
* ``"tcp://HOST:PORT"`` (or any address ``distributed.Client`` accepts,
  e.g. ``tls://``): an existing scheduler; the paths must be readable and the
  output folder writable from the workers (shared file system).
* a ``distributed.Client`` instance: used as is, not closed.
"""

from __future__ import annotations

import csv
import dataclasses
import errno
import functools
import glob as _glob
import os
import re
import threading
import time
import zipfile
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DaskUnavailableError, InvalidRegionError, WsiError
from .read.lazy import INSTALL_HINT, import_dask_array as _import_dask_array, level_array
from .read.request import validate_request
from .slide import Slide, cached_slide, chunk_read_count, file_stamp, open_slide, read_chunk_by_path

__all__ = [
    "DaskUnavailableError",
    "BatchOptionError",
    "cached_slide",
    "level_to_dask",
    "RegionRequest",
    "RegionOutcome",
    "load_regions_csv",
    "read_regions",
    "SlideOutcome",
    "expand_sources",
    "export_output_path",
    "export_many",
    "chunk_read_count",
]

class BatchOptionError(WsiError, ValueError):
    """A bad option of a batch call: unknown scheduler or format, or two
    sources that would be written to the same output (a usage error)."""


def _import_distributed():
    try:
        import distributed
    except ImportError as exc:
        raise DaskUnavailableError(f"a Dask cluster needs dask.distributed ({exc}); {INSTALL_HINT}") from None
    return distributed


def dask_available() -> bool:
    """True when both ``dask.array`` and ``distributed`` import."""
    try:
        import dask.array  # noqa: F401
        import distributed  # noqa: F401
    except ImportError:
        return False
    return True


def level_to_dask(slide, level: int = 0, *, chunks="tile", threads: int = 1):
    """A level of a slide as a lazy ``dask.array.Array`` ``(height, width, 3)`` uint8.

    Args:
        slide: an open :class:`~wsitool.slide.Slide` or a path.  Only its path
            goes into the graph; each worker process opens it once
            (:func:`~wsitool.slide.cached_slide`).
        level, chunks, threads: as :func:`wsitool.read.lazy.level_array`.

    Raises:
        DaskUnavailableError: ``dask[array]`` is not installed.
        InvalidRegionError: bad level or chunks.
        WsiError: at compute time, the file changed since the array was built.
    """
    if isinstance(slide, Slide):
        path = os.path.abspath(slide.path)
        lvls = slide.levels
    else:
        path = os.path.abspath(os.fspath(slide))
        lvls = cached_slide(path).levels
    return level_array(lvls, path, level, read_chunk_by_path, stamp=file_stamp(path),
                       chunks=chunks, threads=threads)


# ---------------------------------------------------------------------------
# Dask clients
# ---------------------------------------------------------------------------


class _ClientHandle:
    """A distributed Client, plus the LocalCluster we started (closed on exit).

    ``partials_in``: the output folder of the tasks.  When the block ends by an
    exception (Ctrl-C, SIGTERM / SIGHUP through :mod:`wsitool.signals`, a
    failure), the LocalCluster is closed, which ends its worker processes in
    the middle of their writes; the temporary outputs they leave there are then
    removed (:func:`wsitool.atomic.clean_stale_partials`: this host, dead
    processes only).
    """

    def __init__(self, scheduler, n_tasks: int, partials_in: str | os.PathLike | None = None):
        distributed = _import_distributed()
        self.cluster = None
        self.owned = True
        self.partials_in = partials_in
        self._scratch: str | None = None
        if isinstance(scheduler, distributed.Client):
            self.client = scheduler
            self.owned = False
        elif scheduler == "local":
            import logging

            import tempfile

            n = max(1, min(n_tasks, os.cpu_count() or 1))
            # The workers' scratch space in a folder of our own, removed on exit
            # even when they were stopped mid-task (Dask leaves lock files then).
            self._scratch = tempfile.mkdtemp(prefix="wsitool-dask-")
            try:
                import dask

                with dask.config.set({"temporary-directory": self._scratch}):
                    self.cluster = distributed.LocalCluster(
                        n_workers=n, threads_per_worker=1, processes=True,
                        dashboard_address=":0", silence_logs=logging.ERROR,
                        local_directory=self._scratch,
                    )
                self.client = distributed.Client(self.cluster)
            except BaseException:
                if self.cluster is not None:
                    self.cluster.close()
                _rmtree_quiet(self._scratch)
                raise
        else:
            try:
                self.client = distributed.Client(str(scheduler), timeout="10s")
            except (OSError, TimeoutError) as exc:
                raise WsiError(f"cannot connect to the Dask scheduler at {scheduler}: {exc}") from None

    def n_workers(self) -> int:
        try:
            return max(1, sum(w.get("nthreads", 1) for w in
                              self.client.scheduler_info().get("workers", {}).values()))
        except Exception:
            return 1

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.owned:
            try:
                self.client.close()
            finally:
                if self.cluster is not None:
                    self.cluster.close()
                    if exc_type is not None and self.partials_in is not None:
                        from . import atomic

                        atomic.clean_stale_partials(self.partials_in)
                if self._scratch is not None:
                    _rmtree_quiet(self._scratch)


def _rmtree_quiet(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _is_client(obj) -> bool:
    return type(obj).__name__ == "Client" and hasattr(obj, "submit")


def _check_scheduler(scheduler, allowed_local: tuple[str, ...]) -> None:
    if scheduler is None or _is_client(scheduler):
        return
    if not isinstance(scheduler, str) or not scheduler:
        raise BatchOptionError(f"scheduler must be a string or a distributed.Client, got {scheduler!r}")
    if scheduler in allowed_local or scheduler == "local" or "://" in scheduler:
        if (scheduler == "local" or "://" in scheduler) and not dask_available():
            raise DaskUnavailableError(f"scheduler {scheduler!r} needs dask.distributed; {INSTALL_HINT}")
        return
    raise BatchOptionError(
        f"unknown scheduler {scheduler!r} (use {', '.join(allowed_local)}, local, "
        "or a scheduler address such as tcp://HOST:PORT)"
    )


def _quiet_tifffile() -> None:
    """Silence tifffile's warnings in worker processes, as the CLI does in its own."""
    import logging

    logging.getLogger("tifffile").setLevel(logging.ERROR)


def _error_record(exc: BaseException) -> tuple[str, tuple[str, ...]]:
    """``(message, class names of the exception's MRO)`` — picklable, for reports."""
    msg = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and not isinstance(exc, WsiError) and exc.strerror:
        msg = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return msg, tuple(c.__name__ for c in type(exc).__mro__)


# ---------------------------------------------------------------------------
# Batch region reading
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RegionRequest:
    """One region to read: ``x``, ``y`` level-0 pixels; ``level``; ``width``,
    ``height`` in pixels of that level; ``name`` of its output (no extension)."""

    x: int
    y: int
    level: int
    width: int
    height: int
    name: str


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


#: Characters allowed in a region name (it becomes a file name): letters and
#: digits of any script, space, and ``_ - . + = , @ ( )``; first character a
#: letter, digit or ``_``; no trailing space or dot; at most
#: :data:`MAX_NAME_BYTES` bytes of UTF-8.
NAME_PUNCTUATION = " _-.+=,@()"
MAX_NAME_BYTES = 150
_REQUIRED = ("x", "y", "level", "width", "height")
_FILE_FORMATS = ("png", "tif", "tiff", "npy")
_PACK_FORMATS = ("npz", "zarr")


def _name_ok(name: str) -> bool:
    if not name or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return False
    if not (name[0].isalnum() or name[0] == "_") or name[-1] in " .":
        return False
    return all(ch.isalnum() or ch in NAME_PUNCTUATION for ch in name)


def _check_name(name: str, where: str) -> str:
    """Refuse a region name outside the safe set (:data:`NAME_PUNCTUATION`) with ``where``."""
    if not isinstance(name, str) or not _name_ok(name):
        raise InvalidRegionError(
            f"{where}: invalid region name {name!r} (allowed: letters, digits, space and "
            f"{NAME_PUNCTUATION.strip()}; starting with a letter, digit or _; at most "
            f"{MAX_NAME_BYTES} bytes)"
        )
    return name


def _decode_text(data: bytes, path: str, what: str) -> str:
    """``data`` decoded as UTF-8 (a BOM allowed), or InvalidRegionError naming the line."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InvalidRegionError(
            f"{path}: line {line}: {what} is not UTF-8 text (byte 0x{data[exc.start]:02x}); "
            "save it as UTF-8"
        ) from None


def load_regions_csv(path: str | os.PathLike) -> list[RegionRequest]:
    """Read region requests from a CSV file with a header row.

    Columns (any order, names case-insensitive): ``x``, ``y`` (level-0 pixels),
    ``level``, ``width``, ``height`` (pixels of that level), and optionally
    ``name`` (output file name without extension; default
    ``NNNNNN_x<X>_y<Y>_L<level>_<W>x<H>`` with the 1-based data row number).
    Blank lines are ignored.

    Returns:
        The requests in file order.

    Raises:
        FileNotFoundError: no such file.
        InvalidRegionError: text that is not UTF-8, a row that is not CSV, a
            missing column, a value that is not an integer, a non-positive
            width/height or negative level, an invalid (see
            :data:`NAME_PUNCTUATION`) or duplicate name — the message names the
            file and line.
    """
    path = os.fspath(path)
    out: list[RegionRequest] = []
    seen: dict[str, int] = {}
    import io

    with open(path, "rb") as fb:
        text = _decode_text(fb.read(), path, "the regions file")
    reader = csv.reader(io.StringIO(text, newline=""))
    header = None
    try:
        for row in reader:
            if not row or all(not c.strip() for c in row):
                continue
            if header is None:
                header = [c.strip().lower() for c in row]
                missing = [c for c in _REQUIRED if c not in header]
                if missing:
                    raise InvalidRegionError(
                        f"{path}: line {reader.line_num}: missing column(s) {', '.join(missing)} "
                        f"(the header must name x, y, level, width, height and optionally name)"
                    )
                continue
            where = f"{path}: line {reader.line_num}"
            if len(row) < len(header):
                row = row + [""] * (len(header) - len(row))
            rec = dict(zip(header, (c.strip() for c in row)))
            vals = {}
            for col in _REQUIRED:
                try:
                    vals[col] = int(rec[col])
                except ValueError:
                    raise InvalidRegionError(
                        f"{where}: column {col} must be an integer, got {rec[col]!r}"
                    ) from None
            if vals["width"] <= 0 or vals["height"] <= 0:
                raise InvalidRegionError(
                    f"{where}: width and height must be positive, got {vals['width']}x{vals['height']}"
                )
            if vals["level"] < 0:
                raise InvalidRegionError(f"{where}: level must be >= 0, got {vals['level']}")
            n = len(out) + 1
            name = rec.get("name") or (
                f"{n:06d}_x{vals['x']}_y{vals['y']}_L{vals['level']}_{vals['width']}x{vals['height']}"
            )
            _check_name(name, where)
            if name in seen:
                raise InvalidRegionError(f"{where}: duplicate region name {name!r} (also on line {seen[name]})")
            seen[name] = reader.line_num
            out.append(RegionRequest(name=name, **vals))
    except csv.Error as exc:  # a NUL byte, an unterminated quote at the end, a huge field
        raise InvalidRegionError(f"{path}: line {reader.line_num}: not a valid CSV row ({exc})") from None
    if header is None:
        raise InvalidRegionError(f"{path}: empty regions file (expected a header x,y,level,width,height[,name])")
    return out


def _region_task(path: str, stamp, requests: Sequence[RegionRequest], output_dir: str | None,
                 fmt: str | None, mode: str, on_error: str, threads: int,
                 return_arrays: bool, overwrite: bool = False) -> list[tuple[RegionOutcome, np.ndarray | None]]:
    """Read a batch of regions of one slide; write files (never over the slide ``path``;
    an existing file only with ``overwrite``) or return the arrays."""
    _quiet_tifffile()
    results = []
    try:
        slide = cached_slide(path, stamp)
    except Exception as exc:
        msg, types = _error_record(exc)
        return [(RegionOutcome(r, "failed", error=msg, error_types=types), None) for r in requests]
    from .export import write_image

    for req in requests:
        try:
            arr = slide.read_region((req.x, req.y), req.level, (req.width, req.height),
                                    mode=mode, threads=threads, on_error=on_error)
            if return_arrays:
                results.append((RegionOutcome(req, "ok", shape=arr.shape), arr))
            else:
                dest = Path(output_dir) / f"{req.name}.{fmt}"
                write_image(dest, arr, overwrite=overwrite, sources=(path,))
                results.append((RegionOutcome(req, "ok", path=str(dest), shape=arr.shape), None))
        except Exception as exc:
            msg, types = _error_record(exc)
            results.append((RegionOutcome(req, "failed", error=msg, error_types=types), None))
    return results


class _PackWriter:
    """Write arrays one by one into ``<dest>`` (.npz zip or Zarr group), atomically.

    The store is made as a :mod:`wsitool.atomic` partial (an exclusive new file,
    or a fresh folder for Zarr) and renamed onto ``dest`` by :meth:`commit`.
    """

    def __init__(self, dest: Path, fmt: str, sources=(), overwrite: bool = False):
        from . import atomic

        self.dest = dest
        self.fmt = fmt
        self.overwrite = overwrite
        self._fh = None
        if fmt == "npz":
            self.partial, self._fh = atomic.open_file(dest, sources, read=True)
            try:
                self._zip = zipfile.ZipFile(self._fh, "w", compression=zipfile.ZIP_STORED,
                                            allowZip64=True)
            except BaseException:
                self.abort()
                raise
        else:
            try:
                import zarr
            except ImportError:
                raise DaskUnavailableError(
                    "--pack with format zarr needs the zarr package (pip install zarr)"
                ) from None
            self._zarr = zarr
            self.partial = atomic.create_dir(dest, sources)
            try:
                self._group = zarr.open_group(str(self.partial.path), mode="a")
            except BaseException:
                self.abort()
                raise
        self.tmp = self.partial.path

    def add(self, name: str, arr: np.ndarray) -> None:
        if self.fmt == "npz":
            with self._zip.open(f"{name}.npy", "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.ascontiguousarray(arr), allow_pickle=False)
        elif hasattr(self._group, "create_array"):  # zarr >= 3
            z = self._group.create_array(name, shape=arr.shape, dtype=arr.dtype,
                                         chunks=(min(arr.shape[0], 512), min(arr.shape[1], 512), arr.shape[2]))
            z[...] = arr
        else:  # pragma: no cover - zarr 2
            self._group.create_dataset(name, data=arr)

    def commit(self) -> None:
        if self.fmt == "npz":
            self._zip.close()
            self._fh.close()
        self.partial.commit(self.overwrite)

    def abort(self) -> None:
        if self.fmt == "npz":
            for closer in (getattr(self, "_zip", None), self._fh):
                try:
                    if closer is not None:
                        closer.close()
                except Exception:
                    pass
        self.partial.abort()


def _slide_stem(path: str) -> str:
    name = os.path.basename(path)
    for suffix in (".ome.tiff", ".ome.tif"):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    stem, _ext = os.path.splitext(name)
    return stem or name


def read_regions(slide, regions: Iterable[RegionRequest] | str | os.PathLike,
                 output_dir: str | os.PathLike, *, format: str | None = None,
                 pack: bool = False, mode: str = "rgba", on_error: str = "raise",
                 scheduler=None, workers: int | None = None, batch_size: int | None = None,
                 progress: Callable[[RegionOutcome], None] | None = None,
                 overwrite: bool = False) -> list[RegionOutcome]:
    """Read many regions of one slide and write them to ``output_dir``.

    Each region is read exactly as a single :meth:`Slide.read_region` call with
    the same ``mode`` and ``on_error`` (so its pixels equal a single read).

    Args:
        slide: an open :class:`~wsitool.slide.Slide` or a path (only the path
            is sent to workers).
        regions: :class:`RegionRequest` objects, or the path of a CSV file
            (:func:`load_regions_csv`).
        output_dir: folder for the outputs (created if absent).
        format: without ``pack``, the file type of each region ``<name>.<fmt>``:
            ``"png"`` (default), ``"tif"``/``"tiff"`` or ``"npy"``
            (written with :func:`wsitool.export.write_image`, atomically).  With
            ``pack``: ``"npz"`` (default; one ``.npy`` member per region, key =
            name, uncompressed) or ``"zarr"`` (a Zarr group, one array per
            region; needs the ``zarr`` package).
        pack: write one store ``<output_dir>/<slide stem>-regions.<npz|zarr>``
            instead of one file per region; written under a temporary name and
            renamed when complete, only regions that were read are in it.
        mode: ``"rgba"`` (default), ``"rgb"`` or ``"raw"``; arrays as
            :meth:`Slide.read_region`.  PNG cannot hold raw non-8-bit samples.
        on_error: ``"raise"`` (a corrupt tile fails its region) or ``"fill"``.
        scheduler: ``None`` or ``"threads"`` (default): a local thread pool of
            ``workers`` threads (default: CPU count); ``"local"``: a new Dask
            ``LocalCluster``; ``"tcp://HOST:PORT"``; or a ``distributed.Client``.
            On Dask, files are written by the workers; packed arrays travel
            back to this process, which writes the store.
        workers: threads of the local pool (ignored on Dask).
        batch_size: regions per Dask task (default: enough for ~4 tasks per
            worker thread, at most 64).
        progress: called with each :class:`RegionOutcome` as it completes.
        overwrite: replace outputs that exist (never the slide itself).
            Without it an existing output refuses the whole batch before
            anything is read or written.

    Returns:
        One :class:`RegionOutcome` per request, in request order.  A region
        that fails (bad tile, limit) is reported there with its error and does
        not stop the others.

    Raises:
        BatchOptionError: unknown ``format`` or ``scheduler``.
        InvalidRegionError: a bad request (level out of range, bad mode or
            name) — checked for every region before any is read, the
            message names the region.
        ResourceLimitError: a region over the configured size limits.
        DaskUnavailableError: a Dask scheduler without Dask installed.
        FileNotFoundError, UnsupportedFormatError, CorruptFileError: the slide
            cannot be opened.
        OutputIsSourceError: an output would be the slide (usage error), checked
            for every output before any region is read, the first one named.
        OutputExistsError: an output exists and ``overwrite`` is False (the
            first one named), checked likewise.
    """
    if on_error not in ("raise", "fill"):
        raise InvalidRegionError(f"on_error must be 'raise' or 'fill', got {on_error!r}")
    if pack:
        fmt = (format or "npz").lower()
        if fmt not in _PACK_FORMATS:
            raise BatchOptionError(f"pack format must be one of {_PACK_FORMATS}, got {format!r}")
    else:
        fmt = (format or "png").lower()
        if fmt not in _FILE_FORMATS:
            raise BatchOptionError(f"format must be one of {_FILE_FORMATS}, got {format!r}")
    _check_scheduler(scheduler, ("threads",))
    if isinstance(regions, (str, os.PathLike)):
        requests = load_regions_csv(regions)
    else:
        requests = list(regions)
    names: set[str] = set()
    own = not isinstance(slide, Slide)
    s = open_slide(slide) if own else slide
    try:
        path = os.path.abspath(s.path)
        for i, r in enumerate(requests):
            where = f"region {r.name!r}"
            _check_name(r.name, where)
            if r.name in names:
                raise InvalidRegionError(f"{path}: duplicate region name {r.name!r}")
            names.add(r.name)
            try:
                lv, *_ = validate_request(s.levels, s.path, (r.x, r.y), r.level, (r.width, r.height), mode)
            except WsiError as exc:
                raise type(exc)(f"{exc} ({where}, #{i + 1})") from None
            if fmt == "png" and mode == "raw" and (lv.dtype != np.uint8 or lv.samples > 4):
                raise InvalidRegionError(
                    f"{path}: level {lv.index} has {lv.samples} x {lv.dtype} samples; PNG cannot "
                    f"hold them in raw mode (use --format npy or tif) ({where})"
                )
    finally:
        if own:
            s.close()
    stamp = file_stamp(path)
    out_dir = Path(output_dir)
    from . import atomic

    # Every output checked before anything is read or written (wsitool.atomic):
    # none may be the slide; existing ones only with overwrite.
    sources = (path, os.fspath(s.path))
    if pack:
        dests = [out_dir / f"{_slide_stem(path)}-regions.{fmt}"]
    else:
        dests = [out_dir / f"{r.name}.{fmt}" for r in requests]
    if out_dir.is_dir():
        for dest in dests:
            atomic.check_output(dest, sources, overwrite, kind="dir" if fmt == "zarr" else "file")
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic.clean_stale_partials(out_dir)
    writer = _PackWriter(dests[0], fmt, sources, overwrite) if pack else None
    region_task = functools.partial(_region_task, overwrite=overwrite)
    outcomes: dict[str, RegionOutcome] = {}

    def collect(batch_results):
        for outcome, arr in batch_results:
            if writer is not None and outcome.status == "ok":
                writer.add(outcome.request.name, arr)
                outcome.path = str(writer.dest)
            outcomes[outcome.request.name] = outcome
            if progress is not None:
                progress(outcome)

    task_args = (str(out_dir.resolve()), None if pack else fmt, mode, on_error)
    try:
        if scheduler in (None, "threads"):
            n = max(1, workers or os.cpu_count() or 1)
            window = 4 * n
            it = iter(requests)
            with ThreadPoolExecutor(max_workers=n, thread_name_prefix="wsitool-regions") as pool:
                pending = set()
                while True:
                    while len(pending) < window:
                        req = next(it, None)
                        if req is None:
                            break
                        pending.add(pool.submit(region_task, path, stamp, [req], *task_args, 1, pack))
                    if not pending:
                        break
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in done:
                        collect(fut.result())
        else:
            with _ClientHandle(scheduler, max(1, len(requests)), partials_in=out_dir) as handle:
                distributed = _import_distributed()
                nthreads = handle.n_workers()
                bs = batch_size or max(1, min(64, len(requests) // (4 * nthreads) or 1))
                batches = [requests[i:i + bs] for i in range(0, len(requests), bs)]
                window = 2 * nthreads
                it = iter(batches)
                ac = distributed.as_completed()
                for _ in range(window):
                    b = next(it, None)
                    if b is None:
                        break
                    ac.add(handle.client.submit(region_task, path, stamp, b, *task_args, 1, pack,
                                                pure=False))
                for fut in ac:
                    collect(fut.result())
                    fut.release()
                    b = next(it, None)
                    if b is not None:
                        ac.add(handle.client.submit(region_task, path, stamp, b, *task_args, 1,
                                                    pack, pure=False))
        if writer is not None:
            writer.commit()
            writer = None
    finally:
        if writer is not None:
            writer.abort()
    return [outcomes[r.name] for r in requests]


# ---------------------------------------------------------------------------
# Batch export
# ---------------------------------------------------------------------------

_FORMAT_SUFFIX = {"tiff": ".tiff", "ome-tiff": ".ome.tiff", "dzi": ".dzi"}


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
    result: Any = None
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
        if not os.path.exists(s) and any(ch in s for ch in "*?["):
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
        key = os.path.abspath(item)
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


def export_output_path(source: str | os.PathLike, output_dir: str | os.PathLike,
                       format: str = "tiff") -> Path:
    """Output path of ``source`` in a batch export: ``<output_dir>/<stem><suffix>``.

    ``stem`` is the file name without its extension (and without ``.ome``
    for ``.ome.tif[f]``); ``suffix`` is ``.tiff``, ``.ome.tiff`` or ``.dzi``
    for the formats ``tiff``, ``ome-tiff`` and ``dzi``.
    """
    if format not in _FORMAT_SUFFIX:
        raise BatchOptionError(f"format must be one of {tuple(_FORMAT_SUFFIX)}, got {format!r}")
    return Path(output_dir) / (_slide_stem(os.fspath(source)) + _FORMAT_SUFFIX[format])


#: The batch export manifest, in the output folder: what earlier batches completed.
MANIFEST_NAME = ".wsitool-manifest.json"
#: Export options that do not change the output's content (not compared on resume).
_UNRECORDED_OPTIONS = ("threads", "overwrite", "progress", "max_pixels")


def _output_size(output: Path, format: str) -> int | None:
    """Size in bytes of a complete-looking output (for Deep Zoom the ``.dzi`` file,
    with its ``_files`` folder present), or None when absent or incomplete."""
    if format == "dzi":
        from .export import _dzi_paths

        output, files, _stem = _dzi_paths(output)
        if not files.is_dir() or files.is_symlink():
            return None
    try:
        st = os.lstat(output)
    except OSError:
        return None
    import stat as _stat

    return st.st_size if _stat.S_ISREG(st.st_mode) else None


def _output_exists(output: Path, format: str) -> bool:
    if format == "dzi":
        from .export import _dzi_paths

        dzi, files, _stem = _dzi_paths(output)
        return os.path.lexists(dzi) or os.path.lexists(files)
    return os.path.lexists(output)


def _source_stamp(source: str) -> dict | None:
    try:
        st = os.stat(source)
    except (OSError, ValueError):  # ValueError: a NUL byte in the path
        return None
    return {"source": os.path.abspath(source), "source_size": st.st_size,
            "source_mtime_ns": st.st_mtime_ns}


def _recorded_options(options: dict) -> dict:
    """The options that shape an output, as JSON values (tuples become lists)."""
    import json

    kept = {k: v for k, v in options.items() if k not in _UNRECORDED_OPTIONS}
    return json.loads(json.dumps(kept, sort_keys=True, default=lambda v: list(v) if isinstance(
        v, (tuple, set, np.ndarray)) else str(v)))


class _Manifest:
    """The batch manifest ``<output_dir>/.wsitool-manifest.json`` (:data:`MANIFEST_NAME`).

    JSON ``{"version": 1, "outputs": {<output file name>: {"source": absolute
    path, "source_size": bytes, "source_mtime_ns": ns, "output_size": bytes,
    "format": ..., "options": {...}, "completed": ISO time}}}``, rewritten
    atomically (:mod:`wsitool.atomic`) after each completed slide.  An
    unreadable or foreign manifest counts as empty.
    """

    def __init__(self, out_dir: Path):
        import json

        self.path = out_dir / MANIFEST_NAME
        self.entries: dict[str, dict] = {}
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as fh:
                data = json.loads(fh.read(1 << 24).decode("utf-8"))
            if isinstance(data, dict) and data.get("version") == 1 and isinstance(data.get("outputs"), dict):
                self.entries = {k: v for k, v in data["outputs"].items() if isinstance(v, dict)}
        except (OSError, ValueError):
            pass

    def plan(self, source: str, output: Path, format: str, options: dict, overwrite: bool) -> str:
        """``"skip"`` (recorded complete: same source file, size, mtime and options, output
        unchanged), ``"replace"`` (an output an earlier batch recorded, now stale),
        ``"new"`` (nothing there) or ``"exists"`` (something not recorded is there)."""
        entry = self.entries.get(output.name)
        stamp = _source_stamp(source)
        if overwrite:
            return "replace" if _output_exists(output, format) else "new"
        if entry is not None and stamp is not None:
            size = _output_size(output, format)
            same = (all(entry.get(k) == v for k, v in stamp.items())
                    and entry.get("format") == format
                    and entry.get("options") == _recorded_options(options)
                    and size is not None and entry.get("output_size") == size)
            if same:
                return "skip"
        if not _output_exists(output, format):
            return "new"
        return "replace" if entry is not None else "exists"

    def record(self, source: str, output: Path, format: str, options: dict,
               stamp: dict | None) -> None:
        """Record ``output`` as complete (``stamp``: the source as it was when the export
        started) and rewrite the manifest; a write error is ignored (resume then redoes it)."""
        import datetime
        import json

        from . import atomic

        size = _output_size(output, format)
        if stamp is None or size is None:
            self.entries.pop(output.name, None)
        else:
            self.entries[output.name] = dict(
                stamp, output_size=size, format=format, options=_recorded_options(options),
                completed=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
        data = json.dumps({"version": 1, "outputs": self.entries}, indent=1, sort_keys=True) + "\n"
        try:
            atomic.write_bytes(self.path, data.encode("utf-8"), overwrite=True)
        except OSError:
            pass


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
    import socket

    _quiet_tifffile()
    worker = f"{socket.gethostname()}:{os.getpid()}"
    t0 = time.perf_counter()
    try:
        from .export import export_pyramid

        result = export_pyramid(source, output, progress=_progress_forwarder(index, topic, local_progress),
                                **options)
        return SlideOutcome(source, output, "ok", time.perf_counter() - t0, result=result,
                            worker=worker)
    except Exception as exc:
        msg, types = _error_record(exc)
        if source not in msg:
            msg = f"{source}: {msg}"
        return SlideOutcome(source, output, "failed", time.perf_counter() - t0, error=msg,
                            error_types=types, worker=worker)


def export_many(sources: Sequence[str | os.PathLike], output_dir: str | os.PathLike, *,
                scheduler=None, format: str = "tiff", threads: int | None = None,
                overwrite: bool = False,
                progress: Callable[[SlideOutcome], None] | None = None,
                tile_progress: Callable[[int, int, int], None] | None = None,
                **export_options) -> list[SlideOutcome]:
    """Export several slides into ``output_dir``, one task per slide.

    Each slide is exported by :func:`wsitool.export.export_pyramid` to
    :func:`export_output_path` (``<stem>.tiff`` etc.).

    Args:
        sources: slide paths (see :func:`expand_sources` for globs/lists).
        output_dir: output folder (created if absent).
        scheduler: ``"local"`` (a ``LocalCluster`` of ``min(len(sources), CPU
            count)`` single-threaded worker processes; the default for more
            than one slide when Dask is installed), ``"sequential"`` (this
            process, one slide after another; the default for one slide or
            without Dask), ``"tcp://HOST:PORT"`` or a ``distributed.Client``.
        format: ``"tiff"``, ``"ome-tiff"`` or ``"dzi"``.
        threads: encode/decode threads per export (default: in this process
            the CPU count; on a cluster twice the CPU count of this machine
            divided by the number of concurrent exports, between 1 and the CPU
            count, so that the last long export can use cores left idle).
        overwrite: re-export slides whose output exists (never over a
            source).  Without it, re-running a batch resumes it: an output
            that the manifest (:data:`MANIFEST_NAME` in ``output_dir``, see
            :class:`_Manifest`) records as complete for the same source path,
            size and mtime, the same options and the same output size is
            ``"skipped"``; a recorded output that is stale (source or options
            changed, output altered) is exported again and replaced; an
            existing output no batch recorded is ``"failed"`` with
            :class:`~wsitool.errors.OutputExistsError`.  Partials that this
            host's dead processes left in ``output_dir`` are removed first
            (:func:`wsitool.atomic.clean_stale_partials`).
        progress: called with each :class:`SlideOutcome` as it finishes (in
            completion order).
        tile_progress: called as ``tile_progress(index, tiles_done,
            tiles_total)`` while slide ``sources[index]`` is written (forwarded
            from Dask workers as events of a per-batch topic, about 4 times a
            second per slide; called from the client's event-loop thread).
        **export_options: passed to ``export_pyramid`` (``tile_size``,
            ``compression``, ``quality``, ``region``, ``level``, ``overlap``,
            ``background``, ``max_pixels``).  ``progress`` of a single export
            is not forwarded.

    Returns:
        One :class:`SlideOutcome` per source, in input order.  A slide whose
        export raises (corrupt file, unsupported format, crash of a worker) is
        ``"failed"`` with its message; the others still run.

    Raises:
        BatchOptionError: bad format or scheduler, or two sources mapping to
            the same output name.
        DaskUnavailableError: a Dask scheduler without Dask installed.
        WsiError: the scheduler address cannot be reached.
    """
    srcs = [os.fspath(s) for s in sources]
    out_dir = Path(output_dir)
    outputs = [export_output_path(s, out_dir, format) for s in srcs]
    by_output: dict[Path, str] = {}
    for s, o in zip(srcs, outputs):
        if o in by_output:
            raise BatchOptionError(
                f"{s} and {by_output[o]} would both be exported to {o}; rename one or export them "
                "to different folders"
            )
        by_output[o] = s
    if scheduler is None:
        scheduler = "local" if len(srcs) > 1 and dask_available() else "sequential"
    _check_scheduler(scheduler, ("sequential",))
    out_dir.mkdir(parents=True, exist_ok=True)
    options = dict(export_options, format=format, overwrite=overwrite)
    options.pop("progress", None)
    results: dict[int, SlideOutcome] = {}
    cpus = os.cpu_count() or 1
    # Resume (item: the manifest): skip only what an earlier batch recorded as
    # complete for the same source file and options; litter of dead runs goes.
    from . import atomic
    from .errors import OutputExistsError

    atomic.clean_stale_partials(out_dir)
    manifest = _Manifest(out_dir)
    stamps = [_source_stamp(s) for s in srcs]
    todo: list[int] = []
    plans: dict[int, str] = {}
    for i, (s, o) in enumerate(zip(srcs, outputs)):
        plans[i] = manifest.plan(s, o, format, options, overwrite)
        if plans[i] == "skip":
            results[i] = SlideOutcome(s, str(o), "skipped")
        elif plans[i] == "exists":
            exc = OutputExistsError(o, "exists and no earlier batch recorded it as complete "
                                       f"(in {MANIFEST_NAME}); use --overwrite / overwrite=True")
            msg, types = _error_record(exc)
            results[i] = SlideOutcome(s, str(o), "failed", error=msg, error_types=types)
        else:
            todo.append(i)
        if i in results and progress is not None:
            progress(results[i])

    def task_options(i: int) -> dict:
        return dict(options, overwrite=plans[i] == "replace")

    def finished_one(i: int, outcome: SlideOutcome) -> None:
        results[i] = outcome
        if outcome.status == "ok":
            manifest.record(srcs[i], outputs[i], format, options, stamps[i])
        if progress is not None:
            progress(outcome)

    if scheduler == "sequential" or not todo:
        options["threads"] = threads
        for i in todo:
            finished_one(i, _export_task(srcs[i], str(outputs[i]), task_options(i), i,
                                         local_progress=tile_progress))
        return [results[i] for i in range(len(srcs))]
    with _ClientHandle(scheduler, len(todo), partials_in=out_dir) as handle:
        # Two threads per core in all: when one long export is the last one
        # running, it can still use the cores the idle workers left.
        running = min(len(todo), handle.n_workers())
        options["threads"] = threads or min(cpus, max(1, 2 * cpus // max(1, running)))
        topic = None
        if tile_progress is not None:
            topic = f"wsitool-export-progress-{os.getpid()}-{time.time_ns()}"

            finished: set[int] = set()

            def on_event(event) -> None:
                _ts, (index, done, total) = event
                if done == total:
                    finished.add(index)
                tile_progress(index, done, total)

            handle.client.subscribe_topic(topic, on_event)
        futures = {}
        for i in todo:
            s, o = srcs[i], outputs[i]
            # Largest files first (higher priority runs earlier), so one big
            # slide does not start last and keep a single worker busy alone.
            try:
                priority = os.path.getsize(s)
            except OSError:
                priority = 0
            fut = handle.client.submit(_export_task, os.path.abspath(s), str(o.resolve()), task_options(i),
                                       i, topic, pure=False, priority=priority,
                                       key=f"wsitool-export-{i}-{os.path.basename(s)}-{time.time_ns()}")
            futures[fut] = i
        distributed = _import_distributed()
        for fut in distributed.as_completed(list(futures)):
            i = futures[fut]
            try:
                outcome = fut.result()
                outcome.source, outcome.output = srcs[i], str(outputs[i])
            except Exception as exc:  # worker died (KilledWorker), cancelled, ...
                msg, types = _error_record(exc)
                outcome = SlideOutcome(srcs[i], str(outputs[i]), "failed",
                                       error=f"{srcs[i]}: {msg}", error_types=types)
            finished_one(i, outcome)
        if topic is not None:
            # the last events may arrive just after the results: wait briefly for them
            ok = {i for i, o in results.items() if o.status == "ok"}
            deadline = time.monotonic() + 2.0
            while not ok <= finished and time.monotonic() < deadline:
                time.sleep(0.02)
            handle.client.unsubscribe_topic(topic)
    return [results[i] for i in range(len(srcs))]
