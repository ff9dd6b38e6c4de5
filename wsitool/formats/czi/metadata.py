"""The metadata XML of a CZI file: ``zeiss.*`` properties, MPP, objective, channels (floor 3).

Source: OpenSlide 4.0.1's Zeiss reader (``openslide-vendor-zeiss.c``), in wsitool's words:

- **Properties.** The subtrees ``AttachmentInfos``, ``DisplaySetting``, ``Information`` and
  ``Scaling`` of ``/ImageDocument/Metadata`` become properties named ``zeiss.`` and the path
  of element names joined by dots (``zeiss.Information.Image.SizeX``), with an attribute as
  one more component (``...Channel:0.Name``).  An element whose parent is named as it plus
  ``s`` (``Channels/Channel``), or a ``Distance`` under ``Items``, is a list member: its
  component is its ``Id`` attribute, else its ``Name``, else it is left out with everything
  under it.  Siblings that would get the same component are all left out.  A text that is
  not only white space is the value, kept as written (the last one where text is split
  around child elements).
- **MPP** from ``zeiss.Scaling.Items.X.Value`` and ``...Y.Value`` (metres per pixel) times
  10⁶; **objective power** from the ``NominalMagnification`` of the objective that
  ``Information.Image.ObjectiveSettings.ObjectiveRef.Id`` names; **barcode** from the first
  ``AttachmentInfo/Label/Barcodes/Barcode/Content`` text.
- **Size.** ``zeiss.Information.Image.SizeX`` and ``SizeY`` (required: the level-0 canvas);
  ``SizeS`` the scene count (1 where absent).
"""

from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ET
from collections.abc import Collection, Sequence

from ...errors import CorruptFileError
from ...model import Channel, channel_color

__all__ = ["Metadata", "parse", "zeiss_properties", "channels"]

_SUBTREES = ("AttachmentInfos", "DisplaySetting", "Information", "Scaling")
_SPACE = " \t\n\r"
_DOUBLE = re.compile(r"[ \t\n\v\f\r]*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_INT = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+$")


@dataclasses.dataclass(frozen=True)
class Metadata:
    """What the XML says.

    Attributes:
        properties: the ``zeiss.*`` properties and the ``openslide.*`` ones they give
            (``mpp-x``, ``mpp-y``, ``objective-power``, ``barcode``).
        width, height: ``SizeX``, ``SizeY`` (level-0 pixels).
        scenes: ``SizeS`` (1 where absent).
        root: the parsed document (for the channels).
    """

    properties: dict[str, str]
    width: int
    height: int
    scenes: int
    root: ET.Element


def _component(parent: str, el: ET.Element) -> str | None:
    tag = el.tag if isinstance(el.tag, str) else ""
    if parent == tag + "s" or (parent == "Items" and tag == "Distance"):
        return el.get("Id") or el.get("Name") or None
    return tag


def _walk(el: ET.Element, path: list[str], out: dict[str, str]) -> None:
    for name, value in el.attrib.items():
        if value.strip(_SPACE):
            out[".".join([*path, name])] = value
    texts = [el.text or ""] + [c.tail or "" for c in el]
    kept = [t for t in texts if t.strip(_SPACE)]
    if kept:
        out[".".join(path)] = kept[-1]
    names = [_component(path[-1], c) for c in el]
    seen: dict[str, int] = {}
    for n in names:
        if n is not None:
            seen[n] = seen.get(n, 0) + 1
    for child, n in zip(el, names, strict=True):
        if n is None or seen[n] > 1:
            continue
        _walk(child, [*path, n], out)


def zeiss_properties(root: ET.Element) -> dict[str, str]:
    """The ``zeiss.*`` properties of the document ``root`` (module notes)."""
    out: dict[str, str] = {}
    meta = root.find("Metadata") if root.tag == "ImageDocument" else None
    if meta is None:
        return out
    for name in _SUBTREES:
        node = meta.find(name)
        if node is not None:
            _walk(node, ["zeiss", name], out)
    return out


def _double(text: str | None) -> float | None:
    """A number as OpenSlide reads one: a comma taken for the decimal point, leading white space
    skipped, nothing after it; else None."""
    canonical = (text or "").replace(",", ".")
    return float(canonical) if _DOUBLE.fullmatch(canonical) else None


def _text(value: float) -> str:
    """A number as OpenSlide 4.0.1 writes these (GLib's shortest text that reads back the same:
    ``20``, ``0.499``)."""
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def parse(xml: bytes) -> Metadata:
    """The :class:`Metadata` of the XML ``xml``.

    Raises:
        CorruptFileError: not XML, or no readable ``SizeX`` / ``SizeY`` / ``SizeS``.
    """
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise CorruptFileError(f"CZI: the metadata is no XML: {exc}") from None
    props = zeiss_properties(root)
    sizes = []
    for key in ("SizeX", "SizeY", "SizeS"):
        text = props.get(f"zeiss.Information.Image.{key}")
        if text is None and key == "SizeS":
            sizes.append(1)
            continue
        if text is None or not _INT.match(text) or not 0 < int(text) < 1 << 40:
            raise CorruptFileError(f"CZI: the metadata gives no usable image {key} ({text!r})")
        sizes.append(int(text))
    for axis in ("x", "y"):
        mpp = _double(props.get(f"zeiss.Scaling.Items.{axis.upper()}.Value"))
        if mpp is not None:
            props[f"openslide.mpp-{axis}"] = _text(mpp * 1e6)
    ref = props.get("zeiss.Information.Image.ObjectiveSettings.ObjectiveRef.Id")
    if ref is not None:
        power = _double(props.get(f"zeiss.Information.Instrument.Objectives.{ref}.NominalMagnification"))
        if power is not None:
            props["openslide.objective-power"] = _text(power)
    for info in root.iterfind("Metadata/AttachmentInfos/AttachmentInfo"):
        content = info.find("Label/Barcodes/Barcode/Content")
        if content is not None and content.text is not None:
            props["openslide.barcode"] = content.text
            break
    return Metadata(props, sizes[0], sizes[1], sizes[2], root)


def _argb(text: str | None) -> tuple[int, int, int] | None:
    """``#AARRGGBB`` or ``#RRGGBB`` to ``(r, g, b)``, else None."""
    m = re.fullmatch(r"#?(?:[0-9a-fA-F]{2})?([0-9a-fA-F]{6})", (text or "").strip())
    if m is None:
        return None
    value = int(m.group(1), 16)
    return (value >> 16) & 255, (value >> 8) & 255, value & 255


def channels(root: ET.Element, cs: Sequence[int], colour: Collection[int] = ()) -> tuple[Channel, ...]:
    """The channels of the ``C`` values ``cs`` (ascending) as the XML describes them: name from
    ``Information/Image/Dimensions/Channels/Channel`` (else ``DisplaySetting``'s, else
    ``C<k>``), wavelengths from the former, colour (``#AARRGGBB``) from the latter (else
    from the wavelength or the defaults, :func:`wsitool.model.channel_color`).  A ``C`` in
    ``colour`` (a colour channel) is three: ``<name> red``, ``green``, ``blue``, in those colours."""
    info = root.findall("Metadata/Information/Image/Dimensions/Channels/Channel")
    display = root.findall("Metadata/DisplaySetting/Channels/Channel")
    out = []
    count = len(cs)
    for k in cs:
        i = info[k] if 0 <= k < len(info) else None
        d = display[k] if 0 <= k < len(display) else None
        name = (i.get("Name") if i is not None else None) or (d.get("Name") if d is not None else None) or f"C{k}"
        ex = _double(i.findtext("ExcitationWavelength")) if i is not None else None
        em = _double(i.findtext("EmissionWavelength")) if i is not None else None
        ex = ex if ex and ex > 0 else None
        em = em if em and em > 0 else None
        if k in colour:
            out += [Channel(name=f"{name} {part}", color=rgb, color_source="default")
                    for part, rgb in (("red", (255, 0, 0)), ("green", (0, 255, 0)), ("blue", (0, 0, 255)))]
            continue
        color = _argb(d.findtext("Color")) if d is not None else None
        if color is not None:
            out.append(Channel(name=name, excitation_nm=ex, emission_nm=em, color=color, color_source="file"))
            continue
        color, source = channel_color(len(out), count, em, ex)
        out.append(Channel(name=name, excitation_nm=ex, emission_nm=em, color=color, color_source=source))
    return tuple(out)
