"""Zeiss CZI (:mod:`wsitool.formats.czi`) against OpenSlide 4.0.1 on the fixtures of
``scripts/make_czi_samples.py`` it reads, and against the reference CZI decoders (pylibCZIrw,
czifile) where OpenSlide refuses: the shared real Bgr24 file and the fluorescence fixture."""

from __future__ import annotations

import json
import pickle
import struct
import subprocess
import sys

import imagecodecs
import numpy as np
import pytest
import tifffile

import wsitool
from wsitool.codec.czi import CZI_CODECS, jpegxr_problem, jpegxr_size, payload, unpack_hilo
from wsitool.errors import CorruptFileError, InvalidOptionError, TileDecodeError, TileWarning
from wsitool.formats import czi
from wsitool.opening import parse_location
from wsitool.opening.location import location_from_wire

from helpers import assert_reads_equal_openslide, script_module, shared_sample

openslide = pytest.importorskip("openslide")
wo = pytest.importorskip("wsitool.openslide")

PYRAMID = "czi-2scene-pyramid.czi"
FLUOR = "czi-fluorescence-3ch.czi"
REAL = "czi-zeiss-rgb-bgr24-924x624.czi"


@pytest.fixture
def pair(made_czi):
    path = made_czi[PYRAMID]
    o, w = openslide.OpenSlide(str(path)), wo.OpenSlide(str(path))
    yield o, w
    o.close()
    w.close()


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wsitool", *args], capture_output=True, text=True, timeout=120)


# ------------------------------------------------------------------ the generator (OpenSlide the oracle)


def test_openslide_reads_the_brightfield_fixture_as_zeiss(made_czi):
    gen = script_module("make_czi_samples")
    for name in gen.BRIGHTFIELD:
        with openslide.OpenSlide(str(made_czi[name])) as o:
            assert o.properties["openslide.vendor"] == "zeiss"
            assert o.level_count == 3 and o.level_downsamples == (1.0, 2.0, 4.0)  # (scene 1's 8: left out)
            for level, (width, height) in enumerate(o.level_dimensions):
                region = np.asarray(o.read_region((0, 0), level, (width, height)))
                assert region.shape == (height, width, 4) and region[..., 3].any()
                assert region[..., :3][region[..., 3] > 0].std() > 0
            assert sorted(o.associated_images) == ["label", "macro", "thumbnail"]
            assert o.properties["openslide.region[1].x"] == "800"


def test_openslide_refuses_the_fluorescence_fixture_and_the_real_file(made_czi):
    with pytest.raises(openslide.OpenSlideError, match="Nonzero subblock channel 1"):
        openslide.OpenSlide(str(made_czi[FLUOR]))
    with pytest.raises(openslide.OpenSlideError, match="Unrecognized subblock dimension"):
        openslide.OpenSlide(str(shared_sample(REAL)))


# ------------------------------------------------------------------ OpenSlide parity


def test_geometry_properties_and_quickhash_equal_openslide(pair):
    o, w = pair
    assert w.properties["openslide.vendor"] == "zeiss"
    assert w.level_dimensions == o.level_dimensions
    assert w.level_downsamples == o.level_downsamples
    for key in ("openslide.mpp-x", "openslide.mpp-y", "openslide.objective-power"):
        assert float(w.properties[key]) == float(o.properties[key]), key
    for key in ("openslide.quickhash-1", "openslide.barcode", "openslide.mpp-x", "openslide.objective-power"):
        assert w.properties[key] == o.properties[key], key
    for prefix in ("zeiss.", "openslide.region[", "openslide.associated."):
        ours = {k: v for k, v in w.properties.items() if k.startswith(prefix)}
        theirs = {k: v for k, v in o.properties.items() if k.startswith(prefix)}
        assert ours == theirs and theirs, prefix
    # the list rules: Id, else Name; siblings of one name left out; attributes as a component
    assert o.properties["zeiss.Scaling.Items.X.Value"] == "4.99e-07"
    assert o.properties["zeiss.Information.Instrument.Objectives.Objective:1.Name"].startswith("Plan-Apo")
    assert "zeiss.Information.Image.Dimensions.S.Scenes.Scene.Shape" not in w.properties


def test_read_region_and_associated_images_equal_openslide(pair):
    o, w = pair
    assert_reads_equal_openslide(o, w, seed=51, regions=16)


def test_overlapping_tiles_lower_mosaic_index_in_front(made_czi):
    """Scene 0's camera tiles overlap by 32 pixels, each cut a few pixels off its neighbours: the
    overlap shows tile M=0 (OpenSlide's order), not M=1 (libCZI's)."""
    base = tifffile.imread(shared_sample("aperio-cmu1-small-region-jpeg.svs"))
    with wsitool.open_slide(made_czi[PYRAMID]) as slide:
        got = slide.read_region((230, 10), 0, (10, 10), mode="rgb")
    front = base[60 + 10:60 + 20, 40 + 230:40 + 240]  # tile (0, 0): no offset
    behind = base[61 + 10:61 + 20, 40 + 224 + 3 + 6:40 + 224 + 3 + 16]  # tile (1, 0): 3, 1 off
    assert np.array_equal(got, front) and not np.array_equal(got, behind)


# ------------------------------------------------------------------ scenes


@pytest.mark.parametrize("scene, levels", [(0, [(704, 480), (352, 240), (176, 120)]),
                                           (1, [(480, 480), (240, 240), (120, 120), (60, 60)])])
def test_a_scene_alone_is_its_region_of_the_whole_slide(made_czi, scene, levels):
    path = made_czi[PYRAMID]
    with wsitool.open_slide(path, scene=scene) as one, openslide.OpenSlide(str(path)) as o:
        assert [lv.dimensions for lv in one.levels] == levels  # every downsample the scene has
        assert one.properties["wsitool.czi.scene"] == str(scene)
        x = int(o.properties[f"openslide.region[{scene}].x"])
        y = int(o.properties[f"openslide.region[{scene}].y"])
        for level in range(3):
            ds = int(o.level_downsamples[level])
            w, h = levels[level]
            theirs = np.asarray(o.read_region((x, y), level, (w, h)))
            assert np.array_equal(one.read_region((0, 0), level, (w, h)), theirs), level
        assert one.properties["openslide.quickhash-1"] == o.properties["openslide.quickhash-1"]
        assert ds == 4


def test_scene_option_checked_and_carried_by_the_location(made_czi):
    path = made_czi[PYRAMID]
    with pytest.raises(InvalidOptionError, match=r"scene 2 is not in this slide \(its scenes: 0, 1\)"):
        wsitool.open_slide(path, scene=2)
    with pytest.raises(InvalidOptionError, match="scene must be a scene number"):
        wsitool.open_slide(path, scene=-1)
    with pytest.raises(InvalidOptionError, match="the TIFF format takes no option 'scene'"):
        wsitool.open_slide(shared_sample("aperio-cmu1-small-region-jpeg.svs"), scene=0)
    with wsitool.open_slide(path, scene=1) as slide:
        loc = slide.location
    wired = location_from_wire(json.loads(json.dumps(loc.wire())))
    for again in (pickle.loads(pickle.dumps(loc)), loc.resolved(), wired):
        with wsitool.open_slide(again) as reopened:
            assert reopened.dimensions == (480, 480)
    with wsitool.open_slide(parse_location(str(path))) as whole:
        assert whole.dimensions == (1280, 544) and whole.properties["wsitool.czi.scenes"] == "0,1"


# ------------------------------------------------------------------ the reference decoders


def test_real_file_equals_pylibczirw_and_czifile():
    pylibczirw = pytest.importorskip("pylibCZIrw.czi")
    czifile = pytest.importorskip("czifile")
    path = shared_sample(REAL)
    with wsitool.open_slide(path) as slide:
        assert slide.vendor == "zeiss" and slide.dimensions == (924, 624) and slide.level_count == 1
        assert slide.mpp == pytest.approx((1.0833333333333333, 1.0833333333333333))
        ours = slide.read_region((0, 0), 0, (924, 624), mode="rgb")
        assert list(slide.associated_images) == ["thumbnail"]
        assert slide.associated_images["thumbnail"].shape == (173, 256, 3)
    with pylibczirw.open_czi(str(path)) as ref:
        bgr = ref.read()
    assert np.array_equal(ours, bgr[:, :, ::-1])  # (pylibCZIrw gives Bgr24 as stored: BGR)
    assert np.array_equal(ours, czifile.imread(str(path))[0])  # (czifile: in RGB order)


def test_fluorescence_channels_equal_pylibczirw(made_czi):
    pylibczirw = pytest.importorskip("pylibCZIrw.czi")
    czifile = pytest.importorskip("czifile")
    gen = script_module("make_czi_samples")
    path = made_czi[FLUOR]
    with wsitool.open_slide(path) as slide:
        assert [(c.name, c.color, c.color_source, c.excitation_nm, c.emission_nm) for c in slide.channels] == [
            (n, tuple(int(col[k:k + 2], 16) for k in (3, 5, 7)), "file", ex, em) for n, col, ex, em in gen.CHANNELS]
        assert [lv.dimensions for lv in slide.levels] == [(512, 512), (256, 256)]
        raw = slide.read_region((0, 0), 0, (512, 512), mode="raw")
        assert raw.dtype == np.uint16 and raw.shape == (512, 512, 3)
        small = slide.read_region((0, 0), 1, (256, 256), mode="raw")
        rgb = slide.read_region((0, 0), 0, (512, 512), mode="rgb")
        assert rgb.shape == (512, 512, 3) and rgb.std() > 0
    with pylibczirw.open_czi(str(path)) as ref:
        for c in range(3):
            assert np.array_equal(raw[:, :, c], ref.read(plane={"C": c})[:, :, 0]), c
    with czifile.CziFile(str(path)) as ref:
        stored = {e.start[e.axes.index("C")]: e.data_segment().data(resize=False) for e in ref.subblock_directory
                  if e.pyramid_type}
    for c in range(3):
        assert np.array_equal(small[:, :, c], stored[c].reshape(256, 256)), c


# ------------------------------------------------------------------ CLI, broken files


def test_cli_info_lists_scenes_and_read_region_reads_one(made_czi, tmp_path):
    path = made_czi[PYRAMID]
    proc = _run("info", "--json", str(path))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["vendor"] == "zeiss" and data["scene"] is None
    assert data["scenes"] == [{"scene": 0, "x": 0, "y": 0, "width": 704, "height": 480},
                              {"scene": 1, "x": 800, "y": 64, "width": 480, "height": 480}]
    text = _run("info", "--scene", "1", str(path))
    assert text.returncode == 0 and "reading scene 1" in text.stdout
    out = tmp_path / "r.png"
    proc = _run("read-region", str(path), "--scene", "1", "--location", "16", "32", "--size", "64", "48",
                "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    with wsitool.open_slide(path, scene=1) as slide:
        want = slide.read_region((16, 32), 0, (64, 48))
    assert np.array_equal(np.asarray(imagecodecs.imread(out)), want)
    bad = _run("info", "--scene", "3", str(path))
    assert bad.returncode == 2 and "scene 3 is not in this slide" in bad.stderr


def test_truncated_files_exit_4_with_one_line(made_czi, tmp_path):
    data = made_czi[PYRAMID].read_bytes()
    for cut in (20, 600, len(data) // 2, len(data) - 4000):
        bad = tmp_path / f"cut{cut}.czi"
        bad.write_bytes(data[:cut])
        proc = _run("info", str(bad))
        assert proc.returncode == 4, (cut, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and str(bad) in lines[0] and "Traceback" not in proc.stderr


def _patched(src, tmp_path, offset: int, value: bytes):
    data = bytearray(src.read_bytes())
    data[offset:offset + len(value)] = value
    out = tmp_path / "patched.czi"
    out.write_bytes(bytes(data))
    return out


def test_counts_and_sizes_from_the_file_are_checked_before_use(made_czi, tmp_path):
    src = made_czi[PYRAMID]
    head = src.read_bytes()[:544]
    dir_pos, meta_pos = struct.unpack_from("<qq", head, 32 + 16 + 32 + 4)
    bad = _patched(src, tmp_path, dir_pos + 32, struct.pack("<i", 2**31 - 1))  # entries
    with pytest.raises(CorruptFileError, match="lists 2147483647 entries"):
        wsitool.open_slide(bad)
    bad = _patched(src, tmp_path, meta_pos + 32, struct.pack("<i", 2**31 - 1))  # XML size
    with pytest.raises(CorruptFileError, match="metadata XML of 2147483647 bytes"):
        wsitool.open_slide(bad)
    bad = _patched(src, tmp_path, dir_pos + 16, struct.pack("<qq", 2**62, 2**62))  # segment sizes
    with pytest.raises(CorruptFileError, match="past the end of the file"):
        wsitool.open_slide(bad)
    entry = dir_pos + 32 + 128  # the first directory entry: its file position (found by scripts/fuzz.py)
    bad = _patched(src, tmp_path, entry + 6, struct.pack("<q", -(2**62)))
    with pytest.raises(CorruptFileError, match=r"subblock 0 at offset -\d+, outside the file"):
        wsitool.open_slide(bad)


def test_a_broken_subblock_is_a_tile_error_naming_the_file(made_czi, tmp_path):
    src = made_czi[PYRAMID]
    with wsitool.open_slide(src) as slide:
        first = slide._levels[0].mosaic.image_offset.min()
    bad = _patched(src, tmp_path, int(first), b"ZISRAWNOTHING\0\0\0")
    with wsitool.open_slide(bad) as slide:
        with pytest.raises(TileDecodeError, match="not a ZISRAWSUBBLOCK segment") as info:
            slide.read_region((0, 0), 0, (1280, 544))
        assert str(bad) in str(info.value)
        with pytest.warns(TileWarning, match="not a ZISRAWSUBBLOCK segment"):
            filled = slide.read_region((0, 0), 0, (1280, 544), on_error="fill")
        assert filled[..., 3].any()


# ------------------------------------------------------------------ the subblock decoders


def _segment(data: bytes) -> bytes:
    """A subblock segment of ``data`` (no metadata, one dimension entry)."""
    head = struct.pack("<iiq", 0, 0, len(data)) + struct.pack("<2siqiiBB4si", b"DV", 0, 0, 0, 0, 0, 0, b"", 1)
    head += struct.pack("<4siifi", b"X", 0, 1, 0.0, 1)
    head += b"\0" * (256 - len(head))
    return struct.pack("<16sqq", b"ZISRAWSUBBLOCK", 256 + len(data), 256 + len(data)) + head + data


def test_zstd1_hilo_header_variants_and_bgr_order():
    grey = (np.arange(48, dtype=np.uint16) * 1031).reshape(6, 8, 1)
    raw = grey.tobytes()
    packed = raw[0::2] + raw[1::2]
    z = bytes(imagecodecs.zstd_encode(packed))
    decode = CZI_CODECS["czi-zstd1"]
    assert np.array_equal(decode(_segment(bytes([3, 1, 1]) + z), 8, 6, 1, np.dtype("u2")), grey)
    plain = bytes(imagecodecs.zstd_encode(raw))
    assert np.array_equal(decode(_segment(bytes([1]) + plain), 8, 6, 1, np.dtype("u2")), grey)
    assert np.array_equal(CZI_CODECS["czi-zstd0"](_segment(plain), 8, 6, 1, np.dtype("u2")), grey)
    assert unpack_hilo(packed) == raw
    with pytest.raises(ValueError, match="chunk type 2"):
        decode(_segment(bytes([3, 2, 1]) + z), 8, 6, 1, np.dtype("u2"))
    with pytest.raises(ValueError, match="zstd1 header of length 2"):
        decode(_segment(bytes([2, 1]) + z), 8, 6, 1, np.dtype("u2"))
    with pytest.raises(ValueError, match="too small"):  # a frame of more than the subblock: never unpacked
        CZI_CODECS["czi-zstd0"](_segment(plain), 4, 6, 1, np.dtype("u2"))
    bgra = np.arange(4 * 5 * 4, dtype=np.uint8).reshape(4, 5, 4)
    rgb = CZI_CODECS["czi-raw-bgra"](_segment(bgra.tobytes()), 5, 4, 3, np.dtype("u1"))
    assert np.array_equal(rgb, bgra[:, :, 2::-1])
    with pytest.raises(ValueError, match="not a ZISRAWSUBBLOCK"):
        payload(b"ZISRAWFILE" + b"\0" * 400)


def test_jpegxr_and_jpeg_subblocks_decode_through_imagecodecs():
    rgb = np.random.default_rng(3).integers(0, 255, (32, 48, 3), dtype=np.uint8)
    jxr = bytes(imagecodecs.jpegxr_encode(rgb, level=1.0))
    assert np.array_equal(CZI_CODECS["czi-jpegxr"](_segment(jxr), 48, 32, 3, np.dtype("u1")), rgb)
    assert jpegxr_size(jxr) == (48, 32)
    with pytest.raises(ValueError, match=r"jpegxr stream declares \(48, 32\)"):  # checked before decoding
        CZI_CODECS["czi-jpegxr"](_segment(jxr), 4800, 3200, 3, np.dtype("u1"))
    jpeg = bytes(imagecodecs.jpeg8_encode(rgb, level=95))
    out = CZI_CODECS["czi-jpeg"](_segment(jpeg), 48, 32, 3, np.dtype("u1"))
    assert np.array_equal(out, imagecodecs.jpeg8_decode(jpeg))
    with pytest.raises(ValueError, match="jpeg stream declares"):  # checked before decoding
        CZI_CODECS["czi-jpeg"](_segment(jpeg), 4800, 3200, 3, np.dtype("u1"))


def test_sniff():
    assert czi.sniff(b"ZISRAWFILE\0\0") and not czi.sniff(b"II*\0")


def test_a_huge_declared_size_is_refused_before_any_table_is_made(made_czi, tmp_path):
    """The XML's SizeX x SizeY sets the level's virtual tile grid: 1.28e9 x 5.44e5 pixels would be
    2.7e9 tile entries; refused at open."""
    src = made_czi[PYRAMID]
    old, new = b"<SizeX>1280</SizeX>\n        <SizeY>544</SizeY>", b"<SizeX>1280000000</SizeX><SizeY>544000</SizeY>"
    assert len(old) == len(new)  # (the XML keeps its length)
    data = src.read_bytes().replace(old, new)
    bad = tmp_path / "huge.czi"
    bad.write_bytes(data)
    with pytest.raises(wsitool.UnsupportedFormatError, match="more than wsitool reads"):
        wsitool.open_slide(bad)


def test_colour_channels_among_several_read_as_three_samples_each(tmp_path):
    """Brightfield beside polarised light (two Bgr24 channels, written by pylibCZIrw): each is its
    red, green and blue; the first three composed are its RGB image."""
    pylibczirw = pytest.importorskip("pylibCZIrw.czi")
    base = tifffile.imread(shared_sample("aperio-cmu1-small-region-jpeg.svs"))
    plain, polarised = base[100:420, 200:600], 255 - base[500:820, 700:1100]
    path = tmp_path / "pol.czi"
    with pylibczirw.create_czi(str(path)) as out:
        out.write(np.ascontiguousarray(plain[:, :, ::-1]), plane={"C": 0})
        out.write(np.ascontiguousarray(polarised[:, :, ::-1]), plane={"C": 1})
    with wsitool.open_slide(path) as slide:
        assert [c.name for c in slide.channels] == [f"C{k} {p}" for k in (0, 1) for p in ("red", "green", "blue")]
        raw = slide.read_region((0, 0), 0, (400, 320), mode="raw")
        assert np.array_equal(raw[:, :, :3], plain) and np.array_equal(raw[:, :, 3:], polarised)
        assert np.array_equal(slide.read_region((0, 0), 0, (400, 320), mode="rgb", channels=[0, 1, 2]), plain)
    with pylibczirw.open_czi(str(path)) as ref:
        assert np.array_equal(ref.read(plane={"C": 1})[:, :, ::-1], raw[:, :, 3:])


def test_jpegxr_fixture_equals_pylibczirw(made_czi):
    """JPEG XR subblocks (24bppBGR, as ZEN writes them): OpenSlide 4.0.1 refuses them; wsitool's
    pixels equal libCZI's (pylibCZIrw, in BGR order) and the stored pyramid subblock."""
    pylibczirw = pytest.importorskip("pylibCZIrw.czi")
    path = made_czi["czi-jpegxr.czi"]
    with pytest.raises(openslide.OpenSlideError, match="JPEG XR compression is not supported"):
        openslide.OpenSlide(str(path))
    base = tifffile.imread(shared_sample("aperio-cmu1-small-region-jpeg.svs"))[900:1412, 300:812]
    with wsitool.open_slide(path) as slide:
        assert [lv.dimensions for lv in slide.levels] == [(512, 512), (256, 256)]
        ours = slide.read_region((0, 0), 0, (512, 512), mode="rgb")
        small = slide.read_region((0, 0), 1, (256, 256), mode="rgb")
    with pylibczirw.open_czi(str(path)) as ref:
        assert np.array_equal(ours, ref.read()[:, :, ::-1])
    assert np.array_equal(ours, base)  # (lossless)
    assert np.array_equal(small, script_module("make_czi_samples")._reduce(base, 2))



def test_bgr48_reads_as_16_bit_rgb(tmp_path):
    """``Bgr48`` (written by pylibCZIrw): ``raw`` is the 16-bit samples in RGB order; ``rgb`` is
    wsitool's 16- to 8-bit scaling, within 1 of the high byte OpenSlide takes."""
    pylibczirw = pytest.importorskip("pylibCZIrw.czi")
    samples = np.random.default_rng(1).integers(0, 65535, (100, 120, 3), dtype=np.uint16)
    path = tmp_path / "bgr48.czi"
    with pylibczirw.create_czi(str(path)) as out:
        out.write(samples, plane={"C": 0})
    with wsitool.open_slide(path) as slide:
        assert slide.levels[0].samples == 3 and slide.levels[0].dtype == np.uint16 and not slide.channels
        assert np.array_equal(slide.read_region((0, 0), 0, (120, 100), mode="raw"), samples[:, :, ::-1])
        rgb = slide.read_region((0, 0), 0, (120, 100), mode="rgb")
    assert np.abs(rgb.astype(int) - (samples[:, :, ::-1] >> 8)).max() <= 1


@pytest.mark.parametrize("tiles, mosaic", [
    ([(0, 0, 10), (64, 0, 20), (0, 64, 30), (64, 64, 40)], False),
    ([(64, 64, 40), (0, 64, 30), (64, 0, 20), (0, 0, 10)], False),
    ([(64, 0, 20), (0, 0, 10)], False),
    ([(0, 0, 10), (64, 0, 20)], True),
    ([(64, 0, 20), (0, 0, 10)], True),
])
def test_paint_order_of_overlapping_subblocks_is_openslides(tmp_path, tiles, mosaic):
    """Flat 128² tiles overlapping at (100, 100): the lower M in front; without M (a tie) the one
    further down, then further right, as OpenSlide 4.0.1 paints them, whatever the file order."""
    gen = script_module("make_czi_samples")
    subs = [gen.Sub(x, y, np.full((128, 128, 3), v, np.uint8), gen.BGR24, gen.NONE,
                    dims={"C": 0, "S": 0, **({"M": k} if mosaic else {})}) for k, (x, y, v) in enumerate(tiles)]
    thumb = bytes(imagecodecs.jpeg8_encode(np.zeros((8, 8, 3), np.uint8)))
    path = tmp_path / "order.czi"
    path.write_bytes(gen.zisraw(subs, gen._xml((192, 192), 1, "Bgr24"), [("Thumbnail", "JPG", thumb)]))
    with openslide.OpenSlide(str(path)) as o, wsitool.open_slide(path) as w:
        theirs = np.asarray(o.read_region((0, 0), 0, (192, 192)))
        assert np.array_equal(w.read_region((0, 0), 0, (192, 192)), theirs)


def test_cli_export_pyramid_of_one_scene(made_czi, tmp_path):
    path = made_czi[PYRAMID]
    out = tmp_path / "scene1.tiff"
    proc = _run("export-pyramid", str(path), str(out), "--scene", "1", "--compression", "deflate", "--quiet")
    assert proc.returncode == 0, proc.stderr
    with wsitool.open_slide(path, scene=1) as one, wsitool.open_slide(out) as exported:
        assert exported.dimensions == one.dimensions == (480, 480)
        want = one.read_region((0, 0), 0, (480, 480), mode="rgb")
        assert np.array_equal(exported.read_region((0, 0), 0, (480, 480), mode="rgb"), want)
    many = _run("export-pyramid", str(path), str(path), str(tmp_path), "--scene", "1")
    assert many.returncode == 2 and "--scene applies to one slide" in many.stderr


def test_a_subblock_read_ends_at_the_next_segment(made_czi):
    """Each subblock's bytes are read from its segment up to the next segment the file lists (the
    directory and metadata after the last subblock, a subblock of a level left out, included):
    exactly its segment (header and allocated size) in the generated files."""
    path = made_czi[PYRAMID]
    data = path.read_bytes()
    with wsitool.open_slide(path) as slide:
        for lv in slide._levels:
            m = lv.mosaic
            for offset, length in zip(m.image_offset.tolist(), m.image_length.tolist(), strict=True):
                allocated = struct.unpack_from("<q", data, offset + 16)[0]
                assert length == 32 + allocated, (lv.index, offset)


def test_cli_stress_of_one_scene_reads_that_scene(made_czi, tmp_path):
    """``stress --scene 1``: the scene travels to the run's readers (its 4 levels, not the 3 of the
    whole slide)."""
    report = tmp_path / "stress.json"
    proc = _run("stress", str(made_czi[PYRAMID]), "--scene", "1", "--iterations", "300", "--workers", "2",
                "--report", str(report))
    assert proc.returncode in (0, 15), proc.stderr  # (15: too short for a memory verdict)
    data = json.loads(report.read_text())
    assert [lv["width"] for lv in data["slide"]["levels"]] == [480, 240, 120, 60]
    assert data["verification"]["mismatches"] == 0 and data["errors"]["count"] == 0


@pytest.mark.parametrize("cs", [(0, 5), (-1, 0)])
def test_channel_numbers_with_gaps_or_below_zero(tmp_path, cs):
    """Found by scripts/fuzz.py (a mutated C start): channels are the C values the subblocks have,
    not 0 .. count - 1 (a colour channel numbered past the count made 6 planes for 4 channels)."""
    gen = script_module("make_czi_samples")
    tiles = [np.full((32, 48, 3), v, np.uint8) for v in (40, 200)]
    subs = [gen.Sub(0, 0, t, gen.BGR24, gen.NONE, dims={"C": c, "S": 0, "M": 0})
            for t, c in zip(tiles, cs, strict=True)]
    path = tmp_path / "gaps.czi"
    path.write_bytes(gen.zisraw(subs, gen._xml((48, 32), 1, "Bgr24")))
    with wsitool.open_slide(path) as slide:
        assert [c.name for c in slide.channels] == [f"C{c} {p}" for c in cs for p in ("red", "green", "blue")]
        raw = slide.read_region((0, 0), 0, (48, 32), mode="raw")
        assert raw[0, 0].tolist() == [40, 40, 40, 200, 200, 200]


def test_a_jpegxr_header_jxrlib_crashes_on_is_refused_before_it(tmp_path):
    """Found by scripts/fuzz.py: a JPEG XR image header declaring output format 13, bit depth 14
    kills the process in jxrlib (SIGFPE), a tiling flag over an untiled stream too (SIGSEGV).
    Checked in a child process, so a regression fails this test instead of killing the run."""
    rgb = np.random.default_rng(5).integers(0, 255, (32, 48, 3), dtype=np.uint8)
    jxr = bytearray(imagecodecs.jpegxr_encode(rgb, level=1.0))
    at = jxr.index(b"WMPHOTO\0")
    jxr[at + 11] = 0xDE  # OUTPUT_CLR_FMT 13, OUTPUT_BITDEPTH 14: undefined
    tiled = bytearray(imagecodecs.jpegxr_encode(rgb, level=1.0))
    tiled[at + 9] = 0x84  # TILING_FLAG and INDEX_TABLE_PRESENT_FLAG over an untiled stream: SIGSEGV
    (tmp_path / "seg.bin").write_bytes(_segment(bytes(jxr)))
    (tmp_path / "tiled.bin").write_bytes(_segment(bytes(tiled)))
    code = ("import sys, numpy as np\nfrom wsitool.codec.czi import CZI_CODECS\n"
            "try:\n    CZI_CODECS['czi-jpegxr'](open(sys.argv[1], 'rb').read(), 48, 32, 3, np.dtype('u1'))\n"
            "except ValueError as exc:\n    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "seg.bin")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert "output colour format 13, bit depth 14" in proc.stdout
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "tiled.bin")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "tiled JPEG XR codestreams are not supported" in proc.stdout, proc.stderr[-500:]
    bad_guid = bytes(imagecodecs.jpegxr_encode(np.zeros((32, 48, 4), np.uint8)))  # 32bppRGBA: not Zeiss's
    assert "pixel format" in jpegxr_problem(bad_guid, 48, 32)
    good = bytes(imagecodecs.jpegxr_encode(rgb, level=1.0))
    assert jpegxr_problem(good, 48, 32) is None and "the subblock is 48x31" in jpegxr_problem(good, 48, 31)
