"""Region reads: pixels against OpenSlide, output modes, validation before any decode."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

import wsitool
from wsitool import InvalidRegionError, ResourceLimitError, WsiError
from wsitool.codec.pool import get_pool
from wsitool.slide import pyramid_levels

from helpers import openslide_samples, random_regions, repo_samples, shared_sample

openslide = pytest.importorskip("openslide", reason="openslide-python is the test oracle")

# Files OpenSlide reads that we compare pixel for pixel.  Excluded, with reason:
# - OME-TIFF: OpenSlide has no OME support (it sees only the base image).
# - generic-jpeg-gray-3level-orientation6.tif: OpenSlide decodes it through
#   libtiff's TIFFRGBAImage, which mirrors the image for Orientation=6 (it can
#   flip but not rotate); wsitool, like OpenSlide's own JPEG path and tiffslide,
#   returns the stored pixel order.  Its twin with Orientation=0 is compared.
# - 16-bit / non-8-bit files: OpenSlide's 8-bit rendering is not a reference
#   for them; they are checked by the bug-input manifest in raw mode.
EXCLUDED = {"generic-jpeg-gray-3level-orientation6.tif"}


# The files OpenSlide reads, as tests/region_hashes.json records it (nothing is opened at import):
# the shared TIFF samples and the repo's own; a file whose first level is not 8-bit is skipped.
ORACLE = [p for p in openslide_samples() + repo_samples() if ".ome." not in p.name and p.name not in EXCLUDED]


def _aligned(rng, ds: float, lo: int, hi: int) -> int | None:
    """A level coordinate in [lo, hi) whose level-0 position round(c * ds) maps
    back to c within 0.002 pixel (OpenSlide interpolates sub-pixel offsets)."""
    if float(ds).is_integer():
        return int(rng.integers(lo, hi)) if hi > lo else lo
    for _ in range(5000):
        c = int(rng.integers(lo, hi)) if hi > lo else lo
        if abs(round(c * ds) / ds - c) < 0.002:
            return c
    return None


@pytest.mark.parametrize("path", ORACLE, ids=lambda p: p.name)
def test_pixels_equal_openslide(path):
    osr = openslide.OpenSlide(str(path))
    rng = np.random.default_rng(1234)
    with wsitool.open_slide(path) as slide:
        if pyramid_levels(slide)[0].dtype != np.uint8:
            pytest.skip(f"{path.name}: {pyramid_levels(slide)[0].dtype} pixels, OpenSlide renders 8-bit ones only")
        for lv in pyramid_levels(slide):
            lossy_j2k = lv.compression.startswith(("APERIO_JP2000", "JPEG2000"))
            tol = 2 if lossy_j2k else 0
            n_checked = 0
            for (x, y, w, h) in random_regions(rng, lv.width, lv.height, 40, max_size=400):
                if n_checked >= 20:
                    break
                if lv.index > 0:
                    x = _aligned(rng, lv.downsample, x, x + 1)
                    y = _aligned(rng, lv.downsample, y, y + 1)
                    if x is None or y is None:
                        # try a nearby coordinate that maps exactly
                        x = _aligned(rng, lv.downsample, 0, lv.width)
                        y = _aligned(rng, lv.downsample, 0, lv.height)
                        if x is None or y is None:
                            continue
                x0, y0 = round(x * lv.downsample), round(y * lv.downsample)
                if lv.index > 0 and (x0 < 0 or y0 < 0):
                    # OpenSlide truncates negative level coordinates towards zero
                    # and interpolates; compare negative locations at level 0 only.
                    continue
                ours = slide.read_region((x0, y0), lv.index, (w, h))
                theirs = np.asarray(osr.read_region((x0, y0), lv.index, (w, h)))
                assert ours.shape == theirs.shape == (h, w, 4)
                diff = np.abs(ours.astype(np.int16) - theirs).max()
                assert diff <= tol, (path.name, lv.index, (x0, y0, w, h), int(diff))
                n_checked += 1
            assert n_checked >= 20, (path.name, lv.index, n_checked)


def test_unreadable_aperio_tile_raises_tile_error():
    path = shared_sample("broken-aperio-unreadable-jpeg.svs")
    with wsitool.open_slide(path) as slide:
        with pytest.raises(wsitool.TileDecodeError) as info:
            slide.read_region((0, 0), 0, (16, 16))
        err = info.value
        assert (err.level, err.col, err.row) == (0, 0, 0) and err.path == str(path)
        with pytest.warns(wsitool.TileWarning):
            arr = slide.read_region((0, 0), 0, (16, 16), on_error="fill")
        assert not arr.any()


def test_cmu1_rgb_colours_are_he_not_green(cmu1):
    """Aperio JPEG/RGB tiles decoded as YCbCr come out green/pink: check the colour
    statistics of tissue (H&E: red and blue above green)."""
    with wsitool.open_slide(cmu1) as slide:
        arr = slide.read_region((0, 0), 0, slide.dimensions, mode="rgb").reshape(-1, 3).astype(float)
    tissue = arr[arr.mean(axis=1) < 200]
    assert len(tissue) > 1000
    r, g, b = tissue.mean(axis=0)
    assert r > g + 20 and b > g + 10


@pytest.mark.parametrize("path", list(repo_samples()), ids=lambda p: p.name)
def test_modes_agree(path):
    with wsitool.open_slide(path) as slide:
        for lv in pyramid_levels(slide):
            loc = (-37, 11)
            size = (min(lv.width, 500) + 20, min(lv.height, 300))
            rgba = slide.read_region(loc, lv.index, size)
            rgb = slide.read_region(loc, lv.index, size, mode="rgb")
            raw = slide.read_region(loc, lv.index, size, mode="raw")
            assert rgba.shape == (size[1], size[0], 4) and rgb.shape == (size[1], size[0], 3)
            assert np.array_equal(rgba[..., :3], rgb)
            assert np.array_equal(raw, rgb)  # 8-bit RGB slides: raw is RGB
            # alpha is 255 exactly on the level pixels inside the slide
            xl = math.floor(loc[0] / lv.downsample + 0.5)
            yl = math.floor(loc[1] / lv.downsample + 0.5)
            cols = np.arange(size[0]) + xl
            rows = np.arange(size[1]) + yl
            inside = ((rows >= 0) & (rows < lv.height))[:, None] & ((cols >= 0) & (cols < lv.width))[None, :]
            assert not inside.all() and inside.any()
            assert np.array_equal(rgba[..., 3] == 255, inside)
            assert not rgba[~inside].any()


def test_region_wholly_outside_is_transparent(sample_jpeg):
    with wsitool.open_slide(sample_jpeg) as slide:
        w, _ = slide.dimensions
        get_pool().reset_stats()
        arr = slide.read_region((w + 10, -500), 0, (64, 64))
        assert arr.shape == (64, 64, 4) and not arr.any()
        assert get_pool().stats().tiles_decoded == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(location=(0, 0), level=0, size=(0, 10)),
        dict(location=(0, 0), level=0, size=(10, -1)),
        dict(location=(0, 0), level=7, size=(10, 10)),
        dict(location=(0, 0), level=-1, size=(10, 10)),
        dict(location=(0.5, 0), level=0, size=(10, 10)),
        dict(location=(True, 0), level=0, size=(10, 10)),
        dict(location=(0, 0), level=False, size=(10, 10)),
        dict(location=(0, 0), level=0, size=(10,)),
        dict(location="ab", level=0, size=(10, 10)),
        dict(location=(0, 0), level=0, size=(10, 10), mode="bgr"),
        dict(location=(0, 0), level=0, size=(10, 10), out=np.zeros((10, 10, 3), np.uint8)),
        dict(location=(0, 0), level=0, size=(10, 10), out=np.zeros((10, 10, 4), np.float32)),
        dict(location=(0, 0), level=0, size=(10, 10), out=np.zeros((10, 20, 4), np.uint8)[:, ::2]),
        dict(location=(0, 0), level=0, size=(10, 10), threads=0),
    ],
)
def test_bad_requests_rejected_before_any_decode(sample_jpeg, kwargs):
    with wsitool.open_slide(sample_jpeg) as slide:
        pool = get_pool()
        before = pool.stats()
        with pytest.raises(InvalidRegionError) as info:
            slide.read_region(**kwargs)
        assert isinstance(info.value, ValueError)
        assert str(sample_jpeg) in str(info.value)
        after = pool.stats()
        assert after.tiles_decoded == before.tiles_decoded
        assert after.bytes_read == before.bytes_read


def test_resource_limit_before_allocation(sample_jpeg):
    with wsitool.open_slide(sample_jpeg) as slide:
        tracemalloc.start()
        try:
            with pytest.raises(ResourceLimitError):
                slide.read_region((0, 0), 0, (100_000, 100_000))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20  # nothing near the 40 GB it would need
        with wsitool.limits(max_region_pixels=1000):
            with pytest.raises(ResourceLimitError):
                slide.read_region((0, 0), 0, (40, 26))
            assert slide.read_region((0, 0), 0, (40, 25)).shape == (25, 40, 4)
        assert not isinstance(ResourceLimitError("x"), wsitool.TileDecodeError)


def test_missing_tiles_fill_transparent_and_are_counted(tmp_path):
    """A tile with byte count 0 is background, not an error (generated here)."""
    import tifffile

    data = np.full((512, 512, 3), 180, np.uint8)
    path = tmp_path / "sparse.tif"
    tifffile.imwrite(path, data, tile=(256, 256), photometric="rgb", compression="jpeg")
    # zero the byte count of tile 3 (bottom right) in place
    with tifffile.TiffFile(path) as tf:
        tag = tf.pages[0].tags["TileByteCounts"]
        offset = tag.valueoffset
    raw = bytearray(path.read_bytes())
    item = {3: 2, 4: 4, 16: 8}[int(tag.dtype)]  # SHORT, LONG, LONG8
    pos = offset + 3 * item
    raw[pos:pos + item] = b"\0" * item
    path.write_bytes(bytes(raw))
    with wsitool.open_slide(path) as slide:
        pool = get_pool()
        before = pool.stats().tiles_missing
        arr = slide.read_region((200, 200), 0, (200, 200))
        assert pool.stats().tiles_missing == before + 1
    assert (arr[56:, 56:] == 0).all()  # the missing tile: transparent
    assert (arr[:56, :56, 3] == 255).all() and abs(int(arr[10, 10, 0]) - 180) <= 3


def test_read_after_close_and_reopen(sample_jpeg):
    s = wsitool.open_slide(sample_jpeg)
    a = s.read_region((5, 5), 0, (50, 50))
    s.close()
    with pytest.raises(WsiError):
        s.read_region((5, 5), 0, (50, 50))
    with wsitool.open_slide(sample_jpeg) as s2:
        assert np.array_equal(a, s2.read_region((5, 5), 0, (50, 50)))


def test_level0_coordinate_inverse():
    """level0_coordinate gives the smallest level-0 coordinate that read_region maps
    to a given level pixel (export strips and Dask chunks aim with it)."""
    from wsitool.ground.geometry import level0_coordinate

    for ds in (1.0, 1.1, 1.5, 2.0, 2.001, 4.016, 8.0857):
        for v in (-7, 0, 1, 2, 3, 4, 5, 123, 4999):
            t = level0_coordinate(v, ds)
            assert int(np.floor(t / ds + 0.5)) == v
            assert int(np.floor((t - 1) / ds + 0.5)) < v  # the smallest such t


def test_close_waits_for_reads_in_flight(sample_jpeg, read_path):
    """close() from another thread while reads run: each read either completes with
    the right pixels or raises 'slide is closed'; none reads a descriptor number
    the process has meanwhile given to another file."""
    import os as _os
    import threading

    with wsitool.open_slide(sample_jpeg) as ref_slide:
        lv = pyramid_levels(ref_slide)[0]
        size = (min(lv.width, 700), min(lv.height, 500))
        ref = ref_slide.read_region((0, 0), 0, size, mode="rgb", threads=1)
    outcomes, wrong = [], []
    for attempt in range(5):
        slide = wsitool.open_slide(sample_jpeg)
        started = threading.Barrier(5)

        def work(slide, started, attempt):
            started.wait()
            for _ in range(200):
                try:
                    got = slide.read_region((0, 0), 0, size, mode="rgb", threads=2)
                except wsitool.WsiError as exc:
                    assert "slide is closed" in str(exc), exc
                    outcomes.append("closed")
                    return
                outcomes.append("read")
                if not np.array_equal(got, ref):
                    wrong.append(attempt)

        threads = [threading.Thread(target=work, args=(slide, started, attempt)) for _ in range(4)]
        for t in threads:
            t.start()
        started.wait()
        slide.close()
        # take descriptor numbers the slide may just have released
        fds = [_os.open(__file__, _os.O_RDONLY) for _ in range(4)]
        for t in threads:
            t.join()
        for fd in fds:
            _os.close(fd)
        assert slide.closed
    assert not wrong
    assert outcomes.count("closed") == 4 * 5


def test_forked_child_reads_with_threads(sample_jpeg, read_path):
    """After os.fork() (PyTorch DataLoader workers are forked), the child reads with
    several threads and gets the parent's pixels: the parent's worker threads and
    decoders are not waited for in the child."""
    import os as _os
    import time

    with wsitool.open_slide(sample_jpeg) as slide:
        lv = pyramid_levels(slide)[0]
        size = (min(lv.width, 600), min(lv.height, 400))
        ref = slide.read_region((3, 5), 0, size, mode="rgb", threads=2)  # parent threads exist
        pid = _os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit code
            code = 3
            try:
                a = slide.read_region((3, 5), 0, size, mode="rgb", threads=2)
                b = slide.read_region((3, 5), 0, size, mode="rgb")  # default: CPU count
                code = 0 if np.array_equal(a, ref) and np.array_equal(b, ref) else 4
            finally:
                _os._exit(code)
        deadline = time.monotonic() + 60
        while True:
            done, status = _os.waitpid(pid, _os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                _os.kill(pid, 9)
                _os.waitpid(pid, 0)
                pytest.fail("the forked child hung reading with threads")
            time.sleep(0.05)
    assert _os.waitstatus_to_exitcode(status) == 0
