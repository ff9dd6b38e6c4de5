"""Deep Zoom routes against openslide-python's DeepZoomGenerator (the oracle) on four real slides.

For each slide the ``.dzi`` is identical, and at every Deep Zoom level a sample
of tiles (corners, edges, middle) has exactly the generator's size and pixels
within a mean absolute difference of 2 (both shrink with Lanczos by default;
the server's ``dz_filter="area"`` is checked against it below).  Tiles are
fetched as PNG (lossless).
"""

from __future__ import annotations

import io
import itertools
import os
from pathlib import Path

import numpy as np
import pytest

# serve_slides: a fixture of serve_helpers (registered by tests/conftest.py)
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

httpx = pytest.importorskip("httpx")
openslide = pytest.importorskip("openslide")
from openslide.deepzoom import DeepZoomGenerator  # noqa: E402
from PIL import Image  # noqa: E402

#: ../shared/samples beside the repository (as tests/conftest.py finds it)
SAMPLES_SHARED = Path(os.environ.get("WSITOOL_SHARED",
                                     Path(__file__).resolve().parents[2].parent / "shared")) / "samples"

SLIDES = ["aperio-cmu1-small-region-jpeg.svs", "aperio-tcga-cr-7395-jp2k-33005-2level.svs",
          "generic-boxes-deflate-4level.tiff",
          # 7 levels, the last 3 made by scaled JPEG decoding (formats/tiff/ndpi_scaled.py)
          "ndpi-hamamatsu-stritt-dapi-fluor-3.5mb.ndpi"]


def _sample(n: int) -> list[int]:
    return sorted({0, n // 2, n - 1})


@pytest.mark.parametrize("name", SLIDES)
def test_dz_matches_deepzoomgenerator(name, serve_slides):
    path = SAMPLES_SHARED / name
    if not path.exists():
        pytest.skip(f"real slide {path} is absent")
    gen = DeepZoomGenerator(openslide.OpenSlide(str(path)))
    worst = 0.0
    with (
        serve_slides([path], threads=2, cache_mb=64) as (url, _state),
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        dzi = client.get(f"/dz/{name}.dzi")
        assert dzi.status_code == 200
        assert dzi.text == gen.get_dzi("jpeg")
        for level in range(gen.level_count):
            cols, rows = gen.level_tiles[level]
            for col, row in itertools.product(_sample(cols), _sample(rows)):
                r = client.get(f"/dz/{name}_files/{level}/{col}_{row}.png")
                assert r.status_code == 200, (level, col, row, r.text)
                ours = np.asarray(Image.open(io.BytesIO(r.content)).convert("RGB"), dtype=np.int16)
                theirs = np.asarray(gen.get_tile(level, (col, row)).convert("RGB"), dtype=np.int16)
                assert ours.shape == theirs.shape, (level, col, row)
                mad = float(np.abs(ours - theirs).mean())
                worst = max(worst, mad)
                assert mad <= 2.0, (level, col, row, mad)
        # outside the grid: 404
        assert client.get(f"/dz/{name}_files/{gen.level_count}/0_0.jpeg").status_code == 404
        assert client.get(f"/dz/{name}_files/0/5_5.jpeg").status_code == 404
    print(f"{name}: worst tile MAD {worst:.3f}")


def test_area_filter_tiles_have_the_generators_size_and_stay_near_it():
    """``dz_filter="area"`` (ServeConfig): the same tiles, shrunk by wsitool's area filter
    instead of Lanczos: same sizes, within the documented mean difference (README: up to
    3.5 on textured tissue at 2x)."""
    import wsitool
    from wsitool.serve.dz import geometry_for, render_dz_tile

    path = Path(__file__).resolve().parents[2] / "samples" / "sample-aperio-jpeg.svs"
    with wsitool.open_slide(path) as slide:
        geom = geometry_for(slide, 254, 1)
        shrunk = 0
        for level in (geom.level_count - 4, geom.level_count - 5):  # past the slide's 4x level
            for col, row in itertools.islice(itertools.product(*map(range, geom.level_tiles[level])), 4):
                t = geom.tile(level, (col, row))
                lan = render_dz_tile(slide, geom, level, col, row, filter="lanczos")
                area = render_dz_tile(slide, geom, level, col, row, filter="area")
                assert area.shape == lan.shape == (t.size[1], t.size[0], 3)
                if tuple(t.read_size) != tuple(t.size):
                    shrunk += 1
                    assert np.abs(area.astype(float) - lan).mean() < 4.0
        assert shrunk  # the levels chosen do shrink
