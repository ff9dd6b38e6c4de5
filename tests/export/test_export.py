"""Tests of wsitool.export (export_pyramid and the export-pyramid command).

Every export here is a small region (at most 1024 pixels wide) so the file
stays fast; the references are built independently from the source with
float64 numpy (box filter) and compared with what OpenSlide, wsitool and
tifffile read back.
"""

from __future__ import annotations

import os
import threading
import tracemalloc
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

import imagecodecs
import numpy as np
import pytest
import tifffile

import wsitool
from wsitool import export
from wsitool.errors import InvalidRegionError, ResourceLimitError, TileDecodeError, WsiError
from wsitool.export import associated as export_associated
from wsitool.export import dzi as export_dzi
from wsitool.export import encode as export_encode
from wsitool.export import export_pyramid
from wsitool.ground.bitstream import jp2_codestream
from wsitool.slide import pyramid_levels

from helpers import repo_samples, shared_sample, tiff_samples

pytest.importorskip("openslide")
import openslide
from openslide.deepzoom import DeepZoomGenerator
from PIL import Image

WHITE = np.array([255, 255, 255], np.uint8)


# ----------------------------------------------------------------------------- references


def composite(rgba: np.ndarray, bg=WHITE) -> np.ndarray:
    """The documented compositing rule: (c * a + bg * (255 - a) + 127) // 255."""
    a = rgba[..., 3:4].astype(np.int64)
    c = rgba[..., :3].astype(np.int64)
    return ((c * a + np.asarray(bg, np.int64) * (255 - a) + 127) // 255).astype(np.uint8)


def source_region(slide, x, y, w, h, level=0, bg=WHITE) -> np.ndarray:
    """Region composited on ``bg``; undecodable tiles become background (as the export does)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rgba = slide.read_region((x, y), level, (w, h), mode="rgba", on_error="fill")
    return composite(rgba, bg)


def box_reference(img: np.ndarray, k: int) -> np.ndarray:
    """float64 mean of each 2**k x 2**k block of ``img``, blocks clipped to the image."""
    f = 1 << k
    h0, w0 = img.shape[:2]
    h, w = -(-h0 // f), -(-w0 // f)
    padded = np.full((h * f, w * f, 3), np.nan)
    padded[:h0, :w0] = img
    return np.nanmean(padded.reshape(h, f, w, f, 3), axis=(1, 3))


def expected_dims(w: int, h: int, tile: int) -> list[tuple[int, int]]:
    dims = [(w, h)]
    while dims[-1][0] > tile or dims[-1][1] > tile:
        pw, ph = dims[-1]
        dims.append((-(-pw // 2), -(-ph // 2)))
    return dims


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def libjpeg_psnr(img: np.ndarray, quality: int) -> float:
    """PSNR that libjpeg-turbo (imagecodecs) reaches on ``img`` at ``quality``, 4:4:4."""
    data = imagecodecs.jpeg8_encode(np.ascontiguousarray(img), level=quality, subsampling="444")
    return psnr(imagecodecs.jpeg8_decode(data), img)


def opens(path: Path) -> bool:
    try:
        with wsitool.open_slide(path):
            return True
    except WsiError:
        return False


def all_slides() -> list[Path]:
    return tiff_samples() + repo_samples()


def slide_id(p: Path) -> str:
    return p.name


def pick_region(slide, max_w=701, max_h=533):
    """An odd-sized region centred in level 0 (odd sizes exercise the partial edge blocks)."""
    W, H = slide.dimensions
    w, h = min(W, max_w), min(H, max_h)
    return (W - w) // 2, (H - h) // 2, w, h


# ----------------------------------------------------------------------------- TIFF on every slide


@pytest.mark.parametrize("path", all_slides(), ids=slide_id)
def test_tiff_export_every_slide(path, tmp_path):
    if not opens(path):
        pytest.skip(f"{path.name} does not open in wsitool")
    tile = 128
    with wsitool.open_slide(path) as src:
        x, y, w, h = pick_region(src)
        if pyramid_levels(src)[0].compression_problem:  # no decoder for the compression: exit 3 (item 15)
            with pytest.raises(wsitool.UnsupportedFormatError):
                export_pyramid(src, tmp_path / "out.svs", region=(x, y, w, h), tile_size=tile)
            assert list(tmp_path.iterdir()) == []
            return
        ref = source_region(src, x, y, w, h)
        try:
            src.read_region((x, y), 0, (w, h), mode="rgba")
            broken = False
        except TileDecodeError:
            broken = True
        mpp = src.mpp
        out = tmp_path / "out.svs"
        if broken:  # the default stops at the first undecodable tile, leaving nothing (issue 14 item 4)
            with pytest.raises(TileDecodeError):
                export_pyramid(src, out, region=(x, y, w, h), tile_size=tile, compression="deflate")
            assert list(tmp_path.iterdir()) == []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", wsitool.TileWarning)
            res = export_pyramid(src, out, region=(x, y, w, h), tile_size=tile, compression="deflate",
                                 on_error="fill" if broken else "raise")
    dims = expected_dims(w, h, tile)
    assert res.level_dimensions == dims
    assert res.tiles_written == sum(-(-a // tile) * -(-b // tile) for a, b in dims)
    assert (res.tiles_failed > 0) == broken

    # OpenSlide: Aperio vendor, MPP, level sizes, exact level 0 (deflate)
    osr = openslide.OpenSlide(str(out))
    try:
        assert osr.properties["openslide.vendor"] == "aperio"
        assert osr.level_dimensions == tuple(dims)
        if mpp is None:
            assert "openslide.mpp-x" not in osr.properties
        else:
            assert float(osr.properties["openslide.mpp-x"]) == pytest.approx(mpp[0], rel=1e-5)
        got = np.asarray(osr.read_region((0, 0), 0, (w, h)))[..., :3]
        np.testing.assert_array_equal(got, ref)
    finally:
        osr.close()

    # wsitool: same levels and MPP; every lower level is the box filter of the source within 1
    with wsitool.open_slide(out) as s:
        assert s.vendor == "aperio"
        assert [tuple(d) for d in s.level_dimensions] == dims
        if mpp is not None:
            assert s.mpp == pytest.approx(mpp, rel=1e-5)
        np.testing.assert_array_equal(s.read_region((0, 0), 0, (w, h), mode="rgb"), ref)
        for k in range(1, len(dims)):
            lvl = s.read_region((0, 0), k, dims[k], mode="rgb").astype(np.float64)
            diff = np.abs(lvl - box_reference(ref.astype(np.float64), k))
            assert diff.max() <= 1.0, f"level {k}: max abs diff {diff.max()}"

    # JPEG at quality 90: >= 40 dB, or as good as libjpeg-turbo itself where no encoder reaches it
    out_jpeg = tmp_path / "out-jpeg.svs"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", wsitool.TileWarning)
        export_pyramid(path, out_jpeg, region=(x, y, w, h), tile_size=tile, compression="jpeg",
                       quality=90, on_error="fill" if broken else "raise")
    osr = openslide.OpenSlide(str(out_jpeg))
    try:
        got = np.asarray(osr.read_region((0, 0), 0, (w, h)))[..., :3]
    finally:
        osr.close()
    value = psnr(got, ref)
    assert value >= min(40.0, libjpeg_psnr(ref, 90) - 1.0), f"PSNR {value:.2f} dB"


def test_jpeg_quality_90_whole_cmu1_over_40db(tmp_path, cmu1):
    """The whole CMU-1 slide at quality 90: >= 40 dB, and no worse than libjpeg-turbo itself."""
    with wsitool.open_slide(cmu1) as src:
        ref = source_region(src, 0, 0, *src.dimensions)
    out = tmp_path / "cmu1.svs"
    export_pyramid(cmu1, out, quality=90)
    osr = openslide.OpenSlide(str(out))
    try:
        got = np.asarray(osr.read_region((0, 0), 0, osr.dimensions))[..., :3]
    finally:
        osr.close()
    value = psnr(got, ref)
    assert value >= 40.0
    assert value >= libjpeg_psnr(ref, 90) - 0.5


def test_jpeg2000_psnr_0_is_lossless_in_openslide(tmp_path, sample_jpeg):
    with wsitool.open_slide(sample_jpeg) as src:
        ref = source_region(src, 100, 50, 300, 260)
    out = tmp_path / "j2k.svs"
    res = export_pyramid(sample_jpeg, out, region=(100, 50, 300, 260), compression="jpeg2000",
                         psnr=0)
    assert res.level_dimensions == [(300, 260), (150, 130)]
    with tifffile.TiffFile(out) as tf:
        assert tf.pages[0].compression == 33005
    osr = openslide.OpenSlide(str(out))
    try:
        np.testing.assert_array_equal(np.asarray(osr.read_region((0, 0), 0, (300, 260)))[..., :3], ref)
    finally:
        osr.close()
    with wsitool.open_slide(out) as s:
        np.testing.assert_array_equal(s.read_region((0, 0), 0, (300, 260), mode="rgb"), ref)


def test_lossy_jpeg2000_decodes_close_to_source(tmp_path, cmu1):
    out = tmp_path / "j2k.svs"
    # associated=False: the size check is about the tiles, not the label and macro carried over
    export_pyramid(cmu1, out, region=(800, 1200, 256, 256), compression="jpeg2000",
                   associated=False)  # the default target PSNR (40 dB)
    with wsitool.open_slide(cmu1) as src:
        ref = source_region(src, 800, 1200, 256, 256)
    with wsitool.open_slide(out) as s:
        got = s.read_region((0, 0), 0, (256, 256), mode="rgb")
    assert 35.0 <= psnr(got, ref) < float("inf")
    with tifffile.TiffFile(out) as tf:  # the pyramid's tiles, without the thumbnail (Aperio layout)
        tile_bytes = sum(sum(p.databytecounts) for p in tf.pages if p.is_tiled)
    assert tile_bytes < 256 * 256 * 3 * 0.35


# ----------------------------------------------------------------------------- source level, region


def test_level_option_reads_that_level_and_scales_mpp(tmp_path, sample_jpeg):
    with wsitool.open_slide(sample_jpeg) as src:
        lw, lh = src.level_dimensions[1]
        ref = source_region(src, 0, 0, lw, lh, level=1)
        mpp = src.mpp
        fx = src.dimensions[0] / lw
    out = tmp_path / "l1.svs"
    res = export_pyramid(sample_jpeg, out, level=1, tile_size=256, compression="deflate")
    assert res.level_dimensions[0] == (lw, lh)
    with wsitool.open_slide(out) as s:
        np.testing.assert_array_equal(s.read_region((0, 0), 0, (lw, lh), mode="rgb"), ref)
        assert s.mpp_x == pytest.approx(mpp[0] * fx, rel=1e-6)


def test_non_power_of_two_level_region(tmp_path):
    """A level with downsample 4.016: only that level is read, lower levels are computed."""
    path = shared_sample("generic-boxes-deflate-4level.tiff")
    with wsitool.open_slide(path) as src:
        assert src.level_downsamples[2] != 4.0
        lw, lh = src.level_dimensions[2]
        ref = source_region(src, 9, 5, lw - 3, lh - 2, level=2)
    out = tmp_path / "b.svs"
    res = export_pyramid(path, out, level=2, region=(9, 5, lw - 3, lh - 2), tile_size=32,
                         compression="deflate")
    with wsitool.open_slide(out) as s:
        assert [tuple(d) for d in s.level_dimensions] == res.level_dimensions
        np.testing.assert_array_equal(s.read_region((0, 0), 0, (lw - 3, lh - 2), mode="rgb"), ref)
        for k in range(1, s.level_count):
            lvl = s.read_region((0, 0), k, s.level_dimensions[k], mode="rgb").astype(np.float64)
            assert np.abs(lvl - box_reference(ref.astype(np.float64), k)).max() <= 1.0


def test_region_outside_slide_gets_background(tmp_path, sample_jpeg):
    bg = (10, 200, 30)
    out = tmp_path / "edge.svs"
    with wsitool.open_slide(sample_jpeg) as src:
        W, _ = src.dimensions
        ref = source_region(src, W - 100, -40, 300, 200, bg=bg)
    export_pyramid(sample_jpeg, out, region=(W - 100, -40, 300, 200), background=bg,
                   compression="deflate", tile_size=64)
    with wsitool.open_slide(out) as s:
        got = s.read_region((0, 0), 0, (300, 200), mode="rgb")
    np.testing.assert_array_equal(got, ref)
    assert (got[:40] == bg).all() and (got[:, 100:] == bg).all()


def test_bad_requests_raise_clear_errors(tmp_path, sample_jpeg):
    out = tmp_path / "x.svs"
    with pytest.raises(InvalidRegionError, match="outside"):
        export_pyramid(sample_jpeg, out, region=(5000, 0, 100, 100))
    with pytest.raises(InvalidRegionError, match="level 7 out of range"):
        export_pyramid(sample_jpeg, out, level=7)
    with pytest.raises(ResourceLimitError, match="max-pixels"):
        export_pyramid(sample_jpeg, out, max_pixels=1000)
    with pytest.raises(ValueError, match="multiple of 16"):
        export_pyramid(sample_jpeg, out, tile_size=100)
    with pytest.raises(ValueError, match="Deep Zoom"):
        export_pyramid(sample_jpeg, tmp_path / "x.dzi", format="dzi", compression="jpeg2000")
    with pytest.raises(ValueError, match="overlap"):
        export_pyramid(sample_jpeg, out, overlap=1)
    with pytest.raises(ValueError, match="half the tile size"):
        export_pyramid(sample_jpeg, tmp_path / "x.dzi", format="dzi", tile_size=8, overlap=5)
    with pytest.raises(FileNotFoundError):
        export_pyramid(sample_jpeg, tmp_path / "missing" / "x.svs")
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- OME-TIFF


def test_ome_tiff_subifds_and_physical_size(tmp_path, cmu1):
    with wsitool.open_slide(cmu1) as src:
        ref = source_region(src, 500, 700, 1000, 900)
        mpp = src.mpp
    out = tmp_path / "o.ome.tif"
    res = export_pyramid(cmu1, out, format="ome-tiff", region=(500, 700, 1000, 900),
                         compression="deflate")
    with tifffile.TiffFile(out) as tf:
        # the pyramid, then the source's label and macro as further OME Images (issue 14 item 7)
        assert tf.is_ome and len(tf.pages) == 3
        assert [s.name for s in tf.series] == ["o", "label", "macro"]
        assert len(tf.pages[0].subifds) == len(res.level_dimensions) - 1
        levels = tf.series[0].levels
        assert [(lv.shape[1], lv.shape[0]) for lv in levels] == res.level_dimensions
        pixels = next(e for e in ET.fromstring(tf.ome_metadata).iter() if e.tag.endswith("Pixels"))
        assert float(pixels.get("PhysicalSizeX")) == pytest.approx(mpp[0], rel=1e-6)
        assert pixels.get("PhysicalSizeXUnit") == "µm"
        np.testing.assert_array_equal(levels[0].asarray(), ref)
    with wsitool.open_slide(out) as s:
        assert s.vendor == "ome-tiff"
        assert [tuple(d) for d in s.level_dimensions] == res.level_dimensions
        assert s.mpp == pytest.approx(mpp, rel=1e-6)
        lvl = s.read_region((0, 0), 2, s.level_dimensions[2], mode="rgb").astype(np.float64)
        assert np.abs(lvl - box_reference(ref.astype(np.float64), 2)).max() <= 1.0


# ----------------------------------------------------------------------------- Deep Zoom


@pytest.mark.parametrize("tile,overlap,size", [(254, 1, (700, 501)), (64, 3, (321, 190)), (128, 0, (256, 129))])
def test_dzi_matches_deepzoomgenerator(tmp_path, cmu1, tile, overlap, size):
    w, h = size
    with wsitool.open_slide(cmu1) as src:
        ref = source_region(src, 900, 1100, w, h)
    out = tmp_path / "dz.dzi"
    res = export_pyramid(cmu1, out, format="dzi", region=(900, 1100, w, h), tile_size=tile,
                         overlap=overlap, compression="deflate")
    assert res.output == out
    dz = DeepZoomGenerator(openslide.ImageSlide(Image.fromarray(ref)), tile_size=tile, overlap=overlap)
    info = ET.parse(out).getroot()
    assert info.get("TileSize") == str(tile) and info.get("Overlap") == str(overlap)
    assert info.get("Format") == "png"
    size_el = next(e for e in info if e.tag.endswith("Size"))
    assert (int(size_el.get("Width")), int(size_el.get("Height"))) == (w, h)
    files = tmp_path / "dz_files"
    assert len(list(files.iterdir())) == dz.level_count
    assert res.level_dimensions == list(reversed(dz.level_dimensions))
    top = dz.level_count - 1
    for level in range(dz.level_count):
        cols, rows = dz.level_tiles[level]
        names = sorted(p.name for p in (files / str(level)).iterdir())
        assert names == sorted(f"{c}_{r}.png" for c in range(cols) for r in range(rows))
        k = top - level
        ref_k = box_reference(ref.astype(np.float64), k)
        for c in range(cols):
            for r in range(rows):
                tile_img = imagecodecs.png_decode((files / str(level) / f"{c}_{r}.png").read_bytes())
                # DeepZoomGenerator's tile size, clipped to the level as the tiles it serves
                # and OpenSeadragon's tile bounds are (get_tile_dimensions alone can overrun
                # the level when the last tile is narrower than the overlap).
                x0 = c * tile - (overlap if c else 0)
                y0 = r * tile - (overlap if r else 0)
                lw, lh = dz.level_dimensions[level]
                gw, gh = dz.get_tile_dimensions(level, (c, r))
                assert (tile_img.shape[1], tile_img.shape[0]) == (min(gw, lw - x0), min(gh, lh - y0))
                if level == top:  # full resolution: exactly what DeepZoomGenerator serves
                    np.testing.assert_array_equal(tile_img, np.asarray(dz.get_tile(level, (c, r))))
                else:
                    part = ref_k[y0:y0 + tile_img.shape[0], x0:x0 + tile_img.shape[1]]
                    inside = tile_img[:part.shape[0], :part.shape[1]].astype(np.float64)
                    assert np.abs(inside - part).max() <= 1.0


def test_dzi_jpeg_tiles(tmp_path, cmu1):
    out = tmp_path / "j"  # ".dzi" is added
    res = export_pyramid(cmu1, out, format="dzi", region=(800, 1200, 600, 400), tile_size=254, overlap=1)
    assert res.output == tmp_path / "j.dzi"
    data = (tmp_path / "j_files" / str(len(res.level_dimensions) - 1) / "1_0.jpeg").read_bytes()
    tile = imagecodecs.jpeg8_decode(data)
    assert tile.shape == (255, 256, 3)  # 254 + 1 overlap on each side that has a neighbour
    # tile (1, 0) covers x 253..509, y 0..255 of the region (tissue there: a one-pixel
    # shift drops the PSNR to about 19 dB)
    with wsitool.open_slide(cmu1) as src:
        expected = source_region(src, 800 + 253, 1200, 256, 255)
    assert psnr(tile, expected) >= 30


# ----------------------------------------------------------------------------- memory bound


def test_memory_stays_under_documented_bound(cmu1, tmp_path):
    region = (600, 0, 1024, 6000)  # the lower half lies below the slide: background
    tile = 64
    with wsitool.open_slide(cmu1) as src:
        lv = pyramid_levels(src)[0]
        dims = export.pyramid_dimensions(region[2], region[3], tile)
        tw, th = dims[export_associated.thumbnail_level(dims)]  # the level kept for the Aperio thumbnail
        carried = sum(src.associated_images[n].shape[0] * src.associated_images[n].shape[1]
                      for n in ("label", "macro"))  # carried over by default
        bound = export.memory_bound(region[2], tile, levels=len(dims), threads=1,
                                    source_tile=(lv.tile_width, lv.tile_height),
                                    thumbnail_pixels=tw * th, associated_pixels=carried)
        whole_level = region[2] * region[3] * 3
        assert whole_level > bound  # holding level 0 alone would break the bound
        src.read_region((0, 0), 0, (8, 8))  # warm up decoder state outside the measurement
        tracemalloc.start()
        try:
            res = export_pyramid(src, tmp_path / "m.svs", region=region, tile_size=tile, threads=1)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert res.memory_bound == bound
    assert peak < bound, f"peak {peak} bytes over the bound {bound}"
    assert res.level_dimensions == dims


def test_memory_does_not_grow_with_height(cmu1, tmp_path):
    """Peak memory of an export depends on its width, not its height: four times
    the rows cost about the same peak (and far less than one level-0 copy)."""
    peaks = {}
    with wsitool.open_slide(cmu1) as src:
        src.read_region((0, 0), 0, (8, 8))  # warm up decoder state outside the measurement
        for height in (1500, 6000):
            tracemalloc.start()
            try:
                export_pyramid(src, tmp_path / f"h{height}.svs", region=(600, 0, 512, height),
                               tile_size=64, threads=1, compression="deflate")
                peaks[height] = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
    assert peaks[6000] < 1.5 * peaks[1500] + (1 << 20), peaks
    assert peaks[6000] < 512 * 6000 * 3 / 2, peaks  # under half of one copy of level 0
    assert export.memory_bound(512, 64, levels=8) < export.memory_bound(1024, 64, levels=8)


# ----------------------------------------------------------------------------- atomicity


class _Boom(Exception):
    pass


@pytest.mark.parametrize("fmt,name", [("tiff", "x.svs"), ("ome-tiff", "x.ome.tif"), ("dzi", "x.dzi")])
@pytest.mark.parametrize("exc", [_Boom, KeyboardInterrupt])
@pytest.mark.parametrize("after", [3, 100])
def test_interrupted_export_leaves_nothing(tmp_path, monkeypatch, cmu1, fmt, name, exc, after):
    original = export_encode.TileCodec.encode
    calls = {"n": 0}
    lock = threading.Lock()

    def failing(self, tile):
        with lock:
            calls["n"] += 1
            if calls["n"] > after:
                raise exc("injected failure")
        return original(self, tile)

    monkeypatch.setattr(export_encode.TileCodec, "encode", failing)
    with pytest.raises(exc):
        # 1200 x 1100 with 128-pixel tiles: 90 + 25 + 9 + ... tiles, "after" cuts level 0 or a lower level
        export_pyramid(cmu1, tmp_path / name, format=fmt, region=(0, 0, 1200, 1100), tile_size=128)
    assert calls["n"] > after
    assert list(tmp_path.iterdir()) == []


def test_failed_overwrite_keeps_previous_output(tmp_path, monkeypatch, sample_jpeg):
    out = tmp_path / "keep.svs"
    export_pyramid(sample_jpeg, out, region=(0, 0, 300, 300))
    before = out.read_bytes()

    def failing(self, tile):
        raise _Boom("injected")

    monkeypatch.setattr(export_encode.TileCodec, "encode", failing)
    with pytest.raises(_Boom):
        export_pyramid(sample_jpeg, out, overwrite=True)
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.svs"]


def test_refuses_to_overwrite(tmp_path, sample_jpeg):
    out = tmp_path / "a.svs"
    out.write_bytes(b"existing")
    with pytest.raises(FileExistsError, match="overwrite"):
        export_pyramid(sample_jpeg, out)
    assert out.read_bytes() == b"existing"
    res = export_pyramid(sample_jpeg, out, overwrite=True, region=(0, 0, 64, 64))
    assert res.bytes_written == out.stat().st_size and opens(out)

    (tmp_path / "d_files").mkdir()  # a Deep Zoom tile folder alone blocks the export too
    with pytest.raises(FileExistsError):
        export_pyramid(sample_jpeg, tmp_path / "d.dzi", format="dzi")
    assert not (tmp_path / "d.dzi").exists()
    export_pyramid(sample_jpeg, tmp_path / "d.dzi", format="dzi", overwrite=True, region=(0, 0, 64, 64))
    assert (tmp_path / "d.dzi").exists() and (tmp_path / "d_files" / "0" / "0_0.jpeg").exists()


def test_refuses_to_write_over_its_source(tmp_path, sample_jpeg):
    copy = tmp_path / "src.svs"
    copy.write_bytes(sample_jpeg.read_bytes())
    with pytest.raises(ValueError, match="source"):
        export_pyramid(copy, copy, overwrite=True)
    assert copy.read_bytes() == sample_jpeg.read_bytes()


# ----------------------------------------------------------------------------- progress, threads, CLI


def test_progress_and_encoders_per_thread(tmp_path, sample_jpeg):
    seen = []
    res = export_pyramid(sample_jpeg, tmp_path / "p.svs", threads=2,
                         progress=lambda done, total: seen.append((done, total)))
    totals = {t for _, t in seen}
    assert totals == {res.tiles_written}
    assert [d for d, _ in seen] == list(range(res.tiles_written + 1))
    # JPEG 2000 tiles are encoded by OpenJPEG through imagecodecs (issue 26), which keeps
    # no per-thread encoder: the nvImageCodec pool makes none
    pool = wsitool.codec.pool.get_pool("cpu")
    created = pool.encoders_created
    export_pyramid(sample_jpeg, tmp_path / "p2.svs", threads=2, compression="jpeg2000",
                   region=(0, 0, 1024, 768))
    assert pool.encoders_created == created


def test_cli_export_pyramid(tmp_path, sample_jpeg):
    from typer.testing import CliRunner

    from wsitool.cli import app

    runner = CliRunner()
    out = tmp_path / "c.svs"
    args = ["export-pyramid", str(sample_jpeg), str(out), "--tile-size", "128", "--region", "10", "20",
            "400", "300", "--compression", "deflate", "--background", "0,0,0", "--quiet"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    with wsitool.open_slide(out) as s:
        assert s.level_dimensions == ((400, 300), (200, 150), (100, 75))
    assert runner.invoke(app, args).exit_code == 9  # exists
    assert runner.invoke(app, [*args, "--overwrite"]).exit_code == 0
    bad_bg = runner.invoke(app, [*args[:-3], "--background", "1,2", "--overwrite"])
    assert bad_bg.exit_code == 2
    outside = runner.invoke(app, ["export-pyramid", str(sample_jpeg), str(tmp_path / "o.svs"),
                                  "--region", "9000", "0", "10", "10"])
    assert outside.exit_code == 5
    assert not (tmp_path / "o.svs").exists()
    dzi = runner.invoke(app, ["export-pyramid", str(sample_jpeg), str(tmp_path / "z.dzi"), "--format",
                              "dzi", "--tile-size", "254", "--overlap", "1", "--quiet"])
    assert dzi.exit_code == 0, dzi.output
    assert (tmp_path / "z_files").is_dir()


def test_jp2_codestream_extraction():
    soc = b"\xff\x4f\xff\x51rest"
    jp2 = (b"\x00\x00\x00\x0cjP  \r\n\x87\n" + b"\x00\x00\x00\x10ftypjp2 \x00\x00\x00\x00"
           + (8 + len(soc)).to_bytes(4, "big") + b"jp2c" + soc)
    assert jp2_codestream(jp2) == soc
    assert jp2_codestream(soc) == soc
    with pytest.raises(ValueError, match="code stream box"):
        jp2_codestream(b"\x00\x00\x00\x0cjP  \r\n\x87\n")


def test_region_origin_means_what_read_region_means(sample_jpeg, tmp_path):
    """--region X Y at a level > 0 exports exactly read_region((X, Y), level, ...)."""
    out = tmp_path / "r.tif"
    export.export_pyramid(sample_jpeg, out, region=(3, 3, 64, 48), level=1,
                          compression="deflate", tile_size=64)
    with wsitool.open_slide(sample_jpeg) as src, wsitool.open_slide(out) as dst:
        expected = src.read_region((3, 3), 1, (64, 48), mode="rgb")
        got = dst.read_region((0, 0), 0, (64, 48), mode="rgb")
    assert np.array_equal(got, expected)


def test_missing_tiles_and_alpha_become_background(tmp_path):
    """Sparse tiles (byte count 0) and a partly transparent RGBA source: background, counted."""
    rng = np.random.default_rng(3)
    rgb = rng.integers(0, 256, (200, 260, 3), dtype=np.uint8)
    tiles = []
    for r in range(0, 200, 64):
        for c in range(0, 260, 64):
            t = np.zeros((64, 64, 3), np.uint8)
            part = rgb[r:r + 64, c:c + 64]
            t[:part.shape[0], :part.shape[1]] = part
            tiles.append(None if (r, c) == (64, 128) else t)
    sparse = tmp_path / "sparse.tif"
    tifffile.imwrite(sparse, iter(tiles), shape=rgb.shape, dtype=np.uint8, tile=(64, 64),
                     photometric="rgb", metadata=None)
    bg = (0, 128, 255)
    res = export_pyramid(sparse, tmp_path / "s.svs", compression="deflate", background=bg, tile_size=64)
    assert res.tiles_missing == 1 and res.tiles_failed == 0
    expected = rgb.copy()
    expected[64:128, 128:192] = bg
    with wsitool.open_slide(tmp_path / "s.svs") as s:
        np.testing.assert_array_equal(s.read_region((0, 0), 0, (260, 200), mode="rgb"), expected)

    rgba = np.dstack([rgb, rng.integers(0, 256, (200, 260), dtype=np.uint8)])
    alpha_src = tmp_path / "alpha.tif"
    tifffile.imwrite(alpha_src, rgba, tile=(64, 64), photometric="rgb", extrasamples=("unassalpha",),
                     metadata=None)
    export_pyramid(alpha_src, tmp_path / "a.svs", compression="deflate", background=bg, tile_size=64)
    with wsitool.open_slide(tmp_path / "a.svs") as s:
        got = s.read_region((0, 0), 0, (260, 200), mode="rgb")
    np.testing.assert_array_equal(got, composite(rgba, bg))


def test_strips_follow_source_tiles_so_each_is_decoded_once(tmp_path, cmu1):
    """CMU-1 has 240-pixel tiles; Deep Zoom tiles are 254: strips still start on source tile rows."""
    assert export.strip_rows(254, 240) == 240
    assert export.strip_rows(256, 100) == 200 and export.strip_rows(64, 1024) == 64
    pool = wsitool.codec.pool.get_pool("cpu")
    before = pool.stats().tiles_decoded
    export_pyramid(cmu1, tmp_path / "d.dzi", format="dzi", region=(0, 100, 2220, 1000),
                   tile_size=254, overlap=1, threads=1)
    touched = -(-2220 // 240) * (1100 // 240 - 100 // 240 + 1)
    assert pool.stats().tiles_decoded - before == touched


@pytest.mark.parametrize("fmt,name", [("tiff", "x.svs"), ("ome-tiff", "x.ome.tif")])
def test_failure_while_writing_lower_pages_leaves_nothing(tmp_path, monkeypatch, sample_jpeg, fmt, name):
    """Level 0 is written and the lower levels are being copied in from the spill file."""
    original = tifffile.TiffWriter.write
    calls = {"n": 0}

    def failing(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device (injected)")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(tifffile.TiffWriter, "write", failing)
    with pytest.raises(OSError, match="injected"):
        export_pyramid(sample_jpeg, tmp_path / name, format=fmt, tile_size=256)
    assert calls["n"] == 3
    assert list(tmp_path.iterdir()) == []


def test_dzi_commit_failure_restores_previous_output(tmp_path, monkeypatch, sample_jpeg):
    out = tmp_path / "v.dzi"
    export_pyramid(sample_jpeg, out, format="dzi", region=(0, 0, 300, 200))
    before_dzi = out.read_text()
    before_tiles = sorted(p.relative_to(tmp_path) for p in (tmp_path / "v_files").rglob("*"))
    original = os.replace
    calls = {"n": 0}

    def failing(src, dst):
        calls["n"] += 1
        if calls["n"] == 4:  # old tiles and old .dzi moved aside, new tiles in place: the .dzi fails
            raise OSError(5, "I/O error (injected)")
        return original(src, dst)

    monkeypatch.setattr(export_dzi.os, "replace", failing)
    with pytest.raises(OSError, match="injected"):
        export_pyramid(sample_jpeg, out, format="dzi", overwrite=True)
    monkeypatch.setattr(export_dzi.os, "replace", original)
    assert out.read_text() == before_dzi
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "v_files").rglob("*")) == before_tiles
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.dzi", "v_files"]
