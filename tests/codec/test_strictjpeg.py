"""JPEG tiles where the compiled extension is absent (no C compiler, macOS): decoded by libjpeg-turbo
through simplejpeg (``wsitool.codec.strictjpeg``): the pixels the extension gives, and corrupt data
an error with libjpeg-turbo's words, as the extension does (issue 49 item 3)."""

from __future__ import annotations

import numpy as np
import pytest
from test_libjpeg import _hostile_streams, _jpeg_levels, _jpeg_slides, _read, _windows, check_extraneous_bytes

import wsitool
from wsitool.codec import jpegloop, strictjpeg
from wsitool.codec.backends import backend_report
from wsitool.codec.paths import decode_paths

from helpers import SHARED_SAMPLES, random_regions

pytest.importorskip("simplejpeg", reason="simplejpeg (a dependency) is not installed")


@pytest.fixture
def without_extension(monkeypatch):
    """As on a machine where ``wsitool._jpegloop`` was not built (the reason as the build records it)."""
    if jpegloop._load() is None:
        pytest.skip(f"the extension is the reference here: {jpegloop.status()}")
    reference = jpegloop._module
    monkeypatch.setattr(jpegloop, "_module", None)
    monkeypatch.setattr(jpegloop, "_tried", True)
    monkeypatch.setattr(jpegloop, "_reason", "not built: no C compiler (recorded for this test)")
    assert jpegloop.libjpeg_decode() is strictjpeg.decode_jpeg
    return reference


def test_the_pixels_are_the_extensions_on_every_jpeg_level(without_extension):
    slides = _jpeg_slides()
    if not slides:
        pytest.skip("no JPEG slide at hand")
    rng = np.random.default_rng(49)
    compared = windows = 0
    for path in slides:
        with wsitool.open_slide(path) as slide:
            for lv in _jpeg_levels(slide):
                chosen = _windows(rng, lv)[:3]
                windows += len(chosen)
                for xl, yl, w, h in chosen:
                    loc = (round(xl * lv.downsample), round(yl * lv.downsample))
                    got, _ = _read(slide, loc, lv.index, (w, h), native=False, libjpeg=True)
                    with pytest.MonkeyPatch.context() as mp:  # the extension back: the reference
                        mp.setattr(jpegloop, "_module", without_extension)
                        ref, _ = _read(slide, loc, lv.index, (w, h), native=False, libjpeg=True)
                    assert np.array_equal(got, ref), f"{path.name} level {lv.index} {loc} {(w, h)}"
                    compared += 1
    # (every window of every JPEG level: 9 with the repository's samples alone, more with the shared slides)
    assert compared == windows >= 3


def test_corrupt_data_is_the_same_error_as_the_extensions(without_extension):
    """A tile with extraneous bytes before a restart marker (a fault users met): ``raise`` gives the
    tile's error in libjpeg-turbo's words, ``fill`` a warning and that tile background, as the
    extension; nvImageCodec (``libjpeg=False``) decodes it without a word."""
    check_extraneous_bytes(native=False)


def test_a_scan_cut_short_is_an_error_not_pixels(without_extension):
    """200 bytes cut from the middle of a tile's scan: the extension and simplejpeg both refuse it
    (nvImageCodec, imagecodecs and Pillow return pixels)."""
    streams = _hostile_streams()
    good = streams["sound"]
    sos = good.index(b"\xff\xda")
    cut = good[:sos + 200] + good[sos + 400:]
    for stream in (cut, streams["truncated"], streams["a restart marker in a stream without DRI"]):
        out = np.zeros((64, 64, 3), np.uint8)
        message = strictjpeg.decode_jpeg(stream, out, 0, 0, 64, 64)
        assert isinstance(message, str) and message
        assert isinstance(without_extension.decode_jpeg(stream, np.zeros((64, 64, 3), np.uint8), 0, 0, 64, 64), str)
    out = np.zeros((64, 64, 3), np.uint8)
    ref = np.zeros((64, 64, 3), np.uint8)
    assert strictjpeg.decode_jpeg(good, out, 0, 0, 64, 64) is None
    assert without_extension.decode_jpeg(good, ref, 0, 0, 64, 64) is None
    assert np.array_equal(out, ref) and out.any()


@pytest.mark.parametrize("scale_log2", [0, 1, 2, 3])
def test_windows_and_dct_scales_equal_the_extensions(without_extension, scale_log2):
    """Windows of every shape and libjpeg-turbo's DCT scales (NDPI's extra levels) as the extension
    decodes them."""
    good = _hostile_streams()["sound"]
    size = 64 >> scale_log2
    rng = np.random.default_rng(scale_log2)
    for x0, y0, w, h in random_regions(rng, size, size, 8, max_size=size):
        x0, y0 = min(max(0, x0), size - 1), min(max(0, y0), size - 1)
        w, h = max(1, min(w, size - x0)), max(1, min(h, size - y0))
        out, ref = np.zeros((h, w, 3), np.uint8), np.zeros((h, w, 3), np.uint8)
        assert strictjpeg.decode_jpeg(good, out, x0, y0, x0 + w, y0 + h, scale_log2) is None
        assert without_extension.decode_jpeg(good, ref, x0, y0, x0 + w, y0 + h, scale_log2) is None
        assert np.array_equal(out, ref), (x0, y0, w, h, scale_log2)


def test_backends_say_which_decodes_jpeg_and_whether_corrupt_data_is_caught(without_extension, monkeypatch):
    rows = {b["name"]: b for b in backend_report(probe=False)}
    strict = rows["CPU: libjpeg-turbo through simplejpeg"]
    assert strict["available"] and "corrupt data an error" in strict["detail"]
    loop = rows["CPU: compiled JPEG tile loop (wsitool._jpegloop)"]
    assert "no C compiler (recorded for this test)" in loop["detail"]
    monkeypatch.setattr(strictjpeg, "available", lambda: False)
    rows = {b["name"]: b for b in backend_report(probe=False)}
    assert "corrupt JPEG data goes undetected" in rows["CPU: libjpeg-turbo through simplejpeg"]["detail"]
    with decode_paths(libjpeg=False):
        assert jpegloop.libjpeg_decode() is None


def test_a_shared_ndpi_reads_as_with_the_extension(without_extension):
    """NDPI: the restart-interval levels and the scaled levels OpenSlide lists."""
    path = SHARED_SAMPLES / "ndpi-hamamatsu-stritt-dapi-fluor-3.5mb.ndpi"
    if not path.exists():
        pytest.skip("the shared NDPI sample is absent")
    with wsitool.open_slide(path) as slide:
        for level in range(slide.level_count):
            w, h = slide.level_dimensions[level]
            size = (min(w, 300), min(h, 200))
            got = slide.read_region((0, 0), level, size, mode="rgb")
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(jpegloop, "_module", without_extension)
                ref = slide.read_region((0, 0), level, size, mode="rgb")
            assert np.array_equal(got, ref), level
