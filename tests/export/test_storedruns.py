"""Long-run reads of a level's stored tiles for passthrough (wsitool.export.storedruns): the same bytes and the
same refusals as the tile-by-tile reference path (TileChecker.read), with the full check run only where a
tile's header differs from the first tile's."""

from __future__ import annotations

import io
import os

import imagecodecs
import numpy as np
import pytest
import tifffile
from PIL import Image

import wsitool
from wsitool.errors import TileDecodeError, UnsupportedFormatError
from wsitool.export import export_pyramid, storedruns
from wsitool.export.passthrough import TileChecker
from wsitool.slide import pyramid_levels

T = 64
COLS, ROWS = 5, 4


def _pixels(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:T, 0:T]
    base = np.stack([x * 3, y * 3, (x + y) * 2], axis=-1) % 256
    return (base + rng.integers(0, 24, (T, T, 3))).clip(0, 255).astype(np.uint8)


def _jpeg(seed: int, quality: int = 90, progressive: bool = False) -> bytes:
    if progressive:
        out = io.BytesIO()
        Image.fromarray(_pixels(seed)).save(out, "JPEG", quality=quality, progressive=True, subsampling=0)
        return out.getvalue()
    return imagecodecs.jpeg8_encode(_pixels(seed), level=quality, colorspace="RGB", outcolorspace="RGB")


def _tiff(path, tiles: list[bytes], compression: str = "jpeg"):
    """A one-level tiled TIFF of COLS x ROWS pre-encoded tiles (stored in grid order); empty bytes: missing."""
    with tifffile.TiffWriter(path) as tw:
        tw.write(iter(tiles), shape=(ROWS * T, COLS * T, 3), dtype=np.uint8, tile=(T, T),
                 compression=compression, photometric="rgb")
    return path


class _Counting(TileChecker):
    """The reference checker, counting the tiles it checked in full."""

    def __init__(self, lv):
        super().__init__(lv)
        self.calls = 0

    def read(self, col, row):
        self.calls += 1
        return super().read(col, row)


class _Count:
    def __init__(self):
        self.n = 0

    def add(self, n=1):
        self.n += n


def _both(path, run_bytes=None, monkeypatch=None):
    """(stored_tiles' bytes, the reference path's bytes, full checks made) for level 0 of ``path``."""
    if run_bytes is not None:
        monkeypatch.setattr(storedruns, "RUN_BYTES", run_bytes)
    with wsitool.open_slide(path) as slide:
        lv = pyramid_levels(slide)[0]
        check, count = _Counting(lv), _Count()
        fast = [None if d is None else bytes(d) for d in storedruns.stored_tiles(lv, check, count)]
        assert count.n == lv.tiles_across * lv.tiles_down
        ref_check = TileChecker(lv)
        ref = [ref_check.read(c, r) for r in range(lv.tiles_down) for c in range(lv.tiles_across)]
    return fast, ref, check.calls


@pytest.mark.parametrize("run_bytes", [None, 3000, 1])
def test_same_bytes_as_the_reference_and_one_full_check(tmp_path, monkeypatch, run_bytes):
    """Tiles coded alike: every tile's bytes equal the reference read's, and only the first is checked in full
    (whatever the run length: one run, runs of a few tiles, a tile per run)."""
    path = _tiff(tmp_path / "a.tif", [_jpeg(i) for i in range(COLS * ROWS)])
    fast, ref, calls = _both(path, run_bytes, monkeypatch)
    assert fast == ref and all(ref)
    assert calls == 1


def test_tiles_coded_otherwise_get_the_full_check(tmp_path):
    """Tiles whose headers differ from the first's (other quantisation tables) pass the full check and come
    out unchanged; the others are vouched for by the signature."""
    tiles = [_jpeg(i, quality=50 if i in (3, 11) else 90) for i in range(COLS * ROWS)]
    fast, ref, calls = _both(_tiff(tmp_path / "b.tif", tiles))
    assert fast == ref
    assert calls == 1 + 2


def test_missing_tiles_stay_missing(tmp_path):
    tiles = [b"" if i in (0, 7, COLS * ROWS - 1) else _jpeg(i) for i in range(COLS * ROWS)]
    fast, ref, calls = _both(_tiff(tmp_path / "c.tif", tiles))
    assert fast == ref
    assert [i for i, d in enumerate(fast) if d is None] == [0, 7, COLS * ROWS - 1]
    assert calls == 1


def _offsets(path) -> list[int]:
    with tifffile.TiffFile(path) as tf:
        return list(tf.pages[0].dataoffsets)


def _errors(path, monkeypatch=None, run_bytes=None) -> tuple[str, str]:
    """The messages of stored_tiles and of the reference path on level 0 of ``path``."""
    if run_bytes is not None:
        monkeypatch.setattr(storedruns, "RUN_BYTES", run_bytes)
    with wsitool.open_slide(path) as slide:
        lv = pyramid_levels(slide)[0]
        with pytest.raises(TileDecodeError) as fast:
            list(storedruns.stored_tiles(lv, TileChecker(lv), _Count()))
        check = TileChecker(lv)
        with pytest.raises(TileDecodeError) as ref:
            for r in range(lv.tiles_down):
                for c in range(lv.tiles_across):
                    check.read(c, r)
    return str(fast.value), str(ref.value)


def test_a_bomb_header_is_refused_as_the_read_path_refuses_it(tmp_path):
    """Tile (2, 1) declares 8000 x 64 pixels in its SOF: the same TileDecodeError, naming that tile."""
    path = _tiff(tmp_path / "d.tif", [_jpeg(i) for i in range(COLS * ROWS)])
    at = _offsets(path)[1 * COLS + 2]
    with open(path, "r+b") as fh:
        fh.seek(at)
        head = fh.read(1024)
        sof = head.index(b"\xff\xc0")
        fh.seek(at + sof + 7)  # SOF0: length (2), precision (1), height (2), width (2)
        fh.write((8000).to_bytes(2, "big"))
    fast, ref = _errors(path)
    assert fast == ref
    assert "tile (col 2, row 1)" in fast and "8000x64" in fast


def test_a_file_cut_short_after_opening(tmp_path, monkeypatch):
    """The file shrinks under the open slide: the run's read comes back short and the tile's own read names
    the tile (the reference path's message)."""
    path = _tiff(tmp_path / "e.tif", [_jpeg(i) for i in range(COLS * ROWS)])
    cut = _offsets(path)[COLS * ROWS - 3] + 10
    with wsitool.open_slide(path) as slide:
        lv = pyramid_levels(slide)[0]
        os.truncate(path, cut)
        with pytest.raises(TileDecodeError) as fast:
            list(storedruns.stored_tiles(lv, TileChecker(lv), _Count()))
        check = TileChecker(lv)
        with pytest.raises(TileDecodeError) as ref:
            for i in range(COLS * ROWS):
                check.read(i % COLS, i // COLS)
    assert str(fast.value) == str(ref.value)


def test_header_signature_of_both_codecs(tmp_path):
    """JPEG: SOI through the SOS segment; JPEG 2000: SOC through the first SOT marker and its length."""
    jpeg = _jpeg(1)
    j2k = imagecodecs.jpeg2k_encode(_pixels(1), level=0, codecformat="J2K")
    for path, data, compression in ((tmp_path / "j.tif", jpeg, "jpeg"), (tmp_path / "k.tif", j2k, "jpeg2000")):
        _tiff(path, [data] * (COLS * ROWS), compression)
        with wsitool.open_slide(path) as slide:
            lv = pyramid_levels(slide)[0]
            head, least = storedruns.header_signature(lv, data)
        if compression == "jpeg":
            sos = data.index(b"\xff\xda")
            assert head == data[:sos + 2 + int.from_bytes(data[sos + 2:sos + 4], "big")] and least == len(head)
        else:
            sot = data.index(b"\xff\x90")
            assert head == data[:sot + 4] and least == sot + 12


def test_dicom_copy_refuses_a_frame_coded_otherwise(tmp_path):
    """A progressive JPEG tile among baseline ones cannot share a JPEG Baseline instance: one line naming the
    level and the tile, nothing written; the same through the tile-by-tile path (verify)."""
    tiles = [_jpeg(i, progressive=i == 8) for i in range(COLS * ROWS)]
    path = _tiff(tmp_path / "f.tif", tiles)
    for verify in (False, True):
        out = tmp_path / f"out{verify}"
        with pytest.raises(UnsupportedFormatError) as info:
            export_pyramid(path, out, format="dicom", compression="copy", verify=verify, associated=False,
                           mpp=0.5)
        msg = str(info.value)
        assert "\n" not in msg and "level 0" in msg and "tile (3, 1)" in msg and path.name in msg
        assert not out.exists()
        assert not [p for p in tmp_path.iterdir() if "partial" in p.name]


def test_dicom_copy_frames_are_the_tiles(tmp_path):
    """The fast path's frames: the tiles as stored (no JPEGTables here), edge to edge, with missing tiles
    left out (TILED_SPARSE)."""
    import pydicom
    from pydicom.encaps import generate_frames

    tiles = [b"" if i == 6 else _jpeg(i) for i in range(COLS * ROWS)]
    path = _tiff(tmp_path / "g.tif", tiles)
    export_pyramid(path, tmp_path / "s", format="dicom", compression="copy", associated=False, mpp=0.5)
    ds = pydicom.dcmread(tmp_path / "s" / "level-0.dcm")
    frames = [f.rstrip(b"\0") for f in generate_frames(ds.PixelData, number_of_frames=int(ds.NumberOfFrames))]
    assert frames == [t.rstrip(b"\0") for t in tiles if t]


def test_a_run_buffer_is_reused_only_once_no_tile_refers_to_it():
    """The run buffers: one that a tile handed out still refers to is never read into again (a new one is
    made); once the last view of it is gone it is reused."""
    pool: list[bytearray] = []
    first = storedruns._idle_buffer(pool, 100)
    first[:3] = b"abc"
    tile = memoryview(first)[0:3]  # a tile the writer still holds
    del first
    second = storedruns._idle_buffer(pool, 100)
    assert second is not tile.obj and bytes(tile) == b"abc"
    del second
    third = storedruns._idle_buffer(pool, 50)  # the second buffer is idle again
    assert third is pool[1]
    del third
    tile.release()
    assert storedruns._idle_buffer(pool, 10) is pool[0]
    assert len(pool) == 2 and all(len(b) == storedruns.RUN_BYTES for b in pool)


def test_frame_runs_write_the_same_bytes_as_frames_one_by_one(tmp_path):
    """framestream's batched path (FrameRun: items, odd-length padding, offsets per run) against the frame by
    frame path, for frames with and without a prefix, odd and even, in runs longer than a writer batch."""
    from wsitool.export.dicom import framestream

    rng = np.random.default_rng(5)
    sizes = rng.integers(1, 300, 700)
    data = rng.integers(0, 256, int(sizes.sum()) + 50, dtype=np.uint8).tobytes()
    starts = np.concatenate(([7], 7 + np.cumsum(sizes)[:-1])).astype(np.int64)
    for prefix in (b"", b"\xff\xd8\xff\xee\x00\x03Z"):
        outs = []
        for batched in (False, True):
            path = tmp_path / f"f{batched}{len(prefix)}.bin"
            if batched:
                frames = [framestream.FrameRun(memoryview(data), starts[:300], sizes[:300], prefix),
                          (prefix + data[starts[300]:starts[300] + sizes[300]],),
                          framestream.FrameRun(data, starts[301:], sizes[301:], prefix)]
            else:
                frames = [(prefix, data[s:s + c]) if prefix else data[s:s + c]
                          for s, c in zip(starts.tolist(), sizes.tolist(), strict=True)]
            with open(path, "x+b") as fh:
                offsets, lengths = framestream.write_frames(fh, path, frames, len(sizes), extended=False)
            outs.append((path.read_bytes(), offsets.tolist(), lengths.tolist()))
        assert outs[0] == outs[1]
        body, offsets, lengths = outs[0]
        assert lengths == [int(c) + len(prefix) + ((int(c) + len(prefix)) & 1) for c in sizes]
        k = 123
        assert body[offsets[k]:offsets[k] + 8] == framestream.item(lengths[k])
        assert body[offsets[k] + 8:offsets[k] + 8 + len(prefix) + int(sizes[k])] == (
            prefix + data[starts[k]:starts[k] + sizes[k]])


def test_frame_runs_count_and_limits(tmp_path):
    """A run past the announced frame count, or a frame starting past the Basic Offset Table's 32 bits, stops
    the write as the frame by frame path does."""
    from wsitool.errors import WsiError
    from wsitool.export.dicom import framestream

    data = bytes(range(200))
    run = framestream.FrameRun(data, np.array([0, 50, 100], np.int64), np.array([40, 40, 40], np.int64))
    with open(tmp_path / "a", "x+b") as fh, pytest.raises(WsiError, match="more frames than the 2"):
        framestream.write_frames(fh, tmp_path / "a", [run], 2, extended=False)
    with open(tmp_path / "b", "x+b") as fh, pytest.raises(WsiError, match="3 frames written, 4 announced"):
        framestream.write_frames(fh, tmp_path / "b", [run], 4, extended=False)
    import unittest.mock

    with unittest.mock.patch.object(framestream, "BASIC_TABLE_LIMIT", 60):
        with open(tmp_path / "c", "x+b") as fh, pytest.raises(WsiError, match="Extended Offset Table"):
            framestream.write_frames(fh, tmp_path / "c", [run], 3, extended=False)
        with open(tmp_path / "d", "x+b") as fh:
            offsets, _ = framestream.write_frames(fh, tmp_path / "d", [run], 3, extended=True)
        assert offsets.tolist() == [0, 48, 96]


def test_an_offset_near_2_63_is_named_not_an_index_error(tmp_path):
    """A BigTIFF tile offset of 2**63 - 100 (offset + count overflows int64): the run is not read whole and the
    tile's own read names it, as the reference path does (was: IndexError from the signature check)."""
    path = tmp_path / "h.tif"
    with tifffile.TiffWriter(path, bigtiff=True) as tw:
        tw.write(iter([_jpeg(i) for i in range(COLS * ROWS)]), shape=(ROWS * T, COLS * T, 3), dtype=np.uint8,
                 tile=(T, T), compression="jpeg", photometric="rgb")
    data = bytearray(path.read_bytes())
    with tifffile.TiffFile(path) as tf:
        tag = tf.pages[0].tags["TileOffsets"]
        assert int(tag.dtype) == 16  # 8-byte LONG8 entries
        pos = tag.valueoffset + 7 * 8
    data[pos:pos + 8] = (2**63 - 100).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    fast, ref = _errors(path)
    assert fast == ref
    assert "tile (col 2, row 1)" in fast and "past the end of the file" in fast


_PEAK_CODE = '''
import sys, wsitool
from wsitool.export import storedruns
from wsitool.export.passthrough import TileChecker
from wsitool.slide import pyramid_levels

class Count:
    def add(self, n=1):
        pass

with wsitool.open_slide(sys.argv[1]) as slide:
    lv = pyramid_levels(slide)[0]
    if sys.argv[2] == "runs":
        n = sum(len(d) for d in storedruns.stored_tiles(lv, TileChecker(lv), Count()))
    else:
        check = TileChecker(lv)
        n = sum(len(check.read(c, 0)) for c in range(lv.tiles_across))
assert n > 0
'''


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="peak RSS from /proc (Linux)")
def test_a_tile_whose_header_is_most_of_it_costs_no_multiple_of_itself(tmp_path):
    """Two tiles of 7.9 MB, each 120 APP15 segments then a small JPEG: the signature check compares the
    8 MB headers a stretch at a time (was: an int64 index per header byte, 8 times the tile; the long reads
    then took 140 MB more than the tile-by-tile reads, now about 35 MB: two run buffers and 8 MiB of index)."""
    from helpers import child_peak_rss

    app = b"".join(b"\xff\xef" + (65535).to_bytes(2, "big") + bytes(65533) for _ in range(120))
    tiles = [t[:2] + app + t[2:] for t in (_jpeg(0), _jpeg(1))]
    path = tmp_path / "app.tif"
    with tifffile.TiffWriter(path) as tw:
        tw.write(iter(tiles), shape=(T, 2 * T, 3), dtype=np.uint8, tile=(T, T), compression="jpeg",
                 photometric="rgb")
    peaks = {}
    for mode in ("runs", "tiles"):
        rc, peaks[mode], err = child_peak_rss(_PEAK_CODE, [str(path), mode], tmp_path)
        assert rc == 0, err
    assert peaks["runs"] - peaks["tiles"] < 6 * len(tiles[0]), peaks


def test_the_signature_match_looks_at_every_header_byte_and_the_least_length():
    """_matches: a tile matches only with every header byte equal (first and last checked) and at least the
    signature's least length; starts are offsets in the run's buffer."""
    head = bytes(range(1, 41))
    buf = bytearray(400)
    tiles = {0: head + b"x" * 20, 80: b"\0" + head[1:] + b"x" * 20, 160: head[:-1] + b"\0" + b"x" * 20,
             240: head + b"x" * 2, 300: head + b"y" * 30}
    for at, data in tiles.items():
        buf[at:at + len(data)] = data
    starts = np.array(list(tiles), np.int64)
    counts = np.array([len(d) for d in tiles.values()], np.int64)
    view = memoryview(buf)[:390]
    assert storedruns._matches(view, starts, counts, (head, 50)).tolist() == [True, False, False, False, True]
