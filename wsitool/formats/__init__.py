"""Container formats: each turns a file into a :class:`~wsitool.model.Pyramid` (floor 3).

A format is a sub-package satisfying :class:`.contract.Format`: ``sniff(head:
bytes) -> bool`` (its magic in the first 132 bytes of the file) and
``open_pyramid(path, source) -> Pyramid``; it describes levels, tiles and how
each tile is encoded, and decodes nothing.  A format whose slides can be
folders (a DICOM series) also has ``open_folder(path) -> Pyramid | None``
(:class:`.contract.FolderFormat`; None: nothing of that format there); its
pyramid's levels then carry byte sources of their own, which its ``release``
closes.  A new container is a new sub-package listed in :data:`FORMATS`;
nothing above this layer changes.
"""

from __future__ import annotations

from ..errors import UnsupportedFormatError
from ..model import Pyramid
from ..storage import ByteSource
from ..storage.prefix import Prefix
from ..storage.urls import SeriesUrl
from . import dicom, tiff
from .contract import FolderFormat, Format

__all__ = ["FORMATS", "Format", "FolderFormat", "open_pyramid", "open_folder", "open_dicomweb", "open_prefix"]

#: The formats tried, in order (each module checked against :class:`Format` by mypy).
FORMATS: tuple[Format, ...] = (tiff, dicom)

#: Bytes read to recognise a format (a DICOM file's "DICM" sits at 128..132, PS3.10 7.1).
HEAD_BYTES = 132


def open_pyramid(path: str, source: ByteSource) -> Pyramid:
    """The pyramid of the file ``source`` reads, by the first format that recognises it.

    Raises:
        UnsupportedFormatError: no format recognises the file ("``path``: not a slide
            wsitool reads (neither TIFF nor DICOM; header ...)"), or a DICOM file given
            by URL.
        CorruptFileError: the recognised format finds the file broken.
    """
    head = source.read(0, HEAD_BYTES)
    for fmt in FORMATS:
        if fmt.sniff(head):
            if source.remote and fmt is not tiff:  # (a DICOM file finds its series by its folder)
                raise UnsupportedFormatError(f"{path}: DICOM files are read from local paths only, "
                                             "not from URLs")
            return fmt.open_pyramid(path, source)
    raise UnsupportedFormatError(f"{path}: not a slide wsitool reads (neither TIFF nor DICOM; "
                                 f"header {head[:4]!r})")


def open_dicomweb(url: SeriesUrl, storage_options: dict | None = None) -> Pyramid:
    """The pyramid of a DICOMweb series (``url``: a :class:`~wsitool.storage.urls.SeriesUrl`);
    see :func:`wsitool.formats.dicom.open_dicomweb` for what it raises."""
    return dicom.open_dicomweb(url, storage_options)


def open_prefix(url: str, storage_options: dict | None = None) -> Pyramid:
    """The pyramid of the DICOM series stored directly under the bucket prefix ``url``
    (``s3://bucket/series/``, ``gs://``, ``az://``; ending in ``/``), read like a series
    folder (:func:`wsitool.formats.dicom.open_prefix`).

    Raises:
        UnsupportedFormatError: no DICOM object directly under the prefix (the message
            names the prefix and what was listed), several series, more keys than
            :data:`~wsitool.storage.prefix.MAX_OBJECTS`.
        CorruptFileError: the series is broken.
        RemoteNotFoundError: no such bucket.  RemoteAccessError: access denied.
        RemoteUnavailableError: the store kept failing.
        WsiError: a bad storage option, or obstore not installed.
    """
    prefix = Prefix(url, storage_options)
    try:
        pyramid = dicom.open_prefix(prefix)
        if pyramid is None:
            raise UnsupportedFormatError(
                f"{prefix.shown}: no DICOM object directly under the prefix ({prefix.listed} "
                f"object(s) there, {prefix.deeper} under deeper prefixes): a prefix must hold the "
                "files of one DICOM whole-slide image series")
        return pyramid
    finally:
        prefix.close()


def open_folder(path: str) -> Pyramid:
    """The pyramid of the folder ``path``, by the first format that finds its slide there.

    Raises:
        UnsupportedFormatError: no format reads folders holding what this one holds.
        CorruptFileError: the recognised format finds the slide broken.
    """
    for fmt in FORMATS:
        if isinstance(fmt, FolderFormat):  # (a module that has open_folder)
            pyramid = fmt.open_folder(path)
            if pyramid is not None:
                return pyramid
    raise UnsupportedFormatError(
        f"{path}: is a directory without a slide wsitool reads (a folder must hold one DICOM "
        "whole-slide image series)"
    )
