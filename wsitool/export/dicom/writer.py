"""Writing one DICOM instance file: the header through pydicom, then the encapsulated frames streamed (floor 6).

File layout (PS3.10 7.1, PS3.5 A.4): the 128-byte preamble, ``DICM``, the
File Meta Information and the data set's attributes as pydicom writes them
(every attribute but the pixel data), then, written here in Explicit VR
Little Endian:

* where the instance uses an Extended Offset Table, the Extended Offset Table
  (7FE0,0001) and Extended Offset Table Lengths (7FE0,0002), ``OV``, 8 bytes
  per frame each, written as zeros and filled in at the end;
* Pixel Data (7FE0,0010), ``OB``, undefined length, whose first item is the
  Basic Offset Table (4 bytes per frame, filled in at the end; empty when the
  Extended Offset Table is used, as PS3.5 A.4 requires), then one item per
  frame (one fragment per frame; an odd-length frame padded with one zero
  byte, PS3.5 A.4), then the Sequence Delimitation Item.

Offsets count from the first byte of the first frame's item tag; the Basic
Offset Table's are 32-bit, so an instance whose frames could pass 4 GiB uses
the Extended Offset Table (64-bit offsets and lengths, PS3.5 A.4 and
PS3.3 C.7.6.3.1.8) instead: :func:`offset_table` decides from a bound known
before the first frame is written, and a frame that would take the Basic
Offset Table past 32 bits stops the export rather than write a wrong one.
Frames are written as they come; only their offsets are kept (16 bytes a
frame).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path

from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.filewriter import dcmwrite
from pydicom.uid import PYDICOM_IMPLEMENTATION_UID, UID

from ...errors import WsiError
from ...version import __version__
from .framestream import BASIC_TABLE_LIMIT, item, write_frames

_DELIMITER = 0xE0DD


def offset_table(frames: int, bound_bytes: int) -> str:
    """``"basic"`` or ``"extended"``: the offset table of an instance of ``frames`` frames whose encoded
    frames (items with their 8-byte headers and padding) take at most ``bound_bytes`` bytes together.

    The Basic Offset Table's 32-bit entries address the start of every frame; the last frame starts
    before ``bound_bytes - 8``, so ``bound_bytes`` below 2**32 keeps every offset in range.
    """
    if frames < 0 or bound_bytes < 0:
        raise ValueError("frames and bound_bytes must be >= 0")
    return "extended" if bound_bytes >= BASIC_TABLE_LIMIT else "basic"


def file_meta(ds: Dataset, transfer_syntax: str) -> FileMetaDataset:
    """The File Meta Information (PS3.10 7.1) of ``ds`` under ``transfer_syntax``."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = ds.SOPClassUID
    meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    meta.TransferSyntaxUID = UID(transfer_syntax)
    meta.ImplementationClassUID = PYDICOM_IMPLEMENTATION_UID
    meta.ImplementationVersionName = f"WSITOOL_{__version__}"[:16]
    return meta


def _element_header(group: int, element: int, vr: bytes, length: int) -> bytes:
    return struct.pack("<HH2sHI", group, element, vr, 0, length)


def ratio_text(raw_bytes: int, coded_bytes: int) -> bytes:
    """Lossy Image Compression Ratio (PS3.3 C.7.6.1.1.5: uncompressed over compressed size) as the 16 bytes
    of a Decimal String, space padded."""
    ratio = raw_bytes / max(coded_bytes, 1)
    return f"{ratio:.6g}".ljust(16).encode("ascii")


#: Lossy Image Compression Ratio (0028,2112), DS, 16 bytes, in Explicit VR Little Endian
_RATIO_ELEMENT = b"\x28\x00\x12\x21DS\x10\x00"


def write_instance(path: Path, ds: Dataset, transfer_syntax: str, frames: Iterable, count: int,
                   table: str, raw_bytes: int = 0) -> int:
    """Write the instance ``ds`` with ``count`` encapsulated ``frames`` to the new file ``path``; returns its size.

    Args:
        path: the file, created exclusively (``FileExistsError`` if it exists).
        ds: every attribute but the pixel data (``NumberOfFrames`` included).
        transfer_syntax: an encapsulated Transfer Syntax UID.
        frames: the frames in order, each a complete compressed frame (bytes, or a tuple of pieces), or
            many at once (:class:`~.framestream.FrameRun`); written by :func:`~.framestream.write_frames`.
        count: how many ``frames`` yields.
        table: ``"basic"`` or ``"extended"`` (:func:`offset_table`).
        raw_bytes: the frames' uncompressed size: where ``ds`` has a Lossy Image Compression Ratio
            (a 16-character placeholder) it is replaced by ``raw_bytes`` over the frames' size.

    Raises:
        WsiError: ``frames`` yielded another count than ``count``, an empty frame, or (``"basic"``)
            frames past the 32-bit offsets of the Basic Offset Table.
        OSError: the file could not be written.
    """
    ds.file_meta = file_meta(ds, transfer_syntax)
    extended = table == "extended"
    with open(path, "x+b") as fh:
        dcmwrite(fh, ds, enforce_file_format=True)
        eot_at = fh.tell()
        ratio_at = _ratio_position(fh, path, eot_at) if "LossyImageCompressionRatio" in ds else -1
        if extended:
            for element in (0x0001, 0x0002):
                fh.write(_element_header(0x7FE0, element, b"OV", 8 * count))
                fh.write(bytes(8 * count))
        fh.write(_element_header(0x7FE0, 0x0010, b"OB", 0xFFFFFFFF))
        bot_len = 0 if extended else 4 * count
        fh.write(item(bot_len))
        bot_at = fh.tell()
        fh.write(bytes(bot_len))
        offsets, lengths = write_frames(fh, path, frames, count, extended)
        fh.write(struct.pack("<HHI", 0xFFFE, _DELIMITER, 0))
        end = fh.tell()
        if ratio_at >= 0:
            fh.seek(ratio_at + len(_RATIO_ELEMENT))
            fh.write(ratio_text(raw_bytes, int(lengths.sum())))
        if extended:
            fh.seek(eot_at + 12)
            fh.write(offsets.astype("<u8").tobytes())
            fh.seek(eot_at + 12 + 8 * count + 12)
            fh.write(lengths.astype("<u8").tobytes())
        else:
            fh.seek(bot_at)
            fh.write(offsets.astype("<u4").tobytes())
    return end


def _ratio_position(fh, path: Path, end: int) -> int:
    """Where the Lossy Image Compression Ratio element starts in the header written so far."""
    fh.seek(0)
    at = fh.read(end).rfind(_RATIO_ELEMENT)
    if at < 0:  # pragma: no cover - pydicom writes the element as set
        raise WsiError(f"{path.name}: no place for the Lossy Image Compression Ratio")
    fh.seek(end)
    return at
