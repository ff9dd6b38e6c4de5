"""The format seam: the registry recognises a file by its first bytes; the TIFF format describes without decoding."""

from __future__ import annotations

import numpy as np
import pytest
import tifffile

from wsitool.errors import UnsupportedFormatError
from wsitool.formats import tiff
from wsitool.model import Pyramid, PyramidLevel
from wsitool.opening import LocalFile as Located
from wsitool.opening import open_location
from wsitool.storage import LocalFile


def test_dicom_and_unknown_files_are_refused_by_name(tmp_path):
    dicom = tmp_path / "x.dcm"
    dicom.write_bytes(b"\0" * 128 + b"DICM" + b"\0" * 64)
    junk = tmp_path / "x.svs"
    junk.write_bytes(b"hello, not a slide" * 10)
    for path, needle in ((dicom, "not a DICOM whole-slide image"),
                         (junk, r"not a slide wsitool reads \(neither TIFF nor DICOM nor CZI; header b'hell'\)")):
        with pytest.raises(UnsupportedFormatError, match=needle):
            open_location(Located(str(path)))


def test_tiff_pyramid_description(tmp_path, sample_jpeg):
    with LocalFile(sample_jpeg) as src:
        assert tiff.sniff(src.read(0, 4))
        pyramid = tiff.open_pyramid(src)
        try:
            assert isinstance(pyramid, Pyramid) and pyramid.vendor == "aperio"
            lv = pyramid.levels[0]
            assert isinstance(lv, PyramidLevel) and lv.source is src
            assert lv.encoding.stream == "jpeg" and lv.encoding.codec == "nv"
            # the JPEG prefix merges SOI, the Adobe RGB marker (photometric RGB) and the tables
            assert lv.encoding.jpeg_prefix.startswith(b"\xff\xd8\xff\xee")
            n = lv.tiles_across * lv.tiles_down
            assert lv.tiles.offsets.dtype == np.uint64 and lv.tiles.offsets.flags.c_contiguous
            assert len(lv.tiles.offsets) >= n and lv.tiles.planes == 1
            assert "thumbnail" in pyramid.associated
            assert pyramid.properties["openslide.level-count"] == str(len(pyramid.levels))
        finally:
            pyramid.release()


def test_planar_separate_level_has_one_segment_per_plane(tmp_path):
    path = tmp_path / "planar.tif"
    img = np.random.default_rng(0).integers(0, 255, (3, 64, 96), np.uint8)
    tifffile.imwrite(path, img, tile=(32, 32), planarconfig="separate", photometric="rgb")
    with LocalFile(path) as src:
        pyramid = tiff.open_pyramid(src)
        lv = pyramid.levels[0]
        assert lv.tiles.planes == 3 and lv.encoding.codec == "generic"
        assert len(lv.tiles.offsets) == 3 * lv.tiles_across * lv.tiles_down
        pyramid.release()
