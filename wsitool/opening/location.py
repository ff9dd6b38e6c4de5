"""Where a slide is: one typed location, parsed once, with the storage options it is read with (floor 4½).

:func:`parse_location` sorts what a user gave (a path, a URL) into one of five kinds, once, at
the edge (:func:`wsitool.open_slide`, the command line):

* :class:`LocalFile`: a file (a TIFF-based slide, or a DICOM file whose series lies beside it);
* :class:`LocalFolder`: a folder (one DICOM series);
* :class:`ObjectUrl`: one object by URL (``http(s)://``, ``s3://``, ``gs://``, ``az://`` and
  their aliases; :mod:`wsitool.storage.opener`);
* :class:`BucketPrefix`: an object-store URL ending in ``/``, read as a folder
  (:mod:`wsitool.storage.prefix`);
* :class:`DicomWebSeries`: ``http(s)://.../studies/{study}/series/{series}``, optionally
  ``dicomweb+http(s)://`` (:mod:`wsitool.formats.dicom.web`).

A location is a frozen value: hashable (a key of the per-process slides,
:mod:`.held`), picklable (Dask tasks, worker processes carry it instead of a
``(url, storage options)`` pair), and never shows a secret: its ``str`` is the name
messages use (a URL without user, password or query: :func:`wsitool.storage.redact`),
its ``repr`` adds the names of its storage options, never their values.  A location
that names one file can open a named file beside it as a byte source
(:meth:`LocalFile.open_sibling`, :meth:`ObjectUrl.open_sibling`): what a format
whose slide is several files reads (MIRAX keeps ``Slidedat.ini``, ``Index.dat`` and
``Data*.dat`` in a folder beside its ``.mrxs``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import posixpath
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from ..errors import InvalidOptionError
from ..storage import ByteSource, open_source, redact
from ..storage.local import LocalFile as LocalSource
from ..storage.prefix import Prefix, is_prefix_url
from ..storage.remote.options import StorageOptions
from ..storage.remote.transports.listing import list_objects
from ..storage.urls import SeriesUrl, check_url, parse_series_url, scheme_of

__all__ = ["LocationOptions", "Location", "FileLocation", "LocalFile", "LocalFolder", "ObjectUrl", "BucketPrefix",
           "DicomWebSeries", "parse_location", "location_from_wire"]


class LocationOptions(Mapping[str, Any]):
    """The storage options of a remote location, frozen when the location is parsed (the generic
    keys checked then: :meth:`wsitool.storage.remote.options.StorageOptions.parse`, so a bad value
    fails at the edge, before any request).  What a location carries and compares; storage parses
    them into its own :class:`~wsitool.storage.remote.options.StorageOptions` where it reads them.

    The keys are those :func:`wsitool.open_slide` documents (``timeout``, ``retries``,
    ``headers``, ``anon``, ``key``, ...); they are read by the storage layer
    (:func:`wsitool.storage.open_source`, :class:`~wsitool.storage.prefix.Prefix`,
    :class:`~wsitool.formats.dicom.web.client.DicomWebClient`), which gets a fresh copy of them
    (:meth:`as_dict`).  Two option mappings equal as JSON text are equal (and hash alike).
    ``repr`` names the keys only: values may be secrets.  Pickled with their values (a
    task that reopens a slide elsewhere needs them; give workers credentials through their
    environment where a task graph must not carry them).

    Raises:
        InvalidOptionError: ``options`` is not a mapping with text keys (exit 2).
    """

    __slots__ = ("_data", "_key")

    def __init__(self, options: Mapping[str, Any]):
        if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
            raise InvalidOptionError("storage options must be a mapping of option names (text) to values, "
                                     f"got {type(options).__name__}")
        self._data: dict[str, Any] = copy.deepcopy(dict(options))
        try:
            self._key = json.dumps(self._data, sort_keys=True, default=repr)
        except (TypeError, ValueError):  # (keys of nested mappings that do not sort)
            self._key = repr(sorted(self._data.items(), key=lambda kv: kv[0]))

    def __getitem__(self, key: str) -> Any:
        return copy.deepcopy(self._data[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocationOptions) and other._key == self._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __reduce__(self) -> tuple:
        return (LocationOptions, (self._data,))

    def as_dict(self) -> dict[str, Any]:
        """A fresh (deep) copy, for a storage function that takes a dict of options."""
        return copy.deepcopy(self._data)

    def __repr__(self) -> str:
        return f"LocationOptions({sorted(self._data)})"  # the names only, never a value


def _frozen(options: Mapping[str, Any] | None) -> LocationOptions | None:
    """``options`` as :class:`LocationOptions`; None for none or an empty mapping."""
    if options is None or isinstance(options, LocationOptions):
        return options or None
    frozen = LocationOptions(options)
    StorageOptions.parse(frozen.as_dict())  # (the generic keys' values: exit 2 now, not at the first request)
    return frozen or None


def _format_frozen(options: Mapping[str, Any] | None) -> LocationOptions | None:
    """Format options as :class:`LocationOptions` (not storage options: unchecked here, the
    format checks them); None for none or an empty mapping.

    Raises:
        InvalidOptionError: not a mapping.
    """
    if options is None or isinstance(options, LocationOptions):
        return options or None
    if not isinstance(options, Mapping):
        raise InvalidOptionError(f"format options must be a mapping, not {type(options).__name__}")
    return LocationOptions(options) or None


def _checked_name(shown: str, name: str) -> list[str]:
    """The ``/``-separated parts of the sibling name ``name``, checked: relative, no ``.``, ``..``
    or empty part, no backslash or NUL (a sibling never leaves the folder of its slide).

    Raises:
        InvalidOptionError: a name that is not such a relative name.
    """
    parts = name.split("/") if isinstance(name, str) else []
    if not parts or any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in parts):
        raise InvalidOptionError(f"{shown}: {name!r} is not the relative name of a file beside the slide")
    return parts


@dataclasses.dataclass(frozen=True, repr=False)
class Location:
    """Where a slide is (one of the five kinds of the module notes); made by :func:`parse_location`.

    Attributes:
        target: the path, or the URL as given (a URL keeps its query: a presigned URL's
            signature; never shown, see :attr:`shown`).
        options: the storage options it is read with (remote kinds only), or None.
        format_options: the options of the slide's format it is opened with (a CZI file's
            ``scene``; :func:`wsitool.opening.open_location`), or None.
    """

    target: str
    options: LocationOptions | None = None
    format_options: LocationOptions | None = None
    #: whether the kind's bytes come over a network (set by each kind)
    _REMOTE: ClassVar[bool] = False

    @property
    def remote(self) -> bool:
        """Whether the slide's bytes come over a network (an object URL, a prefix, a DICOMweb series)."""
        return self._REMOTE

    @property
    def shown(self) -> str:
        """The location as messages name it: the path; a URL without user, password or query."""
        return redact(self.target) if self.remote else self.target

    @property
    def stem(self) -> str:
        """The slide's name without its extension, what output names are made from: the last part of
        the path (of a URL's path, percent-decoded, without its query), a trailing ``/`` of a folder or
        prefix left out, without ``.ome.tif`` / ``.ome.tiff`` (as one extension) or its last
        extension; the name itself where that leaves nothing (``.svs`` stays ``.svs``)."""
        path = self.target
        if self.remote:
            path = urllib.parse.unquote(urllib.parse.urlsplit(path).path)
        name = posixpath.basename(path.replace(os.sep, "/").rstrip("/"))
        for suffix in (".ome.tiff", ".ome.tif"):
            if name.lower().endswith(suffix) and len(name) > len(suffix):
                return name[: -len(suffix)]
        return os.path.splitext(name)[0] or name

    def options_dict(self) -> dict[str, Any] | None:
        """A fresh copy of :attr:`options` as a dict (what the storage layer's functions take), or None."""
        return None if self.options is None else self.options.as_dict()

    def resolved(self) -> Location:
        """The location as another process opens it: a local path made absolute; a URL as it is."""
        return self

    def wire(self) -> dict[str, Any]:
        """The location as JSON values (``kind``, ``target``, ``options``; secrets included: send it
        only where the credentials may go, e.g. a child's stdin); :func:`location_from_wire` reads it."""
        fmt = None if self.format_options is None else self.format_options.as_dict()
        return {"kind": type(self).__name__, "target": self.target, "options": self.options_dict(),
                "format_options": fmt}

    def __str__(self) -> str:
        return self.shown

    def __repr__(self) -> str:
        options = "" if self.options is None else f", options={self.options!r}"
        if self.format_options is not None:
            options += f", format_options={self.format_options!r}"
        return f"{type(self).__name__}({self.shown!r}{options})"


@dataclasses.dataclass(frozen=True, repr=False)
class FileLocation(Location):
    """A location naming one file (:class:`LocalFile`, :class:`ObjectUrl`): its bytes, and the files beside it."""

    def open_source(self) -> ByteSource:
        """The file's byte source (the caller closes it)."""
        raise NotImplementedError  # pragma: no cover - each kind has its own

    def sibling(self, name: str) -> FileLocation:
        """The location of the file ``name`` (a relative name, ``/``-separated: ``slide/Index.dat``)
        beside this one, read with the same storage options.

        Raises:
            InvalidOptionError: ``name`` is absolute, empty, has a ``.`` / ``..`` part, a
                backslash or a NUL.
        """
        raise NotImplementedError  # pragma: no cover - each kind has its own

    def open_sibling(self, name: str) -> ByteSource:
        """The byte source of :meth:`sibling` ``(name)`` (the caller closes it).

        Raises:
            InvalidOptionError: a bad ``name`` (see :meth:`sibling`).
            FileNotFoundError: no such file (a URL: :class:`~wsitool.errors.RemoteNotFoundError`).
            RemoteAccessError, RemoteUnavailableError, OSError: as opening the slide's own file.
        """
        return self.sibling(name).open_source()


@dataclasses.dataclass(frozen=True, repr=False)
class LocalFile(FileLocation):
    """A local file: a TIFF-based slide, or one DICOM file of a series (found beside it)."""

    def open_source(self) -> ByteSource:
        """The file's byte source (the caller closes it).

        Raises:
            FileNotFoundError, PermissionError, OSError: as ``os.open``.
            UnsupportedFormatError: a FIFO, socket or device.
        """
        return LocalSource(self.target)

    def sibling(self, name: str) -> LocalFile:
        parts = _checked_name(self.shown, name)
        return LocalFile(os.path.join(os.path.dirname(self.target), *parts))

    def resolved(self) -> LocalFile:
        return dataclasses.replace(self, target=os.path.abspath(self.target))


@dataclasses.dataclass(frozen=True, repr=False)
class LocalFolder(Location):
    """A local folder holding one slide of several files (a DICOM series)."""

    def resolved(self) -> LocalFolder:
        return dataclasses.replace(self, target=os.path.abspath(self.target))


@dataclasses.dataclass(frozen=True, repr=False)
class ObjectUrl(FileLocation):
    """One remote object: ``http(s)://``, ``s3://``, ``gs://``, ``az://`` (and aliases)."""

    _REMOTE: ClassVar[bool] = True

    def open_source(self) -> ByteSource:
        """The object's byte source (:func:`wsitool.storage.open_source`; the caller closes it).

        Raises:
            RemoteNotFoundError, RemoteAccessError, RemoteUnavailableError: its first request.
            WsiError: a bad storage option, or the ``wsitool[remote]`` extra not installed.
        """
        return open_source(self.target, self.options_dict())

    def sibling(self, name: str) -> ObjectUrl:
        """As :meth:`LocalFile.sibling`: the URL with the last part of its path replaced by
        ``name`` (percent-encoded), its scheme, authority and query kept (a query holding a
        container's token reads the sibling too; a presigned URL signs one object only)."""
        parts = _checked_name(self.shown, name)
        split = urllib.parse.urlsplit(self.target)
        folder = posixpath.dirname(split.path)
        path = posixpath.join(folder, *(urllib.parse.quote(p) for p in parts))
        return ObjectUrl(urllib.parse.urlunsplit(split._replace(path=path, fragment="")), self.options)


@dataclasses.dataclass(frozen=True, repr=False)
class BucketPrefix(Location):
    """The objects directly under an object-store prefix (``s3://bucket/series/``), read as a folder."""

    _REMOTE: ClassVar[bool] = True

    def open_prefix(self) -> Prefix:
        """The prefix's listing and object opener (:class:`~wsitool.storage.prefix.Prefix`; the caller
        closes it).

        Raises:
            WsiError: a bad storage option, or obstore not installed.
        """
        return Prefix(self.target, self.options_dict())

    def listed(self) -> list[str]:
        """The URLs of every object under the prefix, at any depth, sorted
        (:func:`wsitool.storage.remote.transports.listing.list_objects`); :meth:`at` makes them locations.

        Raises:
            RemoteNotFoundError: no such bucket, or nothing under the prefix.
            RemoteAccessError, RemoteUnavailableError, InvalidOptionError: as the listing.
        """
        return list_objects(self.target, self.options_dict())

    def at(self, url: str) -> Location:
        """The location of ``url`` (an object or a deeper prefix of the same store), read with
        this prefix's storage options."""
        return parse_location(url, self.options)


@dataclasses.dataclass(frozen=True, repr=False)
class DicomWebSeries(Location):
    """A DICOMweb series (QIDO-RS / WADO-RS), read frame by frame."""

    _REMOTE: ClassVar[bool] = True

    def series(self) -> SeriesUrl:
        """The series URL taken apart (service root, study, series)."""
        series = parse_series_url(self.target)
        assert series is not None  # (parse_location made this location of it)
        return series


#: The kinds of location by name (:meth:`Location.wire`).
KINDS: dict[str, type[Location]] = {k.__name__: k for k in (LocalFile, LocalFolder, ObjectUrl, BucketPrefix,
                                                             DicomWebSeries)}


def parse_location(location: str | os.PathLike[str] | Location,
                   options: Mapping[str, Any] | None = None,
                   format_options: Mapping[str, Any] | None = None) -> Location:
    """The :class:`Location` of ``location`` (a local path, a slide URL, or a location already).

    A URL is a string starting with one of :data:`wsitool.storage.urls.SCHEMES` and ``://``;
    anything else is a local path, a :class:`LocalFolder` when it is a folder now, else a
    :class:`LocalFile` (which need not exist: opening it raises).  ``options``, the storage
    options, are frozen onto a remote location (an empty mapping is none); ``format_options``
    (the slide format's own, e.g. ``{"scene": 1}``) onto any (checked when it opens).

    Raises:
        InvalidOptionError: storage options for a local path, or for a location that carries
            its own; a URL that cannot be split into its parts; options that are not a mapping.
        WsiError: a ``dicomweb+`` URL that names no series.
    """
    parsed = _parse(location, options)
    fmt = _format_frozen(format_options)
    if fmt is None or fmt == parsed.format_options:
        return parsed
    return dataclasses.replace(parsed, format_options=fmt)


def _parse(location: str | os.PathLike[str] | Location, options: Mapping[str, Any] | None) -> Location:
    frozen = _frozen(options)
    if isinstance(location, Location):
        if frozen is not None and frozen != location.options:
            raise InvalidOptionError(f"{location.shown}: the location carries its own storage options; "
                                     "give them when the location is made")
        return location
    scheme = scheme_of(location)
    if scheme is None:
        path: Any = os.fspath(location)
        if frozen is not None:
            raise InvalidOptionError(f"{path}: storage options apply to URLs only")
        return LocalFolder(path) if os.path.isdir(path) else LocalFile(path)
    url = str(location)
    check_url(url)  # a malformed URL: one InvalidOptionError, not urllib's ValueError
    if parse_series_url(url) is not None:
        return DicomWebSeries(url, frozen)
    if is_prefix_url(url):
        return BucketPrefix(url, frozen)
    return ObjectUrl(url, frozen)


def location_from_wire(wire: Mapping[str, Any]) -> Location:
    """The location :meth:`Location.wire` wrote.

    Raises:
        InvalidOptionError: not a location's wire form.
    """
    kind = KINDS.get(str(wire.get("kind"))) if isinstance(wire, Mapping) else None
    if kind is None or not isinstance(wire.get("target"), str):
        raise InvalidOptionError("not a slide location's wire form (kind, target, options)")
    return kind(wire["target"], _frozen(wire.get("options")), _format_frozen(wire.get("format_options")))
