"""The rich tables of ``wsitool stress``: the live view and the summary of a finished run (floor 6, consumers)."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from .results import StressProgress, StressReport


def live_table(p: StressProgress):
    """A rich Table of a :class:`StressProgress` for the live view."""
    t = Table(title="wsitool stress", show_header=False, box=None, padding=(0, 1))
    t.add_column(style="bold")
    t.add_column()
    if p.target:
        done = f"{p.iterations:,} / {p.target:,} ({100.0 * p.iterations / p.target:.0f} %)"
    else:
        done = f"{p.iterations:,} ({p.elapsed_s:.0f} / {p.duration_s:g} s)"
    t.add_row("phase", p.phase)
    t.add_row("iterations", done)
    t.add_row("reads/s", f"{p.reads_per_s:,.1f}")
    growth = "warm-up" if p.growth_mb is None else f"{p.growth_mb:+.1f} MB"
    t.add_row("RSS", f"{p.rss_mb:,.1f} MB (growth {growth})")
    t.add_row("verified", f"{p.verified:,}" + (f" (+{p.verify_backlog} queued)" if p.verify_backlog else ""))
    t.add_row("mismatches", f"[red]{p.mismatches}[/]" if p.mismatches else "0")
    t.add_row("errors", f"[red]{p.errors}[/]" if p.errors else "0")
    return t


def summary_table(report: StressReport):
    """A rich Table summarising a finished run."""
    d = report.to_dict()
    mem, run, ver, dec = d["memory"], d["run"], d["verification"], d["decoder"]

    def mb(v):
        return "n/a" if v is None else f"{v:,.1f} MB"

    colour = "green" if report.ok else "red"
    t = Table(title=f"stress {Path(d['slide']['path']).name}: [{colour}]{report.verdict}[/]",
              show_header=False)
    t.add_column(style="bold")
    t.add_column()
    cfg = d["config"]
    t.add_row("workload", f"{cfg['workers']} workers, levels {cfg['levels']}, regions "
                          f"{cfg['size_range'][0]}-{cfg['size_range'][1]} px, mode {cfg['mode']}, "
                          f"seed {cfg['seed']}")
    t.add_row("iterations", f"{run['iterations_completed']:,} in {run['elapsed_s']:.1f} s "
                            f"({run['reads_per_s']:,.1f} reads/s)")
    t.add_row("RSS", f"start {mb(mem['rss_start_mb'])}, end {mb(mem['rss_end_mb'])}, "
                     f"peak {mb(mem['rss_peak_mb'])} (after {mem['warmup_iterations']:,} warm-up iterations)")
    slope = "n/a" if mem["slope_mb_per_1k"] is None else f"{mem['slope_mb_per_1k']:+.3f} MB / 1,000 iterations"
    growth = "n/a" if mem["growth_mb"] is None else f"{mem['growth_mb']:+.1f} MB"
    ci = mem.get("slope_ci95_mb_per_1k")
    if ci is not None and mem["slope_mb_per_1k"] is not None:
        slope += f" (95 % interval {ci[0]:+.3f} to {ci[1]:+.3f})"
    t.add_row("growth", f"{growth} (limit {mem['max_growth_mb']:g} MB); slope {slope}")
    if mem.get("note"):
        t.add_row("memory", f"[yellow]{mem['verdict']}[/]: {mem['note']}")
    t.add_row("verified", f"{ver['checked']:,} reads (every {ver['every']}), {ver['mismatches']} mismatches")
    for m in ver["first_mismatches"][:3]:
        t.add_row("", f"[red]mismatch[/] iteration {m['index']} worker {m['worker']}: level "
                      f"{m['level']} at ({m['x']}, {m['y']}) size {m['width']}x{m['height']}")
    t.add_row("read errors", str(d["errors"]["count"]))
    for e in d["errors"]["first"][:3]:
        t.add_row("", f"[red]{e['type']}[/] level {e['level']} at ({e['x']}, {e['y']}): {e['message']}")
    measured = [s for s in mem["samples"] if s["measured"] and s.get("extra")]
    if measured and "threads" in measured[-1]["extra"]:
        a, b = measured[0]["extra"], measured[-1]["extra"]
        t.add_row("threads / fds", f"{a['threads']:.0f} -> {b['threads']:.0f} threads, "
                                   f"{a.get('open_fds', 0):.0f} -> {b.get('open_fds', 0):.0f} open files")
    if dec:
        t.add_row("decoder", f"{dec['decoders_created']} decoders, {dec['tiles_decoded']:,} tiles: "
                             f"{dec['tiles_direct']:,} direct + {dec['tiles_roi']:,} ROI into caller buffers, "
                             f"{dec['tiles_scratch']:,} via scratch, {dec['tiles_generic']:,} tifffile, "
                             f"{dec.get('tiles_openjpeg', 0):,} OpenJPEG windows "
                             f"({dec.get('tiles_reduced', 0):,} reduced), "
                             f"{dec.get('tiles_scaled', 0):,} scaled JPEG; "
                             f"{dec['scratch_allocations']} scratch allocations")
    if d["crash"]:
        c = d["crash"]
        lp = c["last_progress"]
        t.add_row("[red]crash[/]", f"{c['message']}; last progress: {lp['iterations']:,} iterations "
                                   f"at {lp['t']:.1f} s, RSS {lp['rss_mb']:.1f} MB")
    return t
