"""What a DICOM export is told about the patient, study, series, specimen and equipment (floor 6).

Sources, later ones winning: the documented defaults (:data:`EQUIPMENT_DEFAULTS`,
an empty Type 2 attribute for every Type 2 attribute of the Patient, General
Study and General Series modules, a new random Container and Specimen
Identifier), then a DICOM JSON file (PS3.18 F.2, the DICOM JSON Model:
``{"00100020": {"vr": "LO", "Value": ["P-1"]}, ...}``, ``--dicom-metadata
FILE``), then ``KEYWORD=VALUE`` pairs (``--dicom-attribute``; the keyword of
the DICOM dictionary, the value as text in the attribute's VR; ``\\``
separates values of a multi-valued one).  New UIDs (pydicom's
``generate_uid``) for the study, series, frame of reference and pyramid
unless given.

The attributes the export computes from the pixels (image geometry, pixel
description, frame functional groups, optical path, SOP Class / Instance,
Image Type, the pixel data) cannot be given: :data:`COMPUTED` lists them and
giving one is refused.  The JSON file is read with a size cap
(:data:`MAX_JSON_BYTES`): untrusted input does not set how much memory is spent.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping

from pydicom import datadict
from pydicom.dataset import Dataset

from ...errors import InvalidOptionError
from ...version import __version__

#: largest ``--dicom-metadata`` file read, in bytes
MAX_JSON_BYTES = 4 << 20

#: Enhanced General Equipment (PS3.3 C.7.5.2, Type 1 in this IOD) defaults: the equipment that wrote the
#: instances, i.e. wsitool; the scanner of the source is not known in DICOM terms.  Override them with
#: ``--dicom-attribute Manufacturer=...`` (or the JSON file).
EQUIPMENT_DEFAULTS = {
    "Manufacturer": "wsitool",
    "ManufacturerModelName": "wsitool export-pyramid",
    "DeviceSerialNumber": "0",
    "SoftwareVersions": __version__,
}

#: Type 2 attributes of the Patient, General Study and General Series modules: present, empty unless given
TYPE2 = ("PatientName", "PatientID", "PatientBirthDate", "PatientSex", "StudyDate", "StudyTime",
         "ReferringPhysicianName", "StudyID", "AccessionNumber", "SeriesNumber")

#: attributes the export computes: refused in the JSON file and the pairs
COMPUTED = frozenset({
    "SOPClassUID", "SOPInstanceUID", "Modality", "ImageType", "Rows", "Columns", "NumberOfFrames",
    "SamplesPerPixel", "PhotometricInterpretation", "PlanarConfiguration", "BitsAllocated", "BitsStored",
    "HighBit", "PixelRepresentation", "PixelData", "TotalPixelMatrixColumns", "TotalPixelMatrixRows",
    "TotalPixelMatrixFocalPlanes", "TotalPixelMatrixOriginSequence", "ImageOrientationSlide",
    "SharedFunctionalGroupsSequence", "PerFrameFunctionalGroupsSequence", "DimensionOrganizationType",
    "DimensionOrganizationSequence", "DimensionIndexSequence", "OpticalPathSequence", "NumberOfOpticalPaths",
    "ImagedVolumeWidth", "ImagedVolumeHeight", "ImagedVolumeDepth", "LossyImageCompression",
    "LossyImageCompressionMethod", "LossyImageCompressionRatio", "ExtendedOffsetTable",
    "ExtendedOffsetTableLengths", "InstanceNumber", "ConcatenationUID", "FrameOfReferenceUID",
    "PyramidUID", "SpecificCharacterSet", "BurnedInAnnotation", "SpecimenLabelInImage",
    "VolumetricProperties",
})


def _refuse_computed(keyword: str, where: str) -> None:
    if keyword in COMPUTED:
        raise InvalidOptionError(f"{where}: {keyword} is computed by the export and cannot be given")


def load_json(path: str | os.PathLike) -> Dataset:
    """The attributes of a DICOM JSON file (PS3.18 F.2: one object, or a list of one).

    Raises:
        InvalidOptionError: the file is missing, larger than :data:`MAX_JSON_BYTES`, not DICOM JSON, or
            gives an attribute of :data:`COMPUTED` (one line naming the file).
    """
    name = os.fspath(path)
    try:
        with open(name, "rb") as fh:
            raw = fh.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise InvalidOptionError(f"{name}: cannot read the DICOM metadata file ({exc.strerror or exc})") from None
    if len(raw) > MAX_JSON_BYTES:
        raise InvalidOptionError(f"{name}: DICOM metadata file larger than {MAX_JSON_BYTES} bytes")
    try:
        obj = json.loads(raw)
        if isinstance(obj, list) and len(obj) == 1:
            obj = obj[0]
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        ds = Dataset.from_json(obj)
    except Exception as exc:  # json, pydicom's JSON conversion (ValueError, KeyError, TypeError...)
        raise InvalidOptionError(f"{name}: not a DICOM JSON data set ({type(exc).__name__}: {exc})") from None
    for elem in ds:
        _refuse_computed(elem.keyword or str(elem.tag), name)
        if elem.tag.group == 0x0002:
            raise InvalidOptionError(f"{name}: File Meta attribute {elem.keyword} cannot be given")
    return ds


def from_pairs(pairs: Mapping[str, str]) -> Dataset:
    """A data set from ``KEYWORD=VALUE`` pairs (values as text; ``\\`` separates multiple values).

    Raises:
        InvalidOptionError: an unknown keyword, a sequence (give those in the JSON file), a computed one,
            or a value its VR refuses.
    """
    ds = Dataset()
    for keyword, value in pairs.items():
        tag = datadict.tag_for_keyword(keyword)
        if tag is None:
            raise InvalidOptionError(f"--dicom-attribute {keyword}: not a DICOM attribute keyword")
        _refuse_computed(keyword, "--dicom-attribute")
        vr = datadict.dictionary_VR(tag)
        if vr == "SQ" or (tag >> 16) == 0x0002:
            raise InvalidOptionError(f"--dicom-attribute {keyword}: give sequences and file meta in the "
                                     "--dicom-metadata JSON file")
        values: list = str(value).split("\\") if value else []
        try:
            if vr in ("US", "SS", "UL", "SL", "IS", "UV", "SV"):
                values = [int(v) for v in values]
            elif vr in ("FL", "FD", "DS"):
                values = [float(v) for v in values]
            ds.add_new(tag, vr, values[0] if len(values) == 1 else (values or None))
        except (TypeError, ValueError) as exc:
            raise InvalidOptionError(f"--dicom-attribute {keyword}: {value!r} is not a valid {vr} value "
                                     f"({exc})") from None
    return ds


def new_identifier() -> str:
    """A new random identifier (Container / Specimen Identifier default): 16 hex digits, no PHI."""
    return secrets.token_hex(8).upper()


def user_dataset(json_path: str | os.PathLike | None, pairs: Mapping[str, str] | None) -> Dataset:
    """Defaults, then the JSON file, then the pairs (module notes), as one data set."""
    ds = Dataset()
    for keyword in TYPE2:
        setattr(ds, keyword, None)
    for keyword, value in EQUIPMENT_DEFAULTS.items():
        setattr(ds, keyword, value)
    if json_path is not None:
        ds.update(load_json(json_path))
    if pairs:
        ds.update(from_pairs(pairs))
    if not ds.get("ContainerIdentifier"):
        ds.ContainerIdentifier = new_identifier()
    return ds
