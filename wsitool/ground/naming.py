"""The one way a slide's name joins an error raised below the facade and the opener.

Formats, codecs and the region layer work on bytes and levels: they raise without the file, folder
or URL they read.  The opener (:func:`wsitool.opening.open_location`) and the facade
(:class:`wsitool.Slide`) wrap what they call in :class:`about` (or call :func:`attach`), so every
message still starts with the slide's name, as httpx attaches the request to an error in one place.
"""

from __future__ import annotations

from typing import Literal

from ..errors import WsiError

__all__ = ["about", "attach"]


def attach(exc: BaseException, subject: str) -> None:
    """Name ``subject`` (a file, folder or URL, as shown: without credentials) in ``exc`` where
    the layer that raised it did not: a :class:`WsiError` gets its :attr:`~WsiError.subject`,
    an :class:`OSError` with an ``errno`` and no ``filename`` its ``filename``.  An error
    named already keeps its name (the innermost name is the most precise: a DICOM folder's
    instance file, a sibling of a MIRAX slide).  Anything else is left as it is."""
    if isinstance(exc, WsiError):
        if exc.subject is None and not (isinstance(exc, OSError) and exc.filename is not None):
            exc.subject = subject
    elif isinstance(exc, OSError) and exc.errno is not None and exc.filename is None:
        exc.filename = subject


class about:
    """``with about(subject): ...``: :func:`attach` ``subject`` to the error that leaves the block.

    The one place a name joins an error raised below: the opener wraps a format's open, the
    facade its reads.  A class, not a generator, so a read pays two method calls.
    """

    __slots__ = ("subject",)

    def __init__(self, subject: str) -> None:
        self.subject = subject

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> Literal[False]:
        if exc is not None:
            attach(exc, self.subject)
        return False
