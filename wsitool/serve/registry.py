"""Which slides a server serves, under which ids; each opened on first use.

Every argument is a slide file or a folder.  A folder contributes each slide
file under it (any depth; extensions :data:`SLIDE_EXTENSIONS`) and each
sub-folder holding DICOM files (``.dcm``) as one slide (opened as a folder,
where wsitool supports that).  Ids are stable: the path relative to the folder
given, in POSIX form, with ``/`` replaced by ``~`` (``cases/a.svs`` ->
``cases~a.svs``); a file given directly gets its file name.  A clash (two
arguments giving the same id) gets ``~2``, ``~3``, ... in argument order.

Listed at start, opened on first use: the registry is built once, at start-up,
from the file system, without opening the slides (a folder of 10,000 slides is
listed in seconds); a file is only checked to be a regular file that starts like
a slide (a TIFF or DICOM header) or is named like one (a MIRAX ``.mrxs``, whose folder beside
it is not listed), else it is skipped with a log line.  A slide
opens when a request first needs it (:class:`~.pool.OpenSlides`: at most a budget
of descriptors open, the least recently used closed first).  A listed slide that
then fails to open (a broken structure, a file gone) is left out from then on:
one ``not served`` log line, added to :attr:`SlideRegistry.skipped`, and no longer
in the listing (:meth:`SlideRegistry.__iter__`); its requests answer 404.

Security: a request names an id, which is looked up in a dictionary and never
joined to a path, so no request can reach a file that was not listed.  Files and
folders reached through a symbolic link that leaves the folder given are skipped
and counted (:attr:`SlideRegistry.links_skipped`; the server says how many at
start), and so is a DICOM series (a sub-folder, or ``.dcm`` files beside each
other) any of whose instance files is such a link: a series is assembled from
every DICOM file in its folder, so one level, label or thumbnail linked in from
elsewhere would be served as part of it.  The series is left out whole (checked
again when it opens); with ``follow_links=True`` (``--follow-links``) they are
served, under the ids of the links (a folder of links to slides elsewhere is a
common way to assemble a data set), each real folder walked once (link cycles
end).  A file or folder given directly is always served, link or not.

An argument may also be a slide URL (``https://``, ``s3://``, ``gs://``,
``az://``): its id is the last part of the URL's path (percent-decoded; never
the host, a user name, a password or a query string), made unique as above.  An
object-store URL ending in ``/`` is a prefix: every object under it (any depth)
whose name ends in one of :data:`SLIDE_EXTENSIONS` is served, its id its key
relative to the prefix with ``/`` replaced by ``~``, as for a folder; ``.dcm``
objects make series as in a folder (a sub-prefix holding them is one slide, a
prefix holding only them directly is itself one slide).  An
``http(s)://`` URL ending in ``/`` is refused (HTTP has no listing).  A slide URL
given directly is opened at start: one that cannot be reached (not found, access
denied, the server failing) stops the start with that error; one that is reached
but is not a slide wsitool reads is skipped, as a local file.  The objects under
a prefix open on first use (the listing is what start-up checks).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import stat
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import (
    CorruptFileError,
    InvalidOptionError,
    TileDecodeError,
    UnsupportedFormatError,
    WsiError,
    printable,
)
from ..ground.oserrors import RESOURCE_ERRNOS
from ..opening import BucketPrefix, Location, parse_location
from ..opening.opener import claimed, not_a_slide, sniffed
from ..storage import is_url
from ..storage.local import open_regular
from .pool import OpenSlides, default_open_files

if TYPE_CHECKING:
    from ..slide import Slide

__all__ = ["SlideEntry", "SlideRegistry", "SLIDE_EXTENSIONS", "slide_id", "url_slide_id"]

log = logging.getLogger("wsitool.serve")

SLIDE_EXTENSIONS = (".svs", ".tif", ".tiff", ".ome.tif", ".ome.tiff", ".qptiff", ".btf", ".tf2",
                    ".tf8", ".ndpi", ".scn", ".bif", ".dcm", ".mrxs")

#: Bytes read at listing to tell a slide file from anything else (a DICOM file's "DICM" sits at 128..132).
_HEAD_BYTES = 132
#: Descriptors an open TIFF-based slide holds (its byte source and the file tifffile parsed).
_TIFF_FILES = 2


@dataclasses.dataclass(eq=False)
class SlideEntry:
    """One served slide: its id, the path shown (a URL without its secrets) and how it opens.

    Attributes:
        id: the slide's id in URLs.
        path: the path or URL shown in pages and logs (a URL without credentials or query).
        location: what the opener is given: a local path, or the
            :class:`~wsitool.opening.Location` of a URL (which keeps its query, a presigned URL's
            signature, and carries the storage options it is read with).
        files: descriptors the open slide holds (counted against the open-slide budget):
            2 for a TIFF-based slide, one per file of a DICOM series folder, a MIRAX slide's
            ``.mrxs`` and one per file of its folder.
        root: the real path of the folder the slide was found in, which every instance of its
            DICOM series must stay inside; None where no such rule holds (``--follow-links``,
            a file given directly, a URL).
        series: the folder whose DICOM files the slide reads (a series folder, or the folder
            of a ``.dcm`` file); None for any other slide.
        facts: ``(width, height, levels)`` once the slide has been opened, else None.
        failed: why the slide cannot be opened (None: not known to fail).
    """

    id: str
    path: str
    location: str | Location
    files: int = _TIFF_FILES
    root: str | None = None
    series: str | None = None
    facts: tuple[int, int, int] | None = None
    failed: str | None = None
    pool: OpenSlides[SlideEntry] | None = dataclasses.field(default=None, repr=False)

    @property
    def slide(self) -> Slide:
        """The open :class:`~wsitool.Slide`, opened now if it is not open (blocking).

        Not pinned: a slide may be closed once it falls out of the open-slide budget.  The
        server's routes hold a lease instead (:meth:`OpenSlides.acquire` / ``release``).

        Raises:
            Exception: whatever opening the slide raises (see :class:`SlideRegistry`).
        """
        assert self.pool is not None, "an entry of a registry"
        slide = self.pool.acquire(self)
        self.pool.release(self)
        return slide


def slide_id(relative: str) -> str:
    """The id of a slide at POSIX path ``relative`` (relative to its folder)."""
    return relative.replace("/", "~")


def url_slide_id(url: str) -> str:
    """The id of the slide at ``url``: the last part of its path, percent-decoded.

    Never the scheme, host, user name, password, query or fragment; a URL
    without a path names its host (``s3://bucket`` -> ``bucket``).
    """
    parts = urllib.parse.urlsplit(url)
    name = urllib.parse.unquote(parts.path.rstrip("/").rpartition("/")[2])
    return slide_id(name or parts.hostname or "slide")


#: what a slide that is reached but not read is (skipped, as a local file); anything else stops the start
_NOT_A_SLIDE = (UnsupportedFormatError, CorruptFileError, TileDecodeError)
#: what makes a listed slide fail for good (left out from then on), unless the machine is out of something
_FOR_GOOD = (*_NOT_A_SLIDE, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)


def _url_candidates(location: Location) -> list[tuple[str, Location]]:
    """``(id, location)`` of the slides of a URL argument: itself, or those listed under a
    prefix (each read with the prefix's storage options).

    Raises:
        InvalidOptionError: a URL ending in ``/`` that is not an object store's.
        RemoteNotFoundError, RemoteAccessError, RemoteUnavailableError: the listing.
    """
    url = location.target
    if not urllib.parse.urlsplit(url).path.endswith("/"):
        return [(url_slide_id(url), location)]
    if not isinstance(location, BucketPrefix):
        scheme = url.split("://", 1)[0].lower()
        raise InvalidOptionError(f"{location.shown}: a URL ending in '/' is a prefix to list, and {scheme}:// "
                                 "has no listing: give each slide's URL")
    prefix = urllib.parse.unquote(urllib.parse.urlsplit(url).path).lstrip("/")
    listed = []
    for found in location.listed():
        key = urllib.parse.unquote(urllib.parse.urlsplit(found).path).lstrip("/")
        rel = key[len(prefix):] if key.startswith(prefix) else key
        if _is_slide_name(rel):
            listed.append((rel, found))
    top = [rel for rel, _ in listed if "/" not in rel]
    if any(_is_dicom(rel) for rel in top) and all(_is_dicom(rel) for rel in top):
        return [(url_slide_id(url), location)]  # the prefix is itself one DICOM series, as a local folder
    out: list[tuple[str, Location]] = []
    series = set()
    for rel, found in listed:
        folder = rel.rpartition("/")[0]
        if _is_dicom(rel) and folder:  # a sub-prefix of DICOM objects is one slide (a series)
            if folder not in series:
                series.add(folder)
                out.append((slide_id(folder), location.at(found.rpartition("/")[0] + "/")))
            continue
        out.append((slide_id(rel), location.at(found)))
    return out


def _is_dicom(name: str) -> bool:
    return name.lower().endswith(".dcm")


def _dicom_names(folder: str | os.PathLike) -> list[str]:
    """The ``.dcm`` names in ``folder`` (none where it cannot be listed)."""
    try:
        return [name for name in os.listdir(folder) if _is_dicom(name)]
    except OSError:
        return []


def _inside(path: str, root: str) -> bool:
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _files_of(path: str) -> int:
    """Descriptors an open slide file holds: a TIFF-based one :data:`_TIFF_FILES`; a MIRAX slide
    its ``.mrxs`` and the files of its folder (its data files stay open)."""
    if not path.endswith(".mrxs"):
        return _TIFF_FILES
    with contextlib.suppress(OSError):
        return 1 + len(os.listdir(path[:-len(".mrxs")]))
    return _TIFF_FILES


def _is_slide_name(name: str) -> bool:
    return name.lower().endswith(SLIDE_EXTENSIONS)


def _head(path: str) -> bytes:
    """The first :data:`_HEAD_BYTES` bytes of ``path`` if it is a regular file, else ``b""``
    (:func:`~wsitool.storage.local.open_regular`: opened without blocking and checked before
    reading, so a FIFO or a device is never read).

    Raises:
        UnsupportedFormatError: not a regular file (the message names its kind).
        OSError: as ``os.open``.
    """
    fd = open_regular(path)
    try:
        return os.pread(fd, _HEAD_BYTES, 0) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    finally:
        os.close(fd)


def _not_a_slide(path: str) -> str | None:
    """Why the file ``path`` is no slide wsitool reads, judged by its type and first bytes;
    None when it is a regular file that starts like one (its structure is read when it opens)."""
    try:
        head = _head(path)
    except UnsupportedFormatError as exc:  # a FIFO, a socket, a device: the one message of storage.local
        return str(exc)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if sniffed(head) is not None or claimed(os.path.basename(path)) is not None:
        return None
    return not_a_slide(path, head)


def _outside_instances(folder: str, root: str) -> list[str]:
    """The symbolic links in ``folder`` that lead outside ``root`` to DICOM files: instances a
    series of ``folder`` would take in from elsewhere (a link to anything else is passed over
    by the series, as a non-DICOM file)."""
    from ..formats import dicom

    out = []
    with contextlib.suppress(OSError), os.scandir(folder) as found:
        for item in found:
            if item.is_symlink() and not _inside(item.path, root):
                with contextlib.suppress(OSError, UnsupportedFormatError):  # (a FIFO: no DICOM)
                    if dicom.sniff(_head(item.path)):
                        out.append(item.path)
    return sorted(out)


@dataclasses.dataclass(frozen=True)
class _Found:
    """A slide found in a folder: its relative POSIX path, its path, and for DICOM the series
    folder and the number of files in it."""

    rel: str
    path: str
    series: str | None = None
    files: int = _TIFF_FILES


def _series_note(folder: str, outside: list[str]) -> tuple[str, str]:
    """``(folder, reason)`` of a DICOM series left out for its instances linked in from outside."""
    more = f" (and {len(outside) - 1} more)" if len(outside) > 1 else ""
    return folder, (f"{folder}: DICOM series with an instance that is a symbolic link leading outside "
                    f"the folders given ({outside[0]}{more}): give --follow-links to serve it")


def _candidates(root: Path, follow_links: bool = False, skipped_links: list[str] | None = None,
                skipped_series: list[tuple[str, str]] | None = None) -> Iterator[_Found]:
    """The slides under ``root``, sorted.

    Without ``follow_links`` nothing outside ``root`` is listed: a symbolic link
    (to a slide file or a folder) that leads outside it is appended to
    ``skipped_links`` instead, and a DICOM series whose folder holds such a link to a
    DICOM file is not listed (the link is appended to ``skipped_links``, the series with
    why to ``skipped_series``).  With it, links are followed wherever they lead; a real
    folder already walked is not walked again (no link cycle loops).
    """
    real_root = os.path.realpath(root)
    walked: set[str] = set()
    skipped = skipped_links if skipped_links is not None else []
    series_out = skipped_series if skipped_series is not None else []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=follow_links):
        real_dir = os.path.realpath(dirpath)
        if follow_links:
            if real_dir in walked:  # reached again through a link: a cycle or a duplicate
                dirnames[:] = []
                continue
            walked.add(real_dir)
        else:
            for name in dirnames:  # os.walk lists linked folders but does not enter them
                path = os.path.join(dirpath, name)
                if os.path.islink(path) and not _inside(path, real_root):
                    skipped.append(path)
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        dicoms = sorted(f for f in filenames if f.lower().endswith(".dcm"))
        outside = [] if follow_links or not dicoms else _outside_instances(dirpath, real_root)
        skipped.extend(outside)
        if outside:
            series_out.append(_series_note(dirpath, outside))
        if dicoms and rel_dir == "." and not any(_is_slide_name(name) and
                                                 not name.lower().endswith(".dcm") for name in filenames):
            # the folder given is itself one DICOM series: one slide, named after the folder
            if not outside:
                yield _Found(root.name or "series", str(root), str(root), len(filenames))
            return
        if dicoms and rel_dir != ".":
            # a folder of DICOM instances is one slide (a series)
            if not outside and (follow_links or _inside(dirpath, real_root)):
                yield _Found(Path(rel_dir).as_posix(), dirpath, dirpath, len(filenames))
            filenames = [f for f in filenames if not f.lower().endswith(".dcm")]
        for name in sorted(filenames):
            if not _is_slide_name(name):
                continue
            path = os.path.join(dirpath, name)
            if not follow_links and not _inside(path, real_root):
                if path not in outside:
                    skipped.append(path)
                continue
            if _is_dicom(name) and outside:
                continue  # its series would take the outside instances in
            rel = name if rel_dir == "." else f"{Path(rel_dir).as_posix()}/{name}"
            yield _Found(rel, path, dirpath if _is_dicom(name) else None,
                         len(dicoms) if _is_dicom(name) else _files_of(path))


class SlideRegistry:
    """The slides of one server, by id (insertion order = listing order), opened on first use.

    Args:
        sources: slide files and folders, slide URLs, object-store prefixes; a URL as a
            :class:`~wsitool.opening.Location` carries the storage options it is read (and a
            prefix listed) with (:meth:`~wsitool.serve.config.ServeConfig.located`).
        opener: ``opener(location) -> Slide`` (e.g. ``open_slide`` bound to a cache), given a
            local path or a URL's :class:`~wsitool.opening.Location`.
        follow_links: serve what symbolic links inside the folders lead to, even
            outside them (default: such links are skipped and listed in
            :attr:`links_skipped`).  A file or folder given directly is always
            served, link or not.
        max_open_files: descriptors the open slides may hold at once (:class:`~.pool.OpenSlides`);
            None: :func:`~.pool.default_open_files`, from the process's descriptor limit.

    Attributes:
        skipped: ``(path, reason)`` of the slide files left out: at listing (not a
            regular file, not starting like a slide, a URL that is no slide) and
            since (a slide that failed to open; logged then).
        links_skipped: paths of the symbolic links (to slide files, folders, DICOM
            instances) left out because they lead outside the folder given.
        slides: the :class:`~.pool.OpenSlides` of the entries.

    Raises:
        FileNotFoundError: a source does not exist (for a URL:
            :class:`~wsitool.errors.RemoteNotFoundError`, also for a prefix with nothing under it).
        RemoteAccessError, RemoteUnavailableError: a URL or a prefix's listing could not be read.
        InvalidOptionError: an ``http(s)://`` URL ending in ``/`` (no listing).
        WsiError: anything else a URL's opening raises, a bad storage option for one.
    """

    def __init__(self, sources: Iterable[str | os.PathLike | Location], opener: Callable[[str | Location], Slide],
                 follow_links: bool = False, max_open_files: int | None = None):
        self.entries: dict[str, SlideEntry] = {}
        self.skipped: list[tuple[str, str]] = []
        self.links_skipped: list[str] = []
        self._opener = opener
        self._lock = threading.Lock()
        self._listed = False
        self.slides: OpenSlides[SlideEntry] = OpenSlides(self._open, max_open_files or default_open_files())
        try:
            for source in sources:
                if isinstance(source, Location) or is_url(source):
                    self._add_urls(parse_location(source))
                    continue
                src = Path(source)
                if not src.exists():
                    raise FileNotFoundError(2, "No such file or directory", str(src))
                if src.is_dir():
                    root = None if follow_links else os.path.realpath(src)
                    for found in _candidates(src, follow_links, self.links_skipped, self.skipped):
                        self._add_file(slide_id(found.rel), found, root)
                else:
                    files = len(_dicom_names(src.parent)) if _is_dicom(src.name) else _TIFF_FILES
                    self._add_file(slide_id(src.name), _Found(src.name, str(src), None, files), None)
        except BaseException:
            self.close()
            raise
        self._listed = True

    def _add_urls(self, location: Location) -> None:
        """The slides of a URL argument; a slide URL given directly is opened now (a URL that
        cannot be reached stops the start; one that is no slide is skipped)."""
        for sid, found in _url_candidates(location):
            entry = self._enter(sid, SlideEntry(sid, found.shown, found))
            if found != location or location.target.endswith("/"):
                continue  # (listed under a prefix: opened on first use)
            try:
                self.slides.acquire(entry)
            except _NOT_A_SLIDE:
                del self.entries[entry.id]  # reached but not a slide: left out, as any local file
                continue
            self.slides.release(entry)

    def _add_file(self, sid: str, found: _Found, root: str | None) -> None:
        """A local slide: listed if it is a folder or a regular file starting like a slide."""
        if found.series is None or not os.path.isdir(found.path):
            why = _not_a_slide(found.path)
            if why is not None:
                self.skipped.append((found.path, why))  # reported once, by the runner
                return
        self._enter(sid, SlideEntry(sid, found.path, found.path, files=max(1, found.files),
                                    root=root if found.series else None, series=found.series))

    def _enter(self, sid: str, entry: SlideEntry) -> SlideEntry:
        base, n = sid, 2
        while sid in self.entries:
            sid = f"{base}~{n}"
            n += 1
        entry.id, entry.pool = sid, self.slides
        self.entries[sid] = entry
        return entry

    def _open(self, entry: SlideEntry) -> Slide:
        """Open ``entry``'s slide (called by :attr:`slides`); a failure for good marks the entry
        (:attr:`SlideEntry.failed`, :attr:`skipped`, one ``not served`` log line once listed)
        and is raised.

        Raises:
            WsiError: the entry failed before, or is a DICOM series that now takes in an
                instance from outside the folder it was found in.
            Exception: whatever the opener raises.
        """
        if entry.failed is not None:
            raise WsiError(entry.failed)
        series, root = entry.series, entry.root
        outside = _outside_instances(series, root) if root is not None and series is not None else []
        if outside and series is not None:
            self._failed(entry, _series_note(series, outside)[1])
            raise WsiError(entry.failed)
        try:
            slide = self._opener(entry.location)
        except _FOR_GOOD as exc:
            if not (isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS):
                # (out of descriptors or memory: the machine's, tried again on the next request)
                self._failed(entry, str(exc) if str(exc).startswith(entry.path) else f"{entry.path}: {exc}")
            raise
        w, h = slide.dimensions
        entry.facts = (w, h, slide.level_count)
        return slide

    def _failed(self, entry: SlideEntry, why: str) -> None:
        """Leave ``entry`` out from now on, saying why (logged once the listing is done; at start
        the runner reports :attr:`skipped`)."""
        with self._lock:
            if entry.failed is None:
                entry.failed = why
                self.skipped.append((entry.path, why))
                if self._listed:
                    log.warning("not served: %s", printable(why))

    def get(self, sid: str) -> SlideEntry | None:
        """The entry of id ``sid``, or None (a plain dictionary lookup; a slide that failed to
        open is still found: its :attr:`SlideEntry.failed` says why)."""
        if not isinstance(sid, str):
            return None
        return self.entries.get(sid)

    def __iter__(self) -> Iterator[SlideEntry]:
        """The entries served, in listing order (not those that failed to open)."""
        return iter([e for e in self.entries.values() if e.failed is None])

    def __len__(self) -> int:
        """How many slides are served (listed, less those that failed to open)."""
        return sum(1 for e in self.entries.values() if e.failed is None)

    def close(self) -> None:
        """Close every open slide."""
        self.slides.close()
