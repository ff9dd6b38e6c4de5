"""The RSS plot of a stress run (matplotlib, the optional ``plot`` extra) (floor 6, consumers)."""

from __future__ import annotations

import importlib
import io
import os
from itertools import pairwise
from pathlib import Path

import numpy as np

from ..ground import outputs as atomic
from ..ground.extras import needs_extra
from .report import report_sources
from .results import StressReport


def plot_available() -> bool:
    """True when matplotlib (the ``plot`` extra) can be imported."""
    try:
        importlib.import_module("matplotlib")  # the plot extra
    except ImportError:
        return False
    return True


def write_plot(report: StressReport, path: str | os.PathLike) -> None:
    """Plot RSS (MiB) against completed iterations to ``path`` (PNG, SVG or PDF by extension).

    The warm-up samples are drawn in grey, the least-squares line over the
    measured samples dashed (its 95 % interval in the legend), and the
    iterations at which a thread made a decoder after warm-up as triangles
    on the axis.  Written atomically.

    Raises:
        ImportError: matplotlib is missing (``pip install 'wsitool[plot]'``).
    """
    with needs_extra("plot", "plotting needs matplotlib: "):
        import matplotlib  # optional: the plot extra

        matplotlib.use("Agg", force=False)
        from matplotlib.figure import Figure
    mem = report.memory
    samples = mem["samples"]
    warm = mem["warmup_iterations"]
    fig = Figure(figsize=(8, 4.5), dpi=100)
    ax = fig.add_subplot()
    xs = [s["iterations"] for s in samples]
    ys = [s["rss_mb"] for s in samples]
    measured = [s["measured"] for s in samples]
    warm_x = [x for x, m in zip(xs, measured, strict=True) if not m]
    warm_y = [y for y, m in zip(ys, measured, strict=True) if not m]
    ax.plot(warm_x, warm_y, ".", color="0.6", label="warm-up")
    ax.plot([x for x, m in zip(xs, measured, strict=True) if m], [y for y, m in zip(ys, measured, strict=True) if m],
            ".-", color="tab:blue", label="RSS")
    if mem.get("fit_intercept_mb") is not None and mem.get("slope_mb_per_1k") is not None:
        mx = [x for x, m in zip(xs, measured, strict=True) if m]
        fx = np.array([min(mx), max(mx)], dtype=float)
        ax.plot(fx, mem["fit_intercept_mb"] + mem["slope_mb_per_1k"] * fx / 1000.0, "--",
                color="tab:red", label=f"fit: {mem['slope_mb_per_1k']:+.3f} MB / 1k it" + (
                    f" (95 %: {ci[0]:+.3f} to {ci[1]:+.3f})" if (ci := mem.get("slope_ci95_mb_per_1k")) else ""))
    # per-thread decoders made after warm-up (a thread meeting a tile kind for the
    # first time): each is a one-off step of RSS, not a leak
    made = [s["iterations"] for prev, s in pairwise(samples)
            if s["measured"] and s.get("decoders", 0) > prev.get("decoders", 0)]
    if made:
        ax.plot(made, [0.03] * len(made), "^", color="tab:orange", ms=5,
                transform=ax.get_xaxis_transform(), label="decoder made after warm-up")
    if warm:
        ax.axvline(warm, color="0.4", lw=0.8, ls=":")
    ax.set_xlabel("completed iterations")
    ax.set_ylabel("child RSS (MiB)")
    slide = Path(report.data["slide"]["path"]).name
    ax.set_title(f"wsitool stress {slide}: {report.verdict} "
                 f"(growth {mem['growth_mb'] if mem['growth_mb'] is not None else float('nan'):+.1f} MB)")
    ax.legend(loc="best")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fmt = Path(path).suffix.lower().lstrip(".") or "png"
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt)
    atomic.write_bytes(path, buf.getvalue(), overwrite=True, sources=report_sources(report))
