"""CLI: info and read-region, output formats, one-line errors and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import imagecodecs
import numpy as np
import pytest
import tifffile
from typer.testing import CliRunner

import wsitool
from wsitool.cli import app

from helpers import prose, shared_sample

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_info_json(sample_jpeg):
    res = run("info", sample_jpeg, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    with wsitool.open_slide(sample_jpeg) as s:
        assert data["level_count"] == s.level_count
        assert [[lv["width"], lv["height"]] for lv in data["levels"]] == [list(d) for d in s.level_dimensions]
        assert data["mpp_x"] == s.mpp_x and data["vendor"] == "aperio"
        assert "thumbnail" in data["associated_images"]
        assert data["properties"]["openslide.mpp-x"] == s.properties["openslide.mpp-x"]
    assert any(b["available"] for b in data["backends"])


def test_info_table(cmu1):
    res = run("info", cmu1)
    assert res.exit_code == 0
    for word in ("aperio", "2220", "2967", "JPEG", "label", "macro", "thumbnail", "0.499"):
        assert word in res.stdout


@pytest.mark.parametrize("ext", [".png", ".tif", ".npy"])
def test_read_region_writes_file(sample_jpeg, tmp_path, ext):
    out = tmp_path / f"r{ext}"
    res = run("read-region", sample_jpeg, "--location", -50, 20, "--level", 1, "--size", 300, 200,
              "--output", out, "--threads", 2)
    assert res.exit_code == 0, res.output
    with wsitool.open_slide(sample_jpeg) as s:
        expected = s.read_region((-50, 20), 1, (300, 200))
    if ext == ".png":
        got = imagecodecs.png_decode(out.read_bytes())
    elif ext == ".tif":
        got = tifffile.imread(out)
    else:
        got = np.load(out)
    assert np.array_equal(got, expected)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


def test_read_region_raw_mode_npy(tmp_path):
    path = shared_sample("generic-bigtiff-zstd-5level-10000x5000.tiff")
    out = tmp_path / "raw.npy"
    res = run("read-region", path, "-l", 100, 100, "-s", 64, 32, "-o", out, "--mode", "raw")
    assert res.exit_code == 0, res.output
    arr = np.load(out)
    assert arr.shape == (32, 64, 3) and arr.dtype == np.uint8


@pytest.mark.parametrize(
    "args,code,needle",
    [
        (["--size", 0, 10], 5, "size must be positive"),
        (["--size", 10, 10, "--level", 9], 5, "level 9 out of range"),
        (["--size", 100000, 100000], 6, "max_region_pixels"),
        (["--size", 100, 100, "--max-pixels", 50], 6, "max_region_pixels"),
        (["--size", 10, 10, "--device", "cuda"], 8, "no CUDA device available"),
        (["--size", 10, 10, "--mode", "cmyk"], 2, "--mode"),         # usage errors: exit 2
        (["--size", 10, 10, "--on-error", "bogus"], 2, "--on-error"),
        (["--size", 10, 10, "--threads", 0], 2, "--threads"),
    ],
)
def test_read_region_errors(sample_jpeg, tmp_path, args, code, needle):
    out = tmp_path / "x.png"
    res = run("read-region", sample_jpeg, "-o", out, *args)
    assert res.exit_code == code, res.output
    assert needle in res.output
    assert not out.exists()


@pytest.mark.parametrize(
    "name,code",
    [
        ("broken-not-a-tiff-random-ascii.svs", 3),
        ("broken-zero-height.tif", 4),
        ("broken-aperio-unreadable-jpeg.svs", 7),
    ],
)
def test_bad_files_exit_codes(name, code, tmp_path):
    path = shared_sample(name)
    out = tmp_path / "x.png"
    res = run("read-region", path, "-s", 8, 8, "-o", out)
    assert res.exit_code == code, res.output
    assert str(path) in res.output
    assert "Traceback" not in res.output
    assert not out.exists()


def test_missing_file_and_bad_extension(tmp_path, sample_jpeg):
    res = run("read-region", tmp_path / "nope.svs", "-s", 8, 8, "-o", tmp_path / "x.png")
    assert res.exit_code == 9 and "No such file" in res.output
    res = run("read-region", sample_jpeg, "-s", 8, 8, "-o", tmp_path / "x.jpg2")
    assert res.exit_code == 2 and "unknown output extension" in res.output


def test_console_script_installed_and_quiet(sample_jpeg, tmp_path):
    """The real entry point: one line on stderr for an error, nothing from native libraries."""
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "wsitool.cli", "read-region", str(sample_jpeg), "-s", "0", "1",
           "-o", str(tmp_path / "x.png")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 5
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("wsitool: error:"), proc.stderr
    ok = subprocess.run([*cmd[:5], "-s", "64", "64", "-o", str(tmp_path / "y.png")],
                        capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr


def test_export_format_follows_output_extension(sample_jpeg, tmp_path):
    region = ["--region", 0, 0, 300, 200, "--quiet"]
    res = run("export-pyramid", sample_jpeg, tmp_path / "a.dzi", *region)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "a_files").is_dir() and (tmp_path / "a.dzi").read_text().startswith("<?xml")
    res = run("export-pyramid", sample_jpeg, tmp_path / "b.ome.tif", *region)
    assert res.exit_code == 0, res.output
    with tifffile.TiffFile(tmp_path / "b.ome.tif") as tf:
        assert tf.is_ome
    res = run("export-pyramid", sample_jpeg, tmp_path / "c.bmp", *region)
    assert res.exit_code == 2 and "unknown output extension" in res.output
    res = run("export-pyramid", sample_jpeg, tmp_path / "d.tif", "--format", "dzi", *region)
    assert res.exit_code == 2 and "the extension means tiff" in res.output
    assert not (tmp_path / "c.bmp").exists() and not (tmp_path / "d.tif").exists()


def test_missing_output_folder_names_the_output(sample_jpeg, tmp_path):
    out = tmp_path / "nope" / "x.png"
    res = run("read-region", sample_jpeg, "-s", 8, 8, "-o", out)
    assert res.exit_code == 9
    assert f"{out}: output folder does not exist" in res.output and ".partial" not in res.output


def test_export_of_absurd_declared_size_refused_by_default(tmp_path):
    from helpers import BUG_INPUTS

    path = BUG_INPUTS / "B25_huge_declared_100k_x_100k.tif"
    if not path.exists():
        pytest.skip(f"bug-inputs folder {BUG_INPUTS} is absent")
    res = run("export-pyramid", path, tmp_path / "out.tif", "--quiet")
    assert res.exit_code == 6, res.output
    assert "exceeds the limit" in res.output and "--max-pixels" in res.output
    assert list(tmp_path.iterdir()) == []
    # a region of it is fine
    res = run("export-pyramid", path, tmp_path / "part.tif", "--region", 0, 0, 512, 512, "--quiet")
    assert res.exit_code == 0, res.output


def test_info_hides_identifying_dicom_properties_unless_show_phi():
    """PatientID and the like (DICOM PS3.15 E.1-1) are not printed by ``info`` unless asked."""
    path = shared_sample("dicom-pathml-no-imagetype.dcm")
    with wsitool.open_slide(path) as s:
        secret = s.properties["dicom.PatientID"]
        assert "dicom.PatientID" in s.identifying_properties
    for args in (["info", str(path)], ["info", "--json", str(path)]):
        res = run(*args)
        assert res.exit_code == 0, res.output
        assert secret not in res.output and "PatientID" not in res.output
    assert "hidden: --show-phi" in prose(run("info", str(path)).output)
    shown = run("info", "--json", "--show-phi", str(path))
    assert shown.exit_code == 0 and json.loads(shown.output)["properties"]["dicom.PatientID"] == secret
