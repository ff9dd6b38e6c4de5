"""A local file as a byte source: ``pread`` / ``preadv`` on one descriptor, ``posix_fadvise`` read-ahead (floor 1)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from typing import Any

from .source import ByteSource, CountedReads

__all__ = ["LocalFile"]


class LocalFile(CountedReads, ByteSource):
    """A local file opened read-only.

    Args:
        path: the file.

    Raises:
        FileNotFoundError, PermissionError, OSError: as ``os.open``.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        self._fd = os.open(self.path, os.O_RDONLY)
        try:
            self.size = os.fstat(self._fd).st_size
        except BaseException:
            os.close(self._fd)
            raise
        self._reset_reads()
        self._closing = False

    def read(self, offset: int, count: int) -> bytes:
        return os.pread(self._fd, count, offset)

    def readinto(self, offset: int, buffer: Any) -> int:
        return os.preadv(self._fd, [buffer], offset)

    def advise(self, ranges: Iterable[tuple[int, int]], ahead: bool = False) -> None:
        """``POSIX_FADV_WILLNEED`` for each ``(offset, count)`` range; errors are ignored."""
        if self._fd < 0 or not hasattr(os, "posix_fadvise"):
            return
        try:
            for offset, count in ranges:
                os.posix_fadvise(self._fd, offset, count, os.POSIX_FADV_WILLNEED)
        except (OSError, OverflowError):  # pragma: no cover - advisory only
            pass

    def fileno(self) -> int | None:
        return self._fd if self._fd >= 0 else None

    def _released(self) -> bool:
        return self._fd < 0

    @contextlib.contextmanager
    def reading(self) -> Iterator[LocalFile]:
        with self._counted(self.path):
            yield self

    def close(self) -> None:
        """Release the descriptor once the reads in flight finished (do not call
        it from inside :meth:`reading` of the same source: it would wait for itself)."""
        with self._idle:
            self._wait_for_readers()
            fd, self._fd = self._fd, -1  # closed before the number is released
        if fd >= 0:
            os.close(fd)

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def __repr__(self) -> str:
        return f"LocalFile({self.path!r}, {self.size} bytes)"
