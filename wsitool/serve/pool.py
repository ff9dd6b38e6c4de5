"""The open slides of a server: opened on first use, at most a budget of descriptors open (floor 8).

A server lists its slides at start (:mod:`.registry`) and opens each when a request
first needs it.  :class:`OpenSlides` keeps the open ones in least-recently-used
order and counts the descriptors each holds (two for a TIFF-based slide, one per
file of a DICOM series; :attr:`~.registry.SlideEntry.files`): before a slide opens,
the least recently used ones are closed until it fits the budget.  A slide in use
is pinned (:meth:`OpenSlides.acquire` until :meth:`OpenSlides.release`) and never
closed: a request that reads it holds it from before its render is queued until
its answer is made.  When pinned slides alone fill the budget, a request for one
more is refused (:class:`~wsitool.errors.ResourceLimitError`; the server answers 503)
rather than going past it; a single slide larger than the budget opens when no
other is open.

The budget defaults to 3/8 of the process's descriptor limit (``ulimit -n``; at
least 16, at most 1024: 384 under the common 1024, i.e. 192 TIFF slides), leaving the
rest to connections (:mod:`.guard`), the interpreter and its libraries; ``wsitool
serve --max-open-files N`` sets it.  Memory goes with it: an open slide holds its
tile tables and metadata (a few KiB to a few MiB).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from ..errors import InvalidOptionError, ResourceLimitError, WsiError

if TYPE_CHECKING:
    from ..slide import Slide

__all__ = ["OpenSlides", "PoolEntry", "default_open_files", "descriptor_limit"]

#: Where the descriptor limit cannot be read (no ``resource`` module, unlimited): what is assumed.
_ASSUMED_LIMIT = 1024


def descriptor_limit() -> int:
    """The process's soft limit on open descriptors (``ulimit -n``); 1024 where it cannot be
    read or is unlimited."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return _ASSUMED_LIMIT
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return _ASSUMED_LIMIT if soft == resource.RLIM_INFINITY or soft <= 0 else int(soft)


def default_open_files(limit: int | None = None) -> int:
    """The default budget of descriptors for open slides: 3/8 of ``limit`` (default: the
    process's, :func:`descriptor_limit`), at least 16, at most 1024."""
    limit = descriptor_limit() if limit is None else limit
    return max(16, min(1024, limit * 3 // 8))


class PoolEntry(Protocol):
    """What the pool needs of an entry (:class:`~.registry.SlideEntry`): its id and the
    descriptors its open slide holds."""

    id: str
    files: int


#: the entries of one pool
E = TypeVar("E", bound=PoolEntry)


@dataclasses.dataclass
class _Held:
    """An open slide, the requests holding it and the descriptors it counts for."""

    slide: Slide
    pins: int
    files: int


class OpenSlides(Generic[E]):
    """Open slides by entry id, least recently used first, within ``budget`` descriptors.

    Args:
        opener: ``opener(entry) -> Slide``; what it raises, :meth:`acquire` raises.
        budget: descriptors the open slides may hold together (at least 1).

    Thread-safe: requests acquire from the event loop (:meth:`try_acquire`) and from
    worker threads (:meth:`acquire`); a slide is opened once however many ask for it at once.

    Raises:
        InvalidOptionError: ``budget < 1``.
    """

    def __init__(self, opener: Callable[[E], Slide], budget: int):
        if budget < 1:
            raise InvalidOptionError(f"max_open_files must be >= 1, got {budget}")
        self.budget = int(budget)
        self._opener = opener
        self._cond = threading.Condition()
        self._open: collections.OrderedDict[str, _Held] = collections.OrderedDict()
        self._opening: set[str] = set()
        self._used = 0  # descriptors of the open slides and of those being opened
        self._closed = False
        self.opened = 0  # opens so far
        self.evicted = 0  # slides closed to make room

    def try_acquire(self, entry: E) -> Slide | None:
        """``entry``'s slide, pinned, if it is open (never blocks on I/O); else None."""
        with self._cond:
            held = self._open.get(entry.id)
            if held is None:
                return None
            held.pins += 1
            self._open.move_to_end(entry.id)
            return held.slide

    def acquire(self, entry: E) -> Slide:
        """``entry``'s slide, pinned (call :meth:`release` once done with it): opened now (on
        this thread) unless it is open; the least recently used unpinned slides are closed first
        where it would not fit the budget.

        Raises:
            ResourceLimitError: pinned slides fill the budget (the server answers 503).
            WsiError: the slides are being closed (the server is stopping).
            Exception: whatever the opener raises (nothing is then held for ``entry``).
        """
        with self._cond:
            while True:
                if self._closed:
                    raise WsiError("the server is stopping")
                held = self._open.get(entry.id)
                if held is not None:
                    held.pins += 1
                    self._open.move_to_end(entry.id)
                    return held.slide
                if entry.id not in self._opening:
                    break
                self._cond.wait()  # another thread opens it
            victims = self._make_room(entry.files)
            self._opening.add(entry.id)
            self._used += entry.files
        _close(victims)
        try:
            slide = self._opener(entry)
        except BaseException:
            with self._cond:
                self._opening.discard(entry.id)
                self._used -= entry.files
                self._cond.notify_all()
            raise
        with self._cond:
            self._opening.discard(entry.id)
            self._cond.notify_all()
            if self._closed:  # closed while it opened
                self._used -= entry.files
                victims = [slide]
            else:
                self._open[entry.id] = _Held(slide, 1, entry.files)
                self.opened += 1
                victims = []
        if victims:
            _close(victims)
            raise WsiError("the server is stopping")
        return slide

    def _make_room(self, files: int) -> list[Slide]:
        """Take the least recently used unpinned slides out until ``files`` more fit the budget
        (the caller closes them, outside the lock); none where that cannot be done.

        Raises:
            ResourceLimitError: pinned (or opening) slides leave too little room, and some are open.
        """
        if self._used + files <= self.budget:
            return []
        out: list[str] = []
        freed = 0
        for sid, held in self._open.items():
            if held.pins == 0:
                out.append(sid)
                freed += held.files
                if self._used - freed + files <= self.budget:
                    break
        left = self._used - freed
        if left + files > self.budget and left > 0:
            raise ResourceLimitError(f"the open slides in use hold {left} of {self.budget} descriptors "
                                     "(--max-open-files): retry later")
        victims = []
        for sid in out:
            held = self._open.pop(sid)
            self._used -= held.files
            self.evicted += 1
            victims.append(held.slide)
        return victims

    def release(self, entry: E) -> None:
        """Let go of ``entry``'s slide, pinned by :meth:`acquire` or :meth:`try_acquire`."""
        with self._cond:
            held = self._open.get(entry.id)
            if held is not None and held.pins > 0:
                held.pins -= 1

    async def lease(self, entry: E, executor: concurrent.futures.Executor | None) -> Slide:
        """:meth:`acquire` from a coroutine: at once if the slide is open, else opened on
        ``executor`` (never on the event loop).  A lease the caller stops waiting for (its task
        cancelled) is released when the open ends.

        Raises:
            as :meth:`acquire`.
        """
        slide = self.try_acquire(entry)
        if slide is not None:
            return slide
        future = asyncio.get_running_loop().run_in_executor(executor, self.acquire, entry)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            def drop(done: asyncio.Future[Any]) -> None:
                if not done.cancelled() and done.exception() is None:
                    self.release(entry)

            future.add_done_callback(drop)
            raise

    def stats(self) -> dict[str, int]:
        """``open`` (slides), ``files`` (descriptors counted), ``budget``, ``opened`` and
        ``evicted`` (so far), ``pinned`` (slides in use now)."""
        with self._cond:
            return {"open": len(self._open), "files": self._used, "budget": self.budget,
                    "opened": self.opened, "evicted": self.evicted,
                    "pinned": sum(1 for h in self._open.values() if h.pins)}

    def close(self) -> None:
        """Close every open slide (pinned or not: at shutdown, once no request reads them); a
        slide still opening is closed when its open ends."""
        with self._cond:
            self._closed = True
            victims = [held.slide for held in self._open.values()]
            self._used -= sum(held.files for held in self._open.values())
            self._open.clear()
            self._cond.notify_all()
        _close(victims)


def _close(slides: list[Slide]) -> None:
    for slide in slides:
        with contextlib.suppress(Exception):
            slide.close()
