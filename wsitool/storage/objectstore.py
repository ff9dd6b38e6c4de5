"""S3, Google Cloud Storage and Azure Blob range reads for :class:`~wsitool.storage.remote.RemoteSource` (floor 1).

Requests go through obstore (Rust's ``object_store``; ``pip install
'wsitool[remote]'``): it signs them with each cloud's standard credential chain
(environment variables such as ``AWS_ACCESS_KEY_ID`` / ``AWS_ENDPOINT_URL`` /
``AWS_REGION``, ``GOOGLE_APPLICATION_CREDENTIALS``, ``AZURE_STORAGE_ACCOUNT_NAME``
/ ``AZURE_STORAGE_ACCOUNT_KEY``, the instance / workload identity) and every
request after the first carries ``If-Match`` with the ETag taken at open.
wsitool makes the retries (obstore's own are off).

``storage_options`` take obstore's configuration keys (``aws_endpoint``,
``skip_signature``, ``google_service_account``, ``azure_storage_account_name``,
...), and the fsspec names tiffslide users pass, translated:

==========================  =====================================================
fsspec / tiffslide name     meaning
==========================  =====================================================
``anon``                    unsigned requests (public buckets)
``key``, ``secret``,        S3 access key id, secret key, session token
``token``
``endpoint_url``            the S3 endpoint (also in ``client_kwargs``)
``region_name``             the S3 region (also in ``client_kwargs``)
``account_name``,           Azure storage account and key, SAS token
``account_key``,
``sas_token``
``connection_string``       an Azure connection string (``AccountName``,
                            ``AccountKey``, ``BlobEndpoint``,
                            ``SharedAccessSignature``, or
                            ``UseDevelopmentStorage=true``)
``token`` (gs://)           a service-account JSON file path, or ``"anon"``
``endpoint_url`` (gs://)    the GCS endpoint (an emulator's URL)
==========================  =====================================================

Emulators and other endpoints: for S3 ``AWS_ENDPOINT_URL`` (or ``endpoint_url``); for
GCS ``STORAGE_EMULATOR_HOST`` (the variable Google's clients read) or ``endpoint_url`` /
``google_base_url``; for Azure ``azure_endpoint`` (``http://host:port/account`` for
Azurite) with the account's name and key, a connection string (the option or
``AZURE_STORAGE_CONNECTION_STRING``), or ``use_emulator`` (Azurite at
``AZURITE_BLOB_STORAGE_URL``, default ``http://127.0.0.1:10000``). An ``http://``
endpoint turns on plain HTTP.
"""

from __future__ import annotations

import dataclasses
import datetime
import email.utils
import functools
import os
import random
import re
import time
import types
import urllib.parse
from typing import Any

from ..errors import (
    InvalidOptionError,
    RemoteAccessError,
    RemoteNotFoundError,
    RemoteUnavailableError,
    WsiError,
)
from .body import read_body, too_long
from .options import option_flag, option_text
from .remote import RemoteOptions, Response, Transient, Transport, status_error
from .urls import redact

__all__ = ["BucketURL", "ObjectStoreTransport", "list_keys", "list_objects", "make_store", "ranged_get",
           "runtime_usable", "store_config", "without_frames",
           "HeaderTrouble", "check_runtime", "client_timeouts", "http_date", "keep_inherited"]

#: scheme as given -> (obstore's scheme, protocol name)
_SCHEMES = {"s3": ("s3", "s3"), "gs": ("gs", "gs"), "gcs": ("gs", "gs"),
            "az": ("az", "az"), "azure": ("az", "az"), "abfs": ("abfs", "az"), "abfss": ("abfss", "az")}

_AWS: dict[str, str | None] = {
    "key": "aws_access_key_id", "secret": "aws_secret_access_key", "token": "aws_session_token",
    "endpoint_url": "aws_endpoint", "region_name": "aws_region"}
_AZURE: dict[str, str | None] = {
    "account_name": "azure_storage_account_name", "account_key": "azure_storage_account_key",
    "sas_token": "azure_storage_sas_key", "connection_string": None}
_GCS: dict[str, str | None] = {"token": "google_service_account", "endpoint_url": "google_base_url"}
#: obstore's own keys each protocol takes: a prefix, and the short names
_NATIVE_PREFIX = {"s3": ("aws_",), "gs": ("google_",), "az": ("azure_",)}
_NATIVE_KEYS = {
    "s3": ("endpoint", "region", "access_key_id", "secret_access_key", "session_token",
           "virtual_hosted_style_request", "bucket", "bucket_name"),
    "gs": ("service_account", "service_account_key", "base_url", "bearer_token", "application_credentials",
           "bucket", "bucket_name"),
    "az": ("account_name", "account_key", "sas_key", "use_emulator", "use_fabric_endpoint", "endpoint",
           "container_name"),
}
#: connection-string field -> obstore key (Azure)
_AZURE_CONN = {"accountname": "azure_storage_account_name", "accountkey": "azure_storage_account_key",
               "blobendpoint": "azure_endpoint", "sharedaccesssignature": "azure_storage_sas_key"}
#: the configuration keys that name an endpoint (plain http:// ones need allow_http)
_ENDPOINT_KEYS = ("aws_endpoint", "endpoint", "google_base_url", "base_url", "azure_endpoint")


def _obstore() -> types.ModuleType:
    try:
        import obstore
        import obstore.store
    except ImportError:  # pragma: no cover - depends on the installation
        raise WsiError("reading slides from http(s)://, s3://, gs:// and az:// URLs needs the optional extra: "
                       "pip install 'wsitool[remote]'") from None
    return obstore


def store_config(protocol: str, options: dict) -> tuple[dict, dict]:
    """``(config, client_options)`` for obstore from ``storage_options`` (fsspec names translated).

    obstore takes text, booleans and ``timedelta``: a number (``--storage-option secret=1234``)
    becomes its text (:func:`~wsitool.storage.options.option_text`).

    Raises:
        InvalidOptionError: an option this protocol does not take; a value that is not text, a
            number, a boolean or a ``timedelta`` (None, a list, an object); ``anon`` that is not
            true or false.
    """
    options = dict(options)
    client = _obstore_values(options.pop("client_options", None) or {}, "client_options.")
    nested = options.pop("client_kwargs", None) or {}
    for k in ("endpoint_url", "region_name"):
        if k in nested:
            options.setdefault(k, nested[k])
    config: dict = {}
    if option_flag("anon", options.pop("anon", False)):
        config["skip_signature"] = True
    if protocol == "gs" and options.get("token") == "anon":  # gcsfs's name for unsigned requests
        del options["token"]
        config["skip_signature"] = True
    names: dict[str, str | None] = {"s3": _AWS, "gs": _GCS, "az": _AZURE}[protocol]
    for key in options:
        if not ((key == "connection_string" and protocol == "az") or names.get(key) is not None
                or key.startswith(_NATIVE_PREFIX[protocol]) or key in _NATIVE_KEYS[protocol]
                or key == "skip_signature"):
            raise InvalidOptionError(f"storage option {key}: not an option for {protocol}:// URLs")
    for key, value in _obstore_values(options).items():
        if key == "connection_string":
            config.update(_azure_connection_string(value))
        else:
            config[str(names.get(key) or key)] = value
    _endpoint_from_environment(protocol, config)
    endpoint = next((str(config[k]) for k in _ENDPOINT_KEYS if config.get(k)), "")
    if not endpoint and protocol == "s3":  # the standard variables name a local server in tests
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    emulator = config.get("use_emulator", config.get("azure_storage_use_emulator"))
    if endpoint.startswith("http://") or emulator in (True, "true", "True"):
        client.setdefault("allow_http", True)
    return config, client


def _obstore_values(options: dict, prefix: str = "") -> dict:
    """``options`` with each value as obstore takes it: booleans and ``timedelta`` as they are,
    anything else as text (:func:`~wsitool.storage.options.option_text`; the message names
    ``prefix + key``)."""
    if not isinstance(options, dict):
        raise InvalidOptionError(f"storage option {prefix.rstrip('.')}: expected KEY.NAME=VALUE options")
    return {key: value if isinstance(value, (bool, datetime.timedelta)) else option_text(prefix + key, value)
            for key, value in options.items()}


def _endpoint_from_environment(protocol: str, config: dict) -> None:
    """The emulator variables Google's and Azure's own clients read, where no option names an endpoint."""
    if any(config.get(k) for k in _ENDPOINT_KEYS):
        return
    if protocol == "gs" and os.environ.get("STORAGE_EMULATOR_HOST"):
        host = os.environ["STORAGE_EMULATOR_HOST"].rstrip("/")
        config["google_base_url"] = host if "://" in host else "http://" + host
        config.setdefault("skip_signature", True)  # an emulator takes unsigned requests
    elif (protocol == "az" and os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
          and not any(k in config for k in ("azure_storage_account_name", "account_name", "use_emulator",
                                            "azure_storage_use_emulator"))):
        config.update(_azure_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"]))


def _azure_connection_string(text: str) -> dict:
    """obstore's Azure keys from a connection string (``Key=Value;...``).

    Raises:
        WsiError: a field that is not ``Key=Value``, or no account and no development storage.
    """
    config: dict = {}
    fields = {}
    for part in str(text).split(";"):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise InvalidOptionError("storage option connection_string: each field is Key=Value, separated by ';'")
        fields[key.strip().lower()] = value.strip()
    if fields.get("usedevelopmentstorage", "").lower() == "true":
        config["use_emulator"] = True  # Azurite at AZURITE_BLOB_STORAGE_URL or 127.0.0.1:10000
    for field_name, key in _AZURE_CONN.items():
        if fields.get(field_name):
            config[key] = fields[field_name]
    if "azure_endpoint" not in config and fields.get("endpointsuffix") and fields.get("accountname"):
        protocol = fields.get("defaultendpointsprotocol") or "https"
        config["azure_endpoint"] = f"{protocol}://{fields['accountname']}.blob.{fields['endpointsuffix']}"
    if not config:
        raise InvalidOptionError("storage option connection_string: names no AccountName, BlobEndpoint or "
                       "UseDevelopmentStorage=true")
    return config


class ObjectStoreTransport(Transport):
    """Ranged GETs of one object of S3, GCS or Azure Blob Storage.

    Args:
        url: ``s3://bucket/key``, ``gs://bucket/key``, ``az://container/blob`` (or ``abfs[s]://``).
        shown: the URL as messages show it.
        options: the transport's ``storage_options`` (see the module).
        timeout: seconds to connect, and that a request may wait for its next bytes.
        total: seconds one request may take in all (the read's ``operation_timeout``).
        store: an obstore store of the same bucket, options and timeouts to share (the
            objects of one prefix, :mod:`wsitool.storage.prefix`: one connection pool);
            None: one of its own.

    Raises:
        WsiError: obstore is not installed, a bad option or URL (InvalidOptionError, exit 2:
            a URL without a bucket or an object); this process was forked after its parent
            made requests through obstore (:func:`runtime_usable`).
    """

    def __init__(self, url: str, shown: str, options: dict, timeout: float = 20.0, store: Any = None,
                 total: float = 120.0):
        _obstore()  # (the remote extra installed, or one clear line)
        scheme = url.split("://", 1)[0].lower()
        parts = urllib.parse.urlsplit(url)
        if not parts.netloc or not parts.path.lstrip("/"):
            raise InvalidOptionError(f"{shown}: a {scheme}:// slide URL names a bucket and an object "
                                     f"({scheme}://bucket/path/slide.svs)")
        where = BucketURL.parse(url)
        self.shown, self.protocol, self.key = shown, where.protocol, where.key
        check_runtime(shown, where.protocol)
        self._where, self._options, self._timeout, self._total = where, dict(options), timeout, total
        self._store = store if store is not None else self._make_store()

    def _make_store(self) -> Any:
        return make_store(self._where, self._options, self._timeout, self._total)

    def get(self, start: int, end: int, pin: Response | None, timeout: float) -> Response:
        try:
            try:
                return ranged_get(self._store, self.key, start, end, pin, self.shown, self.protocol)
            except _obstore().exceptions.NotSupportedError as exc:  # (an endpoint that ignores Range)
                raise RemoteUnavailableError(f"{self.shown}: the server does not support range requests "
                                             f"({_first_line(exc, 120)})") from None
        except Exception as exc:
            raise without_frames(exc) from None

    def after_fork(self) -> None:
        keep_inherited(self._store)
        check_runtime(self.shown, self.protocol)
        self._store = self._make_store()  # a fresh client: no connection of the parent's

    def close(self) -> None:
        keep_inherited(self._store)
        self._store = None


def ranged_get(store: Any, key: str, start: int, end: int, pin: Response | None, shown: str, protocol: str,
               *, if_match: str | None = None, url: str | None = None) -> Response:
    """Bytes ``start .. end - 1`` of object ``key`` of an obstore ``store`` (a
    :meth:`Transport.get <wsitool.storage.remote.Transport.get>` made through obstore).

    ``if_match``: the ETag the server is asked to check (``If-Match``; default: the pinned
    one, where there is a pin).  ``shown``: the URL as messages show it; ``url``: the URL
    as requested, replaced by ``shown`` wherever obstore's texts quote it.  obstore's
    ``NotSupportedError`` (an HTTP server that ignores ``Range``) is passed on as it is: the
    caller decides.

    Raises:
        RemoteNotFoundError, RemoteAccessError, RemoteChangedError: what retrying cannot fix
            (:func:`_failure` says which status is which).
        RemoteUnavailableError: a server whose answers lack a header obstore needs; a body
            longer than the range (:func:`~wsitool.storage.body.read_body`: never read past it).
        HeaderTrouble: the same, for ``protocol`` "http" (its caller reads through urllib3).
        Transient: what retrying may fix (timeouts, resets, 408/425/429/5xx, a body cut short).
        WsiError: this process was forked after its parent's first obstore request.
    """
    obstore = _obstore()
    exc_mod = obstore.exceptions
    _enter_runtime(shown, protocol)
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
        return _failure(exc, start, pin, shown, protocol, url)  # (raises, unless the object is empty)
    if len(data) != want:
        raise Transient(f"the body was cut short ({len(data)} of {want} bytes)")
    return Response(data, int(meta["size"]), meta.get("e_tag"), http_date(meta.get("last_modified")))


class HeaderTrouble(Exception):
    """An HTTP(S) answer obstore cannot read: a header it needs is missing (``Content-Length``
    of a chunked answer) or not in the form it parses (``Last-Modified``).  urllib3 reads such
    servers: :class:`~wsitool.storage.http.HttpTransport` switches to it."""


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


def _failure(exc: Exception, start: int, pin: Response | None, shown: str, protocol: str,
             url: str | None = None) -> Response:
    """Raise the error of obstore's ``exc`` (see :func:`ranged_get`); but return the empty
    object's :class:`Response` for a range refused at open (416) when the object is empty.

    A status obstore's text names is read by :func:`~wsitool.storage.remote.status_error`, as
    the urllib3 client reads it; obstore's own classes stand in where the text names none.
    No status: timeouts, resets and refused connections are :class:`Transient`.
    """
    exc_mod = _obstore().exceptions
    raw = str(exc)
    if url:
        raw = raw.replace(url, shown)
    status = _status_of(raw)
    if not status and "Range Not Satisfiable" in raw:
        status = 416
    other = _OTHER_RANGE.search(raw)  # (obstore checks the answer's Content-Range against the request)
    if other is not None:
        asked, got = (int(other.group(1)), int(other.group(2))), (int(other.group(3)), int(other.group(4)))
        if got[0] == asked[0] and got[1] > asked[1]:  # more than asked: refused, never read (nor retried)
            raise too_long(shown, asked[1] - asked[0], f"bytes {asked[0]}-{asked[1] - 1}", asked=True,
                           declared=got[1] - got[0]) from None
        raise Transient(f"the server answered bytes {got[0]}-{got[1] - 1} for {asked[0]}-{asked[1] - 1}") from None
    first = _first_line(raw, 4000)
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


@dataclasses.dataclass(frozen=True)
class BucketURL:
    """An ``s3://``, ``gs://`` or ``az://`` URL (or an alias) taken apart.

    Attributes:
        scheme: the scheme as given (``s3``, ``gcs``, ``abfs``, ...), lower case.
        store_scheme: obstore's scheme for it.
        protocol: ``"s3"``, ``"gs"`` or ``"az"``.
        bucket: the bucket (Azure: the container).
        key: the object key or key prefix, unquoted (``""`` for a whole bucket).
        shown: the URL as messages show it (:func:`~wsitool.storage.urls.redact`).
    """

    scheme: str
    store_scheme: str
    protocol: str
    bucket: str
    key: str
    shown: str

    @classmethod
    def parse(cls, url: str, example: str = "bucket/path/slide.svs") -> BucketURL:
        """Take ``url`` apart; ``example`` (after ``scheme://``) is shown when it names no bucket.

        Raises:
            WsiError: not an object-store URL, or no bucket.
        """
        shown = redact(url)
        scheme = url.split("://", 1)[0].lower()
        if scheme not in _SCHEMES:
            raise WsiError(f"{shown}: not an s3://, gs:// or az:// URL")
        parts = urllib.parse.urlsplit(url)
        if not parts.netloc:
            raise WsiError(f"{shown}: a {scheme}:// URL names a bucket ({scheme}://{example})")
        store_scheme, protocol = _SCHEMES[scheme]
        return cls(scheme, store_scheme, protocol, parts.netloc, urllib.parse.unquote(parts.path.lstrip("/")), shown)

    def url_of(self, key: str) -> str:
        """The URL of the object ``key`` of this bucket (the key quoted as a URL path)."""
        return f"{self.scheme}://{self.bucket}/{urllib.parse.quote(key, safe=_KEY_SAFE)}"


#: characters a key keeps unquoted in the URLs listings return
_KEY_SAFE = "/~!$&'()*+,;=:@"


def make_store(where: BucketURL, options: dict, timeout: float, total: float = 120.0) -> Any:
    """An obstore store of ``where``'s bucket (:func:`client_timeouts` of ``timeout`` and
    ``total`` seconds) with obstore's own retries off (wsitool retries: :class:`~wsitool.storage.remote.RemoteSource`
    for reads, :func:`list_keys` for listings).  ``options``: the store's ``storage_options``
    (the generic :class:`~wsitool.storage.remote.RemoteOptions` keys taken out).

    Raises:
        InvalidOptionError: an option the protocol does not take, or a value obstore refuses
            (exit 2).
        WsiError: obstore is not installed.
    """
    obstore = _obstore()
    config, client = store_config(where.protocol, options)
    for key, value in client_timeouts(timeout, total).items():
        client.setdefault(key, value)
    try:
        return obstore.store.from_url(f"{where.store_scheme}://{where.bucket}", config=config or None,
                                      client_options=client,
                                      retry_config={"max_retries": 0, "retry_timeout": datetime.timedelta(seconds=1)})
    except Exception as exc:  # obstore's configuration errors: a value it cannot parse
        raise InvalidOptionError(f"{where.shown}: {_first_line(exc)}") from None


def client_timeouts(timeout: float, total: float) -> dict[str, str]:
    """obstore's client options for wsitool's ``timeout`` (seconds to connect, and that a request
    may wait for its next bytes: reqwest's read timeout) and ``total`` (seconds one request may
    take in all, the read's ``operation_timeout``: a slow link still fetches a 4 MiB range)."""
    def ms(seconds: float) -> str:
        return f"{max(1, int(round(seconds * 1000)))}ms"

    return {"connect_timeout": ms(timeout), "read_timeout": ms(timeout), "timeout": ms(max(total, timeout))}


def list_keys(store: Any, where: BucketURL, options: RemoteOptions, limit: int | None = None) -> list[tuple[str, int]]:
    """``(key, size in bytes)`` of every object under ``where.key`` (recursively), sorted by key.

    One listing request per page (S3 and GCS answer up to 1,000 keys a page, Azure 5,000).
    With ``limit``, the listing stops once more than ``limit`` keys were seen (the caller
    tells the result's length from ``limit + 1`` keys and up).  A failure worth retrying
    (timeout, reset, 5xx) is retried ``options.retries`` times with back-off, within
    ``options.operation_timeout`` seconds.

    Raises:
        RemoteNotFoundError: no such bucket.
        RemoteAccessError: access denied, missing or expired credentials.
        RemoteUnavailableError: the listing kept failing.
        WsiError: obstore refused the key prefix; this process was forked after its parent
            used obstore (a listing would hang).
    """
    _enter_runtime(where.shown, where.protocol)
    deadline = time.monotonic() + options.operation_timeout
    attempt = 0
    while True:
        try:
            return sorted(_list_once(store, where, limit))
        except _Transient as exc:
            attempt += 1
            pause = min(8.0, options.backoff * 2 ** (attempt - 1)) * (0.5 + random.random())
            if attempt > options.retries or time.monotonic() + pause > deadline:
                raise RemoteUnavailableError(
                    f"{where.shown}: listing failed ({exc}; gave up after {attempt} attempts)") from None
            time.sleep(pause)


def _list_once(store: Any, where: BucketURL, limit: int | None) -> list[tuple[str, int]]:
    """One listing of the keys under ``where.key`` (up to ``limit + 1``); errors mapped to
    wsitool's, :class:`_Transient` for those worth retrying."""
    exc_mod = _obstore().exceptions
    found: list[tuple[str, int]] = []
    try:
        for chunk in _obstore().list(store, prefix=where.key or None, chunk_size=1000):
            found.extend((str(meta["path"]), int(meta["size"])) for meta in chunk)
            if limit is not None and len(found) > limit:
                break
    except (FileNotFoundError, exc_mod.NotFoundError):
        raise RemoteNotFoundError(where.shown, "no such bucket") from None
    except (exc_mod.PermissionDeniedError, exc_mod.UnauthenticatedError) as exc:
        raise RemoteAccessError(f"{where.shown}: access denied ({_first_line(exc, 120)})") from None
    except (exc_mod.UnknownConfigurationKeyError, exc_mod.InvalidPathError) as exc:
        raise WsiError(f"{where.shown}: {_first_line(exc)}") from None
    except (exc_mod.BaseError, OSError, TimeoutError, ConnectionError) as exc:
        text = _first_line(exc, 160)
        code = _status_of(str(exc))
        if code in (401, 403):
            raise RemoteAccessError(f"{where.shown}: access denied ({text})") from None
        if code == 404 or "NoSuchBucket" in text:
            raise RemoteNotFoundError(where.shown, "no such bucket") from None
        raise _Transient(f"HTTP {code}" if code else text) from None
    return found


class _Transient(Exception):
    """A listing failure worth retrying (timeout, reset, 5xx)."""


def list_objects(url: str, storage_options: dict | None = None) -> list[str]:
    """The URLs of every object under the prefix ``url`` (``s3://bucket/prefix/``), sorted.

    ``url`` is ``s3://``, ``gs://`` or ``az://`` (and their aliases) with a bucket
    (container) and an optional prefix ending in ``/`` (``s3://bucket/`` lists the
    whole bucket).  The listing is recursive (keys in sub-prefixes come too); each
    URL returned is ``scheme://bucket/key`` with the key as stored (the query of
    ``url``, if any, is not carried over).  ``storage_options`` as for
    :func:`~wsitool.storage.open_source`; ``timeout``, ``operation_timeout``,
    ``retries`` and ``backoff`` bound the listing's requests (:func:`list_keys`).

    Raises:
        RemoteNotFoundError: the bucket does not exist, or nothing is stored under the prefix.
        RemoteAccessError: access denied, missing or expired credentials.
        RemoteUnavailableError: the store kept failing (timeouts, 5xx, resets).
        InvalidOptionError: a bad storage option.
        WsiError: not an object-store URL, obstore not installed.
    """
    where = BucketURL.parse(url, "bucket/prefix/")
    options = dict(storage_options or {})
    generic = RemoteOptions.take(options)
    keys = list_keys(make_store(where, options, generic.timeout, generic.operation_timeout), where, generic)
    if not keys:
        raise RemoteNotFoundError(where.shown, "no object under this prefix")
    return [where.url_of(key) for key, _ in keys]


#: An HTTP status in obstore's error texts: "status 403", "status: 403", "status code: 403
#: Forbidden", reqwest's "(503 Service Unavailable)", or a reason phrase after the code.
_STATUS = re.compile(r"(?:status(?: code)?:? |\()([1-5]\d\d)\b"
                     r"|\b([1-5]\d\d) (?:Unauthorized|Forbidden|Not Found|Range Not Satisfiable)\b")


def _status_of(text: str) -> int:
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


def _enter_runtime(shown: str, protocol: str) -> None:
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


def _first_line(exc: BaseException | str, limit: int = 200) -> str:
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
