"""``openslide.quickhash-1``: OpenSlide's identity of a slide, shared pieces (floor 3).

OpenSlide gives every slide it opens a property ``openslide.quickhash-1``: the
hex SHA-256 of a small, format-chosen part of the file that is meant to stay the
same for the same slide and differ between slides (OpenSlide's source,
``openslide-private.h`` and ``openslide-hash.c``).  What is hashed depends on
the format; wsitool computes the same value as OpenSlide 4 for:

* TIFF-based slides (Aperio SVS, Hamamatsu NDPI, generic tiled TIFF):
  :mod:`wsitool.formats.tiff.quickhash` (the raw bytes of the smallest level,
  at most 5 MiB, then nine TIFF text tags of the first IFD);
* DICOM: :mod:`wsitool.formats.dicom.quickhash` (the Series Instance UID);
* Zeiss CZI: :mod:`wsitool.formats.czi` (the file header's two GUIDs, then the metadata XML).

The rules decide only from the file's own bytes.  Where OpenSlide would not
open a slide for a reason outside them (a compression its libtiff lacks, a
big-endian TIFF its parser refuses, a DICOM pixel layout it does not read),
wsitool still gives the value the rule yields; where the rule itself gives
none (OpenSlide's size limit, a TIFF format whose choice wsitool does not
reproduce), the slide has no such property.

A text value enters the hash as OpenSlide's ``_openslide_hash_string`` feeds
it (``openslide-hash.c``): its bytes up to the first NUL, then one NUL byte; a
missing value is the empty string (so a single NUL byte).
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["KEY", "feed_string"]

#: The property's name (``OPENSLIDE_PROPERTY_NAME_QUICKHASH1``, openslide.h).
KEY = "openslide.quickhash-1"


class _Hasher(Protocol):
    def update(self, data: bytes, /) -> None: ...


def feed_string(hasher: _Hasher, value: bytes | None) -> None:
    """Add the text ``value`` to ``hasher`` as OpenSlide does: its bytes up to the first
    NUL, and a NUL; None (a missing value) adds a single NUL."""
    text = (value or b"").split(b"\0", 1)[0]
    hasher.update(text + b"\0")
