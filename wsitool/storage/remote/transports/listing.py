"""Listings of the objects under a bucket prefix (S3, GCS, Azure), retried like reads (floor 1).

:func:`list_keys` pages through the keys under a prefix with obstore's ``list`` (one request a
page); :func:`list_objects` gives their URLs (``wsitool serve`` reading a prefix of slides;
:class:`~wsitool.storage.prefix.Prefix` for a DICOM series stored as objects).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ....errors import RemoteAccessError, RemoteNotFoundError, RemoteUnavailableError, WsiError
from ..options import RemoteOptions, StorageOptions
from ..status import retry_pause
from .objectstore import BucketURL, make_store
from .obstore_client import enter_runtime, first_line, obstore_module, status_of

__all__ = ["list_keys", "list_objects"]


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
    enter_runtime(where.shown, where.protocol)
    deadline = time.monotonic() + options.operation_timeout
    attempt = 0
    while True:
        try:
            return sorted(_list_once(store, where, limit))
        except _Transient as exc:
            attempt += 1
            pause = retry_pause(attempt, options.backoff)
            if attempt > options.retries or time.monotonic() + pause > deadline:
                raise RemoteUnavailableError(
                    f"{where.shown}: listing failed ({exc}; gave up after {attempt} attempts)") from None
            time.sleep(pause)


def _list_once(store: Any, where: BucketURL, limit: int | None) -> list[tuple[str, int]]:
    """One listing of the keys under ``where.key`` (up to ``limit + 1``); errors mapped to
    wsitool's, :class:`_Transient` for those worth retrying."""
    exc_mod = obstore_module().exceptions
    found: list[tuple[str, int]] = []
    try:
        for chunk in obstore_module().list(store, prefix=where.key or None, chunk_size=1000):
            found.extend((str(meta["path"]), int(meta["size"])) for meta in chunk)
            if limit is not None and len(found) > limit:
                break
    except (FileNotFoundError, exc_mod.NotFoundError):
        raise RemoteNotFoundError(where.shown, "no such bucket") from None
    except (exc_mod.PermissionDeniedError, exc_mod.UnauthenticatedError) as exc:
        raise RemoteAccessError(f"{where.shown}: access denied ({first_line(exc, 120)})") from None
    except (exc_mod.UnknownConfigurationKeyError, exc_mod.InvalidPathError) as exc:
        raise WsiError(f"{where.shown}: {first_line(exc)}") from None
    except (exc_mod.BaseError, OSError, TimeoutError, ConnectionError) as exc:
        text = first_line(exc, 160)
        code = status_of(str(exc))
        if code in (401, 403):
            raise RemoteAccessError(f"{where.shown}: access denied ({text})") from None
        if code == 404 or "NoSuchBucket" in text:
            raise RemoteNotFoundError(where.shown, "no such bucket") from None
        raise _Transient(f"HTTP {code}" if code else text) from None
    return found


class _Transient(Exception):
    """A listing failure worth retrying (timeout, reset, 5xx)."""


def list_objects(url: str, storage_options: Mapping[str, Any] | StorageOptions | None = None) -> list[str]:
    """The URLs of every object under the prefix ``url`` (``s3://bucket/prefix/``), sorted.

    ``url`` is ``s3://``, ``gs://`` or ``az://`` (and their aliases) with a bucket
    (container) and an optional prefix ending in ``/`` (``s3://bucket/`` lists the
    whole bucket).  The listing is recursive (keys in sub-prefixes come too); each
    URL returned is ``scheme://bucket/key`` with the key as stored (the query of
    ``url``, if any, is not carried over).  ``storage_options`` as for
    :func:`~wsitool.storage.open_source` (a mapping, or a parsed
    :class:`~wsitool.storage.remote.options.StorageOptions`); ``timeout``, ``operation_timeout``,
    ``retries`` and ``backoff`` bound the listing's requests (:func:`list_keys`).

    Raises:
        RemoteNotFoundError: the bucket does not exist, or nothing is stored under the prefix.
        RemoteAccessError: access denied, missing or expired credentials.
        RemoteUnavailableError: the store kept failing (timeouts, 5xx, resets).
        InvalidOptionError: a bad storage option.
        WsiError: not an object-store URL, obstore not installed.
    """
    where = BucketURL.parse(url, "bucket/prefix/")
    options = StorageOptions.parse(storage_options)
    generic = options.remote
    keys = list_keys(make_store(where, options.transport_options(), generic.timeout, generic.operation_timeout),
                     where, generic)
    if not keys:
        raise RemoteNotFoundError(where.shown, "no object under this prefix")
    return [where.url_of(key) for key, _ in keys]
