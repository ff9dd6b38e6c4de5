"""A server that ignores ``Range`` (``python -m http.server``, the first one a user tries): an object of
at most ``WHOLE_OBJECT_LIMIT`` is read whole once through the bounded reader, kept, and every range served
from it, with one warning line; a larger one is one error line, exit 17, its body never read."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

import wsitool
from wsitool.cli.console import exit_code_for
from wsitool.errors import RemoteUnavailableError, SlideWarning

from helpers import NO_SHARED, SHARED_SAMPLES

pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")
pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")

SAMPLE = "aperio-cmu1-small-region-jpeg.svs"
FAST = {"timeout": 2, "operation_timeout": 15, "retries": 1, "backoff": 0.01}


@pytest.fixture(params=["obstore", "urllib3"])
def http_client(request, monkeypatch):
    from wsitool.storage.remote.transports.http import HttpTransport

    monkeypatch.setattr(HttpTransport, "force_client", request.param)
    return request.param


@pytest.fixture
def data():
    if not SHARED_SAMPLES.is_dir():
        pytest.skip(NO_SHARED)
    return (SHARED_SAMPLES / SAMPLE).read_bytes()


def test_a_small_object_is_read_whole_once_and_every_range_served_from_it(http_client, scripted, data):
    url, script = scripted(data)
    script.default = "whole"  # 200 and the whole object, whatever Range says
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with wsitool.open_slide(url, storage_options=FAST) as remote, \
                wsitool.open_slide(SHARED_SAMPLES / SAMPLE) as local:
            asked = len(script.log)
            for loc in ((0, 0), (1500, 1000), (2500, 1900)):
                got = remote.read_region(loc, 0, (400, 300), mode="rgb")
                assert np.array_equal(got, local.read_region(loc, 0, (400, 300), mode="rgb"))
            assert len(script.log) == asked  # no request after the whole object came
            # what the slide says it sent is what the server saw (ranges served from memory are no request)
            assert remote.remote["requests"] == remote.remote["open_requests"] == asked
            assert remote.remote["bytes"] == len(data)
    lines = [str(w.message) for w in caught if issubclass(w.category, SlideWarning)]
    assert len(lines) == 1 and "ignores HTTP range requests" in lines[0] and f"{len(data)} bytes" in lines[0]
    # obstore asks for the range, then for the whole object; urllib3 takes the 200 it was sent
    assert asked == (2 if http_client == "obstore" else 1)


def test_an_object_over_the_limit_is_one_error_and_its_body_unread(http_client, scripted, data, monkeypatch):
    from wsitool.storage.remote.transports import http

    monkeypatch.setattr(http, "WHOLE_OBJECT_LIMIT", len(data) - 1)
    url, script = scripted(data)
    script.default = "whole"
    with pytest.raises(RemoteUnavailableError) as info:
        wsitool.open_slide(url, storage_options=FAST)
    assert exit_code_for(info.value) == 17 and "does not support HTTP range requests" in str(info.value)
    assert sum(1 for a, _ in script.log if a == "whole") <= 2  # not retried (obstore: range, then whole)


def test_python_http_server_serves_a_slide(tmp_path, data):
    """The real thing: ``python -m http.server`` over a folder with the slide; ``wsitool info`` and
    ``read-region`` work, saying once that the whole object was read."""
    (tmp_path / SAMPLE).write_bytes(data)
    server = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1",
                               "--directory", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True)
    try:
        port = None
        end = time.monotonic() + 30
        while port is None and time.monotonic() < end:
            line = server.stdout.readline()
            m = re.search(r"port (\d+)", line)
            port = int(m.group(1)) if m else None
        assert port, "python -m http.server did not say its port"
        url = f"http://127.0.0.1:{port}/{SAMPLE}"
        info = subprocess.run([sys.executable, "-m", "wsitool", "info", url], capture_output=True, text=True,
                              timeout=120)
        assert info.returncode == 0, info.stderr
        assert "2220" in info.stdout and "ignores HTTP range requests" in info.stderr
        out = tmp_path / "region.png"
        read = subprocess.run([sys.executable, "-m", "wsitool", "read-region", url, "--location", "1000", "800",
                               "--size", "300", "200", "--output", str(out)], capture_output=True, text=True,
                              timeout=120)
        assert read.returncode == 0, read.stderr
        from PIL import Image

        with wsitool.open_slide(tmp_path / SAMPLE) as local:
            want = local.read_region((1000, 800), 0, (300, 200))
        assert np.array_equal(np.asarray(Image.open(out)), want)
    finally:
        server.terminate()
        server.wait(30)
