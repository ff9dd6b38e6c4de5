"""Batch region reads: many regions of one slide on a thread pool or a Dask cluster (floor 7)."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np

from .. import atomic
from ..errors import InvalidRegionError, WsiError
from ..export import write_image
from ..read.request import validate_request
from ..slide import Slide, cached_slide, file_stamp, open_slide
from ..storage import is_url, redact
from .cluster import BatchOptionError, ClientHandle, check_scheduler, error_record, import_distributed, quiet_tifffile
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


def _region_task(path: str, stamp, requests: Sequence[RegionRequest], output_dir: str | None,
                 fmt: str | None, mode: str, on_error: str, threads: int,
                 return_arrays: bool, overwrite: bool = False,
                 storage_options: dict | None = None) -> list[tuple[RegionOutcome, np.ndarray | None]]:
    """Read a batch of regions of one slide; write files (never over the slide ``path``;
    an existing file only with ``overwrite``) or return the arrays."""
    quiet_tifffile()
    results = []
    try:
        slide = cached_slide(path, stamp, storage_options)
    except Exception as exc:
        msg, types = error_record(exc)
        return [(RegionOutcome(r, "failed", error=msg, error_types=types), None) for r in requests]

    for req in requests:
        try:
            arr = slide.read_region((req.x, req.y), req.level, (req.width, req.height),
                                    mode=mode, threads=threads, on_error=on_error)
            if return_arrays:
                results.append((RegionOutcome(req, "ok", shape=arr.shape), arr))
            else:
                dest = Path(output_dir) / f"{req.name}.{fmt}"
                write_image(dest, arr, overwrite=overwrite, sources=() if is_url(path) else (path,))
                results.append((RegionOutcome(req, "ok", path=str(dest), shape=arr.shape), None))
        except Exception as exc:
            msg, types = error_record(exc)
            results.append((RegionOutcome(req, "failed", error=msg, error_types=types), None))
    return results


def slide_stem(path: str) -> str:
    """The file name of ``path`` (a local path or a slide URL, without its query) without extension."""
    if is_url(path):
        import urllib.parse
        path = urllib.parse.unquote(urllib.parse.urlsplit(path).path)
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
                 overwrite: bool = False, storage_options: dict | None = None) -> list[RegionOutcome]:
    """Read many regions of one slide and write them to ``output_dir``.

    Each region is read exactly as a single :meth:`Slide.read_region` call with
    the same ``mode`` and ``on_error`` (so its pixels equal a single read).

    Args:
        slide: an open :class:`~wsitool.slide.Slide`, a path or a slide URL
            (only the path or URL is sent to workers; a URL with its size and
            ETag, so a worker never reads another version).
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
        storage_options: for a slide URL, as :func:`~wsitool.slide.open_slide`;
            carried in every task, so Dask workers open the URL with them (an
            open remote Slide's own options are used).

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
        if fmt not in PACK_FORMATS:
            raise BatchOptionError(f"pack format must be one of {PACK_FORMATS}, got {format!r}")
    else:
        fmt = (format or "png").lower()
        if fmt not in FILE_FORMATS:
            raise BatchOptionError(f"format must be one of {FILE_FORMATS}, got {format!r}")
    check_scheduler(scheduler, ("threads",))
    requests = load_regions_csv(regions) if isinstance(regions, (str, os.PathLike)) else list(regions)
    names: set[str] = set()
    own = not isinstance(slide, Slide)
    s = open_slide(slide, storage_options=storage_options) if own else slide
    remote = s.remote is not None
    if remote:  # tasks open the URL itself (s.path is redacted) with its options: to every worker
        path, stamp = s._location, s._source.identity()
        storage_options = s._storage_options
    try:
        if not remote:
            path = os.path.abspath(s.path)
        for i, r in enumerate(requests):
            where = f"region {r.name!r}"
            check_name(r.name, where)
            if r.name in names:
                raise InvalidRegionError(f"{redact(path)}: duplicate region name {r.name!r}")
            names.add(r.name)
            try:
                lv, *_ = validate_request(s.levels, s.path, (r.x, r.y), r.level, (r.width, r.height), mode)
            except WsiError as exc:
                raise type(exc)(f"{exc} ({where}, #{i + 1})") from None
            if fmt == "png" and mode == "raw" and (lv.dtype != np.uint8 or lv.samples > 4):
                raise InvalidRegionError(
                    f"{redact(path)}: level {lv.index} has {lv.samples} x {lv.dtype} samples; PNG cannot "
                    f"hold them in raw mode (use --format npy or tif) ({where})"
                )
    finally:
        if own:
            s.close()
    if not remote:
        stamp = file_stamp(path)
    out_dir = Path(output_dir)

    # Every output checked before anything is read or written (wsitool.atomic):
    # none may be the slide; existing ones only with overwrite.
    sources = () if remote else (path, os.fspath(s.path))
    dests = [out_dir / f"{slide_stem(path)}-regions.{fmt}"] if pack else [out_dir / f"{r.name}.{fmt}" for r in requests]
    if out_dir.is_dir():
        for dest in dests:
            atomic.check_output(dest, sources, overwrite, kind="dir" if fmt == "zarr" else "file")
    out_dir.mkdir(exist_ok=True)  # the output folder, in a folder that must exist
    atomic.clean_stale_partials(out_dir)
    writer = PackWriter(dests[0], fmt, sources, overwrite) if pack else None
    region_task = functools.partial(_region_task, overwrite=overwrite, storage_options=storage_options)
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
            with ClientHandle(scheduler, max(1, len(requests)), partials_in=out_dir) as handle:
                distributed = import_distributed()
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


