"""Hamamatsu NDPI: the shared NanoZoomer sample read through tifffile's restart-interval segments.

Each stored level of an NDPI is one JPEG scan with restart markers; tifffile
cuts it into one segment per restart interval (McuStarts, tag 65426) and builds
their header (``TiffPage.jpegheader``).  The oracles: OpenSlide's pixels, which
equal tifffile's on this sample (../shared/samples/SOURCES.md), and tifffile's
own decode of each level.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import tifffile

import wsitool
from wsitool.codec import jpegloop
from wsitool.codec.generic import decode_array
from wsitool.codec.headers import check_header
from wsitool.codec.pool import get_pool
from wsitool.codec.tilebytes import jpeg_stream, read_tile_bytes, read_tile_stream
from wsitool.errors import TileDecodeError
from wsitool.ground.bitstream import ends_with_restart
from wsitool.slide import pyramid_levels

from helpers import random_regions, script_module, shared_sample, with_tile_bytes

NDPI = "ndpi-hamamatsu-stritt-dapi-fluor-3.5mb.ndpi"


@pytest.fixture(scope="module")
def ndpi():
    return shared_sample(NDPI)


@pytest.fixture(scope="module")
def stored(ndpi):
    """Each stored level's pixels as tifffile decodes them, ``(H, W, 3)`` uint8."""
    with tifffile.TiffFile(ndpi) as tf:
        return [lv.asarray() for lv in tf.series[0].levels]


def _regions(lv):
    """Regions ``(x, y, w, h)`` in level pixels: whole intervals, ones straddling
    restart-interval boundaries (rows of ``tile_height``), the edges, partly outside."""
    W, H, th = lv.width, lv.height, lv.tile_height
    return [(0, 0, 256, 256), (100, th - 3, 300, 7), (17, 3 * th - 1, 500, 2 * th + 3),
            (W // 2 - 1, H // 2 - 5, 3, 11), (W - 250, H - 13, 300, 40), (-10, -10, 50, 50),
            (W - 1, 5 * th - 1, 1, 2)]


def test_ndpi_segments_are_restart_intervals_with_the_pages_header(ndpi):
    with wsitool.open_slide(ndpi) as slide:
        for lv in pyramid_levels(slide)[:4]:  # the stored levels (the scaled ones: test_ndpi_scaled.py)
            enc = lv.encoding
            assert enc.jpeg_scan_segments and enc.stream == "jpeg" and enc.codec == "nv"
            assert enc.jpeg_prefix.startswith(b"\xff\xd8") and b"\xff\xdd" in enc.jpeg_prefix  # SOI, DRI
            assert (lv.tile_width, lv.tile_height) == (lv.width, 8)  # one MCU row per interval here
            state = get_pool("cpu").state()
            for row in (0, 1, lv.tiles_down - 1):
                data = read_tile_bytes(lv, row, 0, row, state.stats)
                assert not data.startswith(b"\xff\xd8")  # bare scan data
                assert ends_with_restart(data) == (row != lv.tiles_down - 1)  # the last ends with EOI
                stream = jpeg_stream(lv, data, 0, row)
                assert stream == enc.jpeg_prefix + data[:-2] + b"\xff\xd9"
                # the compiled loop and nvImageCodec path's buffer holds the same stream
                assert bytes(read_tile_stream(lv, row, 0, row, state)) == stream
                check_header(lv, data, 0, row)  # the SOF declares one interval: the grid cell


def test_ndpi_levels_equal_openslide_and_tifffile(ndpi, stored, read_path):
    """Every stored level, at regions straddling restart-interval boundaries: exact."""
    openslide = pytest.importorskip("openslide")
    with wsitool.open_slide(ndpi) as slide, openslide.OpenSlide(str(ndpi)) as ref:
        assert slide.level_count == ref.level_count == 7  # 4 stored, 3 scaled (test_ndpi_scaled.py)
        for L, lv in enumerate(pyramid_levels(slide)[:4]):
            assert ref.level_dimensions[L] == lv.dimensions
            ds = round(lv.downsample)
            out = np.empty((8, lv.width, 3), np.uint8)
            assert jpegloop.applies(lv, "rgb", out) == (read_path == "compiled")
            full = stored[L]
            for x, y, w, h in _regions(lv):
                got = np.asarray(slide.read_region((x * ds, y * ds), L, (w, h), mode="rgb"))
                want = np.asarray(ref.read_region((x * ds, y * ds), L, (w, h)).convert("RGB"))
                assert np.array_equal(got, want), (L, x, y, w, h)
                x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + w, lv.width), min(y + h, lv.height)
                assert np.array_equal(got[y0 - y:y1 - y, x0 - x:x1 - x], full[y0:y1, x0:x1])


def test_ndpi_smallest_level_whole(ndpi, stored, read_path):
    with wsitool.open_slide(ndpi) as slide:
        lv = pyramid_levels(slide)[len(stored) - 1]  # the smallest stored level
        got = np.asarray(slide.read_region((0, 0), lv.index, lv.dimensions, mode="rgb"))
        assert np.array_equal(got, stored[-1])


def test_ndpi_generic_path_decodes_a_segment_as_tifffile(ndpi, stored):
    """tifffile's own decode of a segment (the path of NDPI levels nvImageCodec does not take)."""
    with wsitool.open_slide(ndpi) as slide:
        lv = pyramid_levels(slide)[1]
        state = get_pool("cpu").state()
        for row in (0, 7, lv.tiles_down - 1):
            arr = decode_array(lv, 0, row, state)
            assert np.array_equal(arr, stored[1][row * 8:row * 8 + 8])


def test_ndpi_corrupt_interval_fails_alike_on_both_paths(ndpi, tmp_path, read_path):
    """A segment whose scan data is zeroed: a TileDecodeError naming it, never a crash;
    the intervals around it still read."""
    bad = with_tile_bytes(ndpi, tmp_path, 3, lambda b: bytes(len(b)))
    with wsitool.open_slide(bad) as slide:
        with pytest.raises(TileDecodeError,
                           match=r"level 0, tile \(col 0, row 3\): corrupt or truncated tile data \(libjpeg-turbo: "):
            slide.read_region((0, 20), 0, (64, 16), mode="rgb")
        slide.read_region((0, 0), 0, (64, 24), mode="rgb")
        slide.read_region((0, 32), 0, (64, 24), mode="rgb")


# ------------------------------------------------------------------ the vendor layout (formats/tiff/ndpi.py)


def test_ndpi_vendor_properties_and_macro_equal_openslide(ndpi):
    openslide = pytest.importorskip("openslide")
    with wsitool.open_slide(ndpi) as slide, openslide.OpenSlide(str(ndpi)) as ref:
        props, want = slide.properties, ref.properties
        assert slide.vendor == "hamamatsu" == want["openslide.vendor"]
        keys = [k for k in want if k.startswith("hamamatsu.")]
        assert len(keys) > 60 and {k: props.get(k) for k in keys} == {k: want[k] for k in keys}
        assert not {k for k in props if k.startswith("hamamatsu.")} - set(keys)
        for key in ("openslide.objective-power", "openslide.mpp-x", "openslide.mpp-y"):
            assert props[key] == want[key], key
        assert list(slide.associated_images) == list(ref.associated_images) == ["macro"]  # no map
        macro = slide.associated_images["macro"]
        assert np.array_equal(macro, np.asarray(ref.associated_images["macro"].convert("RGB")))


def _mcu_starts_tag(path, page=0):
    with tifffile.TiffFile(path) as tf:
        tag = tf.pages[page].tags[65426]
        return tag.valueoffset, tag.count


def _patched(src, tmp_path, name, edits):
    data = bytearray(src.read_bytes())
    for offset, raw in edits:
        data[offset:offset + len(raw)] = raw
    out = tmp_path / f"{name}.ndpi"
    out.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize("case", ["past-the-file", "before-the-header", "not-increasing", "past-the-stream"])
def test_ndpi_hostile_mcu_starts_are_refused_at_open(ndpi, tmp_path, case):
    """McuStarts (tag 65426) that cannot be restart intervals of the level's stream: a
    CorruptFileError naming the tag, before tifffile or wsitool allocate by them
    (past-the-file: 4294967040 made tifffile read that many bytes; fuzz regression)."""
    offset, count = _mcu_starts_tag(ndpi)
    with tifffile.TiffFile(ndpi) as tf:
        strip = int(tf.pages[0].tags.valueof(279)[0])
    last = offset + 4 * (count - 1)
    edits = {
        "past-the-file": [(offset, (0xFFFFFF00).to_bytes(4, "little"))],
        "before-the-header": [(offset, (0).to_bytes(4, "little"))],
        "not-increasing": [(offset + 8, (700).to_bytes(4, "little"))],
        "past-the-stream": [(last, strip.to_bytes(4, "little"))],
    }[case]
    bad = _patched(ndpi, tmp_path, case, edits)
    with pytest.raises(wsitool.errors.CorruptFileError, match=r"NDPI IFD 0: McuStarts \(tag 65426\)"):
        wsitool.open_slide(bad)


def test_bounded_file_never_reads_past_the_end(tmp_path):
    from wsitool.storage.view import BoundedFile

    path = tmp_path / "x.bin"
    path.write_bytes(b"0123456789")
    with BoundedFile(path) as fh:
        fh.seek(4)
        assert fh.read(1 << 62) == b"456789"  # would be a MemoryError unclamped
        assert fh.read(5) == b""
        fh.seek(0)
        assert fh.read() == b"0123456789" and fh.name == str(path)


# ------------------------------------------------------------------ spliced bands (the compiled loop)
# Without chroma subsampling the compiled loop decodes the touched intervals of each band
# (the rest of a row of the region's tile grid, or whole rows) as ONE code stream spliced
# from them (wsitool/_native/jpegloop.c, splice_band); the Python path stays per interval.


def _compiled_loop():
    if jpegloop._load() is None:
        pytest.skip(f"compiled JPEG loop: {jpegloop.status()}")


def _both_paths(slide, location, level, size, mode="rgb", threads=1, on_error="raise"):
    """``(compiled, python, spliced)``: each path's pixels, or its error as ``(type, message)``
    (the warnings each gave must be the same); and the intervals the compiled read decoded
    in spliced bands."""
    from wsitool.codec.paths import decode_paths

    pool = get_pool("cpu")
    got = []
    for native in (True, False):
        before = pool.stats().tiles_spliced
        with decode_paths(native=native), warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                pixels = np.asarray(slide.read_region(location, level, size, mode=mode, threads=threads,
                                                      on_error=on_error))
            except TileDecodeError as exc:
                pixels = (type(exc), _gist(str(exc)))
        got.append((pixels, sorted(_gist(str(w.message)) for w in seen), pool.stats().tiles_spliced - before))
    (compiled, said_c, spliced), (python, said_p, none) = got
    assert none == 0 and said_c == said_p
    return compiled, python, spliced


def _gist(message):
    """A failure's message without the decoder's details (the compiled loop adds
    nvImageCodec's processing status to "decoder returned no image (...)")."""
    return re.sub(r"; nvImageCodec processing status [^)]*\)", ")", message)


@pytest.fixture(scope="module")
def generated(tmp_path_factory, ndpi):
    """Small NDPI written by scripts/make_ndpi.py from the sample's pixels: 4:4:4 with 32
    intervals of 256 x 8 a row at level 0, and 4:2:0 (512 x 16 intervals)."""
    make = script_module("make_ndpi").make_ndpi
    root = tmp_path_factory.mktemp("ndpi_splice")
    make(root / "s444.ndpi", 8192, 1024, interval=256, levels=2, source=ndpi)
    make(root / "s420.ndpi", 4096, 512, interval=512, levels=2, subsampling="420", source=ndpi)
    return {"444": root / "s444.ndpi", "420": root / "s420.ndpi"}


def _spliced_parity(path, regions_per_level, seed):
    """Random regions (inside, over the right and bottom edges, partly outside) of every
    stored level, rgb and rgba, 1 and 2 threads: the compiled loop equals the Python path
    bit for bit.  Returns the intervals decoded in spliced bands."""
    rng = np.random.default_rng(seed)
    spliced = 0
    with wsitool.open_slide(path) as slide:
        for L, lv in enumerate(pyramid_levels(slide)):
            if not lv.encoding.jpeg_scan_segments or lv.tile_height < 8:  # (the scaled levels)
                continue
            ds = round(lv.downsample)
            regions = random_regions(rng, lv.width, lv.height, regions_per_level, max_size=1100)
            regions += [(lv.width - 700, lv.height - 30, 700, 30), (3, 5, lv.width - 6, 21)]
            for i, (x, y, w, h) in enumerate(regions):
                mode, threads = ("rgb", "rgba")[i % 2], 1 + i // 2 % 2
                compiled, python, n = _both_paths(slide, (x * ds, y * ds), L, (w, h), mode, threads)
                assert np.array_equal(compiled, python), (L, x, y, w, h, mode, threads)
                spliced += n
    return spliced


def test_ndpi_spliced_bands_equal_the_python_path(ndpi):
    """The shared sample (4:4:4, one interval a row): every stored level."""
    _compiled_loop()
    assert _spliced_parity(ndpi, 12, seed=5) > 0


def test_generated_ndpi_spliced_bands_equal_the_python_path(generated):
    """Many intervals a row: bands with partial intervals at both sides, the level's edges."""
    _compiled_loop()
    assert _spliced_parity(generated["444"], 16, seed=6) > 0


def test_subsampled_ndpi_is_never_spliced(generated):
    """4:2:0: libjpeg's upsampling would reach across interval edges, so per interval (0 spliced)."""
    _compiled_loop()
    with wsitool.open_slide(generated["420"]) as slide:
        assert pyramid_levels(slide)[0].tile_height == 16
    assert _spliced_parity(generated["420"], 8, seed=7) == 0


_CORRUPT = {
    # scan data zeroed, the closing RSTn kept: spliced (no marker inside), but libjpeg warns of
    # corrupt data, so that band goes interval by interval and the interval fails
    "zeroed-data": lambda b: bytes(len(b) - 2) + b[-2:],
    # a marker inside the scan data: that band goes interval by interval
    "marker-inside": lambda b: b[:len(b) // 3] + b"\xff\xd9" + b[len(b) // 3 + 2:],
    # all zeroed, the marker too: that band goes interval by interval, the interval fails
    "zeroed": lambda b: bytes(len(b)),
}


@pytest.mark.parametrize("case", sorted(_CORRUPT))
@pytest.mark.parametrize("on_error", ["raise", "fill"])
def test_corrupt_interval_in_a_spliced_band_fails_as_the_python_path(generated, tmp_path, case, on_error):
    """A corrupt interval (level 0, column 5 of row 2) inside a band: the same pixels, error
    message or warnings as the per-interval Python path, the bands around it still spliced."""
    _compiled_loop()
    bad = with_tile_bytes(generated["444"], tmp_path, 2 * 32 + 5, _CORRUPT[case])
    with wsitool.open_slide(bad) as slide:
        for (x, y, w, h), threads in [((3 * 256 + 17, 0, 6 * 256, 56), 1), ((5 * 256 - 9, 9, 30, 20), 1),
                                      ((0, 0, 1024, 1024), 2)]:
            compiled, python, spliced = _both_paths(slide, (x, y), 0, (w, h), "rgb", threads, on_error)
            if isinstance(python, tuple):
                assert compiled == python and "tile (col 5, row 2)" in python[1]
            else:
                assert np.array_equal(compiled, python), (x, y, w, h)
            # the band holding it goes interval by interval; the other bands are spliced
            assert spliced > 0 or threads == 1
