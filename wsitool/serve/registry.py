"""Which slides a server serves, under which ids.

Every argument is a slide file or a folder.  A folder contributes each slide
file under it (any depth; extensions :data:`SLIDE_EXTENSIONS`) and each
sub-folder holding DICOM files (``.dcm``) as one slide (opened as a folder,
where wsitool supports that).  Ids are stable: the path relative to the folder
given, in POSIX form, with ``/`` replaced by ``~`` (``cases/a.svs`` ->
``cases~a.svs``); a file given directly gets its file name.  A clash (two
arguments giving the same id) gets ``~2``, ``~3``, ... in argument order.

Security: the registry is built once, at start-up, from the file system; a
request names an id, which is looked up in a dictionary and never joined to a
path, so no request can reach a file that was not listed.  Files and folders
reached through a symbolic link that leaves the folder given are skipped and
counted (:attr:`SlideRegistry.links_skipped`; the server says how many at
start); with ``follow_links=True`` (``--follow-links``) they are served, under
the ids of the links (a folder of links to slides elsewhere is a common way to
assemble a data set), each real folder walked once (link cycles end).  Files
that wsitool cannot open are skipped with a log line (not fatal).

An argument may also be a slide URL (``https://``, ``s3://``, ``gs://``,
``az://``): its id is the last part of the URL's path (percent-decoded; never
the host, a user name, a password or a query string), made unique as above.  An
object-store URL ending in ``/`` is a prefix: every object under it (any depth)
whose name ends in one of :data:`SLIDE_EXTENSIONS` is served, its id its key
relative to the prefix with ``/`` replaced by ``~``, as for a folder; ``.dcm``
objects make series as in a folder (a sub-prefix holding them is one slide, a
prefix holding only them directly is itself one slide).  An
``http(s)://`` URL ending in ``/`` is refused (HTTP has no listing).  A URL that
cannot be reached (not found, access denied, the server failing) stops the
start with that error; one that is reached but is not a slide wsitool reads is
skipped, as a local file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import urllib.parse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import CorruptFileError, InvalidOptionError, TileDecodeError, UnsupportedFormatError
from ..storage import is_url, redact
from ..storage.urls import check_url

if TYPE_CHECKING:
    from ..slide import Slide

__all__ = ["SlideEntry", "SlideRegistry", "SLIDE_EXTENSIONS", "slide_id", "url_slide_id"]

log = logging.getLogger("wsitool.serve")

SLIDE_EXTENSIONS = (".svs", ".tif", ".tiff", ".ome.tif", ".ome.tiff", ".qptiff", ".btf", ".tf2",
                    ".tf8", ".ndpi", ".scn", ".bif", ".dcm")


@dataclasses.dataclass
class SlideEntry:
    """One served slide: its id, path (a URL without its secrets) and open :class:`~wsitool.Slide`."""

    id: str
    path: str
    slide: Slide


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


#: schemes whose URL ending in ``/`` is a prefix to list (object stores)
_LISTED = ("s3", "gs", "gcs", "az", "azure", "abfs", "abfss")
#: what a remote slide that is reached but not read is (skipped, as a local file); anything else stops the start
_NOT_A_SLIDE = (UnsupportedFormatError, CorruptFileError, TileDecodeError)


def _url_candidates(url: str, storage_options: dict | None) -> list[tuple[str, str]]:
    """``(id, URL)`` of the slides of a URL argument: itself, or those listed under a prefix.

    Raises:
        InvalidOptionError: a URL ending in ``/`` that is not an object store's.
        RemoteNotFoundError, RemoteAccessError, RemoteUnavailableError: the listing.
    """
    check_url(url)  # a malformed URL: one InvalidOptionError (exit 2), not urllib's ValueError
    if not urllib.parse.urlsplit(url).path.endswith("/"):
        return [(url_slide_id(url), url)]
    scheme = url.split("://", 1)[0].lower()
    if scheme not in _LISTED:
        raise InvalidOptionError(f"{redact(url)}: a URL ending in '/' is a prefix to list, and {scheme}:// "
                                 "has no listing: give each slide's URL")
    from ..storage.objectstore import list_objects

    prefix = urllib.parse.unquote(urllib.parse.urlsplit(url).path).lstrip("/")
    listed = []
    for found in list_objects(url, storage_options):
        key = urllib.parse.unquote(urllib.parse.urlsplit(found).path).lstrip("/")
        rel = key[len(prefix):] if key.startswith(prefix) else key
        if _is_slide_name(rel):
            listed.append((rel, found))
    top = [rel for rel, _ in listed if "/" not in rel]
    if any(_is_dicom(rel) for rel in top) and all(_is_dicom(rel) for rel in top):
        return [(url_slide_id(url), url)]  # the prefix is itself one DICOM series, as a local folder
    out, series = [], set()
    for rel, found in listed:
        folder = rel.rpartition("/")[0]
        if _is_dicom(rel) and folder:  # a sub-prefix of DICOM objects is one slide (a series)
            if folder not in series:
                series.add(folder)
                out.append((slide_id(folder), found.rpartition("/")[0] + "/"))
            continue
        out.append((slide_id(rel), found))
    return out


def _is_dicom(name: str) -> bool:
    return name.lower().endswith(".dcm")


def _inside(path: str, root: str) -> bool:
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _is_slide_name(name: str) -> bool:
    return name.lower().endswith(SLIDE_EXTENSIONS)


def _candidates(root: Path, follow_links: bool = False,
                skipped_links: list[str] | None = None) -> Iterable[tuple[str, str]]:
    """``(relative POSIX path, path)`` of the slides under ``root``, sorted.

    Without ``follow_links`` nothing outside ``root`` is listed: a symbolic link
    (to a slide file or a folder) that leads outside it is appended to
    ``skipped_links`` instead.  With it, links are followed wherever they lead;
    a real folder already walked is not walked again (no link cycle loops).
    """
    real_root = os.path.realpath(root)
    walked: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=follow_links):
        real_dir = os.path.realpath(dirpath)
        if follow_links:
            if real_dir in walked:  # reached again through a link: a cycle or a duplicate
                dirnames[:] = []
                continue
            walked.add(real_dir)
        elif skipped_links is not None:
            for name in dirnames:  # os.walk lists linked folders but does not enter them
                path = os.path.join(dirpath, name)
                if os.path.islink(path) and not _inside(path, real_root):
                    skipped_links.append(path)
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        dicoms = sorted(f for f in filenames if f.lower().endswith(".dcm"))
        if dicoms and rel_dir == "." and not any(_is_slide_name(name) and
                                                 not name.lower().endswith(".dcm") for name in filenames):
            # the folder given is itself one DICOM series: one slide, named after the folder
            yield root.name or "series", str(root)
            return
        if dicoms and rel_dir != ".":
            # a folder of DICOM instances is one slide (a series)
            if follow_links or _inside(dirpath, real_root):
                yield Path(rel_dir).as_posix(), dirpath
            filenames = [f for f in filenames if not f.lower().endswith(".dcm")]
        for name in sorted(filenames):
            if not _is_slide_name(name):
                continue
            path = os.path.join(dirpath, name)
            if not follow_links and not _inside(path, real_root):
                if skipped_links is not None:
                    skipped_links.append(path)
                continue
            rel = name if rel_dir == "." else f"{Path(rel_dir).as_posix()}/{name}"
            yield rel, path


class SlideRegistry:
    """The slides of one server, by id (insertion order = listing order).

    Args:
        sources: slide files and folders.
        opener: ``opener(path) -> Slide`` (e.g. ``open_slide`` bound to a cache).
        follow_links: serve what symbolic links inside the folders lead to, even
            outside them (default: such links are skipped and listed in
            :attr:`links_skipped`).  A file or folder given directly is always
            served, link or not.

    Attributes:
        skipped: ``(path, reason)`` of the slide files that could not be opened.
        links_skipped: paths of the symbolic links (to slide files or folders)
            left out because they lead outside the folder given.

        storage_options: for the URLs among ``sources``: what listing a prefix takes
            (the opener gets the URL and passes its own).

    Raises:
        FileNotFoundError: a source does not exist (for a URL:
            :class:`~wsitool.errors.RemoteNotFoundError`, also for a prefix with nothing under it).
        RemoteAccessError, RemoteUnavailableError: a URL or a prefix's listing could not be read.
        InvalidOptionError: an ``http(s)://`` URL ending in ``/`` (no listing).
        WsiError: anything else a URL's opening raises, a bad storage option for one.
    """

    def __init__(self, sources: Iterable[str | os.PathLike], opener: Callable[[str], Slide],
                 follow_links: bool = False, storage_options: dict | None = None):
        self.entries: dict[str, SlideEntry] = {}
        self.skipped: list[tuple[str, str]] = []
        self.links_skipped: list[str] = []
        try:
            for source in sources:
                if is_url(source):
                    for sid, url in _url_candidates(str(source), storage_options):
                        self._add(sid, url, opener, remote=True)
                    continue
                src = Path(source)
                if not src.exists():
                    raise FileNotFoundError(2, "No such file or directory", str(src))
                if src.is_dir():
                    for rel, path in _candidates(src, follow_links, self.links_skipped):
                        self._add(slide_id(rel), path, opener)
                else:
                    self._add(slide_id(src.name), str(src), opener)
        except BaseException:
            self.close()
            raise

    def _add(self, sid: str, path: str, opener: Callable[[str], Slide], remote: bool = False) -> None:
        shown = redact(path) if remote else path
        try:
            slide = opener(path)
        except _NOT_A_SLIDE as exc:  # reached but not a slide: left out, as any local file
            self.skipped.append((shown, str(exc)))  # reported once, by the runner
            return
        except Exception as exc:
            if remote:  # not reached (missing, denied, failing), a bad option: the start stops
                raise
            self.skipped.append((shown, str(exc)))  # any local slide wsitool cannot open: left out
            return
        base, n = sid, 2
        while sid in self.entries:
            sid = f"{base}~{n}"
            n += 1
        self.entries[sid] = SlideEntry(sid, shown, slide)

    def get(self, sid: str) -> SlideEntry | None:
        """The entry of id ``sid``, or None (a plain dictionary lookup)."""
        if not isinstance(sid, str):
            return None
        return self.entries.get(sid)

    def __iter__(self):
        return iter(self.entries.values())

    def __len__(self) -> int:
        return len(self.entries)

    def close(self) -> None:
        """Close every slide."""
        for entry in self.entries.values():
            with contextlib.suppress(Exception):
                entry.slide.close()
