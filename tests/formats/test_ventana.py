"""Ventana BIF and TIFF (:mod:`wsitool.formats.tiff.ventana`) on the fixtures of
``scripts/make_vendor_samples.py``, against OpenSlide 4.0.1 (the oracle): OpenSlide must read each
fixture as ``ventana``, and wsitool must give what it gives."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import tifffile

import wsitool
from wsitool.deepzoom.subpixel import whole_pixel
from wsitool.errors import CorruptFileError
from wsitool.formats.tiff import ventana

from helpers import (
    assert_offgrid_reads_equal_openslide,
    assert_reads_equal_openslide,
    script_module,
    shared_sample,
    vendor_pair_fixture,
)

openslide = pytest.importorskip("openslide")
wo = pytest.importorskip("wsitool.openslide")

FIXTURES = ("ventana_tiff", "ventana_bif")


pair = vendor_pair_fixture(FIXTURES)


@pytest.mark.parametrize("name", [*FIXTURES, "ventana_overlap", "ventana_areas"])
def test_openslide_reads_every_fixture_as_ventana(made, name):
    with openslide.OpenSlide(str(made[name])) as o:
        assert o.properties["openslide.vendor"] == "ventana"
        assert o.level_count == 3 and o.level_downsamples == (1.0, 2.0, 4.0)
        for level, (width, height) in enumerate(o.level_dimensions):
            region = np.asarray(o.read_region((0, 0), level, (width, height)))
            assert region.shape == (height, width, 4)
            # (two areas: a transparent gap beside the second)
            assert region[..., 3].mean() > (200 if name == "ventana_areas" else 254)
        assert sorted(o.associated_images) == ["macro", "thumbnail"]
        for image in o.associated_images.values():
            assert np.asarray(image)[..., :3].std() > 0


def test_geometry_metadata_and_associated_equal_openslide(pair):
    name, o, w = pair
    assert w.properties["openslide.vendor"] == "ventana"
    assert w.level_dimensions == o.level_dimensions
    assert w.level_downsamples == o.level_downsamples
    if name == "ventana_bif":  # the area's extent, not the stored (larger) image
        assert o.level_dimensions[0] == (1024, 1536)
        assert o.properties["openslide.region[0].width"] == "1024"
    else:
        assert o.level_dimensions[0] == (1100, 1500)
    for key in ("openslide.mpp-x", "openslide.mpp-y", "openslide.objective-power", "openslide.quickhash-1",
                "openslide.bounds-x", "openslide.comment", "tiff.ImageDescription", "tiff.Software"):
        assert w.properties.get(key) == o.properties.get(key), key
    assert o.properties["openslide.comment"] == "level=0 mag=40 quality=90"
    assert "openslide.quickhash-1" in o.properties and o.properties["openslide.mpp-x"] == "0.499"
    for prefix in ("ventana.", "openslide.region[", "openslide.level[", "openslide.associated."):
        ours = {k: v for k, v in w.properties.items() if k.startswith(prefix)}
        theirs = {k: v for k, v in o.properties.items() if k.startswith(prefix)}
        assert ours == theirs, prefix
    assert "ventana.Empty" not in o.properties and o.properties["ventana.ScanRes"] == "0.499"
    for key in set(o.properties) & set(w.properties):
        assert o.properties[key] == w.properties[key], key


def test_read_region_and_associated_images_equal_openslide(pair):
    _, o, w = pair
    assert_reads_equal_openslide(o, w)  # (level-0 locations on each level's grid: item 6 is the sub-pixel case)


#: the BIFs whose tiles OpenSlide places off the stored grid (mosaic levels in wsitool): their
#: level 0 size, and the levels on which every tile lies at a whole pixel (read exactly)
MOSAICS = {"ventana_overlap": ((1015, 1521), (0,)), "ventana_areas": ((1040, 1560), (0, 1))}


@pytest.mark.parametrize("name", MOSAICS)
def test_overlapping_tiles_and_several_areas_geometry_and_metadata_equal_openslide(made, name):
    """Sizes from OpenSlide's tile steps (253 px for the 3 px overlap, 254 for 2), its region
    properties (one per area; no ``openslide.bounds-*``), every property and the quickhash."""
    level0, _ = MOSAICS[name]
    path = str(made[name])
    with openslide.OpenSlide(path) as o, wo.OpenSlide(path) as w:
        assert o.level_dimensions[0] == level0
        assert w.level_dimensions == o.level_dimensions and w.level_downsamples == o.level_downsamples
        assert not [k for k in o.properties if k.startswith("openslide.bounds-")]
        areas = 2 if name == "ventana_areas" else 1
        assert f"openslide.region[{areas - 1}].x" in o.properties and f"openslide.region[{areas}].x" not in o.properties
        assert ({k for k in w.properties if k.startswith("openslide.")}
                == {k for k in o.properties if k.startswith("openslide.")})
        for key in set(o.properties) & set(w.properties):
            assert o.properties[key] == w.properties[key], key
        assert w.properties["openslide.quickhash-1"] == o.properties["openslide.quickhash-1"]
        assert sorted(w.associated_images) == sorted(o.associated_images)
        for image in o.associated_images:
            assert np.array_equal(np.asarray(w.associated_images[image]), np.asarray(o.associated_images[image]))
    with wsitool.open_slide(made[name]) as slide:
        assert slide.levels[0].compression == "MOSAIC"  # (the abutting BIF keeps its stored grid)
    with wsitool.open_slide(made["ventana_bif"]) as slide:
        assert slide.levels[0].compression == "JPEG"


@pytest.mark.parametrize("name", MOSAICS)
def test_whole_pixel_levels_read_exactly_as_openslide(made, name):
    """Where OpenSlide's tile positions are whole pixels (level 0; level 1 of the 254 px step),
    every region equals OpenSlide's: the tiles in OpenSlide's order (cairo SATURATE keeps the
    first painted, the highest row then column, in front), cut at the stored image's edge, the
    gap between two areas transparent."""
    _, exact = MOSAICS[name]
    path = str(made[name])
    rng = np.random.default_rng(7)
    with openslide.OpenSlide(path) as o, wo.OpenSlide(path) as w:
        for level in exact:
            width, height = o.level_dimensions[level]
            ds = int(o.level_downsamples[level])
            boxes = [((-37, -11), (300, 290)), ((width - 60, height - 50), (200, 170)), ((0, 0), (width, height))]
            boxes += [((int(rng.integers(-80, width)), int(rng.integers(-80, height))),
                       (int(rng.integers(1, 380)), int(rng.integers(1, 380)))) for _ in range(12)]
            for (x, y), size in boxes:
                a = np.asarray(o.read_region((x * ds, y * ds), level, size))
                b = np.asarray(w.read_region((x * ds, y * ds), level, size))
                assert np.array_equal(a, b), (level, x, y, size)
        whole = np.asarray(w.read_region((0, 0), 0, o.level_dimensions[0]))
    if name == "ventana_areas":
        assert not whole[..., 3].all() and whole[..., 3].any()  # the gap beside the second area
    else:  # tile (1, 0) lies at x = 253 over the last 3 columns of tile (0, 0): it is in front
        with tifffile.TiffFile(made[name]) as tif:
            stored = tif.pages[2].asarray()
        assert np.array_equal(whole[:250, 253:256, :3], stored[:250, 256:259])
        assert not np.array_equal(whole[:250, 253:256, :3], stored[:250, 253:256])


@pytest.mark.parametrize("name", MOSAICS)
def test_fractional_levels_equal_openslide_exactly(made, name):
    """Levels whose tile step is fractional (126.5 and 63.25 px; 63.5), and regions off every
    level's grid: the drop-in paints each tile at its own fractional offset as OpenSlide's cairo
    does (bilinear, pixman's float path, the first painted tile kept, partial alpha along the
    areas' fractional edges): OpenSlide's pixels, exactly."""
    _, exact = MOSAICS[name]
    path = str(made[name])
    with openslide.OpenSlide(path) as o, wo.OpenSlide(path) as w:
        for level, (width, height) in enumerate(o.level_dimensions):
            a = np.asarray(o.read_region((0, 0), level, (width, height)))
            assert np.array_equal(a, np.asarray(w.read_region((0, 0), level, (width, height)))), level
            partial = (a[..., 3] > 0) & (a[..., 3] < 255)
            assert partial.any() == (level not in exact), level
        assert_offgrid_reads_equal_openslide(o, w, seed=62)


def test_the_native_read_keeps_the_nearest_pixel_on_fractional_levels(made):
    """``Slide.read_region`` paints a fractional level's tiles at the nearest pixel (its documented
    mosaic rule): fully opaque or transparent, where the drop-in blends the fractional edges."""
    path = str(made["ventana_overlap"])
    with wsitool.open_slide(path) as slide, wo.OpenSlide(path) as w:
        lv = slide.levels[2]
        native = slide.read_region((0, 0), 2, (lv.width, lv.height), mode="rgba")
        blended = np.asarray(w.read_region((0, 0), 2, (lv.width, lv.height)))
        assert set(np.unique(native[..., 3]).tolist()) <= {0, 255}
        assert not np.array_equal(native, blended)
        # (a Deep Zoom tile there is blended, and its memory bound counts it so)
        assert not whole_pixel(slide, (0, 0), 2) and whole_pixel(slide, (0, 0), 0)


@pytest.mark.parametrize("areas, why", [
    ([(0, 0, 6, 5, 0, 1234)], "reaches past level 0's stored tiles"),  # 6 columns, 5 stored
    ([(0, 0, 5, 7, 0, 1234)] * 2, "more tiles than level 0 stores"),  # (the same tiles twice)
])
def test_an_area_past_the_stored_tiles_is_a_corrupt_file(tmp_path, areas, why):
    """OpenSlide opens it and fails reading there; wsitool says so at open (exit 4); and areas
    holding more tiles than are stored (which cost work without bound) are refused alike."""
    gen = script_module("make_vendor_samples")
    bad = gen._ventana(tmp_path / "past.bif", shared_sample("aperio-cmu1-small-region-jpeg.svs"), (1100, 1600),
                       gen.encode_info(0, 0, 3, areas))
    with pytest.raises(CorruptFileError, match=why) as info:
        wsitool.open_slide(bad)
    assert str(bad) in str(info.value)
    proc = subprocess.run([sys.executable, "-m", "wsitool", "info", str(bad)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 4 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def _rewrite(made, tmp_path, descriptions, name: str = "bad.tif", iscan: bytes | None = None):
    """The Ventana TIFF fixture with its IFDs' ImageDescriptions replaced (same pixels), and the
    first IFD's XMP packet where ``iscan`` is given."""
    src = made["ventana_tiff"]
    out = tmp_path / name
    with tifffile.TiffFile(src) as tif, tifffile.TiffWriter(out) as dst:
        for k, page in enumerate(tif.pages):
            packet = iscan if (k == 0 and iscan is not None) else page.tags[700].value if 700 in page.tags else None
            extra = [(700, 1, len(packet), packet, True)] if packet is not None else []
            tiling = {"tile": (256, 256)} if page.is_tiled else {"rowsperstrip": page.imagelength}
            dst.write(page.asarray(), compression="jpeg", photometric="rgb", description=descriptions[k],
                      extratags=extra, metadata=None, **tiling)
    return out


GOOD = ["Label Image", "Thumbnail", "level=0 mag=40 quality=90", "level=1 mag=20 quality=90",
        "level=2 mag=10 quality=90"]


@pytest.mark.parametrize("change, why", [
    ({3: "level=2 mag=20 quality=90"}, "unexpected level 2"),
    ({3: "level=1 mag=40 quality=90"}, "unexpected magnification in level 1"),
    ({2: "level=0 quality=90"}, "a level field is missing"),
    ({2: "level=0 mag=x"}, "does not parse"),
    ({0: None}, None),
])
def test_a_broken_ventana_layout_is_a_corrupt_file(made, tmp_path, change, why):
    descs = [change.get(k, d) if k in change and change[k] is not None else d for k, d in enumerate(GOOD)]
    iscan = b"<iScan Magnification='40'" if why is None else None  # an XMP that does not parse
    why = why or "no XML"
    bad = _rewrite(made, tmp_path, descs, iscan=iscan)
    with pytest.raises(CorruptFileError, match=why) as info:
        wsitool.open_slide(bad)
    assert str(bad) in str(info.value)
    proc = subprocess.run([sys.executable, "-m", "wsitool", "info", str(bad)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 4, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_rewritten_good_layout_still_opens_as_openslide_does(made, tmp_path):
    good = _rewrite(made, tmp_path, GOOD, "good.tif")
    with wsitool.open_slide(good) as slide, openslide.OpenSlide(str(good)) as o:
        assert slide.vendor == "ventana" == o.properties["openslide.vendor"]
        assert slide.properties["openslide.quickhash-1"] == o.properties["openslide.quickhash-1"]


def test_tile_joint_numbering_and_metadata_rules():
    area = ventana.Area(0, 0, 3, 2)
    assert ventana._tile_position(area, 1) == (0, 1)  # bottom row, left to right
    assert ventana._tile_position(area, 3) == (2, 1)
    assert ventana._tile_position(area, 4) == (2, 0)  # the next row up, right to left
    with pytest.raises(CorruptFileError, match="out of bounds"):
        ventana._tile_position(area, 7)
    assert ventana.metadata({"ventana.Magnification": "40", "ventana.ScanRes": "0.2325"}) == (0.2325, 0.2325, 40.0)
    assert ventana.metadata({"ventana.Magnification": "40.5", "ventana.ScanRes": "x"}) == (None, None, None)
    # OpenSlide's C parsers skip leading white space, not trailing
    assert ventana.metadata({"ventana.Magnification": " 40", "ventana.ScanRes": " 0.5"}) == (0.5, 0.5, 40.0)
    assert ventana.metadata({"ventana.Magnification": "40 ", "ventana.ScanRes": "0.5 "}) == (None, None, None)
