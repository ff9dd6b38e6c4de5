"""``wsitool patches plan`` and ``wsitool patches extract``: training-set patch pipelines (floor 9)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import typer

from .. import errors
from ..ground.outputs import check_output
from ..opening import Location, parse_location
from ..patches.extract import extract_shards
from ..patches.plan import PatchPlan, PlanFileError, plan_patches, read_plans, write_plans
from ..patches.preview import save_preview
from ..patches.tissue import TissueParams
from ..slide import open_slide
from .batch import batch_progress
from .console import (
    STORAGE_OPTION_HELP,
    console,
    err_console,
    exit_code_for,
    fail,
    handle_errors,
    shown,
    storage_options,
)
from .group import app

patches_app = typer.Typer(help="Training-set patches: plan a slide's patches at an MPP, extract them to tar shards.",
                          no_args_is_help=True)
app.add_typer(patches_app, name="patches")

_PLAN_EXTS = (".parquet", ".h5", ".hdf5")


def _preview_path(preview: Path, slide: Location, in_folder: bool) -> Path:
    """Where ``slide``'s preview goes: ``preview`` itself, or ``SLIDE-preview.png`` in the folder
    ``preview`` (``in_folder``: :func:`_preview_is_folder`; SLIDE: :attr:`Location.stem`)."""
    return preview / (slide.stem + "-preview.png") if in_folder else preview


def _preview_is_folder(preview: str, many: bool) -> bool:
    """Whether ``--preview`` names a folder: several slides, a name ending in ``/``, or an existing
    folder (``previews/`` was a PNG file named ``previews``: the slash was lost as a path)."""
    return many or preview.endswith(("/", os.sep)) or Path(preview).is_dir()


def _load_mask_arg(mask: Path | None):
    if mask is None:
        return "auto"
    if not mask.exists():
        raise FileNotFoundError(2, "mask image does not exist", str(mask))
    return str(mask)


# The options of ``patches plan`` (typer reads these as the defaults).
_SLIDES = typer.Argument(..., metavar="SLIDE...", help="Slide files, DICOM folders or URLs (http(s), s3, gs, az).")
_OUTPUT = typer.Option(..., "--output", "-o", metavar="OUT",
                       help="OUT.parquet (every slide), OUT.h5 (one slide, CLAM's layout), or a folder "
                            "(one file per slide, --format).")
_MPP = typer.Option(None, "--mpp", metavar="UM", help="Micrometres per pixel of the patches.")
_MAGNIFICATION = typer.Option(None, "--magnification", metavar="X",
                              help="Objective magnification of the patches (instead of --mpp).")
_SIZE = typer.Option(224, "--size", metavar="PX", min=1, help="Patch side in pixels (default 224).")
_OVERLAP = typer.Option(0, "--overlap", metavar="PX", min=0, help="Pixels shared by neighbouring patches.")
_MIN_TISSUE = typer.Option(0.5, "--min-tissue", metavar="0..1", min=0.0, max=1.0,
                           help="Smallest tissue fraction of a kept patch (default 0.5).")
_MPP_OVERRIDE = typer.Option(None, "--mpp-override", metavar="UM", help="Level-0 MPP of slides that record none.")
_MPP_TOLERANCE = typer.Option(0.05, "--mpp-tolerance", metavar="REL", min=0.0,
                              help="A level within this relative MPP difference is read as is.")
_ALLOW_UPSCALE = typer.Option(False, "--allow-upscale", help="Allow an MPP finer than level 0.")
_NO_MASK = typer.Option(False, "--no-mask", help="Plan the whole slide (no tissue detection).")
_MASK = typer.Option(None, "--mask", metavar="IMAGE", help="A tissue mask image (one slide).")
_CLAM = typer.Option(False, "--clam", help="CLAM's tissue-detection defaults.")
_PLAN_FORMAT = typer.Option("parquet", "--format", help="With a folder: parquet or h5.")
_PREVIEW = typer.Option(None, "--preview", metavar="PNG",
                        help="Also draw mask and grid: a PNG (one slide) or a folder.")
_THREADS = typer.Option(None, "--threads", "-t", min=1, help="Decode threads.")
_QUIET = typer.Option(False, "--quiet", help="No progress bar.")
_STORAGE_OPTION = typer.Option(None, "--storage-option", metavar="KEY=VALUE", help=STORAGE_OPTION_HELP)


@dataclass(frozen=True)
class _PlanJob:
    """What ``patches plan`` does to each slide: :func:`plan_patches` with these arguments, then the
    per-slide plan file (``folder``, a plan of ``fmt`` there) and preview (``preview``)."""

    mpp: float | None
    magnification: float | None
    size: int
    overlap: int
    mask: str | None
    min_tissue: float
    mpp_tolerance: float
    mpp_override: float | None
    allow_upscale: bool
    tissue: TissueParams
    threads: int | None
    folder: Path | None
    fmt: str
    preview: Path | None
    preview_folder: bool
    overwrite: bool


@patches_app.command("plan")
@handle_errors
def plan_cmd(
    slides: list[str] = _SLIDES, output: Path = _OUTPUT, mpp: float | None = _MPP,
    magnification: float | None = _MAGNIFICATION, size: int = _SIZE, overlap: int = _OVERLAP,
    min_tissue: float = _MIN_TISSUE, mpp_override: float | None = _MPP_OVERRIDE,
    mpp_tolerance: float = _MPP_TOLERANCE, allow_upscale: bool = _ALLOW_UPSCALE, no_mask: bool = _NO_MASK,
    mask: Path | None = _MASK, clam: bool = _CLAM, fmt: Literal["parquet", "h5"] = _PLAN_FORMAT,
    preview: str | None = _PREVIEW, threads: int | None = _THREADS, quiet: bool = _QUIET,
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing plan and preview files."),
    storage_option: list[str] | None = _STORAGE_OPTION,
) -> None:
    """Plan the patches of slides at a physical resolution (tissue only, by default).

    A slide that fails is reported on one line and the others go on; the exit
    status is then that slide's error code.
    """
    folder = _check_plan_options(slides, output, mpp=mpp, magnification=magnification, size=size,
                                 overlap=overlap, mask=mask, no_mask=no_mask)
    many = len(slides) > 1
    options = storage_options(storage_option)
    previews = Path(preview) if preview else None
    in_folder = preview is not None and _preview_is_folder(preview, many)
    _prepare_plan_outputs(slides, output, previews if in_folder else None, folder=folder, overwrite=overwrite)
    job = _PlanJob(mpp, magnification, size, overlap, None if no_mask else _load_mask_arg(mask), min_tissue,
                   mpp_tolerance, mpp_override, allow_upscale, TissueParams.clam() if clam else TissueParams(),
                   threads, output if folder else None, fmt, previews, in_folder, overwrite)
    plans, failures = [], []
    with batch_progress(quiet) as progress:
        task = progress.add_task("planning", total=len(slides))
        for path in slides:
            try:
                plans.append(_plan_slide(parse_location(path, options), job))  # (named once, here)
            except (errors.WsiError, OSError) as exc:
                if not many:
                    raise
                failures.append(exc)
                err_console.print(f"[bold red]wsitool: error:[/] {shown(exc)}", highlight=False,
                                  soft_wrap=True)   # one line, never wrapped mid-word
            progress.advance(task)
    if not folder and plans:
        write_plans(plans, output, overwrite=overwrite)
    if failures:
        raise typer.Exit(exit_code_for(failures[0]))


def _check_plan_options(slides: list[str], output: Path, *, mpp: float | None, magnification: float | None,
                        size: int, overlap: int, mask: Path | None, no_mask: bool) -> bool:
    """The usage errors of ``patches plan`` (exit 2); whether ``output`` is a folder."""
    if (mpp is None) == (magnification is None):
        raise fail("give exactly one of --mpp and --magnification", 2)
    if overlap >= size:
        raise fail("--overlap must be smaller than --size", 2)
    if mask is not None and (no_mask or len(slides) > 1):
        raise fail("--mask takes one slide and cannot be combined with --no-mask", 2)
    folder = output.is_dir() or str(output).endswith(os.sep)
    if not folder and output.suffix.lower() not in _PLAN_EXTS:
        raise fail(f"{output}: the plan file ends in .parquet, .h5 or .hdf5 (or give a folder)", 2)
    if not folder and output.suffix.lower() != ".parquet" and len(slides) > 1:
        raise fail(f"{output}: CLAM's .h5 layout holds one slide; give OUT.parquet or a folder", 2)
    return folder


def _prepare_plan_outputs(slides: list[str], output: Path, preview_folder: Path | None, *, folder: bool,
                          overwrite: bool) -> None:
    """The output and preview folders made when missing; an existing plan file (or a slide given as
    the output) refused before any planning."""
    if preview_folder is not None:
        preview_folder.mkdir(parents=True, exist_ok=True)   # a folder of previews, made when missing
    if folder:
        output.mkdir(parents=True, exist_ok=True)
    else:
        check_output(output, [s for s in slides if "://" not in s], overwrite)


def _plan_slide(location: Location, job: _PlanJob) -> PatchPlan:
    """Plan the slide at ``location``, write its own plan file (``STEM.parquet``, :attr:`Location.stem`)
    and preview (if asked), print its summary line."""
    with open_slide(location) as slide:
        if job.mpp_override is None and slide.mpp is None:
            raise errors.InvalidRegionError(
                f"{slide.path}: the slide records no resolution (MPP); give --mpp-override UM "
                "(its level-0 micrometres per pixel)")
        plan = plan_patches(slide, mpp=job.mpp, magnification=job.magnification, size=job.size,
                            overlap=job.overlap, mask=job.mask, min_tissue=job.min_tissue,
                            mpp_tolerance=job.mpp_tolerance, mpp_override=job.mpp_override,
                            allow_upscale=job.allow_upscale, tissue=job.tissue, threads=job.threads)
        if job.folder is not None:
            write_plans([plan], job.folder / f"{location.stem}.{job.fmt}", overwrite=job.overwrite)
        if job.preview is not None:
            save_preview(slide, plan, _preview_path(job.preview, location, job.preview_folder),
                         overwrite=job.overwrite, threads=job.threads)
    console.print(f"{shown(slide.path)}: {len(plan)} patches at level {plan.level}, "
                  f"read {plan.read_size:g} px -> {plan.size} px, {plan.effective_mpp:.4g} um/px",
                  highlight=False)
    return plan


@patches_app.command("extract")
@handle_errors
def extract_cmd(
    plan_file: Path = typer.Argument(..., metavar="PLAN", help="A plan from `wsitool patches plan` (.parquet or .h5)."),
    output_dir: Path = typer.Option(..., "--output-dir", "-o", metavar="DIR", help="Existing folder for the shards."),
    fmt: Literal["jpeg", "png"] = typer.Option("jpeg", "--format", help="jpeg (default) or png (lossless)."),
    quality: int = typer.Option(90, "--quality", "-q", min=1, max=100, metavar="1..100", help="JPEG quality."),
    shard_size: int = typer.Option(1000, "--shard-size", min=1, metavar="N", help="Patches per tar shard."),
    threads: int | None = typer.Option(None, "--threads", "-t", min=1, help="Decode threads."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing shards."),
    storage_option: list[str] | None = typer.Option(None, "--storage-option", metavar="KEY=VALUE",
                                                    help=STORAGE_OPTION_HELP),
) -> None:
    """Extract the patches of a plan into WebDataset-style tar shards (an image and a .json per patch)."""
    try:
        plans = read_plans(plan_file)
    except PlanFileError as exc:
        raise fail(str(exc), 2) from None
    output_dir.mkdir(parents=True, exist_ok=True)   # made when missing, as the batch commands do
    total = sum(len(p) for p in plans)
    shards = []
    with batch_progress(quiet) as progress:
        task = progress.add_task("extracting", total=total)
        base = 0
        for plan in plans:
            with open_slide(plan.slide.path, storage_options=storage_options(storage_option)) as slide:
                def step(done, base=base):
                    progress.update(task, completed=base + done)
                shards += extract_shards(slide, plan, output_dir, fmt=fmt, quality=quality, shard_size=shard_size,
                                         threads=threads, overwrite=overwrite, progress=step)
            base += len(plan)
    console.print(f"{total} patches in {len(shards)} shard(s) in {shown(output_dir)}", highlight=False)
