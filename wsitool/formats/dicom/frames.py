"""Where each frame's bytes are in a DICOM file, found without reading the frames (floor 3).

Native (uncompressed) Pixel Data (PS3.5 8.1.1) has a defined length; frame
``k`` is the ``k``-th run of ``Rows x Columns x SamplesPerPixel x
BitsAllocated / 8`` bytes of the value.

Encapsulated Pixel Data (PS3.5 8.2, A.4) has an undefined length: a sequence of
items, the first being the Basic Offset Table (empty, or one uint32 per frame:
the offset of the frame's first fragment item from the first fragment item),
then one or more fragment items per frame, then a sequence delimiter.  An
Extended Offset Table (7FE0,0001) with its lengths (7FE0,0002) in the header
(PS3.3 C.7.6.3.1.8) gives uint64 offsets (same origin) and frame lengths; with
it every frame is one fragment.  Without either table, the fragments are found
by their item tags (pydicom's ``parse_fragments`` walks them by their lengths
on the open file) and there must be one fragment per frame.

pydicom's encapsulation helpers (``pydicom.encaps.parse_basic_offsets``,
``parse_fragments``) read the item tags on the open file at the Pixel Data
position; only the element's own 8- or 12-byte header (tag, VR, length;
PS3.5 7.1.2) is read here.  A frame split over several fragments is not
supported (its bytes are not contiguous in the file).

Over a URL (an instance read through a remote source: a bucket prefix; its source defers
metadata, :attr:`wsitool.storage.ByteSource.defer_metadata`) walking
every item would fetch the whole object block by block, so a Basic Offset Table
is trusted (:func:`_trusted_basic`); without any table the rest of the object is
fetched first in a few large requests (up to :data:`REMOTE_WALK_BYTES`) and then
walked.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

import numpy as np

from ...errors import CorruptFileError, UnsupportedFormatError
from ...storage.remote import HEAD_BYTES
from .instance import Instance

__all__ = ["frame_table"]

#: A remote instance without offset tables is walked item by item, which reads its whole
#: Pixel Data: up to this many bytes are fetched first in a few large parallel requests
#: (:data:`~wsitool.storage.remote.MAX_REQUEST` each) rather than 64 KiB block by block.
REMOTE_WALK_BYTES = 32 * 1024 * 1024

_PIXEL_DATA = (0x7FE0, 0x0010)
_UNDEFINED = 0xFFFFFFFF
_LONG_VRS = (b"OB", b"OW", b"OF", b"OD", b"OL", b"OV", b"UN", b"SQ", b"UT", b"UC", b"UR")


def _element_header(inst: Instance, fp: BinaryIO) -> tuple[int, int]:
    """``(value offset, value length)`` of the Pixel Data element at ``inst.pixel_pos``."""
    fp.seek(inst.pixel_pos)
    head = fp.read(12)
    if len(head) < 8:
        raise CorruptFileError(f"{inst.path}: no Pixel Data element (the file ends after the header)")
    group, element = struct.unpack("<HH", head[:4])
    if (group, element) != _PIXEL_DATA:
        if group == 0x7FE0 and element in (0x0008, 0x0009):
            raise UnsupportedFormatError(f"{inst.path}: float pixel data is not supported")
        raise CorruptFileError(
            f"{inst.path}: no Pixel Data element (found tag ({group:04X},{element:04X}) after the header)"
        )
    if inst.implicit_vr:
        (length,) = struct.unpack("<I", head[4:8])
        return inst.pixel_pos + 8, length
    if head[4:6] in _LONG_VRS:
        if len(head) < 12:
            raise CorruptFileError(f"{inst.path}: truncated Pixel Data element header")
        (length,) = struct.unpack("<I", head[8:12])
        return inst.pixel_pos + 12, length
    (length,) = struct.unpack("<H", head[6:8])
    return inst.pixel_pos + 8, length


def frame_table(inst: Instance, encapsulated: bool) -> tuple[np.ndarray, np.ndarray, str]:
    """Byte offset and length of every frame of ``inst`` in its file.

    Returns:
        ``(offsets, counts, table)``: two ``(NumberOfFrames,)`` uint64 arrays
        (a frame of length 0 is missing) and which table located them:
        ``"native"``, ``"extended"``, ``"basic"`` or ``"none"`` (item tags).

    Raises:
        CorruptFileError: no Pixel Data element, truncated Pixel Data, offset
            tables that disagree with the items, fewer fragments than frames.
        UnsupportedFormatError: frames split over several fragments; float pixel data.
    """
    with inst.open() as fp:
        start, length = _element_header(inst, fp)
        if not encapsulated:
            return _native(inst, start, length)
        if length != _UNDEFINED:
            raise CorruptFileError(
                f"{inst.path}: Pixel Data of a compressed transfer syntax has a defined length "
                "(it must be encapsulated, PS3.5 A.4)"
            )
        from pydicom.encaps import parse_basic_offsets, parse_fragments  # (lazy: see instance.py)

        fp.seek(start)
        try:
            basic = parse_basic_offsets(fp)
            first = fp.tell()
            eot = _extended_table(inst)
            if eot is not None:
                return _extended(inst, first, *eot)
            if inst.source is not None and inst.source.defer_metadata:  # (each read a request)
                if basic:
                    return _trusted_basic(inst, fp, first, basic)
                if inst.file_size > HEAD_BYTES and inst.file_size - first <= REMOTE_WALK_BYTES:
                    # the walk reads it all anyway (a smaller one came whole at open)
                    inst.source.advise([(first, inst.file_size - first)])
            count, positions = parse_fragments(fp)
        except (ValueError, struct.error, EOFError, OSError) as exc:  # pydicom: OSError on bad items
            raise CorruptFileError(f"{inst.path}: unreadable encapsulated Pixel Data "
                                   f"(truncated file?): {exc}") from None
        last = _last_length(inst, fp, count, positions)
    pos, lengths = _fragment_lengths(inst, positions, last)
    table = _table_kind(inst, basic, first, positions)
    return pos + np.uint64(8), lengths, table


def _trusted_basic(inst: Instance, fp: BinaryIO, first: int,
                   basic: list[int]) -> tuple[np.ndarray, np.ndarray, str]:
    """The frames of a remote instance from its Basic Offset Table alone (``first``: the
    position of the first fragment item): frame ``k`` is the item at ``first + basic[k]``,
    its length the distance to the next entry less the item header; the last item's
    header is read (one request) for its length.  Walking every item, as a local file is
    checked, would fetch the whole object; so one fragment per frame is taken on trust
    here, with the entries checked to increase and the last item to be a fragment item.

    Raises:
        CorruptFileError: a table of another length than the frame count, entries that
            do not increase, a last entry that names no item, a last fragment past the end.
    """
    n = inst.frames
    if len(basic) != n:
        raise CorruptFileError(f"{inst.path}: the Basic Offset Table has {len(basic)} entries "
                               f"for {n} frames")
    pos = np.asarray(basic, np.uint64) + np.uint64(first)
    if n > 1 and not bool(np.all(np.diff(pos.astype(np.int64)) > 8)):
        raise CorruptFileError(f"{inst.path}: Basic Offset Table entries that do not increase")
    fp.seek(int(pos[-1]))
    head = fp.read(8)
    if len(head) < 8 or struct.unpack("<HH", head[:4]) != (0xFFFE, 0xE000):
        raise CorruptFileError(f"{inst.path}: the last Basic Offset Table entry ({basic[-1]}) "
                               "points to no fragment item")
    last = int(struct.unpack("<I", head[4:8])[0])
    pos, lengths = _fragment_lengths(inst, [int(p) for p in pos], last)
    return pos + np.uint64(8), lengths, "basic"


def _last_length(inst: Instance, fp: BinaryIO, count: int, positions: list[int]) -> int:
    """The value length of the last fragment item (its header at ``positions[-1]``).

    Raises:
        CorruptFileError: no fragment, or a file that ends inside the last item's header.
    """
    if count == 0:
        raise CorruptFileError(f"{inst.path}: encapsulated Pixel Data holds no fragment")
    fp.seek(positions[-1] + 4)
    last = fp.read(4)
    if len(last) < 4:
        raise CorruptFileError(f"{inst.path}: truncated Pixel Data (last fragment header)")
    return int(struct.unpack("<I", last)[0])


def _fragment_lengths(inst: Instance, positions: list[int], last: int) -> tuple[np.ndarray, np.ndarray]:
    """``(item header positions, value lengths)`` of the fragments, two uint64 arrays; each
    length but the last is the distance to the next item less its 8-byte header.

    Raises:
        CorruptFileError: the last fragment ends past the end of the file.
    """
    pos = np.asarray(positions, np.uint64)
    lengths = np.empty(len(positions), np.uint64)
    lengths[:-1] = np.diff(pos) - np.uint64(8)
    lengths[-1] = last
    end = int(pos[-1]) + 8 + int(lengths[-1])
    if end > inst.file_size:
        raise CorruptFileError(
            f"{inst.path}: truncated Pixel Data: the last fragment ends at byte {end}, "
            f"past the end of the file ({inst.file_size} bytes)"
        )
    return pos, lengths


def _table_kind(inst: Instance, basic: list[int], first: int, positions: list[int]) -> str:
    """``"basic"`` (the Basic Offset Table names one fragment per frame, in order) or
    ``"none"`` (no table: one fragment per frame).

    Raises:
        CorruptFileError: a table entry naming no fragment, a table or fragment count
            other than the frame count (fewer fragments: truncated).
        UnsupportedFormatError: frames split over several fragments.
    """
    n, count = inst.frames, len(positions)
    if basic:
        if len(basic) != n:
            raise CorruptFileError(f"{inst.path}: the Basic Offset Table has {len(basic)} entries "
                                   f"for {n} frames")
        index = {int(p) - first: k for k, p in enumerate(positions)}
        picks = [index.get(int(b), -1) for b in basic]
        if any(p < 0 for p in picks):
            bad = next(i for i, p in enumerate(picks) if p < 0)
            raise CorruptFileError(f"{inst.path}: Basic Offset Table entry {bad} ({basic[bad]}) "
                                   "points to no fragment item")
        if count != n or picks != list(range(n)):
            raise UnsupportedFormatError(
                f"{inst.path}: {count} fragments for {n} frames: frames split over several "
                "fragments are not supported"
            )
        return "basic"
    if count < n:
        raise CorruptFileError(f"{inst.path}: {count} fragments for {n} frames "
                               "(truncated Pixel Data?)")
    if count > n:
        raise UnsupportedFormatError(
            f"{inst.path}: {count} fragments for {n} frames and no offset table: frames "
            "split over several fragments are not supported"
        )
    return "none"


def _extended_table(inst: Instance) -> tuple[np.ndarray, np.ndarray] | None:
    ds = inst.ds
    offsets = ds.get("ExtendedOffsetTable")
    if offsets is None or len(offsets) == 0:
        return None
    lengths = ds.get("ExtendedOffsetTableLengths")
    if lengths is None or len(lengths) != len(offsets) or len(offsets) % 8:
        raise CorruptFileError(f"{inst.path}: Extended Offset Table without matching lengths")
    return np.frombuffer(bytes(offsets), "<u8"), np.frombuffer(bytes(lengths), "<u8")


def _extended(inst: Instance, first: int, offsets: np.ndarray,
              lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    n = inst.frames
    if len(offsets) != n:
        raise CorruptFileError(f"{inst.path}: the Extended Offset Table has {len(offsets)} entries "
                               f"for {n} frames")
    starts = offsets.astype(np.uint64) + np.uint64(first + 8)
    ends = starts + lengths.astype(np.uint64)
    if len(ends) and int(ends.max()) > inst.file_size:
        k = int(np.argmax(ends))
        raise CorruptFileError(
            f"{inst.path}: truncated Pixel Data: frame {k} ends at byte {int(ends[k])}, past the "
            f"end of the file ({inst.file_size} bytes)"
        )
    return np.ascontiguousarray(starts), np.ascontiguousarray(lengths, np.uint64), "extended"


def _native(inst: Instance, start: int, length: int) -> tuple[np.ndarray, np.ndarray, str]:
    if inst.bits_allocated % 8:
        raise UnsupportedFormatError(f"{inst.path}: {inst.bits_allocated}-bit packed samples are "
                                     "not supported")
    frame = inst.frame_width * inst.frame_height * inst.samples * inst.bits_allocated // 8
    n = inst.frames
    if length == _UNDEFINED:
        raise CorruptFileError(f"{inst.path}: native Pixel Data with an undefined length")
    need = frame * n
    if length < need or start + need > inst.file_size:
        have = min(length, inst.file_size - start)
        raise CorruptFileError(
            f"{inst.path}: truncated Pixel Data: {have} bytes for {n} frames of {frame} bytes"
        )
    offsets = np.arange(n, dtype=np.uint64) * np.uint64(frame) + np.uint64(start)
    return offsets, np.full(n, frame, np.uint64), "native"
