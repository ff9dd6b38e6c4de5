"""DICOM layouts without a shared sample, built with pydicom (tests/formats/dicom_build.py):
TILED_SPARSE with missing frames, concatenations, Basic / Extended / no offset table,
series folders, and bad DICOM that must fail with one clear WsiError naming the file."""

from __future__ import annotations

import imagecodecs
import numpy as np
import pytest
from pydicom.uid import generate_uid

import wsitool
from wsitool.errors import CorruptFileError, TileDecodeError, UnsupportedFormatError
from wsitool.slide import pyramid_levels

from dicom_build import jpeg_frames, make_image, tiles_of, write_instance, write_series
from helpers import shared_sample

TILE = 64
IMG = make_image(300, 200)


def _expected(img=IMG, tile=TILE, keep=None):
    """The image as the JPEG frames decode independently (imagecodecs), missing tiles 0."""
    h, w = img.shape[:2]
    across = -(-w // tile)
    out = np.zeros((-(-h // tile) * tile, across * tile, 3), np.uint8)
    for k, frame in enumerate(jpeg_frames(tiles_of(img, tile))):
        if keep is not None and k not in keep:
            continue
        r, c = divmod(k, across)
        out[r * tile:(r + 1) * tile, c * tile:(c + 1) * tile] = imagecodecs.jpeg8_decode(frame)
    return out[:h, :w]


@pytest.mark.parametrize("table", ["basic", "extended", "none"])
def test_offset_tables(tmp_path, table):
    path = write_instance(tmp_path / f"{table}.dcm", IMG, TILE, series=generate_uid(),
                          study=generate_uid(), table=table)
    with wsitool.open_slide(path) as slide:
        assert slide.properties["wsitool.dicom.offset-table"] == table
        assert slide.mpp == (0.25, 0.5)  # PixelSpacing (row 0.0005 mm, column 0.00025 mm)
        assert slide.objective_power == 40
        np.testing.assert_array_equal(slide.read_region((0, 0), 0, (300, 200), mode="rgb"), _expected())


def test_tiled_sparse_with_missing_frames(tmp_path):
    keep = {0, 1, 5, 7, 14}
    path = write_instance(tmp_path / "sparse.dcm", IMG, TILE, series=generate_uid(),
                          study=generate_uid(), sparse_keep=keep)
    with wsitool.open_slide(path) as slide:
        assert slide.properties["wsitool.dicom.organization"] == "TILED_SPARSE"
        assert slide.properties["wsitool.dicom.level[0].missing-tiles"] == str(20 - len(keep))
        rgba = slide.read_region((0, 0), 0, (300, 200))
        exp = _expected(keep=keep)
        np.testing.assert_array_equal(rgba[..., :3], exp)
        across = 5
        alpha = np.zeros((256, 320), np.uint8)
        for k in keep:
            r, c = divmod(k, across)
            alpha[r * 64:(r + 1) * 64, c * 64:(c + 1) * 64] = 255
        np.testing.assert_array_equal(rgba[..., 3], alpha[:200, :300])


def test_concatenation_is_one_level(tmp_path):
    uid, study, series = generate_uid(), generate_uid(), generate_uid()
    folder = tmp_path / "concat"
    folder.mkdir()
    # written in the other order: parts are placed by their frame offset
    write_instance(folder / "b.dcm", IMG, TILE, series=series, study=study, concat=(uid, 2, 8, list(range(8, 20))))
    write_instance(folder / "a.dcm", IMG, TILE, series=series, study=study, concat=(uid, 1, 0, list(range(8))))
    for opened in (folder, folder / "b.dcm"):
        with wsitool.open_slide(opened) as slide:
            assert slide.level_count == 1
            assert slide.properties["wsitool.dicom.level[0].concatenation-parts"] == "2"
            np.testing.assert_array_equal(slide.read_region((0, 0), 0, (300, 200), mode="rgb"), _expected())
            src = pyramid_levels(slide)[0].source
        assert src.closed


def test_series_folder_levels_label_and_no_image_type(tmp_path):
    write_series(tmp_path / "s", IMG, TILE, levels=3, image_type=True)
    with wsitool.open_slide(tmp_path / "s") as slide:
        assert slide.level_dimensions == ((300, 200), (150, 100), (75, 50))
        assert slide.level_downsamples == (1.0, 2.0, 4.0)
        assert list(slide.associated_images) == ["label"]
        np.testing.assert_array_equal(slide.associated_images["label"], make_image(40, 30, seed=9))
    path = write_instance(tmp_path / "untyped.dcm", IMG, TILE, series=generate_uid(),
                          study=generate_uid(), image_type=False)
    with wsitool.open_slide(path) as slide:
        assert slide.level_count == 1


def test_folder_with_two_series_names_them(tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    a, b = generate_uid(), generate_uid()
    write_instance(folder / "one.dcm", IMG, TILE, series=a, study=generate_uid())
    write_instance(folder / "two.dcm", IMG, TILE, series=b, study=generate_uid())
    with pytest.raises(UnsupportedFormatError) as info:
        wsitool.open_slide(folder)
    msg = str(info.value)
    # brief (issue 26): what the folder holds and what to give instead, each series by a file
    assert str(folder) in msg and "one.dcm" in msg and "two.dcm" in msg and "2 DICOM series" in msg
    # a file of the folder opens its own series
    with wsitool.open_slide(folder / "two.dcm") as slide:
        assert slide.level_count == 1


def test_empty_folder_and_non_wsi_dicom(tmp_path):
    with pytest.raises(UnsupportedFormatError, match="directory"):
        wsitool.open_slide(tmp_path)
    path = write_instance(tmp_path / "x.dcm", IMG, TILE, series=generate_uid(), study=generate_uid())
    data = bytearray(path.read_bytes())
    wsi = b"1.2.840.10008.5.1.4.1.1.77.1.6"
    ct = b"1.2.840.10008.5.1.4.1.1.2\0\0\0\0\0"  # CT Image Storage, padded to the same length
    data = data.replace(wsi, ct)
    bad = tmp_path / "ct.dcm"
    bad.write_bytes(bytes(data))
    with pytest.raises(UnsupportedFormatError, match="not a DICOM whole-slide image") as info:
        wsitool.open_slide(bad)
    assert str(bad) in str(info.value)


def _single(tmp_path, **kw):
    return write_instance(tmp_path / "one.dcm", IMG, TILE, series=generate_uid(),
                          study=generate_uid(), **kw)


@pytest.mark.parametrize("table", ["basic", "none", "extended"])
def test_truncated_pixel_data(tmp_path, table):
    path = _single(tmp_path, table=table)
    data = path.read_bytes()
    cut = tmp_path / "cut.dcm"
    cut.write_bytes(data[:len(data) - 3000])
    with pytest.raises(CorruptFileError, match="runcated") as info:
        wsitool.open_slide(cut)
    assert str(cut) in str(info.value)


def test_truncated_native_pixel_data(tmp_path):
    path = _single(tmp_path, codec="raw")
    cut = tmp_path / "cut.dcm"
    cut.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CorruptFileError, match="truncated Pixel Data"):
        wsitool.open_slide(cut)


def test_inconsistent_total_pixel_matrix(tmp_path):
    path = _single(tmp_path)
    data = bytearray(path.read_bytes())
    # TotalPixelMatrixColumns (0048,0006) US 300 -> 3000: a grid of 47x4 tiles for 20 frames
    tag = b"\x48\x00\x06\x00UL\x04\x00" + (300).to_bytes(4, "little")
    assert tag in data
    data = data.replace(tag, b"\x48\x00\x06\x00UL\x04\x00" + (3000).to_bytes(4, "little"))
    bad = tmp_path / "tpm.dcm"
    bad.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match="inconsistent Total Pixel Matrix") as info:
        wsitool.open_slide(bad)
    assert str(bad) in str(info.value)


def test_frame_that_is_not_a_stream_is_a_tile_error(tmp_path):
    path = _single(tmp_path)
    with wsitool.open_slide(path) as slide:
        lv = pyramid_levels(slide)[0]
        off, count = int(lv.tiles.offsets[6]), int(lv.tiles.bytecounts[6])
    data = bytearray(path.read_bytes())
    data[off:off + count] = b"\x00" * count
    (tmp_path / "other").mkdir()
    bad = tmp_path / "other" / "frame.dcm"
    bad.write_bytes(bytes(data))
    with wsitool.open_slide(bad) as slide:
        with pytest.raises(TileDecodeError) as info:
            slide.read_region((0, 0), 0, (300, 200))
        assert (info.value.col, info.value.row) == (1, 1) and str(bad) in str(info.value)
        with pytest.warns(wsitool.TileWarning):
            arr = slide.read_region((0, 0), 0, (300, 200), on_error="fill")
        assert (arr[64:128, 64:128, 3] == 0).all() and (arr[:64, :64, 3] == 255).all()


@pytest.mark.parametrize("cut", [300, 1000, 3000])
def test_header_cut_short_is_corrupt_not_oserror(tmp_path, cut):
    """scripts/fuzz_dicom.py: pydicom reports a header that ends inside an element as
    OSError ("No tag to read at file position"); it must be CorruptFileError naming the file."""
    src = shared_sample("dicom-openslide-boxes/boxes_0.dcm")
    bad = tmp_path / "cut.dcm"
    bad.write_bytes(src.read_bytes()[:cut])
    with pytest.raises(CorruptFileError) as info:
        wsitool.open_slide(bad)
    assert str(bad) in str(info.value)
