"""The drop-in's read_region at fractional level positions against OpenSlide 4 (the oracle).

OpenSlide maps a level-0 location to ``location / downsample`` without rounding and
paints the level at that sub-pixel offset (wsitool.deepzoom.subpixel follows it): every
level of every shared slide OpenSlide reads, at random level-0 locations that are not
multiples of the downsample, regions partly outside the slide included.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

pytest.importorskip("openslide")

import openslide as real

import wsitool.openslide as ws
from wsitool.deepzoom.subpixel import whole_pixel

from helpers import openslide_pair, openslide_samples, repo_samples, shared_sample

# The slides OpenSlide reads (tests/region_hashes.json), TIFF, NDPI and DICOM, and the repo's
# own samples; OME-TIFF aside (OpenSlide reads a generic TIFF there) and the Orientation-6
# TIFF, whose tiles OpenSlide turns (test_openslide_parity._reoriented_by_openslide).
SLIDES = [p for p in openslide_samples(suffixes=("",)) + repo_samples()
          if not p.name.startswith("broken-") and ".ome." not in p.name and "orientation6" not in p.name]


def _tolerance(name: str) -> int:
    """0, or 2 for JPEG 2000 (the decoders may differ by 2; on this machine they do not)."""
    return 2 if ("j2k" in name or "jp2k" in name) else 0


def _diff(a, b) -> int:
    return int(np.abs(np.asarray(a).astype(int) - np.asarray(b).astype(int)).max())


@pytest.fixture(params=SLIDES, ids=[p.name for p in SLIDES])
def pair(request):
    with openslide_pair(request.param) as (o, w):
        yield request.param, o, w


def _off_grid(rng, low: int, high: int, ds: float) -> int:
    """A level-0 coordinate in ``[low, high)`` that is not a multiple of ``ds`` where it can be."""
    for _ in range(50):
        v = int(rng.integers(low, high))
        if ds == 1 or v % ds:
            return v
    return v


def _regions(rng, dims0, dims, ds):
    """Four regions of one level: inside, past the right and bottom edges, before the
    origin, and anywhere around the slide."""
    (w0, h0), (w, h) = dims0, dims
    out = []
    for kind in ("inside", "edge", "origin", "around"):
        size = (int(rng.integers(1, min(w, 260) + 1)), int(rng.integers(1, min(h, 260) + 1)))
        if kind == "inside":
            loc = (_off_grid(rng, 0, w0, ds), _off_grid(rng, 0, h0, ds))
        elif kind == "edge":
            loc = (_off_grid(rng, max(0, w0 - int(size[0] * ds)), w0, ds),
                   _off_grid(rng, max(0, h0 - int(size[1] * ds)), h0, ds))
        elif kind == "origin":
            loc = (-_off_grid(rng, 1, int(40 * ds) + 2, ds), -_off_grid(rng, 1, int(40 * ds) + 2, ds))
        else:
            loc = (_off_grid(rng, -int(20 * ds), w0, ds), _off_grid(rng, -int(20 * ds), h0, ds))
        out.append((loc, size))
    return out


def test_fractional_regions_are_openslides(pair):
    path, o, w = pair
    rng = np.random.default_rng(zlib.crc32(path.name.encode()))
    tol, fractional = _tolerance(path.name), 0
    for level in range(o.level_count):
        ds = o.level_downsamples[level]
        for loc, size in _regions(rng, o.dimensions, o.level_dimensions[level], ds):
            a, b = o.read_region(loc, level, size), w.read_region(loc, level, size)
            assert b.mode == "RGBA" and b.size == a.size
            assert _diff(a, b) <= tol, (path.name, level, loc, size, _diff(a, b))
            fractional += not whole_pixel(w._slide, loc, level)
    if o.level_count > 1:
        assert fractional, "no region at a fractional level position was compared"


@pytest.mark.parametrize("name,level,location,size,tol", [
    # the nearest stored pixel differed from OpenSlide by 62 and 64 here
    ("aperio-tcga-cr-7395-jp2k-33005-2level.svs", 1, (1001, 1001), (300, 200), 2),
    ("generic-bigtiff-zstd-5level-10000x5000.tiff", 2, (555, 1501), (300, 300), 0),
    # levels 3-4: an edge one row or column off
    ("generic-bigtiff-zstd-5level-10000x5000.tiff", 3, (555, 1501), (300, 300), 0),
    ("generic-bigtiff-zstd-5level-10000x5000.tiff", 4, (555, 1501), (300, 300), 0),
    # wider than OpenSlide's 4096-pixel pieces, before the origin: the second piece starts at
    # trunc(x + 4096 * ds), a fractional level position where the first is a whole one
    ("aperio-tcga-cr-7395-jp2k-33005-2level.svs", 1, (-8002, 1001), (4400, 64), 2),
])
def test_known_fractional_regions(name, level, location, size, tol):
    path = str(shared_sample(name))
    with real.OpenSlide(path) as o, ws.OpenSlide(path) as w:
        a, b = np.asarray(o.read_region(location, level, size)), np.asarray(w.read_region(location, level, size))
        assert a[..., 3].max() == 255  # the region holds slide pixels
        assert _diff(a, b) <= tol, _diff(a, b)


@pytest.mark.parametrize(("band_rows", "blend_rows"), [(1, 7), (300, 128), (512, 1 << 20)])
def test_a_tall_region_is_blended_band_by_band_with_openslides_pixels(monkeypatch, band_rows, blend_rows):
    """Regions taller than a band: read in bands of whole tile rows and blended a few rows at a time
    (peak memory one band's), every band, blend and tile seam as OpenSlide paints it (1: one tile
    row a band)."""
    from wsitool.deepzoom import subpixel

    monkeypatch.setattr(subpixel, "BAND_ROWS", band_rows)
    monkeypatch.setattr(subpixel, "BLEND_ROWS", blend_rows)
    path = str(shared_sample("generic-bigtiff-zstd-5level-10000x5000.tiff"))
    with real.OpenSlide(path) as o, ws.OpenSlide(path) as w:
        for level, location, size in ((1, (1001, 333), (150, 1300)), (2, (555, -1501), (90, 1000))):
            assert not whole_pixel(w._slide, location, level)
            a = np.asarray(o.read_region(location, level, size))
            b = np.asarray(w.read_region(location, level, size))
            assert a[..., 3].max() == 255 and _diff(a, b) == 0, (level, location, _diff(a, b))


def test_a_large_fractional_read_holds_a_few_times_its_output():
    """A 2000 x 2000 region at a fractional position: the float work is done a band at a time, so
    the traced peak stays a small multiple of the 16 MB output (the whole region at once: 19x)."""
    import tracemalloc

    path = str(shared_sample("generic-bigtiff-zstd-5level-10000x5000.tiff"))
    with ws.OpenSlide(path) as w:
        assert not whole_pixel(w._slide, (1001, 333), 1)
        w.read_region((1001, 333), 1, (64, 64))  # (imports and decoders first)
        tracemalloc.start()
        try:
            region = w.read_region((1001, 333), 1, (2000, 2000))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert region.size == (2000, 2000)
        assert peak < 8 * 2000 * 2000 * 4, peak / 1e6
