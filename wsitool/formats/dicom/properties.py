"""Metadata of a DICOM slide: OpenSlide's ``openslide.*`` keys, ``dicom.*`` attributes, PHI marking (floor 3).

* ``openslide.mpp-x`` / ``mpp-y`` come from Pixel Spacing (0028,0030) in the
  Pixel Measures Sequence of the Shared Functional Groups (PS3.3 C.7.6.16.2.1),
  else of the first per-frame item: millimetres, the first value the spacing
  between rows (vertical, so ``mpp-y``), the second between columns
  (horizontal, ``mpp-x``) (PS3.3 10.7.1.3); times 1000 for micrometres.
* ``openslide.objective-power`` is the Objective Lens Power (0048,0112) of the
  first Optical Path Sequence item (PS3.3 C.8.12.5).
* ``dicom.<Keyword>`` for the level-0 instance's top-level attributes with a
  printable value, ``dicom.<Sequence>[i].<Keyword>`` for the few nested ones
  that matter (pixel spacing, objective power, optical path), as OpenSlide names
  them.
* ``wsitool.dicom.*``: what wsitool picked (optical path, focal plane,
  organization, which offset table located the frames).

PHI: :data:`PHI_KEYWORDS` are the attributes that identify a patient, a
person, an institution or the specimen (after the Basic Application Level
Confidentiality Profile, PS3.15 E.1.1, table E.1-1: names, IDs, birth dates,
addresses, accession and study IDs, container / specimen identifiers, dates of
the study); :func:`is_phi` tells whether a property name holds one, so that
``info`` hides them unless asked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from pydicom.dataset import Dataset

from ...ground.color import icc_bytes
from ...model import PyramidLevel, level_properties
from .instance import first_item as _first

__all__ = ["PHI_KEYWORDS", "is_phi", "build_properties", "mpp_of", "objective_of"]

PHI_KEYWORDS = frozenset({
    "PatientName", "PatientID", "IssuerOfPatientID", "OtherPatientIDs", "OtherPatientIDsSequence",
    "OtherPatientNames", "PatientBirthDate", "PatientBirthTime", "PatientBirthName",
    "PatientMotherBirthName", "PatientSex", "PatientAge", "PatientSize", "PatientWeight",
    "PatientAddress", "PatientTelephoneNumbers", "PatientComments", "EthnicGroup",
    "MilitaryRank", "BranchOfService", "MedicalRecordLocator", "PatientReligiousPreference",
    "AccessionNumber", "StudyID", "ReferringPhysicianName", "PerformingPhysicianName",
    "NameOfPhysiciansReadingStudy", "PhysiciansOfRecord", "OperatorsName", "RequestingPhysician",
    "InstitutionName", "InstitutionAddress", "InstitutionalDepartmentName", "StationName",
    "DeviceSerialNumber", "ContainerIdentifier", "SpecimenIdentifier", "IssuerOfTheContainerIdentifierSequence",
    "StudyDate", "StudyTime", "SeriesDate", "SeriesTime", "AcquisitionDate", "AcquisitionTime",
    "AcquisitionDateTime", "ContentDate", "ContentTime", "InstanceCreationDate",
    "InstanceCreationTime", "StudyDescription", "SeriesDescription", "ImageComments",
    "AdmittingDiagnosesDescription", "PatientState", "ResponsiblePerson", "ResponsibleOrganization",
})

_PREFIX = "dicom."


def is_phi(name: str) -> bool:
    """True when the property ``name`` (e.g. ``"dicom.PatientID"``,
    ``"dicom.SpecimenDescriptionSequence[0].SpecimenIdentifier"``) holds an attribute of
    :data:`PHI_KEYWORDS`: any path component counts, so a sequence of PHI hides its items."""
    if not name.startswith(_PREFIX):
        return False
    return any(part.split("[", 1)[0] in PHI_KEYWORDS for part in name[len(_PREFIX):].split("."))


def mpp_of(ds: Dataset) -> tuple[float | None, float | None]:
    """``(mpp_x, mpp_y)`` in micrometres per pixel from Pixel Spacing (module docstring), or Nones."""
    for group in (_first(ds, "SharedFunctionalGroupsSequence"),
                  _first(ds, "PerFrameFunctionalGroupsSequence")):
        measures = _first(group, "PixelMeasuresSequence")
        spacing = measures.get("PixelSpacing") if measures is not None else None
        if spacing is not None and len(spacing) == 2:
            row, col = float(spacing[0]), float(spacing[1])
            if row > 0 and col > 0:
                return col * 1000.0, row * 1000.0
    return None, None


def objective_of(ds: Dataset) -> float | None:
    """Objective Lens Power of the first optical path, or None."""
    path = _first(ds, "OpticalPathSequence")
    value = path.get("ObjectiveLensPower") if path is not None else None
    try:
        return float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _text(value: object) -> str | None:
    if isinstance(value, (bytes, bytearray)):
        return None
    if isinstance(value, (list, tuple)) or type(value).__name__ == "MultiValue":
        return None
    text = str(value)
    return text if len(text) <= 256 else None


def _flatten(ds: Dataset, prefix: str, out: dict[str, str], depth: int) -> None:
    for elem in ds:
        keyword = elem.keyword
        if not keyword or elem.tag.group in (0x7FE0,) or keyword == "PerFrameFunctionalGroupsSequence":
            continue
        name = f"{prefix}{keyword}"
        if elem.VR == "SQ":
            if depth < 3:
                for i, item in enumerate(elem.value[:8]):
                    _flatten(item, f"{name}[{i}].", out, depth + 1)
            continue
        if elem.VR in ("OB", "OW", "OF", "OD", "OL", "OV", "UN"):
            continue
        value = elem.value
        if type(value).__name__ == "MultiValue" or isinstance(value, (list, tuple)):
            if len(value) > 16:
                continue
            for i, v in enumerate(value):
                text = _text(v)
                if text is not None:
                    out[f"{name}[{i}]"] = text
            continue
        text = _text(value if value is not None else "")
        if text is not None:
            out[name] = text


def build_properties(levels: tuple[PyramidLevel, ...], ds: Dataset, extra: dict[str, str],
                     associated: dict[str, tuple[int, int]]) -> dict[str, str]:
    """The property map of a DICOM slide.

    Args:
        levels: the pyramid levels; ds: the level-0 instance's header.
        extra: ``wsitool.dicom.*`` notes to add.
        associated: name -> ``(width, height)`` of the associated images.
    """
    props: dict[str, str] = {}
    try:
        _flatten(ds, _PREFIX, props, 0)
        meta = getattr(ds, "file_meta", None)
        if meta is not None and meta.get("TransferSyntaxUID"):
            props["dicom.TransferSyntaxUID"] = str(meta.TransferSyntaxUID)
    except Exception:  # a malformed optional attribute loses the dicom.* keys, not the slide
        pass
    props["openslide.vendor"] = "dicom"
    props.update(level_properties(levels))
    mpp_x, mpp_y = mpp_of(ds)
    if mpp_x is not None:
        props["openslide.mpp-x"] = repr(mpp_x)
        props["openslide.mpp-y"] = repr(mpp_y)
    objective = objective_of(ds)
    if objective is not None:
        props["openslide.objective-power"] = f"{objective:g}"
    for name, (w, h) in associated.items():
        props[f"openslide.associated.{name}.width"] = str(w)
        props[f"openslide.associated.{name}.height"] = str(h)
    props.update(extra)
    return props


def icc_profile_of(ds: Dataset) -> bytes | None:
    """The ICC profile of the first optical path (ICC Profile (0028,2000) in the Optical
    Path Sequence (0048,0105), PS3.3 C.8.12.5), raw bytes, or None (also when it cannot be
    a profile: :func:`wsitool.ground.color.icc_bytes`)."""
    path = _first(ds, "OpticalPathSequence")
    value = path.get("ICCProfile") if path is not None else None
    return icc_bytes(bytes(value)) if value else None
