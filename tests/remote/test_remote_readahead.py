"""Read-ahead of a remote slide under pressure: a slow server, a byte budget smaller than the
batches, a slide closed while its read-ahead is in flight (nginx, and a scripted HTTP server)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import wsitool
from wsitool.storage.remote import RemoteSource

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
    monkeypatch.setattr(RemoteSource, "EXTENT_BYTES", 128 * 1024)
    monkeypatch.setattr(RemoteSource, "EXTENT_FLOOR", 128 * 1024)
    got, tight = _patches(url, locs)
    np.testing.assert_array_equal(got, want)
    assert tight <= 1.5 * roomy, (tight, roomy)


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
