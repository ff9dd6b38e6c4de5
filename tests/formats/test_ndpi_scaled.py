"""Hamamatsu NDPI: the levels OpenSlide makes below the stored ones by scaled JPEG decoding.

OpenSlide adds, below each stored NDPI level whose restart interval divides
by 2, 4, 8, the levels libjpeg decodes from the same intervals at 1/2, 1/4,
1/8 (``formats/tiff/ndpi_scaled.py`` has the rule); wsitool decodes them through
libjpeg-turbo's API in its extension, or Pillow's ``draft()`` without it (the same
libjpeg-turbo DCT scaling, ``codec/scaled.py``; pinned to each other below).  The
oracle is OpenSlide 4 (openslide-bin): levels, downsamples, tile sizes, and
regions at locations that are multiples of each level's downsample, through
``wsitool.open_slide`` and the ``wsitool.openslide`` drop-in alike.  Scaled
levels must lie within a maximum absolute difference of 8 and a mean of 1.0
(both libjpeg-turbo, measured 0 and 0.0 on the shared sample).
"""

from __future__ import annotations

import numpy as np
import pytest
import tifffile

import wsitool
import wsitool.openslide as dropin
from wsitool.codec import jpegloop
from wsitool.codec.pool import get_pool
from wsitool.codec.scaled import decode_scaled_stream
from wsitool.codec.tilebytes import jpeg_stream, read_tile_bytes
from wsitool.errors import TileDecodeError
from wsitool.formats.tiff.ndpi_scaled import scaled_plan, with_scaled_levels
from wsitool.read.cache import TileCache
from wsitool.slide import pyramid_levels

from helpers import shared_sample

NDPI = "ndpi-hamamatsu-stritt-dapi-fluor-3.5mb.ndpi"
STORED = 4
#: the largest differences allowed on scaled levels (the stored ones are exact)
MAX_DIFF, MEAN_DIFF = 8, 1.0

openslide = pytest.importorskip("openslide")


@pytest.fixture(scope="module")
def ndpi():
    return shared_sample(NDPI)


@pytest.fixture(scope="module")
def ref(ndpi):
    with openslide.OpenSlide(str(ndpi)) as slide:
        yield slide


def _regions(w, h):
    """``(x, y, width, height)`` in level pixels: whole, inside, across tile rows, past
    every edge, and wholly outside."""
    return [(0, 0, w, h), (3, 5, 40, 17), (w // 2 - 7, h // 2 - 3, 21, 9), (w - 20, h - 7, 50, 30),
            (-10, -6, 30, 25), (w - 1, h - 1, 4, 4), (w + 3, 2, 10, 10), (0, h - 2, w, 2)]


def _diff(got, want) -> tuple[int, float]:
    d = np.abs(np.asarray(got, dtype=np.int16) - np.asarray(want, dtype=np.int16))
    return int(d.max()), float(d.mean())


# ------------------------------------------------------------------ the level list


def test_level_list_equals_openslide(ndpi, ref):
    with wsitool.open_slide(ndpi) as slide, dropin.OpenSlide(str(ndpi)) as osr:
        for s in (slide, osr):
            assert s.level_count == ref.level_count == 7
            assert s.level_dimensions == ref.level_dimensions
            assert s.level_downsamples == ref.level_downsamples
        want = {k: v for k, v in ref.properties.items() if k.startswith("openslide.level")}
        assert {k: osr.properties.get(k) for k in want} == want  # tile sizes included
        for key, value in want.items():  # wsitool.Slide writes downsamples as floats ("16.0")
            got = slide.properties[key]
            assert (float(got) == float(value)) if key.endswith("downsample") else got == value, key
        for lv in pyramid_levels(slide)[STORED:]:
            assert lv.tile_size == (int(ref.properties[f"openslide.level[{lv.index}].tile-width"]),
                                    int(ref.properties[f"openslide.level[{lv.index}].tile-height"]))


def test_scaled_levels_share_the_smallest_stored_levels_intervals(ndpi):
    with wsitool.open_slide(ndpi) as slide:
        src = pyramid_levels(slide)[STORED - 1]
        assert src.encoding.codec == "nv" and src.decoder == "nvimagecodec"
        for k, lv in enumerate(pyramid_levels(slide)[STORED:], start=1):
            enc = lv.encoding
            assert (enc.codec, enc.scale_log2, lv.decoder) == ("scaled-jpeg", k, "pillow")
            assert lv.tiles is src.tiles and lv.source is src.source and enc.page is src.encoding.page
            assert (lv.tile_width << k, lv.tile_height << k) == src.tile_size
            assert (lv.tiles_across, lv.tiles_down) == (src.tiles_across, src.tiles_down)
            # never the compiled loop (nor the GPU path: both take codec "nv" only)
            for mode, ch in (("rgb", 3), ("rgba", 4), ("raw", 3)):
                assert not jpegloop.applies(lv, mode, np.empty((4, 4, ch), np.uint8))


def test_wsitool_info_shows_seven_levels(ndpi):
    import json

    from typer.testing import CliRunner

    from wsitool.cli import app

    res = CliRunner().invoke(app, ["info", "--json", str(ndpi)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["level_count"] == 7
    from wsitool.codec import jpegloop

    ext = jpegloop._load() is not None
    assert [lv["decoder"] for lv in data["levels"]] == (["libjpeg-turbo"] * 7 if ext
                                                          else ["nvimagecodec"] * 4 + ["pillow"] * 3)
    assert [(lv["tile_width"], lv["tile_height"]) for lv in data["levels"][STORED:]] == [(248, 4), (124, 2), (62, 1)]


# ------------------------------------------------------------------ pixels against OpenSlide


def test_regions_equal_openslide_through_open_slide(ndpi, ref, read_path):
    """``open_slide`` RGB regions: stored levels exact, scaled ones within the bounds;
    the worst difference per scaled level is printed (``-s``)."""
    with wsitool.open_slide(ndpi) as slide:
        for L, (w, h) in enumerate(slide.level_dimensions):
            ds = round(slide.level_downsamples[L])
            worst = (0, 0.0)
            for x, y, rw, rh in _regions(w, h):
                got = np.asarray(slide.read_region((x * ds, y * ds), L, (rw, rh), mode="rgb"))
                want = np.asarray(ref.read_region((x * ds, y * ds), L, (rw, rh)).convert("RGB"))
                mx, mean = _diff(got, want)
                if L < STORED:
                    assert mx == 0, (L, x, y, rw, rh)
                else:
                    assert mx <= MAX_DIFF and mean <= MEAN_DIFF, (L, x, y, rw, rh, mx, mean)
                worst = (max(worst[0], mx), max(worst[1], mean))
            print(f"level {L} {w}x{h}: max abs diff {worst[0]}, worst mean {worst[1]:.4f}")


def test_regions_equal_openslide_through_the_dropin(ndpi, ref):
    """The drop-in's RGBA regions (alpha 0 outside the slide, as OpenSlide's)."""
    with dropin.OpenSlide(str(ndpi)) as osr:
        for L in range(STORED - 1, osr.level_count):
            w, h = osr.level_dimensions[L]
            ds = round(osr.level_downsamples[L])
            for x, y, rw, rh in _regions(w, h):
                got = osr.read_region((x * ds, y * ds), L, (rw, rh))
                want = ref.read_region((x * ds, y * ds), L, (rw, rh))
                assert got.mode == want.mode == "RGBA" and got.size == want.size
                got, want = np.asarray(got), np.asarray(want)
                assert np.array_equal(got[..., 3], want[..., 3]), (L, x, y)
                mx, mean = _diff(got, want)
                assert mx <= (0 if L < STORED else MAX_DIFF) and mean <= MEAN_DIFF, (L, x, y, mx, mean)
        thumb, want = osr.get_thumbnail((60, 60)), ref.get_thumbnail((60, 60))  # from level 6
        assert thumb.size == want.size
        assert _diff(thumb.convert("RGB"), want.convert("RGB"))[1] <= MEAN_DIFF


def test_whole_scaled_levels_equal_openslide(ndpi, ref):
    with wsitool.open_slide(ndpi) as slide:
        for L in range(STORED, slide.level_count):
            got = np.asarray(slide.read_region((0, 0), L, slide.level_dimensions[L], mode="rgb"))
            want = np.asarray(ref.read_region((0, 0), L, ref.level_dimensions[L]).convert("RGB"))
            mx, mean = _diff(got, want)
            assert mx <= MAX_DIFF and mean <= MEAN_DIFF, (L, mx, mean)


def test_raw_mode_and_threads_agree(ndpi):
    with wsitool.open_slide(ndpi) as slide:
        for L in range(STORED, slide.level_count):
            size = slide.level_dimensions[L]
            one = np.asarray(slide.read_region((0, 0), L, size, mode="rgb", threads=1))
            assert np.array_equal(np.asarray(slide.read_region((0, 0), L, size, mode="raw")), one)
            assert np.array_equal(np.asarray(slide.read_region((0, 0), L, size, mode="rgb", threads=4)), one)
            rgba = np.asarray(slide.read_region((0, 0), L, size, mode="rgba"))
            assert np.array_equal(rgba[..., :3], one) and (rgba[..., 3] == 255).all()


# ------------------------------------------------------------------ work done


def test_a_region_decodes_only_the_intervals_it_touches(ndpi):
    with wsitool.open_slide(ndpi) as slide:
        pool = get_pool("cpu")
        for L, rows in ((4, 2), (5, 3), (6, 5)):
            lv = pyramid_levels(slide)[L]
            ds = round(lv.downsample)
            y = 11  # rows 11 .. 11 + rows - 1 of the level
            before = pool.stats().tiles_scaled
            slide.read_region((3 * ds, y * ds), L, (9, rows), mode="rgb", threads=1)
            touched = (y + rows - 1) // lv.tile_height - y // lv.tile_height + 1
            assert pool.stats().tiles_scaled - before == touched, L


def test_the_tile_cache_makes_repeat_reads_decode_nothing(ndpi):
    cache = TileCache(8 << 20)
    with wsitool.open_slide(ndpi, cache=cache) as slide:
        pool = get_pool("cpu")
        L = 5
        size = slide.level_dimensions[L]
        first = np.asarray(slide.read_region((0, 0), L, size, mode="rgb"))
        decoded = pool.stats().tiles_scaled
        misses = cache.stats().misses
        again = np.asarray(slide.read_region((0, 0), L, size, mode="rgb"))
        assert np.array_equal(first, again)
        assert pool.stats().tiles_scaled == decoded and cache.stats().misses == misses
        assert cache.stats().hits >= pyramid_levels(slide)[L].tiles_down


# ------------------------------------------------------------------ refusals


def _with_interval(src, tmp_path, page, index, mutate):
    """A copy of ``src`` whose restart interval ``index`` of IFD ``page`` is rewritten."""
    data = bytearray(src.read_bytes())
    with tifffile.TiffFile(src) as tf:
        off, count = tf.pages[page].dataoffsets[index], tf.pages[page].databytecounts[index]
    data[off:off + count] = mutate(bytes(data[off:off + count]))
    out = tmp_path / f"interval-{page}-{index}.ndpi"
    out.write_bytes(bytes(data))
    return out


def test_a_corrupt_interval_names_its_tile_on_every_scaled_level(ndpi, tmp_path):
    # 0xFF bytes: a marker prefix throughout, no entropy-coded data (a zeroed interval may
    # decode, as in libjpeg under OpenSlide: zero bits are valid Huffman codes)
    bad = _with_interval(ndpi, tmp_path, STORED - 1, 9, lambda b: b"\xff" * len(b))
    with wsitool.open_slide(bad) as slide:
        for L in range(STORED, slide.level_count):
            lv = pyramid_levels(slide)[L]
            ds, th = round(lv.downsample), lv.tile_height
            with pytest.raises(TileDecodeError, match=rf"level {L}, tile \(col 0, row 9\): (scaled JPEG decode "
                                                      r"failed: OSError|corrupt or truncated tile data)"):
                slide.read_region((0, 8 * th * ds), L, (lv.width, 3 * th), mode="rgb")
            slide.read_region((0, 0), L, (lv.width, 9 * th), mode="rgb")  # the rows above still read
            before = get_pool("cpu").stats().tiles_failed
            with pytest.warns(wsitool.errors.TileWarning):
                filled = np.asarray(slide.read_region((0, 9 * th * ds), L, (lv.width, th), mode="rgb",
                                                      on_error="fill"))
            assert not filled.any() and get_pool("cpu").stats().tiles_failed == before + 1


def test_frame_header_is_checked_before_decoding(ndpi):
    with wsitool.open_slide(ndpi) as slide:
        src, lv = pyramid_levels(slide)[STORED - 1], pyramid_levels(slide)[STORED]
        state = get_pool("cpu").state()
        stream = jpeg_stream(src, read_tile_bytes(src, 2, 0, 2, state.stats), 0, 2)
        assert decode_scaled_stream(lv, 0, 2, stream).shape == (lv.tile_height, lv.tile_width, 3)
        sof = next(stream.index(m) for m in (b"\xff\xc0", b"\xff\xc1", b"\xff\xc2") if m in stream)
        # SOF: marker, length (2), precision (1), height (2), width (2)
        for height, width in ((16, 496), (8, 992), (30000, 30000)):
            hostile = (stream[:sof + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big")
                       + stream[sof + 9:])
            with pytest.raises(TileDecodeError, match=rf"level {STORED}, tile \(col 0, row 2\): JPEG frame "
                                                      rf"{width}x{height} is not the 496x8 tile this level "
                                                      r"decodes at 1/2"):
                decode_scaled_stream(lv, 0, 2, hostile)
        with pytest.raises(TileDecodeError, match="without a readable frame header"):
            decode_scaled_stream(lv, 0, 2, stream[:sof])


def test_a_decode_of_the_wrong_size_is_refused(ndpi, monkeypatch):
    """Pillow's draft not applied (the full-size interval): refused, not written."""
    from PIL import JpegImagePlugin

    from wsitool.codec.paths import decode_paths

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", lambda self, mode, size: None)
    with (decode_paths(libjpeg=False), wsitool.open_slide(ndpi) as slide,
          pytest.raises(TileDecodeError, match=r"level 5, tile \(col 0, row 0\): scaled JPEG decode gives "
                                               r"496x8 RGB, not the 124x2 RGB tile")):
        slide.read_region((0, 0), 5, (10, 2), mode="rgb")


def test_libjpeg_scaled_decode_equals_pillows(ndpi, tmp_path):
    """The extension's scaled decode (libjpeg-turbo's API) gives Pillow's ``draft`` pixels on
    every scaled level, whole; and an interval with flipped bytes, which Pillow decodes without
    a word, is the tile's error naming libjpeg's warning."""
    from wsitool.codec.paths import decode_paths

    if jpegloop.libjpeg_decode() is None:
        pytest.skip(f"compiled extension: {jpegloop.status()}")
    with wsitool.open_slide(ndpi) as slide:
        for L in range(STORED, slide.level_count):
            lv = pyramid_levels(slide)[L]
            got = slide.read_region((0, 0), L, (lv.width, lv.height), mode="rgb")
            with decode_paths(libjpeg=False):
                want = slide.read_region((0, 0), L, (lv.width, lv.height), mode="rgb")
            assert np.array_equal(got, want), L
    bad = _with_interval(ndpi, tmp_path, STORED - 1, 9,
                         lambda b: b[:len(b) // 3] + bytes(x ^ 0xFF for x in b[len(b) // 3:len(b) // 3 + 8])
                         + b[len(b) // 3 + 8:])
    with wsitool.open_slide(bad) as slide:
        lv = pyramid_levels(slide)[STORED]
        ds, th = round(lv.downsample), lv.tile_height
        with decode_paths(libjpeg=False):
            slide.read_region((0, 9 * th * ds), STORED, (lv.width, th), mode="rgb")  # Pillow: silent
        with pytest.raises(TileDecodeError, match=rf"level {STORED}, tile \(col 0, row 9\): corrupt or truncated "
                                                  r"tile data \(libjpeg-turbo: Corrupt JPEG data"):
            slide.read_region((0, 9 * th * ds), STORED, (lv.width, th), mode="rgb")


# ------------------------------------------------------------------ the rule


def test_scaled_plan_follows_openslides_rule():
    every = (2, 4, 8)
    # the sample: 4 stored levels 2x apart, intervals one MCU row of 8 pixels
    sample = [(3968 >> i, 4864 >> i, 3968 >> i, 8, every) for i in range(4)]
    assert scaled_plan(sample) == [(0, 1), (1, 1), (2, 1), (3, 1), (3, 2), (3, 4), (3, 8)]
    # stored levels 4x apart: scaled ones in between, made from the larger level; of two of
    # one width (500), the one from the smaller stored level
    four = [(4000, 3000, 512, 8, every), (1000, 750, 512, 8, every)]
    assert scaled_plan(four) == [(0, 1), (0, 2), (1, 1), (1, 2), (1, 4), (1, 8)]
    # an interval 4 pixels high scales by 2 and 4 only; no denominators: no scaled levels
    assert scaled_plan([(1000, 1000, 256, 4, every)]) == [(0, 1), (0, 2), (0, 4)]
    assert scaled_plan([(1000, 1000, 256, 8, ())]) == [(0, 1)]
    # widths not strictly decreasing (OpenSlide refuses the slide): the stored levels as they are
    assert scaled_plan([(1000, 1000, 256, 8, every), (1000, 500, 256, 8, every)]) == [(0, 1), (1, 1)]


def test_levels_scaled_from_a_larger_stored_level(ndpi, ref):
    """Levels 0 and 2 only (as a slide stored 4x apart): a level of 1984 pixels made from
    level 0 at 1/2, and the numbering and downsamples of the list."""
    with wsitool.open_slide(ndpi) as slide:
        stored = (pyramid_levels(slide)[0], pyramid_levels(slide)[2])
        levels = with_scaled_levels(stored, slide.dimensions)
        assert [lv.dimensions for lv in levels] == [(3968, 4864), (1984, 2432), (992, 1216), (496, 608),
                                                    (248, 304), (124, 152)]
        assert [lv.index for lv in levels] == list(range(6))
        assert [lv.downsample for lv in levels] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
        assert [lv.encoding.scale_log2 for lv in levels] == [0, 1, 0, 1, 2, 3]
        assert levels[1].tiles is stored[0].tiles and levels[1].tile_size == (1984, 4)
        state = get_pool("cpu").state()
        from wsitool.codec.generic import decode_array

        tile = decode_array(levels[1], 0, 100, state)  # level 0's interval 100 at 1/2
        stored1 = np.asarray(ref.read_region((0, 800), 1, (1984, 4)).convert("RGB"))
        assert tile.shape == (4, 1984, 3)
        # not the scanner's own 1/2 level, but close to it
        assert np.abs(tile.astype(np.int16) - stored1).mean() < 8
