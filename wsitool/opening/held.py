"""This process's open slides, by location: what the tasks that reopen a slide elsewhere share (floor 4½).

A Dask task, a batch worker or a server process is handed a slide's
:class:`~.location.Location` (picklable; a URL's carries its storage options) and the
identity the slide had when the work was planned (:func:`~.opener.slide_identity`), never
an open slide.  :func:`cached_slide` gives each process one open slide per location:

* a local file or folder is keyed by its absolute path and current ``(mtime_ns, size)``
  (16 most recent), so a rewritten file is opened afresh; a task whose identity is not the
  file's now is refused (:class:`~wsitool.errors.WsiError`, "changed since");
* a remote location is keyed by its URL and storage options (a task with other options, new
  credentials say, gets a slide opened with them); the 16 used last are held, threads asking
  for one at once open it once, and a slide whose identity is not the task's is refused.

A slide dropped from the cache (by a newer version, or past the 16) is not closed here: a task
may still read it; it closes when the last reference goes.

This module sits below the facade, so it is handed the facade's opener (an :data:`Opener`:
``opener(location) -> slide``, :func:`wsitool.open_slide`) rather than importing it; a
module-level function, so a task holding it pickles by reference.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import WsiError
from .location import Location
from .opener import file_stamp

__all__ = ["Opener", "HELD", "cached_slide", "read_chunk", "chunk_read_count"]

#: ``opener(location) -> slide``: the facade's way to open a slide (the slide has ``identity``,
#: ``closed``, ``close()``, ``path`` and ``read_region``).
Opener = Callable[[Location], Any]

#: Most slides held per process, of each of the two kinds (local, remote).
HELD = 16


@functools.lru_cache(maxsize=HELD)
def _open_local(opener: Opener, location: Location, stamp: tuple[int, int]) -> Any:
    return opener(location)


#: (opener, location) -> the slide; the HELD used last (the most recently used last)
_remote: dict[tuple[Opener, Location], Any] = {}
#: (opener, location) -> the lock one thread holds while it opens that slide (the others wait
#: and take its slide instead of opening, and closing, their own)
_opening: dict[tuple[Opener, Location], threading.Lock] = {}
_remote_lock = threading.Lock()


def _cached_remote(opener: Opener, location: Location, stamp: Sequence | None) -> Any:
    """:func:`cached_slide` of a remote location."""
    key = (opener, location)
    with _remote_lock:
        opening = _opening.setdefault(key, threading.Lock())
    with opening:
        with _remote_lock:
            held = _remote.get(key)
            if held is not None and not held.closed and (stamp is None or held.identity == tuple(stamp)):
                _remote[key] = _remote.pop(key)  # (the most recently used last)
                return held
        fresh = opener(location)
        now = fresh.identity
        if stamp is not None and tuple(stamp) != now:
            fresh.close()
            raise WsiError(f"{fresh.path}: the object changed since the task was built (size/ETag "
                           f"{tuple(stamp)[1:]} -> {now[1:]}); rebuild the Dask array")
        with _remote_lock:
            _remote.pop(key, None)
            _remote[key] = fresh
            while len(_remote) > HELD:
                gone = next(iter(_remote))
                del _remote[gone]
                _opening.pop(gone, None)
        return fresh


def cached_slide(opener: Opener, location: Location, stamp: Sequence | None = None) -> Any:
    """This process's shared open slide at ``location``, opened with ``opener`` (see the module
    notes); do not close it.

    Args:
        opener: ``opener(location) -> slide``.
        location: where the slide is (a local one is made absolute here).
        stamp: the identity the caller expects (:attr:`wsitool.Slide.identity` when the work was
            planned), or None (any).

    Raises:
        WsiError: ``stamp`` is given and the slide changed since it was taken.
        FileNotFoundError, UnsupportedFormatError, CorruptFileError: as the opener.
    """
    location = location.resolved()
    if location.remote:
        return _cached_remote(opener, location, stamp)
    now = file_stamp(location.target)
    if stamp is not None and tuple(stamp) != now:
        raise WsiError(f"{location.target}: the file changed since the task was built (mtime/size "
                       f"{tuple(stamp)} -> {now}); rebuild the Dask array")
    return _open_local(opener, location, now)


_chunk_reads = 0
_chunk_reads_lock = threading.Lock()


def chunk_read_count() -> int:
    """Number of chunk reads done by Dask arrays of levels (:func:`read_chunk`) in this process."""
    return _chunk_reads


def read_chunk(location: Location, stamp: tuple, level: int, x0: int, y0: int, w: int, h: int, threads: int, *,
               opener: Opener) -> np.ndarray:
    """Dask task: one chunk ``(h, w, 3)`` uint8 of a level of the slide at ``location``.

    ``(x0, y0)`` is the chunk's top-left in level-0 pixels, ``(w, h)`` its size in pixels of
    ``level``; ``stamp`` as in :func:`cached_slide`.  Bind ``opener``
    (``functools.partial(read_chunk, opener=...)``) to get the ``read_chunk``
    :func:`wsitool.read.lazy.level_array` takes.

    Raises:
        WsiError: the slide changed since ``stamp`` was taken; as ``read_region``.
    """
    global _chunk_reads
    slide = cached_slide(opener, location, stamp)
    with _chunk_reads_lock:
        _chunk_reads += 1
    result: np.ndarray = slide.read_region((x0, y0), level, (w, h), mode="rgb", threads=threads)
    return result
