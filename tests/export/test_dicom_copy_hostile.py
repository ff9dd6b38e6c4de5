"""DICOM export with compression copy given hostile or unusual tile layouts: what the frames must be (whole
tiles, one coding), and one clear line with nothing left behind where they cannot be."""

from __future__ import annotations

import imagecodecs
import numpy as np
import pytest
import tifffile

from wsitool.errors import UnsupportedFormatError
from wsitool.export import export_pyramid

T = 64


def _pixels(seed: int, h: int = T, w: int = T) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.ascontiguousarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


@pytest.mark.parametrize("verify", [False, True])
def test_cropped_edge_tiles_are_refused_naming_the_tile(tmp_path, verify):
    """A 300 x 250 level of 64-pixel tiles whose right and bottom tiles are stored cropped (44 and 58 pixels,
    which the read path accepts): a DICOM frame is Rows x Columns, so the export stops at tile (4, 0) with one
    line, exit 3, nothing left (was: frames of 44 x 64 pixels in a 64 x 64 instance, which OpenSlide refuses:
    "Dimensional mismatch reading JPEG")."""
    W, H, cols, rows = 300, 250, 5, 4
    tiles = [imagecodecs.jpeg8_encode(_pixels(r * cols + c, min(T, H - r * T), min(T, W - c * T)), level=90,
                                      colorspace="RGB", outcolorspace="RGB")
             for r in range(rows) for c in range(cols)]
    path = tmp_path / "crop.tif"
    with tifffile.TiffWriter(path) as tw:
        tw.write(iter(tiles), shape=(H, W, 3), dtype=np.uint8, tile=(T, T), compression="jpeg",
                 photometric="rgb")
    out = tmp_path / "out"
    with pytest.raises(UnsupportedFormatError) as info:
        export_pyramid(path, out, format="dicom", compression="copy", verify=verify, associated=False, mpp=0.5)
    msg = str(info.value)
    assert "\n" not in msg and path.name in msg and "tile (4, 0)" in msg and "44x64" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crop.tif"]


COLS, ROWS = 5, 4


def _tiff(path, tiles: list[bytes], compression: str = "jpeg"):
    with tifffile.TiffWriter(path) as tw:
        tw.write(iter(tiles), shape=(ROWS * T, COLS * T, 3), dtype=np.uint8, tile=(T, T),
                 compression=compression, photometric="rgb")
    return path


def _frames(folder) -> list[bytes]:
    import pydicom
    from pydicom.encaps import generate_frames

    ds = pydicom.dcmread(folder / "level-0.dcm")
    return [f.rstrip(b"\0") for f in generate_frames(ds.PixelData, number_of_frames=int(ds.NumberOfFrames))]


def _jpeg(seed: int) -> bytes:
    return imagecodecs.jpeg8_encode(_pixels(seed), level=90, colorspace="RGB", outcolorspace="RGB")


def _relaid(path, tiles: list[bytes], order: list[int], gap: int):
    """``path`` with every tile's bytes appended again in ``order`` (``gap`` zero bytes before each) and the
    index pointing at the new copies: the long reads see tiles out of grid order or far apart."""
    data = bytearray(path.read_bytes())
    offsets = [0] * len(tiles)
    for i in order:
        data += bytes(gap)
        offsets[i] = len(data)
        data += tiles[i]
    with tifffile.TiffFile(path) as tf:
        tag = tf.pages[0].tags["TileOffsets"]
        assert int(tag.dtype) == 4
        for i, off in enumerate(offsets):
            data[tag.valueoffset + 4 * i:tag.valueoffset + 4 * i + 4] = off.to_bytes(4, "little")
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize(("order", "gap"), [("reversed", 0), ("shuffled", 0), ("in order", 300_000)])
def test_frames_are_the_tiles_in_grid_order_whatever_the_layout(tmp_path, order, gap):
    """Tiles stored backwards, shuffled, or 300 KB apart (runs then read tile by tile): the frames are still
    the tiles in row-major grid order."""
    tiles = [_jpeg(i) for i in range(COLS * ROWS)]
    idx = {"reversed": list(range(COLS * ROWS))[::-1], "in order": list(range(COLS * ROWS)),
           "shuffled": np.random.default_rng(3).permutation(COLS * ROWS).tolist()}[order]
    path = _relaid(_tiff(tmp_path / "l.tif", tiles), tiles, idx, gap)
    export_pyramid(path, tmp_path / "s", format="dicom", compression="copy", associated=False, mpp=0.5)
    assert _frames(tmp_path / "s") == [t.rstrip(b"\0") for t in tiles]


def test_a_sound_header_on_a_garbage_body_passes_unless_verified(tmp_path):
    """Copying never decodes: a tile whose header is the first tile's byte for byte but whose coded data are
    noise is passed through as the tile-by-tile checks pass it; --verify decodes and refuses it, naming it."""
    from wsitool.errors import TileDecodeError

    tiles = [_jpeg(i) for i in range(COLS * ROWS)]
    good = tiles[7]
    sos = good.index(b"\xff\xda")
    head = good[:sos + 2 + int.from_bytes(good[sos + 2:sos + 4], "big")]
    tiles[7] = head + bytes(np.random.default_rng(0).integers(0, 255, len(good) - len(head), dtype=np.uint8))
    path = _tiff(tmp_path / "g.tif", tiles)
    export_pyramid(path, tmp_path / "s", format="dicom", compression="copy", associated=False, mpp=0.5)
    assert _frames(tmp_path / "s") == [t.rstrip(b"\0") for t in tiles]
    with pytest.raises(TileDecodeError, match=r"tile \(col 2, row 1\)"):
        export_pyramid(path, tmp_path / "v", format="dicom", compression="copy", associated=False, mpp=0.5,
                       verify=True)
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize("first_mct", [True, False])
def test_jpeg2000_tiles_with_another_colour_transform_are_refused(tmp_path, first_mct):
    """JPEG 2000 tile (4, 1) with the colour transform switched the other way than the first tile's (its
    COD differs, so its header is not the signature's): one line naming it, nothing left."""
    tiles = [imagecodecs.jpeg2k_encode(_pixels(i), level=0, codecformat="J2K", mct=first_mct != (i == 9))
             for i in range(COLS * ROWS)]
    path = _tiff(tmp_path / "k.tif", tiles, "jpeg2000")
    with pytest.raises(UnsupportedFormatError) as info:
        export_pyramid(path, tmp_path / "out", format="dicom", compression="copy", associated=False, mpp=0.5)
    assert "tile (4, 1)" in str(info.value) and path.name in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.tif"]


def test_a_failing_disk_read_names_the_slide(tmp_path, monkeypatch):
    """EIO from a run's long read: an OSError whose filename is the slide (the CLI's one line names it, exit 9;
    was: "Input/output error" alone), nothing left."""
    import errno
    import os

    from wsitool.export import storedruns

    def eio(fd, buffers, offset):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(storedruns.os, "preadv", eio)
    path = _tiff(tmp_path / "e.tif", [_jpeg(i) for i in range(COLS * ROWS)])
    with pytest.raises(OSError) as info:
        export_pyramid(path, tmp_path / "out", format="dicom", compression="copy", associated=False, mpp=0.5)
    assert info.value.errno == errno.EIO and info.value.filename == str(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.tif"]


@pytest.mark.parametrize("verify", [False, True])
def test_a_failing_tile_read_names_the_slide(tmp_path, monkeypatch, verify):
    """EIO from a tile's own read (the first tile's full check; every tile with --verify): the OSError names
    the slide, not the output folder."""
    import errno
    import os

    from wsitool.export import passthrough

    def eio(*args):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(passthrough, "read_tile_bytes", eio)
    path = _tiff(tmp_path / "t.tif", [_jpeg(i) for i in range(COLS * ROWS)])
    with pytest.raises(OSError) as info:
        export_pyramid(path, tmp_path / "out", format="dicom", compression="copy", associated=False, mpp=0.5,
                       verify=verify)
    assert info.value.errno == errno.EIO and info.value.filename == str(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.tif"]


def test_a_level_without_any_stored_tile_is_refused_before_writing(tmp_path):
    """Every tile of the level missing: a DICOM instance of 0 frames is invalid (dciodvfy; OpenSlide: "value
    of NumberOfFrames is malformed"), so the copy stops before writing, one line naming the level (exit 3)."""
    path = _tiff(tmp_path / "m.tif", [b""] * (COLS * ROWS))
    with pytest.raises(UnsupportedFormatError) as info:
        export_pyramid(path, tmp_path / "out", format="dicom", compression="copy", associated=False, mpp=0.5)
    msg = str(info.value)
    assert "\n" not in msg and path.name in msg and "level 0" in msg and "no stored tile" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.tif"]


def test_an_interrupt_mid_write_leaves_nothing_and_no_thread(tmp_path, monkeypatch):
    """Ctrl-C while the frames of the third run are handed to the writer (runs of 3000 bytes, so several):
    the KeyboardInterrupt comes out, the partial folder is gone, and the reader and writer threads have ended."""
    import threading

    from wsitool.export import storedruns
    from wsitool.export.dicom import frames

    monkeypatch.setattr(storedruns, "RUN_BYTES", 3000)
    real = frames.FrameCoding.frame_run
    calls = []

    def interrupted(self, run):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, run)

    monkeypatch.setattr(frames.FrameCoding, "frame_run", interrupted)
    path = _tiff(tmp_path / "i.tif", [_jpeg(i) for i in range(COLS * ROWS)])
    with pytest.raises(KeyboardInterrupt):
        export_pyramid(path, tmp_path / "out", format="dicom", compression="copy", associated=False, mpp=0.5)
    assert len(calls) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["i.tif"]
    assert not [t.name for t in threading.enumerate() if t.name.startswith(("wsitool-runs", "wsitool-write"))]


def test_index_entries_sharing_one_tile_make_equal_frames(tmp_path):
    """Every other index entry points at tile 0's bytes (offset and count): each such frame is tile 0, the
    others their own tiles (views of one long read may overlap)."""
    tiles = [_jpeg(i) for i in range(COLS * ROWS)]
    path = _tiff(tmp_path / "d.tif", tiles)
    data = bytearray(path.read_bytes())
    with tifffile.TiffFile(path) as tf:
        offsets, counts = tf.pages[0].tags["TileOffsets"], tf.pages[0].tags["TileByteCounts"]
        assert int(offsets.dtype) == int(counts.dtype) == 4
        first = (tf.pages[0].dataoffsets[0], tf.pages[0].databytecounts[0])
    for i in range(0, COLS * ROWS, 2):
        for tag, value in zip((offsets, counts), first, strict=True):
            data[tag.valueoffset + 4 * i:tag.valueoffset + 4 * i + 4] = int(value).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    export_pyramid(path, tmp_path / "s", format="dicom", compression="copy", associated=False, mpp=0.5)
    want = [tiles[0] if i % 2 == 0 else t for i, t in enumerate(tiles)]
    assert _frames(tmp_path / "s") == [t.rstrip(b"\0") for t in want]
