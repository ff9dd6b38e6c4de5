"""Read-ahead of a remote slide under pressure: a slow server, a byte budget smaller than the
batches, a slide closed while its read-ahead is in flight (nginx, and a scripted HTTP server)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import wsitool
from wsitool.errors import RemoteUnavailableError
from wsitool.storage.remote.readahead import ReadAhead

from remote_helpers import remote_threads

# nginx_factory, scripted: fixtures of remote_helpers (registered by tests/conftest.py)

pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")
pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "sample-aperio-jpeg.svs"


def _patches(url: str, locs: np.ndarray) -> tuple[np.ndarray, int]:
    """All patches of 256 at ``locs`` (level 0, batches of 32, 2 threads) and the body bytes fetched."""
    with wsitool.open_slide(url) as s:
        s.read_region((0, 0), 0, (1, 1))  # (level 0's tile tables, counted apart)
        before = s._source.stats()["bytes"]
        got = np.concatenate(list(s.read_patches(locs, (256, 256), batch_size=32, threads=2)))
        return got, s._source.stats()["bytes"] - before


def test_patch_read_ahead_beyond_the_byte_budget_fetches_nothing_twice(nginx_factory, monkeypatch):
    """With an extent budget far below a batch's bytes, read-ahead that would pass a quarter of
    it is skipped, and the ranges of the batch being read are not dropped before it reads
    them: about the bytes of the default budget are fetched (5.3x as many before: the ranges
    fetched for the batch were trimmed by the next batches' read-ahead and fetched again)."""
    srv = nginx_factory(SAMPLE.parent)
    url = srv.url + SAMPLE.name
    with wsitool.open_slide(SAMPLE) as local:
        w, h = local.dimensions
        rng = np.random.default_rng(1)
        locs = np.stack([rng.integers(0, w - 256, 400), rng.integers(0, h - 256, 400)], 1)
        want = np.concatenate(list(local.read_patches(locs, (256, 256), batch_size=32, threads=2)))
    got, roomy = _patches(url, locs)
    np.testing.assert_array_equal(got, want)
    monkeypatch.setattr(ReadAhead, "EXTENT_BYTES", 128 * 1024)
    monkeypatch.setattr(ReadAhead, "EXTENT_FLOOR", 128 * 1024)
    got, tight = _patches(url, locs)
    np.testing.assert_array_equal(got, want)
    assert tight <= 1.15 * roomy, (tight, roomy)


def test_an_advised_range_times_out_from_when_its_request_starts(scripted):
    """Twelve advised ranges queued on two connections to a server that answers in 0.5 s
    (3 s in all) with an operation timeout of 2 s: each read gets its bytes, none expires
    unsent (the deadline was taken at the advice: the last four failed)."""
    data = SAMPLE.read_bytes()
    url, script = scripted(data)
    options = {"timeout": 5, "operation_timeout": 2, "retries": 0, "concurrency": 2}
    with wsitool.open_slide(url, storage_options=options) as s:
        src = s._source
        script.default = "slow"
        ranges = [(300_000 + k * 60_000, 1000) for k in range(12)]  # apart: one request each
        n0 = len(script.log)
        src.advise(ranges)
        for offset, count in ranges:
            assert src.read(offset, count) == data[offset:offset + count]
        assert len(script.log) - n0 == 12


def test_a_read_whose_request_is_still_queued_says_so_when_it_times_out(scripted):
    """Eight advised ranges on one connection to a server that answers in 0.5 s, and a read
    of the last with an operation timeout of 1.2 s: its request is still queued when the
    read gives up, and the error says so (and what lets it through) instead of only "no
    answer"; a read whose request was sent and not answered keeps the plain message."""
    data = SAMPLE.read_bytes()
    url, script = scripted(data)
    options = {"timeout": 5, "operation_timeout": 1.2, "retries": 0, "concurrency": 1}
    with wsitool.open_slide(url, storage_options=options) as s:
        src = s._source
        script.default = "slow"
        ranges = [(300_000 + k * 60_000, 1000) for k in range(8)]
        src.advise(ranges)
        with pytest.raises(RemoteUnavailableError, match=r"still queued behind the 1 in flight") as err:
            src.read(*ranges[-1])
        assert "operation_timeout" in str(err.value) and url.split("?")[0] in str(err.value)
        end = time.monotonic() + 10
        while not all(t[3].done() for t in src.readahead.extents) and time.monotonic() < end:
            time.sleep(0.1)  # (the queue drains at 0.5 s a request)
        script.default = "hang"
        src.advise([(10_000, 100)])
        with pytest.raises(RemoteUnavailableError) as err:
            src.read(10_000, 100)
        assert "queued" not in str(err.value)


def test_closing_does_not_wait_for_read_ahead_retries(scripted):
    """A slide closed while its read-ahead waits on a server that never answers: the fetch
    in flight is not retried and the queued ones are dropped, so close returns after one
    request's timeout (1 s) and leaves no fetch thread (it waited through 4 retries, ~10 s,
    before)."""
    data = SAMPLE.read_bytes()
    url, script = scripted(data)
    threads = remote_threads()
    options = {"timeout": 1, "operation_timeout": 60, "retries": 4, "backoff": 0.5, "concurrency": 2}
    s = wsitool.open_slide(url, storage_options=options)
    script.default = "hang"
    s._source.advise([(300_000 + k * 60_000, 1000) for k in range(6)])
    time.sleep(0.2)  # (two requests in flight, four queued)
    t0 = time.monotonic()
    s.close()
    took = time.monotonic() - t0
    assert took < 3, took
    assert remote_threads() <= threads
    hung = [rng for action, rng in script.log if action == "hang"]
    assert 1 <= len(hung) <= 2, hung  # the two in flight, not retried; the queued never sent


def test_closing_while_a_thread_reads_patches_from_a_stalled_server_ends_that_read(scripted):
    """``close()`` from another thread while ``read_patches`` waits on a server that stopped
    answering: no request and no retry starts once close began, so the read ends with "slide
    is closed" after the requests in flight time out (1 s), and close returns then (it waited
    through every retry of every queued request, 33 s, sending 172 requests)."""
    data = SAMPLE.read_bytes()
    url, script = scripted(data)
    options = {"timeout": 1, "operation_timeout": 60, "retries": 3, "backoff": 0.5, "concurrency": 4}
    s = wsitool.open_slide(url, storage_options=options)
    w, h = s.dimensions
    locs = np.stack(np.meshgrid(np.arange(0, w - 256, 256), np.arange(0, h - 256, 256)), -1).reshape(-1, 2)
    failure = []

    def consume():
        try:
            for _ in s.read_patches(locs, (256, 256), batch_size=4, threads=2):
                script.default = "hang"  # (after the first batch)
        except wsitool.WsiError as exc:
            failure.append(exc)

    reader = threading.Thread(target=consume)
    reader.start()
    time.sleep(1.5)
    sent = len(script.log)
    t0 = time.monotonic()
    s.close()
    took = time.monotonic() - t0
    reader.join(10)
    assert not reader.is_alive() and took < 4, took
    assert failure and "closed" in str(failure[0]), failure
    assert len(script.log) - sent <= options["concurrency"], script.log[sent:]


def test_an_interpreter_leaving_an_unclosed_slide_does_not_wait_on_its_read_ahead(scripted, tmp_path):
    """A script that reads a batch, leaves its slide open and ends while the server has stopped
    answering: the queued read-ahead is dropped and nothing is retried, so the interpreter exits
    after the requests in flight time out (1 s); it sent every queued request, each retried,
    before (52 s)."""
    data = SAMPLE.read_bytes()
    url, script = scripted(data)
    code = f"""
import sys, numpy as np
import wsitool.storage.remote  # (first, as to set its cache budget: its exit hook before concurrent.futures')
import wsitool
s = wsitool.open_slide({url!r}, storage_options={{"timeout": 1, "retries": 3, "backoff": 0.5, "concurrency": 2}})
sys.stdout.write("open\\n"); sys.stdout.flush(); sys.stdin.readline()
s._source.advise([(300_000 + k * 40_000, 1000) for k in range(16)])
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "open"
        script.default = "hang"
        t0 = time.monotonic()
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
        took = time.monotonic() - t0
    finally:
        proc.kill()
    assert took < 6, took
    hung = [rng for action, rng in script.log if action == "hang"]
    assert len(hung) <= 2, hung  # the two in flight; the 14 queued never sent


def test_a_body_sent_slowly_is_cut_off_at_the_operation_timeout_by_urllib3(scripted, monkeypatch):
    """urllib3 (the client of a process forked after obstore started) reads a body that comes
    1 KiB every 0.3 s, never silent for the 1 s read timeout, only until ``operation_timeout``
    (3 s): one error line then, as obstore gives; it read the 100 KB to the end (30 s)."""
    from wsitool.errors import RemoteUnavailableError
    from wsitool.storage.remote.transports.http import HttpTransport

    monkeypatch.setattr(HttpTransport, "force_client", "urllib3")
    data = SAMPLE.read_bytes()
    url, script = scripted(data)
    with wsitool.open_slide(url, storage_options={"timeout": 1, "operation_timeout": 3, "retries": 0}) as s:
        script.default = "trickle"
        t0 = time.monotonic()
        with pytest.raises(RemoteUnavailableError, match="took more than 3 s"):
            s._source.read(400_000, 100_000)
        assert time.monotonic() - t0 < 6


def test_many_open_slides_hold_the_process_budget_of_fetched_ranges(nginx_factory, monkeypatch):
    """Eight remote slides open at once (a server of a bucket prefix), each read in four
    regions: together they keep about the process budget of fetched ranges (2 MiB here), the
    slides read least recently giving theirs up first, not each its own budget (8 MiB each
    for these, 64 MiB for a large slide: a server of many slides held that for every one
    it had served)."""
    monkeypatch.setattr(ReadAhead, "PROCESS_EXTENT_BYTES", 2 * 1024 * 1024)
    url = nginx_factory(SAMPLE.parent).url + SAMPLE.name
    slides = [wsitool.open_slide(url) for _ in range(8)]
    try:
        w, h = slides[0].dimensions
        fetched = 0
        for s in slides:
            for x, y in ((0, 0), (w // 2, 0), (0, h // 2), (w // 2, h // 2)):
                s.read_region((x, y), 0, (w // 2, h // 2))
            fetched += s._source.stats()["bytes"]
        held = [s._source.readahead.held for s in slides]
        # (6.6 MB before: each slide its 0.83 MB; now the others keep their last region's ranges)
        assert fetched > 3 * sum(held) and sum(held) <= 2 * 1024 * 1024, (fetched, held)
        assert max(held[:-1]) < held[-1], held
    finally:
        for s in slides:
            s.close()
