"""The body of a server's answer, read without trusting the server (floor 1).

Every client of a remote slide reads the bodies of its answers here: obstore (HTTP(S),
S3, GCS, Azure: :func:`~wsitool.storage.remote.transports.obstore_client.ranged_get`), urllib3 (HTTP(S) in a
forked process, :mod:`wsitool.storage.remote.transports.http`) and the DICOMweb client
(:mod:`wsitool.formats.dicom.web.client`).  A server decides what it sends, so each read is given
the most bytes its request may bring (its *limit*):

* a byte range: the range's length, exactly (``exact=True``): the read stops there;
* an answer whose length is not known in advance (DICOMweb JSON, a multipart answer of
  frames): a documented cap (:data:`~wsitool.formats.dicom.web.client.JSON_LIMIT`, a frame request's
  bound computed from the frames' sizes).

:func:`check_length` refuses a declared ``Content-Length`` that does not fit before any of
the body is read; :func:`read_body` takes the body piece by piece (as the client receives
it) and refuses it as soon as it passes the limit, so a server that declares 10 GiB, or
sends a body without end (chunked, or past its own ``Content-Length``), costs at most the
limit and one piece of memory, and the read ends at once with one
:class:`~wsitool.errors.RemoteUnavailableError` (exit 17: retrying cannot help).  The
client then closes the connection instead of reading the rest.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from ...errors import RemoteUnavailableError
from .status import Transient

__all__ = ["check_length", "read_body", "too_long"]


def too_long(shown: str, limit: int, what: str, *, asked: bool, declared: int | None = None) -> RemoteUnavailableError:
    """The error of an answer longer than its request may bring: ``limit`` bytes for ``what``
    (e.g. ``"bytes 0-65535"``); ``asked``: ``limit`` is what was asked for (a byte range),
    else a cap; ``declared``: the length the server declared, where that is what is refused."""
    if asked:
        said = f"declared {declared} bytes for" if declared is not None else "sent more than"
        return RemoteUnavailableError(f"{shown}: the server {said} the {limit} bytes asked for ({what}); "
                                      "an answer longer than its request is not read")
    said = f"declared {declared} bytes," if declared is not None else "sent"
    return RemoteUnavailableError(f"{shown}: the server {said} more than the {limit} bytes read at most for "
                                  f"{what}")


def check_length(declared: str | None, limit: int, shown: str, what: str, *, exact: bool = False) -> int | None:
    """The declared ``Content-Length`` of an answer (None where it declares none), checked
    before its body is read.

    Args:
        declared: the header's value as sent (None: absent).
        limit: the most bytes the request may bring.
        shown: the URL as messages show it.
        what: what was asked, for the message (``"bytes 0-65535"``, ``"frames 1,2"``).
        exact: the answer must be ``limit`` bytes long (a byte range); a shorter one is
            :class:`~wsitool.storage.remote.status.Transient` (a body cut short: worth a retry).

    Raises:
        RemoteUnavailableError: the length is not a number, or is above ``limit``.
        Transient: with ``exact``, below it.
    """
    if declared is None:
        return None
    text = declared.strip()
    if not text.isdigit() or not text.isascii():
        raise RemoteUnavailableError(f"{shown}: the server declared a Content-Length that is not a number "
                                     f"({text[:40]!r}; {what})")
    length = int(text)
    if length > limit:
        raise too_long(shown, limit, what, asked=exact, declared=length)
    if exact and length < limit:
        raise Transient(f"the server declared {length} bytes for {what} ({limit} asked)")
    return length


def read_body(pieces: Iterable[Any], limit: int, shown: str, what: str, *, exact: bool = False,
              deadline: float | None = None) -> bytes | memoryview:
    """The body of an answer from ``pieces`` (bytes-like objects, as the client receives
    them), at most ``limit`` bytes.

    The body is read to its end, and refused as soon as more than ``limit`` bytes arrived
    (a body that goes on past its range is not taken whole: one piece past the limit at the
    most).  A body of one piece is returned as that piece (no copy: an obstore buffer stays
    as it is); several are joined.  Fewer bytes than ``limit`` is the caller's to judge (a
    range cut short; the end of an object).

    Args:
        pieces: the body's pieces; an empty one, or the iterator's end, ends the body.
        limit: the most bytes accepted.
        shown, what: for messages (the URL as shown, what was asked).
        exact: ``limit`` is the length asked for (a byte range), not a cap (the message says which).
        deadline: ``time.monotonic()`` past which the body is not waited for (checked
            between pieces: a server sending a byte now and then never trips a read timeout).

    Raises:
        RemoteUnavailableError: more than ``limit`` bytes arrived.
        Transient: ``deadline`` passed before the body's end (its reason says how much arrived).
    """
    held: list[Any] = []
    got = 0
    for piece in pieces:
        size = len(piece)
        if not size:
            break
        got += size
        if got > limit:
            held.clear()  # (let the pieces go before the error is handled)
            raise too_long(shown, limit, what, asked=exact)
        held.append(piece)
        if deadline is not None and time.monotonic() > deadline:
            raise Transient(f"{got} of {limit if exact else 'at most ' + str(limit)} bytes received by the deadline")
    if len(held) == 1:
        return held[0] if isinstance(held[0], (bytes, memoryview)) else memoryview(held[0])
    return b"".join(held)
