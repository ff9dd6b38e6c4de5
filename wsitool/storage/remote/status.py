"""What a server's answer means, and how long to wait before asking again (floor 1).

Every client of a remote slide (the HTTP(S) and object-store transports, the DICOMweb client)
reads a status the same way (:func:`status_error`), signals a failure worth retrying with
:class:`Transient`, and waits between attempts by the same exponential back-off
(:func:`retry_pause`).  Each keeps its own loop: what bounds it (a read's deadline, a
listing's, a close that cuts the wait short) is its own.
"""

from __future__ import annotations

import random

from ...errors import RemoteAccessError, RemoteChangedError, RemoteNotFoundError

__all__ = ["RETRY_STATUS", "MAX_PAUSE", "Transient", "status_error", "retry_pause"]

#: Statuses worth retrying (RFC 9110: request timeout, too early, too many requests, and the
#: server errors that say "try again": 500, 502, 503, 504).
RETRY_STATUS = frozenset((408, 425, 429, 500, 502, 503, 504))
#: Longest back-off between two attempts, seconds (before jitter).
MAX_PAUSE = 8.0


class Transient(Exception):
    """A failure worth retrying (timeout, reset, 429/5xx, short body); ``retry_after`` in seconds or None."""

    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


def status_error(status: int, shown: str, pin: object | None, *, detail: str = "",
                 retry_after: float | None = None) -> Exception | None:
    """The error of an answer's HTTP ``status``, the same for every client: 404 and 410 not
    found (exit 9); 401 and 403 access denied (16); 412, and 416 once the object is pinned
    (``pin``: the identity taken at open, a :class:`~wsitool.storage.remote.transport.Response`),
    the object changed (18); :data:`RETRY_STATUS` :class:`Transient` (``retry_after``
    seconds); any other status outside 2xx an unexpected answer (16, not retried: e.g. 400 for
    a malformed or expired signed URL).  None for 2xx, and for 416 before the pin (the caller
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


def retry_pause(attempt: int, backoff: float, low: float = 0.5, spread: float = 1.0) -> float:
    """Seconds to wait before attempt ``attempt + 1`` (``attempt`` >= 1 failed so far):
    ``backoff`` doubled each time, at most :data:`MAX_PAUSE`, times a jitter drawn from
    ``[low, low + spread)`` (``spread`` 0: none)."""
    base = min(MAX_PAUSE, backoff * (2 ** (attempt - 1)))
    return base * (low + spread * random.random()) if spread else base * low
