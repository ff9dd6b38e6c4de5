"""The PerkinElmer QPTIFF rules (:mod:`wsitool.formats.tiff.qptiff`): the page descriptions'
image types, channels and objective, and the shared sample against tifffile's pages."""

from __future__ import annotations

import numpy as np
import tifffile

import wsitool
from wsitool.formats.tiff import qptiff

from helpers import shared_sample

QPTIFF = "qptiff-perkinelmer-vectra-small.qptiff"


def _desc(inner: str) -> str:
    return ('<?xml version="1.0" encoding="utf-16"?>'
            f"<PerkinElmer-QPI-ImageDescription>{inner}</PerkinElmer-QPI-ImageDescription>")


def test_page_descriptions_name_associated_images_and_channels():
    assert qptiff.is_qptiff(_desc("")) and not qptiff.is_qptiff("<OME/>")
    assert qptiff.associated_name(_desc("<ImageType>Overview</ImageType>")) == "macro"
    assert qptiff.associated_name(_desc("<ImageType>Thumbnail</ImageType>")) == "thumbnail"
    assert qptiff.associated_name(_desc("<ImageType>FullResolution</ImageType>")) is None
    assert qptiff.associated_name("<not xml") is None
    ch = qptiff.page_channel(_desc("<Name>FITC</Name><Color>0,255,0</Color>"
                                   "<Responsivity><Filter><FilterID>F2</FilterID></Filter></Responsivity>"), 1, 3)
    assert (ch.name, ch.description, ch.color, ch.color_source) == ("FITC", "F2", (0, 255, 0), "file")
    # no name, a colour out of range: "C<index>" and the default colour of the channel's place
    ch = qptiff.page_channel(_desc("<Color>0,256,0</Color>"), 2, 3)
    assert (ch.name, ch.color, ch.color_source) == ("C2", (255, 0, 0), "default")
    assert qptiff.objective_power(_desc("<Objective>10x</Objective>")) == 10.0
    assert qptiff.objective_power(_desc("<Objective>high</Objective>")) is None


def test_qptiff_channels_equal_tifffile_pages():
    path = shared_sample(QPTIFF)
    pages = tifffile.imread(path, series=0)  # (3, 1440, 1920)
    with wsitool.open_slide(path) as s:
        assert s.vendor == "qptiff"
        assert [(c.name, c.color, c.color_source) for c in s.channels] == [
            ("DAPI", (0, 0, 255), "file"), ("FITC", (0, 255, 0), "file"), ("Cy3", (255, 255, 0), "file")]
        assert s.objective_power == 10.0
        assert sorted(s.associated_images) == ["label", "macro", "thumbnail"]
        raw = s.read_region((0, 0), 0, s.dimensions, mode="raw")
        assert np.array_equal(np.moveaxis(pages, 0, -1), raw)
        assert np.array_equal(s.read_region((0, 0), 0, s.dimensions, mode="raw", channels="Cy3")[..., 0],
                              pages[2])
        rgb = s.read_region((0, 0), 0, s.dimensions, mode="rgb")
        p = pages.astype(np.int32)
        want = np.stack([p[2], p[1] + p[2], p[0]], axis=-1).clip(0, 255).astype(np.uint8)
        assert np.array_equal(rgb, want)
