"""Batch patch reads (``Slide.read_patches``): every patch equals ``read_region`` bit for bit, each tile
decoded once per batch, validation before any decode."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import wsitool
from wsitool import InvalidRegionError, ResourceLimitError, TileDecodeError
from wsitool.codec.pool import get_pool
from wsitool.errors import TileWarning
from wsitool.ground.areafilter import reduce_area
from wsitool.slide import pyramid_levels

from helpers import REPO_SAMPLES, SHARED_SAMPLES, shared_sample, with_tile_bytes

#: Slides of each kind the batch reader must match ``read_region`` on (by name: nothing opened at import).
SHARED = [
    "aperio-cmu1-small-region-jpeg.svs",          # JPEG SVS (compiled loop or Python path)
    "aperio-tcga-cr-7395-jp2k-33005-2level.svs",  # JPEG 2000 SVS (OpenJPEG windows)
    "dicom-cmu1-small-region-12level",            # DICOM series, 12 levels
    "generic-bigtiff-zstd-5level-10000x5000.tiff",  # generic tiled TIFF (tifffile/imagecodecs)
    "tiled-jpeg-ycbcr-48x32tiles-2pages.tif",     # JPEG YCbCr, colour transform after decoding
]


def _open(name: str) -> wsitool.Slide:
    path = REPO_SAMPLES / name if name.startswith("sample-") else shared_sample(name)
    return wsitool.open_slide(path)


def _locations(rng, slide, level: int, n: int, size) -> np.ndarray:
    """Level-0 corners: inside, straddling every edge, and wholly outside the level."""
    lv = pyramid_levels(slide)[level]
    ds = lv.downsample
    w, h = size
    xs = rng.integers(-w, lv.width + 16, n)
    ys = rng.integers(-h, lv.height + 16, n)
    xs[: n // 3] = rng.integers(0, max(1, lv.width - w), n // 3)  # a third wholly inside
    return np.stack([np.round(xs * ds), np.round(ys * ds)], 1).astype(np.int64)


def _reference(slide, locs, level, size, mode="rgb"):
    return np.stack([slide.read_region((int(x), int(y)), level, size, mode=mode) for x, y in locs])


@pytest.mark.parametrize("name", ["sample-aperio-jpeg.svs", *SHARED])
def test_patches_equal_read_region_on_each_kind_of_slide(name, read_path):
    rng = np.random.default_rng(7)
    with _open(name) as slide:
        mode = "rgb" if pyramid_levels(slide)[0].encoding.rgb_problem is None else "raw"
        for level in sorted({0, slide.level_count - 1}):
            size = (96, 80)
            locs = _locations(rng, slide, level, 24, size)
            want = _reference(slide, locs, level, size, mode)
            for batch_size, threads in ((1, 1), (5, 2), (64, 1), (7, 3)):
                got = list(slide.read_patches(locs, size, level=level, batch_size=batch_size, mode=mode,
                                              threads=threads))
                assert [len(b) for b in got] == [min(batch_size, len(locs) - i)
                                                 for i in range(0, len(locs), batch_size)]
                np.testing.assert_array_equal(np.concatenate(got), want,
                                              err_msg=f"{name} level {level} batch {batch_size}")


@pytest.mark.parametrize("mode", ["rgba", "raw"])
def test_modes_and_the_out_form(mode, read_path):
    rng = np.random.default_rng(1)
    with _open("sample-aperio-jpeg.svs") as slide:
        locs = _locations(rng, slide, 0, 30, (200, 150))
        want = _reference(slide, locs, 0, (200, 150), mode)
        out = np.full(want.shape, 77, want.dtype)
        assert slide.read_patches(locs, (200, 150), mode=mode, batch_size=8, out=out, threads=2) is out
        np.testing.assert_array_equal(out, want)
        assert want[..., 3].min() == 0 if mode == "rgba" else True  # some pixels outside: alpha 0


def test_a_tall_grid_larger_than_tiles_and_sequences_of_pairs():
    with _open("sample-aperio-jpeg.svs") as slide:
        lv = pyramid_levels(slide)[1]
        locs = [(int(x * lv.downsample), int(y * lv.downsample))
                for y in range(-37, lv.height, 300) for x in range(-13, lv.width, 300)]
        size = (lv.tile_width * 2 + 17, lv.tile_height + 5)  # spans three tile columns, two rows
        got = np.concatenate(list(slide.read_patches(locs, size, level=1, batch_size=3)))
        np.testing.assert_array_equal(got, _reference(slide, locs, 1, size))


def _touched_tiles(lv, locs, window):
    """The set of ``(row, col)`` tiles of ``lv`` the windows at level-0 ``locs`` touch."""
    tiles = set()
    for x, y in locs:
        lx, ly = math.floor(x / lv.downsample + 0.5), math.floor(y / lv.downsample + 0.5)
        x0, y0 = max(lx, 0), max(ly, 0)
        x1, y1 = min(lx + window[0], lv.width), min(ly + window[1], lv.height)
        if x1 <= x0 or y1 <= y0:
            continue
        for r in range(y0 // lv.tile_height, (y1 - 1) // lv.tile_height + 1):
            for c in range(x0 // lv.tile_width, (x1 - 1) // lv.tile_width + 1):
                tiles.add((r, c))
    return tiles


@pytest.mark.parametrize("name", ["sample-aperio-jpeg.svs", "aperio-tcga-cr-7395-jp2k-33005-2level.svs"])
def test_each_tile_is_decoded_once_per_batch(name, read_path):
    """Decoder counters: a batch decodes exactly the tiles its patches touch that the previous
    batch did not (a run the next batch needs is carried over); one batch: exactly its tiles."""
    with _open(name) as slide:
        lv = pyramid_levels(slide)[0]
        size = (lv.tile_width - 16, lv.tile_height - 16)   # unaligned: most tiles feed 2-4 patches
        locs = [(37 + i * size[0], 41 + j * size[1]) for j in range(4) for i in range(5)]
        pool = get_pool("cpu")
        pool.reset_stats()
        list(slide.read_patches(locs, size, batch_size=len(locs), threads=2))
        every = _touched_tiles(lv, locs, size)
        assert pool.stats().tiles_decoded == len(every) < 4 * len(locs) / 2
        previous: set = set()
        pool.reset_stats()
        for j, batch in enumerate(slide.read_patches(locs, size, batch_size=6, threads=1)):
            del batch
            tiles = _touched_tiles(lv, locs[6 * j:6 * j + 6], size)
            decoded = pool.stats().tiles_decoded
            pool.reset_stats()
            assert decoded == len(tiles - previous), f"batch {j}"
            previous = tiles


def test_the_decoded_tile_cache_is_honoured():
    path = REPO_SAMPLES / "sample-aperio-jpeg.svs"
    locs = [(10 + 100 * i, 20 + 90 * j) for j in range(4) for i in range(4)]
    with wsitool.open_slide(path) as plain:
        want = np.concatenate(list(plain.read_patches(locs, (128, 128))))
    with wsitool.open_slide(path, cache=64 << 20) as slide:
        pool = get_pool("cpu")
        pool.reset_stats()
        first = np.concatenate(list(slide.read_patches(locs, (128, 128), batch_size=4)))
        cold = pool.stats().tiles_decoded
        second = np.concatenate(list(slide.read_patches(locs, (128, 128), batch_size=4)))
        assert pool.stats().tiles_decoded == cold > 0   # the second pass decodes nothing
    np.testing.assert_array_equal(first, want)
    np.testing.assert_array_equal(second, want)


@pytest.mark.parametrize("read_size", [(448, 448), (300, 250), (490.8, 490.8), (100.5, 60.25)])
def test_read_size_is_the_area_filter_of_the_larger_window(read_size, read_path):
    rng = np.random.default_rng(3)
    with _open("sample-aperio-jpeg.svs") as slide:
        size = (224, 112) if read_size[0] != read_size[1] else (224, 224)
        window = (math.ceil(read_size[0]), math.ceil(read_size[1]))
        locs = _locations(rng, slide, 0, 12, window)
        got = np.concatenate(list(slide.read_patches(locs, size, read_size=read_size, batch_size=5, threads=2)))
        for i, (x, y) in enumerate(locs):
            win = slide.read_region((int(x), int(y)), 0, window, mode="rgb")
            want = reduce_area(win, (0, 0, read_size[0], read_size[1]), size[0], size[1])
            np.testing.assert_array_equal(got[i], want, err_msg=f"patch {i}")


def test_a_corrupt_tile_raises_or_becomes_background(tmp_path, read_path):
    src = REPO_SAMPLES / "sample-aperio-jpeg.svs"
    bad = with_tile_bytes(src, tmp_path, 0, lambda b: b[:2] + bytes(len(b) - 2))
    locs = [(10, 10), (600, 500), (100, 30)]
    with wsitool.open_slide(bad) as slide:
        with pytest.raises(TileDecodeError, match="tile"):
            list(slide.read_patches(locs, (64, 64)))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = np.concatenate(list(slide.read_patches(locs, (64, 64), on_error="fill")))
        assert any(issubclass(w.category, TileWarning) for w in caught)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TileWarning)
            want = np.stack([slide.read_region(p, 0, (64, 64), mode="rgb", on_error="fill") for p in locs])
    np.testing.assert_array_equal(got, want)
    assert not got[0].any() and got[1].any()   # tile 0 is background, the other patch is not


def test_a_tile_corrupt_below_a_patch_does_not_blank_it(tmp_path, read_path):
    """A run is decoded over the box of all its patches (whole tiles where a later batch needs
    it), so a tile corrupt only below the rows one patch needs fails the run; that run's patches
    are then read one by one, as ``read_region`` reads them: the patch that needs only the clean
    rows gets them (with ``raise`` too), one that needs the corrupt rows fails or is background."""
    src = REPO_SAMPLES / "sample-aperio-jpeg.svs"
    # tile 8 (column 2, row 1 of 256 x 256 tiles): its second half of bytes zeroed
    bad = with_tile_bytes(src, tmp_path, 8, lambda b: b[:len(b) // 2] + bytes(len(b) - len(b) // 2))
    locs = [(517, 41), (757, 41), (517, 281), (37, 41)]  # 240 x 240: the first two touch rows 256..280 of tile 8
    with wsitool.open_slide(bad) as slide:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TileWarning)
            want = [slide.read_region(p, 0, (240, 240), mode="rgb", on_error="fill") for p in locs]
        assert want[0][215:, :239].any()  # read_region decodes the top rows of tile 8
        with pytest.raises(TileDecodeError):
            slide.read_region(locs[2], 0, (240, 240), mode="rgb")
        for batch_size, threads in ((1, 1), (2, 2), (4, 1), (3, 2)):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = np.concatenate(list(slide.read_patches(locs, (240, 240), batch_size=batch_size,
                                                             threads=threads, on_error="fill")))
            np.testing.assert_array_equal(got, np.stack(want), err_msg=f"batch {batch_size}")
            assert any(issubclass(w.category, TileWarning) for w in caught)  # patch 2's read warned
            # raise: the batches before the one holding patch 2 come back, that one raises
            it = slide.read_patches(locs, (240, 240), batch_size=batch_size, threads=threads)
            for k in range(2 // batch_size):
                np.testing.assert_array_equal(next(it), np.stack(want[k * batch_size:(k + 1) * batch_size]))
            with pytest.raises(TileDecodeError, match="tile"):
                next(it)


def test_requests_are_checked_when_called_before_any_decode():
    with _open("sample-aperio-jpeg.svs") as slide:
        pool = get_pool("cpu")
        pool.reset_stats()
        bad = [
            dict(locations=[(0, 0, 1)], size=(8, 8)),
            dict(locations=[(0.5, 0)], size=(8, 8)),
            dict(locations=np.zeros((2, 2), complex), size=(8, 8)),
            dict(locations=[(0, 0)], size=(0, 8)),
            dict(locations=[(0, 0)], size=(8, 8), batch_size=0),
            dict(locations=[(0, 0)], size=(8, 8), threads=0),
            dict(locations=[(0, 0)], size=(8, 8), level=9),
            dict(locations=[(0, 0)], size=(8, 8), mode="bgr"),
            dict(locations=[(0, 0)], size=(8, 8), on_error="ignore"),
            dict(locations=[(0, 0)], size=(8, 8), read_size=(-1, 4)),
            dict(locations=[(0, 0)], size=(8, 8), read_size=(float("nan"), 4)),
            dict(locations=[(0, 0)], size=(8, 8), read_size=("16", "16")),   # text is not a number
            dict(locations=[(0, 0)], size=(8, 8), read_size=(b"16", 16)),
            dict(locations=[(0, 0)], size=(8, 8), read_size=(np.float32(16), True)),
            dict(locations=[(0, 0)], size=(8, 8), out=np.zeros((2, 8, 8, 3), np.uint8)),
            dict(locations=[(0, 0)], size=(8, 8), device="tpu"),
        ]
        for kwargs in bad:
            with pytest.raises(InvalidRegionError):
                slide.read_patches(**kwargs)   # raised by the call, not by the first batch
        assert pool.stats().tiles_decoded == 0
        wsitool.set_limits(max_region_bytes=200_000)   # a tile (196,608 bytes) and 6 patches of 100 x 100
        with pytest.raises(ResourceLimitError, match="batch_size"):
            slide.read_patches([(0, 0)] * 20, (100, 100), batch_size=16)
        assert [len(b) for b in slide.read_patches([(0, 0)] * 20, (100, 100), batch_size=6)] == [6, 6, 6, 2]
        assert pool.stats().tiles_decoded > 0
        assert list(slide.read_patches(np.empty((0, 2), int), (8, 8))) == []


def test_read_size_needs_8_bit_samples():
    path = SHARED_SAMPLES / "dicom-highdicom-sm-gray16.dcm"
    if not path.exists():
        pytest.skip(f"needs {path}")
    with wsitool.open_slide(path) as slide, pytest.raises(InvalidRegionError, match="8-bit"):
        slide.read_patches([(0, 0)], (8, 8), mode="raw", read_size=(16, 16))


def test_cuda_without_a_gpu_is_one_clear_error():
    from wsitool.ground.device import cuda_available

    if cuda_available():
        pytest.skip("a CUDA device is present: tests/read/test_cuda.py covers the GPU")
    with _open("sample-aperio-jpeg.svs") as slide, pytest.raises(wsitool.DeviceUnavailableError):
        slide.read_patches([(0, 0)], (8, 8), device="cuda")


@pytest.mark.parametrize("codec", ["jpeg", "j2k"])
def test_patches_equal_read_region_on_a_bench_slide(tmp_path, codec):
    """The benchmark's slide kind (scripts/make_bench_slide.py: real tiles copied into a larger grid)."""
    from helpers import script_module

    shared_sample("aperio-cmu1-small-region-jpeg.svs")
    out = tmp_path / f"bench-{codec}.svs"
    assert script_module("make_bench_slide").main([str(out), "--width", "2600", "--height", "2000",
                                                   "--codec", codec, "--samples", str(SHARED_SAMPLES)]) == 0
    with wsitool.open_slide(out) as slide:
        locs = [(37 + 224 * i, 37 + 224 * j) for j in range(8) for i in range(11)]
        got = np.concatenate(list(slide.read_patches(locs, (224, 224), batch_size=16, threads=2)))
        np.testing.assert_array_equal(got, _reference(slide, locs, 0, (224, 224)))


def test_the_compiled_copy_equals_the_numpy_copy(monkeypatch):
    """The compiled loop decodes each run and copies its pieces into the patches in C
    (:func:`wsitool.read.patches.scatter.native_scatter`); the same batches through fill_region and
    numpy copies (the reference) are equal bit for bit: carried runs, edge windows, both modes."""
    from wsitool.codec import jpegloop
    from wsitool.read.patches import reader

    if jpegloop._load() is None:
        pytest.skip(f"compiled JPEG loop: {jpegloop.status()}")
    calls = {"decode": 0, "copy": 0}
    real_run, real_scatter = jpegloop.RegionJobs.run, jpegloop.scatter

    def counted_run(self, pool):
        calls["decode"] += self.scatter is not None
        return real_run(self, pool)

    def counted_scatter(*args):
        calls["copy"] += 1
        return real_scatter(*args)

    monkeypatch.setattr(jpegloop.RegionJobs, "run", counted_run)
    monkeypatch.setattr(jpegloop, "scatter", counted_scatter)
    with _open("sample-aperio-jpeg.svs") as slide:
        lv = pyramid_levels(slide)[0]
        size = (lv.tile_width - 16, lv.tile_height - 16)
        locs = [(-20 + i * size[0], 41 + j * size[1]) for j in range(4) for i in range(6)]
        locs += [(lv.width - 50, lv.height - 30)]
        for mode in ("rgb", "rgba"):
            for batch_size, threads in ((5, 1), (7, 2)):
                got = np.concatenate(list(slide.read_patches(locs, size, batch_size=batch_size, threads=threads,
                                                             mode=mode)))
                with monkeypatch.context() as m:
                    m.setattr(reader, "native_scatter", lambda *args: None)
                    want = np.concatenate(list(slide.read_patches(locs, size, batch_size=batch_size,
                                                                  threads=threads, mode=mode)))
                np.testing.assert_array_equal(got, want, err_msg=f"{mode} batch {batch_size}")
    assert calls["decode"] > 0 and calls["copy"] > 0  # both routes of the compiled copy were taken


def test_only_the_part_of_a_run_that_patches_need_is_decoded():
    """A run no later batch needs is cut to the box its patches cover (the decoder skips the
    rest of its tiles: ``tiles_roi``), a run the batch after next needs is decoded whole;
    every patch still equals ``read_region``, across batch sizes and both paths."""
    from wsitool.codec import jpegloop

    if jpegloop._load() is None:
        pytest.skip(f"compiled JPEG loop: {jpegloop.status()}")
    with _open("aperio-cmu1-small-region-jpeg.svs") as slide:
        lv = pyramid_levels(slide)[0]
        size = (lv.tile_width - 16, lv.tile_height - 16)
        # a grid whose edges cut tiles: its first and last rows and columns need part of them
        locs = [(lv.tile_width // 2 + i * size[0], lv.tile_height // 3 + j * size[1])
                for j in range(3) for i in range(4)]
        want = _reference(slide, locs, 0, size)
        pool = get_pool("cpu")
        for batch_size in (len(locs), 5, 3):
            pool.reset_stats()
            got = np.concatenate(list(slide.read_patches(locs, size, batch_size=batch_size, threads=1)))
            st = pool.stats()
            np.testing.assert_array_equal(got, want, err_msg=f"batch {batch_size}")
            assert st.tiles_roi > 0 and st.tiles_direct > 0, (batch_size, st)
            assert st.tiles_decoded == st.tiles_roi + st.tiles_direct


def test_the_compiled_copy_checks_its_pieces():
    """``jpegloop.scatter`` copies rectangles like numpy and refuses pieces out of bounds."""
    from wsitool.codec import jpegloop

    if jpegloop._load() is None:
        pytest.skip(f"compiled JPEG loop: {jpegloop.status()}")
    src = np.random.default_rng(3).integers(0, 256, (10, 12, 3), dtype=np.uint8)
    dest = np.zeros((2, 6, 7, 3), np.uint8)
    stride, patch = dest.strides[1], dest.strides[0]
    jpegloop.scatter(src, dest, np.array([[patch + 1 * stride + 2 * 3, stride, 3, 8, 4, 9]], np.int64))
    want = np.zeros_like(dest)
    want[1, 1:6, 2:7] = src[3:8, 4:9]
    np.testing.assert_array_equal(dest, want)
    for bad in ([patch + stride, stride, 3, 9, 4, 9],      # writes past the end of dest
                [0, stride, 8, 11, 0, 2],                 # reads past the last row of src
                [0, 3, 0, 2, 0, 5],                       # row stride shorter than a row
                [-1, stride, 0, 1, 0, 1]):
        with pytest.raises(ValueError, match="piece 0"):
            jpegloop.scatter(src, dest, np.array([bad], np.int64))
    # pieces of another dtype, even with bytes that read as a valid int64 piece: refused
    good = np.array([[0, stride, 0, 2, 0, 2]], np.int64)
    for other in (good.view(np.int32), good.view(np.uint8), good.view(np.float64), good.tobytes()):
        with pytest.raises(TypeError, match="int64"):
            jpegloop.scatter(src, dest, other)
    np.testing.assert_array_equal(dest, want)  # nothing copied


def test_run_buffers_are_kept_between_calls_within_the_bound(monkeypatch, read_path):
    """A call hands its run buffers on to the next (no fresh pages to fault in each pass), at
    most ``SPARE_BYTES`` of them; a call abandoned half-way hands them on too; the buffers'
    old pixels never reach a patch (each call equals ``read_region`` again)."""
    from wsitool.read.patches import buffers

    monkeypatch.setattr(buffers, "_spare", [])
    with _open("sample-aperio-jpeg.svs") as slide:
        lv = pyramid_levels(slide)[0]
        size = (lv.tile_width - 16, lv.tile_height - 16)
        locs = [(37 + i * size[0], 41 + j * size[1]) for j in range(4) for i in range(5)]
        want = _reference(slide, locs, 0, size)
        got = np.concatenate(list(slide.read_patches(locs, size, batch_size=6, threads=1)))
        np.testing.assert_array_equal(got, want)
        kept = list(buffers._spare)
        assert kept and sum(b.nbytes for b in kept) <= buffers.SPARE_BYTES
        got = np.concatenate(list(slide.read_patches(locs[::-1], size, batch_size=7, threads=1)))
        np.testing.assert_array_equal(got, want[::-1])
        assert {id(b) for b in buffers._spare} == {id(b) for b in kept}  # the same buffers, none new
        batches = slide.read_patches(locs, size, batch_size=6, threads=1)
        next(batches)
        buffers._spare.clear()
        batches.close()  # abandoned after one batch: its buffers (carried ones too) handed on
        assert len(buffers._spare) >= 1
        monkeypatch.setattr(buffers, "SPARE_BYTES", kept[0].nbytes)
        list(slide.read_patches(locs, size, batch_size=6, threads=1))
        assert len(buffers._spare) == 1
