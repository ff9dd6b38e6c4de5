"""DICOMweb (QIDO-RS, WADO-RS, STOW-RS) over urllib3, and the frames of one instance as a byte source (floor 1).

:class:`DicomWebClient` talks to one DICOMweb service for one series: QIDO-RS
(the series' instances), WADO-RS metadata (``application/dicom+json``), frames
(``multipart/related``, many frame numbers in one request) and STOW-RS
(upload).  Every request has the timeouts, retries with back-off and
``Retry-After``, and error classes of the other remote sources
(:mod:`wsitool.storage.remote`): 404 -> :class:`~wsitool.errors.RemoteNotFoundError`,
401/403 -> :class:`~wsitool.errors.RemoteAccessError`, a timeout, a 5xx after
the retries or a multipart body cut short -> :class:`~wsitool.errors.RemoteUnavailableError`.
Credentials (``username``/``password`` for HTTP basic, ``token`` for bearer,
``headers``) are sent, never shown: messages name the series URL as
:func:`~wsitool.storage.urls.redact` gives it.

:class:`FrameSource` is one instance's frames as a :class:`~wsitool.storage.ByteSource`
whose address space holds frame ``k`` (1-based) at ``k * FRAME_STRIDE``
(:attr:`~wsitool.storage.ByteSource.framed` is True).  The format gives each
tile the address of its frame; :meth:`FrameSource.advise` (called by the region
layer with the addresses of a region's tiles) fetches every frame of the region
that is not cached in one multipart request; :meth:`FrameSource.read_frame`
then serves each tile from what was fetched (a frame nobody announced is
fetched alone).  Fetched frames go to a least-recently-used cache with a byte
budget shared by the client's instances (``frame_cache_mb``, default 64).
"""

from __future__ import annotations

import base64
import collections
import concurrent.futures as cf
import contextlib
import functools
import json
import random
import re
import threading
import time
import types
import urllib.parse
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import InvalidOptionError, RemoteAccessError, RemoteNotFoundError, RemoteUnavailableError, WsiError
from .body import check_length, read_body
from .http import BODY_PIECE, _cause, _verify  # (the same short causes, pieces and verify as HTTP range reads)
from .options import option_text
from .remote import RemoteOptions, Transient
from .source import ByteSource
from .urls import redact

__all__ = ["FRAME_STRIDE", "SeriesUrl", "parse_series_url", "DicomWebClient", "FrameSource",
           "NotAcceptable", "MEDIA_TYPES", "JSON_LIMIT", "frames_limit"]

#: Frames a :class:`FrameSource` keeps from its recent requests beyond the cache (each region's
#: frames stay readable until its reads took them, even with a cache budget of 0).
HELD = 512

#: Distance between two frames' addresses in a :class:`FrameSource` (no frame is 4 GiB).
FRAME_STRIDE = 1 << 32

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

_SERIES = re.compile(r"^(?P<base>.+?)/studies/(?P<study>[0-9.]+)/series/(?P<series>[0-9.]+)/?$")
_RETRY_STATUS = frozenset((408, 425, 429, 500, 502, 503, 504))
_CLIENT_KEYS = ("headers", "verify", "username", "password", "token", "frame_cache_mb", "metadata_limit_mb")

#: Most bytes read of an answer whose length nothing asked for fixes (QIDO-RS and WADO-RS
#: JSON, a bulk data value, a STOW-RS answer), unless ``metadata_limit_mb`` says otherwise: a
#: server sending more is refused (:func:`~wsitool.storage.body.read_body`).
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


class SeriesUrl:
    """A DICOMweb series URL taken apart: ``base`` (the service root), ``study``, ``series``."""

    def __init__(self, base: str, study: str, series: str, given: str):
        self.base = base
        self.study = study
        self.series = series
        self.given = given

    @property
    def shown(self) -> str:
        """The URL as messages show it (no user, password or query)."""
        return redact(self.given.removeprefix("dicomweb+"))


def parse_series_url(location: object) -> SeriesUrl | None:
    """The :class:`SeriesUrl` of ``location`` when it is a DICOMweb series URL, else None.

    A series URL is ``http(s)://host/.../studies/{StudyInstanceUID}/series/{SeriesInstanceUID}``
    (UIDs are digits and dots), optionally with the scheme prefix ``dicomweb+``;
    a ``dicomweb+`` URL that does not end so raises.

    Raises:
        WsiError: a ``dicomweb+`` URL that names no series.
    """
    if not isinstance(location, str):
        return None
    low = location[:16].lower()
    prefixed = low.startswith("dicomweb+")
    url = location[len("dicomweb+"):] if prefixed else location
    if not url.lower().startswith(("http://", "https://")):
        if prefixed:
            raise WsiError(f"{redact(url)}: a dicomweb+ URL must be dicomweb+http(s)://")
        return None
    parts = urllib.parse.urlsplit(url)
    m = _SERIES.match(parts.path)
    if m is None:
        if prefixed:
            raise WsiError(f"{redact(url)}: not a DICOMweb series URL (.../studies/{{study}}/series/{{series}})")
        return None
    base = urllib.parse.urlunsplit((parts.scheme, parts.netloc, m.group("base"), "", ""))
    return SeriesUrl(base, m.group("study"), m.group("series"), location)


class NotAcceptable(Exception):
    """The server will not send frames in the transfer syntax asked for (HTTP 400/406/415/500/501)."""


def _urllib3() -> types.ModuleType:
    try:
        import urllib3
    except ImportError:  # pragma: no cover - depends on the installation
        raise WsiError("reading DICOMweb series needs the optional extra: "
                       "pip install 'wsitool[remote]'") from None
    return urllib3


class _FrameCache:
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


class DicomWebClient:
    """Requests to one DICOMweb service about one series.

    Args:
        url: the parsed series URL.
        storage_options: the generic keys of :class:`~wsitool.storage.remote.RemoteOptions`
            (``timeout``, ``operation_timeout``, ``retries``, ``concurrency``, ``backoff``)
            and ``headers`` (dict), ``verify`` (False or a CA bundle path), ``username`` and
            ``password`` (HTTP basic; also taken from the URL's ``user:password@``),
            ``token`` (bearer), ``frame_cache_mb`` (frame cache budget, default 64),
            ``metadata_limit_mb`` (the most read of a JSON or bulk data answer, default
            :data:`JSON_LIMIT`: 64).

    Attributes:
        requests, bytes: requests made and body bytes received so far.
        json_limit: the most bytes read of a JSON or bulk data answer (``metadata_limit_mb``).
        frame_requests: how many of those requests were frame requests.

    Raises:
        WsiError: an unknown option, a bad value, or urllib3 not installed.
    """

    def __init__(self, url: SeriesUrl, storage_options: dict | None = None):
        options = dict(storage_options or {})
        self.url = url
        self.shown = url.shown
        self.options = RemoteOptions.take(options)
        unknown = sorted(set(options) - set(_CLIENT_KEYS))
        if unknown:
            raise InvalidOptionError(f"{self.shown}: unknown storage option(s) for DICOMweb: {', '.join(unknown)}")
        if not isinstance(options.get("headers") or {}, dict):
            raise InvalidOptionError(f"{self.shown}: storage option headers: expected headers.NAME=VALUE")
        # text options: a number or boolean as typed (password=1234), never None or a list
        headers = {str(k): option_text(f"headers.{k}", v) for k, v in dict(options.get("headers") or {}).items()}
        parts = urllib.parse.urlsplit(url.base)
        user, password = (None if options.get(k) is None else option_text(k, options[k])
                          for k in ("username", "password"))
        if parts.username is not None and user is None:
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
        self.base = urllib.parse.urlunsplit(
            (parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))
        if options.get("token"):
            headers["Authorization"] = f"Bearer {option_text('token', options['token'])}"
        elif user is not None:
            pair = f"{user}:{password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        self._headers = headers
        raw = options.get("frame_cache_mb", 64)
        try:
            if isinstance(raw, bool):
                raise TypeError
            cache_mb = float(raw)
        except (TypeError, ValueError, OverflowError):
            raise InvalidOptionError(f"storage option frame_cache_mb: expected a number, got "
                                     f"{raw!r:.40}") from None
        if not 0 <= cache_mb < 2**40:  # (NaN and infinity included: int() of them raised)
            raise InvalidOptionError(f"storage option frame_cache_mb: expected 0 or more MiB, got {raw!r:.40}")
        self.cache = _FrameCache(int(cache_mb * (1 << 20)))
        self.json_limit = _megabytes(options.get("metadata_limit_mb"), "metadata_limit_mb", JSON_LIMIT)
        urllib3 = _urllib3()
        kw = {}
        verify = _verify(self.shown, options.get("verify", True))  # (verify=false was taken as a CA file)
        if self.base.lower().startswith("https://"):
            if verify is False:
                kw["cert_reqs"] = "CERT_NONE"
                urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
            elif isinstance(verify, str):
                kw["ca_certs"] = verify
        self._pool = urllib3.PoolManager(num_pools=2, maxsize=self.options.concurrency + 4,
                                         block=False, retries=False, **kw)
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
        (:func:`~wsitool.storage.body.read_body`), never read to its end.

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
                    min(8.0, opts.backoff * (2 ** (attempt - 1))) * (0.5 + random.random() / 2)
                time.sleep(max(0.0, min(wait, deadline - now)))

    def _once(self, method: str, url: str, accept: str, body: bytes | None, content_type: str | None,
              not_acceptable: bool, limit: int, deadline: float) -> tuple[bytes, dict]:
        urllib3 = _urllib3()
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
            raise Transient(_cause(exc)) from None
        try:
            status = r.status
            if status in (404, 410):
                raise RemoteNotFoundError(self.shown, f"not found (HTTP {status} for {_what(url)})")
            if status in (401, 403):
                raise RemoteAccessError(f"{self.shown}: access denied (HTTP {status}: missing or "
                                        "wrong credentials)")
            if not_acceptable and status in (400, 406, 415, 500, 501):
                raise NotAcceptable(f"HTTP {status}")
            if status in _RETRY_STATUS:
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
                raise Transient(f"the body was cut short ({_cause(exc)})") from None
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
        found = _param(_param(ctype, "type") or "", "transfer-syntax") or _param(ctype, "transfer-syntax")
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
                    got = _param(part_type, "transfer-syntax")
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
                time.sleep(min(8.0, self.options.backoff * (2 ** (attempt - 1))))
                continue
            return [body for _, body in parts]

    def store(self, files: Iterable[bytes]) -> dict:
        """STOW-RS of DICOM files (their bytes) to the study root in one request; the answer's JSON."""
        boundary = uuid.uuid4().hex
        chunks = []
        for data in files:
            chunks += [f"--{boundary}\r\nContent-Type: application/dicom\r\n\r\n".encode(), data, b"\r\n"]
        chunks.append(f"--{boundary}--\r\n".encode())
        body, _ = self.request("POST", f"{self.base}/studies", "application/dicom+json",
                               body=b"".join(chunks), retry=False,
                               content_type=f'multipart/related; type="application/dicom"; boundary={boundary}')
        try:
            return json.loads(body) if body.strip() else {}
        except ValueError:
            return {}

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


class FrameSource(ByteSource):
    """The frames of one instance in one transfer syntax, frame ``k`` at address ``k * FRAME_STRIDE``.

    ``read(address, count)`` gives the first ``count`` bytes of that frame (the
    whole frame when ``count`` is larger); :meth:`read_frame` the whole frame.
    The client is shared by the series' instances and closed by its owner.
    """

    remote = True
    framed = True
    protocol = "dicomweb"

    def __init__(self, client: DicomWebClient, sop: str, frames: int, syntax: str, path: str,
                 frame_bytes: int | None = None):
        self.client = client
        self.frame_bytes = frame_bytes  # (one frame's pixels, uncompressed: bounds each answer)
        self.sop = sop
        self.frames = frames
        self.syntax = syntax
        self.path = path
        self.size = (frames + 1) * FRAME_STRIDE
        self._pending: dict[int, cf.Future] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._active = 0
        self._idle = threading.Condition(self._lock)

    def _number(self, offset: int) -> int:
        k, rest = divmod(int(offset), FRAME_STRIDE)
        if rest or not 1 <= k <= self.frames:
            raise OSError(f"{self.path}: address {offset} is no frame of the instance")
        return k

    def read_frame(self, offset: int) -> bytes:
        """The encoded bytes of the frame at address ``offset``: from the cache, from the
        request :meth:`advise` started, or else from a request of its own.

        Raises:
            RemoteUnavailableError, RemoteAccessError, RemoteNotFoundError: as the request.
        """
        k = self._number(offset)
        key = (self.sop, k)
        data = self.client.cache.get(key)
        if data is not None:
            return data
        with self._lock:
            fut = self._pending.get(k)
        if fut is not None:
            try:
                got = fut.result(timeout=self.client.options.operation_timeout)
            except cf.TimeoutError:
                raise RemoteUnavailableError(f"{self.path}: frames not received within the operation "
                                             f"timeout ({self.client.options.operation_timeout:g} s)") from None
            data = got.get(k)
            if data is not None:
                return data
        return self._fetch([k])[k]

    def _fetch(self, numbers: list[int]) -> dict[int, bytes]:
        frames = self.client.frames(self.sop, numbers, self.syntax, frame_bytes=self.frame_bytes)
        out = dict(zip(numbers, frames, strict=True))
        for k, data in out.items():
            self.client.cache.put((self.sop, k), data)
        return out

    def read(self, offset: int, count: int) -> bytes:
        data = self.read_frame(offset)
        return data if count >= len(data) else data[:count]

    def readinto(self, offset: int, buffer: Any) -> int:
        data = self.read_frame(offset)
        view = memoryview(buffer).cast("B")
        n = min(len(view), len(data))
        view[:n] = data[:n]
        return n

    def advise(self, ranges: Iterable[tuple[int, int]], ahead: bool = False) -> None:
        """Fetch, in one request, the frames at the starts of ``ranges`` that are neither
        cached nor already being fetched (advisory: errors surface on the reads of those frames).
        ``ahead`` (read-ahead for a later batch): skipped where it wants more than a quarter
        of the :data:`HELD` frames (they would push out the ones being read now)."""
        if self._closed:
            return
        want = []
        with self._lock:
            # frames fetched for earlier regions stay readable (whatever the cache's budget)
            # until more than HELD frames are held: then the oldest fetched ones go
            if len(self._pending) > HELD:
                done = [k for k, f in self._pending.items() if f.done()]
                for k in done[:len(self._pending) - HELD]:
                    del self._pending[k]
            for offset, _count in ranges:
                k, rest = divmod(int(offset), FRAME_STRIDE)
                if rest or not 1 <= k <= self.frames or k in self._pending:
                    continue
                if self.client.cache.get((self.sop, k)) is None:
                    want.append(k)
            want = sorted(set(want))
            if not want or (ahead and 4 * len(want) > HELD):
                return
            fut: cf.Future = cf.Future()
            for k in want:
                self._pending[k] = fut
        # fetched here, in the calling thread: the frames of one request arrive together, so
        # decoding cannot start before the whole answer anyway, and no thread hand-off is paid;
        # a failure is kept for the reads (advice never raises)
        try:
            fut.set_result(self._fetch(want))
        except BaseException as exc:  # (re-raised by every read of these frames)
            fut.set_exception(exc.with_traceback(None))

    @contextlib.contextmanager
    def reading(self) -> Iterator[FrameSource]:
        with self._lock:
            if self._closed:
                raise WsiError(f"{self.path}: slide is closed")
            self._active += 1
        try:
            yield self
        finally:
            with self._lock:
                self._active -= 1
                self._idle.notify_all()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            while self._active:
                self._idle.wait()

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> dict:
        """The client's request counts (shared by the series' instances)."""
        return self.client.stats()


def parse_multipart(data: bytes, content_type: str, shown: str) -> list[tuple[dict, bytes]]:
    """The parts of a ``multipart/related`` body: ``(lower-case headers, body)`` each.

    Raises:
        Transient: a body cut short (no closing delimiter).
        RemoteAccessError: not a multipart answer (no boundary).
    """
    boundary = _param(content_type, "boundary")
    if not boundary:
        raise RemoteAccessError(f"{shown}: the DICOMweb server answered {content_type or 'no type'} "
                                "instead of multipart/related")
    delim = b"--" + boundary.encode("latin-1")
    pos = data.find(delim)
    if pos < 0:
        raise Transient("the multipart body was cut short (no boundary)")
    parts: list[tuple[dict, bytes]] = []
    pos += len(delim)
    while True:
        if data[pos:pos + 2] == b"--":
            return parts
        head_end = data.find(b"\r\n\r\n", pos)
        if head_end < 0:
            raise Transient("the multipart body was cut short (part headers)")
        headers = {}
        for line in data[pos:head_end].split(b"\r\n"):
            name, sep, value = line.decode("latin-1").partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        nxt = data.find(b"\r\n" + delim, head_end + 4)
        if nxt < 0:
            raise Transient("the multipart body was cut short")
        parts.append((headers, data[head_end + 4:nxt]))
        pos = nxt + 2 + len(delim)


def _param(header: str, name: str) -> str | None:
    """Parameter ``name`` of a header value (``type="..."; boundary=...``), quotes removed."""
    for piece in re.split(r';(?=(?:[^"]*"[^"]*")*[^"]*$)', header or ""):
        key, sep, value = piece.strip().partition("=")
        if sep and key.strip().lower() == name:
            return value.strip().strip('"')
    return None


def _megabytes(raw: Any, name: str, default: int) -> int:
    """The storage option ``name`` (MiB, a positive number) in bytes; ``default`` where not given.

    Raises:
        InvalidOptionError: not a positive number.
    """
    if raw is None:
        return default
    try:
        if isinstance(raw, bool):
            raise TypeError
        value = float(raw)
    except (TypeError, ValueError):
        raise InvalidOptionError(f"storage option {name}: expected a number, got {raw!r}") from None
    if not value > 0 or value == float("inf"):
        raise InvalidOptionError(f"storage option {name}: must be a positive number, got {raw!r}")
    return int(value * (1 << 20))


def _what(url: str) -> str:
    """The DICOMweb resource a request URL names, for messages (``metadata``, ``frames``, ...)."""
    path = urllib.parse.urlsplit(url).path.rstrip("/")
    tail = path.rsplit("/", 2)
    return tail[-2] if tail[-1][:1].isdigit() and len(tail) > 1 else tail[-1]


def _bad(shown: str, reason: str) -> RemoteAccessError:
    return RemoteAccessError(f"{shown}: {reason}")


