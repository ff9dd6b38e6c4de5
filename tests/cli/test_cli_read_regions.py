"""CLI: ``read-regions`` (many regions from a CSV) and its deprecated spelling ``read-region --regions``.

Both spellings run the same job: the same files, the same bytes, the same exit codes; the old one prints
one deprecation line to stderr first.  ``read-region`` without ``--regions`` (one region) is unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import wsitool
from wsitool.cli import app
from wsitool.cli.read import DEPRECATED_REGIONS

from helpers import REPO_SAMPLES

SAMPLE = REPO_SAMPLES / "sample-aperio-jpeg.svs"
CSV = "x,y,level,width,height,name\n0,0,0,64,48,first\n100,50,1,32,32,\n-20,-30,2,40,40,corner\n"

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def regions_csv(tmp_path):
    f = tmp_path / "regions.csv"
    f.write_text(CSV)
    return f


def _expected(name_to_region: dict[str, tuple[int, int, int, int, int]]) -> dict[str, np.ndarray]:
    with wsitool.open_slide(SAMPLE) as s:
        return {n: s.read_region((x, y), lv, (w, h), mode="rgba") for n, (x, y, lv, w, h) in name_to_region.items()}


REGIONS = {"first": (0, 0, 0, 64, 48), "000002_x100_y50_L1_32x32": (100, 50, 1, 32, 32),
           "corner": (-20, -30, 2, 40, 40)}


@pytest.mark.parametrize("spelling", [["read-regions"], ["read-region"]], ids=["read-regions", "read-region"])
def test_both_spellings_write_the_same_regions(tmp_path, regions_csv, spelling):
    out = tmp_path / "out"
    res = run(*spelling, SAMPLE, "--regions", regions_csv, "--output-dir", out, "--format", "npy", "--quiet")
    assert res.exit_code == 0, res.output
    assert f"wrote 3 of 3 region(s) from {SAMPLE}" in res.stdout
    for name, arr in _expected(REGIONS).items():
        np.testing.assert_array_equal(np.load(out / f"{name}.npy"), arr)
    deprecated = [line for line in res.stderr.splitlines() if "deprecated" in line]
    if spelling == ["read-region"]:
        assert deprecated == [f"wsitool: warning: {DEPRECATED_REGIONS}"]
        assert DEPRECATED_REGIONS == "read-region --regions is deprecated; use read-regions"
    else:
        assert deprecated == []


@pytest.mark.parametrize("spelling", [["read-regions"], ["read-region"]], ids=["read-regions", "read-region"])
def test_both_spellings_pack_and_refuse_existing_outputs(tmp_path, regions_csv, spelling):
    out = tmp_path / "out"
    args = [*spelling, SAMPLE, "--regions", regions_csv, "--output-dir", out, "--pack", "--quiet"]
    res = run(*args)
    assert res.exit_code == 0, res.output
    store = out / "sample-aperio-jpeg-regions.npz"
    with np.load(store) as z:
        for name, arr in _expected(REGIONS).items():
            np.testing.assert_array_equal(z[name], arr)
    again = run(*args)   # an existing output: exit 9 before anything is read
    assert again.exit_code == 9, again.output
    assert run(*args, "--overwrite").exit_code == 0


@pytest.mark.parametrize("spelling", [["read-regions"], ["read-region"]], ids=["read-regions", "read-region"])
@pytest.mark.parametrize("extra,words", [
    (["--format", "jpg"], "format must be one of"),
    (["--scheduler", "bogus"], "unknown scheduler 'bogus'"),
    (["--scheduler", "local", "--threads", "2"], "--threads applies to the local thread pool"),
    (["--max-pixels", "0"], "--max-pixels must be positive"),
], ids=["format", "scheduler", "threads-on-dask", "max-pixels"])
def test_both_spellings_bad_options_are_usage_errors(tmp_path, regions_csv, spelling, extra, words):
    res = run(*spelling, SAMPLE, "--regions", regions_csv, "--output-dir", tmp_path / "out", *extra)
    assert res.exit_code == 2, res.output
    assert words in res.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_region_over_the_limit_refuses_the_batch_before_reading(tmp_path):
    f = tmp_path / "r.csv"
    f.write_text("x,y,level,width,height,name\n0,0,0,8,8,ok\n0,0,0,60000,60000,huge\n")
    res = run("read-regions", SAMPLE, "--regions", f, "--output-dir", tmp_path / "out", "--max-pixels", "10000",
              "--quiet")
    assert res.exit_code == 6, res.output   # ResourceLimitError, checked for every region first
    assert "exceeds the max_region_pixels limit 10000" in res.stderr and "(region 'huge', #2)" in res.stderr
    assert not (tmp_path / "out" / "ok.png").exists()


def test_read_regions_needs_its_csv_and_folder(tmp_path, regions_csv):
    res = run("read-regions", SAMPLE, "--output-dir", tmp_path / "out")
    assert res.exit_code == 2 and "--regions" in res.stderr
    res = run("read-regions", SAMPLE, "--regions", regions_csv)
    assert res.exit_code == 2 and "--output-dir" in res.stderr
    # the options of one region are not options of read-regions
    for extra in (["--size", "3", "3"], ["--device", "cuda"], ["--output", tmp_path / "a.png"]):
        res = run("read-regions", SAMPLE, "--regions", regions_csv, "--output-dir", tmp_path / "out", *extra)
        assert res.exit_code == 2, (extra, res.output)
        assert "No such option" in res.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra,words", [
    (["--size", "3", "3"], "--size cannot be combined with --regions"),
    (["--location", "1", "2", "--level", "0"], "--location, --level cannot be combined with --regions"),
    (["--device", "cuda"], "--regions reads on the CPU only"),
], ids=["size", "location-level", "device"])
def test_old_spelling_keeps_its_cross_option_checks(tmp_path, regions_csv, extra, words):
    res = run("read-region", SAMPLE, "--regions", regions_csv, "--output-dir", tmp_path / "out", *extra)
    assert res.exit_code == 2, res.output
    lines = res.stderr.splitlines()
    assert lines[0] == f"wsitool: warning: {DEPRECATED_REGIONS}"
    assert words in lines[1] and len(lines) == 2
    res = run("read-region", SAMPLE, "--regions", regions_csv)
    assert res.exit_code == 2 and "--regions needs --output-dir DIR" in res.stderr


@pytest.mark.parametrize("extra,words", [
    (["--output-dir", "d"], "--output-dir need(s) --regions FILE.csv: use read-regions"),
    (["--pack", "--format", "npz"], "--format, --pack need(s) --regions FILE.csv"),
    ([], "missing --size and --output (or read many regions with read-regions)"),
], ids=["output-dir", "pack", "missing"])
def test_one_region_refuses_batch_options(tmp_path, extra, words):
    res = run("read-region", SAMPLE, *extra)
    assert res.exit_code == 2, res.output
    assert words in res.stderr and "deprecated" not in res.stderr


def test_one_region_unchanged(tmp_path):
    out = tmp_path / "a.npy"
    res = run("read-region", SAMPLE, "--location", 100, 50, "--level", 1, "--size", 5, 4, "-o", out)
    assert res.exit_code == 0, res.output
    assert res.stderr == ""
    assert "(width 5, height 4, 4 channels uint8)" in res.stdout and "level 1 at (100, 50)" in res.stdout
    with wsitool.open_slide(SAMPLE) as s:
        np.testing.assert_array_equal(np.load(out), s.read_region((100, 50), 1, (5, 4)))


def test_help_of_both_commands():
    res = run("read-regions", "--help")
    assert res.exit_code == 0
    assert "--regions" in res.stdout and "--device" not in res.stdout and "--location" not in res.stdout
    res = run("read-region", "--help")
    assert res.exit_code == 0 and "use read-regions" in res.stdout
