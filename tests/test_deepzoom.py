"""wsitool.deepzoom.geometry against openslide-python's DeepZoomGenerator (the oracle) and the DZI exporter."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from wsitool.deepzoom.geometry import (
    DeepZoomGeometry,
    best_level_for_downsample,
    bounds_from_properties,
    deepzoom_level_dimensions,
)

deepzoom = pytest.importorskip("openslide.deepzoom")


class _FakeSlide:
    """Just what openslide-python's DeepZoomGenerator reads from a slide (no pixels)."""

    def __init__(self, dims, downsamples, properties):
        self.level_dimensions = tuple(dims)
        self.dimensions = self.level_dimensions[0]
        self.level_downsamples = tuple(downsamples)
        self.properties = properties

    def get_best_level_for_downsample(self, d):
        return best_level_for_downsample(self.level_downsamples, d)


def _pyramid(w, h, n, factor=2):
    """OpenSlide-style levels: each level floor-halved, downsample (W0/w + H0/h) / 2."""
    dims = [(w, h)]
    for _ in range(n - 1):
        pw, ph = dims[-1]
        if pw // factor < 1 or ph // factor < 1:
            break
        dims.append((pw // factor, ph // factor))
    ds = [(w / lw + h / lh) / 2 for lw, lh in dims]
    return dims, ds


SIZES = [(1, 1), (2, 1), (16, 16), (205, 205), (254, 254), (255, 253), (300, 250), (2220, 2967),
         (4443, 3567), (10000, 5000), (1023, 1), (1, 4097), (509, 1021)]
BOUNDS = [None, (None, None, None, None), (3, 5, None, None), (17, 11, 101, 77), (0, 0, 1, 1)]


def _check(geom, gen):
    assert geom.level_count == gen.level_count
    assert geom.level_dimensions == gen.level_dimensions
    assert geom.level_tiles == gen.level_tiles
    assert geom.tile_count == gen.tile_count
    for fmt in ("jpeg", "png"):
        assert geom.dzi_xml(fmt) == gen.get_dzi(fmt)
    for level in range(gen.level_count):
        cols, rows = gen.level_tiles[level]
        cs = sorted({0, 1, cols // 2, cols - 2, cols - 1} & set(range(cols)))
        rs = sorted({0, 1, rows // 2, rows - 2, rows - 1} & set(range(rows)))
        for c, r in itertools.product(cs, rs):
            t = geom.tile(level, (c, r))
            assert t.read_args == gen.get_tile_coordinates(level, (c, r)), (level, c, r)
            assert t.size == gen.get_tile_dimensions(level, (c, r)), (level, c, r)


@pytest.mark.parametrize("w,h", SIZES)
@pytest.mark.parametrize("tile,overlap", [(254, 1), (256, 0), (1, 0), (7, 3), (512, 2)])
def test_geometry_matches_openslide_python(w, h, tile, overlap):
    dims, ds = _pyramid(w, h, 5)
    gen = deepzoom.DeepZoomGenerator(_FakeSlide(dims, ds, {}), tile, overlap, False)
    _check(DeepZoomGeometry(dims, ds, tile_size=tile, overlap=overlap), gen)


@pytest.mark.parametrize("w,h", [s for s in SIZES if min(s) > 120])
@pytest.mark.parametrize("bounds", BOUNDS)
@pytest.mark.parametrize("tile,overlap", [(254, 1), (64, 0)])
def test_bounds_match_openslide_python(w, h, bounds, tile, overlap):
    dims, ds = _pyramid(w, h, 4, factor=3)
    props = {}
    if bounds is not None:
        for key, v in zip(("x", "y", "width", "height"), bounds, strict=True):
            if v is not None:
                props[f"openslide.bounds-{key}"] = str(v)
    gen = deepzoom.DeepZoomGenerator(_FakeSlide(dims, ds, props), tile, overlap, bounds is not None)
    b = bounds_from_properties(props) if bounds is not None else None
    _check(DeepZoomGeometry(dims, ds, tile_size=tile, overlap=overlap, bounds=b), gen)


def test_fractional_downsamples_choose_openslides_level():
    # boxes.tiff-like: 300x250 with downsamples 1, 2, 4.016, 8.086
    dims = [(300, 250), (150, 125), (75, 62), (37, 31)]
    ds = [(300 / w + 250 / h) / 2 for w, h in dims]
    gen = deepzoom.DeepZoomGenerator(_FakeSlide(dims, ds, {}), 254, 1)
    geom = DeepZoomGeometry(dims, ds)
    _check(geom, gen)
    assert geom.slide_levels == tuple(t.slide_level for t in
                                      (geom.tile(k, (0, 0)) for k in range(geom.level_count)))


def test_best_level_rule():
    ds = (1.0, 2.0, 4.016, 8.086)
    assert best_level_for_downsample(ds, 0.5) == 0
    assert best_level_for_downsample(ds, 1.0) == 0
    assert best_level_for_downsample(ds, 1.99) == 0
    assert best_level_for_downsample(ds, 2.0) == 1
    assert best_level_for_downsample(ds, 4.0) == 1
    assert best_level_for_downsample(ds, 4.016) == 2
    assert best_level_for_downsample(ds, 100) == 3


def test_level_dimensions_and_errors():
    assert deepzoom_level_dimensions(5, 3) == ((1, 1), (2, 1), (3, 2), (5, 3))
    geom = DeepZoomGeometry([(5, 3)], [1.0], tile_size=2, overlap=0)
    assert geom.level_tiles[-1] == (3, 2)
    with pytest.raises(ValueError, match="Invalid level"):
        geom.tile(geom.level_count, (0, 0))
    with pytest.raises(ValueError, match="Invalid address"):
        geom.tile(0, (1, 0))
    with pytest.raises(ValueError):
        DeepZoomGeometry([(5, 3)], [1.0], tile_size=0)
    with pytest.raises(ValueError):
        DeepZoomGeometry([(5, 3)], [1.0], overlap=-1)


def test_ground_floor_takes_plain_numbers():
    geom = DeepZoomGeometry(((100, 50),), (1.0,), tile_size=32, overlap=1)
    assert geom.dimensions == (100, 50)
    assert "100x50" in repr(geom)


# --------------------------------------------------------------------- the exporter

@pytest.mark.parametrize("w,h,tile,overlap", [(300, 250, 64, 1), (205, 205, 254, 1), (129, 65, 32, 0),
                                              (97, 300, 50, 2)])
def test_geometry_equals_what_the_dzi_exporter_writes(tmp_path, w, h, tile, overlap):
    """The lead can route export.py's DZI writer through wsitool.deepzoom.geometry: same levels and grid."""
    import tifffile

    from wsitool.export import export_pyramid

    rng = np.random.default_rng(w * h)
    img = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
    src = tmp_path / "src.tif"
    tifffile.imwrite(src, img, tile=(16, 16), photometric="rgb")
    out = tmp_path / "out.dzi"
    export_pyramid(src, out, format="dzi", tile_size=tile, overlap=overlap)
    geom = DeepZoomGeometry([(w, h)], [1.0], tile_size=tile, overlap=overlap)

    root = ET.parse(out).getroot()
    ns = {"d": "http://schemas.microsoft.com/deepzoom/2008"}
    assert int(root.get("TileSize")) == tile and int(root.get("Overlap")) == overlap
    size = root.find("d:Size", ns)
    assert (int(size.get("Width")), int(size.get("Height"))) == geom.dimensions

    from PIL import Image

    files = tmp_path / "out_files"
    levels = sorted(int(p.name) for p in files.iterdir())
    assert levels == list(range(geom.level_count))
    for k in levels:
        names = {p.stem for p in (files / str(k)).iterdir()}
        cols, rows = geom.level_tiles[k]
        assert names == {f"{c}_{r}" for c in range(cols) for r in range(rows)}, k
        for c, r in {(0, 0), (cols - 1, rows - 1), (cols // 2, rows // 2)}:
            p = next((files / str(k)).glob(f"{c}_{r}.*"))
            with Image.open(p) as im:
                assert im.size == geom.tile(k, (c, r)).size, (k, c, r)
