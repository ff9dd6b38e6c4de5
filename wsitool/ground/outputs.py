"""Atomic outputs: the one place in wsitool that creates output files and folders.

Every writer (``read-region``, ``export-pyramid``, batch region reads and
packs, the stress report and plot, the batch manifest) makes its output the
same way:

1. :func:`check_output` before any work: the output must not be one of the
   sources (same inode, also through a symbolic or hard link; a usage error,
   :class:`~wsitool.errors.OutputIsSourceError`, exit 2) and must not exist
   unless ``overwrite`` (:class:`~wsitool.errors.OutputExistsError`, exit 9).
2. The data goes to a *partial*: a new file or folder in the destination
   folder named ``.<name>.partial-<host>-<pid>-<token>`` (:func:`partial_name`:
   this host's name reduced to ``[A-Za-z0-9._-]``, the process id, 16 random
   hex digits).  A file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW``
   (:func:`create_file`), a folder with ``mkdir`` of that fresh name
   (:func:`create_dir`); both fail rather than open anything already there,
   so a symbolic link planted at a temporary name is never written through.
3. :meth:`Partial.commit` renames the partial onto the final name in one
   step; without ``overwrite`` it never replaces an existing final name (even
   one that appeared meanwhile: ``renameat2(RENAME_NOREPLACE)`` or a hard
   link where available); it never replaces a source.  :meth:`Partial.abort`
   (and leaving the ``with`` block by an exception) removes the partial.
4. Live partials are kept in a process-wide registry, so a signal handler can
   remove them (:func:`remove_live_partials`).  A name is recorded before its file
   or folder is made and forgotten only after it is renamed or removed, so a
   signal at any step between (SIGTERM right after ``open`` returned, between the
   two renames of a folder replaced with ``overwrite``) leaves nothing behind
   once the registry is cleared; partials that this host's
   earlier, dead processes left behind are removed by the next run into the
   folder (:func:`clean_stale_partials`); partials of other hosts, of other
   users and of live processes are never touched.

Errors raised here name the user's path (the final name), never the
temporary one.

The partial names and the record of live partials are :mod:`wsitool.ground.partials`'s (its
names are re-exported here).  This module imports only the standard library,
:mod:`wsitool.errors` and that module.
"""

from __future__ import annotations

import ctypes
import errno
import io
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from ..errors import OutputExistsError, OutputIsSourceError
from . import partials
from .partials import clean_stale_partials, is_partial_name, live_partials, partial_name, remove_live_partials

__all__ = [
    "Partial",
    "partial_name",
    "is_partial_name",
    "check_output",
    "create_file",
    "create_dir",
    "open_file",
    "write_bytes",
    "anonymous_file",
    "commit",
    "user_error",
    "clean_stale_partials",
    "live_partials",
    "remove_live_partials",
]

# --------------------------------------------------------------------------- names and checks


def _same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """True when ``a`` and ``b`` exist and are the same inode (links followed)."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except (OSError, ValueError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _is_source(final: Path, sources: Iterable) -> str | None:
    """The source that ``final`` is (as a link, the same inode or the same path), or None."""
    for src in sources or ():
        if src is None:
            continue
        src = os.fspath(src)
        if _same_file(final, src):
            return src
        if os.path.abspath(final) == os.path.abspath(src):
            return src
    return None


def check_output(final: str | os.PathLike, sources: Iterable = (), overwrite: bool = False, *,
                 kind: str = "file") -> None:
    """Check that ``final`` may be written; call it before any work.

    Args:
        final: the output path as the user gave it.
        sources: paths the command reads (slides); ``final`` must not be one
            of them (same inode, also through a link).
        overwrite: allow replacing an existing ``final`` (never a source).
        kind: ``"file"`` or ``"dir"``: what will be written at ``final``.

    Raises:
        OutputIsSourceError: ``final`` is a source (a usage error, exit 2).
        IsADirectoryError: ``kind`` is ``"file"`` and ``final`` is an existing folder (even
            with ``overwrite``: a folder is never replaced by a file).
        OutputExistsError: ``final`` exists and ``overwrite`` is False (exit 9).
        NotADirectoryError: ``kind`` is ``"dir"`` and ``final`` is an existing file.
        FileNotFoundError: the destination folder does not exist.
        PermissionError: the destination folder is not writable (``os.access``: as this
            process's user; root may write anywhere).
    """
    final = Path(os.fspath(final))
    src = _is_source(final, sources)
    if src is not None:
        raise OutputIsSourceError(final, src)
    if kind == "file" and final.is_dir() and not final.is_symlink():
        raise IsADirectoryError(errno.EISDIR, "output is an existing folder", str(final))
    if os.path.lexists(final):
        if not overwrite:
            raise OutputExistsError(final)
        if kind == "dir" and not final.is_dir() and not final.is_symlink():
            raise NotADirectoryError(errno.ENOTDIR, "output exists and is not a folder", str(final))
    parent = final.parent
    if not parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, "output folder does not exist", str(final))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "output folder is not writable", str(final))


def user_error(exc: OSError, final: str | os.PathLike) -> OSError:
    """``exc`` re-made to name ``final`` (the user's path) instead of a temporary name.

    Returns a new exception of the same class (``errno``, ``strerror``,
    ``filename=final``) for the caller to raise; wsitool's own output errors
    are returned unchanged.
    """
    final = os.fspath(final)
    if isinstance(exc, (OutputExistsError, OutputIsSourceError)):
        return exc
    code = exc.errno
    reason = exc.strerror or (os.strerror(code) if code else str(exc))
    try:
        new = type(exc)(code, reason, str(final)) if code else OSError(reason)
    except Exception:  # an OSError subclass with another constructor
        new = OSError(code, reason, str(final))
    if new.filename is None:  # no errno (numpy's "N requested and M written" on a full disk): still name it
        new.filename = str(final)
        new.strerror = reason
    return new


def _names_another(exc: OSError, path: Path) -> bool:
    """Whether ``exc`` names a file outside ``path`` (a source's read failing as the output is written),
    which then keeps its own name rather than the output's."""
    name = exc.filename
    if not isinstance(name, (str, os.PathLike)) or not os.fspath(name):
        return False
    name, inside = os.path.abspath(name), os.path.abspath(path)
    return name != inside and not name.startswith(inside + os.sep)


# --------------------------------------------------------------------------- partials


class Partial:
    """A temporary output (file or folder) on its way to ``final``.

    Made by :func:`create_file` or :func:`create_dir`; use it as a context
    manager (an exception leaving the block removes it, and an ``OSError`` is
    re-raised naming ``final``) and call :meth:`commit` when the data is
    complete.

    Attributes:
        final: the output path the user asked for.
        path: the temporary path (never shown to the user).
        is_dir: True for a folder.
        sources: paths that must never be replaced (see :func:`check_output`).
    """

    def __init__(self, final: Path, path: Path, is_dir: bool, sources: Iterable = ()):
        self.final = final
        self.path = path
        self.is_dir = is_dir
        self.sources = tuple(os.fspath(s) for s in (sources or ()) if s is not None)
        self.done = False

    def commit(self, overwrite: bool = False) -> None:
        """Rename the partial onto :attr:`final` (see :func:`commit`); it is no longer live.

        Raises:
            OutputIsSourceError, OutputExistsError, IsADirectoryError: as :func:`commit`;
                the partial is removed then.
        """
        try:
            commit(self.path, self.final, overwrite=overwrite, sources=self.sources)
        except BaseException:
            self.abort()
            raise
        self.done = True
        partials.unregister(self.path)

    def abort(self) -> None:
        """Remove the partial (file or folder tree); never raises."""
        if not self.done:
            partials.remove(self.path)
            self.done = True
        partials.unregister(self.path)

    def __enter__(self) -> Partial:
        return self

    def __exit__(self, etype, exc, tb) -> None:
        if etype is not None:
            self.abort()
            if isinstance(exc, OSError) and not _names_another(exc, self.path):
                new = user_error(exc, self.final)
                if new is not exc:
                    raise new from None
        elif not self.done:
            self.abort()

    def __repr__(self) -> str:
        return f"Partial({str(self.final)!r}, dir={self.is_dir})"


_OPEN_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))


def create_file(final: str | os.PathLike, sources: Iterable = (), *, read: bool = False) -> tuple[Partial, int]:
    """Create a new partial file for ``final``, exclusively.

    The file is a fresh :func:`partial_name` in ``final``'s folder, opened with
    ``O_CREAT | O_EXCL | O_NOFOLLOW`` (mode ``0o666`` less the umask), and
    registered as live.

    Args:
        final: the output path.
        sources: paths :meth:`Partial.commit` must never replace.
        read: open it read-write (``O_RDWR``) instead of write-only.

    Returns:
        ``(partial, fd)``: the :class:`Partial` and an open descriptor the
        caller owns (close it before committing).

    Raises:
        OSError: the folder is missing or not writable, ... -- naming ``final``.
    """
    final = Path(os.fspath(final))
    flags = _OPEN_FLAGS
    if read:
        flags = (flags & ~os.O_WRONLY) | os.O_RDWR
    for _ in range(8):
        tmp = partial_name(final)
        partials.register(tmp)  # before the file exists: a signal at any step after it finds the name
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileExistsError:  # a name taken (planted or a random clash): draw another
            partials.unregister(tmp)
            continue
        except OSError as exc:
            partials.unregister(tmp)
            raise user_error(exc, final) from None
        except BaseException:  # a signal as the file was made (it may exist): gone with it
            partials.forget(tmp)
            raise
        return Partial(final, tmp, False, sources), fd
    raise user_error(FileExistsError(errno.EEXIST, "could not create a temporary file"), final)


def create_dir(final: str | os.PathLike, sources: Iterable = ()) -> Partial:
    """Create a new partial folder for ``final`` (``mkdir`` of a fresh :func:`partial_name`).

    ``mkdir`` fails on any existing name (a planted link included), so the
    folder is new and its contents are the caller's.  Registered as live.

    Raises:
        OSError: the folder cannot be made -- naming ``final``.
    """
    final = Path(os.fspath(final))
    for _ in range(8):
        tmp = partial_name(final)
        partials.register(tmp)  # before the folder exists (see create_file)
        try:
            os.mkdir(tmp, 0o777)
        except FileExistsError:
            partials.unregister(tmp)
            continue
        except OSError as exc:
            partials.unregister(tmp)
            raise user_error(exc, final) from None
        except BaseException:  # a signal as the folder was made
            partials.forget(tmp)
            raise
        return Partial(final, tmp, True, sources)
    raise user_error(FileExistsError(errno.EEXIST, "could not create a temporary folder"), final)


def open_file(final: str | os.PathLike, sources: Iterable = (), *, read: bool = False) -> tuple[Partial, IO[bytes]]:
    """:func:`create_file` with a binary file object (seekable) instead of a descriptor.

    Returns:
        ``(partial, fh)``; close ``fh`` (``with fh:``) before :meth:`Partial.commit`.
    """
    partial, fd = create_file(final, sources, read=read)
    try:
        raw = io.FileIO(fd, "r+" if read else "w", closefd=True)
    except BaseException:
        os.close(fd)
        partial.abort()
        raise
    raw.name = os.fspath(final)  # what libraries that print or split fh.name see: the user's path
    return partial, io.BufferedRandom(raw) if read else io.BufferedWriter(raw)


def write_bytes(final: str | os.PathLike, data: bytes, *, overwrite: bool = False,
                sources: Iterable = ()) -> None:
    """Write ``data`` to ``final`` atomically (a partial file, then :func:`commit`).

    Raises:
        OutputIsSourceError, OutputExistsError: see :func:`check_output`.
        OSError: naming ``final`` (disk full, permissions, ...).
    """
    final = Path(os.fspath(final))
    check_output(final, sources, overwrite)
    partial, fh = open_file(final, sources)
    with partial:
        with fh:
            fh.write(data)
        partial.commit(overwrite)


def anonymous_file(folder: str | os.PathLike, final: str | os.PathLike | None = None) -> IO[bytes]:
    """A read-write scratch file in ``folder`` with no name (gone when closed, even on a crash).

    Uses ``O_TMPFILE`` where the OS and file system support it; otherwise a
    :func:`create_file` partial that is unlinked at once.  ``final`` (the
    output the scratch is for) is the path errors name.

    Raises:
        OSError: naming ``final`` (or ``folder``).
    """
    folder = Path(os.fspath(folder))
    name = Path(os.fspath(final)) if final is not None else folder
    tmpfile = getattr(os, "O_TMPFILE", 0)
    if tmpfile:
        try:
            fd = os.open(folder, os.O_RDWR | tmpfile | getattr(os, "O_CLOEXEC", 0), 0o600)
            return os.fdopen(fd, "w+b")
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
                raise user_error(exc, name) from None
    target = name if final is not None else folder / "scratch"
    partial, fd = create_file(target, read=True)
    try:
        os.unlink(partial.path)
    finally:
        partial.done = True
        partials.unregister(partial.path)
    return os.fdopen(fd, "w+b")


# --------------------------------------------------------------------------- commit

_RENAME_NOREPLACE = 1
_renameat2: Any = None  # libc's renameat2 (a ctypes function), False where there is none, None: not looked up
_AT_FDCWD = -100


def _load_renameat2() -> Any:
    global _renameat2
    if _renameat2 is None:
        fn: Any = False
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
        except (OSError, AttributeError, TypeError):
            fn = False
        _renameat2 = fn
    return _renameat2


def _rename_noreplace(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final`` unless ``final`` exists (FileExistsError), atomically where possible."""
    fn = _load_renameat2()
    if fn:
        rc = fn(_AT_FDCWD, os.fsencode(tmp), _AT_FDCWD, os.fsencode(final), _RENAME_NOREPLACE)
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(err, os.strerror(err), str(final))
        if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), str(final))
    if not os.path.isdir(tmp) or os.path.islink(tmp):
        try:
            os.link(tmp, final, follow_symlinks=False)  # fails if ``final`` exists
        except FileExistsError:
            raise
        except OSError:
            pass  # no hard links here: fall through to a checked rename
        else:
            os.unlink(tmp)
            return
    if os.path.lexists(final):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(final))
    os.rename(tmp, final)


def commit(tmp: str | os.PathLike, final: str | os.PathLike, *, overwrite: bool = False,
           sources: Iterable = ()) -> None:
    """Rename the finished ``tmp`` onto ``final``.

    Without ``overwrite`` an existing ``final`` is never replaced (checked in
    the rename itself where the OS allows).  With ``overwrite`` an existing
    file is replaced in one rename; an existing folder (a Deep Zoom ``_files``
    tree, a Zarr store) is moved aside under a partial name, the new one
    renamed in, and the old one removed.  A ``final`` that is a source
    (:func:`check_output`) is never replaced.  ``tmp`` is left in place when
    this raises.

    Raises:
        OutputIsSourceError: ``final`` is one of ``sources``.
        OutputExistsError: ``final`` exists and ``overwrite`` is False.
        IsADirectoryError: a file would replace a folder.
        OSError: the rename failed -- naming ``final``.
    """
    tmp, final = Path(os.fspath(tmp)), Path(os.fspath(final))
    src = _is_source(final, sources)
    if src is not None:
        raise OutputIsSourceError(final, src)
    tmp_is_dir = tmp.is_dir() and not tmp.is_symlink()
    try:
        if not overwrite:
            try:
                _rename_noreplace(tmp, final)
            except FileExistsError:
                raise OutputExistsError(final) from None
            return
        final_is_dir = final.is_dir() and not final.is_symlink()
        if final_is_dir and not tmp_is_dir:
            raise IsADirectoryError(errno.EISDIR, "output is an existing folder", str(final))
        if not final_is_dir:
            os.replace(tmp, final)
            return
        old = partial_name(final)
        partials.register(old)  # before the old folder moves there (see create_file)
        try:
            os.rename(final, old)
            os.rename(tmp, final)
        except BaseException:  # an error or a signal, before, between or after the two renames
            if os.path.lexists(old):
                if os.path.lexists(final):
                    partials.remove(old)  # both done: the new output is in place
                else:
                    os.rename(old, final)  # the new one is not: the old output back
            partials.unregister(old)
            raise
        partials.remove(old)
        partials.unregister(old)
    except (OutputExistsError, OutputIsSourceError):
        raise
    except OSError as exc:
        raise user_error(exc, final) from None


