"""The fast read path: tile bytes read behind the JPEG prefix, RGBA widening,
the shared job queue across threads, and read-ahead advice."""

from __future__ import annotations

import numpy as np
import pytest

import wsitool
from wsitool.codec.paths import decode_paths
from wsitool.codec.pool import get_pool
from wsitool.codec.tilebytes import jpeg_stream, read_tile_bytes, read_tile_stream
from wsitool.ground.geometry import plan_tiles
from wsitool.read import fill, worker
from wsitool.read import threads as read_threads
from wsitool.slide import pyramid_levels
from wsitool.storage import local

from helpers import random_regions, repo_samples, with_byte_count, with_tile_bytes


def _nv_slides(cmu1):
    return [cmu1] + [p for p in repo_samples() if p.suffix == ".svs"]


def test_read_tile_stream_is_prefix_plus_tile(cmu1, tcga_j2k):
    """The buffer path yields byte for byte the stream the bytes path builds."""
    for path in (cmu1, tcga_j2k):
        with wsitool.open_slide(path) as slide:
            lv = pyramid_levels(slide)[0]
            state = get_pool("cpu").state()
            for index in (0, 1, lv.tiles_across + 1, len(lv.tiles.offsets) - 1):
                col, row = index % lv.tiles_across, index // lv.tiles_across
                data = read_tile_bytes(lv, index, col, row, state.stats)
                expected = jpeg_stream(lv, data, col, row) if lv.encoding.stream == "jpeg" else data
                got = read_tile_stream(lv, index, col, row, state)
                assert bytes(got) == expected


def test_tile_without_soi_is_a_tile_error(sample_jpeg, tmp_path, read_path):
    bad = with_tile_bytes(sample_jpeg, tmp_path, 0, lambda b: b"\x00\x00" + b[2:])
    with wsitool.open_slide(bad) as slide:
        with pytest.raises(wsitool.TileDecodeError, match="not a JPEG stream") as info:
            slide.read_region((0, 0), 0, (64, 64), mode="rgb")
        assert (info.value.col, info.value.row) == (0, 0)
        with pytest.warns(wsitool.TileWarning):
            out = slide.read_region((0, 0), 0, (64, 64), on_error="fill")
        assert not out.any()


def test_truncated_file_is_a_tile_error(sample_jpeg, tmp_path, read_path):
    data = sample_jpeg.read_bytes()
    with wsitool.open_slide(sample_jpeg) as slide:
        lv = pyramid_levels(slide)[0]
        last = int(np.argmax(lv.tiles.offsets[: lv.tiles_across * lv.tiles_down]))
        cut_at = int(lv.tiles.offsets[last]) + 10
        col, row = last % lv.tiles_across, last // lv.tiles_across
        loc = (col * lv.tile_width, row * lv.tile_height)
    short = tmp_path / "short.svs"
    short.write_bytes(data[:cut_at])
    try:
        slide = wsitool.open_slide(short)
    except wsitool.WsiError:
        pytest.skip("tifffile refuses the cut file before any tile read")
    with slide, pytest.raises(wsitool.TileDecodeError, match="truncated file"):
        slide.read_region(loc, 0, (16, 16), mode="rgb")


@pytest.mark.parametrize("threads", [1, 3])
def test_rgba_is_rgb_plus_opaque_alpha(cmu1, threads, read_path):
    """The widened RGBA path gives the RGB pixels and alpha 255 inside, 0 outside,
    for every kind of tile cut, on one thread and on the shared job queue."""
    rng = np.random.default_rng(11)
    for path in _nv_slides(cmu1):
        with wsitool.open_slide(path) as slide:
            for lv in pyramid_levels(slide):
                for xl, yl, w, h in random_regions(rng, lv.width, lv.height, 8, max_size=500):
                    loc = (round(xl * lv.downsample), round(yl * lv.downsample))
                    rgb = slide.read_region(loc, lv.index, (w, h), mode="rgb", threads=threads)
                    rgba = slide.read_region(loc, lv.index, (w, h), threads=threads)
                    assert np.array_equal(rgba[..., :3], rgb)
                    alpha = rgba[..., 3]
                    assert set(np.unique(alpha)) <= {0, 255}
                    assert not rgba[alpha == 0].any()


def test_rgba_widening_matches_scratch_path(cmu1, monkeypatch):
    with wsitool.open_slide(cmu1) as slide:
        loc, size = (117, 95), (700, 530)
        fast = slide.read_region(loc, 0, size)
        get_pool("cpu").reset_stats()
        with decode_paths(force_scratch=True):
            ref = slide.read_region(loc, 0, size)
        assert get_pool("cpu").stats().tiles_scratch > 0
    assert np.array_equal(fast, ref)


def test_widen_rgba_exact_on_small_buffers():
    rng = np.random.default_rng(3)
    for h, w in ((1, 1), (1, 5), (3, 1), (7, 13)):
        rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        flat = np.empty(h * w * 3 + 4, np.uint8)
        flat[: h * w * 3] = rgb.ravel()
        flat[h * w * 3:] = 0x5A
        out = np.zeros((h + 2, w + 2, 4), np.uint8)
        out32 = out.view("<u4").reshape(h + 2, w + 2)
        worker.widen_rgba(flat, h, w, out32[1:1 + h, 1:1 + w])
        assert np.array_equal(out[1:1 + h, 1:1 + w, :3], rgb)
        assert (out[1:1 + h, 1:1 + w, 3] == 255).all()
        out[1:1 + h, 1:1 + w] = 0
        assert not out.any()  # nothing written outside the destination


def test_shared_queue_hands_each_job_out_once():
    import threading

    jobs = list(range(1000))
    shared = read_threads.SharedJobs(jobs)
    seen: list[int] = []
    lock = threading.Lock()

    def take():
        for j in shared:
            with lock:
                seen.append(j)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == jobs
    stopped = read_threads.SharedJobs(jobs)
    next(stopped)
    stopped.stop()
    assert list(stopped) == []


def test_error_on_one_thread_stops_the_region(sample_jpeg, tmp_path, read_path):
    """A corrupt tile on any worker raises from read_region (after all workers end)."""
    bad = with_tile_bytes(sample_jpeg, tmp_path, 1, lambda b: b"\x00\x00" + b[2:])
    with wsitool.open_slide(bad) as slide:
        lv = pyramid_levels(slide)[0]
        with pytest.raises(wsitool.TileDecodeError):
            slide.read_region((0, 0), 0, (min(lv.width, 4 * lv.tile_width), lv.tile_height * 2),
                              mode="rgb", threads=4)


def test_prefetch_advises_the_region_bytes(cmu1, monkeypatch, read_path):
    calls = []
    monkeypatch.setattr(local.os, "posix_fadvise", lambda fd, off, n, advice: calls.append((off, n)),
                        raising=False)
    monkeypatch.setattr(local.os, "POSIX_FADV_WILLNEED", 3, raising=False)
    with wsitool.open_slide(cmu1) as slide:
        lv = pyramid_levels(slide)[0]
        rx0, ry0, w, h = 100, 130, 3 * lv.tile_width, 3 * lv.tile_height
        slide.read_region((rx0, ry0), 0, (w, h), mode="rgb", threads=1)
        _, jobs = plan_tiles(lv, rx0, ry0, w, h)
        assert len({j.row for j in jobs}) >= local.ADVISE_MIN_RANGES  # (one range a row)
        covered = []
        for col, row, _s, _d in jobs:
            i = row * lv.tiles_across + col
            off, cnt = int(lv.tiles.offsets[i]), int(lv.tiles.bytecounts[i])
            covered.append(any(a <= off and off + cnt <= a + n for a, n in calls))
        assert all(covered)
        calls.clear()
        slide.read_region((rx0, ry0), 0, (10, 10), mode="rgb", threads=1)  # one tile: no advice
        assert calls == []


@pytest.mark.parametrize("threads", [1, 2])
def test_batched_decode_equals_per_tile_decode(cmu1, monkeypatch, threads, python_path):
    """Batches of code streams in one decode call give the per-tile pixels and counts."""
    rng = np.random.default_rng(5)
    with wsitool.open_slide(cmu1) as slide:
        lv = pyramid_levels(slide)[0]
        regions = random_regions(rng, lv.width, lv.height, 6, max_size=900)
        regions.append((0, 0, lv.width, lv.height))
        pool = get_pool("cpu")
        got, counts = [], []
        for batch in (worker.BATCH_TILES, 1):
            monkeypatch.setattr(fill, "BATCH_TILES", batch)
            pool.reset_stats()
            got.append([slide.read_region((x, y), 0, (w, h), mode="rgb", threads=threads)
                        for x, y, w, h in regions])
            st = pool.stats()
            counts.append((st.tiles_decoded, st.tiles_direct, st.tiles_roi, st.tiles_scratch))
        for a, b in zip(*got, strict=True):
            assert np.array_equal(a, b)
        assert counts[0] == counts[1] and counts[0][0] > 0


def test_bad_tile_inside_a_batch_is_named_and_filled(sample_jpeg, tmp_path, monkeypatch, python_path):
    """A tile the decoder gives up on, in the middle of a batch: the error names it
    (on_error="raise"), and with on_error="fill" only that tile is background and
    the result equals the per-tile path's."""
    with wsitool.open_slide(sample_jpeg) as slide:
        whole = int(pyramid_levels(slide)[0].tiles.bytecounts[1])
    bad = with_byte_count(sample_jpeg, tmp_path, 1, whole * 4 // 10)  # libjpeg-turbo gives up
    with wsitool.open_slide(bad) as slide:
        lv = pyramid_levels(slide)[0]
        size = (min(lv.width, 4 * lv.tile_width), min(lv.height, 2 * lv.tile_height))
        with pytest.raises(wsitool.TileDecodeError) as info:
            slide.read_region((0, 0), 0, size, mode="rgb", threads=1)
        assert (info.value.col, info.value.row) == (1, 0)
        outs = []
        for batch in (worker.BATCH_TILES, 1):
            monkeypatch.setattr(fill, "BATCH_TILES", batch)
            get_pool("cpu").reset_stats()
            with pytest.warns(wsitool.TileWarning):
                outs.append(slide.read_region((0, 0), 0, size, mode="rgb", threads=1,
                                              on_error="fill"))
            assert get_pool("cpu").stats().tiles_failed == 1
        assert np.array_equal(outs[0], outs[1])
        tw, th = lv.tile_width, lv.tile_height
        assert not outs[0][:th, tw:2 * tw].any()   # the bad tile is background
        assert outs[0][:th, :tw].any()             # its neighbours are decoded


def test_rgba_keeps_one_wrapped_scratch_per_tile_size(sample_jpeg, python_path):
    """RGBA reads reuse the thread's wrapped whole-tile scratch, and never keep one
    per partial-tile shape (which would grow with every odd region)."""
    rng = np.random.default_rng(21)
    with wsitool.open_slide(sample_jpeg) as slide:
        lv = pyramid_levels(slide)[0]
        for xl, yl, w, h in random_regions(rng, lv.width, lv.height, 25, max_size=700):
            rgba = slide.read_region((xl, yl), 0, (w, h), threads=1)
            assert np.array_equal(rgba[..., :3],
                                  slide.read_region((xl, yl), 0, (w, h), mode="rgb", threads=1))
        kept = get_pool("cpu").state().tile_shapes()
    whole = (lv.tile_height, lv.tile_width, lv.tile_height, lv.tile_width)
    assert whole in kept
    assert all(key[:2] == key[2:] for key in kept)  # whole-tile shapes only


def test_jpeg2000_tiles_are_not_batched(sample_jpeg, monkeypatch, python_path):
    """JPEG 2000 tiles (milliseconds each) go to the threads one by one; JPEG tiles
    in batches.  Both give the single-thread pixels."""
    flushed = []
    real_flush = worker.TileWorker.flush

    def spy(self, pending, state):
        flushed.append((self.lv.encoding.stream, len(pending)))
        return real_flush(self, pending, state)

    monkeypatch.setattr(worker.TileWorker, "flush", spy)
    for path in (sample_jpeg, sample_jpeg.with_name("sample-aperio-j2k.svs")):
        with wsitool.open_slide(path) as slide:
            lv = pyramid_levels(slide)[0]
            size = (min(lv.width, 3 * lv.tile_width), min(lv.height, 3 * lv.tile_height))
            two = slide.read_region((0, 0), 0, size, mode="rgb", threads=2)
            one = slide.read_region((0, 0), 0, size, mode="rgb", threads=1)
            assert np.array_equal(one, two)
    kinds = {kind for kind, _n in flushed}
    assert kinds == {"jpeg"}
    assert max(n for _k, n in flushed) > 1


def test_out_with_a_length_one_axis_of_any_stride(sample_jpeg, read_path):
    """numpy calls an array C-contiguous whatever the stride of a length-1 axis;
    such an ``out`` (here a transposed one-pixel-wide column) is filled like a
    fresh one on the batched path, on one thread and on two."""
    with wsitool.open_slide(sample_jpeg) as slide:
        lv = pyramid_levels(slide)[0]
        h = min(lv.height, 5 * lv.tile_height)
        ref = slide.read_region((lv.tile_width // 2, 0), 0, (1, h), mode="rgb", threads=1)
        for threads in (1, 2):
            out = np.empty((1, h, 3), np.uint8).transpose(1, 0, 2)
            assert out.flags.c_contiguous and out.strides[1] != 3
            got = slide.read_region((lv.tile_width // 2, 0), 0, (1, h), mode="rgb",
                                    threads=threads, out=out)
            assert got is out
            assert np.array_equal(out, ref)


@pytest.mark.parametrize("mode", ["rgb", "rgba"])
@pytest.mark.parametrize("threads", [1, 2])
def test_one_column_at_a_tiles_left_edge_equals_the_whole_tile_decode(tmp_path, read_path, mode, threads):
    """4:2:0 JPEG tiles: a window one column wide at a tile's left edge, which
    libjpeg-turbo's crop decodes without fancy upsampling (up to 111 off), equals the
    whole-tile decode cropped, on both read paths (nvdecode.narrow_jpeg_crop)."""
    import tifffile

    from wsitool.codec.paths import decode_paths

    rng = np.random.default_rng(0)
    img = (np.cumsum(rng.integers(0, 255, (512, 512, 3)), axis=1) // 64 % 256).astype(np.uint8)
    path = tmp_path / "ycbcr420.tif"
    tifffile.imwrite(path, img, tile=(128, 128), compression="jpeg", compressionargs={"level": 90},
                     photometric="ycbcr", subsampling=(2, 2))
    with wsitool.open_slide(path) as slide:
        tw, th = pyramid_levels(slide)[0].tile_size
        for x0, w in ((0, 1), (0, 2), (1, 1), (tw - 1, 2)):
            for y0, h in ((0, 1), (3, 8), (5, 300)):
                loc = (tw + x0, th + y0)
                got = slide.read_region(loc, 0, (w, h), mode=mode, threads=threads)
                with decode_paths(roi_decode=False):  # the reference: whole tiles, cropped
                    ref = slide.read_region(loc, 0, (w, h), mode=mode, threads=threads)
                assert np.array_equal(got, ref), (x0, w, y0, h)
        # the same window on the region's far right: the region ends one column into a tile
        loc = (tw - 37, th)
        got = slide.read_region(loc, 0, (38, 64), mode=mode, threads=threads)
        with decode_paths(roi_decode=False):
            assert np.array_equal(got, slide.read_region(loc, 0, (38, 64), mode=mode, threads=threads))
