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
from wsitool.errors import CorruptFileError, UnsupportedFormatError
from wsitool.formats.tiff import ventana

from helpers import assert_reads_equal_openslide

openslide = pytest.importorskip("openslide")
wo = pytest.importorskip("wsitool.openslide")

FIXTURES = ("ventana_tiff", "ventana_bif")


@pytest.fixture(params=FIXTURES)
def pair(request, made):
    path = made[request.param]
    o, w = openslide.OpenSlide(str(path)), wo.OpenSlide(str(path))
    yield request.param, o, w
    o.close()
    w.close()


@pytest.mark.parametrize("name", [*FIXTURES, "ventana_overlap"])
def test_openslide_reads_every_fixture_as_ventana(made, name):
    with openslide.OpenSlide(str(made[name])) as o:
        assert o.properties["openslide.vendor"] == "ventana"
        assert o.level_count == 3 and o.level_downsamples == (1.0, 2.0, 4.0)
        for level, (width, height) in enumerate(o.level_dimensions):
            region = np.asarray(o.read_region((0, 0), level, (width, height)))
            assert region.shape == (height, width, 4) and region[..., 3].all()
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


def test_overlapping_tiles_are_refused_not_misplaced(made):
    """OpenSlide places them at a fractional step (a smaller level 0); wsitool does not read that yet."""
    path = made["ventana_overlap"]
    with openslide.OpenSlide(str(path)) as o:
        assert o.level_dimensions[0] == (1015, 1521)
    with pytest.raises(UnsupportedFormatError, match="overlapping tiles") as info:
        wsitool.open_slide(path)
    assert str(path) in str(info.value)


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
