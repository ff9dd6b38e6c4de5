"""The same OpenSlide code against openslide-python (the oracle) and wsitool.openslide.

Every shared slide (and repo sample) that both open as the same format is
compared: properties both have, level geometry, read_region RGBA pixels,
associated images, thumbnails, and Deep Zoom tiles from the real generator fed a
wsitool slide and from wsitool's own generator.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openslide")
pytest.importorskip("openslide.deepzoom")

import openslide as real
import openslide.deepzoom as real_dz

import wsitool.openslide as ws
import wsitool.openslide.deepzoom as ws_dz

from helpers import SHARED_SAMPLES, openslide_pair, openslide_samples, repo_samples

# The files OpenSlide opens, as tests/region_hashes.json records them (nothing is opened at
# import), OME-TIFF aside (OpenSlide sees a generic TIFF there, wsitool.openslide an OME one);
# the `pair` fixture skips one that wsitool.openslide detects as another format.
SLIDES = [p for p in openslide_samples() + repo_samples() if not p.name.startswith("broken-") and ".ome." not in p.name]
IDS = [p.name for p in SLIDES]


def _reoriented_by_openslide(path: Path) -> bool:
    """OpenSlide reads JPEG tiles of an IFD with Orientation 6 through libtiff's RGBA
    interface, which turns each tile's content (its output differs from the stored
    pixels that tifffile returns); wsitool returns the stored pixels, as tifffile."""
    import tifffile

    with tifffile.TiffFile(path) as tif:
        tag = tif.pages[0].tags.get(274)
        try:
            return tag is not None and int(tag.value) not in (0, 1)
        except (TypeError, ValueError):
            return False


def _tolerance(path: Path) -> int:
    """Max per-sample difference allowed where both read the same stored pixels."""
    name = path.name.lower()
    return 2 if ("j2k" in name or "jp2k" in name) else 0


@pytest.fixture(params=SLIDES, ids=IDS)
def pair(request):
    with openslide_pair(request.param) as (o, w):
        yield request.param, o, w


def test_some_slides_are_compared():
    if not SHARED_SAMPLES.is_dir():
        pytest.skip(f"real slides folder {SHARED_SAMPLES} is absent (set WSITOOL_SHARED)")
    assert len(SLIDES) >= 5, IDS


def _num(v):
    try:
        return float(v)
    except ValueError:
        return None


def test_properties_both_have(pair):
    _, o, w = pair
    common = set(o.properties) & set(w.properties)
    assert {"openslide.vendor", "openslide.level-count", "openslide.level[0].width"} <= common
    for key in sorted(common):
        a, b = o.properties[key], w.properties[key]
        assert isinstance(b, str)
        if a != b:
            fa, fb = _num(a), _num(b)
            assert fa is not None and fb is not None and math.isclose(fa, fb, rel_tol=1e-6), (key, a, b)
    for key in ("openslide.comment", "openslide.mpp-x", "openslide.icc-size", "openslide.quickhash-1"):
        assert (key in o.properties) == (key in w.properties), key


def test_level_geometry(pair):
    _, o, w = pair
    assert w.level_count == o.level_count
    assert w.dimensions == o.dimensions
    assert w.level_dimensions == o.level_dimensions
    assert w.level_downsamples == pytest.approx(o.level_downsamples, rel=1e-12)
    for d in (0.5, 1, 1.5, 2, 3.99, 4, 4.5, 8, 17, 1e6):
        assert w.get_best_level_for_downsample(d) == o.get_best_level_for_downsample(d)
    assert repr(w) == repr(o)
    assert set(w.associated_images) == set(o.associated_images)


def _diff(a, b) -> np.ndarray:
    return np.abs(np.asarray(a).astype(int) - np.asarray(b).astype(int))


def _regions(dims, ds):
    """Regions whose level position is an integer (OpenSlide does not blend there)."""
    w, h = dims
    out = [((0, 0), (min(w, 700), min(h, 700)))]
    if float(ds).is_integer():
        d = int(ds)
        out.append(((-7 * d, -5 * d), (40, 30)))  # before the origin
        out.append(((d * (w // 3), d * (h // 3)), (min(300, w), min(200, h))))
        out.append(((d * (w - 50), d * (h - 20)), (100, 60)))  # past the edge
    return out


def test_read_region_pixels(pair):
    path, o, w = pair
    tol = _tolerance(path)
    if _reoriented_by_openslide(path):
        import tifffile

        stored = tifffile.imread(path, key=0)
        got = np.asarray(w.read_region((0, 0), 0, w.dimensions))
        assert (got[..., 0] == stored).all() and (got[..., 3] == 255).all()
        pytest.skip("OpenSlide turns the tiles of an Orientation-6 IFD (see _reoriented_by_openslide)")
    for level in range(o.level_count):
        for loc, size in _regions(o.level_dimensions[level], o.level_downsamples[level]):
            a, b = o.read_region(loc, level, size), w.read_region(loc, level, size)
            assert b.mode == "RGBA" and b.size == a.size
            d = _diff(a, b)
            assert d.max() <= tol, (level, loc, size, d.max())
            assert ("icc_profile" in b.info) == ("icc_profile" in a.info)
            if "icc_profile" in a.info:
                assert b.info["icc_profile"] == a.info["icc_profile"]


def test_associated_images(pair):
    path, o, w = pair
    for name in o.associated_images:
        a, b = o.associated_images[name], w.associated_images[name]
        assert b.mode == "RGBA" and b.size == a.size, name
        assert _diff(a, b).max() <= _tolerance(path), name
        assert b.info.get("icc_profile") == a.info.get("icc_profile"), name


def test_thumbnail_and_profile(pair):
    _, o, w = pair
    for size in ((100, 100), (256, 64)):
        ta, tb = o.get_thumbnail(size), w.get_thumbnail(size)
        assert tb.mode == "RGB" and tb.size == ta.size
    if o.color_profile is None:
        assert w.color_profile is None
    else:
        assert w.color_profile.tobytes() == o.color_profile.tobytes()


def _addresses(cols, rows):
    cs = sorted({0, 1, cols // 2, cols - 1} & set(range(cols)))
    rs = sorted({0, 1, rows // 2, rows - 1} & set(range(rows)))
    return [(c, r) for c in cs for r in rs]


@pytest.mark.parametrize("tile,overlap", [(254, 1), (256, 0)])
def test_deepzoom_tiles(pair, tile, overlap):
    path, o, w = pair
    tol = _tolerance(path)
    if _reoriented_by_openslide(path):
        pytest.skip("OpenSlide turns the tiles of an Orientation-6 IFD (see _reoriented_by_openslide)")
    oracle = real_dz.DeepZoomGenerator(o, tile, overlap)
    ours = ws_dz.DeepZoomGenerator(w, tile, overlap)
    oracle_tiles: dict = {}  # (level, addr) -> OpenSlide's tile (decoded once for both generators)
    real_tiles: dict = {}  # (level, addr) -> the real generator's tile of the same slide
    for gen in (real_dz.DeepZoomGenerator(w, tile, overlap), ours):
        assert gen.level_count == oracle.level_count
        assert gen.level_tiles == oracle.level_tiles
        assert gen.level_dimensions == oracle.level_dimensions
        assert gen.tile_count == oracle.tile_count
        assert gen.get_dzi("jpeg") == oracle.get_dzi("jpeg")
        for level in range(oracle.level_count):
            for addr in _addresses(*oracle.level_tiles[level]):
                coords = oracle.get_tile_coordinates(level, addr)
                assert gen.get_tile_coordinates(level, addr) == coords
                assert gen.get_tile_dimensions(level, addr) == oracle.get_tile_dimensions(level, addr)
                if (level, addr) not in oracle_tiles:
                    oracle_tiles[level, addr] = oracle.get_tile(level, addr)
                a, b = oracle_tiles[level, addr], gen.get_tile(level, addr)
                if gen is not ours:
                    real_tiles[level, addr] = b
                assert b.mode == "RGB" and b.size == a.size, (level, addr)
                d = _diff(a, b)
                # both generators read through the drop-in's rule (OpenSlide's sub-pixel blend
                # at fractional level positions, wsitool.deepzoom.subpixel): OpenSlide's tiles
                assert d.max() <= tol, (type(gen).__module__, level, addr, coords, d.max())
                if gen is ours:  # same slide: the two generators' tiles are identical
                    assert _diff(real_tiles[level, addr], b).max() == 0, (level, addr)


def test_errors_and_lifetime(pair):
    _, o, w = pair
    with pytest.raises(ws.OpenSlideError):
        w.read_region((0, 0), 0, (-1, 5))
    assert w.read_region((0, 0), 0, (0, 5)).size == (0, 5)
    bad = w.read_region((0, 0), w.level_count, (3, 3))  # OpenSlide 4: transparent, no error
    assert np.asarray(bad).max() == 0 and np.asarray(o.read_region((0, 0), o.level_count, (3, 3))).max() == 0
    with pytest.raises(TypeError):
        w.set_cache(object())
    w.set_cache(ws.OpenSlideCache(1 << 20))
    w.read_region((0, 0), 0, (20, 20))
    with pytest.raises(KeyError):
        w.associated_images["nope"]
    with pytest.raises(TypeError):
        w.properties["openslide.vendor"] = "x"  # read-only mapping


def test_fractional_difference_is_openslides_blend():
    """At a fractional level position OpenSlide returns the bilinear blend of the stored
    pixels; the native Slide.read_region keeps its nearest stored pixel (documented), the
    drop-in returns OpenSlide's blend."""
    from helpers import shared_sample

    path = str(shared_sample("aperio-tcga-cr-7395-jp2k-33005-2level.svs"))
    o, w = real.OpenSlide(path), ws.OpenSlide(path)
    level, (x, y), (sw, sh) = 1, (2023, 2023), (300, 200)
    ds = o.level_downsamples[level]
    stored = np.asarray(o.read_region((0, 0), level, (1400, 1400))).astype(float)[..., :3]
    fx, fy = x / ds, y / ds
    ix, iy, tx, ty = int(fx), int(fy), fx - int(fx), fy - int(fy)
    assert 0.1 < tx < 0.9

    def s(dy, dx):
        return stored[iy + dy: iy + dy + sh, ix + dx: ix + dx + sw]

    blend = (1 - ty) * ((1 - tx) * s(0, 0) + tx * s(0, 1)) + ty * ((1 - tx) * s(1, 0) + tx * s(1, 1))
    nearest = stored[round(fy): round(fy) + sh, round(fx): round(fx) + sw]
    got_o = np.asarray(o.read_region((x, y), level, (sw, sh))).astype(float)[..., :3]
    got_w = np.asarray(w.read_region((x, y), level, (sw, sh))).astype(float)[..., :3]
    native = w._slide.read_region((x, y), level, (sw, sh))[..., :3].astype(float)
    assert np.abs(native - nearest).max() == 0
    assert np.abs(got_o - blend).mean() < 0.5
    assert np.abs(got_o - got_w).max() <= _tolerance(Path(path))
