"""Process-wide limits that protect against absurd requests and decompression bombs.

The limits are checked before any allocation or decode:

* ``max_region_pixels`` -- the largest region (width x height, in pixels of the
  requested level) that :meth:`Slide.read_region` will produce.  Default
  ``2**28`` (268 million pixels, 1 GiB as RGBA).
* ``max_region_bytes`` -- the largest output buffer in bytes.  Default
  ``2**31`` (2 GiB).
* ``max_export_pixels`` -- the largest level 0 (width x height) that
  :func:`wsitool.export_pyramid` writes when no ``max_pixels`` is given.
  Default ``2**33`` (8.6 gigapixels, e.g. 100,000 x 85,000, the size of a
  large 40x scan): a file declaring more (such as a 300 KB TIFF claiming
  100,000 x 100,000) is refused unless the caller raises the limit
  (``max_pixels=`` / ``--max-pixels``).  Export streams in bounded memory,
  so this guards time and disk, not RAM.
* ``max_tile_pixels`` -- the largest tile or strip (width x height) that will
  be decoded.  TIFF tiles are normally 256 to 1024 pixels square and strips a
  few rows of the image width, so the default ``2**26`` (64 million pixels)
  is generous; a file declaring more is refused instead of decoded.

Change the process default with :func:`set_limits`, or override it for the
current context only with the :func:`limits` context manager (a
:class:`contextvars.ContextVar`: other threads, and asyncio tasks started
elsewhere, keep their own limits); the CLI exposes ``--max-pixels``.  The
threads wsitool starts for a call (the decode pool of a region read, export's
reader and encoders, the threads of a batch read, Dask's threaded scheduler)
run in a copy of the caller's context, so they apply the caller's limits.

Ground floor (standard library only).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import threading
from collections.abc import Iterator

from ..errors import InvalidOptionError

__all__ = ["Limits", "get_limits", "set_limits", "limits"]


@dataclasses.dataclass(frozen=True)
class Limits:
    """Current limits; see the module docstring for the meaning of each field."""

    max_region_pixels: int = 2**28
    max_region_bytes: int = 2**31
    max_tile_pixels: int = 2**26
    max_export_pixels: int = 2**33


_lock = threading.Lock()
#: the process default (:func:`set_limits`)
_default = Limits()
#: this context's override (:func:`limits`), or None for the process default
_override: contextvars.ContextVar[Limits | None] = contextvars.ContextVar("wsitool_limits", default=None)

_LIMIT_NAMES = tuple(f.name for f in dataclasses.fields(Limits))


def get_limits() -> Limits:
    """Return the limits in force in the current context (a frozen :class:`Limits`):
    the innermost :func:`limits` block's, else the process default."""
    current = _override.get()
    return _default if current is None else current


def _checked(changes: dict[str, int | None]) -> dict[str, int]:
    """The changes that are not None, each checked to be a positive integer
    (else :class:`~wsitool.errors.InvalidOptionError`, a ``ValueError``)."""
    unknown = set(changes) - set(_LIMIT_NAMES)
    if unknown:
        raise TypeError(f"unknown limit(s): {sorted(unknown)}")
    kept = {k: v for k, v in changes.items() if v is not None}
    for name, value in kept.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise InvalidOptionError(f"{name} must be a positive integer, got {value!r}")
    return kept


def set_limits(
    *,
    max_region_pixels: int | None = None,
    max_region_bytes: int | None = None,
    max_tile_pixels: int | None = None,
    max_export_pixels: int | None = None,
) -> Limits:
    """Change the process default limits; arguments left ``None`` keep their value.

    The default applies in every thread and context that has no :func:`limits`
    block of its own in force (inside one, that block's values stay in force
    until it ends).  Returns the previous default :class:`Limits`.

    Raises:
        InvalidOptionError: a value that is not a positive integer (also a ValueError).
    """
    global _default
    changes = _checked(dict(max_region_pixels=max_region_pixels, max_region_bytes=max_region_bytes,
                            max_tile_pixels=max_tile_pixels, max_export_pixels=max_export_pixels))
    with _lock:
        previous = _default
        _default = dataclasses.replace(_default, **changes)
    return previous


@contextlib.contextmanager
def limits(**changes: int) -> Iterator[Limits]:
    """Context manager: the limits in force with ``changes`` applied, for the current
    context only, until the block ends (then the outer value is back).

    Other threads keep their limits; the threads wsitool starts for a call made
    inside the block run in a copy of this context and apply these limits.
    Blocks nest.  Yields the :class:`Limits` in force inside the block.

    Raises:
        InvalidOptionError: a value that is not a positive integer (also a ValueError).
        TypeError: an unknown limit name.
    """
    inner = dataclasses.replace(get_limits(), **_checked(dict(changes)))
    token = _override.set(inner)
    try:
        yield inner
    finally:
        _override.reset(token)
