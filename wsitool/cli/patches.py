"""``wsitool patches plan`` and ``wsitool patches extract``: training-set patch pipelines (floor 9)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import typer

from .. import errors
from ..atomic import check_output
from ..patches.extract import extract_shards
from ..patches.plan import PlanFileError, plan_patches, read_plans, write_plans
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


def _stem(slide: str) -> str:
    """A file-name stem for ``slide`` (a path or a URL: its last part, before any query)."""
    name = slide.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    return name.split(".")[0] or "slide"


def _preview_path(preview: Path, slide: str, many: bool) -> Path:
    if many or preview.is_dir():
        return preview / (_stem(slide) + "-preview.png")
    return preview


def _load_mask_arg(mask: Path | None):
    if mask is None:
        return "auto"
    if not mask.exists():
        raise FileNotFoundError(2, "mask image does not exist", str(mask))
    return str(mask)


@patches_app.command("plan")
@handle_errors
def plan_cmd(
    slides: list[str] = typer.Argument(..., metavar="SLIDE...",
                                       help="Slide files, DICOM folders or URLs (http(s), s3, gs, az)."),
    output: Path = typer.Option(..., "--output", "-o", metavar="OUT",
                                help="OUT.parquet (every slide), OUT.h5 (one slide, CLAM's layout), or a folder "
                                     "(one file per slide, --format)."),
    mpp: float | None = typer.Option(None, "--mpp", metavar="UM", help="Micrometres per pixel of the patches."),
    magnification: float | None = typer.Option(None, "--magnification", metavar="X",
                                                  help="Objective magnification of the patches (instead of --mpp)."),
    size: int = typer.Option(224, "--size", metavar="PX", min=1, help="Patch side in pixels (default 224)."),
    overlap: int = typer.Option(0, "--overlap", metavar="PX", min=0, help="Pixels shared by neighbouring patches."),
    min_tissue: float = typer.Option(0.5, "--min-tissue", metavar="0..1", min=0.0, max=1.0,
                                     help="Smallest tissue fraction of a kept patch (default 0.5)."),
    mpp_override: float | None = typer.Option(None, "--mpp-override", metavar="UM",
                                                 help="Level-0 MPP of slides that record none."),
    mpp_tolerance: float = typer.Option(0.05, "--mpp-tolerance", metavar="REL", min=0.0,
                                        help="A level within this relative MPP difference is read as is."),
    allow_upscale: bool = typer.Option(False, "--allow-upscale", help="Allow an MPP finer than level 0."),
    no_mask: bool = typer.Option(False, "--no-mask", help="Plan the whole slide (no tissue detection)."),
    mask: Path | None = typer.Option(None, "--mask", metavar="IMAGE", help="A tissue mask image (one slide)."),
    clam: bool = typer.Option(False, "--clam", help="CLAM's tissue-detection defaults."),
    fmt: Literal["parquet", "h5"] = typer.Option("parquet", "--format", help="With a folder: parquet or h5."),
    preview: Path | None = typer.Option(None, "--preview", metavar="PNG",
                                           help="Also draw mask and grid: a PNG (one slide) or a folder."),
    threads: int | None = typer.Option(None, "--threads", "-t", min=1, help="Decode threads."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing plan and preview files."),
    storage_option: list[str] | None = typer.Option(None, "--storage-option", metavar="KEY=VALUE",
                                                    help=STORAGE_OPTION_HELP),
) -> None:
    """Plan the patches of slides at a physical resolution (tissue only, by default).

    A slide that fails is reported on one line and the others go on; the exit
    status is then that slide's error code.
    """
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
    many = len(slides) > 1
    options = storage_options(storage_option)
    if preview is not None and (many or str(preview).endswith(os.sep)):
        preview.mkdir(parents=True, exist_ok=True)   # a folder of previews, made when missing
    if folder:
        output.mkdir(parents=True, exist_ok=True)
    else:  # before any planning: an existing plan file (or a slide given as the output) is refused now
        check_output(output, [s for s in slides if "://" not in s], overwrite)
    params = TissueParams.clam() if clam else TissueParams()
    mask_arg = None if no_mask else _load_mask_arg(mask)
    plans, failures = [], []
    with batch_progress(quiet) as progress:
        task = progress.add_task("planning", total=len(slides))
        for path in slides:
            try:
                with open_slide(path, storage_options=options) as slide:
                    if mpp_override is None and slide.mpp is None:
                        raise errors.InvalidRegionError(
                            f"{slide.path}: the slide records no resolution (MPP); give --mpp-override UM "
                            "(its level-0 micrometres per pixel)")
                    plan = plan_patches(slide, mpp=mpp, magnification=magnification, size=size, overlap=overlap,
                                        mask=mask_arg, min_tissue=min_tissue, mpp_tolerance=mpp_tolerance,
                                        mpp_override=mpp_override, allow_upscale=allow_upscale, tissue=params,
                                        threads=threads)
                    if folder:
                        write_plans([plan], output / f"{_stem(path)}.{fmt}", overwrite=overwrite)
                    if preview is not None:
                        save_preview(slide, plan, _preview_path(preview, str(path), many), overwrite=overwrite,
                                     threads=threads)
                plans.append(plan)
                console.print(f"{shown(slide.path)}: {len(plan)} patches at level {plan.level}, "
                              f"read {plan.read_size:g} px -> {plan.size} px, {plan.effective_mpp:.4g} um/px",
                              highlight=False)
            except (errors.WsiError, OSError) as exc:
                if many:
                    failures.append(exc)
                    err_console.print(f"[bold red]wsitool: error:[/] {shown(exc)}", highlight=False,
                                      soft_wrap=True)   # one line, never wrapped mid-word
                else:
                    raise
            progress.advance(task)
    if not folder and plans:
        write_plans(plans, output, overwrite=overwrite)
    if failures:
        raise typer.Exit(exit_code_for(failures[0]))


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
