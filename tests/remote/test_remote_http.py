"""Slides read over HTTP from a real nginx equal the local reads; requests and bytes of the bench slide."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import tifffile

import wsitool
from wsitool.slide import pyramid_levels

from helpers import NO_SHARED, SHARED_SAMPLES, tiff_samples

# nginx_factory: a fixture of remote_helpers (registered by tests/conftest.py)

pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")

REPO = Path(__file__).resolve().parents[2]


def _open_both(path: Path, url: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            local = wsitool.open_slide(path)
        except wsitool.WsiError as exc:
            local = exc
        try:
            remote = wsitool.open_slide(url)
        except wsitool.WsiError as exc:
            remote = exc
    return local, remote


@pytest.mark.parametrize("sample", tiff_samples(), ids=lambda p: p.name)
def test_every_sample_reads_the_same_over_http(sample, nginx_factory):
    srv = nginx_factory(SHARED_SAMPLES)
    local, remote = _open_both(sample, srv.url + sample.name)
    if isinstance(local, Exception):  # a broken sample: the same error class, naming the URL
        assert type(remote) is type(local), (remote, local)
        assert srv.url + sample.name in str(remote)
        return
    assert not isinstance(remote, Exception), remote
    with local, remote:
        assert remote.remote["protocol"] == "http" and remote.remote["size"] == sample.stat().st_size
        assert remote.level_dimensions == local.level_dimensions
        assert dict(remote.properties) == dict(local.properties)
        assert list(remote.associated_images) == list(local.associated_images)
        for name in local.associated_images:
            try:
                want = local.associated_images[name]
            except wsitool.WsiError as exc:
                with pytest.raises(type(exc)):
                    remote.associated_images[name]
                continue
            assert np.array_equal(remote.associated_images[name], want), name
        for i, (w, h) in enumerate(local.level_dimensions):
            if w * h > 40_000_000:  # the biggest levels: a band through the middle
                loc, size = (0, int(local.level_downsamples[i] * h // 2)), (w, min(h, 512))
            else:
                loc, size = (0, 0), (w, h)
            mode = "raw"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    want = local.read_region(loc, i, size, mode=mode, on_error="fill")
                except wsitool.WsiError as exc:
                    with pytest.raises(type(exc)):
                        remote.read_region(loc, i, size, mode=mode, on_error="fill")
                    continue
                got = remote.read_region(loc, i, size, mode=mode, on_error="fill")
            assert np.array_equal(got, want), (sample.name, i)


def test_presigned_style_url_and_redaction(nginx_factory):
    if not SHARED_SAMPLES.is_dir():
        pytest.skip(NO_SHARED)
    srv = nginx_factory(SHARED_SAMPLES)
    name = "aperio-cmu1-small-region-jpeg.svs"
    url = srv.url + name + "?X-Amz-Credential=AKIDSECRET&X-Amz-Signature=deadbeef"
    before = len(srv.requests_settled())
    with wsitool.open_slide(url) as s:
        assert "deadbeef" not in s.path and "AKIDSECRET" not in s.path and s.path.endswith("?<redacted>")
        assert all("deadbeef" not in str(v) for v in s.properties.values())
        assert s.remote["open_requests"] >= 1
        s.read_region((0, 0), 0, (512, 512))
    logged = srv.requests()[before:]
    assert logged and all(status == 206 for status, _, _ in logged)  # only ranged GETs, no HEAD
    assert logged[0][2] == "bytes=0-65535"  # the head fetch is 64 KiB
    missing = srv.url + "nope.svs?token=abc123"
    r = subprocess.run([sys.executable, "-m", "wsitool", "info", missing], capture_output=True, text=True,
                       cwd=REPO)
    assert r.returncode == 9 and "abc123" not in r.stderr and "nope.svs" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_cli_reads_a_url(nginx_factory, tmp_path):
    if not SHARED_SAMPLES.is_dir():
        pytest.skip(NO_SHARED)
    srv = nginx_factory(SHARED_SAMPLES)
    url = srv.url + "aperio-cmu1-small-region-jpeg.svs"
    out = tmp_path / "r.npy"
    r = subprocess.run([sys.executable, "-m", "wsitool", "read-region", url, "-l", "100", "200", "-s", "300", "250",
                        "--mode", "rgb", "-o", str(out), "--storage-option", "timeout=10",
                        "--storage-option", "headers.X-Test=1"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    with wsitool.open_slide(SHARED_SAMPLES / "aperio-cmu1-small-region-jpeg.svs") as s:
        assert np.array_equal(np.load(out), s.read_region((100, 200), 0, (300, 250), mode="rgb"))
    r = subprocess.run([sys.executable, "-m", "wsitool", "info", "--json", url], capture_output=True, text=True,
                       cwd=REPO)
    assert r.returncode == 0, r.stderr
    import json
    data = json.loads(r.stdout)
    assert data["remote"]["protocol"] == "http" and data["remote"]["open_requests"] >= 1
    r = subprocess.run([sys.executable, "-m", "wsitool", "info", url, "--storage-option", "bogus"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and "KEY=VALUE" in r.stderr


@pytest.fixture(scope="module")
def bench_slide(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    out = folder / "b.svs"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "make_bench_slide.py"), str(out)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"could not build the bench slide: {r.stderr.strip()[-200:]}")
    return out


def _tiles_bytes(lv, x, y, w, h):
    c0, c1 = x // lv.tile_width, (x + w - 1) // lv.tile_width
    r0, r1 = y // lv.tile_height, (y + h - 1) // lv.tile_height
    return sum(int(lv.tiles.bytecounts[r * lv.tiles_across + c]) for r in range(r0, r1 + 1)
               for c in range(c0, c1 + 1))


def _table_span(path):
    """``(first byte, end)`` of level 0's TileOffsets and TileByteCounts arrays in the file."""
    with tifffile.TiffFile(path) as tif:
        tags = [tif.pages[0].tags[code] for code in (324, 325)]
        return min(t.valueoffset for t in tags), max(t.valueoffset + t.valuebytecount for t in tags)


def _ranges(logged):
    out = []
    for _, _, rng in logged:
        a, b = rng.removeprefix("bytes=").split("-")
        out.append((int(a), int(b) + 1))
    return out


def test_request_and_byte_accounting_on_the_bench_slide(bench_slide, nginx_factory):
    srv = nginx_factory(bench_slide.parent)
    before = len(srv.requests_settled())
    table = _table_span(bench_slide)
    with wsitool.open_slide(srv.url + bench_slide.name) as s:
        size = s.remote["size"]
        opened = s.remote["open_requests"], s.remote["open_bytes"]
        # the head fetch and the IFD chain (3 levels + thumbnail/label/macro IFDs after their
        # data), counted by the source; no level's tile table yet, but the smallest level's
        # (openslide.quickhash-1 hashes its tiles), which lies beside its IFD
        assert opened[0] <= 1 + 6, opened
        levels = pyramid_levels(s)
        assert not levels[0].tiles.loaded and not levels[1].tiles.loaded
        at_open = _ranges(srv.requests_when(before + opened[0])[before:])
        assert len(at_open) == opened[0]
        # level 0's table (bytes 602 to 251,102 of this BigTIFF) is not fetched: only what the
        # head fetch (the first 64 KiB) and the 64 KiB block of JPEGTables (after it) hold
        assert at_open[0] == (0, 64 * 1024)
        assert all(b - a == 64 * 1024 for a, b in at_open)
        middle = sum(table) // 2
        assert not any(a <= middle < b for a, b in at_open)
        src = s._source
        s0 = src.stats()
        s.read_region((20000, 15000), 0, (256, 256))
        after_small = src.stats()
        assert after_small["bytes"] <= 0.01 * size, (after_small, size)
        first_read = _ranges(srv.requests_when(before + after_small["requests"])[before + opened[0]:])
        # level 0's table is first used here: one request for both arrays, then the tiles
        assert sum(a < table[1] and table[0] < b for a, b in first_read) == 1, (first_read, table)
        assert after_small["requests"] - s0["requests"] <= 1 + 2  # 256 px: at most 2 rows of tiles
        lv = levels[0]
        x, y = 10100, 8050
        s0 = src.stats()
        s.read_region((x, y), 0, (1024, 1024))
        s1 = src.stats()
        need = _tiles_bytes(lv, x, y, 1024, 1024)
        assert s1["bytes"] - s0["bytes"] <= 1.25 * need + 64 * 1024, (s1["bytes"] - s0["bytes"], need)
        # merged per tile row (5 rows of tiles), not one request per tile (25)
        assert s1["requests"] - s0["requests"] <= 5
        counted = src.stats()
    logged = srv.requests_when(before + counted["requests"])[before:]
    # the server's access log agrees with the source's counters
    assert len(logged) == counted["requests"]
    assert sum(sent for _, sent, _ in logged) == counted["bytes"]


def test_patch_plans_from_a_url_keep_no_token(nginx_factory, tmp_path):
    """`patches plan` and `extract` read a slide by URL; the plan records it without its query; a failing
    URL's token is never printed (the trial found `patches plan` printing it as a local path)."""
    pytest.importorskip("cv2", reason="the patches extra (opencv-python-headless) is not installed")
    pytest.importorskip("pyarrow", reason="the patches extra (pyarrow) is not installed")
    from wsitool.patches import read_plan

    srv = nginx_factory(REPO / "samples")
    url = srv.url + "sample-aperio-jpeg.svs"
    plan_file = tmp_path / "p.parquet"
    r = subprocess.run([sys.executable, "-m", "wsitool", "patches", "plan", url + "?sig=SECRET9", "--mpp", "0.5",
                        "--size", "128", "--no-mask", "-o", str(plan_file), "--quiet"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert "SECRET9" not in r.stdout + r.stderr
    plan = read_plan(plan_file)
    assert plan.slide.path == url and plan.slide.size == (REPO / "samples" / "sample-aperio-jpeg.svs").stat().st_size
    shards = tmp_path / "shards"   # made when missing
    r = subprocess.run([sys.executable, "-m", "wsitool", "patches", "extract", str(plan_file), "-o", str(shards),
                        "--format", "png", "--quiet"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert len(list(shards.glob("*.tar"))) == 1
    r = subprocess.run([sys.executable, "-m", "wsitool", "patches", "plan", srv.url + "nope.svs?sig=SECRET9",
                        "--mpp", "0.5", "-o", str(tmp_path / "q.parquet")], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 9 and "SECRET9" not in r.stderr and "nope.svs" in r.stderr


def test_the_compiled_loop_reads_remote_jpeg_tiles(nginx_factory, monkeypatch):
    """A remote JPEG region goes through the compiled loop (its tiles from the fetched ranges:
    ``RemoteSource.gather``), the same pixels as the local read, no request beyond the region's."""
    from wsitool.codec import jpegloop
    if jpegloop._load() is None:
        pytest.skip(f"the compiled loop is not built: {jpegloop._reason}")
    sample = REPO / "samples" / "sample-aperio-jpeg.svs"
    runs = []
    real_run = jpegloop.RegionJobs.run
    monkeypatch.setattr(jpegloop.RegionJobs, "run", lambda self, pool: (runs.append(1), real_run(self, pool))[1])
    srv = nginx_factory(sample.parent)
    with wsitool.open_slide(srv.url + sample.name) as remote, wsitool.open_slide(sample) as local:
        for level in range(remote.level_count):
            w, h = remote.level_dimensions[level]
            for loc, size in (((0, 0), (min(w, 700), min(h, 500))), ((w // 3, h // 4), (300, 257))):
                scale = remote.level_downsamples[level]
                at = (int(loc[0] * scale), int(loc[1] * scale))
                for threads in (1, 2):
                    runs.clear()
                    a = remote.read_region(at, level, size, mode="rgb", threads=threads)
                    assert runs, (level, loc)
                    np.testing.assert_array_equal(a, local.read_region(at, level, size, mode="rgb"))


def test_advised_ranges_of_a_small_slide_stay_within_their_budget(nginx_factory):
    """Overlapping regions advise overlapping ranges; the ranges a slide keeps stay within
    twice the object's size (or the 8 MiB floor), not the 64 MiB of a large slide (seen in a
    stress run over HTTP as RSS rising 0.5 MB per 1,000 reads of a 1.9 MB slide)."""
    import random
    from concurrent.futures import ThreadPoolExecutor
    sample = REPO / "samples" / "sample-aperio-jpeg.svs"
    srv = nginx_factory(sample.parent)
    with wsitool.open_slide(srv.url + sample.name) as s:
        src = s._source.readahead
        budget = src.budget()
        assert budget == max(src.EXTENT_FLOOR, 2 * src.size) < src.EXTENT_BYTES
        w0, h0 = s.dimensions
        rnd = random.Random(0)
        boxes = [(rnd.randint(64, 300), rnd.randint(64, 300)) for _ in range(1500)]
        spots = [(rnd.randrange(0, w0 - w), rnd.randrange(0, h0 - h), w, h) for w, h in boxes]
        seen = []

        def one(spot):
            x, y, w, h = spot
            s.read_region((x, y), 0, (w, h), mode="rgb")
            seen.append(src.held)

        with ThreadPoolExecutor(4) as ex:
            list(ex.map(one, spots))
        # (one advice may add its ranges before the trim that follows it)
        assert max(seen) <= budget + 4 * 1024 * 1024, (max(seen), budget)
        assert src.held <= budget


def test_reads_inside_advised_ranges_are_bytes_of_the_file(nginx_factory):
    """obstore's answers are kept uncopied (a ``memoryview`` of its buffer); what a read returns
    is a ``bytes`` copy of just its slice (tifffile and the block cache keep what they are given),
    and the extents the compiled loop reads hold the file's bytes."""
    sample = REPO / "samples" / "sample-aperio-jpeg.svs"
    raw = sample.read_bytes()
    srv = nginx_factory(sample.parent)
    with wsitool.open_slide(srv.url + sample.name) as s:
        src = s._source
        a, b = len(raw) // 3, len(raw) // 3 + 50_000
        src.advise([(a, b - a)])
        got = src.read(a + 100, 1000)
        assert type(got) is bytes and got == raw[a + 100:a + 1100]
        extents = src.gather([(a + 5, 10), (a + 40_000, 9_000)])
        assert extents and all(bytes(data) == raw[start:start + len(data)] for start, data in extents)
        head = src.read(10, 100)  # from the block cache, filled from the first answer
        assert type(head) is bytes and head == raw[10:110]


def test_patch_batches_fetch_their_runs_together(nginx_factory, monkeypatch):
    """``read_patches`` on a remote slide advises every fresh run of a batch at once (neighbours
    merged into one request) and the next batch's while this one decodes, instead of one
    round trip per run as each decode starts: at most one request per batch here, where runs
    of two tiles make three runs of each tile row.  Pixels equal the local read's."""
    from wsitool.read.patches import reader
    monkeypatch.setattr(reader, "RUN_TILES", 2)
    sample = REPO / "samples" / "sample-aperio-jpeg.svs"
    srv = nginx_factory(sample.parent)
    with wsitool.open_slide(srv.url + sample.name) as remote, wsitool.open_slide(sample) as local:
        w, h = remote.dimensions
        xs, ys = np.meshgrid(np.arange(0, w, 128), np.arange(0, h, 128))
        locs = np.stack([xs.ravel(), ys.ravel()], 1)
        per_row = len(np.arange(0, w, 128))
        batch = 2 * per_row  # two patch rows: one tile row of 256 pixels
        remote.read_region((0, 0), 0, (1, 1))  # (level 0's tile tables, counted apart)
        before = remote._source.stats()["requests"]
        got = np.concatenate(list(remote.read_patches(locs, (128, 128), batch_size=batch, threads=1)))
        requests = remote._source.stats()["requests"] - before
        want = np.concatenate(list(local.read_patches(locs, (128, 128), batch_size=batch, threads=1)))
        np.testing.assert_array_equal(got, want)
        batches = math.ceil(len(locs) / batch)
        runs = math.ceil(h / 256) * math.ceil(math.ceil(w / 256) / 2)  # tile rows x runs of two tiles
        assert runs > batches and requests <= batches, (requests, batches, runs)


def test_an_advice_does_not_fetch_again_what_an_earlier_one_holds(nginx_factory):
    """Ranges held by an earlier advice are left out before the rest is merged: advising tiles
    1-3 after tiles 0-2 (all adjacent in the file) fetches tile 3's bytes only, not 0-3 again
    (the next batch of patches shares tiles with the last)."""
    sample = REPO / "samples" / "sample-aperio-jpeg.svs"
    srv = nginx_factory(sample.parent)
    with wsitool.open_slide(srv.url + sample.name) as s:
        lv = pyramid_levels(s)[0]
        offs, cnts = lv.tiles.offsets[:4].tolist(), lv.tiles.bytecounts[:4].tolist()
        assert all(offs[k] + cnts[k] <= offs[k + 1] <= offs[k] + cnts[k] + 1024 for k in range(3))  # adjacent
        src = s._source
        src.advise(list(zip(offs[:3], cnts[:3], strict=True)))
        src.gather(list(zip(offs[:3], cnts[:3], strict=True)))  # (waits for them)
        before = src.stats()
        src.advise(list(zip(offs[1:], cnts[1:], strict=True)))
        extents = src.gather(list(zip(offs, cnts, strict=True)))
        after = src.stats()
        assert after["requests"] - before["requests"] == 1
        assert after["bytes"] - before["bytes"] == cnts[3]
        raw = sample.read_bytes()
        assert all(bytes(d) == raw[a:a + len(d)] for a, d in extents)


def test_a_cached_slide_given_other_storage_options_is_opened_with_them(nginx_factory):
    """``cached_slide`` (what each Dask task of a URL calls) holds a slide per location, URL and
    storage options: a task carrying other options (new credentials, another concurrency) gets
    a slide opened with those (it got the one held, opened with the first options), and the
    slide the other tasks hold stays open."""
    from wsitool.distributed import cached_slide
    from wsitool.opening import parse_location
    sample = REPO / "samples" / "sample-aperio-jpeg.svs"
    url = nginx_factory(sample.parent).url + sample.name + "?cached=options"
    first = cached_slide(parse_location(url, {"concurrency": 3}))
    assert cached_slide(parse_location(url, {"concurrency": 3})) is first
    plain = cached_slide(url)  # (no options: a location of its own)
    assert plain is not first and plain._source.options.concurrency != 3
    other = cached_slide(parse_location(url, {"concurrency": 5}))
    assert other is not first and other._source.options.concurrency == 5
    assert cached_slide(parse_location(url, {"concurrency": 3})) is first and not first.closed
    assert first.read_region((0, 0), 0, (64, 64)).shape == other.read_region((0, 0), 0, (64, 64)).shape


def test_threads_asking_for_a_cached_slide_at_once_share_one_and_none_is_closed(nginx_factory):
    """Eight threads (a Dask worker's first tasks) ask ``cached_slide`` for the same URL at
    once and read at once, with the same options and with two sets of options in turn: the
    URL is opened once per set of options and no read meets a closed slide (each thread
    opened its own and closed the one it replaced: 20 of 80 reads failed)."""
    from concurrent.futures import ThreadPoolExecutor

    from wsitool.distributed import cached_slide
    from wsitool.opening import parse_location
    sample = REPO / "samples" / "sample-aperio-jpeg.svs"
    url = nginx_factory(sample.parent).url + sample.name + "?cached=threads"
    barrier = threading.Barrier(8)

    def task(k):
        barrier.wait()
        got = []
        for j in range(6):
            s = cached_slide(parse_location(url, {"timeout": 10 + (k + j) % 2}))
            got.append(id(s))
            s.read_region((64 * j, 64 * k), 0, (64, 64))
        return got

    with ThreadPoolExecutor(8) as pool:
        ids = [i for got in pool.map(task, range(8)) for i in got]
    assert len(set(ids)) == 2, len(set(ids))
