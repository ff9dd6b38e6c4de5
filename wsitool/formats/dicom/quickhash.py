"""``openslide.quickhash-1`` of a DICOM slide, equal to OpenSlide 4's (floor 3).

OpenSlide's DICOM format hashes no pixel data: the slide's identity is its
Series Instance UID (0020,000E), the UID every instance of the series shares,
fed to SHA-256 as text (its characters, without DICOM's trailing padding, then
one NUL byte; :func:`wsitool.formats.quickhash.feed_string`); the property is
the hex digest (OpenSlide's source, ``openslide-vendor-dicom.c``, ``dicom_open``).
It costs nothing to compute, so it is computed when the slide opens.  A series
without the UID (which OpenSlide does not open) has no property.
"""

from __future__ import annotations

import hashlib

from ..quickhash import KEY, feed_string

__all__ = ["KEY", "series_quickhash"]


def series_quickhash(series_uid: str) -> str | None:
    """The ``openslide.quickhash-1`` of the series with UID ``series_uid`` (as pydicom gives
    it, padding removed), or None for an empty UID."""
    uid = (series_uid or "").strip("\0 ")
    if not uid:
        return None
    hasher = hashlib.sha256()
    feed_string(hasher, uid.encode("utf-8", "surrogateescape"))
    return hasher.hexdigest()
