"""DICOM WSI export (``format="dicom"``, issue 52): every output readable, passthrough byte for byte.

Each source is exported once (module fixture) and the series is checked with
the tools other people use: ``dciodvfy -new`` (dicom3tools; 0 errors on every
instance), OpenSlide 4 given one instance file (vendor ``dicom``, the source's
level geometry and associated images), wsidicom given the folder, and wsitool
reading the folder back.  Regions are compared with wsitool's read of the
source: equal for passed-through and lossless frames, ``max |diff| <= 40`` and
``mean <= 3`` for re-encoded lossy ones.  Passed-through frames are checked
byte for byte against the source's tiles (JPEG: the tables merged in, the
frame header and entropy-coded data the source's; JPEG 2000: identical).

Sources: the shared CMU-1 small region (Aperio JPEG with JPEGTables, RGB,
label / macro / thumbnail), TCGA (Aperio JPEG 2000 33005, no MPP: given),
the Hamamatsu NDPI (restart-interval JPEG: re-encoded), a lossless generic
TIFF (uncompressed: lossless JPEG 2000 and JPEG) and a DICOM series (Google's
12-level CMU-1 conversion, JPEG frames passed through again).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.encaps import generate_frames

import wsitool
from wsitool.export import export_pyramid
from wsitool.ground.bitstream import jpeg_sof
from wsitool.slide import pyramid_levels

from helpers import shared_sample

#: name -> (shared sample, export keywords, exact, associated images of the export)
CASES = {
    "cmu-jpeg-copy": ("aperio-cmu1-small-region-jpeg.svs", dict(compression="copy"), True,
                      {"label", "macro", "thumbnail"}),
    "tcga-j2k-copy": ("aperio-tcga-cr-7395-jp2k-33005-2level.svs", dict(compression="copy", mpp=0.25), True,
                      {"thumbnail"}),
    "ndpi-jpeg": ("ndpi-hamamatsu-stritt-dapi-fluor-3.5mb.ndpi", dict(compression="jpeg", threads=2), False,
                  {"macro"}),
    "tiff-j2k-lossless": ("generic-bigtiff-raw-rgb-2level-205px.tif", dict(compression="jpeg2000-lossless"), True,
                          set()),
    "tiff-jpeg": ("generic-bigtiff-raw-rgb-2level-205px.tif", dict(compression="jpeg", tile_size=64), False, set()),
    "dicom-copy": ("dicom-cmu1-small-region-12level", dict(compression="copy"), True, set()),
}
COPIES = [name for name, case in CASES.items() if case[1]["compression"] == "copy"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (source path, output folder), each exported on first use."""
    done: dict[str, tuple[Path, Path]] = {}

    def get(name: str) -> tuple[Path, Path]:
        if name not in done:
            sample, kwargs, _exact, _assoc = CASES[name]
            src = shared_sample(sample)
            out = tmp_path_factory.mktemp("dicom") / name
            result = export_pyramid(src, out, format="dicom", **kwargs)
            assert result.output == out and result.format == "dicom"
            done[name] = (src, out)
        return done[name]

    return get


def assert_close(got: np.ndarray, want: np.ndarray, exact: bool, what: str) -> None:
    assert got.shape == want.shape, what
    assert want.std() > 1, f"{what}: a flat reference region proves nothing"
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    if exact:
        assert diff.max() == 0, f"{what}: max |diff| {diff.max()}"
    else:
        assert diff.max() <= 40 and diff.mean() <= 3, f"{what}: max {diff.max()}, mean {diff.mean():.2f}"


def _region(slide_levels, k: int) -> tuple[int, int, int, int]:
    """A small region of level ``k`` (its pixels), inside the level."""
    w, h = slide_levels[k]
    rw, rh = min(160, w), min(120, h)
    return (w - rw) // 2, (h - rh) // 2, rw, rh


@pytest.mark.parametrize("name", list(CASES))
def test_dciodvfy_reports_no_error(exported, name):
    """``dciodvfy -new`` (dicom3tools) finds no error in any instance."""
    tool = shutil.which("dciodvfy")
    if tool is None:
        pytest.skip("dciodvfy (dicom3tools, the `test` extra) is not installed")
    _src, out = exported(name)
    files = sorted(out.glob("*.dcm"))
    assert files
    for f in files:
        run = subprocess.run([tool, "-new", str(f)], capture_output=True, text=True, timeout=120)
        text = run.stdout + run.stderr
        assert "VLWholeSlideMicroscopyImage" in text, f"{f.name}: {text[:500]}"
        errors = [line for line in text.splitlines() if line.startswith("Error")]
        assert not errors, f"{f.name}: {errors[:5]}"


@pytest.mark.parametrize("name", list(CASES))
def test_wsitool_reads_the_series_back(exported, name):
    """wsitool opens the folder: the source's levels, sizes, associated images, MPP; equal regions."""
    src, out = exported(name)
    _sample, kwargs, exact, assoc = CASES[name]
    with wsitool.open_slide(src) as s, wsitool.open_slide(out) as d:
        assert d.vendor == "dicom"
        dims = [(lv.width, lv.height) for lv in s.levels]
        assert [(lv.width, lv.height) for lv in d.levels] == dims
        assert set(d.associated_images) == assoc
        want_mpp = kwargs.get("mpp") or s.mpp[0]
        assert d.mpp[0] == pytest.approx(want_mpp, rel=1e-6)
        for k in range(min(len(dims), 4)):
            x, y, w, h = _region(dims, k)
            ds = s.levels[k].downsample
            loc0 = (round(x * ds), round(y * ds))
            got = d.read_region(loc0, k, (w, h), mode="rgb")
            want = s.read_region(loc0, k, (w, h), mode="rgb")
            if want.std() > 1:
                assert_close(got, want, exact, f"{name} level {k}")


@pytest.mark.parametrize("name", list(CASES))
def test_openslide_opens_the_series_from_one_instance(exported, name):
    """OpenSlide 4, given one instance file, finds the series: vendor, level geometry, associated images, pixels."""
    openslide = pytest.importorskip("openslide")
    src, out = exported(name)
    _sample, _kwargs, exact, assoc = CASES[name]
    one = sorted(out.glob("*.dcm"))[-1]  # not necessarily level 0
    with wsitool.open_slide(src) as s:
        dims = [(lv.width, lv.height) for lv in s.levels]
        o = openslide.OpenSlide(str(one))
        try:
            assert o.properties["openslide.vendor"] == "dicom"
            assert list(o.level_dimensions) == dims
            assert set(o.associated_images) == assoc
            x, y, w, h = _region(dims, 0)
            got = np.asarray(o.read_region((x, y), 0, (w, h)))[..., :3]
            assert_close(got, s.read_region((x, y), 0, (w, h), mode="rgb"), exact, f"{name} OpenSlide level 0")
            k = len(dims) - 1 if len(dims) < 4 else 1
            lw, lh = min(64, dims[k][0]), min(64, dims[k][1])
            got = np.asarray(o.read_region((0, 0), k, (lw, lh)))[..., :3]
            want = s.read_region((0, 0), k, (lw, lh), mode="rgb")
            if want.std() > 1:
                assert_close(got, want, exact, f"{name} OpenSlide level {k}")
        finally:
            o.close()


@pytest.mark.parametrize("name", list(CASES))
def test_wsidicom_opens_the_folder(exported, name):
    """wsidicom opens the folder with level 0's size and pixels, and the label where there is one.

    (wsidicom keeps only the levels whose scale against level 0 is a power of two within 1 %;
    CMU-1's 12-level DICOM conversion has fractional steps below level 2.)"""
    wsidicom = pytest.importorskip("wsidicom")
    src, out = exported(name)
    _sample, _kwargs, exact, assoc = CASES[name]
    with wsitool.open_slide(src) as s, wsidicom.WsiDicom.open(out) as w:
        dims = [(lv.width, lv.height) for lv in s.levels]
        assert (w.levels[0].size.width, w.levels[0].size.height) == dims[0]
        assert 1 <= len(w.levels) <= len(dims)
        x, y, rw, rh = _region(dims, 0)
        got = np.asarray(w.read_region((x, y), 0, (rw, rh)))[..., :3]
        assert_close(got, s.read_region((x, y), 0, (rw, rh), mode="rgb"), exact, f"{name} wsidicom")
        if "label" in assoc:
            label = np.asarray(w.read_label())
            assert label.shape[:2] == s.associated_images["label"].shape[:2]


def _frames(path: Path) -> tuple[pydicom.Dataset, list[bytes]]:
    ds = pydicom.dcmread(path)
    return ds, list(generate_frames(ds.PixelData, number_of_frames=int(ds.NumberOfFrames)))


@pytest.mark.parametrize("name", COPIES)
def test_passthrough_frames_are_the_source_tiles(exported, name):
    """Every frame is a source tile: JPEG 2000 byte-identical; JPEG with the same frame header, tables and
    entropy-coded data (the tile after its SOI ends the frame), only the shared tables merged in front."""
    src, out = exported(name)
    with wsitool.open_slide(src) as s:
        for k, lv in enumerate(pyramid_levels(s)):
            ds, frames = _frames(out / f"level-{k}.dcm")
            n = lv.tiles_across * lv.tiles_down
            assert len(frames) == n and (ds.Columns, ds.Rows) == (lv.tile_width, lv.tile_height)
            offs, cnts = lv.tiles.offsets, lv.tiles.bytecounts
            for i in sorted({0, n // 2, n - 1}):
                tile = lv.source.read(int(offs[i]), int(cnts[i]))
                frame = frames[i]
                if len(frame) % 2 == 0 and frame.endswith(b"\0") and not tile.endswith(b"\0"):
                    frame = frame[:-1]  # the item's padding byte (PS3.5 A.4)
                if ds.file_meta.TransferSyntaxUID == "1.2.840.10008.1.2.4.91":
                    assert frame == tile
                    continue
                assert ds.file_meta.TransferSyntaxUID == "1.2.840.10008.1.2.4.50"
                assert frame.startswith(b"\xff\xd8") and frame.endswith(tile[2:])
                assert jpeg_sof(frame) == jpeg_sof(tile) or jpeg_sof(tile) is None
                tables = getattr(lv.encoding.page, "jpegtables", None)
                if tables:
                    assert bytes(tables)[2:-2] in frame  # the DQT / DHT segments, as the source stores them


def test_passthrough_photometric_follows_the_stream(exported):
    """Aperio's RGB JPEG tiles: RGB; Aperio 33005 (colour transform, 9-7 wavelet): YBR_ICT under .91."""
    _src, cmu = exported("cmu-jpeg-copy")
    ds = pydicom.dcmread(cmu / "level-0.dcm", stop_before_pixels=True)
    assert ds.PhotometricInterpretation == "RGB"
    assert ds.file_meta.TransferSyntaxUID == "1.2.840.10008.1.2.4.50"
    _src, tcga = exported("tcga-j2k-copy")
    for f in ("level-0.dcm", "level-1.dcm"):
        ds = pydicom.dcmread(tcga / f, stop_before_pixels=True)
        assert (ds.PhotometricInterpretation, ds.file_meta.TransferSyntaxUID) == ("YBR_ICT", "1.2.840.10008.1.2.4.91")
    _src, lossless = exported("tiff-j2k-lossless")
    ds = pydicom.dcmread(lossless / "level-0.dcm", stop_before_pixels=True)
    assert (ds.PhotometricInterpretation, ds.file_meta.TransferSyntaxUID) == ("YBR_RCT", "1.2.840.10008.1.2.4.90")
    assert ds.LossyImageCompression == "00"


def test_one_series_shared_identifiers(exported):
    """One study, series, frame of reference; one pyramid UID for the VOLUME instances; image types."""
    _src, out = exported("cmu-jpeg-copy")
    heads = {f.name: pydicom.dcmread(f, stop_before_pixels=True) for f in out.glob("*.dcm")}
    assert set(heads) == {"level-0.dcm", "thumbnail.dcm", "label.dcm", "overview.dcm"}
    for key in ("StudyInstanceUID", "SeriesInstanceUID", "FrameOfReferenceUID", "ContainerIdentifier"):
        assert len({str(ds.get(key)) for ds in heads.values()}) == 1, key
    assert len({ds.SOPInstanceUID for ds in heads.values()}) == 4
    assert [ds.ImageType[2] for _n, ds in sorted(heads.items())] == ["LABEL", "VOLUME", "OVERVIEW", "THUMBNAIL"]
    level = heads["level-0.dcm"]
    assert level.DimensionOrganizationType == "TILED_FULL"
    assert (level.TotalPixelMatrixColumns, level.TotalPixelMatrixRows) == (2220, 2967)
    spacing = level.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0].PixelSpacing
    assert float(spacing[0]) == pytest.approx(0.000499, rel=1e-3)
    path = level.OpticalPathSequence[0]
    assert float(path.ObjectiveLensPower) == 20
    assert len(path.ICCProfile) > 100
    for keyword in ("PatientName", "PatientID", "PatientBirthDate", "PatientSex", "StudyDate", "AccessionNumber"):
        assert keyword in level and not level.get(keyword), keyword  # Type 2: present, empty
    assert "BarcodeValue" in heads["label.dcm"] and not heads["label.dcm"].BarcodeValue
