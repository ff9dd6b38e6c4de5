"""Focused tests of each field-fault kind (beyond the manifest checks).

Files come from ../shared/bug-inputs (skipped when absent) or are generated
here with tifffile so the whole kind is covered, not only the one file.
"""

from __future__ import annotations

import struct
import tracemalloc
import warnings

import numpy as np
import pytest
import tifffile

import wsitool
from wsitool.codec import nvdecode
from wsitool.codec.pool import get_pool
from wsitool.errors import (
    CorruptFileError,
    ResourceLimitError,
    TileDecodeError,
    TileWarning,
    UnsupportedFormatError,
    WsiError,
)
from wsitool.ground.bitstream import webp_frame_size
from wsitool.slide import pyramid_levels

from helpers import BUG_INPUTS, NO_BUGS


def bug(name: str):
    path = BUG_INPUTS / name
    if not path.exists():
        pytest.skip(f"{NO_BUGS} (needs {name})")
    return path


# ---------------------------------------------------------------------- corrupt tiles (B04)


def test_corrupt_tile_error_names_level_col_row_and_slide_stays_usable():
    path = bug("B04_corrupt_tiles_level1.tif")
    with wsitool.open_slide(path) as s:
        good_before = s.read_region((0, 0), 1, (256, 256))
        for loc, cr in (((600, 0), (1, 0)), ((600, 600), (1, 1))):  # garbage, truncated
            with pytest.raises(TileDecodeError) as info:
                s.read_region(loc, 1, (100, 100))
            e = info.value
            assert (e.level, e.col, e.row) == (1, *cr)
            assert e.path == str(path)
            assert f"level 1, tile (col {cr[0]}, row {cr[1]})" in str(e)
            assert not isinstance(e, ResourceLimitError)
        # the same handle still reads, same pixels as before the errors
        again = s.read_region((0, 0), 1, (256, 256))
        np.testing.assert_array_equal(again, good_before)
        assert (again[..., 3] == 255).all()


def test_corrupt_tile_fill_policy_warns_counts_and_keeps_neighbours():
    path = bug("B04_corrupt_tiles_level1.tif")
    with wsitool.open_slide(path) as s:
        pool = get_pool("cpu")
        good = s.read_region((0, 0), 1, (256, 256))  # tile (0, 0) of level 1
        pool.reset_stats()
        with pytest.warns(TileWarning, match=r"level 1, tile \(col 1, row 0\)"):
            arr = s.read_region((0, 0), 1, (512, 256), on_error="fill", threads=1)
        assert pool.stats().tiles_failed == 1
        np.testing.assert_array_equal(arr[:, :256], good)  # the good neighbour is intact
        assert (arr[:, 256:] == 0).all()  # the bad tile is transparent background


# ---------------------------------------------------------------------- missing tiles (B03)


@pytest.mark.parametrize("name", ["B03_sparse_tiles_generic.tif", "B03_sparse_tiles_aperio.tif"])
def test_missing_tiles_are_transparent_and_counted(name):
    path = bug(name)
    with wsitool.open_slide(path) as s:
        lv = pyramid_levels(s)[0]
        pool = get_pool("cpu")
        pool.reset_stats()
        with warnings.catch_warnings():
            warnings.simplefilter("error", TileWarning)  # missing is not corrupt: no warning
            arr = s.read_region((0, 0), 0, s.dimensions, threads=1)
        missing = {5, 10}
        assert pool.stats().tiles_missing == len(missing)
        assert pool.stats().tiles_failed == 0
        expect = np.full(arr.shape[:2], 255, np.uint8)
        for idx in missing:
            c, r = idx % lv.tiles_across, idx // lv.tiles_across
            expect[r * lv.tile_height:(r + 1) * lv.tile_height, c * lv.tile_width:(c + 1) * lv.tile_width] = 0
        np.testing.assert_array_equal(arr[..., 3], expect)
        assert (arr[expect == 0] == 0).all()


def test_missing_tile_in_generated_deflate_file(tmp_path):
    """Offset 0 / byte count 0 on a non-JPEG level: same fill, never handed to a decoder."""
    img = np.random.default_rng(1).integers(0, 255, (128, 128, 3), np.uint8)
    path = tmp_path / "sparse.tif"
    tifffile.imwrite(path, img, tile=(64, 64), compression="zlib", photometric="rgb")
    with tifffile.TiffFile(path) as t:
        tag = t.pages[0].tags["TileByteCounts"]
        where, fmt = tag.valueoffset, {3: "<H", 4: "<I"}[int(tag.dtype)]
    raw = bytearray(path.read_bytes())
    struct.pack_into(fmt, raw, where + 3 * struct.calcsize(fmt), 0)  # tile 3 = (col 1, row 1)
    path.write_bytes(raw)
    with wsitool.open_slide(path) as s:
        arr = s.read_region((0, 0), 0, (128, 128), mode="rgb")
    np.testing.assert_array_equal(arr[:64], img[:64])
    np.testing.assert_array_equal(arr[64:, :64], img[64:, :64])
    assert (arr[64:, 64:] == 0).all()


# ---------------------------------------------------------------------- header vs grid (B26)


def test_sof_bomb_rejected_before_decode(monkeypatch):
    path = bug("B26_jpeg_sof_declares_8000x8000.tif")
    decoded = []
    real = nvdecode.decode_checked

    def spy(level, col, row, *a, **k):
        decoded.append((col, row))
        return real(level, col, row, *a, **k)

    monkeypatch.setattr(nvdecode, "decode_checked", spy)
    with wsitool.open_slide(path) as s:
        with pytest.raises(TileDecodeError, match="declares 8000x8000") as info:
            s.read_region((0, 0), 0, (512, 512), threads=1)
        assert (info.value.col, info.value.row) == (1, 1)
        assert (1, 1) not in decoded  # refused from the header, the decoder never saw it
        assert set(decoded) <= {(0, 0), (1, 0), (0, 1)}


def _patch_jpeg_sof(raw: bytearray, start: int, width: int, height: int) -> None:
    i = start
    while True:
        i = raw.index(b"\xff", i)
        if raw[i + 1] in (0xC0, 0xC1, 0xC2):
            struct.pack_into(">HH", raw, i + 5, height, width)
            return
        i += 1


def test_generic_jpeg_tile_with_wrong_sof_is_rejected(tmp_path):
    """The same rule on the tifffile path (grey JPEG), for any size other than the cell."""
    img = np.tile(np.arange(128, dtype=np.uint8), (128, 1))
    path = tmp_path / "gray.tif"
    tifffile.imwrite(path, img, tile=(64, 64), compression="jpeg", photometric="minisblack")
    with tifffile.TiffFile(path) as t:
        off = t.pages[0].dataoffsets[1]
    raw = bytearray(path.read_bytes())
    _patch_jpeg_sof(raw, off, 4000, 64)
    path.write_bytes(raw)
    with wsitool.open_slide(path) as s:
        assert pyramid_levels(s)[0].decoder == "tifffile"
        s.read_region((0, 0), 0, (64, 64))  # tile 0 fine
        with pytest.raises(TileDecodeError, match="declares 4000x64") as info:
            s.read_region((64, 0), 0, (64, 64))
        assert (info.value.col, info.value.row) == (1, 0)


def test_webp_frame_size_and_bomb(tmp_path):
    imagecodecs = pytest.importorskip("imagecodecs")
    img = np.random.default_rng(2).integers(0, 255, (17, 33, 3), np.uint8)
    assert webp_frame_size(imagecodecs.webp_encode(img, level=80)) == (33, 17)  # VP8
    assert webp_frame_size(imagecodecs.webp_encode(img, lossless=True)) == (33, 17)  # VP8L
    rgba = np.dstack([img, np.full(img.shape[:2], 128, np.uint8)])
    assert webp_frame_size(imagecodecs.webp_encode(rgba, level=80)) == (33, 17)  # VP8X
    assert webp_frame_size(b"not webp" * 8) is None

    big = np.random.default_rng(3).integers(0, 255, (64, 128, 3), np.uint8)
    path = tmp_path / "webp.tif"
    tifffile.imwrite(path, big, tile=(64, 64), compression="webp", compressionargs={"lossless": True},
                     photometric="rgb")
    with tifffile.TiffFile(path) as t:
        off = t.pages[0].dataoffsets[1]
    raw = bytearray(path.read_bytes())
    assert raw[off + 12:off + 16] == b"VP8L"
    bits = (16000 - 1) | ((16000 - 1) << 14)
    struct.pack_into("<I", raw, off + 21, bits | (struct.unpack_from("<I", raw, off + 21)[0] & ~0xFFFFFFF))
    path.write_bytes(raw)
    with wsitool.open_slide(path) as s:
        np.testing.assert_array_equal(s.read_region((0, 0), 0, (64, 64), mode="rgb"), big[:, :64])
        with pytest.raises(TileDecodeError, match="declares 16000x16000"):
            s.read_region((64, 0), 0, (64, 64))


# ---------------------------------------------------------------------- limits (B25)


def test_huge_request_refused_before_any_allocation():
    path = bug("B25_huge_declared_100k_x_100k.tif")
    with wsitool.open_slide(path) as s:
        assert s.dimensions == (100000, 100000)
        for mode in ("rgba", "rgb", "raw"):
            tracemalloc.start()
            try:
                with pytest.raises(ResourceLimitError, match="100000x100000"):
                    s.read_region((0, 0), 0, (100000, 100000), mode=mode)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert peak < 1 << 20, f"{mode}: {peak} bytes traced while refusing"
        assert not issubclass(ResourceLimitError, TileDecodeError)
        # small reads of the same slide work
        assert s.read_region((512, 512), 0, (128, 128)).shape == (128, 128, 4)


def test_limits_are_configurable():
    path = bug("B25_huge_declared_100k_x_100k.tif")
    with wsitool.open_slide(path) as s:
        with wsitool.limits(max_region_pixels=100 * 100):
            with pytest.raises(ResourceLimitError, match="max_region_pixels"):
                s.read_region((0, 0), 0, (101, 100))
            assert s.read_region((0, 0), 0, (100, 100)).shape == (100, 100, 4)
        with wsitool.limits(max_region_bytes=1000), pytest.raises(ResourceLimitError, match="max_region_bytes"):
            s.read_region((0, 0), 0, (16, 16))  # 1024 bytes as RGBA
        # (the file's tiles are 512 x 512)
        with wsitool.limits(max_tile_pixels=256 * 256), pytest.raises(ResourceLimitError, match="max_tile_pixels"):
            s.read_region((0, 0), 0, (8, 8))


def test_associated_image_over_limit_refused():
    path = bug("B18_bigtiff_svs_assoc_without_description.tif")
    with (wsitool.open_slide(path) as s, wsitool.limits(max_region_pixels=1000),
          pytest.raises(ResourceLimitError, match="associated image 'label'")):
        s.associated_images["label"]


# ---------------------------------------------------------------------- 16-bit, big-endian, CMYK


def test_uint16_rgb_mapping_is_the_documented_linear_scale():
    path = bug("B16_uint16_single_channel.tif")
    with wsitool.open_slide(path) as s:
        assert pyramid_levels(s)[0].dtype == np.uint16 and pyramid_levels(s)[0].samples == 1
        raw = s.read_region((50, 50), 0, (300, 200), mode="raw")
        rgb = s.read_region((50, 50), 0, (300, 200), mode="rgb")
        rgba = s.read_region((50, 50), 0, (300, 200))
    assert raw.dtype == np.uint16 and raw.shape == (200, 300, 1) and raw.max() > 255
    expect = np.rint(raw[..., 0].astype(np.float64) * 255.0 / 65535.0).astype(np.uint8)
    for c in range(3):
        np.testing.assert_array_equal(rgb[..., c], expect)
    np.testing.assert_array_equal(rgba[..., :3], rgb)
    assert (rgba[..., 3] == 255).all()


def test_big_endian_equals_little_endian_twin(tmp_path):
    """Any byte order, with and without the predictor: identical raw values."""
    data = (np.arange(300 * 200, dtype=np.uint32) * 2654435761 % 65536).astype(np.uint16).reshape(200, 300)
    out = {}
    for bo in "<>":
        for pred in (None, 2):
            p = tmp_path / f"x{bo == '>'}{pred}.tif"
            tifffile.imwrite(p, data, byteorder=bo, tile=(64, 64), compression="zlib", predictor=pred)
            with wsitool.open_slide(p) as s:
                out[bo, pred] = s.read_region((0, 0), 0, (300, 200), mode="raw")[..., 0]
    for arr in out.values():
        np.testing.assert_array_equal(arr, data)


def test_cmyk_convention_and_conversion():
    path = bug("B30_cmyk_jpeg_tiles.tif")
    with wsitool.open_slide(path) as s:
        lv = pyramid_levels(s)[0]
        assert lv.photometric == "SEPARATED" and lv.samples == 4
        assert lv.encoding.page.tags.valueof(332) == 1  # InkSet CMYK
        raw = s.read_region((0, 0), 0, (512, 512), mode="raw")
        rgb = s.read_region((0, 0), 0, (512, 512), mode="rgb")
        rgba = s.read_region((0, 0), 0, (512, 512))
    cmyk = raw.astype(np.float64) / 255.0
    expect = np.rint(255.0 * (1 - cmyk[..., :3]) * (1 - cmyk[..., 3:4])).astype(np.uint8)
    np.testing.assert_array_equal(rgb, expect)
    np.testing.assert_array_equal(rgba[..., :3], rgb)
    assert (rgba[..., 3] == 255).all()  # K is never alpha
    # TIFF convention (0 = no ink): the red patch has no cyan, full magenta/yellow.
    c, m, y, _k = raw[60:124, 60:124].reshape(-1, 4).mean(axis=0)
    assert c < 30 and m > 180 and y > 180


def test_separated_not_cmyk_refused_for_rgb_but_raw_works(tmp_path):
    data = np.random.default_rng(4).integers(0, 255, (64, 64, 4), np.uint8)
    path = tmp_path / "inks.tif"
    tifffile.imwrite(path, data, tile=(32, 32), photometric="separated",
                     extratags=[(332, "H", 1, 2, True)])  # InkSet 2: not CMYK
    with wsitool.open_slide(path) as s:
        np.testing.assert_array_equal(s.read_region((0, 0), 0, (64, 64), mode="raw"), data)
        for mode in ("rgb", "rgba"):
            with pytest.raises(UnsupportedFormatError, match="InkSet 2"):
                s.read_region((0, 0), 0, (64, 64), mode=mode)


# ---------------------------------------------------------------------- malformed tags


def _retype_entry(path, tag_code: int, new_type: int) -> None:
    with tifffile.TiffFile(path) as t:
        entry = t.pages[0].tags[tag_code].offset
    raw = bytearray(path.read_bytes())
    struct.pack_into("<H", raw, entry + 2, new_type)
    path.write_bytes(raw)


@pytest.mark.parametrize("tag_code, new_type, expect", [
    (256, 2, "tag ImageWidth holds"),  # ASCII width
    (322, 11, "tag TileWidth holds"),  # FLOAT tile width
    (277, 2, "unreadable TIFF structure: TypeError"),  # tifffile itself trips over it
])
def test_tag_of_wrong_type_is_corrupt_file_error(tmp_path, tag_code, new_type, expect):
    path = tmp_path / "t.tif"
    tifffile.imwrite(path, np.zeros((64, 64, 3), np.uint8), tile=(32, 32), photometric="rgb")
    _retype_entry(path, tag_code, new_type)
    with pytest.raises(CorruptFileError) as info:
        wsitool.open_slide(path)
    assert str(path) in str(info.value)
    assert expect in str(info.value)


def test_wrong_count_offsets_is_corrupt_file_error(tmp_path):
    path = tmp_path / "t.tif"
    tifffile.imwrite(path, np.zeros((64, 64, 3), np.uint8), tile=(32, 32), photometric="rgb")
    with tifffile.TiffFile(path) as t:
        entry = t.pages[0].tags["TileOffsets"].offset
    raw = bytearray(path.read_bytes())
    struct.pack_into("<I", raw, entry + 4, 2)  # 2 offsets for a 2 x 2 grid
    path.write_bytes(raw)
    with pytest.raises(WsiError), wsitool.open_slide(path) as s:
        s.read_region((0, 0), 0, (64, 64))


# ---------------------------------------------------------------------- truncated JPEG 2000 (fuzz find)


def _j2k_tiff(tmp_path):
    img = np.random.default_rng(6).integers(0, 255, (64, 128, 3), np.uint8)
    path = tmp_path / "j2k.tif"
    tifffile.imwrite(path, img, tile=(64, 64), compression="jpeg2000", photometric="rgb")
    with tifffile.TiffFile(path) as t:
        page = t.pages[0]
        tag = page.tags["TileByteCounts"]
        return path, img, page.dataoffsets[1], tag.valueoffset, {3: "<H", 4: "<I"}[int(tag.dtype)]


def test_j2k_header_problem_finds_truncated_main_headers(tmp_path):
    from wsitool.ground.bitstream import j2k_header_problem

    path, _img, off, _where, _fmt = _j2k_tiff(tmp_path)
    raw = path.read_bytes()
    with tifffile.TiffFile(path) as t:
        n = t.pages[0].databytecounts[1]
    tile = raw[off:off + n]
    assert j2k_header_problem(tile) is None
    sot = tile.index(b"\xff\x90")
    for cut in range(4, sot + 12):  # anywhere before the first tile-part header is whole
        assert j2k_header_problem(tile[:cut]) is not None, cut
    assert j2k_header_problem(tile[:sot + 12]) is None
    assert "not a JPEG 2000" in j2k_header_problem(b"\xff\xd8\xff\xe0" + bytes(20))
    # out-of-range COD parameters (T.800 table A.15) crashed nvImageCodec's CPU decoder too
    cod = tile.index(b"\xff\x52")
    # COD from its marker: FF52, Lcod(2), Scod, progression, layers(2), MCT, levels, xcb, ycb, style, transform
    for field, value, what in ((10, 6, "code-block exponents"), (10, 75, "code-block exponents"),
                               (9, 40, "decomposition levels"), (13, 3, "wavelet transform"),
                               (5, 9, "progression order"), (4, 0xEE, "invalid Scod"),
                               (4, 1, "precinct sizes missing")):
        bad = bytearray(tile)
        bad[cod + field] = value
        assert what in (j2k_header_problem(bytes(bad)) or ""), (field, value)


def test_truncated_j2k_tile_is_a_tile_error_not_a_crash(tmp_path):
    """nvImageCodec's CPU JPEG 2000 decoder crashed on this; run it in a child process."""
    import json
    import subprocess
    import sys

    path, img, off, where, fmt = _j2k_tiff(tmp_path)
    raw = path.read_bytes()
    tile = raw[off:]
    sot = tile.index(b"\xff\x90")
    patched = bytearray(raw)
    struct.pack_into(fmt, patched, where + struct.calcsize(fmt), sot - 10)  # cut inside the main header
    path.write_bytes(patched)
    code = (
        "import json, sys, wsitool, numpy as np\n"
        "s = wsitool.open_slide(sys.argv[1])\n"
        "good = s.read_region((0, 0), 0, (64, 64), mode='rgb')\n"
        "try:\n"
        "    s.read_region((64, 0), 0, (64, 64))\n"
        "    out = {'error': None}\n"
        "except wsitool.TileDecodeError as e:\n"
        "    out = {'error': str(e), 'col': e.col, 'row': e.row}\n"
        "np.save(sys.argv[2], good)\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "good.npy")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"child died with {proc.returncode}: {proc.stderr[-500:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["error"] and "main header truncated" in out["error"]
    assert (out["col"], out["row"]) == (1, 0)
    good = np.load(tmp_path / "good.npy")
    assert np.abs(good.astype(int) - img[:, :64]).mean() < 3  # lossy J2K, neighbour intact


# ---------------------------------------------------------------------- corrupt LZW (fuzz find)


def _lzw_pack(codes):
    """TIFF LZW bit packing (MSB first, early change) of a list of codes."""
    bits, width, nxt, first = [], 9, 258, True
    for c in codes:
        bits.append(format(c, f"0{width}b"))
        if c == 256:
            width, nxt, first = 9, 258, True
            continue
        if not first:
            nxt += 1
        first = False
        if nxt + 1 >= (1 << width) and width < 12:
            width += 1
    s = "".join(bits)
    s += "0" * (-len(s) % 8)
    return int(s, 2).to_bytes(len(s) // 8, "big")


def test_lzw_problem_flags_non_literal_first_codes():
    from wsitool.ground.bitstream import lzw_problem

    imagecodecs = pytest.importorskip("imagecodecs")
    assert imagecodecs.lzw_decode(_lzw_pack([256, 65, 66, 258, 257])) == b"ABAB"  # packer is right
    assert lzw_problem(_lzw_pack([256, 65, 66, 258, 257])) is None
    assert "398" in lzw_problem(_lzw_pack([256, 398, 258, 257]))
    assert "300" in lzw_problem(_lzw_pack([256, 65, 66, 256, 300, 257]))  # after a later Clear
    assert "does not start with a Clear" in lzw_problem(_lzw_pack([65, 66, 258, 257]))
    # garbage starting with a zero byte looks like old-style LSB-first LZW (crashed imagecodecs)
    assert "old-style" in lzw_problem(bytes.fromhex("004b6a00004bd200004c3900004c9f00"))
    # a real stream with many Clear codes (table refills) passes, also with its bytes changed
    rng = np.random.default_rng(0)
    data = (rng.integers(0, 4, (512, 512, 3)) * 60).astype(np.uint8).tobytes()
    enc = imagecodecs.lzw_encode(data)
    assert len(enc) > 20_000 and lzw_problem(enc) is None
    assert lzw_problem(enc[:12345]) is None  # truncation alone is the decoder's business


def test_corrupt_lzw_tile_is_a_tile_error_not_a_crash(tmp_path):
    """imagecodecs' LZW decoder crashed on this; run it in a child process."""
    import json
    import subprocess
    import sys

    img = np.random.default_rng(7).integers(0, 255, (64, 128), np.uint8)
    path = tmp_path / "lzw.tif"
    tifffile.imwrite(path, img, tile=(64, 64), compression="lzw")
    with tifffile.TiffFile(path) as t:
        off, n = t.pages[0].dataoffsets[1], t.pages[0].databytecounts[1]
    bad = _lzw_pack([256, 398, 258, 259, 257])
    raw = bytearray(path.read_bytes())
    raw[off:off + n] = bad + bytes(n - len(bad))
    path.write_bytes(raw)
    code = (
        "import json, sys, wsitool\n"
        "s = wsitool.open_slide(sys.argv[1])\n"
        "good = s.read_region((0, 0), 0, (64, 64), mode='raw')\n"
        "try:\n"
        "    s.read_region((64, 0), 0, (64, 64), mode='raw')\n"
        "    out = {'error': None}\n"
        "except wsitool.TileDecodeError as e:\n"
        "    out = {'error': str(e), 'col': e.col}\n"
        "out['good_sum'] = int(good.sum())\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"child died with {proc.returncode}: {proc.stderr[-500:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["error"] and "not a literal" in out["error"] and out["col"] == 1
    assert out["good_sum"] == int(img[:, :64].sum())


# ---------------------------------------------------------------------- decompressed size vs grid


def _append_tile(path, index: int, payload: bytes) -> None:
    """Append ``payload`` to the file and point tile ``index`` at it."""
    with tifffile.TiffFile(path) as t:
        tags = t.pages[0].tags
        offs, counts = tags["TileOffsets"], tags["TileByteCounts"]
        spec = [(offs.valueoffset, {3: "<H", 4: "<I"}[int(offs.dtype)]),
                (counts.valueoffset, {3: "<H", 4: "<I"}[int(counts.dtype)])]
    raw = bytearray(path.read_bytes())
    at = len(raw)
    raw += payload
    for (where, fmt), value in zip(spec, (at, len(payload)), strict=True):
        struct.pack_into(fmt, raw, where + index * struct.calcsize(fmt), value)
    path.write_bytes(raw)


@pytest.mark.parametrize("compression", ["zlib", "zstd", "lzw"])
def test_tile_decompressing_past_its_cell_is_refused_bounded(tmp_path, compression):
    """A tile whose data inflates beyond its grid cell (a deflate/zstd/LZW bomb): the decoder
    output is bounded by the cell size (tifffile passes ``out=cell bytes`` to imagecodecs),
    so nothing near the bomb's size is allocated.  zlib and zstd report the overflow (a tile
    error); imagecodecs' LZW decoder stops at the buffer's end, so that tile reads as the
    first cell's worth of its data."""
    imagecodecs = pytest.importorskip("imagecodecs")
    img = np.random.default_rng(8).integers(0, 255, (64, 128, 3), np.uint8)
    path = tmp_path / "bomb.tif"
    tifffile.imwrite(path, img, tile=(64, 64), compression=compression, photometric="rgb")
    big = bytes(64 << 20)  # 64 MiB of zeros; the cell holds 12 KiB
    payload = {"zlib": imagecodecs.zlib_encode, "zstd": imagecodecs.zstd_encode,
               "lzw": imagecodecs.lzw_encode}[compression](big)
    assert len(payload) < 2 << 20
    _append_tile(path, 1, payload)
    with wsitool.open_slide(path) as s:
        np.testing.assert_array_equal(s.read_region((0, 0), 0, (64, 64), mode="rgb"), img[:, :64])
        tracemalloc.start()
        try:
            if compression == "lzw":
                arr = s.read_region((64, 0), 0, (64, 64), mode="rgb", threads=1)
                assert (arr == 0).all()
            else:
                with pytest.raises(TileDecodeError) as info:
                    s.read_region((64, 0), 0, (64, 64), mode="rgb", threads=1)
                assert (info.value.col, info.value.row) == (1, 0)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 8 << 20, f"{peak} bytes traced while decoding a 64 MiB bomb"
