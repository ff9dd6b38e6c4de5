"""``ExportOptions`` (issue 29): the export's option checks, made once, raising
``InvalidOptionError`` (also a ``ValueError``) with the messages ``export_pyramid`` always had."""

from __future__ import annotations

import dataclasses
import os

import pytest

from wsitool.errors import InvalidOptionError, ResourceLimitError, WsiError
from wsitool.export import ExportOptions, export_pyramid
from wsitool.ground.limits import limits


def test_defaults_are_export_pyramids():
    o = ExportOptions()
    assert (o.format, o.tile_size, o.compression, o.quality, o.psnr, o.overlap) == ("tiff", 256, "jpeg", 90, None, 0)
    assert o.threads == (os.cpu_count() or 1) == o.thread_count
    assert o.background == (255, 255, 255)
    assert (o.on_error, o.label, o.associated, o.verify, o.from_source_levels, o.overwrite) == (
        "raise", True, True, False, False, False)


def test_values_are_stored_normalised():
    o = ExportOptions(format="DZI", compression="Deflate", tile_size=254.0, overlap=1, threads=2.0,
                      background=["1", "2", "3"], psnr="41", max_pixels=1e6)
    assert (o.format, o.compression, o.tile_size, o.overlap, o.threads) == ("dzi", "deflate", 254, 1, 2)
    assert o.background == (1, 2, 3) and o.background_rgb.tolist() == [1, 2, 3]
    assert o.psnr == 41.0 and o.max_pixels == 1_000_000
    assert type(o.tile_size) is int and type(o.max_pixels) is int
    assert o == dataclasses.replace(o)  # normalising twice changes nothing


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ExportOptions().quality = 10


@pytest.mark.parametrize(("kw", "message"), [
    (dict(format="png"), "format must be one of ('tiff', 'ome-tiff', 'dzi', 'dicom'), got 'png'"),
    (dict(compression="LZW"), "compression must be one of ('jpeg', 'jpeg2000', 'jpeg2000-lossless', 'deflate', "
                              "'none', 'copy'), got 'lzw'"),
    (dict(format="dzi", compression="jpeg2000"), "Deep Zoom tiles are JPEG or PNG"),
    (dict(format="dzi", from_source_levels=True), "from_source_levels applies to tiff and ome-tiff"),
    (dict(format="dzi", compression="copy"), "compression copy writes TIFF formats"),
    (dict(tile_size=True), "tile_size must be an integer, got True"),
    (dict(tile_size=100), "tile_size must be a positive multiple of 16 for TIFF (TIFF 6.0 section 15), got 100"),
    (dict(format="dzi", tile_size=0), "tile_size must be >= 1, got 0"),
    (dict(quality=101), "quality must be 1..100, got 101"),
    (dict(quality=2.5), "quality must be an integer, got 2.5"),
    (dict(psnr="high"), "psnr must be a number of dB (0: lossless), got 'high'"),
    (dict(psnr=201), "psnr must be 0 (lossless) .. 200 dB, got 201"),
    (dict(overlap=-1, format="dzi"), "overlap must be >= 0, got -1"),
    (dict(overlap=1), "overlap applies to Deep Zoom (format dzi) only"),
    (dict(format="dzi", tile_size=4, overlap=3), "overlap must be at most half the tile size (2), got 3"),
    (dict(threads=0), "threads must be >= 1, got 0"),
    (dict(background=(1, 2)), "background must be three integers 0..255, got (1, 2)"),
    (dict(background=(0, 0, 256)), "background must be three integers 0..255"),
    (dict(max_pixels=0), "max_pixels must be positive, got 0"),
    (dict(on_error="skip"), "on_error must be one of ('raise', 'fill'), got 'skip'"),
])
def test_each_bad_option_raises_invalid_option_error(kw, message):
    with pytest.raises(InvalidOptionError) as info:
        ExportOptions(**kw)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, WsiError)


def test_checks_run_in_export_pyramids_order():
    """Several bad options: the first in the historic order is the one reported."""
    with pytest.raises(InvalidOptionError, match=r"^format must be"):
        ExportOptions(format="x", compression="y", quality=0)
    with pytest.raises(InvalidOptionError, match=r"^quality must be"):
        ExportOptions(quality=0, overlap=-1, threads=0)


def test_tile_size_over_the_tile_limit_is_a_resource_error():
    with limits(max_tile_pixels=256 * 256), \
            pytest.raises(ResourceLimitError, match="tile_size 512 exceeds the max_tile_pixels limit 65536"):
        ExportOptions(tile_size=512)


def test_export_pyramid_checks_options_before_touching_the_source(tmp_path):
    """Option errors come first, even for a source that does not exist, and nothing is written."""
    with pytest.raises(InvalidOptionError, match=r"quality must be 1\.\.100, got 0"):
        export_pyramid(tmp_path / "missing.svs", tmp_path / "out.svs", quality=0)
    with pytest.raises(ValueError, match="background must be three integers"):
        export_pyramid(tmp_path / "missing.svs", tmp_path / "out.svs", background=(1, 2, 3, 4))
    assert list(tmp_path.iterdir()) == []
