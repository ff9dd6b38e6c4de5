"""The child-process side of ``wsitool stress``: the multi-threaded workload.

This module runs in a separate Python process started by
:func:`wsitool.stress.run_stress` (through :func:`main`), so that
a crash in native decoding code (SIGSEGV, abort) kills only the child and the
parent can still write its report.  It is not meant to be imported by users;
the public API is :mod:`wsitool.stress`.

Protocol:
    * The parent writes one JSON object, the run configuration built by
      :func:`wsitool.stress.run_stress`, to the child's standard input; the
      child's standard error goes to a file the parent reads after the run.
    * The child writes JSON lines to the file descriptor ``config["fd"]``
      (a pipe inherited from the parent): one ``{"type": "start", ...}``, then
      ``{"type": "sample", ...}`` messages at a fixed interval (RSS, iteration
      count, decoder counters, the checksums of the reads to verify and the
      first read errors), then one ``{"type": "done", ...}``.

Regions are a pure function of ``(seed, iteration index)``
(:func:`region_for`), so the parent and the tests can reproduce any read.

Test-only fault injection (never set it in production): the environment
variable ``WSITOOL_STRESS_FAULT`` makes the child misbehave on purpose, so the
tests can check that the stress report catches each kind of failure:

* ``leak`` -- every read keeps a reference to a copy of its decoded pixels
  (at least 256 KiB, written so the pages are resident), like a decoder that
  ignores the caller's buffer and never frees its own;
* ``corrupt`` -- worker threads with an odd id flip the first byte of every
  second read they make (pixels returned wrong under concurrency);
* ``segv`` -- once a quarter of the iterations is done (or after one second
  in ``--duration`` mode), the child sends itself SIGSEGV;
* ``hang`` -- from the same point on, every worker blocks forever (a
  deadlock), so the parent's stall timeout fires.
"""

from __future__ import annotations

import faulthandler
import hashlib
import importlib
import json
import os
import random
import signal
import sys
import threading
import time
import traceback

FAULT_ENV = "WSITOOL_STRESS_FAULT"
FAULTS = ("leak", "corrupt", "segv", "hang")

#: Placement kinds of a random region and their cumulative probabilities.
_KINDS = ((0.55, "inside"), (0.75, "edge"), (0.90, "top-left"), (1.0, "anywhere"))

MAX_LISTED = 10  # first errors forwarded with details


class OutBufferIgnored(RuntimeError):
    """``read_region(out=buf)`` returned another array than ``buf`` (counted as a read error)."""


def checksum(buf) -> str:
    """Hex BLAKE2b-128 digest of a C-contiguous buffer (any dtype)."""
    return hashlib.blake2b(memoryview(buf).cast("B"), digest_size=16).hexdigest()


def size_bounds(region_size: int) -> tuple[int, int]:
    """Smallest and largest region side drawn for ``region_size``: [size/2, 3*size/2]."""
    return max(1, region_size // 2), max(1, region_size + region_size // 2)


def region_for(seed: int, index: int, levels: list[dict], region_size: int):
    """The region read at iteration ``index``: ``(level, x0, y0, width, height)``.

    ``levels`` lists the candidate levels as dicts with ``index``, ``width``,
    ``height``, ``downsample``.  Width and height are drawn uniformly in
    :func:`size_bounds`; the position is inside the level (55 %), straddling
    its right/bottom edge (20 %), partly outside its top-left corner (15 %) or
    anywhere including wholly outside (10 %).  ``x0, y0`` are level-0 pixels.
    """
    rng = random.Random((seed << 40) ^ index)
    lv = levels[rng.randrange(len(levels))]
    lo, hi = size_bounds(region_size)
    w, h = rng.randint(lo, hi), rng.randint(lo, hi)
    lw, lh = lv["width"], lv["height"]
    u = rng.random()
    kind = next(name for p, name in _KINDS if u < p)
    if kind == "inside":
        x = rng.randint(0, max(0, lw - w))
        y = rng.randint(0, max(0, lh - h))
    elif kind == "edge":
        x = rng.randint(max(0, lw - w), lw - 1)
        y = rng.randint(max(0, lh - h), lh - 1)
    elif kind == "top-left":
        x = rng.randint(-w + 1, 0)
        y = rng.randint(-h + 1, 0)
    else:
        x = rng.randint(-w, lw + 32)
        y = rng.randint(-h, lh + 32)
    # the level-0 location that read_region maps back to level pixel (x, y)
    from .geometry import level0_coordinate

    ds = lv["downsample"]
    return lv["index"], level0_coordinate(x, ds), level0_coordinate(y, ds), w, h


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def process_counts() -> dict[str, float]:
    """Default extra sampler: ``{"threads": live Python threads, "open_fds": open file descriptors}``.

    A count that climbs through a run points at a thread or file-handle leak.
    """
    import psutil

    out = {"threads": float(threading.active_count())}
    try:
        out["open_fds"] = float(psutil.Process().num_fds())
    except (AttributeError, psutil.Error):  # num_fds is POSIX-only
        pass
    return out


def _load_samplers(names):
    """Import ``"module:function"`` sampler names (see wsitool.stress.SAMPLERS)."""
    out = []
    for name in names:
        mod, _, fn = name.partition(":")
        out.append((name, getattr(importlib.import_module(mod), fn)))
    return out


class _Workload:
    def __init__(self, cfg: dict, slide, pipe):
        import numpy as np

        self.np = np
        self.cfg = cfg
        self.slide = slide
        self.pipe = pipe
        self.pipe_lock = threading.Lock()
        self.levels = cfg["levels"]
        self.mode = cfg["mode"]
        self.device = cfg["device"]
        self.read_threads = cfg["read_threads"]
        self.seed = cfg["seed"]
        self.K = cfg["verify_every"]
        self.target = cfg["iterations"]  # None in duration mode
        self.duration = cfg["duration"]
        self.fault = os.environ.get(FAULT_ENV) or None
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
        self.samplers = _load_samplers(cfg.get("samplers", ()))
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
        import dataclasses

        from .codec.pool import get_pool

        return dataclasses.asdict(get_pool(self.device).stats())

    def sample(self) -> dict:
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
            "rss": _rss(),
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
        flat = self.np.zeros(hi * hi * self.cfg["channels"] * self.cfg["itemsize"], self.np.uint8)
        try:
            self._work(wid, flat)
        finally:
            # Wait, with buffers and decoders alive, until the final sample is taken.
            self.finished.wait()
            self.release.wait()

    def _work(self, wid: int, flat) -> None:
        np = self.np
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
        self.send({"type": "start", "pid": os.getpid(), "rss": _rss(),
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
    cfg = json.loads(sys.stdin.read())
    # stderr is a file the parent reads after the run: a fatal signal leaves
    # the Python stack of every thread there.
    faulthandler.enable(file=sys.stderr, all_threads=True)
    pipe = os.fdopen(cfg["fd"], "wb", buffering=0)
    try:
        from .slide import open_slide

        with open_slide(cfg["path"]) as slide:
            _Workload(cfg, slide, pipe).run()
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
