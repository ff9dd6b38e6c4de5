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
"""

from __future__ import annotations

import abc
import contextlib
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import WsiError

__all__ = ["ByteSource", "CountedReads"]


class ByteSource(abc.ABC):
    """Random access to the bytes of one file.

    Attributes:
        path: the file's path or URL, as the user gave it (named in messages).
        size: its size in bytes, taken when opened.
    """

    path: str
    size: int
    #: True for a source whose reads are network requests: the region layer then
    #: always announces a region's tile ranges (:meth:`advise`) before reading them.
    remote: bool = False
    #: True for a source of frames fetched by number (DICOMweb,
    #: :class:`~wsitool.formats.dicom.web.frames.FrameSource`): a tile's offset is its frame's
    #: address and its byte count only an upper bound; the tile path reads it whole
    #: with ``read_frame(offset)``, and the region layer advises the tiles' addresses.
    framed: bool = False

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
        """Hint that the ``(offset, count)`` byte ranges will be read soon (read-ahead).

        ``ahead``: for a later batch than the one being read (a source may skip it where
        its budget is spent: :meth:`wsitool.storage.remote.RemoteSource.advise`).
        Advisory only: the default does nothing, and errors are never raised.
        """
        return  # the default: no read-ahead (not abstract: every source may keep it)

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
