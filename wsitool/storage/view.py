"""A read-only file object over a byte source, for parsers that want one (floor 1).

tifffile parses a remote TIFF through :class:`SourceFile`: every ``read`` is a
positional read of the source (so it comes from the remote source's block cache,
never from a read-ahead of its own), clamped to the bytes the source holds.
"""

from __future__ import annotations

import io
import os
from typing import Any

from .source import ByteSource

__all__ = ["SourceFile"]


class SourceFile(io.RawIOBase):
    """A seekable, read-only binary file whose bytes are those of ``source``.

    Reads never ask the source for more than is left before its end.  Closing
    the view does not close the source.  ``name`` is the source's shown name.
    """

    def __init__(self, source: ByteSource):
        super().__init__()
        self._source = source
        self._pos = 0
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
        data = self._source.read(self._pos, count)
        view[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        left = max(0, self._source.size - self._pos)
        size = left if size is None or size < 0 else min(size, left)
        if size == 0:
            return b""
        data = self._source.read(self._pos, size)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)
