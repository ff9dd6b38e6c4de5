"""The ZISRAW segments of a Zeiss CZI file: header, subblock directory, metadata, attachments (floor 3).

A CZI file (Carl Zeiss ZISRAW, little-endian) is a chain of segments, each a 32-byte header
(a 16-byte NUL-padded id such as ``ZISRAWSUBBLOCK``, then int64 allocated and used sizes)
and its data.  The file header segment (``ZISRAWFILE``, at 0) gives the GUIDs and the
positions of the subblock directory (``ZISRAWDIRECTORY``), the metadata (``ZISRAWMETADATA``:
the XML) and the attachment directory (``ZISRAWATTDIR``).  A directory entry (schema
``DV``) names a subblock's pixel type, compression, pyramid type, position and its
dimensions (``X``, ``Y``, ``C``, ``S``, ``M``, ``T``, ``Z``, ...: start, logical size,
stored size); an attachment entry (schema ``A1``) a named piece (``Label``,
``SlidePreview``, ``Thumbnail``) and its content type (``JPG``, ``CZI``).

The segments are parsed by czifile (``czifile.Segment`` and the segment classes it
reads), over the byte source's file view, once their headers have been checked here:
the id, a used size inside the file, and entry counts that fit that size, so that no
number in the file sets how much is read or kept.  The subblock's own header (where its
pixel bytes start) is read here (:func:`subblock_data`), when the subblock is first decoded.

Every problem is a :class:`~wsitool.errors.CorruptFileError` (the opener names the file).
"""

from __future__ import annotations

import dataclasses
import struct
import warnings
from typing import Any, BinaryIO

from ...errors import CorruptFileError
from ...storage import ByteSource

__all__ = ["MAGIC", "segment", "Subblock", "Attachment", "CziFile", "read_file", "subblock_data", "MAX_XML_BYTES",
           "MAX_SUBBLOCKS"]

#: The file's first bytes (the id of its header segment).
MAGIC = b"ZISRAWFILE"
#: The largest metadata XML read (bytes): a real Axioscan slide's is well under 1 MiB.
MAX_XML_BYTES = 64 << 20
#: The most subblocks a directory may list (a 200,000 x 100,000 pixel slide of 512² subblocks with
#: 4 channels and its pyramid has about 400,000).
MAX_SUBBLOCKS = 1_000_000

_SEGMENT = struct.Struct("<16sqq")
_DIR_ENTRY_MIN = 32  # a DV entry without dimensions
_DIM_ENTRY = 20
_ATT_ENTRY = 128
_SUBBLOCK_FIXED = 16  # metadata size, attachment size, data size after the segment header

#: Pixel type codes (ZISRAW): name, samples, bytes per sample.
PIXEL_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("Gray8", 1, 1), 1: ("Gray16", 1, 2), 2: ("Gray32Float", 1, 4), 3: ("Bgr24", 3, 1),
    4: ("Bgr48", 3, 2), 8: ("Bgr96Float", 3, 4), 9: ("Bgra32", 4, 1), 10: ("Gray64ComplexFloat", 2, 4),
    11: ("Bgr192ComplexFloat", 6, 4), 12: ("Gray32", 1, 4), 13: ("Gray64", 1, 8)}
_CODES = {name: code for code, (name, _, _) in PIXEL_TYPES.items()}
#: Compression codes (ZISRAW) and their names.
COMPRESSIONS = {0: "uncompressed", 1: "JPEG", 2: "LZW", 4: "JPEG XR", 5: "zstd0", 6: "zstd1"}


@dataclasses.dataclass(frozen=True)
class Subblock:
    """One directory entry: a stored image of one plane.

    Attributes:
        index: its place in the directory (0, 1, ...).
        pixel_type, compression: ZISRAW codes (:data:`PIXEL_TYPES`, :data:`COMPRESSIONS`).
        pyramid_type: 0 none, 1 single, 2 multiple (subblocks of a pyramid level).
        position: byte offset of its ``ZISRAWSUBBLOCK`` segment.
        x, y: start of its ``X``, ``Y`` dimensions (level-0 pixels; may be negative).
        logical_width, logical_height: its ``X``, ``Y`` sizes (level-0 pixels covered).
        width, height: its stored size (pixels of the image as stored).
        dims: the start of every other dimension (``{"C": 0, "S": 1, "M": 7, "T": 0}``).
    """

    index: int
    pixel_type: int
    compression: int
    pyramid_type: int
    position: int
    x: int
    y: int
    logical_width: int
    logical_height: int
    width: int
    height: int
    dims: dict[str, int]

    @property
    def downsample(self) -> int:
        """Logical over stored width, rounded to the closest integer (halves away from 0), as
        OpenSlide's Zeiss reader takes it; at least 1."""
        return max(1, (2 * self.logical_width + self.width) // (2 * self.width))

    def dim(self, name: str) -> int:
        """The start of dimension ``name``, 0 where the entry has none."""
        return self.dims.get(name, 0)


@dataclasses.dataclass(frozen=True)
class Attachment:
    """An attachment directory entry: ``name`` (``"Label"``), ``content_type`` (``"JPG"``,
    ``"CZI"``) and the position of its ``ZISRAWATTACH`` segment."""

    name: str
    content_type: str
    position: int


@dataclasses.dataclass(frozen=True)
class CziFile:
    """What a CZI file's segments say (:func:`read_file`).

    Attributes:
        primary_guid, file_guid: the 16 raw bytes of each GUID of the file header.
        subblocks: the directory's entries in file order.
        xml: the metadata XML's bytes up to its first NUL (empty where there is none).
        attachments: the attachment directory's entries (empty where there is none).
        positions: where the file header, subblock directory, metadata and attachment
            directory segments start (those the file has).
    """

    primary_guid: bytes
    file_guid: bytes
    subblocks: tuple[Subblock, ...]
    xml: bytes
    attachments: tuple[Attachment, ...]
    positions: tuple[int, ...] = ()


def segment(source: ByteSource, pos: int, sid: str) -> tuple[int, int]:
    """``(data offset, used size)`` of the segment ``sid`` at ``pos`` (its header checked).

    Raises:
        CorruptFileError: no such segment there, or one that passes the end of the file.
    """
    if pos < 0 or pos + _SEGMENT.size > source.size:
        raise CorruptFileError(f"CZI: {sid} segment position {pos} outside the file ({source.size} bytes)")
    raw = source.read(pos, _SEGMENT.size)
    if len(raw) < _SEGMENT.size:
        raise CorruptFileError(f"CZI: {sid} segment at {pos} is cut short")
    name, allocated, used = _SEGMENT.unpack(raw)
    found = name.split(b"\0", 1)[0]
    if found != sid.encode():
        raise CorruptFileError(f"CZI: no {sid} segment at offset {pos} (found {found!r})")
    if used == 0:
        used = allocated
    start = pos + _SEGMENT.size
    if used < 0 or start + used > source.size:
        raise CorruptFileError(f"CZI: {sid} segment at {pos} declares {used} bytes, past the end of the file "
                               f"({source.size} bytes)")
    return start, used


def _count(source: ByteSource, start: int, used: int, entry: int, sid: str) -> int:
    raw = source.read(start, 4)
    count = struct.unpack("<i", raw)[0] if len(raw) == 4 else -1
    if count < 0 or count * entry > used:
        raise CorruptFileError(f"CZI: {sid} lists {count} entries, more than its {used} bytes hold")
    return count


def _parsed(fh: BinaryIO, pos: int, what: str) -> Any:
    """czifile's parse of the segment at ``pos``, its errors and warnings as one CorruptFileError."""
    import czifile  # (loaded where a CZI is opened, not by every command)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return czifile.Segment(fh, pos).data()
    except (ValueError, KeyError, struct.error, OSError, UnicodeDecodeError, IndexError, TypeError,
            AttributeError) as exc:
        raise CorruptFileError(f"CZI: unreadable {what}: {type(exc).__name__}: {exc}") from None


def _entry(k: int, e: Any) -> Subblock:
    dims: dict[str, tuple[int, int, int]] = {}
    for d in e.dimension_entries:
        dims[str(d.dimension)] = (int(d.start), int(d.size), int(d.stored_size))
    if "X" not in dims or "Y" not in dims:
        raise CorruptFileError(f"CZI: subblock {k} has no X or Y dimension")
    x, w, sw = dims.pop("X")
    y, h, sh = dims.pop("Y")
    if min(w, h, sw, sh) <= 0 or max(w, h, sw, sh) > 1 << 31:
        raise CorruptFileError(f"CZI: subblock {k} has size {w}x{h} stored as {sw}x{sh}")
    import czifile

    code = _CODES.get(czifile.czifile.PIXEL_TYPE.get(e.dtype, ""), -1)  # (czifile keeps a dtype name)
    return Subblock(index=k, pixel_type=code, compression=int(e.compression),
                    pyramid_type=int(e.pyramid_type), position=int(e.file_position), x=x, y=y,
                    logical_width=w, logical_height=h, width=sw, height=sh,
                    dims={name: start for name, (start, _, _) in dims.items()})


def _directory(source: ByteSource, fh: BinaryIO, pos: int) -> tuple[Subblock, ...]:
    start, used = segment(source, pos, "ZISRAWDIRECTORY")
    count = _count(source, start, used, _DIR_ENTRY_MIN, "ZISRAWDIRECTORY")
    if count > MAX_SUBBLOCKS:
        raise CorruptFileError(f"CZI: {count} subblocks, more than wsitool reads ({MAX_SUBBLOCKS})")
    parsed = _parsed(fh, pos, "subblock directory")
    entries = getattr(parsed, "entries", ())
    return tuple(_entry(k, e) for k, e in enumerate(entries))


def _attachments(source: ByteSource, fh: BinaryIO, pos: int) -> tuple[Attachment, ...]:
    start, used = segment(source, pos, "ZISRAWATTDIR")
    _count(source, start, used, _ATT_ENTRY, "ZISRAWATTDIR")
    parsed = _parsed(fh, pos, "attachment directory")
    return tuple(Attachment(str(e.name), str(e.content_file_type), int(e.file_position))
                 for e in getattr(parsed, "entries", ()))


def _metadata(source: ByteSource, pos: int) -> bytes:
    start, used = segment(source, pos, "ZISRAWMETADATA")
    raw = source.read(start, 8)
    xml_size = struct.unpack("<i", raw[:4])[0] if len(raw) == 8 else -1
    if xml_size < 0 or 256 + xml_size > used:
        raise CorruptFileError(f"CZI: metadata XML of {xml_size} bytes in a segment of {used}")
    if xml_size > MAX_XML_BYTES:
        raise CorruptFileError(f"CZI: metadata XML of {xml_size} bytes, more than wsitool reads "
                               f"({MAX_XML_BYTES})")
    return source.read(start + 256, xml_size).split(b"\0", 1)[0]


def read_file(source: ByteSource, fh: BinaryIO, offset: int = 0) -> CziFile:
    """Parse the segments of the CZI whose file header is at ``offset`` of ``source``
    (0; an embedded CZI attachment elsewhere), through ``fh``, the source's file view.

    Raises:
        CorruptFileError: a segment missing, of the wrong id, past the end of the file, or
            unreadable (an unknown pixel type); a subblock without X or Y, of a non-positive
            size or outside the file; more subblocks than :data:`MAX_SUBBLOCKS`.
    """
    start, used = segment(source, offset, "ZISRAWFILE")
    raw = source.read(start, 80)
    if len(raw) < 80 or used < 80:
        raise CorruptFileError("CZI: file header cut short")
    (_major, _minor, _r1, _r2, primary, guid, _part, dir_pos, meta_pos, _pending,
     att_pos) = struct.unpack("<iiii16s16siqqiq", raw)
    if dir_pos <= 0:
        raise CorruptFileError("CZI: the file header gives no subblock directory")
    subblocks = tuple(dataclasses.replace(s, position=s.position + offset)
                      for s in _directory(source, fh, offset + dir_pos))
    for s in subblocks:
        if not 0 <= s.position < source.size:
            raise CorruptFileError(f"CZI: subblock {s.index} at offset {s.position}, outside the file "
                                   f"({source.size} bytes)")
    xml = _metadata(source, offset + meta_pos) if meta_pos > 0 else b""
    attachments = _attachments(source, fh, offset + att_pos) if att_pos > 0 else ()
    positions = (offset, *(offset + p for p in (dir_pos, meta_pos, att_pos) if p > 0))
    return CziFile(primary, guid, subblocks, xml, attachments, positions)


def subblock_data(source: ByteSource, sub: Subblock) -> tuple[int, int]:
    """``(offset, count)`` of the pixel data of ``sub`` in ``source``: after its segment
    header, the fixed fields, its directory entry padded to 256 bytes, and its metadata.

    Raises:
        CorruptFileError: no ``ZISRAWSUBBLOCK`` segment there, or sizes that leave the segment.
    """
    start, used = segment(source, sub.position, "ZISRAWSUBBLOCK")
    raw = source.read(start, _SUBBLOCK_FIXED + _DIR_ENTRY_MIN)
    if len(raw) < _SUBBLOCK_FIXED + _DIR_ENTRY_MIN:
        raise CorruptFileError(f"CZI: subblock {sub.index} header cut short")
    meta, attach, data = struct.unpack("<iiq", raw[:16])
    ndims = struct.unpack("<i", raw[16 + 28:16 + 32])[0]
    if ndims < 0 or ndims > 64:
        raise CorruptFileError(f"CZI: subblock {sub.index} header lists {ndims} dimensions")
    entry = _DIR_ENTRY_MIN + ndims * _DIM_ENTRY
    header = _SUBBLOCK_FIXED + max(240, entry)
    if meta < 0 or attach < 0 or data <= 0 or header + meta + data > used:
        raise CorruptFileError(f"CZI: subblock {sub.index} declares metadata {meta}, data {data} bytes "
                               f"in a segment of {used}")
    return start + header + meta, data
