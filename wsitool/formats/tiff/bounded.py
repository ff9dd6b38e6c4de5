"""A file for tifffile to parse whose reads never ask for more than the file holds (floor 3).

tifffile sizes some reads by values taken from the file: an NDPI page's JPEG
header is read as ``McuStarts[0]`` bytes (tag 65426, see :mod:`.ndpi`), so a
hostile start far past the end of the file made the buffered reader allocate
that many bytes up front (a ``MemoryError`` under a memory cap, an
out-of-memory kill without one).  :class:`BoundedFile` clamps every ``read``
to the bytes between the position and the end of the file; what the file
holds reads as before, and the checks of the format layer then refuse the
values that point past it.
"""

from __future__ import annotations

import io
import os

__all__ = ["BoundedFile"]


class BoundedFile(io.BufferedReader):
    """A read-only buffered file whose ``read(n)`` asks for at most the bytes left in the file.

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
