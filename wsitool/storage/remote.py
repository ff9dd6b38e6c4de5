"""A slide's bytes read over the network with range requests (floor 1).

:class:`RemoteSource` is the :class:`~wsitool.storage.ByteSource` of a slide
URL.  It does not read ahead like a file object: it fetches what the layers
above ask for, and remembers it in a process-wide cache.

* **Open**: one ranged GET of the first :data:`HEAD_BYTES` (64 KiB) bytes; the
  object's size comes from its ``Content-Range`` (no HEAD request, so presigned
  URLs work) and its ETag (else Last-Modified) is pinned.  Every later response
  must carry the same size and ETag, else :class:`~wsitool.errors.RemoteChangedError`:
  reads never mix two versions of an object.
* **Metadata reads** (the TIFF parser walking the IFD chain, tile offset tables,
  associated images) go through a block cache of :data:`BLOCK_SIZE` (64 KiB)
  blocks; the blocks one read misses are fetched as one request per contiguous
  run, and a block several threads want at once is fetched once (the others wait
  for it).
* **Tile reads**: before a region is decoded, the region layer calls
  :meth:`RemoteSource.advise` with the byte ranges of its tiles; they are merged
  where the gap between them is at most :data:`MERGE_GAP` bytes and fetched
  exactly (no block rounding), at most ``concurrency`` requests in flight per
  slide (default :data:`CONCURRENCY`), while the first tiles already decode.
* **Cache**: blocks and fetched ranges share one least-recently-used byte
  budget for the whole process (:func:`set_cache_bytes`; default
  :data:`DEFAULT_CACHE_BYTES`, environment ``WSITOOL_REMOTE_CACHE_MB``).
* **Failures**: timeouts, connection resets, bodies cut short and HTTP
  429/500/502/503/504 are retried with exponential back-off (``retries``
  times, honouring ``Retry-After`` where the transport reports it); each
  request has a timeout (``timeout``) and each read operation a deadline
  (``operation_timeout``), so no read hangs.  Then
  :class:`~wsitool.errors.RemoteUnavailableError`.  Not found, access denied
  and a changed object are not retried.

How one request is made is a :class:`Transport`'s business
(:mod:`wsitool.storage.http` for HTTP(S), :mod:`wsitool.storage.objectstore`
for S3, GCS and Azure).  Messages name the URL through
:func:`~wsitool.storage.urls.redact` only.
"""

from __future__ import annotations

import abc
import atexit
import bisect
import concurrent.futures as cf
import concurrent.futures.thread  # noqa: F401 - its exit hook registered before this module's (see below)
import contextlib
import math
import os
import random
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import (
    InvalidOptionError,
    RemoteAccessError,
    RemoteChangedError,
    RemoteNotFoundError,
    RemoteUnavailableError,
    WsiError,
)
from .source import ByteSource, CountedReads
from .urls import redact

__all__ = [
    "RemoteSource", "Transport", "Response", "Transient", "RemoteOptions",
    "BLOCK_SIZE", "HEAD_BYTES", "MERGE_GAP", "CONCURRENCY", "MAX_CONCURRENCY", "DEFAULT_CACHE_BYTES",
    "set_cache_bytes", "cache_stats", "RETRY_STATUS", "status_error",
]

#: Bytes of the first request at open (the TIFF header and, usually, the first IFDs).
HEAD_BYTES = 64 * 1024
#: Block size of the metadata cache.
BLOCK_SIZE = 64 * 1024
#: Advised ranges closer than this are fetched as one request (the bytes between come along).
MERGE_GAP = 16 * 1024
#: Largest single request of an advised read (longer merged ranges are split, to fetch in parallel).
MAX_REQUEST = 4 * 1024 * 1024
#: Default number of requests in flight per slide for advised (tile) ranges.
CONCURRENCY = 16
#: Read-ahead (``advise(..., ahead=True)``) is dropped where it would leave more than this
#: many requests per unit of ``concurrency`` queued or in flight.
AHEAD_QUEUE = 8
#: Most requests in flight per slide that ``concurrency`` may ask for (each one a thread and a pooled connection).
MAX_CONCURRENCY = 256
#: Default byte budget of the process-wide cache (256 MiB).
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024


class _Fetch(cf.Future):
    """The bytes of one advised range; ``started``: its request has left the queue (a
    reader timing out on one still queued says so)."""

    started = False


@dataclass
class RemoteOptions:
    """Network settings of one remote slide (the generic keys of ``storage_options``).

    Attributes:
        timeout: seconds to connect, and that a request may wait for its next bytes.
        operation_timeout: seconds one read (a region, a metadata read) may take in all,
            retries included; also the most one request may take (obstore).
        retries: attempts after the first for a transient failure.
        concurrency: requests in flight for one slide's advised ranges.
        backoff: seconds before the first retry (doubled each time, with jitter, at most 8 s).
    """

    timeout: float = 20.0
    operation_timeout: float = 120.0
    retries: int = 4
    concurrency: int = CONCURRENCY
    backoff: float = 0.25

    KEYS = ("timeout", "operation_timeout", "retries", "concurrency", "backoff")

    @classmethod
    def take(cls, options: dict) -> RemoteOptions:
        """The generic settings popped out of ``options`` (the rest stays for the transport).

        Raises:
            WsiError: a value that is not a positive number (retries: a non-negative integer;
                concurrency: at most :data:`MAX_CONCURRENCY`).
        """
        out = cls()
        for key in cls.KEYS:
            if key not in options:
                continue
            raw = options.pop(key)
            try:
                if isinstance(raw, bool):
                    raise TypeError
                value = float(raw)
            except (TypeError, ValueError):
                raise InvalidOptionError(f"storage option {key}: expected a number, got {raw!r}") from None
            if not math.isfinite(value):
                raise InvalidOptionError(f"storage option {key}: must be a finite number, got {raw!r}")
            if key in ("retries", "concurrency"):
                if not value.is_integer():  # 1.5 retries was silently 1
                    raise InvalidOptionError(f"storage option {key}: expected a whole number, got {raw!r}")
                value = int(value)
            if value < 0 or (value == 0 and key not in ("retries", "backoff")):
                raise InvalidOptionError(f"storage option {key}: must be positive, got {raw!r}")
            if key == "concurrency" and value > MAX_CONCURRENCY:
                raise InvalidOptionError(f"storage option concurrency: at most {MAX_CONCURRENCY}, got {raw!r}")
            setattr(out, key, value)
        return out


@dataclass
class Response:
    """One ranged GET's result: the bytes and what the server said about the object.

    ``data``: ``bytes``, or a read-only byte ``memoryview`` of the client's own buffer (obstore's
    body, uncopied): slice it and copy the slice where it is kept."""

    data: bytes | memoryview
    size: int  # the object's total size (Content-Range total)
    etag: str | None = None
    modified: str | None = None


class Transient(Exception):
    """A failure worth retrying (timeout, reset, 429/5xx, short body); ``retry_after`` in seconds or None."""

    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


#: Statuses worth retrying (RFC 9110: request timeout, too early, too many requests, and the
#: server errors that say "try again": 500, 502, 503, 504).
RETRY_STATUS = frozenset((408, 425, 429, 500, 502, 503, 504))


def status_error(status: int, shown: str, pin: Response | None, *, detail: str = "",
                 retry_after: float | None = None) -> Exception | None:
    """The error of an answer's HTTP ``status``, the same for every client: 404 and 410 not
    found (exit 9); 401 and 403 access denied (16); 412, and 416 once the object is pinned, the
    object changed (18); :data:`RETRY_STATUS` :class:`Transient` (``retry_after`` seconds);
    any other status outside 2xx an unexpected answer (16, not retried: e.g. 400 for a
    malformed or expired signed URL).  None for 2xx, and for 416 before the pin (the caller
    tells an empty object from a refused range).  ``shown``: the URL as messages show it;
    ``detail``: the client's own words, added to denied and unexpected answers."""
    more = f"; {detail}" if detail else ""
    if status in (404, 410):
        return RemoteNotFoundError(shown, f"not found (HTTP {status})")
    if status in (401, 403):
        expired = " or the URL expired" if "?" in shown else ""
        return RemoteAccessError(f"{shown}: access denied (HTTP {status}: missing or expired "
                                 f"credentials{expired}{more})")
    if status == 412 or (status == 416 and pin is not None):
        return RemoteChangedError(f"{shown}: the object changed on the server while open (HTTP {status}: "
                                  f"{'its ETag no longer matches' if status == 412 else 'a range inside it is gone'})"
                                  "; open it again")
    if status in RETRY_STATUS:
        return Transient(f"HTTP {status}", retry_after)
    if status == 416 or 200 <= status < 300:
        return None
    return RemoteAccessError(f"{shown}: unexpected answer HTTP {status}{more}")


class Transport(abc.ABC):
    """How one ranged GET of one object is made.

    Implementations raise :class:`~wsitool.errors.RemoteNotFoundError`,
    :class:`~wsitool.errors.RemoteAccessError` or
    :class:`~wsitool.errors.RemoteChangedError` for what retrying cannot fix and
    :class:`Transient` for what it may; their messages use :attr:`shown`.
    """

    #: the URL as messages show it (:func:`~wsitool.storage.urls.redact`).
    shown: str
    #: "http", "s3", "gs" or "az" (named by ``info``).
    protocol: str

    @abc.abstractmethod
    def get(self, start: int, end: int, pin: Response | None, timeout: float) -> Response:
        """Bytes ``start .. end - 1`` (``end`` past the object's end gives the bytes there are).

        ``pin``: the object's identity taken at open (None for the first request): a
        transport that can make the server check it (``If-Match``) does.
        """

    def after_fork(self) -> None:
        """Drop connections inherited from the parent (called in a child process before its first read)."""
        return  # a default: nothing to drop (not abstract: a transport without connections keeps it)

    def close(self) -> None:
        """Close the connections."""
        return  # a default: nothing to close (not abstract)


# ---------------------------------------------------------------------- the shared cache


class _Cache:
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
        while self.bytes > self.budget:
            _, gone = self._items.popitem(last=False)
            self.bytes -= len(gone)

    def drop(self, token: int) -> None:
        """Forget every entry of one source (at its close)."""
        with self.lock:
            for key in [k for k in self._items if k[0] == token]:
                self.bytes -= len(self._items.pop(key))


def _budget_from_env() -> int:
    raw = os.environ.get("WSITOOL_REMOTE_CACHE_MB")
    try:
        return max(1, int(float(raw) * 1024 * 1024)) if raw else DEFAULT_CACHE_BYTES
    except ValueError:
        return DEFAULT_CACHE_BYTES


_cache = _Cache(_budget_from_env())


def set_cache_bytes(budget: int) -> None:
    """Set the byte budget of the process-wide remote cache (evicting down to it now).

    Raises:
        ValueError: ``budget`` below 1.
    """
    if budget < 1:
        raise ValueError(f"remote cache budget must be >= 1 byte, got {budget}")
    with _cache.lock:
        _cache.budget = int(budget)
        while _cache.bytes > _cache.budget:
            _, gone = _cache._items.popitem(last=False)
            _cache.bytes -= len(gone)


def cache_stats() -> dict:
    """``{"bytes": held, "budget": budget, "entries": count}`` of the process-wide remote cache."""
    with _cache.lock:
        return {"bytes": _cache.bytes, "budget": _cache.budget, "entries": len(_cache._items)}


def _reset_after_fork() -> None:
    # The parent's lock may have been held by another thread at fork, and its
    # in-flight futures belong to threads the child does not have.
    global _cache
    _cache = _Cache(_cache.budget)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)

_tokens = iter(range(1, 1 << 62))
_tokens_lock = threading.Lock()
#: the open sources of this process (their read-ahead is stopped at interpreter exit)
_open_sources: weakref.WeakSet[RemoteSource] = weakref.WeakSet()


def _stop_at_exit() -> None:
    """At interpreter exit, before ``concurrent.futures`` waits for its threads: the queued
    read-ahead of every open remote slide is dropped and none is retried (a slide never
    closed, against a server that stopped answering, kept the exit waiting through every
    queued request and its retries: 52 s)."""
    for source in list(_open_sources):
        source._stop_fetching()


# (threading's exit hooks run before it joins the threads that are not daemons, the last
# registered first: this one before concurrent.futures', which waits for every queued item;
# atexit's would run after that wait)
with contextlib.suppress(RuntimeError):  # (imported while the interpreter shuts down: too late anyway)
    getattr(threading, "_register_atexit", atexit.register)(_stop_at_exit)


# ---------------------------------------------------------------------- the source


class RemoteSource(CountedReads, ByteSource):
    """The bytes of one remote object, read with ranged GETs through ``transport``.

    Args:
        url: the URL as given (kept in :attr:`path`; messages use :attr:`shown`).
        transport: the :class:`Transport` of the object.
        options: the :class:`RemoteOptions` (timeouts, retries, concurrency).

    Attributes:
        size: the object's size, from the first response.
        etag, modified: its ETag and Last-Modified at open (either may be None).
        requests, bytes_fetched: counters of this source (requests sent, body bytes received).
        protocol: the transport's protocol name.

    Raises:
        RemoteNotFoundError, RemoteAccessError, RemoteUnavailableError: the first request failed.
    """

    remote = True

    def __init__(self, url: str, transport: Transport, options: RemoteOptions | None = None):
        self.path = url
        self.shown = redact(url)
        self.transport = transport
        self.protocol = transport.protocol
        self.options = options or RemoteOptions()
        with _tokens_lock:
            self._token = next(_tokens)
        self._reset_reads()
        self._closing = False
        self._closed = False
        self._stop = threading.Event()  # set when close starts: no request or retry starts after
        self._guard = 1 << 62  # extents of this seq on (the last read's own advice) are never trimmed
        self._advised_at = time.monotonic()  # when this slide was last advised (_trim_others)
        self._pid = os.getpid()
        self._pool: cf.ThreadPoolExecutor | None = None
        self._extents: list[tuple[int, int, int, cf.Future]] = []  # advised (start, end, seq, bytes), sorted
        self._extent_bytes = 0  # bytes of the ranges in self._extents
        self._seq = 0
        self.requests = 0
        self.bytes_fetched = 0
        self.pin: Response | None = None
        deadline = time.monotonic() + self.options.operation_timeout
        first = self._fetch(0, HEAD_BYTES, deadline)
        self.size = first.size
        self.etag = first.etag
        self.modified = first.modified
        self.pin = Response(b"", first.size, first.etag, first.modified)
        _open_sources.add(self)
        with _cache.lock:
            for k in range(0, len(first.data) // BLOCK_SIZE + (1 if len(first.data) % BLOCK_SIZE else 0)):
                block = bytes(first.data[k * BLOCK_SIZE:(k + 1) * BLOCK_SIZE])
                if len(block) == BLOCK_SIZE or (k * BLOCK_SIZE + len(block) == self.size):
                    _cache.put((self._token, "b", k), block)

    # -------------------------------------------------------------- requests

    def _fetch(self, start: int, end: int, deadline: float) -> Response:
        """One range, retried; checked against the pinned identity.

        Raises:
            RemoteUnavailableError: still failing after the retries or past the deadline.
            RemoteChangedError: the object is not the one opened.
        """
        self._check_process()
        attempt = 0
        while True:
            left = deadline - time.monotonic()
            if self._stop.is_set():  # closing (or the interpreter exiting): no new request, no retry
                raise WsiError(f"{self.shown}: slide is closed (bytes {start}-{end - 1} not read)")
            if left <= 0:
                raise RemoteUnavailableError(
                    f"{self.shown}: no answer within the operation timeout of "
                    f"{self.options.operation_timeout:g} s (bytes {start}-{end - 1})")
            try:
                with self._lock:
                    self.requests += 1
                response = self.transport.get(start, end, self.pin, min(self.options.timeout, left))
            except Transient as exc:
                attempt += 1
                if attempt > self.options.retries:
                    raise RemoteUnavailableError(
                        f"{self.shown}: {exc.reason} (bytes {start}-{end - 1}; gave up after "
                        f"{attempt} attempts)") from None
                pause = min(8.0, self.options.backoff * (2 ** (attempt - 1))) * (0.5 + random.random())
                if exc.retry_after is not None:
                    pause = max(pause, min(exc.retry_after, 10.0))
                pause = min(pause, max(0.0, deadline - time.monotonic()))
                self._stop.wait(pause)  # (cut short by close)
                continue
            with self._lock:
                self.bytes_fetched += len(response.data)
            self._check_pin(response, start, end)
            return response

    def _check_pin(self, response: Response, start: int, end: int) -> None:
        pin = self.pin
        if pin is None:
            want = max(0, min(end, response.size) - start)
        else:
            if response.size != pin.size:
                raise RemoteChangedError(f"{self.shown}: the object changed on the server while open "
                                         f"(size {pin.size} -> {response.size} bytes); open it again")
            if pin.etag and response.etag and response.etag != pin.etag:
                raise RemoteChangedError(f"{self.shown}: the object changed on the server while open "
                                         f"(ETag {pin.etag} -> {response.etag}); open it again")
            if not pin.etag and pin.modified and response.modified and response.modified != pin.modified:
                raise RemoteChangedError(f"{self.shown}: the object changed on the server while open "
                                         f"(Last-Modified {pin.modified} -> {response.modified}); open it again")
            want = max(0, min(end, pin.size) - start)
        if len(response.data) != want:  # transports check this too; never hand on a short body
            raise RemoteUnavailableError(f"{self.shown}: {len(response.data)} bytes for a range of {want} "
                                         f"(bytes {start}-{end - 1})")

    def _check_process(self) -> None:
        if self._pid != os.getpid():  # a forked child: the parent's connections and threads are not ours
            self._pid = os.getpid()
            self._pool = None
            self._stop = threading.Event()
            self._reset_reads()
            self._extents = []
            self._extent_bytes = 0
            self.transport.after_fork()

    def _deadline(self) -> float:
        return time.monotonic() + self.options.operation_timeout

    # -------------------------------------------------------------- reads

    def read(self, offset: int, count: int) -> bytes:
        """Up to ``count`` bytes at ``offset`` (fewer only at the end of the object).

        Raises:
            RemoteUnavailableError, RemoteChangedError, RemoteAccessError: see the module.
            WsiError: the source is closed.
        """
        if self._closed:
            raise WsiError(f"{self.shown}: slide is closed")
        if offset < 0 or count < 0:
            raise OSError(f"{self.shown}: negative offset or count ({offset}, {count})")
        count = min(count, self.size - offset)
        if count <= 0:
            return b""
        deadline = self._deadline()
        data = self._from_extents(offset, count, deadline)
        if data is not None:
            return data
        return self._from_blocks(offset, count, deadline)

    def readinto(self, offset: int, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(offset, len(view))
        view[:len(data)] = data
        return len(data)

    def gather(self, ranges: Iterable[tuple[int, int]]) -> list[tuple[int, bytes]]:
        """The bytes of the ``(offset, count)`` ranges, as ``(start, data)`` extents in
        ascending ``start`` that hold every range whole (for the compiled JPEG loop, which
        reads a region's tiles from them).  A range an advised fetch holds waits for it; the
        others are advised now (merged, in flight at once) and waited for.

        Raises:
            RemoteUnavailableError, RemoteChangedError, RemoteAccessError: as :meth:`read`.
            WsiError: the source is closed.
        """
        if self._closed:
            raise WsiError(f"{self.shown}: slide is closed")
        self._check_process()
        wanted = [(o, min(c, self.size - o)) for o, c in ranges if c > 0 and 0 <= o < self.size]
        deadline = self._deadline()
        found: dict[tuple[int, int], tuple[int, bytes]] = {}  # (start, end) -> extent
        for attempt in range(2):
            missing = []
            held = (0, 0)  # the bytes [a, b) of the extent found last (a row's tiles share one)
            for o, c in wanted:
                if held[0] <= o and o + c <= held[1]:
                    continue
                hit = self._extent(o, o + c)
                if hit is None:
                    missing.append((o, c))
                    continue
                start, end, fut = hit
                if (start, end) not in found:
                    data = self._wait(fut, deadline)
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
                found[(o, o + c)] = (o, self.read(o, c))
        return sorted(found.values(), key=lambda e: e[0])

    def _extent(self, start: int, end: int) -> tuple[int, int, cf.Future] | None:
        """The advised extent holding ``[start, end)``, as ``(its start, its end, its future)``,
        or None."""
        with self._lock:
            k = bisect.bisect_right(self._extents, (start, float("inf"))) - 1
            for j in range(k, max(-1, k - 8), -1):  # (extents may overlap)
                s, e, _, fut = self._extents[j]
                if s <= start and e >= end:
                    return s, e, fut
        return None

    def _wait(self, future: cf.Future[bytes], deadline: float) -> bytes:
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except cf.TimeoutError:
            if isinstance(future, _Fetch) and not future.started:  # (its request never went out)
                raise RemoteUnavailableError(
                    f"{self.shown}: no answer within the operation timeout of "
                    f"{self.options.operation_timeout:g} s: the request was still queued behind the "
                    f"{self.options.concurrency} in flight (a slow server; a larger operation_timeout "
                    f"or concurrency lets it through)") from None
            raise RemoteUnavailableError(f"{self.shown}: no answer within the operation timeout of "
                                         f"{self.options.operation_timeout:g} s") from None

    def _from_extents(self, offset: int, count: int, deadline: float) -> bytes | None:
        end = offset + count
        hit = self._extent(offset, end)
        if hit is None:
            return None
        s, _, fut = hit
        try:
            data = self._wait(fut, deadline)
        except RemoteUnavailableError:
            raise
        except WsiError:
            raise
        except Exception:  # pragma: no cover - the advised fetch failed oddly: read the blocks
            return None
        if data is None:
            return None
        return bytes(data[offset - s:end - s])

    def _from_blocks(self, offset: int, count: int, deadline: float) -> bytes:
        b0, b1 = offset // BLOCK_SIZE, (offset + count - 1) // BLOCK_SIZE
        have: dict[int, bytes] = {}
        waits: dict[int, cf.Future] = {}
        mine: dict[int, cf.Future] = {}
        with _cache.lock:
            for b in range(b0, b1 + 1):
                key = (self._token, "b", b)
                data = _cache.get(key)
                if data is not None:
                    have[b] = data
                elif key in _cache.inflight:
                    waits[b] = _cache.inflight[key]
                else:
                    waits[b] = mine[b] = _cache.inflight[key] = cf.Future()
        if mine:
            self._fetch_blocks(mine, deadline)  # resolves the futures (also on failure)
        for b, fut in waits.items():
            have[b] = self._wait(fut, deadline)
        blob = b"".join(have[b] for b in range(b0, b1 + 1))
        start = offset - b0 * BLOCK_SIZE
        return blob[start:start + count]

    def _fetch_blocks(self, mine: dict[int, cf.Future], deadline: float) -> None:
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
                end = min(self.size, (run[-1] + 1) * BLOCK_SIZE)
                data = self._fetch(start, end, deadline).data
                pieces = {b: bytes(data[(b - run[0]) * BLOCK_SIZE:(b - run[0] + 1) * BLOCK_SIZE]) for b in run}
                with _cache.lock:
                    for b, block in pieces.items():
                        _cache.put((self._token, "b", b), block)
                        _cache.inflight.pop((self._token, "b", b), None)
                for b, block in pieces.items():
                    mine[b].set_result(block)
                    done.add(b)
        except BaseException as exc:
            left = [b for b in mine if b not in done]
            with _cache.lock:
                for b in left:
                    _cache.inflight.pop((self._token, "b", b), None)
            for b in left:
                mine[b].set_exception(exc)
            # (the caller re-raises it from the futures it waits on)

    # -------------------------------------------------------------- advice (tile ranges)

    def advise(self, ranges: Iterable[tuple[int, int]], ahead: bool = False) -> None:
        """Start fetching the ``(offset, count)`` ranges that no earlier advice holds whole:
        merged where the gap is at most :data:`MERGE_GAP`, split at :data:`MAX_REQUEST`, at
        most ``concurrency`` requests in flight.  Later reads inside these ranges wait for
        them instead of fetching blocks.  Never raises: a failed fetch is raised by the read
        that needs its bytes.

        ``ahead``: read-ahead for a later batch, dropped whole where its new bytes and those
        still being fetched would pass a quarter of the extent budget, or its requests and
        those queued :data:`AHEAD_QUEUE` per unit of ``concurrency`` (a slow server, or
        batches larger than the budget: the ranges fetched for the batch being read now
        stay held until it reads them; that batch advises its own ranges when it starts)."""
        if self._closed:
            return
        self._check_process()
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
                self._guard = self._seq + 1  # (kept until the next read's advice: see _trim_extents)
            for s, e in merged:
                for a in range(s, e, MAX_REQUEST):
                    b = min(e, a + MAX_REQUEST)
                    fut = _Fetch()
                    self._seq += 1
                    bisect.insort(self._extents, (a, b, self._seq, fut))
                    self._extent_bytes += b - a
                    jobs.append((a, b, fut))
            if jobs and self._pool is None:
                self._pool = cf.ThreadPoolExecutor(self.options.concurrency, thread_name_prefix="wsitool-remote")
            pool = self._pool
        self._advised_at = time.monotonic()
        self._trim_extents()
        self._trim_others()
        for k, (a, b, fut) in enumerate(jobs):
            assert pool is not None  # made above whenever there are jobs
            try:
                pool.submit(self._fill_extent, a, b, fut)
            except RuntimeError:  # closed meanwhile (or the interpreter exiting): nothing more is fetched
                for _, _, left in jobs[k:]:
                    self._fail_extent(left, WsiError(f"{self.shown}: slide is closed"))
                return

    def _room(self, merged: list[list[int]]) -> bool:  # caller holds self._lock
        """Whether read-ahead of the ``merged`` spans fits (see :meth:`advise`)."""
        pending = [t for t in self._extents if not t[3].done()]
        requests = sum(-(-(e - s) // MAX_REQUEST) for s, e in merged) + len(pending)
        held = sum(e - s for s, e in merged) + sum(t[1] - t[0] for t in pending)
        return requests <= AHEAD_QUEUE * self.options.concurrency and 4 * held <= self._extent_budget()

    def _covered(self, s: int, e: int) -> bool:  # caller holds self._lock
        k = bisect.bisect_right(self._extents, (s, float("inf"))) - 1
        for j in range(k, max(-1, k - 8), -1):
            a, b, _, _ = self._extents[j]
            if a <= s and b >= e:
                return True
        return False

    def _fill_extent(self, a: int, b: int, fut: _Fetch) -> None:
        fut.started = True
        try:  # (the operation timeout counts from the request's start, not from its advice)
            data = self._fetch(a, b, self._deadline()).data
        except BaseException as exc:
            self._fail_extent(fut, exc)
            return
        with contextlib.suppress(cf.InvalidStateError):  # (failed by _stop_fetching meanwhile)
            fut.set_result(data)

    def _fail_extent(self, fut: cf.Future, exc: BaseException) -> None:
        """Drop the extent of ``fut`` and hand its readers ``exc`` (unless it has its bytes)."""
        with self._lock:
            self._extents = [t for t in self._extents if t[3] is not fut]
            self._extent_bytes = sum(t[1] - t[0] for t in self._extents)
        with contextlib.suppress(cf.InvalidStateError):
            fut.set_exception(exc)

    #: Advised bytes a slide keeps (the oldest ranges are dropped past this): what the
    #: regions being read now need, not a cache (decoded tiles are cached above).  For a
    #: small object at most twice its size (ranges of overlapping regions overlap), but
    #: never under :attr:`EXTENT_FLOOR`.
    EXTENT_BYTES = 64 * 1024 * 1024
    EXTENT_FLOOR = 8 * 1024 * 1024
    #: Advised bytes all the open remote slides of the process keep together (past it the
    #: other slides drop theirs, those advised least recently first: :meth:`_trim_others`).
    PROCESS_EXTENT_BYTES = 128 * 1024 * 1024

    def _extent_budget(self) -> int:
        """Bytes of advised ranges this slide keeps before the oldest finished ones are dropped."""
        return min(self.EXTENT_BYTES, max(self.EXTENT_FLOOR, 2 * self.size))

    def _trim_extents(self) -> None:
        """Past this slide's budget, down to three quarters of it (:meth:`_drop_oldest`)."""
        budget = self._extent_budget()
        if self._extent_bytes > budget:
            self._drop_oldest(budget * 3 // 4)

    def _drop_oldest(self, keep: int) -> int:
        """Drop finished advised ranges, those advised first first, until at most ``keep``
        bytes are held; never those of the last read's own advice (a region or batch larger
        than the budget: they were dropped before it read them, and fetched again).  The
        newest finished ones are those of the batch being read now.  Returns the bytes dropped."""
        with self._lock:
            before = total = self._extent_bytes
            gone = set()
            done = (t for t in self._extents if t[3].done() and t[2] < self._guard)
            for a, b, seq, _fut in sorted(done, key=lambda t: t[2]):
                if total <= keep:
                    break
                gone.add(seq)
                total -= b - a
            if gone:
                self._extents = [t for t in self._extents if t[2] not in gone]
                self._extent_bytes = total
            return before - total

    def _trim_others(self) -> None:
        """Where the open remote slides of the process hold more than
        :attr:`PROCESS_EXTENT_BYTES` of advised ranges together, the other slides drop their
        finished ones (not their last read's own), the slide advised least recently first,
        down to three quarters of it: a server of many slides kept up to each one's budget
        for every slide it had served.  Takes one slide's lock at a time."""
        budget = self.PROCESS_EXTENT_BYTES
        sources = list(_open_sources)
        total = sum(src._extent_bytes for src in sources)  # (unlocked reads: an estimate is enough)
        if total <= budget:
            return
        for other in sorted((src for src in sources if src is not self), key=lambda src: src._advised_at):
            total -= other._drop_oldest(0)
            if total <= budget * 3 // 4:
                return

    # -------------------------------------------------------------- lifetime

    def fileno(self) -> int | None:
        return None

    def _released(self) -> bool:
        return self._closed

    @contextlib.contextmanager
    def reading(self) -> Iterator[RemoteSource]:
        self._check_process()
        with self._counted(self.shown):
            yield self

    def close(self) -> None:
        """Close: from now on no request and no retry starts, so the reads in flight end
        with the requests already sent (a read that needs another raises "slide is closed");
        wait for them, cancel the queued read-ahead, stop the fetch threads (a request in
        flight ends within ``timeout`` of silence, ``operation_timeout`` in all), close the
        connections and drop this slide's cached bytes.  Idempotent."""
        with self._idle:
            if self._closed:
                return
            self._stop.set()  # (a read in flight ends with its requests already sent)
            self._wait_for_readers()
            self._closed = True
            pool, self._pool = self._pool, None
            self._extents = []
            self._extent_bytes = 0
        if pool is not None:
            # read-ahead nobody waits for: the queued fetches are cancelled; a request in flight
            # is not retried once closing, so this waits for one request at most
            pool.shutdown(wait=True, cancel_futures=True)
        self.transport.close()
        _cache.drop(self._token)
        _open_sources.discard(self)

    def _stop_fetching(self) -> None:
        """No request or retry starts from now on and the queued read-ahead is dropped (the
        interpreter is exiting); the source stays open (a read then raises "slide is closed")."""
        self._stop.set()
        with self._lock:
            pool = self._pool
            pending = [t[3] for t in self._extents if not t[3].done()]
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        for fut in pending:  # (a reader waiting on a cancelled fetch would wait out its deadline)
            self._fail_extent(fut, WsiError(f"{self.shown}: slide is closed (the interpreter is exiting)"))

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> dict:
        """``{"requests": n, "bytes": n}`` sent and received by this source so far."""
        with self._lock:
            return {"requests": self.requests, "bytes": self.bytes_fetched}

    def identity(self) -> tuple:
        """``(url, size, etag or last-modified)``: one version of the object (the cache key of
        slides opened by URL)."""
        return (self.path, self.size, self.etag or self.modified or "")

    def __repr__(self) -> str:
        return f"RemoteSource({self.shown!r}, {self.size} bytes)"
