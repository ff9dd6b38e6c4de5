"""The manifest of a batch export: what it completed, for which source version and options (resume) (floor 7)."""

from __future__ import annotations

import contextlib
import json
import os
import stat as _stat
from pathlib import Path

import numpy as np

from ..export.dzi import dzi_paths
from ..ground import outputs as atomic

#: The batch export manifest, in the output folder: what earlier batches completed.
MANIFEST_NAME = ".wsitool-manifest.json"


#: Export options that do not change the output's content (not compared on resume).
UNRECORDED_OPTIONS = ("threads", "overwrite", "progress", "max_pixels", "storage_options")  # (credentials)


def output_size(output: Path, format: str) -> int | None:
    """Size in bytes of a complete-looking output (for Deep Zoom the ``.dzi`` file,
    with its ``_files`` folder present; for DICOM the files of the series' folder), or None
    when absent or incomplete."""
    if format == "dicom":
        if not output.is_dir() or output.is_symlink():
            return None
        with os.scandir(output) as entries:
            return sum(e.stat(follow_symlinks=False).st_size for e in entries if e.is_file(follow_symlinks=False))
    if format == "dzi":
        output, files = dzi_paths(output)
        if not files.is_dir() or files.is_symlink():
            return None
    try:
        st = os.lstat(output)
    except OSError:
        return None

    return st.st_size if _stat.S_ISREG(st.st_mode) else None


def output_exists(output: Path, format: str) -> bool:
    if format == "dzi":
        dzi, files = dzi_paths(output)
        return os.path.lexists(dzi) or os.path.lexists(files)
    return os.path.lexists(output)


def source_stamp(source: str) -> dict | None:
    try:
        st = os.stat(source)
    except (OSError, ValueError):  # ValueError: a NUL byte in the path
        return None
    return {"source": os.path.abspath(source), "source_size": st.st_size,
            "source_mtime_ns": st.st_mtime_ns}


def recorded_options(options: dict) -> dict:
    """The options that shape an output, as JSON values (tuples become lists)."""

    kept = {k: v for k, v in options.items() if k not in UNRECORDED_OPTIONS}
    return json.loads(json.dumps(kept, sort_keys=True, default=lambda v: list(v) if isinstance(
        v, (tuple, set, np.ndarray)) else str(v)))


class Manifest:
    """The batch manifest ``<output_dir>/.wsitool-manifest.json`` (:data:`MANIFEST_NAME`).

    JSON ``{"version": 1, "outputs": {<output file name>: {"source": absolute
    path, "source_size": bytes, "source_mtime_ns": ns, "output_size": bytes,
    "format": ..., "options": {...}, "completed": ISO time}}}``, rewritten
    atomically (:mod:`wsitool.ground.outputs`) after each completed slide.  An
    unreadable or foreign manifest counts as empty.
    """

    def __init__(self, out_dir: Path):
        self.path = out_dir / MANIFEST_NAME
        self.entries: dict[str, dict] = {}
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as fh:
                data = json.loads(fh.read(1 << 24).decode("utf-8"))
            if isinstance(data, dict) and data.get("version") == 1 and isinstance(data.get("outputs"), dict):
                self.entries = {k: v for k, v in data["outputs"].items() if isinstance(v, dict)}
        except (OSError, ValueError):
            pass

    def plan(self, source: str, output: Path, format: str, options: dict, overwrite: bool) -> str:
        """``"skip"`` (recorded complete: same source file, size, mtime and options, output
        unchanged), ``"replace"`` (an output an earlier batch recorded, now stale),
        ``"new"`` (nothing there) or ``"exists"`` (something not recorded is there)."""
        entry = self.entries.get(output.name)
        stamp = source_stamp(source)
        if overwrite:
            return "replace" if output_exists(output, format) else "new"
        if entry is not None and stamp is not None:
            size = output_size(output, format)
            same = (all(entry.get(k) == v for k, v in stamp.items())
                    and entry.get("format") == format
                    and entry.get("options") == recorded_options(options)
                    and size is not None and entry.get("output_size") == size)
            if same:
                return "skip"
        if not output_exists(output, format):
            return "new"
        return "replace" if entry is not None else "exists"

    def record(self, source: str, output: Path, format: str, options: dict,
               stamp: dict | None) -> None:
        """Record ``output`` as complete (``stamp``: the source as it was when the export
        started) and rewrite the manifest; a write error is ignored (resume then redoes it)."""
        import datetime


        size = output_size(output, format)
        if stamp is None or size is None:
            self.entries.pop(output.name, None)
        else:
            self.entries[output.name] = dict(
                stamp, output_size=size, format=format, options=recorded_options(options),
                completed=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
        data = json.dumps({"version": 1, "outputs": self.entries}, indent=1, sort_keys=True) + "\n"
        with contextlib.suppress(OSError):
            atomic.write_bytes(self.path, data.encode("utf-8"), overwrite=True)


