"""Small DICOM WSI instances written with pydicom for the tests: TILED_FULL / TILED_SPARSE,
missing frames, Basic / Extended Offset Tables or none, concatenations, several series.

Only what wsitool reads is written (PS3.3 A.32.8 VL Whole Slide Microscopy IOD
is much larger); the pixels are a known numpy image so reads can be checked.
"""

from __future__ import annotations

from pathlib import Path

import imagecodecs
import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import encapsulate, encapsulate_extended
from pydicom.sequence import Sequence
from pydicom.uid import ExplicitVRLittleEndian, JPEGBaseline8Bit, generate_uid

WSI = "1.2.840.10008.5.1.4.1.1.77.1.6"


def make_image(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A smooth ``(height, width, 3)`` uint8 image (JPEG-friendly, with structure)."""
    y, x = np.mgrid[0:height, 0:width]
    rng = np.random.default_rng(seed)
    a, b = rng.uniform(0.02, 0.08, 2)
    img = np.stack([128 + 100 * np.sin(a * x), 128 + 100 * np.cos(b * y),
                    128 + 60 * np.sin(0.05 * x + 0.03 * y)], axis=-1)
    return np.rint(img).astype(np.uint8)


def tiles_of(img: np.ndarray, tile: int) -> list[np.ndarray]:
    """The ``tile x tile`` cells of ``img`` in row-major order, padded with 0 at the edges."""
    h, w = img.shape[:2]
    out = []
    for r in range(-(-h // tile)):
        for c in range(-(-w // tile)):
            cell = np.zeros((tile, tile, 3), np.uint8)
            part = img[r * tile:(r + 1) * tile, c * tile:(c + 1) * tile]
            cell[:part.shape[0], :part.shape[1]] = part
            out.append(cell)
    return out


def base_dataset(width: int, height: int, tile: int, frames: int, *, series: str, study: str,
                 flavor: str = "VOLUME", spacing=(0.0005, 0.00025), photometric: str = "RGB",
                 image_type: bool = True) -> Dataset:
    ds = Dataset()
    ds.SOPClassUID = WSI
    ds.SOPInstanceUID = generate_uid()
    ds.StudyInstanceUID = study
    ds.SeriesInstanceUID = series
    ds.FrameOfReferenceUID = generate_uid()
    ds.Modality = "SM"
    ds.PatientID = "PHI-123"
    ds.PatientName = "Doe^Jane"
    if image_type:
        ds.ImageType = ["ORIGINAL", "PRIMARY", flavor, "NONE"]
    ds.Rows = tile
    ds.Columns = tile
    ds.TotalPixelMatrixColumns = width
    ds.TotalPixelMatrixRows = height
    ds.NumberOfFrames = frames
    ds.SamplesPerPixel = 3
    ds.PhotometricInterpretation = photometric
    ds.PlanarConfiguration = 0
    ds.BitsAllocated = 8
    ds.BitsStored = 8
    ds.HighBit = 7
    ds.PixelRepresentation = 0
    shared = Dataset()
    measures = Dataset()
    measures.PixelSpacing = list(spacing)
    shared.PixelMeasuresSequence = Sequence([measures])
    ds.SharedFunctionalGroupsSequence = Sequence([shared])
    path = Dataset()
    path.OpticalPathIdentifier = "1"
    path.ObjectiveLensPower = 40
    ds.OpticalPathSequence = Sequence([path])
    ds.NumberOfOpticalPaths = 1
    ds.TotalPixelMatrixFocalPlanes = 1
    return ds


def save(ds: Dataset, path: Path, transfer_syntax) -> Path:
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = ds.SOPClassUID
    meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    meta.TransferSyntaxUID = transfer_syntax
    ds.file_meta = meta
    ds.save_as(path, enforce_file_format=True)
    return path


def jpeg_frames(cells: list[np.ndarray], quality: int = 95) -> list[bytes]:
    """Baseline JPEG frames (imagecodecs / libjpeg-turbo writes a JFIF APP0: YCbCr coded)."""
    return [bytes(imagecodecs.jpeg8_encode(c, level=quality)) for c in cells]


def write_instance(path: Path, img: np.ndarray, tile: int, *, series: str, study: str,
                   codec: str = "jpeg", table: str = "basic", sparse_keep=None,
                   flavor: str = "VOLUME", spacing=(0.0005, 0.00025), image_type: bool = True,
                   concat: tuple[str, int, int, list[int]] | None = None) -> Path:
    """Write one instance holding ``img`` in ``tile``-pixel frames.

    Args:
        codec: ``"jpeg"`` (encapsulated baseline) or ``"raw"`` (native).
        table: ``"basic"``, ``"extended"`` or ``"none"`` offset table (encapsulated only).
        sparse_keep: None for TILED_FULL; else the grid indices written, TILED_SPARSE,
            in reverse order (positions decide, not frame order).
        concat: ``(uid, number, frame offset, grid indices)``: a concatenation part
            holding those frames (TILED_FULL order).
    """
    h, w = img.shape[:2]
    cells = tiles_of(img, tile)
    across = -(-w // tile)
    indices = list(range(len(cells)))
    if sparse_keep is not None:
        indices = sorted(sparse_keep, reverse=True)
    if concat is not None:
        indices = list(concat[3])
    chosen = [cells[i] for i in indices]
    ds = base_dataset(w, h, tile, len(chosen), series=series, study=study, flavor=flavor,
                      spacing=spacing, photometric="YBR_FULL_422" if codec == "jpeg" else "RGB",
                      image_type=image_type)
    if sparse_keep is not None:
        ds.DimensionOrganizationType = "TILED_SPARSE"
        items = []
        for i in indices:
            r, c = divmod(i, across)
            item, pos = Dataset(), Dataset()
            pos.ColumnPositionInTotalImagePixelMatrix = c * tile + 1
            pos.RowPositionInTotalImagePixelMatrix = r * tile + 1
            pos.XOffsetInSlideCoordinateSystem = 0
            pos.YOffsetInSlideCoordinateSystem = 0
            pos.ZOffsetInSlideCoordinateSystem = 0
            item.PlanePositionSlideSequence = Sequence([pos])
            items.append(item)
        ds.PerFrameFunctionalGroupsSequence = Sequence(items)
    else:
        ds.DimensionOrganizationType = "TILED_FULL"
    if concat is not None:
        ds.ConcatenationUID = concat[0]
        ds.InConcatenationNumber = concat[1]
        ds.ConcatenationFrameOffsetNumber = concat[2]
        ds.InConcatenationTotalNumber = 2
    if codec == "raw":
        ds.PixelData = b"".join(c.tobytes() for c in chosen)
        return save(ds, path, ExplicitVRLittleEndian)
    frames = jpeg_frames(chosen)
    ds.LossyImageCompression = "01"
    if table == "extended":
        data, eot, lengths = encapsulate_extended(frames)
        ds.PixelData = data
        ds.ExtendedOffsetTable = eot
        ds.ExtendedOffsetTableLengths = lengths
    else:
        ds.PixelData = encapsulate(frames, has_bot=table == "basic")
    ds["PixelData"].is_undefined_length = True
    ds["PixelData"].VR = "OB"
    return save(ds, path, JPEGBaseline8Bit)


def write_series(folder: Path, img: np.ndarray, tile: int, levels: int = 3, **kw) -> list[Path]:
    """A multi-file pyramid of ``img`` (each level half the previous, box-filtered) plus a label."""
    folder.mkdir(parents=True, exist_ok=True)
    study, series = kw.pop("study", generate_uid()), kw.pop("series", generate_uid())
    out = []
    level = img
    for k in range(levels):
        out.append(write_instance(folder / f"level-{k}.dcm", level, tile, series=series, study=study,
                                  spacing=(0.0005 * 2 ** k, 0.00025 * 2 ** k), **kw))
        h, w = level.shape[0] // 2 * 2, level.shape[1] // 2 * 2
        level = level[:h, :w].reshape(h // 2, 2, w // 2, 2, 3).mean((1, 3)).round().astype(np.uint8)
    label = make_image(40, 30, seed=9)
    out.append(write_instance(folder / "label.dcm", label, 64, series=series, study=study,
                              flavor="LABEL", codec="raw"))
    return out
