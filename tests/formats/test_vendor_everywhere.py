"""The vendor-layout fixtures go everywhere a slide goes: the CLI's ``info`` and ``read-region``,
``read_patches``, the TIFF export, the Deep Zoom server (against OpenSlide's DeepZoomGenerator)
and ``stress``.

The format tests (test_philips.py, test_ventana.py, ...) compare each fixture's reads with
OpenSlide; these check that the layers above the format take the new vendors as they take
Aperio: each assertion here compares one path with another read of the same slide.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

import wsitool
from wsitool.cli import app

#: the fixtures, by maker: scripts/make_vendor_samples.py's (the ``made`` fixture) and
#: scripts/make_mirax_samples.py's (``mirax_made``)
VENDOR_FIXTURES = ["philips_multilevel", "philips_sparse", "ventana_bif", "ventana_overlap", "leica_brightfield",
                   "leica_two_main", "leica_offgrid", "leica_overlap", "mirax_vimslide", "mirax_stitching"]


@pytest.fixture
def fixture_path(request):
    """``fixture_path(name)``: the path of the fixture the maker ``name`` wrote."""
    def find(name: str):
        made = request.getfixturevalue("mirax_made" if name.startswith("mirax_") else "made")
        return made[name]
    return find


def _cli(*args: str):
    result = CliRunner().invoke(app, list(args))
    return result


@pytest.mark.parametrize("name", VENDOR_FIXTURES)
def test_info_names_the_vendor_and_levels(fixture_path, name):
    path = fixture_path(name)
    result = _cli("info", str(path), "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    with wsitool.open_slide(path) as slide:
        assert info["vendor"] == slide.vendor
        assert slide.vendor in name
        assert [lv["width"] for lv in info["levels"]] == [lv.width for lv in slide.levels]


@pytest.mark.parametrize("name", VENDOR_FIXTURES)
def test_read_region_cli_and_read_patches_equal_the_library_read(fixture_path, name, tmp_path):
    path = fixture_path(name)
    out = tmp_path / "region.png"
    with wsitool.open_slide(path) as slide:
        level = slide.level_count - 1
        lw, lh = slide.level_dimensions[level]
        ds = slide.level_downsamples[level]
        size = (min(96, lw), min(80, lh))
        loc = (int(lw // 3 * ds), int(lh // 4 * ds))
        want = slide.read_region(loc, level, size, mode="rgba")
        result = _cli("read-region", str(path), "--location", str(loc[0]), str(loc[1]), "--level", str(level),
                      "--size", str(size[0]), str(size[1]), "--output", str(out))
        assert result.exit_code == 0, result.output
        got = np.asarray(Image.open(out).convert("RGBA"))
        assert np.array_equal(got, want)
        locs = [(0, 0), loc, (int(slide.dimensions[0] * 0.6), int(slide.dimensions[1] * 0.5))]
        patches = np.concatenate(list(slide.read_patches(locs, (64, 48), level=0, batch_size=2)))
        assert patches.shape == (3, 48, 64, 3)
        for k, xy in enumerate(locs):
            assert np.array_equal(patches[k], slide.read_region(xy, 0, (64, 48), mode="rgb"))


def _on_white(rgba: np.ndarray) -> np.ndarray:
    """``(h, w, 4)`` uint8 with alpha 0 or 255 -> ``(h, w, 3)``, white where transparent (the
    export's default background)."""
    assert set(np.unique(rgba[..., 3])) <= {0, 255}
    return np.where(rgba[..., 3:] == 0, 255, rgba[..., :3]).astype(np.uint8)


@pytest.mark.parametrize("name", VENDOR_FIXTURES)
def test_tiff_export_reads_back_as_the_source(fixture_path, name, tmp_path):
    path = fixture_path(name)
    out = tmp_path / "out.tiff"
    result = _cli("export-pyramid", str(path), str(out), "--compression", "deflate", "--quiet", "--threads", "2")
    assert result.exit_code == 0, result.output
    with wsitool.open_slide(path) as src, wsitool.open_slide(out) as dst:
        assert dst.dimensions == src.dimensions
        w, h = src.dimensions
        for xy in [(0, 0), (w // 3, h // 2), (max(0, w - 200), max(0, h - 150))]:
            a = _on_white(src.read_region(xy, 0, (200, 150)))
            b = _on_white(dst.read_region(xy, 0, (200, 150)))
            assert np.array_equal(a, b), xy


@pytest.mark.parametrize("name", VENDOR_FIXTURES)
def test_deep_zoom_tiles_equal_openslides_generator(fixture_path, name, serve_slides):
    httpx = pytest.importorskip("httpx")
    openslide = pytest.importorskip("openslide")
    from openslide.deepzoom import DeepZoomGenerator

    path = fixture_path(name)
    with openslide.OpenSlide(str(path)) as osr:
        gen = DeepZoomGenerator(osr)
        with (
            serve_slides([path], threads=2, cache_mb=32) as (url, _state),
            httpx.Client(base_url=url, timeout=60) as client,
        ):
            dzi = client.get(f"/dz/{path.name}.dzi")
            assert dzi.status_code == 200, dzi.text
            assert dzi.text == gen.get_dzi("jpeg")
            top = gen.level_count - 1
            for level in (top, top - 1, top - 3):
                cols, rows = gen.level_tiles[level]
                for col, row in {(0, 0), (cols // 2, rows // 2), (cols - 1, rows - 1)}:
                    r = client.get(f"/dz/{path.name}_files/{level}/{col}_{row}.png")
                    assert r.status_code == 200, (level, col, row, r.text)
                    ours = np.asarray(Image.open(io.BytesIO(r.content)).convert("RGB"), dtype=np.int16)
                    theirs = np.asarray(gen.get_tile(level, (col, row)).convert("RGB"), dtype=np.int16)
                    assert ours.shape == theirs.shape, (level, col, row)
                    assert float(np.abs(ours - theirs).mean()) <= 2.0, (level, col, row)


@pytest.mark.parametrize("name", VENDOR_FIXTURES)
def test_stress_runs_clean(fixture_path, name, tmp_path):
    report = tmp_path / "stress.json"
    result = _cli("stress", str(fixture_path(name)), "--workers", "4", "--iterations", "2000", "--region-size", "128",
                  "--verify-every", "5", "--report", str(report))
    # 0 ok, or 15 where a run this short is too short for a memory verdict on a loaded machine
    assert result.exit_code in (0, 15), result.output
    data = json.loads(report.read_text())
    assert data["errors"]["count"] == 0 and data["crash"] is None, data
    assert data["verification"]["checked"] >= 300 and data["verification"]["mismatches"] == 0, data
