"""CLI: each error class of the bug inputs maps to one clear line and its documented exit code."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from typer.testing import CliRunner

import wsitool
from wsitool import errors
from wsitool.cli import EXIT_CODES, app, exit_code_for

from helpers import BUG_INPUTS, NO_BUGS, SHARED_SAMPLES

runner = CliRunner()


@pytest.fixture(autouse=True)
def _restore_limits():
    before = wsitool.get_limits()  # --max-pixels changes the process-wide limits
    yield
    wsitool.set_limits(max_region_pixels=before.max_region_pixels,
                       max_region_bytes=before.max_region_bytes,
                       max_tile_pixels=before.max_tile_pixels)


def _path(folder, name):
    p = folder / name
    if not p.exists():
        pytest.skip(f"{NO_BUGS} (needs {name})")
    return p


def _read(path, out, *args):
    return runner.invoke(app, ["read-region", str(path), "-o", str(out), *map(str, args)])


def _one_error_line(result, *needles):
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("wsitool: error:")
    assert "Traceback" not in result.output
    for n in needles:
        assert n in lines[0], lines[0]


def test_exit_codes_are_distinct_per_class():
    classes = [errors.UnsupportedFormatError, errors.CorruptFileError, errors.InvalidRegionError,
               errors.ResourceLimitError, errors.TileDecodeError, errors.DeviceUnavailableError]
    codes = [exit_code_for(c.__new__(c)) for c in classes]
    assert len(set(codes)) == len(codes) and 0 not in codes and 1 not in codes and 2 not in codes
    assert dict(EXIT_CODES)[errors.ResourceLimitError] == 6
    assert dict(EXIT_CODES)[errors.TileDecodeError] == 7


def test_sof_bomb_tile_exit_7(tmp_path):
    path = _path(BUG_INPUTS, "B26_jpeg_sof_declares_8000x8000.tif")
    out = tmp_path / "r.png"
    res = _read(path, out, "--location", 300, 300, "--size", 150, 150)
    assert res.exit_code == 7, res.output
    _one_error_line(res, str(path), "level 0", "col 1", "row 1", "8000x8000")
    assert not out.exists() and list(tmp_path.iterdir()) == []  # nothing half-written


def test_sof_bomb_tile_fill_policy_exit_0(tmp_path):
    path = _path(BUG_INPUTS, "B26_jpeg_sof_declares_8000x8000.tif")
    out = tmp_path / "r.npy"
    res = _read(path, out, "--location", 200, 200, "--size", 150, 150, "--on-error", "fill")
    assert res.exit_code == 0, res.output
    warn = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert warn[0].startswith("wsitool: warning:") and "col 1, row 1" in warn[0]
    assert warn[-1] == "wsitool: warning: 1 bad tile(s) filled with transparent background"
    arr = np.load(out)
    assert arr.shape == (150, 150, 4)
    assert (arr[:56, :56, 3] == 255).all() and (arr[56:, 56:, 3] == 0).all()


def test_huge_region_exit_6(tmp_path):
    path = _path(BUG_INPUTS, "B25_huge_declared_100k_x_100k.tif")
    out = tmp_path / "r.png"
    res = _read(path, out, "--size", 100000, 100000)
    assert res.exit_code == 6, res.output
    _one_error_line(res, str(path), "100000x100000", "max_region_pixels")
    assert not out.exists()


def test_max_pixels_option(tmp_path):
    path = _path(BUG_INPUTS, "B25_huge_declared_100k_x_100k.tif")
    res = _read(path, tmp_path / "a.png", "--location", 512, 512, "--size", 128, 128,
                "--max-pixels", 128 * 127)
    assert res.exit_code == 6
    _one_error_line(res, "max_region_pixels")
    res = _read(path, tmp_path / "b.png", "--location", 512, 512, "--size", 128, 128,
                "--max-pixels", 128 * 128)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "b.png").exists()


def test_corrupt_tile_exit_7_names_tile(tmp_path):
    path = _path(BUG_INPUTS, "B04_corrupt_tiles_level1.tif")
    res = _read(path, tmp_path / "r.png", "--location", 600, 0, "--level", 1, "--size", 100, 100)
    assert res.exit_code == 7
    _one_error_line(res, "level 1", "col 1", "row 0")


def test_level_out_of_range_exit_5(tmp_path):
    path = _path(BUG_INPUTS, "B05_out_of_bounds.tif")
    res = _read(path, tmp_path / "r.png", "--level", 9, "--size", 10, 10)
    assert res.exit_code == 5
    _one_error_line(res, "level 9 out of range")


def test_cmyk_rgb_ok_and_unconvertible_exit_3(tmp_path):
    import tifffile

    path = tmp_path / "inks.tif"
    tifffile.imwrite(path, np.zeros((32, 32, 4), np.uint8), photometric="separated",
                     extratags=[(332, "H", 1, 2, True)])
    res = _read(path, tmp_path / "r.png", "--size", 8, 8)
    assert res.exit_code == 3
    _one_error_line(res, "InkSet 2", "mode='raw'")
    res = _read(path, tmp_path / "r.npy", "--size", 8, 8, "--mode", "raw")
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("name, code", [
    ("broken-not-a-tiff-random-ascii.svs", 3),
    ("broken-zero-height.tif", 4),
])
def test_broken_files_exit_codes(tmp_path, name, code):
    path = SHARED_SAMPLES / name
    if not path.exists():
        pytest.skip(f"{SHARED_SAMPLES} lacks {name}")
    res = runner.invoke(app, ["info", str(path)])
    assert res.exit_code == code
    _one_error_line(res, str(path))


def test_truncated_structure_is_one_warning_line_not_a_library_log(sample_jpeg, tmp_path, capsys,
                                                                   monkeypatch):
    """A file cut inside its IFD chain opens with the levels that could be read; what
    tifffile reports comes out once, as a SlideWarning naming the file (and in the
    CLI as one ``wsitool: warning:`` line), not as tifffile's own log line."""
    import warnings

    import wsitool
    from wsitool import cli

    cut = tmp_path / "cut.svs"
    cut.write_bytes(sample_jpeg.read_bytes()[:20000])
    with (pytest.warns(wsitool.SlideWarning, match="invalid page offset") as caught,
          wsitool.open_slide(cut) as slide):
        assert slide.level_count >= 1
        assert slide.problems and "invalid page offset" in slide.problems[0]
    assert str(cut) in str(caught[0].message)
    assert "tifffile" not in capsys.readouterr().err

    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main() replaces it
    with pytest.raises(SystemExit) as done:
        cli.main(["info", str(cut)])
    assert done.value.code == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("wsitool: warning:") and str(cut) in err[0]


@pytest.mark.parametrize("level", [logging.NOTSET, logging.DEBUG, logging.CRITICAL])
def test_opening_leaves_the_tifffile_logger_as_the_application_set_it(sample_jpeg, tmp_path,
                                                                      level):
    """The capture of tifffile's messages during open is temporary: level, propagation
    and handlers of the "tifffile" logger are as before, and debug records are not
    turned into warnings; the problem is reported whatever the application's level."""
    import wsitool

    cut = tmp_path / "cut.svs"
    cut.write_bytes(sample_jpeg.read_bytes()[:20000])
    logger = logging.getLogger("tifffile")
    saved = (logger.level, logger.propagate, list(logger.handlers))
    logger.setLevel(level)
    try:
        with pytest.warns(wsitool.SlideWarning) as caught:
            wsitool.open_slide(cut).close()
        assert len(caught) == 1 and "invalid page offset" in str(caught[0].message)
        assert (logger.level, logger.propagate, logger.handlers) == (level, saved[1], saved[2])
    finally:
        logger.setLevel(saved[0])


# ------------------------------------------------------------------ issue 47, item 7: FIFOs, secrets, numbers

import os  # noqa: E402
import queue  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

from helpers import REPO, REPO_SAMPLES  # noqa: E402

#: Seconds a command may take on a FIFO (it hung for good: opening a FIFO waits for a writer).
FIFO_WAIT = 60


def _cli(*args, timeout: float = FIFO_WAIT) -> subprocess.CompletedProcess:
    """``wsitool ARGS`` in a child; a hang fails the test (TimeoutExpired) instead of blocking it."""
    return subprocess.run([sys.executable, "-m", "wsitool.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


@pytest.fixture
def fifo(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    path = tmp_path / "pipe.svs"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("command", [["info", "{p}"], ["read-region", "{p}", "--size", "8", "8", "-o", "{o}"],
                                     ["export-pyramid", "{p}", "{o}.tiff"], ["info", "--json", "{p}"]])
def test_a_fifo_is_refused_at_once_exit_3(fifo, tmp_path, command):
    """`info`, `read-region` and `export-pyramid` of a FIFO waited for a writer forever, silent;
    now one line naming it and what it is, exit 3 (as /dev/zero), nothing written."""
    args = [a.format(p=fifo, o=tmp_path / "out.png") for a in command]
    proc = _cli(*args)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.splitlines() == [f"wsitool: error: {fifo}: not a slide wsitool reads "
                                        "(a FIFO, not a regular file)"], proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.svs"]


def test_a_fifo_in_a_dicom_folder_is_passed_over(tmp_path):
    series = SHARED_SAMPLES / "dicom-openslide-boxes"
    if not series.is_dir():
        pytest.skip(f"real slides folder {SHARED_SAMPLES} is absent (needs dicom-openslide-boxes)")
    folder = tmp_path / "series"
    shutil.copytree(series, folder)
    os.mkfifo(folder / "zz.dcm")
    proc = _cli("info", folder)
    assert proc.returncode == 0, proc.stderr
    proc = _cli("info", folder / "zz.dcm")
    assert proc.returncode == 3 and "a FIFO" in proc.stderr, proc.stderr
    with pytest.raises(errors.UnsupportedFormatError, match="a FIFO"):
        wsitool.open_slide(folder / "zz.dcm")


def test_serve_skips_a_fifo_with_its_warning(tmp_path):
    """`serve` of a folder holding a FIFO hung at start-up; now the FIFO is not served (its
    warning line) and the rest is."""
    folder = tmp_path / "served"
    folder.mkdir()
    shutil.copy(REPO_SAMPLES / "sample-aperio-jpeg.svs", folder / "a.svs")
    os.mkfifo(folder / "b.svs")
    proc = subprocess.Popen([sys.executable, "-m", "wsitool.cli", "serve", str(folder), "--port", "0",
                             "--threads", "1", "--cache-mb", "0"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stderr], daemon=True).start()
    seen = []
    try:
        while not any("serving 1 slide(s)" in ln for ln in seen):
            seen.append(lines.get(timeout=FIFO_WAIT))  # queue.Empty: it hung (or said nothing)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    warning = [ln for ln in seen if "not served" in ln]
    assert len(warning) == 1 and f"{folder / 'b.svs'}: not a slide wsitool reads (a FIFO" in warning[0], seen


@pytest.mark.parametrize("url", ["ftp://user:PW@host/x.svs", "sftp://user:PW@host/x.svs?token=TOKEN",
                                 "https://user:PW@127.0.0.1:1/x.svs?X-Amz-Signature=TOKEN"])
@pytest.mark.parametrize("command", ["info", "read-region", "export-pyramid", "serve", "stress"])
def test_no_message_shows_a_urls_password_or_query(url, command, tmp_path):
    """`wsitool info ftp://user:PW@host/x.svs` printed the password: only the URLs wsitool reads
    were redacted (and a path made of the argument shows it as ftp:/user:PW@...)."""
    more = {"read-region": ["--size", "1", "1", "-o", tmp_path / "o.png"], "export-pyramid": [tmp_path / "o.tiff"],
            "serve": ["--port", "0"], "stress": ["-n", "1"]}.get(command, [])
    proc = _cli(command, url, *more, "--storage-option", "retries=0") if url.startswith("https") else \
        _cli(command, url, *more)
    assert proc.returncode not in (0, 1), proc.stderr
    assert "PW" not in proc.stderr + proc.stdout and "TOKEN" not in proc.stderr + proc.stdout, proc.stderr
    assert "***@" in proc.stderr, proc.stderr
