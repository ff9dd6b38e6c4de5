"""DICOMweb faults against a scripted server: denied, missing, no agreed transfer syntax, cut bodies, hangs."""

from __future__ import annotations

import http.server
import json
import re
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import wsitool
from wsitool.cli.console import exit_code_for
from wsitool.errors import RemoteAccessError, RemoteNotFoundError, RemoteUnavailableError, UnsupportedFormatError

from helpers import shared_sample
from remote_helpers import ScriptedServer, endless

pydicom = pytest.importorskip("pydicom", reason="pydicom is not installed")
pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")

SAMPLE = "dicom-google-jpeg-ybr-957x715.dcm"
STORED = "1.2.840.10008.1.2.4.50"


class Series:
    """One real single-file series served as DICOMweb: QIDO, metadata, frames (multipart)."""

    def __init__(self, path):
        from pydicom.encaps import generate_frames

        ds = pydicom.dcmread(path)
        self.study, self.series, self.sop = ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.SOPInstanceUID
        self.frames = list(generate_frames(ds.PixelData, number_of_frames=int(ds.NumberOfFrames)))
        del ds.PixelData
        self.meta = ds.to_json_dict()
        self.meta["00080016"] = {"vr": "UI", "Value": [str(ds.SOPClassUID)]}
        self.actions: dict[str, list] = {}  # endpoint ("qido", "metadata", "frames") -> actions
        self.default: dict[str, object] = {}
        self.log: list[str] = []
        self.sent: list[int] = []  # bytes each hostile answer (remote_helpers.endless) sent

    def action(self, endpoint: str):
        queue = self.actions.get(endpoint) or []
        return queue.pop(0) if queue else self.default.get(endpoint, "ok")


def _handler(series: Series):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, status, body=b"", ctype="application/dicom+json"):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            path = self.path.split("?")[0]
            if path.endswith("/instances"):
                endpoint = "qido"
            elif path.endswith("/metadata"):
                endpoint = "metadata"
            elif "/frames/" in path:
                endpoint = "frames"
            else:
                return self._send(404)
            series.log.append(endpoint)
            act = series.action(endpoint)
            if isinstance(act, int):
                return self._send(act, b"{}")
            if act == "hang":
                time.sleep(3)
                return self._send(503)
            if act in ("overlong", "endless"):  # 10 GiB declared, or chunked: a body without end
                self.send_response(200)
                self.send_header("Content-Type", 'multipart/related; type="image/jpeg"; boundary=b0undary'
                                 if endpoint == "frames" else "application/dicom+json")
                if act == "overlong":
                    self.send_header("Content-Length", str(10 << 30))
                else:
                    self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                series.sent.append(endless(self.wfile, chunked=act == "endless", head=b"--b0undary\r\n"))
                self.close_connection = True
                return
            if endpoint == "qido":
                return self._send(200, json.dumps([{"00080018": {"vr": "UI", "Value": [series.sop]},
                                                    "00080016": series.meta["00080016"]}]).encode())
            if endpoint == "metadata":
                return self._send(200, json.dumps([series.meta]).encode())
            accept = self.headers.get("Accept", "")
            asked = re.search(r"transfer-syntax=([0-9.*]+)", accept)
            if asked is None or asked.group(1) not in ("*", STORED):
                return self._send(406, b"{}")
            numbers = [int(n) for n in path.rsplit("/", 1)[1].split(",")]
            boundary = "b0undary"
            body = b"".join(
                f"--{boundary}\r\nContent-Type: image/jpeg; transfer-syntax={STORED}\r\n\r\n".encode()
                + series.frames[n - 1] + b"\r\n" for n in numbers) + f"--{boundary}--\r\n".encode()
            ctype = f'multipart/related; type="image/jpeg"; boundary={boundary}'
            if act == "cut":  # the body stops in the middle of the last part, announced as such
                body = body[: len(body) - len(series.frames[numbers[-1] - 1]) // 2]
            if act == "drop":  # the connection closes before the announced length
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2])
                self.close_connection = True
                return
            return self._send(200, body, ctype)

    return Handler


@pytest.fixture
def server():
    series = Series(shared_sample(SAMPLE))
    httpd = ScriptedServer(("127.0.0.1", 0), _handler(series))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    series.url = (f"http://127.0.0.1:{httpd.server_address[1]}/dicom-web/studies/{series.study}"
                  f"/series/{series.series}")
    yield series
    httpd.shutdown()
    httpd.server_close()


FAST = {"timeout": 0.5, "retries": 1, "backoff": 0.01, "operation_timeout": 5}


def _open(url, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return wsitool.open_slide(url, storage_options={**FAST, **options})


def test_the_scripted_series_reads_as_the_local_file(server):
    local = wsitool.open_slide(shared_sample(SAMPLE))
    with local, _open(server.url) as remote:
        a = local.read_region((0, 0), 0, local.dimensions)
        assert np.array_equal(remote.read_region((0, 0), 0, remote.dimensions), a)


@pytest.mark.parametrize("status", [401, 403])
def test_denied_is_access_error_16(server, status):
    server.default["qido"] = status
    with pytest.raises(RemoteAccessError) as info:
        _open(server.url)
    assert exit_code_for(info.value) == 16
    assert f"HTTP {status}" in str(info.value)


def test_missing_series_is_not_found_9(server):
    server.default["qido"] = 404
    with pytest.raises(RemoteNotFoundError) as info:
        _open(server.url)
    assert exit_code_for(info.value) == 9


def test_no_agreed_transfer_syntax_is_unsupported_3(server):
    server.default["frames"] = 406
    with pytest.raises(UnsupportedFormatError) as info:
        _open(server.url)
    assert exit_code_for(info.value) == 3
    assert "1.2.840.10008.1.2.4.50" in str(info.value)  # the fallbacks are named


@pytest.mark.parametrize("fault", ["cut", "drop", 503])
def test_cut_bodies_and_5xx_are_retried_then_unavailable_17(server, fault):
    with _open(server.url, frame_cache_mb=0) as slide:
        server.actions["frames"] = [fault]  # once: the retry succeeds
        first = slide.read_region((256, 256), 0, (300, 300))
        server.default["frames"] = fault  # always: one error after the retries
        with pytest.raises(RemoteUnavailableError) as info:
            slide.read_region((0, 0), 0, (300, 300))
        assert exit_code_for(info.value) == 17
        server.default["frames"] = "ok"
        local = wsitool.open_slide(shared_sample(SAMPLE))
        with local:
            assert np.array_equal(first, local.read_region((256, 256), 0, (300, 300)))


def test_a_hung_server_is_unavailable_17(server):
    with _open(server.url, frame_cache_mb=0) as slide:
        server.default["frames"] = "hang"
        t0 = time.monotonic()
        with pytest.raises(RemoteUnavailableError) as info:
            slide.read_region((0, 0), 0, (300, 300))
        assert exit_code_for(info.value) == 17
        assert "timed out" in str(info.value)
        assert time.monotonic() - t0 < 10


def test_cli_error_line_hides_credentials(server):
    server.default["qido"] = 401
    url = server.url.replace("http://", "http://bob:hunter2@")
    r = subprocess.run([sys.executable, "-m", "wsitool", "info", url, "--storage-option", "retries=0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 16, r.stderr
    assert "hunter2" not in r.stderr + r.stdout and "bob" not in r.stderr + r.stdout
    assert "access denied" in r.stderr


def _not_drained(series, count=1):
    """The hostile answers stopped being read at once: what the server wrote before the
    connection closed is far below its cap (4 GiB; the server learns at its next write)."""
    end = time.monotonic() + 30
    while len(series.sent) < count and time.monotonic() < end:
        time.sleep(0.05)
    return bool(series.sent) and max(series.sent) < 64 << 20


@pytest.mark.parametrize("fault", ["overlong", "endless"])
@pytest.mark.parametrize("endpoint", ["qido", "metadata"])
def test_an_answer_without_end_at_open_is_one_error_17(server, endpoint, fault):
    server.default[endpoint] = fault
    with pytest.raises(RemoteUnavailableError) as info:
        _open(server.url, metadata_limit_mb=8)
    text = str(info.value)
    assert exit_code_for(info.value) == 17 and len(text.splitlines()) == 1
    assert "8388608 bytes" in text and "metadata_limit_mb" in text
    assert _not_drained(server, server.log.count(endpoint))


@pytest.mark.parametrize("fault", ["overlong", "endless"])
def test_a_frames_answer_past_the_frames_size_is_one_error_17(server, fault):
    with _open(server.url, frame_cache_mb=0) as slide:
        at_open = server.log.count("frames")
        server.default["frames"] = fault
        with pytest.raises(RemoteUnavailableError) as info:
            slide.read_region((0, 0), 0, (300, 300))
        assert exit_code_for(info.value) == 17 and "frames" in str(info.value)
        assert server.log.count("frames") == at_open + 1  # one request for the region's frames, not retried
    assert _not_drained(server)


def test_metadata_limit_mb_must_be_a_positive_number(server):
    with pytest.raises(ValueError, match="metadata_limit_mb"):
        _open(server.url, metadata_limit_mb="lots")
    with pytest.raises(ValueError, match="metadata_limit_mb"):
        _open(server.url, metadata_limit_mb=0)
