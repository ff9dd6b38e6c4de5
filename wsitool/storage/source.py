"""The byte-source interface: read ranges of a slide's bytes, know its size, close it (floor 1).

Ground rules every implementation keeps:

* Reads are positional (no shared file position), so any number of threads
  read one source at once.
* :meth:`ByteSource.reading` brackets one read operation (a region read);
  :meth:`ByteSource.close` waits for the operations in flight and later ones
  raise :class:`~wsitool.errors.WsiError` ("slide is closed"), so no read ever
  uses a released descriptor or connection.
* After ``fork()`` a source stays usable in the child (a local descriptor is
  inherited; a remote source reconnects on its first read there).

Storage policy is the source's own: the layers above say what they will read
(:meth:`ByteSource.advise`: the ranges of the segments it needs) and read segments through
:meth:`ByteSource.read_segment`; a local file applies its ``fadvise`` rule, a remote one
merges the ranges and queues their requests, a source of frames batches them.  Nothing above
branches on which kind of source it holds: where the layers above need a decision, the
source states it (:attr:`ByteSource.defer_metadata`, :attr:`ByteSource.gathers`).
"""

from __future__ import annotations

import abc
import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO, cast

from ..errors import WsiError
from .view import SourceFile

__all__ = ["ByteSource", "CountedReads"]


class ByteSource(abc.ABC):
    """Random access to the bytes of one file.

    Attributes:
        path: the file's path or URL, as the user gave it (named in messages).
        size: its size in bytes, taken when opened.
    """

    path: str
    size: int
    #: What the source is (for messages and ``info``): True for a source whose reads are
    #: network requests.  The layers above do not branch on it: they use the policy verbs.
    remote: bool = False
    #: What the source is: True for a source of frames fetched by number (DICOMweb,
    #: :class:`~wsitool.formats.dicom.web.frames.FrameSource`): a tile's offset is its frame's
    #: address and its byte count only an upper bound (:meth:`read_segment` reads it whole).
    framed: bool = False
    #: Storage policy for parsers: True where the metadata a parse does not need at once (a
    #: TIFF's tile tables, a walk over every fragment item of a DICOM file) is better read when
    #: first used, or taken from an offset table on trust, because each read is a request.
    defer_metadata: bool = False
    #: True where :meth:`gather` serves the compiled JPEG loop the bytes of a region's tiles
    #: (a source read by byte ranges over the network); the loop reads a source with a
    #: descriptor (:meth:`fileno`) directly, and takes no other.
    gathers: bool = False

    @abc.abstractmethod
    def read(self, offset: int, count: int) -> bytes:
        """Up to ``count`` bytes at byte ``offset`` (fewer only at the end of the file).

        Raises:
            OSError: the read failed.
        """

    @abc.abstractmethod
    def readinto(self, offset: int, buffer: Any) -> int:
        """Fill the writable buffer ``buffer`` with the bytes at ``offset``; return the count read.

        Raises:
            OSError: the read failed.
        """

    def advise(self, ranges: Iterable[tuple[int, int]], ahead: bool = False) -> None:
        """Hint that the bytes of the ``(offset, count)`` ranges will be read soon: the one verb
        of storage policy.  ``ranges``: the segments (tiles, strips, frames) a read needs, in
        the order it reads them, as the index gives them (a row's neighbours may come as one
        range: :func:`wsitool.read.plan.segment_ranges`); each source decides what to do
        (:class:`~wsitool.storage.local.LocalFile`: ``posix_fadvise``, unless a few short ranges:
        :data:`~wsitool.storage.local.ADVISE_MIN_BYTES`;
        :class:`~wsitool.storage.remote.RemoteSource`: merged requests in flight at once;
        :class:`~wsitool.formats.dicom.web.frames.FrameSource`: the frames whose addresses the
        ranges hold, in one request).

        ``ahead``: for a later batch than the one being read (a source may skip it where
        its budget is spent: :meth:`wsitool.storage.remote.RemoteSource.advise`).
        Advisory only: the default does nothing, and errors are never raised.
        """
        return  # the default: no read-ahead (not abstract: every source may keep it)

    def gather(self, ranges: Iterable[tuple[int, int]]) -> list[tuple[int, bytes]]:
        """The bytes of the ``(offset, count)`` ranges, as ``(start, data)`` extents in
        ascending ``start`` that hold every range whole (the compiled JPEG loop reads a
        region's tiles from them where :attr:`gathers`).  The default reads each range.

        Raises:
            OSError, WsiError: a read failed (as :meth:`read`).
        """
        return sorted(((o, self.read(o, c)) for o, c in ranges if c > 0), key=lambda e: e[0])

    def read_segment(self, offset: int, count: int) -> tuple[bytes, int]:
        """One stored segment (a tile, a strip, a frame) whose index entry is ``(offset,
        count)``: ``(its bytes, its length)``.  The default reads ``count`` bytes and the
        length is ``count`` (fewer bytes is a short read: the caller reports it); a source whose
        counts are upper bounds gives the segment whole and its own length.

        Raises:
            OSError, WsiError: the read failed.
        """
        return self.read(offset, count), count

    def read_segment_into(self, offset: int, count: int, buffer: Callable[[int], Any]) -> tuple[int, int]:
        """As :meth:`read_segment`, into ``buffer(length)`` (the caller's writable of ``length``
        bytes): ``(bytes read, length)``.

        Raises:
            OSError, WsiError: the read failed.
        """
        return self.readinto(offset, buffer(count)), count

    def open_file(self, blank: Iterable[tuple[int, int]] = ()) -> BinaryIO:
        """A read-only binary file of the source's bytes for a parser (tifffile), whose reads
        never ask for more than the source holds; closing it leaves the source open.
        ``blank``: ranges that read as zeros when read exactly
        (:class:`~wsitool.storage.view.SourceFile`; a source parsed eagerly has none).

        Raises:
            OSError: the file cannot be opened.
        """
        return cast(BinaryIO, SourceFile(self, blank))

    def fileno(self) -> int | None:
        """A file descriptor that ``pread`` works on, or None (not a local file).

        Only valid inside :meth:`reading`; the compiled JPEG tile loop reads
        through it and applies only where there is one.
        """
        return None

    @abc.abstractmethod
    def reading(self) -> contextlib.AbstractContextManager[Any]:
        """Context manager around one read operation; :meth:`close` waits for it.

        Raises:
            WsiError: the source is closed or closing.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the source after the reads in flight finished; idempotent, any thread."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """True once :meth:`close` was called."""

    def __enter__(self) -> ByteSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CountedReads:
    """The bookkeeping behind :meth:`ByteSource.reading` and :meth:`ByteSource.close` of a
    source that owns something a read uses (a descriptor, connections): the read
    operations in flight are counted under ``_lock``, and closing waits on ``_idle``
    until none is left.

    A subclass calls :meth:`_reset_reads` in its constructor (and after ``fork()``, for
    a fresh lock), says in :meth:`_released` whether what reads need is gone, brackets
    its reads with :meth:`_counted`, and calls :meth:`_wait_for_readers` from its
    ``close`` while it holds ``_idle``.
    """

    _lock: threading.Lock
    _idle: threading.Condition
    _readers: int  # operations inside reading()
    _closing: bool = False

    def _reset_reads(self) -> None:
        """A new lock and condition, and no read in flight (``_closing`` is kept)."""
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._readers = 0

    def _released(self) -> bool:
        """True once the source released what reads use (the caller holds ``_lock``)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def _counted(self, shown: str) -> Iterator[None]:
        """One read operation, counted while it runs.

        Raises:
            WsiError: the source is closed or closing ("``shown``: slide is closed").
        """
        with self._lock:
            if self._released() or self._closing:
                raise WsiError(f"{shown}: slide is closed")
            self._readers += 1
        try:
            yield
        finally:
            with self._lock:
                self._readers -= 1
                if self._readers == 0:
                    self._idle.notify_all()

    def _wait_for_readers(self) -> None:
        """Refuse new reads and wait until the ones in flight finished (the caller holds ``_idle``)."""
        self._closing = True
        while self._readers:
            self._idle.wait()

