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

Change them with :func:`set_limits` (process-wide) or temporarily with the
:func:`limits` context manager; the CLI exposes ``--max-pixels``.

The module also holds :class:`DecodePaths`, which decode paths region reads may
take (the compiled JPEG loop, sub-region decodes): the switches that parity
tests and diagnosis use to pin a read to the reference path.

Ground floor (standard library only).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading

__all__ = ["Limits", "get_limits", "set_limits", "limits", "DecodePaths", "get_decode_paths",
           "decode_paths"]


@dataclasses.dataclass(frozen=True)
class Limits:
    """Current limits; see the module docstring for the meaning of each field."""

    max_region_pixels: int = 2**28
    max_region_bytes: int = 2**31
    max_tile_pixels: int = 2**26
    max_export_pixels: int = 2**33


_lock = threading.Lock()
_current = Limits()


def get_limits() -> Limits:
    """Return the limits in force (a frozen :class:`Limits`)."""
    return _current


def set_limits(
    *,
    max_region_pixels: int | None = None,
    max_region_bytes: int | None = None,
    max_tile_pixels: int | None = None,
    max_export_pixels: int | None = None,
) -> Limits:
    """Change the process-wide limits; arguments left ``None`` keep their value.

    Returns the previous :class:`Limits`.  Raises ``ValueError`` for a value
    that is not a positive integer.
    """
    global _current
    changes = {
        k: v
        for k, v in dict(
            max_region_pixels=max_region_pixels,
            max_region_bytes=max_region_bytes,
            max_tile_pixels=max_tile_pixels,
            max_export_pixels=max_export_pixels,
        ).items()
        if v is not None
    }
    for name, value in changes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    with _lock:
        previous = _current
        _current = dataclasses.replace(_current, **changes)
    return previous


@contextlib.contextmanager
def limits(**changes: int):
    """Context manager: apply :func:`set_limits` changes, restore on exit."""
    previous = set_limits(**changes)
    try:
        yield get_limits()
    finally:
        global _current
        with _lock:
            _current = previous


@dataclasses.dataclass(frozen=True)
class DecodePaths:
    """Which decode paths region reads may take; every combination gives the same pixels.

    Fields:
        native: use the compiled JPEG tile loop (``wsitool._jpegloop``) where it
            applies.  Default from the environment when wsitool is imported:
            ``WSITOOL_NATIVE=0`` (or ``false``, ``no``, ``off``) turns it off.
        roi_decode: decode partial tiles as a sub-region of the code stream
            straight into the output; when False they are decoded whole into a
            scratch buffer and cropped (the reference the ROI path is pinned to).
        force_scratch: decode every nvImageCodec tile whole into scratch and
            copy (the reference of the in-place path).
        openjpeg: decode JPEG 2000 tiles through OpenJPEG's window decoder
            (:mod:`wsitool.codec.openjpeg`: only the code-blocks a partial tile
            needs) where libopenjp2 is available; when False they take the
            nvImageCodec path.
    """

    native: bool = True
    roi_decode: bool = True
    force_scratch: bool = False
    openjpeg: bool = True


def _paths_from_environment() -> DecodePaths:
    flag = os.environ.get("WSITOOL_NATIVE", "1").strip().lower()
    return DecodePaths(native=flag not in ("0", "false", "no", "off"))


#: (``WSITOOL_NATIVE`` is read once, when wsitool is imported, as before any read.)
_paths: DecodePaths = _paths_from_environment()


def get_decode_paths() -> DecodePaths:
    """The :class:`DecodePaths` in force."""
    return _paths


@contextlib.contextmanager
def decode_paths(**changes: bool):
    """Context manager: change :class:`DecodePaths` fields process-wide; on exit each
    changed field gets back the value it had on entry (the other fields are left
    as they are then, so nested uses that change different fields compose).

    Raises:
        TypeError: an unknown field name.
    """
    global _paths
    unknown = set(changes) - {f.name for f in dataclasses.fields(DecodePaths)}
    if unknown:
        raise TypeError(f"unknown DecodePaths field(s): {sorted(unknown)}")
    with _lock:
        previous = {name: getattr(_paths, name) for name in changes}
        _paths = dataclasses.replace(_paths, **changes)
        current = _paths
    try:
        yield current
    finally:
        with _lock:
            _paths = dataclasses.replace(_paths, **previous)
