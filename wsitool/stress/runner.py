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
from typing import cast

from ..errors import WsiError
from ..ground.signals import signal_name
from ..opening import parse_location
from ..types import Mode
from .config import (
    DEFAULT_MAX_GROWTH_MB,
    DEFAULT_SAMPLE_INTERVAL,
    DEFAULT_STALL_TIMEOUT,
    DEFAULT_VERIFY_EVERY,
    DEFAULT_WARMUP,
    RunPlan,
    plan_run,
)
from .memory import MIB, memory_section
from .report import MAX_LISTED, build_report
from .results import StressProgress, StressReport
from .verdict import crash_record, judge
from .verify import Verifier


def run_stress(
    path: str | os.PathLike, *, workers: int = 16, iterations: int | None = 10000,
    duration: float | None = None, region_size: int = 512, levels: str | Sequence[int] | None = None,
    seed: int = 0, verify_every: int = DEFAULT_VERIFY_EVERY, max_growth_mb: float = DEFAULT_MAX_GROWTH_MB,
    warmup: float = DEFAULT_WARMUP, sample_interval: float = DEFAULT_SAMPLE_INTERVAL,
    stall_timeout: float = DEFAULT_STALL_TIMEOUT, mode: str = "rgb", read_threads: int = 1, device: str = "cpu",
    samplers: Iterable[str] = (), progress: Callable[[StressProgress], None] | None = None,
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
        InvalidOptionError: ``workers``, ``iterations``, ``mode`` or another argument out of range (also a
            ValueError).
        InvalidRegionError: bad ``levels`` (not an index, out of range, or levels of different kinds).
        DeviceUnavailableError: ``device`` is CUDA and no CUDA device is usable.
        WsiError: the child could not start or failed before its first read.
    """
    plan = plan_run(
        parse_location(path, storage_options), workers=workers, iterations=iterations, duration=duration,
        region_size=region_size,
        levels=levels, seed=seed, verify_every=verify_every, max_growth_mb=max_growth_mb, warmup=warmup,
        sample_interval=sample_interval, stall_timeout=stall_timeout, mode=mode,
        read_threads=read_threads, device=device, samplers=samplers)
    verifier = Verifier(plan.location, cast(Mode, mode), device)  # checked by plan_run
    verifier.start()
    run = _StressRun(plan, verifier, progress, StressProgress(target=plan.iterations, duration_s=duration))
    return run.execute()


def child_bootstrap() -> str:
    """The ``python -c`` program of the child: import this very copy of wsitool (its folder
    goes first on ``sys.path`` unless it is already there, an installed package) and run
    :func:`wsitool.stress.worker.main`."""
    pkg_root = str(Path(__file__).resolve().parents[2])
    return (
        "import sys\n"
        f"root = {pkg_root!r}\n"
        "if root not in sys.path: sys.path.insert(0, root)\n"
        "from wsitool.stress.worker import main\n"
        "sys.exit(main())\n"
    )


def read_messages(rfd: int, messages: queue.Queue[dict | None]) -> None:
    """Put each JSON line the child writes on ``rfd`` on ``messages`` (a line cut by a crash
    is dropped), then None at the end of the pipe.  Runs on the reader thread."""
    with os.fdopen(rfd, "rb") as fh:
        for line in fh:
            with contextlib.suppress(ValueError):  # a line cut by a crash
                messages.put(json.loads(line))
    messages.put(None)


def stderr_text(trace_path: str) -> str:
    """The child's standard error as text: all of it up to 16,000 bytes, else its first and
    last 8,000 bytes (the crash header and the end); ``""`` when the file cannot be read."""
    try:
        with open(trace_path, "rb") as fh:
            raw = fh.read(8000)
            size = os.fstat(fh.fileno()).st_size
            if size > 16000:  # keep the head (crash header) and the tail only
                fh.seek(size - 8000)
                raw += b"\n[... cut ...]\n" + fh.read()
            else:
                raw += fh.read()
            return raw.decode("utf-8", "replace")
    except OSError:
        return ""


class _StressRun:
    """One run after its plan: the child process, what its messages say, the report.

    The steps, in the order :meth:`execute` takes them: :meth:`start_child`,
    :meth:`watch` (each message through :meth:`handle`), :meth:`verify_backlog`,
    :meth:`report`; :meth:`update_snapshot` feeds ``progress`` throughout.
    """

    def __init__(self, plan: RunPlan, verifier: Verifier, progress: Callable[[StressProgress], None] | None,
                 snap: StressProgress):
        self.plan = plan
        self.verifier = verifier
        self.progress = progress
        self.snap = snap
        self.samples: list[dict] = []
        self.errors_listed: list[dict] = []
        self.last: dict = {}
        self.done: dict | None = None
        self.fatal: str | None = None
        self.hang = False
        self.last_change = time.monotonic()
        self.last_iterations = -1

    def execute(self) -> StressReport:
        """Run the child to its end, verify the backlog and build the report.

        On an interrupt (KeyboardInterrupt, SIGTERM) the child is killed, the verifier
        stopped and the temporary folder removed before it propagates.
        """
        verifier = self.verifier
        tmpdir = tempfile.TemporaryDirectory(prefix="wsitool-stress-")
        trace_path = os.path.join(tmpdir.name, "child-stderr.txt")
        started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        t_start = time.monotonic()
        proc, rfd = self.start_child(trace_path, tmpdir)
        messages: queue.Queue[dict | None] = queue.Queue()
        rthread = threading.Thread(target=read_messages, args=(rfd, messages), name="stress-reader", daemon=True)
        rthread.start()
        self.last_change = time.monotonic()
        try:
            self.watch(proc, messages)
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
        try:
            self.verify_backlog()
        except BaseException:  # interrupted while verifying the backlog
            verifier.halt()
            tmpdir.cleanup()
            raise
        stderr_tail = stderr_text(trace_path)
        tmpdir.cleanup()
        report = self.report(status, stderr_tail, wall, started_at)
        self.update_snapshot("done")
        return report

    def start_child(self, trace_path: str, tmpdir: tempfile.TemporaryDirectory) -> tuple[subprocess.Popen, int]:
        """Start the child (its standard error to ``trace_path``), send it its configuration on
        its stdin; return the process and the read end of its message pipe.  If it cannot
        start, the verifier is stopped and ``tmpdir`` removed before the error propagates."""
        rfd, wfd = os.pipe()
        child_cfg = {**self.plan.child, "fd": wfd}
        try:
            with open(trace_path, "wb") as errfile:
                proc = subprocess.Popen(
                    [sys.executable, "-c", child_bootstrap()],
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errfile,
                    pass_fds=(wfd,), close_fds=True,
                )
        except BaseException:
            os.close(rfd)
            os.close(wfd)
            self.verifier.halt()
            tmpdir.cleanup()
            raise
        os.close(wfd)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(child_cfg).encode())
        proc.stdin.close()
        return proc, rfd

    def watch(self, proc: subprocess.Popen, messages: queue.Queue[dict | None]) -> None:
        """Handle the child's messages until its pipe ends; kill it when no iteration
        completed for ``stall_timeout`` seconds (a hang)."""
        stall_timeout = self.plan.config["stall_timeout_s"]
        while True:
            try:
                msg = messages.get(timeout=0.25)
            except queue.Empty:
                msg = {"type": "tick"}
            if msg is None:
                break
            self.handle(msg)
            if self.done is None and time.monotonic() - self.last_change > stall_timeout:
                self.hang = True
                proc.kill()

    def handle(self, msg: dict) -> None:
        """One message of the child: ``sample``, ``done``, ``fatal``, ``start``, or a ``tick``
        (no message for a quarter second)."""
        kind_ = msg.get("type")
        if kind_ == "sample":
            self.samples.append(msg)
            self.last = msg
            for rec in msg["verify"]:
                self.verifier.queue.put(rec)
            for e in msg["error_list"]:
                if len(self.errors_listed) < MAX_LISTED:
                    self.errors_listed.append(e)
            if msg["iterations"] != self.last_iterations:
                self.last_iterations = msg["iterations"]
                self.last_change = time.monotonic()
            self.update_snapshot("measuring")
        elif kind_ == "done":
            self.done = msg
        elif kind_ == "fatal":
            self.fatal = msg.get("error")
        elif kind_ == "start":
            self.last_change = time.monotonic()
        elif kind_ == "tick":
            self.update_snapshot(self.snap.phase)

    def verify_backlog(self) -> None:
        """Let the reference reader check what is still queued (the child is gone)."""
        self.verifier.queue.put(None)
        while self.verifier.is_alive():
            self.verifier.join(timeout=0.25)
            self.update_snapshot("verifying")

    def measured_start(self) -> dict | None:
        """The first sample past the warm-up, or None."""
        for s in self.samples:
            if self.plan.warm.over(s):
                return s
        return None

    def update_snapshot(self, phase: str) -> None:
        """Refresh the progress snapshot from the last sample and the verifier; hand it to ``progress``."""
        snap, last, verifier = self.snap, self.last, self.verifier
        snap.phase = phase
        if last:
            snap.elapsed_s = last["t"]
            snap.iterations = last["iterations"]
            snap.errors = last["errors"]
            snap.rss_mb = last["rss"] / MIB
            snap.reads_per_s = last["iterations"] / last["t"] if last["t"] > 0 else 0.0
            st = self.measured_start()
            snap.growth_mb = (last["rss"] - st["rss"]) / MIB if st is not None else None
            if phase in ("starting", "measuring", "warm-up"):
                snap.phase = "measuring" if st is not None else "warm-up"
        with verifier.lock:
            snap.verified = verifier.checked
            snap.mismatches = verifier.mismatches
        snap.verify_backlog = verifier.backlog()
        if self.progress is not None:
            self.progress(snap)

    def report(self, status: int, stderr_tail: str, wall: float, started_at: str) -> StressReport:
        """The report of the finished run (``status``: the child's exit status).

        Raises:
            WsiError: the child never ran a single sample (a start-up failure, not a result).
        """
        plan, last, verifier, cfg = self.plan, self.last, self.verifier, self.plan.config
        if not self.samples and self.done is None:
            reason = self.fatal or (stderr_tail.strip().splitlines() or ["no output"])[-1]
            if status < 0:
                reason = f"killed by {signal_name(-status)}"
            raise WsiError(f"{plan.location.shown}: the stress child process failed to start: {reason}")
        memory = memory_section(self.samples, plan.warm, cfg["warmup"], cfg["max_growth_mb"], cfg["workers"])
        crash = crash_record(status=status, hang=self.hang, done=self.done, fatal=self.fatal, last=last,
                             stall_timeout=cfg["stall_timeout_s"], stderr_tail=stderr_tail)
        problems, verdict = judge(crash=crash, hang=self.hang, mismatches=verifier.mismatches,
                                  read_errors=last.get("errors", 0), memory_verdict=memory["verdict"])
        return build_report(
            started_at=started_at, slide_info=plan.slide_info, config=cfg, last=last, done=self.done,
            wall=wall, memory=memory, verify_every=cfg["verify_every"], checked=verifier.checked,
            mismatches=verifier.mismatches, first_mismatches=verifier.listed, errors_listed=self.errors_listed,
            crash=crash, problems=problems, verdict=verdict)
