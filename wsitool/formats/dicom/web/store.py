"""STOW-RS: DICOM Part-10 files sent to a DICOMweb service, streamed from disk (floor 3).

:func:`stow` sends files (or the DICOM files of folders) to ``<service>/studies`` (or
``<service>/studies/{StudyInstanceUID}``) as ``multipart/related; type="application/dicom"``
(PS3.18 10.5), in batches of at most ``batch_mb`` MiB and ``batch_files`` files, one request a
batch.  Each request's body is read from the files as it is sent, a piece of
:data:`PIECE` bytes at a time, with a ``Content-Length`` computed beforehand: memory does not
grow with the files' sizes.  The options are the DICOMweb reader's (:mod:`.options`: ``token``,
``username``/``password`` or the URL's ``user:password@``, ``headers``, ``verify``,
``timeout``, ``operation_timeout``, ``retries``, ``backoff``, ``metadata_limit_mb``);
credentials are sent, never shown: every message names the URL as
:func:`~wsitool.storage.urls.redact` gives it.

The server's answer (DICOM JSON: ReferencedSOPSequence (0008,1199), FailedSOPSequence
(0008,1198) with FailureReason (0008,1197)) is read within ``metadata_limit_mb`` and
judged per instance (:mod:`.store_answer`): an instance is stored only where the answer
lists it as stored, so a server answering 200 while listing fewer instances than it was
sent is caught.  The result is a :class:`StowReport`; :meth:`StowReport.raise_for_failures`
turns instances not stored into :class:`~wsitool.errors.RemoteStoreError` (exit 19).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ....errors import (
    InvalidOptionError,
    RemoteAccessError,
    RemoteNotFoundError,
    RemoteStoreError,
    RemoteUnavailableError,
    UnsupportedFormatError,
)
from ....storage.remote.body import check_length, read_body
from ....storage.remote.options import StorageOptions
from ....storage.remote.status import RETRY_STATUS, Transient, retry_pause
from ....storage.remote.transports.http import BODY_PIECE, failure_cause
from ....storage.urls import SeriesUrl, redact
from .client import JSON_LIMIT, make_pool, urllib3_module
from .options import ClientOptions
from .store_answer import StowInstance, judge_answer, parse_answer

__all__ = ["BATCH_MB", "BATCH_FILES", "PIECE", "StowInstance", "StowReport", "stow", "upload", "stow_target",
           "dicom_files", "batches"]

#: Default most bytes of files in one request (MiB): a server holds a request's body whole
#: before it answers (Orthanc does), so a batch bounds what it holds.
BATCH_MB = 128
#: Default most files in one request.
BATCH_FILES = 64
#: Bytes read from a file and sent at a time.
PIECE = 1 << 20
#: The media type of a STOW-RS request (its boundary added).
_STOW_TYPE = 'multipart/related; type="application/dicom"'


@dataclasses.dataclass
class StowReport:
    """What :func:`stow` did.

    Attributes:
        url: the STOW-RS endpoint as messages show it (no credentials, no query).
        instances: every file sent, in the order sent (:class:`StowInstance`).
        requests: POST requests made (retries included).
        bytes_sent: body bytes sent (retries included).
        skipped: files of the folders given that are not DICOM Part-10 files (not sent).
    """

    url: str
    instances: list[StowInstance]
    requests: int = 0
    bytes_sent: int = 0
    skipped: list[str] = dataclasses.field(default_factory=list)

    @property
    def stored(self) -> list[StowInstance]:
        """The instances the server stored."""
        return [i for i in self.instances if i.stored]

    @property
    def failed(self) -> list[StowInstance]:
        """The instances the server did not store (failed, or left out of its answer)."""
        return [i for i in self.instances if i.stored is False]

    @property
    def ok(self) -> bool:
        """Whether every instance was stored."""
        return all(i.stored for i in self.instances)

    def summary(self) -> str:
        """One line: how many instances of how many were stored, where."""
        size = sum(i.size for i in self.instances) / (1 << 20)
        return (f"{self.url}: {len(self.stored)} of {len(self.instances)} instance(s) stored "
                f"({size:.1f} MiB in {self.requests} request(s))")

    def raise_for_failures(self) -> None:
        """Raise where an instance was not stored.

        Raises:
            RemoteStoreError: naming how many were not stored and the first one's file,
                SOP Instance UID and reason (exit 19).
        """
        failed = self.failed
        if failed:
            first = failed[0]
            raise RemoteStoreError(f"{self.url}: {len(failed)} of {len(self.instances)} instance(s) not stored "
                                   f"(first: {first.path}, SOP Instance UID {first.sop}: {first.reason})")

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values (``--json``)."""
        return {"url": self.url, "requests": self.requests, "bytes_sent": self.bytes_sent,
                "stored": len(self.stored), "failed": len(self.failed), "skipped": self.skipped,
                "instances": [dataclasses.asdict(i) for i in self.instances]}


def stow_target(url: str) -> tuple[SeriesUrl, str, str | None]:
    """The parts of a STOW-RS URL: the service (``http(s)://host/root``, as a
    :class:`~wsitool.storage.urls.SeriesUrl` without study or series, for
    :class:`~.options.ClientOptions`), the endpoint's path below it (``/studies`` or
    ``/studies/{uid}``) and the study UID (None: any).

    ``url`` is the service root, or it ends in ``/studies`` or ``/studies/{StudyInstanceUID}``;
    ``dicomweb+`` before the scheme is allowed.

    Raises:
        InvalidOptionError: not an ``http(s)://`` URL, or one naming a series or an instance.
    """
    bare = url[len("dicomweb+"):] if url[:9].lower() == "dicomweb+" else url
    shown = redact(bare)
    if not bare.lower().startswith(("http://", "https://")):
        raise InvalidOptionError(f"{shown}: expected the http(s):// URL of a DICOMweb service "
                                 "(its root, or .../studies, or .../studies/{StudyInstanceUID})")
    try:
        parts = urllib.parse.urlsplit(bare)
    except ValueError as exc:
        raise InvalidOptionError(f"{shown}: not a valid URL ({exc})") from None
    if not parts.hostname:
        raise InvalidOptionError(f"{shown}: not a valid URL (no host)")
    segments = parts.path.rstrip("/").split("/")
    study = None
    if len(segments) >= 2 and segments[-2] == "studies":
        study = segments[-1]
        if not study.replace(".", "").isdigit():
            raise InvalidOptionError(f"{shown}: {study!r} is not a Study Instance UID")
        segments = segments[:-2]
    elif segments[-1] == "studies":
        segments = segments[:-1]
    if "series" in segments or "instances" in segments:
        raise InvalidOptionError(f"{shown}: STOW-RS stores to a service's /studies (or one study), "
                                 "not to a series or an instance")
    root = urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/".join(segments), parts.query, ""))
    return SeriesUrl(root, "", "", root), "/studies" + (f"/{study}" if study else ""), study


def dicom_files(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[StowInstance], list[str]]:
    """The files to send: each file given, and the DICOM Part-10 files directly in each
    folder given (sorted by name; hidden files and other files left out: the second list).

    Each file's header is read (never its pixel data) for its SOP Instance UID and Study
    Instance UID.

    Raises:
        FileNotFoundError, OSError: a path that cannot be read.
        UnsupportedFormatError: a file given by name that is not a DICOM Part-10 file (no
            ``DICM`` preamble) or has no SOP Instance UID; a folder with no DICOM file.
    """
    out: list[StowInstance] = []
    skipped: list[str] = []
    for given in paths:
        path = os.fspath(given)
        if os.path.isdir(path):
            found = 0
            for name in sorted(os.listdir(path)):
                full = os.path.join(path, name)
                if name.startswith(".") or not os.path.isfile(full):
                    continue
                inst = _instance(full, strict=False)
                if inst is None:
                    skipped.append(full)
                else:
                    out.append(inst)
                    found += 1
            if not found:
                raise UnsupportedFormatError(f"{path}: no DICOM Part-10 file in this folder")
        else:
            inst = _instance(path, strict=True)
            assert inst is not None  # (strict: raised instead)
            out.append(inst)
    return out, skipped


def _instance(path: str, strict: bool) -> StowInstance | None:
    """The :class:`StowInstance` of the file ``path``; None where it is not a DICOM Part-10
    file and not ``strict``.

    Raises:
        OSError: the file cannot be read.  UnsupportedFormatError: not a Part-10 file, with ``strict``.
    """
    import pydicom
    from pydicom.errors import InvalidDicomError

    with open(path, "rb") as fp:
        size = os.fstat(fp.fileno()).st_size
        if fp.read(132)[128:] != b"DICM":
            if strict:
                raise UnsupportedFormatError(f"{path}: not a DICOM Part-10 file (no DICM preamble); "
                                             "STOW-RS sends Part-10 files")
            return None
        fp.seek(0)
        try:
            ds = pydicom.dcmread(fp, stop_before_pixels=True, specific_tags=["SOPInstanceUID", "StudyInstanceUID"])
        except (InvalidDicomError, ValueError, EOFError, KeyError, TypeError) as exc:
            if strict:
                raise UnsupportedFormatError(f"{path}: unreadable DICOM header ({type(exc).__name__})") from None
            return None
    sop = str(ds.get("SOPInstanceUID") or getattr(ds.file_meta, "MediaStorageSOPInstanceUID", "") or "")
    if not sop:
        if strict:
            raise UnsupportedFormatError(f"{path}: the DICOM file has no SOP Instance UID")
        return None
    return StowInstance(path, sop, str(ds.get("StudyInstanceUID") or ""), size)


def batches(instances: Sequence[StowInstance], batch_bytes: int, batch_files: int) -> Iterator[list[StowInstance]]:
    """``instances`` in runs of at most ``batch_files`` files and ``batch_bytes`` bytes (a
    file larger than ``batch_bytes`` goes alone), in order."""
    run: list[StowInstance] = []
    size = 0
    for inst in instances:
        if run and (len(run) >= batch_files or size + inst.size > batch_bytes):
            yield run
            run, size = [], 0
        run.append(inst)
        size += inst.size
    if run:
        yield run


class _FileFailed(Exception):
    """A file could not be read while its request was sent (not an ``OSError``: urllib3
    would take it for a connection failure)."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


class _Body:
    """The multipart body of one batch: its length, and its pieces read from the files as they are sent."""

    def __init__(self, batch: Sequence[StowInstance], progress: Callable[[int], None] | None):
        self.batch = batch
        self.boundary = uuid.uuid4().hex
        self.progress = progress
        self.heads = [(f"--{self.boundary}\r\nContent-Type: application/dicom\r\n"
                       f"Content-Length: {inst.size}\r\n\r\n").encode("ascii") for inst in batch]
        self.tail = f"--{self.boundary}--\r\n".encode("ascii")
        self.length = sum(len(h) + inst.size + 2 for h, inst in zip(self.heads, batch, strict=True)) + len(self.tail)
        self.sent = 0
        self.done_at: float | None = None

    @property
    def content_type(self) -> str:
        return f"{_STOW_TYPE}; boundary={self.boundary}"

    def pieces(self) -> Iterator[bytes]:
        """The body, piece by piece; :attr:`sent` counts what was handed over.

        Raises:
            _FileFailed: a file that cannot be read, or that is shorter than it was.
        """
        for head, inst in zip(self.heads, self.batch, strict=True):
            yield self._count(head)
            try:
                with open(inst.path, "rb") as fp:
                    left = inst.size
                    while left:
                        piece = fp.read(min(PIECE, left))
                        if not piece:
                            raise OSError(0, "the file became shorter while it was sent", inst.path)
                        left -= len(piece)
                        yield self._count(piece)
            except OSError as exc:
                if exc.filename is None:
                    exc.filename = inst.path
                raise _FileFailed(exc) from None
            yield self._count(b"\r\n")
        yield self._count(self.tail)
        self.done_at = time.monotonic()

    def _count(self, piece: bytes) -> bytes:
        self.sent += len(piece)
        if self.progress is not None:
            self.progress(len(piece))
        return piece


class _Poster:
    """The POST requests of one upload: the pool, the headers, the answers' bound."""

    def __init__(self, target: SeriesUrl, path: str, options: Mapping[str, Any] | StorageOptions | None):
        settings = ClientOptions.parse(target, options, JSON_LIMIT)
        self.shown = redact(settings.base + path)
        self.endpoint = settings.base + path
        query = urllib.parse.urlsplit(target.base).query
        if query:  # (a service whose URL carries a key: kept, never shown)
            self.endpoint += "?" + query
        self.options = settings.remote
        self.headers = settings.headers
        self.limit = settings.json_limit
        self.pool = make_pool(settings, 2)
        self.requests = 0
        self.bytes_sent = 0

    def send(self, batch: Sequence[StowInstance], progress: Callable[[int], None] | None) -> None:
        """POST ``batch`` (retried as reading retries: ``retries``, back-off, ``Retry-After``),
        and mark its instances from the answer.

        Raises:
            RemoteNotFoundError: 404/410 (no STOW-RS there).  RemoteAccessError: 401/403, a
                redirect, or another 4xx without failures listed.  RemoteUnavailableError:
                timeouts, resets, 408/429/5xx after the retries; an answer longer than
                ``metadata_limit_mb`` (not retried).  OSError: a file that cannot be read.
        """
        opts = self.options
        attempt = 0
        while True:
            body = _Body(batch, progress)
            try:
                status, data = self._once(body)
                break
            except Transient as exc:
                attempt += 1
                if attempt > opts.retries:
                    raise RemoteUnavailableError(f"{self.shown}: the DICOMweb server kept failing: {exc.reason} "
                                                 f"({attempt} attempt(s))") from None
                wait = exc.retry_after if exc.retry_after is not None else retry_pause(attempt, opts.backoff,
                                                                                        spread=0.5)
                time.sleep(max(0.0, min(wait, opts.operation_timeout)))
            finally:
                self.bytes_sent += body.sent
        doc = parse_answer(data)
        if status not in (200, 202) and (doc is None or not doc.get("00081198")):
            raise RemoteAccessError(f"{self.shown}: the server refused the upload (HTTP {status}, no failed "
                                    "instance listed)")
        judge_answer(batch, status, doc)

    def _once(self, body: _Body) -> tuple[int, bytes]:
        urllib3 = urllib3_module()
        headers = dict(self.headers)
        headers.update({"Accept": "application/dicom+json", "Accept-Encoding": "identity",
                        "Content-Type": body.content_type, "Content-Length": str(body.length)})
        timeout = self.options.timeout
        self.requests += 1
        try:
            r = self.pool.urlopen("POST", self.endpoint, body=body.pieces(), headers=headers, redirect=False,
                                  retries=False, preload_content=False,
                                  timeout=urllib3.Timeout(connect=timeout, read=timeout))
        except _FileFailed as exc:
            raise exc.error from None
        except urllib3.exceptions.HTTPError as exc:
            raise Transient(failure_cause(exc)) from None
        try:
            return r.status, self._answer(r, body)
        except BaseException:
            r.close()
            raise
        finally:
            r.release_conn()

    def _answer(self, r: Any, body: _Body) -> bytes:
        """The body of the answer ``r`` (at most :attr:`limit` bytes, within ``operation_timeout``
        of the request's end), after its status is judged."""
        urllib3 = urllib3_module()
        status = r.status
        if status in (404, 410):
            raise RemoteNotFoundError(self.shown, f"not found (HTTP {status}: no STOW-RS service there)")
        if status in (401, 403):
            raise RemoteAccessError(f"{self.shown}: access denied (HTTP {status}: missing or wrong credentials)")
        if status in RETRY_STATUS:
            ra = r.headers.get("Retry-After")
            try:
                wait = min(float(ra), self.options.operation_timeout) if ra else None
            except ValueError:
                wait = None
            raise Transient(f"HTTP {status}", wait)
        if 300 <= status < 400 or status < 200 or 205 <= status < 300:
            raise RemoteAccessError(f"{self.shown}: unexpected answer HTTP {status} to the upload")
        what = "the STOW-RS answer (storage option metadata_limit_mb, in MiB, raises the limit)"
        if (r.headers.get("Content-Encoding") or "identity").strip().lower() == "identity":
            check_length(r.headers.get("Content-Length"), self.limit, self.shown, what)
        deadline = (body.done_at or time.monotonic()) + self.options.operation_timeout
        pieces = iter(functools.partial(r.read1, BODY_PIECE, decode_content=True), b"")
        try:
            return bytes(read_body(pieces, self.limit, self.shown, what, deadline=deadline))
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Transient(f"the answer was cut short ({failure_cause(exc)})") from None

    def close(self) -> None:
        self.pool.clear()


def stow(paths: Iterable[str | os.PathLike[str]], url: str,
         options: Mapping[str, Any] | StorageOptions | None = None, *, batch_mb: float = BATCH_MB,
         batch_files: int = BATCH_FILES, progress: Callable[[int, int], None] | None = None) -> StowReport:
    """Store DICOM Part-10 files on a DICOMweb service with STOW-RS, streamed from disk.

    Args:
        paths: files, and folders whose DICOM files (directly inside) are sent.
        url: the service root (``https://host/dicom-web``), its ``/studies``, or
            ``/studies/{StudyInstanceUID}`` (then every file must belong to that study);
            ``dicomweb+`` before the scheme is allowed; ``user:password@`` is HTTP basic.
        options: the DICOMweb storage options (:mod:`.options`: ``token``, ``username``,
            ``password``, ``headers``, ``verify``, ``timeout``, ``operation_timeout``,
            ``retries``, ``backoff``, ``metadata_limit_mb``).
        batch_mb: most MiB of files per request (a larger file goes alone).
        batch_files: most files per request.
        progress: called as ``progress(sent, total)`` as the bodies are handed to the
            connection: body bytes sent so far (a retry sends its batch again; at most
            ``total``) and in all the requests (bytes).

    Returns:
        The :class:`StowReport`: each instance stored or not, and why.  Instances the server
        did not store do not raise: call :meth:`StowReport.raise_for_failures`.

    Raises:
        InvalidOptionError: a bad URL, option or batch size; a file of another study than the URL's.
        UnsupportedFormatError: a file given by name that is not a DICOM Part-10 file; a folder without one.
        OSError: a file that cannot be read (before or while it is sent).
        RemoteNotFoundError: HTTP 404/410 (no STOW-RS service at the URL).
        RemoteAccessError: HTTP 401/403; another 4xx or a redirect with no failed instance listed.
        RemoteUnavailableError: timeouts, resets, HTTP 408/429/5xx after the retries; an answer
            longer than ``metadata_limit_mb``.  Batches sent before stay stored (the message
            counts them).
    """
    batch_bytes = _batch_bytes(batch_mb, batch_files)
    target, path, study = stow_target(url)
    poster = _Poster(target, path, options)
    try:
        instances, skipped = dicom_files(paths)
        if study is not None:
            for inst in instances:
                if inst.study != study:
                    raise InvalidOptionError(f"{inst.path}: of study {inst.study or '(none)'}, not the study "
                                             f"of {poster.shown}")
        report = StowReport(poster.shown, instances, skipped=skipped)
        runs = list(batches(instances, batch_bytes, batch_files))
        tick = _ticker(progress, sum(_Body(run, None).length for run in runs))
        done = 0
        for batch in runs:
            try:
                poster.send(batch, tick)
            except (RemoteAccessError, RemoteUnavailableError) as exc:
                if done:
                    raise type(exc)(f"{exc} ({done} of {len(instances)} instance(s) sent before)") from None
                raise
            finally:
                report.requests, report.bytes_sent = poster.requests, poster.bytes_sent
            done += len(batch)
        return report
    finally:
        poster.close()


def _batch_bytes(batch_mb: float, batch_files: int) -> int:
    """``batch_mb`` in bytes, both batch bounds checked.

    Raises:
        InvalidOptionError: not a positive number of MiB (below 2**40), or of files.
    """
    if isinstance(batch_mb, bool) or not (isinstance(batch_mb, (int, float)) and 0 < batch_mb < 2**40):
        raise InvalidOptionError(f"batch_mb: expected a positive number of MiB, got {batch_mb!r}")
    if isinstance(batch_files, bool) or not isinstance(batch_files, int) or batch_files < 1:
        raise InvalidOptionError(f"batch_files: expected a positive whole number, got {batch_files!r}")
    return max(1, int(batch_mb * (1 << 20)))


def _ticker(progress: Callable[[int, int], None] | None, total: int) -> Callable[[int], None] | None:
    """A callback of each piece's size that calls ``progress(sent, total)``; None without ``progress``."""
    if progress is None:
        return None
    sent = 0

    def tick(size: int) -> None:
        nonlocal sent
        sent += size
        progress(min(sent, total), total)

    return tick


def upload(base_url: str, files: Iterable[str | os.PathLike[str]],
           options: Mapping[str, Any] | StorageOptions | None = None) -> int:
    """STOW-RS of the DICOM files ``files`` to the service at ``base_url`` (:func:`stow`);
    how many were stored.

    Raises:
        RemoteStoreError: an instance not stored; the errors of :func:`stow`.
    """
    report = stow(files, base_url, options)
    report.raise_for_failures()
    return len(report.stored)

