"""Decode pool: fast path vs reference path, caller buffers, per-thread decoders, concurrency."""

from __future__ import annotations

import contextlib
import threading
import time
import tracemalloc

import numpy as np
import pytest

import wsitool
from wsitool.codec.nvdecode import narrow_jpeg_crop
from wsitool.codec.paths import decode_paths
from wsitool.codec.pool import get_pool
from wsitool.ground.bitstream import jpeg_frame_size
from wsitool.ground.geometry import level_rect, plan_tiles
from wsitool.slide import pyramid_levels

from helpers import random_regions, repo_samples


def _nv_slides(cmu1_path):
    paths = [cmu1_path] + [p for p in repo_samples() if p.suffix == ".svs"]
    return paths


@pytest.fixture
def force_scratch():
    """A setter of ``DecodePaths.force_scratch`` for this test (restored afterwards)."""
    stack = contextlib.ExitStack()

    def set_(value: bool):
        stack.close()
        stack.enter_context(decode_paths(force_scratch=value))

    yield set_
    stack.close()


def _regions_with_every_tile_kind(lv, rng):
    """Interior tiles, edge tiles cut by the region, corner tiles, image-edge tiles."""
    tw, th = lv.tile_width, lv.tile_height
    regions = [
        (0, 0, min(lv.width, 3 * tw), min(lv.height, 2 * th)),          # whole tiles
        (tw // 3, th // 5, 2 * tw, tw + 17),                              # cut on all sides
        (lv.width - tw - 7, lv.height - th - 3, tw + 40, th + 40),        # bottom-right corner
        (-13, -9, tw // 2, th // 2),                                      # top-left corner outside
        (tw - 1, th - 1, 2, 2),                                           # 4 tiles, 1 pixel each
    ]
    regions += random_regions(rng, lv.width, lv.height, 12, max_size=700)
    return regions


def test_zero_copy_path_equals_scratch_path(cmu1, force_scratch, read_path):
    """Parity: decoding into the output's sub-views (whole tiles and JPEG
    sub-regions) gives byte-identical pixels to whole-tile scratch decoding."""
    rng = np.random.default_rng(7)
    pool = get_pool()
    for path in _nv_slides(cmu1):
        with wsitool.open_slide(path) as slide:
            for lv in pyramid_levels(slide):
                for (x, y, w, h) in _regions_with_every_tile_kind(lv, rng):
                    loc = (round(x * lv.downsample), round(y * lv.downsample))
                    force_scratch(False)
                    pool.reset_stats()
                    fast = slide.read_region(loc, lv.index, (w, h), mode="rgb")
                    fast_stats = pool.stats()
                    force_scratch(True)
                    pool.reset_stats()
                    ref = slide.read_region(loc, lv.index, (w, h), mode="rgb")
                    ref_stats = pool.stats()
                    assert np.array_equal(fast, ref), (path.name, lv.index, (x, y, w, h))
                    assert ref_stats.tiles_direct == ref_stats.tiles_roi == 0
                    # the only scratch tiles of the fast path: windows one column wide at a
                    # tile's left edge, decoded whole (nvdecode.narrow_jpeg_crop)
                    rx, ry = level_rect(lv, *loc)
                    narrow = sum(1 for j in plan_tiles(lv, rx, ry, w, h)[1]
                                 if narrow_jpeg_crop(lv, j.src, min(lv.tile_width, lv.width - j.col * lv.tile_width)))
                    assert fast_stats.tiles_scratch == narrow
                    assert ref_stats.tiles_scratch == (fast_stats.tiles_direct + fast_stats.tiles_roi
                                                       + fast_stats.tiles_scratch)


def test_fast_path_really_used(cmu1, read_path):
    pool = get_pool()
    with wsitool.open_slide(cmu1) as slide:
        pool.reset_stats()
        slide.read_region((100, 100), 0, (1000, 800), mode="rgb")
        st = pool.stats()
    assert st.tiles_direct > 0 and st.tiles_roi > 0 and st.tiles_scratch == 0


def test_decoder_writes_into_callers_buffer(cmu1, read_path):
    with wsitool.open_slide(cmu1) as slide:
        out = np.zeros((960, 960, 3), np.uint8)
        pool = get_pool()
        pool.reset_stats()
        result = slide.read_region((240, 480), 0, (960, 960), mode="rgb", out=out)
        assert result is out
        assert out.any()
        assert pool.stats().tiles_direct == 16  # 4x4 whole tiles, aligned
        # the in-place result equals the reference path (whole tiles into scratch, then copied)
        with decode_paths(force_scratch=True):
            reference = slide.read_region((240, 480), 0, (960, 960), mode="rgb")
        assert np.array_equal(out, reference)


def test_repeated_reads_into_out_allocate_no_region_sized_arrays(cmu1, read_path):
    with wsitool.open_slide(cmu1) as slide:
        for mode, channels in (("rgb", 3), ("rgba", 4)):
            out = np.empty((1024, 1024, channels), np.uint8)
            slide.read_region((37, 41), 0, (1024, 1024), mode=mode, out=out, threads=2)  # warm-up
            tracemalloc.start()
            try:
                for i in range(5):
                    slide.read_region((37 + i * 50, 41), 0, (1024, 1024), mode=mode, out=out, threads=2)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert peak < out.nbytes // 4, (mode, peak)


def test_each_thread_has_its_own_decoder(sample_jpeg):
    seen = {}
    lock = threading.Lock()
    pool = get_pool()
    barrier = threading.Barrier(4)

    def work(k):
        barrier.wait()
        st = pool.state()
        dec = st.decoder
        with lock:
            seen[k] = (st, dec)  # keep the objects alive so ids stay unique

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    states = {id(v[0]) for v in seen.values()}
    decoders = {id(v[1]) for v in seen.values()}
    locks = {id(v[0].lock) for v in seen.values()}
    assert len(states) == len(decoders) == len(locks) == 4
    # a second call on the same thread reuses the same decoder
    st = pool.state()
    assert st.decoder is pool.state().decoder


def test_sixteen_threads_match_serial_reads(cmu1, tcga_j2k, read_path):
    """16 threads share one Slide and read random regions for a few seconds;
    every result equals the same read done serially beforehand."""
    rng = np.random.default_rng(99)
    jobs = []
    with wsitool.open_slide(cmu1) as a, wsitool.open_slide(tcga_j2k) as b:
        for slide in (a, b):
            for lv in pyramid_levels(slide):
                for (x, y, w, h) in random_regions(rng, lv.width, lv.height, 10, max_size=400):
                    loc = (round(x * lv.downsample), round(y * lv.downsample))
                    jobs.append((slide, loc, lv.index, (w, h)))
        expected = [s.read_region(loc, lvl, size, threads=1) for (s, loc, lvl, size) in jobs]
        stop = time.monotonic() + 3.0
        errors = []
        counts = [0] * 16

        def worker(k: int):
            r = np.random.default_rng(k)
            try:
                while time.monotonic() < stop:
                    i = int(r.integers(len(jobs)))
                    s, loc, lvl, size = jobs[i]
                    got = s.read_region(loc, lvl, size, threads=int(r.integers(1, 3)))
                    if not np.array_equal(got, expected[i]):
                        errors.append((k, i))
                    counts[k] += 1
            except Exception as exc:  # pragma: no cover - reported below
                errors.append((k, repr(exc)))

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors[:5]
    assert sum(counts) >= 16


def test_decode_returning_none_is_an_error_not_a_blank(sample_jpeg, tmp_path, read_path):
    """A tile whose entropy-coded data is cut makes libjpeg-turbo give up; the
    decoder's None must become a TileDecodeError naming the tile."""
    import tifffile

    data = bytearray(sample_jpeg.read_bytes())
    with tifffile.TiffFile(sample_jpeg) as tf:
        page = tf.pages[0]
        off, count = page.dataoffsets[5], page.databytecounts[5]
        across = -(-page.imagewidth // page.tilewidth)
    # keep the headers and 40 % of the scan data, no EOI: libjpeg-turbo stops early
    tile = bytes(data[off:off + count])
    cut = tile[: len(tile) * 4 // 10]
    data[off:off + len(cut)] = cut
    bad = tmp_path / "cut.svs"
    bad.write_bytes(bytes(data))
    # patch the byte count so the reader sees the short tile
    with tifffile.TiffFile(bad) as tf:
        tag = tf.pages[0].tags["TileByteCounts"]
        item = {3: 2, 4: 4, 16: 8}[int(tag.dtype)]
        pos = tag.valueoffset + 5 * item
    raw = bytearray(bad.read_bytes())
    raw[pos:pos + item] = len(cut).to_bytes(item, "little")
    bad.write_bytes(bytes(raw))
    with wsitool.open_slide(bad) as slide:
        lv = pyramid_levels(slide)[0]
        x, y = (5 % across) * lv.tile_width, (5 // across) * lv.tile_height
        with pytest.raises(wsitool.TileDecodeError) as info:
            slide.read_region((x, y), 0, (lv.tile_width, lv.tile_height), mode="rgb")
        assert (info.value.col, info.value.row) == (5 % across, 5 // across)
        # the slide is still usable for good tiles
        assert slide.read_region((0, 0), 0, (100, 100), mode="rgb").any()


def test_jpeg_frame_size_parser():
    import imagecodecs

    img = np.zeros((37, 53, 3), np.uint8)
    stream = imagecodecs.jpeg8_encode(img)
    assert jpeg_frame_size(stream) == (53, 37)
    assert jpeg_frame_size(b"\x11\x00garbage") is None
    assert jpeg_frame_size(stream[:4]) is None
    # abbreviated stream with no SOF before SOS
    assert jpeg_frame_size(b"\xff\xd8\xff\xda\x00\x02") is None


def test_decoder_that_cannot_be_made_is_device_unavailable(monkeypatch):
    """nvImageCodec refusing to make a decoder is one DeviceUnavailableError naming the device."""
    from wsitool.codec import pool as pool_mod
    from wsitool.codec.library import nv
    from wsitool.errors import DeviceUnavailableError

    class Refusing:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("no backend")

    fresh = pool_mod.DecoderPool("cpu")
    monkeypatch.setattr(nv(), "Decoder", Refusing)
    with pytest.raises(DeviceUnavailableError, match="could not create an nvImageCodec decoder for cpu"):
        fresh._create_decoder()


def test_ended_threads_leave_their_counts_not_their_bookkeeping():
    """Each export starts reader and encoder threads: the pool must not keep a record per
    thread that has ended, yet its counters must still include what those threads did."""
    import gc

    path = next(p for p in repo_samples() if p.name == "sample-aperio-jpeg.svs")
    pool = get_pool("cpu")
    with wsitool.open_slide(path) as s:
        s.read_region((0, 0), 0, (8, 8), threads=1)
        gc.collect()
        live = len(pool._all_stats)
        before = pool.stats().tiles_decoded

        def work():
            with decode_paths(native=False):  # the Python path counts in this thread's state
                s.read_region((0, 0), 0, (256, 256), threads=1)

        for _ in range(20):
            t = threading.Thread(target=work)
            t.start()
            t.join()
        gc.collect()
    assert len(pool._all_stats) <= live + 1  # not one per ended thread
    assert pool.stats().tiles_decoded - before >= 20  # their decodes still counted


def test_a_thread_state_finalizer_never_takes_the_pool_lock():
    """The garbage collector runs a dead thread's finalizer inside whatever the current thread is
    doing; CI once hung with a thread holding the pool's create lock (making a decoder in
    ``ThreadState.slot``) and the collection calling ``_retire``, which took the same lock."""
    import threading

    from wsitool.codec.pool import DecoderPool, DecodeStats

    pool = DecoderPool("cpu")
    gone = DecodeStats()
    gone.tiles_decoded = 7
    pool._all_stats.append(gone)

    def inside_the_lock():
        with pool._create_lock:    # as slot() holds it around factory()
            pool._retire(gone)     # as a collection inside factory() would call it

    t = threading.Thread(target=inside_the_lock, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "the finalizer blocked on the pool lock"
    assert pool.stats().tiles_decoded == 7 and gone not in pool._all_stats   # folded in, counted once
