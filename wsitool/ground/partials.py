"""Partials: the temporary names outputs are written under, and the record of the live ones.

A partial of ``final`` is a file or folder beside it named ``.<name>.partial-<host>-<pid>-<token>``
(:func:`partial_name`).  This process records the partials it creates (:func:`register`, before
the file or folder is made; :func:`forget` after it is renamed or removed), so a signal handler can
remove them (:func:`remove_live_partials`); a forked child starts with none.  The partials that
this host's dead processes left are removed by the next run into their folder
(:func:`clean_stale_partials`).  :mod:`wsitool.ground.outputs` creates and commits them.

This module imports only the standard library.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import stat
import threading
from pathlib import Path

__all__ = [
    "PARTIAL_MARK",
    "partial_name",
    "is_partial_name",
    "register",
    "unregister",
    "forget",
    "remove",
    "live_partials",
    "remove_live_partials",
    "clean_stale_partials",
]

#: The marker between the final name and the host/pid/token of a partial.
PARTIAL_MARK = ".partial-"

_PARTIAL_RE = re.compile(
    r"^\.(?P<name>.+)\.partial-(?P<host>[A-Za-z0-9._-]+)-(?P<pid>[0-9]+)-(?P<token>[0-9a-f]{8,})$"
)
_HOST_BAD = re.compile(r"[^A-Za-z0-9._-]")


def _host() -> str:
    """This host's name as it appears in partial names (``[A-Za-z0-9._-]``, at most 32 chars)."""
    host = _HOST_BAD.sub("_", socket.gethostname() or "localhost")[:32]
    return host or "localhost"


def partial_name(final: str | os.PathLike) -> Path:
    """A fresh temporary name for ``final`` in its folder: ``.<name>.partial-<host>-<pid>-<token>``.

    ``token`` is 16 random hex digits, so the name cannot be guessed in
    advance.  The name is not created (see :func:`create_file` /
    :func:`create_dir`).
    """
    final = Path(os.fspath(final))
    return final.with_name(f".{final.name}{PARTIAL_MARK}{_host()}-{os.getpid()}-{secrets.token_hex(8)}")


def is_partial_name(name: str) -> bool:
    """True when the file name ``name`` has the form :func:`partial_name` gives."""
    return _PARTIAL_RE.match(name) is not None


# --------------------------------------------------------------------------- registry

_live: set[str] = set()  # paths of this process's partial outputs (files or folders)
_live_lock = threading.RLock()  # re-entrant: a signal handler may run while the main thread holds it


def register(partial: Path) -> None:
    """Record ``partial`` as live (before its file or folder is made)."""
    with _live_lock:
        _live.add(os.fspath(partial))


def unregister(partial: Path) -> None:
    """Take ``partial`` out of the record (after it was renamed or removed)."""
    with _live_lock:
        _live.discard(os.fspath(partial))


def forget(partial: Path) -> None:
    """Remove ``partial`` (if it exists), then take it out of the registry: a signal between
    the two leaves it registered, for :func:`remove_live_partials`."""
    remove(partial)
    unregister(partial)


def _forget_after_fork() -> None:  # a forked child must not remove its parent's partials
    _live.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def live_partials() -> list[Path]:
    """The partials this process has created and not yet committed or removed."""
    with _live_lock:
        return [Path(p) for p in _live]


def remove_live_partials() -> int:
    """Remove every live partial of this process (for a signal handler or ``atexit``).

    Safe to call from a signal handler in the main thread and from any thread;
    never raises.  Returns the number of partials removed.
    """
    with _live_lock:
        items = list(_live)
    removed = 0
    for item in items:
        if remove(Path(item)):
            removed += 1
        unregister(Path(item))
    return removed


def remove(partial: Path) -> bool:
    """Remove a file, link or folder tree at ``partial`` without following links; never raises."""
    try:
        st = os.lstat(partial)
    except OSError:
        return False
    try:
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(partial, ignore_errors=True)
            return not os.path.lexists(partial)
        os.unlink(partial)
        return True
    except OSError:
        return False


# --------------------------------------------------------------------------- stale partials


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a process id we could judge: leave it
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (PermissionError: it exists, another user's)
        return True
    return True


def clean_stale_partials(folder: str | os.PathLike) -> list[Path]:
    """Remove partials in ``folder`` that this host's dead processes left.

    A name is removed when it has the :func:`partial_name` form, carries this
    host's name and the id of a process that no longer runs, and belongs to
    the current user.  Partials of other hosts (shared file systems), of live
    processes (including this one) and of other users are left alone, as is
    anything else.  Never follows a link; never raises.

    Returns:
        The paths removed.
    """
    folder = Path(os.fspath(folder))
    host = _host()
    uid = os.getuid() if hasattr(os, "getuid") else None
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        m = _PARTIAL_RE.match(entry.name)
        if m is None or m.group("host") != host:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if uid is not None and st.st_uid != uid:
            continue
        if _pid_alive(int(m.group("pid"))):
            continue
        stale_one = folder / entry.name
        if remove(stale_one):
            removed.append(stale_one)
    return removed
