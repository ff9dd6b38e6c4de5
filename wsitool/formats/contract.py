"""The contract between a container format and the slide: what a format module provides (floor 3).

A format is a module (a sub-package of :mod:`wsitool.formats`, listed in
:data:`wsitool.formats.FORMATS`) that satisfies :class:`Format`: it recognises
its files by their first bytes and describes one as a
:class:`~wsitool.model.Pyramid`; a format whose slides can be folders (a DICOM
series) also satisfies :class:`FolderFormat`.  It decodes nothing.

What the slide (:class:`wsitool.Slide`) reads of the pyramid a format returns:
``vendor``, ``levels`` (largest first; their byte sources, tile indices and
encodings), ``associated``, ``properties`` (read-only), ``problems`` (logged at
open), ``color_profile``, ``identifying``, and ``release``, called once when the
slide closes (the format's own resources: a tifffile handle, the byte sources
of a series' other files).  The byte source a format is given stays the
caller's: the slide closes it after ``release``.

The protocols are checked statically (mypy checks the modules listed in
:data:`~wsitool.formats.FORMATS` against :class:`Format`) and at run time
(``isinstance(module, FolderFormat)``: runtime-checkable, which looks only for
the names).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..model import Pyramid
from ..storage import ByteSource

__all__ = ["Format", "FolderFormat"]


@runtime_checkable
class Format(Protocol):
    """A container format: a module with these two functions."""

    def sniff(self, head: bytes) -> bool:
        """True when ``head``, the first bytes of a file (up to
        :data:`~wsitool.formats.HEAD_BYTES`; fewer for a shorter file), are this
        format's magic."""
        ...

    def open_pyramid(self, path: str, source: ByteSource) -> Pyramid:
        """The pyramid of the file ``path`` whose bytes ``source`` reads (``source`` stays
        the caller's; what the format opens besides, ``Pyramid.release`` closes).

        Raises:
            UnsupportedFormatError: not this format after all, or a variant it does not read.
            CorruptFileError: the file is broken.
        """
        ...


@runtime_checkable
class FolderFormat(Format, Protocol):
    """A format whose slides can also be folders (a DICOM series)."""

    def open_folder(self, path: str) -> Pyramid | None:
        """The pyramid of the slide in the folder ``path``; None when the folder holds
        nothing of this format (the next format is tried).

        Raises:
            UnsupportedFormatError: the folder holds this format's files but no slide
                wsitool reads (several series, no whole-slide image).
            CorruptFileError: the slide is broken.
        """
        ...
