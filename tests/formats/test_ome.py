"""The OME-TIFF rules (:mod:`wsitool.formats.tiff.ome`): pixel size and objective from the
OME-XML, and the further OME Images as associated images."""

from __future__ import annotations

import numpy as np
import tifffile

import wsitool
from wsitool.formats.tiff import ome

_XML = ('<OME xmlns="http://www.openmicroscopy.org/Schemas/OME/2016-06">'
        '<Instrument><Objective ID="O:0" NominalMagnification="40"/></Instrument>'
        '<Image ID="Image:0"><Pixels PhysicalSizeX="0.25" PhysicalSizeY="250" PhysicalSizeYUnit="nm"/>'
        "</Image></OME>")


def test_pixel_size_in_micrometres_and_objective_from_the_xml():
    props: dict[str, str] = {}
    assert ome.ome_metadata(_XML, props) == (0.25, 0.25, 40.0)
    assert props == {"ome.PhysicalSizeX": "0.25", "ome.PhysicalSizeXUnit": "µm",
                     "ome.PhysicalSizeY": "250", "ome.PhysicalSizeYUnit": "nm"}
    # an unknown unit is no size; unparsable XML is no metadata
    odd: dict[str, str] = {}
    assert ome.ome_metadata(_XML.replace('PhysicalSizeYUnit="nm"', 'PhysicalSizeYUnit="parsec"'), odd)[1] is None
    assert ome.ome_metadata("<OME", {}) == (None, None, None)


def test_further_ome_images_are_associated_images_named_by_their_name(tmp_path):
    path = tmp_path / "two.ome.tif"
    with tifffile.TiffWriter(path, ome=True) as tw:
        tw.write(np.zeros((64, 64, 3), np.uint8), tile=(32, 32), photometric="rgb")
        tw.write(np.full((16, 24, 3), 200, np.uint8), photometric="rgb", metadata={"Name": "Label"})
    with tifffile.TiffFile(path) as tf:
        assert ome.other_images(tf) == {1: "label"}
    with wsitool.open_slide(path) as s:
        assert s.vendor == "ome-tiff" and s.level_count == 1
        assert list(s.associated_images) == ["label"]
        assert s.associated_images["label"].shape == (16, 24, 3)
