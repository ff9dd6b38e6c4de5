"""One object's ranged GETs: retried, within a deadline, checked against the identity pinned at open (floor 1).

Timeouts, connection resets, bodies cut short and HTTP 429/500/502/503/504 (a
:class:`~wsitool.storage.remote.status.Transient` from the transport) are retried with
exponential back-off (``retries`` times, honouring ``Retry-After`` where the transport reports
it); each request has a timeout (``timeout``) and each read operation a deadline
(``operation_timeout``), so no read hangs.  Then :class:`~wsitool.errors.RemoteUnavailableError`.
Not found, access denied and a changed object are not retried.  Every answer after the first
must carry the size and ETag (else Last-Modified) of the first, else
:class:`~wsitool.errors.RemoteChangedError`: reads never mix two versions of an object.
"""

from __future__ import annotations

import threading
import time

from ...errors import RemoteChangedError, RemoteUnavailableError, WsiError
from .options import RemoteOptions
from .status import Transient, retry_pause
from .transport import Response, Transport

__all__ = ["Fetcher"]

#: Longest wait a server's ``Retry-After`` may ask for, seconds.
MAX_RETRY_AFTER = 10.0


class Fetcher:
    """The ranged GETs of one object through ``transport``.

    Args:
        transport: the :class:`~wsitool.storage.remote.transport.Transport` of the object.
        shown: the URL as messages show it.
        options: the :class:`~wsitool.storage.remote.options.RemoteOptions`.

    Attributes:
        pin: the object's identity (size, ETag, Last-Modified) taken from the first answer,
            None before it (:meth:`pin_first`).
        requests, bytes_fetched: requests sent, body bytes received.
        stop: set when the source closes (or the interpreter exits): no request or retry
            starts after it.
    """

    def __init__(self, transport: Transport, shown: str, options: RemoteOptions):
        self.transport = transport
        self.shown = shown
        self.options = options
        self.pin: Response | None = None
        self.requests = 0
        self.bytes_fetched = 0
        self._counts = threading.Lock()
        self.stop = threading.Event()

    def after_fork(self) -> None:
        """In a forked child: a fresh stop event and lock, and the transport's connections dropped."""
        self.stop = threading.Event()
        self._counts = threading.Lock()
        self.transport.after_fork()

    def deadline(self) -> float:
        """The deadline of a read operation starting now (``time.monotonic()`` seconds)."""
        return time.monotonic() + self.options.operation_timeout

    def pin_first(self, first: Response) -> None:
        """Pin the identity of the object as ``first`` (the answer at open) gives it."""
        self.pin = Response(b"", first.size, first.etag, first.modified)

    def stats(self) -> dict:
        """``{"requests": n, "bytes": n}`` sent and received so far."""
        with self._counts:
            return {"requests": self.requests, "bytes": self.bytes_fetched}

    def fetch(self, start: int, end: int, deadline: float) -> Response:
        """One range, retried; checked against the pinned identity.

        Raises:
            RemoteUnavailableError: still failing after the retries or past the deadline.
            RemoteChangedError: the object is not the one opened.
            WsiError: :attr:`stop` is set ("slide is closed").
        """
        attempt = 0
        while True:
            left = deadline - time.monotonic()
            if self.stop.is_set():  # closing (or the interpreter exiting): no new request, no retry
                raise WsiError(f"{self.shown}: slide is closed (bytes {start}-{end - 1} not read)")
            if left <= 0:
                raise RemoteUnavailableError(
                    f"{self.shown}: no answer within the operation timeout of "
                    f"{self.options.operation_timeout:g} s (bytes {start}-{end - 1})")
            try:
                with self._counts:
                    self.requests += 1
                response = self.transport.get(start, end, self.pin, min(self.options.timeout, left))
            except Transient as exc:
                attempt += 1
                if attempt > self.options.retries:
                    raise RemoteUnavailableError(
                        f"{self.shown}: {exc.reason} (bytes {start}-{end - 1}; gave up after "
                        f"{attempt} attempts)") from None
                pause = retry_pause(attempt, self.options.backoff)
                if exc.retry_after is not None:
                    pause = max(pause, min(exc.retry_after, MAX_RETRY_AFTER))
                pause = min(pause, max(0.0, deadline - time.monotonic()))
                self.stop.wait(pause)  # (cut short by close)
                continue
            with self._counts:
                self.requests += response.requests - 1  # (0: served from memory; 2: asked twice)
                self.bytes_fetched += len(response.data) if response.received is None else response.received
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
