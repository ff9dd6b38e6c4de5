"""wsitool.read.cache.TileCache and open_slide(..., cache=): same pixels, counted, bounded, thread-safe."""

from __future__ import annotations

import threading
import time
import warnings

import numpy as np
import pytest

import wsitool
from wsitool.errors import TileDecodeError, TileWarning
from wsitool.read.cache import ENTRY_OVERHEAD, MAP_MIN_BYTES, TileCache, entry_cost

from helpers import REPO, SHARED_SAMPLES

SAMPLES = sorted((REPO / "samples").glob("sample-*"))


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_cached_reads_equal_uncached(path):
    cache = TileCache(64 << 20)
    plain, cached = wsitool.open_slide(path), wsitool.open_slide(path, cache=cache)
    for level in range(plain.level_count):
        w, h = plain.level_dimensions[level]
        for mode in ("rgb", "rgba", "raw"):
            for loc, size in [((0, 0), (w, h)), ((-7, 13), (333, 211)), ((50, 50), (w + 10, 30))]:
                for threads in (1, 3):
                    a = plain.read_region(loc, level, size, mode=mode)
                    b = cached.read_region(loc, level, size, mode=mode, threads=threads)
                    assert np.array_equal(a, b), (level, mode, loc, threads)
    s = cache.stats()
    assert s.hits > 0 and s.misses > 0 and s.bytes == cache.nbytes > 0
    cached.close()
    assert cache.stats().entries == 0 and cache.nbytes == 0  # closing drops the slide's tiles


def test_budget_lru_and_counters():
    one = entry_cost(1000)
    assert one >= 1000 + ENTRY_OVERHEAD
    cache = TileCache(3 * one)
    def tile(v):  # a loader of a 1000-byte tile
        return lambda: np.full((10, 10, 10), v, np.uint8)

    scope = cache.scope()
    for i in range(3):
        scope.tile(0, i, 0, "rgb", tile(i))
    assert cache.stats().entries == 3 and cache.nbytes == 3 * one
    scope.tile(0, 0, 0, "rgb", tile(9))          # hit: (0, 0) becomes most recent
    scope.tile(0, 3, 0, "rgb", tile(3))          # evicts (1, 0), the least recently used
    s = cache.stats()
    assert (s.hits, s.misses, s.evictions, s.entries, s.bytes) == (1, 4, 1, 3, 3 * one)
    assert s.pending_bytes == 0 and s.retired_bytes == 0
    assert (scope.token, 0, 1, 0, "rgb") not in cache and (scope.token, 0, 0, 0, "rgb") in cache
    big = scope.tile(0, 9, 9, "rgb", lambda: np.zeros(5000, np.uint8))  # over budget: not kept
    assert big.size == 5000 and (scope.token, 0, 9, 9, "rgb") not in cache
    got = scope.tile(0, 0, 0, "rgb", tile(7))
    assert got[0, 0, 0] == 0 and not got.flags.writeable
    other = cache.scope()                        # another slide: separate keys
    assert other.tile(0, 0, 0, "rgb", tile(5))[0, 0, 0] == 5
    with pytest.raises(ValueError):
        TileCache(-1)


def test_one_decode_per_tile_under_concurrency():
    cache = TileCache(1 << 20)
    scope = cache.scope()
    calls = []
    gate = threading.Barrier(8)

    def load():
        calls.append(1)
        time.sleep(0.05)
        return np.ones((4, 4, 3), np.uint8)

    def reader():
        gate.wait()
        scope.tile(1, 2, 3, "rgb", load)

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    s = cache.stats()
    assert len(calls) == 1 and s.misses == 1 and s.hits == 7 and s.waits == 7


def test_failures_are_not_cached_and_reach_waiters():
    cache = TileCache(1 << 20)
    scope = cache.scope()

    def bad():
        raise TileDecodeError("x.svs", 0, 1, 2, "corrupt")

    for _ in range(2):
        with pytest.raises(TileDecodeError):
            scope.tile(0, 1, 2, "rgb", bad)
    assert cache.stats().failures == 2 and cache.stats().entries == 0


def test_corrupt_tile_through_a_cached_slide():
    broken = SHARED_SAMPLES / "broken-aperio-unreadable-jpeg.svs"
    if not broken.exists():
        pytest.skip(f"real slide {broken} is absent")
    s = wsitool.open_slide(broken, cache=1 << 20)
    with pytest.raises(TileDecodeError):
        s.read_region((0, 0), 0, (16, 16))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = s.read_region((0, 0), 0, (16, 16), on_error="fill")
    assert not out.any() and any(issubclass(w.category, TileWarning) for w in caught)
    with pytest.raises(TypeError):
        wsitool.open_slide(broken, cache="lots")


def test_a_load_in_flight_when_its_slide_closes_is_not_stored():
    """discard() while a tile of that scope is being decoded: the result is returned to
    its caller but not kept (it would hold budget until evicted)."""
    cache = TileCache(1 << 20)
    scope = cache.scope()
    started, finish = threading.Event(), threading.Event()

    def slow():
        started.set()
        finish.wait(5)
        return np.zeros((4, 4, 3), np.uint8)

    got = []
    t = threading.Thread(target=lambda: got.append(scope.tile(0, 0, 0, "rgb", slow)))
    t.start()
    started.wait(5)
    scope.close()
    finish.set()
    t.join(5)
    assert got and got[0].shape == (4, 4, 3)
    assert cache.stats().entries == 0 and cache.stats().bytes == 0


def _live_cache_arrays(arrays) -> int:
    """Distinct live memory (bytes) under the arrays the cache returned that are still alive."""
    seen, total = set(), 0
    for ref in arrays:
        a = ref()
        if a is None:
            continue
        base = a
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        if id(base) not in seen:
            seen.add(id(base))
            total += a.nbytes
    return total


def test_accounted_bytes_cover_what_the_cache_holds():
    """Tiles kept, tiles being decoded and evicted tiles a reader still holds: the cache's
    accounted bytes cover them all at every step, and never exceed the budget.  What the
    cache keeps alive is measured from outside: weak references to every array it returned,
    minus the ones the test itself holds on purpose (its readers' references)."""
    import gc
    import weakref

    tile_bytes = 240 * 240 * 3                       # Aperio's JPEG tiles: memory maps of their own
    assert tile_bytes >= MAP_MIN_BYTES
    budget = 10 * entry_cost(tile_bytes) + 100       # room for 10 tiles
    cache = TileCache(budget)
    scope = cache.scope()
    returned = []                                    # weak references to every array the cache gave out
    held = []                                        # a "reader" keeping some evicted tiles alive
    in_load = threading.Event()
    release = threading.Event()

    def load(v):
        return lambda: np.full((240, 240, 3), v % 256, np.uint8)

    def check():
        gc.collect()
        s = cache.stats()
        live = _live_cache_arrays(returned)
        assert s.bytes <= s.max_bytes, s
        # everything alive that came from the cache is accounted (held tiles count as retired)
        assert live <= s.bytes, (live, s)
        kept = sum(entry_cost(tile_bytes) for _ in range(s.entries))
        assert s.bytes == kept + s.pending_bytes + s.retired_bytes, s
        return s

    for i in range(40):
        t = scope.tile(0, i, 0, "rgb", load(i))
        assert t[0, 0, 0] == i % 256 and not t.flags.writeable
        assert t.ctypes.data % 4096 == 0               # its own page-aligned memory
        returned.append(weakref.ref(t))
        if i % 7 == 0:
            held.append(t)                           # a reader slow to let go
        del t
        s = check()
    assert s.evictions >= 30 and s.retired_bytes > 0  # held tiles evicted, still counted
    assert s.entries < 10                            # they take room from the kept tiles
    # a load in flight reserves a tile's cost before it returns
    def slow():
        in_load.set()
        release.wait(10)
        return np.zeros((240, 240, 3), np.uint8)

    th = threading.Thread(target=lambda: returned.append(weakref.ref(scope.tile(0, 99, 0, "rgb", slow))))
    th.start()
    assert in_load.wait(10)
    s = check()
    assert s.pending_bytes == entry_cost(tile_bytes)
    release.set()
    th.join(10)
    s = check()
    assert s.pending_bytes == 0
    # the reader lets go: retired bytes are released, room comes back
    held.clear()
    gc.collect()
    s = check()
    assert s.retired_bytes == 0
    for i in range(100, 120):
        t = scope.tile(0, i, 0, "rgb", load(i))
        returned.append(weakref.ref(t))
        del t
    s = check()
    assert s.entries == 10 and s.bytes <= budget
    scope.close()
    s = check()
    assert s.entries == 0 and s.bytes == 0


def test_an_evicted_tile_nobody_holds_is_not_retired():
    """The eviction's reference count: no false "still held" for tiles only the cache had."""
    cache = TileCache(2 * entry_cost(240 * 240 * 3))
    scope = cache.scope()
    for i in range(6):
        scope.tile(0, i, 0, "rgb", lambda: np.ones((240, 240, 3), np.uint8))
    s = cache.stats()
    assert s.evictions >= 4 and s.retired_bytes == 0 and s.entries == 2
