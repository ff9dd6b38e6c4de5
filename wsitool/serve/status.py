"""Counters of one server process, reported by ``/status``."""

from __future__ import annotations

import collections
import os
import threading
import time

__all__ = ["ServerCounters"]


class ServerCounters:
    """Request counters (thread-safe).

    ``in_flight``: requests being answered now; ``rendering``: of those, the ones
    decoding on a worker thread; ``waiting``: those queued for one (or for room in
    the render memory).  ``cancelled``: requests whose client left before their
    render started; ``cancelled_rendering``: renders stopped because their client
    left while they ran.  Totals by
    route kind (``iiif``, ``info``, ``dz``, ``page``, ``other``) and by status code.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self.started = time.time()
        self.in_flight = 0
        self.rendering = 0
        self.waiting = 0
        self.peak_in_flight = 0
        self.by_kind: collections.Counter = collections.Counter()
        self.by_status: collections.Counter = collections.Counter()
        self.bytes_sent = 0
        self.tiles_rendered = 0
        self.cancelled = 0
        self.cancelled_rendering = 0

    def begin(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def end(self, kind: str, status: int, nbytes: int) -> None:
        with self._lock:
            self.in_flight -= 1
            self.by_kind[kind] += 1
            self.by_status[status] += 1
            self.bytes_sent += nbytes

    def add(self, name: str, delta: int = 1) -> None:
        """Add ``delta`` to the counter attribute ``name`` (``rendering``, ``waiting``, ...)."""
        with self._lock:
            setattr(self, name, getattr(self, name) + delta)

    def snapshot(self) -> dict:
        """JSON-ready counters, with the process's resident memory (bytes)."""
        import psutil

        with self._lock:
            data = {
                "uptime_s": round(time.time() - self.started, 3),
                "requests_in_flight": self.in_flight,
                "peak_requests_in_flight": self.peak_in_flight,
                "rendering": self.rendering,
                "waiting": self.waiting,
                "requests": dict(self.by_kind),
                "status_codes": {str(k): v for k, v in sorted(self.by_status.items())},
                "bytes_sent": self.bytes_sent,
                "images_rendered": self.tiles_rendered,
                "cancelled_before_render": self.cancelled,
                "cancelled_while_rendering": self.cancelled_rendering,
            }
        data["rss_bytes"] = psutil.Process(os.getpid()).memory_info().rss
        return data
