"""Scale-out on Dask: lazy level arrays, batch region reads, batch exports.

Dask tests start one ``LocalCluster`` of two single-threaded worker processes
for the module; they skip with a reason when ``dask[array]`` / ``distributed``
are not installed.  The tests of the no-Dask fallback run either way.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import wsitool
from wsitool import distributed as D
from wsitool.cli import app, exit_code_for
from wsitool.codec.pool import get_pool
from wsitool.slide import pyramid_levels

from helpers import REPO_SAMPLES, SHARED_SAMPLES, shared_sample

HAVE_DASK = all(importlib.util.find_spec(m) is not None for m in ("dask", "distributed"))
needs_dask = pytest.mark.skipif(
    not HAVE_DASK, reason='dask[array] and distributed are not installed (pip install "wsitool[dask]")'
)
HAVE_EXPORT = importlib.util.find_spec("wsitool.export") is not None
needs_export = pytest.mark.skipif(not HAVE_EXPORT, reason="wsitool.export (issue 4) is not present")

SAMPLE = REPO_SAMPLES / "sample-aperio-jpeg.svs"


@pytest.fixture(scope="module")
def client():
    if not HAVE_DASK:
        pytest.skip('dask[array] and distributed are not installed (pip install "wsitool[dask]")')
    import logging

    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address=":0", silence_logs=logging.ERROR)
    c = Client(cluster)
    yield c
    c.close()
    cluster.close()


def _read_level(path, level):
    with wsitool.open_slide(path) as s:
        return s.read_region((0, 0), level, s.level_dimensions[level], mode="rgb")


# --------------------------------------------------------------------------- to_dask


@needs_dask
@pytest.mark.parametrize("name,level", [
    ("repo:sample-aperio-jpeg.svs", 0),
    ("aperio-cmu1-small-region-jpeg.svs", 0),
    ("aperio-tcga-cr-7395-jp2k-33005-2level.svs", 1),  # downsample 2.0004..., not an integer
    ("generic-boxes-deflate-4level.tiff", 2),
])
def test_to_dask_equals_whole_level_read(name, level):
    path = REPO_SAMPLES / name[5:] if name.startswith("repo:") else shared_sample(name)
    with wsitool.open_slide(path) as s:
        arr = s.to_dask(level)
        lv = pyramid_levels(s)[level]
        assert arr.shape == (lv.height, lv.width, 3)
        assert arr.dtype == np.uint8
        got = arr.compute(scheduler="sync")
    np.testing.assert_array_equal(got, _read_level(path, level))


@needs_dask
def test_to_dask_slice_reads_only_its_chunks():
    with wsitool.open_slide(SAMPLE) as s:
        arr = s.to_dask(0)
        lv = pyramid_levels(s)[0]
    assert arr.chunksize[:2] == (lv.tile_height, lv.tile_width)
    ys, xs = slice(300, 700), slice(500, 530)
    # chunks the slice overlaps, from the array's own chunk boundaries
    ybounds = np.cumsum((0,) + arr.chunks[0])
    xbounds = np.cumsum((0,) + arr.chunks[1])
    rows = [i for i in range(len(arr.chunks[0])) if ybounds[i] < ys.stop and ybounds[i + 1] > ys.start]
    cols = [j for j in range(len(arr.chunks[1])) if xbounds[j] < xs.stop and xbounds[j + 1] > xs.start]
    expected_chunks = len(rows) * len(cols)
    assert 0 < expected_chunks < arr.npartitions
    pool = get_pool("cpu")
    pool.reset_stats()
    before = D.chunk_read_count()
    part = arr[ys, xs].compute(scheduler="sync")
    assert D.chunk_read_count() - before == expected_chunks
    assert pool.stats().tiles_decoded == expected_chunks  # one tile per chunk
    with wsitool.open_slide(SAMPLE) as s:
        ref = s.read_region((xs.start, ys.start), 0, (30, 400), mode="rgb")
    np.testing.assert_array_equal(part, ref)


@needs_dask
def test_to_dask_graph_pickles_by_path_and_runs_on_cluster(client):
    path = shared_sample("aperio-cmu1-small-region-jpeg.svs")
    with wsitool.open_slide(path) as s:
        arr = s.to_dask(0, chunks=(512, 700))
    blob = pickle.dumps(dict(arr.__dask_graph__()))
    assert os.path.abspath(path).encode() in blob
    assert b"Slide" not in blob  # no open slide object travels
    assert arr.chunksize == (512, 700, 3)
    got = client.compute(arr[1000:2100, 300:1800]).result()
    with wsitool.open_slide(path) as s:
        ref = s.read_region((300, 1000), 0, (1500, 1100), mode="rgb")
    np.testing.assert_array_equal(got, ref)


@needs_dask
def test_to_dask_refuses_a_changed_file(tmp_path):
    copy = tmp_path / "copy.svs"
    shutil.copyfile(SAMPLE, copy)
    arr = wsitool.distributed.level_to_dask(copy, 2)
    st = os.stat(copy)
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    with pytest.raises(wsitool.WsiError, match="changed since"):
        arr.compute(scheduler="sync")


@needs_dask
def test_to_dask_bad_arguments():
    with wsitool.open_slide(SAMPLE) as s:
        with pytest.raises(wsitool.InvalidRegionError):
            s.to_dask(s.level_count)
        with pytest.raises(wsitool.InvalidRegionError):
            s.to_dask(0, chunks="whole")
        with pytest.raises(wsitool.InvalidRegionError):
            s.to_dask(0, chunks=(0, 10))
        with pytest.raises(wsitool.InvalidRegionError, match="pair of integers"):
            s.to_dask(0, chunks=(1, 2, 3))
        with pytest.raises(wsitool.InvalidRegionError, match="integer"):
            s.to_dask(True)
        # the level rule of read_region: an integral float is that level
        assert s.to_dask(1.0).shape == s.to_dask(1).shape == (*s.level_dimensions[1][::-1], 3)


# --------------------------------------------------------------------------- batch regions

REGIONS_CSV = """x,y,level,width,height,name
0,0,0,300,200,first
100,50,1,256,256,
-20,-30,2,100,100,outside-corner
1400,1000,0,300,300,
37,91,0,1,1,px
"""


def _single(path, r, mode="rgba"):
    with wsitool.open_slide(path) as s:
        return s.read_region((r.x, r.y), r.level, (r.width, r.height), mode=mode)


def test_load_regions_csv(tmp_path):
    f = tmp_path / "r.csv"
    f.write_text(REGIONS_CSV)
    reqs = D.load_regions_csv(f)
    assert next(r.name for r in reqs) == "first"
    assert reqs[1].name == "000002_x100_y50_L1_256x256"
    assert (reqs[2].x, reqs[2].y, reqs[2].level, reqs[2].width, reqs[2].height) == (-20, -30, 2, 100, 100)
    bad = tmp_path / "bad.csv"
    for text, match in [
        ("x,y,level,width\n1,2,0,5\n", "missing column"),
        ("x,y,level,width,height\n1,2,0,5,abc\n", "line 2"),
        ("x,y,level,width,height,name\n1,2,0,5,5,a\n1,2,0,5,5,a\n", "duplicate"),
        ("x,y,level,width,height,name\n1,2,0,5,5,../escape\n", "invalid region name"),
    ]:
        bad.write_text(text)
        with pytest.raises(wsitool.InvalidRegionError, match=match):
            D.load_regions_csv(bad)


@pytest.mark.parametrize("fmt", ["npy", "png"])
def test_read_regions_threads_equal_single_reads(tmp_path, fmt):
    import imagecodecs

    f = tmp_path / "r.csv"
    f.write_text(REGIONS_CSV)
    reqs = D.load_regions_csv(f)
    out = tmp_path / "out"
    seen = []
    outcomes = D.read_regions(SAMPLE, f, out, format=fmt, progress=seen.append)
    assert [o.status for o in outcomes] == ["ok"] * len(reqs)
    assert len(seen) == len(reqs)
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{r.name}.{fmt}" for r in reqs)
    for r, o in zip(reqs, outcomes, strict=True):
        data = (np.load(o.path) if fmt == "npy"
                else imagecodecs.png_decode(Path(o.path).read_bytes()))
        np.testing.assert_array_equal(data, _single(SAMPLE, r))


def test_read_regions_pack_npz_and_invalid_level(tmp_path):
    f = tmp_path / "r.csv"
    f.write_text(REGIONS_CSV)
    reqs = D.load_regions_csv(f)
    outcomes = D.read_regions(SAMPLE, reqs, tmp_path, pack=True, mode="rgb", workers=2)
    store = tmp_path / "sample-aperio-jpeg-regions.npz"
    assert all(o.path == str(store) for o in outcomes)
    with np.load(store) as z:
        assert sorted(z.files) == sorted(r.name for r in reqs)
        for r in reqs:
            np.testing.assert_array_equal(z[r.name], _single(SAMPLE, r, "rgb"))
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]
    bad = [D.RegionRequest(0, 0, 7, 10, 10, "nope")]
    with pytest.raises(wsitool.InvalidRegionError, match="level 7"):
        D.read_regions(SAMPLE, bad, tmp_path / "x")


def test_read_regions_corrupt_tile_reported_others_written(tmp_path):
    path = shared_sample("broken-aperio-unreadable-jpeg.svs")
    with wsitool.open_slide(path) as s:
        w, h = s.dimensions
    reqs = [D.RegionRequest(0, 0, 0, w, h, "whole"), D.RegionRequest(w + 10, 0, 0, 4, 4, "outside")]
    outcomes = D.read_regions(path, reqs, tmp_path, format="npy")
    assert outcomes[0].status == "failed" and "TileDecodeError" in outcomes[0].error_types
    assert outcomes[1].status == "ok"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside.npy"]


@needs_dask
def test_read_regions_on_cluster_equal_single_reads(tmp_path, client):
    f = tmp_path / "r.csv"
    f.write_text(REGIONS_CSV)
    reqs = D.load_regions_csv(f)
    outcomes = D.read_regions(SAMPLE, f, tmp_path / "files", format="npy", scheduler=client, batch_size=2)
    for r, o in zip(reqs, outcomes, strict=True):
        assert o.status == "ok"
        np.testing.assert_array_equal(np.load(o.path), _single(SAMPLE, r))
    outcomes = D.read_regions(SAMPLE, f, tmp_path / "pack", pack=True, scheduler=client)
    with np.load(outcomes[0].path) as z:
        for r in reqs:
            np.testing.assert_array_equal(z[r.name], _single(SAMPLE, r))


def test_cli_read_region_batch_and_option_errors(tmp_path):
    f = tmp_path / "r.csv"
    f.write_text(REGIONS_CSV)
    runner = CliRunner()
    out = tmp_path / "o"
    res = runner.invoke(app, ["read-region", str(SAMPLE), "--regions", str(f), "--output-dir", str(out),
                              "--format", "npy", "--quiet"])
    assert res.exit_code == 0, res.output
    reqs = D.load_regions_csv(f)
    for r in reqs:
        np.testing.assert_array_equal(np.load(out / f"{r.name}.npy"), _single(SAMPLE, r))
    # mixing single-region and batch options, or missing pieces: usage errors (exit 2)
    for args in (["--regions", str(f), "--output-dir", str(out), "--size", "3", "3"],
                 ["--regions", str(f)],
                 ["--size", "3", "3"],
                 ["--size", "3", "3", "-o", str(tmp_path / "a.png"), "--pack"],
                 ["--regions", str(f), "--output-dir", str(out), "--format", "jpg"]):
        res = runner.invoke(app, ["read-region", str(SAMPLE), *args])
        assert res.exit_code == 2, (args, res.output)
    # the single-region form still works
    res = runner.invoke(app, ["read-region", str(SAMPLE), "--size", "5", "4", "-o", str(tmp_path / "a.npy")])
    assert res.exit_code == 0
    assert np.load(tmp_path / "a.npy").shape == (4, 5, 4)


# --------------------------------------------------------------------------- batch export


def _batch_sources(tmp_path):
    """Small real and generated slides, plus two corrupt ones."""
    good = [REPO_SAMPLES / "sample-aperio-jpeg.svs"]
    for name in ("aperio-openslide-small-16px.svs", "generic-boxes-deflate-4level.tiff",
                 "tiled-jpeg-ycbcr-48x32tiles-2pages.tif"):
        if (SHARED_SAMPLES / name).exists():
            good.append(SHARED_SAMPLES / name)
    if len(good) < 3:  # ../shared absent: the repo's own samples only
        good += [REPO_SAMPLES / "sample-ome-pyramid.ome.tif", REPO_SAMPLES / "sample-aperio-j2k.svs"]
    corrupt = tmp_path / "in" / "corrupt.svs"
    corrupt.parent.mkdir()
    # TIFF header whose first IFD lies beyond the end of the file
    corrupt.write_bytes(b"II*\x00" + (10**6).to_bytes(4, "little") + bytes(100))
    return [str(p) for p in good], str(corrupt)


def _check_export(source, output, single_dir):
    """Output opens in wsitool and matches a single in-process export of the source."""
    from wsitool.export import export_pyramid

    ref = single_dir / os.path.basename(output)
    export_pyramid(source, ref, format="tiff", compression="deflate")
    with wsitool.open_slide(output) as got, wsitool.open_slide(ref) as want, \
            wsitool.open_slide(source) as src:
        assert got.level_dimensions[0] == src.level_dimensions[0]
        assert got.level_dimensions == want.level_dimensions
        # level 0 equals the source itself (deflate is lossless; transparent -> white)
        w, h = src.level_dimensions[0]
        loc, size = (max(0, w // 2 - 256), max(0, h // 2 - 256)), (min(w, 512), min(h, 512))
        rgba = src.read_region(loc, 0, size).astype(np.uint32)
        a = rgba[..., 3:4]
        expected = ((rgba[..., :3] * a + 255 * (255 - a) + 127) // 255).astype(np.uint8)
        np.testing.assert_array_equal(got.read_region(loc, 0, size, mode="rgb"), expected)
        lv = got.level_count - 1
        np.testing.assert_array_equal(
            got.read_region((0, 0), lv, got.level_dimensions[lv], mode="rgb"),
            want.read_region((0, 0), lv, want.level_dimensions[lv], mode="rgb"))


@needs_dask
@needs_export
def test_export_many_on_cluster_corrupt_and_resume(tmp_path, client):
    good, corrupt = _batch_sources(tmp_path)
    sources = [*good[:2], corrupt, *good[2:]]
    out = tmp_path / "out"
    seen, tiles = [], {}
    outcomes = D.export_many(sources, out, scheduler=client, compression="deflate", progress=seen.append,
                             tile_progress=lambda i, done, total: tiles.__setitem__(i, (done, total)))
    assert len(seen) == len(sources)
    for i, o in enumerate(outcomes):  # tile progress forwarded from the workers
        if o.status == "ok":
            assert tiles[i] == (o.result.tiles_written, o.result.tiles_written)
    by_src = {o.source: o for o in outcomes}
    assert by_src[corrupt].status == "failed"
    assert "corrupt.svs" in by_src[corrupt].error
    assert not (out / "corrupt.tiff").exists()
    single = tmp_path / "single"
    single.mkdir()
    for src in good:
        o = by_src[src]
        assert o.status == "ok", o.error
        _check_export(src, o.output, single)
    assert len({o.worker for o in outcomes if o.status == "ok"}) >= 1
    # resume: completed outputs are skipped, a missing one is redone
    mtimes = {o.output: os.stat(o.output).st_mtime_ns for o in outcomes if o.status == "ok"}
    redo = outcomes[0].output
    os.unlink(redo)
    again = D.export_many(sources, out, scheduler=client, compression="deflate")
    status = {o.output: o.status for o in again}
    assert status[redo] == "ok"
    for path, mt in mtimes.items():
        if path != redo:
            assert status[path] == "skipped"
            assert os.stat(path).st_mtime_ns == mt
    assert {o.source: o.status for o in again}[corrupt] == "failed"


@needs_dask
@needs_export
def test_cli_export_pyramid_batch_on_scheduler_address(tmp_path, client):
    good, corrupt = _batch_sources(tmp_path)
    listing = tmp_path / "list.txt"
    listing.write_text("\n".join([*good[:2], corrupt]) + "\n# a comment\n\n")
    out = tmp_path / "out"
    runner = CliRunner()
    res = runner.invoke(app, ["export-pyramid", str(out), "--from-list", str(listing),
                              "--scheduler", client.scheduler.address, "--compression", "deflate",
                              "--quiet"])
    with pytest.raises(wsitool.WsiError) as info:
        wsitool.open_slide(corrupt)
    assert res.exit_code == exit_code_for(info.value) != 0, res.output  # the corrupt slide's code
    assert "corrupt.svs" in res.output
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(
        D.export_output_path(s, out).name for s in good[:2])
    res = runner.invoke(app, ["export-pyramid", str(out), "--from-list", str(listing),
                              "--scheduler", client.scheduler.address, "--compression", "deflate",
                              "--quiet"])  # the same options: resumed (other options re-export)
    assert "2 skipped" in res.output


def test_export_many_names_must_not_collide(tmp_path):
    a = tmp_path / "a" / "slide.svs"
    b = tmp_path / "b" / "slide.svs"
    with pytest.raises(D.BatchOptionError, match="both be exported"):
        D.export_many([a, b], tmp_path / "out", scheduler="sequential")


def test_expand_sources_glob_and_list(tmp_path):
    for n in ("b.svs", "a.svs", "c.tif"):
        (tmp_path / n).write_bytes(b"")
    listing = tmp_path / "l.txt"
    listing.write_text("c.tif\n# skip\n\na.svs\n")
    got = D.expand_sources([str(tmp_path / "*.svs")], listing)
    assert [os.path.basename(p) for p in got] == ["a.svs", "b.svs", "c.tif"]
    with pytest.raises(FileNotFoundError, match="matches no file"):
        D.expand_sources([str(tmp_path / "*.nothing")])


# --------------------------------------------------------------------------- without Dask


@pytest.fixture
def no_dask(monkeypatch):
    """Make dask / distributed unimportable in this process."""
    for mod in list(sys.modules):
        if mod == "dask" or mod.startswith(("dask.", "distributed")):
            monkeypatch.delitem(sys.modules, mod)
    for mod in ("dask", "dask.array", "distributed"):
        monkeypatch.setitem(sys.modules, mod, None)


def test_without_dask_tcp_scheduler_fails_with_one_line(no_dask, tmp_path):
    assert not D.dask_available()
    with pytest.raises(D.DaskUnavailableError, match="wsitool\\[dask\\]"):
        D.export_many([SAMPLE], tmp_path, scheduler="tcp://127.0.0.1:8786")
    res = CliRunner().invoke(app, ["export-many", str(SAMPLE), str(tmp_path),
                                   "--scheduler", "tcp://127.0.0.1:8786"])
    assert res.exit_code == 1
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "dask" in lines[0].lower()
    # the deprecated spelling (export-pyramid with --scheduler): its one warning line, then the same line
    old = CliRunner().invoke(app, ["export-pyramid", str(SAMPLE), str(tmp_path),
                                   "--scheduler", "tcp://127.0.0.1:8786"])
    assert old.exit_code == 1
    assert [ln for ln in old.output.splitlines() if ln.strip()] == [
        "wsitool: warning: export-pyramid with several sources is deprecated; use export-many", lines[0]]


@needs_export
def test_without_dask_several_slides_run_sequentially(no_dask, tmp_path):
    good, corrupt = _batch_sources(tmp_path)
    tiles = {}
    outcomes = D.export_many([good[0], corrupt, good[1]], tmp_path / "out", compression="deflate",
                             tile_progress=lambda i, done, total: tiles.__setitem__(i, (done, total)))
    assert [o.status for o in outcomes] == ["ok", "failed", "ok"]
    assert tiles[0] == (outcomes[0].result.tiles_written,) * 2
    assert len({o.worker for o in outcomes}) == 1  # all in this process
    assert outcomes[0].worker.endswith(f":{os.getpid()}")


def test_read_regions_pack_zarr(tmp_path):
    zarr = pytest.importorskip("zarr", reason="zarr is not installed (optional, for --pack --format zarr)")
    f = tmp_path / "r.csv"
    f.write_text(REGIONS_CSV)
    reqs = D.load_regions_csv(f)
    outcomes = D.read_regions(SAMPLE, reqs, tmp_path, pack=True, format="zarr", mode="rgb")
    group = zarr.open_group(outcomes[0].path, mode="r")
    for r in reqs:
        np.testing.assert_array_equal(group[r.name][...], _single(SAMPLE, r, "rgb"))


@needs_dask
def test_read_regions_own_local_cluster(tmp_path, monkeypatch):
    """scheduler="local" starts a LocalCluster of worker processes, runs the reads
    there, and closes it."""
    import distributed

    made = []

    class SpyCluster(distributed.LocalCluster):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append((self, [type(w).__name__ for w in self.workers.values()]))

    monkeypatch.setattr(distributed, "LocalCluster", SpyCluster)
    reqs = [D.RegionRequest(200, 300, 0, 64, 48, "a"), D.RegionRequest(0, 0, 2, 384, 288, "b")]
    outcomes = D.read_regions(SAMPLE, reqs, tmp_path, format="npy", scheduler="local")
    for r, o in zip(reqs, outcomes, strict=True):
        np.testing.assert_array_equal(np.load(o.path), _single(SAMPLE, r))
    assert len(made) == 1
    cluster, kinds = made[0]
    assert kinds and set(kinds) == {"Nanny"}  # worker processes, not threads of this one
    assert cluster.status.name == "closed"
