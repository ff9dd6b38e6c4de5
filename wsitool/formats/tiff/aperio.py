"""The Aperio SVS layout: its ImageDescription, and which IFDs are its associated images (floor 3).

Source: OpenSlide's Aperio format notes (openslide.org/formats/aperio) and
Aperio's "Digital Slides and Third-Party Data Interchange" (MP-0008): the first
IFD's ImageDescription starts with "Aperio" and carries ``|``-separated
``key = value`` fields (``MPP``, ``AppMag``, ...); the second IFD is a stripped
thumbnail; label and macro are stripped IFDs whose ImageDescription holds the
word "label" / "macro" (GT450 scanners: NewSubfileType 1 = label, 9 = macro).
"""

from __future__ import annotations

import re

import tifffile
from tifffile import FILETYPE

from .properties import positive_float
from .tags import description

__all__ = ["is_aperio", "associated_name", "description_metadata", "description_text",
           "level_description_text", "thumbnail_description_text", "associated_description_text"]


def is_aperio(first_description: str) -> bool:
    """True when the first IFD's ImageDescription marks an Aperio slide."""
    return first_description.startswith("Aperio")


def associated_name(page: tifffile.TiffPage, top_index: int) -> str | None:
    """Name of an associated image (``"label"``, ``"macro"``, ``"thumbnail"``,
    ``"associated-N"``) for a stripped IFD of an Aperio slide, or None for a tiled
    one (a pyramid level).  ``top_index`` is the IFD's index in the main chain."""
    if page.is_tiled:
        return None
    desc = description(page).lower()
    if re.search(r"\blabel\b", desc):
        return "label"
    if re.search(r"\bmacro\b", desc):
        return "macro"
    subfile = int(page.subfiletype)
    if subfile == FILETYPE.REDUCEDIMAGE | FILETYPE.MACRO:  # NewSubfileType 9
        return "macro"
    if subfile == FILETYPE.REDUCEDIMAGE and top_index != 1:
        return "label"
    if top_index == 1:
        return "thumbnail"
    return f"associated-{top_index}"


def description_metadata(desc: str, props: dict[str, str]) -> tuple[float | None, float | None, float | None]:
    """Parse the ``key = value`` fields of an Aperio ImageDescription into
    ``props`` as ``aperio.<key>``; return ``(mpp_x, mpp_y, objective power)``
    (micrometres per pixel from ``MPP``, ``AppMag``; None where absent or invalid)."""
    for field in desc.split("|")[1:]:
        if "=" in field:
            key, _, value = field.partition("=")
            props[f"aperio.{key.strip()}"] = value.strip()
    mpp = positive_float(props.get("aperio.MPP"))
    return mpp, mpp, positive_float(props.get("aperio.AppMag"))


def description_text(width: int, height: int, tile: int, kind: str, mpp: float | None,
                     mag: float | None, software: str,
                     extra: dict[str, object] | None = None) -> str:
    """Level 0's ImageDescription in the Aperio layout: the header line (``Aperio
    Image Library <software>``, CR LF), the size line, then ``|key = value`` fields.

    Args:
        width, height: level-0 size in pixels; tile: tile size in pixels.
        kind: the compression named after the size line (e.g. ``"JPEG Q=90"``).
        mpp: micrometres per level-0 pixel or None; mag: objective power or None.
        software: the writer's name and version.
        extra: further ``key = value`` fields, appended in order.
    """
    fields = [f"Aperio Image Library {software}\r\n"
              f"{width}x{height} [0,0 {width}x{height}] ({tile}x{tile}) {kind}"]
    if mag is not None:
        fields.append(f"AppMag = {mag:g}")
    if mpp is not None:
        fields.append(f"MPP = {mpp:.6g}")
    fields.append("ScannedBy = wsitool export-pyramid")
    fields.extend(f"{key} = {value}" for key, value in (extra or {}).items())
    return "|".join(fields)


def level_description_text(base: tuple[int, int], size: tuple[int, int], tile: int, kind: str,
                           software: str) -> str:
    """A lower level's ImageDescription in the Aperio layout (``W0xH0 -> WxH (TxT) kind``);
    ``base`` and ``size`` are ``(width, height)`` of level 0 and of the level, in pixels."""
    (w0, h0), (w, h) = base, size
    return f"Aperio Image Library {software}\r\n{w0}x{h0} -> {w}x{h} ({tile}x{tile}) {kind}"


def thumbnail_description_text(base: tuple[int, int], size: tuple[int, int], software: str) -> str:
    """The stripped thumbnail's ImageDescription (``W0xH0 -> WxH - ``, as Aperio writes it);
    ``base`` and ``size`` are ``(width, height)`` of level 0 and of the thumbnail, in pixels."""
    (w0, h0), (w, h) = base, size
    return f"Aperio Image Library {software}\n{w0}x{h0} -> {w}x{h} - "


def associated_description_text(name: str, size: tuple[int, int], software: str) -> str:
    """A label's or macro's ImageDescription: its name and ``(width, height)`` on the second
    line (OpenSlide names Aperio associated images from that word)."""
    w, h = size
    return f"Aperio Image Library {software}\n{name} {w}x{h}"
