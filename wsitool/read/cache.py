"""A cache of decoded source tiles, shared by region reads of any number of slides (floor 4).

Region reads plan the tiles a region touches (:func:`wsitool.geometry.plan_tiles`)
and decode them; with a :class:`TileCache` given to :func:`wsitool.open_slide`
(``cache=``) each tile is looked up first and decoded only on a miss, whole (the
part of the tile inside the level), then kept for later reads of any region that
touches it.  A tile server, a patch pipeline or a viewer re-reads the same tiles
many times; they decode once.

Properties:

* **Keys**: ``(slide scope, level index, col, row, mode)``.  Each slide opened
  with the cache gets its own scope (:meth:`TileCache.scope`), so slides never
  share entries; closing the slide drops its entries.
* **Byte budget**: entries are counted by their ``nbytes``; the least recently
  used ones are evicted while the total is over ``max_bytes``.  A tile larger
  than the whole budget is decoded and returned but not kept.
* **Thread-safe**, with one decode per key at a time: when several threads miss
  the same tile together, one decodes it and the others wait for its result
  (counted as hits, ``waits``), so concurrent readers of overlapping regions do
  not decode a tile twice.
* **Never caches failures**: a tile whose decode raised is not stored; the error
  is given to the threads that waited for it, and the next read tries again.
* Entries are read-only ``(height, width, channels)`` arrays (uint8 for
  ``rgb``/``rgba``, the level's dtype for ``raw``).

What does not use it: reads on a GPU (``device="cuda"``), and the compiled JPEG
loop (:mod:`wsitool.codec.jpegloop`), which decodes straight into the caller's
buffer: with a cache a read takes the Python tile path
(:func:`wsitool.read.worker.decode_tile`), tile by tile.  Without a cache
nothing changes.

Standard library and numpy only; it knows nothing of decoding (the caller passes
the function that decodes a tile).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections import OrderedDict
from typing import Callable, Hashable

import numpy as np

__all__ = ["TileCache", "CacheStats", "CacheScope"]


@dataclasses.dataclass(frozen=True)
class CacheStats:
    """A snapshot of a :class:`TileCache`'s counters.

    Fields: ``hits`` (lookups answered from the cache, including ``waits``);
    ``misses`` (lookups that decoded); ``waits`` (lookups that waited for another
    thread's decode of the same tile); ``evictions``; ``failures`` (decodes that
    raised); ``entries``; ``bytes`` (sum of the entries' ``nbytes``);
    ``max_bytes`` (the budget).
    """

    hits: int
    misses: int
    waits: int
    evictions: int
    failures: int
    entries: int
    bytes: int
    max_bytes: int

    def as_dict(self) -> dict:
        """The fields as a JSON-ready dict."""
        return dataclasses.asdict(self)


class _Pending:
    """One decode in progress: the waiters block on ``done``."""

    __slots__ = ("done", "value", "error")

    def __init__(self):
        self.done = threading.Event()
        self.value: np.ndarray | None = None
        self.error: BaseException | None = None


class TileCache:
    """LRU cache of decoded tiles with a byte budget, shared by threads and slides.

    Args:
        max_bytes: the budget in bytes (``>= 0``; 0 keeps nothing but still
            counts misses).

    Raises:
        ValueError: ``max_bytes`` is negative or not an integer.
    """

    def __init__(self, max_bytes: int):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be an integer >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._loading: dict[Hashable, _Pending] = {}
        self._bytes = 0
        self._hits = self._misses = self._waits = self._evictions = self._failures = 0
        self._scopes = itertools.count(1)
        self._closed: set[int] = set()  # tokens of discarded scopes

    # ------------------------------------------------------------------ scopes

    def scope(self) -> "CacheScope":
        """A new scope: the view of this cache one slide reads through."""
        return CacheScope(self, next(self._scopes))

    def discard(self, token: int) -> None:
        """Drop every entry of scope ``token`` (a closed slide's tiles)."""
        with self._lock:
            self._closed.add(token)  # a load in flight for it is not stored afterwards
            for key in [k for k in self._entries if k[0] == token]:
                self._bytes -= self._entries.pop(key).nbytes

    # ------------------------------------------------------------------ lookups

    def get_or_load(self, key: Hashable, load: Callable[[], np.ndarray]) -> np.ndarray:
        """The entry for ``key``; on a miss ``load()`` makes it (once, whoever asks meanwhile).

        ``load`` returns the decoded tile (made read-only here); what it raises
        is raised to this caller and to every thread that waited for it, and
        nothing is stored.
        """
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
                self._hits += 1
                return value
            pending = self._loading.get(key)
            owner = pending is None
            if owner:
                pending = self._loading[key] = _Pending()
                self._misses += 1
            else:
                self._hits += 1
                self._waits += 1
        if not owner:
            pending.done.wait()
            if pending.error is not None:
                raise pending.error
            return pending.value
        try:
            value = load()
            value.setflags(write=False)
        except BaseException as exc:
            with self._lock:
                self._failures += 1
                del self._loading[key]
            pending.error = exc
            pending.done.set()
            raise
        with self._lock:
            del self._loading[key]
            if not (isinstance(key, tuple) and key and key[0] in self._closed):
                self._store(key, value)
        pending.value = value
        pending.done.set()
        return value

    def _store(self, key: Hashable, value: np.ndarray) -> None:
        """Insert under the lock, then evict least recently used entries while over budget."""
        if value.nbytes > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.nbytes
        self._entries[key] = value
        self._bytes += value.nbytes
        while self._bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.nbytes
            self._evictions += 1

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    # ------------------------------------------------------------------ upkeep

    def clear(self) -> None:
        """Drop every entry (counters are kept)."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def stats(self) -> CacheStats:
        """A consistent snapshot of the counters."""
        with self._lock:
            return CacheStats(self._hits, self._misses, self._waits, self._evictions,
                              self._failures, len(self._entries), self._bytes, self.max_bytes)

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        s = self.stats()
        return (f"TileCache({s.bytes}/{s.max_bytes} bytes, {s.entries} tiles, "
                f"{s.hits} hits, {s.misses} misses)")


class CacheScope:
    """One slide's view of a :class:`TileCache` (keys prefixed by the scope's token).

    Region reads call :meth:`tile`; :meth:`close` drops the slide's entries.
    """

    __slots__ = ("cache", "token")

    def __init__(self, cache: TileCache, token: int):
        self.cache = cache
        self.token = token

    def tile(self, level: int, col: int, row: int, mode: str,
             load: Callable[[], np.ndarray]) -> np.ndarray:
        """Tile ``(col, row)`` of ``level`` as read in ``mode``; ``load()`` decodes it on a miss."""
        return self.cache.get_or_load((self.token, level, col, row, mode), load)

    def close(self) -> None:
        """Drop this scope's entries."""
        self.cache.discard(self.token)
