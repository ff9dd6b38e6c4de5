"""ICC profiles: Slide.color_profile, read_region(color="icc") against Pillow's ImageCms (the oracle)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import tifffile

import wsitool
from wsitool.read.icc import IccTransform, profile_description

pytest.importorskip("imagecodecs")
pytest.importorskip("PIL.ImageCms")
import imagecodecs
from PIL import Image, ImageCms


def adobe_rgb_profile() -> bytes:
    """An RGB profile with Adobe RGB (1998) primaries: D65 white, R (0.64, 0.33),
    G (0.21, 0.71), B (0.15, 0.06), gamma 563/256 (Adobe RGB (1998) spec, 4.3.1.2)."""
    return bytes(imagecodecs.cms_profile(
        "rgb", whitepoint=(0.3127, 0.3290, 1.0),
        primaries=(0.64, 0.33, 1.0, 0.21, 0.71, 1.0, 0.15, 0.06, 1.0), gamma=563 / 256))


def _pixels(h=96, w=128) -> np.ndarray:
    rng = np.random.default_rng(7)
    img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    img[:8] = (0, 200, 0)  # a saturated green: far outside sRGB's gamut in Adobe RGB
    return img


@pytest.fixture(scope="module")
def icc_slide(tmp_path_factory):
    path = tmp_path_factory.mktemp("icc") / "adobe.tif"
    img = _pixels()
    profile = adobe_rgb_profile()
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(32, 32), photometric="rgb", compression="zlib", iccprofile=profile,
                  subfiletype=0)
        tif.write(img[::2, ::2].copy(), tile=(32, 32), photometric="rgb", compression="zlib",
                  subfiletype=1)
    return path, img, profile


def _pillow_srgb(img: np.ndarray, profile: bytes) -> np.ndarray:
    src = ImageCms.ImageCmsProfile(io.BytesIO(profile))
    transform = ImageCms.buildTransform(src, ImageCms.createProfile("sRGB"), "RGB", "RGB")
    return np.asarray(ImageCms.applyTransform(Image.fromarray(img), transform))


def test_profile_is_read_and_converted_like_pillow(icc_slide):
    path, img, profile = icc_slide
    with wsitool.open_slide(path) as slide:
        assert slide.color_profile == profile
        assert slide.properties["openslide.icc-size"] == str(len(profile))
        plain = slide.read_region((0, 0), 0, (128, 96), mode="rgb")
        assert (plain == img).all()  # without color="icc": untouched
        conv = slide.read_region((0, 0), 0, (128, 96), mode="rgb", color="icc")
        oracle = _pillow_srgb(img, profile)
        assert np.abs(conv.astype(int) - oracle).max() <= 1
        assert np.abs(conv.astype(int) - img).mean() > 5  # visibly different
        rgba = slide.read_region((-10, -10), 0, (60, 40), color="icc")  # RGBA, partly outside
        assert (rgba[:10, :, :] == 0).all() and (rgba[10:, 10:, 3] == 255).all()
        assert np.abs(rgba[10:, 10:, :3].astype(int) - oracle[:30, :50]).max() <= 1
        # level 1 has no profile of its own: the slide's profile applies to every level
        lvl1 = slide.read_region((0, 0), 1, (64, 48), mode="rgb", color="icc")
        assert np.abs(lvl1.astype(int) - _pillow_srgb(img[::2, ::2].copy(), profile)).max() <= 1


def test_color_argument_checks(icc_slide):
    path, _, _ = icc_slide
    with wsitool.open_slide(path) as slide:
        with pytest.raises(wsitool.InvalidRegionError):
            slide.read_region((0, 0), 0, (8, 8), color="srgb")
        with pytest.raises(wsitool.InvalidRegionError):
            slide.read_region((0, 0), 0, (8, 8), mode="raw", color="icc")


def test_slide_without_profile_is_untouched(repo_sample_path=None):
    from helpers import repo_samples

    path = next(p for p in repo_samples() if p.suffix == ".svs")
    with wsitool.open_slide(path) as slide:
        assert slide.color_profile is None
        a = slide.read_region((0, 0), 0, (64, 64))
        assert (slide.read_region((0, 0), 0, (64, 64), color="icc") == a).all()


def test_description_matches_pillow(icc_slide):
    _, _, profile = icc_slide
    assert profile_description(profile) == ImageCms.getProfileDescription(
        ImageCms.ImageCmsProfile(io.BytesIO(profile))).strip()
    srgb = bytes(imagecodecs.cms_profile("srgb"))
    assert profile_description(srgb) == ImageCms.getProfileDescription(
        ImageCms.ImageCmsProfile(io.BytesIO(srgb))).strip()
    assert profile_description(None) is None and profile_description(b"x" * 10) is None


def test_bad_profile_is_refused():
    with pytest.raises(wsitool.UnsupportedFormatError):
        IccTransform(b"\0" * 200)


def test_openslide_oracle_reads_the_same_profile(icc_slide):
    real = pytest.importorskip("openslide")
    import wsitool.openslide as ws

    path, _, profile = icc_slide
    o, w = real.OpenSlide(str(path)), ws.OpenSlide(str(path))
    assert o.color_profile.tobytes() == w.color_profile.tobytes() == profile
    assert w.read_region((0, 0), 0, (4, 4)).info["icc_profile"] == profile
    assert w.get_thumbnail((16, 16)).info["icc_profile"] == profile


def test_shared_samples_profiles_match_openslide():
    real = pytest.importorskip("openslide")
    from helpers import shared_sample

    for name in ("aperio-tcga-cr-7395-jp2k-33005-2level.svs", "generic-boxes-deflate-4level.tiff"):
        path = str(shared_sample(name))
        o = real.OpenSlide(path)
        with wsitool.open_slide(path) as slide:
            assert slide.color_profile == o.color_profile.tobytes()
            for assoc in o.associated_images:
                assert slide.associated_color_profile(assoc) == o.associated_images[assoc].info.get(
                    "icc_profile")


@pytest.mark.parametrize("fmt", ["tiff", "ome-tiff"])
def test_export_carries_the_profile(icc_slide, tmp_path, fmt):
    path, _, profile = icc_slide
    out = tmp_path / ("out.ome.tif" if fmt == "ome-tiff" else "out.tif")
    wsitool.export_pyramid(path, out, format=fmt, tile_size=32)
    with wsitool.open_slide(out) as slide:
        assert slide.color_profile == profile


@pytest.mark.parametrize("fmt", ["tiff", "ome-tiff"])
def test_copy_export_carries_the_profile(icc_slide, tmp_path, fmt):
    """compression="copy" writes its own pages: the profile goes there too (it did not)."""
    path, _, profile = icc_slide
    out = tmp_path / ("copy.ome.tif" if fmt == "ome-tiff" else "copy.tif")
    wsitool.export_pyramid(path, out, format=fmt, compression="copy")
    with wsitool.open_slide(out) as slide:
        assert slide.color_profile == profile
