"""3DHISTECH MIRAX (``.mrxs``), read as OpenSlide 4.0.1 reads it (floor 3).

Source: OpenSlide 4.0.1's MIRAX reader (``openslide-vendor-mirax.c``) and its format notes, in
wsitool's words.  A slide is ``<name>.mrxs`` (a small JPEG, or empty: nothing in it is read)
and a folder ``<name>/`` beside it with ``Slidedat.ini`` (:mod:`.slidedat`), the index file it
names (:mod:`.index`) and the data files; the camera images of each zoom level are placed at
their stitched positions (:mod:`.layout`) and read as a mosaic level (:mod:`wsitool.mosaic`).

The opener recognises the slide by its name (``.mrxs``, as OpenSlide: its contents say
nothing) when its first bytes are no other format's (:func:`claims`), and opens the files
beside it through the slide's place, locally or under the same URL base.  A missing folder
file is one :class:`~wsitool.errors.CorruptFileError` (a missing ``Slidedat.ini``: not a
slide, :class:`~wsitool.errors.UnsupportedFormatError`); a camera image past the end of a
truncated data file fails the reads that need it
(:class:`~wsitool.errors.TruncatedDataError`, or background with ``on_error="fill"``).

Properties: every ``Slidedat.ini`` key as ``mirax.<group>.<key>``; ``openslide.mpp-x|y`` (level
0's ``MICROMETER_PER_PIXEL_X|Y``), ``openslide.objective-power`` (``OBJECTIVE_MAGNIFICATION``,
an integer, a trailing ``x`` dropped), ``openslide.background-color`` (level 0's
``IMAGE_FILL_COLOR_BGR``), ``openslide.bounds-*`` (the placed images of level 0) and
``openslide.quickhash-1`` (SHA-256 of Slidedat.ini and then of the lowest level's images in
index order; computed when first asked).  Associated images: ``macro``, ``label`` and
``thumbnail`` from the ``Scan data layer`` records (JPEG).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping
from typing import Any

from ...errors import CorruptFileError, UnsupportedFormatError
from ...model import Pyramid
from ...storage import ByteSource
from ..contract import Place
from . import slidedat
from .build import build_pyramid, read_all

__all__ = ["NAME", "READS_URLS", "OPTIONS", "EXTENSION", "sniff", "claims", "open_pyramid", "open_placed"]

NAME = "MIRAX"
READS_URLS = True
OPTIONS: frozenset[str] = frozenset()
EXTENSION = ".mrxs"


def sniff(head: bytes) -> bool:
    """False: a ``.mrxs`` file's bytes identify nothing (the opener asks :func:`claims`)."""
    return False


def claims(name: str) -> bool:
    """Whether a file named ``name`` (its last path component) is a MIRAX slide's: it ends with
    ``.mrxs`` (case as OpenSlide: exact)."""
    return name.endswith(EXTENSION) and len(name) > len(EXTENSION)


def open_pyramid(source: ByteSource) -> Pyramid:
    """Refused: a MIRAX slide needs the files beside it (the opener calls :func:`open_placed`).

    Raises:
        UnsupportedFormatError: always.
    """
    raise UnsupportedFormatError("a MIRAX slide opens from its .mrxs file and the folder beside it")


def _stem(place: Place) -> str:
    name = re.split(r"[/\\]", place.shown.split("?", 1)[0].split("#", 1)[0])[-1]
    if not claims(name):
        raise UnsupportedFormatError(f"not a MIRAX file name: {name!r} (expected <name>{EXTENSION})")
    return name[:-len(EXTENSION)]


def open_placed(place: Place, source: ByteSource, options: Mapping[str, Any], /) -> Pyramid:
    """The pyramid of the MIRAX slide whose ``.mrxs`` is at ``place`` (module docstring).

    Raises:
        UnsupportedFormatError: no ``<name>/Slidedat.ini`` beside the file.
        CorruptFileError: a broken Slidedat.ini or index, a missing index or data file.
        ResourceLimitError: a level beyond what wsitool reads (more than 2**40 pixels).
    """
    stem = _stem(place)
    opened: list[ByteSource] = []

    def sibling(name: str, what: str) -> ByteSource:
        try:
            src = place.open_sibling(f"{stem}/{name}")
        except FileNotFoundError:
            if what == "Slidedat.ini":
                raise UnsupportedFormatError(f"no {stem}/Slidedat.ini beside it: a MIRAX slide is the "
                                             f"{EXTENSION} file and its folder") from None
            raise CorruptFileError(f"MIRAX {what} {stem}/{name} is missing") from None
        opened.append(src)
        return src

    try:
        ini_src = sibling("Slidedat.ini", "Slidedat.ini")
        if ini_src.size > slidedat.MAX_BYTES:
            raise CorruptFileError(f"Slidedat.ini: {ini_src.size} bytes, more than a key file holds")
        ini_bytes = read_all(ini_src, "Slidedat.ini")
        ini_src.close()  # (read whole: only the data files stay open)
        pyramid = build_pyramid(slidedat.parse(ini_bytes), ini_bytes, lambda n, w: sibling(_safe(n), w))
    except BaseException:
        for src in opened:
            src.close()
        raise
    pyramid.release = _closer(opened)
    return pyramid


def _safe(name: str) -> str:
    """A data or index file name of Slidedat.ini as a sibling path (``\\`` as ``/``)."""
    return posixpath.normpath(name.replace("\\", "/"))


def _closer(sources: list[ByteSource]) -> Callable[[], None]:
    def release() -> None:
        for src in sources:
            src.close()
    return release

