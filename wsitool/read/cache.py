"""A cache of decoded source tiles, shared by region reads of any number of slides (floor 4).

Region reads plan the tiles a region touches (:func:`wsitool.ground.geometry.plan_tiles`)
and decode them; with a :class:`TileCache` given to :func:`wsitool.open_slide`
(``cache=``) each tile is looked up first and decoded only on a miss, whole (the
part of the tile inside the level), then kept for later reads of any region that
touches it.  A tile server, a patch pipeline or a viewer re-reads the same tiles
many times; they decode once.

Properties:

* **Keys**: ``(slide scope, level index, col, row, mode)``.  Each slide opened
  with the cache gets its own scope (:meth:`TileCache.scope`), so slides never
  share entries; closing the slide drops its entries.
* **Byte budget that bounds what the cache holds**: each entry is counted at
  its cost (:func:`entry_cost`: its pixel bytes rounded up to whole pages,
  plus a fixed :data:`ENTRY_OVERHEAD` for the array header, the key and the
  LRU link), and the total the cache accounts (``bytes``) also counts

  - *entries being filled*: a miss reserves, before it decodes, the cost of
    the last tile stored for the same slide, level and mode (corrected when
    the decode returns);
  - *tiles that outlive eviction*: an evicted tile that a reader still holds
    (copying its pixels out) stays counted (``retired_bytes``) until the
    last reference goes.

  The least recently used entries are evicted while the total is over
  ``max_bytes``; a decoded tile that does not fit even then (the budget is
  taken by loads in flight and retired tiles, or the tile is larger than the
  budget) is returned to its reader but not kept.  So the tiles the cache
  keeps alive never take more than ``max_bytes`` (tested in
  tests/serve/test_tile_cache.py).
* **Its own memory**: kept tiles live in page-aligned anonymous memory maps
  of their own (a copy of the decoded array, made once per miss), not on the
  malloc heap: an evicted tile's pages go back to the operating system at
  once, and long-lived tiles do not pin the heap between short-lived request
  buffers (glibc cannot return a heap's free middle).  A miss that evicts a
  tile of its own size nobody holds reuses that tile's map (a full cache
  churning maps no new pages).
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

Standard library, numpy and :mod:`wsitool.errors` only; it knows nothing of decoding (the
caller passes the function that decodes a tile).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import mmap
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from ..errors import InvalidOptionError

__all__ = ["TileCache", "CacheStats", "CacheScope", "entry_cost", "ENTRY_OVERHEAD", "scope_for"]

#: Bytes counted per entry beyond its pixels: the array's header and memory
#: map object (~250), the key tuple and its ints (~150), the LRU dictionary's
#: slot and link (~100), rounded up.
ENTRY_OVERHEAD = 512

_PAGE = mmap.PAGESIZE


#: Tiles of at least this many bytes are kept in memory maps of their own;
#: smaller ones (a page would waste most of itself) stay on the heap.
MAP_MIN_BYTES = 32 << 10


def entry_cost(nbytes: int) -> int:
    """Bytes a kept tile of ``nbytes`` pixel bytes costs: its memory (whole pages from
    :data:`MAP_MIN_BYTES` on, else 16-byte malloc chunks plus a chunk header) plus
    :data:`ENTRY_OVERHEAD`."""
    if nbytes >= MAP_MIN_BYTES:
        return -(-nbytes // _PAGE) * _PAGE + ENTRY_OVERHEAD
    return -(-nbytes // 16) * 16 + 16 + ENTRY_OVERHEAD


def _own_copy(value: np.ndarray, buf: mmap.mmap | None = None) -> np.ndarray:
    """``value`` copied into a page-aligned anonymous memory map of its own (``buf``: the map
    of an evicted tile, reused, or a new one; unmapped when the array is freed); small tiles,
    and any tile when the system refuses a new map (Linux's ``vm.max_map_count``), are kept as
    they are."""
    if value.nbytes < MAP_MIN_BYTES:
        return value
    if buf is None or len(buf) != value.nbytes:
        _close(buf)
        try:
            buf = mmap.mmap(-1, value.nbytes)
        except OSError:
            return value
    out = np.frombuffer(buf, dtype=value.dtype).reshape(value.shape)
    out[...] = value
    return out


def _close(buf: mmap.mmap | None) -> None:
    """Unmap ``buf`` now if no array uses it any more (else it goes with its last array)."""
    if buf is not None:
        with contextlib.suppress(BufferError):
            buf.close()


def _mapping_of(value: np.ndarray) -> mmap.mmap | None:
    """The memory map under an array made by :func:`_own_copy`, or None."""
    base: object = value
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return base if isinstance(base, mmap.mmap) else None


def _refcount(value: object) -> int:
    return sys.getrefcount(value)


def _baseline() -> int:
    """References to an array that only the cache's eviction code holds, as :meth:`TileCache._drop` counts them."""
    value = np.empty(1)
    return _refcount(value)


#: What :func:`_refcount` gives inside :meth:`TileCache._drop` when nobody else holds the array
#: (its caller's local, the argument, getrefcount's own); calibrated once, not assumed.
_UNHELD = _baseline()


@dataclasses.dataclass(frozen=True)
class CacheStats:
    """A snapshot of a :class:`TileCache`'s counters.

    Fields: ``hits`` (lookups answered from the cache, including ``waits``);
    ``misses`` (lookups that decoded); ``waits`` (lookups that waited for another
    thread's decode of the same tile); ``evictions``; ``failures`` (decodes that
    raised); ``entries``; ``bytes`` (everything the cache accounts: the entries'
    costs, :func:`entry_cost`, plus ``pending_bytes`` and ``retired_bytes``;
    never above ``max_bytes`` after an operation, except transiently while
    loads in flight and retired tiles alone exceed it); ``max_bytes`` (the
    budget); ``pending_bytes`` (reserved by loads in flight);
    ``retired_bytes`` (evicted tiles still held by a reader); ``not_kept``
    (decoded tiles returned but not kept: no room).
    """

    hits: int
    misses: int
    waits: int
    evictions: int
    failures: int
    entries: int
    bytes: int
    max_bytes: int
    pending_bytes: int = 0
    retired_bytes: int = 0
    not_kept: int = 0

    def as_dict(self) -> dict[str, int]:
        """The fields as a JSON-ready dict."""
        return dataclasses.asdict(self)


class _Pending:
    """One decode in progress: the waiters block on ``done``; ``reserved`` bytes are accounted."""

    __slots__ = ("done", "value", "error", "reserved", "buf")

    def __init__(self, reserved: int = 0) -> None:
        self.done = threading.Event()
        self.value: np.ndarray | None = None
        self.error: BaseException | None = None
        self.reserved = reserved
        self.buf: mmap.mmap | None = None  # the map of an evicted tile, for this one (counted in ``reserved``)


class TileCache:
    """LRU cache of decoded tiles with a byte budget that bounds what it holds, shared by threads and slides.

    Args:
        max_bytes: the budget in bytes (``>= 0``; 0 keeps nothing but still
            counts misses).  It covers the kept tiles at their cost
            (:func:`entry_cost`), the reservations of loads in flight and the
            evicted tiles readers still hold (see the module docstring).

    Raises:
        InvalidOptionError: ``max_bytes`` is negative or not an integer (also a ``ValueError``).
    """

    def __init__(self, max_bytes: int) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise InvalidOptionError(f"max_bytes must be an integer >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        # (keys: any hashable; those of a CacheScope are tuples whose first item is the scope)
        self._entries: OrderedDict[Any, np.ndarray] = OrderedDict()
        self._loading: dict[Hashable, _Pending] = {}
        self._bytes = 0          # entries' costs
        self._pending = 0        # reservations of loads in flight
        self._retired = 0        # evicted tiles still referenced elsewhere
        self._released: list[int] = []  # retired costs freed (appended by weakref callbacks, lock-free)
        self._typical: dict[Any, int] = {}  # (scope, level, mode) -> bytes of the largest tile kept
        self._hits = self._misses = self._waits = self._evictions = self._failures = 0
        self._not_kept = 0
        self._scopes = itertools.count(1)
        self._closed: set[int] = set()  # tokens of discarded scopes

    # ------------------------------------------------------------------ scopes

    def scope(self) -> CacheScope:
        """A new scope: the view of this cache one slide reads through."""
        return CacheScope(self, next(self._scopes))

    def discard(self, token: int) -> None:
        """Drop every entry of scope ``token`` (a closed slide's tiles)."""
        with self._lock:
            self._closed.add(token)  # a load in flight for it is not stored afterwards
            for key in [k for k in self._entries if k[0] == token]:
                value = self._entries.pop(key)
                buf = self._drop(value)
                del value
                _close(buf)
            for key in [k for k in self._typical if k[0] == token]:
                del self._typical[key]

    # ------------------------------------------------------------------ accounting (under the lock)

    def _total(self) -> int:
        if self._released:  # retired tiles freed since: no longer held
            while self._released:
                self._retired -= self._released.pop()
        return self._bytes + self._pending + self._retired

    def _drop(self, value: np.ndarray) -> mmap.mmap | None:
        """Stop keeping ``value``; if a reader still holds it, its cost stays counted until freed;
        else the memory map under it (if any) is returned, for reuse or unmapping."""
        cost = entry_cost(value.nbytes)
        self._bytes -= cost
        # (every caller holds the popped array in one local and passes it on, as _baseline does)
        if _refcount(value) > _UNHELD + 1:
            self._retired += cost
            weakref.finalize(value, self._released.append, cost)
            return None
        return _mapping_of(value)

    def _evict_to(self, limit: int, reuse: int = 0) -> mmap.mmap | None:
        """Evict least recently used entries while the accounted total is over ``limit``.

        Returns the map of an evicted tile of ``reuse`` bytes that nobody holds (for the
        next tile of that size: no new pages to map and fault in), or None; the other
        evicted maps are unmapped."""
        found, maps = None, []
        while self._entries and self._total() > limit:
            _, evicted = self._entries.popitem(last=False)
            buf = self._drop(evicted)
            self._evictions += 1
            del evicted
            if buf is not None:
                if found is None and reuse and len(buf) == reuse:
                    found = buf
                else:
                    maps.append(buf)
        for buf in maps:
            _close(buf)
        return found

    @staticmethod
    def _kind(key: Hashable) -> Hashable:
        """``(scope, level, mode)`` of a tile key (tiles of one kind have one size but at the edges)."""
        if isinstance(key, tuple) and len(key) == 5:
            return (key[0], key[1], key[4])
        return None

    # ------------------------------------------------------------------ lookups

    def get_or_load(self, key: Hashable, load: Callable[[], np.ndarray]) -> np.ndarray:
        """The entry for ``key``; on a miss ``load()`` makes it (once, whoever asks meanwhile).

        ``load`` returns the decoded tile; what is kept (and returned) is a
        read-only copy in memory of the cache's own (module docstring), or
        ``load``'s array itself, made read-only, when it is not kept.  What
        ``load`` raises is raised to this caller and to every thread that
        waited for it, and nothing is stored.
        """
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
                self._hits += 1
                return value
            pending = self._loading.get(key)
            owner = pending is None
            if pending is None:
                pending = self._begin_load(key)
            else:
                self._hits += 1
                self._waits += 1
        if not owner:
            pending.done.wait()
            if pending.error is not None:
                raise pending.error
            assert pending.value is not None  # (set before ``done``)
            return pending.value
        try:
            value = load()
        except BaseException as exc:
            self._load_failed(key, pending, exc)
            raise
        return self._finish_load(key, pending, value)

    def _begin_load(self, key: Hashable) -> _Pending:
        """Under the lock: register the miss of ``key`` as loading, reserving the cost of the
        last tile of its kind and evicting to make room (and find a map to reuse)."""
        size = self._typical.get(self._kind(key), 0)
        reserve = entry_cost(size) if size else 0
        if reserve > self.max_bytes:
            size = reserve = 0  # it will not be kept anyway
        pending = self._loading[key] = _Pending(reserve)
        self._pending += reserve
        # room for it while it decodes, and the map of a tile it replaces
        pending.buf = self._evict_to(self.max_bytes, size if size >= MAP_MIN_BYTES else 0)
        self._misses += 1
        return pending

    def _load_failed(self, key: Hashable, pending: _Pending, exc: BaseException) -> None:
        """The load of ``key`` raised ``exc``: release its reservation, count the failure and
        hand ``exc`` to the threads waiting for it (nothing is stored)."""
        _close(pending.buf)
        pending.buf = None
        with self._lock:
            self._failures += 1
            self._pending -= pending.reserved
            del self._loading[key]
        pending.error = exc
        pending.done.set()

    def _finish_load(self, key: Hashable, pending: _Pending, value: np.ndarray) -> np.ndarray:
        """Keep the loaded ``value`` of ``key`` where it fits (a read-only copy in the cache's
        own memory), wake the threads waiting for it and return what they all get."""
        cost = entry_cost(value.nbytes)
        keep = cost <= self.max_bytes and not (isinstance(key, tuple) and key and key[0] in self._closed)
        buf, pending.buf = pending.buf, None  # (counted in the reservation meanwhile)
        if keep:
            value = _own_copy(value, buf)  # (outside the lock: a copy of one tile)
        else:
            _close(buf)
        del buf
        value.setflags(write=False)
        with self._lock:
            del self._loading[key]
            self._pending -= pending.reserved
            if keep and not (isinstance(key, tuple) and key and key[0] in self._closed):
                keep = self._store(key, value, cost)
            if not keep:
                self._not_kept += 1
        pending.value = value
        pending.done.set()
        return value

    def _store(self, key: Hashable, value: np.ndarray, cost: int) -> bool:
        """Insert under the lock after evicting least recently used entries to make room; False: no room."""
        old = self._entries.pop(key, None)
        if old is not None:
            buf = self._drop(old)
            del old
            _close(buf)
        self._evict_to(self.max_bytes - cost)
        kind = self._kind(key)
        if kind is not None:
            self._typical[kind] = max(value.nbytes, self._typical.get(kind, 0))  # full tiles, not edge ones
        if self._total() + cost > self.max_bytes:
            return False  # loads in flight and retired tiles take the budget
        self._entries[key] = value
        self._bytes += cost
        return True

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    # ------------------------------------------------------------------ upkeep

    def clear(self) -> None:
        """Drop every entry (counters are kept)."""
        with self._lock:
            while self._entries:
                _, value = self._entries.popitem()
                buf = self._drop(value)
                del value
                _close(buf)

    def stats(self) -> CacheStats:
        """A consistent snapshot of the counters."""
        with self._lock:
            total = self._total()
            return CacheStats(self._hits, self._misses, self._waits, self._evictions,
                              self._failures, len(self._entries), total, self.max_bytes,
                              self._pending, self._retired, self._not_kept)

    @property
    def nbytes(self) -> int:
        """Bytes accounted now (the entries' costs, loads in flight, retired tiles still held)."""
        with self._lock:
            return self._total()

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

    def __init__(self, cache: TileCache, token: int) -> None:
        self.cache = cache
        self.token = token

    def tile(self, level: Hashable, col: int, row: int, mode: str,
             load: Callable[[], np.ndarray]) -> np.ndarray:
        """Tile ``(col, row)`` of ``level`` (its index, or ``(index, plane)`` for a channel's plane,
        :attr:`wsitool.model.PyramidLevel.cache_key`) as read in ``mode``; ``load()`` decodes it on a miss."""
        return self.cache.get_or_load((self.token, level, col, row, mode), load)

    def holds(self, level: Hashable, col: int, row: int, mode: str) -> bool:
        """Whether tile ``(col, row)`` of ``level`` in ``mode`` is cached now (a read of it would
        need no bytes; it may be evicted before that read)."""
        return (self.token, level, col, row, mode) in self.cache

    def close(self) -> None:
        """Drop this scope's entries."""
        self.cache.discard(self.token)


def scope_for(cache: TileCache | int | None) -> CacheScope | None:
    """The scope one slide reads through, for the ``cache`` argument of :func:`wsitool.open_slide`:
    a new scope of a :class:`TileCache`, of a private cache of ``cache`` bytes (an int), or None.

    Raises:
        TypeError: ``cache`` is none of these.
        InvalidOptionError: a negative byte budget.
    """
    if isinstance(cache, int) and not isinstance(cache, bool):
        cache = TileCache(cache)  # a private cache of that many bytes
    if cache is not None and not isinstance(cache, TileCache):
        raise TypeError(f"cache must be a wsitool.TileCache, a byte budget or None, got {type(cache).__name__}")
    return cache.scope() if cache is not None else None
