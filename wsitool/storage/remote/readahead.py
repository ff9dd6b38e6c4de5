"""The advised ranges of a remote slide: fetched ahead, in parallel, within budgets per slide and per process (floor 1).

Before a region is decoded the region layer announces its tiles' byte ranges
(:meth:`ByteSource.advise <wsitool.storage.ByteSource.advise>`); a remote slide hands them to its
:class:`ReadAhead`: they are merged where the gap between them is at most :data:`MERGE_GAP` bytes
and fetched exactly (no block rounding), split at :data:`MAX_REQUEST`, at most ``concurrency``
requests in flight per slide, while the first tiles already decode.  Later reads inside these
ranges wait for them (:meth:`ReadAhead.take`, :meth:`ReadAhead.gather`) instead of fetching
blocks.

What a slide keeps is bounded: its own advised bytes (:attr:`ReadAhead.EXTENT_BYTES`, the oldest
finished ranges dropped past it), and those of every open remote slide of the process together
(:attr:`ReadAhead.PROCESS_EXTENT_BYTES`: the other slides drop theirs, least recently advised
first).  At interpreter exit the queued read-ahead of every open slide is dropped and none is
retried (:func:`_stop_at_exit`).
"""

from __future__ import annotations

import atexit
import bisect
import concurrent.futures as cf
import concurrent.futures.thread  # noqa: F401 - its exit hook registered before this module's (see below)
import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterable

from ...errors import RemoteUnavailableError, WsiError
from .fetch import Fetcher

__all__ = ["MERGE_GAP", "MAX_REQUEST", "AHEAD_QUEUE", "ReadAhead", "wait_for"]

#: Advised ranges closer than this are fetched as one request (the bytes between come along).
MERGE_GAP = 16 * 1024
#: Largest single request of an advised read (longer merged ranges are split, to fetch in parallel).
MAX_REQUEST = 4 * 1024 * 1024
#: Read-ahead (``advise(..., ahead=True)``) is dropped where it would leave more than this
#: many requests per unit of ``concurrency`` queued or in flight.
AHEAD_QUEUE = 8


class _Fetch(cf.Future):
    """The bytes of one advised range; ``started``: its request has left the queue (a
    reader timing out on one still queued says so)."""

    started = False


def wait_for(future: cf.Future, deadline: float, fetcher: Fetcher) -> bytes:
    """The bytes of ``future`` (an advised range, or a block another thread fetches), waited for
    until ``deadline`` (``time.monotonic()``).

    Raises:
        RemoteUnavailableError: not there by the deadline (saying so where its request was
            still queued behind the ``concurrency`` in flight); the fetch's own failure.
        RemoteChangedError, RemoteAccessError, WsiError: the fetch's failure.
    """
    try:
        return future.result(timeout=max(0.0, deadline - time.monotonic()))
    except cf.TimeoutError:
        options = fetcher.options
        if isinstance(future, _Fetch) and not future.started:  # (its request never went out)
            raise RemoteUnavailableError(
                f"{fetcher.shown}: no answer within the operation timeout of "
                f"{options.operation_timeout:g} s: the request was still queued behind the "
                f"{options.concurrency} in flight (a slow server; a larger operation_timeout "
                f"or concurrency lets it through)") from None
        raise RemoteUnavailableError(f"{fetcher.shown}: no answer within the operation timeout of "
                                     f"{options.operation_timeout:g} s") from None


class ReadAhead:
    """The advised ranges of one remote object of ``size`` bytes, fetched through ``fetcher``.

    Each is ``(start, end, seq, future)`` in :attr:`extents` (sorted by start; they may
    overlap); ``seq`` numbers the advice, the oldest first.
    """

    #: Advised bytes a slide keeps (the oldest ranges are dropped past this): what the
    #: regions being read now need, not a cache (decoded tiles are cached above).  For a
    #: small object at most twice its size (ranges of overlapping regions overlap), but
    #: never under :attr:`EXTENT_FLOOR`.
    EXTENT_BYTES = 64 * 1024 * 1024
    EXTENT_FLOOR = 8 * 1024 * 1024
    #: Advised bytes all the open remote slides of the process keep together (past it the
    #: other slides drop theirs, those advised least recently first: :meth:`_trim_others`).
    PROCESS_EXTENT_BYTES = 128 * 1024 * 1024

    def __init__(self, fetcher: Fetcher, size: int):
        self.fetcher = fetcher
        self.size = size
        self._lock = threading.Lock()
        self._closing = False
        self._pool: cf.ThreadPoolExecutor | None = None
        self.extents: list[tuple[int, int, int, cf.Future]] = []  # advised (start, end, seq, bytes), sorted
        self.held = 0  # bytes of the ranges in self.extents
        self._seq = 0
        self._guard = 1 << 62  # extents of this seq on (the last read's own advice) are never trimmed
        self.advised_at = time.monotonic()  # when this slide was last advised (_trim_others)
        _open.add(self)

    def after_fork(self) -> None:
        """In a forked child: no pool, no advised range, a fresh lock (the parent's threads are not ours)."""
        self._lock = threading.Lock()
        self._pool = None
        self.extents = []
        self.held = 0

    # -------------------------------------------------------------- advice

    def advise(self, ranges: Iterable[tuple[int, int]], ahead: bool = False) -> None:
        """Start fetching the ``(offset, count)`` ranges that no earlier advice holds whole:
        merged where the gap is at most :data:`MERGE_GAP`, split at :data:`MAX_REQUEST`, at
        most ``concurrency`` requests in flight.  Never raises: a failed fetch is raised by the
        read that needs its bytes.

        ``ahead``: read-ahead for a later batch, dropped whole where its new bytes and those
        still being fetched would pass a quarter of the extent budget, or its requests and
        those queued :data:`AHEAD_QUEUE` per unit of ``concurrency`` (a slow server, or
        batches larger than the budget: the ranges fetched for the batch being read now
        stay held until it reads them; that batch advises its own ranges when it starts)."""
        spans = sorted((max(0, o), min(self.size, o + c)) for o, c in ranges if c > 0 and o < self.size)
        jobs: list[tuple[int, int, _Fetch]] = []
        with self._lock:
            if self._closing:
                return
            # ranges an earlier advice holds are not asked for again, also where the rest of
            # this advice would merge them with new ones (the next batch of patches shares tiles
            # with the last)
            merged: list[list[int]] = []
            for s, e in spans:
                if self._covered(s, e):
                    continue
                if merged and s - merged[-1][1] <= MERGE_GAP:
                    merged[-1][1] = max(merged[-1][1], e)
                else:
                    merged.append([s, e])
            if ahead and not self._room(merged):
                return
            if not ahead and merged:
                self._guard = self._seq + 1  # (kept until the next read's advice: see _drop_oldest)
            for s, e in merged:
                for a in range(s, e, MAX_REQUEST):
                    b = min(e, a + MAX_REQUEST)
                    fut = _Fetch()
                    self._seq += 1
                    bisect.insort(self.extents, (a, b, self._seq, fut))
                    self.held += b - a
                    jobs.append((a, b, fut))
            if jobs and self._pool is None:
                self._pool = cf.ThreadPoolExecutor(self.fetcher.options.concurrency,
                                                   thread_name_prefix="wsitool-remote")
            pool = self._pool
        self.advised_at = time.monotonic()
        self._trim()
        self._trim_others()
        for k, (a, b, fut) in enumerate(jobs):
            assert pool is not None  # made above whenever there are jobs
            try:
                pool.submit(self._fill, a, b, fut)
            except RuntimeError:  # closed meanwhile (or the interpreter exiting): nothing more is fetched
                for _, _, left in jobs[k:]:
                    self._fail(left, WsiError(f"{self.fetcher.shown}: slide is closed"))
                return

    def _room(self, merged: list[list[int]]) -> bool:  # caller holds self._lock
        """Whether read-ahead of the ``merged`` spans fits (see :meth:`advise`)."""
        pending = [t for t in self.extents if not t[3].done()]
        requests = sum(-(-(e - s) // MAX_REQUEST) for s, e in merged) + len(pending)
        held = sum(e - s for s, e in merged) + sum(t[1] - t[0] for t in pending)
        return (requests <= AHEAD_QUEUE * self.fetcher.options.concurrency
                and 4 * held <= self.budget())

    def _covered(self, s: int, e: int) -> bool:  # caller holds self._lock
        k = bisect.bisect_right(self.extents, (s, float("inf"))) - 1
        for j in range(k, max(-1, k - 8), -1):
            a, b, _, _ = self.extents[j]
            if a <= s and b >= e:
                return True
        return False

    def _fill(self, a: int, b: int, fut: _Fetch) -> None:
        fut.started = True
        try:  # (the operation timeout counts from the request's start, not from its advice)
            data = self.fetcher.fetch(a, b, self.fetcher.deadline()).data
        except BaseException as exc:
            self._fail(fut, exc)
            return
        with contextlib.suppress(cf.InvalidStateError):  # (failed by stop_fetching meanwhile)
            fut.set_result(data)

    def _fail(self, fut: cf.Future, exc: BaseException) -> None:
        """Drop the extent of ``fut`` and hand its readers ``exc`` (unless it has its bytes)."""
        with self._lock:
            self.extents = [t for t in self.extents if t[3] is not fut]
            self.held = sum(t[1] - t[0] for t in self.extents)
        with contextlib.suppress(cf.InvalidStateError):
            fut.set_exception(exc)

    # -------------------------------------------------------------- reads

    def find(self, start: int, end: int) -> tuple[int, int, cf.Future] | None:
        """The advised extent holding ``[start, end)``, as ``(its start, its end, its future)``,
        or None."""
        with self._lock:
            k = bisect.bisect_right(self.extents, (start, float("inf"))) - 1
            for j in range(k, max(-1, k - 8), -1):  # (extents may overlap)
                s, e, _, fut = self.extents[j]
                if s <= start and e >= end:
                    return s, e, fut
        return None

    def take(self, offset: int, count: int, deadline: float) -> bytes | None:
        """Bytes ``offset .. offset + count - 1`` from an advised range holding them (waiting
        for it), or None where none does.

        Raises:
            RemoteUnavailableError, WsiError: the range's fetch failed, or not by ``deadline``.
        """
        end = offset + count
        hit = self.find(offset, end)
        if hit is None:
            return None
        s, _, fut = hit
        try:
            data = wait_for(fut, deadline, self.fetcher)
        except WsiError:
            raise
        except Exception:  # pragma: no cover - the advised fetch failed oddly: read the blocks
            return None
        if data is None:
            return None
        return bytes(data[offset - s:end - s])

    def gather(self, wanted: list[tuple[int, int]], deadline: float,
               read: Callable[[int, int], bytes]) -> list[tuple[int, bytes]]:
        """The bytes of the ``(offset, count)`` ranges ``wanted`` (inside the object), as
        ``(start, data)`` extents in ascending ``start`` that hold every range whole: a range an
        advised fetch holds waits for it; the others are advised now and waited for; where an
        advised fetch was dropped meanwhile, ``read(offset, count)`` reads the range.

        Raises:
            RemoteUnavailableError, RemoteChangedError, RemoteAccessError, WsiError: as
                :meth:`take` and ``read`` raise them.
        """
        found: dict[tuple[int, int], tuple[int, bytes]] = {}  # (start, end) -> extent
        for attempt in range(2):
            missing = []
            held = (0, 0)  # the bytes [a, b) of the extent found last (a row's tiles share one)
            for o, c in wanted:
                if held[0] <= o and o + c <= held[1]:
                    continue
                hit = self.find(o, o + c)
                if hit is None:
                    missing.append((o, c))
                    continue
                start, end, fut = hit
                if (start, end) not in found:
                    data = wait_for(fut, deadline, self.fetcher)
                    if data is None or len(data) < o + c - start:
                        missing.append((o, c))
                        continue
                    found[(start, end)] = (start, data)
                held = (start, start + len(found[(start, end)][1]))
            if not missing:
                break
            if attempt == 0:
                self.advise(missing)
            wanted = missing
        else:  # (an advised fetch dropped meanwhile: read the ranges as any read)
            for o, c in wanted:
                found[(o, o + c)] = (o, read(o, c))
        return sorted(found.values(), key=lambda e: e[0])

    # -------------------------------------------------------------- budgets

    def budget(self) -> int:
        """Bytes of advised ranges this slide keeps before the oldest finished ones are dropped."""
        return min(self.EXTENT_BYTES, max(self.EXTENT_FLOOR, 2 * self.size))

    def _trim(self) -> None:
        """Past this slide's budget, down to three quarters of it (:meth:`drop_oldest`)."""
        budget = self.budget()
        if self.held > budget:
            self.drop_oldest(budget * 3 // 4)

    def drop_oldest(self, keep: int) -> int:
        """Drop finished advised ranges, those advised first first, until at most ``keep``
        bytes are held; never those of the last read's own advice (a region or batch larger
        than the budget: they were dropped before it read them, and fetched again).  The
        newest finished ones are those of the batch being read now.  Returns the bytes dropped."""
        with self._lock:
            before = total = self.held
            gone = set()
            done = (t for t in self.extents if t[3].done() and t[2] < self._guard)
            for a, b, seq, _fut in sorted(done, key=lambda t: t[2]):
                if total <= keep:
                    break
                gone.add(seq)
                total -= b - a
            if gone:
                self.extents = [t for t in self.extents if t[2] not in gone]
                self.held = total
            return before - total

    def _trim_others(self) -> None:
        """Where the open remote slides of the process hold more than
        :attr:`PROCESS_EXTENT_BYTES` of advised ranges together, the other slides drop their
        finished ones (not their last read's own), the slide advised least recently first,
        down to three quarters of it: a server of many slides kept up to each one's budget
        for every slide it had served.  Takes one slide's lock at a time."""
        budget = self.PROCESS_EXTENT_BYTES
        others = list(_open)
        total = sum(other.held for other in others)  # (unlocked reads: an estimate is enough)
        if total <= budget:
            return
        for other in sorted((o for o in others if o is not self), key=lambda o: o.advised_at):
            total -= other.drop_oldest(0)
            if total <= budget * 3 // 4:
                return

    # -------------------------------------------------------------- lifetime

    def refuse(self) -> None:
        """No advice is taken from now on (the slide is closing)."""
        with self._lock:
            self._closing = True

    def close(self) -> None:
        """Refuse advice, cancel the queued fetches and stop the fetch threads (a request in
        flight ends as the fetcher's ``stop`` makes it), drop every range."""
        with self._lock:
            self._closing = True
            pool, self._pool = self._pool, None
            self.extents = []
            self.held = 0
        if pool is not None:
            # read-ahead nobody waits for: the queued fetches are cancelled; a request in flight
            # is not retried once closing, so this waits for one request at most
            pool.shutdown(wait=True, cancel_futures=True)
        _open.discard(self)

    def stop_fetching(self) -> None:
        """No request or retry starts from now on and the queued read-ahead is dropped (the
        interpreter is exiting); a read then raises "slide is closed"."""
        self.fetcher.stop.set()
        with self._lock:
            pool = self._pool
            pending = [t[3] for t in self.extents if not t[3].done()]
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        for fut in pending:  # (a reader waiting on a cancelled fetch would wait out its deadline)
            self._fail(fut, WsiError(f"{self.fetcher.shown}: slide is closed (the interpreter is exiting)"))


#: the read-ahead of the open remote slides of this process (their budget is shared; it is
#: stopped at interpreter exit)
_open: weakref.WeakSet[ReadAhead] = weakref.WeakSet()


def _stop_at_exit() -> None:
    """At interpreter exit, before ``concurrent.futures`` waits for its threads: the queued
    read-ahead of every open remote slide is dropped and none is retried (a slide never
    closed, against a server that stopped answering, kept the exit waiting through every
    queued request and its retries: 52 s)."""
    for readahead in list(_open):
        readahead.stop_fetching()


# (threading's exit hooks run before it joins the threads that are not daemons, the last
# registered first: this one before concurrent.futures', which waits for every queued item;
# atexit's would run after that wait)
with contextlib.suppress(RuntimeError):  # (imported while the interpreter shuts down: too late anyway)
    getattr(threading, "_register_atexit", atexit.register)(_stop_at_exit)
