"""Bytes held in memory, read as a byte source (floor 1).

For an image a format finds inside its file's metadata rather than at a byte range of
the file (a Philips TIFF's label and macro: base64 JPEG in its XML), decoded once at
open; the codec layer then reads it as it reads any segment.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..errors import WsiError
from .source import ByteSource

__all__ = ["MemorySource"]


class MemorySource(ByteSource):
    """The bytes ``data`` as a :class:`~wsitool.storage.ByteSource`.  Its :attr:`path` is
    ``"<memory>"``: what it holds is named by the error's context (the opener and the facade
    attach the slide's name; an associated image's errors name the image)."""

    path = "<memory>"

    def __init__(self, data: bytes):
        self._data = bytes(data)
        self.size = len(self._data)
        self._closed = False

    def read(self, offset: int, count: int) -> bytes:
        """Up to ``count`` bytes at ``offset`` (fewer at the end; none for a negative offset)."""
        if offset < 0 or count <= 0:
            return b""
        return self._data[offset:offset + count]

    def readinto(self, offset: int, buffer: Any) -> int:
        """Copy the bytes at ``offset`` into the writable ``buffer``; the count copied."""
        view = memoryview(buffer).cast("B")
        data = self.read(offset, len(view))
        view[:len(data)] = data
        return len(data)

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Nothing to wait for; raises :class:`~wsitool.errors.WsiError` once closed."""
        if self._closed:
            raise WsiError(f"{self.path} is closed")
        yield

    def close(self) -> None:
        """Mark closed (the bytes go with the object)."""
        self._closed = True

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed
