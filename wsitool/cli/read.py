"""``wsitool read-region``: one region to a file, or a CSV of regions (floor 9)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Literal

import typer

from .. import atomic, errors
from ..distributed import load_regions_csv, read_regions
from ..errors import TileWarning
from ..export import check_image_extension, write_image
from ..slide import open_slide
from ..storage import is_url, redact
from .batch import batch_progress, failure_code, usage_errors
from .console import (
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


@app.command("read-region")
@handle_errors
def read_region_cmd(
    slide: str = typer.Argument(..., help="Slide file, or a slide URL (http(s)://, s3://, gs://, az://)."),
    location: tuple[int, int] | None = typer.Option(
        None, "--location", "-l", metavar="X Y",
        help="X Y of the top-left pixel, level-0 pixels, two integers separated by a space (default 0 0)."
    ),
    level: int | None = typer.Option(None, "--level", "-L", help="Pyramid level (default 0 = full resolution)."),
    size: tuple[int, int] | None = typer.Option(
        None, "--size", "-s", metavar="W H",
        help="WIDTH HEIGHT in pixels of LEVEL, separated by a space.",
    ),
    output: Path | None = typer.Option(
        None, "--output", "-o", metavar="FILE",
        help="Output file: .png, .jpg/.jpeg, .webp, .tif/.tiff or .npy.",
    ),
    quality: int = typer.Option(
        90, "--quality", "-q", min=1, max=100, metavar="1..100",
        help="Quality of a .jpg or .webp output (WebP: 100 is lossless).",
    ),
    mode: Literal["rgba", "rgb", "raw"] = typer.Option(
        "rgba", "--mode",
        help="rgba (default), rgb, or raw (native samples; .npy/.tif).",
    ),
    threads: int | None = typer.Option(
        None, "--threads", "-t", min=1,
        help="Decode threads (default: CPU count); with --regions, regions read in parallel.",
    ),
    on_error: Literal["raise", "fill"] = typer.Option(
        "raise", "--on-error",
        help="raise (default) or fill corrupt tiles with transparent background.",
    ),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    max_pixels: int | None = typer.Option(None, "--max-pixels", help="Refuse regions larger than this many pixels."),
    regions: Path | None = typer.Option(
        None, "--regions",
        help="CSV of many regions (columns x,y,level,width,height[,name]); needs --output-dir.",
    ),
    output_dir: Path | None = typer.Option(None, "--output-dir", help="Folder for the --regions outputs."),
    fmt: str | None = typer.Option(
        None, "--format",
        help="With --regions: png (default), tif, npy; with --pack: npz (default) or zarr.",
    ),
    pack: bool = typer.Option(
        False, "--pack",
        help="With --regions: one <slide>-regions.npz (or .zarr) store instead of one file per region.",
    ),
    scheduler: str | None = typer.Option(
        None, "--scheduler",
        help="With --regions: threads (default), local (Dask LocalCluster) or tcp://HOST:PORT.",
    ),
    quiet: bool = typer.Option(False, "--quiet", help="With --regions: no progress bar."),
    overwrite: bool = typer.Option(
        False, "--overwrite",
        help="Replace existing output file(s) (never the source slide).",
    ),
    storage_option: list[str] | None = typer.Option(
        None, "--storage-option", metavar="KEY=VALUE",
        help=STORAGE_OPTION_HELP,
    ),
) -> None:
    """Read a region (OpenSlide semantics) and write it to an image file.

    With --regions FILE.csv --output-dir DIR, read many regions (see
    wsitool.distributed.read_regions); exit status 0 when all were written,
    else the exit code of the first failed region's error.
    """

    options = storage_options(storage_option)
    if not is_url(slide):
        slide = Path(slide)
    if regions is not None:
        single = [o for o, v in (("--size", size), ("--output", output), ("--location", location),
                                 ("--level", level)) if v is not None]
        if single:
            raise fail(f"{', '.join(single)} cannot be combined with --regions (the CSV gives each "
                       "region's location, level and size; use --output-dir for the outputs)", 2)
        if output_dir is None:
            raise fail("--regions needs --output-dir DIR", 2)
        if device != "cpu":
            raise fail("--regions reads on the CPU only (drop --device)", 2)
        with max_pixels_scope(max_pixels):
            _read_regions_batch(slide, regions, output_dir, fmt, pack, mode, on_error, scheduler,
                                threads, quiet, overwrite, options)
        return
    batch_only = [o for o, v in (("--output-dir", output_dir), ("--format", fmt),
                                 ("--scheduler", scheduler)) if v is not None]
    if pack:
        batch_only.append("--pack")
    if batch_only:
        raise fail(f"{', '.join(batch_only)} need(s) --regions FILE.csv", 2)
    if size is None or output is None:
        missing = " and ".join(o for o, v in (("--size", size), ("--output", output)) if v is None)
        raise fail(f"missing {missing} (or give --regions FILE.csv --output-dir DIR)", 2)
    location = location or (0, 0)
    level = 0 if level is None else level
    try:
        check_image_extension(output)
    except ValueError as exc:
        raise fail(str(exc), 2) from None

    atomic.check_output(output, [slide], overwrite)  # before reading: never the source
    atomic.clean_stale_partials(output.parent)


    with max_pixels_scope(max_pixels), open_slide(slide, storage_options=options) as s, \
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
    if device != "cpu":
        arr = arr.get()
    try:
        write_image(output, arr, overwrite=overwrite, sources=[slide], quality=quality)
    except ValueError as exc:
        if isinstance(exc, errors.WsiError):
            raise
        raise fail(str(exc), 2) from None
    # JPEG has no alpha: an RGBA region is written composited onto white, 3 channels (export.image)
    written = 3 if output.suffix.lower() in (".jpg", ".jpeg") and arr.shape[2] == 4 else arr.shape[2]
    console.print(
        f"wrote {shown(output)} (width {arr.shape[1]}, height {arr.shape[0]}, {written} "
        f"channel{'s' if written != 1 else ''} {arr.dtype}) "
        f"from {shown(redact(str(slide)))} level {level} at ({location[0]}, {location[1]})",
        highlight=False,
    )


def _read_regions_batch(slide, regions, output_dir, fmt, pack, mode, on_error, scheduler,
                        threads, quiet, overwrite=False, options=None) -> None:
    if scheduler is not None and scheduler != "threads" and threads is not None:
        raise fail("--threads applies to the local thread pool; on Dask the workers' threads are used", 2)
    requests = load_regions_csv(regions)
    with batch_progress(quiet) as bar, usage_errors():
        task = bar.add_task("regions", total=len(requests))
        outcomes = read_regions(slide, requests, output_dir, format=fmt, pack=pack, mode=mode,
                                on_error=on_error, scheduler=scheduler, workers=threads,
                                progress=lambda o: bar.advance(task), overwrite=overwrite,
                                storage_options=options)
    failed = [o for o in outcomes if o.status != "ok"]
    for o in failed:
        err_console.print(f"[red]failed[/] {shown(o.request.name)}: {shown(o.error)}", highlight=False,
                          soft_wrap=True)
    where = outcomes[0].path if pack and len(outcomes) > len(failed) else str(output_dir)
    console.print(f"wrote {len(outcomes) - len(failed)} of {len(outcomes)} region(s) from "
                  f"{shown(redact(str(slide)))} to {shown(where)}", highlight=False, soft_wrap=True)
    if failed:
        raise fail(f"{len(failed)} of {len(outcomes)} region(s) failed (first: {failed[0].error})",
                   failure_code(failed[0].error_types))


