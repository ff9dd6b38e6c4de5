"""A slide's bytes read over the network with range requests: :class:`RemoteSource` (floor 1).

:class:`RemoteSource` is the :class:`~wsitool.storage.ByteSource` of a slide URL.  It does not
read ahead like a file object: it fetches what the layers above ask for, and remembers it in a
process-wide cache.  Its jobs are the modules beside it:

* **Open**: one ranged GET of the first :data:`HEAD_BYTES` (64 KiB) bytes; the object's size
  comes from its ``Content-Range`` (no HEAD request, so presigned URLs work) and its ETag (else
  Last-Modified) is pinned (:mod:`.fetch`: every later answer must match).
* **Requests**: retries, back-off, timeouts and deadlines, the pinned identity (:mod:`.fetch`).
* **Metadata reads** go through the process-wide block cache (:mod:`.cache`).
* **Tile reads**: the ranges the region layer advises are fetched ahead, in parallel, within
  budgets per slide and per process (:mod:`.readahead`).
* **Lifetime**: :meth:`RemoteSource.reading` brackets a read; :meth:`RemoteSource.close` waits
  for the reads in flight and stops the fetches; a forked child reconnects on its first read
  there; at interpreter exit the queued read-ahead is dropped (:mod:`.readahead`).

How one request is made is a :class:`~wsitool.storage.remote.transport.Transport`'s business
(:mod:`wsitool.storage.remote.transports`).  Messages name the URL through
:func:`~wsitool.storage.urls.redact` only.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from ...errors import WsiError
from ..source import ByteSource, CountedReads
from ..urls import redact
from . import cache
from .fetch import Fetcher
from .options import RemoteOptions
from .readahead import ReadAhead, wait_for
from .transport import Response, Transport

__all__ = ["RemoteSource", "HEAD_BYTES"]

#: Bytes of the first request at open (the TIFF header and, usually, the first IFDs).
HEAD_BYTES = 64 * 1024

_tokens = iter(range(1, 1 << 62))
_tokens_lock = threading.Lock()


class RemoteSource(CountedReads, ByteSource):
    """The bytes of one remote object, read with ranged GETs through ``transport``.

    Args:
        url: the URL as given (kept in :attr:`path`; messages use :attr:`shown`).
        transport: the :class:`~wsitool.storage.remote.transport.Transport` of the object.
        options: the :class:`~wsitool.storage.remote.options.RemoteOptions` (timeouts, retries,
            concurrency).

    Attributes:
        size: the object's size, from the first response.
        etag, modified: its ETag and Last-Modified at open (either may be None).
        requests, bytes_fetched: counters of this source (requests sent, body bytes received).
        protocol: the transport's protocol name.
        readahead: its :class:`~wsitool.storage.remote.readahead.ReadAhead` (the advised ranges).

    Raises:
        RemoteNotFoundError, RemoteAccessError, RemoteUnavailableError: the first request failed.
    """

    remote = True
    defer_metadata = True  # (each read is a request: tile tables when first used)
    gathers = True  # (the compiled loop reads a region's tiles from the advised ranges)

    def __init__(self, url: str, transport: Transport, options: RemoteOptions | None = None):
        self.path = url
        self.shown = redact(url)
        self.protocol = transport.protocol
        self.options = options or RemoteOptions()
        self._fetcher = Fetcher(transport, self.shown, self.options)
        with _tokens_lock:
            self._token = next(_tokens)
        self._reset_reads()
        self._closing = False
        self._closed = False
        self._pid = os.getpid()
        first = self._fetcher.fetch(0, HEAD_BYTES, self._fetcher.deadline())
        self.size = first.size
        self.etag = first.etag
        self.modified = first.modified
        self._fetcher.pin_first(first)
        self.readahead = ReadAhead(self._fetcher, self.size)
        cache.keep_first(self._token, first.data, self.size)

    @property
    def transport(self) -> Transport:
        """The transport the requests go through."""
        return self._fetcher.transport

    @property
    def pin(self) -> Response | None:
        """The object's identity taken at open (size, ETag, Last-Modified)."""
        return self._fetcher.pin

    @property
    def requests(self) -> int:
        """Requests sent so far."""
        return self._fetcher.requests

    @property
    def bytes_fetched(self) -> int:
        """Body bytes received so far."""
        return self._fetcher.bytes_fetched

    def _check_process(self) -> None:
        if self._pid != os.getpid():  # a forked child: the parent's connections and threads are not ours
            self._pid = os.getpid()
            self._reset_reads()
            self.readahead.after_fork()
            self._fetcher.after_fork()

    def _fetch(self, start: int, end: int, deadline: float) -> Response:
        self._check_process()
        return self._fetcher.fetch(start, end, deadline)

    # -------------------------------------------------------------- reads

    def read(self, offset: int, count: int) -> bytes:
        """Up to ``count`` bytes at ``offset`` (fewer only at the end of the object).

        Raises:
            RemoteUnavailableError, RemoteChangedError, RemoteAccessError: see :mod:`.fetch`.
            WsiError: the source is closed.
        """
        if self._closed:
            raise WsiError(f"{self.shown}: slide is closed")
        if offset < 0 or count < 0:
            raise OSError(f"{self.shown}: negative offset or count ({offset}, {count})")
        count = min(count, self.size - offset)
        if count <= 0:
            return b""
        deadline = self._fetcher.deadline()
        data = self.readahead.take(offset, count, deadline)
        if data is not None:
            return data
        return cache.read_blocks(self._token, offset, count, self.size,
                                 lambda start, end: self._fetch(start, end, deadline).data,
                                 lambda fut: wait_for(fut, deadline, self._fetcher))

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
        return self.readahead.gather(wanted, self._fetcher.deadline(), self.read)

    def advise(self, ranges: Iterable[tuple[int, int]], ahead: bool = False) -> None:
        """Start fetching the ``(offset, count)`` ranges that no earlier advice holds whole
        (:meth:`ReadAhead.advise <wsitool.storage.remote.readahead.ReadAhead.advise>`: merged,
        at most ``concurrency`` requests in flight; ``ahead``: read-ahead for a later batch,
        dropped where the budget is spent).  Later reads inside these ranges wait for them
        instead of fetching blocks.  Never raises."""
        if self._closed:
            return
        self._check_process()
        self.readahead.advise(ranges, ahead)

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
            self._fetcher.stop.set()  # (a read in flight ends with its requests already sent)
            self.readahead.refuse()
            self._wait_for_readers()
            self._closed = True
        self.readahead.close()
        self.transport.close()
        cache.shared().drop(self._token)

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> dict:
        """``{"requests": n, "bytes": n}`` sent and received by this source so far."""
        return self._fetcher.stats()

    def identity(self) -> tuple:
        """``(url, size, etag or last-modified)``: one version of the object (the cache key of
        slides opened by URL)."""
        return (self.path, self.size, self.etag or self.modified or "")

    def __repr__(self) -> str:
        return f"RemoteSource({self.shown!r}, {self.size} bytes)"
