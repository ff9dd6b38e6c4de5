"""Command-line interface: a thin typer layer over the Python API.

Each command parses its arguments, calls the API and formats the result with
rich.  Expected errors print one line, ``wsitool: error: <file>: <cause>``,
and exit with the code of their class (:data:`EXIT_CODES`); no traceback.

Exit codes:
    0 success; 1 other wsitool error; 2 bad command-line usage;
    3 unsupported format; 4 corrupt file; 5 invalid region request;
    6 resource limit exceeded; 7 tile decode error; 8 no CUDA device;
    9 file not found or other I/O error; 130 interrupted (Ctrl-C).
    ``wsitool stress`` adds its own verdict codes (see its help).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Callable, List, Literal, Optional, Tuple

import typer
from rich.console import Console
from rich.table import Table

from . import errors
from .export import check_image_extension, write_image
from .read.icc import profile_description

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Read, convert and stress-test tiled pyramidal whole-slide images (SVS, TIFF, OME-TIFF).",
)
# Not on a terminal (pipes, logs, CI): wide lines instead of rich's 80 columns, so
# tables and messages are not cut or wrapped mid-sentence -- unless COLUMNS says
# how wide (rich reads it when no width is given).


def _width(stream) -> int | None:
    return None if stream.isatty() or os.environ.get("COLUMNS") else 200


console = Console(width=_width(sys.stdout))
err_console = Console(stderr=True, width=_width(sys.stderr))

EXIT_CODES: list[tuple[type[BaseException], int]] = [
    (errors.UnsupportedFormatError, 3),
    (errors.CorruptFileError, 4),
    (errors.InvalidRegionError, 5),
    (errors.ResourceLimitError, 6),
    (errors.TileDecodeError, 7),
    (errors.DeviceUnavailableError, 8),
    (errors.WsiError, 1),
    (FileNotFoundError, 9),
    (OSError, 9),
]


def exit_code_for(exc: BaseException) -> int:
    """The documented exit code of an exception (1 if not a known class)."""
    for cls, code in EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return 1


def fail(message: str, code: int) -> "typer.Exit":
    """Print one error line to stderr and return the Exit to raise."""
    from rich.markup import escape  # messages hold paths and hints with brackets

    err_console.print(f"[bold red]wsitool: error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def handle_errors(func: Callable) -> Callable:
    """Decorator mapping expected exceptions to one line and an exit code."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except typer.Exit:
            raise
        except KeyboardInterrupt:
            raise fail("interrupted", 130) from None
        except (errors.WsiError, OSError) as exc:
            if isinstance(exc, OSError) and not isinstance(exc, errors.WsiError):
                where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
                message = f"{where}{exc.strerror or exc}"
            else:
                message = str(exc)
            raise fail(message, exit_code_for(exc)) from None

    return wrapper


def max_pixels_scope(max_pixels: Optional[int]):
    """Context manager applying ``--max-pixels`` (pixels per region) for one command."""
    import contextlib

    from .settings import limits

    if max_pixels is None:
        return contextlib.nullcontext()
    if max_pixels <= 0:
        raise fail("--max-pixels must be positive", 2)
    return limits(max_region_pixels=max_pixels, max_region_bytes=max(max_pixels * 8, 2**31))


# ---------------------------------------------------------------------- info


def _icc_summary(profile: bytes | None) -> dict | None:
    """``{"bytes": n, "description": str | None}`` of an embedded ICC profile, or None."""
    return None if profile is None else {"bytes": len(profile), "description": profile_description(profile)}


@app.command()
@handle_errors
def info(
    slide: Path = typer.Argument(..., help="Slide file (SVS, TIFF, OME-TIFF)."),
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
) -> None:
    """Show levels, tile sizes, compression, MPP, vendor and associated images."""
    from .codec.backends import backend_report
    from .slide import open_slide

    with open_slide(slide) as s:
        levels = [
            {
                "level": lv.index,
                "width": lv.width,
                "height": lv.height,
                "downsample": lv.downsample,
                "tile_width": lv.tile_width,
                "tile_height": lv.tile_height,
                "tiled": lv.tiled,
                "compression": lv.compression,
                "photometric": lv.photometric,
                "samples": lv.samples,
                "dtype": str(lv.dtype),
                "decoder": lv.decoder,
            }
            for lv in s.levels
        ]
        assoc = {}
        for name in s.associated_images:
            try:
                h, w = s.associated_images[name].shape[:2]
                assoc[name] = [w, h]
            except errors.WsiError as exc:
                assoc[name] = f"unreadable: {exc}"
        data = {
            "path": str(slide),
            "vendor": s.vendor,
            "dimensions": list(s.dimensions),
            "level_count": s.level_count,
            "mpp_x": s.mpp_x,
            "mpp_y": s.mpp_y,
            "objective_power": s.objective_power,
            "levels": levels,
            "associated_images": assoc,
            "icc_profile": _icc_summary(s.color_profile),
            "backends": backend_report(),
            "properties": dict(s.properties),
        }
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return
    mpp = f"{data['mpp_x']:.4g} x {data['mpp_y']:.4g} µm/px" if data["mpp_x"] else "unknown"
    obj = f"{data['objective_power']:g}x" if data["objective_power"] else "unknown"
    console.print(f"[bold]{slide}[/]  vendor [cyan]{data['vendor']}[/]  MPP {mpp}  objective {obj}")
    icc = data["icc_profile"]
    console.print(f"ICC profile: {icc['description'] or '(no description)'} ({icc['bytes']} bytes)"
                  if icc else "ICC profile: none")
    table = Table(title="Levels")
    for col in ("level", "dimensions", "downsample", "tile", "compression", "photometric",
                "samples", "decoder"):
        table.add_column(col)
    for lv in levels:
        table.add_row(
            str(lv["level"]), f"{lv['width']} x {lv['height']}", f"{lv['downsample']:.4f}",
            f"{lv['tile_width']} x {lv['tile_height']}" + ("" if lv["tiled"] else " (strips)"),
            lv["compression"], lv["photometric"], f"{lv['samples']} x {lv['dtype']}", lv["decoder"],
        )
    console.print(table)
    if assoc:
        at = Table(title="Associated images")
        at.add_column("name")
        at.add_column("size")
        for name, size in assoc.items():
            at.add_row(name, f"{size[0]} x {size[1]}" if isinstance(size, list) else size)
        console.print(at)
    bt = Table(title="Decode backends")
    bt.add_column("backend")
    bt.add_column("available")
    bt.add_column("decodes")
    bt.add_column("detail")
    for b in data["backends"]:
        bt.add_row(b["name"], "yes" if b["available"] else "no", b["decodes"], b.get("detail", ""))
    console.print(bt)


# ---------------------------------------------------------------------- read-region


@app.command("read-region")
@handle_errors
def read_region_cmd(
    slide: Path = typer.Argument(..., help="Slide file."),
    location: Optional[Tuple[int, int]] = typer.Option(
        None, "--location", "-l", help="X Y of the top-left pixel, level-0 pixels (default 0 0)."
    ),
    level: Optional[int] = typer.Option(None, "--level", "-L", help="Pyramid level (default 0 = full resolution)."),
    size: Optional[Tuple[int, int]] = typer.Option(None, "--size", "-s", help="WIDTH HEIGHT in pixels of LEVEL."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Output file: .png, .tif/.tiff or .npy."),
    mode: Literal["rgba", "rgb", "raw"] = typer.Option("rgba", "--mode", help="rgba (default), rgb, or raw (native samples; .npy/.tif)."),
    threads: Optional[int] = typer.Option(None, "--threads", "-t", min=1, help="Decode threads (default: CPU count); with --regions, regions read in parallel."),
    on_error: Literal["raise", "fill"] = typer.Option("raise", "--on-error", help="raise (default) or fill corrupt tiles with transparent background."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    max_pixels: Optional[int] = typer.Option(None, "--max-pixels", help="Refuse regions larger than this many pixels."),
    regions: Optional[Path] = typer.Option(None, "--regions", help="CSV of many regions (columns x,y,level,width,height[,name]); needs --output-dir."),
    output_dir: Optional[Path] = typer.Option(None, "--output-dir", help="Folder for the --regions outputs."),
    fmt: Optional[str] = typer.Option(None, "--format", help="With --regions: png (default), tif, npy; with --pack: npz (default) or zarr."),
    pack: bool = typer.Option(False, "--pack", help="With --regions: one <slide>-regions.npz (or .zarr) store instead of one file per region."),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", help="With --regions: threads (default), local (Dask LocalCluster) or tcp://HOST:PORT."),
    quiet: bool = typer.Option(False, "--quiet", help="With --regions: no progress bar."),
) -> None:
    """Read a region (OpenSlide semantics) and write it to an image file.

    With --regions FILE.csv --output-dir DIR, read many regions (see
    wsitool.distributed.read_regions); exit status 0 when all were written,
    else the exit code of the first failed region's error.
    """
    from .slide import open_slide

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
                                threads, quiet)
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

    from .errors import TileWarning

    with max_pixels_scope(max_pixels), open_slide(slide) as s, \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TileWarning)
        arr = s.read_region(location, level, size, mode=mode, threads=threads, on_error=on_error,
                            device=device)
    filled = [w for w in caught if issubclass(w.category, TileWarning)]
    for w in filled:  # --on-error fill: one line per bad tile, then the count
        err_console.print(f"[yellow]wsitool: warning:[/] {w.message}", highlight=False, soft_wrap=True)
    if filled:
        err_console.print(f"[yellow]wsitool: warning:[/] {len(filled)} bad tile(s) filled with transparent background",
                          highlight=False, soft_wrap=True)
    if device != "cpu":
        arr = arr.get()
    write_image(output, arr)
    console.print(
        f"wrote {output} ({arr.shape[1]} x {arr.shape[0]} x {arr.shape[2]} {arr.dtype}) "
        f"from {slide} level {level} at ({location[0]}, {location[1]})",
        highlight=False,
    )


def _batch_progress(quiet: bool):
    """A rich Progress for batch commands (disabled when quiet or not a terminal)."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=err_console,
                    disable=quiet or not err_console.is_terminal, transient=False)


@contextlib.contextmanager
def _usage_errors():
    """Report a BatchOptionError (unknown scheduler/format, clashing outputs) as usage, exit 2."""
    from .distributed import BatchOptionError

    try:
        yield
    except BatchOptionError as exc:
        raise fail(str(exc), 2) from None


def _failure_code(error_types: tuple[str, ...]) -> int:
    """Exit code of a failure recorded by class names (see wsitool.distributed)."""
    for cls, code in EXIT_CODES:
        if cls.__name__ in error_types:
            return code
    if "ValueError" in error_types:  # an invalid export option, as in the single-slide form
        return 2
    return 1


def _read_regions_batch(slide, regions, output_dir, fmt, pack, mode, on_error, scheduler,
                        threads, quiet) -> None:
    from .distributed import load_regions_csv, read_regions

    if scheduler is not None and scheduler != "threads" and threads is not None:
        raise fail("--threads applies to the local thread pool; on Dask the workers' threads are used", 2)
    requests = load_regions_csv(regions)
    with _batch_progress(quiet) as bar, _usage_errors():
        task = bar.add_task("regions", total=len(requests))
        outcomes = read_regions(slide, requests, output_dir, format=fmt, pack=pack, mode=mode,
                                on_error=on_error, scheduler=scheduler, workers=threads,
                                progress=lambda o: bar.advance(task))
    failed = [o for o in outcomes if o.status != "ok"]
    for o in failed:
        err_console.print(f"[red]failed[/] {o.request.name}: {o.error}", highlight=False, soft_wrap=True)
    where = outcomes[0].path if pack and len(outcomes) > len(failed) else str(output_dir)
    console.print(f"wrote {len(outcomes) - len(failed)} of {len(outcomes)} region(s) from {slide} "
                  f"to {where}", highlight=False)
    if failed:
        raise fail(f"{len(failed)} of {len(outcomes)} region(s) failed (first: {failed[0].error})",
                   _failure_code(failed[0].error_types))


# ---------------------------------------------------------------------- export-pyramid


def _parse_background(text: str) -> Tuple[int, int, int]:
    parts = [p.strip() for p in text.split(",")]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 3 or not all(0 <= v <= 255 for v in values):
        raise fail(f"--background must be R,G,B with values 0..255, got {text!r}", 2)
    return values  # type: ignore[return-value]


@app.command("export-pyramid")
@handle_errors
def export_pyramid_cmd(
    sources: Optional[List[Path]] = typer.Argument(
        None, help="Source slide file(s) (or quoted glob patterns), followed by OUTPUT.",
        show_default=False),
    output: Path = typer.Argument(..., help="One slide: .svs/.tif (tiff), .ome.tif (ome-tiff) or NAME.dzi (dzi). "
                                            "Several slides (batch): an output folder."),
    fmt: Optional[str] = typer.Option(None, "--format", "-f", help="tiff (Aperio-style SVS), ome-tiff or dzi (default: from OUTPUT's extension; tiff for a folder)."),
    tile_size: int = typer.Option(256, "--tile-size", help="Output tile size in pixels (multiple of 16 for TIFF)."),
    compression: str = typer.Option("jpeg", "--compression", "-c", help="jpeg, jpeg2000 (TIFF only), deflate or none (dzi: PNG)."),
    quality: int = typer.Option(90, "--quality", "-q", help="1..100; JPEG quality, JPEG 2000: 100 lossless, else a target size of quality/300 of the raw tile."),
    region: Optional[Tuple[int, int, int, int]] = typer.Option(
        None, "--region", help="X Y W H: X Y in level-0 pixels, W H in pixels of --level."),
    level: int = typer.Option(0, "--level", "-L", help="Source level to export (its resolution becomes level 0)."),
    overlap: int = typer.Option(0, "--overlap", help="Deep Zoom tile overlap in pixels."),
    threads: Optional[int] = typer.Option(None, "--threads", "-t", min=1, help="Encoder/decoder threads per export (default: CPU count; on a cluster: 2 x CPU count / concurrent exports)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing output (batch: re-export completed ones)."),
    background: str = typer.Option("255,255,255", "--background", help="R,G,B painted where the source is transparent."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    max_pixels: Optional[int] = typer.Option(None, "--max-pixels", help="Largest export allowed, in level-0 pixels of the output (default 2**33, 8.6 gigapixels)."),
    from_list: Optional[Path] = typer.Option(None, "--from-list", help="Batch: file listing source slides, one per line."),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", help="Batch: local (Dask LocalCluster; default for several slides), sequential, or tcp://HOST:PORT."),
) -> None:
    """Stream a slide (or a region) into a new tiled pyramid: Aperio TIFF, OME-TIFF or Deep Zoom.

    Batch mode (several sources, --from-list, an existing output folder or
    --scheduler): each slide becomes OUTPUT/<stem>.tiff|.ome.tiff|.dzi, one
    Dask task per slide; a failed slide is reported and the others go on;
    completed outputs are skipped on a re-run (resume) unless --overwrite.
    Exit status 0 when every slide was exported or skipped, else the exit
    code of the first failed slide's error.
    """
    from .export import COMPRESSIONS, FORMATS

    srcs = list(sources or [])
    batch = (from_list is not None or len(srcs) != 1 or output.is_dir() or scheduler is not None
             or str(output).endswith(os.sep))
    if fmt is not None:
        fmt = fmt.lower()
        if fmt not in FORMATS:
            raise fail(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}", 2)
    if not batch:
        implied = format_for_output(output)
        if implied is None:
            raise fail(f"{output}: unknown output extension (use .svs/.tif/.tiff for tiff, "
                       ".ome.tif/.ome.tiff for ome-tiff, .dzi for dzi)", 2)
        if fmt is not None and fmt != implied:
            raise fail(f"{output}: the extension means {implied}, but --format is {fmt}", 2)
        fmt = implied
    fmt = fmt or "tiff"
    if compression.lower() not in COMPRESSIONS:
        raise fail(f"--compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}", 2)
    if max_pixels is not None and max_pixels <= 0:
        raise fail("--max-pixels must be positive", 2)
    bg = _parse_background(background)
    options = dict(format=fmt, tile_size=tile_size, compression=compression.lower(), quality=quality,
                   region=tuple(region) if region else None, level=level, overlap=overlap,
                   threads=threads, overwrite=overwrite, background=bg, max_pixels=max_pixels)
    if batch:
        _export_batch(srcs, from_list, output, scheduler, quiet, options)
    else:
        _export_single(srcs[0], output, quiet, options)


def format_for_output(output: Path) -> Optional[str]:
    """Export format implied by an output file name, or None for an unknown extension."""
    name = output.name.lower()
    if name.endswith((".ome.tif", ".ome.tiff")):
        return "ome-tiff"
    if name.endswith(".dzi"):
        return "dzi"
    if name.endswith((".svs", ".tif", ".tiff")):
        return "tiff"
    return None


def _export_single(slide: Path, output: Path, quiet: bool, options: dict) -> None:
    from .export import export_pyramid

    show = not quiet and err_console.is_terminal
    progress_bar = None
    callback = None
    if show:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn,
                                   TextColumn, TimeElapsedColumn, TimeRemainingColumn)

        progress_bar = Progress(
            TextColumn("[bold]export[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("tiles"),
            TaskProgressColumn(), TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
            TimeRemainingColumn(), console=err_console, transient=True,
        )
        import time

        task = progress_bar.add_task("export", total=None, rate="")
        t0 = time.perf_counter()

        def on_progress(done: int, total: int) -> None:
            elapsed = time.perf_counter() - t0
            rate = f"{done / elapsed:.0f} tiles/s" if elapsed > 0 else ""
            progress_bar.update(task, completed=done, total=total, rate=rate)

        callback = on_progress

    try:
        if progress_bar is not None:
            progress_bar.start()
        try:
            result = export_pyramid(slide, output, progress=callback, **options)
        finally:
            if progress_bar is not None:
                progress_bar.stop()
    except (FileExistsError, IsADirectoryError) as exc:
        raise fail(str(exc) if not exc.filename else f"{exc.filename}: {exc.strerror}", 9) from None
    except ValueError as exc:
        if isinstance(exc, errors.WsiError):
            raise
        raise fail(f"{slide}: {exc}", 2) from None
    dims = result.level_dimensions
    console.print(
        f"wrote {result.output} ({result.format}, {result.compression}, {len(dims)} levels "
        f"{dims[0][0]}x{dims[0][1]} -> {dims[-1][0]}x{dims[-1][1]}, {result.tiles_written} tiles, "
        f"{result.bytes_written} bytes) in {result.seconds:.2f} s",
        highlight=False,
    )
    if result.tiles_missing or result.tiles_failed:
        err_console.print(
            f"[yellow]wsitool: warning:[/] {slide}: {result.tiles_missing} missing and "
            f"{result.tiles_failed} undecodable source tile(s) were painted with the background",
            highlight=False,
        )


def _export_batch(srcs: List[Path], from_list: Optional[Path], output: Path, scheduler: Optional[str],
                  quiet: bool, options: dict) -> None:
    """Batch export-pyramid: many slides into the folder ``output`` (wsitool.distributed)."""
    from .distributed import dask_available, expand_sources, export_many

    paths = expand_sources(srcs, from_list)
    if not paths:
        raise fail("no input slides (give paths, a glob pattern or --from-list FILE)", 2)
    if output.exists() and not output.is_dir():
        raise fail(f"{output}: exists and is not a folder (several slides need an output folder)", 2)
    if scheduler is None and len(paths) > 1 and not dask_available():
        err_console.print(f"Dask is not installed: exporting {len(paths)} slides one after another "
                          '(pip install "wsitool[dask]" to run them in parallel)', highlight=False)
    counts = {"ok": 0, "skipped": 0, "failed": 0}
    with _batch_progress(quiet) as bar:
        task = bar.add_task("slides", total=len(paths))
        tiles_task = bar.add_task("tiles", total=None)
        tile_state: dict[int, tuple[int, int]] = {}

        def on_tiles(index: int, done: int, total: int) -> None:
            tile_state[index] = (done, total)
            bar.update(tiles_task, completed=sum(d for d, _ in tile_state.values()),
                       total=sum(t for _, t in tile_state.values()))

        def on_done(o) -> None:
            counts[o.status] += 1
            bar.advance(task)
            line = {"ok": f"[green]ok[/] {o.source} -> {o.output} ({o.seconds:.1f} s)",
                    "skipped": f"[yellow]skipped[/] {o.source} ({o.output} exists)",
                    "failed": f"[red]failed[/] {o.error}"}[o.status]
            (err_console if o.status == "failed" else console).print(line, highlight=False,
                                                                     soft_wrap=True)
            res = o.result
            if res is not None and (res.tiles_missing or res.tiles_failed):
                err_console.print(
                    f"[yellow]wsitool: warning:[/] {o.source}: {res.tiles_missing} missing and "
                    f"{res.tiles_failed} undecodable source tile(s) were painted with the background",
                    highlight=False)

        with _usage_errors():
            outcomes = export_many(paths, output, scheduler=scheduler, progress=on_done,
                                   tile_progress=None if bar.disable else on_tiles, **options)
    console.print(f"{counts['ok']} exported, {counts['skipped']} skipped, {counts['failed']} failed "
                  f"of {len(outcomes)} slide(s) into {output}", highlight=False)
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        raise typer.Exit(_failure_code(failed[0].error_types))


# ---------------------------------------------------------------------- stress


@app.command("stress")
@handle_errors
def stress_cmd(
    slide: Path = typer.Argument(..., help="Slide file."),
    workers: int = typer.Option(16, "--workers", "-w", min=1, help="Reader threads sharing one opened slide."),
    iterations: Optional[int] = typer.Option(None, "--iterations", "-n",
                                             help="Total reads over all workers (default 10000)."),
    duration: Optional[float] = typer.Option(None, "--duration", help="Run this many seconds instead of --iterations."),
    region_size: int = typer.Option(512, "--region-size", help="Nominal region side (px); sides vary from 1/2 to 3/2 of it."),
    levels: str = typer.Option("all", "--levels", help="'all' or level indices, e.g. '0,1'."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random regions (>= 0)."),
    verify_every: int = typer.Option(10, "--verify-every", "-k", help="Verify every K-th read against a fresh serial reader."),
    report: Optional[Path] = typer.Option(None, "--report", help="Write the JSON report here."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Plot RSS vs iterations (.png/.svg/.pdf; needs the 'plot' extra)."),
    max_growth_mb: float = typer.Option(64.0, "--max-growth-mb", help="RSS growth after warm-up (MiB) counted as a leak."),
    warmup: float = typer.Option(0.1, "--warmup", help="Fraction of the run not measured (warm-up)."),
    mode: Literal["rgb", "rgba", "raw"] = typer.Option("rgb", "--mode", help="rgb (decode into caller buffers), rgba or raw."),
    read_threads: int = typer.Option(1, "--read-threads", min=1, help="threads= of each read."),
    stall_timeout: float = typer.Option(120.0, "--stall-timeout", help="Seconds without progress before the run counts as hung."),
    sample_interval: float = typer.Option(0.1, "--sample-interval", help="Seconds between RSS samples."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
) -> None:
    """Many threads read random regions of one slide: report leaks, wrong pixels, crashes.

    Exit codes: 0 ok; 10 leak; 11 mismatch; 12 read errors; 13 crash; 14 hang
    (the most serious problem wins); general codes 1-9 for bad input.
    """
    from . import stress

    if iterations is not None and duration is not None:
        raise fail("--iterations and --duration are mutually exclusive", 2)
    if plot is not None:
        if plot.suffix.lower() not in (".png", ".svg", ".pdf"):
            raise fail(f"{plot}: unknown plot extension {plot.suffix!r} (use .png, .svg or .pdf)", 2)
        if not stress.plot_available():
            raise fail("--plot needs matplotlib: pip install 'wsitool[plot]'", 2)
    live = None
    if console.is_terminal:
        from rich.live import Live

        live = Live(console=console, refresh_per_second=4, transient=True)
        live.start()

    def on_progress(p):
        if live is not None:
            live.update(stress.live_table(p))

    try:
        result = stress.run_stress(
            slide, workers=workers, iterations=iterations if iterations is not None else 10000,
            duration=duration, region_size=region_size, levels=levels, seed=seed,
            verify_every=verify_every, max_growth_mb=max_growth_mb, warmup=warmup, mode=mode,
            read_threads=read_threads, stall_timeout=stall_timeout, device=device,
            sample_interval=sample_interval,
            progress=on_progress,
        )
    finally:
        if live is not None:
            live.stop()
    console.print(stress.summary_table(result))
    if report is not None:
        stress.write_report(result, report)
        console.print(f"wrote report {report}", highlight=False)
    if plot is not None:
        stress.write_plot(result, plot)
        console.print(f"wrote plot {plot}", highlight=False)
    if result.exit_code:
        raise typer.Exit(result.exit_code)


# ---------------------------------------------------------------------- serve


@app.command("serve")
@handle_errors
def serve_cmd(
    sources: List[Path] = typer.Argument(..., help="Slide files and folders of slides."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (default: loopback only)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port (0: any free port)."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="Decode threads (default: CPU count)."),
    cache_mb: int = typer.Option(256, "--cache-mb", min=0, help="Decoded-tile cache budget in MiB (0: off)."),
    viewer_js: Optional[str] = typer.Option(None, "--viewer-js",
                                            help="OpenSeadragon script: a URL, or a local file the server serves "
                                                 "(default: the pinned jsDelivr release)."),
    tile_size: int = typer.Option(512, "--tile-size", min=16, help="IIIF tile size advertised in info.json."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only warnings and errors."),
    debug: bool = typer.Option(False, "--debug", help="Log every request (debug level)."),
) -> None:
    """Serve slides over IIIF Image API 3.0 (level 2) and Deep Zoom, with a viewer page at /.

    Routes: /iiif/3/{id}/info.json, /iiif/3/{id}/{region}/{size}/{rotation}/{quality}.{format},
    /dz/{id}.dzi, /dz/{id}_files/{level}/{col}_{row}.jpeg, /view/{id}, /status.  Stops
    cleanly on SIGINT / SIGTERM / SIGHUP (exit 130 / 143 / 129).  Needs the 'serve' extra.
    """
    try:
        from .serve.config import DEFAULT_VIEWER_JS, ServeConfig
        from .serve.runner import serve
    except ImportError as exc:  # pragma: no cover - the web stack is an optional extra
        raise fail(f"serve needs the web stack ({exc.name}): pip install 'wsitool[serve]'", 2) from None
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise fail(f"serve needs the web stack ({exc.name}): pip install 'wsitool[serve]'", 2) from None
    options = dict(cache_mb=cache_mb, viewer_js=viewer_js or DEFAULT_VIEWER_JS, tile_size=tile_size)
    if threads is not None:
        options["threads"] = threads
    config = ServeConfig(**options)
    code = serve(sources, config, host=host, port=port, quiet=quiet, debug=debug)
    if code:
        raise typer.Exit(code)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Print a Python warning as one ``wsitool: warning:`` line on stderr."""
    err_console.print(f"[yellow]wsitool: warning:[/] {message}", highlight=False, soft_wrap=True)


def main(argv: Optional[List[str]] = None) -> None:
    """Console-script entry point."""
    logging.getLogger("tifffile").setLevel(logging.ERROR)
    warnings.showwarning = _show_warning
    app(args=argv, prog_name="wsitool")


if __name__ == "__main__":  # pragma: no cover
    main()
