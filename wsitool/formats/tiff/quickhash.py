"""``openslide.quickhash-1`` of a TIFF-based slide, equal to OpenSlide 4's (floor 3).

The rule, in wsitool's words; the format facts come from OpenSlide's source
(``openslide.c``: the order in which formats are tried; ``openslide-decode-tifflike.c``:
``hash_tiff_level`` and ``_openslide_tifflike_init_properties_and_hash``; the
``*_detect`` and ``*_open`` of ``openslide-vendor-aperio.c``, ``-hamamatsu.c``,
``-generic-tiff.c``, ``-huron.c``, ``-trestle.c`` and the other TIFF formats:
which format wins and which IFD each hashes; ``openslide-hash.c``):

1. **The format OpenSlide reads the file as.**  OpenSlide tries its formats in
   a fixed order and keeps the first whose detection passes: NDPI (the file is
   an NDPI: tag 65420 in the first IFD), Trestle (Software starts with
   ``MedScan``, an ImageDescription, every IFD tiled), Aperio (first IFD tiled,
   its ImageDescription starts with ``Aperio``), Huron (first IFD tiled, Make
   starts with ``Huron``), Argos, Leica, Philips (Software ``Philips`` with a
   ``DPUfsImport`` description), Ventana, then generic TIFF
   (first IFD tiled).  Each format's mark and hashed IFD are its entry in
   :data:`wsitool.formats.tiff.vendors.VENDORS` (the table wsitool's own detection
   uses), read through :class:`Marks`.  wsitool hashes as NDPI, Trestle, Aperio, Huron, Leica
   (a Leica SCN namespace in the ImageDescription), Philips, Ventana (an ``iScan`` XMP packet)
   and generic TIFF do.  A file carrying the mark Argos detection looks for (an
   ``Argos.Scan.Metadata`` XML in tag 65000) gets no hash: Argos hashes more
   text, which wsitool does not reproduce.  Nor
   does a TIFF whose first IFD is not tiled (no format of OpenSlide reads it).
2. **The IFD hashed: the format's smallest level.**  Aperio, Huron, Trestle and Philips:
   the last tiled IFD in file order (their levels are the tiled IFDs).  Generic TIFF: among the
   tiled IFDs that are the first one or carry the reduced-resolution bit of
   NewSubfileType, the one with the smallest ImageWidth (the last of equals in
   file order).  Ventana: the narrowest of the IFDs whose ImageDescription holds
   ``level=``.  Leica: the IFD its SCN XML names (:func:`.leica.hashed_ifds`: the main
   image's or the macro's smallest dimension; its text tags those of level 0's first IFD).
   NDPI: among the IFDs with SourceLens (tag 65421) above 0 and focal plane (tag 65424) 0,
   the smallest ImageWidth (the first of equals).
   Only top-level IFDs count (no SubIFDs).
3. **Its bytes.**  The IFD's segments: TileOffsets / TileByteCounts when
   TileOffsets holds values, else StripOffsets / StripByteCounts (an NDPI
   level is one strip, its whole JPEG stream, not tifffile's restart
   intervals); both lists of one, non-zero length.  When the byte counts add up
   to more than 5 MiB (5 x 2**20) OpenSlide hashes nothing and the slide has
   no ``openslide.quickhash-1`` (it keeps open fast on non-pyramidal or
   huge-top-level files).  Otherwise the stored bytes of each segment, in the
   order of the tag, compressed as they are, go into one SHA-256.
4. **Then nine text tags of the first IFD** (Ventana: of level 0's IFD), in this order: ImageDescription,
   Make, Model, Software, DateTime, Artist, HostComputer, Copyright,
   DocumentName: for each, the property name (``tiff.ImageDescription``, ...)
   and then the tag's value, both as text (:func:`wsitool.formats.quickhash.feed_string`:
   bytes up to the first NUL, then a NUL).  A tag that is absent, empty, not of
   type ASCII, BYTE or UNDEFINED, or whose value lies outside the file counts as
   the empty string; a tag the IFD repeats counts with its last entry (tifffile
   writes a second ImageDescription, for one).  In an NDPI, OpenSlide reads every ASCII value through its
   value field as an offset, short ones included; so does wsitool.  No number
   tags are hashed.

The property is the hex digest.  Cost: which bytes to hash is decided when the
slide opens, from the tags tifffile parsed (plus a few bytes of the text tags
the format detection compares); the bytes (at most 5 MiB plus the text tags)
are read when the property is first asked for
(:class:`wsitool.formats.deferred.DeferredProperties`).  A slide whose hashed
segments do not lie inside the file, which OpenSlide refuses to open, gets no
property either.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import operator
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tifffile
from tifffile import DATATYPE

from ...errors import CorruptFileError
from ...ground.oserrors import raise_if_os_resource
from ...storage import ByteSource
from ..deferred import DeferredProperties
from ..quickhash import KEY, feed_string
from . import ndpi
from .tags import MALFORMED

__all__ = ["LIMIT", "QuickHash", "Marks", "plan", "with_quickhash", "last_tiled", "generic_level", "ndpi_level",
           "is_tiled"]

#: Most bytes of level data hashed; a smallest level larger than this gets no hash (OpenSlide's limit).
LIMIT = 5 << 20

#: (property name, tag code): the text tags hashed after the level's bytes, in OpenSlide's order.
TEXT_TAGS = (("tiff.ImageDescription", 270), ("tiff.Make", 271), ("tiff.Model", 272),
             ("tiff.Software", 305), ("tiff.DateTime", 306), ("tiff.Artist", 315),
             ("tiff.HostComputer", 316), ("tiff.Copyright", 33432), ("tiff.DocumentName", 269))

_TEXT_TYPES = (DATATYPE.BYTE, DATATYPE.ASCII, DATATYPE.UNDEFINED)  # the types OpenSlide reads as a string
_ASCII = DATATYPE.ASCII
_NEW_SUBFILE_TYPE = 254
_NDPI_FOCAL_PLANE = 65424
_TILE_TAGS = (324, 325)   # TileOffsets, TileByteCounts
_STRIP_TAGS = (273, 279)  # StripOffsets, StripByteCounts


@dataclasses.dataclass(frozen=True)
class QuickHash:
    """What to hash for a slide's ``openslide.quickhash-1``, decided at open.

    Attributes:
        segments: ``(offset, count)`` byte ranges of the smallest level, in hash order.
        texts: ``(property name, (offset, count) or None)`` for each text tag
            (None: hashed as the empty string).
    """

    segments: tuple[tuple[int, int], ...]
    texts: tuple[tuple[str, tuple[int, int] | None], ...]

    def runs(self) -> list[tuple[int, int]]:
        """The segments with empty ones left out and neighbours that touch merged (same bytes, fewer reads)."""
        runs: list[tuple[int, int]] = []
        for offset, count in self.segments:
            if count == 0:
                continue
            if runs and runs[-1][0] + runs[-1][1] == offset:
                runs[-1] = (runs[-1][0], runs[-1][1] + count)
            else:
                runs.append((offset, count))
        return runs

    def digest(self, source: ByteSource) -> str:
        """The hex SHA-256, reading the bytes through ``source`` (the slide's, still open).

        Raises:
            WsiError: the slide is closed.
            CorruptFileError: the file is shorter than when it was opened, or a read failed.
        """
        hasher = hashlib.sha256()
        runs = self.runs()
        with source.reading():
            source.advise(runs)
            try:
                for offset, count in runs:
                    hasher.update(self._read(source, offset, count))
                for name, where in self.texts:
                    feed_string(hasher, name.encode("ascii"))
                    feed_string(hasher, None if where is None else self._read(source, *where))
            except OSError as exc:
                raise_if_os_resource(exc)
                raise CorruptFileError(f"reading the bytes of {KEY} failed: {exc}") from None
        return hasher.hexdigest()

    def _read(self, source: ByteSource, offset: int, count: int) -> bytes:
        data = source.read(offset, count)
        if len(data) != count:
            raise CorruptFileError(f"{count} bytes at offset {offset} (for {KEY}) "
                                   f"lie past the end of the file")
        return data


def _value(tag: Any) -> Any:
    """A tifffile tag's value, as tifffile parsed it."""
    return tag.value


def with_quickhash(tiff: tifffile.TiffFile, pages: list[Any], source: ByteSource,
                   properties: dict[str, str], formats: Sequence[Any],
                   values: Callable[[Any], Any] = _value) -> Mapping[str, str]:
    """``properties`` with ``openslide.quickhash-1`` added as a deferred value where
    OpenSlide's rule gives the slide one (see the module docstring); else ``properties``.
    ``formats`` as for :func:`plan`; ``values(tag)`` gives a tifffile tag's value (a remote
    TIFF's tile tables that the parse left unread are read by
    :meth:`.tables.DeferredTables.values`)."""
    hashing = plan(tiff, pages, source, formats, values)
    if hashing is None:
        return properties
    return DeferredProperties(properties, {KEY: functools.partial(hashing.digest, source)})


def plan(tiff: tifffile.TiffFile, pages: list[Any], source: ByteSource, formats: Sequence[Any],
         values: Callable[[Any], Any] = _value) -> QuickHash | None:
    """What OpenSlide hashes for the TIFF ``tiff`` (tifffile's, with its top-level ``pages``;
    ``values`` as for :func:`with_quickhash`), or None where it hashes nothing (or reads the
    file as a format wsitool does not follow).  ``formats``: OpenSlide's formats in its
    detection order, each with ``openslide_mark(marks)`` and ``hashed_page(pages)``
    (:data:`wsitool.formats.tiff.vendors.VENDORS`)."""
    try:
        return _plan(tiff, pages, source, values, formats)
    except MALFORMED:  # a tag of the wrong type or count: no hash, the slide opens as before
        return None


def _plan(tiff: tifffile.TiffFile, pages: list[Any], source: ByteSource,
          values: Callable[[Any], Any], formats: Sequence[Any]) -> QuickHash | None:
    if not pages or not all(hasattr(p, "tags") for p in pages):
        return None
    marks = Marks(source, pages, bool(tiff.is_ndpi))
    fmt = next((f for f in formats if f.openslide_mark(marks)), None)
    if fmt is None:
        return None  # no format of OpenSlide reads it
    page = fmt.hashed_page(pages)
    if page is None:
        return None
    segments = _segments(page, source.size, values)
    if segments is None:
        return None
    first = fmt.hashed_text_page(pages)
    return QuickHash(segments=segments,
                     texts=tuple((name, marks.texts.where(first, code)) for name, code in TEXT_TAGS))


class Marks:
    """What OpenSlide's format detection looks at in a TIFF (module docstring, 1): the first
    IFD's tags, read raw, whether it is tiled, and whether tifffile found an NDPI.

    Attributes:
        pages: the top-level IFDs; first: the first of them; tiled: it is tiled;
        ndpi: the file is an NDPI; texts: the raw text reader.
    """

    def __init__(self, source: ByteSource, pages: list[tifffile.TiffPage], ndpi: bool):
        self.pages, self.first, self.ndpi = pages, pages[0], ndpi
        self.tiled = is_tiled(pages[0])
        self.texts = _Texts(source, ndpi)

    def starts(self, code: int, prefix: bytes) -> bool:
        """The first IFD's text tag ``code`` starts with ``prefix``."""
        return self.texts.starts(self.first, code, prefix)

    def contains(self, code: int, needle: bytes) -> bool:
        """The first IFD's text tag ``code`` holds ``needle``."""
        return self.texts.contains(self.first, code, needle)

    def has(self, code: int) -> bool:
        """The first IFD has a text tag ``code`` with a value inside the file."""
        return self.texts.where(self.first, code) is not None


def last_tiled(pages: list[Any]) -> Any:
    """The last tiled IFD in file order (Aperio, Huron, Trestle, Philips: their levels are the
    tiled IFDs), or None."""
    tiled = [p for p in pages if is_tiled(p)]
    return tiled[-1] if tiled else None


def generic_level(pages: list[Any]) -> Any:
    """Generic TIFF's smallest level: of the tiled IFDs that are the first or reduced-resolution,
    the narrowest (the last of equals in file order), or None."""
    levels = [p for i, p in enumerate(pages) if is_tiled(p) and (i == 0 or _is_reduced(p))]
    # the smallest width; of equals the last in file order (a stable sort, largest first)
    return min(reversed(levels), key=lambda p: int(p.imagewidth)) if levels else None


def ndpi_level(pages: list[Any]) -> Any:
    """NDPI's smallest level: of the IFDs with SourceLens above 0 and focal plane 0, the
    narrowest (the first of equals); None where OpenSlide would refuse an IFD."""
    levels = []
    for p in pages:
        lens = ndpi.source_lens(p)
        if lens is None:
            return None  # OpenSlide refuses an NDPI IFD without SourceLens
        if lens > 0:
            plane = _tag(p, _NDPI_FOCAL_PLANE)
            if plane is None:
                return None  # ... and a level without a focal plane
            if int(np.atleast_1d(plane.value)[0]) == 0:
                levels.append(p)
    return min(levels, key=lambda p: int(p.imagewidth)) if levels else None  # first of equals


def _tag(page: Any, code: int) -> Any:
    """The IFD's entry for tag ``code``, the last one where the IFD repeats it (OpenSlide's
    TIFF reader keeps the last; tifffile's ``get`` gives the first), or None."""
    found = page.tags.getall(code)
    return found[-1] if found else None


def is_tiled(page: Any) -> bool:
    """TileWidth and TileLength both present with values (OpenSlide's test of a tiled IFD)."""
    tags = page.tags
    width, length = tags.get(322), tags.get(323)
    return width is not None and length is not None and width.count > 0 and length.count > 0


def _is_reduced(page: Any) -> bool:
    """NewSubfileType present with its reduced-resolution bit (bit 0)."""
    value = page.tags.valueof(_NEW_SUBFILE_TYPE)
    return value is not None and bool(int(value) & 1)


def _segments(page: Any, file_size: int, values: Callable[[Any], Any]) -> tuple[tuple[int, int], ...] | None:
    """The IFD's ``(offset, count)`` segments (module docstring, 3), or None where OpenSlide
    hashes none: no or mismatched lists, over :data:`LIMIT`, or a segment outside the file."""
    for tags in (_TILE_TAGS, _STRIP_TAGS):  # (offsets code, counts code)
        offsets_tag = _tag(page, tags[0])
        if offsets_tag is not None and int(offsets_tag.count) > 0:
            break
    else:
        return None
    counts_tag = _tag(page, tags[1])
    if counts_tag is None or int(counts_tag.count) != int(offsets_tag.count):
        return None
    offsets, counts = _sequence(values(offsets_tag)), _sequence(values(counts_tag))
    if not counts or len(offsets) != len(counts):
        return None
    try:  # the total first, with no copy: a level over the limit costs no more look at its tags
        total = sum(counts)
        if not isinstance(total, (int, np.integer)) or total > LIMIT or min(counts) < 0:
            return None  # (a float among them makes the total a float)
        segments = tuple(zip(map(operator.index, offsets), map(operator.index, counts), strict=True))
    except TypeError:
        return None
    if min(offsets) < 0 or max((o + c for o, c in segments if c), default=0) > file_size:
        return None  # a segment past the end of the file: OpenSlide fails to open such a file
    return segments


def _sequence(value: Any) -> tuple[Any, ...] | list[Any]:
    """A tag's value as a sequence (tifffile gives one value of a count-1 tag bare)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value if isinstance(value, (tuple, list)) else (value,)


class _Texts:
    """Where the text tags' values lie, read raw as OpenSlide reads them (not tifffile's decoded strings)."""

    def __init__(self, source: ByteSource, is_ndpi: bool):
        self._source, self._ndpi = source, is_ndpi

    def where(self, page: Any, code: int) -> tuple[int, int] | None:
        """``(offset, count)`` of the tag's value in the file, or None: absent, empty, not a
        text type, or outside the file (OpenSlide then has no string for it)."""
        tag = _tag(page, code)
        if tag is None or int(tag.count) <= 0 or int(tag.dtype) not in _TEXT_TYPES:
            return None
        offset: int | None = int(tag.valueoffset)
        count = int(tag.count)
        if self._ndpi and int(tag.dtype) == _ASCII and count <= 4:
            offset = self._ndpi_pointer(page, tag)  # tifffile kept it inline; OpenSlide follows it
        if offset is None or offset < 0 or offset + count > self._source.size:
            return None
        return offset, count

    def starts(self, page: Any, code: int, prefix: bytes) -> bool:
        """True when the tag's text starts with ``prefix`` (OpenSlide's test of a vendor mark)."""
        return self._raw(page, code, prefix, len(prefix)).startswith(prefix)

    def contains(self, page: Any, code: int, needle: bytes, limit: int = 1 << 20) -> bool:
        """True when ``needle`` is in the tag's text (its first ``limit`` bytes)."""
        return needle in self._raw(page, code, needle, limit)

    def _raw(self, page: Any, code: int, mark: bytes, limit: int) -> bytes:
        """The tag's raw text (up to ``limit`` bytes, cut at a NUL), or ``b""``; read only when
        tifffile's decoded value holds ``mark`` at all (no read for the usual file without it)."""
        tag = _tag(page, code)
        value = None if tag is None else tag.value
        if isinstance(value, str):
            value = value.encode("latin-1", "replace")
        if not isinstance(value, bytes) or mark not in value:
            return b""
        where = self.where(page, code)
        if where is None:
            return b""
        return self._source.read(where[0], min(where[1], limit)).split(b"\0", 1)[0]

    def _ndpi_pointer(self, page: Any, tag: Any) -> int | None:
        """The offset an NDPI entry's 4-byte value field and its 4-byte high extension (after the
        IFD's next-IFD offset) make together, read from the file."""
        read = self._source.read
        raw = read(int(page.offset), 2)
        if len(raw) != 2:
            return None
        (entries,) = struct.unpack("<H", raw)
        index = (int(tag.offset) - int(page.offset) - 2) // 12
        low = read(int(tag.offset) + 8, 4)
        high = read(int(page.offset) + 2 + 12 * entries + 8 + 4 * index, 4)
        if len(low) != 4 or len(high) != 4 or not 0 <= index < entries:
            return None
        return struct.unpack("<I", low)[0] | (struct.unpack("<I", high)[0] << 32)
