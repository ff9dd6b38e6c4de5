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
  level, tile column and row.  :class:`TruncatedDataError`, one whose data lies past the
  end of a data file of a slide of several files (MIRAX), is also a :class:`CorruptFileError`.
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

Messages always name the file and, where it applies, the level and tile.  The layers below the
facade raise without the name: they know bytes, not where they came from.  The facade
(:class:`wsitool.Slide`) and the opener attach it in one place, as an error passes out of them
(:mod:`wsitool.ground.naming`): ``str(error)`` then starts with the file, folder or URL
(:attr:`WsiError.subject`).
"""

from __future__ import annotations

import errno as _errno
import os

__all__ = [
    "WsiError",
    "UnsupportedFormatError",
    "CorruptFileError",
    "InvalidOptionError",
    "InvalidRegionError",
    "ResourceLimitError",
    "TileDecodeError",
    "TruncatedDataError",
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
    """Base class of every error wsitool raises on purpose.

    Attributes:
        subject: the file, folder or URL (without credentials) the error is about, or None
            while it has not been named.  Attached by the facade or the opener
            (:func:`wsitool.ground.naming.attach`) as the error leaves them; ``str(error)`` starts with it.
    """

    subject: str | None = None

    def __str__(self) -> str:
        text = super().__str__()
        subject = self.subject
        if subject and not text.startswith(subject):
            return f"{subject}: {text}"
        return text


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


class TruncatedDataError(TileDecodeError, CorruptFileError):
    """A tile needs data past the end of a slide file the slide consists of besides its own (a
    MIRAX data file cut short): a :class:`TileDecodeError` (``on_error="fill"`` fills the tile)
    that is also a :class:`CorruptFileError` (the CLI's exit code 4)."""


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
    line says ``--overwrite`` instead (``CLI_REASON``).
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
    (without tokens), the last cause and the attempts made.  Also raised at once,
    without retries, for a server that cannot serve the reads at all: an HTTP(S)
    server that does not support range requests (``200`` with the whole object)."""


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


class TileWarning(UserWarning):
    """Emitted when ``on_error="fill"`` replaced a corrupt tile by background."""
