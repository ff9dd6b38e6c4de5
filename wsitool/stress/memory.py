"""The memory measurement of a stress run: warm-up, RSS / GPU figures, slope fit and the memory verdict (floor 6, consumers).

The child samples its resident set size every ``sample_interval`` seconds
with the number of completed iterations and the decoder pool's counters.
**Warm-up** (:class:`WarmUp`): the first ``warmup`` fraction of the run (of
the iterations, or of the duration), at least :data:`WARMUP_READS_PER_WORKER`
reads per worker, and until the last decoder of the run was created; those
samples are plotted but not measured.  After warm-up :func:`memory_section`
gives RSS at start and end, the peak, the growth (end - start), the slope of a
least-squares line through the (iterations, RSS) samples in MB per 1,000
iterations with its 95 % interval, the GPU growth (:func:`gpu_growth`), and
:func:`memory_verdict`: ``ok``, ``leak`` or ``inconclusive``.  MB means MiB
(1,048,576 bytes) throughout.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

MIB = 1024.0 * 1024.0

#: Reads per worker before memory is measured: warm-up lasts at least
#: ``WARMUP_READS_PER_WORKER * workers`` iterations (and the ``warmup``
#: fraction of the run).  Each thread's decoder, scratch buffers and allocator
#: arena reach their working size on its own first reads, so with many workers
#: a fixed fraction of the run is not enough (64 workers at 3,000 iterations
#: made about 5 reads each in a 10 % warm-up and reported a false +70-94 MB
#: leak).  Counted over all workers, not per thread: under the GIL some
#: threads may get few reads, or none, in a short run.
WARMUP_READS_PER_WORKER = 20

#: Fewest samples after warm-up from which the memory verdict is decided
#: (the first is taken when warm-up ends, the last when the workers are done);
#: with fewer, the verdict is ``inconclusive``.
MIN_MEASURED_SAMPLES = 2


def decoders_created(sample: dict) -> int:
    """Decoders the child had created at ``sample`` (one per reading thread)."""
    return int((sample.get("decoder") or {}).get("decoders_created", 0))


@dataclasses.dataclass(frozen=True)
class WarmUp:
    """When warm-up ends: ``per_worker`` iterations (``WARMUP_READS_PER_WORKER * workers``)
    and ``iterations`` (iteration mode) or ``seconds`` (duration mode) of the run."""

    per_worker: int
    iterations: Optional[int]
    seconds: Optional[float]

    def over(self, s: dict, final_decoders: Optional[int] = None) -> bool:
        """True when sample ``s`` (a child message) is measured, not warm-up."""
        # Warm-up: the fraction of the run, WARMUP_READS_PER_WORKER reads per
        # worker (each thread's decoder, buffers and allocator arena reach their
        # working size on its own first reads) and, known after the run, every
        # decoder of the run created (threads the GIL let start late create
        # theirs late), whichever ends last.
        if s["iterations"] < self.per_worker:
            return False
        if final_decoders is not None and decoders_created(s) < final_decoders:
            return False
        if self.iterations is not None:
            return s["iterations"] >= self.iterations
        return s["t"] >= self.seconds


def fit_line(xs: Sequence[float], ys: Sequence[float]):
    """Least-squares line ``y = a + b x`` (2 or more samples); ``(a, b)`` or ``(None, None)``."""
    if len(xs) < 2 or max(xs) == min(xs):
        return None, None
    x = np.asarray(xs, float)
    y = np.asarray(ys, float)
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def t975(dof: int) -> float:
    """Two-sided 95 % quantile of Student's t with ``dof`` degrees of freedom
    (Cornish-Fisher expansion around the normal quantile; exact to 0.01 from 3 on)."""
    z = 1.959963984540054
    if dof <= 0:
        return math.inf
    if dof in (1, 2):
        return (12.706204736, 4.302652730)[dof - 1]
    return (z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * dof**3))


def slope_ci95(xs: Sequence[float], ys: Sequence[float]) -> Optional[tuple[float, float]]:
    """95 % confidence interval of the least-squares slope (per unit of x), or None.

    From the residual scatter around the line (ordinary least squares, t with
    n - 2 degrees of freedom).  RSS samples are not independent, so read it as
    "how well the line describes the samples", not as a strict probability.
    """
    n = len(xs)
    if n < 3:
        return None
    x = np.asarray(xs, float)
    y = np.asarray(ys, float)
    sxx = float(((x - x.mean()) ** 2).sum())
    if sxx == 0:
        return None
    b, a = np.polyfit(x, y, 1)
    resid = y - (a + b * x)
    se = math.sqrt(float((resid ** 2).sum()) / (n - 2) / sxx)
    h = t975(n - 2) * se
    return float(b - h), float(b + h)


def gpu_growth(measured: list[dict]) -> Optional[dict]:
    """GPU memory after warm-up from the ``gpu_memory_sample`` sampler, or None.

    Growth (end - start, MiB) of CuPy's pool bytes in use and of the device's
    used memory; either above ``max_growth_mb`` makes the verdict ``leak``.
    """
    rows = [s["extra"] for s in measured if "device_used_bytes" in s.get("extra", {})]
    if not rows:
        return None
    out: dict[str, float] = {}
    for key, name in (("pool_used_bytes", "pool_used"), ("device_used_bytes", "device_used")):
        start, end = rows[0][key] / MIB, rows[-1][key] / MIB
        out[f"{name}_start_mb"] = round(start, 3)
        out[f"{name}_end_mb"] = round(end, 3)
        out[f"{name}_growth_mb"] = round(end - start, 3)
    return out


def memory_verdict(meas: list, growth, gpu_growth_mb, ci, max_growth_mb: float,
                   workers: int) -> tuple[str, Optional[str]]:
    """``("ok" | "leak" | "inconclusive", note)`` of the memory measured after warm-up.

    ``leak``: growth over ``max_growth_mb`` (RSS or GPU memory) with RSS
    rising steadily (the slope's 95 % interval above 0, where there are 3 or
    more samples to fit; a GPU growth counts as is).  ``inconclusive``: fewer than :data:`MIN_MEASURED_SAMPLES` samples
    after warm-up (a run too short for its worker count), or growth over the
    limit that the samples do not show as a steady rise (a step, noise).
    """
    if len(meas) < MIN_MEASURED_SAMPLES:
        return "inconclusive", (
            f"only {len(meas)} memory sample(s) after warm-up (at least {MIN_MEASURED_SAMPLES} needed; "
            f"warm-up lasts {WARMUP_READS_PER_WORKER} reads per worker, {WARMUP_READS_PER_WORKER * workers} "
            f"iterations with {workers} workers): run longer (--iterations, --duration)")
    if gpu_growth_mb is not None and gpu_growth_mb > max_growth_mb:
        return "leak", f"GPU memory grew by {gpu_growth_mb:.1f} MB after warm-up"
    if growth is not None and growth > max_growth_mb:
        if ci is None or ci[0] > 0:
            return "leak", f"RSS grew by {growth:.1f} MB after warm-up" + (", steadily" if ci else "")
        return "inconclusive", (
            f"RSS grew by {growth:.1f} MB after warm-up, but not steadily (the slope's 95 % interval "
            "includes 0): run longer to tell a leak from a step")
    return "ok", None


def memory_section(samples: list[dict], warm: WarmUp, warmup: float, max_growth_mb: float,
                   workers: int) -> dict:
    """The report's ``memory`` section from the child's ``sample`` messages, with its verdict and note."""
    final_decoders = decoders_created(samples[-1]) if samples else None
    rss_samples = [{
        "t": round(s["t"], 4),
        "iterations": s["iterations"],
        "rss_mb": round(s["rss"] / MIB, 3),
        "min_worker_reads": s.get("min_worker_reads", 0),
        "decoders": decoders_created(s),
        "measured": warm.over(s, final_decoders),
        **({"extra": s["extra"]} if s.get("extra") else {}),
    } for s in samples]
    meas = [s for s in rss_samples if s["measured"]]
    first = meas[0] if meas else None
    warm_it = first["iterations"] if first else (rss_samples[-1]["iterations"] if rss_samples else 0)
    ci = None
    if meas:
        a, b = fit_line([s["iterations"] for s in meas], [s["rss_mb"] for s in meas])
        ci = slope_ci95([s["iterations"] for s in meas], [s["rss_mb"] for s in meas])
        rss_start, rss_end = meas[0]["rss_mb"], meas[-1]["rss_mb"]
        growth = rss_end - rss_start
        peak = max(s["rss_mb"] for s in meas)
    else:
        a = b = None
        rss_start = rss_end = growth = peak = None
    memory = {
        "unit": "MiB",
        "warmup_fraction": warmup,
        "warmup_iterations": warm_it,
        "samples_measured": len(meas),
        "rss_start_mb": rss_start,
        "rss_end_mb": rss_end,
        "rss_peak_mb": peak,
        "rss_peak_all_mb": max((s["rss_mb"] for s in rss_samples), default=None),
        "growth_mb": None if growth is None else round(growth, 3),
        "slope_mb_per_1k": None if b is None else b * 1000.0,
        "slope_ci95_mb_per_1k": None if ci is None else [ci[0] * 1000.0, ci[1] * 1000.0],
        "fit_intercept_mb": a,
        "max_growth_mb": max_growth_mb,
        "warmup_reads_per_worker": WARMUP_READS_PER_WORKER,
        "gpu": gpu_growth(meas),
        "samples": rss_samples,
    }
    gpu = max((v for k, v in (memory["gpu"] or {}).items() if k.endswith("growth_mb")), default=None)
    memory["verdict"], memory["note"] = memory_verdict(meas, growth, gpu, ci, max_growth_mb, workers)
    return memory
