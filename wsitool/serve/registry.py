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
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..slide import Slide

__all__ = ["SlideEntry", "SlideRegistry", "SLIDE_EXTENSIONS", "slide_id"]

log = logging.getLogger("wsitool.serve")

SLIDE_EXTENSIONS = (".svs", ".tif", ".tiff", ".ome.tif", ".ome.tiff", ".qptiff", ".btf", ".tf2",
                    ".tf8", ".ndpi", ".scn", ".bif", ".dcm")


@dataclasses.dataclass
class SlideEntry:
    """One served slide: its id, path and open :class:`~wsitool.Slide`."""

    id: str
    path: str
    slide: Slide


def slide_id(relative: str) -> str:
    """The id of a slide at POSIX path ``relative`` (relative to its folder)."""
    return relative.replace("/", "~")


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

    Raises:
        FileNotFoundError: a source does not exist.
    """

    def __init__(self, sources: Iterable[str | os.PathLike], opener, follow_links: bool = False):
        self.entries: dict[str, SlideEntry] = {}
        self.skipped: list[tuple[str, str]] = []
        self.links_skipped: list[str] = []
        for src in sources:
            src = Path(src)
            if not src.exists():
                raise FileNotFoundError(2, "No such file or directory", str(src))
            if src.is_dir():
                for rel, path in _candidates(src, follow_links, self.links_skipped):
                    self._add(slide_id(rel), path, opener)
            else:
                self._add(slide_id(src.name), str(src), opener)

    def _add(self, sid: str, path: str, opener) -> None:
        try:
            slide = opener(path)
        except Exception as exc:  # any slide wsitool cannot open is left out, not fatal
            self.skipped.append((path, str(exc)))  # reported once, by the runner
            return
        base, n = sid, 2
        while sid in self.entries:
            sid = f"{base}~{n}"
            n += 1
        self.entries[sid] = SlideEntry(sid, path, slide)

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
