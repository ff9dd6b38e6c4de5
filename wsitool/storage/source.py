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
from collections.abc import Iterable

__all__ = ["ByteSource"]


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
    #: :class:`~wsitool.storage.dicomweb.FrameSource`): a tile's offset is its frame's
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
    def readinto(self, offset: int, buffer) -> int:
        """Fill the writable buffer ``buffer`` with the bytes at ``offset``; return the count read.

        Raises:
            OSError: the read failed.
        """

    def advise(self, ranges: Iterable[tuple[int, int]]) -> None:
        """Hint that the ``(offset, count)`` byte ranges will be read soon (read-ahead).

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
    def reading(self) -> contextlib.AbstractContextManager:
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

    def __exit__(self, *exc) -> None:
        self.close()
