"""HTTP(S) range requests for :class:`~wsitool.storage.remote.RemoteSource` (floor 1).

One ``urllib3`` connection pool per slide (``pip install 'wsitool[remote]'``).
Each request is ``GET`` with ``Range: bytes=a-b`` (never ``HEAD``: a presigned
URL is signed for GET only); the object's size is the total of the
``Content-Range`` of a ``206`` answer.  A ``200`` answer (a server that ignores
ranges) is accepted for a range at the start of an object of at most 64 MiB;
any other is :class:`~wsitool.errors.RemoteUnavailableError` at once ("does not
support HTTP range requests", exit 17: retrying cannot help).
After the first answer each request carries ``If-Match`` with the pinned ETag
when it is a strong one (``412`` then means the object changed).

``storage_options`` for HTTP(S): ``headers`` (a dict sent with every request,
e.g. ``{"Authorization": "Bearer ..."}``; never printed), ``verify`` (False to
skip TLS verification, or a CA bundle path), plus the generic keys of
:class:`~wsitool.storage.remote.RemoteOptions`.
"""

from __future__ import annotations

import re
import types
from typing import Any

from ..errors import (
    InvalidOptionError,
    RemoteAccessError,
    RemoteChangedError,
    RemoteNotFoundError,
    RemoteUnavailableError,
    WsiError,
)
from .remote import Response, Transient, Transport

__all__ = ["HttpTransport"]

_CONTENT_RANGE = re.compile(r"bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)", re.I)
_RETRY_STATUS = frozenset((408, 425, 429, 500, 502, 503, 504))
#: Largest whole body accepted from a server that ignores Range.
_WHOLE_BODY_LIMIT = 64 * 1024 * 1024


def _urllib3() -> types.ModuleType:
    try:
        import urllib3
    except ImportError:  # pragma: no cover - depends on the installation
        raise WsiError("reading slides over HTTP(S) needs the optional extra: "
                       "pip install 'wsitool[remote]'") from None
    return urllib3


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
    """Ranged GETs of one HTTP(S) URL.

    Args:
        url: the URL (with its query, e.g. a presigned URL's signature).
        shown: the URL as messages show it.
        options: the transport's ``storage_options`` (``headers``, ``verify``).
        maxsize: connections kept in the pool.

    Raises:
        WsiError: urllib3 is not installed, or an unknown option.
    """

    protocol = "http"

    def __init__(self, url: str, shown: str, options: dict, maxsize: int = 16):
        self.url = url
        self.shown = shown
        self.headers = _headers(shown, options.pop("headers", None))
        self.verify = options.pop("verify", True)
        if options:
            raise InvalidOptionError(f"{shown}: unknown storage option(s) for HTTP(S): {', '.join(sorted(options))}")
        try:  # a bad port or host: a usage error now, not a "server failing" after the retries
            host = _urllib3().util.parse_url(url).host
        except ValueError:  # urllib3's LocationValueError; its text can quote the query (secrets)
            host = None
        if not host:
            raise InvalidOptionError(f"{shown}: not a valid URL (check the host and the port)")
        self.maxsize = maxsize
        self._pool: Any = None  # urllib3.PoolManager
        self._make_pool()

    def _make_pool(self) -> None:
        urllib3 = _urllib3()
        kw = {}
        if self.url.lower().startswith("https://"):
            if self.verify is False:
                kw["cert_reqs"] = "CERT_NONE"
                urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
            elif isinstance(self.verify, str):
                kw["ca_certs"] = self.verify
        self._pool = urllib3.PoolManager(num_pools=2, maxsize=self.maxsize, block=False, retries=False, **kw)

    def get(self, start: int, end: int, pin: Response | None, timeout: float) -> Response:
        urllib3 = _urllib3()
        headers = dict(self.headers)
        headers["Range"] = f"bytes={start}-{end - 1}"
        headers.setdefault("Accept-Encoding", "identity")
        if pin is not None and pin.etag and not pin.etag.startswith("W/"):
            headers["If-Match"] = pin.etag
        try:
            r = self._pool.request("GET", self.url, headers=headers, preload_content=False,
                                   redirect=True, timeout=urllib3.Timeout(connect=timeout, read=timeout))
        except urllib3.exceptions.HTTPError as exc:  # timeouts, refused / reset connections, TLS
            raise Transient(_cause(exc)) from None
        try:
            response = self._answer(r, start, end, pin)
        except BaseException as exc:
            # an error answer's connection is closed, not pooled, and the error leaves without
            # the frames that hold the response: a traceback kept alive (a future's error, a
            # caller's) would otherwise keep its socket open
            conn = getattr(r, "connection", None) or getattr(r, "_connection", None)
            r.close()
            if conn is not None:
                conn.close()
            r.release_conn()
            del r, conn
            raise exc.with_traceback(None) from None
        r.release_conn()
        return response

    def _answer(self, r: Any, start: int, end: int, pin: Response | None) -> Response:
        """The :class:`Response` of ``r`` (urllib3's answer to a GET of bytes ``start .. end - 1``).

        Raises:
            RemoteNotFoundError, RemoteAccessError, RemoteChangedError: what retrying cannot fix;
                so is RemoteUnavailableError for a server that ignores Range (a 200 answer).
            Transient: what it may (a retry status, a cut body, a range other than asked).
        """
        urllib3 = _urllib3()
        status = r.status
        refused = self._refusal(r, status, start, end, pin)
        if refused is not None:
            return refused
        want, total = self._extent(r, status, start, end)
        try:
            data = r.read(want if status == 206 else total, decode_content=False)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Transient(f"the body was cut short ({_cause(exc)})") from None
        if len(data) < want:
            raise Transient(f"the body was cut short ({len(data)} of {want} bytes)")
        if status == 200:
            data = data[:want]
        return Response(data, total, r.headers.get("ETag"), r.headers.get("Last-Modified"))

    def _refusal(self, r: Any, status: int, start: int, end: int, pin: Response | None) -> Response | None:
        """Raise the error of a status that carries no bytes (not found, denied, changed, a
        range refused, a retry status); the empty object's :class:`Response` for a 416 at
        open of a 0-byte object; None for every other status."""
        if status in (404, 410):
            r.drain_conn()
            raise RemoteNotFoundError(self.shown, f"not found (HTTP {status})")
        if status in (401, 403):
            r.drain_conn()
            expired = " or the URL expired" if "?" in self.url else ""
            raise RemoteAccessError(f"{self.shown}: access denied (HTTP {status}: missing or expired "
                                    f"credentials{expired})")
        if status == 412:
            r.drain_conn()
            raise RemoteChangedError(f"{self.shown}: the object changed on the server while open "
                                     "(HTTP 412, its ETag no longer matches); open it again")
        if status == 416:
            total = _total(r.headers.get("Content-Range", ""))
            r.drain_conn()
            if pin is None and total == 0:
                return Response(b"", 0, r.headers.get("ETag"), r.headers.get("Last-Modified"))
            if pin is not None:
                raise RemoteChangedError(f"{self.shown}: the object changed on the server while open "
                                         f"(HTTP 416 for bytes {start}-{end - 1} of {pin.size}); open it again")
            raise RemoteAccessError(f"{self.shown}: the server refused the byte range "
                                    f"{start}-{end - 1} (HTTP 416)")
        if status in _RETRY_STATUS:
            retry_after = r.headers.get("Retry-After")
            r.drain_conn()
            try:
                wait = float(retry_after) if retry_after else None
            except ValueError:
                wait = None
            raise Transient(f"HTTP {status}", wait)
        return None

    def _extent(self, r: Any, status: int, start: int, end: int) -> tuple[int, int]:
        """``(bytes wanted, the object's size)`` of a 206 or 200 answer; raises for one
        whose range or length does not serve the request, and for every other status."""
        if status == 206:
            m = _CONTENT_RANGE.match(r.headers.get("Content-Range", ""))
            if m is None or m.group(1) is None or m.group(3) == "*":
                r.drain_conn()
                raise Transient(f"HTTP 206 without a usable Content-Range "
                                f"({r.headers.get('Content-Range')!r})")
            got_start, got_end, total = int(m.group(1)), int(m.group(2)), int(m.group(3))
            if got_start != start:
                r.drain_conn()
                raise Transient(f"the server answered bytes {got_start}-{got_end} for {start}-{end - 1}")
            want = min(end, total) - start
        elif status == 200:
            length = r.headers.get("Content-Length")
            size = int(length) if length and length.isdigit() else None
            if start != 0 or size is None or size > _WHOLE_BODY_LIMIT:
                r.drain_conn()
                # not a refusal (exit 16) but a server wsitool cannot read from: 17, without retries
                raise RemoteUnavailableError(f"{self.shown}: the server does not support HTTP range requests "
                                             f"(HTTP 200, the whole object, for bytes {start}-{end - 1})")
            total = size
            want = min(end, total)
        else:
            r.drain_conn()
            raise RemoteAccessError(f"{self.shown}: unexpected answer HTTP {status}")
        return want, total

    def after_fork(self) -> None:
        self._pool = None  # the parent's sockets stay the parent's
        self._make_pool()

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.clear()


def _total(content_range: str) -> int | None:
    m = _CONTENT_RANGE.match(content_range or "")
    if m is None or m.group(3) == "*":
        return None
    return int(m.group(3))


def _cause(exc: BaseException) -> str:
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
