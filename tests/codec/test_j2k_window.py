"""OpenJPEG window decode (wsitool.codec.openjpeg) against whole-tile decode plus crop, bit-exact.

Every JPEG 2000 level of the shared samples, the repo's Aperio J2K sample and a
small bench slide built from real TCGA 33005 tiles; windows at the four
corners, along the four edges, 1-pixel windows, whole tiles and random ones;
edge tiles of the grid included.  Reduced-resolution windows against the
reduced whole tile cropped (also bit-exact).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import wsitool
from wsitool.codec import openjpeg
from wsitool.codec.nvdecode import decode_into as nv_decode_into
from wsitool.codec.paths import decode_paths
from wsitool.codec.pool import get_pool
from wsitool.codec.tilebytes import read_tile_bytes
from wsitool.errors import TileDecodeError
from wsitool.slide import pyramid_levels

from helpers import REPO, REPO_SAMPLES, SHARED_SAMPLES

pytestmark = pytest.mark.skipif(not openjpeg.available(), reason="no libopenjp2")

J2K_SHARED = [
    "aperio-tcga-cr-7395-jp2k-33005-2level.svs",
    "tiled-jp2k-34712-2pages.tif",
    "dicom-camelyon-jp2k-lossless-1696x812.dcm",
    "dicom-google-jp2k-lossless-957x715.dcm",
]


@pytest.fixture(scope="module")
def bench_j2k(tmp_path_factory):
    if not (SHARED_SAMPLES / J2K_SHARED[0]).exists():
        pytest.skip("shared samples absent")
    out = tmp_path_factory.mktemp("bench") / "bench-j2k.svs"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_bench_slide.py"), str(out),
                    "--codec", "j2k", "--width", "2000", "--height", "1500",
                    "--samples", str(SHARED_SAMPLES)], check=True, capture_output=True)
    return out


def _slides(bench):
    paths = [SHARED_SAMPLES / n for n in J2K_SHARED if (SHARED_SAMPLES / n).exists()]
    return [*paths, REPO_SAMPLES / "sample-aperio-j2k.svs", bench]


def _tiles(lv):
    """First, a middle, last-column, last-row and last tile of the grid."""
    across, down = lv.tiles_across, lv.tiles_down
    picks = {(0, 0), (across // 2, down // 2), (across - 1, 0), (0, down - 1), (across - 1, down - 1)}
    return sorted(picks)


def windows(w: int, h: int, rng) -> list[tuple[int, int, int, int]]:
    """Corner, edge, 1-pixel, whole and random windows of a ``w x h`` tile."""
    a, b = max(1, w // 3), max(1, h // 4)
    out = [(0, 0, w, h),
           (0, 0, a, b), (w - a, 0, w, b), (0, h - b, a, h), (w - a, h - b, w, h),   # corners
           (a, 0, w - a if w - a > a else a + 1, 1), (0, b, 1, h - b if h - b > b else b + 1),  # edges
           (w - 1, 0, w, h), (0, h - 1, w, h),
           (0, 0, 1, 1), (w - 1, 0, w, 1), (0, h - 1, 1, h), (w - 1, h - 1, w, h),    # 1 pixel
           (w // 2, h // 2, w // 2 + 1, h // 2 + 1)]
    for _ in range(4):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        out.append((x0, y0, int(rng.integers(x0 + 1, w + 1)), int(rng.integers(y0 + 1, h + 1))))
    return out


def _decode(lv, col, row, data, rect, reduce=0):
    x0, y0, x1, y1 = rect
    dst = np.full((y1 - y0, x1 - x0, 3), 7, np.uint8)
    assert openjpeg.decode_into(lv, col, row, data, dst, rect, get_pool().state(), reduce=reduce)
    return dst


def test_window_equals_whole_tile_crop_on_every_j2k_level(bench_j2k):
    rng = np.random.default_rng(18)
    state = get_pool().state()
    checked = 0
    for path in _slides(bench_j2k):
        with wsitool.open_slide(path) as slide:
            for lv in slide._pyramid.levels:
                assert lv.encoding.stream == "j2k", path
                for col, row in _tiles(lv):
                    data = read_tile_bytes(lv, row * lv.tiles_across + col, col, row, state.stats)
                    iw = min(lv.tile_width, lv.width - col * lv.tile_width)
                    ih = min(lv.tile_height, lv.height - row * lv.tile_height)
                    whole = _decode(lv, col, row, data, (0, 0, iw, ih))
                    # the whole tile is the nvImageCodec decode of the same tile
                    ref = np.empty_like(whole)
                    with decode_paths(roi_decode=False):
                        nv_decode_into(lv, col, row, data, ref, (0, 0, iw, ih), state)
                    assert np.array_equal(whole, ref), (path, lv.index, col, row)
                    for rect in windows(iw, ih, rng):
                        x0, y0, x1, y1 = rect
                        got = _decode(lv, col, row, data, rect)
                        assert np.array_equal(got, whole[y0:y1, x0:x1]), (path, lv.index, col, row, rect)
                        checked += 1
    assert checked > 500


@pytest.mark.parametrize("reduce", [1, 2, 3])
def test_reduced_window_equals_reduced_whole_tile_crop(bench_j2k, reduce):
    rng = np.random.default_rng(reduce)
    state = get_pool().state()
    k = 1 << reduce
    for path in [SHARED_SAMPLES / J2K_SHARED[0], bench_j2k]:
        with wsitool.open_slide(path) as slide:
            for lv in slide._pyramid.levels:
                for col, row in _tiles(lv):
                    data = read_tile_bytes(lv, row * lv.tiles_across + col, col, row, state.stats)
                    iw = -(-min(lv.tile_width, lv.width - col * lv.tile_width) // k)
                    ih = -(-min(lv.tile_height, lv.height - row * lv.tile_height) // k)
                    whole = _decode(lv, col, row, data, (0, 0, iw, ih), reduce)
                    for rect in windows(iw, ih, rng):
                        x0, y0, x1, y1 = rect
                        got = _decode(lv, col, row, data, rect, reduce)
                        assert np.array_equal(got, whole[y0:y1, x0:x1]), (path, lv.index, col, row, rect)


def test_counters_and_one_copy_per_window(tcga_j2k):
    pool = get_pool()
    with wsitool.open_slide(tcga_j2k) as slide:
        pool.reset_stats()
        slide.read_region((100, 100), 0, (600, 300), mode="rgb", threads=1)
        st = pool.stats()
    # 600 x 300 at (100, 100) of 256 x 256 tiles: 3 x 2 tiles
    assert st.tiles_openjpeg == st.tiles_decoded == st.window_copies == 6
    assert st.tiles_scratch == 0


def test_region_reads_match_nvimagecodec_path(tcga_j2k):
    with wsitool.open_slide(tcga_j2k) as slide:
        for mode in ("rgb", "rgba", "raw"):
            a = slide.read_region((77, 1234), 0, (900, 700), mode=mode, threads=2)
            with decode_paths(openjpeg=False):
                b = slide.read_region((77, 1234), 0, (900, 700), mode=mode, threads=2)
            assert np.array_equal(a, b), mode


def test_header_checks_hold_on_this_path(tcga_j2k):
    state = get_pool().state()
    with wsitool.open_slide(tcga_j2k) as slide:
        lv = slide._pyramid.levels[0]
        data = read_tile_bytes(lv, 0, 0, 0, state.stats)
        dst = np.empty((10, 10, 3), np.uint8)
        # truncated main header: refused before OpenJPEG sees it
        with pytest.raises(TileDecodeError, match="truncated"):
            openjpeg.decode_into(lv, 0, 0, data[:30], dst, (0, 0, 10, 10), state)
        # SIZ declaring 8000 x 8000 inside a 256 x 256 cell: a bomb, refused
        i = data.index(b"\xff\x51")
        bomb = bytearray(data)
        bomb[i + 6:i + 10] = (8000).to_bytes(4, "big")
        bomb[i + 10:i + 14] = (8000).to_bytes(4, "big")
        with pytest.raises(TileDecodeError, match="8000x8000"):
            openjpeg.decode_into(lv, 0, 0, bytes(bomb), dst, (0, 0, 10, 10), state)
        # tile data cut short: OpenJPEG's error, worded, never a crash
        with pytest.raises(TileDecodeError):
            openjpeg.decode_into(lv, 0, 0, data[: len(data) // 2], dst, (0, 0, 10, 10), state)
        with pytest.raises(TileDecodeError, match="outside"):
            openjpeg.decode_into(lv, 0, 0, data, dst, (250, 250, 260, 260), state)


def test_one_context_per_thread(tcga_j2k):
    import threading
    pool = get_pool()
    seen = []
    with wsitool.open_slide(tcga_j2k) as slide:
        def work():
            slide.read_region((0, 0), 0, (300, 300), mode="rgb", threads=1)
            seen.append(pool.state()._slots["openjpeg"])  # the objects: ids of freed ones recur
        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len({id(c) for c in seen}) == 3


def test_main_header_facts_and_the_fallback_past_n_l(tcga_j2k):
    """One header walk gives the checks, the code stream range, the SIZ size and N_L; a
    reduction deeper than N_L is not taken by the OpenJPEG path (the caller falls back)."""
    from wsitool.codec.library import nv
    from wsitool.ground.bitstream import j2k_main_header

    with wsitool.open_slide(tcga_j2k) as slide:
        lv = pyramid_levels(slide)[0]
        state = get_pool().state()
        data = bytes(read_tile_bytes(lv, 0, 0, 0, state.stats))
        header = j2k_main_header(data)
        assert header.problem is None and (header.start, header.end) == (0, len(data))
        assert (header.width, header.height) == (lv.tile_width, lv.tile_height)
        assert header.levels == 5  # Aperio's (COD SPcod byte 0)
        # a JP2 file: the range is the jp2c box's content, the same facts inside
        tile = np.zeros((64, 48, 3), np.uint8)
        jp2 = bytes(nv().Encoder(device_id=nv().NVIMGCODEC_DEVICE_CPU_ONLY,
                                 backends=[nv().Backend(nv().BackendKind.CPU_ONLY)]).encode(tile, "jpeg2k"))
        wrapped = j2k_main_header(jp2)
        assert wrapped.problem is None and wrapped.start > 0 and (wrapped.width, wrapped.height) == (48, 64)
        assert j2k_main_header(data[:40]).problem == "JPEG 2000 main header truncated"
        # N_L = 5: a 1/32 read decodes from the wavelet levels, a 1/64 one is not this path's
        if not openjpeg.available():
            pytest.skip("no libopenjp2")
        small = np.empty((8, 8, 3), np.uint8)
        assert openjpeg.decode_into(lv, 0, 0, data, small, (0, 0, 8, 8), state, reduce=5)
        tiny = np.empty((4, 4, 3), np.uint8)
        assert not openjpeg.decode_into(lv, 0, 0, data, tiny, (0, 0, 4, 4), state, reduce=6)
