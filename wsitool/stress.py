"""Multi-threaded random-region stress run with a memory-leak and thread-safety report.

:func:`run_stress` answers three questions about the decoder stack on one
slide, with evidence: does memory grow, does any read return wrong pixels
under concurrency, does anything crash or hang.

How a run works:

1. The parent (the caller of :func:`run_stress`) opens the slide once to check
   it and the requested levels, then starts a **child process**
   (running :func:`wsitool.stress_worker.main`) that does all the work, so that a
   crash in native code (SIGSEGV, abort) kills only the child; the parent
   reports the signal and the last progress it saw.
2. In the child, ``workers`` threads share **one** opened
   :class:`~wsitool.slide.Slide`.  Each thread claims the next iteration index
   and reads the region :func:`wsitool.stress_worker.region_for` derives from
   ``(seed, index)``: a random level among ``levels``, width and height drawn
   uniformly in ``[region_size / 2, 3 * region_size / 2]``, placed inside the
   level, on its right/bottom edge, partly outside its top-left corner or
   anywhere (also wholly outside).  Every thread reads into its own output
   buffer, allocated once before the run and reused: a C-contiguous
   ``(height, width, channels)`` view over the start of one flat buffer sized
   for the largest region (``read_region(..., out=view)``).
3. Every ``verify_every``-th iteration (index divisible by K) the child sends
   the read's BLAKE2b checksum.  In the parent, a separate **fresh reader**
   (its own ``Slide``, opened before the child starts, in another process)
   reads the same region serially (``threads=1``, same mode) and compares
   checksums.  Mismatches are counted; the first ten are listed with their
   coordinates.
4. The child samples its resident set size (RSS, psutil) every
   ``sample_interval`` seconds together with the number of completed
   iterations and the decoder pool's counters (:class:`wsitool.decode.DecodeStats`).
   **Warm-up**: the first ``warmup`` fraction of the run (of the iterations,
   or of the duration with ``duration=``; default 10 %) lets decoders,
   per-thread scratch buffers and the allocator's arenas reach their working
   size; those samples are plotted but not measured.  After warm-up the report
   gives RSS at start and end, the peak, the growth (end - start) and the
   slope of a least-squares line through the (iterations, RSS) samples, in
   MB per 1,000 iterations.  MB means MiB (1,048,576 bytes) throughout.
5. Verdicts: ``leak`` when growth exceeds ``max_growth_mb``
   (:data:`DEFAULT_MAX_GROWTH_MB`), ``mismatch`` when any verified read
   differs, ``error`` when any read raised, ``crash`` when the child died
   (signal or non-zero exit), ``hang`` when no iteration completed for
   ``stall_timeout`` seconds (the child is then killed).  The report lists
   all that apply (``problems``); ``verdict`` is the most serious one in the
   order crash, hang, mismatch, error, leak, or ``ok``.

Exit codes of ``wsitool stress`` (:data:`EXIT_CODES`; chosen above the
general codes 1-9 of :mod:`wsitool.cli`): 0 ok, 10 leak, 11 mismatch,
12 read errors, 13 crash, 14 hang, 15 inconclusive (memory could not be judged:
too few samples after warm-up, or growth without a steady rise; see
:func:`_memory_verdict`).  Warm-up also lasts :data:`WARMUP_READS_PER_WORKER`
reads per worker and until the last decoder of the run was created.

The JSON report (:meth:`StressReport.to_dict`) follows the JSON Schema shipped
as ``wsitool/stress_report.schema.json`` (:func:`report_schema`).

Hook for extra per-sample measurements (e.g. GPU memory): :data:`SAMPLERS`
maps a device kind to ``"module:function"`` names; each function is imported
in the child and called at every sample with no argument, and must return a
mapping of name to number (e.g. ``{"gpu_used_mb": 812.0}``), stored under the
sample's ``extra``.  ``run_stress(samplers=...)`` adds more for one run.  The
default, :func:`wsitool.stress_worker.process_counts`, records the child's
thread count and open file descriptors.  A sampler that raises is reported in
``sampler_errors`` and does not stop the run.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import numpy as np

from .errors import InvalidRegionError, WsiError

__all__ = [
    "run_stress",
    "StressReport",
    "StressProgress",
    "EXIT_CODES",
    "DEFAULT_MAX_GROWTH_MB",
    "SAMPLERS",
    "report_schema",
    "validate_report",
    "write_report",
    "write_plot",
    "plot_available",
    "parse_levels",
]

#: Growth of RSS after warm-up (MiB) above which the verdict is ``leak``.
#: Clean 16-worker, 10,000-iteration runs on the shared samples (JPEG, JPEG
#: 2000, zstd, deflate) grow by 1.8 to 4.9 MiB, less than a tenth of this
#: (figures in the README); the leaks this check exists for grew by 1.6 GB to
#: 19 GB over such a run.  Small steady leaks show in ``slope_mb_per_1k`` of
#: a longer run (e.g. 50,000 iterations) before they cross the threshold.
DEFAULT_MAX_GROWTH_MB = 64.0
DEFAULT_VERIFY_EVERY = 10
DEFAULT_WARMUP = 0.1
DEFAULT_SAMPLE_INTERVAL = 0.1
DEFAULT_STALL_TIMEOUT = 120.0

#: Exit code of each verdict (``wsitool stress``).
EXIT_CODES: dict[str, int] = {"ok": 0, "leak": 10, "mismatch": 11, "error": 12, "crash": 13, "hang": 14,
                              "inconclusive": 15}
_SEVERITY = ("crash", "hang", "mismatch", "error", "leak", "inconclusive")

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

#: Extra per-sample measurement functions run in the child, by device kind
#: (``"cpu"`` or ``"cuda"``): ``"module:function"`` names, each returning a
#: mapping ``{name: number}``.  The GPU memory sampler registers itself here.
SAMPLERS: dict[str, list[str]] = {
    "cpu": ["wsitool.stress_worker:process_counts"],
    "cuda": ["wsitool.stress_worker:process_counts", "wsitool.read.cuda:gpu_memory_sample"],
}

MAX_LISTED = 10
_MIB = 1024.0 * 1024.0
_SCHEMA_FILE = "stress_report.schema.json"


# --------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------


@dataclasses.dataclass
class StressProgress:
    """A live snapshot handed to ``run_stress(progress=...)`` at every sample.

    Fields: ``elapsed_s`` (seconds since the workload started), ``iterations``
    (completed reads), ``target`` (iterations asked for, or None),
    ``duration_s`` (or None), ``reads_per_s``, ``rss_mb`` (child RSS, MiB),
    ``growth_mb`` (RSS now minus RSS at the end of warm-up, None during
    warm-up), ``verified``, ``mismatches``, ``errors``, ``phase``
    (``"starting"``, ``"warm-up"``, ``"measuring"``, ``"verifying"``, ``"done"``).
    """

    elapsed_s: float = 0.0
    iterations: int = 0
    target: Optional[int] = None
    duration_s: Optional[float] = None
    reads_per_s: float = 0.0
    rss_mb: float = 0.0
    growth_mb: Optional[float] = None
    verified: int = 0
    mismatches: int = 0
    errors: int = 0
    verify_backlog: int = 0
    phase: str = "starting"


@dataclasses.dataclass
class StressReport:
    """Outcome of :func:`run_stress`; :meth:`to_dict` gives the JSON report.

    Attributes:
        verdict: ``"ok"``, ``"leak"``, ``"mismatch"``, ``"error"``, ``"crash"``
            or ``"hang"`` (most serious problem, see the module docstring).
        problems: every verdict that applies (empty when ok).
        exit_code: :data:`EXIT_CODES` of ``verdict``.
        data: the full report as a JSON-ready dict (schema:
            ``stress_report.schema.json``).
    """

    verdict: str
    problems: list[str]
    exit_code: int
    data: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The JSON report (a deep copy is not made; do not mutate)."""
        return self.data

    @property
    def memory(self) -> dict[str, Any]:
        """The ``memory`` section: RSS figures in MiB and the samples."""
        return self.data["memory"]

    @property
    def ok(self) -> bool:
        """True when the verdict is ``ok``."""
        return self.verdict == "ok"


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def parse_levels(spec: str | Sequence[int] | None, level_count: int, path: str = "") -> list[int]:
    """Level indices from ``"all"``, ``"0,2"`` or a sequence; None means all.

    Raises:
        InvalidRegionError: a level is not an integer or out of range.
    """
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "all"):
        return list(range(level_count))
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[int] = []
    for item in items:
        try:
            lv = int(str(item).strip())
        except ValueError:
            raise InvalidRegionError(f"{path}: bad level {item!r} in --levels (use 'all' or e.g. '0,1')") from None
        if not 0 <= lv < level_count:
            raise InvalidRegionError(
                f"{path}: level {lv} out of range (the slide has {level_count} level(s): 0..{level_count - 1})"
            )
        if lv not in out:
            out.append(lv)
    if not out:
        raise InvalidRegionError(f"{path}: --levels selects no level")
    return out


def report_schema() -> dict:
    """The JSON Schema (draft 2020-12) of the stress report, shipped with the package."""
    from importlib import resources

    return json.loads(resources.files("wsitool").joinpath(_SCHEMA_FILE).read_text("utf-8"))


def validate_report(data: Mapping) -> None:
    """Validate a report dict against :func:`report_schema` (needs ``jsonschema``).

    Raises ``jsonschema.ValidationError`` when it does not conform.
    """
    import jsonschema

    jsonschema.Draft202012Validator(report_schema()).validate(data)


def _atomic_write(path: Path, write: Callable, report: "StressReport | None" = None) -> None:
    """Write ``path`` through :mod:`wsitool.atomic`: ``write(fh)`` fills a new exclusive
    temporary file, renamed onto ``path`` when complete (an existing report is
    replaced; the stressed slide never is)."""
    from . import atomic

    sources = ()
    if report is not None:
        try:
            sources = (report.data["slide"]["path"],)
        except (AttributeError, KeyError, TypeError):
            sources = ()
    path = Path(path)
    atomic.check_output(path, sources, overwrite=True)
    partial, fh = atomic.open_file(path, sources)
    with partial:
        with fh:
            write(fh)
        partial.commit(overwrite=True)


def write_report(report: StressReport, path: str | os.PathLike) -> None:
    """Write the JSON report to ``path`` atomically (temporary file, then rename)."""
    text = json.dumps(report.to_dict(), indent=2) + "\n"
    _atomic_write(Path(path), lambda fh: fh.write(text.encode("utf-8")), report)


def plot_available() -> bool:
    """True when matplotlib (the ``plot`` extra) can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_plot(report: StressReport, path: str | os.PathLike) -> None:
    """Plot RSS (MiB) against completed iterations to ``path`` (PNG, SVG or PDF by extension).

    The warm-up samples are drawn in grey, the least-squares line over the
    measured samples dashed.  Written atomically.

    Raises:
        ImportError: matplotlib is missing (``pip install 'wsitool[plot]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install 'wsitool[plot]'") from exc
    mem = report.memory
    samples = mem["samples"]
    warm = mem["warmup_iterations"]
    fig = Figure(figsize=(8, 4.5), dpi=100)
    ax = fig.add_subplot()
    xs = [s["iterations"] for s in samples]
    ys = [s["rss_mb"] for s in samples]
    measured = [s["measured"] for s in samples]
    ax.plot([x for x, m in zip(xs, measured) if not m], [y for y, m in zip(ys, measured) if not m],
            ".", color="0.6", label="warm-up")
    ax.plot([x for x, m in zip(xs, measured) if m], [y for y, m in zip(ys, measured) if m],
            ".-", color="tab:blue", label="RSS")
    if mem.get("fit_intercept_mb") is not None and mem.get("slope_mb_per_1k") is not None:
        mx = [x for x, m in zip(xs, measured) if m]
        fx = np.array([min(mx), max(mx)], dtype=float)
        ax.plot(fx, mem["fit_intercept_mb"] + mem["slope_mb_per_1k"] * fx / 1000.0, "--",
                color="tab:red", label=f"fit: {mem['slope_mb_per_1k']:+.3f} MB / 1k it")
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
    _atomic_write(Path(path), lambda fh: fig.savefig(fh, format=fmt), report)


def _fit(xs: Sequence[float], ys: Sequence[float]):
    """Least-squares line ``y = a + b x`` (2 or more samples); ``(a, b)`` or ``(None, None)``."""
    if len(xs) < 2 or max(xs) == min(xs):
        return None, None
    x = np.asarray(xs, float)
    y = np.asarray(ys, float)
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def _t975(dof: int) -> float:
    """Two-sided 95 % quantile of Student's t with ``dof`` degrees of freedom
    (Cornish-Fisher expansion around the normal quantile; exact to 0.01 from 3 on)."""
    z = 1.959963984540054
    if dof <= 0:
        return math.inf
    if dof in (1, 2):
        return (12.706204736, 4.302652730)[dof - 1]
    return (z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * dof**3))


def _slope_ci95(xs: Sequence[float], ys: Sequence[float]) -> Optional[tuple[float, float]]:
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
    h = _t975(n - 2) * se
    return float(b - h), float(b + h)


def _memory_verdict(meas: list, growth, gpu_growth, ci, max_growth_mb: float,
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
    if gpu_growth is not None and gpu_growth > max_growth_mb:
        return "leak", f"GPU memory grew by {gpu_growth:.1f} MB after warm-up"
    if growth is not None and growth > max_growth_mb:
        if ci is None or ci[0] > 0:
            return "leak", f"RSS grew by {growth:.1f} MB after warm-up" + (", steadily" if ci else "")
        return "inconclusive", (
            f"RSS grew by {growth:.1f} MB after warm-up, but not steadily (the slope's 95 % interval "
            "includes 0): run longer to tell a leak from a step")
    return "ok", None


def _excerpt(text: str, keep: int = 3000) -> str:
    """Head and tail of ``text`` (the crash header and the last frames)."""
    if len(text) <= 2 * keep:
        return text
    return text[:keep] + "\n[... cut ...]\n" + text[-keep:]


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


# --------------------------------------------------------------------------
# The fresh reference reader (parent side)
# --------------------------------------------------------------------------


class _Verifier(threading.Thread):
    """Reads each region to verify with its own Slide, serially, and compares."""

    def __init__(self, path: str, mode: str, device: str):
        super().__init__(name="stress-verifier", daemon=True)
        from .slide import open_slide

        self.slide = open_slide(path)  # opened before the run: a fresh reader
        self.mode = mode
        self.device = device
        self.queue: "queue.Queue[Optional[list]]" = queue.Queue()
        self.checked = 0
        self.mismatches = 0
        self.listed: list[dict] = []
        self.lock = threading.Lock()
        self._halt = threading.Event()

    def run(self) -> None:
        from .stress_worker import checksum

        try:
            while True:
                rec = self.queue.get()
                if rec is None or self._halt.is_set():
                    return
                idx, wid, level, x0, y0, w, h, got = rec
                error = None
                try:
                    arr = self.slide.read_region((x0, y0), level, (w, h), mode=self.mode, threads=1,
                                                 device=self.device)
                    if self.device != "cpu":
                        arr = arr.get()
                    expected = checksum(np.ascontiguousarray(arr))
                except Exception as exc:  # the reference itself failed
                    expected, error = None, f"{type(exc).__name__}: {exc}"[:500]
                with self.lock:
                    self.checked += 1
                    if expected != got:
                        self.mismatches += 1
                        if len(self.listed) < MAX_LISTED:
                            item = {"index": idx, "worker": wid, "level": level, "x": x0, "y": y0,
                                    "width": w, "height": h, "checksum": got, "expected": expected}
                            if error:
                                item["reference_error"] = error
                            self.listed.append(item)
        finally:
            self.slide.close()

    def backlog(self) -> int:
        return self.queue.qsize()

    def halt(self) -> None:
        """Stop without verifying the backlog and wait until the thread has ended.

        Called when the run is interrupted (Ctrl-C, SIGTERM): a daemon thread
        still inside a native decode while the interpreter exits aborts the
        process ("terminate called without an active exception", exit 134),
        so the thread finishes its current read and is joined first.
        """
        self._halt.set()
        self.queue.put(None)
        if self.is_alive() and self is not threading.current_thread():
            self.join()


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------


def _decoders(sample: dict) -> int:
    """Decoders the child had created at ``sample`` (one per reading thread)."""
    return int((sample.get("decoder") or {}).get("decoders_created", 0))


def _gpu_growth(measured: list[dict]) -> Optional[dict]:
    """GPU memory after warm-up from the ``gpu_memory_sample`` sampler, or None.

    Growth (end - start, MiB) of CuPy's pool bytes in use and of the device's
    used memory; either above ``max_growth_mb`` makes the verdict ``leak``.
    """
    rows = [s["extra"] for s in measured if "device_used_bytes" in s.get("extra", {})]
    if not rows:
        return None
    out: dict[str, float] = {}
    for key, name in (("pool_used_bytes", "pool_used"), ("device_used_bytes", "device_used")):
        start, end = rows[0][key] / _MIB, rows[-1][key] / _MIB
        out[f"{name}_start_mb"] = round(start, 3)
        out[f"{name}_end_mb"] = round(end, 3)
        out[f"{name}_growth_mb"] = round(end - start, 3)
    return out


def run_stress(
    path: str | os.PathLike,
    *,
    workers: int = 16,
    iterations: Optional[int] = 10000,
    duration: Optional[float] = None,
    region_size: int = 512,
    levels: str | Sequence[int] | None = None,
    seed: int = 0,
    verify_every: int = DEFAULT_VERIFY_EVERY,
    max_growth_mb: float = DEFAULT_MAX_GROWTH_MB,
    warmup: float = DEFAULT_WARMUP,
    sample_interval: float = DEFAULT_SAMPLE_INTERVAL,
    stall_timeout: float = DEFAULT_STALL_TIMEOUT,
    mode: str = "rgb",
    read_threads: int = 1,
    device: str = "cpu",
    samplers: Iterable[str] = (),
    progress: Optional[Callable[[StressProgress], None]] = None,
) -> StressReport:
    """Stress one slide with many threads reading random regions; return the report.

    Args:
        path: the slide (any format :func:`wsitool.open_slide` reads).
        workers: reader threads sharing one ``Slide`` in the child (>= 1).
        iterations: total reads over all workers (>= 1); ignored if ``duration`` is set.
        duration: run for this many seconds instead of a fixed iteration count.
        region_size: nominal region side in pixels of the level; sides are
            drawn in ``[region_size / 2, 3 * region_size / 2]``.
        levels: ``None`` / ``"all"`` or level indices (``"0,1"`` or a list).
        seed: non-negative integer; the same seed gives the same regions.
        verify_every: K; iterations whose index is divisible by K are checked
            against the fresh reference reader (1 = every read).
        max_growth_mb: RSS growth after warm-up (MiB) above which the verdict is ``leak``.
        warmup: fraction of the run (iterations, or duration) excluded from
            the memory measurement, in ``[0, 0.9]``.
        sample_interval: seconds between RSS samples.
        stall_timeout: seconds without a completed iteration after which the
            child is killed and the verdict is ``hang``.
        mode: ``"rgb"`` (default: tiles decode straight into the caller's
            buffer), ``"rgba"`` or ``"raw"``, as in :meth:`Slide.read_region`.
        read_threads: ``threads=`` of each read (default 1: the parallelism
            comes from the workers, as in a data loader).
        device: ``"cpu"`` or ``"cuda[:N]"``.
        samplers: extra ``"module:function"`` per-sample measurements (see
            :data:`SAMPLERS`).
        progress: called with a :class:`StressProgress` at every sample (from
            the calling thread).

    Returns:
        A :class:`StressReport`; its verdict never raises: leaks, mismatches,
        read errors, crashes and hangs are results, not exceptions.

    Raises:
        FileNotFoundError, UnsupportedFormatError, CorruptFileError: the slide
            cannot be opened (checked in the parent before the child starts).
        InvalidRegionError: bad ``levels``, ``mode`` or other argument (also a ValueError).
        DeviceUnavailableError: ``device`` is CUDA and no CUDA device is usable.
        WsiError: the child could not start or failed before its first read.
    """
    from .version import __version__
    from .read.request import output_shape
    from .slide import open_slide
    from .stress_worker import size_bounds

    path = os.fspath(path)
    if device != "cpu":
        from .device import cuda_device_id

        cuda_device_id(device)  # DeviceUnavailableError: "no CUDA device available ..."
    kind = "cpu" if device == "cpu" else "cuda"

    def bad(msg: str) -> InvalidRegionError:
        return InvalidRegionError(f"{path}: {msg}")

    if workers < 1:
        raise bad(f"workers must be >= 1, got {workers}")
    if duration is not None:
        if not duration > 0:
            raise bad(f"duration must be > 0 seconds, got {duration}")
        iterations = None
    elif iterations is None or iterations < 1:
        raise bad(f"iterations must be >= 1, got {iterations}")
    if region_size < 1:
        raise bad(f"region_size must be >= 1, got {region_size}")
    if seed < 0:
        raise bad(f"seed must be >= 0, got {seed}")
    if verify_every < 1:
        raise bad(f"verify_every must be >= 1, got {verify_every}")
    if not 0 <= warmup <= 0.9:
        raise bad(f"warmup must be a fraction in [0, 0.9], got {warmup}")
    if mode not in ("rgb", "rgba", "raw"):
        raise bad(f"mode must be rgb, rgba or raw, got {mode!r}")
    if read_threads < 1:
        raise bad(f"read_threads must be >= 1, got {read_threads}")
    if not sample_interval > 0 or not stall_timeout > 0 or not max_growth_mb >= 0:
        raise bad("sample_interval and stall_timeout must be > 0, max_growth_mb >= 0")

    with open_slide(path) as probe:
        level_ids = parse_levels(levels, probe.level_count, path)
        lv_info = [{"index": lv.index, "width": lv.width, "height": lv.height,
                    "downsample": lv.downsample} for lv in probe.levels if lv.index in level_ids]
        slide_info = {
            "path": path,
            "vendor": probe.vendor,
            "levels": [{"index": lv.index, "width": lv.width, "height": lv.height,
                        "downsample": lv.downsample, "tile_width": lv.tile_width,
                        "tile_height": lv.tile_height, "compression": lv.compression,
                        "decoder": lv.decoder} for lv in probe.levels],
        }
        (_, _, channels), dtype = output_shape(probe.levels[level_ids[0]], (1, 1), mode)
        shapes = {output_shape(probe.levels[i], (1, 1), mode) for i in level_ids}
        if len(shapes) != 1:  # levels always share samples and dtype; keep the guard
            raise bad(f"levels {level_ids} differ in samples or dtype for mode {mode!r}")

    all_samplers = list(SAMPLERS.get(kind, [])) + [s for s in samplers]
    lo, hi = size_bounds(region_size)
    per_worker_warmup = WARMUP_READS_PER_WORKER * workers
    warmup_iterations = (max(math.ceil(warmup * iterations), per_worker_warmup)
                         if iterations is not None else None)
    warmup_seconds = warmup * duration if duration is not None else None
    config = {
        "workers": workers, "iterations": iterations, "duration_s": duration,
        "region_size": region_size, "size_range": [lo, hi], "levels": level_ids, "seed": seed,
        "verify_every": verify_every, "max_growth_mb": max_growth_mb, "warmup": warmup,
        "sample_interval_s": sample_interval, "stall_timeout_s": stall_timeout, "mode": mode,
        "read_threads": read_threads, "device": device, "samplers": all_samplers,
    }

    verifier = _Verifier(path, mode, device)
    verifier.start()
    tmpdir = tempfile.TemporaryDirectory(prefix="wsitool-stress-")
    trace_path = os.path.join(tmpdir.name, "child-stderr.txt")
    rfd, wfd = os.pipe()
    child_cfg = {
        "path": path, "fd": wfd, "levels": lv_info, "mode": mode,
        "device": device, "read_threads": read_threads, "seed": seed, "verify_every": verify_every,
        "iterations": iterations, "duration": duration, "workers": workers,
        "region_size": region_size, "size_bounds": [lo, hi], "channels": channels,
        "dtype": np.dtype(dtype).str, "itemsize": np.dtype(dtype).itemsize,
        "sample_interval": sample_interval, "samplers": all_samplers,
        "warmup_iterations": warmup_iterations,
    }
    started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    t_start = time.monotonic()
    # The child must import this very copy of wsitool: its folder goes first on
    # sys.path unless it is already there (an installed package).
    pkg_root = str(Path(__file__).resolve().parents[1])
    bootstrap = (
        "import sys\n"
        f"root = {pkg_root!r}\n"
        "if root not in sys.path: sys.path.insert(0, root)\n"
        "from wsitool.stress_worker import main\n"
        "sys.exit(main())\n"
    )
    try:
        with open(trace_path, "wb") as errfile:
            proc = subprocess.Popen(
                [sys.executable, "-c", bootstrap],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errfile,
                pass_fds=(wfd,), close_fds=True,
            )
    except BaseException:
        os.close(rfd)
        os.close(wfd)
        verifier.halt()
        tmpdir.cleanup()
        raise
    os.close(wfd)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(child_cfg).encode())
    proc.stdin.close()

    messages: "queue.Queue[Optional[dict]]" = queue.Queue()

    def reader() -> None:
        with os.fdopen(rfd, "rb") as fh:
            for line in fh:
                try:
                    messages.put(json.loads(line))
                except ValueError:
                    pass  # a line cut by a crash
        messages.put(None)

    rthread = threading.Thread(target=reader, name="stress-reader", daemon=True)
    rthread.start()

    samples: list[dict] = []
    errors_listed: list[dict] = []
    last: dict = {}
    done: Optional[dict] = None
    fatal: Optional[str] = None
    hang = False
    last_change = time.monotonic()
    last_iterations = -1
    snap = StressProgress(target=iterations, duration_s=duration)

    def measured_start() -> Optional[dict]:
        for s in samples:
            if _is_measured(s):
                return s
        return None

    def _is_measured(s: dict, final_decoders: Optional[int] = None) -> bool:
        # Warm-up: the fraction of the run, WARMUP_READS_PER_WORKER reads per
        # worker (each thread's decoder, buffers and allocator arena reach their
        # working size on its own first reads) and, known after the run, every
        # decoder of the run created (threads the GIL let start late create
        # theirs late), whichever ends last.
        if s["iterations"] < per_worker_warmup:
            return False
        if final_decoders is not None and _decoders(s) < final_decoders:
            return False
        if warmup_iterations is not None:
            return s["iterations"] >= warmup_iterations
        return s["t"] >= warmup_seconds

    def update_snapshot(phase: str) -> None:
        snap.phase = phase
        if last:
            snap.elapsed_s = last["t"]
            snap.iterations = last["iterations"]
            snap.errors = last["errors"]
            snap.rss_mb = last["rss"] / _MIB
            snap.reads_per_s = last["iterations"] / last["t"] if last["t"] > 0 else 0.0
            st = measured_start()
            snap.growth_mb = (last["rss"] - st["rss"]) / _MIB if st is not None else None
            if phase in ("starting", "measuring", "warm-up"):
                snap.phase = "measuring" if st is not None else "warm-up"
        with verifier.lock:
            snap.verified = verifier.checked
            snap.mismatches = verifier.mismatches
        snap.verify_backlog = verifier.backlog()
        if progress is not None:
            progress(snap)

    try:
        eof = False
        while not eof:
            try:
                msg = messages.get(timeout=0.25)
            except queue.Empty:
                msg = {"type": "tick"}
            if msg is None:
                eof = True
                break
            kind_ = msg.get("type")
            if kind_ == "sample":
                samples.append(msg)
                last = msg
                for rec in msg["verify"]:
                    verifier.queue.put(rec)
                for e in msg["error_list"]:
                    if len(errors_listed) < MAX_LISTED:
                        errors_listed.append(e)
                if msg["iterations"] != last_iterations:
                    last_iterations = msg["iterations"]
                    last_change = time.monotonic()
                update_snapshot("measuring")
            elif kind_ == "done":
                done = msg
            elif kind_ == "fatal":
                fatal = msg.get("error")
            elif kind_ == "start":
                last_change = time.monotonic()
            elif kind_ == "tick":
                update_snapshot(snap.phase)
            if done is None and time.monotonic() - last_change > stall_timeout:
                hang = True
                proc.kill()
        rthread.join()
        status = proc.wait()
    except BaseException:  # KeyboardInterrupt, SIGTERM: do not leave the child or a thread behind
        proc.kill()
        proc.wait()
        verifier.halt()
        rthread.join(timeout=5.0)
        tmpdir.cleanup()
        raise
    wall = time.monotonic() - t_start

    # Verify the backlog: the child is gone, the reference reader continues.
    verifier.queue.put(None)
    try:
        while verifier.is_alive():
            verifier.join(timeout=0.25)
            update_snapshot("verifying")
    except BaseException:  # interrupted while verifying the backlog
        verifier.halt()
        tmpdir.cleanup()
        raise
    try:
        with open(trace_path, "rb") as fh:
            raw = fh.read(8000)
            size = os.fstat(fh.fileno()).st_size
            if size > 16000:  # keep the head (crash header) and the tail only
                fh.seek(size - 8000)
                raw += b"\n[... cut ...]\n" + fh.read()
            else:
                raw += fh.read()
            stderr_tail = raw.decode("utf-8", "replace")
    except OSError:
        stderr_tail = ""
    tmpdir.cleanup()

    if not samples and done is None:
        # The child never ran a single sample: a start-up failure, not a stress result.
        reason = fatal or (stderr_tail.strip().splitlines() or ["no output"])[-1]
        if status < 0:
            reason = f"killed by {_signal_name(-status)}"
        raise WsiError(f"{path}: the stress child process failed to start: {reason}")

    # ---------------------------------------------------------------- memory
    final_decoders = _decoders(samples[-1]) if samples else None
    rss_samples = [{
        "t": round(s["t"], 4),
        "iterations": s["iterations"],
        "rss_mb": round(s["rss"] / _MIB, 3),
        "min_worker_reads": s.get("min_worker_reads", 0),
        "decoders": _decoders(s),
        "measured": _is_measured(s, final_decoders),
        **({"extra": s["extra"]} if s.get("extra") else {}),
    } for s in samples]
    meas = [s for s in rss_samples if s["measured"]]
    first = meas[0] if meas else None
    warm_it = first["iterations"] if first else (rss_samples[-1]["iterations"] if rss_samples else 0)
    ci = None
    if meas:
        a, b = _fit([s["iterations"] for s in meas], [s["rss_mb"] for s in meas])
        ci = _slope_ci95([s["iterations"] for s in meas], [s["rss_mb"] for s in meas])
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
        "gpu": _gpu_growth(meas),
        "samples": rss_samples,
    }

    # ---------------------------------------------------------------- verdict
    completed = last.get("iterations", 0)
    read_errors = last.get("errors", 0)
    crashed = (status != 0 and not hang) or (done is None and not hang)
    crash = None
    if crashed or hang:
        crash = {
            "kind": "hang" if hang else ("signal" if status < 0 else "exit"),
            "signal": _signal_name(-status) if status < 0 else None,
            "exit_status": status,
            "message": (
                f"no iteration completed for {stall_timeout:g} s; child killed" if hang
                else f"child killed by {_signal_name(-status)}" if status < 0
                else f"child exited with status {status}" + (f": {fatal}" if fatal else "")
            ),
            "last_progress": {
                "t": round(last.get("t", 0.0), 4),
                "iterations": completed,
                "rss_mb": round(last.get("rss", 0) / _MIB, 3),
                "errors": read_errors,
            },
            "stderr_tail": _excerpt(stderr_tail),
        }
    problems = []
    if crash is not None:
        problems.append("hang" if hang else "crash")
    if verifier.mismatches:
        problems.append("mismatch")
    if read_errors:
        problems.append("error")
    gpu_growth = max((v for k, v in (memory["gpu"] or {}).items() if k.endswith("growth_mb")),
                     default=None)
    memory_verdict, memory_note = _memory_verdict(
        meas, growth, gpu_growth, ci, max_growth_mb, workers)
    memory["verdict"] = memory_verdict
    memory["note"] = memory_note
    if memory_verdict == "leak":
        problems.append("leak")
    elif memory_verdict == "inconclusive" and crash is None:
        problems.append("inconclusive")
    problems.sort(key=_SEVERITY.index)
    verdict = problems[0] if problems else "ok"
    elapsed = done["elapsed"] if done else last.get("t", 0.0)
    data = {
        "schema": "wsitool-stress-report",
        "schema_version": 1,
        "wsitool_version": __version__,
        "started_at": started_at,
        "verdict": verdict,
        "problems": problems,
        "exit_code": EXIT_CODES[verdict],
        "slide": slide_info,
        "config": config,
        "run": {
            "iterations_completed": completed,
            "reads_ok": completed - read_errors,
            "elapsed_s": round(elapsed, 4),
            "wall_s": round(wall, 4),
            "reads_per_s": round(completed / elapsed, 3) if elapsed > 0 else 0.0,
            "reads_by_level": {str(i): n for i, n in enumerate(last.get("by_level", [])) if n},
            "fault_injected": os.environ.get("WSITOOL_STRESS_FAULT") or None,
        },
        "memory": memory,
        "verification": {
            "every": verify_every,
            "checked": verifier.checked,
            "mismatches": verifier.mismatches,
            "first_mismatches": verifier.listed,
        },
        "errors": {"count": read_errors, "first": errors_listed},
        "decoder": last.get("decoder", {}),
        "crash": crash,
        "sampler_errors": (done or {}).get("sampler_errors", {}),
    }
    update_snapshot("done")
    return StressReport(verdict=verdict, problems=problems, exit_code=EXIT_CODES[verdict], data=data)


# --------------------------------------------------------------------------
# Rendering (used by the CLI)
# --------------------------------------------------------------------------


def live_table(p: StressProgress):
    """A rich Table of a :class:`StressProgress` for the live view."""
    from rich.table import Table

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
    from rich.table import Table

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
                             f"{dec['tiles_scratch']:,} via scratch, {dec['tiles_generic']:,} tifffile; "
                             f"{dec['scratch_allocations']} scratch allocations")
    if d["crash"]:
        c = d["crash"]
        lp = c["last_progress"]
        t.add_row("[red]crash[/]", f"{c['message']}; last progress: {lp['iterations']:,} iterations "
                                   f"at {lp['t']:.1f} s, RSS {lp['rss_mb']:.1f} MB")
    return t
