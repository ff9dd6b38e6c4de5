"""The obstore calls of the HTTP(S) and object-store transports (floor 1).

obstore (Rust's ``object_store``; ``pip install 'wsitool[remote]'``) makes the requests of
HTTP(S) URLs (:mod:`.http`) and of S3, GCS and Azure (:mod:`.objectstore`): one ranged GET
(:func:`ranged_get`, its body read through the bounded reader
:func:`~wsitool.storage.remote.body.read_body`), its failures in wsitool's words
(:func:`raise_failure`: not found, denied, changed, or :class:`~wsitool.storage.remote.status.Transient`),
the guard of its runtime, which does not survive ``fork()`` once it has made a request
(:func:`runtime_usable`, :func:`check_runtime`, :func:`keep_inherited`), and its error texts
shown without secrets (:func:`first_line`).
"""

from __future__ import annotations

import datetime
import email.utils
import functools
import os
import re
import types
from typing import Any

from ....errors import RemoteAccessError, RemoteNotFoundError, RemoteUnavailableError, WsiError
from ....ground.extras import optional_import
from ..body import read_body, too_long
from ..status import Transient, status_error
from ..transport import Response

__all__ = ["obstore_module", "ranged_get", "raise_failure", "HeaderTrouble", "without_frames", "http_date",
           "client_timeouts", "status_of", "runtime_usable", "enter_runtime", "check_runtime", "keep_inherited",
           "first_line"]

_module: types.ModuleType | None = None


def obstore_module() -> types.ModuleType:
    """The ``obstore`` package (its ``store`` module imported too).

    Raises:
        WsiError: obstore is not installed (the remote extra).
    """
    global _module
    if _module is None:
        optional_import("obstore.store", "remote", "reading slides from http(s)://, s3://, gs:// and az:// URLs "
                        "needs the optional extra: ", WsiError)
        import obstore  # (imported with its store module above)

        _module = obstore
    return _module


def ranged_get(store: Any, key: str, start: int, end: int, pin: Response | None, shown: str, protocol: str,
               *, if_match: str | None = None, url: str | None = None) -> Response:
    """Bytes ``start .. end - 1`` of object ``key`` of an obstore ``store`` (a
    :meth:`Transport.get <wsitool.storage.remote.transport.Transport.get>` made through obstore).

    ``if_match``: the ETag the server is asked to check (``If-Match``; default: the pinned
    one, where there is a pin).  ``shown``: the URL as messages show it; ``url``: the URL
    as requested, replaced by ``shown`` wherever obstore's texts quote it.  obstore's
    ``NotSupportedError`` (an HTTP server that ignores ``Range``) is passed on as it is: the
    caller decides.

    Raises:
        RemoteNotFoundError, RemoteAccessError, RemoteChangedError: what retrying cannot fix
            (:func:`raise_failure` says which status is which).
        RemoteUnavailableError: a server whose answers lack a header obstore needs; a body
            longer than the range (:func:`~wsitool.storage.remote.body.read_body`: never read past it).
        HeaderTrouble: the same, for ``protocol`` "http" (its caller reads through urllib3).
        Transient: what retrying may fix (timeouts, resets, 408/425/429/5xx, a body cut short).
        WsiError: this process was forked after its parent's first obstore request.
    """
    obstore = obstore_module()
    exc_mod = obstore.exceptions
    enter_runtime(shown, protocol)
    opts: dict = {"range": (start, end if pin is None else min(end, pin.size))}
    if if_match is None and pin is not None:
        if_match = pin.etag
    if if_match:
        opts["if_match"] = if_match
    try:
        result = obstore.get(store, key, options=opts)
        meta = result.meta
        want = max(0, min(end, meta["size"]) - start)
        # the body through the one bounded reader (obstore does not stop at the range it was
        # asked for: a server sending more, or without end, is refused past the range's
        # length); in one piece where the server sends no more (min_chunk_size), obstore's
        # buffer as it is (no copy: a copy of a tile row's bytes was a fresh mmap of 100+
        # KiB per request, page faults and all); its slices are copied where kept
        data = read_body(result.stream(min_chunk_size=max(1, want)), want, shown,
                         f"bytes {start}-{end - 1}", exact=True)
        del result  # (a body not read to its end: its connection is dropped, not pooled)
    except exc_mod.NotSupportedError:
        raise
    except (exc_mod.BaseError, OSError, TimeoutError, ConnectionError) as exc:
        return raise_failure(exc, start, pin, shown, protocol, url)  # (raises, unless the object is empty)
    if len(data) != want:
        raise Transient(f"the body was cut short ({len(data)} of {want} bytes)")
    return Response(data, int(meta["size"]), meta.get("e_tag"), http_date(meta.get("last_modified")))


class HeaderTrouble(Exception):
    """An HTTP(S) answer obstore cannot read: a header it needs is missing (``Content-Length``
    of a chunked answer) or not in the form it parses (``Last-Modified``).  urllib3 reads such
    servers: :class:`~wsitool.storage.remote.transports.http.HttpTransport` switches to it."""


def without_frames(exc: BaseException) -> BaseException:
    """``exc`` without the frames that raised it and the exception it was raised from.  Those
    frames hold the obstore store and its response, and so the pooled connection: an error
    kept alive (a future's, a caller's) would keep the socket open after the slide closed."""
    exc.__context__ = None
    exc.__cause__ = None
    return exc.with_traceback(None)


@functools.lru_cache(maxsize=64)  # (every answer carries the same one or two dates: parsed once)
def http_date(when: datetime.datetime | str | None) -> str | None:
    """A Last-Modified time as HTTP writes it (RFC 9110 IMF-fixdate, ``Wed, 02 Dec 2026 10:00:00
    GMT``), from obstore's datetime or a header's text, so that both HTTP clients pin and
    compare the same text; None for none (obstore says 1970-01-01, the Unix epoch, where the
    server sent none).  Text that does not parse as a date is kept as it is."""
    if isinstance(when, str):
        try:
            parsed = email.utils.parsedate_to_datetime(when)
        except (TypeError, ValueError, IndexError):
            return when
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=datetime.timezone.utc)
        when = parsed
    if when is None or when.timestamp() == 0:
        return None
    return email.utils.format_datetime(when.astimezone(datetime.timezone.utc), usegmt=True)


#: obstore's words for an answer whose Content-Range is not the range asked for (end exclusive)
_OTHER_RANGE = re.compile(r"Requested (\d+)\.\.(\d+), got (\d+)\.\.(\d+)")


def raise_failure(exc: Exception, start: int, pin: Response | None, shown: str, protocol: str,
             url: str | None = None) -> Response:
    """Raise the error of obstore's ``exc`` (see :func:`ranged_get`); but return the empty
    object's :class:`Response` for a range refused at open (416) when the object is empty.

    A status obstore's text names is read by :func:`~wsitool.storage.remote.status.status_error`, as
    the urllib3 client reads it; obstore's own classes stand in where the text names none.
    No status: timeouts, resets and refused connections are :class:`Transient`.
    """
    exc_mod = obstore_module().exceptions
    raw = str(exc)
    if url:
        raw = raw.replace(url, shown)
    status = status_of(raw)
    if not status and "Range Not Satisfiable" in raw:
        status = 416
    other = _OTHER_RANGE.search(raw)  # (obstore checks the answer's Content-Range against the request)
    if other is not None:
        asked, got = (int(other.group(1)), int(other.group(2))), (int(other.group(3)), int(other.group(4)))
        if got[0] == asked[0] and got[1] > asked[1]:  # more than asked: refused, never read (nor retried)
            raise too_long(shown, asked[1] - asked[0], f"bytes {asked[0]}-{asked[1] - 1}", asked=True,
                           declared=got[1] - got[0]) from None
        raise Transient(f"the server answered bytes {got[0]}-{got[1] - 1} for {asked[0]}-{asked[1] - 1}") from None
    first = first_line(raw, 4000)
    text = first if len(first) <= 160 else first[:157] + "..."
    if not status:
        if isinstance(exc, exc_mod.PreconditionError):
            status = 412
        elif isinstance(exc, FileNotFoundError):
            raise RemoteNotFoundError(shown) from None
        elif isinstance(exc, (exc_mod.PermissionDeniedError, exc_mod.UnauthenticatedError)):
            status = 403
    if status == 416 and pin is None and start == 0:  # an empty object
        return Response(b"", 0)
    if status == 400 and "RequestTimeout" in raw:  # (S3's 400 for an idle socket: worth a retry)
        raise Transient("HTTP 400 RequestTimeout") from None
    error = status_error(status, shown, pin, detail="" if protocol == "http" else text) if status else None
    if status == 416 and error is None:
        error = RemoteAccessError(f"{shown}: the server refused the byte range from {start} (HTTP 416)")
    if error is not None:
        raise error from None
    if "redirect" in raw.lower():  # reqwest's limit of redirects (urllib3: the last 3xx answer)
        raise RemoteAccessError(f"{shown}: too many redirects ({text})") from None
    if "Header missing from response" in first or "Invalid last modified" in first:
        if protocol == "http":
            raise HeaderTrouble(text) from None
        # the server will not add it on a retry
        raise RemoteUnavailableError(
            f"{shown}: the server's answer lacks a header the {protocol}:// client needs "
            f"({text}); an emulator that omits it cannot serve slides") from None
    raise Transient(_cause(raw, first)) from None




def client_timeouts(timeout: float, total: float) -> dict[str, str]:
    """obstore's client options for wsitool's ``timeout`` (seconds to connect, and that a request
    may wait for its next bytes: reqwest's read timeout) and ``total`` (seconds one request may
    take in all, the read's ``operation_timeout``: a slow link still fetches a 4 MiB range)."""
    def ms(seconds: float) -> str:
        return f"{max(1, int(round(seconds * 1000)))}ms"

    return {"connect_timeout": ms(timeout), "read_timeout": ms(timeout), "timeout": ms(max(total, timeout))}




#: An HTTP status in obstore's error texts: "status 403", "status: 403", "status code: 403
#: Forbidden", reqwest's "(503 Service Unavailable)", or a reason phrase after the code.
_STATUS = re.compile(r"(?:status(?: code)?:? |\()([1-5]\d\d)\b"
                     r"|\b([1-5]\d\d) (?:Unauthorized|Forbidden|Not Found|Range Not Satisfiable)\b")


def status_of(text: str) -> int:
    """The HTTP status an obstore error text names (0: none).  Digits alone are not taken:
    the texts carry timings too ("... in 401.173µs - HTTP error: error sending request")."""
    m = _STATUS.search(text)
    return int(m.group(1) or m.group(2)) if m else 0



#: The process whose request started obstore's runtime (its Tokio worker threads); None before
#: the first request.  A process forked after that inherits the started runtime without its
#: threads, and an obstore request there never returns (obstore is not fork-safe once used;
#: making a store does not start the runtime, a request does).
_runtime_pid: int | None = None


def runtime_usable() -> bool:
    """False in a process forked from one that had made an obstore request (a request would hang)."""
    return _runtime_pid is None or _runtime_pid == os.getpid()


def enter_runtime(shown: str, protocol: str) -> None:
    """Note that this process uses obstore's runtime (:func:`check_runtime` first)."""
    global _runtime_pid
    check_runtime(shown, protocol)
    if _runtime_pid is None:
        _runtime_pid = os.getpid()


def check_runtime(shown: str, protocol: str) -> None:
    """Refuse where obstore's runtime was inherited started (:func:`runtime_usable` false).

    Raises:
        WsiError: this process was forked after its parent made requests through obstore.
    """
    if not runtime_usable():
        raise WsiError(f"{shown}: cannot read {protocol}:// URLs in a process forked after its parent made requests "
                       "through obstore (the client of http(s)://, s3://, gs:// and az:// URLs), which does not "
                       "survive fork(); start the worker processes with 'spawn' or 'forkserver' (PyTorch "
                       "DataLoader: multiprocessing_context='spawn')")


#: stores (and HTTP clients) of a parent's obstore runtime that a forked child dropped: kept
#: referenced, never released there (their destructors would wake the parent's runtime, whose
#: locks another parent thread may have held at fork)
_inherited: list[Any] = []


def keep_inherited(client: Any) -> None:
    """Keep ``client`` (an obstore store, or an object holding one) alive for good where this
    process inherited obstore's runtime started (:func:`runtime_usable` false); else nothing."""
    if client is not None and not runtime_usable():
        _inherited.append(client)



#: obstore's kinds of HTTP failure (its "Debug source": ``HttpError { kind: ... }``) in words.
_KINDS = {"Timeout": "timed out", "Connect": "could not connect", "Interrupted": "connection reset or closed",
          "Decode": "the body could not be read"}


def _cause(raw: str, first: str) -> str:
    """A short cause of an obstore failure that names no HTTP status (``raw``: its text;
    ``first``: its first line, redacted): the kind of failure (timed out, could not connect,
    reset) and the end of the first line, after the request's URL and timing."""
    kind = re.search(r"HttpError \{\s*kind: (\w+)", raw)
    tail = first.rpartition(" - ")[2] or first
    if len(tail) > 160:
        tail = tail[:157] + "..."
    if kind is not None and kind.group(1) in _KINDS:
        return f"{_KINDS[kind.group(1)]} ({tail})"
    return tail if " - " in first else (first if len(first) <= 160 else first[:157] + "...")


def first_line(exc: BaseException | str, limit: int = 200) -> str:
    """The first line of an obstore error (or of its text) with every URL in it shown without
    its query (it can carry a token) and user information (a password), as
    :func:`~wsitool.storage.urls.redact` does."""
    whole = exc if isinstance(exc, str) else str(exc)
    text = whole.splitlines()[0] if whole else type(exc).__name__
    out = []
    for word in text.split():
        if "://" in word:
            scheme, _, rest = word.partition("://")
            authority, slash, path = rest.partition("/")
            if "@" in authority:
                authority = "***@" + authority.rpartition("@")[2]
            word = f"{scheme}://{authority}{slash}{path}"
            if "?" in word:
                word = word.split("?", 1)[0] + "?<redacted>"
        out.append(word)
    text = " ".join(out)
    return text if len(text) <= limit else text[:limit - 3] + "..."

