"""Usage errors in one line (item 10), ``info`` in 80 columns (item 14), unknown
compressions and the bad-version header (item 15) -- issue 14."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import wsitool
from wsitool.cli import app
from wsitool.errors import UnsupportedFormatError
from wsitool.slide import pyramid_levels

from helpers import REPO, REPO_SAMPLES, shared_sample

JPEG = REPO_SAMPLES / "sample-aperio-jpeg.svs"
runner = CliRunner()


def run(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def one_error_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("wsitool: error: "), output
    assert not any(ch in output for ch in "╭╰│"), output  # no click/rich box
    return lines[0]


# ------------------------------------------------------------------ item 10


@pytest.mark.parametrize("args,words", [
    (["read-region", JPEG, "--location", "256,256", "--size", "64", "64", "-o", "x.png"],
     ["--location", "X Y"]),
    (["read-region", JPEG, "--mode", "bogus", "--size", "64", "64", "-o", "x.png"], ["--mode", "bogus"]),
    (["read-region", JPEG, "--threads", "0", "--size", "64", "64", "-o", "x.png"], ["--threads"]),
    (["stress", JPEG, "--workers", "0"], ["--workers"]),
    (["export-pyramid", JPEG, "out.tiff", "--threads", "0"], ["--threads"]),
    (["info"], ["SLIDE"]),  # the metavariable help shows (issue 26)
    (["export-pyramid", JPEG, ""], ["OUTPUT is empty"]),   # not the current folder (an unset $OUT)
    (["export-many", JPEG, " "], ["OUTPUT_DIR is empty"]),
    (["no-such-command"], ["no-such-command"]),
])
def test_usage_errors_are_one_line_exit_2(args, words, tmp_path):
    res = run(*args)
    assert res.exit_code == 2, res.output
    line = one_error_line(res.output)
    for w in words:
        assert w in line


def test_usage_error_through_the_console_script_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "wsitool.cli", "read-region", str(JPEG), "--location",
                           "256,256", "--size", "64", "64", "-o", "x.png"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2
    one_error_line(proc.stderr)
    assert proc.stdout == ""


def test_location_help_shows_what_is_accepted(tmp_path):
    res = run("read-region", "--help", env={"COLUMNS": "200"})
    assert "<int,int>" not in res.output
    assert "X Y" in res.output and "W H" in res.output
    out = tmp_path / "r.png"
    ok = run("read-region", JPEG, "--location", "256", "256", "--size", "64", "64", "-o", out)
    assert ok.exit_code == 0, ok.output


def test_bare_command_prints_help_exit_2():
    res = run()
    assert res.exit_code == 2 and "Usage" in res.output


# ------------------------------------------------------------------ item 14


def _lines(text: str) -> list[str]:
    return [ln.rstrip("\n") for ln in text.splitlines()]


@pytest.mark.parametrize("name", ["aperio-cmu1-small-region-jpeg.svs",
                                  "aperio-tcga-cr-7395-jp2k-33005-2level.svs",
                                  "generic-bigtiff-zstd-5level-10000x5000.tiff"])
def test_info_fits_80_columns_when_piped(name):
    path = shared_sample(name)
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run([sys.executable, "-m", "wsitool.cli", "info", str(path)], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = _lines(proc.stdout)
    # the slide's path (as long as the clone's) is the one thing allowed past 80 columns
    assert max(len(ln) for ln in lines if str(path) not in ln) <= 80, proc.stdout
    # the level headers are whole, the backend table is behind --backends
    header = next(ln for ln in lines if ln.startswith("level "))
    for word in ("level", "size", "downsample", "tile", "compression", "pixels", "decoder"):
        assert word in header.split(), header
    assert "…" not in proc.stdout
    assert len(lines) <= 20, proc.stdout
    assert "--backends" in proc.stdout and "CPU: nvImageCodec" not in proc.stdout


def test_info_follows_columns_and_backends_option(cmu1):
    wide = run("info", cmu1, "--backends", env={"COLUMNS": "160"})
    assert wide.exit_code == 0
    assert "Decode backends" in wide.output and "libjpeg-turbo" in wide.output
    assert max(len(ln) for ln in _lines(wide.output) if str(cmu1) not in ln) <= 160
    narrow = run("info", cmu1, "--backends", env={"COLUMNS": "80"})
    assert max(len(ln) for ln in _lines(narrow.output) if str(cmu1) not in ln) <= 80
    js = json.loads(run("info", cmu1, "--json").stdout)
    assert js["backends"]  # the JSON keeps everything


# ------------------------------------------------------------------ item 15


def test_unknown_compression_flagged_by_info_and_reads_exit_3(tmp_path):
    path = shared_sample("broken-generic-unknown-compression-52479.tiff")
    res = run("info", path)
    assert res.exit_code == 0
    assert "unsupported" in res.output and "52479" in res.output
    js = json.loads(run("info", path, "--json").stdout)
    assert js["levels"][0]["compression_problem"] == "unsupported compression 52479"
    for extra in ([], ["--on-error", "fill"]):  # never painted over
        out = tmp_path / "x.png"
        rr = run("read-region", path, "--size", "1", "1", "-o", out, *extra)
        assert rr.exit_code == 3, rr.output
        assert "unsupported compression 52479" in one_error_line(rr.output)
        assert not out.exists()
    with wsitool.open_slide(path) as s:
        assert pyramid_levels(s)[0].compression_problem
        with pytest.raises(UnsupportedFormatError, match="unsupported compression 52479"):
            s.read_region((0, 0), 0, (1, 1))


def test_supported_levels_have_no_compression_problem():
    for p in sorted(REPO_SAMPLES.glob("sample-*")):
        with wsitool.open_slide(p) as s:
            assert all(lv.compression_problem is None for lv in pyramid_levels(s))


def test_bad_version_header_is_unsupported_format_as_documented():
    """``II*\\x01``: a byte order mark but version 298, neither TIFF (42) nor BigTIFF
    (43): nothing says it is a TIFF, so it is "not a TIFF" (3), as OpenSlide says;
    a recognised TIFF/BigTIFF signature with a broken header after it is corrupt (4)."""
    bad_version = shared_sample("broken-tiff-bad-version.tif")
    res = run("info", bad_version)
    assert res.exit_code == 3, res.output
    bad_bigtiff = shared_sample("broken-bigtiff-bad-header.tif")
    assert run("info", bad_bigtiff).exit_code == 4
    documented = (REPO / "docs" / "reference" / "errors.md").read_text()
    assert "42" in documented and "43" in documented and "signature" in documented


def test_wrote_line_names_width_height_and_channels(tmp_path):
    out = tmp_path / "r.png"
    res = run("read-region", JPEG, "--size", "96", "32", "-o", out)
    assert res.exit_code == 0, res.output
    assert "width 96, height 32, 4 channels uint8" in res.output


def test_version_option_prints_the_package_version():
    import wsitool
    from wsitool.cli import app

    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"wsitool {wsitool.__version__}"


def test_an_empty_slide_path_is_named_in_its_error():
    """``wsitool info ""`` (an unset shell variable): the error line still says which path."""
    res = run("info", "")
    assert res.exit_code == 9, res.output
    assert "'': No such file or directory" in one_error_line(res.output)


# ------------------------------------------------------------------ issue 47, item 8: any width, any path


@pytest.mark.parametrize("columns", ["40", "80", None])
def test_messages_are_one_line_at_any_width_and_path(tmp_path, columns):
    """A message naming a long path is one line however narrow the terminal ($COLUMNS) or deep
    the folder (a clone at a long path split the phrases tests look for); help keeps option names
    whole below 80 columns."""
    deep = tmp_path.joinpath(*["d" * 60] * 4)
    deep.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns:
        env["COLUMNS"] = columns

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "wsitool.cli", *map(str, args)], capture_output=True,
                              text=True, timeout=120, cwd=REPO, env=env)

    out = deep / "region.png"
    ok = cli("read-region", JPEG, "--size", "8", "8", "-o", out)
    assert ok.returncode == 0, ok.stderr
    assert len(ok.stdout.splitlines()) == 1 and f"wrote {out} (width 8, height 8" in ok.stdout, ok.stdout
    missing = deep / "no-such-slide.svs"
    bad = cli("info", missing)
    assert bad.returncode == 9
    assert bad.stderr.splitlines() == [f"wsitool: error: {missing}: No such file or directory"], bad.stderr
    helped = cli("read-regions", "--help")
    assert "--regions " in helped.stdout and "--output-dir " in helped.stdout and "…" not in helped.stdout


# ------------------------------------------------------------------ issue 47, item 7: huge numbers


@pytest.mark.parametrize("digits", [400, 5000])
@pytest.mark.parametrize("args", [
    ["read-region", JPEG, "-o", "{out}.png", "--size", "8", "8", "--location", "{n}", "0"],
    ["read-region", JPEG, "-o", "{out}.png", "--size", "{n}", "8"],
    ["read-region", JPEG, "-o", "{out}.png", "--size", "8", "8", "--level", "{n}"],
    ["read-region", JPEG, "-o", "{out}.png", "--size", "8", "8", "--threads", "{n}"],
    ["export-pyramid", JPEG, "{out}.tiff", "--region", "0", "0", "{n}", "8"],
    ["export-pyramid", JPEG, "{out}.tiff", "--max-pixels", "{n}"],
    ["export-pyramid", JPEG, "{out}.tiff", "--compression", "jpeg2000", "--psnr", "{n}"],
    ["stress", JPEG, "--workers", "{n}"], ["stress", JPEG, "--iterations", "{n}"],
    ["stress", JPEG, "-n", "1", "--seed", "{n}"], ["stress", JPEG, "-n", "1", "--sample-interval", "{n}"],
], ids=lambda a: "-".join(str(x) for x in a if str(x).startswith("--") or x in ("read-region", "export-pyramid",
                                                                                 "stress")))
def test_a_number_of_hundreds_of_digits_is_one_usage_line(tmp_path, args, digits):
    """A number beyond a 64-bit integer (or a float that is not finite: 400 nines is inf) in any
    option: one usage line, exit 2, not echoing the digits. `stress --workers <400 digits>` exited
    1 ("OverflowError: cannot fit 'int' into an index-sized integer"), `--iterations` with a bare
    OverflowError, `read-region --location` wrote a region and echoed 400 digits."""
    big = "9" * digits
    res = run(*[str(a).format(n=big, out=tmp_path / "o") for a in args])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wsitool: error: ") and len(lines[0]) < 300, res.output
    assert list(tmp_path.iterdir()) == []


def test_a_regions_csv_number_of_thousands_of_digits_is_one_short_line(tmp_path):
    rows = ((f"{'9' * 5000},0,0,8,8", "x"), (f"0,0,{'9' * 400},8,8", "level"), (f"0,0,0,-{'9' * 30},8", "width"))
    for row, col in rows:
        csv = tmp_path / "r.csv"
        csv.write_text("x,y,level,width,height\n" + row + "\n")
        res = run("read-regions", JPEG, "--regions", csv, "--output-dir", tmp_path / "out")
        assert res.exit_code == 5, res.output
        line = one_error_line(res.output)
        assert f"line 2: column {col}" in line and len(line) < 300, line
