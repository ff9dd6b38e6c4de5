"""One opener: a location to what a slide needs (pyramid, byte source, identity), by the registered formats (floor 4½).

:func:`open_location` takes a :class:`~.location.Location` (sorted once, by
:func:`~.location.parse_location`) and calls, for its kind, the entry point of the first
registered format that has one (:mod:`wsitool.formats.contract`):

==================================  ===============================================================
location                            what the opener does
==================================  ===============================================================
:class:`~.location.LocalFile`,      opens its byte source, reads its first
:class:`~.location.ObjectUrl`       :data:`~wsitool.formats.HEAD_BYTES` and gives it to the first
                                    format that recognises them (``sniff``), else to the first
                                    that claims the file's name (``claims``: MIRAX ``.mrxs``):
                                    ``open_placed`` (with the format options) or ``open_pyramid``
:class:`~.location.LocalFolder`     ``open_folder`` of each folder format until one finds its slide
:class:`~.location.BucketPrefix`    ``open_prefix`` likewise, through one listing of the prefix
:class:`~.location.DicomWebSeries`  ``open_dicomweb`` of the first series format
==================================  ===============================================================

The formats are :data:`BUILT_IN` (TIFF, DICOM, Zeiss CZI, then MIRAX) and those added with
:func:`register`: a new format is a module satisfying the contract, registered here, never a
branch.  The opener also loads the decoders' library before the slide's files open (under a
tight descriptor limit a later load would lose its CPU codecs, tests/test_os_resources.py;
where it cannot load, JPEG and JPEG 2000 levels take the imagecodecs path), and takes the
slide's identity (:func:`slide_identity`), the one rule for whether a slide changed.

Format options (``open_location(location, {"scene": 1})``, or those the location carries:
``wsitool.open_slide(path, scene=1)``) go to a format that declares them
(:class:`~wsitool.formats.contract.PlacedFormat`: CZI's ``scene``); any other is one
:class:`~wsitool.errors.InvalidOptionError` before the format is called.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, cast

from ..codec import library as nvlib
from ..errors import InvalidOptionError, UnsupportedFormatError
from ..formats import HEAD_BYTES, czi, dicom, mirax, tiff
from ..formats.contract import FolderFormat, Format, NamedFormat, PlacedFormat, PrefixFormat, SeriesFormat
from ..formats.deferred import DeferredProperties
from ..ground.naming import about
from ..model import Pyramid
from ..storage import ByteSource
from .location import BucketPrefix, DicomWebSeries, FileLocation, LocalFolder, Location, ObjectUrl

__all__ = ["BUILT_IN", "OpenedSlide", "open_location", "register", "unregister", "formats", "sniffed",
           "not_a_slide", "slide_identity", "file_stamp"]

#: The formats wsitool ships, in the order they are tried (each checked against the contract by mypy).
BUILT_IN: tuple[Format, ...] = (tiff, dicom, czi, mirax)

_registered: list[Format] = list(BUILT_IN)
_registry_lock = threading.Lock()


def formats() -> tuple[Format, ...]:
    """The formats the opener tries, in order."""
    with _registry_lock:
        return tuple(_registered)


def register(fmt: Format, *, first: bool = False) -> None:
    """Add the format module ``fmt`` to those the opener tries: after the others, or before them
    (``first``, for a format whose files another one would also recognise).

    Raises:
        TypeError: ``fmt`` lacks a name of :class:`~wsitool.formats.contract.Format`.
    """
    if not isinstance(fmt, Format):
        raise TypeError(f"{fmt!r} is not a slide format (NAME, READS_URLS, sniff, open_pyramid)")
    with _registry_lock:
        if fmt not in _registered:
            _registered.insert(0 if first else len(_registered), fmt)


def unregister(fmt: Format) -> None:
    """Take ``fmt`` out of the formats the opener tries (a no-op when it is not there)."""
    with _registry_lock:
        if fmt in _registered:
            _registered.remove(fmt)


def sniffed(head: bytes) -> Format | None:
    """The first format that recognises ``head`` (a file's first bytes), or None."""
    for fmt in formats():
        if fmt.sniff(head):
            return fmt
    return None


def claimed(name: str) -> Format | None:
    """The first format that recognises files by their name (:class:`~wsitool.formats.contract.NamedFormat`)
    and claims ``name`` (the last component of a path or URL path), or None."""
    for fmt in formats():
        if isinstance(fmt, NamedFormat) and fmt.claims(name):
            return fmt
    return None


def _file_name(location: Location) -> str:
    """The last component of a file location's path (a URL's without query or fragment)."""
    target = location.target
    if location.remote:
        target = urllib.parse.urlsplit(target).path
    return target.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]


def not_a_slide(shown: str, head: bytes) -> str:
    """The message for a file no format recognises: ``"<shown>: not a slide wsitool reads
    (neither TIFF nor DICOM nor CZI; header b'GIF8')"``."""
    names = " nor ".join(fmt.NAME for fmt in formats() if not isinstance(fmt, NamedFormat))
    return f"{shown}: not a slide wsitool reads (neither {names}; header {head[:4]!r})"


@dataclasses.dataclass
class OpenedSlide:
    """An open location: what :class:`wsitool.Slide` takes.

    Attributes:
        location: where the slide is.
        pyramid: the format's description (levels, associated images, properties; its
            ``release`` closes what the format opened).
        source: the byte source of a file slide (the opener's, closed by :meth:`close`); None
            where the format opens its own (a folder, a prefix, a DICOMweb series).
        identity: :func:`slide_identity`, taken at open.
        open_stats: requests and bytes the open took (a remote file; its source's ``stats()``), else None.
        format: the format that opened it.
    """

    location: Location
    pyramid: Pyramid
    source: ByteSource | None
    identity: tuple
    open_stats: dict | None
    format: Format

    def close(self) -> None:
        """Close the source, then release what the format opened (for an open no slide took over)."""
        if self.source is not None:
            self.source.close()
        self.pyramid.close()


def open_location(location: Location, format_options: Mapping[str, Any] | None = None) -> OpenedSlide:
    """Open the slide at ``location`` with the first registered format that reads it.

    ``format_options``: options of the format's own (a CZI file's ``{"scene": 1}``; see the
    module notes); None: the location's own (:attr:`~.location.Location.format_options`).

    Raises:
        FileNotFoundError: no such file (a URL: :class:`~wsitool.errors.RemoteNotFoundError`).
        UnsupportedFormatError: no format reads it (the message names what was tried), a DICOM
            file by URL, a folder or prefix without one series.
        CorruptFileError: the format finds the slide broken.
        InvalidOptionError: a format option the format does not take (or any, for a folder,
            prefix or series).
        RemoteAccessError, RemoteUnavailableError, WsiError: as the storage layer.
    """
    if format_options is None and location.format_options is not None:
        format_options = location.format_options.as_dict()
    options = dict(format_options or {})
    with_nv = nvlib.available()  # (before the slide's own descriptors: the module notes)
    for cls, kind in _KINDS:
        if isinstance(location, cls):
            opens = kind
            break
    else:
        raise TypeError(f"not a slide location: {location!r}")
    with about(location.shown):  # (the one place an open's errors get the slide's name)
        pyramid, source, fmt = opens(location, options)
    try:
        _name(pyramid, location.shown)
        if not with_nv:
            for lv in pyramid.levels:
                lv.encoding = nvlib.fallback_encoding(lv.encoding)
        identity = slide_identity(location, source, pyramid)
        stats = cast(Any, source).stats() if isinstance(location, ObjectUrl) else None
    except BaseException:
        OpenedSlide(location, pyramid, source, (), None, fmt).close()
        raise
    return OpenedSlide(location, pyramid, source, identity, stats, fmt)


def _name(pyramid: Pyramid, shown: str) -> None:
    """Name the slide ``shown`` in what the format left unnamed: the levels (and planes) without a
    ``path`` of their own (tile errors name it: a DICOM level keeps its instance file's), and
    the deferred properties (:attr:`wsitool.formats.deferred.DeferredProperties.subject`)."""
    for lv in pyramid.levels:
        for named in (lv, *(lv.planes or ())):
            if not named.path:
                named.path = shown
    if isinstance(pyramid.properties, DeferredProperties):
        pyramid.properties.subject = shown


def _check_options(shown: str, what: str, accepted: frozenset[str], options: Mapping[str, Any]) -> None:
    """Raise for the options ``accepted`` leaves out (called where there are options).

    Raises:
        InvalidOptionError: ``"<shown>: the TIFF format takes no option 'scene'"`` (and which it takes).
    """
    unknown = sorted(set(options) - accepted)
    if unknown:
        names = ", ".join(repr(k) for k in unknown)
        takes = f" (it takes {', '.join(sorted(accepted))})" if accepted else ""
        raise InvalidOptionError(f"{shown}: {what} takes no option {names}{takes}")


_Opened = tuple[Pyramid, "ByteSource | None", Format]


def _open_file(location: Location, options: dict[str, Any]) -> _Opened:
    assert isinstance(location, FileLocation)
    source = location.open_source()
    try:
        head = source.read(0, HEAD_BYTES)
        fmt = sniffed(head) or claimed(_file_name(location))
        if fmt is None:
            raise UnsupportedFormatError(not_a_slide(location.shown, head))
        if location.remote and not fmt.READS_URLS:
            raise UnsupportedFormatError(f"{location.shown}: {fmt.NAME} files are read from local paths only, "
                                         "not from URLs")
        accepted = fmt.OPTIONS if isinstance(fmt, PlacedFormat) else frozenset()
        if options:
            _check_options(location.shown, f"the {fmt.NAME} format", accepted, options)
        if isinstance(fmt, PlacedFormat):
            return fmt.open_placed(location, source, options), source, fmt
        return fmt.open_pyramid(source), source, fmt
    except BaseException:
        source.close()
        raise


def _open_folder(location: Location, options: dict[str, Any]) -> _Opened:
    if options:
        _check_options(location.shown, "a folder slide", frozenset(), options)
    for fmt in formats():
        if isinstance(fmt, FolderFormat):  # (a module that has open_folder)
            pyramid = fmt.open_folder(location.target)
            if pyramid is not None:
                return pyramid, None, fmt
    raise UnsupportedFormatError(f"{location.shown}: is a directory without a slide wsitool reads (a folder must "
                                 "hold one DICOM whole-slide image series)")


def _open_prefix(location: Location, options: dict[str, Any]) -> _Opened:
    assert isinstance(location, BucketPrefix)
    if options:
        _check_options(location.shown, "a bucket prefix", frozenset(), options)
    prefix = location.open_prefix()
    try:
        for fmt in formats():
            if isinstance(fmt, PrefixFormat):
                pyramid = fmt.open_prefix(prefix)
                if pyramid is not None:
                    return pyramid, None, fmt
        raise UnsupportedFormatError(
            f"{prefix.shown}: no DICOM object directly under the prefix ({prefix.listed} object(s) there, "
            f"{prefix.deeper} under deeper prefixes): a prefix must hold the files of one DICOM whole-slide "
            "image series")
    finally:
        prefix.close()


def _open_series(location: Location, options: dict[str, Any]) -> _Opened:
    assert isinstance(location, DicomWebSeries)
    if options:
        _check_options(location.shown, "a DICOMweb series", frozenset(), options)
    for fmt in formats():
        if isinstance(fmt, SeriesFormat):
            return fmt.open_dicomweb(location.series(), location.options_dict()), None, fmt
    raise UnsupportedFormatError(f"{location.shown}: no registered format reads DICOMweb series")


#: Each kind of location and how it opens (the first class it is an instance of).
_KINDS: tuple[tuple[type[Location], Callable[[Location, dict[str, Any]], _Opened]], ...] = (
    (FileLocation, _open_file), (LocalFolder, _open_folder), (BucketPrefix, _open_prefix),
    (DicomWebSeries, _open_series))


# ---------------------------------------------------------------------- identity


def file_stamp(path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(mtime_ns, size in bytes)`` of the local file or folder ``path``: one version of it.

    Raises:
        FileNotFoundError, OSError: as ``os.stat``.
    """
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size)


def slide_identity(location: Location, source: ByteSource | None, pyramid: Pyramid) -> tuple:
    """One version of the slide at ``location`` (what a task that reopens it elsewhere checks):

    * a local file or folder: ``(mtime_ns, size)`` (:func:`file_stamp`);
    * an object by URL: ``(url, size, etag)`` of its byte source
      (:meth:`wsitool.storage.remote.RemoteSource.identity`, pinned at open);
    * several remote objects (a bucket prefix, a DICOMweb series): ``(url shown, total size,
      digest)``, the digest of the sorted identities of every object its levels and associated
      images read.

    Raises:
        FileNotFoundError, OSError: a local path that went away.
    """
    if not location.remote:
        return file_stamp(location.target)
    if source is not None:
        identity: tuple = cast(Any, source).identity()
        return identity
    found: dict[int, tuple] = {}
    levels = [p for lv in pyramid.levels for p in (lv.planes or (lv,))]
    for src in [lv.source for lv in levels] + [im.source for im in pyramid.associated.values()]:
        for part in getattr(src, "parts", (src,)):
            if hasattr(part, "identity"):
                found[id(part)] = part.identity()
    ids = sorted(found.values())
    digest = hashlib.sha256(repr(ids).encode()).hexdigest()[:32]
    return (location.shown, sum(int(i[1]) for i in ids), digest)
