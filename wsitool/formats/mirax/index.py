"""``Index.dat``: where a MIRAX slide's images and records are (floor 3).

Layout, as OpenSlide 4.0.1 reads it (little-endian int32 throughout):

* the version ``01.02`` and the slide id (``SLIDE_ID`` of Slidedat.ini), as text;
* at the end of that header, the pointer to the *hierarchical* root, then the pointer to the
  *non-hierarchical* root;
* hierarchical: the root is a table with a pointer per zoom level (the ``Slide zoom level``
  hierarchy comes first); each points at a list head ``0, first page``; a data page is
  ``count, next page`` (0: the last) followed by ``count`` records ``(image index, offset,
  length, data file number)``;
* non-hierarchical: the root is a table with a pointer per record (numbered across all the
  ``NONHIER_i`` names in Slidedat.ini order); each points at ``0, page``; the page is
  ``count (>= 1), next, 0, 0, offset, length, data file number``.

The whole file is read once (at most :data:`MAX_BYTES`); every pointer is checked against its
length and every page list against cycles, so a broken index is one
:class:`~wsitool.errors.CorruptFileError`, never a loop.
"""

from __future__ import annotations

import struct

import numpy as np

from ...errors import CorruptFileError

__all__ = ["Index", "MAX_BYTES", "VERSION"]

VERSION = b"01.02"
#: Largest Index.dat read (16 bytes a camera image: room for some 4 million images a level).
MAX_BYTES = 256 << 20


class Index:
    """An Index.dat's bytes with the slide id it must carry.

    Raises (constructor):
        CorruptFileError: another version, or another slide id.
    """

    def __init__(self, data: bytes, slide_id: str, datafile_count: int):
        self.data = data
        self.datafile_count = datafile_count
        sid = slide_id.encode("utf-8", "surrogateescape")
        if data[:len(VERSION)] != VERSION:
            raise CorruptFileError("Index.dat doesn't have the expected version (01.02)")
        if data[len(VERSION):len(VERSION) + len(sid)] != sid:
            raise CorruptFileError("Index.dat doesn't have a matching slide identifier")
        self.hier_root = len(VERSION) + len(sid)
        self.nonhier_root = self.hier_root + 4

    def i32(self, pos: int, what: str) -> int:
        """The int32 at ``pos``; CorruptFileError naming ``what`` where it lies outside the file."""
        if pos < 0 or pos + 4 > len(self.data):
            raise CorruptFileError(f"Index.dat: can't read {what} at offset {pos} (file of {len(self.data)} bytes)")
        return struct.unpack_from("<i", self.data, pos)[0]

    def nonhier(self, record: int) -> tuple[int, int, int]:
        """``(offset, length, data file number)`` of non-hierarchical record ``record``.

        Raises:
            CorruptFileError: a pointer outside the file, a page not as described, a file number
                outside the slide's data files.
        """
        table = self.i32(self.nonhier_root, "the non-hierarchical root")
        ptr = self.i32(table + 4 * record, f"non-hierarchical record pointer {record}")
        if self.i32(ptr, f"non-hierarchical record {record}") != 0:
            raise CorruptFileError(f"Index.dat: expected 0 at the start of non-hierarchical record {record}")
        page = self.i32(ptr + 4, f"the data page of non-hierarchical record {record}")
        if self.i32(page, "a data page's count") < 1:
            raise CorruptFileError(f"Index.dat: non-hierarchical record {record} has no data item")
        if self.i32(page + 8, "a data page") != 0 or self.i32(page + 12, "a data page") != 0:
            raise CorruptFileError(f"Index.dat: expected zeros in the data page of record {record}")
        offset = self.i32(page + 16, "a record's offset")
        length = self.i32(page + 20, "a record's length")
        fileno = self.i32(page + 24, "a record's file number")
        if offset < 0 or length < 0:
            raise CorruptFileError(f"Index.dat: non-hierarchical record {record} at offset {offset}, "
                                   f"length {length}")
        if not 0 <= fileno < self.datafile_count:
            raise CorruptFileError(f"Index.dat: invalid data file number {fileno} (record {record})")
        return offset, length, fileno

    def level_records(self, level: int) -> np.ndarray:
        """The ``(n, 4)`` int64 records ``(image index, offset, length, file number)`` of zoom
        level ``level``, in page order.

        Raises:
            CorruptFileError: a pointer outside the file, a list that loops, a negative value or
                a file number outside the slide's data files.
        """
        table = self.i32(self.hier_root, "the hierarchical root")
        head = self.i32(table + 4 * level, f"zoom level {level}'s pointer")
        if self.i32(head, f"zoom level {level}'s list") != 0:
            raise CorruptFileError(f"Index.dat: expected 0 at the start of zoom level {level}'s list")
        page = self.i32(head + 4, f"zoom level {level}'s first page")
        parts: list[np.ndarray] = []
        seen: set[int] = set()
        while True:
            if page in seen:
                raise CorruptFileError(f"Index.dat: zoom level {level}'s page list loops (page at {page})")
            seen.add(page)
            count = self.i32(page, "a page's length")
            nxt = self.i32(page + 4, "a page's next pointer")
            if count < 0 or page + 8 + 16 * count > len(self.data):
                raise CorruptFileError(f"Index.dat: page at {page} of zoom level {level} holds {count} records "
                                       "past the end of the file")
            recs = np.frombuffer(self.data, "<i4", 4 * count, page + 8).reshape(count, 4)
            parts.append(recs.astype(np.int64))
            if nxt == 0:
                break
            page = nxt
        recs = np.concatenate(parts) if parts else np.zeros((0, 4), np.int64)
        for col, what in enumerate(("image_index", "offset", "length", "fileno")):
            if recs.size and int(recs[:, col].min()) < 0:
                raise CorruptFileError(f"Index.dat: zoom level {level}: {what} < 0")
        if recs.size and int(recs[:, 3].max()) >= self.datafile_count:
            raise CorruptFileError(f"Index.dat: zoom level {level}: invalid data file number {int(recs[:, 3].max())}")
        return recs
