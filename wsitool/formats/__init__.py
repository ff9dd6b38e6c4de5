"""Container formats: each turns a file, a folder or a series into a :class:`~wsitool.model.Pyramid` (floor 3).

A format is a sub-package satisfying :class:`.contract.Format`: ``sniff(head:
bytes) -> bool`` (its magic in the first :data:`HEAD_BYTES` bytes of the file)
and ``open_pyramid(source) -> Pyramid``; it describes levels, tiles and
how each tile is encoded, and decodes nothing.  A format whose slides can be
folders, bucket prefixes or DICOMweb series has the entry point of that kind too
(:mod:`.contract`).  Which format opens a slide is the opener's choice
(:mod:`wsitool.opening.opener`): a new container is a new sub-package registered
there; nothing else changes.
"""

from __future__ import annotations

from .contract import FolderFormat, Format, PlacedFormat, PrefixFormat, SeriesFormat

__all__ = ["HEAD_BYTES", "Format", "FolderFormat", "PrefixFormat", "SeriesFormat", "PlacedFormat"]

#: Bytes read to recognise a format (a DICOM file's "DICM" sits at 128..132, PS3.10 7.1).
HEAD_BYTES = 132
