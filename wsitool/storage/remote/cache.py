"""The process-wide cache of remote bytes, and the reads that go through it block by block (floor 1).

Metadata reads of a remote slide (the TIFF parser walking the IFD chain, tile offset tables,
associated images) go through a block cache of :data:`BLOCK_SIZE` (64 KiB) blocks: the blocks
one read misses are fetched as one request per contiguous run (:func:`read_blocks`), and a block
several threads want at once is fetched once (the others wait for it).  The blocks of every open
remote slide share one least-recently-used byte budget for the whole process
(:func:`set_cache_bytes`; default :data:`DEFAULT_CACHE_BYTES`, environment
``WSITOOL_REMOTE_CACHE_MB``).  A forked child starts with an empty cache of the same budget.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["BLOCK_SIZE", "DEFAULT_CACHE_BYTES", "BlockCache", "shared", "set_cache_bytes", "cache_stats",
           "read_blocks", "keep_first"]

#: Block size of the metadata cache.
BLOCK_SIZE = 64 * 1024
#: Default byte budget of the process-wide cache (256 MiB).
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024


class BlockCache:
    """Least-recently-used bytes, keyed by ``(source token, kind, start[, end])``, one byte budget."""

    def __init__(self, budget: int):
        self.budget = budget
        self.lock = threading.Lock()
        self._items: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()
        self.bytes = 0
        #: key -> Future of bytes being fetched (one fetch per key however many threads wait)
        self.inflight: dict[tuple[Any, ...], cf.Future[bytes]] = {}

    def get(self, key: tuple[Any, ...]) -> bytes | None:  # caller holds self.lock
        data = self._items.get(key)
        if data is not None:
            self._items.move_to_end(key)
        return data

    def put(self, key: tuple[Any, ...], data: bytes) -> None:  # caller holds self.lock
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= len(old)
        if len(data) > self.budget:
            return
        self._items[key] = data
        self.bytes += len(data)
        self._evict()

    def _evict(self) -> None:  # caller holds self.lock
        while self.bytes > self.budget:
            _, gone = self._items.popitem(last=False)
            self.bytes -= len(gone)

    def resize(self, budget: int) -> None:
        """A new byte budget, evicting down to it now."""
        with self.lock:
            self.budget = int(budget)
            self._evict()

    def drop(self, token: int) -> None:
        """Forget every entry of one source (at its close)."""
        with self.lock:
            for key in [k for k in self._items if k[0] == token]:
                self.bytes -= len(self._items.pop(key))

    def stats(self) -> dict:
        """``{"bytes": held, "budget": budget, "entries": count}``."""
        with self.lock:
            return {"bytes": self.bytes, "budget": self.budget, "entries": len(self._items)}


def _budget_from_env() -> int:
    raw = os.environ.get("WSITOOL_REMOTE_CACHE_MB")
    try:
        return max(1, int(float(raw) * 1024 * 1024)) if raw else DEFAULT_CACHE_BYTES
    except ValueError:
        return DEFAULT_CACHE_BYTES


_cache = BlockCache(_budget_from_env())


def shared() -> BlockCache:
    """The process-wide cache (another object in a forked child: look it up at each use)."""
    return _cache


def set_cache_bytes(budget: int) -> None:
    """Set the byte budget of the process-wide remote cache (evicting down to it now).

    Raises:
        ValueError: ``budget`` below 1.
    """
    if budget < 1:
        raise ValueError(f"remote cache budget must be >= 1 byte, got {budget}")
    _cache.resize(budget)


def cache_stats() -> dict:
    """``{"bytes": held, "budget": budget, "entries": count}`` of the process-wide remote cache."""
    return _cache.stats()


def _reset_after_fork() -> None:
    # The parent's lock may have been held by another thread at fork, and its
    # in-flight futures belong to threads the child does not have.
    global _cache
    _cache = BlockCache(_cache.budget)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def keep_first(token: int, data: bytes | memoryview, size: int) -> None:
    """Cache the whole blocks of ``data``, the first bytes of an object of ``size`` bytes (its
    last block too where ``data`` reaches the end), as source ``token``'s."""
    cache = _cache
    with cache.lock:
        for k in range(0, len(data) // BLOCK_SIZE + (1 if len(data) % BLOCK_SIZE else 0)):
            block = bytes(data[k * BLOCK_SIZE:(k + 1) * BLOCK_SIZE])
            if len(block) == BLOCK_SIZE or (k * BLOCK_SIZE + len(block) == size):
                cache.put((token, "b", k), block)


def read_blocks(token: int, offset: int, count: int, size: int,
                fetch: Callable[[int, int], bytes | memoryview],
                wait: Callable[[cf.Future], bytes]) -> bytes:
    """Bytes ``offset .. offset + count - 1`` of source ``token`` (an object of ``size`` bytes)
    through the cache: the blocks held are taken, those another thread is fetching waited for
    (``wait(future)``: within the read's deadline), the others fetched as one request per
    contiguous run (``fetch(start, end)``) and kept.

    Raises:
        RemoteUnavailableError, RemoteChangedError, RemoteAccessError, WsiError: as ``fetch`` and
            ``wait`` raise them (a failed fetch is raised to every thread waiting on its blocks).
    """
    b0, b1 = offset // BLOCK_SIZE, (offset + count - 1) // BLOCK_SIZE
    have: dict[int, bytes] = {}
    waits: dict[int, cf.Future] = {}
    mine: dict[int, cf.Future] = {}
    cache = _cache
    with cache.lock:
        for b in range(b0, b1 + 1):
            key = (token, "b", b)
            data = cache.get(key)
            if data is not None:
                have[b] = data
            elif key in cache.inflight:
                waits[b] = cache.inflight[key]
            else:
                waits[b] = mine[b] = cache.inflight[key] = cf.Future()
    if mine:
        _fetch_blocks(cache, token, size, mine, fetch)  # resolves the futures (also on failure)
    for b, fut in waits.items():
        have[b] = wait(fut)
    blob = b"".join(have[b] for b in range(b0, b1 + 1))
    start = offset - b0 * BLOCK_SIZE
    return blob[start:start + count]


def _fetch_blocks(cache: BlockCache, token: int, size: int, mine: dict[int, cf.Future],
                  fetch: Callable[[int, int], bytes | memoryview]) -> None:
    """Fetch the blocks of ``mine`` (one request per contiguous run), publish them in the
    cache and resolve their futures; on a failure every future left gets the error."""
    runs: list[list[int]] = []
    for b in sorted(mine):
        if runs and runs[-1][-1] + 1 == b:
            runs[-1].append(b)
        else:
            runs.append([b])
    done: set[int] = set()
    try:
        for run in runs:
            start = run[0] * BLOCK_SIZE
            end = min(size, (run[-1] + 1) * BLOCK_SIZE)
            data = fetch(start, end)
            pieces = {b: bytes(data[(b - run[0]) * BLOCK_SIZE:(b - run[0] + 1) * BLOCK_SIZE]) for b in run}
            with cache.lock:
                for b, block in pieces.items():
                    cache.put((token, "b", b), block)
                    cache.inflight.pop((token, "b", b), None)
            for b, block in pieces.items():
                mine[b].set_result(block)
                done.add(b)
    except BaseException as exc:
        left = [b for b in mine if b not in done]
        with cache.lock:
            for b in left:
                cache.inflight.pop((token, "b", b), None)
        for b in left:
            mine[b].set_exception(exc)
        # (the caller re-raises it from the futures it waits on)
