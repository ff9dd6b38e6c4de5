"""MIRAX (:mod:`wsitool.formats.mirax`) on the fixtures of ``scripts/make_mirax_samples.py``, against
OpenSlide 4.0.1 (the oracle): OpenSlide must read each fixture as ``mirax`` and every level of it,
and wsitool must give what it gives."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import wsitool
from wsitool.codec import mosaic as codec_mosaic
from wsitool.errors import CorruptFileError, TileDecodeError, TruncatedDataError, UnsupportedFormatError
from wsitool.formats.mirax import slidedat
from wsitool.storage.local import LocalFile

from helpers import assert_offgrid_reads_equal_openslide, assert_reads_equal_openslide, vendor_pair_fixture

openslide = pytest.importorskip("openslide")
wo = pytest.importorskip("wsitool.openslide")

FIXTURES = ("mirax_vimslide", "mirax_stitching", "mirax_nominal")
#: fixtures whose every level lies at whole-pixel positions: OpenSlide's pixels, exactly
EXACT = ("mirax_vimslide", "mirax_stitching")
#: Property keys compared with OpenSlide (the ``mirax.*`` keys are compared all).
KEYS = ("openslide.vendor", "openslide.mpp-x", "openslide.mpp-y", "openslide.objective-power",
        "openslide.background-color", "openslide.quickhash-1", "openslide.bounds-x", "openslide.bounds-y",
        "openslide.bounds-width", "openslide.bounds-height", "openslide.level-count")


pair = vendor_pair_fixture(FIXTURES, "mirax_made")


def _copy(mirax_made, name: str, tmp_path: Path) -> Path:
    """A copy of fixture ``name`` (its .mrxs and folder) in ``tmp_path``."""
    src = mirax_made[name]
    shutil.copyfile(src, tmp_path / src.name)
    shutil.copytree(src.with_suffix(""), tmp_path / src.stem)
    return tmp_path / src.name


def test_openslide_reads_every_fixture_as_mirax(pair):
    """The generator's fixtures count: OpenSlide 4.0.1 opens each as MIRAX and reads every level."""
    _name, o, _ = pair
    assert o.properties["openslide.vendor"] == "mirax"
    assert o.level_count >= 3
    for level, (width, height) in enumerate(o.level_dimensions):
        region = np.asarray(o.read_region((0, 0), level, (width, height)))
        assert region.shape == (height, width, 4) and region[..., 3].mean() > 200
        assert o.level_downsamples[level] == 2.0 ** level
    assert o.associated_images


def test_geometry_properties_and_quickhash_equal_openslide(pair):
    name, o, w = pair
    assert w.level_dimensions == o.level_dimensions
    assert w.level_downsamples == o.level_downsamples
    for key in KEYS:
        assert w.properties.get(key) == o.properties.get(key), key
    mirax_keys = {k: v for k, v in o.properties.items() if k.startswith("mirax.")}
    assert len(mirax_keys) > 40
    assert {k: v for k, v in w.properties.items() if k.startswith("mirax.")} == mirax_keys
    if name == "mirax_vimslide":  # its first photo moved by (8, 16): bounds start past 0
        assert o.properties["openslide.bounds-x"] == "8"
    assert sorted(w.associated_images) == sorted(o.associated_images)


@pytest.mark.parametrize("name", EXACT)
def test_regions_on_every_level_equal_openslide(mirax_made, name):
    """Random RGBA regions on every level, the edges and the associated images: OpenSlide's pixels
    (overlapping camera images in its order, missing photos transparent)."""
    path = str(mirax_made[name])
    with openslide.OpenSlide(path) as o, wo.OpenSlide(path) as w:
        assert_reads_equal_openslide(o, w, seed=51, regions=10)


@pytest.mark.parametrize("name", FIXTURES)
def test_regions_at_fractional_offsets_equal_openslide(mirax_made, name):
    """Regions at level-0 locations off each level's grid, on every level (``mirax-nominal``'s level
    2 places its photos at half pixels, too): OpenSlide's cairo painting, exactly: each photo
    sampled bilinearly at its own offset (pixman's float path, or its 8-bit one where a whole
    photo's samples all lie inside it: ``mirax-vimslide`` level 1), the first painted kept."""
    path = str(mirax_made[name])
    with openslide.OpenSlide(path) as o, wo.OpenSlide(path) as w:
        assert_offgrid_reads_equal_openslide(o, w, seed=61)


def test_the_native_read_paints_fractional_positions_at_the_nearest_pixel(mirax_made):
    """``Slide.read_region`` keeps its documented rule on ``mirax-nominal`` level 2 (photos at half
    pixels): each placement's pixels copied at ``floor(x + 0.5)``, no blending (the drop-in blends)."""
    path = str(mirax_made["mirax_nominal"])
    with wsitool.open_slide(path) as slide, wo.OpenSlide(path) as w:
        lv = wsitool.slide.pyramid_levels(slide)[2]
        mosaic = lv.mosaic
        assert mosaic.fractional
        native = slide.read_region((0, 0), 2, (lv.width, lv.height), mode="rgba")
        frac = np.flatnonzero((mosaic.x != mosaic.px) | (mosaic.y != mosaic.py))
        p = int(frac[-1])  # (the last painted at a fractional position: its visible part checked)
        px, py, sx, sy = (int(v[p]) for v in (mosaic.px, mosaic.py, mosaic.sx, mosaic.sy))
        pw, ph = min(int(mosaic.w[p]), lv.width - px), min(int(mosaic.h[p]), lv.height - py)
        seen = np.ones((ph, pw), bool)
        for q in range(p + 1, len(mosaic.x)):  # (what later placements cover)
            qx, qy = int(mosaic.px[q]) - px, int(mosaic.py[q]) - py
            seen[max(0, qy):max(0, qy + int(mosaic.h[q])), max(0, qx):max(0, qx + int(mosaic.w[q]))] = False
        assert seen.sum() > 100
        image = codec_mosaic.decode_image(mosaic, int(mosaic.image[p]))[sy:sy + ph, sx:sx + pw]
        assert np.array_equal(native[py:py + ph, px:px + pw, :3][seen], image[seen])
        blended = np.asarray(w.read_region((0, 0), 2, (lv.width, lv.height)))
        assert not np.array_equal(blended[py:py + ph, px:px + pw, :3][seen], image[seen])


def test_slidedat_parser_follows_glib_as_openslide_reads_it(mirax_made, tmp_path):
    """BOM, CRLF, key-less lines, white space around ``=``, a comment, a group given twice, a key
    given twice: the ``mirax.*`` properties are OpenSlide's."""
    path = _copy(mirax_made, "mirax_stitching", tmp_path)
    ini = path.with_suffix("") / "Slidedat.ini"
    text = ini.read_bytes()
    extra = (b"\r\n# a comment\r\n[GENERAL]\r\n  SPACED  =   two words  \r\n=\r\n   = also keyless\r\n"
             b"SLIDE_NAME = renamed\r\n[EXTRA]\r\nEMPTY=\r\n")
    ini.write_bytes(text + extra)
    with openslide.OpenSlide(str(path)) as o, wo.OpenSlide(str(path)) as w:
        want = {k: v for k, v in o.properties.items() if k.startswith("mirax.")}
        assert want["mirax.GENERAL.SPACED"] == "two words  " and want["mirax.EXTRA.EMPTY"] == ""
        assert {k: v for k, v in w.properties.items() if k.startswith("mirax.")} == want
        assert w.properties["openslide.quickhash-1"] == o.properties["openslide.quickhash-1"]
    kf = slidedat.parse(b"\xef\xbb\xbf[A]\r\nX = 5 \r\nY=1.5\r\n")
    assert kf.integer("A", "X") == 5 and kf.double("A", "Y") == 1.5
    with pytest.raises(CorruptFileError, match="not an integer"):
        kf.integer("A", "Y")
    with pytest.raises(CorruptFileError, match="line 2"):
        slidedat.parse(b"[A]\nno equals sign here\n")
    with pytest.raises(CorruptFileError, match="more than a key file holds"):
        slidedat.parse(b"#" * (slidedat.MAX_BYTES + 1))


def test_info_and_read_region_cli(mirax_made, tmp_path):
    path = str(mirax_made["mirax_vimslide"])
    info = subprocess.run([sys.executable, "-m", "wsitool", "info", path], capture_output=True, text=True,
                          timeout=120)
    assert info.returncode == 0 and "mirax" in info.stdout and "1952x2432" in info.stdout
    out = tmp_path / "r.png"
    rr = subprocess.run([sys.executable, "-m", "wsitool", "read-region", path, "-l", "400", "600", "-L", "1",
                         "-s", "300", "200", "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert rr.returncode == 0, rr.stderr
    with openslide.OpenSlide(path) as o:
        from PIL import Image
        assert np.array_equal(np.asarray(Image.open(out)), np.asarray(o.read_region((400, 600), 1, (300, 200))))


def _cli_error(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wsitool", *args], capture_output=True, text=True, timeout=120,
                          env={"COLUMNS": "60", "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})


def test_a_missing_data_file_is_one_line_exit_4(mirax_made, tmp_path):
    path = _copy(mirax_made, "mirax_vimslide", tmp_path)
    (path.with_suffix("") / "Data0001.dat").unlink()
    with pytest.raises(CorruptFileError, match=r"Data0001\.dat is missing"):
        wsitool.open_slide(path)
    r = _cli_error(["info", str(path)])
    assert r.returncode == 4 and len(r.stderr.strip().splitlines()) == 1 and "Data0001.dat" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_truncated_data_file_fails_its_reads_or_fills(mirax_made, tmp_path):
    """Data0000.dat cut in half: the slide opens (as OpenSlide's does), a read needing a camera image
    past the cut is a TruncatedDataError (exit 4, one line), or background with on_error="fill"."""
    path = _copy(mirax_made, "mirax_vimslide", tmp_path)
    data = path.with_suffix("") / "Data0000.dat"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    with wsitool.open_slide(path) as slide:
        w, h = slide.level_dimensions[0]
        with pytest.raises(TruncatedDataError, match="truncated file") as info:
            slide.read_region((0, 0), 0, (w, h))
        assert isinstance(info.value, TileDecodeError) and isinstance(info.value, CorruptFileError)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            filled = slide.read_region((0, 0), 0, (w, h), on_error="fill")
        assert 0 < (filled[..., 3] == 0).mean() < 0.9
    r = _cli_error(["read-region", str(path), "-s", str(w), str(h), "-o", str(tmp_path / "x.png")])
    assert r.returncode == 4 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "x.png").exists()
    r = _cli_error(["read-region", str(path), "-s", str(w), str(h), "-o", str(tmp_path / "y.png"),
                    "--on-error", "fill"])
    assert r.returncode == 0 and (tmp_path / "y.png").exists()


def test_a_mrxs_without_its_folder_is_not_a_slide(tmp_path, mirax_made):
    lone = tmp_path / "lone.mrxs"
    shutil.copyfile(mirax_made["mirax_vimslide"], lone)
    with pytest.raises(UnsupportedFormatError, match=r"lone/Slidedat\.ini"):
        wsitool.open_slide(lone)
    empty = tmp_path / "empty.mrxs"
    empty.write_bytes(b"")
    r = _cli_error(["info", str(empty)])
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1


def test_a_broken_index_is_one_corrupt_file_error(mirax_made, tmp_path):
    path = _copy(mirax_made, "mirax_vimslide", tmp_path)
    index = path.with_suffix("") / "Index.dat"
    data = bytearray(index.read_bytes())
    table = struct.unpack_from("<i", data, len(b"01.02") + len("4b3c2a1f-0e9d-4c8b-a7f6-5e4d3c2b1a09"))[0]
    level0 = struct.unpack_from("<i", data, table)[0]
    page = struct.unpack_from("<i", data, level0 + 4)[0]
    struct.pack_into("<i", data, page + 4, page)  # the page's "next" pointer: itself
    index.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match="loops"):
        wsitool.open_slide(path)
    index.write_bytes(b"01.02" + b"another-slide-id")
    with pytest.raises(CorruptFileError, match="matching slide identifier"):
        wsitool.open_slide(path)


def test_a_256_region_reads_at_most_twice_its_images_bytes(mirax_made, monkeypatch):
    """Bytes read from the data files for 256 x 256 regions (counted at the byte source) against
    the compressed bytes of the camera images the region overlaps."""
    read: dict[str, int] = {}
    real = LocalFile.read

    def counting(self, offset, count):
        data = real(self, offset, count)
        if self.path.endswith(".dat"):
            read[self.path] = read.get(self.path, 0) + len(data)
        return data

    rng = np.random.default_rng(5)
    with wsitool.open_slide(mirax_made["mirax_vimslide"]) as slide:
        levels = wsitool.slide.pyramid_levels(slide)
        monkeypatch.setattr(LocalFile, "read", counting)
        for level in range(slide.level_count):
            lv = levels[level]
            for _ in range(6):
                x = int(rng.integers(0, max(1, lv.width - 256)))
                y = int(rng.integers(0, max(1, lv.height - 256)))
                lv.mosaic.decoded.clear()
                read.clear()
                ds = int(slide.level_downsamples[level])
                slide.read_region((x * ds, y * ds), level, (256, 256), threads=1)
                m = lv.mosaic
                need = int(m.image_length[m.images_in(x, y, x + 256, y + 256)].sum())
                assert 0 < sum(read.values()) <= 2 * need, (level, x, y)


def test_a_mirax_url_opens_its_folder_under_the_same_base(nginx_factory, mirax_made):
    pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")
    path = mirax_made["mirax_stitching"]
    url = nginx_factory(path.parent).url + path.name
    with wsitool.open_slide(url) as remote, wsitool.open_slide(path) as local:
        assert remote.properties["openslide.quickhash-1"] == local.properties["openslide.quickhash-1"]
        for level in range(local.level_count):
            np.testing.assert_array_equal(remote.read_region((800, 600), level, (300, 260)),
                                          local.read_region((800, 600), level, (300, 260)))


@pytest.mark.parametrize("name", FIXTURES)
def test_deep_zoom_tiles_equal_openslide_and_patches_equal_regions(mirax_made, name):
    """The drop-in's Deep Zoom tiles are OpenSlide's; ``read_patches`` gives ``read_region``'s pixels."""
    from openslide.deepzoom import DeepZoomGenerator

    from wsitool.openslide.deepzoom import DeepZoomGenerator as Ours

    path = str(mirax_made[name])
    with openslide.OpenSlide(path) as o, wo.OpenSlide(path) as w:
        theirs, ours = DeepZoomGenerator(o), Ours(w)
        for level in range(theirs.level_count):
            cols, rows = theirs.level_tiles[level]
            for address in ((0, 0), (cols // 2, rows // 2), (cols - 1, rows - 1)):
                assert np.array_equal(np.asarray(ours.get_tile(level, address)),
                                      np.asarray(theirs.get_tile(level, address))), (level, address)
    with wsitool.open_slide(path) as slide:
        locations = [(0, 0), (700, 900), (1500, 1800), (333, 1234)]
        patches = np.concatenate(list(slide.read_patches(locations, level=0, size=(300, 280), mode="rgba")))
        for (x, y), patch in zip(locations, patches, strict=True):
            assert np.array_equal(patch, slide.read_region((x, y), 0, (300, 280)))


def test_serve_lists_a_mirax_slide_of_a_folder_and_opens_it(mirax_made, tmp_path):
    """``serve FOLDER`` lists the .mrxs (named, not sniffed: its bytes are a JPEG) and not the files
    of its folder; its descriptor budget counts them; the slide opens as MIRAX."""
    from wsitool.serve.registry import SlideRegistry

    path = _copy(mirax_made, "mirax_stitching", tmp_path)
    registry = SlideRegistry([tmp_path], wsitool.open_slide)
    try:
        entries = list(registry)
        assert [e.id for e in entries] == [path.name] and not registry.skipped
        assert entries[0].files == 1 + len(list(path.with_suffix("").iterdir()))
        assert entries[0].slide.vendor == "mirax"
    finally:
        registry.close()
