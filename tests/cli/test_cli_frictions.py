"""The command-line frictions a new user hit (issue 26, items 4 to 8).

The commands run as a user runs them: ``python -m wsitool.cli`` in a
subprocess writing to a pipe (so the output is laid out as in a pipe, with
``COLUMNS`` as given), or typer's runner where only the text matters.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import imagecodecs
import numpy as np
import pytest

import wsitool
from wsitool.slide import pyramid_levels

from helpers import REPO, SHARED_SAMPLES, shared_sample


def cli(*args, columns: int = 80, cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS=str(columns))
    return subprocess.run([sys.executable, "-m", "wsitool.cli", *map(str, args)],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


# ---------------------------------------------------------------- 4: sources first, CLI words


def test_swapped_arguments_name_the_missing_source_not_the_existing_output(tmp_path):
    slide = shared_sample("aperio-openslide-small-16px.svs")
    proc = cli("export-pyramid", tmp_path / "e1.svs", slide)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 9 and len(lines) == 1, proc.stderr
    assert "e1.svs: source slide not found" in lines[0]
    assert "already exists" not in proc.stderr


def test_swapped_arguments_with_both_existing_never_suggest_replacing_the_slide(tmp_path):
    """The trial's case: `export-pyramid OTHER.svs MINE.svs`, both slides: the old message said to add
    --overwrite, which replaced the user's slide."""
    import shutil

    mine = tmp_path / "mine.svs"
    shutil.copy(REPO / "samples" / "sample-aperio-jpeg.svs", mine)
    before = mine.read_bytes()
    proc = cli("export-pyramid", REPO / "samples" / "sample-aperio-j2k.svs", mine)
    assert proc.returncode == 9 and "is a slide" in proc.stderr and "swapped" in proc.stderr, proc.stderr
    assert mine.read_bytes() == before


def test_existing_output_says_the_cli_option_only(tmp_path):
    slide = shared_sample("aperio-openslide-small-16px.svs")
    out = tmp_path / "out.svs"
    out.write_bytes(b"keep")
    proc = cli("export-pyramid", slide, out)
    assert proc.returncode == 9
    assert "--overwrite" in proc.stderr and "overwrite=True" not in proc.stderr
    with pytest.raises(FileExistsError, match=r"overwrite=True") as info:
        wsitool.export_pyramid(slide, out)
    assert "--overwrite" not in str(info.value)  # Python errors use Python words


# ---------------------------------------------------------------- 5: JPEG and WebP patches


@pytest.mark.parametrize("ext", [".jpg", ".jpeg", ".webp"])
def test_read_region_writes_jpeg_and_webp(tmp_path, ext):
    slide = shared_sample("aperio-cmu1-small-region-jpeg.svs")
    out = tmp_path / f"patch{ext}"
    proc = cli("read-region", slide, "--location", 500, 600, "--size", 224, 224, "-o", out,
               "--quality", 95)
    assert proc.returncode == 0, proc.stderr
    got = imagecodecs.imread(out.read_bytes())
    assert got.shape[:2] == (224, 224)
    with wsitool.open_slide(slide) as s:
        ref = s.read_region((500, 600), 0, (224, 224), mode="rgb")
    mse = np.mean((got[..., :3].astype(float) - ref.astype(float)) ** 2)
    assert 10 * np.log10(255**2 / max(mse, 1e-9)) > 30


def test_jpeg_of_16_bit_samples_is_refused_with_one_line(tmp_path):
    from wsitool.export import write_image

    with pytest.raises(ValueError, match="8-bit"):
        write_image(tmp_path / "x.jpg", np.zeros((4, 4, 3), np.uint16))
    assert not (tmp_path / "x.jpg").exists()


# ---------------------------------------------------------------- 6: a folder of mixed slides


def test_info_on_a_folder_of_mixed_slides_is_brief():
    if not SHARED_SAMPLES.is_dir():
        pytest.skip(f"{SHARED_SAMPLES} absent")
    proc = cli("info", SHARED_SAMPLES)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 3 and len(lines) == 1
    assert len(lines[0].replace(str(SHARED_SAMPLES), "")) <= 300, lines[0]  # wherever the clone is
    assert "DICOM series" in lines[0] and "give one slide file" in lines[0]
    assert not re.search(r"\d+\.\d+\.\d+\.\d+\.\d+", lines[0])  # no Series UIDs


# ---------------------------------------------------------------- 7: 80 columns, the real decoder


@pytest.mark.parametrize("name", ["aperio-tcga-cr-7395-jp2k-33005-2level.svs",
                                  "aperio-cmu1-small-region-jpeg.svs",
                                  "generic-bigtiff-zstd-5level-10000x5000.tiff"])
def test_info_fits_80_columns_without_breaking_a_value(name):
    slide = shared_sample(name)
    proc = cli("info", slide, cwd=slide.parent)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # the path of the slide is the only thing allowed past 80 columns
    assert all(len(line) <= 80 for line in lines if name not in line), proc.stdout
    assert not [line for line in lines if line != line.rstrip()], "trailing spaces"
    with wsitool.open_slide(slide) as s:
        for lv in pyramid_levels(s):  # every value of the levels table whole on one line
            row = next((line for line in lines if line.split()[:2] == [str(lv.index), f"{lv.width}x{lv.height}"]),
                       None)
            assert row is not None and lv.compression in row, proc.stdout
    if s.mpp_x:
        assert re.search(r"MPP \S+ x \S+ µm/px", proc.stdout)
    else:
        assert "MPP unknown" in proc.stdout


def test_info_names_libjpeg_turbo_for_jpeg_levels():
    """JPEG levels decoded through libjpeg-turbo's API (the compiled extension) say so; with
    nvImageCodec doing it (no extension) they say nvimagecodec."""
    from wsitool.codec import jpegloop

    proc = cli("info", REPO / "samples" / "sample-aperio-jpeg.svs", "--json")
    import json
    want = "libjpeg-turbo" if jpegloop._load() is not None else "nvimagecodec"
    assert [lv["decoder"] for lv in json.loads(proc.stdout)["levels"]] == [want] * 3


def test_info_names_openjpeg_for_jpeg2000_levels():
    slide = shared_sample("aperio-tcga-cr-7395-jp2k-33005-2level.svs")
    from wsitool.codec import openjpeg
    if not openjpeg.available():
        pytest.skip("no libopenjp2: J2K tiles take nvImageCodec")
    proc = cli("info", slide, "--json")
    import json
    assert [lv["decoder"] for lv in json.loads(proc.stdout)["levels"]] == ["openjpeg", "openjpeg"]
    proc = cli("info", slide)
    assert "openjpeg" in proc.stdout and "nvimagecodec" not in proc.stdout


def test_stress_summary_to_a_pipe_fits_80_columns(tmp_path):
    slide = shared_sample("aperio-cmu1-small-region-jpeg.svs")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run([sys.executable, "-m", "wsitool.cli", "stress", str(slide), "-w", "2",
                           "-n", "40", "--region-size", "64"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.stdout.strip(), proc.stderr
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80, proc.stdout


# ---------------------------------------------------------------- 8: metavariables in help


@pytest.mark.parametrize("command", ["info", "read-region", "export-pyramid", "stress", "serve"])
def test_help_shows_metavariables_not_type_labels(command):
    proc = cli(command, "--help", columns=120)
    assert proc.returncode == 0
    usage = next(line for line in proc.stdout.splitlines() if "Usage:" in line)
    labels = re.findall(r"<(?:bool|int|float|str|path|file|list\[\w+\])(?: range)?>",
                                                  proc.stdout) + re.findall(r"\{[a-z_]+\}", usage)
    assert not labels, labels
    assert re.search(r"Usage: wsitool \S+ \[OPTIONS\] .*[A-Z]", proc.stdout)
