"""HTTP(S) range requests for :class:`~wsitool.storage.remote.RemoteSource` (floor 1).

Requests go through obstore's ``HTTPStore`` (Rust's ``object_store`` over reqwest;
``pip install 'wsitool[remote]'``), as those of S3, GCS and Azure do
(:mod:`.objectstore`): one connection pool per slide, the GIL
released for the whole request.  Chosen over urllib3, which this transport used
before, on the remote benchmark (``scripts/bench_remote.py``): 1024 x 1024 JPEG
regions at 0 ms over nginx, 8 threads, went from 0.59x to 0.86x of the local read's
regions per second on a 2-core machine (urllib3 spends ~0.2 ms of CPU per request
holding the GIL, and its threads contend for it: 110 context switches per region).

Each request is ``GET`` with ``Range: bytes=a-b`` (never ``HEAD``: a presigned
URL is signed for GET only; its query string is sent as given); the object's size
is the total of the ``Content-Range`` of a ``206`` answer.  Redirects are followed.
A ``200`` answer (a server that ignores ranges, such as ``python -m http.server``) whose
declared ``Content-Length`` is at most :data:`WHOLE_OBJECT_LIMIT` (64 MiB) is read whole, once,
through the bounded reader, and kept: every later range is served from it, without a request,
and a :class:`~wsitool.errors.SlideWarning` says so in one line; a larger one, or one without a
length, is :class:`~wsitool.errors.RemoteUnavailableError` at once, its body unread ("does not
support HTTP range requests", exit 17: retrying cannot help).  After the first answer each request
carries ``If-Match`` with the pinned ETag when it is a strong one (``412`` then means
the object changed).  ``timeout``: seconds to connect and that a request may wait for
its next bytes; ``operation_timeout`` also bounds one whole request.  Statuses read as in
:func:`~wsitool.storage.remote.status.status_error` by both clients (404/410 not found, 401/403
denied, 412 changed, 408/425/429/500/502/503/504 retried, any other an unexpected answer).

obstore's runtime does not survive ``fork()`` once it has made a request: in a process
forked after that (:func:`~wsitool.storage.remote.transports.obstore_client.runtime_usable` false) the same
requests go through urllib3 (:class:`_Urllib3Client`; one connection pool, up to 5
redirects), with the same outcomes (the fault tests run both clients); so do those of a
server whose answers obstore cannot read (chunked, without ``Content-Length``; a
``Last-Modified`` in an obsolete date form).  Last-Modified is pinned and compared in one
form (:func:`~wsitool.storage.remote.transports.obstore_client.http_date`) whichever client read it.

``storage_options`` for HTTP(S): ``headers`` (a dict sent with every request,
e.g. ``{"Authorization": "Bearer ..."}``; never printed), ``verify`` (False to
skip TLS verification, or the path of a PEM file of CA certificates trusted besides the
system's), plus the generic keys of :class:`~wsitool.storage.remote.options.RemoteOptions`.
"""

from __future__ import annotations

import datetime
import functools
import re
import ssl
import threading
import time
import types
import urllib.parse
import warnings
from pathlib import Path
from typing import Any

from ....errors import (
    InvalidOptionError,
    RemoteAccessError,
    RemoteUnavailableError,
    SlideWarning,
    WsiError,
)
from ....ground.extras import optional_import
from ..body import check_length, read_body, too_long
from ..status import Transient, status_error
from ..transport import Response, Transport
from .obstore_client import (
    HeaderTrouble,
    client_timeouts,
    first_line,
    http_date,
    keep_inherited,
    obstore_module,
    raise_failure,
    ranged_get,
    runtime_usable,
    without_frames,
)

__all__ = ["HttpTransport", "BODY_PIECE", "WHOLE_OBJECT_LIMIT", "verify_option", "failure_cause"]

_CONTENT_RANGE = re.compile(r"bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)", re.I)
#: Largest object read whole (and kept in memory) from a server that ignores Range.
WHOLE_OBJECT_LIMIT = 64 * 1024 * 1024
#: Most bytes of a body urllib3 reads at a time (the request's deadline is checked between them).
BODY_PIECE = 256 * 1024


def _urllib3() -> types.ModuleType:
    return optional_import("urllib3", "remote", "reading slides over HTTP(S) needs the optional extra: ", WsiError)


def _headers(shown: str, raw: Any) -> dict:
    """The ``headers`` storage option as a dict of names to text (numbers become text).

    Raises:
        InvalidOptionError: not a mapping of names to text or numbers (the values,
            often secrets, are never shown).
    """
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidOptionError(f"{shown}: storage option headers: expected headers.NAME=VALUE "
                                 f"(or a JSON object), got type {type(raw).__name__}")
    out = {}
    for name, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise InvalidOptionError(f"{shown}: storage option headers.{name}: expected text, "
                                     f"got type {type(value).__name__}")
        out[str(name)] = value if isinstance(value, str) else str(value)
    return out


class HttpTransport(Transport):
    """Ranged GETs of one HTTP(S) URL: through obstore (:class:`_ObstoreClient`), or urllib3
    (:class:`_Urllib3Client`) in a process forked after obstore's runtime started, where
    obstore would hang (:func:`~wsitool.storage.remote.transports.obstore_client.runtime_usable`), and for a
    server whose answers obstore cannot read (a chunked answer without ``Content-Length``,
    a ``Last-Modified`` in an obsolete form: :class:`~wsitool.storage.remote.transports.obstore_client.HeaderTrouble`).

    Args:
        url: the URL (with its query, e.g. a presigned URL's signature).
        shown: the URL as messages show it.
        options: the transport's ``storage_options`` (``headers``, ``verify``).
        maxsize: connections kept in the pool.
        timeout: seconds to connect, and that a request may wait for its next bytes.
        total: seconds one request may take in all (the read's ``operation_timeout``).

    Raises:
        WsiError: the remote extra is not installed; InvalidOptionError: an unknown option, a bad
            ``headers`` or ``verify``, a URL without a valid host or port.
    """

    protocol = "http"
    #: "obstore" or "urllib3": the client every new transport takes (tests; None: as
    #: :func:`~wsitool.storage.remote.transports.obstore_client.runtime_usable` says).
    force_client: str | None = None

    def __init__(self, url: str, shown: str, options: dict, maxsize: int = 16, timeout: float = 20.0,
                 total: float = 120.0):
        self.url = url
        self.shown = shown
        self.headers = _headers(shown, options.pop("headers", None))
        self.verify = verify_option(shown, options.pop("verify", True))
        if options:
            raise InvalidOptionError(f"{shown}: unknown storage option(s) for HTTP(S): {', '.join(sorted(options))}")
        try:  # a bad port or host: a usage error now, not a "server failing" after the retries
            parts = urllib.parse.urlsplit(url)
            host, _ = parts.hostname, parts.port
        except ValueError:  # its text can quote the URL (secrets)
            host = None
        if not host:
            raise InvalidOptionError(f"{shown}: not a valid URL (check the host and the port)")
        self.maxsize, self.timeout, self.total = maxsize, timeout, total
        self._client: _ObstoreClient | _Urllib3Client = self._make_client()
        #: the whole object, where the server ignores Range (:data:`WHOLE_OBJECT_LIMIT`)
        self._whole: Response | None = None
        self._lock = threading.Lock()

    def _make_client(self, which: str | None = None) -> _ObstoreClient | _Urllib3Client:
        which = which or self.force_client or ("obstore" if runtime_usable() else "urllib3")
        if which == "obstore":
            return _ObstoreClient(self.url, self.shown, self.headers, self.verify, self.maxsize, self.timeout,
                                  self.total)
        return _Urllib3Client(self.url, self.shown, self.headers, self.verify, self.maxsize, self.total)

    def get(self, start: int, end: int, pin: Response | None, timeout: float) -> Response:
        whole, requests = self._whole, 0
        if whole is None:
            client = self._client
            try:
                got = client.get(start, end, pin, timeout)
            except HeaderTrouble:
                # a server obstore cannot read: this slide goes on through urllib3 (the answer again);
                # the obstore client is not closed here (other threads may be reading through it):
                # it goes when the last of them lets it go
                if self._client is client:
                    self._client = self._make_client("urllib3")
                got = self._client.get(start, end, pin, timeout)
            if not got.whole:
                return got
            whole, requests = self._keep_whole(got), got.requests
        return Response(whole.data[start:min(end, whole.size)], whole.size, whole.etag, whole.modified,
                        requests=requests, received=len(whole.data) if requests else 0)

    def _keep_whole(self, got: Response) -> Response:
        """Keep the whole object a server that ignores ``Range`` sent (one line says so, once)."""
        with self._lock:
            if self._whole is None:
                self._whole = Response(bytes(got.data), got.size, got.etag, got.modified)
                warnings.warn(f"{self.shown}: the server ignores HTTP range requests: the whole object "
                              f"({got.size} bytes, at most {WHOLE_OBJECT_LIMIT >> 20} MiB are read so) was read "
                              "once and is kept in memory", SlideWarning, stacklevel=2)
            return self._whole

    def after_fork(self) -> None:
        keep_inherited(self._client)
        self._client = self._make_client()  # a fresh client: no connection of the parent's

    def close(self) -> None:
        keep_inherited(self._client)
        self._client.close()


class _ObstoreClient:
    """The ranged GETs of :class:`HttpTransport` through obstore's ``HTTPStore`` (see the module)."""

    protocol = "http"

    def __init__(self, url: str, shown: str, headers: dict, verify: bool | str, maxsize: int, timeout: float,
                 total: float):
        self.url, self.shown = url, shown
        options: dict[str, Any] = {**client_timeouts(timeout, total), "pool_max_idle_per_host": str(maxsize),
                                   "allow_http": url.lower().startswith("http://")}
        if headers:
            options["default_headers"] = headers
        if verify is False:
            options["allow_invalid_certificates"] = True
        elif isinstance(verify, str):
            options["root_certificate"] = _ca_bytes(shown, verify)
        try:
            self._store: Any = obstore_module().store.HTTPStore.from_url(
                url, client_options=options,
                retry_config={"max_retries": 0, "retry_timeout": datetime.timedelta(seconds=1)})
        except WsiError:
            raise
        except Exception as exc:  # obstore refuses the URL, a header or the CA file
            raise InvalidOptionError(f"{shown}: not a valid URL, header or CA file for the HTTP client "
                                     f"({first_line(str(exc).replace(url, shown), 120)})") from None

    def get(self, start: int, end: int, pin: Response | None, timeout: float) -> Response:
        strong = pin.etag if pin is not None and pin.etag and not pin.etag.startswith("W/") else ""
        try:
            try:
                # (the store's URL is the slide's: its path "" is the URL itself, query and all)
                return ranged_get(self._store, "", start, end, pin, self.shown, self.protocol, if_match=strong,
                                  url=self.url)
            except obstore_module().exceptions.NotSupportedError:  # a 200 answer: the server ignores Range
                return self._whole(start, end)
        except Exception as exc:
            raise without_frames(exc) from None

    def _whole(self, start: int, end: int) -> Response:
        """The whole object of a server that ignores ``Range`` (a :class:`Response` with ``whole``),
        where its declared size is at most :data:`WHOLE_OBJECT_LIMIT`: one GET of it.

        Raises:
            RemoteUnavailableError: a larger object (its body unread; retrying cannot help).
            Transient, and the errors of :func:`~wsitool.storage.remote.transports.obstore_client.ranged_get`.
        """
        refused = RemoteUnavailableError(f"{self.shown}: the server does not support HTTP range requests "
                                         f"(HTTP 200, the whole object, for bytes {start}-{end - 1}; an object of "
                                         f"at most {WHOLE_OBJECT_LIMIT >> 20} MiB would be read whole)")
        obstore = obstore_module()
        exc_mod = obstore.exceptions
        try:
            result = obstore.get(self._store, "")
            meta = result.meta
            size = int(meta["size"])  # (its Content-Length: obstore refuses an answer without one)
            if size > WHOLE_OBJECT_LIMIT:
                del result  # (its body unread: the connection is dropped)
                raise refused
            data = bytes(read_body(result.stream(min_chunk_size=max(1, size)), size, self.shown,
                                   "the whole object", exact=True))
            del result
        except (exc_mod.BaseError, OSError, TimeoutError, ConnectionError) as exc:
            return raise_failure(exc, start, None, self.shown, self.protocol, self.url)
        if len(data) != size:
            raise Transient(f"the body was cut short ({len(data)} of {size} bytes)")
        return Response(data, size, meta.get("e_tag"), http_date(meta.get("last_modified")), whole=True,
                        requests=2)  # (the ranged GET the server answered with a 200, then this one)

    def close(self) -> None:
        self._store = None  # (the pool and its connections go with the store)


class _Urllib3Client:
    """The ranged GETs of :class:`HttpTransport` through urllib3: in a process forked after
    obstore's runtime started (:func:`~wsitool.storage.remote.transports.obstore_client.runtime_usable`), where an
    obstore request would never return, and for a server whose answers obstore cannot read
    (:class:`~wsitool.storage.remote.transports.obstore_client.HeaderTrouble`).  One connection pool of ``maxsize``
    connections; up to 5 redirects."""

    def __init__(self, url: str, shown: str, headers: dict, verify: bool | str, maxsize: int, total: float = 120.0):
        self.url, self.shown, self.headers, self.verify, self.maxsize = url, shown, headers, verify, maxsize
        self.total = total  # seconds one request may take in all (a body sent slowly is cut off past it)
        self._pool: Any = None  # urllib3.PoolManager
        self._make_pool()

    def _make_pool(self) -> None:
        urllib3 = _urllib3()
        kw: dict[str, Any] = {}
        if self.verify is False:
            kw["cert_reqs"] = "CERT_NONE"
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        elif isinstance(self.verify, str):  # trusted besides the system's roots, as obstore does
            context = ssl.create_default_context()
            try:
                context.load_verify_locations(cafile=self.verify)
            except (OSError, ssl.SSLError) as exc:
                raise InvalidOptionError(f"{self.shown}: storage option verify: cannot load the CA file "
                                         f"{self.verify!r} ({type(exc).__name__})") from None
            kw["ssl_context"] = context
        # urllib3 retries nothing (RemoteSource does) but follows up to 5 redirects (retries=False
        # would hand the 302 back); a redirect's answer is then read like any other
        retries = urllib3.Retry(total=None, connect=0, read=0, status=0, other=0, redirect=5,
                                raise_on_redirect=False, raise_on_status=False)
        self._pool = urllib3.PoolManager(num_pools=4, maxsize=self.maxsize, block=False, retries=retries, **kw)

    def get(self, start: int, end: int, pin: Response | None, timeout: float) -> Response:
        urllib3 = _urllib3()
        headers = dict(self.headers)
        headers["Range"] = f"bytes={start}-{end - 1}"
        headers.setdefault("Accept-Encoding", "identity")
        if pin is not None and pin.etag and not pin.etag.startswith("W/"):
            headers["If-Match"] = pin.etag
        deadline = time.monotonic() + self.total
        try:
            r = self._pool.request("GET", self.url, headers=headers, preload_content=False,
                                   redirect=True, timeout=urllib3.Timeout(connect=timeout, read=timeout))
        except urllib3.exceptions.HTTPError as exc:  # timeouts, refused / reset connections, TLS
            raise Transient(failure_cause(exc)) from None
        try:
            response = self._answer(r, start, end, pin, deadline)
        except BaseException as exc:
            # an error answer's connection is closed, not pooled, and the error leaves without
            # the frames that hold the response: a traceback kept alive (a future's error, a
            # caller's) would otherwise keep its socket open
            _discard(r)
            del r
            raise exc.with_traceback(None) from None
        if r.length_remaining == 0:  # the body read to its end: the connection serves again
            r.release_conn()
        else:  # (a chunked body's last chunk unread): closed, not pooled
            _discard(r)
        return response

    def _answer(self, r: Any, start: int, end: int, pin: Response | None, deadline: float) -> Response:
        """The :class:`Response` of ``r`` (urllib3's answer to a GET of bytes ``start .. end - 1``),
        its body read through :func:`~wsitool.storage.remote.body.read_body` at most :data:`BODY_PIECE`
        bytes at a time until ``deadline`` (``time.monotonic()``: a server sending a byte now and
        then never trips the read timeout), never past the bytes asked for.

        Raises:
            RemoteNotFoundError, RemoteAccessError, RemoteChangedError: what retrying cannot fix;
                so is RemoteUnavailableError for a server that ignores Range (a 200 answer), or
                declares or sends more than was asked.
            Transient: what it may (a retry status, a cut body, a range other than asked).
        """
        status = r.status
        refused = self._refusal(r, status, start, end, pin)
        if refused is not None:
            return refused
        want, total = self._extent(r, status, start, end)
        what = f"bytes {start}-{end - 1}" if status == 206 else "the whole object"
        check_length(r.headers.get("Content-Length"), want if status == 206 else total, self.shown, what,
                     exact=True)
        data = self._body(r, want if status == 206 else total, what, deadline)
        if len(data) < (want if status == 206 else total):
            raise Transient(f"the body was cut short ({len(data)} of {want if status == 206 else total} bytes)")
        return Response(data, total, r.headers.get("ETag"), http_date(r.headers.get("Last-Modified")),
                        whole=status == 200)

    def _body(self, r: Any, count: int, what: str, deadline: float) -> bytes:
        """Up to ``count`` bytes of ``r``'s body (fewer: the body ended early), never more.

        Raises:
            RemoteUnavailableError: more than ``count`` bytes arrived (:func:`~wsitool.storage.remote.body.read_body`).
            Transient: the connection failed, or ``deadline`` passed before the body's end.
        """
        urllib3 = _urllib3()
        read = getattr(r, "read1", None) or r.read  # (read1: what has arrived, without waiting for all)
        pieces = iter(functools.partial(read, BODY_PIECE, decode_content=False), b"")
        try:
            return bytes(read_body(pieces, count, self.shown, what, exact=True, deadline=deadline))
        except Transient as exc:
            raise Transient(f"the body took more than {self.total:g} s ({exc.reason})") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Transient(f"the body was cut short ({failure_cause(exc)})") from None

    def _refusal(self, r: Any, status: int, start: int, end: int, pin: Response | None) -> Response | None:
        """Raise the error of a status that carries no bytes
        (:func:`~wsitool.storage.remote.status.status_error`: not found, denied, changed, a retry
        status, any other outside 2xx); the empty object's :class:`Response` for a 416 at open
        of a 0-byte object; None for 2xx.  The body of such an answer is not read (its
        connection is closed by the caller)."""
        retry_after = r.headers.get("Retry-After")
        try:
            wait = float(retry_after) if retry_after else None
        except ValueError:
            wait = None
        error = status_error(status, self.shown, pin, retry_after=wait)
        if status == 416 and error is None:  # before the pin: an empty object, or a range refused
            total = _total(r.headers.get("Content-Range", ""))
            if total == 0:
                return Response(b"", 0, r.headers.get("ETag"), http_date(r.headers.get("Last-Modified")))
            error = RemoteAccessError(f"{self.shown}: the server refused the byte range "
                                      f"{start}-{end - 1} (HTTP 416)")
        if error is not None:
            raise error
        return None

    def _extent(self, r: Any, status: int, start: int, end: int) -> tuple[int, int]:
        """``(bytes wanted, the object's size)`` of a 206 or 200 answer; raises for one
        whose range or length does not serve the request, and for every other status
        (the body is not read: the caller closes the connection)."""
        if status == 206:
            m = _CONTENT_RANGE.match(r.headers.get("Content-Range", ""))
            if m is None or m.group(1) is None or m.group(3) == "*":
                raise Transient(f"HTTP 206 without a usable Content-Range "
                                f"({r.headers.get('Content-Range')!r})")
            got_start, got_end, total = int(m.group(1)), int(m.group(2)), int(m.group(3))
            if got_start != start:
                raise Transient(f"the server answered bytes {got_start}-{got_end} for {start}-{end - 1}")
            want = min(end, total) - start
            if got_end + 1 - got_start > want:  # more than asked: never read (nor retried)
                raise too_long(self.shown, want, f"bytes {start}-{end - 1}", asked=True,
                               declared=got_end + 1 - got_start)
        elif status == 200:
            length = r.headers.get("Content-Length")
            size = int(length) if length and length.isdigit() and length.isascii() else None
            if size is None or size > WHOLE_OBJECT_LIMIT:
                # not a refusal (exit 16) but a server wsitool cannot read from: 17, without retries
                # (and without reading the body: a server sending an endless one is not drained)
                raise RemoteUnavailableError(f"{self.shown}: the server does not support HTTP range requests "
                                             f"(HTTP 200, the whole object, for bytes {start}-{end - 1}; an "
                                             f"object of at most {WHOLE_OBJECT_LIMIT >> 20} MiB would be read whole)")
            total = size
            want = total  # (the whole object, kept by HttpTransport)
        else:  # (another 2xx: _refusal let it through)
            raise RemoteAccessError(f"{self.shown}: unexpected answer HTTP {status}")
        return want, total

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.clear()


def _discard(r: Any) -> None:
    """Close urllib3's answer ``r`` and its connection without reading what is left of its
    body (a server may send one without end), then hand the pool its slot back."""
    conn = getattr(r, "connection", None) or getattr(r, "_connection", None)
    r.close()
    if conn is not None:
        conn.close()
    r.release_conn()


def verify_option(shown: str, raw: Any) -> bool | str:
    """The ``verify`` storage option as True (the system's CA certificates), False (no
    verification) or the path of a PEM file of CA certificates trusted besides the system's
    (checked readable now).  Takes booleans, ``0``/``1``, ``"true"``/``"false"`` (any case),
    None (the default), and a path.

    Raises:
        InvalidOptionError: another type, or a path that cannot be read.
    """
    if raw is None or raw is True or (isinstance(raw, str) and raw.lower() in ("true", "1", "yes")):
        return True
    if raw is False or (isinstance(raw, str) and raw.lower() in ("false", "0", "no")):
        return False
    if isinstance(raw, int) and not isinstance(raw, bool) and raw in (0, 1):
        return bool(raw)
    if isinstance(raw, (str, Path)) and str(raw):
        path = str(raw)
        _ca_bytes(shown, path)
        return path
    raise InvalidOptionError(f"{shown}: storage option verify: expected true, false or a CA file path, "
                             f"got type {type(raw).__name__}")


def _ca_bytes(shown: str, path: str) -> bytes:
    """The bytes of the CA file ``path`` (PEM; comments in any encoding).

    Raises:
        InvalidOptionError: it cannot be read, or holds no PEM certificate.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InvalidOptionError(f"{shown}: storage option verify: cannot read the CA file {path!r} "
                                 f"({exc.strerror or type(exc).__name__})") from None
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise InvalidOptionError(f"{shown}: storage option verify: {path!r} holds no PEM certificate")
    return data


def _total(content_range: str) -> int | None:
    m = _CONTENT_RANGE.match(content_range or "")
    if m is None or m.group(3) == "*":
        return None
    return int(m.group(3))


def failure_cause(exc: BaseException) -> str:
    """A short cause of a urllib3 failure, without the URL (it may carry tokens)."""
    name = type(exc).__name__
    reason = getattr(exc, "reason", None)
    if reason is not None:
        exc = reason
        name = type(reason).__name__
    text = str(exc)
    # urllib3 puts the pool and URL in its messages: keep the part after the last colon
    if "host=" in text or "url=" in text or "http" in text:
        text = text.rsplit(":", 1)[-1].strip() or name
    if "timed out" in text.lower() or "Timeout" in name:
        return f"timed out ({text})" if text else "timed out"
    if "reset" in text.lower() or "ProtocolError" in name:
        return f"connection reset ({text})"
    return f"{name}: {text}" if text else name
