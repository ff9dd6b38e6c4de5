"""``storage_options`` read once: the network settings every remote slide has, the keys a
transport takes, and the values of options that take text or a yes/no (floor 1).

:class:`StorageOptions` is what the storage layer receives: :meth:`StorageOptions.parse` splits a
``storage_options`` mapping once, where it enters storage (:func:`~wsitool.storage.open_source`,
:class:`~wsitool.storage.prefix.Prefix`,
:func:`~wsitool.storage.remote.transports.listing.list_objects`, the DICOMweb client), into the
generic :class:`RemoteOptions` (timeouts, retries, concurrency, back-off) and the keys left for
the transport, which reads them itself (HTTP headers, TLS verification, a bucket's
credentials).  An already parsed :class:`StorageOptions` passes through unchanged.

``--storage-option KEY=VALUE`` reads VALUE as JSON when it parses (so ``secret=1234`` arrives as
the number 1234, ``token=true`` as True), and the Python API takes any value; the clients want
text for keys, secrets, tokens, endpoints and names (obstore refuses a number with a
``TypeError``).  :func:`option_text` gives such a value as the text it was written as;
:func:`option_flag` reads a yes/no option.  Neither ever shows the value in an error: it may
be a secret.

Standard library only, and :mod:`wsitool.errors`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
from collections.abc import Mapping
from typing import Any

from ...errors import InvalidOptionError

__all__ = ["CONCURRENCY", "MAX_CONCURRENCY", "RemoteOptions", "StorageOptions", "option_text", "option_flag",
           "option_number"]

#: Default number of requests in flight per slide for advised (tile) ranges.
CONCURRENCY = 16
#: Most requests in flight per slide that ``concurrency`` may ask for (each one a thread and a pooled connection).
MAX_CONCURRENCY = 256


@dataclasses.dataclass
class RemoteOptions:
    """Network settings of one remote slide (the generic keys of ``storage_options``).

    Attributes:
        timeout: seconds to connect, and that a request may wait for its next bytes.
        operation_timeout: seconds one read (a region, a metadata read) may take in all,
            retries included; also the most one request may take (obstore).
        retries: attempts after the first for a transient failure.
        concurrency: requests in flight for one slide's advised ranges.
        backoff: seconds before the first retry (doubled each time, with jitter, at most 8 s).
    """

    timeout: float = 20.0
    operation_timeout: float = 120.0
    retries: int = 4
    concurrency: int = CONCURRENCY
    backoff: float = 0.25

    KEYS = ("timeout", "operation_timeout", "retries", "concurrency", "backoff")

    @classmethod
    def take(cls, options: dict) -> RemoteOptions:
        """The generic settings popped out of ``options`` (the rest stays for the transport).

        Raises:
            WsiError: a value that is not a positive number (retries: a non-negative integer;
                concurrency: at most :data:`MAX_CONCURRENCY`).
        """
        out = cls()
        for key in cls.KEYS:
            if key not in options:
                continue
            raw = options.pop(key)
            value = option_number(key, raw)
            if key in ("retries", "concurrency"):
                if not value.is_integer():  # 1.5 retries was silently 1
                    raise InvalidOptionError(f"storage option {key}: expected a whole number, got {raw!r}")
                value = int(value)
            if value < 0 or (value == 0 and key not in ("retries", "backoff")):
                raise InvalidOptionError(f"storage option {key}: must be positive, got {raw!r}")
            if key == "concurrency" and value > MAX_CONCURRENCY:
                raise InvalidOptionError(f"storage option concurrency: at most {MAX_CONCURRENCY}, got {raw!r}")
            setattr(out, key, value)
        return out


@dataclasses.dataclass(frozen=True)
class StorageOptions:
    """``storage_options`` split once: the generic settings and the transport's own keys.

    Attributes:
        remote: the :class:`RemoteOptions` (``timeout``, ``operation_timeout``, ``retries``,
            ``concurrency``, ``backoff``).
        own: every other key, as given, for the transport to read (read-only; each transport
            refuses the keys it does not take).
        keys: every key given (a generic key set to its default too).
    """

    remote: RemoteOptions = dataclasses.field(default_factory=RemoteOptions)
    own: Mapping[str, Any] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    keys: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, given: Mapping[str, Any] | StorageOptions | None) -> StorageOptions:
        """``given`` read once (an already parsed one is returned as it is; None: no option).

        Raises:
            InvalidOptionError: ``given`` is not a mapping, or a generic key's value is bad
                (:meth:`RemoteOptions.take`).
        """
        if isinstance(given, StorageOptions):
            return given
        if given is not None and not isinstance(given, Mapping):
            raise InvalidOptionError(f"storage options: expected KEY=VALUE options (a mapping), "
                                     f"got type {type(given).__name__}")
        rest = dict(given or {})
        keys = frozenset(rest)
        remote = RemoteOptions.take(rest)
        return cls(remote, types.MappingProxyType(rest), keys)

    def transport_options(self) -> dict[str, Any]:
        """A fresh copy of :attr:`own` (a transport pops the keys it reads from it)."""
        return dict(self.own)

    def __bool__(self) -> bool:
        """True where any option was given."""
        return bool(self.keys)


def _kind(value: Any) -> str:
    """The JSON name of ``value``'s type (``null``, ``a list``, ``an object``) or Python's."""
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object (KEY.NAME=VALUE)"
    return f"type {type(value).__name__}"


def option_number(key: str, raw: Any) -> float:
    """``raw``, the value of the number option ``key``, as a finite float (a number, or text that
    reads as one; not a boolean).

    Raises:
        InvalidOptionError: not a number, or not finite (exit 2).
    """
    try:
        if isinstance(raw, bool):
            raise TypeError
        value = float(raw)
    except (TypeError, ValueError):
        raise InvalidOptionError(f"storage option {key}: expected a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise InvalidOptionError(f"storage option {key}: must be a finite number, got {raw!r}")
    return value


def option_text(key: str, value: Any) -> str:
    """``value`` of the text option ``key`` as text: a string as is; a number or boolean as JSON
    writes it (``1234`` -> ``"1234"``, ``12.5`` -> ``"12.5"``, True -> ``"true"``), which is the
    text given on the command line (it keeps a number only where it reads back the same).

    Raises:
        InvalidOptionError: None, a list, a mapping or another type (exit 2).
    """
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return json.dumps(value)
    raise InvalidOptionError(f"storage option {key}: expected text, got {_kind(value)}")


def option_flag(key: str, value: Any) -> bool:
    """``value`` of the yes/no option ``key``: a boolean, ``0``/``1``, or ``true``/``false``,
    ``yes``/``no``, ``1``/``0`` in any case.

    Raises:
        InvalidOptionError: anything else (``anon=maybe`` was read as false; exit 2).
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "1", "false", "no", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    shown = repr(value) if isinstance(value, str) and len(value) <= 10 else _kind(value)
    raise InvalidOptionError(f"storage option {key}: expected true or false, got {shown}")
