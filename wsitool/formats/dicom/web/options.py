"""A DICOMweb client's storage options, read once (floor 3).

Besides the generic keys every remote slide takes (:class:`~wsitool.storage.remote.RemoteOptions`:
``timeout``, ``operation_timeout``, ``retries``, ``concurrency``, ``backoff``), a DICOMweb series
takes ``headers`` (a dict sent with every request), ``verify`` (False, or the path of a CA file),
``username`` and ``password`` (HTTP basic; also taken from the URL's ``user:password@``),
``token`` (bearer), ``frame_cache_mb`` (the frame cache's budget, default 64) and
``metadata_limit_mb`` (the most read of a JSON or bulk data answer, default
:data:`~wsitool.formats.dicom.web.client.JSON_LIMIT`: 64).  Credentials are sent, never shown.
"""

from __future__ import annotations

import base64
import dataclasses
import urllib.parse
from collections.abc import Mapping
from typing import Any

from ....errors import InvalidOptionError
from ....storage.remote.options import RemoteOptions, StorageOptions, option_number, option_text
from ....storage.remote.transports.http import verify_option
from ....storage.urls import SeriesUrl

__all__ = ["CLIENT_KEYS", "ClientOptions"]

#: The keys of a DICOMweb client's own (beside the generic ones).
CLIENT_KEYS = ("headers", "verify", "username", "password", "token", "frame_cache_mb", "metadata_limit_mb")


@dataclasses.dataclass(frozen=True)
class ClientOptions:
    """What a :class:`~wsitool.formats.dicom.web.client.DicomWebClient` is told.

    Attributes:
        remote: the generic :class:`~wsitool.storage.remote.RemoteOptions`.
        base: the service root without user information.
        headers: the headers of every request (``Authorization`` included, where given).
        verify: True, False (no TLS verification) or a CA file's path.
        frame_cache_bytes: the frame cache's budget.
        json_limit: the most bytes read of a JSON or bulk data answer.
    """

    remote: RemoteOptions
    base: str
    headers: dict[str, str]
    verify: bool | str
    frame_cache_bytes: int
    json_limit: int

    @classmethod
    def parse(cls, url: SeriesUrl, options: Mapping[str, Any] | StorageOptions | None,
              json_limit: int) -> ClientOptions:
        """The options of a client of the series ``url`` (``json_limit``: the default of
        ``metadata_limit_mb``, in bytes).

        Raises:
            InvalidOptionError: an unknown key or a bad value (a secret is never shown).
        """
        parsed = StorageOptions.parse(options)
        own = parsed.own
        shown = url.shown
        unknown = sorted(set(own) - set(CLIENT_KEYS))
        if unknown:
            raise InvalidOptionError(f"{shown}: unknown storage option(s) for DICOMweb: {', '.join(unknown)}")
        if not isinstance(own.get("headers") or {}, dict):
            raise InvalidOptionError(f"{shown}: storage option headers: expected headers.NAME=VALUE")
        # text options: a number or boolean as typed (password=1234), never None or a list
        headers = {str(k): option_text(f"headers.{k}", v) for k, v in dict(own.get("headers") or {}).items()}
        parts = urllib.parse.urlsplit(url.base)
        user, password = (None if own.get(k) is None else option_text(k, own[k])
                          for k in ("username", "password"))
        if parts.username is not None and user is None:
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
        base = urllib.parse.urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))
        if own.get("token"):
            headers["Authorization"] = f"Bearer {option_text('token', own['token'])}"
        elif user is not None:
            pair = f"{user}:{password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        cache_bytes = _cache_bytes(own.get("frame_cache_mb", 64))
        limit = _megabytes(own.get("metadata_limit_mb"), "metadata_limit_mb", json_limit)
        verify = verify_option(shown, own.get("verify", True))  # (verify=false was taken as a CA file)
        return cls(parsed.remote, base, headers, verify, cache_bytes, limit)


def _cache_bytes(raw: Any) -> int:
    """The ``frame_cache_mb`` option (MiB, 0 or more) in bytes.

    Raises:
        InvalidOptionError: not a number, negative, or past 2**40 MiB.
    """
    try:
        if isinstance(raw, bool):
            raise TypeError
        cache_mb = float(raw)
    except (TypeError, ValueError, OverflowError):
        raise InvalidOptionError(f"storage option frame_cache_mb: expected a number, got "
                                 f"{raw!r:.40}") from None
    if not 0 <= cache_mb < 2**40:  # (NaN and infinity included: int() of them raised)
        raise InvalidOptionError(f"storage option frame_cache_mb: expected 0 or more MiB, got {raw!r:.40}")
    return int(cache_mb * (1 << 20))


def _megabytes(raw: Any, name: str, default: int) -> int:
    """The storage option ``name`` (MiB, a positive number) in bytes; ``default`` where not given.

    Raises:
        InvalidOptionError: not a positive number.
    """
    if raw is None:
        return default
    value = option_number(name, raw)
    if not value > 0:
        raise InvalidOptionError(f"storage option {name}: must be a positive number, got {raw!r}")
    return int(value * (1 << 20))
