"""``wsitool serve`` as a process: binds loopback, answers, stops cleanly on SIGTERM / SIGINT."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

import wsitool  # noqa: E402

from helpers import REPO, SHARED_SAMPLES, serve_port  # noqa: E402

SLIDE = REPO / "samples" / "sample-aperio-jpeg.svs"


def _default_signals() -> None:
    """SIGINT as a terminal's foreground job has it (a background test runner passes it on ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(*args):
    cmd = [sys.executable, "-c", "from wsitool.cli import main; main()", "serve", str(SLIDE), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_signals)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_serve_stops_cleanly_on_signals(sig, code):
    proc = _start("--port", "0", "--threads", "1", "--cache-mb", "16")
    try:
        port = serve_port(proc)
        r = httpx.get(f"http://127.0.0.1:{port}/iiif/3/sample-aperio-jpeg.svs/full/256,/0/default.jpg",
                      timeout=20)
        assert r.status_code == 200 and r.content[:2] == b"\xff\xd8"
        status = httpx.get(f"http://127.0.0.1:{port}/status", timeout=10).json()
        assert status["cache"]["misses"] > 0 and status["slides"] == 1
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err


def test_quiet_prints_nothing():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _start("--port", str(port), "--quiet", "--cache-mb", "0")
    try:
        for _ in range(300):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        else:
            raise AssertionError("server did not answer")
        r = httpx.get(f"http://127.0.0.1:{port}/status", timeout=5).json()
        assert r["cache"] is None
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and err == "" and out == ""


def test_missing_source_is_exit_9():
    proc = subprocess.run([sys.executable, "-c", "from wsitool.cli import main; main()", "serve",
                           "/nonexistent/slides", "--port", "0"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 9 and "nonexistent" in proc.stderr


def test_nothing_to_serve_is_one_line_exit_3(tmp_path):
    bad = tmp_path / "junk.svs"
    bad.write_bytes(b"not a slide at all" * 10)
    proc = subprocess.run([sys.executable, "-c", "from wsitool.cli import main; main()", "serve", str(bad),
                           "--port", "0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no slide to serve" in lines[0] and str(bad) in lines[0], proc.stderr


def test_a_dicom_series_folder_given_is_one_slide():
    from wsitool.serve.registry import SlideRegistry

    folder = SHARED_SAMPLES / "dicom-openslide-boxes"
    if not folder.is_dir():
        pytest.skip(f"real slides folder {folder} is absent")
    registry = SlideRegistry([folder], wsitool.open_slide)
    try:
        assert [entry.path for entry in registry] == [str(folder)] and not registry.skipped
    finally:
        registry.close()
