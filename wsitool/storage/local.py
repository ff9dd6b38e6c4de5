"""A local file as a byte source: ``pread`` / ``preadv`` on one descriptor, ``posix_fadvise`` read-ahead (floor 1)."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO, cast

from ..errors import UnsupportedFormatError
from .source import ByteSource, CountedReads
from .view import BoundedFile

__all__ = ["LocalFile", "open_regular", "ADVISE_MIN_BYTES", "ADVISE_MIN_RANGES"]

#: A local file's ``fadvise`` rule: advice of fewer than :data:`ADVISE_MIN_RANGES` ranges and
#: fewer bytes than this (a few tiles of one or two rows) is not passed on: the first decode
#: would wait for its bytes anyway, the kernel's own read-ahead serves a read that goes on, and
#: the calls cost more than they save.
ADVISE_MIN_BYTES = 128 * 1024
ADVISE_MIN_RANGES = 3

#: What a path that is not a regular file is, as messages name it.
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def open_regular(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of ``path``, refused unless it is a regular file (or a folder).

    Opened with ``O_NONBLOCK`` (a FIFO's ``open`` would wait for a writer forever, a
    terminal's for a carrier), checked with ``fstat`` on that descriptor (no window
    for the path to change between the check and the open), then set blocking again.

    Raises:
        UnsupportedFormatError: a FIFO, socket or device (``/dev/zero``), naming the path and
            its kind (exit 3).
        FileNotFoundError, PermissionError, OSError: as ``os.open``.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise UnsupportedFormatError(f"{os.fspath(path)}: not a slide wsitool reads ({kind}, "
                                         "not a regular file)")
        if flags & getattr(os, "O_NONBLOCK", 0):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


class LocalFile(CountedReads, ByteSource):
    """A local file opened read-only.

    Args:
        path: the file.

    Raises:
        UnsupportedFormatError: not a regular file (a FIFO, a device: :func:`open_regular`).
        FileNotFoundError, PermissionError, OSError: as ``os.open``.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        self._fd = open_regular(self.path)
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
        """``POSIX_FADV_WILLNEED`` for each ``(offset, count)`` range, unless the advice is fewer
        than :data:`ADVISE_MIN_RANGES` ranges of fewer than :data:`ADVISE_MIN_BYTES` bytes;
        nothing for read-ahead of a later batch (``ahead``: each batch's own advice serves it).
        The read-ahead runs while the first tiles decode, so a cold file's reads overlap the
        decodes; on a cached file it costs one cheap call per range.  Errors are ignored."""
        if ahead or self._fd < 0 or not hasattr(os, "posix_fadvise"):
            return
        spans = ranges if isinstance(ranges, list) else list(ranges)
        if len(spans) < ADVISE_MIN_RANGES and sum(count for _, count in spans) < ADVISE_MIN_BYTES:
            return
        try:
            for offset, count in spans:
                os.posix_fadvise(self._fd, offset, count, os.POSIX_FADV_WILLNEED)
        except (OSError, OverflowError):  # pragma: no cover - advisory only
            pass

    def open_file(self, blank: Iterable[tuple[int, int]] = ()) -> BinaryIO:
        """The file of :attr:`path` opened again, buffered, its reads clamped to its size
        (:class:`~wsitool.storage.view.BoundedFile`; a local file is parsed eagerly: no ``blank``).

        Raises:
            OSError: the file cannot be opened.
        """
        return cast(BinaryIO, BoundedFile(self.path))

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

