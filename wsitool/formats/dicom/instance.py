"""One DICOM instance (one file): its header read by pydicom up to the Pixel Data element (floor 3).

pydicom parses the data set with ``stop_before_pixels`` (PS3.10 7: preamble,
"DICM", File Meta Information, then the data set); the file is left at the
Pixel Data element's tag, whose position is kept so that :mod:`.frames` finds
the frames without reading them.  Everything the pyramid needs is taken from
the header here, inside one guard, so a malformed attribute value (pydicom
converts values lazily) becomes :class:`~wsitool.errors.CorruptFileError`,
never a stray exception.  The checks raise without the file's name; :func:`read_instance`,
which opens the file, attaches it (:func:`wsitool.ground.naming.about`).

Facts used (PS3.3):

* SOP Class UID 1.2.840.10008.5.1.4.1.1.77.1.6, VL Whole Slide Microscopy Image
  Storage (PS3.4 B.5); anything else is not a slide.
* Image Type (0008,0008) value 3 is the image flavour: VOLUME, LABEL, OVERVIEW
  or THUMBNAIL (C.8.12.4.1.1); an instance without Image Type is taken as VOLUME.
* Total Pixel Matrix Columns / Rows (0048,0006 / 0048,0007) is the image size;
  Columns / Rows (0028,0011 / 0028,0010) the frame (tile) size (C.8.12.4).
* Concatenation UID (0020,9161), Concatenation Frame Offset Number (0020,9228)
  and In-concatenation Number (0020,9162) tie the parts of one image (C.7.6.16.2.2.4).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import TYPE_CHECKING, Any, BinaryIO, cast

if TYPE_CHECKING:  # pragma: no cover - pydicom is imported when a DICOM file is opened
    from pydicom.dataset import Dataset

from ...errors import CorruptFileError, UnsupportedFormatError, WsiError
from ...ground.naming import about
from ...storage import ByteSource, SourceFile
from ...storage.local import open_regular

__all__ = ["WSI_SOP_CLASS", "Instance", "read_instance", "instance_from_dataset", "is_dicom"]

#: VL Whole Slide Microscopy Image Storage (PS3.4 B.5).
WSI_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.77.1.6"

#: Bytes before and of the magic: 128-byte preamble then "DICM" (PS3.10 7.1).
MAGIC_AT = 128


def is_dicom(head: bytes) -> bool:
    """True when ``head`` (the first 132 bytes of a file) has "DICM" at byte 128 (PS3.10 7.1)."""
    return len(head) >= MAGIC_AT + 4 and head[MAGIC_AT:MAGIC_AT + 4] == b"DICM"


@dataclasses.dataclass(eq=False)
class Instance:
    """The header of one WSI instance.

    Attributes:
        path: the file.
        ds: the pydicom data set without Pixel Data (for properties and per-frame groups).
        pixel_pos: byte offset of the Pixel Data element's tag (7FE0,0010) in the file.
        file_size: size of the file in bytes.
        transfer_syntax: Transfer Syntax UID of the data set.
        implicit_vr: the data set's encoding is Implicit VR (PS3.5 section 7.1.3).
        flavor: ``"VOLUME"``, ``"LABEL"``, ``"OVERVIEW"``, ``"THUMBNAIL"`` or another Image Type value 3.
        has_image_type: False when Image Type is absent (flavour taken as VOLUME).
        width, height: total pixel matrix in pixels.
        frame_width, frame_height: Columns and Rows of one frame in pixels.
        frames: Number of Frames.
        samples, bits_allocated, bits_stored, signed, planar: pixel description
            (Samples per Pixel, Bits Allocated, Bits Stored, Pixel Representation 1,
            Planar Configuration 1).
        photometric: Photometric Interpretation, e.g. ``"RGB"``, ``"YBR_FULL_422"``.
        study, series, pyramid: the UIDs that group instances ("" if absent).
        concatenation: Concatenation UID or "", concat_offset its Concatenation
            Frame Offset Number, concat_number its In-concatenation Number.
        organization: Dimension Organization Type (``"TILED_FULL"``, ``"TILED_SPARSE"``) or "".
        source: the byte source the header was read through (an object of a bucket
            prefix; :mod:`.frames` reads the offset tables through it), or None: the
            file at ``path``.
    """

    path: str
    ds: Dataset
    pixel_pos: int
    file_size: int
    transfer_syntax: str
    implicit_vr: bool
    flavor: str
    has_image_type: bool
    width: int
    height: int
    frame_width: int
    frame_height: int
    frames: int
    samples: int
    bits_allocated: int
    bits_stored: int
    signed: bool
    planar: bool
    photometric: str
    study: str
    series: str
    pyramid: str
    concatenation: str
    concat_offset: int
    concat_number: int
    organization: str
    source: ByteSource | None = None

    def open(self) -> BinaryIO:
        """A binary file of the instance's bytes: a read-only view of :attr:`source` where there is
        one (closing it leaves the source open), else the file at :attr:`path` opened for reading.

        Raises:
            UnsupportedFormatError: the file is a FIFO or a device (opening it could block for good).
            FileNotFoundError, PermissionError, OSError: opening the file.
        """
        return _open(self.source) if self.source is not None else os.fdopen(open_regular(self.path), "rb")


def _open(source: ByteSource) -> BinaryIO:
    """A read-only binary file of ``source``'s bytes (closing it leaves the source open)."""
    return cast(BinaryIO, SourceFile(source))


def _int(ds: Dataset, keyword: str, default: int | None = None) -> int:
    value = ds.get(keyword)
    if value is None or value == "":
        if default is None:
            raise CorruptFileError(f"attribute {keyword} is missing")
        return default
    return int(value)


def read_instance(path: str, source: ByteSource | None = None) -> Instance:
    """Read the header of the DICOM file ``path`` (pixel data not read); through ``source``
    where given (a remote object: ``path`` then only names it, as :attr:`Instance.path`), else
    from the file.  The one place a DICOM file of a slide is opened: its errors name ``path``
    (:func:`wsitool.ground.naming.about`; the checks below raise without it).

    Raises:
        UnsupportedFormatError: not a DICOM file, or not a VL Whole Slide
            Microscopy image (another SOP class), or a pixel layout wsitool does
            not read (no Pixel Data element).
        CorruptFileError: the header is unreadable or an attribute the pyramid
            needs is missing or malformed (message names the cause).
    """
    import pydicom  # loaded with the first DICOM file (DESIGN: the DICOM library is imported lazily)

    with about(path), (_open(source) if source is not None else os.fdopen(open_regular(path), "rb")) as fp:
        fp.seek(0, 2)
        file_size = fp.tell()
        fp.seek(0)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ds = pydicom.dcmread(fp, stop_before_pixels=True)
                pixel_pos = fp.tell()
                return Instance(path=path, ds=ds, pixel_pos=pixel_pos, file_size=file_size,
                                source=source, **_describe(ds))
        except WsiError:
            raise
        except Exception as exc:  # pydicom's many ways (OSError included) of finding a header broken
            raise CorruptFileError(f"unreadable DICOM header: {type(exc).__name__}: {exc}") from None


def instance_from_dataset(path: str, ds: Dataset, file_size: int) -> Instance:
    """The :class:`Instance` of a header that did not come from a file (DICOMweb metadata):
    ``ds`` must carry ``file_meta.TransferSyntaxUID``; ``path`` names it (:attr:`Instance.path`)
    and ``file_size`` is the size of the address space its frames are read from.  Errors do not
    name it: the caller does.

    Raises:
        UnsupportedFormatError, CorruptFileError: as :func:`read_instance`.
    """
    try:
        return Instance(path=path, ds=ds, pixel_pos=0, file_size=file_size, **_describe(ds))
    except WsiError:
        raise
    except Exception as exc:  # a malformed value pydicom converts late
        raise CorruptFileError(f"malformed DICOM attributes: {type(exc).__name__}: {exc}") from None


def _describe(ds: Dataset) -> dict[str, Any]:
    """The :class:`Instance` fields the data set ``ds`` gives (all but ``path``, ``ds``,
    ``pixel_pos``, ``file_size`` and ``source``).

    Raises:
        UnsupportedFormatError, CorruptFileError: as :func:`read_instance`.
    """
    meta = getattr(ds, "file_meta", None)
    sop = str(ds.get("SOPClassUID", "") or (meta.get("MediaStorageSOPClassUID", "") if meta else ""))
    if sop != WSI_SOP_CLASS:
        from pydicom.uid import UID

        name = getattr(UID(sop), "name", sop) if sop else "none"
        raise UnsupportedFormatError(
            f"not a DICOM whole-slide image (SOP class {sop or 'missing'}: {name}; wsitool reads "
            f"VL Whole Slide Microscopy Image Storage {WSI_SOP_CLASS})"
        )
    ts = str(meta.get("TransferSyntaxUID", "")) if meta is not None else ""
    if not ts:
        raise CorruptFileError("no Transfer Syntax UID in the File Meta Information")
    implicit = ds.original_encoding[0] if hasattr(ds, "original_encoding") else False
    image_type = ds.get("ImageType")
    values = list(image_type) if image_type is not None and not isinstance(image_type, str) else (
        [image_type] if image_type else [])
    flavor = str(values[2]).upper() if len(values) >= 3 else "VOLUME"
    rows, cols = _int(ds, "Rows"), _int(ds, "Columns")
    frames = _int(ds, "NumberOfFrames", 1)
    width = _int(ds, "TotalPixelMatrixColumns", cols if frames == 1 else None)
    height = _int(ds, "TotalPixelMatrixRows", rows if frames == 1 else None)
    if min(rows, cols, width, height) <= 0 or frames <= 0:
        raise CorruptFileError(
            f"inconsistent image size: total pixel matrix {width}x{height}, frames of "
            f"{cols}x{rows}, {frames} frame(s)"
        )
    samples = _int(ds, "SamplesPerPixel", 1)
    bits = _int(ds, "BitsAllocated")
    if samples not in (1, 3, 4) or bits not in (1, 8, 16, 32):
        raise UnsupportedFormatError(f"{samples} samples of {bits} bits per pixel")
    concat = str(ds.get("ConcatenationUID", "") or "")
    return dict(
        transfer_syntax=ts, implicit_vr=bool(implicit), flavor=flavor,
        has_image_type=bool(values), width=width, height=height, frame_width=cols,
        frame_height=rows, frames=frames, samples=samples, bits_allocated=bits,
        bits_stored=_int(ds, "BitsStored", bits), signed=_int(ds, "PixelRepresentation", 0) == 1,
        planar=_int(ds, "PlanarConfiguration", 0) == 1 and samples > 1,
        photometric=str(ds.get("PhotometricInterpretation", "") or "").upper(),
        study=str(ds.get("StudyInstanceUID", "") or ""),
        series=str(ds.get("SeriesInstanceUID", "") or ""),
        pyramid=str(ds.get("PyramidUID", "") or ""),
        concatenation=concat,
        concat_offset=_int(ds, "ConcatenationFrameOffsetNumber", 0) if concat else 0,
        concat_number=_int(ds, "InConcatenationNumber", 1) if concat else 1,
        organization=str(ds.get("DimensionOrganizationType", "") or "").upper(),
    )


def first_item(seq: Any, keyword: str) -> Any:
    """The first item of sequence ``keyword`` of ``seq`` (a data set or item), or None."""
    items = seq.get(keyword) if seq is not None else None
    return items[0] if items else None
