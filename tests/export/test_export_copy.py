"""Tile passthrough: ``export_pyramid(..., compression="copy")`` / ``--compression copy`` (issue 19).

The output's copied levels must hold the source's compressed tiles byte for
byte (read with tifffile's raw tile access: ``dataoffsets`` / ``databytecounts``
and the file handle), keep the source's JPEGTables and photometric, and decode
to exactly the pixels the source decodes to in every reader that reads the
codec (OpenSlide, tiffslide, tifffile, libvips): each reader's read of the
output is compared with the same reader's read of the source, and a black or
constant read counts as a failure.  libvips from pyvips-binary has no JPEG
2000 codec and OpenSlide does not read OME-TIFF nor 34712 tiles: those are
skipped with the reason.

Sources: the repo's own Aperio JPEG (RGB, no tables, 3 levels) and JPEG 2000
(33005, 2 levels) samples; the shared CMU-1 small region (JPEG with JPEGTables,
photometric RGB, one level: all lower levels computed), TCGA (33005) and
OpenSlide's boxes.tiff (deflate, downsample steps 2, 4.016, 8.086).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import tifffile
from typer.testing import CliRunner

import wsitool
from wsitool import TileWarning
from wsitool.cli import app
from wsitool.errors import InvalidRegionError, TileDecodeError
from wsitool.export import export_pyramid, painted_tiles
from wsitool.export.passthrough import jpeg_sampling

from helpers import REPO_SAMPLES, shared_sample, with_byte_count, with_tile_bytes

runner = CliRunner()

SOURCES = {
    "jpeg-rgb": lambda: REPO_SAMPLES / "sample-aperio-jpeg.svs",
    "j2k-33005": lambda: REPO_SAMPLES / "sample-aperio-j2k.svs",
    "jpeg-tables": lambda: shared_sample("aperio-cmu1-small-region-jpeg.svs"),
    "j2k-tcga": lambda: shared_sample("aperio-tcga-cr-7395-jp2k-33005-2level.svs"),
    "deflate": lambda: shared_sample("generic-boxes-deflate-4level.tiff"),
}
NAMES = {"tiff": "out.svs", "ome-tiff": "out.ome.tif"}


def level_pages(path: Path) -> list:
    """The pyramid levels' keyframes (tifffile series 0), full resolution first."""
    tf = tifffile.TiffFile(path)
    return tf, [lv.keyframe for lv in tf.series[0].levels]


def raw_tiles(tf, page) -> list[bytes]:
    fh = tf.filehandle
    out = []
    for off, n in zip(page.dataoffsets, page.databytecounts, strict=True):
        fh.seek(off)
        out.append(fh.read(n) if n else b"")
    return out


@pytest.fixture(scope="module", params=[(s, f) for s in SOURCES for f in NAMES],
                ids=lambda p: f"{p[0]}-{p[1]}")
def copied(request, tmp_path_factory):
    name, fmt = request.param
    src = SOURCES[name]()
    out = tmp_path_factory.mktemp(f"copy-{name}-{fmt}") / NAMES[fmt]
    res = export_pyramid(src, out, format=fmt, compression="copy", threads=2)
    with wsitool.open_slide(src) as s:
        n_src = s.level_count
    return src, out, fmt, res, n_src


def test_copied_levels_hold_the_source_tiles_byte_for_byte(copied):
    src, out, fmt, res, n_src = copied
    stf, spages = level_pages(src)
    otf, opages = level_pages(out)
    try:
        assert len(opages) == len(res.level_dimensions) >= n_src
        assert res.tiles_copied == sum(len(p.dataoffsets) for p in spages)
        for k, (sp, op) in enumerate(zip(spages, opages[:len(spages)], strict=True)):
            assert (op.imagewidth, op.imagelength) == (sp.imagewidth, sp.imagelength)
            assert (op.tilewidth, op.tilelength) == (sp.tilewidth, sp.tilelength)
            assert op.photometric == sp.photometric, f"level {k}"
            assert op.jpegtables == sp.jpegtables, f"level {k}"
            assert op.predictor == sp.predictor
            if int(sp.compression) == 7:
                assert int(op.compression) == 7 and op.subsampling == sp.subsampling
            elif int(sp.compression) == 33005:  # OpenSlide's Aperio code; 34712 in OME-TIFF
                assert int(op.compression) == (33005 if fmt == "tiff" else 34712)
            else:
                assert op.compression == sp.compression
            src_tiles, out_tiles = raw_tiles(stf, sp), raw_tiles(otf, op)
            assert len(out_tiles) == len(src_tiles)
            assert out_tiles == src_tiles, f"level {k}: tiles differ"
        # the computed levels below halve the smallest source level
        for k in range(len(spages), len(opages)):
            w, h = res.level_dimensions[k - 1]
            assert res.level_dimensions[k] == (-(-w // 2), -(-h // 2))
        w, h = res.level_dimensions[-1]
        assert w <= opages[-1].tilewidth and h <= opages[-1].tilelength
    finally:
        stf.close()
        otf.close()


def _check_same(got: np.ndarray, ref: np.ndarray, reader: str, k: int) -> None:
    got, ref = np.asarray(got)[..., :3], np.asarray(ref)[..., :3]
    assert got.shape == ref.shape, f"{reader} level {k}: {got.shape} != {ref.shape}"
    assert got.any() and got.std() > 0, f"{reader} level {k}: black or constant read"
    np.testing.assert_array_equal(got, ref, err_msg=f"{reader} level {k}")


def test_tifffile_reads_the_same_pixels(copied):
    src, out, *_ = copied
    with tifffile.TiffFile(src) as s, tifffile.TiffFile(out) as o:
        for k, lv in enumerate(s.series[0].levels):
            _check_same(o.series[0].levels[k].asarray(), lv.asarray(), "tifffile", k)


def test_tiffslide_reads_the_same_pixels(copied):
    src, out, _fmt, _res, n_src = copied
    tiffslide = pytest.importorskip("tiffslide")
    with tiffslide.TiffSlide(src) as s, tiffslide.TiffSlide(out) as o:
        for k in range(n_src):
            d = s.level_dimensions[k]
            assert tuple(o.level_dimensions[k]) == tuple(d)
            _check_same(o.read_region((0, 0), k, d, as_array=True),
                        s.read_region((0, 0), k, d, as_array=True), "tiffslide", k)


def test_openslide_reads_the_same_pixels(copied):
    src, out, fmt, res, n_src = copied
    if fmt != "tiff":
        pytest.skip("OpenSlide does not read OME-TIFF (and refuses 34712 tiles)")
    openslide = pytest.importorskip("openslide")
    s, o = openslide.OpenSlide(str(src)), openslide.OpenSlide(str(out))
    try:
        assert o.properties["openslide.vendor"] == "aperio"
        assert [tuple(d) for d in o.level_dimensions] == res.level_dimensions
        for k in range(n_src):
            d = s.level_dimensions[k]
            _check_same(np.asarray(o.read_region((0, 0), k, d)), np.asarray(s.read_region((0, 0), k, d)),
                        "OpenSlide", k)
    finally:
        s.close()
        o.close()


def test_libvips_reads_the_same_pixels(copied):
    src, out, fmt, _res, n_src = copied
    pyvips = pytest.importorskip("pyvips", reason="pyvips (test extra) not installed")
    with tifffile.TiffFile(src) as tf:
        j2k = int(tf.pages[0].compression) in (33003, 33005, 34712)
        src_pages = [lv.keyframe.index for lv in tf.series[0].levels]
    if j2k and not pyvips.type_find("VipsOperation", "jp2kload"):
        pytest.skip("this libvips (pyvips-binary) has no JPEG 2000 codec: it reads J2K tiles as "
                    "black or fails")
    for k in range(n_src):
        ref = pyvips.Image.tiffload(str(src), page=src_pages[k]).numpy()
        if fmt == "tiff":
            got = pyvips.Image.tiffload(str(out), page=0 if k == 0 else k + 1).numpy()
        else:
            got = pyvips.Image.tiffload(str(out), page=0, subifd=k - 1).numpy()
        _check_same(got, ref, "libvips", k)


@pytest.mark.parametrize("name", ["jpeg-rgb", "j2k-33005"])
def test_round_trip_svs_ome_tiff_keeps_the_tiles(tmp_path, name):
    src = SOURCES[name]()
    ome = export_pyramid(src, tmp_path / "a.ome.tif", compression="copy").output
    back = export_pyramid(ome, tmp_path / "b.svs", compression="copy").output
    stf, spages = level_pages(src)
    btf, bpages = level_pages(back)
    try:
        for k, sp in enumerate(spages):
            assert raw_tiles(btf, bpages[k]) == raw_tiles(stf, sp), f"level {k}"
            assert bpages[k].compression == sp.compression
    finally:
        stf.close()
        btf.close()
    with wsitool.open_slide(src) as s, wsitool.open_slide(back) as b:
        for k in range(s.level_count):
            d = s.level_dimensions[k]
            np.testing.assert_array_equal(b.read_region((0, 0), k, d), s.read_region((0, 0), k, d))


def test_aligned_region_copies_the_sub_grid(tmp_path):
    src = SOURCES["jpeg-rgb"]()  # 1536 x 1152, 256 tiles; 768 x 576, 384 x 288
    res = export_pyramid(src, tmp_path / "r.svs", compression="copy", region=(512, 0, 1024, 1152))
    # level 1 is on its grid too (512 / 2 = 256); level 2 is not (128): computed from level 1
    assert res.level_dimensions == [(1024, 1152), (512, 576), (256, 288), (128, 144)]
    assert res.tiles_copied == 4 * 5 + 2 * 3
    stf, spages = level_pages(src)
    otf, opages = level_pages(res.output)
    try:
        s0, o0 = raw_tiles(stf, spages[0]), raw_tiles(otf, opages[0])
        assert o0 == [s0[r * 6 + c] for r in range(5) for c in range(2, 6)]
        s1, o1 = raw_tiles(stf, spages[1]), raw_tiles(otf, opages[1])
        assert o1 == [s1[r * 3 + c] for r in range(3) for c in range(1, 3)]
    finally:
        stf.close()
        otf.close()
    with wsitool.open_slide(src) as s, wsitool.open_slide(res.output) as o:
        np.testing.assert_array_equal(o.read_region((0, 0), 0, (1024, 1152)),
                                      s.read_region((512, 0), 0, (1024, 1152)))


def test_unaligned_region_is_refused_with_one_line(tmp_path):
    src = SOURCES["jpeg-rgb"]()
    with pytest.raises(InvalidRegionError, match="not on the 256x256 tile grid") as info:
        export_pyramid(src, tmp_path / "r.svs", compression="copy", region=(100, 0, 512, 512))
    assert "\n" not in str(info.value)
    res = runner.invoke(app, ["export-pyramid", str(src), str(tmp_path / "r.svs"), "--quiet",
                              "--compression", "copy", "--region", "0", "0", "500", "512"])
    assert res.exit_code == 5, res.output
    assert "tile grid" in res.output and len(res.output.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_copy_is_refused_for_deep_zoom_and_stripped_levels(tmp_path):
    with pytest.raises(ValueError, match="TIFF formats"):
        export_pyramid(SOURCES["jpeg-rgb"](), tmp_path / "x.dzi", format="dzi", compression="copy")
    stripped = shared_sample("stripped-deflate-gray-10000x5000.tif")
    with pytest.raises(wsitool.UnsupportedFormatError, match="stripped"):
        export_pyramid(stripped, tmp_path / "x.svs", compression="copy")
    assert list(tmp_path.iterdir()) == []


def _zeroed(data: bytes) -> bytes:
    return bytes(len(data))


def _j2k_body_ff(data: bytes) -> bytes:
    """Keep the J2K main and tile-part headers (up to SOD), fill the packet data with 0xff:
    the header checks pass, OpenJPEG fails to decode."""
    sod = data.find(b"\xff\x93") + 2
    return data[:sod] + b"\xff" * (len(data) - sod)


def test_corrupt_copied_tile_fails_the_export_leaving_nothing(tmp_path):
    src = with_tile_bytes(SOURCES["jpeg-rgb"](), tmp_path, 7, _zeroed)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(TileDecodeError, match=r"level 0, tile \(col 1, row 1\): not a JPEG stream"):
        export_pyramid(src, out_dir / "o.svs", compression="copy")
    assert list(out_dir.iterdir()) == []
    res = runner.invoke(app, ["export-pyramid", str(src), str(out_dir / "o.ome.tif"), "--quiet",
                              "--compression", "copy"])
    assert res.exit_code == 7, res.output
    assert list(out_dir.iterdir()) == []
    # a header that does not parse (the read path's nvImageCodec header check)
    bad = shared_sample("broken-aperio-unreadable-jpeg.svs")
    with pytest.raises(TileDecodeError, match="unreadable code stream header"):
        export_pyramid(bad, out_dir / "o.ome.tif", compression="copy", format="ome-tiff")
    assert list(out_dir.iterdir()) == []


def test_fill_writes_a_failing_tile_as_missing_and_counts_it(tmp_path):
    src = with_tile_bytes(SOURCES["jpeg-rgb"](), tmp_path, 7, _zeroed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = export_pyramid(src, tmp_path / "o.svs", compression="copy", on_error="fill")
    assert res.tiles_failed == 1
    assert any(issubclass(w.category, TileWarning) for w in caught)
    with tifffile.TiffFile(res.output) as tf:
        counts = tf.pages[0].databytecounts
        assert counts[7] == 0 and all(counts[i] > 0 for i in range(len(counts)) if i != 7)
    with wsitool.open_slide(res.output) as s:
        assert painted_tiles(s) == 1


def test_verify_decodes_every_copied_tile(tmp_path):
    src = with_tile_bytes(SOURCES["j2k-33005"](), tmp_path, 5, _j2k_body_ff)
    # the header and byte-range checks pass: copied as it is
    res = export_pyramid(src, tmp_path / "plain.svs", compression="copy")
    with tifffile.TiffFile(src) as s, tifffile.TiffFile(res.output) as o:
        assert raw_tiles(o, o.pages[0])[5] == raw_tiles(s, s.pages[0])[5]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(TileDecodeError, match=r"level 0, tile \(col 1, row 1\)"):
        export_pyramid(src, out_dir / "v.svs", compression="copy", verify=True)
    assert list(out_dir.iterdir()) == []
    res = runner.invoke(app, ["export-pyramid", str(src), str(out_dir / "v.svs"), "--quiet",
                              "--compression", "copy", "--verify"])
    assert res.exit_code == 7, res.output
    assert list(out_dir.iterdir()) == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TileWarning)
        res = export_pyramid(src, out_dir / "v.svs", compression="copy", verify=True, on_error="fill")
    assert res.tiles_failed == 1
    with tifffile.TiffFile(res.output) as o:
        assert o.pages[0].databytecounts[5] == 0
    # a clean source verifies
    res = export_pyramid(SOURCES["j2k-33005"](), out_dir / "clean.svs", compression="copy", verify=True)
    assert res.tiles_failed == 0
    res = runner.invoke(app, ["export-pyramid", str(SOURCES["jpeg-rgb"]()), str(out_dir / "c.svs"),
                              "--quiet", "--verify"])
    assert res.exit_code == 2 and "--compression copy" in res.output


def test_missing_source_tile_stays_missing(tmp_path):
    src = with_byte_count(SOURCES["jpeg-rgb"](), tmp_path, 3, 0)
    res = export_pyramid(src, tmp_path / "o.ome.tif", compression="copy")
    assert res.tiles_missing == 1 and res.tiles_failed == 0
    with tifffile.TiffFile(res.output) as tf:
        assert tf.pages[0].databytecounts[3] == 0


def test_cli_copy_writes_and_says_so(tmp_path):
    src = SOURCES["jpeg-rgb"]()
    res = runner.invoke(app, ["export-pyramid", str(src), str(tmp_path / "c.ome.tif"), "--quiet",
                              "--compression", "copy"])
    assert res.exit_code == 0, res.output
    assert "(ome-tiff, copy, 4 levels" in res.output


def test_jpeg_sampling_reads_the_frame_header():
    with tifffile.TiffFile(SOURCES["jpeg-rgb"]()) as tf:
        first = raw_tiles(tf, tf.pages[0])[0]
    assert jpeg_sampling(first) == (1, 1)
    import imagecodecs
    tile = np.zeros((16, 16, 3), np.uint8)
    assert jpeg_sampling(imagecodecs.jpeg8_encode(tile, level=80, subsampling="420")) == (2, 2)
    assert jpeg_sampling(b"\xff\xd8\x00") is None
