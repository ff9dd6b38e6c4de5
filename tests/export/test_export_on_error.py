"""Undecodable source tiles in export-pyramid (issue 14, item 4).

By default an export (``wsitool.export_pyramid``, ``wsitool export-pyramid``,
single and batch) stops at the first undecodable source tile with that tile's
:class:`TileDecodeError` (CLI exit 7) and leaves nothing in the output folder;
``on_error="fill"`` / ``--on-error fill`` paints the tiles with the background,
warns, and records their count in the output, where ``wsitool info`` shows it
(:func:`wsitool.export.painted_tiles`), and in the batch summary.

The corrupt sources are the shared 1-tile ``broken-aperio-unreadable-jpeg.svs``
and a copy of CMU-1 (in ``tmp_path``) with six level-0 tiles zeroed.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import tifffile
from typer.testing import CliRunner

import wsitool
from wsitool import TileWarning, export_pyramid
from wsitool.cli import app
from wsitool.errors import TileDecodeError
from wsitool.export import PAINTED_KEY, painted_tiles

from helpers import shared_sample

runner = CliRunner()

#: The region of CMU-1 exported (level-0 pixels) and the 240 x 240 tiles zeroed in the copy:
#: rows 5 and 6, columns 0..2, all inside the region.
REGION = (0, 960, 720, 720)
ZEROED = [(c, r) for r in (5, 6) for c in (0, 1, 2)]


def zeroed_cmu1(tmp_path: Path) -> Path:
    """A copy of CMU-1 whose level-0 tiles :data:`ZEROED` hold zeros (undecodable)."""
    src = shared_sample("aperio-cmu1-small-region-jpeg.svs")
    data = bytearray(src.read_bytes())
    with tifffile.TiffFile(src) as tf:
        page = tf.pages[0]
        across = -(-page.imagewidth // page.tilewidth)
        for c, r in ZEROED:
            i = r * across + c
            off, n = page.dataoffsets[i], page.databytecounts[i]
            data[off:off + n] = bytes(n)
    out = tmp_path / "in" / "cmu1-zeroed.svs"
    out.parent.mkdir()
    out.write_bytes(bytes(data))
    return out


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ---------------------------------------------------------------------- API


@pytest.mark.parametrize("fmt,name", [("tiff", "o.svs"), ("ome-tiff", "o.ome.tif"), ("dzi", "o.dzi")])
def test_export_stops_at_first_undecodable_tile_leaving_nothing(tmp_path, fmt, name):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    src = shared_sample("broken-aperio-unreadable-jpeg.svs")
    with pytest.raises(TileDecodeError, match=r"level 0, tile \(col 0, row 0\)"):
        export_pyramid(src, out_dir / name, format=fmt)
    assert listing(out_dir) == []  # no output, no partial, no tiles folder


def test_zeroed_tiles_stop_the_export_by_default(tmp_path):
    src = zeroed_cmu1(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(TileDecodeError) as info:
        export_pyramid(src, out_dir / "o.svs", region=REGION, compression="deflate")
    assert (info.value.col, info.value.row) in ZEROED
    assert listing(out_dir) == []


@pytest.mark.parametrize("fmt,name", [("tiff", "o.svs"), ("ome-tiff", "o.ome.tif")])
def test_fill_paints_warns_and_records_the_count(tmp_path, fmt, name):
    src = zeroed_cmu1(tmp_path)
    out = tmp_path / name
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = export_pyramid(src, out, format=fmt, region=REGION, compression="deflate",
                             on_error="fill", background=(0, 255, 0))
    assert res.tiles_failed == len(ZEROED)
    tile_warnings = [w for w in caught if issubclass(w.category, TileWarning)]
    assert len(tile_warnings) == 1
    assert f"{len(ZEROED)} undecodable source tile(s) painted" in str(tile_warnings[0].message)
    with wsitool.open_slide(out) as s:
        assert painted_tiles(s) == len(ZEROED)
        # a zeroed tile (col 0, row 5: level-0 rows 1200..1439) is background in the output
        got = s.read_region((0, 1200 - REGION[1]), 0, (240, 240), mode="rgb")
        assert (got == np.array([0, 255, 0], np.uint8)).all()
    if fmt == "tiff":
        openslide = pytest.importorskip("openslide")
        osr = openslide.OpenSlide(str(out))
        try:
            assert osr.properties[f"aperio.{PAINTED_KEY}"] == str(len(ZEROED))
        finally:
            osr.close()
    else:
        ome_types = pytest.importorskip("ome_types")
        with tifffile.TiffFile(out) as tf:
            xml = tf.ome_metadata
        ome_types.validate_xml(xml)  # the annotation keeps the OME-XML valid
        ann = ome_types.from_xml(xml).structured_annotations.map_annotations[0]
        assert ann.namespace == "wsitool"
        assert {m.k: m.value for m in ann.value.ms} == {PAINTED_KEY: str(len(ZEROED))}


def test_fill_on_a_clean_slide_records_zero_and_default_records_nothing(tmp_path):
    src = shared_sample("aperio-cmu1-small-region-jpeg.svs")
    export_pyramid(src, tmp_path / "fill.svs", region=(0, 0, 256, 256), on_error="fill")
    export_pyramid(src, tmp_path / "raise.svs", region=(0, 0, 256, 256))
    with wsitool.open_slide(tmp_path / "fill.svs") as s:
        assert painted_tiles(s) == 0
    with wsitool.open_slide(tmp_path / "raise.svs") as s:
        assert painted_tiles(s) is None
    with wsitool.open_slide(src) as s:  # not a wsitool export
        assert painted_tiles(s) is None


def test_fill_dzi_records_the_count_in_the_dzi(tmp_path):
    src = shared_sample("broken-aperio-unreadable-jpeg.svs")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TileWarning)
        res = export_pyramid(src, tmp_path / "o.dzi", format="dzi", on_error="fill")
    assert res.tiles_failed == 1
    assert f"<!-- wsitool: {PAINTED_KEY}=1 -->" in (tmp_path / "o.dzi").read_text()


def test_bad_on_error_value_is_refused(tmp_path):
    src = shared_sample("aperio-cmu1-small-region-jpeg.svs")
    with pytest.raises(ValueError, match="on_error"):
        export_pyramid(src, tmp_path / "o.svs", on_error="ignore")
    assert listing(tmp_path) == []


def test_export_many_counts_an_undecodable_slide_failed_unless_fill(tmp_path):
    from wsitool.distributed import export_many

    bad = str(zeroed_cmu1(tmp_path))
    good = str(shared_sample("aperio-cmu1-small-region-jpeg.svs"))
    out = tmp_path / "out"
    outcomes = export_many([bad, good], out, scheduler="sequential", region=REGION,
                           compression="deflate")
    assert [o.status for o in outcomes] == ["failed", "ok"]
    assert "TileDecodeError" in outcomes[0].error_types
    assert not (out / "cmu1-zeroed.tiff").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TileWarning)
        outcomes = export_many([bad, good], tmp_path / "out2", scheduler="sequential", region=REGION,
                               compression="deflate", on_error="fill")
    assert [o.status for o in outcomes] == ["ok", "ok"]
    assert outcomes[0].result.tiles_failed == len(ZEROED)


# ---------------------------------------------------------------------- CLI


def test_cli_export_exit_7_nothing_written_then_fill_and_info(tmp_path):
    src = shared_sample("broken-aperio-unreadable-jpeg.svs")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "x.svs"
    res = runner.invoke(app, ["export-pyramid", str(src), str(out), "--quiet"])
    assert res.exit_code == 7, res.output
    assert "level 0, tile (col 0, row 0)" in res.output
    assert listing(out_dir) == []

    res = runner.invoke(app, ["export-pyramid", str(src), str(out), "--quiet", "--on-error", "fill"])
    assert res.exit_code == 0, res.output
    assert "1 undecodable source tile(s) were painted" in res.output

    res = runner.invoke(app, ["info", str(out)])
    assert res.exit_code == 0, res.output
    assert "painted tiles: 1" in res.output
    res = runner.invoke(app, ["info", "--json", str(out)])
    assert json.loads(res.stdout)["painted_tiles"] == 1


def test_cli_batch_fails_the_slide_unless_fill_and_summarises_painted(tmp_path):
    bad = zeroed_cmu1(tmp_path)
    good = shared_sample("aperio-cmu1-small-region-jpeg.svs")
    region = [str(v) for v in REGION]
    out = tmp_path / "batch"
    res = runner.invoke(app, ["export-pyramid", str(bad), str(good), str(out), "--scheduler",
                              "sequential", "--quiet", "--compression", "deflate", "--region", *region])
    assert res.exit_code == 7, res.output
    assert "1 exported, 0 skipped, 1 failed" in res.output
    assert not (out / "cmu1-zeroed.tiff").exists()

    out2 = tmp_path / "batch2"
    res = runner.invoke(app, ["export-pyramid", str(bad), str(good), str(out2), "--scheduler",
                              "sequential", "--quiet", "--compression", "deflate", "--region", *region,
                              "--on-error", "fill"])
    assert res.exit_code == 0, res.output
    assert f"2 exported, 0 skipped, 0 failed of 2 slide(s) into {out2}; {len(ZEROED)} undecodable " \
           "tile(s) painted in 1 slide(s)" in " ".join(res.output.split())
    with wsitool.open_slide(out2 / "cmu1-zeroed.tiff") as s:
        assert painted_tiles(s) == len(ZEROED)


def test_an_unnamed_error_raised_while_exporting_names_the_slide(tmp_path, monkeypatch):
    """The layers below raise without the file's name (a tile table found cut short when the
    export first reads it, a codec's failure): the export names the slide once, as the facade
    does, and leaves no output."""
    from wsitool.errors import CorruptFileError
    from wsitool.export import pyramid

    from helpers import REPO_SAMPLES

    def cut_short(*args, **kwargs):
        raise CorruptFileError("tile table at byte 4096 is cut short by the end of the file")

    monkeypatch.setattr(pyramid, "_export_reencoded", cut_short)
    slide = REPO_SAMPLES / "sample-aperio-jpeg.svs"
    with pytest.raises(CorruptFileError) as info:
        export_pyramid(slide, tmp_path / "out.tiff")
    assert str(info.value) == f"{slide}: tile table at byte 4096 is cut short by the end of the file"
    assert list(tmp_path.iterdir()) == []
