"""Ground-floor modules: geometry, argument coercion, decode-path switches, fork safety, import without side effects."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from wsitool.codec.paths import decode_paths, get_decode_paths
from wsitool.errors import InvalidRegionError
from wsitool.ground.forksafe import PerProcess
from wsitool.ground.geometry import TileJob, inside_rect, level_rect, plan_tiles
from wsitool.ground.integers import as_int, int_pair


class _Grid:
    def __init__(self, width, height, tw, th, downsample=1.0):
        self.width, self.height, self.tile_width, self.tile_height = width, height, tw, th
        self.downsample = downsample


def test_plan_tiles_covers_the_inside_once_with_matching_rectangles():
    grid = _Grid(1000, 700, 240, 256)
    rng = np.random.default_rng(1)
    for _ in range(200):
        rx, ry = (int(v) for v in rng.integers(-300, 1100, 2))
        w, h = (int(v) for v in rng.integers(1, 900, 2))
        inside, jobs = plan_tiles(grid, rx, ry, w, h)
        cover = np.zeros((h, w), np.int32)
        for job in jobs:
            assert isinstance(job, TileJob)
            sx0, sy0, sx1, sy1 = job.src
            dx0, dy0, dx1, dy1 = job.dst
            assert (sx1 - sx0, sy1 - sy0) == (dx1 - dx0, dy1 - dy0) and sx1 > sx0 and sy1 > sy0
            # the same level pixel from both frames
            assert job.col * 240 + sx0 == rx + dx0 and job.row * 256 + sy0 == ry + dy0
            job.view(cover)[...] += 1
        if inside is None:
            assert jobs == [] and not cover.any()
            continue
        cx0, cy0, cx1, cy1 = inside
        assert inside == inside_rect(grid, rx, ry, w, h)
        assert (cover[cy0 - ry:cy1 - ry, cx0 - rx:cx1 - rx] == 1).all()
        assert cover.sum() == (cx1 - cx0) * (cy1 - cy0)


def test_level_rect_nearest_pixel():
    assert level_rect(_Grid(10, 10, 1, 1, 1.0), 7, 9) == (7, 9)
    grid = _Grid(10, 10, 1, 1, 4.0)
    assert level_rect(grid, 5, 6) == (1, 2)  # floor(1.25 + .5), floor(1.5 + .5)


def test_as_int_and_pairs():
    assert as_int(3.0, "x") == 3 and as_int(np.int64(4), "x") == 4
    for bad in (True, 2.5, "3", None):
        with pytest.raises(InvalidRegionError, match="x must be an integer"):
            as_int(bad, "x", "slide.svs")
    with pytest.raises(ValueError, match=r"^tile_size must be an integer"):
        as_int(1.5, "tile_size", error=ValueError)
    assert int_pair((1, 2.0), "size") == (1, 2)
    with pytest.raises(InvalidRegionError, match="pair of integers"):
        int_pair(5, "size", "s.svs")


def test_decode_paths_nest_by_field_and_restore():
    before = get_decode_paths()
    outer = decode_paths(native=not before.native)
    outer.__enter__()
    with decode_paths(force_scratch=True):
        assert get_decode_paths().force_scratch and get_decode_paths().native is not before.native
        outer.__exit__(None, None, None)  # out of order: restores only its own field
        assert get_decode_paths().native is before.native and get_decode_paths().force_scratch
    assert get_decode_paths() == before
    with pytest.raises(TypeError), decode_paths(bogus=True):
        pass


def test_per_process_value_is_made_once_and_anew_in_a_forked_child():
    made = []
    value = PerProcess(lambda: made.append(os.getpid()) or object())
    seen = set()
    threads = [threading.Thread(target=lambda: seen.add(id(value.get()))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 1 and made == [os.getpid()]
    parent = value.get()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: a new value, the parent's untouched
        try:
            ok = value.peek() is None and value.get() is not parent and made[-1] == os.getpid()
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    answer = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert answer == b"1"
    assert value.get() is parent


def test_importing_wsitool_changes_nothing_in_the_process():
    """No environment variables set, no native library loaded, stderr untouched at import."""
    code = ("import os, sys; env = dict(os.environ); fd2 = os.fstat(2).st_ino; "
            "import wsitool, wsitool.cli; "
            "assert 'nvidia.nvimgcodec' not in sys.modules, 'nvImageCodec loaded at import'; "
            "assert dict(os.environ) == env, 'environment changed'; "
            "assert os.fstat(2).st_ino == fd2; print('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_one_jpeg_marker_walk_serves_frame_size_sampling_and_app_markers():
    import imagecodecs

    from wsitool.export.passthrough import jpeg_sampling
    from wsitool.formats.dicom.encoding import jpeg_markers
    from wsitool.ground.bitstream import jpeg_frame_size, jpeg_segments, jpeg_sof

    tile = np.random.default_rng(0).integers(0, 255, (24, 40, 3), dtype=np.uint8)
    jpeg = imagecodecs.jpeg8_encode(tile, level=80, subsampling="420")  # JFIF APP0, then tables
    adobe = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x01"
    # fill bytes and a stray RST marker between segments are skipped, as T.81 B.1.1.3 allows
    odd = jpeg[:2] + b"\xff\xff\xd3" + adobe + jpeg[2:]
    markers = [m for m, _s, _e in jpeg_segments(odd)]
    assert markers[0] == 0xEE and markers[1] == 0xE0 and markers[-1] == 0xDA
    assert all(m != 0xD3 for m in markers)
    for data in (jpeg, odd):
        assert jpeg_frame_size(data) == (40, 24)
        assert jpeg_sampling(data) == (2, 2)
        assert jpeg_sof(data)[0] == 8  # the body: precision first
    assert jpeg_markers(jpeg) == (True, None)
    assert jpeg_markers(odd) == (True, 1)
    # no SOI, a cut stream, or SOS before any frame header: nothing found
    assert list(jpeg_segments(jpeg[2:])) == [] and jpeg_frame_size(jpeg[2:]) is None
    assert jpeg_frame_size(jpeg[:30]) is None
    assert jpeg_sof(b"\xff\xd8\xff\xda\x00\x02") is None


def test_one_jp2_box_walk():
    from wsitool.ground.bitstream import jp2_boxes, jp2_codestream_start

    sig = b"\x00\x00\x00\x0cjP  \r\n\x87\n"
    colr = (15).to_bytes(4, "big") + b"colr" + bytes([1, 0, 0]) + (16).to_bytes(4, "big")
    jp2h = (8 + len(colr)).to_bytes(4, "big") + b"jp2h" + colr
    code = b"\xff\x4f\xff\x51" + bytes(40)
    xl = (1).to_bytes(4, "big") + b"jp2c" + (16 + len(code)).to_bytes(8, "big") + code  # XLBox
    data = sig + jp2h + xl
    boxes = list(jp2_boxes(data))
    assert [t for t, _a, _b in boxes] == [b"jP  ", b"jp2h", b"jp2c"]
    _t, a, b = boxes[1]
    assert [t for t, _c, _d in jp2_boxes(data, a, b)] == [b"colr"]  # nested walk
    start, end, problem = jp2_codestream_start(data)
    assert data[start:end] == code and problem is None
    to_end = sig + (0).to_bytes(4, "big") + b"jp2c" + code  # LBox 0: to the end of the file
    s2, e2, _ = jp2_codestream_start(to_end)
    assert to_end[s2:e2] == code
    assert jp2_codestream_start(sig + (4).to_bytes(4, "big") + b"jp2c")[2] == "invalid JP2 box length 4"
    assert jp2_codestream_start(sig + (1).to_bytes(4, "big") + b"jp2c" + b"\x00")[2] == "truncated JP2 box header"
    assert "without a code stream box" in jp2_codestream_start(sig + jp2h)[2]
    assert jp2_codestream_start(code) == (0, len(code), None)  # a raw code stream
