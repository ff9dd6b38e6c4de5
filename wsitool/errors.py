"""Exception hierarchy of wsitool.

Every error that wsitool raises on purpose derives from :class:`WsiError`, so
callers can catch one class.  The subclasses separate the causes a caller may
want to handle differently:

* :class:`UnsupportedFormatError` -- the file is not a slide wsitool can read
  (not a TIFF, a DICOM file, a TIFF without any usable image).
* :class:`CorruptFileError` -- the container is broken (bad IFD chain, an image
  with zero width or height, tile offsets that point outside the file).
* :class:`InvalidRegionError` -- the request itself is malformed (negative or
  zero size, level out of range, wrong ``out`` buffer).  Also a
  :class:`ValueError`, as ``openslide-python`` users expect.
* :class:`ResourceLimitError` -- the request would exceed a configured pixel
  or byte limit (see :func:`wsitool.set_limits`); raised *before* any
  allocation or decode.
* :class:`TileDecodeError` -- one tile could not be decoded; carries the file,
  level, tile column and row.
* :class:`DeviceUnavailableError` -- a CUDA device was requested but none is
  usable.

Messages always name the file and, where it applies, the level and tile.
"""

from __future__ import annotations

import os

__all__ = [
    "WsiError",
    "UnsupportedFormatError",
    "CorruptFileError",
    "InvalidRegionError",
    "ResourceLimitError",
    "TileDecodeError",
    "DeviceUnavailableError",
    "SlideWarning",
    "TileWarning",
    "DaskUnavailableError",
]


class WsiError(Exception):
    """Base class of every error wsitool raises on purpose."""


class UnsupportedFormatError(WsiError):
    """The file exists but is not a slide format wsitool reads."""


class CorruptFileError(WsiError):
    """The container is structurally broken (TIFF header, IFDs, offsets)."""


class InvalidRegionError(WsiError, ValueError):
    """A region request is malformed: level, size, location type or ``out`` buffer."""


class ResourceLimitError(WsiError):
    """A request would exceed a configured pixel or byte limit.

    Raised before anything is allocated or decoded; see :func:`wsitool.set_limits`.
    """


class DeviceUnavailableError(WsiError):
    """A GPU device was requested (``device="cuda"``) but none is usable."""


class TileDecodeError(WsiError):
    """One tile (or strip) of a level could not be read or decoded.

    Attributes:
        path: the slide file.
        level: pyramid level index (0 = full resolution).
        col, row: tile column and row in the level's tile grid (for stripped
            levels ``col`` is 0 and ``row`` the strip index).
        reason: short cause, e.g. ``"decoder returned no image"``.
    """

    def __init__(self, path: str | os.PathLike, level: int, col: int, row: int, reason: str):
        self.path = os.fspath(path)
        self.level = level
        self.col = col
        self.row = row
        self.reason = reason
        super().__init__(
            f"{self.path}: level {level}, tile (col {col}, row {row}): {reason}"
        )

    def __reduce__(self):  # keep picklable across processes (stress, dask)
        return (type(self), (self.path, self.level, self.col, self.row, self.reason))


class DaskUnavailableError(WsiError):
    """Dask (``dask[array]`` / ``distributed``) is needed but not importable
    (install the optional extra: ``pip install "wsitool[dask]"``)."""


class SlideWarning(UserWarning):
    """A problem in a slide's structure that does not stop it from being read.

    Emitted by :func:`wsitool.open_slide` for what tifffile reports while it
    parses the file (for example an IFD offset past the end of the file, which
    is what a truncated file looks like): the slide opens with the levels that
    could be read, and :attr:`wsitool.Slide.problems` lists the messages.
    """


class TileWarning(UserWarning):
    """Emitted when ``on_error="fill"`` replaced a corrupt tile by background."""
