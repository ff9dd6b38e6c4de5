"""The memory measurement of a stress run: warm-up, RSS / GPU figures, slope fit and the memory verdict
(floor 6, consumers).

The child samples its resident set size every ``sample_interval`` seconds
with the number of completed iterations and the decoder pool's counters.

**Warm-up** (:class:`WarmUp`) is the first ``warmup`` fraction of the run (of
the iterations, or of the duration), at least :data:`WARMUP_READS_PER_WORKER`
reads per worker counted over all workers, and at least
:data:`WARMUP_READS_EACH` reads by every worker, whichever ends last; then
the plateau test (:func:`settled_start`) extends it while RSS is still
slowing down, at most to :data:`PLATEAU_MAX_FRACTION` of the run.  The rule
depends on nothing that can recur all run (an earlier rule also waited for
the last decoder of the run to be created; a thread that met a rare tile kind
late made that the last few samples, and a leak went unmeasured).  Warm-up
samples are plotted but not measured.

After warm-up :func:`memory_section` gives RSS at start and end, the peak,
the growth (end - start), the slope of a least-squares line through the
(iterations, RSS) samples in MB per 1,000 iterations with its 95 % interval,
the GPU growth (:func:`gpu_growth`), and :func:`memory_verdict`: ``ok``,
``leak`` or ``inconclusive``, on absolute thresholds of that interval
(:data:`LEAK_SLOPE_MB_PER_1K`, :data:`OK_SLOPE_MB_PER_1K`).  MB means MiB
(1,048,576 bytes) throughout.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

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

#: Reads that every worker must have completed before memory is measured.
#: With many threads on few cores some threads start reading late (64 workers
#: on 2 busy cores: one had not read at all after 2,000 iterations); each
#: thread's first reads make its decoders and buffers, so until every thread
#: has read a few times RSS steps up for reasons that are not leaks.  Once
#: reached it stays reached: nothing that recurs all run moves warm-up.
WARMUP_READS_EACH = 5

#: The plateau test extends warm-up at most to this fraction of the run's
#: iterations (see :func:`settled_start`).
PLATEAU_MAX_FRACTION = 0.5

#: Fewest samples after warm-up from which ``ok`` or a slope ``leak`` is
#: decided (the first is taken when warm-up ends, the last when the workers
#: are done); with fewer the verdict is ``inconclusive``, unless the growth
#: alone is over the limit.
MIN_MEASURED_SAMPLES = 10

#: Fewest iterations after warm-up from which ``ok`` or a slope ``leak`` is
#: decided.  The slope is a figure per 1,000 iterations: measured over fewer,
#: a few hundred KiB of allocator noise alone swing it by more than
#: :data:`OK_SLOPE_MB_PER_1K`.
MIN_MEASURED_ITERATIONS = 1000

#: ... and at least this many per worker (``50 * workers`` iterations when
#: that is more).  Each thread's buffers grow to their working size over its
#: own reads, at the pace it meets its largest batches of tiles: 64 workers
#: sharing 3,000 iterations (47 reads each) were all still growing, together
#: a steady +7 MB / 1,000 iterations that flattened in longer runs.
MIN_MEASURED_READS_PER_WORKER = 50

#: ``leak`` when the 95 % interval of the RSS slope lies wholly above this
#: (MiB per 1,000 iterations: 2 KiB kept per read).  The leak of issue 24
#: (27 KiB per read) measured +13 to +19; clean 16-worker runs on the shared
#: samples measure under +0.5 (``docs/benchmarks/stress-2026-12-01.md``).
LEAK_SLOPE_MB_PER_1K = 2.0

#: ``ok`` only when the upper bound of that interval is below this (MiB per
#: 1,000 iterations) and the growth is under ``max_growth_mb``; between the
#: two thresholds, or with an interval too wide to tell, ``inconclusive``.
OK_SLOPE_MB_PER_1K = 1.0


def decoders_created(sample: dict) -> int:
    """Per-thread decoder objects the child had created at ``sample`` (see ``docs/guides/stress.md``:
    one per thread and kind of decoder it used)."""
    return int((sample.get("decoder") or {}).get("decoders_created", 0))


@dataclasses.dataclass(frozen=True)
class WarmUp:
    """When the fixed warm-up ends: ``per_worker`` iterations (``WARMUP_READS_PER_WORKER *
    workers``), :data:`WARMUP_READS_EACH` reads by every worker, and ``iterations``
    (iteration mode) or ``seconds`` (duration mode) of the run, whichever comes last.
    :func:`settled_start` may extend it (the plateau test)."""

    per_worker: int
    iterations: int | None
    seconds: float | None

    def over(self, s: dict) -> bool:
        """True when sample ``s`` (a child message) is measured, not warm-up."""
        if s["iterations"] < self.per_worker or s.get("min_worker_reads", 0) < WARMUP_READS_EACH:
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


def slope_ci95(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
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


def gpu_growth(measured: list[dict]) -> dict | None:
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


def min_measured_iterations(workers: int) -> int:
    """Fewest iterations after warm-up for a slope verdict with ``workers`` threads:
    :data:`MIN_MEASURED_ITERATIONS`, or :data:`MIN_MEASURED_READS_PER_WORKER` per worker when more."""
    return max(MIN_MEASURED_ITERATIONS, MIN_MEASURED_READS_PER_WORKER * workers)


def memory_verdict(meas: list, growth, gpu_growth_mb, ci, max_growth_mb: float,
                   workers: int) -> tuple[str, str | None]:
    """``("ok" | "leak" | "inconclusive", note)`` of the memory measured after warm-up.

    Args:
        meas: the measured samples (dicts with ``iterations``), oldest first.
        growth: RSS growth over them (MiB), or None.
        gpu_growth_mb: the larger GPU memory growth (MiB), or None on the CPU.
        ci: 95 % interval ``(low, high)`` of the RSS slope in MiB per
            iteration (:func:`slope_ci95`), or None.
        max_growth_mb: growth above which memory is a leak (MiB).
        workers: the run's worker threads (for the note).

    The rules, in order:

    1. ``leak``: GPU growth over ``max_growth_mb``; or RSS growth over it
       while RSS rises steadily (the interval above 0, or too few samples to
       fit one).
    2. ``inconclusive``: fewer than :data:`MIN_MEASURED_SAMPLES` samples or
       :func:`min_measured_iterations` iterations after warm-up (too few to
       judge a slope per 1,000 iterations either way).
    3. ``leak``: the interval's lower bound above :data:`LEAK_SLOPE_MB_PER_1K`
       (MiB per 1,000 iterations), whatever the growth.
    4. ``ok``: growth within the limit and the interval's upper bound below
       :data:`OK_SLOPE_MB_PER_1K`.
    5. ``inconclusive`` otherwise: a growth over the limit that is a step, not
       a rise, or an interval that reaches between the thresholds.
    """
    if gpu_growth_mb is not None and gpu_growth_mb > max_growth_mb:
        return "leak", f"GPU memory grew by {gpu_growth_mb:.1f} MB after warm-up"
    if growth is not None and growth > max_growth_mb and (ci is None or ci[0] > 0):
        return "leak", f"RSS grew by {growth:.1f} MB after warm-up" + (", steadily" if ci else "")
    its = (meas[-1]["iterations"] - meas[0]["iterations"]) if meas else 0
    min_its = min_measured_iterations(workers)
    run_longer = (
        f"only {len(meas)} memory sample(s) over {its:,} iteration(s) after warm-up (at least "
        f"{MIN_MEASURED_SAMPLES} samples over {min_its:,} iterations needed with {workers} workers; warm-up "
        f"lasts the --warmup fraction of the run and at least {WARMUP_READS_PER_WORKER} reads per "
        f"worker, {WARMUP_READS_PER_WORKER * workers:,} iterations with {workers} workers): run longer "
        "(--iterations, --duration)")
    if len(meas) < MIN_MEASURED_SAMPLES or its < min_its or ci is None:
        return "inconclusive", run_longer
    lo, hi = ci[0] * 1000.0, ci[1] * 1000.0
    interval = f"{lo:+.3f} to {hi:+.3f} MB / 1,000 iterations"
    if lo > LEAK_SLOPE_MB_PER_1K:
        return "leak", (f"RSS rises steadily after warm-up: the slope's 95 % interval, {interval}, "
                        f"lies above {LEAK_SLOPE_MB_PER_1K:g}")
    if growth is not None and growth > max_growth_mb:
        return "inconclusive", (
            f"RSS grew by {growth:.1f} MB after warm-up, but not steadily (the slope's 95 % interval "
            f"{interval} includes 0): run longer to tell a leak from a step")
    if hi < OK_SLOPE_MB_PER_1K:
        return "ok", None
    return "inconclusive", (
        f"the slope's 95 % interval, {interval}, reaches {OK_SLOPE_MB_PER_1K:g} or more without lying "
        f"above {LEAK_SLOPE_MB_PER_1K:g}: run longer (--iterations) to tell a small leak from noise")


def settled_start(meas: Sequence[dict], limit_iterations: float) -> int:
    """Index in ``meas`` from which RSS has settled: the plateau test of warm-up.

    Many threads each reach their buffers' and arenas' working size at their
    own pace (each first meets its largest batch of tiles at a random time),
    so RSS can still be approaching a plateau when the fixed warm-up ends: a
    rise that slows down.  A leak rises at the same rate all along.  The test:
    split the samples from the candidate start on into halves; while the 95 %
    interval of the first half's slope lies wholly above the second half's
    (:func:`slope_ci95`), move the start on by a quarter of them, as long as
    the new start is at or before ``limit_iterations``.  A steady leak never
    passes the test, so it is measured from the fixed warm-up on; a leak on
    top of a slowing rise still shows in the later window.

    Args:
        meas: samples after the fixed warm-up (dicts with ``iterations`` and
            ``rss_mb``), oldest first.
        limit_iterations: the latest iteration count warm-up may extend to.

    Returns:
        0 when no extension applies, else the index of the first measured sample.
    """
    start = 0
    while len(meas) - start >= 2 * MIN_MEASURED_SAMPLES:
        rest = meas[start:]
        half = len(rest) // 2
        first = slope_ci95([s["iterations"] for s in rest[:half]], [s["rss_mb"] for s in rest[:half]])
        second = slope_ci95([s["iterations"] for s in rest[half:]], [s["rss_mb"] for s in rest[half:]])
        if first is None or second is None or not first[0] > second[1]:
            break
        nxt = start + max(1, half // 2)
        if meas[nxt]["iterations"] > limit_iterations:
            break
        start = nxt
    return start


def measured_samples(samples: list[dict], warm: WarmUp) -> tuple[list[dict], list[dict], int | None]:
    """The report's RSS samples (MiB) from the child's ``sample`` messages, and which are measured.

    Returns:
        ``(rss_samples, measured, fixed_end)``: every sample, each marked ``measured``;
        the measured ones (past the fixed warm-up and the plateau test,
        :func:`settled_start`); and the iteration count at the end of the fixed
        warm-up (None when no sample is past it).
    """
    rss_samples = [{
        "t": round(s["t"], 4),
        "iterations": s["iterations"],
        "rss_mb": round(s["rss"] / MIB, 3),
        "min_worker_reads": s.get("min_worker_reads", 0),
        "decoders": decoders_created(s),
        "measured": warm.over(s),
        **({"extra": s["extra"]} if s.get("extra") else {}),
    } for s in samples]
    meas = [s for s in rss_samples if s["measured"]]
    fixed_end = meas[0]["iterations"] if meas else None
    if meas:
        settled = settled_start(meas, PLATEAU_MAX_FRACTION * rss_samples[-1]["iterations"])
        for s in meas[:settled]:
            s["measured"] = False
        meas = meas[settled:]
    return rss_samples, meas, fixed_end


def memory_section(samples: list[dict], warm: WarmUp, warmup: float, max_growth_mb: float,
                   workers: int) -> dict:
    """The report's ``memory`` section from the child's ``sample`` messages, with its verdict and note."""
    rss_samples, meas, fixed_end = measured_samples(samples, warm)
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
        "warmup_reads_each": WARMUP_READS_EACH,
        "warmup_plateau_iterations": (warm_it - fixed_end) if fixed_end is not None else 0,
        "measured_iterations": (meas[-1]["iterations"] - meas[0]["iterations"]) if meas else 0,
        "thresholds": {"leak_slope_mb_per_1k": LEAK_SLOPE_MB_PER_1K,
                       "ok_slope_mb_per_1k": OK_SLOPE_MB_PER_1K,
                       "min_measured_samples": MIN_MEASURED_SAMPLES,
                       "min_measured_iterations": min_measured_iterations(workers),
                       "min_measured_reads_per_worker": MIN_MEASURED_READS_PER_WORKER,
                       "plateau_max_fraction": PLATEAU_MAX_FRACTION},
        "gpu": gpu_growth(meas),
        "samples": rss_samples,
    }
    gpu = max((v for k, v in (memory["gpu"] or {}).items() if k.endswith("growth_mb")), default=None)
    memory["verdict"], memory["note"] = memory_verdict(meas, growth, gpu, ci, max_growth_mb, workers)
    if memory["verdict"] == "inconclusive" and rss_samples:
        need = needed_iterations(rss_samples, meas, ci, warmup, workers)
        if need is not None:
            done, seconds = rss_samples[-1]["iterations"], rss_samples[-1]["t"]
            pace = f" (about {need * seconds / done:,.0f} s at this run's {done / seconds:,.0f} iterations/s)" \
                if done and seconds else ""
            memory["iterations_needed"] = need
            memory["note"] += f"; a verdict on this slide needs about --iterations {need:,}{pace}"
    return memory


def needed_iterations(rss_samples: list[dict], meas: list[dict], ci: tuple[float, float] | None,
                      warmup: float, workers: int) -> int | None:
    """About how many iterations a run of this slide, these workers and this ``warmup`` fraction needs
    for a verdict, from an inconclusive one, rounded up to a thousand; None where no number can be
    given (the slope's interval sits between the thresholds: a longer run may still be inconclusive).

    Two needs, the larger wins: enough after warm-up (:func:`min_measured_iterations`, with the
    warm-up the run had taken, or its ``warmup`` fraction of the longer run), and an interval narrow
    enough to lie under :data:`OK_SLOPE_MB_PER_1K`: a least-squares slope's interval narrows as the
    measured span to the power 3/2 when samples come at a steady pace.
    """
    done = rss_samples[-1]["iterations"]
    warm = meas[0]["iterations"] if meas else done
    measured = (meas[-1]["iterations"] - meas[0]["iterations"]) if meas else 0
    floor = min_measured_iterations(workers)
    # warm-up: the larger of what it took this run and its fraction of the longer run
    need = max(warm + floor, math.ceil(floor / max(1e-9, 1.0 - warmup)))
    if ci is not None and measured > 0:
        lo, hi = ci[0] * 1000.0, ci[1] * 1000.0
        half = (hi - lo) / 2
        # the slope taken as 0 where the interval holds 0 (a clean run's noise), else its centre
        slope = 0.0 if lo <= 0 else (lo + hi) / 2
        if slope >= OK_SLOPE_MB_PER_1K * 0.9:
            return None  # (the slope itself is near the threshold: length alone will not decide)
        if hi >= OK_SLOPE_MB_PER_1K:
            factor = (half / (OK_SLOPE_MB_PER_1K * 0.9 - slope)) ** (2 / 3)
            need = max(need, warm + math.ceil(measured * factor * 1.2))
    need = max(need, done + 1)
    return -(-need // 1000) * 1000
