"""Reading one tile's encoded bytes from its level's byte source, with the checks every path shares (floor 3).

A missing tile (offset or byte count 0, as sparse slides write) reads as None;
a segment past the end of the file, a short read or a JPEG tile without SOI
raise :class:`~wsitool.errors.TileDecodeError` naming level, column and row.

JPEG tiles become complete streams in one of two ways
(:class:`~wsitool.model.TileEncoding`): the level's ``jpeg_prefix`` (SOI,
Adobe marker, JPEGTables) replaces each tile's own SOI; or, for the restart
intervals of a Hamamatsu NDPI level (``jpeg_scan_segments``), which carry no
SOI, the prefix is a whole header put in front of the segment and the
segment's final RSTn marker becomes EOI.
"""

from __future__ import annotations

import numpy as np

from ..errors import TileDecodeError
from ..ground.bitstream import EOI, SOI, ends_with_restart, jpeg_with_prefix
from ..model import PyramidLevel
from .failures import not_soi_reason, past_eof_reason, short_read_reason
from .pool import DecodeStats, ThreadState

__all__ = ["read_tile_bytes", "read_tile_stream", "jpeg_stream"]


def read_tile_bytes(level: PyramidLevel, index: int, col: int, row: int, stats: DecodeStats) -> bytes | None:
    """Read the encoded bytes of segment ``index`` (tile or strip) of ``level``.

    Returns ``None`` for a missing tile (offset 0 or byte count 0, which TIFF
    writers use for sparse slides).  Raises :class:`TileDecodeError` if the
    segment lies outside the file (truncated file) or the read is short.
    """
    where = _segment(level, index, col, row)
    if where is None:
        return None
    offset, count = where
    # (a source of frames gives the frame whole: its length is the segment's, the index's
    # count only an upper bound; ByteSource.read_segment)
    data, length = level.source.read_segment(offset, count)
    _check_read(level, col, row, len(data), length, offset)
    stats.bytes_read += length
    return data


def _segment(level: PyramidLevel, index: int, col: int, row: int) -> tuple[int, int] | None:
    """``(offset, byte count)`` of segment ``index``, None if missing; checked against the file size."""
    offset = int(level.tiles.offsets[index])
    count = int(level.tiles.bytecounts[index])
    if offset == 0 or count == 0:
        return None
    if offset + count > level.source.size:
        raise TileDecodeError(level.path, level.index, col, row,
                              past_eof_reason(offset, count, level.source.size))
    return offset, count


def _check_read(level: PyramidLevel, col: int, row: int, got: int, count: int, offset: int) -> None:
    if got != count:
        raise TileDecodeError(level.path, level.index, col, row,
                              short_read_reason(got, count, offset))


def read_tile_stream(level: PyramidLevel, index: int, col: int, row: int,
                     state: ThreadState, slot: int = 0) -> np.ndarray | None:
    """Read tile ``index`` of an nvImageCodec level as a complete code stream.

    Same checks, errors and statistics as :func:`read_tile_bytes`, plus the
    JPEG start-of-image check of the tile, but the bytes land in the calling
    thread's reusable read buffer with the JPEG prefix (SOI, Adobe marker,
    JPEGTables) already in front, with one ``preadv`` and no intermediate
    ``bytes`` objects.  Returns a ``(n,)`` uint8 view of that buffer (valid
    until this thread's next read into the same ``slot``), or ``None`` for a
    missing tile.

    Raises:
        TileDecodeError: segment past the end of the file, short read, or a
            JPEG tile that does not start with SOI.
    """
    where = _segment(level, index, col, row)
    if where is None:
        return None
    offset, count = where
    enc = level.encoding
    jpeg = enc.stream == "jpeg"
    prefix = enc.jpeg_prefix if jpeg else b""
    # a bare restart interval: the whole header goes in front; else the tile's SOI lands under the prefix's end
    start = len(prefix) if jpeg and enc.jpeg_scan_segments else (len(prefix) - 2 if prefix else 0)
    held: list = []

    def into(length: int) -> memoryview:  # the thread's read buffer, the segment's length after the prefix
        held[:] = state.read_buffer(start + length, slot)
        return held[1][start:start + length]

    got, count = level.source.read_segment_into(offset, count, into)  # (a frame: its own length)
    _check_read(level, col, row, got, count, offset)
    buf, view = held
    state.stats.bytes_read += count
    if jpeg and enc.jpeg_scan_segments:
        view[:start] = prefix
        if ends_with_restart(view[start:start + count]):
            view[start + count - 1] = EOI[1]
    elif jpeg:
        # (memoryview indexing gives plain ints: cheaper than numpy scalars)
        if count < 2 or view[start] != 0xFF or view[start + 1] != 0xD8:
            raise TileDecodeError(level.path, level.index, col, row,
                                  not_soi_reason(bytes(buf[start:start + min(count, 2)])))
        if prefix:
            view[:start + 2] = prefix
    return buf[:start + count]


def jpeg_stream(level: PyramidLevel, data: bytes, col: int, row: int) -> bytes:
    """The complete JPEG stream of one tile's bytes ``data`` (as read by :func:`read_tile_bytes`).

    Tiles with their own SOI: the level's prefix (SOI, Adobe RGB marker,
    JPEGTables) in place of that SOI.  NDPI restart intervals
    (``encoding.jpeg_scan_segments``): the level's header + the segment, its
    final RSTn replaced by EOI (see :class:`~wsitool.model.TileEncoding`).

    Raises:
        TileDecodeError: a tile that should start with SOI does not.
    """
    enc = level.encoding
    if enc.jpeg_scan_segments:
        return enc.jpeg_prefix + (data[:-2] + EOI if ends_with_restart(data) else data)
    if not data.startswith(SOI):
        raise TileDecodeError(level.path, level.index, col, row, not_soi_reason(data[:2]))
    return jpeg_with_prefix(level.encoding.jpeg_prefix, data)


