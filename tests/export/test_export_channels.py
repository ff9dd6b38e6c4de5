"""OME-TIFF exports of multi-channel fluorescence slides keep every channel (issue 32).

tifffile reads the channels back pixel for pixel with their names and colours in
the OME-XML; Bio-Formats (``ImageInfo -nopix -omexml``; skipped without Java or
the jar, see ``test_export_bioformats``) parses the OME-XML and lists one series
of C channels with the names and colours.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import tifffile
from test_export_bioformats import image_info

import wsitool
from wsitool.export import export_pyramid

from helpers import shared_sample

NS = "{http://www.openmicroscopy.org/Schemas/OME/2016-06}"
CASES = {
    "dicom": ("dicom-3dhistech-fluorescence-3channel",
              [("DAPI", 65535), ("FITC", 16711935), ("Rhodamine", -16776961)], 3),
    "qptiff": ("qptiff-perkinelmer-vectra-small.qptiff",
               [("DAPI", 65535), ("FITC", 16711935), ("Cy3", -65281)], 4),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = {}
    folder = tmp_path_factory.mktemp("channels")
    for key, (name, _channels, _levels) in CASES.items():
        path = folder / f"{key}.ome.tif"
        export_pyramid(shared_sample(name), path, format="ome-tiff", tile_size=256, compression="deflate")
        out[key] = path
    return out


@pytest.mark.parametrize("key", sorted(CASES))
def test_channels_kept_in_tifffile(exported, key):
    name, channels, levels = CASES[key]
    path = exported[key]
    with wsitool.open_slide(shared_sample(name)) as s:
        raw = s.read_region((0, 0), 0, s.dimensions, mode="raw")
        mpp = s.mpp
    with tifffile.TiffFile(path) as tf:
        series = tf.series[0]
        assert series.axes == "CYX" and len(series.levels) == levels
        assert np.array_equal(np.moveaxis(series.asarray(), 0, -1), raw)
        half = series.levels[1].asarray()
        assert half.shape == (3, raw.shape[0] // 2, raw.shape[1] // 2)
        root = ET.fromstring(tf.ome_metadata)
    pixels = root.find(f"{NS}Image/{NS}Pixels")
    assert pixels.get("SizeC") == "3" and pixels.get("Type") == "uint8"
    assert float(pixels.get("PhysicalSizeX")) == pytest.approx(mpp[0])
    assert [(c.get("Name"), int(c.get("Color"))) for c in pixels.findall(f"{NS}Channel")] == channels
    assert pixels.find(f"{NS}TiffData").get("PlaneCount") == "3"


@pytest.mark.parametrize("key", sorted(CASES))
def test_channels_named_in_bioformats(exported, key):
    _name, channels, levels = CASES[key]
    out = image_info(exported[key], "-noflat", "-omexml")
    assert "OME-XML parsing failed" not in out
    first = re.split(r"\nSeries #\d+", out)[1]
    assert re.search(r"SizeC = 3\b", first) and f"Resolutions = {levels}" in first
    found = re.findall(r'<Channel Color="(-?\d+)" ID="Channel:0:\d" Name="([^"]+)"', out)
    assert [(n, int(c)) for c, n in found] == channels


def test_rgb_ome_tiff_parsed_by_bioformats(tmp_path):
    """The µm unit of an RGB export reaches Bio-Formats as UTF-8 (a character reference
    made it drop the whole OME-XML and read the file as a plain TIFF)."""
    path = tmp_path / "rgb.ome.tif"
    export_pyramid(shared_sample("aperio-cmu1-small-region-jpeg.svs"), path, format="ome-tiff")
    out = image_info(path, "-noflat", "-omexml")
    assert "OME-XML parsing failed" not in out
    assert 'PhysicalSizeXUnit="µm"' in out
