"""DICOM whole-slide images: single instances, multi-file series, series folders (floor 3).

pydicom reads the headers (:mod:`.instance`, ``stop_before_pixels``) and its
encapsulation helpers locate the frames (:mod:`.frames`); nothing decodes here.
The pieces, one concept each:

* :mod:`.series`: which files form the series (a file opens its series from
  the instances beside it; a folder opens the one series it holds);
* :mod:`.instance`: one file's header; :mod:`.frames`: its frames' byte ranges;
* :mod:`.tiling`: frames to a tile grid (TILED_FULL / TILED_SPARSE,
  concatenations, first optical path and focal plane);
* :mod:`.encoding`: transfer syntax to :class:`~wsitool.model.TileEncoding`;
* :mod:`.properties`: ``openslide.*`` / ``dicom.*`` keys and PHI marking
  (:data:`PHI_KEYWORDS`, :func:`is_phi`).

Levels are the VOLUME instances (PS3.3 C.8.12.4.1.1; an instance without Image
Type counts as VOLUME) of one pyramid: the opened file's Study and Pyramid UID
(or those of the largest VOLUME; Frame of Reference UIDs are not compared, as
some converters give each level its own), the first optical path, sorted by
size, largest first; one instance per size.  LABEL, OVERVIEW and THUMBNAIL
instances become the associated images ``label``, ``macro`` and ``thumbnail``
(OpenSlide's names).  Each instance is its own file with its own
:class:`~wsitool.storage.LocalFile` (a concatenation: one
:class:`~wsitool.storage.span.Span` of its parts); :attr:`Pyramid.release`
closes every source this package opened.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import warnings
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ...errors import CorruptFileError, UnsupportedFormatError, WsiError
from ...ground.naming import about
from ...model import AssociatedImage, Channel, Pyramid, PyramidLevel, TileIndex, multichannel_level
from ...storage import ByteSource, LocalFile
from ...storage.prefix import MIN_OBJECT_BYTES, Prefix, PrefixObject
from ...storage.remote import HEAD_BYTES
from ...storage.span import Span
from ...storage.urls import SeriesUrl
from .encoding import frame_encoding, is_encapsulated
from .frames import frame_table
from .instance import MAGIC_AT, Instance, is_dicom, read_instance
from .palette import path_channels
from .properties import PHI_KEYWORDS, build_properties, icc_profile_of, is_phi
from .quickhash import KEY as QUICKHASH
from .quickhash import series_quickhash
from .series import Holder, dicom_files, one_series, series_of_file, series_of_folder
from .tiling import GridNotes, Image, merge_parts, tile_grid
from .web import DicomWebClient, frames_table, series_instances

__all__ = ["NAME", "READS_URLS", "sniff", "open_pyramid", "open_folder", "open_dicomweb", "open_prefix",
           "PHI_KEYWORDS", "is_phi"]

#: The format's name in messages (:class:`~wsitool.formats.contract.Format`).
NAME = "DICOM"
#: A DICOM file finds the rest of its series in its folder: local paths only (a series by URL
#: is a bucket prefix, :func:`open_prefix`, or a DICOMweb series, :func:`open_dicomweb`).
READS_URLS = False

#: Image Type value 3 -> associated image name (OpenSlide's).
ASSOCIATED = {"LABEL": "label", "OVERVIEW": "macro", "THUMBNAIL": "thumbnail"}


def sniff(head: bytes) -> bool:
    """True when ``head`` (the first 132 bytes) is a DICOM file: "DICM" at byte 128 (PS3.10 7.1)."""
    return is_dicom(head)


def open_pyramid(source: ByteSource) -> Pyramid:
    """Describe the DICOM WSI series that the local file ``source.path`` (read by ``source``) belongs to.

    ``source`` serves the file's own instance and stays the caller's; the other
    instances of the series (found beside it) get sources of their own, closed
    by the pyramid's ``release``.  An error about one of those names its file; the
    caller names the slide (:func:`wsitool.ground.naming.about`).

    Raises:
        UnsupportedFormatError: not a whole-slide image, no VOLUME instance, a
            transfer syntax or pixel layout wsitool does not read.
        CorruptFileError: unreadable header, truncated Pixel Data, offset tables
            or Total Pixel Matrix inconsistent with the frames.
    """
    instances, problems = series_of_file(source.path)
    return _assemble(instances, problems, source)


def open_dicomweb(url: SeriesUrl, storage_options: dict | None = None) -> Pyramid:
    """Describe the DICOMweb series ``url`` (QIDO-RS, WADO-RS metadata; frames fetched per
    region, :mod:`.web`) as the local reader describes a series folder.

    ``storage_options``: as :class:`~wsitool.formats.dicom.web.client.DicomWebClient`.

    Raises:
        RemoteNotFoundError: no such series.  RemoteAccessError: access denied.
        RemoteUnavailableError: the server kept failing.
        UnsupportedFormatError, CorruptFileError: as :func:`open_folder`, and no
            transfer syntax wsitool reads agreed with the server.
    """
    client = DicomWebClient(url, storage_options)
    try:
        instances, problems, sources = series_instances(client)
    except BaseException:
        client.close()
        raise
    return _assemble(instances, problems, None, sources=sources, tables=frames_table)


def open_folder(path: str) -> Pyramid | None:
    """Describe the one DICOM WSI series in the folder ``path``; None when it holds no DICOM file.

    Raises:
        UnsupportedFormatError: several series in the folder (named), or no
            whole-slide image among its DICOM files.
        CorruptFileError: as :func:`open_pyramid`.
    """
    files = dicom_files(path)
    if not files:
        return None
    instances, problems = series_of_folder(path, files)
    return _assemble(instances, problems, None)


def open_prefix(prefix: Prefix) -> Pyramid | None:
    """Describe the one DICOM WSI series stored directly under a bucket prefix, as
    :func:`open_folder` describes a folder's; None when no object there is a DICOM file.

    Every object (of at least 132 bytes) is opened as a remote source, at most the
    prefix's ``concurrency`` at once: its first request (64 KiB) tells whether it is
    DICOM ("DICM" at byte 128, whatever the preamble holds: a file that is also a TIFF
    is read as DICOM here) and holds the header; the frame tables are read then too
    (:func:`~.frames.frame_table`: over a URL a Basic Offset Table is trusted).  The
    sources of objects that are not of the series are closed; the pyramid's
    ``release`` closes the others.

    Raises:
        UnsupportedFormatError: several series under the prefix (named), no whole-slide
            image among its DICOM objects, or more keys than
            :data:`~wsitool.storage.prefix.MAX_OBJECTS` under it.
        CorruptFileError: as :func:`open_folder`.
        RemoteNotFoundError, RemoteAccessError, RemoteUnavailableError: listing or reading failed.
    """
    objects = prefix.objects()
    sources = _ObjectSources()
    try:
        reads, tables = _read_objects(prefix, [o for o in objects if o.size >= MIN_OBJECT_BYTES], sources)
        if not reads:
            sources.close()
            return None
        holder = Holder("prefix", lambda: len(objects) - len(reads), "give the prefix of one series")
        instances, problems = one_series(prefix.shown, reads, holder)
        sources.keep({inst.path for inst in instances})
    except BaseException:
        sources.close()
        raise

    def table(inst: Instance) -> tuple[np.ndarray, np.ndarray, str]:
        found = tables.get(inst.path)
        if isinstance(found, BaseException):
            raise found
        return found if found is not None else _file_table(inst)

    return _assemble(instances, problems, None, sources=sources, tables=table)


#: an object's frame table, or the error computing it raised (raised when the table is used)
_TableOrError = tuple[np.ndarray, np.ndarray, str] | WsiError


def _read_objects(prefix: Prefix, objects: list[PrefixObject], sources: _ObjectSources
                  ) -> tuple[list[tuple[str, Instance | WsiError]], dict[str, _TableOrError]]:
    """``(reads, tables)`` of the DICOM objects among ``objects``, opened in parallel: each
    one's header (or the error reading it) and its frame table (or the error), by the
    object's shown URL.  Objects that are not DICOM files are closed at once."""
    reads: dict[str, Instance | WsiError] = {}
    tables: dict[str, _TableOrError] = {}

    def one(obj: PrefixObject) -> None:
        source = prefix.open(obj)
        if not is_dicom(source.read(0, MAGIC_AT + 4)):
            source.close()
            return
        sources.add(obj, source)
        try:
            inst = read_instance(obj.shown, source)
        except (UnsupportedFormatError, CorruptFileError) as exc:
            reads[obj.shown] = exc
            return
        reads[obj.shown] = inst
        try:
            offsets, counts, name = _file_table(inst)
        except WsiError as exc:
            tables[obj.shown] = exc
            return
        tables[obj.shown] = (offsets, counts, name)
        _advise_first_frame(source, offsets, counts)

    if objects:
        workers = max(1, min(prefix.options.concurrency, len(objects)))
        with cf.ThreadPoolExecutor(workers, thread_name_prefix="wsitool-prefix") as pool:
            for future in [pool.submit(one, obj) for obj in objects]:
                future.result()  # (the first failure: not found, denied, unavailable)
    ordered = [(o.shown, reads[o.shown]) for o in objects if o.shown in reads]
    return ordered, tables


def _advise_first_frame(source: ByteSource, offsets: np.ndarray, counts: np.ndarray) -> None:
    """Start fetching the bytes :func:`_first_frame` will read (unless the open's first
    request already holds them), so that each object's is fetched in parallel."""
    present = np.flatnonzero(counts)
    if len(present):
        k = int(present[0])
        start, count = int(offsets[k]), min(int(counts[k]), 65536)
        if start + count > HEAD_BYTES:
            source.advise([(start, count)])


class _SourcesLike(Protocol):
    """What :func:`_assemble` reads a series' instances through: :class:`_Sources` (local
    files) or the DICOMweb reader's frame sources (:mod:`.web`)."""

    @property
    def given(self) -> ByteSource | None:
        """The source of the file the caller opened (at its ``path``; it stays the caller's), or None."""

    def of(self, paths: list[str]) -> ByteSource:
        """The byte source of the instance at ``paths`` (the parts of a concatenation)."""

    def close(self) -> None:
        """Close every source opened here."""


#: instance -> ``(frame offsets, frame byte counts, offset table name)`` (:func:`frame_table`)
_Tables = Callable[[Instance], tuple[np.ndarray, np.ndarray, str]]


class _Sources:
    """The byte sources of one pyramid: the caller's for its own file, new ones for the others."""

    def __init__(self, given: ByteSource | None):
        self.given = given
        self.opened: list[ByteSource] = []
        self._files: dict[str, ByteSource] = {}  # one source per file (channels share an instance)

    def of(self, paths: list[str]) -> ByteSource:
        """One source of the files ``paths`` (a :class:`~wsitool.storage.span.Span` of several)."""
        parts = [self._one(p) for p in paths]
        if len(parts) == 1:
            return parts[0]
        span = Span(parts)  # (named as its first part: the file paths[0])
        self.opened.append(span)
        return span

    def _one(self, path: str) -> ByteSource:
        if self.given is not None and os.path.abspath(path) == os.path.abspath(self.given.path):
            return self.given
        key = os.path.abspath(path)
        if key in self._files:
            return self._files[key]
        src = LocalFile(path)
        self.opened.append(src)
        self._files[key] = src
        return src

    def close(self) -> None:
        """Close every source opened here (not the caller's)."""
        for src in self.opened:
            if isinstance(src, Span):  # its parts are closed one by one below
                continue
            src.close()
        self.opened = []
        self._files = {}


class _ObjectSources(_Sources):
    """The remote sources of a prefix's objects by shown URL (:func:`open_prefix`): the
    ones of the series are kept, the others closed (:meth:`keep`)."""

    def __init__(self) -> None:
        super().__init__(None)
        self._lock = threading.Lock()

    def add(self, obj: PrefixObject, source: ByteSource) -> None:
        """Hold ``source``, the prefix object ``obj``'s, by its shown URL (closed by :meth:`close`)."""
        with self._lock:
            self._files[obj.shown] = source
            self.opened.append(source)

    def keep(self, paths: set[str]) -> None:
        """Close the sources of the objects not in ``paths``."""
        for path in [p for p in self._files if p not in paths]:
            source = self._files.pop(path)
            self.opened.remove(source)
            source.close()

    def _one(self, path: str) -> ByteSource:
        return self._files[path]


def _file_table(inst: Instance) -> tuple[np.ndarray, np.ndarray, str]:
    """The frames of a local instance: :func:`frame_table` of its file (its errors name it)."""
    with about(inst.path):
        return frame_table(inst, is_encapsulated(inst.transfer_syntax))


def _assemble(instances: list[Instance], problems: list[str], given: ByteSource | None,
              sources: _SourcesLike | None = None, tables: _Tables = _file_table) -> Pyramid:
    """The pyramid of ``instances`` (``given``: the source of the file the caller opened, or
    None).  ``sources`` (``.of(paths)``, ``.close()``, ``.given``) and ``tables`` (instance ->
    ``(offsets, counts, table name)``) default to local files; the DICOMweb reader (:mod:`.web`)
    gives its own (frames fetched by number)."""
    if sources is None:
        sources = _Sources(given)
    try:
        with warnings.catch_warnings():  # pydicom's value-length warnings on lazy conversion
            warnings.simplefilter("ignore")
            return _describe(instances, problems, sources, tables)
    except WsiError:
        sources.close()
        raise
    except OSError:
        sources.close()
        raise
    except Exception as exc:  # a malformed attribute value pydicom converts late
        sources.close()
        raise CorruptFileError(f"malformed DICOM attributes: {type(exc).__name__}: {exc}") from None
    except BaseException:
        sources.close()
        raise


def _images(instances: list[Instance], tables: _Tables = _file_table) -> list[Image]:
    """Each instance as an :class:`Image`, the parts of a concatenation as one."""
    groups: dict[str, list[Instance]] = {}
    order: list[str] = []
    for inst in instances:
        key = inst.concatenation or f"instance:{inst.path}"
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(inst)
    images = []
    for key in order:
        parts = groups[key]
        images.append(merge_parts(parts, [tables(p) for p in parts]))
    return images


def _path_ids(inst: Instance) -> list[str]:
    """The Optical Path Identifiers of ``inst``, in its Optical Path Sequence's order."""
    return [str(item.get("OpticalPathIdentifier", "")) for item in (inst.ds.get("OpticalPathSequence") or [])]


def _pick_volumes(instances: list[Instance], given: ByteSource | None) -> list[Instance]:
    """The VOLUME instances of the pyramid read: the opened file's (else the largest's)
    Study and Pyramid UIDs, and its first optical path unless read as channels."""
    volumes = [i for i in instances if i.flavor == "VOLUME"]
    if not volumes:
        kinds = sorted({i.flavor for i in instances})
        raise UnsupportedFormatError(f"the DICOM series has no VOLUME instance "
                                     f"(only {', '.join(kinds)})")
    own = next((i for i in volumes if given is not None and i.path == given.path), None)
    anchor = own or max(volumes, key=lambda i: i.width * i.height)
    # Frame of Reference UIDs are not compared: Google's wsi2dcm gives every
    # level its own (the shared CMU-1 series), and OpenSlide accepts that too.
    key = (anchor.study, anchor.pyramid)
    chosen = [i for i in volumes if (i.study, i.pyramid) == key]
    paths = _path_ids(anchor)
    if paths and not _multichannel(chosen):
        first = paths[0]
        chosen = [i for i in chosen if not _path_ids(i) or first in _path_ids(i)]
    return chosen


def _multichannel(volumes: list[Instance]) -> bool:
    """True when the volumes hold several optical paths of one-sample images: a
    fluorescence series, read as channels (else the first optical path is read)."""
    ids = {p for i in volumes for p in _path_ids(i)}
    return len(ids) > 1 and all(i.samples == 1 for i in volumes)


def _path_items(images: list[Image]) -> list[Any]:
    """The distinct Optical Path Sequence items of ``images``, by identifier, in first-seen order."""
    seen: dict[str, object] = {}
    for image in images:
        for item in image.head.ds.get("OpticalPathSequence") or []:
            seen.setdefault(str(item.get("OpticalPathIdentifier", "")), item)
    return list(seen.values())


def _first_frame(source: ByteSource, offsets: np.ndarray, counts: np.ndarray) -> bytes | None:
    """The first bytes (up to 64 KiB) of the first present frame, for the encoding checks; None if none."""
    present = np.flatnonzero(counts)
    if len(present) == 0:
        return None
    k = int(present[0])
    return source.read(int(offsets[k]), min(int(counts[k]), 65536))


def _describe(instances: list[Instance], problems: list[str], sources: _SourcesLike,
              tables: _Tables = _file_table) -> Pyramid:
    """The pyramid of the series' ``instances``: its levels (:func:`_pick_volumes`, one
    image per size, or per size and optical path for a series read as channels), the
    associated images and the properties."""
    volumes = _pick_volumes(instances, sources.given)
    images = sorted(_images(volumes, tables), key=lambda im: -(im.head.width * im.head.height))
    items = _path_items(images) if _multichannel(volumes) else []
    ids = [str(item.get("OpticalPathIdentifier", "")) for item in items]
    kept = _level_groups(images, ids, problems)
    head0 = kept[0][0][0].head
    channels = path_channels(items, head0.bits_stored) if ids else []
    levels, notes = _build_levels(kept, ids, channels, sources)
    associated = _associated(instances, sources, problems, tables)
    sizes = {name: (im.width, im.height) for name, im in associated.items()}
    properties = build_properties(tuple(levels), head0.ds, notes, sizes)
    profile = icc_profile_of(head0.ds)
    if profile is not None:  # OpenSlide's key for it (openslide-python's ICC support)
        properties["openslide.icc-size"] = str(len(profile))
    quickhash = series_quickhash(head0.series)  # the series' identity, as OpenSlide's
    if quickhash is not None:
        properties[QUICKHASH] = quickhash
    return Pyramid(vendor="dicom", levels=tuple(levels), associated=associated,
                   properties=properties, problems=problems, release=sources.close,
                   color_profile=profile,
                   identifying=frozenset(k for k in properties if is_phi(k)))


#: the images of one level: ``(image, index of the optical path in its sequence)`` each
_Group = list[tuple[Image, int]]


def _level_groups(images: list[Image], ids: list[str], problems: list[str]) -> list[_Group]:
    """Per size, largest first (``images`` are sorted so): the images of that size; each
    optical path of ``ids`` from the first image holding it (with no ``ids``: the first
    image).  Passed-over images, and levels without every optical path, are reported in
    ``problems``.

    Raises:
        UnsupportedFormatError: with ``ids``, no level holds all the optical paths.
    """
    kept: list[_Group] = []
    level_sizes: list[tuple[int, int]] = []
    for image in images:
        size = (image.head.width, image.head.height)
        if not level_sizes or level_sizes[-1] != size:
            level_sizes.append(size)
            kept.append([])
        group = kept[-1]
        own = _path_ids(image.head)
        if ids:
            missing = [k for k in range(len(ids)) if ids[k] in own
                       and all(ids[k] not in _path_ids(im.head) for im, _ in group)]
            if missing:
                group.extend((image, own.index(ids[k])) for k in missing)
                continue
        elif not group:
            group.append((image, 0))
            continue
        problems.append(f"passed over {image.head.path}: a second VOLUME instance of "
                        f"{image.head.width}x{image.head.height}")
    if not ids:
        return kept
    complete = []
    for group, size in zip(kept, level_sizes, strict=True):
        if len(group) == len(ids):
            group.sort(key=lambda pair: ids.index(_path_ids(pair[0].head)[pair[1]]))
            complete.append(group)
        else:
            problems.append(f"passed over the {size[0]}x{size[1]} level: {len(group)} of the "
                            f"{len(ids)} optical paths")
    if not complete:
        raise UnsupportedFormatError(f"no level of the DICOM series holds all "
                                     f"{len(ids)} optical paths")
    return complete


def _build_levels(kept: list[_Group], ids: list[str], channels: list[Channel],
                  sources: _SourcesLike) -> tuple[list[PyramidLevel], dict[str, str]]:
    """``(levels, wsitool.dicom.* notes)`` of the level groups: one :class:`PyramidLevel` per
    image (a plane of a multi-channel level where the series is read as channels)."""
    w0, h0 = kept[0][0][0].head.width, kept[0][0][0].head.height
    levels: list[PyramidLevel] = []
    notes: dict[str, str] = {}
    for index, group in enumerate(kept):
        planes, grids = [], []
        for image, path_index in group:
            head = image.head
            offsets, counts, grid = tile_grid(image, path_index)
            source = sources.of([p.path for p in image.parts])
            encoding, dtype = frame_encoding(head, _first_frame(source, offsets, counts))
            plane = PyramidLevel(
                index=index, width=head.width, height=head.height,
                downsample=(w0 / head.width + h0 / head.height) / 2.0,
                tile_width=head.frame_width, tile_height=head.frame_height, tiled=True,
                samples=head.samples, dtype=dtype, encoding=encoding,
                tiles=TileIndex(offsets, counts), source=source)
            plane.path = head.path  # (its tile errors name the instance file, not the folder)
            planes.append(plane)
            grids.append(grid)
        levels.append(multichannel_level(planes, channels) if ids else planes[0])
        if index == 0:
            notes = _series_notes(group[0][0], grids[0], len(ids))
        if grids[0].missing:
            notes[f"wsitool.dicom.level[{index}].missing-tiles"] = str(grids[0].missing)
        if len(group[0][0].parts) > 1:
            notes[f"wsitool.dicom.level[{index}].concatenation-parts"] = str(len(group[0][0].parts))
    return levels, notes


def _series_notes(image: Image, grid: GridNotes, channels: int) -> dict[str, str]:
    """The ``wsitool.dicom.*`` notes of how level 0's image (``image``, tiled as ``grid``)
    was read; ``channels``: the optical paths read as channels (0: one path read)."""
    picked = (f"all {channels}, as channels" if channels
              else f"{grid.optical_path} (first of {grid.optical_paths})")
    return {
        "wsitool.dicom.organization": grid.organization,
        "wsitool.dicom.optical-path": picked,
        "wsitool.dicom.focal-plane": f"{grid.focal_plane} (first of {grid.focal_planes})",
        "wsitool.dicom.offset-table": image.table,
        "wsitool.dicom.image-type": "VOLUME" if image.head.has_image_type else "(none; taken as VOLUME)",
    }


def _associated(instances: list[Instance], sources: _SourcesLike, problems: list[str],
                tables: _Tables = _file_table) -> dict[str, AssociatedImage]:
    """The LABEL, OVERVIEW and THUMBNAIL instances as ``label``, ``macro``, ``thumbnail``
    (the first of each); one that cannot be read is passed over (in ``problems``)."""
    out: dict[str, AssociatedImage] = {}
    for inst in instances:
        name = ASSOCIATED.get(inst.flavor)
        if name is None or name in out:
            continue
        try:
            (image,) = _images([inst], tables)
            offsets, counts, _grid = tile_grid(image)
            source = sources.of([inst.path])
            encoding, dtype = frame_encoding(inst, _first_frame(source, offsets, counts))
        except WsiError as exc:
            problems.append(f"associated image {name!r} passed over: {exc}")
            continue
        out[name] = AssociatedImage(
            name=name, width=inst.width, height=inst.height, samples=inst.samples,
            itemsize=dtype.itemsize, planar=False, encoding=encoding,
            offsets=tuple(int(v) for v in offsets), bytecounts=tuple(int(v) for v in counts),
            max_segment=(inst.frame_width, inst.frame_height), source=source,
            tile_size=(inst.frame_width, inst.frame_height))
    return out
