"""Finding the instances of a DICOM WSI series: from one of its files, or from a folder (floor 3).

A DICOM WSI is a series of instances, one file each (PS3.3 C.8.12.4; levels,
label, overview and thumbnail are separate instances of one Series Instance
UID).  Opening one file opens its series: the DICOM files beside it (same
folder, "DICM" at byte 128) whose Series Instance UID is the file's.  Opening
a folder opens the one series it holds; a folder holding several series is
an error naming them.  Files beside that are not DICOM, not whole-slide images,
or of other series are passed over; a sibling of the series whose header is
unreadable is passed over and reported (``problems``) by the error reading it, which names
it (:func:`~.instance.read_instance`); the opener names the slide.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from ...errors import CorruptFileError, UnsupportedFormatError, WsiError
from ...storage.local import open_regular
from .instance import MAGIC_AT, Instance, is_dicom, read_instance

__all__ = ["dicom_files", "series_of_file", "series_of_folder", "one_series", "Holder"]


def dicom_files(folder: str) -> list[str]:
    """The regular files directly in ``folder`` that start like DICOM files (PS3.10 7.1), sorted
    (a FIFO or device there is passed over: :func:`~wsitool.storage.local.open_regular`)."""
    out = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    for name in names:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        try:
            with os.fdopen(open_regular(path), "rb") as fp:  # (not open(): a FIFO's blocks)
                head = fp.read(MAGIC_AT + 4)
        except (OSError, UnsupportedFormatError):
            continue
        if is_dicom(head):
            out.append(path)
    return out


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def series_of_file(path: str) -> tuple[list[Instance], list[str]]:
    """The instances of the series ``path`` belongs to (``path``'s own first), and problems.

    Raises:
        UnsupportedFormatError, CorruptFileError: as :func:`read_instance` for ``path`` itself.
    """
    own = read_instance(path)
    instances = [own]
    problems: list[str] = []
    folder = os.path.dirname(os.path.abspath(path))
    for other in dicom_files(folder):
        if _same(other, path):
            continue
        try:
            inst = read_instance(other)
        except UnsupportedFormatError:
            continue
        except CorruptFileError as exc:
            problems.append(f"passed over {exc}")  # (it names the file)
            continue
        except OSError as exc:
            problems.append(f"passed over {other}: {exc}")
            continue
        if inst.series == own.series:
            instances.append(inst)
    return instances, problems


def series_of_folder(folder: str, files: list[str]) -> tuple[list[Instance], list[str]]:
    """The instances of the one WSI series among ``files`` (the DICOM files of ``folder``), and problems.

    Raises:
        UnsupportedFormatError: no whole-slide image among them, or several
            series (the message names each with one of its files).
        CorruptFileError: the only WSI candidates are unreadable (the first one's error).
    """
    reads: list[tuple[str, Instance | WsiError]] = []
    for path in files:
        try:
            reads.append((path, read_instance(path)))
        except (UnsupportedFormatError, CorruptFileError) as exc:
            reads.append((path, exc))
    return one_series(folder, reads, Holder("folder", lambda: _other_files(folder, files),
                                            "give one slide file, e.g. a file of one series"))


@dataclasses.dataclass(frozen=True)
class Holder:
    """What holds the DICOM files, for the messages of :func:`one_series`: its kind
    (``"folder"``, ``"prefix"``), how many other (non-DICOM) entries it holds (called only
    for the several-series message) and what to give instead of it."""

    kind: str
    others: Callable[[], int]
    instead: str


def one_series(where: str, reads: list[tuple[str, Instance | WsiError]],
               holder: Holder) -> tuple[list[Instance], list[str]]:
    """The instances of the one WSI series among ``reads`` (each DICOM file of ``where``, a
    folder or a bucket prefix, with its header or the error reading it, which names the file),
    and problems: the rule a folder and a prefix share.  Files that are not whole-slide images are passed
    over; unreadable ones are passed over and reported.

    Raises:
        UnsupportedFormatError: no whole-slide image among them, or several
            series (the message names each with one of its files).
        CorruptFileError: the only WSI candidates are unreadable (the first one's error).
    """
    by_series: dict[str, list[Instance]] = {}
    problems: list[str] = []
    first_error: WsiError | None = None
    for _, read in reads:
        if isinstance(read, CorruptFileError):
            problems.append(f"passed over {read}")
            first_error = read if not isinstance(first_error, CorruptFileError) else first_error
            continue
        if isinstance(read, WsiError):
            first_error = first_error or read
            continue
        by_series.setdefault(read.series, []).append(read)
    if not by_series:
        if first_error is not None:
            raise type(first_error)(f"{where}: no readable DICOM whole-slide image in the {holder.kind} "
                                    f"({first_error})")
        raise UnsupportedFormatError(f"{where}: no DICOM whole-slide image in the {holder.kind}")
    if len(by_series) > 1:
        raise UnsupportedFormatError(_several_series(where, by_series, holder))
    return next(iter(by_series.values())), problems


#: Series named by one of their files in the several-series message; the rest are counted.
NAMED_SERIES = 2


def _other_files(folder: str, files: list[str]) -> int:
    """Regular files of ``folder`` that are not among its DICOM ``files``."""
    try:
        return sum(1 for e in os.scandir(folder) if e.is_file()) - len(files)
    except OSError:
        return 0


def _several_series(where: str, by_series: dict, holder: Holder) -> str:
    """One short line for a folder (prefix) that is not one slide: what it holds (DICOM
    series, other files) and what to give instead (named for the first :data:`NAMED_SERIES`
    series by one of their files)."""
    others = holder.others()
    names = [os.path.basename(found[0].path) for found in by_series.values()]
    shown = ", ".join(names[:NAMED_SERIES]) + (f", ... {len(names) - NAMED_SERIES} more"
                                               if len(names) > NAMED_SERIES else "")
    held = f"{len(by_series)} DICOM series" + (f" and {others} other file(s)" if others > 0 else "")
    return f"{where}: a {holder.kind} of {held}, not one slide: {holder.instead} ({shown})"
