"""Leica SCN (:mod:`wsitool.formats.tiff.leica`) on the fixtures of ``scripts/make_vendor_samples.py``,
against OpenSlide 4.0.1 (the oracle) for the brightfield ones and Bio-Formats for the fluorescence one,
which OpenSlide does not read."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tifffile

import wsitool
from wsitool.errors import CorruptFileError, UnsupportedFormatError
from wsitool.formats.tiff import leica

from helpers import assert_reads_equal_openslide, script_module, vendor_pair_fixture

openslide = pytest.importorskip("openslide")
wo = pytest.importorskip("wsitool.openslide")

BRIGHTFIELD = ("leica_brightfield", "leica_two_main")
#: main images off the stored tile grid (read as mosaic levels, :mod:`wsitool.formats.tiff.leica_mosaic`)
OFFGRID = ("leica_offgrid", "leica_overlap")


pair = vendor_pair_fixture(BRIGHTFIELD + OFFGRID)


@pytest.mark.parametrize("name", BRIGHTFIELD)
def test_openslide_reads_every_brightfield_fixture_as_leica(made, name):
    with openslide.OpenSlide(str(made[name])) as o:
        assert o.properties["openslide.vendor"] == "leica"
        assert o.level_dimensions == ((2048, 2560), (1024, 1280), (512, 640))
        assert o.level_downsamples == (1.0, 2.0, 4.0)
        for level, (width, height) in enumerate(o.level_dimensions):
            region = np.asarray(o.read_region((0, 0), level, (width, height)))
            inside = region[..., 3] > 0
            # the main images are painted, the rest of the collection is transparent
            assert inside.any() and not inside.all() and region[inside][:, :3].std() > 0
        assert list(o.associated_images) == ["macro"]
        assert np.asarray(o.associated_images["macro"])[..., :3].std() > 0


@pytest.mark.parametrize("name", OFFGRID)
def test_openslide_reads_every_offgrid_fixture_as_leica(made, name):
    """As SCN400 writes them: abbreviated YCbCr JPEG tiles with shared JPEGTables, main images at
    offsets that are no tile boundary, of sizes that are not whole tiles."""
    with tifffile.TiffFile(made[name]) as tif:
        main = tif.pages[2]
        assert main.jpegtables is not None and main.photometric == tifffile.PHOTOMETRIC.YCBCR
        assert (main.imagewidth, main.imagelength) == (1000, 1300) and main.tilewidth == 128
    with openslide.OpenSlide(str(made[name])) as o:
        assert o.properties["openslide.vendor"] == "leica"
        assert (o.properties["openslide.region[0].x"], o.properties["openslide.region[0].y"]) == ("300", "437")
        for level, (width, height) in enumerate(o.level_dimensions):
            region = np.asarray(o.read_region((0, 0), level, (width, height)))
            inside = region[..., 3] > 0
            assert inside.any() and not inside.all() and region[inside][:, :3].std() > 0
        assert list(o.associated_images) == ["macro"]


def test_offgrid_levels_are_mosaics_and_ongrid_levels_tile_grids(made):
    """Off the stored grid every level is a mosaic of the stored tiles, keeping the areas the
    drop-in paints; on the grid the levels stay the stored JPEG tile grid (the faster path)."""
    with wsitool.open_slide(made["leica_overlap"]) as slide:
        assert [lv.compression for lv in slide.levels] == ["MOSAIC"] * 3
        assert slide.levels[0].areas == ((300, 437, 1000, 1300), (901, 1501, 803, 601))
        assert slide.levels[1].areas[0] == (150, 218, 500, 650)  # 218.5 truncated, as OpenSlide
    with wsitool.open_slide(made["leica_brightfield"]) as slide:
        assert [lv.compression for lv in slide.levels] == ["JPEG"] * 3


def test_the_first_main_image_stays_in_front_where_they_overlap(made):
    """OpenSlide paints with cairo's SATURATE operator: the first main image's pixels stay."""
    base = tifffile.imread(script_module("make_vendor_samples").SOURCE, key=0)
    with openslide.OpenSlide(str(made["leica_overlap"])) as o, wo.OpenSlide(str(made["leica_overlap"])) as w:
        a = np.asarray(o.read_region((901, 1501), 0, (399, 236)))  # inside both
        b = np.asarray(w.read_region((901, 1501), 0, (399, 236)))
    assert np.array_equal(a, b)
    first = base[100 + 1501 - 437:100 + 1501 - 437 + 236, 200 + 901 - 300:200 + 901 - 300 + 399].astype(int)
    second = base[1500:1736, 1000:1399].astype(int)
    ours = b[..., :3].astype(int)
    assert np.abs(ours - first).mean() < 8 < np.abs(ours - second).mean()  # (JPEG: close, not equal)


def test_no_icc_profile_as_in_openslide(tmp_path, monkeypatch):
    """OpenSlide's Leica reader reports no ICC profile, for the slide or its macro, even where
    the IFDs carry one."""
    from PIL import ImageCms

    gen = script_module("make_vendor_samples")
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    monkeypatch.setattr(gen, "_JPEG", {**gen._JPEG, "extratags": [(34675, 7, len(icc), icc, True)]})
    path = gen.leica_brightfield(tmp_path, gen.SOURCE)
    assert tifffile.TiffFile(path).pages[2].tags[34675].value == icc
    with openslide.OpenSlide(str(path)) as o, wo.OpenSlide(str(path)) as w:
        assert o.color_profile is None and w.color_profile is None
        assert not [k for k in w.properties if "icc" in k] and not [k for k in o.properties if "icc" in k]
        assert dict(w.properties) == dict(o.properties)


def test_openslide_refuses_the_fluorescence_fixture(made):
    with pytest.raises(openslide.OpenSlideError, match="main image"):
        openslide.OpenSlide(str(made["leica_fluorescence"]))


def test_geometry_metadata_and_associated_equal_openslide(pair):
    name, o, w = pair
    assert w.level_dimensions == o.level_dimensions
    assert w.level_downsamples == o.level_downsamples
    assert dict(w.properties) == dict(o.properties)  # every key: leica.*, bounds, regions, MPP, quickhash
    props = o.properties
    assert props["openslide.mpp-x"] == "0.5" and props["openslide.objective-power"] == "20"
    assert "tiff.ImageDescription" not in props and "openslide.comment" not in props
    if name == "leica_brightfield":
        assert props["leica.barcode"] == "LEICA-TEST-1"  # the base64 element, decoded
        assert (props["openslide.bounds-x"], props["openslide.bounds-height"]) == ("512", "1536")
    elif name == "leica_two_main":  # the 2010/03/10 attribute, as it is; bounds: the union of both main images
        assert props["leica.barcode"] == "LEICA-TEST-2"
        assert props["openslide.region[1].y"] == "2048" and props["openslide.bounds-height"] == "2048"


def test_read_region_and_associated_images_equal_openslide(pair):
    _, o, w = pair
    assert_reads_equal_openslide(o, w, regions=20)


def test_drop_in_paints_each_main_image_at_openslides_whole_pixel_at_any_location(pair):
    """OpenSlide's Leica reader never blends: a main image is painted at ``trunc(x / ds - offset)``,
    so a region starting before it (fractional level position) sees it one pixel later."""
    _, o, w = pair
    rng = np.random.default_rng(51)
    width, height = o.dimensions
    for level in range(o.level_count):
        boxes = [((1021, 1023), (300, 200)), ((2045, 2047), (80, 60))]  # before the image, fractional
        boxes += [((int(rng.integers(-300, width)), int(rng.integers(-300, height))),
                   (int(rng.integers(1, 300)), int(rng.integers(1, 300)))) for _ in range(25)]
        for location, size in boxes:
            a = np.asarray(o.read_region(location, level, size))
            b = np.asarray(w.read_region(location, level, size))
            assert np.array_equal(a, b), (level, location, size)


def test_quickhash_follows_openslides_choice_of_ifd(made):
    """One main image and one macro: the main image's smallest dimension (legacy); two main
    images: the macro's smallest dimension."""
    one = leica.parse(tifffile.TiffFile(made["leica_brightfield"]).pages[0].description)
    two = leica.parse(tifffile.TiffFile(made["leica_two_main"]).pages[0].description)
    assert leica.hashed_ifds(one) == (4, 2)
    assert leica.hashed_ifds(two) == (1, 2)


def test_fluorescence_channels_read_through_the_channel_api(made):
    with wsitool.open_slide(made["leica_fluorescence"]) as slide:
        assert slide.vendor == "leica"
        assert [lv.dimensions for lv in slide.levels] == [(768, 1024), (384, 512)]
        assert [c.name for c in slide.levels[0].channels] == ["C0", "C1", "C2"]
        assert slide.mpp == (0.5, 0.5) and "openslide.quickhash-1" not in slide.properties
        assert slide.properties["leica.illumination-source"] == "fluorescence"
        assert list(slide.associated_images) == ["macro"]
        raw = slide.read_region((0, 0), 0, (768, 1024), mode="raw")
    src = tifffile.imread(script_module("make_vendor_samples").SOURCE, key=0)[:1024, :768]
    assert np.array_equal(raw, src)  # the channels are the source's R, G, B (Deflate: lossless)


def _bioformats() -> tuple[str, str]:
    from export.test_export_bioformats import bioformats_jar

    return str(bioformats_jar()), "loci.formats.tools."


def test_fluorescence_fixture_equals_bioformats(made, tmp_path):
    """Bio-Formats' Leica SCN reader: the fluorescence image is a series of 3 channels and 2
    resolutions; its pixels, converted per resolution, are wsitool's channel planes."""
    jar, tools = _bioformats()
    path = made["leica_fluorescence"]
    java = ["java", "-Dbioformats_can_do_upgrade_check=false", "-cp", jar]
    info = subprocess.run([*java, tools + "ImageInfo", "-nopix", "-noflat", str(path)], capture_output=True,
                          text=True, timeout=300)
    assert info.returncode == 0, info.stderr[-2000:]
    series = re.split(r"\nSeries #\d+ :", info.stdout)[1:]
    assert len(series) == 2 and "SizeC = 3\n" in series[1] and "Resolutions = 2" in series[1]
    with wsitool.open_slide(path) as slide:
        for r, lv in enumerate(slide.levels):
            out = tmp_path / f"r{r}.ome.tif"
            conv = subprocess.run([*java, tools + "ImageConverter", "-series", str(2 + r), "-nogroup", str(path),
                                   str(out)], capture_output=True, text=True, timeout=300)
            assert conv.returncode == 0, conv.stderr[-2000:]
            theirs = tifffile.imread(out)
            ours = slide.read_region((0, 0), r, lv.dimensions, mode="raw")
            assert theirs.shape == (3, lv.height, lv.width)
            assert np.array_equal(theirs, np.moveaxis(ours, -1, 0)), r


def _with_xml(made, tmp_path, edit, name="bad.scn", src="leica_brightfield"):
    """A copy of a fixture whose SCN XML is ``edit(xml)``."""
    out = tmp_path / name
    shutil.copyfile(made[src], out)
    xml = tifffile.TiffFile(made[src]).pages[0].description
    tifffile.tiffcomment(out, comment=edit(xml).encode("utf-8"))
    return out


def _macro(xml: str) -> str:
    found = re.search(r'<image name="macro".*?</image>', xml)
    assert found is not None
    return found[0]


BROKEN = {
    "no xml": (lambda x: x.replace("</scn>", ""), "no XML"),
    # (the namespace named, not the root's: OpenSlide passes it over, to read it as generic TIFF)
    "namespace": (lambda x: x.replace('xmlns="http', 'xmlns="urn:x" xmlns:l="http'), "namespace"),
    "no collection": (lambda x: x.replace("collection", "kollection"), "collection"),
    "no view": (lambda x: x.replace("<view ", "<vue "), "no view"),
    "bad ifd": (lambda x: x.replace('ifd="4"', 'ifd="four"'), "ifd missing or not an integer"),
    "ifd outside": (lambda x: x.replace('ifd="4"', 'ifd="40"'), "IFD 40"),
    "no main": (lambda x: re.sub(r'<image name="main2".*?</image>', "", x), "can't find main image"),
    "two macros": (lambda x: x.replace('<image name="main2"', _macro(x) + '<image name="main2"'),
                   "several macro images"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_leica_layout_is_one_line_and_exit_4(made, tmp_path, case):
    edit, why = BROKEN[case]
    bad = _with_xml(made, tmp_path, edit)
    with pytest.raises(CorruptFileError, match=why) as info:
        wsitool.open_slide(bad)
    assert str(bad) in str(info.value)
    proc = subprocess.run([sys.executable, "-m", "wsitool", "info", str(bad)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 4, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_dissimilar_main_images_are_refused_as_openslide_does(made, tmp_path):
    bad = _with_xml(made, tmp_path, lambda x: x.replace("<objective>20</objective>", "<objective>40</objective>", 1),
                    src="leica_two_main")
    with pytest.raises(openslide.OpenSlideError, match="dissimilar"):
        openslide.OpenSlide(str(bad))
    with pytest.raises(CorruptFileError, match="dissimilar"):
        wsitool.open_slide(bad)


def test_a_main_image_off_the_tile_grid_is_read_where_openslide_places_it(made, tmp_path):
    """OpenSlide places it at 500 nm x 100 = 100 pixels (25 at level 2): wsitool reads it there,
    as a mosaic of its stored tiles (it refused the file before)."""
    moved = _with_xml(made, tmp_path, lambda x: x.replace('offsetX="256000"', 'offsetX="50000"'))
    with openslide.OpenSlide(str(moved)) as o, wo.OpenSlide(str(moved)) as w:
        assert o.properties["openslide.bounds-x"] == "100"
        assert dict(w.properties) == dict(o.properties)
        assert_reads_equal_openslide(o, w, regions=12)


def test_an_offgrid_main_image_not_jpeg_is_refused_with_one_line(made, tmp_path, monkeypatch):
    """Off the grid only JPEG tiles are read (what Leica scanners write): Deflate tiles are
    refused by name, exit 3, rather than painted wrongly."""
    gen = script_module("make_vendor_samples")
    monkeypatch.setattr(gen, "_JPEG", {"compression": "adobe_deflate", "photometric": "rgb"})
    src = gen.leica_brightfield(tmp_path, gen.SOURCE)
    moved = _with_xml({"leica_brightfield": src}, tmp_path, lambda x: x.replace('offsetX="256000"', 'offsetX="50000"'))
    with pytest.raises(UnsupportedFormatError, match="off the tile grid stored as ADOBE_DEFLATE") as info:
        wsitool.open_slide(moved)
    assert str(moved) in str(info.value)
    proc = subprocess.run([sys.executable, "-m", "wsitool", "info", str(moved)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("nm", [
    ("500000000", "1000000000"),  # level 0 alone over the limit (10^12 pixels)
    ("119680000", "119680000"),  # each level under it (level 0: 3.5 M tiles), all together over
])
def test_a_collection_too_large_for_the_tile_tables_is_refused(made, tmp_path, nm):
    """The canvas's tile tables are sized by the XML: a collection claiming more tiles than
    :data:`leica.MAX_CANVAS_TILES` is refused before any table is made (OpenSlide would show it)."""
    huge = _with_xml(made, tmp_path, lambda x: x.replace('sizeX="1024000" sizeY="1280000"',
                                                          f'sizeX="{nm[0]}" sizeY="{nm[1]}"'))
    with pytest.raises(UnsupportedFormatError, match="limit"):
        wsitool.open_slide(huge)


def test_offgrid_main_images_of_different_jpeg_tables_are_refused(tmp_path, monkeypatch):
    """One mosaic level merges one JPEGTables into its tiles: a second main image whose tables
    differ (another quality) is refused with one line rather than decoded with the wrong ones."""
    gen = script_module("make_vendor_samples")
    calls = []
    plain = gen._abbreviated_jpeg_tiles

    def second_at_70(img, quality=90):
        calls.append(img.shape)
        return plain(img, 70 if len(calls) > 3 else quality)  # (IFDs 5-7: the second main image)

    monkeypatch.setattr(gen, "_abbreviated_jpeg_tiles", second_at_70)
    path = gen.leica_overlap(tmp_path, gen.SOURCE)
    with openslide.OpenSlide(str(path)) as o:
        assert o.level_count == 3  # (OpenSlide decodes each IFD with its own tables)
    with pytest.raises(UnsupportedFormatError, match="different JPEG tables") as info:
        wsitool.open_slide(path)
    assert str(path) in str(info.value)


def test_an_offgrid_level_of_too_many_stored_tiles_is_refused(made, monkeypatch):
    """The mosaic's arrays are sized by the file's tile tables: over
    :data:`leica_mosaic.MAX_PLACED_TILES` tiles in a level, the slide is refused."""
    from wsitool.formats.tiff import leica_mosaic

    monkeypatch.setattr(leica_mosaic, "MAX_PLACED_TILES", 79)  # level 0: 8 x 11 = 88 stored tiles
    with pytest.raises(UnsupportedFormatError, match="limit"):
        wsitool.open_slide(made["leica_offgrid"])
    monkeypatch.setattr(leica_mosaic, "MAX_PLACED_TILES", 88)
    with wsitool.open_slide(made["leica_offgrid"]) as slide:
        assert slide.levels[0].compression == "MOSAIC"


def test_cli_info_and_read_region_on_a_leica_fixture(made, tmp_path):
    path = made["leica_brightfield"]
    info = subprocess.run([sys.executable, "-m", "wsitool", "info", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert info.returncode == 0, info.stderr
    assert "leica" in info.stdout and "2048" in info.stdout
    out = tmp_path / "r.npy"
    proc = subprocess.run([sys.executable, "-m", "wsitool", "read-region", str(path), "-l", "400", "400", "-L", "1",
                           "-s", "200", "100", "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    arr = np.load(out)
    with openslide.OpenSlide(str(path)) as o:
        assert np.array_equal(arr, np.asarray(o.read_region((400, 400), 1, (200, 100))))


def test_scn_integer_and_objective_rules():
    node = leica.ET.fromstring('<d a=" 12" b="12 " c="+3" e="" f="1e3"/>')
    assert leica._int(node, "a") == 12 and leica._int(node, "c") == 3
    for name in ("b", "e", "f", "missing"):
        with pytest.raises(CorruptFileError):
            leica._int(node, name)
    assert leica._c_int("20") == 20 and leica._c_int(" 40") == 40
    assert leica._c_int("20.0") is None and leica._c_int("20 ") is None and leica._c_int(None) is None
