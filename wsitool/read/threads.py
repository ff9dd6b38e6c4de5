"""The decode threads of region reads: one shared pool per process, jobs handed out one at a time (floor 4).

A region's tile jobs sit in one shared iterator; each of the ``k`` threads (the
caller plus ``k - 1`` pool workers) takes the next job when it has finished its
last one, so threads that drew cheap partial tiles do not wait idle for one that
drew whole ones.  The pool is made on first use in each process (a forked child
makes its own, :mod:`wsitool.ground.forksafe`).
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from ..errors import TileDecodeError
from ..ground.forksafe import PerProcess

__all__ = ["thread_count", "batch_size", "run_threads", "run_jobs", "SharedJobs", "Once"]

_Job = TypeVar("_Job")


def _new_executor() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=max(4, os.cpu_count() or 1), thread_name_prefix="wsitool-decode")


_executor: PerProcess[ThreadPoolExecutor] = PerProcess(_new_executor)


def thread_count(threads: int | None, njobs: int) -> int:
    """Threads for a region of ``njobs`` tiles: ``threads`` (default: the CPU count), at most one per tile."""
    nthreads = threads if threads is not None else (os.cpu_count() or 1)
    return max(1, min(nthreads, njobs))


def batch_size(most: int, k: int, njobs: int, per_thread: int = 2) -> int:
    """Tiles per decode call: up to ``most``, but small enough that each of
    ``k`` threads gets about ``per_thread`` batches (so the shared queue still
    balances the work, also when the threads do not run equally fast)."""
    return most if k == 1 else max(1, min(most, njobs // (per_thread * k)))


def run_threads(k: int, work: Callable[[], Any], stop: Callable[[], Any]) -> None:
    """Run ``work()`` on the calling thread and ``k - 1`` pool threads; wait for
    all, call ``stop()`` after the first error and re-raise that error.  Each pool
    thread runs in a copy of the caller's context (its limits, :mod:`wsitool.ground.limits`)."""
    if k == 1:
        work()
        return
    executor = _executor.get()
    futures = [executor.submit(contextvars.copy_context().run, work) for _ in range(k - 1)]
    errors: list[BaseException] = []
    try:
        work()
    except BaseException as exc:  # wait for the others before raising
        errors.append(exc)
        stop()
    for fut in futures:
        failure = fut.exception()
        if failure is not None:
            errors.append(failure)
            stop()
    if errors:
        raise _first(errors)


def _first(errors: list[BaseException]) -> BaseException:
    """The error a multi-threaded read raises: the first that is not a tile's; else the tile
    error of the first tile in row-major order, whichever thread met its tile first (jobs
    are handed out in order and every job handed out finishes, so each tile before it was
    decoded, or failed too): the same error on every run, as with one thread."""
    others = [e for e in errors if not isinstance(e, TileDecodeError)]
    if others:
        return others[0]
    return min(errors, key=lambda e: (getattr(e, "row", 0), getattr(e, "col", 0)))


def run_jobs(jobs: Sequence[_Job], k: int, work: Callable[[Any], Any]) -> None:
    """``work(iterable)`` over ``jobs`` on ``k`` threads (the calling one among them): with
    one thread ``work(jobs)``, else each thread takes jobs from one :class:`SharedJobs`
    until none is left (:func:`run_threads`: the first error stops the rest, re-raised)."""
    if k == 1:
        work(jobs)
        return
    shared = SharedJobs(jobs)
    run_threads(k, lambda: work(shared), shared.stop)


class SharedJobs(Generic[_Job]):
    """Iterator over a job list shared by several threads (each job handed out once)."""

    def __init__(self, jobs: Sequence[_Job]):
        self._jobs = jobs
        self._next = 0
        self._lock = threading.Lock()

    def stop(self) -> None:
        """Hand out no more jobs (after an error: fail fast)."""
        with self._lock:
            self._next = len(self._jobs)

    def __iter__(self) -> SharedJobs[_Job]:
        return self

    def __next__(self) -> _Job:
        with self._lock:
            i = self._next
            if i >= len(self._jobs):
                raise StopIteration
            self._next = i + 1
        return self._jobs[i]


class Once:
    """``fn()`` run by the first thread that calls this; the others (and later calls) go on at
    once.  For set-up work that one of the threads sharing a job list can do while the others
    start on the jobs (the read-ahead advice of a region, the plan of the next patch batch)."""

    def __init__(self, fn: Callable[[], Any]):
        self._fn: Callable[[], Any] | None = fn
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            fn, self._fn = self._fn, None
        if fn is not None:
            fn()
