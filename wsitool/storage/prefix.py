"""The objects directly under a bucket prefix, listed once and opened as remote byte sources (floor 1).

A URL of an object store that ends in ``/`` (``s3://bucket/series/``,
``gs://bucket/series/``, ``az://container/series/``) names a prefix: the
objects directly under it are read like the files of a local folder (a DICOM
series stored one file per instance).  :class:`Prefix` lists it and opens each
object it is asked for as a :class:`~wsitool.storage.remote.RemoteSource`
through one shared obstore client (one connection pool for the whole series).

Costs and bounds:

* **Listing**: ``obstore.list`` pages through the keys under the prefix (S3 and
  GCS answer up to 1,000 keys a request, Azure 5,000), so a prefix of up to
  :data:`MAX_OBJECTS` keys is listed in one request.  The listing stops as soon
  as more than :data:`MAX_OBJECTS` keys were seen, and the prefix is refused:
  every object directly under it may cost a request at open, and a prefix that
  large is a study, a collection or a whole bucket, not one slide.  Keys under
  deeper prefixes (``series/sub/x``) count towards the bound but are not read
  (a local folder's sub-folders are not either).
* **Each object**: opening its source is one ranged GET of its first 64 KiB
  (:data:`~wsitool.storage.remote.HEAD_BYTES`), which both tells what it is
  (a DICOM file has "DICM" at byte 128) and holds, for most instances, the whole
  header.  Objects shorter than 132 bytes are passed over without a request.

Retries, timeouts and error classes are those of
:class:`~wsitool.storage.remote.RemoteSource` for the objects; the listing is
retried ``retries`` times on a transient failure.  Messages name the prefix
through :func:`~wsitool.storage.urls.redact` only.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from collections.abc import Mapping
from typing import Any

from ..errors import UnsupportedFormatError, WsiError
from .remote import RemoteSource, StorageOptions
from .remote.transports.listing import list_keys
from .remote.transports.objectstore import BUCKET_SCHEMES, BucketURL, ObjectStoreTransport, make_store
from .urls import redact, scheme_of

__all__ = ["MAX_OBJECTS", "MIN_OBJECT_BYTES", "Prefix", "PrefixObject", "is_prefix_url"]

#: Keys listed under one prefix at most (one page of an S3 or GCS listing); more is refused.
MAX_OBJECTS = 1000
#: Objects shorter than this are passed over unread (a DICOM file's magic ends at byte 132).
MIN_OBJECT_BYTES = 132


def is_prefix_url(location: object) -> bool:
    """True when ``location`` is an ``s3://``, ``gs://`` or ``az://`` URL (or an alias)
    whose path ends in ``/``: a prefix, read as a folder."""
    scheme = scheme_of(location)
    if scheme is None or scheme not in BUCKET_SCHEMES:
        return False
    return urllib.parse.urlsplit(str(location)).path.endswith("/")


@dataclasses.dataclass(frozen=True)
class PrefixObject:
    """One object directly under a prefix: its key, URL (``scheme://bucket/key``), the URL as
    messages show it, and its size in bytes."""

    key: str
    url: str
    shown: str
    size: int


class Prefix:
    """The objects directly under the prefix ``url`` of an object store.

    Args:
        url: ``s3://bucket/prefix/`` (``gs://``, ``az://`` and their aliases), ending in ``/``.
        storage_options: as for :func:`~wsitool.storage.open_source` (the generic keys
            ``timeout``, ``operation_timeout``, ``retries``, ``concurrency`` and the store's own;
            a mapping, or already parsed: :class:`~wsitool.storage.remote.StorageOptions`).

    Attributes:
        shown: the prefix URL as messages show it.
        protocol: ``"s3"``, ``"gs"`` or ``"az"``.
        options: the generic :class:`~wsitool.storage.remote.RemoteOptions` every object is read with.
        listed: objects directly under the prefix, after :meth:`objects`.
        deeper: keys seen under deeper prefixes (not read), after :meth:`objects`.
        list_requests: listing requests made (pages of up to 1,000 keys; S3 and GCS), after :meth:`objects`.

    Raises:
        WsiError: not a prefix URL, a bad storage option, or obstore not installed.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | StorageOptions | None = None):
        self.shown = redact(url)
        if not is_prefix_url(url):
            raise WsiError(f"{self.shown}: not an s3://, gs:// or az:// prefix ending in '/'")
        self._where = BucketURL.parse(url, "bucket/prefix/")
        self.protocol = self._where.protocol
        self.key_prefix = self._where.key
        parsed = StorageOptions.parse(storage_options)
        self.options = parsed.remote
        self._transport_options = parsed.own
        self._store: Any = make_store(self._where, parsed.transport_options(), self.options.timeout,
                                      self.options.operation_timeout)
        self.deeper = 0
        self.listed = 0
        self.list_requests = 0

    def objects(self) -> list[PrefixObject]:
        """The objects directly under the prefix, by key (at most :data:`MAX_OBJECTS` keys listed).

        Raises:
            UnsupportedFormatError: more than :data:`MAX_OBJECTS` keys under the prefix.
            RemoteNotFoundError: no such bucket.  RemoteAccessError: access denied.
            RemoteUnavailableError: the listing kept failing after the retries.
        """
        metas = list_keys(self._store, self._where, self.options, limit=MAX_OBJECTS)
        self.list_requests = 1
        if len(metas) > MAX_OBJECTS:
            raise UnsupportedFormatError(f"{self.shown}: more than {MAX_OBJECTS} objects under the prefix: not "
                                         "one slide; give the prefix of one DICOM series")
        out = []
        self.deeper = 0
        for key, size in metas:
            rest = key[len(self.key_prefix):]
            if not rest or rest.endswith("/"):
                continue  # the prefix's own marker object, a "folder" marker
            if "/" in rest:
                self.deeper += 1
                continue
            url = self._where.url_of(key)
            out.append(PrefixObject(key, url, redact(url), size))
        self.listed = len(out)
        return out

    def open(self, obj: PrefixObject) -> RemoteSource:
        """The byte source of ``obj`` (one ranged GET of its first 64 KiB), through the prefix's
        client; the caller closes it.

        Raises:
            RemoteNotFoundError, RemoteAccessError, RemoteUnavailableError: its first request failed.
        """
        transport = ObjectStoreTransport(obj.url, obj.shown, dict(self._transport_options),
                                         timeout=self.options.timeout, store=self._store,
                                         total=self.options.operation_timeout)
        try:
            return RemoteSource(obj.url, transport, dataclasses.replace(self.options))
        except BaseException:
            transport.close()
            raise

    def close(self) -> None:
        """Drop the listing's client (the sources opened keep theirs until they are closed)."""
        self._store = None

