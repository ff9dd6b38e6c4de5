"""``wsitool read-region`` (one region to a file) and ``wsitool read-regions`` (a CSV of regions) (floor 9)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import typer

from .. import errors
from ..distributed import load_regions_csv, read_regions
from ..errors import TileWarning
from ..export import check_image_extension, write_image
from ..ground import outputs as atomic
from ..slide import open_slide
from ..storage import is_url, redact
from ..types import Mode, OnError
from .batch import batch_progress, failure_code, usage_errors
from .console import (
    SCENE_HELP,
    STORAGE_OPTION_HELP,
    console,
    err_console,
    fail,
    handle_errors,
    max_pixels_scope,
    shown,
    storage_options,
)
from .group import app

#: the line ``read-region --regions`` prints (stderr) before it runs read-regions, for one release
DEPRECATED_REGIONS = "read-region --regions is deprecated; use read-regions"

# The options of read-region.
_LOCATION = typer.Option(
    None, "--location", "-l", metavar="X Y",
    help="X Y of the top-left pixel, level-0 pixels, two integers separated by a space (default 0 0).")
_LEVEL = typer.Option(None, "--level", "-L", help="Pyramid level (default 0 = full resolution).")
_SIZE = typer.Option(None, "--size", "-s", metavar="W H", help="WIDTH HEIGHT in pixels of LEVEL, separated by a space.")
_OUTPUT = typer.Option(None, "--output", "-o", metavar="FILE",
                       help="Output file: .png, .jpg/.jpeg, .webp, .tif/.tiff or .npy.")
_QUALITY = typer.Option(90, "--quality", "-q", min=1, max=100, metavar="1..100",
                        help="Quality of a .jpg or .webp output (WebP: 100 is lossless).")
# The options read-region and read-regions share, defined once (typer reads these as the defaults).
_SLIDE = typer.Argument(..., help="Slide file, or a slide URL (http(s)://, s3://, gs://, az://).")
_MODE = typer.Option("rgba", "--mode", help="rgba (default), rgb, or raw (native samples; .npy/.tif).")
_ON_ERROR = typer.Option("raise", "--on-error",
                         help="raise (default) or fill corrupt tiles with transparent background.")
_MAX_PIXELS = typer.Option(None, "--max-pixels", help="Refuse regions larger than this many pixels.")
_OVERWRITE = typer.Option(False, "--overwrite", help="Replace existing output file(s) (never the source slide).")
_STORAGE_OPTION = typer.Option(None, "--storage-option", metavar="KEY=VALUE", help=STORAGE_OPTION_HELP)
# The options of read-regions; read-region takes them too, with --regions, for one release (deprecated).
_REGIONS_HELP = "CSV of many regions (columns x,y,level,width,height[,name])."
_OUTPUT_DIR_HELP = "Folder for the outputs (created if absent; its parent must exist)."
_FORMAT_HELP = "png (default), tif, npy; with --pack: npz (default) or zarr."
_PACK_HELP = "One <slide>-regions.npz (or .zarr) store instead of one file per region."
_SCHEDULER_HELP = "threads (default), local (Dask LocalCluster) or tcp://HOST:PORT."
_QUIET_HELP = "No progress bar."


def _old(help_text: str) -> str:
    """The help of an option of the deprecated ``read-region --regions``."""
    return f"Deprecated (use read-regions): with --regions, {help_text[0].lower()}{help_text[1:]}"


_OLD_REGIONS = typer.Option(None, "--regions", help="Deprecated (use read-regions): " + _REGIONS_HELP)
_OLD_OUTPUT_DIR = typer.Option(None, "--output-dir", help=_old(_OUTPUT_DIR_HELP))
_OLD_FORMAT = typer.Option(None, "--format", help=_old(_FORMAT_HELP))
_OLD_PACK = typer.Option(False, "--pack", help=_old(_PACK_HELP))
_OLD_SCHEDULER = typer.Option(None, "--scheduler", help=_old(_SCHEDULER_HELP))
_OLD_QUIET = typer.Option(False, "--quiet", help=_old(_QUIET_HELP))


@dataclass(frozen=True)
class RegionsJob:
    """What ``read-regions`` was asked: the slide, the CSV, the outputs and how to read."""

    slide: str | Path
    regions: Path
    output_dir: Path
    fmt: str | None
    pack: bool
    mode: Mode
    on_error: OnError
    scheduler: str | None
    threads: int | None
    quiet: bool
    overwrite: bool
    options: dict | None


@app.command("read-region")
@handle_errors
def read_region_cmd(
    slide: str = _SLIDE,
    location: tuple[int, int] | None = _LOCATION,
    level: int | None = _LEVEL,
    size: tuple[int, int] | None = _SIZE,
    output: Path | None = _OUTPUT,
    quality: int = _QUALITY,
    mode: Literal["rgba", "rgb", "raw"] = _MODE,
    threads: int | None = typer.Option(None, "--threads", "-t", min=1, help="Decode threads (default: CPU count)."),
    on_error: Literal["raise", "fill"] = _ON_ERROR,
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    max_pixels: int | None = _MAX_PIXELS,
    regions: Path | None = _OLD_REGIONS,
    output_dir: Path | None = _OLD_OUTPUT_DIR,
    fmt: str | None = _OLD_FORMAT,
    pack: bool = _OLD_PACK,
    scheduler: str | None = _OLD_SCHEDULER,
    quiet: bool = _OLD_QUIET,
    overwrite: bool = _OVERWRITE,
    storage_option: list[str] | None = _STORAGE_OPTION,
    scene: int | None = typer.Option(None, "--scene", min=0, metavar="N", help=SCENE_HELP),
) -> None:
    """Read a region (OpenSlide semantics) and write it to an image file.

    Many regions from a CSV file: see read-regions (read-region --regions
    still runs it, with a deprecation warning, for one release).
    """
    options = storage_options(storage_option)
    source = _slide_source(slide)
    if regions is not None:  # the old spelling of read-regions
        err_console.print(f"[yellow]wsitool: warning:[/] {DEPRECATED_REGIONS}", highlight=False, soft_wrap=True)
        out_dir = _check_legacy_regions(size=size, output=output, location=location, level=level,
                                        output_dir=output_dir, device=device)
        job = RegionsJob(source, regions, out_dir, fmt, pack, mode, on_error, scheduler, threads, quiet,
                         overwrite, options)
        with max_pixels_scope(max_pixels):
            _read_regions_batch(job)
        return
    _refuse_batch_options(output_dir=output_dir, fmt=fmt, scheduler=scheduler, pack=pack)
    if size is None or output is None:
        missing = " and ".join(o for o, v in (("--size", size), ("--output", output)) if v is None)
        raise fail(f"missing {missing} (or read many regions with read-regions)", 2)
    location = location or (0, 0)
    level = 0 if level is None else level
    _check_output_file(output, source, overwrite)
    with max_pixels_scope(max_pixels):
        arr = _read_one(source, options, location, level, size, mode=mode, threads=threads, on_error=on_error,
                        device=device, scene=scene)
    _write_one(output, arr, source, quality=quality, overwrite=overwrite)
    _report_one(output, arr, source, level, location)


@app.command("read-regions")
@handle_errors
def read_regions_cmd(
    slide: str = _SLIDE,
    regions: Path = typer.Option(..., "--regions", metavar="CSV", help=_REGIONS_HELP),
    output_dir: Path = typer.Option(..., "--output-dir", metavar="DIR", help=_OUTPUT_DIR_HELP),
    fmt: str | None = typer.Option(None, "--format", help=_FORMAT_HELP),
    pack: bool = typer.Option(False, "--pack", help=_PACK_HELP),
    mode: Literal["rgba", "rgb", "raw"] = _MODE,
    threads: int | None = typer.Option(
        None, "--threads", "-t", min=1,
        help="Regions read in parallel by the local thread pool (default: CPU count; not with a Dask --scheduler)."),
    on_error: Literal["raise", "fill"] = _ON_ERROR,
    max_pixels: int | None = _MAX_PIXELS,
    scheduler: str | None = typer.Option(None, "--scheduler", help=_SCHEDULER_HELP),
    quiet: bool = typer.Option(False, "--quiet", help=_QUIET_HELP),
    overwrite: bool = _OVERWRITE,
    storage_option: list[str] | None = _STORAGE_OPTION,
) -> None:
    """Read many regions of one slide, listed in a CSV file, one output file each or one packed store.

    Regions are read on a local thread pool or a Dask cluster (see
    wsitool.distributed.read_regions); exit status 0 when all were written,
    else the exit code of the first failed region's error.
    """
    options = storage_options(storage_option)
    job = RegionsJob(_slide_source(slide), regions, output_dir, fmt, pack, mode, on_error, scheduler, threads,
                     quiet, overwrite, options)
    with max_pixels_scope(max_pixels):
        _read_regions_batch(job)


# ------------------------------------------------------------------ steps of read-region


def _slide_source(slide: str) -> str | Path:
    """A slide argument as the API takes it: a URL as is, a local path as a Path."""
    return slide if is_url(slide) else Path(slide)


def _refuse_batch_options(*, output_dir: Path | None, fmt: str | None, scheduler: str | None, pack: bool) -> None:
    """The batch options without --regions: a usage error (exit 2) naming them."""
    batch_only = [o for o, v in (("--output-dir", output_dir), ("--format", fmt),
                                 ("--scheduler", scheduler)) if v is not None]
    if pack:
        batch_only.append("--pack")
    if batch_only:
        raise fail(f"{', '.join(batch_only)} need(s) --regions FILE.csv: use read-regions", 2)


def _check_output_file(output: Path, slide: str | Path, overwrite: bool) -> None:
    """Before reading: a known image extension, never the slide, an existing file only with ``overwrite``."""
    try:
        check_image_extension(output)
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    atomic.check_output(output, [slide], overwrite)  # before reading: never the source
    atomic.clean_stale_partials(output.parent)


def _read_one(slide: str | Path, options: dict | None, location: tuple[int, int], level: int,
              size: tuple[int, int], *, mode: Mode, threads: int | None, on_error: OnError,
              device: str, scene: int | None = None) -> np.ndarray:
    """The region as a NumPy array (a CUDA read copied to the host); one warning line per filled tile."""
    with open_slide(slide, storage_options=options, scene=scene) as s, \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TileWarning)
        arr = s.read_region(location, level, size, mode=mode, threads=threads, on_error=on_error,
                            device=device)
    filled = [w for w in caught if issubclass(w.category, TileWarning)]
    for w in filled:  # --on-error fill: one line per bad tile, then the count
        err_console.print(f"[yellow]wsitool: warning:[/] {shown(w.message)}", highlight=False, soft_wrap=True)
    if filled:
        err_console.print(f"[yellow]wsitool: warning:[/] {len(filled)} bad tile(s) filled with transparent background",
                          highlight=False, soft_wrap=True)
    return arr.get() if device != "cpu" else arr


def _write_one(output: Path, arr: np.ndarray, slide: str | Path, *, quality: int, overwrite: bool) -> None:
    """Write the region; an option the writer refuses is a usage error (exit 2)."""
    try:
        write_image(output, arr, overwrite=overwrite, sources=[slide], quality=quality)
    except ValueError as exc:
        if isinstance(exc, errors.WsiError):
            raise
        raise fail(str(exc), 2) from None


def _report_one(output: Path, arr: np.ndarray, slide: str | Path, level: int, location: tuple[int, int]) -> None:
    # JPEG has no alpha: an RGBA region is written composited onto white, 3 channels (export.image)
    written = 3 if output.suffix.lower() in (".jpg", ".jpeg") and arr.shape[2] == 4 else arr.shape[2]
    console.print(
        f"wrote {shown(output)} (width {arr.shape[1]}, height {arr.shape[0]}, {written} "
        f"channel{'s' if written != 1 else ''} {arr.dtype}) "
        f"from {shown(redact(str(slide)))} level {level} at ({location[0]}, {location[1]})",
        highlight=False,
    )


# ------------------------------------------------------------------ steps of read-regions


def _check_legacy_regions(*, size: tuple[int, int] | None, output: Path | None, location: tuple[int, int] | None,
                          level: int | None, output_dir: Path | None, device: str) -> Path:
    """``read-region --regions`` (deprecated): the one-region options refused (exit 2); the --output-dir,
    required (exit 2 without it)."""
    single = [o for o, v in (("--size", size), ("--output", output), ("--location", location),
                             ("--level", level)) if v is not None]
    if single:
        raise fail(f"{', '.join(single)} cannot be combined with --regions (the CSV gives each "
                   "region's location, level and size; use --output-dir for the outputs)", 2)
    if output_dir is None:
        raise fail("--regions needs --output-dir DIR", 2)
    if device != "cpu":
        raise fail("--regions reads on the CPU only (drop --device)", 2)
    return output_dir


def _read_regions_batch(job: RegionsJob) -> None:
    """Read every region of ``job``, print one line per failed region and a summary; exit as the first failure."""
    if job.scheduler is not None and job.scheduler != "threads" and job.threads is not None:
        raise fail("--threads applies to the local thread pool; on Dask the workers' threads are used", 2)
    requests = load_regions_csv(job.regions)
    with batch_progress(job.quiet) as bar, usage_errors():
        task = bar.add_task("regions", total=len(requests))
        outcomes = read_regions(job.slide, requests, job.output_dir, format=job.fmt, pack=job.pack, mode=job.mode,
                                on_error=job.on_error, scheduler=job.scheduler, workers=job.threads,
                                progress=lambda o: bar.advance(task), overwrite=job.overwrite,
                                storage_options=job.options)
    failed = [o for o in outcomes if o.status != "ok"]
    for o in failed:
        err_console.print(f"[red]failed[/] {shown(o.request.name)}: {shown(o.error)}", highlight=False,
                          soft_wrap=True)
    where = outcomes[0].path if job.pack and len(outcomes) > len(failed) else str(job.output_dir)
    console.print(f"wrote {len(outcomes) - len(failed)} of {len(outcomes)} region(s) from "
                  f"{shown(redact(str(job.slide)))} to {shown(where)}", highlight=False, soft_wrap=True)
    if failed:
        raise fail(f"{len(failed)} of {len(outcomes)} region(s) failed (first: {failed[0].error})",
                   failure_code(failed[0].error_types))
