"""A read-only file object over a byte source, for parsers that want one (floor 1).

tifffile parses a remote TIFF through :class:`SourceFile`: every ``read`` is a
positional read of the source (so it comes from the remote source's block cache,
never from a read-ahead of its own), clamped to the bytes the source holds.
A view may be told ranges to *blank*: a read of exactly such a range gives
zeros and fetches nothing (the tile tables of a remote TIFF, which tifffile
parses at open but wsitool fetches when their level is first read:
:mod:`wsitool.formats.tiff.tables`).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from typing import Any

from .source import ByteSource

__all__ = ["SourceFile"]


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

    def __init__(self, source: ByteSource, blank: Iterable[tuple[int, int]] = ()):
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
