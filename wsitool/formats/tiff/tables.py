"""Tile tables of a remote TIFF, fetched when their level is first read (floor 3).

tifffile reads the TileOffsets (tag 324) and TileByteCounts (tag 325) arrays of
an IFD when it parses the IFD (both are in its ``TIFF.TAG_LOAD`` list of values
it does not delay-load).  Over the network that would fetch every level's table
at open: a 100,000 x 100,000 level of 256 x 256 tiles has two arrays of 152,600
entries, 1.2 MB in a classic TIFF and 2.4 MB in a BigTIFF.  So for a remote
slide (a source that defers metadata: :attr:`wsitool.storage.ByteSource.defer_metadata`):

1. :func:`scan` walks the IFD chain and the SubIFDs (tag 330) and notes, from
   the IFD entries, where each IFD's two arrays lie (offset, field type, count)
   and where the IFDs and every other value stored outside its entry lie; it
   fetches the IFDs (the requests tifffile's own parse then finds in the cache)
   and none of the values.  tifffile parses the tags (a tifffile option to
   delay-load these two tags would make this walk unnecessary).
2. tifffile parses the file through a :class:`~wsitool.storage.SourceFile` that
   reads exactly those ranges as zeros (``blank``), so the ``TiffPage`` objects
   hold zeros for the deferred tables and nothing was fetched for them.
3. :meth:`DeferredTables.index` gives each level a
   :class:`~wsitool.model.TileIndex` that reads its real arrays when a read first
   needs them (:meth:`DeferredTables.values` reads one at once, for the
   associated images and ``openslide.quickhash-1``'s smallest level).

Deferred are arrays of field type SHORT, LONG (TIFF 6.0, section 2: types 3, 4)
or LONG8 (BigTIFF: type 16) too long to sit in their IFD entry, lying inside
the file, and sharing no byte with an IFD, another value or another table (nor
read as two field types), so the blank ranges hide nothing else.  Not deferred:
NDPI files (tag 65420 in the first IFD; tifffile rewrites NDPI offsets from the
real values while it parses), other field types, and any file :func:`scan`
cannot walk (tifffile's parse then reports what is wrong, as for a local file).
Local slides are parsed as before.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import numpy as np

from ...errors import CorruptFileError
from ...model import TileIndex
from ...storage import ByteSource

__all__ = ["DeferredTables", "Table", "scan", "EAGER"]

_OFFSETS, _COUNTS, _SUBIFDS, _NDPI_MARK = 324, 325, 330, 65420
#: Field types of a deferred table and their numpy codes (TIFF 6.0 section 2; BigTIFF).
_TYPES = {3: "u2", 4: "u4", 16: "u8"}
#: At most this many IFDs (chain and SubIFDs) are walked; beyond, tables load at parse as before.
MAX_IFDS = 4096
#: A level's two tables at most this many bytes apart are read with one read.
GAP = 64 * 1024
#: An IFD with more entries than this is passed over (tifffile's own bound for an entry count).
_MAX_ENTRIES = 4096


@dataclasses.dataclass(frozen=True)
class Table:
    """Where one deferred array lies: ``count`` values of numpy type ``dtype`` at byte ``offset``."""

    offset: int
    dtype: str
    count: int

    @property
    def nbytes(self) -> int:
        """Bytes of the array in the file."""
        return self.count * np.dtype(self.dtype).itemsize


class DeferredTables:
    """The deferred tile tables of one remote TIFF (none: :data:`EAGER`).

    Args:
        source: the slide's bytes.
        tables: the deferred arrays by their byte offset.
    """

    def __init__(self, source: ByteSource | None, tables: dict[int, Table]):
        self._source = source
        self._tables = dict(tables)
        self._read_once: dict[int, np.ndarray] = {}  # what values() read, for the level's index

    @property
    def blank(self) -> frozenset[tuple[int, int]]:
        """``(offset, count)`` of each deferred array: what tifffile's parse reads as zeros."""
        return frozenset((t.offset, t.nbytes) for t in self._tables.values())

    def __len__(self) -> int:
        return len(self._tables)

    def table(self, tag: Any) -> Table | None:
        """The deferred array of tifffile's ``TiffTag`` ``tag`` (324 or 325), or None where
        tifffile read the tag's value itself."""
        if tag is None or int(tag.code) not in (_OFFSETS, _COUNTS):
            return None
        found = self._tables.get(int(tag.valueoffset))
        if found is None or found.count != int(tag.count) or found.dtype[1:] != _TYPES.get(int(tag.dtype)):
            return None
        return found

    def values(self, tag: Any) -> Any:
        """The value of ``tag``: for a deferred table a ``(count,)`` uint64 array read now
        from the source, else tifffile's ``tag.value``.

        Raises:
            CorruptFileError: the array is cut short by the end of the file.
            WsiError: the source failed (a remote error).
        """
        table = self.table(tag)
        return tag.value if table is None else self._read(table)

    def index(self, page: Any, planes: int) -> TileIndex:
        """The :class:`~wsitool.model.TileIndex` of tifffile page ``page``: its tables as
        tifffile parsed them, or, where one is deferred, read on the index's first use."""
        deferred = (self.table(page.tags.get(_OFFSETS)), self.table(page.tags.get(_COUNTS)))
        if deferred == (None, None):
            return TileIndex(np.ascontiguousarray(page.dataoffsets, dtype=np.uint64),
                             np.ascontiguousarray(page.databytecounts, dtype=np.uint64), planes)
        eager = (page.dataoffsets, page.databytecounts)

        def load() -> tuple[np.ndarray, np.ndarray]:
            if None not in deferred:
                self._read_together(deferred)  # (one request, where the two lie close)
            offsets, counts = (np.ascontiguousarray(eager[k], dtype=np.uint64) if t is None else self._read(t)
                               for k, t in enumerate(deferred))
            return offsets, counts

        return TileIndex(None, None, planes, load=load)

    def _read_together(self, pair: tuple[Table | None, Table | None]) -> None:
        """Read the two tables of a level with one read where at most :data:`GAP` bytes lie
        between them (writers put them side by side), so their first use costs one request."""
        tables = sorted((t for t in pair if t is not None and t.offset not in self._read_once),
                        key=lambda t: t.offset)
        if len(tables) != 2:
            return
        first, last = tables
        gap = last.offset - (first.offset + first.nbytes)
        if not 0 <= gap <= GAP:
            return
        assert self._source is not None
        data = self._source.read(first.offset, last.offset + last.nbytes - first.offset)
        for t in tables:
            self._keep(t, data[t.offset - first.offset:t.offset - first.offset + t.nbytes])

    def _read(self, table: Table) -> np.ndarray:
        done = self._read_once.get(table.offset)
        if done is not None:
            return done
        assert self._source is not None
        return self._keep(table, self._source.read(table.offset, table.nbytes))

    def _keep(self, table: Table, data: bytes) -> np.ndarray:
        if len(data) != table.nbytes:
            raise CorruptFileError(f"tile table at byte {table.offset} is cut short by the end "
                                   "of the file")
        values = np.ascontiguousarray(np.frombuffer(data, table.dtype), dtype=np.uint64)
        values.flags.writeable = False
        self._read_once[table.offset] = values
        return values


#: No deferred table: every table as tifffile parsed it (local slides, NDPI).
EAGER = DeferredTables(None, {})


def scan(source: ByteSource) -> DeferredTables:
    """The tile tables of the TIFF in ``source`` that tifffile's parse can leave unread
    (module docstring).  :data:`EAGER` where there are none, the file is an NDPI, or its
    structure cannot be walked (tifffile's parse then says why).  A table whose bytes
    overlap an IFD, another tag's value or another table, or that two entries read
    differently, is not deferred: tifffile reads it as before.

    Raises:
        WsiError: the source failed (a remote error).
    """
    layout = _layout(source.read(0, 16))
    if layout is None:
        return EAGER
    walk = _Walk(source, layout)
    try:
        ndpi = walk.run()
    except (struct.error, _TooMany):  # an IFD cut short, or a structure too big to walk
        return EAGER
    found = walk.tables()
    if ndpi or not found:
        return EAGER
    return DeferredTables(source, found)


def _layout(head: bytes) -> tuple[str, int, int] | None:
    """``(byte order, offset size, first IFD's offset)`` from a TIFF (TIFF 6.0 section 2)
    or BigTIFF header, or None."""
    order = {b"II": "<", b"MM": ">"}.get(head[:2])
    if order is None or len(head) < 16:
        return None
    version = struct.unpack(order + "H", head[2:4])[0]
    if version == 42:
        return order, 4, struct.unpack(order + "I", head[4:8])[0]
    if version == 43 and struct.unpack(order + "HH", head[4:8]) == (8, 0):
        return order, 8, struct.unpack(order + "Q", head[8:16])[0]
    return None


class _TooMany(Exception):
    """The walk met more IFD entries than :data:`MAX_ENTRIES_WALKED`."""


#: Bytes of one value of each TIFF field type (TIFF 6.0 section 2; BigTIFF: 16-18).
_TYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4,
               16: 8, 17: 8, 18: 8}
#: The walk gives up (every table read at parse, as before) past this many IFD entries.
MAX_ENTRIES_WALKED = 1 << 16


class _Walk:
    """One walk of a TIFF's IFD chain and SubIFDs (:func:`scan`).

    An IFD (TIFF 6.0 section 2; BigTIFF) is an entry count (2 bytes; BigTIFF 8), that
    many entries of tag code (2), field type (2), value count (4; 8) and a value field
    (4; 8) holding the value or its offset, then the next IFD's offset.  The walk notes
    the tables of tags 324 and 325, follows tag 330 (the first of an IFD) and the chain,
    looks for tag 65420 (NDPI) in the first IFD, and notes where every IFD and every
    other out-of-line value lies; tifffile parses the rest.
    """

    def __init__(self, source: ByteSource, layout: tuple[str, int, int]):
        self.source = source
        self.order, self.osize, self.first = layout
        self.candidates: list[Table] = []
        self.others: list[tuple[int, int]] = []  # [start, end) of IFDs and other values
        self.entries = 0

    def run(self) -> bool:
        """Walk; True when the file is an NDPI (the walk stops at its first IFD)."""
        order, osize = self.order, self.osize
        head_fmt = order + ("H", "Q")[osize == 8]
        head_size, entry_size = struct.calcsize(head_fmt), 4 + 2 * osize
        seen: set[int] = set()
        chain, pending = self.first, set[int]()  # the next IFD of the chain; SubIFDs to read
        while len(seen) < MAX_IFDS and (chain or pending):
            in_chain = bool(chain)
            at, chain = (chain, 0) if in_chain else (pending.pop(), chain)
            if not 8 <= at < self.source.size - head_size or at in seen:
                continue
            seen.add(at)
            n = struct.unpack(head_fmt, self.source.read(at, head_size))[0]
            if n > _MAX_ENTRIES:
                continue
            self.entries += n
            if self.entries > MAX_ENTRIES_WALKED:
                raise _TooMany
            block = self.source.read(at + head_size, n * entry_size + osize)
            self.others.append((at, at + head_size + n * entry_size + osize))
            subifds = self._entries(block, n, len(seen) == 1)
            if subifds is None:
                return True
            pending.update(o for o in subifds if o not in seen)
            while len(pending) + len(seen) > MAX_IFDS:
                pending.pop()
            if in_chain:  # (tifffile reads the SubIFDs a tag lists, not chains from them)
                chain = struct.unpack_from(order + ("I", "Q")[osize == 8], block, n * entry_size)[0]
        return False

    def _entries(self, block: bytes, n: int, first_ifd: bool) -> list[int] | None:
        """Look at the ``n`` entries in ``block``; the SubIFDs they list, None for an NDPI."""
        order, osize = self.order, self.osize
        entry_fmt, entry_size = order + ("HHI", "HHQ")[osize == 8], 4 + 2 * osize
        offset_fmt = order + ("I", "Q")[osize == 8]
        subifds: list[int] | None = []
        for k in range(n):
            code, dtype, count = struct.unpack_from(entry_fmt, block, k * entry_size)
            field = block[k * entry_size + 4 + osize:(k + 1) * entry_size]
            if code == _NDPI_MARK and first_ifd:
                return None
            nbytes = count * _TYPE_SIZES.get(dtype, 0)
            if nbytes <= osize:
                continue  # (the value sits in its entry)
            at = struct.unpack(offset_fmt, field)[0]
            kind = _TYPES.get(dtype)
            if code in (_OFFSETS, _COUNTS) and kind is not None:
                self.candidates.append(Table(offset=int(at), dtype=order + kind, count=int(count)))
            else:
                self.others.append((at, at + nbytes))
            if code == _SUBIFDS and subifds == [] and count <= _MAX_ENTRIES and dtype in (4, 13, 16, 18):
                subifds = _subifds(self.source, order, osize, dtype, count, field)
        return subifds

    def tables(self) -> dict[int, Table]:
        """The candidates that can be deferred, by offset: inside the file, each offset read
        one way only, overlapping no IFD, other value or other table."""
        size = self.source.size
        by_offset: dict[int, set[Table]] = {}
        for t in self.candidates:
            by_offset.setdefault(t.offset, set()).add(t)
        tables = {o: next(iter(ts)) for o, ts in by_offset.items()
                  if len(ts) == 1 and 8 <= o and o + next(iter(ts)).nbytes <= size}
        spans = sorted([(o, o + t.nbytes, o) for o, t in tables.items()]
                       + [(a, b, -1) for a, b in self.others if b > a])
        clash: set[int] = set()
        end, owner = -1, -1  # the furthest end so far, and whose
        for a, b, who in spans:
            if a < end:  # overlaps what came before
                clash.update(x for x in (who, owner) if x >= 0)
            if b > end:
                end, owner = b, who
        return {o: t for o, t in tables.items() if o not in clash}


def _subifds(source: ByteSource, order: str, osize: int, dtype: int, count: int, field: bytes) -> list[int]:
    """The IFD offsets a SubIFDs entry (tag 330; LONG, IFD, LONG8 or IFD8) lists."""
    code = "I" if dtype in (4, 13) else "Q"
    nbytes = count * struct.calcsize(code)
    if nbytes <= osize:
        data = field[:nbytes]
    else:
        at = struct.unpack(order + ("I", "Q")[osize == 8], field)[0]
        data = source.read(at, nbytes) if at + nbytes <= source.size else b""
    return list(struct.unpack(f"{order}{len(data) // struct.calcsize(code)}{code}", data))
