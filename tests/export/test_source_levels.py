"""``export_pyramid(..., from_source_levels=True)`` / ``--from-source-levels``: output levels
read from the source's own lower levels where their downsample is a power of two."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

import wsitool
from wsitool.cli import app
from wsitool.export import export_pyramid
from wsitool.export.plan import source_level_segments

from helpers import REPO_SAMPLES, shared_sample


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 99.0 if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def _box2(img: np.ndarray) -> np.ndarray:
    h, w = img.shape[:2]
    p = np.pad(img.astype(np.float64), ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
    return (p[0::2, 0::2] + p[1::2, 0::2] + p[0::2, 1::2] + p[1::2, 1::2]) / 4


def _levels(*sizes):
    w0, h0 = sizes[0]
    return [SimpleNamespace(index=i, width=w, height=h, downsample=(w0 / w + h0 / h) / 2)
            for i, (w, h) in enumerate(sizes)]  # what source_level_segments reads of a Level


def test_segments_follow_power_of_two_levels():
    # CMU-1's own level sizes: 32914 rows give 8228 at 4x and 2057 at 16x (rounded down)
    levels = _levels((46000, 32914), (11500, 8228), (2875, 2057))
    segs = source_level_segments(levels, 0, (0, 0, 46000, 32914), 256, "tiff")
    assert [(s.level, s.first) for s in segs] == [(0, 0), (1, 2), (2, 4)]
    assert segs[0].dims == [(46000, 32914), (23000, 16457)]
    assert segs[1].dims[0] == (11500, 8228)  # the source level's size, not ceil(32914 / 4)
    assert segs[2].dims[0] == (2875, 2057)
    assert segs[2].dims[-1][0] <= 256 and segs[2].dims[-1][1] <= 256
    # a region on a level's grid: its start divided, the size halving gives
    segs = source_level_segments(levels, 0, (1024, 2048, 4001, 3003), 256, "tiff")
    assert [(s.level, s.first) for s in segs] == [(0, 0), (1, 2), (2, 4)]
    assert segs[1].rect == (256, 512, 1001, 751)  # ceil(4001 / 4), ceil(3003 / 4)
    assert segs[2].rect == (64, 128, 251, 188)
    for s in segs:  # never bigger than halving the region
        f = 1 << s.first
        assert s.dims[0][0] <= -(-4001 // f) and s.dims[0][1] <= -(-3003 // f)
    # a region off the 4x grid reads neither source level (16x is off it too)
    segs = source_level_segments(levels, 0, (1001, 2003, 4000, 3000), 256, "tiff")
    assert [(s.level, s.first) for s in segs] == [(0, 0)]
    # on the 4x grid but not the 16x one: level 1 only
    segs = source_level_segments(levels, 0, (4, 8, 4000, 3000), 256, "tiff")
    assert [(s.level, s.first) for s in segs] == [(0, 0), (1, 2)]
    # a region beyond the slide's edge keeps halving's size (the rest is background)
    segs = source_level_segments(levels, 0, (45056, 0, 1000, 32914), 256, "tiff")
    assert segs[1].dims[0] == (250, 8228)


def test_segments_skip_other_steps():
    levels = _levels((9000, 9000), (3000, 3000), (1125, 1125))  # 3x, then 8x
    segs = source_level_segments(levels, 0, (0, 0, 9000, 9000), 256, "tiff")
    assert [(s.level, s.first) for s in segs] == [(0, 0), (2, 3)]
    levels = _levels((1000, 1000), (490, 490))  # 2.04x: beyond the 2 % tolerance
    assert len(source_level_segments(levels, 0, (0, 0, 1000, 1000), 256, "tiff")) == 1
    levels = _levels((1024, 1024), (128, 128))  # 8x, but the pyramid stops at 4x (256)
    assert len(source_level_segments(levels, 0, (0, 0, 1024, 1024), 256, "tiff")) == 1


@pytest.mark.parametrize("fmt,name", [("tiff", "s.svs"), ("ome-tiff", "s.ome.tif")])
def test_levels_come_from_the_source_levels(tmp_path, fmt, name):
    path = REPO_SAMPLES / "sample-aperio-jpeg.svs"
    out = tmp_path / name
    res = export_pyramid(path, out, format=fmt, tile_size=128, from_source_levels=True, quality=95)
    plain = export_pyramid(path, tmp_path / ("p" + name), format=fmt, tile_size=128, quality=95)
    assert plain.source_levels == [0] * len(plain.level_dimensions)
    assert res.source_levels[:3] == [0, 1, 2] and set(res.source_levels[3:]) == {2}
    assert res.level_dimensions == plain.level_dimensions  # this slide halves exactly
    with wsitool.open_slide(path) as src, wsitool.open_slide(out) as o, \
            wsitool.open_slide(tmp_path / ("p" + name)) as p:
        for k in (1, 2):
            w, h = src.level_dimensions[k]
            source = src.read_region((0, 0), k, (w, h), mode="rgb")
            ours = o.read_region((0, 0), k, (w, h), mode="rgb")
            halved = p.read_region((0, 0), k, (w, h), mode="rgb")
            # the source level's own pixels, re-encoded once ...
            assert _psnr(ours, source) >= 38
            # ... which are not what halving level 0 gives (a different filter)
            assert _psnr(ours, source) > _psnr(halved, source) + 3
        # the level below the last source level is halved from it
        w3, h3 = o.level_dimensions[3]
        l2 = o.read_region((0, 0), 2, o.level_dimensions[2], mode="rgb")
        l3 = o.read_region((0, 0), 3, (w3, h3), mode="rgb")
        assert _psnr(l3, _box2(l2)[:h3, :w3]) >= 36
        if fmt == "tiff":  # the Aperio thumbnail: the smallest level's size (Bio-Formats' SVS rule, issue 26)
            thumb = o.associated_images["thumbnail"]
            kt = o.level_count - 1
            level = o.read_region((0, 0), kt, o.level_dimensions[kt], mode="rgb")
            assert thumb.shape == level.shape
            assert _psnr(thumb, level) >= 30   # reduced from a larger level (32.3 dB measured): a different filter


def test_source_level_one_pixel_short_keeps_its_size(tmp_path):
    path = shared_sample("generic-boxes-deflate-4level.tiff")  # 300x250, 75x62 at 4.016x
    res = export_pyramid(path, tmp_path / "b.svs", tile_size=16, compression="deflate",
                         from_source_levels=True)
    assert res.level_dimensions[2] == (75, 62)  # not ceil(250 / 4) = 63 rows of which one blank
    with wsitool.open_slide(path) as src, wsitool.open_slide(tmp_path / "b.svs") as o:
        a = src.read_region((0, 0), 2, (75, 62), mode="rgb")
        b = o.read_region((0, 0), 2, (75, 62), mode="rgb")
        assert np.array_equal(a, b)  # deflate: lossless, so exactly the source level


def test_cli_from_source_levels(tmp_path):
    runner = CliRunner()
    path = str(REPO_SAMPLES / "sample-aperio-jpeg.svs")
    ok = runner.invoke(app, ["export-pyramid", path, str(tmp_path / "c.svs"), "--from-source-levels",
                             "--quiet"])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "c.svs").is_file()
    dzi = runner.invoke(app, ["export-pyramid", path, str(tmp_path / "c.dzi"), "--from-source-levels"])
    assert dzi.exit_code == 2 and "tiff and ome-tiff" in dzi.output
    cp = runner.invoke(app, ["export-pyramid", path, str(tmp_path / "d.svs"), "--from-source-levels",
                             "--compression", "copy"])
    assert cp.exit_code == 2 and "copy" in cp.output
    assert not (tmp_path / "c.dzi").exists() and not (tmp_path / "d.svs").exists()
    with pytest.raises(ValueError, match="tiff and ome-tiff"):
        export_pyramid(path, tmp_path / "e.dzi", format="dzi", from_source_levels=True)


@pytest.mark.parametrize("region", [(3, 0, 2, 1152), (1, 1, 18, 18), (-37, -11, 900, 700),
                                    (1, 1, 1534, 1150), (4, 8, 1532, 1144)])
def test_off_grid_regions_keep_the_halving_geometry(tmp_path, region):
    path = REPO_SAMPLES / "sample-aperio-jpeg.svs"
    a = export_pyramid(path, tmp_path / "a.svs", region=region, tile_size=16, compression="deflate",
                       from_source_levels=True)
    b = export_pyramid(path, tmp_path / "b.svs", region=region, tile_size=16, compression="deflate")
    assert len(a.level_dimensions) == len(b.level_dimensions)
    for (wa, ha), (wb, hb) in zip(a.level_dimensions, b.level_dimensions, strict=True):
        assert wb - 1 <= wa <= wb and hb - 1 <= ha <= hb
    with wsitool.open_slide(tmp_path / "a.svs") as s:
        assert [tuple(d) for d in s.level_dimensions] == [tuple(d) for d in a.level_dimensions]
