"""The OME-XML of OME-TIFF exports carries what the OME model has a place for (issue 26, item 2)."""

from __future__ import annotations

from datetime import datetime

import pytest
import tifffile

import wsitool
from wsitool.export import export_pyramid
from wsitool.export.omexml import Instrument, OmeChannel, OmeImage, acquisition_date, ome_xml

ome_types = pytest.importorskip("ome_types", reason="ome-types (test extra) validates OME-XML")


def test_ome_tiff_export_carries_objective_mpp_date_and_scanner(tmp_path, cmu1):
    out = tmp_path / "out.ome.tif"
    export_pyramid(cmu1, out, format="ome-tiff", region=(0, 0, 512, 512))
    with tifffile.TiffFile(out) as tf:
        xml = tf.pages[0].description
    ome_types.validate_xml(xml)
    ome = ome_types.from_xml(xml)
    assert ome.instruments[0].objectives[0].nominal_magnification == 20.0
    assert ome.instruments[0].microscope.serial_number == "CPAPERIOCS"  # Aperio ScanScope ID
    image = ome.images[0]
    assert image.objective_settings.id == ome.instruments[0].objectives[0].id
    assert image.acquisition_date.replace(tzinfo=None) == datetime(2009, 12, 29, 9, 59, 15)
    assert image.pixels.physical_size_x == pytest.approx(0.499)
    assert [im.name for im in ome.images[1:]] == ["label", "macro"]
    with wsitool.open_slide(out) as s:  # what `wsitool info` shows
        assert s.objective_power == 20.0
        assert s.mpp == pytest.approx((0.499, 0.499))


def test_writer_takes_a_list_of_channels():
    xml = ome_xml([OmeImage("fluo", 64, 32, 0, dtype="uint16",
                            channels=[OmeChannel(1, "DAPI", (0, 0, 255), emission_nm=461.0),
                                      OmeChannel(1, "FITC", (0, 255, 0))])],
                  instrument=Instrument(magnification=40.0))
    ome_types.validate_xml(xml)
    px = ome_types.from_xml(xml).images[0].pixels
    assert px.size_c == 2 and [c.name for c in px.channels] == ["DAPI", "FITC"]
    assert px.channels[0].emission_wavelength == 461.0
    assert xml.isascii()


def test_acquisition_date_formats():
    assert acquisition_date({"aperio.Date": "12/29/09", "aperio.Time": "09:59:15"}) == \
        datetime(2009, 12, 29, 9, 59, 15)
    assert acquisition_date({"dicom.AcquisitionDateTime": "20210720133842.25+0100"}) == \
        datetime(2021, 7, 20, 13, 38, 42)
    assert acquisition_date({"tiff.DateTime": "2017:02:07 13:06:43"}) == datetime(2017, 2, 7, 13, 6, 43)
    assert acquisition_date({"tiff.DateTime": "not a date"}) is None
