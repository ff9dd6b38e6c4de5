"""The attributes of a VL Whole Slide Microscopy Image instance (PS3.3 A.32.8), module by module (floor 6).

:class:`SeriesFacts` holds what every instance of one export shares (UIDs,
the user's patient / study / series / specimen / equipment attributes from
:mod:`.metadata`, the level-0 pixel spacing, objective power, ICC profile and
acquisition time); :func:`instance_dataset` builds one instance's data set
(every attribute but the pixel data) from it and the image's geometry:

* Patient, General Study, General Series (Modality ``SM``), Whole Slide
  Microscopy Series, General and Enhanced General Equipment: the user's
  attributes (Type 2 ones present, empty unless given).
* Frame of Reference (one UID for the series, Position Reference Indicator
  ``SLIDE_CORNER``), Multi-Resolution Pyramid (one Pyramid UID for the
  VOLUME instances).
* General Image / Whole Slide Microscopy Image (PS3.3 C.8.12.4): Image Type
  ``ORIGINAL`` (the level the export starts from, passed through) or ``DERIVED`` (the others, and re-encoded ones),
  ``PRIMARY``, the flavour (``VOLUME``, ``THUMBNAIL``, ``LABEL``,
  ``OVERVIEW``), ``NONE`` or ``RESAMPLED`` (levels below the first); the Total
  Pixel Matrix (its origin at the slide's corner), Image Orientation (Slide)
  ``[0, 1, 0, 1, 0, 0]`` (rows along the slide's Y axis, columns along X), the
  Imaged Volume in millimetres, the lossy compression attributes.
* Multi-frame Functional Groups: shared Pixel Measures (Pixel Spacing in mm,
  row spacing first: PS3.3 10.7.1.3), Whole Slide Microscopy Image Frame Type
  and Optical Path Identification; per frame (TILED_SPARSE only) Plane Position
  (Slide) with the 1-based column / row of the frame's first pixel.
* Multi-frame Dimension: the frames' dimensions are the row and column
  positions in the Total Pixel Matrix (PS3.3 C.7.6.17.3, TILED_FULL order).
* Specimen (Container Identifier, one specimen description) and Optical Path
  (brightfield, full-spectrum illumination, the ICC profile, the objective
  lens power), Acquisition Context (empty), SOP Common.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence

from pydicom.dataset import Dataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import generate_uid

from .frames import FrameCoding

#: VL Whole Slide Microscopy Image Storage (PS3.4 B.5)
WSI_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.77.1.6"

#: Lossy Image Compression Ratio until the frames are written (16 characters, the longest DS)
RATIO_PLACEHOLDER = "1.00000000000000"

#: Image Orientation (Slide): the first row along +Y of the slide, the first column along +X
ORIENTATION = [0, 1, 0, 1, 0, 0]

#: Dimension index pointers: Plane Position (Slide) Sequence's Column / Row Position In Total Image Pixel Matrix
_PLANE_POSITION_SLIDE = 0x0048021A
_COLUMN_POSITION = 0x0048021E
_ROW_POSITION = 0x0048021F


def _code(value: str, scheme: str, meaning: str) -> Dataset:
    item = Dataset()
    item.CodeValue = value
    item.CodingSchemeDesignator = scheme
    item.CodeMeaning = meaning
    return item


@dataclasses.dataclass
class SeriesFacts:
    """What the instances of one export share.

    Attributes:
        user: the user's attributes (:func:`~.metadata.user_dataset`).
        mpp: ``(x, y)`` micrometres per pixel of the first VOLUME level.
        size0: ``(width, height)`` of the first VOLUME level in pixels.
        objective: objective power of the first level, or None.
        icc: the ICC profile (the source's, or sRGB).
        acquired: acquisition date and time (the source's, else now), as a DICOM DT.
    """

    user: Dataset
    mpp: tuple[float, float]
    size0: tuple[int, int]
    objective: float | None
    icc: bytes
    acquired: str
    study_uid: str = ""
    series_uid: str = ""
    frame_uid: str = ""
    pyramid_uid: str = ""

    def __post_init__(self) -> None:
        self.study_uid = self.user.get("StudyInstanceUID") or generate_uid()
        self.series_uid = self.user.get("SeriesInstanceUID") or generate_uid()
        self.frame_uid = generate_uid()
        self.pyramid_uid = generate_uid()


def acquisition_datetime(when: datetime.datetime | None) -> str:
    """A DICOM DT (``YYYYMMDDHHMMSS.ffffff``) of ``when`` (now, UTC, when None)."""
    when = when or datetime.datetime.now(datetime.timezone.utc)
    return when.strftime("%Y%m%d%H%M%S.%f")


@dataclasses.dataclass(frozen=True)
class ImageGeometry:
    """One instance's image.

    Attributes:
        flavor: ``VOLUME``, ``THUMBNAIL``, ``LABEL`` or ``OVERVIEW``.
        width, height: the Total Pixel Matrix in pixels.
        tile_width, tile_height: Columns x Rows of one frame.
        frames: number of frames.
        number: Instance Number (1-based).
        original: the level the export starts from (Image Type ORIGINAL), else DERIVED.
        resampled: a level below the first (Image Type value 4 RESAMPLED).
        positions: TILED_SPARSE: ``(column, row)`` of each frame's tile (0-based tile indices), in frame
            order; None: TILED_FULL.
    """

    flavor: str
    width: int
    height: int
    tile_width: int
    tile_height: int
    frames: int
    number: int
    original: bool = False
    resampled: bool = False
    positions: Sequence[tuple[int, int]] | None = None


def instance_dataset(facts: SeriesFacts, image: ImageGeometry, coding: FrameCoding) -> Dataset:
    """Every attribute of one instance but the pixel data (module notes)."""
    ds = Dataset()
    ds.SpecificCharacterSet = "ISO_IR 192"
    ds.update(facts.user)
    ds.SOPClassUID = WSI_SOP_CLASS
    ds.SOPInstanceUID = generate_uid()
    ds.StudyInstanceUID = facts.study_uid
    ds.SeriesInstanceUID = facts.series_uid
    ds.Modality = "SM"
    ds.FrameOfReferenceUID = facts.frame_uid
    if "PositionReferenceIndicator" not in ds:
        ds.PositionReferenceIndicator = "SLIDE_CORNER"
    if image.flavor == "VOLUME":
        ds.PyramidUID = facts.pyramid_uid
    now = datetime.datetime.now(datetime.timezone.utc)
    ds.ContentDate = now.strftime("%Y%m%d")
    ds.ContentTime = now.strftime("%H%M%S.%f")
    ds.AcquisitionDateTime = facts.acquired
    ds.InstanceNumber = image.number
    _image_module(ds, facts, image, coding)
    _functional_groups(ds, facts, image)
    _specimen(ds, facts)
    _optical_path(ds, facts)
    ds.AcquisitionContextSequence = DicomSequence([])
    return ds


def _spacing_mm(facts: SeriesFacts, image: ImageGeometry) -> tuple[float, float]:
    """``(column spacing, row spacing)`` in mm of ``image`` (its size against level 0's)."""
    fx = facts.size0[0] / image.width
    fy = facts.size0[1] / image.height
    return facts.mpp[0] * fx / 1000.0, facts.mpp[1] * fy / 1000.0


def _ds(value: float) -> str:
    """A Decimal String of at most 16 characters (PS3.5 6.2)."""
    text = f"{value:.10g}"
    if len(text) > 16:
        text = f"{value:.8e}"
    return text


def _image_module(ds: Dataset, facts: SeriesFacts, image: ImageGeometry, coding: FrameCoding) -> None:
    volume = image.flavor == "VOLUME"
    ds.ImageType = ["ORIGINAL" if image.original else "DERIVED", "PRIMARY", image.flavor,
                    "RESAMPLED" if image.resampled else "NONE"]
    ds.Rows, ds.Columns = image.tile_height, image.tile_width
    ds.NumberOfFrames = image.frames
    ds.TotalPixelMatrixColumns, ds.TotalPixelMatrixRows = image.width, image.height
    ds.TotalPixelMatrixFocalPlanes = 1
    origin = Dataset()
    origin.XOffsetInSlideCoordinateSystem = 0
    origin.YOffsetInSlideCoordinateSystem = 0
    ds.TotalPixelMatrixOriginSequence = DicomSequence([origin])
    ds.ImageOrientationSlide = ORIENTATION
    sx, sy = _spacing_mm(facts, image)
    ds.ImagedVolumeWidth = float(sx * image.width)
    ds.ImagedVolumeHeight = float(sy * image.height)
    ds.ImagedVolumeDepth = 0.001
    ds.SamplesPerPixel = 3
    ds.PhotometricInterpretation = coding.photometric
    ds.PlanarConfiguration = 0
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.LossyImageCompression = "01" if coding.lossy else "00"
    if coding.lossy:
        ds.LossyImageCompressionMethod = coding.method
        ds.LossyImageCompressionRatio = RATIO_PLACEHOLDER  # the writer puts the ratio in
    ds.VolumetricProperties = "VOLUME"
    ds.SpecimenLabelInImage = "YES" if image.flavor in ("LABEL", "OVERVIEW") else "NO"
    ds.BurnedInAnnotation = "YES" if image.flavor in ("LABEL", "OVERVIEW") else "NO"
    ds.FocusMethod = "AUTO"
    ds.ExtendedDepthOfField = "NO"
    ds.DimensionOrganizationType = "TILED_SPARSE" if image.positions is not None else "TILED_FULL"
    if not volume:
        ds.PatientOrientation = None
    if image.flavor == "LABEL":  # Slide Label module: Type 2, empty unless the user gave them (PHI)
        for keyword in ("BarcodeValue", "LabelText"):
            if keyword not in ds:
                setattr(ds, keyword, None)


def _functional_groups(ds: Dataset, facts: SeriesFacts, image: ImageGeometry) -> None:
    sx, sy = _spacing_mm(facts, image)
    measures = Dataset()
    measures.PixelSpacing = [_ds(sy), _ds(sx)]
    measures.SliceThickness = _ds(0.001)
    frame_type = Dataset()
    frame_type.FrameType = list(ds.ImageType)
    path_id = Dataset()
    path_id.OpticalPathIdentifier = "1"
    shared = Dataset()
    shared.PixelMeasuresSequence = DicomSequence([measures])
    shared.WholeSlideMicroscopyImageFrameTypeSequence = DicomSequence([frame_type])
    shared.OpticalPathIdentificationSequence = DicomSequence([path_id])
    ds.SharedFunctionalGroupsSequence = DicomSequence([shared])
    dimension_uid = generate_uid()
    organization = Dataset()
    organization.DimensionOrganizationUID = dimension_uid
    ds.DimensionOrganizationSequence = DicomSequence([organization])
    indices = []
    for pointer, label in ((_COLUMN_POSITION, "Column Position"), (_ROW_POSITION, "Row Position")):
        index = Dataset()
        index.DimensionOrganizationUID = dimension_uid
        index.DimensionIndexPointer = pointer
        index.FunctionalGroupPointer = _PLANE_POSITION_SLIDE
        index.DimensionDescriptionLabel = label
        indices.append(index)
    ds.DimensionIndexSequence = DicomSequence(indices)
    if image.positions is None:
        return
    per_frame = []
    for col, row in image.positions:
        x, y = col * image.tile_width, row * image.tile_height
        position = Dataset()
        position.ColumnPositionInTotalImagePixelMatrix = x + 1
        position.RowPositionInTotalImagePixelMatrix = y + 1
        position.XOffsetInSlideCoordinateSystem = _ds(y * sy)  # rows run along X (ORIENTATION)
        position.YOffsetInSlideCoordinateSystem = _ds(x * sx)
        position.ZOffsetInSlideCoordinateSystem = "0"
        content = Dataset()
        content.DimensionIndexValues = [x + 1, y + 1]
        item = Dataset()
        item.FrameContentSequence = DicomSequence([content])
        item.PlanePositionSlideSequence = DicomSequence([position])
        per_frame.append(item)
    ds.PerFrameFunctionalGroupsSequence = DicomSequence(per_frame)


def _specimen(ds: Dataset, facts: SeriesFacts) -> None:
    if "IssuerOfTheContainerIdentifierSequence" not in ds:
        ds.IssuerOfTheContainerIdentifierSequence = DicomSequence([])
    if "ContainerTypeCodeSequence" not in ds:
        ds.ContainerTypeCodeSequence = DicomSequence([_code("433466003", "SCT", "Microscope slide")])
    if "SpecimenDescriptionSequence" not in ds:
        specimen = Dataset()
        specimen.SpecimenIdentifier = ds.ContainerIdentifier
        specimen.SpecimenUID = generate_uid(entropy_srcs=[facts.series_uid, "specimen"])
        specimen.IssuerOfTheSpecimenIdentifierSequence = DicomSequence([])
        specimen.SpecimenPreparationSequence = DicomSequence([])
        ds.SpecimenDescriptionSequence = DicomSequence([specimen])


def _optical_path(ds: Dataset, facts: SeriesFacts) -> None:
    path = Dataset()
    path.OpticalPathIdentifier = "1"
    path.IlluminationTypeCodeSequence = DicomSequence([_code("111744", "DCM", "Brightfield illumination")])
    path.IlluminationColorCodeSequence = DicomSequence([_code("414298005", "SCT", "Full Spectrum")])
    path.ICCProfile = facts.icc
    if facts.objective:
        path.ObjectiveLensPower = _ds(facts.objective)
    ds.OpticalPathSequence = DicomSequence([path])
    ds.NumberOfOpticalPaths = 1
