"""The child process of ``wsitool stress``: the multi-threaded workload (floor 6, consumers).

This module runs in a separate Python process started by
:func:`wsitool.stress.runner.run_stress` (``python -c`` importing :func:`main`,
or ``python -m wsitool.stress.worker``), so that a crash in native decoding
code (SIGSEGV, abort) kills only the child and the parent can still write its
report.  It is not meant to be imported by users; the public API is
:mod:`wsitool.stress`.

Protocol:
    * The parent writes one JSON object, the run configuration built by
      :func:`wsitool.stress.config.plan_run`, to the child's standard input; the
      child's standard error goes to a file the parent reads after the run.
    * The child writes JSON lines to the file descriptor ``config["fd"]``
      (a pipe inherited from the parent): one ``{"type": "start", ...}``, then
      ``{"type": "sample", ...}`` messages at a fixed interval (RSS, iteration
      count, decoder counters, the checksums of the reads to verify and the
      first read errors), then one ``{"type": "done", ...}``.

Regions come from :func:`wsitool.stress.regions.region_for`; the test-only
faults (:mod:`wsitool.stress.faults`) are injected here.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback

import numpy as np

from ..codec.pool import get_pool
from ..opening import location_from_wire
from ..slide import open_slide
from .faults import injected_fault
from .regions import checksum, region_for
from .report import MAX_LISTED
from .samplers import load_samplers, rss


class OutBufferIgnored(RuntimeError):
    """``read_region(out=buf)`` returned another array than ``buf`` (counted as a read error)."""


class Workload:
    """The workload of one child: ``workers`` threads reading seeded regions of one shared ``slide``.

    ``cfg`` is the run configuration the parent sends (see the module
    docstring); messages go to ``pipe`` as JSON lines.  :meth:`run` returns
    when every worker is done and the ``done`` message is sent.
    """

    def __init__(self, cfg: dict, slide, pipe):
        self.cfg = cfg
        self.slide = slide
        self.pipe = pipe
        self.pipe_lock = threading.Lock()
        #: one sample at a time, taken and sent under it: samples reach the parent in the
        #: order they were taken (the fault path samples from a worker thread as well)
        self.sample_lock = threading.Lock()
        self.levels = cfg["levels"]
        self.mode = cfg["mode"]
        self.device = cfg["device"]
        self.read_threads = cfg["read_threads"]
        self.seed = cfg["seed"]
        self.K = cfg["verify_every"]
        self.target = cfg["iterations"]  # None in duration mode
        self.duration = cfg["duration"]
        self.fault = injected_fault()
        self._fault_lock = threading.Lock()
        self._fault_fired = False
        self.claim_lock = threading.Lock()
        self.next_index = 0
        self.completed = 0
        self.errors = 0
        self.by_level = [0] * (max(lv["index"] for lv in self.levels) + 1)
        #: reads each worker has completed (the parent's warm-up waits for every worker)
        self.worker_reads = [0] * cfg["workers"]
        self.pending_verify: list = []
        self.pending_errors: list = []
        self.listed_errors = 0
        self.stop = threading.Event()
        self.wake = threading.Event()
        self.finished = threading.Barrier(cfg["workers"] + 1)
        self.release = threading.Event()
        self.t0 = 0.0
        self.deadline = None
        self.samples_sent = 0
        self.leaked: list = []
        self.final: dict = {}
        self.samplers = load_samplers(cfg.get("samplers", ()))
        self.sampler_errors: dict[str, str] = {}

    # ------------------------------------------------------------ messages
    def send(self, msg: dict) -> None:
        line = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        with self.pipe_lock:
            try:
                self.pipe.write(line)
                self.pipe.flush()
            except (BrokenPipeError, ValueError):
                # The parent is gone (killed, interrupted): stop at once
                # rather than run on unobserved.
                os._exit(3)

    def decode_stats(self) -> dict:
        return dataclasses.asdict(get_pool(self.device).stats())

    def sample(self) -> dict:
        with self.sample_lock:
            return self._sample()

    def _sample(self) -> dict:
        extra = {}
        for name, fn in self.samplers:
            try:
                extra.update({str(k): float(v) for k, v in dict(fn()).items()})
            except Exception as exc:  # a broken sampler must not stop the run
                self.sampler_errors.setdefault(name, f"{type(exc).__name__}: {exc}")
        with self.claim_lock:
            verify, self.pending_verify = self.pending_verify, []
            errs, self.pending_errors = self.pending_errors, []
            completed, errors = self.completed, self.errors
            min_worker_reads = min(self.worker_reads) if self.worker_reads else 0
            worker_reads = list(self.worker_reads)
        msg = {
            "type": "sample",
            "t": time.monotonic() - self.t0,
            "iterations": completed,
            "min_worker_reads": min_worker_reads,
            "worker_reads": worker_reads,
            "errors": errors,
            "rss": rss(),
            "extra": extra,
            "decoder": self.decode_stats(),
            "by_level": list(self.by_level),
            "verify": verify,
            "error_list": errs,
        }
        self.send(msg)
        self.samples_sent += 1
        return msg

    # ------------------------------------------------------------ work
    def claim(self):
        with self.claim_lock:
            if self.stop.is_set():
                return None
            if self.target is not None and self.next_index >= self.target:
                return None
            if self.deadline is not None and time.monotonic() >= self.deadline:
                return None
            idx = self.next_index
            self.next_index += 1
            return idx

    def worker(self, wid: int) -> None:
        # One buffer per worker, allocated once, sized for the largest region;
        # each read uses a C-contiguous view over its first h*w*c elements.
        hi = self.cfg["size_bounds"][1]
        flat = np.zeros(hi * hi * self.cfg["channels"] * self.cfg["itemsize"], np.uint8)
        try:
            self._work(wid, flat)
        finally:
            # Wait, with buffers and decoders alive, until the final sample is taken.
            self.finished.wait()
            self.release.wait()

    def _work(self, wid: int, flat) -> None:
        itemsize = self.cfg["itemsize"]
        channels = self.cfg["channels"]
        dtype = np.dtype(self.cfg["dtype"])
        mine = 0
        while True:
            idx = self.claim()
            if idx is None:
                return
            level, x0, y0, w, h = region_for(self.seed, idx, self.levels, self.cfg["region_size"])
            try:
                if self.device == "cpu":
                    view = flat[: h * w * channels * itemsize].view(dtype).reshape(h, w, channels)
                    arr = self.slide.read_region((x0, y0), level, (w, h), out=view, mode=self.mode,
                                                 threads=self.read_threads)
                    if arr is not view:  # a reader that ignores caller buffers leaks
                        raise OutBufferIgnored(
                            f"read_region returned a new array instead of filling out= "
                            f"(level {level}, ({x0}, {y0}), {w}x{h})")
                else:  # GPU: CuPy output, copied to the host only for checksums
                    arr = self.slide.read_region((x0, y0), level, (w, h), mode=self.mode,
                                                 threads=self.read_threads, device=self.device)
                mine += 1
                if self.fault == "leak":
                    keep = np.empty(max(arr.nbytes, 256 * 1024), np.uint8)
                    keep[: arr.nbytes] = np.asarray(arr).reshape(-1).view(np.uint8)
                    keep[arr.nbytes:] = 1
                    self.leaked.append(keep)
                elif self.fault == "corrupt" and wid % 2 == 1 and mine % 2 == 0:
                    arr.reshape(-1).view(np.uint8)[0] ^= 0xFF
                elif self.fault == "segv" and self._fault_due():
                    self.sample()  # the progress the crash report shows is this moment's
                    os.kill(os.getpid(), signal.SIGSEGV)
                elif self.fault == "hang" and self._fault_due():
                    threading.Event().wait()  # a deadlock: never returns
                record = None
                if idx % self.K == 0:
                    host = arr if self.device == "cpu" else arr.get()
                    record = [idx, wid, level, x0, y0, w, h, checksum(host)]
                with self.claim_lock:
                    self.completed += 1
                    self.worker_reads[wid] += 1
                    self.by_level[level] += 1
                    if record is not None:
                        self.pending_verify.append(record)
                    if self.completed == self.cfg.get("warmup_iterations"):
                        self.wake.set()  # sample exactly at the end of warm-up
            except Exception as exc:
                with self.claim_lock:
                    self.completed += 1
                    self.worker_reads[wid] += 1
                    self.by_level[level] += 1
                    self.errors += 1
                    if self.listed_errors < MAX_LISTED:
                        self.listed_errors += 1
                        self.pending_errors.append({
                            "index": idx, "worker": wid, "level": level, "x": x0, "y": y0,
                            "width": w, "height": h, "type": type(exc).__name__,
                            "message": str(exc)[:500],
                        })

    def _fault_due(self) -> bool:
        """True for exactly one call, once the fault is due: a second thread
        sending SIGSEGV while faulthandler is still writing the first dump would
        kill the child mid-dump (seen as a cut "Fatal Python error: " line)."""
        if self.samples_sent < 2:
            return False
        if self.target is not None:
            due = self.completed >= max(1, self.target // 4)
        else:
            due = time.monotonic() - self.t0 >= 1.0
        if not due:
            return False
        with self._fault_lock:
            fired, self._fault_fired = self._fault_fired, True
        return not fired

    def monitor(self) -> None:
        interval = self.cfg["sample_interval"]
        while True:
            self.wake.wait(interval)
            self.wake.clear()
            if self.stop.is_set():
                self.final = self.sample()  # same threads alive as in every other sample
                return
            self.sample()

    def run(self) -> None:
        self.t0 = time.monotonic()
        if self.duration is not None:
            self.deadline = self.t0 + self.duration
        self.send({"type": "start", "pid": os.getpid(), "rss": rss(),
                   "fault": self.fault})
        self.sample()
        mon = threading.Thread(target=self.monitor, name="stress-monitor", daemon=True)
        mon.start()
        threads = [threading.Thread(target=self.worker, args=(i,), name=f"stress-worker-{i}")
                   for i in range(self.cfg["workers"])]
        for t in threads:
            t.start()
        # Every worker has run out of iterations but still holds its buffer and
        # its thread's decoder: the final sample sees the steady state, not
        # the memory released when the threads end.
        self.finished.wait()
        elapsed = time.monotonic() - self.t0
        self.stop.set()
        self.wake.set()
        mon.join()
        last = self.final
        self.release.set()
        for t in threads:
            t.join()
        self.send({"type": "done", "elapsed": elapsed, "iterations": last["iterations"],
                   "errors": last["errors"], "sampler_errors": self.sampler_errors})


def main() -> int:
    """The child's entry: read the run configuration from stdin, run the workload; the exit status."""
    cfg = json.loads(sys.stdin.read())
    # stderr is a file the parent reads after the run: a fatal signal leaves
    # the Python stack of every thread there.
    faulthandler.enable(file=sys.stderr, all_threads=True)
    pipe = os.fdopen(cfg["fd"], "wb", buffering=0)
    try:
        with open_slide(location_from_wire(cfg["location"])) as slide:
            Workload(cfg, slide, pipe).run()
    except BaseException as exc:
        traceback.print_exc()
        try:
            line = json.dumps({"type": "fatal", "error": f"{type(exc).__name__}: {exc}"})
            pipe.write((line + "\n").encode())
        except OSError:
            pass
        return 1
    finally:
        pipe.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
