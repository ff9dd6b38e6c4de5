"""The parent side of ``wsitool stress``: start the child, watch it, collect the outcome (floor 6, consumers).

:func:`run_stress` checks its arguments and the slide (:func:`~wsitool.stress.config.plan_run`),
starts the fresh reference reader (:class:`~wsitool.stress.verify.Verifier`)
and then a **child process** (``python -c`` importing
:func:`wsitool.stress.worker.main`) that does all the work, so that a crash in
native code (SIGSEGV, abort) kills only the child; the parent reports the
signal and the last progress it saw.  The child's JSON lines arrive on a pipe
(a reader thread puts them on a queue); the parent hands each sample to the
verifier and to ``progress``, kills the child when no iteration completed for
``stall_timeout`` seconds, verifies the backlog after the child is gone, keeps
the head and tail of the child's standard error, and builds the report
(:mod:`~wsitool.stress.memory`, :mod:`~wsitool.stress.verdict`,
:mod:`~wsitool.stress.report`).  An interrupt (Ctrl-C, SIGTERM) kills the
child and stops the verifier before it propagates.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from ..errors import WsiError
from ..signals import signal_name
from ..storage import redact
from .config import (
    DEFAULT_MAX_GROWTH_MB,
    DEFAULT_SAMPLE_INTERVAL,
    DEFAULT_STALL_TIMEOUT,
    DEFAULT_VERIFY_EVERY,
    DEFAULT_WARMUP,
    plan_run,
)
from .memory import MIB, memory_section
from .report import MAX_LISTED, build_report
from .results import StressProgress, StressReport
from .verdict import crash_record, judge
from .verify import Verifier


def run_stress(
    path: str | os.PathLike,
    *,
    workers: int = 16,
    iterations: int | None = 10000,
    duration: float | None = None,
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
    progress: Callable[[StressProgress], None] | None = None,
    storage_options: dict | None = None,
) -> StressReport:
    """Stress one slide with many threads reading random regions; return the report.

    Args:
        path: the slide (any format :func:`wsitool.open_slide` reads), or a slide URL.
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
        storage_options: for a slide URL, as :func:`wsitool.open_slide` (sent to
            the child on its stdin, never on its command line).

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
    plan = plan_run(
        path, workers=workers, iterations=iterations, duration=duration, region_size=region_size,
        levels=levels, seed=seed, verify_every=verify_every, max_growth_mb=max_growth_mb, warmup=warmup,
        sample_interval=sample_interval, stall_timeout=stall_timeout, mode=mode,
        read_threads=read_threads, device=device, samplers=samplers, storage_options=storage_options)
    path, iterations = plan.path, plan.iterations

    verifier = Verifier(path, mode, device, storage_options)
    verifier.start()
    tmpdir = tempfile.TemporaryDirectory(prefix="wsitool-stress-")
    trace_path = os.path.join(tmpdir.name, "child-stderr.txt")
    rfd, wfd = os.pipe()
    child_cfg = {**plan.child, "fd": wfd}
    started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    t_start = time.monotonic()
    # The child must import this very copy of wsitool: its folder goes first on
    # sys.path unless it is already there (an installed package).
    pkg_root = str(Path(__file__).resolve().parents[2])
    bootstrap = (
        "import sys\n"
        f"root = {pkg_root!r}\n"
        "if root not in sys.path: sys.path.insert(0, root)\n"
        "from wsitool.stress.worker import main\n"
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

    messages: queue.Queue[dict | None] = queue.Queue()

    def reader() -> None:
        with os.fdopen(rfd, "rb") as fh:
            for line in fh:
                with contextlib.suppress(ValueError):  # a line cut by a crash
                    messages.put(json.loads(line))
        messages.put(None)

    rthread = threading.Thread(target=reader, name="stress-reader", daemon=True)
    rthread.start()

    samples: list[dict] = []
    errors_listed: list[dict] = []
    last: dict = {}
    done: dict | None = None
    fatal: str | None = None
    hang = False
    last_change = time.monotonic()
    last_iterations = -1
    snap = StressProgress(target=iterations, duration_s=duration)

    def measured_start() -> dict | None:
        for s in samples:
            if plan.warm.over(s):
                return s
        return None

    def update_snapshot(phase: str) -> None:
        snap.phase = phase
        if last:
            snap.elapsed_s = last["t"]
            snap.iterations = last["iterations"]
            snap.errors = last["errors"]
            snap.rss_mb = last["rss"] / MIB
            snap.reads_per_s = last["iterations"] / last["t"] if last["t"] > 0 else 0.0
            st = measured_start()
            snap.growth_mb = (last["rss"] - st["rss"]) / MIB if st is not None else None
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
            reason = f"killed by {signal_name(-status)}"
        raise WsiError(f"{redact(path)}: the stress child process failed to start: {reason}")

    memory = memory_section(samples, plan.warm, warmup, max_growth_mb, workers)
    crash = crash_record(status=status, hang=hang, done=done, fatal=fatal, last=last,
                         stall_timeout=stall_timeout, stderr_tail=stderr_tail)
    problems, verdict = judge(crash=crash, hang=hang, mismatches=verifier.mismatches,
                              read_errors=last.get("errors", 0), memory_verdict=memory["verdict"])
    report = build_report(
        started_at=started_at, slide_info=plan.slide_info, config=plan.config, last=last, done=done,
        wall=wall, memory=memory, verify_every=verify_every, checked=verifier.checked,
        mismatches=verifier.mismatches, first_mismatches=verifier.listed, errors_listed=errors_listed,
        crash=crash, problems=problems, verdict=verdict)
    update_snapshot("done")
    return report
