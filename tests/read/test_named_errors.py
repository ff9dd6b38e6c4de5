"""The slide is named once, at the edge (issue 48 item 5).

The region layer (``wsitool.read``) raises without the slide's path; the facade
(``Slide.read_region`` / ``read_patches``, also while iterating its batches) and the callers
beyond it that use the layer directly (export, stress, the regions CSV, image writing) attach
the name (:mod:`wsitool.ground.naming`): each message starts with the file, named once.
"""

from __future__ import annotations

import numpy as np
import pytest

import wsitool
from tests.helpers import shared_sample
from wsitool.errors import InvalidOptionError, InvalidRegionError, TileDecodeError, WsiError
from wsitool.read.patches import check_patch_request
from wsitool.read.request import region_request, validate_request
from wsitool.slide import pyramid_levels


@pytest.fixture(scope="module")
def cmu1():
    return shared_sample("aperio-cmu1-small-region-jpeg.svs")


@pytest.fixture(scope="module")
def broken():
    return shared_sample("broken-aperio-unreadable-jpeg.svs")


def _named_once(err: BaseException, name: str) -> None:
    text = str(err)
    assert text.startswith(f"{name}: ") and text.count(name) == 1, text
    assert "\n" not in text


def test_the_read_layer_raises_without_the_path(cmu1):
    with wsitool.open_slide(cmu1) as slide:
        levels = pyramid_levels(slide)
        with pytest.raises(InvalidRegionError) as info:
            region_request(levels, (0, 0), 9, (16, 16))
        assert str(info.value).startswith("level 9 out of range") and info.value.subject is None
        with pytest.raises(InvalidRegionError) as info:
            validate_request(levels, (0, 0), 0, (0, 16), "rgb")
        assert str(info.value) == "size must be positive, got 0x16"
        with pytest.raises(InvalidRegionError) as info:
            check_patch_request(levels, [(0, 0)], (16, 16), batch_size=0)
        assert str(info.value) == "batch_size must be >= 1, got 0"
        assert "aperio" not in str(info.value)


@pytest.mark.parametrize("kwargs, words", [
    (dict(level=9), "level 9 out of range"),
    (dict(size=(0, 4)), "size must be positive"),
    (dict(threads=0), "threads must be >= 1"),
    (dict(mode="cmyk"), "mode must be one of"),
    (dict(channels=0), "channels= applies to multi-channel slides"),
    (dict(downsample=3), "downsample must be one of"),
])
def test_a_bad_region_request_names_the_slide_once(cmu1, kwargs, words):
    args = dict(location=(0, 0), level=0, size=(16, 16)) | kwargs
    with wsitool.open_slide(cmu1) as slide:
        with pytest.raises(InvalidRegionError, match=words) as info:
            slide.read_region(**args)
        _named_once(info.value, slide.path)
        assert info.value.subject == slide.path


def test_a_bad_patch_request_names_the_slide_once(cmu1):
    with wsitool.open_slide(cmu1) as slide:
        with pytest.raises(InvalidRegionError, match="locations must be") as info:
            slide.read_patches([(0.5, 0)], (16, 16))
        _named_once(info.value, slide.path)


def test_an_error_raised_while_iterating_patches_names_the_slide_once(cmu1, broken):
    with wsitool.open_slide(cmu1) as slide:
        batches = slide.read_patches([(0, 0)] * 4, (64, 64), batch_size=1)
        next(batches)
        slide.close()
        with pytest.raises(WsiError, match="slide is closed") as info:
            next(batches)
        _named_once(info.value, slide.path)
    with wsitool.open_slide(broken) as slide:
        batches = slide.read_patches([(0, 0), (0, 0)], (16, 16), batch_size=1, on_error="raise")
        with pytest.raises(TileDecodeError) as info:
            next(batches)
        _named_once(info.value, slide.path)


def test_a_corrupt_tile_names_the_slide_once(broken):
    with wsitool.open_slide(broken) as slide:
        with pytest.raises(TileDecodeError) as info:
            slide.read_region((0, 0), 0, (16, 16), on_error="raise")
        _named_once(info.value, slide.path)
        assert (info.value.level, info.value.col, info.value.row) == (0, 0, 0)


def test_callers_beyond_the_facade_name_the_file_once(cmu1, tmp_path):
    from wsitool.distributed.regions_csv import load_regions_csv
    from wsitool.export import export_pyramid, write_image
    from wsitool.opening import parse_location
    from wsitool.stress.config import probe_slide

    with pytest.raises(InvalidRegionError, match="level 7 out of range") as info:
        export_pyramid(cmu1, tmp_path / "x.tif", level=7)
    _named_once(info.value, str(cmu1))
    with pytest.raises(InvalidRegionError, match="tile grid") as info:
        export_pyramid(cmu1, tmp_path / "x.tif", compression="copy", region=(100, 0, 512, 512))
    _named_once(info.value, str(cmu1))
    location = parse_location(cmu1)
    with pytest.raises(InvalidRegionError, match="level 5 out of range") as info:
        probe_slide(location, "0,5", "rgb")
    _named_once(info.value, location.shown)
    csv = tmp_path / "regions.csv"
    csv.write_bytes(b"x,y,level,width,height\n\xff,0,0,1,1\n")
    with pytest.raises(InvalidRegionError, match="line 2: the regions file is not UTF-8") as info:
        load_regions_csv(csv)
    _named_once(info.value, str(csv))
    out = tmp_path / "r.jpg"
    with pytest.raises(InvalidOptionError, match="JPEG holds 8-bit samples") as info:
        write_image(out, np.zeros((4, 4, 3), np.uint16))
    _named_once(info.value, str(out))
    assert not out.exists()
