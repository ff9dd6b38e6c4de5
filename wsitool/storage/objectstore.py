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
``token`` (gs://)           a service-account JSON file path
==========================  =====================================================
"""

from __future__ import annotations

import datetime
import os
import types
import urllib.parse
from typing import Any

from ..errors import RemoteAccessError, RemoteChangedError, RemoteNotFoundError, WsiError
from .remote import Response, Transient, Transport

__all__ = ["ObjectStoreTransport", "store_config"]

#: scheme as given -> (obstore's scheme, protocol name)
_SCHEMES = {"s3": ("s3", "s3"), "gs": ("gs", "gs"), "gcs": ("gs", "gs"),
            "az": ("az", "az"), "azure": ("az", "az"), "abfs": ("abfs", "az"), "abfss": ("abfss", "az")}

_AWS: dict[str, str | None] = {
    "key": "aws_access_key_id", "secret": "aws_secret_access_key", "token": "aws_session_token",
    "endpoint_url": "aws_endpoint", "region_name": "aws_region"}
_AZURE: dict[str, str | None] = {
    "account_name": "azure_storage_account_name", "account_key": "azure_storage_account_key",
    "sas_token": "azure_storage_sas_key", "connection_string": None}
_GCS: dict[str, str | None] = {"token": "google_service_account"}
#: obstore's own keys each protocol takes: a prefix, and the short names
_NATIVE_PREFIX = {"s3": ("aws_",), "gs": ("google_",), "az": ("azure_",)}
_NATIVE_KEYS = {
    "s3": ("endpoint", "region", "access_key_id", "secret_access_key", "session_token",
           "virtual_hosted_style_request", "bucket", "bucket_name"),
    "gs": ("service_account", "service_account_key", "bucket", "bucket_name"),
    "az": ("account_name", "account_key", "sas_key", "use_emulator", "use_fabric_endpoint",
           "container_name"),
}


def _obstore() -> types.ModuleType:
    try:
        import obstore
        import obstore.store
    except ImportError:  # pragma: no cover - depends on the installation
        raise WsiError("reading slides from s3://, gs:// and az:// URLs needs the optional extra: "
                       "pip install 'wsitool[remote]'") from None
    return obstore


def store_config(protocol: str, options: dict) -> tuple[dict, dict]:
    """``(config, client_options)`` for obstore from ``storage_options`` (fsspec names translated).

    Raises:
        WsiError: an option this protocol does not take.
    """
    options = dict(options)
    client = dict(options.pop("client_options", None) or {})
    nested = options.pop("client_kwargs", None) or {}
    for k in ("endpoint_url", "region_name"):
        if k in nested:
            options.setdefault(k, nested[k])
    config: dict = {}
    if options.pop("anon", False) in (True, "true", "True", "1", 1):
        config["skip_signature"] = True
    names: dict[str, str | None] = {"s3": _AWS, "gs": _GCS, "az": _AZURE}[protocol]
    for key, value in options.items():
        if key in names:
            if names[key] is None:
                raise WsiError(f"storage option {key}: not supported; give account_name and "
                               "account_key or sas_token")
            config[names[key]] = value
        elif key.startswith(_NATIVE_PREFIX[protocol]) or key in _NATIVE_KEYS[protocol] or key == "skip_signature":
            config[key] = value
        else:
            raise WsiError(f"storage option {key}: not an option for {protocol}:// URLs")
    endpoint = config.get("aws_endpoint") or config.get("endpoint") or ""
    if not endpoint and protocol == "s3":  # the standard variables name a local server in tests
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    if str(endpoint).startswith("http://") or config.get("use_emulator") in (True, "true"):
        client.setdefault("allow_http", True)
    return config, client


class ObjectStoreTransport(Transport):
    """Ranged GETs of one object of S3, GCS or Azure Blob Storage.

    Args:
        url: ``s3://bucket/key``, ``gs://bucket/key``, ``az://container/blob`` (or ``abfs[s]://``).
        shown: the URL as messages show it.
        options: the transport's ``storage_options`` (see the module).
        timeout: seconds a request may take.

    Raises:
        WsiError: obstore is not installed, a bad option or URL.
    """

    def __init__(self, url: str, shown: str, options: dict, timeout: float = 20.0):
        obstore = _obstore()
        scheme = url.split("://", 1)[0].lower()
        store_scheme, self.protocol = _SCHEMES[scheme]
        parts = urllib.parse.urlsplit(url)
        bucket, key = parts.netloc, parts.path.lstrip("/")
        if not bucket or not key:
            raise WsiError(f"{shown}: a {scheme}:// slide URL names a bucket and an object "
                           f"({scheme}://bucket/path/slide.svs)")
        self.shown = shown
        self.key = urllib.parse.unquote(key)
        config, client = store_config(self.protocol, options)
        client.setdefault("timeout", f"{max(1, int(round(timeout)))}s")
        client.setdefault("connect_timeout", f"{max(1, int(round(timeout)))}s")
        self._args = (f"{store_scheme}://{bucket}", config, client)
        try:
            self._store = self._make_store()
        except Exception as exc:  # obstore's configuration errors
            raise WsiError(f"{shown}: {_first_line(exc)}") from None
        self._obstore = obstore

    def _make_store(self) -> Any:
        obstore = _obstore()
        root, config, client = self._args
        return obstore.store.from_url(root, config=config or None, client_options=client,
                                      retry_config={"max_retries": 0,
                                                    "retry_timeout": datetime.timedelta(seconds=1)})

    def get(self, start: int, end: int, pin: Response | None, timeout: float) -> Response:
        obstore = self._obstore
        exc_mod = obstore.exceptions
        opts: dict = {"range": (start, end if pin is None else min(end, pin.size))}
        if pin is not None and pin.etag:
            opts["if_match"] = pin.etag
        try:
            result = obstore.get(self._store, self.key, options=opts)
            meta = result.meta
            data = bytes(result.bytes())
        except FileNotFoundError:
            raise RemoteNotFoundError(self.shown) from None
        except (exc_mod.PermissionDeniedError, exc_mod.UnauthenticatedError) as exc:
            raise RemoteAccessError(f"{self.shown}: access denied ({_first_line(exc, 120)})") from None
        except exc_mod.PreconditionError:
            raise RemoteChangedError(f"{self.shown}: the object changed on the server while open "
                                     "(its ETag no longer matches); open it again") from None
        except exc_mod.NotModifiedError:  # pragma: no cover - no If-None-Match is sent
            raise Transient("not modified") from None
        except (exc_mod.GenericError, exc_mod.BaseError, OSError, TimeoutError, ConnectionError) as exc:
            text = _first_line(exc, 160)
            if "416" in text or "Range Not Satisfiable" in text:
                if pin is not None:
                    raise RemoteChangedError(f"{self.shown}: the object changed on the server while open "
                                             "(a range inside it is not there any more); open it again") from None
                if start == 0:  # an empty object
                    return Response(b"", 0)
            if "403" in text or "401" in text:
                raise RemoteAccessError(f"{self.shown}: access denied ({text})") from None
            raise Transient(text) from None
        want = max(0, min(end, meta["size"]) - start)
        if len(data) != want:
            raise Transient(f"the body was cut short ({len(data)} of {want} bytes)")
        modified = meta.get("last_modified")
        return Response(data, int(meta["size"]), meta.get("e_tag"),
                        modified.isoformat() if modified is not None else None)

    def after_fork(self) -> None:
        self._store = self._make_store()  # a fresh client: no connection of the parent's

    def close(self) -> None:
        self._store = None


def _first_line(exc: BaseException, limit: int = 200) -> str:
    """The cause of an obstore error without the request URL's query (it can carry a token)."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    out = []
    for word in text.split():
        if "://" in word and "?" in word:
            word = word.split("?", 1)[0] + "?<redacted>"
        out.append(word)
    text = " ".join(out)
    return text if len(text) <= limit else text[:limit - 3] + "..."
