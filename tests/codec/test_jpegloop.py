"""The compiled JPEG tile loop (wsitool._jpegloop, wsitool/codec/jpegloop.py) pinned to the Python path.

Every test reads the same thing twice, once through the compiled loop and once
with it turned off (``decode_paths(native=False)``: the Python path of
wsitool.read.worker.TileWorker, the reference), and asserts the same pixels, the same
decoder counters, and for bad tiles the same error type, tile and message.
Without the compiled loop (no C compiler at install time) these tests skip
with the reason :func:`wsitool.codec.jpegloop.status` gives; the Python path is then
what every other test exercises.
"""

from __future__ import annotations

import contextlib
import re
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

import wsitool
from wsitool.codec import jpegloop
from wsitool.codec.paths import decode_paths
from wsitool.codec.pool import get_pool
from wsitool.slide import pyramid_levels

from helpers import (
    BUG_INPUTS,
    present,
    random_regions,
    repo_samples,
    slides_where,
    tiff_samples,
    with_byte_count,
    with_tile_bytes,
)

_paths = contextlib.ExitStack()


def _use_native(flag: bool) -> None:
    """Turn the compiled loop on or off until the test ends (``decode_paths(native=flag)``)."""
    _paths.close()
    _paths.enter_context(decode_paths(native=flag))


def _require_native():
    _use_native(True)
    if jpegloop._load() is None:
        pytest.skip(f"compiled JPEG loop: {jpegloop.status()}")


@pytest.fixture(autouse=True)
def _native_on():
    _require_native()
    yield
    _paths.close()


_COUNTERS = ("tiles_decoded", "tiles_direct", "tiles_roi", "tiles_scratch", "tiles_missing",
             "tiles_failed", "bytes_read")


def _read(slide, loc, level, size, *, compiled: bool, **kw):
    """(pixels or exception, counters, warning messages) of one read on one path."""
    _use_native(compiled)
    pool = get_pool("cpu")
    pool.reset_stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = slide.read_region(loc, level, size, **kw)
        except (wsitool.TileDecodeError, OSError) as exc:
            result = exc
    st = pool.stats()
    _use_native(True)
    msgs = [str(w.message) for w in caught if issubclass(w.category, wsitool.TileWarning)]
    return result, tuple(getattr(st, c) for c in _COUNTERS), msgs


_DETAIL = re.compile(r"(unreadable code stream header|decoder returned no image|unusable code stream) \(.*\)$")


def _normal(msg: str) -> str:
    """A message without the detail in parentheses after 'unreadable code stream
    header' / 'decoder returned no image' / 'unusable code stream': nvImageCodec
    words it differently in its Python binding and its C status codes."""
    return _DETAIL.sub(r"\1 (...)", msg)


def _same_message(a: str, b: str) -> bool:
    return _normal(a) == _normal(b)


def _assert_parity(slide, loc, level, size, **kw):
    fast, fast_counts, fast_warn = _read(slide, loc, level, size, compiled=True, **kw)
    ref, ref_counts, ref_warn = _read(slide, loc, level, size, compiled=False, **kw)
    what = f"{slide.path} level {level} {loc} {size} {kw}"
    if isinstance(ref, Exception):
        assert type(fast) is type(ref), f"{what}: {fast!r} vs {ref!r}"
        if isinstance(ref, wsitool.TileDecodeError):
            assert (fast.level, fast.col, fast.row) == (ref.level, ref.col, ref.row), what
            assert _same_message(str(fast), str(ref)), f"{what}:\n{fast}\n{ref}"
        return None
    assert not isinstance(fast, Exception), f"{what}: compiled loop raised {fast!r}"
    assert np.array_equal(fast, ref), what
    assert fast_counts == ref_counts, f"{what}: {dict(zip(_COUNTERS, fast_counts, strict=True))} vs " \
                                      f"{dict(zip(_COUNTERS, ref_counts, strict=True))}"
    # (the threads finish their tiles in any order)
    assert sorted(map(_normal, fast_warn)) == sorted(map(_normal, ref_warn)), what
    return fast


def _jpeg_levels(slide):
    probe = {"rgb": np.empty((1, 1, 3), np.uint8), "rgba": np.empty((1, 1, 4), np.uint8)}
    return [lv for lv in pyramid_levels(slide) if jpegloop.applies(lv, "rgb", probe["rgb"])]


def _jpeg_slides():
    return slides_where(present(tiff_samples() + repo_samples()) + sorted(BUG_INPUTS.glob("*.tif")), _jpeg_levels)


def test_status_says_in_use():
    assert jpegloop.status().startswith("in use")
    _use_native(False)
    assert jpegloop.status().startswith("off")


def test_the_compiled_loop_is_what_reads_jpeg(sample_jpeg, monkeypatch):
    """A JPEG read goes through RegionJobs.run; turned off, it does not."""
    calls = []
    real = jpegloop.RegionJobs.run
    monkeypatch.setattr(jpegloop.RegionJobs, "run", lambda self, pool: (calls.append(1), real(self, pool)))
    with wsitool.open_slide(sample_jpeg) as slide:
        slide.read_region((0, 0), 0, (300, 300), mode="rgb")
        assert calls
        calls.clear()
        _use_native(False)
        slide.read_region((0, 0), 0, (300, 300), mode="rgb")
        assert not calls


@pytest.mark.parametrize("mode", ["rgb", "rgba", "raw"])
@pytest.mark.parametrize("threads", [1, 3])
def test_pixels_and_counters_equal_the_python_path(mode, threads):
    """Random regions (inside, across the edges, outside) of every level of every
    JPEG slide at hand: same pixels, same counters."""
    slides = _jpeg_slides()
    if not slides:
        pytest.skip("no JPEG slide decoded by nvImageCodec at hand")
    rng = np.random.default_rng([7, threads, len(mode)])
    checked = 0
    for path in slides:
        with wsitool.open_slide(path) as slide:
            for lv in _jpeg_levels(slide):
                regions = random_regions(rng, lv.width, lv.height, 4, max_size=700)
                regions += [(-37, -11, min(300, lv.width + 50), 90), (lv.width - 5, lv.height - 7, 40, 40)]
                for xl, yl, w, h in regions:
                    loc = (round(xl * lv.downsample), round(yl * lv.downsample))
                    _assert_parity(slide, loc, lv.index, (w, h), mode=mode, threads=threads,
                                   on_error="fill")
                    checked += 1
    assert checked >= 6


def _sof_size(data: bytes, width: int, height: int) -> bytes:
    i = data.index(b"\xff\xc0")
    return data[:i + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + data[i + 9:]


def _flip(data: bytes, at: int, n: int) -> bytes:
    """``data`` with bytes ``[at, at + n)`` inverted (XOR 0xFF)."""
    return data[:at] + bytes(b ^ 0xFF for b in data[at:at + n]) + data[at + n:]


#: What each fault of tile (1, 0) must give (None: a missing tile, not an error).
_FAULT_OUTCOME = {
    "no-soi": "not a JPEG stream (starts with 0001",
    "cut-scan": "libjpeg-turbo: Premature end of JPEG file",
    # flipped bytes inside the entropy-coded data: libjpeg-turbo only warns and decodes
    # wrong pixels; the compiled decode makes that warning the tile's error
    "flipped-bits": "libjpeg-turbo: Corrupt JPEG data",
    "zero-count": None,
    "past-eof": "truncated file",
    "sof-8000": "declares 8000x8000 pixels",
    "sof-smaller": "declares 16x16 pixels",
    "garbage": "unreadable code stream header",
}


@pytest.mark.parametrize("fault", ["no-soi", "cut-scan", "flipped-bits", "zero-count", "past-eof", "sof-8000",
                                   "sof-smaller", "garbage"])
@pytest.mark.parametrize("on_error", ["raise", "fill"])
@pytest.mark.parametrize("threads", [1, 2])
def test_bad_tile_gives_the_python_paths_error(sample_jpeg, tmp_path, fault, on_error, threads):
    """One bad tile among good ones: the same error (type, tile, message) with
    ``on_error="raise"``; the same pixels, counters and warnings with ``"fill"``."""
    with wsitool.open_slide(sample_jpeg) as slide:
        lv = pyramid_levels(slide)[0]
        size_of = int(lv.tiles.bytecounts[1])
        file_size = lv.source.size
    if fault == "no-soi":
        bad = with_tile_bytes(sample_jpeg, tmp_path, 1, lambda b: b"\x00\x01" + b[2:], fault)
    elif fault == "cut-scan":
        bad = with_byte_count(sample_jpeg, tmp_path, 1, size_of * 4 // 10, fault)
    elif fault == "flipped-bits":
        bad = with_tile_bytes(sample_jpeg, tmp_path, 1, lambda b: _flip(b, len(b) // 3, 40), fault)
    elif fault == "zero-count":
        bad = with_byte_count(sample_jpeg, tmp_path, 1, 0, fault)
    elif fault == "past-eof":
        bad = with_byte_count(sample_jpeg, tmp_path, 1, file_size, fault)
    elif fault == "sof-8000":
        bad = with_tile_bytes(sample_jpeg, tmp_path, 1, lambda b: _sof_size(b, 8000, 8000), fault)
    elif fault == "sof-smaller":
        bad = with_tile_bytes(sample_jpeg, tmp_path, 1, lambda b: _sof_size(b, 16, 16), fault)
    else:
        bad = with_tile_bytes(sample_jpeg, tmp_path, 1,
                               lambda b: b[:2] + bytes(range(256)) * (len(b) // 256) + b[2 + 256 * (len(b) // 256):],
                               fault)
    with wsitool.open_slide(bad) as slide:
        lv = pyramid_levels(slide)[0]
        size = (min(lv.width, 3 * lv.tile_width + 17), min(lv.height, 2 * lv.tile_height - 5))
        for mode in ("rgb", "rgba"):
            got = _assert_parity(slide, (9, 3), 0, size, mode=mode, threads=threads, on_error=on_error)
            fast, counts, warned = _read(slide, (9, 3), 0, size, compiled=True, mode=mode,
                                         threads=threads, on_error=on_error)
            expect = _FAULT_OUTCOME[fault]
            if expect is None:  # not an error: the tile is missing (background)
                assert counts[_COUNTERS.index("tiles_missing")] == 1 and not warned
            elif on_error == "raise":
                assert isinstance(fast, wsitool.TileDecodeError) and (fast.col, fast.row) == (1, 0)
                assert expect in str(fast), str(fast)
            else:
                assert len(warned) == 1 and expect in warned[0], warned
                assert counts[_COUNTERS.index("tiles_failed")] == 1
                tw, th = lv.tile_width, lv.tile_height
                assert not got[:th - 3, tw - 9:2 * tw - 9].any()  # the bad tile
                assert got[:th - 3, :tw - 9].any()                # a good one


def test_truncated_file_gives_the_python_paths_error(sample_jpeg, tmp_path):
    data = sample_jpeg.read_bytes()
    with wsitool.open_slide(sample_jpeg) as slide:
        lv = pyramid_levels(slide)[0]
        last = int(np.argmax(lv.tiles.offsets[: lv.tiles_across * lv.tiles_down]))
        col, row = last % lv.tiles_across, last // lv.tiles_across
        loc = (col * lv.tile_width, row * lv.tile_height)
    short = tmp_path / "short.svs"
    short.write_bytes(data[: int(lv.tiles.offsets[last]) + 10])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", wsitool.SlideWarning)
        slide = wsitool.open_slide(short)
    with slide:
        err = _read(slide, loc, 0, (16, 16), compiled=True, mode="rgb")[0]
        assert isinstance(err, wsitool.TileDecodeError) and "truncated file" in str(err)
        _assert_parity(slide, loc, 0, (16, 16), mode="rgb")


def test_out_view_is_filled_and_nothing_around_it(sample_jpeg):
    """A caller's ``out`` that is a C-contiguous block of a bigger array: filled in
    place (the very buffer), nothing written before or after it."""
    with wsitool.open_slide(sample_jpeg) as slide:
        lv = pyramid_levels(slide)[0]
        w, h = min(lv.width, 500), min(lv.height, 300)
        big = np.full((h + 4, w, 3), 77, np.uint8)
        out = big[2:2 + h]
        got = slide.read_region((5, 5), 0, (w, h), mode="rgb", out=out, threads=2)
        assert got is out
        _use_native(False)
        ref = slide.read_region((5, 5), 0, (w, h), mode="rgb", threads=2)
    assert np.array_equal(out, ref)
    assert (big[:2] == 77).all() and (big[2 + h:] == 77).all()


def test_one_decoder_per_thread_and_threads_agree(sample_jpeg):
    """Eight threads reading the same regions at once through their own compiled
    decoders get the single-thread pixels; each thread makes its decoders (the
    loop's and the Python path's) on its first read, and none after."""
    with wsitool.open_slide(sample_jpeg) as slide:
        lv = pyramid_levels(slide)[0]
        rng = np.random.default_rng(3)
        # (regions whose last column is a tile's first column take the Python path,
        # read/plan.ends_one_column_into_a_tile: left out, so the loop reads them all)
        regions = [r for r in random_regions(rng, lv.width, lv.height, 8, max_size=600)
                   if (min(r[0] + r[2], lv.width) - 1) % lv.tile_width != 0][:6]
        ref = [slide.read_region((x, y), 0, (w, h), mode="rgb", threads=1) for x, y, w, h in regions]
        made = []
        errors = []

        def work():
            try:
                state = get_pool("cpu").state()
                first = None
                for _ in range(3):
                    for (x, y, w, h), r in zip(regions, ref, strict=True):
                        got = slide.read_region((x, y), 0, (w, h), mode="rgb", threads=1)
                        assert np.array_equal(got, r)
                        first = state.stats.decoders_created if first is None else first
                made.append((first, state.stats.decoders_created))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    # each thread: the loop's decoder and the Python path's (for the tiles the loop
    # leaves), both made on its first read and none after
    assert made == [(2, 2)] * 8


def test_bad_arguments_are_refused_not_crashed(sample_jpeg):
    """The C entry point checks what it is given (a caller bug, not a file fault)."""
    with wsitool.open_slide(sample_jpeg) as slide:
        lv = pyramid_levels(slide)[0]
        dec = jpegloop.new_decoder()
        out = np.zeros((10, 10, 3), np.uint8)
        level = (lv.tile_width, lv.tile_height, lv.width, lv.height, lv.tiles_across, lv.source.size)
        ok_region = (0, 0, 0, 0, 10, 10)
        prefix = lv.encoding.jpeg_prefix or b""
        args = (lv.source.fileno(), prefix, out, lv.tiles.offsets, lv.tiles.bytecounts, level, ok_region, 0, 1, 4)
        assert dec.decode_tiles(*args)[5] == 1  # the good call decodes its tile
        bad = [
            (lv.source.fileno(), prefix, out[:, :, :2], *args[3:]),                       # 2 channels
            (lv.source.fileno(), prefix, out.astype(np.uint16), *args[3:]),               # not uint8
            (lv.source.fileno(), prefix, out[:, ::2], *args[3:]),                         # not contiguous
            (lv.source.fileno(), prefix, np.zeros((10, 10, 3), np.uint8)[:5].view()[::-1], *args[3:]),
            (*args[:6], (0, 0, 0, 0, 11, 10), 0, 1, 4),                        # region wider than out
            (*args[:6], (0, 0, 0, 0, lv.width + 1, 10), 0, 1, 4),              # region past the level
            (*args[:7], 0, 2, 4),                                              # job past the region
            (*args[:7], 0, 1, 0),                                              # batch 0
            (*args[:7], 0, 1, 65),                                             # batch > MAX_BATCH
            (*args[:3], lv.tiles.offsets.view(np.uint8)[:-1], *args[4:]),           # not 8-byte items
        ]
        for call in bad:
            with pytest.raises((ValueError, BufferError, TypeError)):
                dec.decode_tiles(*call)
        assert dec.decode_tiles(*args)[5] == 1  # and the decoder still works
        # offsets and byte counts of different lengths (as some files list them): fine
        assert dec.decode_tiles(lv.source.fileno(), prefix, out, lv.tiles.offsets[:-1], *args[4:])[5] == 1
        dest = np.zeros((2, 4, 4, 3), np.uint8)
        piece = np.array([[0, dest.strides[1], 0, 4, 0, 4]], np.int64)
        far = np.array([[0, dest.strides[1], 0, 4, 0, 11]], np.int64)  # reads past out's width
        for call in [(*args, 0, dest, piece, False, dest),                  # dest2 without pieces2
                     (*args, 0, None, None, False, dest, piece),            # pieces2 without pieces
                     (*args, 0, dest, piece, False, dest, far)]:
            with pytest.raises((ValueError, TypeError)):
                dec.decode_tiles(*call)
        assert not dest.any()  # refused before any decode or copy


_ALIASED_PIECES = """
import numpy as np, sys
import wsitool
from wsitool.codec import jpegloop
from wsitool.slide import pyramid_levels
mod = jpegloop._load()
src = np.frombuffer(np.array([1 << 40], np.int64).tobytes(), np.uint8).reshape(1, 8, 1).copy()
# piece 0 writes src's 8 bytes over piece 1's offset: piece 1 must still go where it said at the call
pieces = np.array([[48, 8, 0, 1, 0, 8], [0, 8, 0, 1, 0, 8]], np.int64)
mod.scatter(src, pieces.view(np.uint8).reshape(-1), pieces)
assert pieces[:, 0].tolist() == [1 << 40, 1 << 40], pieces
with wsitool.open_slide(sys.argv[1]) as slide:
    lv = pyramid_levels(slide)[0]
    level = (lv.tile_width, lv.tile_height, lv.width, lv.height, lv.tiles_across, lv.source.size)
    out = np.zeros((1, 8, 3), np.uint8)
    # piece 0: the decoded row (24 bytes) over piece 1 (and 2)'s first fields
    pieces = np.array([[48, 24, 0, 1, 0, 8], [0, 24, 0, 1, 0, 8], [0, 24, 0, 1, 0, 8]], np.int64)
    want = np.zeros((1, 8, 3), np.uint8)
    for keep in (True, False):
        p = pieces.copy()
        dest = p.view(np.uint8).reshape(-1)
        res = mod.Decoder().decode_tiles(lv.source.fileno(), lv.encoding.jpeg_prefix or b"", out, lv.tiles.offsets,
                                         lv.tiles.bytecounts, level, (0, 0, 0, 0, 8, 1), 0, 1, 1, 0, dest, p, keep)
        assert res[5] == 1 and not res[8], res
        if keep:
            want = out.copy()
        assert bytes(dest[:24]) == want.tobytes() and bytes(dest[48:72]) == want.tobytes()
print("ok")
"""


def test_pieces_overwritten_by_their_own_copies_are_read_as_given(sample_jpeg):
    """A ``dest`` that holds the pieces themselves (or that another thread changes while the GIL
    is released): every piece is checked and copied as it was at the call, never re-read after
    a copy changed it (a piece's offset overwritten with pixels wrote far outside ``dest``)."""
    import subprocess
    import sys

    if jpegloop._load() is None:
        pytest.skip(f"compiled JPEG loop: {jpegloop.status()}")
    done = subprocess.run([sys.executable, "-c", _ALIASED_PIECES, str(sample_jpeg)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-2000:])


def test_pieces_come_from_the_tile_scratch_into_two_destinations(sample_jpeg):
    """``keep=False``: RGB tiles decoded into the loop's tile scratch, the pieces (``dest``)
    and the next batch's pieces (``dest2``) copied from it, ``out`` left as it was; the same
    pixels as a decode into ``out`` (``keep=True``, the default) and numpy slicing of it."""
    with wsitool.open_slide(sample_jpeg) as slide:
        lv = pyramid_levels(slide)[0]
        tw, th = lv.tile_width, lv.tile_height
        w, h = min(2 * tw, lv.width), min(th + th // 2, lv.height)
        level = (tw, th, lv.width, lv.height, lv.tiles_across, lv.source.size)
        region = (0, 0, 0, 0, w, h)
        prefix = lv.encoding.jpeg_prefix or b""
        dec = jpegloop.new_decoder()
        jobs = ((w - 1) // tw + 1) * ((h - 1) // th + 1)
        base = (lv.source.fileno(), prefix)
        whole = np.zeros((h, w, 3), np.uint8)
        dec.decode_tiles(*base, whole, lv.tiles.offsets, lv.tiles.bytecounts, level, region, 0, jobs, 4)
        a, b = np.zeros((3, 20, 30, 3), np.uint8), np.zeros((2, 20, 30, 3), np.uint8)
        # windows spanning tile edges, one of them a window of the region's last rows
        rects = [(0, 20, tw - 10, tw + 20), (th - 5, th + 15, 3, 33), (h - 20, h, w - 30, w)]
        pa = np.array([(i * a.strides[0], a.strides[1], y0, y1, x0, x1)
                       for i, (y0, y1, x0, x1) in enumerate(rects)], np.int64)
        pb = np.array([(i * b.strides[0], b.strides[1], y0, y1, x0, x1)
                       for i, (y0, y1, x0, x1) in enumerate(rects[1:])], np.int64)
        out = np.full((h, w, 3), 7, np.uint8)
        res = dec.decode_tiles(*base, out, lv.tiles.offsets, lv.tiles.bytecounts, level, region, 0, jobs, 4, 0,
                               a, pa, False, b, pb)
        assert res[5] == jobs and not res[8]
        assert (out == 7).all()  # not written: the pixels went from the scratch to the pieces
        for i, (y0, y1, x0, x1) in enumerate(rects):
            np.testing.assert_array_equal(a[i], whole[y0:y1, x0:x1])
            if i:
                np.testing.assert_array_equal(b[i - 1], whole[y0:y1, x0:x1])
        kept = np.zeros_like(a)
        dec.decode_tiles(*base, out, lv.tiles.offsets, lv.tiles.bytecounts, level, region, 0, jobs, 4, 0,
                         kept, pa, True)
        np.testing.assert_array_equal(out, whole)  # keep: out holds the tiles too
        np.testing.assert_array_equal(kept, a)


def _replace_tile(src, tmp_path, index: int, data: bytes, name: str):
    """A copy of ``src`` whose level-0 tile ``index`` is ``data`` (appended at the end)."""
    import tifffile

    raw = bytearray(src.read_bytes())
    with tifffile.TiffFile(src) as tf:
        tags = tf.pages[0].tags
        spots = []
        for tag_name in ("TileOffsets", "TileByteCounts"):
            tag = tags[tag_name]
            spots.append((tag.valueoffset, {3: 2, 4: 4, 16: 8}[int(tag.dtype)]))
    while len(raw) % 2:
        raw.append(0)
    offset = len(raw)
    raw += data
    for (pos, item), value in zip(spots, (offset, len(data)), strict=True):
        raw[pos + index * item:pos + (index + 1) * item] = value.to_bytes(item, "little")
    out = tmp_path / f"{name}-{src.name}"
    out.write_bytes(bytes(raw))
    return out


def _exif_orientation(jpeg: bytes, orientation: int) -> bytes:
    """``jpeg`` with an APP1 Exif segment holding only the Orientation tag (TIFF 6.0 IFD, little-endian)."""
    ifd = (b"II*\x00\x08\x00\x00\x00\x01\x00" + (0x0112).to_bytes(2, "little") + (3).to_bytes(2, "little")
           + (1).to_bytes(4, "little") + orientation.to_bytes(2, "little") + b"\x00\x00" + bytes(4))
    payload = b"Exif\x00\x00" + ifd
    return jpeg[:2] + b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload + jpeg[2:]


@pytest.mark.parametrize("orientation", [3, 6])
def test_exif_orientation_in_a_tile_is_ignored_on_both_paths(sample_jpeg, tmp_path, orientation):
    """A tile whose code stream carries an EXIF Orientation: the stored pixels on
    both paths (the TIFF Orientation tag, not the tile's, says how the image lies)."""
    with wsitool.open_slide(sample_jpeg) as slide:
        lv = pyramid_levels(slide)[0]
        tw, th = lv.tile_width, lv.tile_height
        plain = slide.read_region((tw, 0), 0, (tw, th), mode="rgb")
        off, count = int(lv.tiles.offsets[1]), int(lv.tiles.bytecounts[1])
    stream = sample_jpeg.read_bytes()[off:off + count]
    bad = _replace_tile(sample_jpeg, tmp_path, 1, _exif_orientation(stream, orientation), "exif")
    with wsitool.open_slide(bad) as slide:
        for mode in ("rgb", "rgba"):
            for loc, size in (((tw, 0), (tw, th)), ((tw + 5, 3), (tw - 30, th - 7))):
                got = _assert_parity(slide, loc, 0, size, mode=mode, threads=1, on_error="raise")
                x0, y0 = loc[0] - tw, loc[1]
                assert np.array_equal(got[..., :3], plain[y0:y0 + size[1], x0:x0 + size[0]])


def test_one_byte_tile_names_only_its_byte(sample_jpeg, tmp_path):
    """A 1-byte tile: the message shows that byte, not a leftover of an earlier read."""
    bad = _replace_tile(sample_jpeg, tmp_path, 1, b"\xab", "one-byte")
    with wsitool.open_slide(bad) as slide:
        lv = pyramid_levels(slide)[0]
        for mode in ("rgb", "rgba"):
            err = _read(slide, (0, 0), 0, (2 * lv.tile_width, lv.tile_height), compiled=False, mode=mode)[0]
            assert isinstance(err, wsitool.TileDecodeError) and "starts with ab instead" in str(err), err
            _assert_parity(slide, (0, 0), 0, (2 * lv.tile_width, lv.tile_height), mode=mode)


def test_first_bad_tile_in_tile_order_is_raised(sample_jpeg, tmp_path):
    """A decode failure (tile 1) before a read-time failure (tile 2) of the same
    batch: both paths raise tile 1's error, in every mode, on one thread."""
    with wsitool.open_slide(sample_jpeg) as slide:
        lv = pyramid_levels(slide)[0]
        cut = int(lv.tiles.bytecounts[1]) * 4 // 10
    bad = with_byte_count(sample_jpeg, tmp_path, 1, cut, "cut")
    bad = with_tile_bytes(bad, tmp_path, 2, lambda b: b"\x00\x01" + b[2:], "no-soi")
    with wsitool.open_slide(bad) as slide:
        lv = pyramid_levels(slide)[0]
        for mode in ("rgb", "rgba", "raw"):
            err = _read(slide, (0, 0), 0, (4 * lv.tile_width, lv.tile_height), compiled=True, mode=mode,
                        threads=1)[0]
            assert isinstance(err, wsitool.TileDecodeError) and (err.col, err.row) == (1, 0), err
            _assert_parity(slide, (0, 0), 0, (4 * lv.tile_width, lv.tile_height), mode=mode, threads=1)


def test_coordinates_that_would_overflow_are_refused(sample_jpeg):
    """decode_tiles with sizes or coordinates near 2**63 raises, never writes out of bounds."""
    with wsitool.open_slide(sample_jpeg) as slide:
        lv = pyramid_levels(slide)[0]
        dec = jpegloop.new_decoder()
        out = np.zeros((10, 10, 3), np.uint8)
        offsets = np.array([1, 0], np.uint64)
        counts = np.array([1, 1], np.uint64)
        calls = [
            ((lv.tile_width, lv.tile_height, lv.width, lv.height, lv.tiles_across, lv.source.size),
             (-2**63, 0, 0, 0, 10, 10)),
            ((2**62, 1, 2**62 + 10, 10, 1, lv.source.size), (2**62, 0, 2**62, 0, 2**62 + 10, 10)),
            ((1, 1, 2**40, 2**40, 2**62, lv.source.size), (0, 2**39, 0, 2**39, 10, 2**39 + 10)),
        ]
        for level, region in calls:
            with pytest.raises(ValueError):
                dec.decode_tiles(lv.source.fileno(), b"", out, offsets, counts, level, region, 0, 1, 1)


def test_without_the_extension_reads_take_the_python_path(sample_jpeg, monkeypatch):
    """As on a machine without a C compiler: status() says why, applies() is False,
    reads give the same pixels, and `wsitool info`'s backend table shows it."""
    import sys

    from wsitool.codec.backends import backend_report

    with wsitool.open_slide(sample_jpeg) as slide:
        ref = slide.read_region((7, 9), 0, (300, 200), mode="rgb")
        monkeypatch.setitem(sys.modules, "wsitool._jpegloop", None)  # import fails
        monkeypatch.delattr(wsitool, "_jpegloop", raising=False)
        monkeypatch.setattr(jpegloop, "_tried", False)
        monkeypatch.setattr(jpegloop, "_module", None)
        # the reason is the build's own (wsitool/_build.json), never a guess
        monkeypatch.setattr(jpegloop.libjpeg, "build_reason", lambda name="": "no C compiler (error: command 'gcc')")
        assert jpegloop.status().startswith("not in use: not built: no C compiler (error: command 'gcc')")
        assert not jpegloop.applies(pyramid_levels(slide)[0], "rgb", ref)
        assert np.array_equal(slide.read_region((7, 9), 0, (300, 200), mode="rgb"), ref)
        row = [b for b in backend_report(probe=False) if "compiled JPEG tile loop" in b["name"]]
        assert len(row) == 1 and not row[0]["available"] and "no C compiler" in row[0]["detail"]
        monkeypatch.setattr(jpegloop, "_tried", False)
        monkeypatch.setattr(jpegloop.libjpeg, "build_reason", lambda name="": None)  # no record
        assert "cannot be imported" in jpegloop.status() and "left no reason" in jpegloop.status()
    monkeypatch.undo()
    jpegloop._tried = False
    assert jpegloop.status().startswith("in use")
    row = [b for b in backend_report(probe=False) if "compiled JPEG tile loop" in b["name"]]
    assert row[0]["available"]


def test_buffers_are_made_once_per_thread_then_reused(sample_jpeg):
    """A thread's first reads allocate its decoder's tile-bytes and RGB buffers
    (counted in scratch_allocations); the same reads again allocate none."""
    got = {}

    def work():
        state = get_pool("cpu").state()
        with wsitool.open_slide(sample_jpeg) as slide:
            lv = pyramid_levels(slide)[0]
            size = (min(lv.width, 900), min(lv.height, 700))
            for mode in ("rgb", "rgba"):
                slide.read_region((11, 13), 0, size, mode=mode, threads=1)
            got["first"] = state.stats.scratch_allocations
            for _ in range(3):
                for mode in ("rgb", "rgba"):
                    slide.read_region((11, 13), 0, size, mode=mode, threads=1)
            got["again"] = state.stats.scratch_allocations

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert got["first"] > 0
    assert got["again"] == got["first"]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_chunks_cover_each_tile_once_and_shrink_towards_the_end(sample_jpeg, threads):
    """RegionJobs hands out every job once, in order; with several threads the chunks
    shrink towards the end (at most the jobs left over twice the threads)."""
    with wsitool.open_slide(sample_jpeg) as slide:
        lv = pyramid_levels(slide)[0]
        w, h = min(lv.width, 6 * lv.tile_width), min(lv.height, 4 * lv.tile_height)
        region = jpegloop.RegionJobs(lv, np.empty((h, w, 3), np.uint8), 0, 0, (0, 0, w, h), "raise")
        region.chunk, region.threads = 4, threads
        spans = []
        while (span := region._take()) is not None:
            spans.append(span)
    assert [a for a, _ in spans] == [0] + [b for _, b in spans[:-1]] and spans[-1][1] == region.count
    sizes = [b - a for a, b in spans]
    if threads == 1:
        assert set(sizes[:-1]) == {4}
    else:
        assert all(1 <= b - a <= max(1, min(4, (region.count - a) // (2 * threads))) for a, b in spans)
        assert sizes == sorted(sizes, reverse=True) and sizes[-1] == 1


def test_tiles_read_from_extents_equal_the_file_reads(sample_jpeg):
    """``fd`` -1 with ``extents`` (a remote slide's fetched ranges): the tiles come from the
    extents, the same pixels and counters as ``pread``; a tile in no extent fails as an I/O
    error (ENODATA); extents out of order or without ``fd`` -1 are refused before any decode."""
    import errno
    with wsitool.open_slide(sample_jpeg) as slide:
        lv = pyramid_levels(slide)[0]
        tw, th = lv.tile_width, lv.tile_height
        w, h = min(3 * tw, lv.width), min(2 * th, lv.height)
        level = (tw, th, lv.width, lv.height, lv.tiles_across, lv.source.size)
        region = (0, 0, 0, 0, w, h)
        prefix = lv.encoding.jpeg_prefix or b""
        offs, cnts = lv.tiles.offsets, lv.tiles.bytecounts
        cols, rows = (w - 1) // tw + 1, (h - 1) // th + 1
        jobs = cols * rows
        dec = jpegloop.new_decoder()
        want = np.zeros((h, w, 3), np.uint8)
        ref = dec.decode_tiles(lv.source.fileno(), prefix, want, offs, cnts, level, region, 0, jobs, 4)
        raw = Path(sample_jpeg).read_bytes()
        # one extent per tile row, each from a little before its first tile to a little past its last
        extents = []
        for r in range(rows):
            idx = [r * lv.tiles_across + c for c in range(cols)]
            a = int(min(offs[idx])) - 5
            b = int(max(offs[i] + cnts[i] for i in idx)) + 7
            extents.append((a, memoryview(raw)[a:b]))
        extents.sort(key=lambda e: e[0])
        got = np.full((h, w, 3), 9, np.uint8)
        res = dec.decode_tiles(-1, prefix, got, offs, cnts, level, region, 0, jobs, 4, 0,
                               None, None, True, None, None, extents)
        np.testing.assert_array_equal(got, want)
        assert res[:6] == ref[:6] and res[7] == ref[7] and not res[8]  # (6: buffers made, reused here)
        missing = np.zeros((h, w, 3), np.uint8)
        res = dec.decode_tiles(-1, prefix, missing, offs, cnts, level, region, 0, jobs, 4, 0,
                               None, None, True, None, None, extents[:1])  # the other rows: in none
        failed = {job for job, code, a, *_ in res[8] if code == jpegloop._load().F_IO_ERROR and a == errno.ENODATA}
        start, data = extents[0]
        inside = {j for j in range(jobs)
                  for i in [(j // cols) * lv.tiles_across + j % cols]
                  if start <= offs[i] and offs[i] + cnts[i] <= start + len(data)}
        assert inside and failed == set(range(jobs)) - inside
        args = (prefix, got, offs, cnts, level, region, 0, jobs, 4, 0, None, None, True, None, None)
        with pytest.raises(ValueError, match="ascending"):
            dec.decode_tiles(-1, *args, extents[::-1] if len(extents) > 1 else [(5, b""), (1, b"")])
        with pytest.raises(ValueError, match="fd -1"):
            dec.decode_tiles(lv.source.fileno(), *args, extents)
        with pytest.raises(ValueError, match="fd -1"):
            dec.decode_tiles(-1, *args)
        assert dec.decode_tiles(-1, *args, extents)[5] == jobs  # and the decoder still works


def test_extents_a_callback_empties_while_they_are_taken_are_not_used_after_free(sample_jpeg):
    """The loop takes its own tuple of the extents: an ``__index__`` that clears the caller's
    list while the starts are read frees nothing the loop still uses."""
    with wsitool.open_slide(sample_jpeg) as slide:
        lv = pyramid_levels(slide)[0]
        tw, th = lv.tile_width, lv.tile_height
        level = (tw, th, lv.width, lv.height, lv.tiles_across, lv.source.size)
        out = np.zeros((th, tw, 3), np.uint8)
        extents: list = []

        class Start:
            def __index__(self):
                extents.clear()
                return 0

        extents.extend([(Start(), bytes(64)), (100, bytearray(64))])
        res = jpegloop.new_decoder().decode_tiles(-1, lv.encoding.jpeg_prefix or b"", out, lv.tiles.offsets,
                                                   lv.tiles.bytecounts, level, (0, 0, 0, 0, tw, th), 0, 1, 1, 0,
                                                   None, None, True, None, None, extents)
        assert res[8]  # the tile lies in neither extent: an I/O failure, not a crash
