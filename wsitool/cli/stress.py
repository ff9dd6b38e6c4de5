"""``wsitool stress``: the memory-leak and thread-safety run (floor 9)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import typer
from rich.live import Live

from .. import errors, stress
from ..ground import outputs as atomic
from ..ground.extras import install_hint
from ..opening import parse_location
from ..slide import scene_options
from ..storage import is_url
from .console import (
    SCENE_HELP,
    STORAGE_OPTION_HELP,
    console,
    fail,
    fitted_console,
    handle_errors,
    shown,
    storage_options,
)
from .group import app


@app.command("stress")
@handle_errors
def stress_cmd(
    slide: str = typer.Argument(..., help="Slide file, or a slide URL (http(s)://, s3://, gs://, az://)."),
    workers: int = typer.Option(16, "--workers", "-w", min=1, help="Reader threads sharing one opened slide."),
    iterations: int | None = typer.Option(None, "--iterations", "-n", min=1,
                                             help="Total reads over all workers (default 10000)."),
    duration: float | None = typer.Option(None, "--duration", help="Run this many seconds instead of --iterations."),
    region_size: int = typer.Option(
        512, "--region-size", min=1,
        help="Nominal region side (px); sides vary from 1/2 to 3/2 of it.",
    ),
    levels: str = typer.Option("all", "--levels", help="'all' or level indices, e.g. '0,1'."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the random regions (>= 0)."),
    verify_every: int = typer.Option(
        10, "--verify-every", "-k", min=1,
        help="Verify every K-th read against a fresh serial reader.",
    ),
    report: Path | None = typer.Option(None, "--report", help="Write the JSON report here."),
    plot: Path | None = typer.Option(
        None, "--plot",
        help="Plot RSS vs iterations (.png/.svg/.pdf; needs the 'plot' extra).",
    ),
    max_growth_mb: float = typer.Option(
        64.0, "--max-growth-mb", min=0.0,
        help="RSS growth after warm-up (MiB) counted as a leak.",
    ),
    warmup: float = typer.Option(
        0.1, "--warmup", min=0.0, max=0.9,
        help="Fraction of the run not measured (warm-up), 0 to 0.9.",
    ),
    mode: Literal["rgb", "rgba", "raw"] = typer.Option(
        "rgb", "--mode",
        help="rgb (decode into caller buffers), rgba or raw.",
    ),
    read_threads: int = typer.Option(1, "--read-threads", min=1, help="threads= of each read."),
    stall_timeout: float = typer.Option(
        120.0, "--stall-timeout",
        help="Seconds without progress before the run counts as hung.",
    ),
    sample_interval: float = typer.Option(0.1, "--sample-interval", help="Seconds between RSS samples."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --report / --plot file."),
    storage_option: list[str] | None = typer.Option(
        None, "--storage-option", metavar="KEY=VALUE",
        help=STORAGE_OPTION_HELP,
    ),
    scene: int | None = typer.Option(None, "--scene", min=0, metavar="N", help=SCENE_HELP),
) -> None:
    """Many threads read random regions of one slide: report leaks, wrong pixels, crashes.

    Exit codes: 0 ok; 10 leak; 11 mismatch; 12 read errors; 13 crash; 14 hang;
    15 inconclusive (too short to judge memory; the most serious problem wins);
    general codes 1-9 for bad input (2 a bad option, 9 an unwritable --report/--plot).
    """

    options = storage_options(storage_option)
    source: str | Path = slide if is_url(slide) else Path(slide)
    _check_options(source, iterations=iterations, duration=duration, stall_timeout=stall_timeout,
                   sample_interval=sample_interval, report=report, plot=plot, overwrite=overwrite)
    where: Any = source if scene is None else parse_location(source, options, scene_options(scene))
    result = _run_live(
        where, workers=workers, iterations=iterations if iterations is not None else 10000,
        duration=duration, region_size=region_size, levels=levels, seed=seed,
        verify_every=verify_every, max_growth_mb=max_growth_mb, warmup=warmup, mode=mode,
        read_threads=read_threads, stall_timeout=stall_timeout, device=device,
        sample_interval=sample_interval, storage_options=options,
    )
    fitted_console().print(stress.summary_table(result))  # 80 columns in a pipe
    _write_outputs(result, report, plot)
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def _check_options(slide: str | Path, *, iterations: int | None, duration: float | None, stall_timeout: float,
                   sample_interval: float, report: Path | None, plot: Path | None, overwrite: bool) -> None:
    """The checks made before the run: exclusive and positive options (exit 2), the plot's
    extension and matplotlib (exit 2), writable ``--report`` / ``--plot`` targets (exit 9)
    that are not the slide and exist only with ``--overwrite``."""
    if iterations is not None and duration is not None:
        raise fail("--iterations and --duration are mutually exclusive", 2)
    for name, value in (("--duration", duration), ("--stall-timeout", stall_timeout),
                        ("--sample-interval", sample_interval)):
        if value is not None and not value > 0:
            raise fail(f"{name} must be > 0 seconds, got {value:g}", 2)
    if plot is not None:
        if plot.suffix.lower() not in (".png", ".svg", ".pdf"):
            raise fail(f"{plot}: unknown plot extension {plot.suffix!r} (use .png, .svg or .pdf)", 2)
        if not stress.plot_available():
            raise fail("--plot needs matplotlib: " + install_hint("plot"), 2)
    for name, target in (("--report", report), ("--plot", plot)):
        if target is not None:  # checked before the run, not after the whole workload
            # the rule of every command that writes (wsitool.ground.outputs.check_output): never
            # the slide itself, an existing file only with --overwrite, a folder there to write in
            try:
                atomic.check_output(target, [] if isinstance(slide, str) else [slide], overwrite)
            except (errors.OutputExistsError, errors.OutputIsSourceError):
                raise
            except OSError as exc:
                raise fail(f"{target}: {exc.strerror} ({name})", 9) from None


def _run_live(slide: Any, **options: Any) -> stress.StressReport:
    """:func:`wsitool.stress.run_stress` with a live progress table on a terminal."""
    live = None
    if console.is_terminal:
        live = Live(console=console, refresh_per_second=4, transient=True)
        live.start()

    def on_progress(p: stress.StressProgress) -> None:
        if live is not None:
            live.update(stress.live_table(p))

    try:
        return stress.run_stress(slide, progress=on_progress, **options)
    finally:
        if live is not None:
            live.stop()


def _write_outputs(result: stress.StressReport, report: Path | None, plot: Path | None) -> None:
    """Write the ``--report`` JSON and the ``--plot`` figure asked for, one line each."""
    if report is not None:
        stress.write_report(result, report)
        console.print(f"wrote report {shown(report)}", highlight=False)
    if plot is not None:
        stress.write_plot(result, plot)
        console.print(f"wrote plot {shown(plot)}", highlight=False)
