"""A format raises without the slide's name; the opener names it once (issue 48 item 5).

The formats work on byte sources: their errors carry no path.  The opener attaches the name
as the error leaves a format's entry point (:mod:`wsitool.ground.naming`), and a DICOM
folder names the instance file an error is about where it reads that file.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
import tifffile
from pydicom.uid import generate_uid

import wsitool
from wsitool.errors import CorruptFileError, UnsupportedFormatError
from wsitool.formats import tiff
from wsitool.storage import LocalFile

from dicom_build import make_image, write_instance, write_series

IMG = make_image(300, 200)
TILE = 64


def _bad_tag_tiff(path):
    """A tiled TIFF whose TileWidth (tag 322) holds two values: IFD 0 fails the tag checks."""
    tifffile.imwrite(path, np.zeros((64, 64), np.uint8), tile=(32, 32))
    data = bytearray(path.read_bytes())
    (ifd,) = struct.unpack_from("<I", data, 4)
    (count,) = struct.unpack_from("<H", data, ifd)
    for k in range(count):
        entry = ifd + 2 + 12 * k
        if struct.unpack_from("<H", data, entry)[0] == 322:
            struct.pack_into("<HI", data, entry + 2, 3, 2)  # SHORT x 2, inline: (32, 0)
            break
    else:
        raise AssertionError("no TileWidth tag")
    path.write_bytes(bytes(data))
    return path


def test_a_format_raises_without_the_path_and_open_slide_names_it_once(tmp_path):
    bad = _bad_tag_tiff(tmp_path / "bad-tag.tif")
    with LocalFile(bad) as src, pytest.raises(CorruptFileError) as raw:
        tiff.open_pyramid(src)
    assert str(bad) not in str(raw.value) and "bad-tag" not in str(raw.value)
    assert raw.value.subject is None
    with pytest.raises(CorruptFileError) as named:
        wsitool.open_slide(bad)
    message = str(named.value)
    assert message.startswith(f"{bad}: ") and message.count("bad-tag.tif") == 1
    assert message == f"{bad}: {raw.value}"  # the same words, named once


def test_not_a_tiff_is_named_once(tmp_path):
    bad = tmp_path / "fake.tif"
    bad.write_bytes(b"II*\x00" + b"\xff" * 200)  # a TIFF header whose first IFD lies nowhere
    with LocalFile(bad) as src, pytest.raises(CorruptFileError) as raw:
        tiff.open_pyramid(src)
    assert "fake.tif" not in str(raw.value)
    with pytest.raises(CorruptFileError) as named:
        wsitool.open_slide(bad)
    assert str(named.value).startswith(f"{bad}: ") and str(named.value).count("fake.tif") == 1


def test_a_folder_names_the_broken_instance_once(tmp_path):
    folder = tmp_path / "series"
    folder.mkdir()
    path = write_instance(folder / "only.dcm", IMG, TILE, series=generate_uid(), study=generate_uid())
    data = bytearray(path.read_bytes())
    at = data.index(b"\x48\x00\x06\x00UL")  # TotalPixelMatrixColumns: a value of the wrong length
    data[at + 6:at + 8] = (3).to_bytes(2, "little")
    path.write_bytes(bytes(data[:at + 8]) + b"\x01\x02\x03")  # and the file ends there
    with pytest.raises(CorruptFileError) as info:
        wsitool.open_slide(folder)
    message = str(info.value)
    assert message.startswith(f"{folder}: no readable DICOM whole-slide image in the folder")
    assert message.count("only.dcm") == 1 and f"({path}: " in message


def test_a_broken_sibling_is_passed_over_and_named_once(tmp_path):
    folder = tmp_path / "series"
    files = write_series(folder, IMG, TILE, levels=2)
    broken = folder / "broken.dcm"
    broken.write_bytes(files[0].read_bytes()[:400])  # the header cut short: unreadable
    with pytest.warns(wsitool.SlideWarning), wsitool.open_slide(folder) as slide:
        assert slide.level_count == 2
        (problem,) = [p for p in slide.problems if "broken.dcm" in p]
    assert problem.startswith(f"passed over {broken}: ") and problem.count("broken.dcm") == 1


def test_a_dicom_file_is_named_once_where_it_is_read(tmp_path):
    bad = tmp_path / "ct.dcm"
    path = write_instance(tmp_path / "x.dcm", IMG, TILE, series=generate_uid(), study=generate_uid())
    data = path.read_bytes().replace(b"1.2.840.10008.5.1.4.1.1.77.1.6", b"1.2.840.10008.5.1.4.1.1.2\0\0\0\0\0")
    bad.write_bytes(data)
    from wsitool.formats.dicom.instance import read_instance

    with pytest.raises(UnsupportedFormatError) as raw:
        read_instance(str(bad))  # (the one place a DICOM file is opened: it names the file)
    assert raw.value.subject == str(bad) and str(raw.value).count("ct.dcm") == 1
    assert raw.value.args[0].startswith("not a DICOM whole-slide image")  # (the check raised it bare)
    with pytest.raises(UnsupportedFormatError) as named:
        wsitool.open_slide(bad)
    assert str(named.value).startswith(f"{bad}: ") and str(named.value).count("ct.dcm") == 1


def test_what_a_slide_reads_after_open_is_named_once(tmp_path):
    """The levels' path (tile errors), the deferred quickhash and the associated images are
    named by the opener and the facade, not by the format."""
    import shutil

    from wsitool.errors import TileDecodeError, WsiError

    from helpers import shared_sample

    svs = tmp_path / "cut.svs"
    shutil.copyfile(shared_sample("aperio-cmu1-small-region-jpeg.svs"), svs)
    with wsitool.open_slide(svs) as slide:
        with open(svs, "r+b") as fp:  # the file shrinks after the open: every later read falls short
            fp.truncate(4096)
        with pytest.raises((TileDecodeError, CorruptFileError)) as tile:
            slide.read_region((0, 0), 0, (512, 512))
        with pytest.raises(CorruptFileError) as quick:
            slide.properties["openslide.quickhash-1"]
        with pytest.raises(WsiError) as label:
            slide.associated_images["thumbnail"]
    for info in (tile, quick, label):
        message = str(info.value)
        assert message.startswith(f"{svs}: ") and message.count("cut.svs") == 1, message
