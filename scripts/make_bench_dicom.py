#!/usr/bin/env python
"""Build a large DICOM WSI series from the JPEG bench slide's real tiles (for scripts/bench_dicom.py).

Input: the Aperio-style JPEG slide of ``scripts/make_bench_slide.py`` (default
/tmp/bench-jpeg.svs).  Output: a folder with one VL Whole Slide Microscopy
instance per level (PS3.3 A.32.8), TILED_FULL, JPEG Baseline transfer syntax,
frames = the slide's own JPEG tiles made self-contained (tables merged, an
Adobe APP14 "RGB" marker as in the TIFF, so colours stay as the TIFF's),
an Extended Offset Table (PS3.3 C.7.6.3.1.8) and an empty Basic Offset Table.
No tile is re-encoded: the DICOM reads decode the very bytes the TIFF reads do.

Written with pydicom (``pydicom.encaps.encapsulate_extended``): highdicom 0.28
has no whole-slide image writer, and the frames are already encoded.

Usage: python scripts/make_bench_dicom.py [/tmp/bench-jpeg.svs] [/tmp/bench-dicom]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import encapsulate_extended
from pydicom.sequence import Sequence
from pydicom.uid import JPEGBaseline8Bit, generate_uid

import wsitool
from wsitool.slide import pyramid_levels

WSI = "1.2.840.10008.5.1.4.1.1.77.1.6"


def instance(lv, frames, study, series, pyramid, mpp, number) -> Dataset:
    ds = Dataset()
    ds.SOPClassUID = WSI
    ds.SOPInstanceUID = generate_uid()
    ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.PyramidUID = study, series, pyramid
    ds.FrameOfReferenceUID = pyramid
    ds.Modality = "SM"
    ds.InstanceNumber = number
    ds.ImageType = ["ORIGINAL" if number == 1 else "DERIVED", "PRIMARY", "VOLUME",
                    "NONE" if number == 1 else "RESAMPLED"]
    ds.DimensionOrganizationType = "TILED_FULL"
    ds.Rows, ds.Columns = lv.tile_height, lv.tile_width
    ds.TotalPixelMatrixColumns, ds.TotalPixelMatrixRows = lv.width, lv.height
    ds.NumberOfFrames = len(frames)
    ds.SamplesPerPixel = 3
    ds.PhotometricInterpretation = "RGB"
    ds.PlanarConfiguration = 0
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.LossyImageCompression = "01"
    shared, measures = Dataset(), Dataset()
    spacing = mpp * lv.downsample / 1000.0 if mpp else 0.00025 * lv.downsample
    measures.PixelSpacing = [spacing, spacing]
    shared.PixelMeasuresSequence = Sequence([measures])
    ds.SharedFunctionalGroupsSequence = Sequence([shared])
    path = Dataset()
    path.OpticalPathIdentifier = "1"
    ds.OpticalPathSequence = Sequence([path])
    ds.NumberOfOpticalPaths = 1
    ds.TotalPixelMatrixFocalPlanes = 1
    data, eot, lengths = encapsulate_extended(frames)
    ds.ExtendedOffsetTable, ds.ExtendedOffsetTableLengths = eot, lengths
    ds.PixelData = data
    ds["PixelData"].VR = "OB"
    ds["PixelData"].is_undefined_length = True
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = WSI, ds.SOPInstanceUID
    meta.TransferSyntaxUID = JPEGBaseline8Bit
    ds.file_meta = meta
    return ds


def main() -> int:
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/bench-jpeg.svs")
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/bench-dicom")
    out.mkdir(parents=True, exist_ok=True)
    study, series, pyramid = generate_uid(), generate_uid(), generate_uid()
    t = time.perf_counter()
    with wsitool.open_slide(src) as slide, open(src, "rb") as fp:
        mpp = slide.mpp_x
        for lv in pyramid_levels(slide):
            prefix = lv.encoding.jpeg_prefix
            n = lv.tiles_across * lv.tiles_down
            frames = []
            for k in range(n):
                off, count = int(lv.tiles.offsets[k]), int(lv.tiles.bytecounts[k])
                fp.seek(off)
                tile = fp.read(count)
                frames.append(prefix + tile[2:] if prefix else tile)
            ds = instance(lv, frames, study, series, pyramid, mpp, lv.index + 1)
            target = out / f"level-{lv.index}.dcm"
            ds.save_as(target, enforce_file_format=True)
            print(f"{target}: {lv.width}x{lv.height}, {n} frames, "
                  f"{target.stat().st_size / 1e6:.0f} MB", flush=True)
    print(f"done in {time.perf_counter() - t:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
