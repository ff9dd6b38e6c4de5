"""The format contract (:mod:`wsitool.formats.contract`): every listed format provides it."""

from __future__ import annotations

import pytest

from wsitool import formats
from wsitool.errors import UnsupportedFormatError
from wsitool.formats import dicom, tiff
from wsitool.formats.contract import FolderFormat, Format
from wsitool.storage import LocalFile


def test_listed_formats_provide_the_contract():
    assert formats.FORMATS == (tiff, dicom)
    assert all(isinstance(fmt, Format) for fmt in formats.FORMATS)
    assert isinstance(dicom, FolderFormat) and not isinstance(tiff, FolderFormat)
    assert tiff.sniff(b"II*\x00") and tiff.sniff(b"MM\x00+") and not tiff.sniff(b"II*\x01")
    assert dicom.sniff(b"\0" * 128 + b"DICM") and not dicom.sniff(b"II*\x00" + b"\0" * 128)


def test_a_file_no_format_recognises_names_what_was_tried(tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"GIF89a" + b"\0" * 200)
    with LocalFile(junk) as src, pytest.raises(UnsupportedFormatError) as info:
        formats.open_pyramid(str(junk), src)
    assert str(info.value) == f"{junk}: not a slide wsitool reads (neither TIFF nor DICOM; header b'GIF8')"


def test_a_folder_without_a_slide_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("no slide here")
    with pytest.raises(UnsupportedFormatError, match="is a directory without a slide wsitool reads"):
        formats.open_folder(str(tmp_path))
