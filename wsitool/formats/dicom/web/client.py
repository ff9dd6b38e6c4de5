"""DICOMweb (QIDO-RS, WADO-RS, STOW-RS) over urllib3: one client per series (floor 3).

:class:`DicomWebClient` talks to one DICOMweb service for one series: QIDO-RS
(the series' instances), WADO-RS metadata (``application/dicom+json``), frames
(``multipart/related``, many frame numbers in one request); STOW-RS (upload) is
:mod:`.store`'s, with the same options and :func:`make_pool`.  Every request has the
timeouts, retries with back-off and ``Retry-After``, and error classes of the other remote sources
(:mod:`wsitool.storage.remote`): 404 -> :class:`~wsitool.errors.RemoteNotFoundError`,
401/403 -> :class:`~wsitool.errors.RemoteAccessError`, a timeout, a 5xx after
the retries or a multipart body cut short -> :class:`~wsitool.errors.RemoteUnavailableError`.
Credentials (``username``/``password`` for HTTP basic, ``token`` for bearer,
``headers``; :mod:`.options`) are sent, never shown: messages name the series URL as
:func:`~wsitool.storage.urls.redact` gives it.  Fetched frames go to a least-recently-used
cache (:class:`FrameCache`) with a byte budget shared by the client's instances
(``frame_cache_mb``, default 64).
"""

from __future__ import annotations

import collections
import functools
import json
import re
import threading
import time
import types
import urllib.parse
from collections.abc import Mapping
from typing import Any

from ....errors import RemoteAccessError, RemoteNotFoundError, RemoteUnavailableError, WsiError
from ....ground.extras import optional_import
from ....storage.remote.body import check_length, read_body
from ....storage.remote.options import StorageOptions
from ....storage.remote.status import RETRY_STATUS, Transient, retry_pause
from ....storage.remote.transports.http import BODY_PIECE, failure_cause
from ....storage.urls import SeriesUrl
from .multipart import header_param, parse_multipart
from .options import ClientOptions

__all__ = ["DicomWebClient", "FrameCache", "NotAcceptable", "MEDIA_TYPES", "JSON_LIMIT", "frames_limit", "make_pool",
           "urllib3_module"]

#: Frame transfer syntax -> the media type WADO-RS names it with (PS3.18 8.7.3.5.2).
MEDIA_TYPES = {
    "1.2.840.10008.1.2.4.50": "image/jpeg", "1.2.840.10008.1.2.4.51": "image/jpeg",
    "1.2.840.10008.1.2.4.57": "image/jpeg", "1.2.840.10008.1.2.4.70": "image/jpeg",
    "1.2.840.10008.1.2.4.80": "image/jls", "1.2.840.10008.1.2.4.81": "image/jls",
    "1.2.840.10008.1.2.4.90": "image/jp2", "1.2.840.10008.1.2.4.91": "image/jp2",
    "1.2.840.10008.1.2.4.201": "image/jphc", "1.2.840.10008.1.2.4.202": "image/jphc",
    "1.2.840.10008.1.2.4.203": "image/jphc",
    "1.2.840.10008.1.2.1": "application/octet-stream",
}


#: Most bytes read of an answer whose length nothing asked for fixes (QIDO-RS and WADO-RS
#: JSON, a bulk data value, a STOW-RS answer), unless ``metadata_limit_mb`` says otherwise: a
#: server sending more is refused (:func:`~wsitool.storage.remote.body.read_body`).
JSON_LIMIT = 64 << 20
#: Most bytes read of a frames answer, per frame asked for: twice the frame's pixels
#: uncompressed (no frame in a transfer syntax wsitool reads is larger) and this much more for
#: the part's headers; a request whose frames' size is not known reads at most
#: :data:`FRAME_UNKNOWN_LIMIT` per frame.
FRAME_SLACK = 16 << 10
FRAME_UNKNOWN_LIMIT = 64 << 20


def frames_limit(count: int, frame_bytes: int | None) -> int:
    """The most bytes a multipart answer of ``count`` frames of ``frame_bytes`` pixel bytes
    each (None: not known) may hold (:data:`FRAME_SLACK`, :data:`FRAME_UNKNOWN_LIMIT`)."""
    per = FRAME_UNKNOWN_LIMIT if not frame_bytes else 2 * frame_bytes + FRAME_SLACK
    return count * per + FRAME_SLACK


class NotAcceptable(Exception):
    """The server will not send frames in the transfer syntax asked for (HTTP 400/406/415/500/501)."""


def urllib3_module() -> types.ModuleType:
    """urllib3, imported when first needed.

    Raises:
        WsiError: the remote extra (urllib3) is not installed.
    """
    return optional_import("urllib3", "remote", "reading DICOMweb series needs the optional extra: ", WsiError)


class FrameCache:
    """Least-recently-used frames by ``(SOP Instance UID, frame number)`` within a byte budget."""

    def __init__(self, budget: int):
        self.budget = budget
        self.used = 0
        self.items: collections.OrderedDict[tuple[str, int], bytes] = collections.OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: tuple[str, int]) -> bytes | None:
        with self.lock:
            data = self.items.get(key)
            if data is not None:
                self.items.move_to_end(key)
            return data

    def put(self, key: tuple[str, int], data: bytes) -> None:
        with self.lock:
            if key in self.items or len(data) > self.budget:
                return
            self.items[key] = data
            self.used += len(data)
            while self.used > self.budget:
                _, old = self.items.popitem(last=False)
                self.used -= len(old)


def make_pool(settings: ClientOptions, size: int) -> Any:
    """A urllib3 pool manager for the service of ``settings`` (its TLS verification: ``verify``),
    ``size`` connections per host, no retries of its own (the callers retry).

    Raises:
        WsiError: urllib3 not installed.
    """
    urllib3 = urllib3_module()
    kw = {}
    if settings.base.lower().startswith("https://"):
        if settings.verify is False:
            kw["cert_reqs"] = "CERT_NONE"
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        elif isinstance(settings.verify, str):
            kw["ca_certs"] = settings.verify
    return urllib3.PoolManager(num_pools=2, maxsize=size, block=False, retries=False, **kw)


class DicomWebClient:
    """Requests to one DICOMweb service about one series.

    Args:
        url: the parsed series URL.
        options: the generic keys of :class:`~wsitool.storage.remote.RemoteOptions`
            and the client's own (:mod:`.options`), as a mapping or already parsed
            (:class:`~wsitool.storage.remote.StorageOptions`).

    Attributes:
        requests, bytes: requests made and body bytes received so far.
        json_limit: the most bytes read of a JSON or bulk data answer (``metadata_limit_mb``).
        frame_requests: how many of those requests were frame requests.

    Raises:
        WsiError: an unknown option, a bad value, or urllib3 not installed.
    """

    def __init__(self, url: SeriesUrl, options: Mapping[str, Any] | StorageOptions | None = None):
        self.url = url
        self.shown = url.shown
        settings = ClientOptions.parse(url, options, JSON_LIMIT)
        self.options = settings.remote
        self.base = settings.base
        self._headers = settings.headers
        self.cache = FrameCache(settings.frame_cache_bytes)
        self.json_limit = settings.json_limit
        self._pool = make_pool(settings, self.options.concurrency + 4)
        self._lock = threading.Lock()
        self.requests = 0
        self.bytes = 0
        self.frame_requests = 0
        self.closed = False

    # ------------------------------------------------------------------ requests

    def _series_path(self) -> str:
        return f"{self.base}/studies/{self.url.study}/series/{self.url.series}"

    def request(self, method: str, url: str, accept: str, *, body: bytes | None = None,
                content_type: str | None = None, retry: bool = True,
                not_acceptable: bool = False, limit: int | None = None) -> tuple[bytes, dict]:
        """One request with retries; returns ``(body, response headers)`` of a 2xx answer.

        ``limit``: the most bytes of the answer's body read (default ``json_limit``); a
        server declaring or sending more is refused at once
        (:func:`~wsitool.storage.remote.body.read_body`), never read to its end.

        Raises:
            RemoteNotFoundError: 404/410.  RemoteAccessError: 401/403 or another 4xx.
            RemoteUnavailableError: transient failures (timeouts, resets, 408/429/5xx,
                bodies cut short) after ``retries`` attempts or past ``operation_timeout``;
                an answer longer than ``limit`` (not retried).
            NotAcceptable: with ``not_acceptable``, a 400/406/415/500/501 answer (not retried).
        """
        if self.closed:
            raise WsiError(f"{self.shown}: slide is closed")
        opts = self.options
        deadline = time.monotonic() + opts.operation_timeout
        attempt = 0
        while True:
            try:
                return self._once(method, url, accept, body, content_type, not_acceptable,
                                  self.json_limit if limit is None else limit, deadline)
            except Transient as exc:
                attempt += 1
                now = time.monotonic()
                if not retry or attempt > opts.retries or now >= deadline:
                    raise RemoteUnavailableError(
                        f"{self.shown}: the DICOMweb server kept failing: {exc.reason} "
                        f"({attempt} attempt(s))") from None
                wait = exc.retry_after if exc.retry_after is not None else \
                    retry_pause(attempt, opts.backoff, spread=0.5)
                time.sleep(max(0.0, min(wait, deadline - now)))

    def _once(self, method: str, url: str, accept: str, body: bytes | None, content_type: str | None,
              not_acceptable: bool, limit: int, deadline: float) -> tuple[bytes, dict]:
        urllib3 = urllib3_module()
        headers = dict(self._headers)
        headers["Accept"] = accept
        headers.setdefault("Accept-Encoding", "identity")
        if content_type:
            headers["Content-Type"] = content_type
        timeout = self.options.timeout
        with self._lock:
            self.requests += 1
        try:
            r = self._pool.request(method, url, headers=headers, body=body, preload_content=False,
                                   redirect=True, timeout=urllib3.Timeout(connect=timeout, read=timeout))
        except urllib3.exceptions.HTTPError as exc:
            raise Transient(failure_cause(exc)) from None
        try:
            status = r.status
            if status in (404, 410):
                raise RemoteNotFoundError(self.shown, f"not found (HTTP {status} for {_what(url)})")
            if status in (401, 403):
                raise RemoteAccessError(f"{self.shown}: access denied (HTTP {status}: missing or "
                                        "wrong credentials)")
            if not_acceptable and status in (400, 406, 415, 500, 501):
                raise NotAcceptable(f"HTTP {status}")
            if status in RETRY_STATUS:
                ra = r.headers.get("Retry-After")
                try:
                    wait = float(ra) if ra else None
                except ValueError:
                    wait = None
                raise Transient(f"HTTP {status}", wait)
            if not 200 <= status < 300:
                raise RemoteAccessError(f"{self.shown}: unexpected answer HTTP {status} for {_what(url)}")
            what = _what(url)
            if limit == self.json_limit:
                what += " (storage option metadata_limit_mb, in MiB, raises the limit)"
            if (r.headers.get("Content-Encoding") or "identity").strip().lower() == "identity":
                check_length(r.headers.get("Content-Length"), limit, self.shown, what)
            pieces = iter(functools.partial(r.read1, BODY_PIECE, decode_content=True), b"")
            try:
                data = bytes(read_body(pieces, limit, self.shown, what, deadline=deadline))
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise Transient(f"the body was cut short ({failure_cause(exc)})") from None
            with self._lock:
                self.bytes += len(data)
            return data, dict(r.headers)
        except BaseException:
            r.close()
            raise
        finally:
            r.release_conn()

    def _json(self, url: str) -> list:
        data, _ = self.request("GET", url, "application/dicom+json")
        if not data.strip():  # (204: no match)
            return []
        try:
            out = json.loads(data)
        except ValueError:
            raise _bad(self.shown, f"{_what(url)} answered with something else than JSON") from None
        if not isinstance(out, list):
            raise _bad(self.shown, f"{_what(url)} answered with JSON that is not a list")
        return out

    # ------------------------------------------------------------------ DICOMweb

    def instances(self) -> list[dict]:
        """QIDO-RS: the instances of the series (their DICOM JSON attributes); tries a
        filter on VL Whole Slide Microscopy (and ``AvailableTransferSyntaxUID``) first, and
        the unfiltered query where the server rejects the filter.

        Raises:
            RemoteNotFoundError: no such series (404 or no instance); the other errors as
                :meth:`request` raises them.
        """
        root = f"{self._series_path()}/instances"
        try:
            found = self._json(root + "?SOPClassUID=1.2.840.10008.5.1.4.1.1.77.1.6&includefield=00083002")
        except RemoteAccessError:  # a server refusing the filter (400): ask plainly
            found = None
        except RemoteUnavailableError:
            found = None
        if not found:
            found = self._json(root)
        if not found:
            raise RemoteNotFoundError(self.shown, "not found (the series has no instance)")
        return found

    def metadata(self) -> list[dict]:
        """WADO-RS series metadata: one DICOM JSON object per instance (bulk data by URI)."""
        return self._json(f"{self._series_path()}/metadata")

    def bulk(self, uri: str) -> bytes:
        """The value behind a ``BulkDataURI`` (a single-part multipart answer is unwrapped)."""
        data, headers = self.request("GET", uri, 'multipart/related; type="application/octet-stream"')
        ctype = headers.get("Content-Type") or headers.get("content-type") or ""
        if ctype.lower().startswith("multipart/"):
            parts = parse_multipart(data, ctype, self.shown)
            return parts[0][1] if parts else b""
        return data

    def stored_syntax(self, sop: str, frame_bytes: int | None = None) -> str | None:
        """The transfer syntax the server names for frame 1 of ``sop`` when asked for any
        (``transfer-syntax=*``); None where it refuses or names none.  Only the part's
        headers are used: some servers answer such requests with short bodies.
        ``frame_bytes``: a frame's pixel bytes uncompressed (bounds the answer: :func:`frames_limit`).

        Raises:
            RemoteNotFoundError, RemoteAccessError: as :meth:`request`.
        """
        url = f"{self._series_path()}/instances/{sop}/frames/1"
        try:
            data, headers = self.request("GET", url, 'multipart/related; type="application/octet-stream"; '
                                         "transfer-syntax=*", retry=False, not_acceptable=True,
                                         limit=frames_limit(1, frame_bytes))
        except (NotAcceptable, RemoteUnavailableError):
            return None
        except RemoteAccessError as exc:
            if "access denied" in str(exc):
                raise
            return None
        ctype = headers.get("Content-Type") or headers.get("content-type") or ""
        found = (header_param(header_param(ctype, "type") or "", "transfer-syntax")
                 or header_param(ctype, "transfer-syntax"))
        if not found:
            boundary_at = data.find(b"\r\n\r\n")
            head = data[:boundary_at].decode("latin-1", "replace").lower() if boundary_at > 0 else ""
            m = re.search(r"transfer-syntax=([0-9.]+)", head)
            found = m.group(1) if m else None
        return found if found in MEDIA_TYPES else None

    def frames(self, sop: str, numbers: list[int], syntax: str, *, negotiate: bool = False,
               frame_bytes: int | None = None) -> list[bytes]:
        """WADO-RS frames ``numbers`` (1-based) of instance ``sop`` in ``syntax``, in one request.

        ``frame_bytes``: one frame's pixel bytes uncompressed; the answer is read up to
        :func:`frames_limit` of it (a server sending more is refused, not read on).

        Raises:
            NotAcceptable: with ``negotiate``, the server will not send ``syntax``.
            RemoteUnavailableError: fewer parts than frames (a short body), retried first;
                the other errors as :meth:`request` raises them.
        """
        media = MEDIA_TYPES.get(syntax, "application/octet-stream")
        accept = f'multipart/related; type="{media}"; transfer-syntax={syntax}'
        url = f"{self._series_path()}/instances/{sop}/frames/{','.join(str(n) for n in numbers)}"
        attempt = 0
        while True:
            data, headers = self.request("GET", url, accept, not_acceptable=negotiate,
                                         retry=not negotiate, limit=frames_limit(len(numbers), frame_bytes))
            with self._lock:
                self.frame_requests += 1
            ctype = headers.get("Content-Type") or headers.get("content-type") or ""
            try:
                parts = parse_multipart(data, ctype, self.shown)
                if len(parts) != len(numbers):
                    raise Transient(f"{len(parts)} frame(s) in the answer for {len(numbers)} asked")
                for part_type in {head.get("content-type", "") for head, _ in parts}:  # (parts share one)
                    got = header_param(part_type, "transfer-syntax")
                    if got and got != syntax:
                        raise NotAcceptable(f"the server sent transfer syntax {got} for {syntax}")
            except Transient as exc:
                attempt += 1
                if negotiate:
                    raise NotAcceptable(exc.reason) from None
                if attempt > self.options.retries:
                    raise RemoteUnavailableError(
                        f"{self.shown}: the DICOMweb server kept failing: {exc.reason} "
                        f"({attempt} attempt(s))") from None
                time.sleep(retry_pause(attempt, self.options.backoff, low=1.0, spread=0.0))
                continue
            return [body for _, body in parts]

    def stats(self) -> dict:
        """``{"requests", "frame_requests", "bytes"}`` so far."""
        with self._lock:
            return {"requests": self.requests, "frame_requests": self.frame_requests, "bytes": self.bytes}

    def close(self) -> None:
        """Drop the connections; later requests raise.  Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._pool.clear()


def _what(url: str) -> str:
    """The DICOMweb resource a request URL names, for messages (``metadata``, ``frames``, ...)."""
    path = urllib.parse.urlsplit(url).path.rstrip("/")
    tail = path.rsplit("/", 2)
    return tail[-2] if tail[-1][:1].isdigit() and len(tail) > 1 else tail[-1]


def _bad(shown: str, reason: str) -> RemoteAccessError:
    return RemoteAccessError(f"{shown}: {reason}")
