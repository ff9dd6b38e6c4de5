"""Large Hamamatsu NDPI, written at test time by ``scripts/make_ndpi.py`` from the shared sample's pixels.

Each level of such a file is one baseline JPEG scan spliced from restart
intervals encoded with fixed tables (see the script).  Two files:

* **wide**: level 0 is 100,352 x 2,048 pixels (196 restart intervals of 512 x 8
  pixels per row; 100,000 is not a whole number of 512-pixel intervals, which
  NDPI and OpenSlide require), so its SOF holds width 0 as NDPI writes it past
  65,535; two lower levels.  wsitool equals OpenSlide's ``read_region`` and
  tifffile's own decode of the intervals, on both read paths, and a 256 x 256
  read decodes exactly the restart intervals it touches.
* **over 4 GiB**: the level-0 strip (and its IFD) lie past byte 4 GiB of a
  sparse file, so StripOffsets, the IFD offset and the out-of-line value
  pointers need the high 32 bits NDPI keeps in each IFD's 4-byte-per-entry
  extension (and McuStartsHighBytes, tag 65432, is written).  OpenSlide 4.0.1
  opens it (its tifflike reader reads the extension), so wsitool is compared
  with both OpenSlide and tifffile.

Slow: the wide file takes ~10 s to write on 2 cores (the 4 GiB one < 1 s and
~2 MiB of disk); generated files stay under ``tmp_path``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tifffile

import wsitool
from wsitool.codec.pool import get_pool
from wsitool.slide import pyramid_levels

from helpers import script_module, shared_sample

pytestmark = pytest.mark.slow

NDPI = "ndpi-hamamatsu-stritt-dapi-fluor-3.5mb.ndpi"
WIDE = (100352, 2048)


def _make_ndpi():
    return script_module("make_ndpi").make_ndpi


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    path = tmp_path_factory.mktemp("ndpi_wide") / "wide.ndpi"
    info = _make_ndpi()(path, *WIDE, interval=512, levels=3, source=shared_sample(NDPI))
    return path, info


@pytest.fixture(scope="module")
def over_4g(tmp_path_factory):
    path = tmp_path_factory.mktemp("ndpi_4g") / "over4g.ndpi"
    info = _make_ndpi()(path, 16384, 1024, interval=512, levels=2, offset_above_4g=True,
                        source=shared_sample(NDPI))
    return path, info


def _tifffile_region(tf, level, x, y, w, h):
    """Rows ``y:y+h``, columns ``x:x+w`` of a stored level as tifffile decodes its restart
    intervals (only those the region touches, each through the page's JPEG header)."""
    page = tf.series[0].levels[level].keyframe
    th, tw = page.tilelength, page.tilewidth
    across = -(-page.imagewidth // tw)
    out = np.zeros((h, w, 3), np.uint8)
    fh = tf.filehandle
    for row in range(y // th, (y + h - 1) // th + 1):
        for col in range(x // tw, (x + w - 1) // tw + 1):
            i = row * across + col
            fh.seek(page.dataoffsets[i])
            data = fh.read(page.databytecounts[i])  # before page.decode: its first use moves the file
            seg, (_, _, ty, tx, _), _ = page.decode(data, i, jpegheader=page.jpegheader)
            seg = seg[0]
            y0, y1 = max(ty, y), min(ty + th, y + h)
            x0, x1 = max(tx, x), min(tx + tw, x + w)
            out[y0 - y:y1 - y, x0 - x:x1 - x] = seg[y0 - ty:y1 - ty, x0 - tx:x1 - tx]
    return out


def _regions(w, h):
    """Level regions: the origin, interval (512 x 8) boundaries straddled, past 65,535, the far edge."""
    return [(0, 0, 256, 256), (511, 7, 2, 2), (w // 2 - 300, h // 2 - 5, 700, 37),
            (min(65530, w - 600), 3, 600, 20), (w - 1000, h - 40, 1000, 40), (w - 256, 0, 256, h)]


def test_wide_ndpi_equals_openslide_and_tifffile(wide, read_path):
    """100,352-pixel level 0 (SOF width 0), 512-pixel intervals: exact, both read paths."""
    openslide = pytest.importorskip("openslide")
    path, info = wide
    with open(path, "rb") as fh:
        fh.seek(info["levels"][0][3])  # level 0's JPEG stream
        head = fh.read(1024)
    sof = head.index(b"\xff\xc0")
    assert int.from_bytes(head[sof + 5:sof + 7], "big") == WIDE[1]
    assert int.from_bytes(head[sof + 7:sof + 9], "big") == 0  # width past 65,535: 0, as NDPI writes
    with wsitool.open_slide(path) as slide, openslide.OpenSlide(str(path)) as ref, \
            tifffile.TiffFile(path) as tf:
        assert tf.is_ndpi and slide.vendor == "hamamatsu" == ref.properties["openslide.vendor"]
        assert slide.level_dimensions[:3] == ref.level_dimensions[:3] == ((100352, 2048), (50176, 1024),
                                                                          (25088, 512))
        assert slide.level_dimensions == ref.level_dimensions
        for L in range(3):
            lv = pyramid_levels(slide)[L]
            assert (lv.tile_width, lv.tile_height) == (512, 8) and lv.encoding.jpeg_scan_segments
            ds = round(slide.level_downsamples[L])
            for x, y, w, h in _regions(*lv.dimensions):
                got = np.asarray(slide.read_region((x * ds, y * ds), L, (w, h), mode="rgb"))
                want = np.asarray(ref.read_region((x * ds, y * ds), L, (w, h)).convert("RGB"))
                assert np.array_equal(got, want), (L, x, y, w, h)
                assert np.array_equal(got, _tifffile_region(tf, L, x, y, w, h)), (L, x, y, w, h)


@pytest.mark.parametrize("x, y, touched", [(1024, 0, 32), (1024 + 100, 3, 33), (512 * 100 - 100, 1700, 2 * 33),
                                           (70000, 1000, 2 * 32)])
def test_wide_ndpi_region_decodes_only_the_intervals_it_touches(wide, read_path, x, y, touched):
    """A 256 x 256 read at level 0 decodes one interval (512 x 8) per row and column it touches,
    however wide the level (196 intervals a row)."""
    path, _ = wide
    pool = get_pool("cpu")
    with wsitool.open_slide(path) as slide:
        slide.read_region((0, 0), 0, (8, 8), mode="rgb")  # open the decoders
        before, spliced = pool.stats().tiles_decoded, pool.stats().tiles_spliced
        slide.read_region((x, y), 0, (256, 256), mode="rgb")
        assert pool.stats().tiles_decoded - before == touched
        # the compiled loop decodes them in bands spliced into one code stream each (4:4:4)
        assert pool.stats().tiles_spliced - spliced == (touched if read_path == "compiled" else 0)


def test_ndpi_over_4gib_equals_openslide_and_tifffile(over_4g, read_path):
    """Level 0 stored past byte 4 GiB of a sparse file.  OpenSlide 4.0.1 opens it; where an
    OpenSlide cannot, the comparison is with tifffile's decode alone."""
    path, info = over_4g
    st = os.stat(path)
    assert st.st_size > 1 << 32
    assert st.st_blocks * 512 < 16 << 20  # sparse: a few MiB on disk
    strip_at = info["levels"][0][3]
    assert strip_at > 1 << 32
    with tifffile.TiffFile(path) as tf:
        page = tf.pages[0]
        assert tf.is_ndpi and page.offset > 1 << 32 and page.dataoffsets[0] > 1 << 32
        assert page.tags.valueof(273)[0] == strip_at  # StripOffsets' high bits from the IFD extension
        assert 65432 in page.tags  # McuStartsHighBytes
        try:
            import openslide
            ref = openslide.OpenSlide(str(path))
        except Exception:  # an OpenSlide that cannot open it: tifffile only
            ref = None
        with wsitool.open_slide(path) as slide:
            lv = pyramid_levels(slide)[0]
            assert lv.dimensions == (16384, 1024) and min(int(o) for o in lv.tiles.offsets) > 1 << 32
            if ref is not None:
                assert slide.level_dimensions == ref.level_dimensions
            for L in range(2):
                ds = round(slide.level_downsamples[L])
                for x, y, w, h in _regions(*pyramid_levels(slide)[L].dimensions):
                    got = np.asarray(slide.read_region((x * ds, y * ds), L, (w, h), mode="rgb"))
                    assert np.array_equal(got, _tifffile_region(tf, L, x, y, w, h)), (L, x, y, w, h)
                    if ref is not None:
                        want = np.asarray(ref.read_region((x * ds, y * ds), L, (w, h)).convert("RGB"))
                        assert np.array_equal(got, want), (L, x, y, w, h)
        if ref is not None:
            ref.close()
