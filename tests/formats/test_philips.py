"""Philips TIFF (:mod:`wsitool.formats.tiff.philips`) on the fixtures of ``scripts/make_vendor_samples.py``,
against OpenSlide 4.0.1 (the oracle): OpenSlide must read each fixture as ``philips``, and wsitool
must give what it gives."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import tifffile

import wsitool
from wsitool.errors import CorruptFileError
from wsitool.formats.tiff import philips

from helpers import assert_reads_equal_openslide, vendor_pair_fixture

openslide = pytest.importorskip("openslide")
wo = pytest.importorskip("wsitool.openslide")

FIXTURES = ("philips_multilevel", "philips_sparse")


pair = vendor_pair_fixture(FIXTURES)


def test_openslide_reads_every_fixture_as_philips(pair):
    _, o, _ = pair
    assert o.properties["openslide.vendor"] == "philips"
    assert o.level_count >= 2
    for level, (width, height) in enumerate(o.level_dimensions):
        ds = o.level_downsamples[level]
        region = np.asarray(o.read_region((0, 0), level, (width, height)))
        assert region.shape == (height, width, 4) and region[..., 3].any()
        assert ds == 2.0 ** level
    assert sorted(o.associated_images) == ["label", "macro"]
    for image in o.associated_images.values():
        assert np.asarray(image)[..., :3].std() > 0


def test_geometry_metadata_and_associated_equal_openslide(pair):
    name, o, w = pair
    assert w.properties["openslide.vendor"] == "philips"
    assert w.level_dimensions == o.level_dimensions
    assert w.level_downsamples == o.level_downsamples
    # the stored lower levels are padded to whole tiles: the XML's spacings clip them
    assert o.level_dimensions[1] == (o.level_dimensions[0][0] // 2, o.level_dimensions[0][1] // 2)
    for key in ("openslide.mpp-x", "openslide.mpp-y", "openslide.objective-power", "openslide.barcode",
                "openslide.quickhash-1", "openslide.bounds-x", "openslide.comment", "tiff.ImageDescription"):
        assert w.properties.get(key) == o.properties.get(key), key
    assert "openslide.quickhash-1" in o.properties and "openslide.mpp-x" in o.properties
    assert ("openslide.objective-power" in o.properties) == (name == "philips_multilevel")
    ours = {k: v for k, v in w.properties.items() if k.startswith("philips.")}
    theirs = {k: v for k, v in o.properties.items() if k.startswith("philips.")}
    assert ours == theirs and "philips.PIIM_PIXEL_DATA_REPRESENTATION_SEQUENCE[1].DICOM_PIXEL_SPACING" in ours
    for key in set(o.properties) & set(w.properties):  # the rest: as numbers where they differ as text
        a, b = o.properties[key], w.properties[key]
        assert a == b or math.isclose(float(a), float(b), rel_tol=1e-12), (key, a, b)


def test_read_region_and_associated_images_equal_openslide(pair):
    _, o, w = pair
    assert_reads_equal_openslide(o, w)  # (level-0 locations on each level's grid: item 6 is the sub-pixel case)


def test_sparse_tiles_are_transparent_as_in_openslide(made):
    path = str(made["philips_sparse"])
    with tifffile.TiffFile(path) as tif:
        assert int(tif.pages[0].databytecounts[1 * 4 + 1]) == 0  # tile (row 1, col 1) has no data
    o, w = openslide.OpenSlide(path), wo.OpenSlide(path)
    try:
        box = ((256 + 10, 256 + 10), 0, (600, 300))  # over the missing 2 x 2 block and beyond it
        a, b = np.asarray(o.read_region(*box)), np.asarray(w.read_region(*box))
        assert np.array_equal(a, b)
        assert not a[:240, :240].any() and a[..., 3].any()  # transparent black inside, data around
    finally:
        o.close()
        w.close()


def _rewrite(made, tmp_path, description: str, name: str = "bad.tiff", later: int = 1):
    """The multi-level fixture with the first IFD's ImageDescription replaced (same pixels);
    ``later``: NewSubfileType of the lower levels."""
    src = made["philips_multilevel"]
    out = tmp_path / name
    with tifffile.TiffFile(src) as tif, tifffile.TiffWriter(out, bigtiff=True) as dst:
        for k, page in enumerate(tif.pages):
            if not page.is_tiled:
                continue
            dst.write(page.asarray(), tile=(256, 256), compression="jpeg", photometric="rgb",
                      subfiletype=0 if k == 0 else later, description=description if k == 0 else None,
                      software="Philips DP v1.0" if k == 0 else None, metadata=None)
    return out


@pytest.mark.parametrize("xml, why", [
    ('<DataObject ObjectType="DPUfsImport"><Attribute', "does not parse"),
    ('<DataObject ObjectType="DPUfsImport"></DataObject>', "expected one WSI image"),
    ('<Other ObjectType="DPUfsImport"/>', "root"),
])
def test_a_broken_philips_layout_is_a_corrupt_file(made, tmp_path, xml, why):
    bad = _rewrite(made, tmp_path, xml)
    with pytest.raises(CorruptFileError, match=why) as info:
        wsitool.open_slide(bad)
    assert str(bad) in str(info.value)
    proc = subprocess.run([sys.executable, "-m", "wsitool", "info", str(bad)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 4, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_spacings_must_match_the_levels(made, tmp_path):
    with tifffile.TiffFile(made["philips_multilevel"]) as tif:
        xml = tif.pages[0].description
    cut = xml.replace(xml[xml.rindex('<DataObject ObjectType="PixelDataRepresentation">'):
                          xml.index("</Array>", xml.rindex("PixelDataRepresentation"))], "")
    bad = _rewrite(made, tmp_path, cut)
    with pytest.raises(CorruptFileError, match="2 pixel spacings for 3 levels"):
        wsitool.open_slide(bad)


def test_levels_must_be_reduced_resolution(made, tmp_path):
    with tifffile.TiffFile(made["philips_multilevel"]) as tif:
        xml = tif.pages[0].description
    with wsitool.open_slide(_rewrite(made, tmp_path, xml, "good.tiff")) as slide:
        assert slide.vendor == "philips"
    with pytest.raises(CorruptFileError, match="IFD 1 is not reduced-resolution"):
        wsitool.open_slide(_rewrite(made, tmp_path, xml, later=0))


def test_objective_and_spacing_rules():
    assert philips._objective("tiff-levels=40,20-q=1") == 40.0
    assert philips._objective("tiff-levels=10003,10002") is None
    assert philips._objective('sourceFilename="a-levels=40"-levels=40') is None
    assert philips._objective("levels=0,1") is None
    assert philips._spacing('"0.00025" "0.0005"') == (0.0005, 0.00025)  # row, then column
    assert philips._spacing('"0,00025" "0,00025"') == (0.00025, 0.00025)
    assert philips._spacing('"0.00025"  "0.00025"') is None  # two spaces: three fields
    assert philips._spacing('"x" "1"') is None


def test_vendor_table_follows_openslide_detection_order():
    from wsitool.formats.tiff.vendors import VENDORS

    names = [v.name for v in VENDORS]
    assert names[:8] == ["hamamatsu", "trestle", "aperio", "huron", "argos", "leica", "philips", "ventana"]
    assert names[-1] == "generic-tiff"


def test_an_unreadable_xml_label_is_left_out():
    """OpenSlide adds the XML's label and macro only where their JPEG header decodes."""
    layout = philips.parse('<DataObject ObjectType="DPUfsImport"><Attribute Name="PIM_DP_SCANNED_IMAGES"><Array>'
                           '<DataObject><Attribute Name="PIM_DP_IMAGE_TYPE">WSI</Attribute></DataObject>'
                           '<DataObject><Attribute Name="PIM_DP_IMAGE_TYPE">LABELIMAGE</Attribute>'
                           '<Attribute Name="PIM_DP_IMAGE_DATA">bm90IGEganBlZw==</Attribute></DataObject>'
                           "</Array></Attribute></DataObject>")
    assert layout.image_data("LABELIMAGE") == "bm90IGEganBlZw=="
    assert philips.xml_associated(layout, set()) == {}
    assert layout.properties() == {"philips.PIM_DP_IMAGE_TYPE": "WSI"}
