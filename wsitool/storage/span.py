"""Several files read as one byte source: their bytes laid end to end (floor 1).

A DICOM concatenation (PS3.3 C.7.6.16.2.2.4) splits one image's frames over
several instances, one file each; a :class:`Span` gives the level one source
whose address space is the parts one after the other (part ``k`` starts at the
sum of the sizes of parts ``0 .. k-1``), so the format's tile index holds one
offset per frame as for a single file.  A read never crosses from one part
into the next (each frame lies inside its own file).  There is no single
descriptor, so :meth:`Span.fileno` is None (the compiled JPEG loop, which
reads through a descriptor, does not apply).
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .source import ByteSource

__all__ = ["Span"]


class Span(ByteSource):
    """The byte sources ``parts`` end to end, as one source (it owns and closes them).

    Args:
        parts: the sources, in order; at least one.  Messages name the first part's path (the file
            the concatenation's first instance is in).
    """

    def __init__(self, parts: Sequence[ByteSource]):
        if not parts:
            raise ValueError("a Span needs at least one part")
        self.parts = tuple(parts)
        self.path = parts[0].path
        self.bases: list[int] = []
        total = 0
        for part in self.parts:
            self.bases.append(total)
            total += part.size
        self.size = total

    def _part(self, offset: int) -> int:
        """Index of the part holding byte ``offset`` (-1 for a negative offset)."""
        return bisect.bisect_right(self.bases, offset) - 1

    def _locate(self, offset: int, count: int) -> tuple[ByteSource, int]:
        """``(part, offset in it)`` of ``count`` bytes at ``offset``.

        Raises:
            OSError: a negative offset, or a range crossing the end of its part (a
                frame never spans two files of a concatenation, PS3.3 C.7.6.16.2.2).
        """
        k = self._part(offset)
        if k < 0:
            raise OSError(f"{self.path}: negative offset {offset}")
        part, local = self.parts[k], offset - self.bases[k]
        if local + count > part.size:
            raise OSError(f"{self.path}: a read of {count} bytes at {offset} crosses the end of "
                          f"part {k} ({part.path})")
        return part, local

    def read(self, offset: int, count: int) -> bytes:
        """Up to ``count`` bytes at ``offset`` (fewer at the end of the last part).

        Raises:
            OSError: see :meth:`_locate` (a short read at the end of the span is not one).
        """
        k = self._part(offset)
        if k == len(self.parts) - 1 and k >= 0:  # the last part: a short read, as a file gives
            return self.parts[k].read(offset - self.bases[k], count)
        part, local = self._locate(offset, count)
        return part.read(local, count)

    def readinto(self, offset: int, buffer: Any) -> int:
        part, local = self._locate(offset, len(memoryview(buffer)))
        return part.readinto(local, buffer)

    def advise(self, ranges: Iterable[tuple[int, int]], ahead: bool = False) -> None:
        by_part: dict[int, list[tuple[int, int]]] = {}
        for offset, count in ranges:
            k = self._part(offset)
            if k >= 0:
                by_part.setdefault(k, []).append((offset - self.bases[k], count))
        for k, local in by_part.items():
            self.parts[k].advise(local, ahead)

    @contextlib.contextmanager
    def reading(self) -> Iterator[Span]:
        with contextlib.ExitStack() as stack:
            for part in self.parts:
                stack.enter_context(part.reading())
            yield self

    def close(self) -> None:
        for part in self.parts:
            part.close()

    @property
    def closed(self) -> bool:
        return any(part.closed for part in self.parts)

    def __repr__(self) -> str:
        return f"Span({len(self.parts)} parts, {self.size} bytes)"
