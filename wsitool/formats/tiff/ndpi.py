"""The Hamamatsu NDPI layout: which IFDs are levels, macro and map, its metadata, and checks of its JPEG tags (floor 3).

Sources: OpenSlide's Hamamatsu format notes (openslide.org/formats/hamamatsu)
and tifffile's NDPI support (``TiffFile.is_ndpi``, ``TiffPage.ndpi_tags``,
``tifffile.ndpi_jpeg_tile``), which parses the file:

* an NDPI is a TIFF whose first IFD carries the private tag 65420 (FileFormat);
* tag 65421 (SourceLens) of each IFD is the objective magnification its
  image was scanned at; -1 marks the macro image (the photo of the whole
  slide) and -2 the focus map, which OpenSlide does not expose;
* tags 65422 / 65423: the X / Y offset of the scan from the slide centre (nm);
* each pyramid level is one JPEG stream with restart markers; tag 65426
  (McuStarts) lists the byte offset of each restart interval inside that
  stream, with the high 32 bits of each in tag 65432 (McuStartsHighBytes)
  where needed; tifffile makes one segment per interval from them (see
  :attr:`wsitool.model.TileEncoding.jpeg_scan_segments`); below the stored
  levels OpenSlide lists levels decoded from the same intervals at 1/2, 1/4,
  1/8 (:mod:`.ndpi_scaled`);
* tag 65449: a property map, ``key=value`` lines separated by CR LF, which
  OpenSlide reports as ``hamamatsu.<key>`` as they are (a value keeps a lone
  CR, and the key is the text before the first ``=``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tifffile
from tifffile import DATATYPE

from ...errors import CorruptFileError
from .properties import num_str, positive_float

__all__ = ["is_ndpi", "source_lens", "associated_name", "is_map", "description_metadata", "check_page"]

SOURCE_LENS = 65421
X_OFFSET = 65422
Y_OFFSET = 65423
MCU_STARTS = 65426
MCU_STARTS_HIGH = 65432
PROPERTY_MAP = 65449
STRIP_OFFSETS = 273
STRIP_BYTE_COUNTS = 279
#: the tag types a property map of bytes may have (BYTE, ASCII, UNDEFINED)
_BYTE_TYPES = (DATATYPE.BYTE, DATATYPE.ASCII, DATATYPE.UNDEFINED)
_MACRO_LENS = -1.0
_MAP_LENS = -2.0


def is_ndpi(tiff: tifffile.TiffFile) -> bool:
    """True when tifffile recognised the file as an NDPI (tag 65420 in the first IFD)."""
    return bool(tiff.is_ndpi)


def source_lens(page: tifffile.TiffPage) -> float | None:
    """The SourceLens (tag 65421) of an IFD as a float, or None where absent or not a number."""
    try:
        value = float(page.tags.valueof(SOURCE_LENS))
    except (TypeError, ValueError):
        return None
    return value if np.isfinite(value) else None


def associated_name(page: tifffile.TiffPage) -> str | None:
    """``"macro"`` for the IFD whose SourceLens is -1, else None (a level, or the map)."""
    return "macro" if source_lens(page) == _MACRO_LENS else None


def is_map(page: tifffile.TiffPage) -> bool:
    """True for the focus map IFD (SourceLens -2): neither a level nor an associated image, as in OpenSlide."""
    return source_lens(page) == _MAP_LENS


def description_metadata(first: tifffile.TiffPage, read: Callable[[int, int], bytes],
                         props: dict[str, str]) -> tuple[None, None, float | None]:
    """Add the NDPI properties of the first IFD ``first`` to ``props``; return
    ``(mpp_x, mpp_y, objective power)``.

    Keys, named as OpenSlide 4 names them: ``hamamatsu.SourceLens`` (tag 65421),
    ``hamamatsu.XOffsetFromSlideCentre`` / ``YOffsetFromSlideCentre`` (65422 /
    65423, nanometres) and one ``hamamatsu.<key>`` per ``key=value`` line of the
    property map (tag 65449), read as raw bytes with ``read(offset, count)``
    (the slide's byte source) so that the values are kept byte for byte.
    NDPI gives no MPP of its own: (None, None), and the caller takes it from
    the TIFF resolution tags (centimetre units).  The objective power is the
    SourceLens when positive, else None.
    """
    lens = source_lens(first)
    if lens is not None:
        props["hamamatsu.SourceLens"] = num_str(lens)
    for code, key in ((X_OFFSET, "XOffsetFromSlideCentre"), (Y_OFFSET, "YOffsetFromSlideCentre")):
        value = first.tags.valueof(code)
        if isinstance(value, (int, np.integer)):
            props[f"hamamatsu.{key}"] = str(int(value))
    tag = first.tags.get(PROPERTY_MAP)
    if tag is not None and tag.value is not None and int(tag.dtype) in _BYTE_TYPES:
        count = int(tag.count)
        raw = tag.value.encode("latin-1", "replace") if count <= 4 else read(int(tag.valueoffset), count)
        for line in raw.split(b"\0", 1)[0].decode("latin-1").split("\r\n"):
            key, sep, value = line.partition("=")
            if sep and key:
                props[f"hamamatsu.{key}"] = value
    return None, None, (lens if positive_float(lens) else None)


def check_page(page: tifffile.TiffPage, file_size: int) -> None:
    """Refuse an IFD whose McuStarts cannot describe restart intervals of its JPEG stream.

    Checked for every IFD that has McuStarts (tag 65426), against the
    IFD's one strip (StripOffsets / StripByteCounts, the level's JPEG stream)
    and the file: the strip lies inside the file; the starts (with their high
    bytes, tag 65432, where present) are at least 1 (after the header),
    strictly increasing, and all inside the strip.  tifffile turns each start
    into a segment (offset, byte count); a start past the stream would make a
    segment past the file or a negative byte count.

    Raises:
        CorruptFileError: naming the IFD and what is wrong.
    """
    starts = page.tags.valueof(MCU_STARTS)
    if starts is None:
        return
    where = f"NDPI IFD {page.index}"
    offsets = page.tags.valueof(STRIP_OFFSETS)
    counts = page.tags.valueof(STRIP_BYTE_COUNTS)
    if offsets is None or counts is None or len(np.atleast_1d(offsets)) != 1 or len(np.atleast_1d(counts)) != 1:
        raise CorruptFileError(f"{where}: McuStarts (tag 65426) without exactly one JPEG strip")
    strip_offset = int(np.atleast_1d(offsets)[0])
    strip_count = int(np.atleast_1d(counts)[0])
    if strip_offset <= 0 or strip_count <= 0 or strip_offset + strip_count > file_size:
        raise CorruptFileError(f"{where}: JPEG stream at offset {strip_offset} (+{strip_count} bytes) "
                               f"lies outside the file ({file_size} bytes)")
    starts = np.atleast_1d(np.asarray(starts)).astype(np.uint64)
    high = page.tags.valueof(MCU_STARTS_HIGH)
    if high is not None:
        high = np.atleast_1d(np.asarray(high)).astype(np.uint64)
        if len(high) != len(starts):
            raise CorruptFileError(f"{where}: {len(high)} McuStartsHighBytes (tag 65432) for "
                                   f"{len(starts)} McuStarts (tag 65426)")
        starts = starts | (high << np.uint64(32))
    if len(starts) == 0:
        raise CorruptFileError(f"{where}: empty McuStarts (tag 65426)")
    first, last = int(starts[0]), int(starts.max())
    if first < 1 or last >= strip_count:
        bad = first if first < 1 or first >= strip_count else last
        raise CorruptFileError(f"{where}: McuStarts (tag 65426) entry {bad} lies outside the "
                               f"level's JPEG stream ({strip_count} bytes)")
    if len(starts) > 1 and not bool(np.all(starts[1:] > starts[:-1])):
        raise CorruptFileError(f"{where}: McuStarts (tag 65426) are not increasing")
