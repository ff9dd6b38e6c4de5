"""``wsitool export-pyramid`` (one slide) and ``wsitool export-many`` (slides into a folder): TIFF / OME-TIFF /
Deep Zoom (floor 9).  ``export-pyramid`` with several sources still runs ``export-many``, after a deprecation
line, for one release."""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any, Literal

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from .. import errors
from ..distributed import dask_available, expand_sources, export_many
from ..errors import TileWarning
from ..export import COMPRESSIONS, FORMATS, export_pyramid
from ..export.plan import background_color
from ..ground.extras import install_hint
from ..opening import parse_location
from ..slide import open_slide, scene_options
from ..storage import redact
from .batch import batch_progress, failure_code, usage_errors
from .console import SCENE_HELP, STORAGE_OPTION_HELP, console, err_console, fail, handle_errors, shown, storage_options
from .group import app
from .stow import send


def _parse_background(text: str) -> tuple[int, int, int]:
    """``--background R,G,B`` by the API's rule (:func:`wsitool.export.plan.background_color`)."""
    try:
        r, g, b = (int(v) for v in background_color(p.strip() for p in text.split(",")))
    except ValueError:
        raise fail(f"--background must be R,G,B with values 0..255, got {text!r}", 2) from None
    return r, g, b


# The options of export-pyramid and export-many, defined once (typer reads these as the defaults).
_SOURCES = typer.Argument(
    None, metavar="SLIDE...",
    help=("Source slide file(s) (or quoted glob patterns) or slide URLs (http(s)://, s3://, gs://, az://), "
          "followed by OUTPUT (local)."),
    show_default=False)
_FORMAT = typer.Option(
    None, "--format", "-f",
    help=("tiff (Aperio-style SVS), ome-tiff, dzi or dicom (OUTPUT: a new folder holding one DICOM WSI series) "
          "(default: from OUTPUT's extension; tiff for a folder)."))
_FORMAT_MANY = typer.Option(None, "--format", "-f",
                            help="tiff (Aperio-style SVS; the default), ome-tiff, dzi or dicom (a folder per slide).")
_TILE_SIZE = typer.Option(256, "--tile-size", help="Output tile size in pixels (multiple of 16 for TIFF).")
_COMPRESSION = typer.Option(
    "jpeg", "--compression", "-c",
    help=("jpeg, jpeg2000, jpeg2000-lossless (TIFF, DICOM), deflate or none (TIFF; dzi: PNG); copy (TIFF, DICOM): "
          "copy the source's compressed tiles byte for byte, with its tile size and levels (a --region must be on "
          "the tile grid)."))
_QUALITY = typer.Option(90, "--quality", "-q", metavar="1..100", help="JPEG quality.")
_PSNR = typer.Option(
    None, "--psnr", metavar="DB",
    help=("JPEG 2000: target PSNR of every tile in dB (default 40: about JPEG quality 90; each dB more costs about "
          "5 % in size); 0: lossless."))
_REGION = typer.Option(
    None, "--region", metavar="X Y W H", help="X Y W H: X Y in level-0 pixels, W H in pixels of --level.")
_LEVEL = typer.Option(0, "--level", "-L", help="Source level to export (its resolution becomes level 0).")
_OVERLAP = typer.Option(0, "--overlap", help="Deep Zoom tile overlap in pixels.")
_THREADS = typer.Option(
    None, "--threads", "-t", min=1,
    help=("Encoder/decoder threads per export (default: CPU count; on a cluster: 2 x CPU count / concurrent "
          "exports)."))
_OVERWRITE = typer.Option(False, "--overwrite", help="Replace an existing output (batch: re-export completed ones).")
_BACKGROUND = typer.Option("255,255,255", "--background", help="R,G,B painted where the source is transparent.")
_QUIET = typer.Option(False, "--quiet", help="No progress bar.")
_MAX_PIXELS = typer.Option(
    None, "--max-pixels",
    help="Largest export allowed, in level-0 pixels of the output (default 2**33, 8.6 gigapixels).")
_FROM_LIST = typer.Option(None, "--from-list", help="Batch: file listing source slides, one per line.")
_SCHEDULER = typer.Option(
    None, "--scheduler",
    help="Batch: local (Dask LocalCluster; default for several slides), sequential, or tcp://HOST:PORT.")
_ON_ERROR = typer.Option(
    "raise", "--on-error",
    help=("raise (default): stop at the first undecodable source tile (exit 7, nothing written); fill: paint it "
          "with the background, warn, and record the count in the output."))
_NO_LABEL = typer.Option(
    False, "--no-label", help="Do not carry the source's label image over (it often shows patient identifiers).")
_NO_ASSOCIATED = typer.Option(
    False, "--no-associated", help="Do not carry the source's label and macro images over.")
_FROM_SOURCE_LEVELS = typer.Option(
    False, "--from-source-levels",
    help=("tiff/ome-tiff, re-encoding: read each output level whose downsample is one of the source's levels (a "
          "power of two within 2%) from that level, and halve the next ones from it, instead of halving everything "
          "from level 0."))
_VERIFY = typer.Option(
    False, "--verify",
    help=("With --compression copy: also decode every copied tile (a tile that does not decode fails the export, "
          "exit 7, or with --on-error fill is written as missing)."))
_STORAGE_OPTION = typer.Option(None, "--storage-option", metavar="KEY=VALUE", help=STORAGE_OPTION_HELP)
_NO_OVERVIEW = typer.Option(
    False, "--no-overview", help="dicom: leave out the overview (macro) image; --no-label leaves out both.")
_ADD_LEVELS = typer.Option(
    False, "--add-levels", help="dicom: also write levels below the smallest source level, halved down to one tile.")
_MPP = typer.Option(
    None, "--mpp", metavar="UM", help="dicom: micrometres per pixel of the exported level, where the source has none.")
_DICOM_METADATA = typer.Option(
    None, "--dicom-metadata", metavar="FILE",
    help="dicom: a DICOM JSON file (PS3.18 F.2) of patient, study, series, specimen and equipment attributes.")
_DICOM_ATTRIBUTE = typer.Option(
    None, "--dicom-attribute", metavar="KEYWORD=VALUE",
    help="dicom: one attribute (e.g. PatientID=P-1, Manufacturer=...), after --dicom-metadata; repeatable.")

_STOW = typer.Option(
    None, "--stow", metavar="URL",
    help="dicom: then send the series to this DICOMweb service with STOW-RS, as wsitool stow does.")
_STOW_OPTION = typer.Option(
    None, "--stow-option", metavar="KEY=VALUE",
    help="With --stow: a DICOMweb option for the upload (token=..., username=..., password=..., headers.NAME=...), "
         "repeatable.")

#: the line export-pyramid prints (stderr) when given the batch form, for one release
DEPRECATED_BATCH = "export-pyramid with several sources is deprecated; use export-many"


@app.command("export-pyramid")
@handle_errors
def export_pyramid_cmd(
    sources: list[str] | None = _SOURCES,
    output: str = typer.Argument(
        ..., metavar="OUTPUT",
        help=("One slide: .svs/.tif (tiff), .ome.tif (ome-tiff) or NAME.dzi (dzi). "
              "Several slides (deprecated: use export-many): an output folder.")),
    fmt: str | None = _FORMAT, tile_size: int = _TILE_SIZE, compression: str = _COMPRESSION,
    quality: int = _QUALITY, psnr: float | None = _PSNR, region: tuple[int, int, int, int] | None = _REGION,
    level: int = _LEVEL, overlap: int = _OVERLAP, threads: int | None = _THREADS, overwrite: bool = _OVERWRITE,
    background: str = _BACKGROUND, quiet: bool = _QUIET, max_pixels: int | None = _MAX_PIXELS,
    from_list: Path | None = _FROM_LIST, scheduler: str | None = _SCHEDULER,
    on_error: Literal["raise", "fill"] = _ON_ERROR, no_label: bool = _NO_LABEL,
    no_associated: bool = _NO_ASSOCIATED, from_source_levels: bool = _FROM_SOURCE_LEVELS, verify: bool = _VERIFY,
    storage_option: list[str] | None = _STORAGE_OPTION, no_overview: bool = _NO_OVERVIEW,
    add_levels: bool = _ADD_LEVELS, mpp: float | None = _MPP, dicom_metadata: Path | None = _DICOM_METADATA,
    dicom_attribute: list[str] | None = _DICOM_ATTRIBUTE, stow_url: str | None = _STOW,
    stow_option: list[str] | None = _STOW_OPTION,
    scene: int | None = typer.Option(None, "--scene", min=0, metavar="N", help=SCENE_HELP),
) -> None:
    """Stream a slide (or a region) into a new tiled pyramid: Aperio TIFF, OME-TIFF, Deep Zoom or a DICOM WSI series.

    An undecodable source tile stops the export with exit 7 unless --on-error
    fill, which paints it, warns and records the count in the output.  The
    batch form (several sources, --from-list, an existing output folder or
    --scheduler) is deprecated: it runs export-many, after one warning line.
    """
    srcs = list(sources or [])
    out = _output_arg(output, "OUTPUT")
    folder_output = (fmt or "").lower() == "dicom"  # the output is a folder of its own
    batch = (from_list is not None or len(srcs) != 1 or scheduler is not None
             or (not folder_output and (out.is_dir() or str(out).endswith(os.sep))))
    fmt = _resolve_format(fmt, None if batch else out)
    options = _export_options(
        fmt, tile_size=tile_size, compression=compression, quality=quality, psnr=psnr, region=region, level=level,
        overlap=overlap, threads=threads, overwrite=overwrite, background=background, max_pixels=max_pixels,
        on_error=on_error, no_label=no_label, no_associated=no_associated, from_source_levels=from_source_levels,
        verify=verify, storage_option=storage_option, dicom=_dicom_options(
            fmt, no_overview=no_overview, add_levels=add_levels, mpp=mpp, dicom_metadata=dicom_metadata,
            dicom_attribute=dicom_attribute))
    if (stow_url is not None or stow_option) and (fmt != "dicom" or batch):
        raise fail("--stow applies to one slide exported with --format dicom (a batch: export-many, "
                   "then wsitool stow)", 2)
    if stow_option and stow_url is None:
        raise fail("--stow-option needs --stow URL", 2)
    if batch:
        if scene is not None:
            raise fail("--scene applies to one slide (export-pyramid SLIDE OUTPUT)", 2)
        err_console.print(f"[yellow]wsitool: warning:[/] {DEPRECATED_BATCH}", highlight=False, soft_wrap=True)
        _export_batch(srcs, from_list, out, scheduler, quiet, options)
    else:
        _export_single(srcs[0], out, quiet, options, scene)
        if stow_url is not None:  # (the series is complete on disk first: a failed upload leaves it there)
            send([str(out)], stow_url, stow_option)


@app.command("export-many")
@handle_errors
def export_many_cmd(
    sources: list[str] | None = typer.Argument(
        None, metavar="SLIDE...",
        help=("Source slide files (or quoted glob patterns) or slide URLs (http(s)://, s3://, gs://, az://), "
              "followed by OUTPUT_DIR; or none, with --from-list."),
        show_default=False),
    output_dir: str = typer.Argument(
        ..., metavar="OUTPUT_DIR", help="Output folder (created if absent; its parent must exist)."),
    fmt: str | None = _FORMAT_MANY, tile_size: int = _TILE_SIZE, compression: str = _COMPRESSION,
    quality: int = _QUALITY, psnr: float | None = _PSNR, region: tuple[int, int, int, int] | None = _REGION,
    level: int = _LEVEL, overlap: int = _OVERLAP, threads: int | None = _THREADS, overwrite: bool = _OVERWRITE,
    background: str = _BACKGROUND, quiet: bool = _QUIET, max_pixels: int | None = _MAX_PIXELS,
    from_list: Path | None = _FROM_LIST, scheduler: str | None = _SCHEDULER,
    on_error: Literal["raise", "fill"] = _ON_ERROR, no_label: bool = _NO_LABEL,
    no_associated: bool = _NO_ASSOCIATED, from_source_levels: bool = _FROM_SOURCE_LEVELS, verify: bool = _VERIFY,
    storage_option: list[str] | None = _STORAGE_OPTION, no_overview: bool = _NO_OVERVIEW,
    add_levels: bool = _ADD_LEVELS, mpp: float | None = _MPP, dicom_metadata: Path | None = _DICOM_METADATA,
    dicom_attribute: list[str] | None = _DICOM_ATTRIBUTE,
) -> None:
    """Export several slides into a folder, one Dask task per slide (resumable).

    Each slide becomes OUTPUT_DIR/<stem>.tiff|.ome.tiff|.dzi (--format, default
    tiff); a failed slide is reported and the others go on; completed outputs
    are skipped on a re-run (resume) unless --overwrite.  Exit status 0 when
    every slide was exported or skipped, else the exit code of the first
    failed slide's error (an undecodable source tile: 7, unless --on-error fill).
    """
    options = _export_options(
        _resolve_format(fmt, None), tile_size=tile_size, compression=compression, quality=quality, psnr=psnr,
        region=region, level=level, overlap=overlap, threads=threads, overwrite=overwrite, background=background,
        max_pixels=max_pixels, on_error=on_error, no_label=no_label, no_associated=no_associated,
        from_source_levels=from_source_levels, verify=verify, storage_option=storage_option,
        dicom=_dicom_options(_resolve_format(fmt, None), no_overview=no_overview, add_levels=add_levels, mpp=mpp,
                             dicom_metadata=dicom_metadata, dicom_attribute=dicom_attribute))
    _export_batch(list(sources or []), from_list, _output_arg(output_dir, "OUTPUT_DIR"), scheduler, quiet, options)


def _output_arg(raw: str, name: str) -> Path:
    """The output argument as a path; an empty one (an unset shell variable, say) is a usage
    error (exit 2), not the current folder, which is what a path made from ``""`` names."""
    if not raw.strip():
        raise fail(f"{name} is empty: give an output path", 2)
    return Path(raw)


def _resolve_format(fmt: str | None, output: Path | None) -> str:
    """The export format: ``--format`` checked, and for one slide (``output`` given, else a
    batch) the format its extension implies, which ``--format`` must agree with; a batch
    defaults to tiff.  Usage errors exit 2."""
    if fmt is not None:
        fmt = fmt.lower()
        if fmt not in FORMATS:
            raise fail(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}", 2)
    if output is not None and fmt != "dicom":
        implied = format_for_output(output)
        if implied is None:
            raise fail(f"{output}: unknown output extension (use .svs/.tif/.tiff for tiff, "
                       ".ome.tif/.ome.tiff for ome-tiff, .dzi for dzi)", 2)
        if fmt is not None and fmt != implied:
            raise fail(f"{output}: the extension means {implied}, but --format is {fmt}", 2)
        fmt = implied
    return fmt or "tiff"


def _export_options(fmt: str, *, tile_size: int, compression: str, quality: int, psnr: float | None,
                    region: tuple[int, int, int, int] | None, level: int, overlap: int, threads: int | None,
                    overwrite: bool, background: str, max_pixels: int | None, on_error: str, no_label: bool,
                    no_associated: bool, from_source_levels: bool, verify: bool,
                    storage_option: list[str] | None, dicom: dict[str, Any] | None = None) -> dict[str, Any]:
    """The keywords of :func:`~wsitool.export.export_pyramid` from the command's options, after
    the checks between options the API leaves to the export (usage errors, exit 2)."""
    comp = compression.lower()
    if comp not in COMPRESSIONS:
        raise fail(f"--compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}", 2)
    if max_pixels is not None and max_pixels <= 0:
        raise fail("--max-pixels must be positive", 2)
    bg = _parse_background(background)
    if psnr is not None and comp not in ("jpeg2000", "copy"):
        raise fail(f"--psnr applies to --compression jpeg2000, not {comp} (JPEG takes --quality)", 2)
    options: dict[str, Any] = dict(
        format=fmt, tile_size=tile_size, compression=comp, quality=quality, region=tuple(region) if region else None,
        level=level, overlap=overlap, threads=threads, overwrite=overwrite, background=bg, max_pixels=max_pixels,
        on_error=on_error, label=not no_label, associated=not no_associated)
    if psnr is not None:
        options["psnr"] = psnr
    if from_source_levels:
        if fmt == "dzi":
            raise fail("--from-source-levels applies to tiff and ome-tiff (Deep Zoom level sizes "
                       "are fixed by halving the full size)", 2)
        if comp == "copy":
            raise fail("--from-source-levels re-encodes; --compression copy always copies the "
                       "source's levels", 2)
        options["from_source_levels"] = True
    remote_options = storage_options(storage_option)
    if remote_options:  # sent with each export task, to every Dask worker
        options["storage_options"] = remote_options
    if verify:
        if comp != "copy":
            raise fail("--verify applies to --compression copy only", 2)
        options["verify"] = True
    options.update(dicom or {})
    return options


def _dicom_options(fmt: str, *, no_overview: bool, add_levels: bool, mpp: float | None,
                   dicom_metadata: Path | None, dicom_attribute: list[str] | None) -> dict[str, Any]:
    """The DICOM export's keywords (only those given); usage errors (exit 2) for them with another format
    and for a ``--dicom-attribute`` without ``=``."""
    given = {"--no-overview": no_overview, "--add-levels": add_levels, "--mpp": mpp is not None,
             "--dicom-metadata": dicom_metadata is not None, "--dicom-attribute": bool(dicom_attribute)}
    if fmt != "dicom":
        for name, on in given.items():
            if on:
                raise fail(f"{name} applies to --format dicom only", 2)
        return {}
    out: dict[str, Any] = {}
    if no_overview:
        out["overview"] = False
    if add_levels:
        out["add_levels"] = True
    if mpp is not None:
        out["mpp"] = mpp
    if dicom_metadata is not None:
        out["dicom_metadata"] = str(dicom_metadata)
    pairs: dict[str, str] = {}
    for text in dicom_attribute or ():
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise fail(f"--dicom-attribute must be KEYWORD=VALUE, got {text!r}", 2)
        pairs[key.strip()] = value
    if pairs:
        out["dicom_attributes"] = pairs
    return out


def format_for_output(output: Path) -> str | None:
    """Export format implied by an output file name, or None for an unknown extension."""
    name = output.name.lower()
    if name.endswith((".ome.tif", ".ome.tiff")):
        return "ome-tiff"
    if name.endswith(".dzi"):
        return "dzi"
    if name.endswith((".svs", ".tif", ".tiff")):
        return "tiff"
    return None


def _looks_like_a_slide(path: Path) -> bool:
    """True when ``path`` is an existing file wsitool opens as a slide (the arguments may be swapped)."""
    if not path.is_file():
        return False
    try:
        with open_slide(path):
            return True
    except (errors.WsiError, OSError, ValueError):
        return False


def _export_single(slide: str, output: Path, quiet: bool, options: dict, scene: int | None = None) -> None:
    if not options.get("overwrite") and ("://" in slide or os.path.exists(slide)) and _looks_like_a_slide(output):
        # `export-pyramid e1.svs SLIDE.svs`: the user's slide is the second argument; never suggest replacing it
        raise fail(f"{output}: already exists and is a slide: the order is `export-pyramid SLIDE OUTPUT` "
                   "(were they swapped?); --overwrite would replace it", 9)
    show = not quiet and err_console.is_terminal
    progress_bar = None
    callback = None
    if show:
        progress_bar = Progress(
            TextColumn("[bold]export[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("tiles"),
            TaskProgressColumn(), TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
            TimeRemainingColumn(), console=err_console, transient=True,
        )

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
            with warnings.catch_warnings():  # the painted tiles get the one line below
                warnings.simplefilter("ignore", TileWarning)
                source: Any = slide
                if scene is not None:  # (a CZI scene: the location carries it)
                    source = parse_location(slide, options.pop("storage_options", None), scene_options(scene))
                result = export_pyramid(source, output, progress=callback, **options)
        finally:
            if progress_bar is not None:
                progress_bar.stop()
    except ValueError as exc:
        if isinstance(exc, errors.WsiError) and not isinstance(exc, errors.InvalidOptionError):
            raise
        raise fail(f"{redact(slide)}: {exc}", 2) from None  # an option the API refused
    dims = result.level_dimensions
    console.print(
        f"wrote {shown(result.output)} ({result.format}, {result.compression}, "
        f"{len(dims)} level{'s' if len(dims) != 1 else ''} "
        f"{dims[0][0]}x{dims[0][1]} -> {dims[-1][0]}x{dims[-1][1]}, {result.tiles_written} tiles, "
        f"{result.bytes_written} bytes) in {result.seconds:.2f} s",
        highlight=False,
    )
    _warn_painted(slide, result)


def _warn_painted(source, result) -> None:
    """One warning line when an export painted missing or undecodable source tiles."""
    if result is not None and (result.tiles_missing or result.tiles_failed):
        err_console.print(
            f"[yellow]wsitool: warning:[/] {shown(redact(str(source)))}: {result.tiles_missing} missing and "
            f"{result.tiles_failed} undecodable source tile(s) were painted with the background",
            highlight=False,
        )


def _export_batch(srcs: list[str], from_list: Path | None, output: Path, scheduler: str | None,
                  quiet: bool, options: dict) -> None:
    """Batch export-pyramid: many slides into the folder ``output`` (wsitool.distributed)."""

    paths = expand_sources(srcs, from_list)
    if not paths:
        raise fail("no input slides (give paths, a glob pattern or --from-list FILE)", 2)
    if output.exists() and not output.is_dir():
        raise fail(f"{output}: exists and is not a folder (several slides need an output folder)", 2)
    if scheduler is None and len(paths) > 1 and not dask_available():
        err_console.print(shown(f"Dask is not installed: exporting {len(paths)} slides one after another "
                                f"({install_hint('dask')} to run them in parallel)"), highlight=False)
    counts = {"ok": 0, "skipped": 0, "failed": 0}
    with batch_progress(quiet) as bar:
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
            line = {"ok": f"[green]ok[/] {shown(redact(o.source))} -> {shown(o.output)} ({o.seconds:.1f} s)",
                    "skipped": f"[yellow]skipped[/] {shown(redact(o.source))} ({shown(o.output)} is "
                               "recorded complete for this source and these options)",
                    "failed": f"[red]failed[/] {shown(o.error)}"}[o.status]
            (err_console if o.status == "failed" else console).print(line, highlight=False,
                                                                     soft_wrap=True)
            _warn_painted(o.source, o.result)


        with usage_errors(), warnings.catch_warnings():
            warnings.simplefilter("ignore", TileWarning)  # painted tiles: on_done's line says it
            outcomes = export_many(paths, output, scheduler=scheduler, progress=on_done,
                                   tile_progress=None if bar.disable else on_tiles, **options)
    painted = [o.result.tiles_failed for o in outcomes if o.result is not None and o.result.tiles_failed]
    console.print(f"{counts['ok']} exported, {counts['skipped']} skipped, {counts['failed']} failed "
                  f"of {len(outcomes)} slide(s) into {shown(output)}"
                  + (f"; {sum(painted)} undecodable tile(s) painted in {len(painted)} slide(s)"
                     if painted else ""), highlight=False, soft_wrap=True)
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        raise typer.Exit(failure_code(failed[0].error_types))


