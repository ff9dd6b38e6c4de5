"""Container formats: each turns a file into a :class:`~wsitool.model.Pyramid` (floor 3).

A format is a sub-package with ``sniff(head: bytes) -> bool`` (its magic in the
first 132 bytes of the file) and ``open_pyramid(path, source) -> Pyramid``; it
describes levels, tiles and how each tile is encoded, and decodes nothing.  A
new container is a new sub-package listed in :data:`FORMATS`; nothing above
this layer changes.
"""

from __future__ import annotations

from ..errors import UnsupportedFormatError
from ..model import Pyramid
from ..storage import ByteSource
from . import tiff

__all__ = ["FORMATS", "open_pyramid"]

#: The formats tried, in order.
FORMATS = (tiff,)

#: Bytes read to recognise a format (a DICOM file's "DICM" sits at 128..132, PS3.10 7.1).
HEAD_BYTES = 132


def open_pyramid(path: str, source: ByteSource) -> Pyramid:
    """The pyramid of the file ``source`` reads, by the first format that recognises it.

    Raises:
        UnsupportedFormatError: no format recognises the file.
        CorruptFileError: the recognised format finds the file broken.
    """
    head = source.read(0, HEAD_BYTES)
    if len(head) >= HEAD_BYTES and head[128:132] == b"DICM":
        raise UnsupportedFormatError(f"{path}: DICOM files are not supported yet (unsupported format)")
    for fmt in FORMATS:
        if fmt.sniff(head):
            return fmt.open_pyramid(path, source)
    raise UnsupportedFormatError(f"{path}: not a TIFF file (unsupported format; header {head[:4]!r})")
