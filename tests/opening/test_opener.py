"""The opener (:mod:`wsitool.opening.opener`): formats found in a registry, a format's own options
passed on (an unknown one: one InvalidOptionError), siblings read through the location."""

from __future__ import annotations

import types

import numpy as np
import pytest

import wsitool
from wsitool.errors import InvalidOptionError, UnsupportedFormatError
from wsitool.formats import tiff
from wsitool.formats.contract import Format, PlacedFormat
from wsitool.opening import LocalFile, LocalFolder, OpenedSlide, open_location, opener, parse_location

from helpers import fake_format, fake_slide_files, shared_sample


@pytest.fixture
def fake():
    fmt = fake_format()
    opener.register(fmt)
    try:
        yield fmt
    finally:
        opener.unregister(fmt)
    assert opener.formats() == opener.BUILT_IN


def test_an_unknown_format_option_is_one_invalid_option_error(tmp_path):
    svs = shared_sample("aperio-openslide-small-16px.svs")
    with pytest.raises(InvalidOptionError) as info:
        open_location(LocalFile(str(svs)), {"scene": 1})
    assert str(info.value) == f"{svs}: the TIFF format takes no option 'scene'"
    with pytest.raises(InvalidOptionError, match="a folder slide takes no option 'scene'"):
        open_location(LocalFolder(str(shared_sample("dicom-openslide-boxes"))), {"scene": 1})
    assert isinstance(InvalidOptionError("x"), ValueError)  # (exit 2 on the command line)


def test_a_registered_format_opens_its_file_and_a_sibling_with_its_options(tmp_path, fake):
    assert isinstance(fake, Format) and isinstance(fake, PlacedFormat)
    assert opener.formats() == (*opener.BUILT_IN, fake)
    svs, index = fake_slide_files(tmp_path)
    opened = open_location(parse_location(index), {"scene": 0})
    assert isinstance(opened, OpenedSlide) and opened.format is fake
    assert fake.calls == [(str(index), {"scene": 0})]
    with wsitool.Slide(opened) as slide, wsitool.open_slide(svs) as ref:
        assert slide.path == str(index) and slide.level_dimensions == ref.level_dimensions
        np.testing.assert_array_equal(slide.read_region((100, 200), 0, (300, 200)),
                                      ref.read_region((100, 200), 0, (300, 200)))
    with wsitool.open_slide(index) as slide:  # (no options: the format's own default)
        assert slide.vendor == "aperio"


def test_a_registered_format_refuses_an_option_it_does_not_take(tmp_path, fake):
    _, index = fake_slide_files(tmp_path)
    with pytest.raises(InvalidOptionError) as info:
        open_location(parse_location(index), {"scene": 0, "focal_plane": 2})
    assert str(info.value) == f"{index}: the FAKE format takes no option 'focal_plane' (it takes scene)"
    assert fake.calls == []  # refused before the format was called
    with pytest.raises(InvalidOptionError, match="no scene 3"):
        open_location(parse_location(index), {"scene": 3})


def test_a_file_no_format_reads_names_every_registered_format(tmp_path, fake):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"GIF89a" + b"\0" * 200)
    with pytest.raises(UnsupportedFormatError) as info:
        open_location(LocalFile(str(junk)))
    tried = "neither TIFF nor DICOM nor CZI nor FAKE"
    assert str(info.value) == f"{junk}: not a slide wsitool reads ({tried}; header b'GIF8')"


def test_register_checks_the_contract():
    with pytest.raises(TypeError, match="not a slide format"):
        opener.register(types.ModuleType("nothing"))
    opener.register(tiff)  # already there: not twice
    assert opener.formats() == opener.BUILT_IN


def test_slide_takes_an_opened_slide_and_no_options_with_it():
    opened = open_location(LocalFile(str(shared_sample("aperio-openslide-small-16px.svs"))))
    with pytest.raises(InvalidOptionError, match="open already"):
        wsitool.Slide(opened, storage_options={"anon": True})
    with wsitool.Slide(opened) as slide:
        assert slide.identity == opened.identity and slide.location is opened.location
    assert opened.source is not None and opened.source.closed
