"""Slide model: levels, metadata and associated images against OpenSlide on real files."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import wsitool
from wsitool import CorruptFileError, UnsupportedFormatError, WsiError
from wsitool.slide import pyramid_levels

from helpers import SHARED_SAMPLES, openslide_samples, repo_samples, shared_sample

openslide = pytest.importorskip("openslide", reason="openslide-python is the test oracle")


# The files OpenSlide opens and those it rejects, as tests/region_hashes.json records them
# (nothing is opened at import).  OpenSlide has no OME-TIFF support: it opens an OME pyramid's
# base image as a one-level generic TIFF and ignores its SubIFD levels, so it is no oracle there.
ORACLE_FILES = [
    p for p in openslide_samples() + openslide_samples("unread") + repo_samples()
    if ".ome." not in p.name
]
NON_ORACLE_FILES = openslide_samples("rejected")


def test_shared_samples_present_or_skipped():
    if not SHARED_SAMPLES.is_dir():
        pytest.skip(f"real slides folder {SHARED_SAMPLES} is absent")
    # the oracle set must not be empty when the folder exists: it holds Aperio and generic TIFFs
    assert len(ORACLE_FILES) >= 8


@pytest.mark.parametrize("path", ORACLE_FILES, ids=lambda p: p.name)
def test_geometry_and_mpp_match_openslide(path):
    osr = openslide.OpenSlide(str(path))
    with wsitool.open_slide(path) as slide:
        assert slide.level_count == osr.level_count
        assert slide.level_dimensions == osr.level_dimensions
        for ours, theirs in zip(slide.level_downsamples, osr.level_downsamples, strict=True):
            assert math.isclose(ours, theirs, rel_tol=1e-9)
        for key in ("openslide.mpp-x", "openslide.mpp-y", "openslide.objective-power"):
            theirs = osr.properties.get(key)
            ours = slide.properties.get(key)
            if theirs is None:
                assert ours is None or osr.properties.get("openslide.vendor") == "generic-tiff"
            else:
                assert ours is not None, key
                assert math.isclose(float(ours), float(theirs), rel_tol=1e-9), key
        if osr.properties["openslide.vendor"] == "aperio":
            assert slide.vendor == "aperio"
            assert set(slide.associated_images) == set(osr.associated_images)
        for d in (0.5, 1.0, 1.5, 2.0, 2.01, 3.9, 4.0, 4.02, 8.0, 9.0, 16.5, 100.0):
            assert slide.get_best_level_for_downsample(d) == osr.get_best_level_for_downsample(d), d
        for lv in slide.levels:
            p = f"openslide.level[{lv.index}]"
            assert int(slide.properties[f"{p}.width"]) == lv.width
            assert (lv.tile_width, lv.tile_height) == (
                int(osr.properties.get(f"{p}.tile-width", lv.tile_width)),
                int(osr.properties.get(f"{p}.tile-height", lv.tile_height)),
            )


# (the Aperio rules and slides: tests/formats/test_aperio.py)


@pytest.mark.parametrize("path", NON_ORACLE_FILES, ids=lambda p: p.name)
def test_files_openslide_rejects_give_clear_result(path):
    """Either a clean wsitool error naming the file, or a slide whose reads work or fail cleanly."""
    try:
        slide = wsitool.open_slide(path)
    except WsiError as exc:
        assert str(path) in str(exc)
        return
    with slide:
        for lv in slide.levels:
            try:
                arr = slide.read_region((0, 0), lv.index, (min(lv.width, 64), min(lv.height, 64)))
            except WsiError as exc:
                assert str(path) in str(exc)
            else:
                assert arr.shape == (min(lv.height, 64), min(lv.width, 64), 4)


@pytest.mark.parametrize(
    "name,error",
    [
        ("broken-not-a-tiff-random-ascii.svs", UnsupportedFormatError),
        ("broken-tiff-bad-version.tif", UnsupportedFormatError),
        ("broken-bigtiff-bad-header.tif", CorruptFileError),
        ("broken-zero-height.tif", CorruptFileError),
    ],
)
def test_bad_files_raise_documented_errors(name, error):
    path = shared_sample(name)
    with pytest.raises(error) as info:
        wsitool.open_slide(path)
    assert str(path) in str(info.value)


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        wsitool.open_slide(tmp_path / "nope.svs")


def test_truncated_file_gives_wsi_error_or_correct_pixels(cmu1, tmp_path):
    """A truncated copy either fails with a WsiError naming it, or whatever it
    still holds reads back exactly like the original (CMU-1 stores its tiles
    before its IFDs, so cutting only the tail loses the associated images)."""
    data = cmu1.read_bytes()
    with wsitool.open_slide(cmu1) as good:
        w, h = good.dimensions
        reference = good.read_region((0, 0), 0, (w, h), mode="rgb")
    errors = 0
    for frac in (0.02, 0.3, 0.5, 0.66, 0.9, 0.999):
        bad = tmp_path / f"trunc-{frac}.svs"
        bad.write_bytes(data[: int(len(data) * frac)])
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                slide = wsitool.open_slide(bad)
        except WsiError as exc:
            assert str(bad) in str(exc)
            errors += 1
            continue
        with slide:
            try:
                arr = slide.read_region((0, 0), 0, (w, h), mode="rgb")
            except WsiError as exc:
                assert str(bad) in str(exc)
                errors += 1
            else:
                assert np.array_equal(arr, reference)
            for name in slide.associated_images:
                try:
                    slide.associated_images[name]
                except WsiError as exc:
                    assert str(bad) in str(exc)
    assert errors >= 2


def test_level_detection_rule_on_repo_samples():
    samples = {p.name: p for p in repo_samples()}
    with wsitool.open_slide(samples["sample-ome-pyramid.ome.tif"]) as s:
        # OME pyramid whose lower levels are only reachable through SubIFDs
        assert s.vendor == "ome-tiff"
        assert s.level_count == 3
        assert s.mpp == (0.25, 0.25)
        assert [round(d) for d in s.level_downsamples] == [1, 2, 4]
    with wsitool.open_slide(samples["sample-aperio-jpeg.svs"]) as s:
        # the stripped thumbnail has the slide's aspect ratio but is not a level
        assert s.level_count == 3
        assert "thumbnail" in s.associated_images
        assert s.associated_images["thumbnail"].shape[2] == 3


def test_closed_slide_refuses_reads(sample_jpeg):
    slide = wsitool.open_slide(sample_jpeg)
    slide.close()
    assert slide.closed
    with pytest.raises(WsiError):
        slide.read_region((0, 0), 0, (10, 10))


def test_level_rule_keeps_small_levels_of_elongated_images(tmp_path):
    """Small levels of an elongated pyramid (2000 x 300 halved down to 16 x 3) are
    levels; a square overview next to a 4:3 pyramid is not."""
    import tifffile

    from wsitool.formats.tiff.levels import same_aspect

    path = tmp_path / "long.tif"
    sizes = [(2000, 300)]
    while sizes[-1][0] > 16:
        w, h = sizes[-1]
        sizes.append(((w + 1) // 2, (h + 1) // 2))
    with tifffile.TiffWriter(path) as tw:
        for i, (w, h) in enumerate(sizes):
            tw.write(np.full((h, w, 3), 200, np.uint8), tile=(16, 16), photometric="rgb",
                     subfiletype=1 if i else 0, compression="zlib")
    with wsitool.open_slide(path) as slide:
        assert slide.level_dimensions == tuple(sizes)
    assert same_aspect(2000, 300, 16, 3)
    assert not same_aspect(1024, 768, 200, 200)
    assert same_aspect(1024, 768, 256, 192) and same_aspect(205, 205, 102, 102)


@pytest.mark.parametrize("path", repo_samples(), ids=lambda p: p.name)
def test_closed_slide_is_freed_without_the_cyclic_collector(path):
    """A slide, its levels and their tile tables go as soon as the last reference does:
    the associated-image mapping used to hold the slide, a cycle that kept all of it
    (about 0.7 KiB of tile tables per open of a small slide, megabytes for a large one)
    until a full garbage collection."""
    import gc
    import weakref

    gc.collect()
    gc.disable()
    try:
        slide = wsitool.open_slide(path)
        for name in slide.associated_images:
            assert slide.associated_images[name].size
        slide.read_region((0, 0), 0, (16, 16))
        refs = [weakref.ref(slide), weakref.ref(slide.levels[0]), weakref.ref(slide.associated_images),
                weakref.ref(pyramid_levels(slide)[0])]
        slide.close()
        del slide
        assert [r() for r in refs] == [None, None, None, None]
    finally:
        gc.enable()
