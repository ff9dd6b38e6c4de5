"""Faults of a remote server, injected by a scripted HTTP server: each gives its documented
outcome within the timeouts, and nothing (threads, connections) is left behind."""

from __future__ import annotations

import time

import numpy as np
import pytest

import wsitool
from wsitool.cli.console import exit_code_for
from wsitool.errors import (
    RemoteAccessError,
    RemoteChangedError,
    RemoteNotFoundError,
    RemoteUnavailableError,
    SlideWarning,
)

from helpers import NO_SHARED, SHARED_SAMPLES
from remote_helpers import client_connections, remote_threads

# scripted: a fixture of remote_helpers (registered by tests/conftest.py)

pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")
pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")

SAMPLE = "aperio-cmu1-small-region-jpeg.svs"


@pytest.fixture(params=["obstore", "urllib3"], autouse=True)
def http_client(request, monkeypatch):
    """Every fault, through each HTTP client: obstore, and urllib3 (a forked child's)."""
    from wsitool.storage.remote.transports.http import HttpTransport

    monkeypatch.setattr(HttpTransport, "force_client", request.param)
    return request.param
FAST = {"timeout": 1, "operation_timeout": 6, "retries": 2, "backoff": 0.01}


@pytest.fixture
def data():
    if not SHARED_SAMPLES.is_dir():
        pytest.skip(NO_SHARED)
    return (SHARED_SAMPLES / SAMPLE).read_bytes()


@pytest.fixture
def expected():
    with wsitool.open_slide(SHARED_SAMPLES / SAMPLE) as s:
        return s.read_region((0, 0), 0, (1000, 1000), mode="rgb")


def _port(url):
    return int(url.split(":")[2].split("/")[0])


def _settled(url, threads_before):
    """No fetch thread and no connection to the server is left (after the slide closed)."""
    end = time.monotonic() + 5
    while time.monotonic() < end:
        if remote_threads() <= threads_before and client_connections(_port(url)) == 0:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("fault", ["slow", 503, 429, 500, "short", "reset"])
def test_transient_faults_are_retried(fault, scripted, data, expected):
    url, script = scripted(data)
    threads = remote_threads()
    with wsitool.open_slide(url, storage_options=FAST) as s:
        script.actions = [fault]  # the next request fails once
        got = s.read_region((0, 0), 0, (1000, 1000), mode="rgb")
        assert np.array_equal(got, expected)
        assert any(a == str(fault) for a, _ in script.log)
    assert _settled(url, threads)


@pytest.mark.parametrize("fault, cls, code", [
    (403, RemoteAccessError, 16), (401, RemoteAccessError, 16), (404, RemoteNotFoundError, 9),
    (503, RemoteUnavailableError, 17), ("short", RemoteUnavailableError, 17),
    ("reset", RemoteUnavailableError, 17), (416, RemoteChangedError, 18),
    (400, RemoteAccessError, 16), (410, RemoteNotFoundError, 9),  # not retried (a bad or expired signed URL: 400)
    (501, RemoteAccessError, 16)])  # a 5xx that is not "try again": the same table for both clients
def test_persistent_faults_raise_one_error(fault, cls, code, scripted, data):
    url, script = scripted(data)
    threads = remote_threads()
    s = wsitool.open_slide(url + "?sig=SECRET", storage_options=FAST)
    try:
        script.default = fault
        t0 = time.monotonic()
        with pytest.raises(cls) as info:
            s.read_region((0, 0), 0, (1000, 1000), mode="rgb")
        assert time.monotonic() - t0 < FAST["operation_timeout"] + 2
        assert exit_code_for(info.value) == code
        assert "SECRET" not in str(info.value) and "slide.svs" in str(info.value)
        assert len(str(info.value).splitlines()) == 1
        if fault in (400, 410, 403, 401, 404, 416, 501):  # what retrying cannot fix is not retried
            asked = [rng for a, rng in script.log if a == str(fault)]
            assert asked and len(asked) == len(set(asked))  # (a region's ranges fail at once: no range twice)
    finally:
        s.close()
    assert _settled(url, threads)


@pytest.mark.parametrize("fault, cls", [(403, RemoteAccessError), (404, RemoteNotFoundError),
                                        (503, RemoteUnavailableError)])
def test_faults_at_open(fault, cls, scripted, data):
    url, script = scripted(data)
    script.default = fault
    threads = remote_threads()
    with pytest.raises(cls):
        wsitool.open_slide(url, storage_options=FAST)
    assert _settled(url, threads)


def test_a_hanging_server_times_out(scripted, data):
    url, script = scripted(data)
    threads = remote_threads()
    s = wsitool.open_slide(url, storage_options={**FAST, "retries": 1})
    try:
        script.default = "hang"
        t0 = time.monotonic()
        with pytest.raises(RemoteUnavailableError, match=r"timed out|timeout"):
            s.read_region((0, 0), 0, (1000, 1000), mode="rgb")
        assert time.monotonic() - t0 < FAST["operation_timeout"] + 2
    finally:
        s.close()
    assert remote_threads() <= threads


def test_an_object_replaced_while_open_is_an_error(scripted, data, expected):
    url, script = scripted(data, etag='"v1"')
    with wsitool.open_slide(url, storage_options=FAST) as s:
        assert np.array_equal(s.read_region((0, 0), 0, (1000, 1000), mode="rgb"), expected)
        script.etag = '"v2"'  # same size, another version
        with pytest.raises(RemoteChangedError) as info:
            s.read_region((1000, 1000), 0, (1000, 1000), mode="rgb")
        assert exit_code_for(info.value) == 18
        script.data = data + b"x"  # and another size
        with pytest.raises(RemoteChangedError):
            s.read_region((1000, 0), 0, (500, 500), mode="rgb")


def test_one_fetch_per_block_however_many_threads(scripted, data):
    from concurrent.futures import ThreadPoolExecutor
    url, script = scripted(data)
    with wsitool.open_slide(url) as s:
        src = s._source
        n0 = len(script.log)
        offset = 1_200_000  # not fetched at open
        with ThreadPoolExecutor(8) as ex:
            parts = list(ex.map(lambda _: src.read(offset, 1000), range(32)))
        assert all(p == data[offset:offset + 1000] for p in parts)
        assert len(script.log) - n0 == 1


def test_query_headers_and_if_match_as_sent(scripted, data, expected, http_client):
    """Each client sends the URL's query as given (a presigned URL's signature), the
    ``headers`` option on every request, and If-Match with the strong ETag pinned at open."""
    url, script = scripted(data)
    query = "?X-Amz-Signature=SECRET&x=a%2Fb"
    with wsitool.open_slide(url + query, storage_options={**FAST, "headers": {"X-Test": "v 1"}}) as s:
        assert np.array_equal(s.read_region((0, 0), 0, (1000, 1000), mode="rgb"), expected)
    assert len(script.seen) >= 2
    assert all(path == "/slide.svs" + query for path, _ in script.seen)
    assert all(headers.get("x-test") == "v 1" for _, headers in script.seen)
    assert "if-match" not in script.seen[0][1]  # the first request pins the ETag
    assert all(headers.get("if-match") == '"v1"' for _, headers in script.seen[1:])


def test_a_weak_etag_is_never_sent_as_if_match(scripted, data, expected, http_client):
    url, script = scripted(data, etag='W/"w1"')
    with wsitool.open_slide(url, storage_options=FAST) as s:
        assert np.array_equal(s.read_region((0, 0), 0, (1000, 1000), mode="rgb"), expected)
        assert s._source.etag == 'W/"w1"'
    assert not [h for _, h in script.seen if "if-match" in h]  # (a weak ETag never matches If-Match)


def test_redirects_are_followed(scripted, data, expected, http_client):
    url, script = scripted(data)
    script.actions = ["redirect"]  # the open's first request
    with wsitool.open_slide(url, storage_options=FAST) as s:
        script.actions = ["redirect"]  # and a tile range
        assert np.array_equal(s.read_region((0, 0), 0, (1000, 1000), mode="rgb"), expected)
    moved = [(p, h.get("range")) for p, h in script.seen if p.endswith("moved=1")]
    assert len(moved) == 2 and all(rng for _, rng in moved)  # the Range went along


def test_a_small_object_from_a_server_without_ranges(scripted, http_client):
    """A server that ignores Range (200, the whole object) serves an object of at most 64 MiB: it
    is read whole once and every range comes from it (tests/remote/test_remote_whole.py has more)."""
    from wsitool.storage.opener import open_source

    blob = bytes(range(256)) * 300
    url, script = scripted(blob)
    script.default = "whole"
    with pytest.warns(SlideWarning, match="ignores HTTP range requests"):
        src = open_source(url, storage_options=FAST)
    try:
        asked = len(script.log)
        assert src.size == len(blob)
        assert src.read(0, 1000) == blob[:1000]
        assert src.read(70_000, 100) == blob[70_000:70_100]  # past the head fetch: from the kept object
        assert len(script.log) == asked
    finally:
        src.close()


def test_a_chunked_server_is_read_through_urllib3(scripted, data, expected, http_client):
    """obstore needs Content-Length on every answer; a server that sends its 206 bodies
    chunked is read on through urllib3 (the same pixels), not refused."""
    url, script = scripted(data)
    script.default = "chunked"
    with wsitool.open_slide(url, storage_options=FAST) as s:
        assert np.array_equal(s.read_region((0, 0), 0, (1000, 1000), mode="rgb"), expected)
        assert type(s._source.transport._client).__name__ == "_Urllib3Client"


def test_a_last_modified_in_an_obsolete_form_is_read(scripted, data, expected, http_client):
    """RFC 850's date form (RFC 9110 section 5.6.7 tells recipients to accept it) is not
    obstore's: urllib3 reads such a server, and the date is pinned in the one form both use."""
    url, _ = scripted(data, etag=None, modified="Wednesday, 02-Dec-26 10:00:00 GMT")
    with wsitool.open_slide(url, storage_options=FAST) as s:
        assert np.array_equal(s.read_region((0, 0), 0, (1000, 1000), mode="rgb"), expected)
        assert s._source.modified == "Wed, 02 Dec 2026 10:00:00 GMT"
