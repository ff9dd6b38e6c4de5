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
import os
import urllib.parse
from typing import Any

from ....errors import InvalidOptionError, RemoteUnavailableError, WsiError
from ...urls import redact
from ..options import option_flag, option_text
from ..transport import Response, Transport
from .obstore_client import (
    check_runtime,
    client_timeouts,
    first_line,
    keep_inherited,
    obstore_module,
    ranged_get,
    without_frames,
)

__all__ = ["BUCKET_SCHEMES", "BucketURL", "ObjectStoreTransport", "make_store", "store_config"]

#: scheme as given -> (obstore's scheme, protocol name)
BUCKET_SCHEMES = {"s3": ("s3", "s3"), "gs": ("gs", "gs"), "gcs": ("gs", "gs"),
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


def store_config(protocol: str, options: dict) -> tuple[dict, dict]:
    """``(config, client_options)`` for obstore from ``storage_options`` (fsspec names translated).

    obstore takes text, booleans and ``timedelta``: a number (``--storage-option secret=1234``)
    becomes its text (:func:`~wsitool.storage.remote.options.option_text`).

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
    anything else as text (:func:`~wsitool.storage.remote.options.option_text`; the message names
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
        obstore_module()  # (the remote extra installed, or one clear line)
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
            except obstore_module().exceptions.NotSupportedError as exc:  # (an endpoint that ignores Range)
                raise RemoteUnavailableError(f"{self.shown}: the server does not support range requests "
                                             f"({first_line(exc, 120)})") from None
        except Exception as exc:
            raise without_frames(exc) from None

    def after_fork(self) -> None:
        keep_inherited(self._store)
        check_runtime(self.shown, self.protocol)
        self._store = self._make_store()  # a fresh client: no connection of the parent's

    def close(self) -> None:
        keep_inherited(self._store)
        self._store = None


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
        if scheme not in BUCKET_SCHEMES:
            raise WsiError(f"{shown}: not an s3://, gs:// or az:// URL")
        parts = urllib.parse.urlsplit(url)
        if not parts.netloc:
            raise WsiError(f"{shown}: a {scheme}:// URL names a bucket ({scheme}://{example})")
        store_scheme, protocol = BUCKET_SCHEMES[scheme]
        return cls(scheme, store_scheme, protocol, parts.netloc, urllib.parse.unquote(parts.path.lstrip("/")), shown)

    def url_of(self, key: str) -> str:
        """The URL of the object ``key`` of this bucket (the key quoted as a URL path)."""
        return f"{self.scheme}://{self.bucket}/{urllib.parse.quote(key, safe=_KEY_SAFE)}"


#: characters a key keeps unquoted in the URLs listings return
_KEY_SAFE = "/~!$&'()*+,;=:@"


def make_store(where: BucketURL, options: dict, timeout: float, total: float = 120.0) -> Any:
    """An obstore store of ``where``'s bucket (:func:`client_timeouts` of ``timeout`` and
    ``total`` seconds) with obstore's own retries off (wsitool retries:
    :class:`~wsitool.storage.remote.source.RemoteSource` for reads,
    :func:`~wsitool.storage.remote.transports.listing.list_keys` for listings).  ``options``: the
    store's ``storage_options`` (the generic :class:`~wsitool.storage.remote.options.RemoteOptions`
    keys taken out).

    Raises:
        InvalidOptionError: an option the protocol does not take, or a value obstore refuses
            (exit 2).
        WsiError: obstore is not installed.
    """
    obstore = obstore_module()
    config, client = store_config(where.protocol, options)
    for key, value in client_timeouts(timeout, total).items():
        client.setdefault(key, value)
    try:
        return obstore.store.from_url(f"{where.store_scheme}://{where.bucket}", config=config or None,
                                      client_options=client,
                                      retry_config={"max_retries": 0, "retry_timeout": datetime.timedelta(seconds=1)})
    except Exception as exc:  # obstore's configuration errors: a value it cannot parse
        raise InvalidOptionError(f"{where.shown}: {first_line(exc)}") from None
