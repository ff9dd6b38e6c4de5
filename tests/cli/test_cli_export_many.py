"""``wsitool export-many`` (issue 29): the batch form of ``export-pyramid`` as its own command,
and the old spelling (``export-pyramid`` with several sources, a folder, ``--from-list`` or
``--scheduler``) still working for one release after one deprecation line on stderr."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from wsitool.cli import app
from wsitool.cli.export import DEPRECATED_BATCH

from helpers import shared_sample

runner = CliRunner()

CMU1 = "aperio-cmu1-small-region-jpeg.svs"
#: a small region keeps each export to a few tiles
FAST = ["--scheduler", "sequential", "--quiet", "--compression", "deflate", "--region", "0", "0", "256", "256"]


@pytest.fixture
def two_slides(tmp_path: Path) -> list[Path]:
    """Two names (links in tmp_path) for the shared CMU-1 region, so that their outputs differ."""
    src = shared_sample(CMU1)
    links = []
    for name in ("a.svs", "b.svs"):
        link = tmp_path / name
        link.symlink_to(src)
        links.append(link)
    return links


def _warnings(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "warning" in ln]


def test_export_many_exports_each_slide_into_the_folder_and_resumes(two_slides, tmp_path):
    out = tmp_path / "out"
    res = runner.invoke(app, ["export-many", *map(str, two_slides), str(out), *FAST])
    assert res.exit_code == 0, res.output
    assert "2 exported, 0 skipped, 0 failed of 2 slide(s)" in " ".join(res.stdout.split())
    assert DEPRECATED_BATCH not in res.output
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["a.tiff", "b.tiff"]
    again = runner.invoke(app, ["export-many", *map(str, two_slides), str(out), *FAST])
    assert again.exit_code == 0, again.output
    assert "0 exported, 2 skipped, 0 failed" in " ".join(again.stdout.split())


def test_export_many_one_slide_is_still_a_batch(two_slides, tmp_path):
    out = tmp_path / "new-folder"
    res = runner.invoke(app, ["export-many", str(two_slides[0]), str(out), *FAST, "--format", "ome-tiff"])
    assert res.exit_code == 0, res.output
    assert (out / "a.ome.tiff").is_file()
    assert not _warnings(res.stderr)


def test_export_many_from_list_only(two_slides, tmp_path):
    listing = tmp_path / "list.txt"
    listing.write_text("a.svs\n# a comment\nb.svs\n")
    out = tmp_path / "out"
    res = runner.invoke(app, ["export-many", str(out), "--from-list", str(listing), *FAST])
    assert res.exit_code == 0, res.output
    assert (out / "a.tiff").is_file() and (out / "b.tiff").is_file()


@pytest.mark.parametrize(("args", "message"), [
    (["--format", "png"], "--format must be one of tiff, ome-tiff, dzi"),
    (["--compression", "lzw"], "--compression must be one of"),
    (["--verify"], "--verify applies to --compression copy only"),
    (["--psnr", "40"], "--psnr applies to --compression jpeg2000, not deflate"),
])
def test_export_many_usage_errors_exit_2(two_slides, tmp_path, args, message):
    res = runner.invoke(app, ["export-many", str(two_slides[0]), str(tmp_path / "out"), *FAST, *args])
    assert res.exit_code == 2, res.output
    assert message in res.stderr
    assert not (tmp_path / "out").exists()


def test_export_many_without_sources_is_a_usage_error(tmp_path):
    res = runner.invoke(app, ["export-many", str(tmp_path / "out"), "--quiet"])
    assert res.exit_code == 2, res.output
    assert "no input slides" in res.stderr


def test_export_many_option_refused_by_the_api_fails_each_slide_with_exit_2(two_slides, tmp_path):
    """--tile-size 17 passes the CLI and is refused by ExportOptions (InvalidOptionError, a usage
    error): each slide fails, the exit status is 2 as it was for the bare ValueError."""
    out = tmp_path / "out"
    res = runner.invoke(app, ["export-many", *map(str, two_slides), str(out), *FAST, "--tile-size", "17"])
    assert res.exit_code == 2, res.output
    assert "0 exported, 0 skipped, 2 failed" in " ".join(res.stdout.split())
    assert "tile_size must be a positive multiple of 16" in res.stderr


def test_export_pyramid_batch_form_warns_once_and_still_exports(two_slides, tmp_path):
    out = tmp_path / "old"
    res = runner.invoke(app, ["export-pyramid", *map(str, two_slides), str(out), *FAST])
    assert res.exit_code == 0, res.output
    assert _warnings(res.stderr) == [f"wsitool: warning: {DEPRECATED_BATCH}"]
    assert "2 exported, 0 skipped, 0 failed" in " ".join(res.stdout.split())
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["a.tiff", "b.tiff"]


def test_export_pyramid_into_an_existing_folder_is_the_deprecated_batch(two_slides, tmp_path):
    out = tmp_path / "folder"
    out.mkdir()
    res = runner.invoke(app, ["export-pyramid", str(two_slides[0]), str(out), *FAST])
    assert res.exit_code == 0, res.output
    assert res.stderr.count(DEPRECATED_BATCH) == 1
    assert (out / "a.tiff").is_file()


def test_export_pyramid_one_slide_does_not_warn(two_slides, tmp_path):
    res = runner.invoke(app, ["export-pyramid", str(two_slides[0]), str(tmp_path / "one.svs"),
                              "--quiet", "--compression", "deflate", "--region", "0", "0", "256", "256"])
    assert res.exit_code == 0, res.output
    assert DEPRECATED_BATCH not in res.output
    assert (tmp_path / "one.svs").is_file()


def test_export_pyramid_option_refused_by_the_api_names_the_slide(two_slides, tmp_path):
    """The API's InvalidOptionError keeps the single-slide form's line: the slide, the message, exit 2."""
    res = runner.invoke(app, ["export-pyramid", str(two_slides[0]), str(tmp_path / "one.svs"),
                              "--quiet", "--tile-size", "17"])
    assert res.exit_code == 2, res.output
    assert f"{two_slides[0]}: tile_size must be a positive multiple of 16" in " ".join(res.stderr.split())
    assert not (tmp_path / "one.svs").exists()
