"""Mosaic (placed-image) levels: the spatial index, paint order, codecs, the read path and its bytes."""

from __future__ import annotations

import io

import imagecodecs
import numpy as np
import pytest
from PIL import Image

from wsitool.codec.mosaic import CODECS, decode_image
from wsitool.errors import TileDecodeError
from wsitool.mosaic import DecodedImages, Mosaic, MosaicBuilder, mosaic_level
from wsitool.read.cache import TileCache, scope_for
from wsitool.read.region import read_pyramid_region
from wsitool.storage import LocalFile


def _pixels(w: int, h: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


def _encode(arr: np.ndarray, codec: str) -> bytes:
    if codec == "png":
        return bytes(imagecodecs.png_encode(arr))
    if codec == "bmp":
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, "BMP")
        return buf.getvalue()
    if codec == "raw":
        return arr.tobytes()
    if codec == "raw-bgr":
        return arr[:, :, ::-1].tobytes()
    if codec == "zstd-bgr":
        return bytes(imagecodecs.zstd_encode(arr[:, :, ::-1].tobytes()))
    raise AssertionError(codec)


def _write(tmp_path, images: list[tuple[np.ndarray, str]]) -> tuple[str, list[tuple[int, int]]]:
    """One data file holding the encoded images (after a 16-byte header); their (offset, length)."""
    path = tmp_path / "data.bin"
    where = []
    with open(path, "wb") as f:
        f.write(b"\0" * 16)
        for arr, codec in images:
            data = _encode(arr, codec)
            where.append((f.tell(), len(data)))
            f.write(data)
    return str(path), where


@pytest.fixture
def scene(tmp_path):
    """Three lossless 40x30 images overlapping at (5, 7), (35, 20), (50, 7); a level of 100x60."""
    imgs = [(_pixels(40, 30, k), c) for k, c in enumerate(("png", "raw-bgr", "zstd-bgr"))]
    path, where = _write(tmp_path, imgs)
    src = LocalFile(path)
    b = MosaicBuilder()
    s = b.source(src)
    ids = [b.image(s, off, n, 40, 30, c) for (off, n), (_a, c) in zip(where, imgs, strict=True)]
    b.place(ids[0], 5, 7)
    b.place(ids[1], 35, 20)
    b.place(ids[2], 50, 7, z=-1)  # painted first: the others cover it
    mosaic = b.build()
    level = mosaic_level(mosaic, index=0, width=100, height=60, downsample=1.0, tile_width=16, tile_height=16)
    level.path = path
    expect = np.zeros((60, 100, 4), np.uint8)
    for (x, y), (arr, _c) in zip([(50, 7), (5, 7), (35, 20)], [imgs[2], imgs[0], imgs[1]], strict=True):
        expect[y:y + 30, x:x + 40, :3] = arr
        expect[y:y + 30, x:x + 40, 3] = 255
    yield level, expect, [a for a, _c in imgs]
    src.close()


def test_reads_paint_in_order_and_leave_gaps_transparent(scene):
    level, expect, _ = scene
    got = read_pyramid_region([level], (0, 0), 0, (100, 60), threads=1)
    assert np.array_equal(got, expect)
    rgb = read_pyramid_region([level], (-3, 4), 0, (70, 50), mode="rgb", threads=2)
    window = np.zeros((50, 70, 3), np.uint8)
    window[:, 3:] = expect[4:54, :67, :3]
    assert np.array_equal(rgb, window)


def test_cached_reads_equal_uncached(scene):
    level, expect, _ = scene
    scope = scope_for(TileCache(1 << 22))
    for _ in range(2):
        got = read_pyramid_region([level], (10, 3), 0, (80, 50), cache=scope, threads=2)
        assert np.array_equal(got, expect[3:53, 10:90])


def test_query_finds_exactly_the_overlapping_placements():
    rng = np.random.default_rng(3)
    b = MosaicBuilder()
    s = b.source(object())
    n = 3000
    xs = rng.uniform(-500, 50_000, n)
    ys = rng.uniform(0, 30_000, n)
    ws = rng.integers(1, 700, n)
    hs = rng.integers(1, 500, n)
    for x, y, w, h in zip(xs, ys, ws, hs, strict=True):
        b.place(b.image(s, 0, 1, int(w), int(h), "jpeg"), x, y)
    m = b.build()
    px, py = np.floor(xs + 0.5), np.floor(ys + 0.5)
    for _ in range(200):
        x0, y0 = int(rng.integers(-600, 50_000)), int(rng.integers(-10, 30_000))
        x1, y1 = x0 + int(rng.integers(1, 3000)), y0 + int(rng.integers(1, 3000))
        want = np.nonzero((px < x1) & (py < y1) & (px + ws > x0) & (py + hs > y0))[0]
        assert np.array_equal(m.query(x0, y0, x1, y1), want)  # (added in order: z = index)
    assert m.fractional


def test_far_flung_placements_keep_the_index_small():
    b = MosaicBuilder()
    s = b.source(object())
    for x in (-(2 ** 40), 0, 2 ** 40):
        b.place(b.image(s, 0, 1, 10, 10, "jpeg"), x, x)
    m = b.build()
    assert m._starts.size < 5000
    assert m.query(-5, -5, 5, 5).tolist() == [1]


@pytest.mark.parametrize("codec", ["png", "bmp", "raw", "raw-bgr", "zstd-bgr"])
def test_codecs_decode_to_the_stored_pixels(tmp_path, codec):
    arr = _pixels(13, 9, 1)
    path, [(off, n)] = _write(tmp_path, [(arr, codec)])
    with LocalFile(path) as src:
        b = MosaicBuilder()
        b.place(b.image(b.source(src), off, n, 13, 9, codec), 0, 0)
        assert np.array_equal(decode_image(b.build(), 0), arr)
    assert {"jpeg", "jpegxr", "zstd"} <= set(CODECS)


def test_a_truncated_data_file_is_a_tile_error_or_fill(tmp_path, scene):
    level, _expect, _ = scene
    m: Mosaic = level.mosaic
    cut = int(m.image_offset[1]) + 10
    with open(m.sources[0].path, "rb") as f:
        head = f.read(cut)
    short = tmp_path / "short.bin"
    short.write_bytes(head)
    with LocalFile(str(short)) as src:
        b = MosaicBuilder()
        s = b.source(src)
        for k in range(3):
            b.place(b.image(s, int(m.image_offset[k]), int(m.image_length[k]), 40, 30, m.codecs[m.image_codec[k]]),
                    float(m.x[k]), float(m.y[k]))
        lv = mosaic_level(b.build(), index=0, width=100, height=60, downsample=1.0, tile_width=16, tile_height=16)
        with pytest.raises(TileDecodeError, match="past the end of the file"):
            read_pyramid_region([lv], (0, 0), 0, (100, 60), threads=1)
        with pytest.warns(Warning):
            got = read_pyramid_region([lv], (0, 0), 0, (16, 16), threads=1, on_error="fill")
        assert got.shape == (16, 16, 4)


def test_a_stream_of_another_size_is_refused_before_decoding(tmp_path):
    arr = _pixels(13, 9, 1)
    path, [(off, n)] = _write(tmp_path, [(arr, "png")])
    with LocalFile(path) as src:
        b = MosaicBuilder()
        b.place(b.image(b.source(src), off, n, 12, 9, "png"), 0, 0)
        lv = mosaic_level(b.build(), index=0, width=20, height=20, downsample=1.0)
        with pytest.raises(TileDecodeError, match="declares 13x9"):
            read_pyramid_region([lv], (0, 0), 0, (20, 20))


def test_a_region_reads_only_the_images_it_needs(tmp_path):
    imgs = [(_pixels(64, 64, k), "png") for k in range(9)]
    path, where = _write(tmp_path, imgs)
    with LocalFile(path) as src:
        b = MosaicBuilder()
        s = b.source(src)
        for k, (off, n) in enumerate(where):
            b.place(b.image(s, off, n, 64, 64, "png"), (k % 3) * 60, (k // 3) * 60)
        lv = mosaic_level(b.build(), index=0, width=184, height=184, downsample=1.0, tile_width=32,
                          tile_height=32)
        from wsitool.codec.pool import get_pool
        before = get_pool("cpu").stats().bytes_read
        read_pyramid_region([lv], (0, 0), 0, (50, 50), threads=1)
        assert get_pool("cpu").stats().bytes_read - before == where[0][1]
    offsets, counts = lv.tiles.offsets, lv.tiles.bytecounts
    assert offsets.size == 36 and int(offsets.min()) == 1 and int(counts[0]) == where[0][1]


def test_mosaics_sharing_a_decoded_cache_keep_their_images_apart(tmp_path):
    imgs = [(_pixels(8, 8, k), "raw") for k in range(2)]
    path, where = _write(tmp_path, imgs)
    shared = DecodedImages(1 << 20)
    with LocalFile(path) as src:
        mosaics = []
        for (off, n) in where:  # image 0 of each mosaic is a different stored image
            b = MosaicBuilder(decoded=shared)
            b.place(b.image(b.source(src), off, n, 8, 8, "raw"), 0, 0)
            mosaics.append(b.build())
        assert mosaics[0].decoded is mosaics[1].decoded is shared
        for m, (arr, _c) in zip(mosaics, imgs, strict=True):
            assert np.array_equal(decode_image(m, 0), arr)
        for m, (arr, _c) in zip(mosaics, imgs, strict=True):
            assert np.array_equal(m.cached(0), arr)
        assert shared.nbytes == 2 * 8 * 8 * 3
