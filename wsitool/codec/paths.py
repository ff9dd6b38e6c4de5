"""Which decode paths region reads may take (:class:`DecodePaths`): the compiled JPEG loop,
sub-region decodes, OpenJPEG's window decoder, libjpeg-turbo's own API.  Every combination
gives the same pixels; these are the switches that parity tests and diagnosis use to pin a
read to the reference path (``WSITOOL_NATIVE=0`` in the environment turns the compiled loop
off for the process).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Iterator

__all__ = ["DecodePaths", "get_decode_paths", "decode_paths"]

_lock = threading.Lock()


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
        libjpeg: decode JPEG tiles on the CPU through libjpeg-turbo's own API in
            the compiled extension (``wsitool._jpegloop``: the compiled loop, and
            ``decode_jpeg`` for the Python path), where it is built: corrupt
            entropy-coded data is then an error.  When False (or where the
            extension is absent) nvImageCodec's CPU backend decodes them, the same
            libjpeg-turbo with the same pixels, but it decodes corrupt data
            without a word; the compiled loop is then not used either.
            ``WSITOOL_NATIVE=0`` leaves this on (it turns off only the loop).
    """

    native: bool = True
    roi_decode: bool = True
    force_scratch: bool = False
    openjpeg: bool = True
    libjpeg: bool = True


def _paths_from_environment() -> DecodePaths:
    flag = os.environ.get("WSITOOL_NATIVE", "1").strip().lower()
    return DecodePaths(native=flag not in ("0", "false", "no", "off"))


#: (``WSITOOL_NATIVE`` is read once, when wsitool is imported, as before any read.)
_paths: DecodePaths = _paths_from_environment()


def get_decode_paths() -> DecodePaths:
    """The :class:`DecodePaths` in force."""
    return _paths


@contextlib.contextmanager
def decode_paths(**changes: bool) -> Iterator[DecodePaths]:
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
