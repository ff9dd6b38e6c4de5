"""The OME-XML of an OME-TIFF export, built from a model of its images (floor 6).

One writer for every OME-TIFF wsitool writes: :func:`ome_xml` turns a list
of :class:`OmeImage` (the pyramid, then the label and macro), an optional
:class:`Instrument` and an optional map annotation into the document
written in the first IFD's ImageDescription.  Each image lists its channels
(:class:`OmeChannel`), so a multi-channel export adds channels, not a
second writer.

Facts used (the OME Data Model and its XML schema, 2016-06,
openmicroscopy.org/Schemas/OME/2016-06/ome.xsd, and the OME-TIFF
specification):

* ``OME`` holds ``Instrument`` elements, then ``Image`` elements, then
  ``StructuredAnnotations`` (that order is the schema's sequence).
* ``Instrument`` holds an optional ``Microscope`` (``Manufacturer``,
  ``Model``, ``SerialNumber``) then its ``Objective`` s, each with an ``ID``
  (``Objective:I:O``) and ``NominalMagnification`` (the objective power
  OpenSlide calls ``openslide.objective-power``; QuPath reads it).
* ``Image`` holds, in order, ``AcquisitionDate`` (xsd:dateTime),
  ``InstrumentRef``, ``ObjectiveSettings`` (``ID`` of the objective), then
  ``Pixels``, then ``AnnotationRef`` s.
* ``Pixels`` of an interleaved RGB image: ``SizeC`` 3 and one ``Channel``
  with ``SamplesPerPixel`` 3 (as Bio-Formats writes it); ``PhysicalSizeX/Y``
  in ``µm``; one ``TiffData`` naming the IFD (top-level IFDs only: the
  reduced resolutions are SubIFDs of it and are not counted).
"""

from __future__ import annotations

import dataclasses
import re
import xml.sax.saxutils as sax
from collections.abc import Mapping, Sequence
from datetime import datetime

from ..errors import InvalidOptionError

__all__ = ["OmeChannel", "OmeImage", "Instrument", "ome_xml", "as_description", "acquisition_date",
           "instrument_from"]

NAMESPACE = "http://www.openmicroscopy.org/Schemas/OME/2016-06"
SCHEMA_LOCATION = f"{NAMESPACE} {NAMESPACE}/ome.xsd"


@dataclasses.dataclass
class OmeChannel:
    """One OME ``Channel``: ``samples`` samples per pixel (3 for interleaved RGB),
    an optional name, display colour ``(r, g, b)`` 0..255 and emission /
    excitation wavelengths in nm."""

    samples: int = 3
    name: str | None = None
    color: tuple[int, int, int] | None = None
    emission_nm: float | None = None
    excitation_nm: float | None = None


@dataclasses.dataclass
class OmeImage:
    """One OME ``Image``: ``width`` x ``height`` pixels of ``dtype`` (OME ``Type``:
    ``uint8``, ``uint16``, ...), its channels, the top-level TIFF IFD holding its
    first plane, the pixel size in µm ``(x, y)`` or None, and its acquisition date
    (a :class:`datetime`, or None)."""

    name: str
    width: int
    height: int
    ifd: int
    channels: Sequence[OmeChannel] = (OmeChannel(),)
    dtype: str = "uint8"
    physical_size_um: tuple[float, float] | None = None
    acquired: datetime | None = None
    objective: bool = False  # an ObjectiveSettings reference to the instrument's objective


@dataclasses.dataclass
class Instrument:
    """The microscope (scanner) and its objective's nominal magnification; any may be None."""

    magnification: float | None = None
    manufacturer: str | None = None
    model: str | None = None
    serial: str | None = None

    def empty(self) -> bool:
        return all(v is None for v in dataclasses.astuple(self))


def _attrs(**kw) -> str:
    """`` key="value"`` pairs of the items that are not None, XML-escaped."""
    return "".join(f" {k}={sax.quoteattr(_text(v))}" for k, v in kw.items() if v is not None)


def _text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v) if v != int(v) else f"{v:.1f}"
    return str(v)


def _color(rgb: tuple[int, int, int]) -> int:
    """OME ``Color``: RGBA packed in a signed 32-bit integer, alpha 255."""
    v = (int(rgb[0]) << 24) | (int(rgb[1]) << 16) | (int(rgb[2]) << 8) | 0xFF
    return v - (1 << 32) if v >= 1 << 31 else v


def ome_xml(images: Sequence[OmeImage], *, instrument: Instrument | None = None,
            annotation: tuple[str, Mapping[str, str]] | None = None, creator: str = "wsitool") -> str:
    """The OME-XML document of ``images`` (at least one), as a 7-bit ASCII str.

    Args:
        images: the OME Images, in IFD order.
        instrument: the scanner and objective; written when it holds anything,
            and referenced (``InstrumentRef``, and ``ObjectiveSettings`` where
            ``OmeImage.objective`` and a magnification is known) by every image.
        annotation: ``(namespace, {key: value})``: one ``MapAnnotation`` that
            the first image references.
        creator: the ``OME@Creator`` attribute.

    Raises:
        InvalidOptionError: (a ``ValueError``) no image, or an image without channels
            or with a size < 1.
    """
    if not images:
        raise InvalidOptionError("an OME-XML document needs at least one image")
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f"<OME{_attrs(xmlns=NAMESPACE)} xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\""
           f"{_attrs(Creator=creator)} xsi:schemaLocation=\"{SCHEMA_LOCATION}\">"]
    used = instrument if instrument is not None and not instrument.empty() else None
    if used is not None:
        out.extend(_instrument_xml(used))
    for i, im in enumerate(images):
        out.extend(_image_xml(i, im, used, annotation is not None and i == 0))
    if annotation is not None:
        namespace, values = annotation
        items = "".join(f"<M{_attrs(K=k)}>{sax.escape(_text(v))}</M>" for k, v in values.items())
        out.append(f'<StructuredAnnotations><MapAnnotation ID="Annotation:0"{_attrs(Namespace=namespace)}>'
                   f"<Value>{items}</Value></MapAnnotation></StructuredAnnotations>")
    out.append("</OME>")
    # 7-bit ASCII, as TIFF strings are (TIFF 6.0 section 2): "µm" and any other
    # character outside ASCII become XML character references (&#181;)
    return "".join(out).encode("ascii", "xmlcharrefreplace").decode("ascii")


def _instrument_xml(instrument: Instrument) -> list[str]:
    """The ``Instrument`` element: its ``Microscope`` and ``Objective`` where known."""
    out = ['<Instrument ID="Instrument:0">']
    if any(v is not None for v in (instrument.manufacturer, instrument.model, instrument.serial)):
        scope = _attrs(Manufacturer=instrument.manufacturer, Model=instrument.model, SerialNumber=instrument.serial)
        out.append(f"<Microscope{scope}/>")
    if instrument.magnification is not None:
        out.append(f'<Objective ID="Objective:0:0"{_attrs(NominalMagnification=float(instrument.magnification))}/>')
    out.append("</Instrument>")
    return out


def _image_xml(i: int, im: OmeImage, instrument: Instrument | None, annotated: bool) -> list[str]:
    """The ``Image`` element of image ``i``: date, instrument references, ``Pixels`` with its
    channels and ``TiffData``, and the annotation reference where ``annotated``.

    Raises:
        InvalidOptionError: the image has no channel or a size < 1.
    """
    if im.width < 1 or im.height < 1 or not im.channels:
        raise InvalidOptionError(f"image {i} ({im.name!r}): {im.width}x{im.height}, "
                                 f"{len(im.channels)} channel(s)")
    out = [f'<Image ID="Image:{i}"{_attrs(Name=im.name)}>']
    if im.acquired is not None:
        out.append(f"<AcquisitionDate>{im.acquired.replace(microsecond=0).isoformat()}</AcquisitionDate>")
    if instrument is not None:
        out.append('<InstrumentRef ID="Instrument:0"/>')
        if instrument.magnification is not None and im.objective:
            out.append('<ObjectiveSettings ID="Objective:0:0"/>')
    size_c = sum(c.samples for c in im.channels)
    phys = {}
    if im.physical_size_um is not None:
        phys = dict(PhysicalSizeX=float(im.physical_size_um[0]), PhysicalSizeXUnit="µm",
                    PhysicalSizeY=float(im.physical_size_um[1]), PhysicalSizeYUnit="µm")
    interleaved = any(c.samples > 1 for c in im.channels)
    out.append(f'<Pixels ID="Pixels:{i}" DimensionOrder="XYCZT"'
               f"{_attrs(Type=im.dtype, Interleaved=interleaved if interleaved else None)}"
               f"{_attrs(SizeX=im.width, SizeY=im.height, SizeZ=1, SizeC=size_c, SizeT=1, **phys)}>")
    out.extend(_channel_xml(i, c, ch) for c, ch in enumerate(im.channels))
    planes = len(im.channels) if not interleaved else 1
    out.append(f'<TiffData IFD="{im.ifd}" PlaneCount="{planes}"/>')
    out.append("</Pixels>")
    if annotated:
        out.append('<AnnotationRef ID="Annotation:0"/>')
    out.append("</Image>")
    return out


def _channel_xml(i: int, c: int, ch: OmeChannel) -> str:
    """The ``Channel`` element ``c`` of image ``i``: samples, name, colour, wavelengths."""
    color = _color(ch.color) if ch.color else None
    emission_unit = "nm" if ch.emission_nm else None
    excitation_unit = "nm" if ch.excitation_nm else None
    return (f'<Channel ID="Channel:{i}:{c}"'
            f"{_attrs(SamplesPerPixel=ch.samples, Name=ch.name, Color=color)}"
            f"{_attrs(EmissionWavelength=ch.emission_nm, EmissionWavelengthUnit=emission_unit)}"
            f"{_attrs(ExcitationWavelength=ch.excitation_nm, ExcitationWavelengthUnit=excitation_unit)}>"
            "<LightPath/></Channel>")


def as_description(xml: str) -> bytes:
    """The ImageDescription bytes of an :func:`ome_xml` document: UTF-8, with the character
    references it uses for non-ASCII text turned back into characters.  Bio-Formats (8.x)
    does not resolve character references in OME-XML attribute values: ``&#181;m`` reads
    as ``" #181;m"``, an unknown unit, and the whole OME-XML is then ignored (the file is
    read as a plain TIFF, one series per IFD, without channel names); the OME-TIFF
    specification has the ImageDescription in UTF-8."""
    return re.sub(r"&#(\d+);", lambda m: chr(int(m.group(1))), xml).encode("utf-8")


_DATE_FORMATS = (
    ("aperio.Date", "aperio.Time", "%m/%d/%y %H:%M:%S"),  # Aperio: Date = 12/29/09|Time = 09:59:15
    ("dicom.AcquisitionDateTime", None, "%Y%m%d%H%M%S"),  # DICOM DT: fraction and offset dropped
    ("dicom.ContentDate", "dicom.ContentTime", "%Y%m%d %H%M%S"),  # DICOM DA and TM
    ("tiff.DateTime", None, "%Y:%m:%d %H:%M:%S"),  # TIFF 6.0 section 8
)


def acquisition_date(props: Mapping[str, str]) -> datetime | None:
    """When the slide was scanned, from its properties (Aperio ``Date``/``Time``,
    DICOM ``AcquisitionDateTime`` or ``ContentDate``/``ContentTime``, TIFF
    ``DateTime``, the first that parses; seconds precision), or None."""
    for dkey, tkey, fmt in _DATE_FORMATS:
        d = (props.get(dkey) or "").strip()
        t = (props.get(tkey) or "").strip() if tkey else ""
        if not d or (tkey and not t):
            continue
        if dkey.startswith("dicom."):
            d = (re.match(r"\d{14}", d) or re.match(r"\d{8}", d) or [""])[0]
            if dkey == "dicom.AcquisitionDateTime" and len(d) == 8:
                d += "000000"
            t = (re.match(r"\d{6}", t) or [""])[0] if tkey else ""
        text = f"{d} {t}" if tkey else d
        try:
            return datetime.strptime(text, fmt)
        except ValueError:
            continue
    return None


def instrument_from(props: Mapping[str, str], magnification: float | None) -> Instrument:
    """The scanner (DICOM ``Manufacturer`` / ``ManufacturerModelName`` /
    ``DeviceSerialNumber``, TIFF ``Make`` / ``Model``, Aperio ``ScanScope ID``
    as the serial number) and the objective power ``magnification``."""
    def first(*keys):
        for k in keys:
            v = props.get(k)
            if v and v.strip():
                return v.strip()
        return None

    return Instrument(
        magnification=magnification,
        manufacturer=first("dicom.Manufacturer", "tiff.Make"),
        model=first("dicom.ManufacturerModelName", "tiff.Model"),
        serial=first("dicom.DeviceSerialNumber", "aperio.ScanScope ID"),
    )
