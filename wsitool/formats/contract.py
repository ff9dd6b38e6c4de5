"""The contract between a container format and the slide: what a format module provides (floor 3).

A format is a module (a sub-package of :mod:`wsitool.formats`) that the opener finds in its
registry (:mod:`wsitool.opening.opener`: :data:`~wsitool.opening.opener.BUILT_IN`, or
:func:`~wsitool.opening.opener.register`) and that satisfies :class:`Format`: it recognises
its files by their first bytes and describes one as a :class:`~wsitool.model.Pyramid`.  It
decodes nothing, and raises without the slide's name (the opener attaches it to what leaves an
entry point: :mod:`wsitool.ground.naming`).  The opener sorts the location once and calls, for each kind of location,
the entry point that kind needs, of the first format that has it; a format has those of the
kinds its slides come as:

* a file, local or by URL: :class:`Format` (``sniff``, ``open_pyramid``), or
  :class:`PlacedFormat` (``open_placed``) for a format that reads files beside its own
  (MIRAX) or takes options of its own (a CZI scene);
* a local folder (a DICOM series): :class:`FolderFormat` (``open_folder``);
* a bucket prefix read as a folder: :class:`PrefixFormat` (``open_prefix``);
* a DICOMweb series: :class:`SeriesFormat` (``open_dicomweb``).

What the slide (:class:`wsitool.Slide`) reads of the pyramid a format returns:
``vendor``, ``levels`` (largest first; their byte sources, tile indices and
encodings), ``associated``, ``properties`` (read-only), ``problems`` (logged at
open), ``color_profile``, ``identifying``, and ``release``, called once when the
slide closes (the format's own resources: a tifffile handle, the byte sources
of a series' other files).  The byte source a format is given stays the
caller's: the slide closes it after ``release``.

The protocols are checked statically (mypy checks the modules of
:data:`~wsitool.opening.opener.BUILT_IN` against :class:`Format`) and at run time
(``isinstance(module, FolderFormat)``: runtime-checkable, which looks only for
the names).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..model import Pyramid
from ..storage import ByteSource

if TYPE_CHECKING:
    from ..storage.prefix import Prefix
    from ..storage.urls import SeriesUrl

__all__ = ["Format", "FolderFormat", "PrefixFormat", "SeriesFormat", "Place", "PlacedFormat", "NamedFormat"]


@runtime_checkable
class Format(Protocol):
    """A container format: a module with these names.

    Attributes:
        NAME: the format's name in messages (``"TIFF"``, ``"DICOM"``).
        READS_URLS: whether a file of it is read by URL as well as from a local path (a DICOM
            file finds the rest of its series in its folder: local paths only).
    """

    NAME: str
    READS_URLS: bool

    def sniff(self, head: bytes) -> bool:
        """True when ``head``, the first bytes of a file (up to
        :data:`~wsitool.formats.HEAD_BYTES`; fewer for a shorter file), are this
        format's magic."""
        ...

    def open_pyramid(self, source: ByteSource) -> Pyramid:
        """The pyramid of the file whose bytes ``source`` reads (``source`` stays the caller's;
        what the format opens besides, ``Pyramid.release`` closes).  Its errors need not name
        the file, nor its levels carry a ``path``: the opener names both
        (:func:`wsitool.ground.naming.about`).  A format that finds more files beside it (a
        DICOM series) takes the file's path from ``source.path``.

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


@runtime_checkable
class PrefixFormat(Format, Protocol):
    """A format whose slides can be the objects directly under a bucket prefix (a DICOM series)."""

    def open_prefix(self, prefix: Prefix, /) -> Pyramid | None:
        """The pyramid of the slide under ``prefix`` (listed and opened through it; the caller
        closes it); None when nothing there is of this format.

        Raises:
            UnsupportedFormatError, CorruptFileError: as :meth:`FolderFormat.open_folder`.
            RemoteNotFoundError, RemoteAccessError, RemoteUnavailableError: listing or reading.
        """
        ...


@runtime_checkable
class SeriesFormat(Format, Protocol):
    """A format read from a DICOMweb service (QIDO-RS / WADO-RS)."""

    def open_dicomweb(self, url: SeriesUrl, options: dict[str, Any] | None, /) -> Pyramid:
        """The pyramid of the series ``url``, read with the storage options ``options`` (its
        frame sources are its own, closed by ``Pyramid.release``).

        Raises:
            RemoteNotFoundError, RemoteAccessError, RemoteUnavailableError: the service.
            UnsupportedFormatError, CorruptFileError: the series.
        """
        ...


@runtime_checkable
class Place(Protocol):
    """Where a file slide is, as a format sees it (:class:`wsitool.opening.location.FileLocation`):
    its name in messages, and the files beside it."""

    @property
    def shown(self) -> str:
        """The slide as messages name it (a URL without secrets)."""
        ...

    def open_sibling(self, name: str) -> ByteSource:
        """The byte source of the file ``name`` (relative, ``/``-separated) beside the slide's own
        file, local or remote alike (the caller closes it).

        Raises:
            InvalidOptionError: a name that leaves the slide's folder.
            FileNotFoundError: no such file (a URL: RemoteNotFoundError).
        """
        ...


@runtime_checkable
class PlacedFormat(Format, Protocol):
    """A file format that reads files beside its own (MIRAX: ``Slidedat.ini``, ``Index.dat``,
    ``Data*.dat`` in a folder beside the ``.mrxs``) or takes options of its own (a CZI scene).

    The opener calls :meth:`open_placed` instead of ``open_pyramid``; an option the caller gives
    that is not in :attr:`OPTIONS` is refused before the format is called (MIRAX and Zeiss CZI,
    whose ``scene`` option it is, use it).

    Attributes:
        OPTIONS: the names of the options it takes.
    """

    OPTIONS: frozenset[str]

    def open_placed(self, place: Place, source: ByteSource, options: Mapping[str, Any], /) -> Pyramid:
        """The pyramid of the file at ``place`` whose bytes ``source`` reads (``source`` stays the
        caller's; the siblings it opens, ``Pyramid.release`` closes), with ``options`` (keys
        among :attr:`OPTIONS`).

        Raises:
            InvalidOptionError: a bad option value.
            UnsupportedFormatError, CorruptFileError: as :meth:`Format.open_pyramid`.
        """
        ...


@runtime_checkable
class NamedFormat(Format, Protocol):
    """A file format whose files say nothing of themselves in their first bytes, recognised by
    their name instead (a MIRAX ``.mrxs`` is a small JPEG, or empty).  The opener asks
    :meth:`claims` only when no format's ``sniff`` recognises the bytes (a TIFF named
    ``.mrxs`` stays a TIFF, as for OpenSlide)."""

    def claims(self, name: str) -> bool:
        """Whether a file named ``name`` (the last component of its path or URL path) is this
        format's."""
        ...
