"""The CPU JPEG decode through libjpeg-turbo's own API (``wsitool._jpegloop``: the compiled
loop, and ``decode_jpeg`` on the Python path), pinned to nvImageCodec's CPU backend (the same
library): the same pixels on every JPEG level at hand, windows of every shape included; and
corrupt entropy-coded data, which nvImageCodec decodes without a word, an error."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import wsitool
from wsitool.codec import jpegloop
from wsitool.codec.paths import decode_paths
from wsitool.slide import pyramid_levels

from helpers import (
    BUG_INPUTS,
    NO_BUGS,
    SHARED_SAMPLES,
    present,
    random_regions,
    repo_samples,
    slides_where,
    tiff_samples,
)

#: DICOM samples with JPEG frames (read through the Python path: no compiled loop for frames)
DICOM_JPEG = ["dicom-cmu1-small-region-12level", "dicom-google-jpeg-ybr-957x715.dcm"]


@pytest.fixture(autouse=True)
def _extension():
    if jpegloop._load() is None:
        pytest.skip(f"compiled extension: {jpegloop.status()}")


def _read(slide, loc, level, size, **paths):
    """(pixels or the TileDecodeError, TileWarning messages) of one rgb read with ``on_error="fill"``
    (``raise`` where ``paths`` holds ``on_error``) under ``decode_paths(**paths)``."""
    on_error = paths.pop("on_error", "fill")
    with decode_paths(**paths), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            got = slide.read_region(loc, level, size, mode="rgb", on_error=on_error)
        except wsitool.TileDecodeError as exc:
            got = exc
    return got, [str(w.message) for w in caught if issubclass(w.category, wsitool.TileWarning)]


def _tiles(messages: list[str]) -> list[str]:
    """The failed tiles that warnings name (the wording of the causes differs between the
    nvImageCodec binding and the compiled loop's header checks: see test_jpegloop._normal)."""
    return sorted(m for msg in messages for m in re.findall(r"level \d+, tile \(col \d+, row \d+\)", msg))


def _jpeg_levels(slide):
    """The levels whose tiles libjpeg-turbo decodes (:func:`wsitool.codec.jpegloop.libjpeg_decoder`)."""
    return [lv for lv in pyramid_levels(slide) if jpegloop.libjpeg_decoder(lv) is not None]


def _windows(rng, lv):
    """Regions ``(xl, yl, w, h)`` in level pixels: random ones, and windows of a tile that the
    crop and row skip of a window decode must get right (one column at a tile's left and right
    edge, small and unaligned, a whole tile, across a tile corner)."""
    tw, th = lv.tile_width, lv.tile_height
    tx = tw * int(rng.integers(0, max(1, lv.width // tw)))
    ty = th * int(rng.integers(0, max(1, lv.height // th)))
    out = random_regions(rng, lv.width, lv.height, 3, max_size=600)
    out += [(tx, ty, 1, min(th, 37)), (tx + tw - 1, ty + 3, 1, 20), (tx + 5, ty + 3, 7, 9),
            (tx + 17, ty + 9, 31, 1), (tx, ty, tw, th), (tx + tw - 9, ty + th - 11, 23, 29)]
    return [(x, y, w, h) for x, y, w, h in out if x < lv.width and y < lv.height]


def _jpeg_slides():
    dicom = [SHARED_SAMPLES / n for n in DICOM_JPEG if (SHARED_SAMPLES / n).exists()]
    return slides_where(present(tiff_samples() + repo_samples()) + dicom, _jpeg_levels)


@pytest.mark.parametrize("native", [True, False], ids=["compiled-loop", "python-path"])
def test_pixels_equal_nvimagecodecs(native):
    """Every JPEG level of every slide at hand (Aperio, generic TIFF, NDPI with its spliced
    bands, DICOM frames, the repo's samples): libjpeg-turbo's API through the compiled loop or the Python
    path gives nvImageCodec's pixels, bit for bit."""
    slides = _jpeg_slides()
    if not slides:
        pytest.skip("no JPEG slide at hand")
    rng = np.random.default_rng([31, native])
    compared = 0
    for path in slides:
        with wsitool.open_slide(path) as slide:
            for lv in _jpeg_levels(slide):
                for xl, yl, w, h in _windows(rng, lv):
                    loc = (round(xl * lv.downsample), round(yl * lv.downsample))
                    ref, ref_warned = _read(slide, loc, lv.index, (w, h), native=False, libjpeg=False)
                    got, warned = _read(slide, loc, lv.index, (w, h), native=native, libjpeg=True)
                    what = f"{path.name} level {lv.index} {loc} {(w, h)}"
                    assert _tiles(warned) == _tiles(ref_warned), f"{what}: {warned} vs {ref_warned}"
                    assert np.array_equal(got, ref), what
                    compared += 1
    assert compared >= 20


def _tile_bytes(lv, index: int) -> bytes:
    with open(lv.path, "rb") as fh:
        fh.seek(int(lv.tiles.offsets[index]))
        return fh.read(int(lv.tiles.bytecounts[index]))


@pytest.mark.parametrize("native", [True, False], ids=["compiled-loop", "python-path"])
def test_extraneous_bytes_in_a_tile_are_an_error(native):
    """B28 (wsidicomizer #155): tile 5 has 4 junk bytes before its first RST marker.  libjpeg
    warns ("4 extraneous bytes before marker 0xd0") and nvImageCodec decodes it anyway; here it
    is the tile's error naming that, or with ``fill`` a warning, that tile background and its
    neighbours exact."""
    check_extraneous_bytes(native)


def check_extraneous_bytes(native: bool) -> None:
    """B28's checks, through the compiled loop (``native``) or the Python tile path (also run with the
    extension absent by test_strictjpeg)."""
    path = BUG_INPUTS / "B28_jpeg_restart_extraneous_bytes.tif"
    if not path.exists():
        pytest.skip(NO_BUGS)
    with wsitool.open_slide(path) as slide:
        lv = pyramid_levels(slide)[0]
        tw, th = lv.tile_width, lv.tile_height
        col, row = 5 % lv.tiles_across, 5 // lv.tiles_across
        loc, size = (col * tw - 16, row * th), (tw + 32, th)
        err, _ = _read(slide, loc, 0, size, native=native, on_error="raise")
        assert isinstance(err, wsitool.TileDecodeError) and (err.col, err.row) == (col, row), err
        assert "Corrupt JPEG data: 4 extraneous bytes before marker 0xd0" in str(err)
        got, warned = _read(slide, loc, 0, size, native=native)
        assert len(warned) == 1 and "extraneous bytes" in warned[0]
        assert not got[:, 16:16 + tw].any() and got[:, :16].any() and got[:, 16 + tw:].any()
        silent, silent_warned = _read(slide, loc, 0, size, native=False, libjpeg=False)
        assert not silent_warned and silent[:, 16:16 + tw].any()  # what nvImageCodec gives


def test_decode_jpeg_checks_its_output_buffer(sample_jpeg):
    """``decode_jpeg`` refuses an output of another shape or layout before decoding; a stream
    that is not JPEG is libjpeg's message, not an exception."""
    mod = jpegloop._load()
    with wsitool.open_slide(sample_jpeg) as slide:
        lv = pyramid_levels(slide)[0]
        from wsitool.codec.tilebytes import jpeg_stream

        stream = jpeg_stream(lv, _tile_bytes(lv, 0), 0, 0)
    tw, th = lv.tile_width, lv.tile_height
    whole = np.zeros((th, tw, 3), np.uint8)
    assert mod.decode_jpeg(stream, whole, 0, 0, tw, th) is None and whole.any()
    for bad in (np.zeros((th, tw, 4), np.uint8), np.zeros((th - 1, tw, 3), np.uint8),
                np.zeros((th, tw, 3), np.uint16), np.zeros((tw, th, 3), np.uint8).transpose(1, 0, 2)):
        with pytest.raises(ValueError):
            mod.decode_jpeg(stream, bad, 0, 0, tw, th)
    with pytest.raises(ValueError):
        mod.decode_jpeg(stream, whole, 5, 0, 5, th)
    big = np.zeros((th + 8, tw, 3), np.uint8)
    assert "does not hold the window" in mod.decode_jpeg(stream, big, 0, 0, tw, th + 8)
    assert "Not a JPEG file" in mod.decode_jpeg(b"\x00" * 64, whole, 0, 0, tw, th)
    window = np.zeros((50, 70, 3), np.uint8)
    assert mod.decode_jpeg(stream, window, 13, 21, 83, 71) is None
    assert np.array_equal(window, whole[21:71, 13:83])


def _tiled_tiff(path, tiles: list[bytes], width: int, height: int, tile: int = 64):
    """A one-level tiled TIFF at ``path`` whose JPEG tiles are the given complete streams."""
    tifffile = pytest.importorskip("tifffile")
    tifffile.imwrite(path, iter(tiles), shape=(height, width, 3), dtype=np.uint8, tile=(tile, tile),
                     compression="jpeg", photometric="rgb")
    return path


def _pattern(h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 3 + y) % 256, (y * 5) % 256, (x * y // 7) % 256], -1)
    return (img + rng.integers(0, 40, img.shape)).clip(0, 255).astype(np.uint8)


def _pil_jpeg(img: np.ndarray, **options) -> bytes:
    image = pytest.importorskip("PIL.Image")
    import io

    buf = io.BytesIO()
    image.fromarray(img).save(buf, format="JPEG", quality=90, **options)
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["lossless", "cmyk", "12-bit"])
def test_jpeg_kinds_libjpeg_does_not_decode_stay_with_nvimagecodec(tmp_path, kind):
    """A level of lossless (SOF3), CMYK or 12-bit JPEG tiles (in an 8-bit RGB TIFF): libjpeg-turbo
    2.1 decodes none of them to RGB, so the level is left to nvImageCodec
    (:func:`jpegloop.libjpeg_decodes`, from the first tile's frame header) on both paths: its
    pixels (lossless, CMYK) or its error (12-bit, which it does not decode either)."""
    imagecodecs = pytest.importorskip("imagecodecs")
    img = _pattern(128, 128)
    cells = [np.ascontiguousarray(img[y:y + 64, x:x + 64]) for y in (0, 64) for x in (0, 64)]
    if kind == "lossless":
        tiles = [imagecodecs.jpeg8_encode(c, lossless=True) for c in cells]
    elif kind == "cmyk":
        image = pytest.importorskip("PIL.Image")
        tiles = []
        for c in cells:
            import io

            buf = io.BytesIO()
            image.fromarray(c).convert("CMYK").save(buf, format="JPEG", quality=90)
            tiles.append(buf.getvalue())
    else:
        tiles = [imagecodecs.jpeg8_encode(c.astype(np.uint16) * 16, 90, bitspersample=12) for c in cells]
    path = _tiled_tiff(tmp_path / f"{kind}.tif", tiles, 128, 128)
    with wsitool.open_slide(path) as slide:
        assert not jpegloop.libjpeg_decodes(pyramid_levels(slide)[0])
        ref, _ = _read(slide, (3, 5), 0, (100, 90), native=False, libjpeg=False, on_error="raise")
        assert isinstance(ref, wsitool.TileDecodeError) == (kind == "12-bit"), ref
        for native in (True, False):
            got, _ = _read(slide, (3, 5), 0, (100, 90), native=native, on_error="raise")
            if isinstance(ref, wsitool.TileDecodeError):
                assert str(got) == str(ref)  # nvImageCodec's own words
            else:
                assert np.array_equal(got, ref), (kind, native)


def _hostile_streams() -> dict[str, bytes]:
    """Damaged or hostile JPEG streams of a 64 x 64 tile (a sound one under ``"sound"``)."""
    img = _pattern(64, 64, 1)
    good, progressive = _pil_jpeg(img), _pil_jpeg(img, progressive=True)
    sos = good.index(b"\xff\xda")
    head_end = sos + 2 + int.from_bytes(good[sos + 2:sos + 4], "big")
    head, scan = good[:head_end], good[head_end:-2]
    last_scan = progressive[progressive.rindex(b"\xff\xda"):-2]
    return {
        "sound": good,
        "truncated": good[:len(good) // 2],
        "junk after the last MCU": head + scan + b"\x12" * 100_000 + b"\xff\xd9",
        "a scan of 4 MB of stuffed 0xFF": head + b"\xff\x00" * 2_000_000 + b"\xff\xd9",
        "a second scan": head + scan + good[sos:],
        "a restart marker in a stream without DRI": head + scan[:300] + b"\xff\xd0" + scan[300:] + b"\xff\xd9",
        "a progressive scan repeated 500 times": progressive[:-2] + last_scan * 500 + b"\xff\xd9",
    }


def test_hostile_streams_are_a_message_and_leave_the_decoder_sound():
    """Each damaged or hostile stream decoded whole is libjpeg-turbo's message (no crash, no
    hang: the worst is a 4 MB scan), and a sound stream decodes the same before and after."""
    mod = jpegloop._load()
    streams = _hostile_streams()
    before = np.zeros((64, 64, 3), np.uint8)
    assert mod.decode_jpeg(streams["sound"], before, 0, 0, 64, 64) is None
    for name, stream in streams.items():
        if name == "sound":
            continue
        message = mod.decode_jpeg(stream, np.zeros((64, 64, 3), np.uint8), 0, 0, 64, 64)
        assert isinstance(message, str) and message, name
    after = np.zeros((64, 64, 3), np.uint8)
    assert mod.decode_jpeg(streams["sound"], after, 0, 0, 64, 64) is None
    assert np.array_equal(before, after) and before.any()


def test_threads_reading_corrupt_tiles_agree_with_one_thread(tmp_path):
    """8 threads reading windows of a slide with damaged tiles, ``fill`` and ``raise`` mixed,
    through the compiled loop and the Python path: each read is what the same read gives on
    one thread: the same pixels, or an error (naming one of the damaged tiles: with several
    in a window, which one fails first is a race, on one thread too)."""
    import threading

    streams = _hostile_streams()
    bad = [s for name, s in streams.items() if name != "sound"]
    img = _pattern(256, 256, 2)
    tiles = [_pil_jpeg(img[y:y + 64, x:x + 64]) for y in range(0, 256, 64) for x in range(0, 256, 64)]
    for i, stream in enumerate(bad):
        tiles[1 + 2 * i] = stream
    damaged = {((1 + 2 * i) % 4, (1 + 2 * i) // 4) for i in range(len(bad))}
    path = _tiled_tiff(tmp_path / "damaged.tif", tiles, 256, 256)
    rng = np.random.default_rng(7)
    reads = [((int(rng.integers(0, 200)), int(rng.integers(0, 200))), ("fill", "raise")[i % 2]) for i in range(48)]

    def outcome(slide, loc, on_error):
        # (no decode_paths or catch_warnings in the threads: both are process-wide, not thread-safe)
        try:
            got = slide.read_region(loc, 0, (90, 70), mode="rgb", on_error=on_error)
        except wsitool.TileDecodeError as exc:
            return ("error", (exc.col, exc.row) in damaged)
        return (got.tobytes(), True)

    def threaded(slide) -> list:
        got: list = [None] * len(reads)

        def work(k):
            for i in range(k, len(reads), 8):
                got[i] = outcome(slide, *reads[i])

        threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return got

    expected: list = []
    for native in (True, False):
        with wsitool.open_slide(path) as slide, decode_paths(native=native), warnings.catch_warnings():
            warnings.simplefilter("ignore", wsitool.TileWarning)
            expected = [outcome(slide, *r) for r in reads]
            got = threaded(slide)
        assert got == expected and all(o[1] for o in expected), native
    assert any(o[0] == "error" for o in expected) and any(o[0] != "error" for o in expected)
