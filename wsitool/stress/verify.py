"""The fresh reference reader of ``wsitool stress``: verifies the child's reads in the parent (floor 6, consumers).

Every ``verify_every``-th iteration (index divisible by K) the child sends the
read's BLAKE2b checksum (:func:`wsitool.stress.regions.checksum`).  In the
parent, :class:`Verifier` (its own ``Slide``, opened before the child starts,
in another process) reads the same region serially (``threads=1``, same mode)
and compares checksums.  Mismatches are counted; the first
:data:`~wsitool.stress.report.MAX_LISTED` are listed with their coordinates.
"""

from __future__ import annotations

import queue
import threading

import numpy as np

from ..opening import Location
from ..slide import open_slide
from ..types import Mode
from .regions import checksum
from .report import MAX_LISTED


class Verifier(threading.Thread):
    """Reads each region to verify with its own Slide, serially, and compares."""

    def __init__(self, location: Location, mode: Mode, device: str):
        super().__init__(name="stress-verifier", daemon=True)
        self.slide = open_slide(location)  # opened before the run: a fresh reader
        self.mode = mode
        self.device = device
        self.queue: queue.Queue[list | None] = queue.Queue()
        self.checked = 0
        self.mismatches = 0
        self.listed: list[dict] = []
        self.lock = threading.Lock()
        self._halt = threading.Event()

    def run(self) -> None:
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
