"""Open a slide location, a local path or a URL, as a byte source (floor 1)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import InvalidOptionError, WsiError
from .local import LocalFile
from .source import ByteSource
from .urls import redact, scheme_of

if TYPE_CHECKING:  # (the remote stack is imported with the first URL)
    from .remote import StorageOptions

__all__ = ["open_source"]


def open_source(location: str | os.PathLike,
                storage_options: Mapping[str, Any] | StorageOptions | None = None) -> ByteSource:
    """The :class:`ByteSource` of a local path or a slide URL.

    ``http://`` / ``https://`` URLs are read by :mod:`.remote.transports.http`; ``s3://``,
    ``gs://`` (``gcs://``), ``az://`` (``abfs://``, ``abfss://``, ``azure://``) by
    :mod:`.remote.transports.objectstore`; both through :class:`~wsitool.storage.remote.RemoteSource`.
    ``storage_options``: the generic keys of :class:`~wsitool.storage.remote.RemoteOptions`
    (``timeout``, ``operation_timeout``, ``retries``, ``concurrency``) and the
    transport's own, as a mapping or already parsed (:class:`~wsitool.storage.remote.StorageOptions`);
    only for URLs.

    Raises:
        FileNotFoundError, PermissionError, OSError: a local path, as ``os.open``.
        RemoteNotFoundError, RemoteAccessError, RemoteUnavailableError: the URL's first request.
        WsiError: ``storage_options`` for a local path, a bad option, or the
            ``wsitool[remote]`` extra not installed.
    """
    scheme = scheme_of(location)
    if scheme is None:
        if storage_options:
            raise InvalidOptionError(f"{os.fspath(location)}: storage options apply to URLs only")
        return LocalFile(location)
    if scheme.startswith("dicomweb+"):
        raise WsiError(f"{redact(str(location))}: a DICOMweb series is opened with open_slide, "
                       "not as one file")
    from .remote import RemoteSource, StorageOptions, Transport

    url = str(location)
    shown = redact(url)
    parsed = StorageOptions.parse(storage_options)
    options, generic = parsed.transport_options(), parsed.remote
    transport: Transport
    if scheme in ("http", "https"):
        from .remote.transports.http import HttpTransport

        transport = HttpTransport(url, shown, options, maxsize=generic.concurrency + 8, timeout=generic.timeout,
                                  total=generic.operation_timeout)
    else:
        from .remote.transports.objectstore import ObjectStoreTransport

        transport = ObjectStoreTransport(url, shown, options, timeout=generic.timeout,
                                         total=generic.operation_timeout)
    try:
        return RemoteSource(url, transport, generic)
    except BaseException:
        transport.close()
        raise
