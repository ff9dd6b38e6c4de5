"""The format contract (:mod:`wsitool.formats.contract`): every registered format provides it."""

from __future__ import annotations

import pytest

from wsitool.errors import UnsupportedFormatError
from wsitool.formats import czi, dicom, mirax, tiff
from wsitool.formats.contract import FolderFormat, Format, NamedFormat, PlacedFormat, PrefixFormat, SeriesFormat
from wsitool.opening import LocalFile, LocalFolder, open_location
from wsitool.opening import opener as registry


def test_registered_formats_provide_the_contract():
    assert registry.BUILT_IN == (tiff, dicom, czi, mirax)
    assert registry.formats() == (tiff, dicom, czi, mirax)
    assert isinstance(mirax, PlacedFormat) and isinstance(mirax, NamedFormat) and not mirax.sniff(b"\xff\xd8")
    assert mirax.claims("slide.mrxs") and not mirax.claims("slide.MRXS") and not mirax.claims(".mrxs")
    assert all(isinstance(fmt, Format) for fmt in registry.formats())
    assert isinstance(dicom, FolderFormat) and not isinstance(tiff, FolderFormat)
    assert isinstance(dicom, PrefixFormat) and isinstance(dicom, SeriesFormat)
    assert not isinstance(tiff, PrefixFormat) and not isinstance(tiff, SeriesFormat)
    assert tiff.sniff(b"II*\x00") and tiff.sniff(b"MM\x00+") and not tiff.sniff(b"II*\x01")
    assert dicom.sniff(b"\0" * 128 + b"DICM") and not dicom.sniff(b"II*\x00" + b"\0" * 128)
    assert isinstance(czi, PlacedFormat) and czi.OPTIONS == frozenset({"scene"}) and czi.READS_URLS
    assert czi.sniff(b"ZISRAWFILE" + b"\0" * 22) and not czi.sniff(b"ZISRAWSUBBLOCK")


def test_a_file_no_format_recognises_names_what_was_tried(tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"GIF89a" + b"\0" * 200)
    with pytest.raises(UnsupportedFormatError) as info:
        open_location(LocalFile(str(junk)))
    assert str(info.value) == f"{junk}: not a slide wsitool reads (neither TIFF nor DICOM nor CZI; header b'GIF8')"


def test_a_folder_without_a_slide_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("no slide here")
    with pytest.raises(UnsupportedFormatError, match="is a directory without a slide wsitool reads"):
        open_location(LocalFolder(str(tmp_path)))
