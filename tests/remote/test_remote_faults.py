"""Faults of a remote server, injected by a scripted HTTP server: each gives its documented
outcome within the timeouts, and nothing (threads, connections) is left behind."""

from __future__ import annotations

import time

import numpy as np
import pytest

import wsitool
from wsitool.cli.console import exit_code_for
from wsitool.errors import RemoteAccessError, RemoteChangedError, RemoteNotFoundError, RemoteUnavailableError

from helpers import NO_SHARED, SHARED_SAMPLES
from remote_helpers import client_connections, remote_threads

# scripted: a fixture of remote_helpers (registered by tests/conftest.py)

pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")

SAMPLE = "aperio-cmu1-small-region-jpeg.svs"
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
    ("whole", RemoteUnavailableError, 17)])  # 200 with the whole object: no range support
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
        if fault == "whole":  # said as such, and not retried
            assert "does not support HTTP range requests" in str(info.value)
            asked = [rng for a, rng in script.log if a == "whole"]
            assert asked and len(asked) == len(set(asked))  # no range asked twice: no retry
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
