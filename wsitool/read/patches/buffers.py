"""The run buffers of the batch reader, reused across runs, batches and calls (floor 4)."""

from __future__ import annotations

import collections
import os
import threading

import numpy as np

__all__ = ["SPARE_BYTES", "RunBuffers"]


#: Most bytes of run buffers kept between calls (:class:`RunBuffers`): a one-thread read of
#: 240 x 240 tiles uses one 2.7 MB buffer a thread plus one per run carried (a few at most).
SPARE_BYTES = 32 << 20

_spare: list[np.ndarray] = []  # run buffers between calls, the one given back last at the end
_spare_lock = threading.Lock()


def _forget_spare() -> None:
    """In a forked child: a fresh lock (another thread may have held the parent's), no buffers."""
    global _spare_lock
    _spare_lock = threading.Lock()
    _spare.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_spare)


class RunBuffers:
    """Flat run buffers, reused across the runs and batches of one call: the one given back
    last is taken first (its pages most likely still in the cache).

    A call's buffers are kept for the next call when it ends (:meth:`close`; at most
    :data:`SPARE_BYTES` in all, process-wide): a fresh buffer's pages are faulted in and
    zeroed by the kernel on first write, a cost each pass of a patch grid paid again
    (about 4,700 page faults a pass on the 1,296-patch benchmark grid)."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self._free: collections.deque = collections.deque()  # append / pop: atomic

    def take(self) -> np.ndarray:
        try:
            return self._free.pop()
        except IndexError:
            pass
        with _spare_lock:
            for i in range(len(_spare) - 1, -1, -1):
                if _spare[i].nbytes == self.nbytes:
                    return _spare.pop(i)
        return np.empty(self.nbytes, np.uint8)

    def give(self, buf: np.ndarray) -> None:
        self._free.append(buf)

    def close(self) -> None:
        """Hand the free buffers on to later calls (the oldest kept ones dropped beyond
        :data:`SPARE_BYTES`); this object keeps none."""
        with _spare_lock:
            _spare.extend(reversed(self._free))  # the one given back last ends up last
            self._free.clear()
            total = sum(b.nbytes for b in _spare)
            while _spare and total > SPARE_BYTES:
                total -= _spare.pop(0).nbytes
