"""The encapsulated frames of one instance streamed into its file: items, offsets, batched writes (floor 6).

Each frame becomes one item of the Pixel Data's fragments (PS3.5 A.4): the item tag
``(FFFE,E000)``, a 32-bit length, the frame, and one zero byte where the frame's length is odd.
A frame comes as bytes, as a tuple of pieces laid end to end (a JPEG tile's new header and its
coded data, never joined), or many at once as a :class:`FrameRun` (the tiles of one long read
of the source, each behind the same prefix): the same items, with the bookkeeping done per run
rather than per frame (:func:`write_frames` gives the same bytes for the same frames either way,
``tests/export/test_storedruns.py``).

Writes: the pieces are gathered into batches of at most :data:`BATCH` pieces or
:data:`BATCH_BYTES` bytes, which one writer thread writes while this thread gathers the next (at
most one batch waiting, so the frames held are at most two batches), in ``os.writev`` calls of
at most :data:`WRITE_BYTES` bytes, resuming after short writes.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ...errors import WsiError

__all__ = ["BASIC_TABLE_LIMIT", "BATCH", "BATCH_BYTES", "WRITE_BYTES", "FrameRun", "item", "write_frames"]

#: the Basic Offset Table holds 32-bit offsets: frames that may reach this many bytes need the extended one
BASIC_TABLE_LIMIT = 2**32
#: pieces written by one ``os.writev`` (below the usual IOV_MAX of 1024)
BATCH = 960
#: frame bytes gathered for the writer thread at a time (8 MiB; a larger frame is a batch of its own)
BATCH_BYTES = 8 << 20
#: most bytes one write call takes (256 KiB, the I/O size of coreutils' ``cp``): larger writes make
#: Linux 6 take large folios for the page cache, which on a virtual machine that hands free memory
#: back to its host (virtio-balloon free page reporting) cost 6 to 8 times as much to write into
#: (docs/benchmarks/dicom-export-2026-12-08.md: 2.7 s against 0.37 s for 1 GB in 4 MiB writes)
WRITE_BYTES = 256 << 10

_ITEM_TAG = struct.Struct("<HHI")
_ITEM = 0xE000
#: an item header as numpy lays it out: group FFFE, element E000, 32-bit length
_ITEM_DTYPE = np.dtype([("group", "<u2"), ("element", "<u2"), ("length", "<u4")])


def item(length: int) -> bytes:
    """The 8-byte header of an item of ``length`` bytes (PS3.5 7.5)."""
    return _ITEM_TAG.pack(0xFFFE, _ITEM, length)


class FrameRun(NamedTuple):
    """Frames cut from one buffer: frame ``k`` is ``prefix`` then ``data[starts[k]:starts[k] + counts[k]]``.

    Attributes:
        data: the buffer (bytes or a view; kept alive until the frames are written).
        starts: ``(n,)`` int64, each frame's first byte in ``data``.
        counts: ``(n,)`` int64, each frame's byte count in ``data`` (at least 1 with ``prefix`` empty).
        prefix: bytes in front of every frame (empty: none).
    """

    data: memoryview | bytes
    starts: np.ndarray
    counts: np.ndarray
    prefix: bytes = b""


class _Sink:
    """The items of one instance's frames as they come, and the writer thread that writes them."""

    def __init__(self, fd: int, path: Path, count: int, extended: bool, writer: ThreadPoolExecutor):
        self.fd, self.path, self.count, self.extended, self.writer = fd, path, count, extended, writer
        self.offsets: list[int] = []
        self.lengths: list[int] = []
        self.pending: list = []
        self.pos = self.n = self.held = 0
        self.writing: Future | None = None

    def frame(self, parts: tuple) -> None:
        size = sum(map(len, parts))
        if self.n >= self.count:
            raise WsiError(f"{self.path.name}: more frames than the {self.count} announced")
        if not size:
            raise WsiError(f"{self.path.name}: frame {self.n + 1} is empty")
        self._check_offset(self.pos)
        odd = size & 1
        self.offsets.append(self.pos)
        self.lengths.append(size + odd)
        self.pending.append(item(size + odd))
        self.pending.extend(parts)
        if odd:
            self.pending.append(b"\0")
        self.pos += 8 + size + odd
        self.held += size
        self.n += 1
        if len(self.pending) >= BATCH or self.held >= BATCH_BYTES:
            self.hand_over()

    def run(self, run: FrameRun) -> None:
        """The frames of ``run``, in pieces of at most BATCH / 4 frames (each frame at most 4 pieces)."""
        step = BATCH // 4
        for at in range(0, len(run.starts), step):
            self._run_part(run.data, run.starts[at:at + step], run.counts[at:at + step], run.prefix)

    def _run_part(self, data, starts: np.ndarray, counts: np.ndarray, prefix: bytes) -> None:
        k = len(starts)
        if self.n + k > self.count:
            raise WsiError(f"{self.path.name}: more frames than the {self.count} announced")
        sizes = counts.astype(np.int64) + len(prefix)
        if k and int(sizes.min()) <= 0:
            raise WsiError(f"{self.path.name}: frame {self.n + 1 + int(np.argmin(sizes))} is empty")
        odd = sizes & 1
        lengths = sizes + odd
        at = self.pos + np.concatenate(([0], np.cumsum(lengths + 8)[:-1])).astype(np.int64)
        if k:
            self._check_offset(int(at[-1]))
        heads = np.empty(k, _ITEM_DTYPE)
        heads["group"], heads["element"], heads["length"] = 0xFFFE, _ITEM, lengths
        hv = memoryview(heads.tobytes())
        view = memoryview(data)
        pending = self.pending
        for j, (s, c, o) in enumerate(zip(starts.tolist(), counts.tolist(), odd.tolist(), strict=True)):
            pending.append(hv[8 * j:8 * j + 8])
            if prefix:
                pending.append(prefix)
            pending.append(view[s:s + c])
            if o:
                pending.append(b"\0")
        self.offsets.extend(at.tolist())
        self.lengths.extend(lengths.tolist())
        self.pos = int(at[-1] + 8 + lengths[-1]) if k else self.pos
        self.held += int(sizes.sum())
        self.n += k
        if len(pending) >= BATCH or self.held >= BATCH_BYTES:
            self.hand_over()

    def _check_offset(self, last: int) -> None:
        if not self.extended and last >= BASIC_TABLE_LIMIT:
            raise WsiError(f"{self.path.name}: frames past 4 GiB need the Extended Offset Table")

    def hand_over(self) -> None:
        """Give the gathered pieces to the writer thread (after the batch before, whose error stops here)."""
        if self.writing is not None:
            self.writing.result()
        self.writing = self.writer.submit(writev_all, self.fd, self.pending)
        self.pending = []
        self.held = 0

    def drain(self) -> None:
        """Wait for the batch in flight (its error raised) and write what is left here."""
        if self.writing is not None:
            self.writing.result()
        writev_all(self.fd, self.pending)


def write_frames(fh, path: Path, frames: Iterable, count: int, extended: bool) -> tuple[np.ndarray, np.ndarray]:
    """Write the items of ``frames`` (module docstring) at the position of ``fh``; their offsets (from the
    first frame's item tag) and item lengths, ``(count,)`` uint64 each.

    Raises:
        WsiError: another count than ``count``, an empty frame, or (``extended`` False) a frame that
            starts past the 32-bit offsets of the Basic Offset Table.
        OSError: a write failed (on the writer thread; raised here).
    """
    fh.flush()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="wsitool-write") as writer:
        sink = _Sink(fh.fileno(), path, count, extended, writer)
        try:
            for data in frames:
                if isinstance(data, FrameRun):
                    sink.run(data)
                else:
                    sink.frame(data if isinstance(data, tuple) else (data,))
        except BaseException:
            if sink.writing is not None:  # (the file is closed after this: let the write in flight end first)
                wait([sink.writing])
            raise
        sink.drain()
    fh.seek(0, os.SEEK_END)  # the buffered file object's position after the raw writes
    if sink.n != count:
        raise WsiError(f"{path.name}: {sink.n} frames written, {count} announced")
    return np.asarray(sink.offsets, np.uint64), np.asarray(sink.lengths, np.uint64)


def writev_all(fd: int, pending: list) -> None:
    """Write ``pending`` (and empty it) in ``os.writev`` calls of at most :data:`WRITE_BYTES` bytes and
    :data:`BATCH` pieces each (a larger piece is cut), resuming after short writes."""
    group: list = []
    size = 0
    for piece in pending:
        n = len(piece)
        at = 0
        while at < n:
            take = min(n - at, WRITE_BYTES - size)
            group.append(piece if take == n else memoryview(piece)[at:at + take])
            size += take
            at += take
            if size >= WRITE_BYTES or len(group) >= BATCH:
                _write_all(fd, group)
                group, size = [], 0
    if group:
        _write_all(fd, group)
    pending.clear()


def _write_all(fd: int, group: list) -> None:
    """One ``os.writev`` of ``group``, then more for what a short write left."""
    total = sum(map(len, group))
    while True:
        done = os.writev(fd, group)
        if done == total:
            return
        total -= done
        while done >= len(group[0]):
            done -= len(group[0])
            group.pop(0)
        if done:
            group[0] = memoryview(group[0])[done:]
