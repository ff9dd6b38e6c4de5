"""TIFF tags as tifffile hands them over: checked for type, count and range before use (floor 3).

tifffile keeps whatever type and count a file declares, so a mutated entry can
hand back a string, a float or a tuple where an integer belongs; this module
turns each such fault into one :class:`~wsitool.errors.CorruptFileError` naming
the IFD and the tag.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import tifffile

from ...errors import CorruptFileError

__all__ = ["MALFORMED", "check_page", "description", "enum_name"]


def enum_name(value: object) -> str:
    """The name of a tifffile enum member (``"JPEG"``), or the text of a value it has no member for."""
    return getattr(value, "name", str(value))


#: Exception types that tifffile (or our own arithmetic on its values) raises
#: for tags of the wrong type, count or range; they mean "malformed file".
MALFORMED = (ValueError, TypeError, OverflowError, ZeroDivisionError, IndexError, KeyError,
              AttributeError, UnicodeError, EOFError, OSError, struct.error)


# Tags read as one unsigned integer (TIFF 6.0 section 8 gives them SHORT or
# LONG; BigTIFF adds LONG8).  tifffile keeps whatever type and count the file
# declares, so a mutated entry can hand back a string, a float or a tuple.
SCALAR_INT_TAGS = (
    ("imagewidth", "ImageWidth"), ("imagelength", "ImageLength"), ("tilewidth", "TileWidth"),
    ("tilelength", "TileLength"), ("rowsperstrip", "RowsPerStrip"),
    ("samplesperpixel", "SamplesPerPixel"), ("compression", "Compression"),
    ("photometric", "PhotometricInterpretation"), ("planarconfig", "PlanarConfiguration"),
    ("subfiletype", "NewSubfileType"), ("imagedepth", "ImageDepth"),
    ("bitspersample", "BitsPerSample"), ("sampleformat", "SampleFormat"),
    ("predictor", "Predictor"),
)


def is_uint(value: object, limit: int = 2**63) -> bool:
    """True for one integer (not a bool) in ``0 .. limit - 1``."""
    return (isinstance(value, (int, np.integer)) and not isinstance(value, bool)
            and 0 <= int(value) < limit)


def check_page(page: tifffile.TiffPage, ifd: int) -> None:
    """Refuse an IFD whose structural tags have the wrong type, count or range.

    Checked (TIFF 6.0 section 8, TIFF Technical Note 2): the scalar tags of
    :data:`SCALAR_INT_TAGS` are one non-negative integer; Tile/Strip offsets
    and byte counts are sequences of non-negative integers; JPEGTables is a
    byte string; ExtraSamples are integers; a palette image (photometric 3)
    has a ``(3, N)`` ColorMap.  This turns every "tag of the wrong shape" fault
    into one :class:`CorruptFileError` naming the IFD and the tag, instead of a
    TypeError deep inside tifffile or numpy.
    """
    where = f"IFD {ifd}"
    for attr, tag in SCALAR_INT_TAGS:
        value = getattr(page, attr, 0)
        if not is_uint(value, 2**32 if attr not in ("imagewidth", "imagelength") else 2**63):
            raise CorruptFileError(
                f"{where}: tag {tag} holds {str(value)[:40]!r}, expected one non-negative integer"
            )
    for attr, tag in (("dataoffsets", "TileOffsets/StripOffsets"),
                      ("databytecounts", "TileByteCounts/StripByteCounts")):
        values = getattr(page, attr, ())
        ok = isinstance(values, (tuple, list, np.ndarray))
        if ok and len(values):
            try:
                arr = np.asarray(values)
            except (ValueError, TypeError, OverflowError):
                arr = None
            ok = (arr is not None and arr.ndim == 1 and arr.dtype.kind in "iu"
                  and int(arr.min()) >= 0)
        if not ok:
            raise CorruptFileError(f"{where}: tag {tag} does not hold non-negative integers")
    tables = page.jpegtables
    if tables is not None and not isinstance(tables, (bytes, bytearray)):
        raise CorruptFileError(f"{where}: tag JPEGTables is not a byte string")
    extras = page.extrasamples
    if extras is not None and not all(is_uint(v) for v in np.atleast_1d(extras).tolist()):
        raise CorruptFileError(f"{where}: tag ExtraSamples does not hold integers")
    if int(page.photometric) == tifffile.PHOTOMETRIC.PALETTE:
        cmap = page.colormap
        if not (isinstance(cmap, np.ndarray) and cmap.ndim == 2 and cmap.shape[0] == 3
                and cmap.shape[1] >= 2 and np.issubdtype(cmap.dtype, np.integer)):
            raise CorruptFileError(f"{where}: palette image without a valid (3, N) ColorMap")


def description(page: Any) -> str:
    """The ImageDescription of a tifffile page (``""`` where it has none)."""
    desc = page.description if hasattr(page, "description") else ""
    return desc or ""
