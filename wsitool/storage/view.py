"""Read-only file objects over a slide's bytes, for parsers that want one (floor 1).

tifffile parses a remote TIFF through :class:`SourceFile`: every ``read`` is a
positional read of the source (so it comes from the remote source's block cache,
never from a read-ahead of its own), clamped to the bytes the source holds.
A local file is parsed through :class:`BoundedFile`, a buffered file of its path
whose reads are clamped the same way (:meth:`wsitool.storage.ByteSource.open_file`).
A view may be told ranges to *blank*: a read of exactly such a range gives
zeros and fetches nothing (the tile tables of a remote TIFF, which tifffile
parses at open but wsitool fetches when their level is first read:
:mod:`wsitool.formats.tiff.tables`).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from typing import Any, Protocol

__all__ = ["SourceFile", "BoundedFile", "Readable"]


class Readable(Protocol):
    """What a :class:`SourceFile` reads: a :class:`~wsitool.storage.ByteSource`'s ``path``,
    ``size`` and positional ``read``."""

    path: str
    size: int

    def read(self, offset: int, count: int) -> bytes:
        """Up to ``count`` bytes at ``offset``."""


class SourceFile(io.RawIOBase):
    """A seekable, read-only binary file whose bytes are those of ``source``.

    Reads never ask the source for more than is left before its end.  Closing
    the view does not close the source.  ``name`` is the source's shown name.

    Args:
        source: the bytes.
        blank: ``(offset, count)`` ranges that read as ``count`` zero bytes when a
            read asks for exactly that range (any other read of those bytes reads
            the source).
    """

    def __init__(self, source: Readable, blank: Iterable[tuple[int, int]] = ()):
        super().__init__()
        self._source = source
        self._pos = 0
        self._blank = frozenset(blank)
        self.name = getattr(source, "shown", source.path)

    @property
    def size(self) -> int:
        return self._source.size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_SET:
            pos = offset
        elif whence == os.SEEK_CUR:
            pos = self._pos + offset
        elif whence == os.SEEK_END:
            pos = self._source.size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise OSError(f"{self.name}: negative seek position {pos}")
        self._pos = pos
        return pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        count = min(len(view), max(0, self._source.size - self._pos))
        if count == 0:
            return 0
        if (self._pos, count) in self._blank:
            view[:count] = bytes(count)
            self._pos += count
            return count
        data = self._source.read(self._pos, count)
        view[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        left = max(0, self._source.size - self._pos)
        size = left if size is None or size < 0 else min(size, left)
        if size == 0:
            return b""
        if (self._pos, size) in self._blank:
            self._pos += size
            return bytes(size)
        data = self._source.read(self._pos, size)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)


class BoundedFile(io.BufferedReader):
    """A read-only buffered file whose ``read(n)`` asks for at most the bytes left in the file.

    tifffile sizes some reads by values taken from the file: an NDPI page's JPEG header is
    read as ``McuStarts[0]`` bytes (tag 65426), so a hostile start far past the end of the
    file made the buffered reader allocate that many bytes up front (a ``MemoryError`` under
    a memory cap, an out-of-memory kill without one).  What the file holds reads as before,
    and the checks of the format layer then refuse the values that point past it.

    Args:
        path: the file to open (read-only, binary).

    Raises:
        OSError: the file cannot be opened.
    """

    def __init__(self, path: str | os.PathLike):
        raw = io.FileIO(os.fspath(path), "rb")
        try:
            super().__init__(raw)
            self._size = os.fstat(raw.fileno()).st_size
        except BaseException:
            raw.close()
            raise

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes from the current position (all that is left for None or a negative size)."""
        if size is not None and size > 0:
            size = min(size, max(0, self._size - self.tell()))
        return super().read(size)
