"""A CZI file's associated images: its ``Label``, ``SlidePreview`` and ``Thumbnail`` attachments (floor 3).

As OpenSlide 4.0.1 reads them: the attachment directory's entries named ``Label``,
``SlidePreview`` and ``Thumbnail`` become ``label``, ``macro`` and ``thumbnail``.  An
attachment segment (``ZISRAWATTACH``) is a 32-byte segment header, a 256-byte attachment
header (its data size, then a copy of its directory entry), then the data: a JPEG stream
(content type ``JPG``) or a CZI file of one subblock (``CZI``, read by :mod:`.segments`).
Other attachments (the ``EventList``, ``TimeStamps``, profiles) are not images.
"""

from __future__ import annotations

import struct

from ...errors import CorruptFileError, UnsupportedFormatError
from ...ground.bitstream import jpeg_frame_size
from ...model import AssociatedImage, TileEncoding
from ...storage import ByteSource
from . import layout, segments

__all__ = ["associated", "NAMES"]

#: Attachment name -> associated image name.
NAMES = {"Label": "label", "SlidePreview": "macro", "Thumbnail": "thumbnail"}
_HEADER = 32 + 256
#: The most bytes read to find a JPEG attachment's frame header.
_JPEG_HEAD = 1 << 20


def _encoding(imagecodec: str, grey: bool) -> TileEncoding:
    jpeg = imagecodec == "jpeg8"
    return TileEncoding(compression="JPEG" if jpeg else "CZI", compression_code=7 if jpeg else 0,
                        photometric="MINISBLACK" if grey else "RGB", photometric_code=1 if grey else 2,
                        bits=8, stream="jpeg" if jpeg else None, codec="generic", imagecodec=imagecodec)


def _jpeg(source: ByteSource, name: str, data: int, size: int) -> AssociatedImage:
    dims = jpeg_frame_size(source.read(data, min(size, _JPEG_HEAD)))
    if dims is None:
        raise CorruptFileError(f"CZI: attachment {name!r} is no JPEG stream with a readable frame header")
    return AssociatedImage(name=NAMES[name], width=dims[0], height=dims[1], samples=3, itemsize=1, planar=False,
                           encoding=_encoding("jpeg8", False), offsets=(data,), bytecounts=(size,),
                           max_segment=dims)


def _embedded(source: ByteSource, name: str, data: int) -> AssociatedImage:
    fh = source.open_file()
    try:
        inner = segments.read_file(source, fh, data)
    finally:
        fh.close()
    if len(inner.subblocks) != 1:
        raise CorruptFileError(f"CZI: attachment {name!r} holds {len(inner.subblocks)} subblocks, one expected")
    sub = inner.subblocks[0]
    codec = layout.codec_name(sub)
    if sub.pixel_type not in (0, 3, 9):
        raise UnsupportedFormatError(f"CZI: attachment {name!r} has pixel type {sub.pixel_type}")
    start, used = segments.segment(source, sub.position, "ZISRAWSUBBLOCK")
    grey = sub.pixel_type == 0
    return AssociatedImage(name=NAMES[name], width=sub.width, height=sub.height, samples=1 if grey else 3,
                           itemsize=1, planar=False, encoding=_encoding(codec, grey), offsets=(sub.position,),
                           bytecounts=(start - sub.position + used,), max_segment=(sub.width, sub.height))


def associated(source: ByteSource, attachments: tuple[segments.Attachment, ...]) -> dict[str, AssociatedImage]:
    """The associated images of the ``attachments`` (name -> image; the first of a name).

    Raises:
        CorruptFileError: an attachment segment out of the file, a JPEG without a frame
            header, an embedded CZI that is not one readable subblock.
        UnsupportedFormatError: an attachment of another content type, or an embedded
            subblock wsitool does not decode.
    """
    out: dict[str, AssociatedImage] = {}
    for att in attachments:
        if att.name not in NAMES or NAMES[att.name] in out:
            continue
        start, used = segments.segment(source, att.position, "ZISRAWATTACH")
        raw = source.read(start, 4)
        size = struct.unpack("<i", raw)[0] if len(raw) == 4 else -1
        data = att.position + _HEADER
        if size <= 0 or _HEADER - 32 + size > used:
            raise CorruptFileError(f"CZI: attachment {att.name!r} declares {size} bytes in a segment of {used}")
        if att.content_type == "JPG":
            out[NAMES[att.name]] = _jpeg(source, att.name, data, size)
        elif att.content_type == "CZI":
            out[NAMES[att.name]] = _embedded(source, att.name, data)
        else:
            raise UnsupportedFormatError(f"CZI: attachment {att.name!r} has content type {att.content_type!r}")
    return out
