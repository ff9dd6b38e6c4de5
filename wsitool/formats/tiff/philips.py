"""The Philips TIFF layout (IntelliSite exports): its XML, levels, associated images (floor 3).

Source: OpenSlide 4.0.1's Philips reader (``openslide-vendor-philips-tiff.c``) and its
format notes (openslide.org/formats/philips), in wsitool's words:

- **Mark.** Software of the first IFD starts with ``Philips``; its ImageDescription is
  an XML document whose root is ``DataObject`` with ``ObjectType="DPUfsImport"``.
  That root holds ``Attribute`` elements (``Name`` = a DICOM or Philips key); the
  attribute ``PIM_DP_SCANNED_IMAGES`` holds an ``Array`` of ``DataObject`` s, each a
  scanned image whose ``PIM_DP_IMAGE_TYPE`` is ``WSI`` (exactly one), ``LABELIMAGE``
  or ``MACROIMAGE``.
- **Levels.** Every tiled top-level IFD, in file order; each after the first carries the
  reduced-resolution bit of NewSubfileType and is no larger than the one before.  The
  stored sizes are padded, so the WSI image's ``PIIM_PIXEL_DATA_REPRESENTATION_SEQUENCE``
  gives one ``DICOM_PIXEL_SPACING`` per level (``"row" "column"`` in mm): a level's
  downsample is the mean of its spacings over level 0's, rounded to an integer, and its
  size level 0's divided by that, truncated.  Tiles with TileByteCounts 0 are missing
  (transparent).
- **Associated images.** A stripped IFD whose ImageDescription starts with ``Label`` or
  ``Macro``; else the first ``LABELIMAGE`` / ``MACROIMAGE`` image's ``PIM_DP_IMAGE_DATA``,
  a base64 JPEG (one that is missing or undecodable is left out).
- **Properties.** The root's attributes flattened to ``philips.<Name>`` (text of
  attributes without child elements), those of the first WSI image too, and of each
  pixel-data representation as ``philips.PIIM_PIXEL_DATA_REPRESENTATION_SEQUENCE[i].<Name>``;
  MPP from ``philips.DICOM_PIXEL_SPACING`` (mm, so times 1000); objective power from the
  ``levels=`` item of ``DICOM_DERIVATION_DESCRIPTION`` (its first value when 1..200);
  ``openslide.barcode`` the base64-decoded ``PIM_DP_UFS_BARCODE``.  The XML itself is no
  property (no ``tiff.ImageDescription``, no ``openslide.comment``).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import math
import xml.etree.ElementTree as ET

import tifffile
from tifffile import FILETYPE

from ...errors import CorruptFileError
from ...ground.bitstream import jpeg_frame_size
from ...model import AssociatedImage, PyramidLevel, TileEncoding
from ...storage.memory import MemorySource
from .tags import description

__all__ = ["is_philips", "Layout", "parse", "associated_name", "fix_levels", "xml_associated"]

_SEQUENCE = "PIIM_PIXEL_DATA_REPRESENTATION_SEQUENCE"
_SCANNED = "PIM_DP_SCANNED_IMAGES"


def is_philips(tiff: tifffile.TiffFile) -> bool:
    """True when the first IFD claims the Philips layout: Software starts with ``Philips`` and
    the ImageDescription names ``DPUfsImport`` (checked whole by :func:`parse`)."""
    first = tiff.pages.first
    software = first.tags.valueof(305)
    return (isinstance(software, str) and software.startswith("Philips")
            and "DPUfsImport" in description(first))


def _name(node: ET.Element) -> str | None:
    return node.get("Name")


def _image_type(node: ET.Element) -> str | None:
    for attr in node.findall("Attribute"):
        if _name(attr) == "PIM_DP_IMAGE_TYPE":
            return attr.text or ""
    return None


class Layout:
    """The parsed XML of a Philips TIFF.

    Attributes:
        root: the ``DataObject`` root element.
        images: the scanned images (``DataObject`` s of ``PIM_DP_SCANNED_IMAGES``), in order.
        wsi: the one WSI image.
    """

    def __init__(self, root: ET.Element):
        self.root = root
        self.images: list[ET.Element] = []
        for attr in root.findall("Attribute"):
            if _name(attr) == _SCANNED:
                self.images.extend(attr.findall("Array/DataObject"))
        wsis = [im for im in self.images if _image_type(im) == "WSI"]
        if len(wsis) != 1:
            raise CorruptFileError(f"Philips TIFF: expected one WSI image in the XML, found {len(wsis)}")
        self.wsi = wsis[0]

    def spacings(self) -> list[str]:
        """The ``DICOM_PIXEL_SPACING`` texts of the WSI image's pixel-data representations."""
        out: list[str] = []
        for attr in self.wsi.findall("Attribute"):
            if _name(attr) != _SEQUENCE:
                continue
            for rep in attr.findall("Array/DataObject"):
                if rep.get("ObjectType") != "PixelDataRepresentation":
                    continue
                out.extend(a.text or "" for a in rep.findall("Attribute") if _name(a) == "DICOM_PIXEL_SPACING")
        return out

    def image_data(self, kind: str) -> str | None:
        """The ``PIM_DP_IMAGE_DATA`` text of the first scanned image of type ``kind``, or None."""
        for im in self.images:
            if _image_type(im) == kind:
                for attr in im.findall("Attribute"):
                    if _name(attr) == "PIM_DP_IMAGE_DATA":
                        return attr.text or ""
                return None
        return None

    def properties(self) -> dict[str, str]:
        """``philips.*`` as OpenSlide flattens the XML (module docstring)."""
        props: dict[str, str] = {}
        self._flatten(self.root.findall("Attribute"), "philips", props)
        return props

    def _flatten(self, attrs: list[ET.Element], prefix: str, props: dict[str, str]) -> None:
        for attr in attrs:
            name = _name(attr)
            if name is None:
                continue
            if name == _SCANNED:
                if self.wsi in attr.findall("Array/DataObject"):
                    self._flatten(self.wsi.findall("Attribute"), prefix, props)
            elif name == _SEQUENCE:
                for i, rep in enumerate(attr.findall("Array/DataObject")):
                    self._flatten(rep.findall("Attribute"), f"{prefix}.{name}[{i}]", props)
            elif len(attr) == 0:
                props[f"{prefix}.{name}"] = attr.text or ""


def parse(first_description: str) -> Layout:
    """The :class:`Layout` of a Philips ImageDescription.

    Raises:
        CorruptFileError: not XML, a root other than ``DataObject ObjectType="DPUfsImport"``,
            or not exactly one WSI image.
    """
    try:
        root = ET.fromstring(first_description)
    except ET.ParseError as exc:
        raise CorruptFileError(f"Philips TIFF: its XML description does not parse ({exc})") from None
    if root.tag != "DataObject" or root.get("ObjectType") != "DPUfsImport":
        raise CorruptFileError("Philips TIFF: its XML root is not a DataObject of type DPUfsImport")
    return Layout(root)


def associated_name(page: tifffile.TiffPage) -> str | None:
    """``"label"`` / ``"macro"`` for a stripped IFD whose ImageDescription starts with ``Label`` /
    ``Macro``; ``""`` for any other stripped IFD (neither level nor image); None for a tiled
    one (a level)."""
    if page.is_tiled:
        return None
    desc = description(page)
    return "label" if desc.startswith("Label") else "macro" if desc.startswith("Macro") else ""


def check_levels(pages: list[tifffile.TiffPage]) -> None:
    """Refuse tiled IFDs out of the layout's order (module docstring, Levels).

    Raises:
        CorruptFileError: a later level without the reduced-resolution bit, or larger than the one before.
    """
    for prev, page in itertools.pairwise(pages):
        if not int(page.subfiletype) & FILETYPE.REDUCEDIMAGE:
            raise CorruptFileError(f"Philips TIFF: IFD {page.index} is not reduced-resolution")
        if page.imagewidth > prev.imagewidth or page.imagelength > prev.imagelength:
            raise CorruptFileError(f"Philips TIFF: IFD {page.index} is larger than the level before")


def _spacing(text: str) -> tuple[float, float] | None:
    """``(column, row)`` spacing in mm of a ``"row" "column"`` text, or None (OpenSlide's parse)."""
    parts = text.split(" ")
    if len(parts) != 2:
        return None
    values = []
    for part in parts:
        part = part.replace('"', " ").strip().replace(",", ".")
        try:
            values.append(float(part))
        except ValueError:
            return None
        if part.lower().lstrip("+-") in ("nan", "inf", "infinity") or "_" in part:
            return None
    if not all(math.isfinite(v) for v in values):
        return None
    return values[1], values[0]


def fix_levels(levels: tuple[PyramidLevel, ...], layout: Layout) -> tuple[PyramidLevel, ...]:
    """The levels with OpenSlide's downsamples and sizes from the XML's spacings (module
    docstring); the tile grid stays the stored one.

    Raises:
        CorruptFileError: not one spacing a level, or one that does not parse or gives no downsample.
    """
    spacings = layout.spacings()
    if len(spacings) != len(levels):
        raise CorruptFileError(f"Philips TIFF: {len(spacings)} pixel spacings for {len(levels)} levels")
    parsed: list[tuple[float, float]] = []
    for i, text in enumerate(spacings):
        sp = _spacing(text)
        if sp is None:
            raise CorruptFileError(f"Philips TIFF: level {i}: pixel spacing {text!r} does not parse")
        parsed.append(sp)
    w0, h0 = parsed[0]
    base = levels[0]
    for i, level in enumerate(levels[1:], start=1):
        w, h = parsed[i]
        try:
            mean = ((w / w0) + (h / h0)) / 2
        except ZeroDivisionError:
            mean = math.nan
        if not math.isfinite(mean) or mean < 0.5:
            raise CorruptFileError(f"Philips TIFF: level {i}: pixel spacing gives no downsample")
        ds = float(math.floor(mean + 0.5))  # C round(): half away from zero (positive here)
        across, down = level.tiles_across, level.tiles_down
        level.downsample = ds
        level.width = int(base.width / ds)
        level.height = int(base.height / ds)
        level.tiles_across, level.tiles_down = across, down  # the stored grid, clipped on read
    levels[0].downsample = 1.0
    return levels


def metadata(props: dict[str, str]) -> tuple[float | None, float | None, float | None, str | None]:
    """``(mpp_x, mpp_y, objective power, barcode)`` from the ``philips.*`` properties."""
    mpp_x = mpp_y = objective = None
    spacing = props.get("philips.DICOM_PIXEL_SPACING")
    sp = _spacing(spacing) if spacing is not None else None
    if sp is not None:
        mpp_x, mpp_y = 1e3 * sp[0], 1e3 * sp[1]
    derivation = props.get("philips.DICOM_DERIVATION_DESCRIPTION")
    if derivation is not None:
        objective = _objective(derivation)
    barcode = props.get("philips.PIM_DP_UFS_BARCODE")
    text = None
    if barcode is not None:
        text = _b64(barcode).split(b"\0", 1)[0].decode("utf-8", "replace")
    return mpp_x, mpp_y, objective, text


def _objective(derivation: str) -> float | None:
    for item in derivation.split("-"):
        key, _, value = item.partition("=")
        if key == "sourceFilename":
            break
        if key == "levels" and "=" in item:
            first = value.split(",")[0]
            if first.isascii() and first.isdigit() and 0 < int(first) <= 200:
                return float(int(first))
            break
    return None


def _b64(text: str) -> bytes:
    """Base64 decoded leniently, as GLib does (characters outside the alphabet skipped)."""
    cleaned = "".join(c for c in text if c.isascii() and (c.isalnum() or c in "+/="))
    cleaned = cleaned.split("=", 1)[0]
    cleaned += "=" * (-len(cleaned) % 4)
    try:
        return base64.b64decode(cleaned)
    except (binascii.Error, ValueError):
        return b""


def xml_associated(layout: Layout, present: set[str]) -> dict[str, AssociatedImage]:
    """The label and macro carried in the XML (base64 JPEG) that no IFD gave; one missing
    or whose JPEG header does not parse is left out."""
    out: dict[str, AssociatedImage] = {}
    for name, kind in (("label", "LABELIMAGE"), ("macro", "MACROIMAGE")):
        if name in present:
            continue
        text = layout.image_data(kind)
        if text is None:
            continue
        data = _b64(text)
        size = _frame(data)
        if size is None:
            continue
        out[name] = _jpeg_image(name, data, size)
    return out


def _frame(data: bytes) -> tuple[int, int] | None:
    try:
        size = jpeg_frame_size(data)
    except Exception:
        return None
    if not size or size[0] <= 0 or size[1] <= 0:
        return None
    return int(size[0]), int(size[1])


def _jpeg_image(name: str, data: bytes, size: tuple[int, int]) -> AssociatedImage:
    w, h = size
    encoding = TileEncoding(compression="JPEG", compression_code=7, photometric="YCBCR",
                            photometric_code=6, bits=8, stream="jpeg", codec="generic",
                            imagecodec="jpeg8")
    return AssociatedImage(name=name, width=w, height=h, samples=3, itemsize=1, planar=False,
                           encoding=encoding, offsets=(1,), bytecounts=(len(data),), max_segment=(w, h),
                           # (at offset 1: a segment at offset 0 counts as missing)
                           source=MemorySource(b"\0" + data), tile_size=(w, h))
