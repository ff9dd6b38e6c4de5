"""The slides this package's tasks read, by location: one open slide per process and location (floor 7).

:func:`wsitool.opening.held.cached_slide` bound to :func:`wsitool.open_slide`, the opener
:meth:`wsitool.Slide.to_dask` binds too (so a worker holds one slide for both).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..opening import Location, held, parse_location
from ..slide import Slide, open_slide

__all__ = ["cached_slide"]


def cached_slide(location: str | os.PathLike[str] | Location, stamp: Sequence | None = None) -> Slide:
    """This process's shared open :class:`~wsitool.Slide` at ``location`` (a path, a URL, or a
    :class:`~wsitool.opening.Location`, which carries a URL's storage options); do not close it.

    Slides are held per process (16 local and 16 remote ones, the least recently used dropped;
    see :mod:`wsitool.opening.held`): a local one keyed by its absolute path and the file's
    ``(mtime_ns, size)``, so a rewritten file is opened afresh; a remote one by its URL and
    storage options.  ``stamp``: the :attr:`~wsitool.Slide.identity` the caller expects, or None.

    Raises:
        WsiError: ``stamp`` is given and the slide changed since it was taken.
        FileNotFoundError, UnsupportedFormatError, CorruptFileError: as :func:`wsitool.open_slide`.
    """
    slide: Slide = held.cached_slide(open_slide, parse_location(location), stamp)
    return slide
