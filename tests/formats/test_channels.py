"""Multi-channel fluorescence slides (issue 32): every channel read, the composite, the palette decoder.

The 3-channel DICOM series (3DHISTECH, one instance per level holding the three
optical paths as frames) is checked against its frames decoded directly (pydicom
for the frame bytes, imagecodecs' JPEG decoder); the PerkinElmer QPTIFF against
tifffile's pages is in test_qptiff.py.
"""

from __future__ import annotations

import imagecodecs
import numpy as np
import pytest

import wsitool
from wsitool.errors import InvalidRegionError
from wsitool.formats.dicom.palette import expand_segments, palette_lut
from wsitool.model import Channel, channel_color, wavelength_color
from wsitool.read.channels import composite, to_8bit
from wsitool.slide import pyramid_levels

from helpers import shared_sample

DICOM = "dicom-3dhistech-fluorescence-3channel"


def _dicom_frames(path, level_file: str) -> list[np.ndarray]:
    """Each frame of one instance decoded directly: pydicom's frame bytes, libjpeg."""
    import pydicom
    from pydicom.encaps import generate_frames

    ds = pydicom.dcmread(path / level_file)
    frames = generate_frames(ds.PixelData, number_of_frames=int(ds.NumberOfFrames))
    w, h = int(ds.TotalPixelMatrixColumns), int(ds.TotalPixelMatrixRows)
    return [imagecodecs.jpeg8_decode(f)[:h, :w] for f in frames]


# ------------------------------------------------------------------ DICOM


def test_dicom_channels_equal_their_frames_and_stack():
    path = shared_sample(DICOM)
    with wsitool.open_slide(path) as s:
        assert [c.name for c in s.channels] == ["DAPI", "FITC", "Rhodamine"]
        assert [c.description for c in s.channels] == ["DAPI (Blue)", "FITC (green)", "Rhodamine (orange)"]
        assert [c.color_source for c in s.channels] == ["palette"] * 3
        assert [c.excitation_nm for c in s.channels] == [None] * 3  # IlluminationWaveLength 0.0
        assert s.level_count == 6
        for level, name in ((0, "7_0.dcm"), (2, "9_0.dcm"), (5, "12_0.dcm")):
            frames = _dicom_frames(path, name)
            size = s.level_dimensions[level]
            raw = s.read_region((0, 0), level, size, mode="raw")
            assert raw.shape == (size[1], size[0], 3) and raw.dtype == np.uint8
            for k in range(3):
                alone = s.read_region((0, 0), level, size, mode="raw", channels=[k])
                assert np.array_equal(alone[..., 0], frames[k]), (level, k)
                assert np.array_equal(raw[..., k], frames[k])
        # by name, reordered, a window inside
        part = s.read_region((100, 200), 0, (64, 32), mode="raw", channels=["rhodamine", "DAPI"])
        full = s.read_region((0, 0), 0, (704, 704), mode="raw")
        assert np.array_equal(part, full[200:232, 100:164][..., [2, 0]])


def test_dicom_palettes_and_composite():
    path = shared_sample(DICOM)
    with wsitool.open_slide(path) as s:
        ramp = np.arange(256)
        want = {"DAPI": 2, "FITC": 1, "Rhodamine": 0}  # blue, green, red, each 0 -> 255
        for c in s.channels:
            lut = c.table()
            k = want[c.name]
            assert np.array_equal(lut[:, k], ramp), c.name
            assert not lut[:, [j for j in range(3) if j != k]].any(), c.name
        raw = s.read_region((0, 0), 0, (704, 704), mode="raw")
        rgb = s.read_region((0, 0), 0, (704, 704), mode="rgb")
        # the palettes are identity ramps: the composite is the channels as B, G, R
        assert np.array_equal(rgb, raw[..., ::-1])
        rgba = s.read_region((-8, 700), 0, (16, 16), mode="rgba")
        assert np.array_equal(rgba[..., 3] == 255, np.pad(np.ones((4, 8), bool), ((0, 12), (8, 0))))
        assert not rgba[4:, :, :3].any() and not rgba[:, :8, :3].any()
        two = s.read_region((0, 0), 0, (704, 704), mode="rgb", channels=["FITC"])
        assert np.array_equal(two[..., 1], raw[..., 1]) and not two[..., [0, 2]].any()


def test_dicom_info_json_lists_channels(capsys):
    from typer.testing import CliRunner

    from wsitool.cli import app

    res = CliRunner().invoke(app, ["info", "--json", str(shared_sample(DICOM))])
    assert res.exit_code == 0, res.output
    import json

    data = json.loads(res.output)
    assert [(c["name"], c["color"]) for c in data["channels"]] == [
        ("DAPI", [0, 0, 255]), ("FITC", [0, 255, 0]), ("Rhodamine", [255, 0, 0])]
    assert data["levels"][0]["samples"] == 3


# (the QPTIFF slide against tifffile's pages: tests/formats/test_qptiff.py)


# ------------------------------------------------------------------ batch reads and the cache


@pytest.mark.parametrize("mode", ["raw", "rgb", "rgba"])
def test_read_patches_and_cache_on_channels(mode):
    path = shared_sample(DICOM)
    locs = [(0, 0), (300, 400), (650, 650), (-20, 10)]
    with wsitool.open_slide(path) as plain, wsitool.open_slide(path, cache=64 << 20) as cached:
        for s in (plain, cached):
            for chans in (None, ["FITC", 0]):
                batches = list(s.read_patches(locs, (96, 80), batch_size=3, mode=mode, channels=chans))
                got = np.concatenate(batches)
                want = np.stack([plain.read_region(loc, 0, (96, 80), mode=mode, channels=chans)
                                 for loc in locs])
                assert got.shape == want.shape and got.dtype == want.dtype
                assert np.array_equal(got, want), (mode, chans)
        # twice through the cache: the planes are cached apart, not mixed up
        again = cached.read_region((0, 0), 0, (704, 704), mode="raw")
        assert np.array_equal(again, plain.read_region((0, 0), 0, (704, 704), mode="raw"))


def test_channel_selection_errors_and_rgb_slides_unchanged():
    path = shared_sample(DICOM)
    with wsitool.open_slide(path) as s:
        for bad in (["Cy5"], [3], [], [True], [1.5]):
            with pytest.raises(InvalidRegionError):
                s.read_region((0, 0), 0, (8, 8), mode="raw", channels=bad)
        assert s.read_region((0, 0), 0, (8, 8), mode="raw", channels=-1).shape == (8, 8, 1)
    with wsitool.open_slide(shared_sample("aperio-cmu1-small-region-jpeg.svs")) as rgb:
        assert rgb.channels == () and pyramid_levels(rgb)[0].planes is None
        with pytest.raises(InvalidRegionError, match="multi-channel"):
            rgb.read_region((0, 0), 0, (8, 8), mode="raw", channels=[0])


# ------------------------------------------------------------------ palettes and colours


def test_segmented_palette_decoder():
    # 16-bit words: discrete 1 entry (0), linear 255 entries to 255 -> the ramp
    assert expand_segments([0, 1, 0, 1, 255, 255]) == list(range(256))
    # linear rounding, then an indirect copy of the first two segments (byte offset 0)
    assert expand_segments([0, 2, 10, 20, 1, 2, 40, 2, 2, 0, 0]) == [10, 20, 30, 40, 10, 20, 30, 40]
    assert expand_segments([0, 1, 4, 1, 2, 0, 2, 1, 0, 0], word_bytes=1) == [4, 2, 0, 4]
    for bad in ([1, 3, 9], [7, 1, 0], [0, 5, 1], [0, 1, 0, 2, 1, 99, 0]):
        with pytest.raises(ValueError):
            expand_segments(bad)


class _Item(dict):
    get = dict.get


def _item(seg: dict, bits: int = 8, entries: int = 256) -> _Item:
    item = _Item()
    for colour, data in seg.items():
        item[f"{colour}PaletteColorLookupTableDescriptor"] = [entries, 0, bits]
        item[f"Segmented{colour}PaletteColorLookupTableData"] = data
    return item


def test_palette_lut_both_word_widths():
    ramp16 = np.array([0, 1, 0, 1, 255, 255], "<u2").tobytes()
    zero16 = np.array([0, 1, 0, 1, 255, 0], "<u2").tobytes()
    # 3DHISTECH: 16-bit words under an 8-bit descriptor
    lut = palette_lut(_item({"Red": zero16, "Green": ramp16, "Blue": zero16}))
    assert lut.shape == (256, 3) and np.array_equal(lut[:, 1], np.arange(256)) and not lut[:, [0, 2]].any()
    # packed 8-bit segments: [discrete 1 x 0, linear 255 -> 255]
    packed = bytes([0, 1, 0, 1, 255, 255])
    lut8 = palette_lut(_item({"Red": packed, "Green": packed, "Blue": packed}))
    assert np.array_equal(lut8[:, 2], np.arange(256))
    # 16-bit entries are reduced to their high byte
    wide = np.array([0, 1, 0, 1, 255, 65535], "<u2").tobytes()
    lut16 = palette_lut(_item({"Red": wide, "Green": wide, "Blue": wide}, bits=16))
    assert lut16[255, 0] == 255 and lut16[128, 0] == 128
    assert palette_lut(_item({"Red": b"\x07\x00", "Green": ramp16, "Blue": ramp16})) is None


def test_colours_from_wavelength_and_defaults():
    assert wavelength_color(440) == (0, 0, 255) and wavelength_color(510) == (0, 255, 0)
    assert wavelength_color(700) == (255, 0, 0) and wavelength_color(300) == (130, 0, 200)
    assert channel_color(0, 3, emission_nm=461.0) == (wavelength_color(461.0), "wavelength")
    assert channel_color(0, 3, emission_nm=0.0, excitation_nm=None) == ((0, 0, 255), "default")
    assert channel_color(2, 3) == ((255, 0, 0), "default")
    assert channel_color(0, 1) == ((255, 255, 255), "default")
    assert channel_color(9, 10) == ((255, 255, 255), "default")


def test_composite_clips_and_scales_wide_samples():
    class _Lv:
        channels = (Channel("a", color=(255, 0, 0)), Channel("b", color=(255, 128, 0)))

    raw = np.array([[[65535, 65535], [0, 32768]]], np.uint16)
    out = np.zeros((1, 2, 3), np.uint8)
    composite(raw, _Lv, out)
    assert out[0, 0].tolist() == [255, 128, 0]  # 255 + 255 clipped
    assert out[0, 1].tolist() == [127, 64, 0]
    assert to_8bit(np.array([-5, 0.5, 2.0])).tolist() == [0, 128, 255]
