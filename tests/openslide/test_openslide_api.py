"""wsitool.openslide's surface: errors, lifetime, ImageSlide / open_slide, the cache."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("wsitool.openslide")
from PIL import Image

import wsitool.openslide as ws

from helpers import repo_samples, shared_sample


def _svs():
    return str(next(p for p in repo_samples() if p.name == "sample-aperio-jpeg.svs"))


def test_formats_and_errors():
    assert ws.OpenSlide.detect_format(_svs()) == "aperio"
    assert ws.OpenSlide.detect_format("/nonexistent.svs") is None
    with pytest.raises(ws.OpenSlideUnsupportedFormatError):
        ws.OpenSlide("/nonexistent.svs")
    with pytest.raises(ws.OpenSlideUnsupportedFormatError):
        ws.OpenSlide(str(shared_sample("broken-not-a-tiff-random-ascii.svs")))
    # a corrupt tile: wsitool's TileDecodeError, mapped
    with (pytest.raises(ws.OpenSlideError),
          ws.OpenSlide(str(shared_sample("broken-aperio-unreadable-jpeg.svs"))) as s):
        s.read_region((0, 0), 0, (16, 16))
    assert issubclass(ws.OpenSlideUnsupportedFormatError, ws.OpenSlideError)


def test_lifetime_and_repr():
    s = ws.OpenSlide(_svs())
    assert repr(s) == f"OpenSlide({_svs()!r})"
    img = s.read_region((0, 0), 0, (8, 8))
    s.close()
    assert img.size == (8, 8) and np.asarray(img).shape == (8, 8, 4)  # the image outlives the slide
    for call in (lambda: s.dimensions, lambda: s.properties, lambda: s.associated_images,
                 lambda: s.read_region((0, 0), 0, (1, 1)), lambda: s.get_thumbnail((4, 4)),
                 lambda: s.get_best_level_for_downsample(2), lambda: s.color_profile, s.close):
        with pytest.raises(ws.OpenSlideError):
            call()


def test_associated_and_cache():
    with ws.OpenSlide(_svs()) as s:
        thumb = s.associated_images["thumbnail"]
        assert thumb.mode == "RGBA" and np.asarray(thumb)[..., 3].min() == 255
        assert s.properties["openslide.associated.thumbnail.width"] == str(thumb.size[0])
        cache = ws.OpenSlideCache(8 << 20)
        assert repr(cache) == "OpenSlideCache(8388608)"
        a = np.asarray(s.read_region((100, 100), 0, (300, 200)))
        s.set_cache(cache)
        b = np.asarray(s.read_region((100, 100), 0, (300, 200)))
        c = np.asarray(s.read_region((100, 100), 0, (300, 200)))
        assert (a == b).all() and (b == c).all()
        assert cache._cache.stats().hits > 0


def test_image_slide_and_open_slide(tmp_path):
    rng = np.random.default_rng(1)
    arr = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)
    png = tmp_path / "x.png"
    Image.fromarray(arr).save(png)
    s = ws.open_slide(str(png))
    assert isinstance(s, ws.ImageSlide) and ws.ImageSlide.detect_format(str(png)) == "PNG"
    assert s.level_count == 1 and s.dimensions == (40, 30) and s.level_downsamples == (1.0,)
    r = np.asarray(s.read_region((-5, -5), 0, (20, 20)))
    assert (r[:5] == 0).all() and (r[5:, 5:, :3] == arr[:15, :15]).all() and (r[5:, 5:, 3] == 255).all()
    with pytest.raises(ws.OpenSlideError):
        s.read_region((0, 0), 1, (2, 2))
    with pytest.raises(ws.OpenSlideError):
        s.read_region((0, 0), 0, (-2, 2))
    assert s.get_thumbnail((10, 10)).size == (10, 8)
    s.close()
    with pytest.raises(ValueError):
        s.read_region((0, 0), 0, (1, 1))
    assert isinstance(ws.open_slide(_svs()), ws.OpenSlide)


def test_deepzoom_on_image_slide_matches_the_real_generator():
    real_dz = pytest.importorskip("openslide.deepzoom")
    import wsitool.openslide.deepzoom as ws_dz

    rng = np.random.default_rng(2)
    im = Image.fromarray(rng.integers(0, 256, (300, 513, 3), dtype=np.uint8))
    a = real_dz.DeepZoomGenerator(__import__("openslide").ImageSlide(im), 254, 1)
    b = ws_dz.DeepZoomGenerator(ws.ImageSlide(im), 254, 1)
    assert a.level_tiles == b.level_tiles and a.get_dzi("png") == b.get_dzi("png")
    for level in (a.level_count - 1, a.level_count - 3, 0):
        for addr in ((0, 0), (a.level_tiles[level][0] - 1, a.level_tiles[level][1] - 1)):
            ta, tb = a.get_tile(level, addr), b.get_tile(level, addr)
            assert ta.size == tb.size and (np.asarray(ta) == np.asarray(tb)).all()
    assert "DeepZoomGenerator(ImageSlide(" in repr(b)
