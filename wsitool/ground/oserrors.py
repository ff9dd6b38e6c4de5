"""Diagnosis of operating-system failures: out of descriptors, memory, or a failing disk (floor 0).

A native decoder or a file open that fails for want of a descriptor or memory
looks like a corrupt file from the inside; these helpers tell the two apart so
callers raise an ``OSError`` naming the machine's cause (the CLI exits 9, I/O
error) instead of blaming the slide.  Standard library only.
"""

from __future__ import annotations

import errno as _errno
import os
from types import ModuleType

_resource: ModuleType | None
try:
    import resource as _resource  # POSIX only
except ImportError:  # pragma: no cover - Windows
    _resource = None

__all__ = ["RESOURCE_ERRNOS", "DECODER_DESCRIPTOR_HEADROOM", "os_resource_error", "raise_if_os_resource",
           "descriptors_exhausted"]


#: errno values that mean the operating system ran out of something (descriptors,
#: memory) or the storage failed: I/O errors of the machine, not of the slide.
RESOURCE_ERRNOS = frozenset(e for e in (
    getattr(_errno, "EMFILE", None), getattr(_errno, "ENFILE", None), getattr(_errno, "ENOMEM", None),
    getattr(_errno, "EIO", None), getattr(_errno, "ENOBUFS", None),
) if e is not None)

_RESOURCE_HINTS = {
    getattr(_errno, "EMFILE", -1): "the process is out of file descriptors: raise ulimit -n",
    getattr(_errno, "ENFILE", -1): "the system is out of file descriptors",
    getattr(_errno, "ENOMEM", -1): "out of memory",
    getattr(_errno, "EIO", -1): "the storage reported an I/O error",
}


def os_resource_error(exc: BaseException) -> OSError | None:
    """An OSError naming the cause if ``exc`` is an operating-system resource
    failure (:data:`RESOURCE_ERRNOS`: EMFILE, ENFILE, ENOMEM, EIO, ...), else None.

    Such failures are the machine's, not the file's: callers raise the result
    instead of reporting the slide as corrupt (the CLI exits 9, I/O error).  Its
    ``filename`` is ``exc``'s (None when ``exc`` has none): the facade or the opener
    names the slide as the error leaves them (:func:`wsitool.ground.naming.attach`).
    """
    code: int
    if isinstance(exc, MemoryError):
        code = _errno.ENOMEM
    elif isinstance(exc, OSError) and exc.errno is not None and exc.errno in RESOURCE_ERRNOS:
        code = exc.errno
    else:
        return None
    hint = _RESOURCE_HINTS.get(code)
    text = os.strerror(code) + (f" ({hint})" if hint else "")
    where = getattr(exc, "filename", None)
    return OSError(code, text, where) if where is not None else OSError(code, text)


def raise_if_os_resource(exc: BaseException) -> None:
    """Raise :func:`os_resource_error` of ``exc`` when there is one (else return)."""
    err = os_resource_error(exc)
    if err is not None:
        raise err from None


#: Descriptors a native decoder may need for its own work (thread-pool pipes,
#: plugin files): with fewer free than this, a failed decode is blamed on the
#: descriptor limit, not on the tile.
DECODER_DESCRIPTOR_HEADROOM = 4


def descriptors_exhausted() -> OSError | None:
    """Probe whether this process can still open files: None if it can, else the
    OSError (EMFILE/ENFILE/ENOMEM) worded by :func:`os_resource_error`.

    A native decoder that cannot get a descriptor (or memory) for its work
    returns "no image", which looks like corrupt tile data; callers probe before
    blaming the tile.  Exhausted means: opening a file fails now, or fewer than
    :data:`DECODER_DESCRIPTOR_HEADROOM` descriptors are free under the soft
    ``RLIMIT_NOFILE`` (the decoder may have failed a moment ago and released
    what it had).
    """
    try:
        fd = os.open(os.devnull, os.O_RDONLY)
    except OSError as exc:
        return os_resource_error(exc)
    os.close(fd)
    try:
        soft = _resource.getrlimit(_resource.RLIMIT_NOFILE)[0] if _resource else None
        # (listing /proc/self/fd takes one descriptor itself, which it lists)
        in_use = len(os.listdir("/proc/self/fd")) - 1
    except (OSError, ValueError):
        soft = in_use = None
    if in_use is not None and soft not in (None, -1) and soft - in_use < DECODER_DESCRIPTOR_HEADROOM:
        return os_resource_error(OSError(_errno.EMFILE, os.strerror(_errno.EMFILE)))
    return None
