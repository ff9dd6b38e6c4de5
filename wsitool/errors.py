"""Exception hierarchy of wsitool.

Every error that wsitool raises on purpose derives from :class:`WsiError`, so
callers can catch one class.  The subclasses separate the causes a caller may
want to handle differently:

* :class:`UnsupportedFormatError` -- the file is not a slide wsitool can read
  (not a TIFF, a DICOM file, a TIFF without any usable image).
* :class:`CorruptFileError` -- the container is broken (bad IFD chain, an image
  with zero width or height, tile offsets that point outside the file).
* :class:`InvalidOptionError` -- an option given to a function, command or
  server is out of range or contradicts another (also a :class:`ValueError`,
  so code written against the plain ``ValueError`` keeps working).
* :class:`InvalidRegionError` -- the request itself is malformed (negative or
  zero size, level out of range, wrong ``out`` buffer).  Also a
  :class:`ValueError`, as ``openslide-python`` users expect.
* :class:`ResourceLimitError` -- the request would exceed a configured pixel
  or byte limit (see :func:`wsitool.set_limits`); raised *before* any
  allocation or decode.
* :class:`TileDecodeError` -- one tile could not be decoded; carries the file,
  level, tile column and row.
* :class:`DeviceUnavailableError` -- a CUDA device was requested but none is
  usable.
* :class:`OutputIsSourceError` -- a command would write over one of its own
  sources (a usage error; also a :class:`ValueError`).
* :class:`OutputExistsError` -- an output exists and overwriting was not
  asked for (also a :class:`FileExistsError`).
* :class:`RemoteNotFoundError` -- a slide URL names no object (also a
  :class:`FileNotFoundError`, as a missing file).
* :class:`RemoteAccessError` -- the server refused access: denied, expired
  credentials or an expired presigned URL.
* :class:`RemoteUnavailableError` -- the remote source kept failing after
  its retries (timeout, 5xx, connection reset, truncated body).
* :class:`RemoteChangedError` -- the object changed on the server while the
  slide was open (another size or ETag).

Messages always name the file and, where it applies, the level and tile.
"""

from __future__ import annotations

import errno as _errno
import os

try:
    import resource as _resource  # POSIX only
except ImportError:  # pragma: no cover - Windows
    _resource = None

__all__ = [
    "WsiError",
    "UnsupportedFormatError",
    "CorruptFileError",
    "InvalidOptionError",
    "InvalidRegionError",
    "ResourceLimitError",
    "TileDecodeError",
    "DeviceUnavailableError",
    "SlideWarning",
    "TileWarning",
    "DaskUnavailableError",
    "OutputExistsError",
    "OutputIsSourceError",
    "RemoteNotFoundError",
    "RemoteAccessError",
    "RemoteUnavailableError",
    "RemoteChangedError",
    "printable",
]


class WsiError(Exception):
    """Base class of every error wsitool raises on purpose."""


class UnsupportedFormatError(WsiError):
    """The file exists but is not a slide format wsitool reads."""


class CorruptFileError(WsiError):
    """The container is structurally broken (TIFF header, IFDs, offsets)."""


class InvalidOptionError(WsiError, ValueError):
    """An option is out of range, of the wrong kind, or contradicts another one
    (an export's tile size, a server's cache budget, a Deep Zoom overlap); the
    message names the option and what it accepts."""


class InvalidRegionError(WsiError, ValueError):
    """A region request is malformed: level, size, location type or ``out`` buffer."""


class ResourceLimitError(WsiError):
    """A request would exceed a configured pixel or byte limit.

    Raised before anything is allocated or decoded; see :func:`wsitool.set_limits`.
    """


class DeviceUnavailableError(WsiError):
    """A GPU device was requested (``device="cuda"``) but none is usable."""


class TileDecodeError(WsiError):
    """One tile (or strip) of a level could not be read or decoded.

    Attributes:
        path: the slide file.
        level: pyramid level index (0 = full resolution).
        col, row: tile column and row in the level's tile grid (for stripped
            levels ``col`` is 0 and ``row`` the strip index).
        reason: short cause, e.g. ``"decoder returned no image"``.
    """

    def __init__(self, path: str | os.PathLike, level: int, col: int, row: int, reason: str):
        self.path = os.fspath(path)
        self.level = level
        self.col = col
        self.row = row
        self.reason = reason
        super().__init__(
            f"{self.path}: level {level}, tile (col {col}, row {row}): {reason}"
        )

    def __reduce__(self):  # keep picklable across processes (stress, dask)
        return (type(self), (self.path, self.level, self.col, self.row, self.reason))


class DaskUnavailableError(WsiError):
    """A package of the scale-out layer is needed but not importable: Dask
    (``dask[array]`` / ``distributed``; ``pip install "wsitool[dask]"``), or zarr for
    ``--pack`` stores in format zarr (``pip install "wsitool[zarr]"``)."""


class SlideWarning(UserWarning):
    """A problem in a slide's structure that does not stop it from being read.

    Emitted by :func:`wsitool.open_slide` for what tifffile reports while it
    parses the file (for example an IFD offset past the end of the file, which
    is what a truncated file looks like): the slide opens with the levels that
    could be read, and :attr:`wsitool.Slide.problems` lists the messages.
    """


class OutputIsSourceError(WsiError, ValueError):
    """An output path is (or links to) a source the command reads: never written.

    Attributes:
        path: the output path as given.
        source: the source it is.
    """

    def __init__(self, path: str | os.PathLike, source: str | os.PathLike):
        self.path = os.fspath(path)
        self.source = os.fspath(source)
        same = "" if os.path.abspath(self.path) == os.path.abspath(self.source) else f" ({self.source})"
        super().__init__(f"{self.path}: output is the source slide{same}; choose another output name")

    def __reduce__(self):
        return (type(self), (self.path, self.source))


class OutputExistsError(WsiError, FileExistsError):
    """An output exists and ``overwrite`` (``--overwrite``) was not given.

    An :class:`OSError` (``errno.EEXIST``) whose ``filename`` is the output path.
    Its message uses the Python API's words (``overwrite=True``); the command
    line says ``--overwrite`` instead (:data:`CLI_REASON`).
    """

    #: The default reason, and the one the command line prints in its place.
    API_REASON = "already exists (pass overwrite=True to replace it)"
    CLI_REASON = "already exists (add --overwrite to replace it)"

    def __init__(self, path: str | os.PathLike, reason: str = API_REASON):
        super().__init__(_errno.EEXIST, reason, os.fspath(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"

    def __reduce__(self):
        return (type(self), (self.filename, self.strerror))


class RemoteNotFoundError(WsiError, FileNotFoundError):
    """A slide URL names no object (HTTP 404, no such key or bucket).

    A :class:`FileNotFoundError` (the CLI exits 9, as for a missing file) whose
    message names the URL without credentials or query tokens.
    """

    def __init__(self, url: str, reason: str = "not found"):
        OSError.__init__(self, _errno.ENOENT, reason, url)

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"

    def __reduce__(self):
        return (type(self), (self.filename, self.strerror))


class RemoteAccessError(WsiError):
    """The server refused a slide URL: access denied (HTTP 401/403), expired
    credentials or an expired presigned URL, or a range it will not serve (416).
    The message names the URL without credentials or query tokens."""


class RemoteUnavailableError(WsiError):
    """A remote slide's server kept failing after the retries: timeouts, HTTP
    429/5xx, connection resets, bodies cut short.  The message names the URL
    (without tokens), the last cause and the attempts made."""


class RemoteChangedError(WsiError):
    """A remote slide changed on the server while it was open: its size or ETag
    (or Last-Modified) differs from the one taken at open.  Reads never mix two
    versions of an object; open the slide again."""


def printable(text) -> str:
    """``text`` safe to print on a terminal: non-printable characters escaped as ``repr`` does.

    Control characters (C0, C1, DEL: escape sequences, bells, newlines) and
    the Unicode characters that are not printable (bidi overrides,
    zero-width and other format characters, unassigned code points) become
    ``\\xNN``, ``\\uNNNN``, ``\\n``, ``\\r``, ``\\t``; everything else,
    a backslash and spaces included, is unchanged.
    """
    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


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


def os_resource_error(exc: BaseException, path: str | os.PathLike | None = None) -> OSError | None:
    """An OSError naming the cause if ``exc`` is an operating-system resource
    failure (:data:`RESOURCE_ERRNOS`: EMFILE, ENFILE, ENOMEM, EIO, ...), else None.

    Such failures are the machine's, not the file's: callers raise the result
    instead of reporting the slide as corrupt (the CLI exits 9, I/O error).
    """
    if isinstance(exc, MemoryError):
        code = _errno.ENOMEM
    elif isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS:
        code = exc.errno
    else:
        return None
    hint = _RESOURCE_HINTS.get(code)
    text = os.strerror(code) + (f" ({hint})" if hint else "")
    where = os.fspath(path) if path is not None else getattr(exc, "filename", None)
    return OSError(code, text, where) if where is not None else OSError(code, text)


def raise_if_os_resource(exc: BaseException, path: str | os.PathLike | None = None) -> None:
    """Raise :func:`os_resource_error` of ``exc`` when there is one (else return)."""
    err = os_resource_error(exc, path)
    if err is not None:
        raise err from None


#: Descriptors a native decoder may need for its own work (thread-pool pipes,
#: plugin files): with fewer free than this, a failed decode is blamed on the
#: descriptor limit, not on the tile.
DECODER_DESCRIPTOR_HEADROOM = 4


def descriptors_exhausted(path: str | os.PathLike | None = None) -> OSError | None:
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
        return os_resource_error(exc, path)
    os.close(fd)
    try:
        soft = _resource.getrlimit(_resource.RLIMIT_NOFILE)[0] if _resource else None
        # (listing /proc/self/fd takes one descriptor itself, which it lists)
        in_use = len(os.listdir("/proc/self/fd")) - 1
    except (OSError, ValueError):
        soft = in_use = None
    if in_use is not None and soft not in (None, -1) and soft - in_use < DECODER_DESCRIPTOR_HEADROOM:
        return os_resource_error(OSError(_errno.EMFILE, os.strerror(_errno.EMFILE)), path)
    return None


class TileWarning(UserWarning):
    """Emitted when ``on_error="fill"`` replaced a corrupt tile by background."""
