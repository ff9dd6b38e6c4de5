"""DICOM WSI on the shared samples: every one opens (or fails as documented), OpenSlide parity.

Oracles:

* OpenSlide 4 (openslide-bin) where it opens the sample: geometry, MPP,
  objective power, associated names, and 20 seeded regions per level (edges,
  partly outside): exactly equal RGBA for JPEG frames, within 2 for JPEG 2000.
  At levels whose downsample is not an integer OpenSlide blends (fractional
  level coordinates), so those are compared with the stored level, read by
  OpenSlide at (0, 0) where its level coordinates are integers.
* The CMU-1 series says RGB but its frames carry JFIF markers (YCbCr coded).
  wsitool follows the stream's markers; OpenSlide 4.0.1 does not: it hands
  out the Y, Cb, Cr samples as R, G, B (about (243, 128, 128) on white
  background).  So this series is compared with OpenSlide's pixels passed
  through the JFIF YCbCr -> RGB transform (within 1), and with the Aperio
  slide it was converted from (same scan, re-encoded: PSNR).
* Samples OpenSlide refuses (16-bit MONOCHROME2, JPEG-LS, no ImageType):
  pydicom's own pixel handlers decode the whole frames independently of
  wsitool (numpy for native data, Pillow for JPEG), and the JPEG-LS sample is
  the lossless twin of the uncompressed RGB sample, so they must be equal.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pydicom
import pytest

import wsitool
from wsitool.errors import WsiError
from wsitool.ground.color import ycbcr_to_rgb
from wsitool.ground.geometry import level0_coordinate
from wsitool.slide import pyramid_levels

from helpers import random_regions, shared_names, shared_sample

SERIES = "dicom-cmu1-small-region-12level"
# sample -> (what OpenSlide is given, tolerance) for the ones OpenSlide opens
OPENSLIDE = {
    "dicom-camelyon-jp2k-lossless-1696x812.dcm": (None, 2),
    "dicom-google-jp2k-lossless-957x715.dcm": (None, 2),
    "dicom-google-jpeg-ybr-957x715.dcm": (None, 0),
    "dicom-highdicom-sm-rgb-uncompressed.dcm": (None, 0),
    "dicom-panimg-one-frame-no-bot.dcm": (None, 0),
    "dicom-panimg-one-frame-with-bot.dcm": (None, 0),
    "dicom-openslide-boxes": ("dicom-openslide-boxes/boxes_0.dcm", 0),
}
REFUSED_BY_OPENSLIDE = ["dicom-highdicom-sm-gray16.dcm", "dicom-highdicom-sm-jpegls.dcm",
                        "dicom-pathml-no-imagetype.dcm",
                        # OpenSlide 4: "Couldn't read PlanarConfiguration" (3 monochrome optical paths)
                        "dicom-3dhistech-fluorescence-3channel"]
ALL = sorted(OPENSLIDE) + REFUSED_BY_OPENSLIDE + [SERIES]


def _openslide():
    """openslide-python, the oracle (``test`` extra, not ``test-core``): skips the test where absent."""
    return pytest.importorskip("openslide", reason="openslide-python (the test extra) is the oracle")


def _oracle(name):
    given = OPENSLIDE[name][0] or name
    return _openslide().OpenSlide(str(shared_sample(given)))


def test_all_shared_dicom_samples_are_covered():
    # tests/shared_samples.json lists the folder (tests/test_shared_samples.py checks it)
    assert set(shared_names("dicom-")) == set(ALL)


@pytest.mark.parametrize("name", ALL)
def test_every_sample_opens_and_reads_every_level(name):
    path = shared_sample(name)
    with wsitool.open_slide(path) as slide:
        assert slide.vendor == "dicom"
        assert slide.properties["openslide.vendor"] == "dicom"
        assert int(slide.properties["openslide.level-count"]) == slide.level_count
        for lv in pyramid_levels(slide):
            arr = slide.read_region((0, 0), lv.index, (min(lv.width, 300), min(lv.height, 300)))
            assert arr.shape == (min(lv.height, 300), min(lv.width, 300), 4)
            assert (arr[..., 3] == 255).all()  # no missing tiles in these samples
        for key in slide.associated_images:
            assert slide.associated_images[key].dtype == np.uint8
        # fluorescence series are read as channels (issue 32), the others through their first path
        assert ("(first of" in slide.properties["wsitool.dicom.optical-path"]) != bool(slide.channels)


@pytest.mark.parametrize("name", [*sorted(OPENSLIDE), SERIES])
def test_geometry_mpp_and_associated_match_openslide(name):
    osr = _openslide().OpenSlide(str(shared_sample(f"{SERIES}/level-0-frames-0-30.dcm"))) \
        if name == SERIES else _oracle(name)
    with wsitool.open_slide(shared_sample(name)) as slide:
        assert slide.level_count == osr.level_count
        assert slide.level_dimensions == osr.level_dimensions
        for ours, theirs in zip(slide.level_downsamples, osr.level_downsamples, strict=True):
            assert math.isclose(ours, theirs, rel_tol=1e-12)
        for key in ("openslide.mpp-x", "openslide.mpp-y", "openslide.objective-power"):
            theirs, ours = osr.properties.get(key), slide.properties.get(key)
            assert (theirs is None) == (ours is None), key
            if theirs is not None:
                assert math.isclose(float(ours), float(theirs), rel_tol=1e-9), key
        assert set(slide.associated_images) == set(osr.associated_images)
        for key in osr.associated_images:
            theirs = np.asarray(osr.associated_images[key].convert("RGB"))
            np.testing.assert_array_equal(slide.associated_images[key], theirs)
        for lv in pyramid_levels(slide):
            p = f"openslide.level[{lv.index}]"
            assert (lv.tile_width, lv.tile_height) == (int(osr.properties[f"{p}.tile-width"]),
                                                       int(osr.properties[f"{p}.tile-height"]))


def _compare_regions(slide, osr, tolerance, transform=None):
    rng = np.random.default_rng(20261201)
    for lv in pyramid_levels(slide):
        ds = lv.downsample
        integer = ds == round(ds)
        stored = None
        if not integer:
            stored = np.asarray(osr.read_region((0, 0), lv.index, lv.dimensions))
        for x, y, w, h in random_regions(rng, lv.width, lv.height, 20, max_size=400):
            x0, y0 = level0_coordinate(x, ds), level0_coordinate(y, ds)
            ours = slide.read_region((x0, y0), lv.index, (w, h))
            if integer:
                theirs = np.asarray(osr.read_region((x0, y0), lv.index, (w, h)))
            else:
                theirs = np.zeros((h, w, 4), np.uint8)
                ys, xs, ye, xe = max(0, y), max(0, x), min(lv.height, y + h), min(lv.width, x + w)
                if ye > ys and xe > xs:
                    theirs[ys - y:ye - y, xs - x:xe - x] = stored[ys:ye, xs:xe]
            if transform is not None:
                theirs = transform(theirs)
            diff = np.abs(ours.astype(int) - theirs.astype(int)).max() if ours.size else 0
            assert diff <= tolerance, (lv.index, x, y, w, h, diff)


@pytest.mark.parametrize("name", sorted(OPENSLIDE))
def test_regions_match_openslide(name):
    osr = _oracle(name)
    with wsitool.open_slide(shared_sample(name)) as slide:
        _compare_regions(slide, osr, OPENSLIDE[name][1])


def test_cmu1_series_follows_the_jfif_marker_where_openslide_does_not():
    osr = _openslide().OpenSlide(str(shared_sample(f"{SERIES}/level-0-frames-0-30.dcm")))

    def jfif_to_rgb(rgba):
        out = rgba.copy()
        out[..., :3] = ycbcr_to_rgb(np.ascontiguousarray(rgba[..., :3]))
        return np.where(rgba[..., 3:] == 0, 0, out).astype(np.uint8)

    with wsitool.open_slide(shared_sample(SERIES)) as slide:
        _compare_regions(slide, osr, 1, transform=jfif_to_rgb)
        ours = slide.read_region((0, 0), 0, slide.dimensions, mode="rgb").astype(float)
    with wsitool.open_slide(shared_sample("aperio-cmu1-small-region-jpeg.svs")) as svs:
        ref = svs.read_region((0, 0), 0, svs.dimensions, mode="rgb").astype(float)
    def psnr(a, b):
        return 10 * np.log10(255.0 ** 2 / np.mean((a - b) ** 2))

    as_openslide = np.asarray(osr.read_region((0, 0), 0, osr.dimensions))[..., :3].astype(float)
    assert psnr(ours, ref) > 30  # the same scan, re-encoded by the converter
    assert psnr(as_openslide, ref) < 15  # Y, Cb, Cr shown as R, G, B


def _pydicom_frames(path):
    """Every frame decoded by pydicom's own handlers, as ``(frames, rows, cols, samples)``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = pydicom.dcmread(path)
        arr = ds.pixel_array  # YBR in JPEG is converted to RGB by pydicom
    if arr.ndim == 2 or (ds.SamplesPerPixel == 1 and arr.ndim == 3 and int(ds.NumberOfFrames) > 1):
        arr = arr[..., None]
    if int(ds.get("NumberOfFrames", 1)) == 1:
        arr = arr[None]
    return ds, arr


def _assemble(ds, frames):
    rows, cols = int(ds.Rows), int(ds.Columns)
    w, h = int(ds.TotalPixelMatrixColumns), int(ds.TotalPixelMatrixRows)
    across = -(-w // cols)
    out = np.zeros((-(-h // rows) * rows, across * cols, frames.shape[-1]), frames.dtype)
    for k in range(across * -(-h // rows)):
        r, c = divmod(k, across)
        out[r * rows:(r + 1) * rows, c * cols:(c + 1) * cols] = frames[k]
    return out[:h, :w]


@pytest.mark.parametrize("name", ["dicom-highdicom-sm-gray16.dcm", "dicom-highdicom-sm-rgb-uncompressed.dcm"])
def test_native_samples_equal_pydicom(name):
    path = shared_sample(name)
    ds, frames = _pydicom_frames(path)
    ref = _assemble(ds, frames)
    with wsitool.open_slide(path) as slide:
        raw = slide.read_region((0, 0), 0, slide.dimensions, mode="raw")
        assert raw.dtype == ref.dtype
        np.testing.assert_array_equal(raw, ref)
        if ds.BitsAllocated == 16:  # rgb: linear scaling of the stored bits, grey replicated
            rgb = slide.read_region((0, 0), 0, slide.dimensions, mode="rgb")
            scaled = np.rint(ref[..., 0] * (255.0 / (2 ** int(ds.BitsStored) - 1)))
            np.testing.assert_array_equal(rgb[..., 1], scaled.astype(np.uint8))


def test_jpegls_sample_is_the_lossless_twin_of_the_uncompressed_one():
    with wsitool.open_slide(shared_sample("dicom-highdicom-sm-jpegls.dcm")) as ls, \
            wsitool.open_slide(shared_sample("dicom-highdicom-sm-rgb-uncompressed.dcm")) as raw:
        assert pyramid_levels(ls)[0].compression == "JPEGLS" and pyramid_levels(ls)[0].decoder == "imagecodecs"
        np.testing.assert_array_equal(ls.read_region((-3, -3), 0, (60, 60)),
                                      raw.read_region((-3, -3), 0, (60, 60)))


def test_sample_without_image_type_equals_pydicom_pillow_decode():
    path = shared_sample("dicom-pathml-no-imagetype.dcm")
    pytest.importorskip("PIL")
    ds, frames = _pydicom_frames(path)
    ref = _assemble(ds, frames)
    with wsitool.open_slide(path) as slide:
        assert slide.properties["wsitool.dicom.image-type"].startswith("(none")
        ours = slide.read_region((0, 0), 0, slide.dimensions, mode="rgb")
    # Pillow and nvImageCodec both decode with libjpeg(-turbo) but not the same build:
    # IDCT / upsampling rounding may differ by a little
    assert np.abs(ours.astype(int) - ref.astype(int)).max() <= 3
    assert np.mean(ours.astype(int) - ref.astype(int)) == pytest.approx(0, abs=0.1)


def test_file_of_a_series_opens_the_series_and_close_closes_every_source():
    name = f"{SERIES}/level-3-frames-0-1.dcm"
    slide = wsitool.open_slide(shared_sample(name))
    assert slide.level_count == 12 and slide.dimensions == (2220, 2967)
    sources = {id(lv.source): lv.source for lv in pyramid_levels(slide)}
    assert len(sources) == 12
    slide.close()
    assert slide.closed and all(src.closed for src in sources.values())
    with pytest.raises(WsiError, match="closed"):
        slide.read_region((0, 0), 0, (8, 8))
    folder = wsitool.open_slide(shared_sample(SERIES))
    levels = pyramid_levels(folder)
    folder.close()
    assert all(lv.source.closed for lv in levels)


def test_opening_a_series_is_fast():
    import time

    path = shared_sample(SERIES)
    wsitool.open_slide(path).close()
    t = time.perf_counter()
    for _ in range(3):
        wsitool.open_slide(path).close()
    assert (time.perf_counter() - t) / 3 < 0.5


def test_phi_keys_are_marked():
    from wsitool.formats import dicom

    with wsitool.open_slide(shared_sample("dicom-openslide-boxes")) as slide:
        keys = set(slide.properties)
    assert "dicom.PatientID" in keys and dicom.is_phi("dicom.PatientID")
    assert dicom.is_phi("dicom.SpecimenDescriptionSequence[0].SpecimenIdentifier")
    assert not dicom.is_phi("dicom.Manufacturer") and not dicom.is_phi("openslide.mpp-x")
    assert "PatientName" in dicom.PHI_KEYWORDS


def test_icc_profile_of_the_optical_path_as_openslide_reads_it():
    """ICC Profile (0028,2000) of the first Optical Path Sequence item: the slide's
    color_profile, with the size OpenSlide 4 reports (openslide.icc-size)."""
    openslide = pytest.importorskip("openslide")
    folder = shared_sample("dicom-openslide-boxes")
    first = sorted(folder.glob("*.dcm"))[0]
    with wsitool.open_slide(folder) as s, openslide.OpenSlide(str(first)) as o:
        assert s.color_profile is not None
        assert s.properties["openslide.icc-size"] == o.properties["openslide.icc-size"] == str(len(s.color_profile))
        assert s.color_profile[36:40] == b"acsp"  # an ICC profile header (ICC.1 7.2.9)


def test_an_icc_profile_that_cannot_be_one_is_ignored():
    """The same rule as TIFF's tag 34675 (wsitool.ground.color.icc_bytes): data shorter than the
    ICC header, or a declared size past the data, is no profile."""
    pydicom = pytest.importorskip("pydicom")
    from wsitool.formats.dicom.properties import icc_profile_of

    def with_icc(data: bytes):
        ds = pydicom.Dataset()
        item = pydicom.Dataset()
        item.ICCProfile = data
        ds.OpticalPathSequence = [item]
        return ds

    good = (200).to_bytes(4, "big") + bytes(196)
    assert icc_profile_of(with_icc(good)) == good
    assert icc_profile_of(with_icc(good[:100])) is None  # shorter than the header
    assert icc_profile_of(with_icc((4000).to_bytes(4, "big") + bytes(196))) is None  # size past the data
    assert icc_profile_of(pydicom.Dataset()) is None
