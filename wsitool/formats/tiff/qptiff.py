"""PerkinElmer / Akoya QPTIFF (Vectra, Polaris): one page per channel, channels named in per-page XML (floor 3).

Every page's ImageDescription is an XML document whose root is
``PerkinElmer-QPI-ImageDescription``; its ``ImageType`` says what the page is:
``FullResolution`` (a channel of the full-resolution image),
``ReducedResolution`` (a channel of a reduced level, when the file has a
pyramid), ``Thumbnail``, ``Overview`` (the slide photograph, OpenSlide's
``macro``) or ``Label``.  The pages of one resolution follow each other, one
per channel, in the same channel order at every resolution.  A channel page
names its channel (``Name``) and its display colour (``Color``, ``"r,g,b"``);
a ``Filter`` element's ``FilterID`` describes the filter set.  ``Objective``
(``"10x"``) is the objective.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from ...model import Channel, channel_color

__all__ = ["is_qptiff", "image_type", "associated_name", "page_channel", "objective_power"]

_ROOT = "PerkinElmer-QPI-ImageDescription"

#: ImageType -> associated image name (OpenSlide's names).
ASSOCIATED = {"Thumbnail": "thumbnail", "Overview": "macro", "Label": "label"}


def is_qptiff(description: str) -> bool:
    """True when a first page's ImageDescription is a PerkinElmer QPI document."""
    return _ROOT in description[:512]


def _root(description: str) -> ET.Element | None:
    """The parsed XML of a page's description, or None when it does not parse."""
    text = re.sub(r"^\s*<\?xml[^>]*\?>", "", description)  # (the declaration says utf-16; the str is decoded)
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return None
    return root if root.tag == _ROOT else None


def image_type(description: str) -> str | None:
    """The page's ``ImageType`` (``"FullResolution"``, ``"Thumbnail"``, ...), or None."""
    root = _root(description)
    value = root.findtext("ImageType") if root is not None else None
    return value.strip() if value else None


def associated_name(description: str) -> str | None:
    """``"thumbnail"``, ``"macro"`` or ``"label"`` for those pages, None for channel pages."""
    return ASSOCIATED.get(image_type(description) or "")


def _rgb(text: str | None) -> tuple[int, int, int] | None:
    if not text:
        return None
    parts = text.split(",")
    try:
        rgb = tuple(int(p) for p in parts)
    except ValueError:
        return None
    if len(rgb) != 3 or not all(0 <= v <= 255 for v in rgb):
        return None
    return rgb[0], rgb[1], rgb[2]


def page_channel(description: str, index: int, count: int) -> Channel:
    """The :class:`~wsitool.model.Channel` a channel page describes (channel ``index`` of ``count``):
    ``Name`` (else ``"C<index>"``), the filter's ``FilterID`` as description, ``Color`` (else
    :func:`~wsitool.model.channel_color`); QPTIFF gives no wavelengths as numbers."""
    root = _root(description)
    name = (root.findtext("Name") or "").strip() if root is not None else ""
    desc = (root.findtext("Responsivity/Filter/FilterID") or "").strip() if root is not None else ""
    color = _rgb(root.findtext("Color")) if root is not None else None
    source = "file"
    if color is None:
        color, source = channel_color(index, count)
    return Channel(name=name or f"C{index}", description=desc or None, color=color, color_source=source)


def objective_power(description: str) -> float | None:
    """The ``Objective`` element as a number (``"10x"`` -> 10.0), or None."""
    root = _root(description)
    text = (root.findtext("Objective") or "") if root is not None else ""
    match = re.match(r"\s*(\d+(?:\.\d+)?)\s*[xX]?\s*$", text)
    return float(match.group(1)) if match else None
