"""The interface every remote transport implements: one ranged GET of one object (floor 1).

:class:`~wsitool.storage.remote.source.RemoteSource` reads through a :class:`Transport` and
knows nothing of the client behind it; the transports are in
:mod:`wsitool.storage.remote.transports` (HTTP(S) in :mod:`~wsitool.storage.remote.transports.http`,
S3, GCS and Azure in :mod:`~wsitool.storage.remote.transports.objectstore`).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

__all__ = ["Transport", "Response"]


@dataclass
class Response:
    """One ranged GET's result: the bytes and what the server said about the object.

    ``data``: ``bytes``, or a read-only byte ``memoryview`` of the client's own buffer (obstore's
    body, uncopied): slice it and copy the slice where it is kept.  ``whole``: ``data`` is the
    whole object, sent by a server that ignores ``Range`` (an HTTP ``200``), not the range asked.
    ``requests``: the requests this answer took (0: served from the whole object kept before;
    2: obstore's ranged GET refused, then the whole object).  ``received``: the body bytes
    received, where not ``len(data)`` (a range cut from the whole object just read; 0 when kept)."""

    data: bytes | memoryview
    size: int  # the object's total size (Content-Range total)
    etag: str | None = None
    modified: str | None = None
    whole: bool = False
    requests: int = 1
    received: int | None = None


class Transport(abc.ABC):
    """How one ranged GET of one object is made.

    Implementations raise :class:`~wsitool.errors.RemoteNotFoundError`,
    :class:`~wsitool.errors.RemoteAccessError` or
    :class:`~wsitool.errors.RemoteChangedError` for what retrying cannot fix and
    :class:`~wsitool.storage.remote.status.Transient` for what it may; their messages use
    :attr:`shown`.
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
