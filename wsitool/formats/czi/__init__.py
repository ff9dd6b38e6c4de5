"""Zeiss CZI (ZISRAW): the Axioscan's format, brightfield and fluorescence (floor 3).

A :class:`~wsitool.formats.contract.PlacedFormat` (it takes the ``scene`` option):

* :mod:`.segments`: the ZISRAW segments (through czifile, after bounds checks of its own);
* :mod:`.metadata`: the XML's ``zeiss.*`` properties, MPP, objective, barcode, channels;
* :mod:`.layout`: subblocks to mosaic levels (:mod:`wsitool.mosaic`), by scene and channel,
  in OpenSlide 4.0.1's placement and paint order;
* :mod:`.attachments`: the label, macro (``SlidePreview``) and thumbnail.

``openslide.quickhash-1`` is OpenSlide's: the SHA-256 of the primary file GUID, the file
GUID (16 bytes each) and the metadata XML (up to its first NUL, then a NUL).  The vendor is
``zeiss``.  Without the ``scene`` option a slide reads as OpenSlide shows it: every scene on
one canvas (``openslide.region[N].*`` say where); ``scene=N`` reads scene ``N`` alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from ...errors import InvalidOptionError
from ...model import Pyramid, level_properties
from ...storage import ByteSource
from ..contract import Place
from ..quickhash import KEY as QUICKHASH
from ..quickhash import feed_string
from . import layout, metadata, segments
from .attachments import associated

__all__ = ["NAME", "READS_URLS", "OPTIONS", "sniff", "open_pyramid", "open_placed", "scene_option"]

NAME = "CZI"
READS_URLS = True
OPTIONS = frozenset({"scene"})
VENDOR = "zeiss"


def sniff(head: bytes) -> bool:
    """True when ``head`` starts with the CZI magic ``ZISRAWFILE``."""
    return head.startswith(segments.MAGIC)


def scene_option(value: Any) -> int | None:
    """The ``scene`` option's value checked: None, or a scene number (an int from 0).

    Raises:
        InvalidOptionError: anything else.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidOptionError(f"scene must be a scene number (0, 1, ...), not {value!r}")
    return value


def open_pyramid(source: ByteSource) -> Pyramid:
    """The whole slide (every scene) of the CZI ``source`` reads (:func:`open_placed` without options)."""
    return _open(source, None)


def open_placed(place: Place, source: ByteSource, options: Mapping[str, Any], /) -> Pyramid:
    """The CZI ``source`` reads, with the ``scene`` option (None: every scene, as OpenSlide).

    Raises:
        InvalidOptionError: a scene the file does not have, or not a scene number.
        UnsupportedFormatError: a compression or pixel type wsitool does not read.
        CorruptFileError: the file is broken.
    """
    return _open(source, scene_option(options.get("scene")))


def _open(source: ByteSource, scene: int | None) -> Pyramid:
    fh = source.open_file()
    try:
        czi = segments.read_file(source, fh)
    finally:
        fh.close()
    meta = metadata.parse(czi.xml)
    problems: list[str] = []
    cv = layout.canvas(czi.subblocks, (meta.width, meta.height), meta.scenes, scene, problems)
    cs = sorted({s.dim("C") for s in cv.subblocks})
    grey = any(s.pixel_type in (0, 1) for s in cv.subblocks)
    chans = metadata.channels(meta.root, cs, layout.colour_channels(cv.subblocks)) if len(cs) > 1 or grey else ()
    # every segment the file lists bounds the bytes of the subblock before it
    starts = [*czi.positions, *(a.position for a in czi.attachments), *(s.position for s in czi.subblocks)]
    levels = layout.levels(source, cv, starts, chans)
    images = associated(source, czi.attachments)
    props: dict[str, str] = dict(meta.properties)
    props["openslide.vendor"] = VENDOR
    props.update(level_properties(levels))
    for k, (x, y, w, h) in sorted(cv.regions.items()):
        for key, value in (("x", x), ("y", y), ("width", w), ("height", h)):
            props[f"openslide.region[{k}].{key}"] = str(value)
    for name, image in images.items():
        props[f"openslide.associated.{name}.width"] = str(image.width)
        props[f"openslide.associated.{name}.height"] = str(image.height)
    props["wsitool.czi.scenes"] = ",".join(str(k) for k in sorted(layout.scenes(czi.subblocks)))
    if scene is not None:
        props["wsitool.czi.scene"] = str(scene)
    digest = hashlib.sha256(czi.primary_guid + czi.file_guid)
    feed_string(digest, czi.xml)
    props[QUICKHASH] = digest.hexdigest()
    return Pyramid(vendor=VENDOR, levels=levels, associated=images, properties=props, problems=problems)
