"""``wsitool serve``: the first SIGINT / SIGTERM starts the graceful shutdown (and says so), a
second one stops at once, even while a render is running, with the exit status of the first
signal and no traceback.

The server runs as a process on 127.0.0.1 (a free port) through the console script's entry
point, with the IIIF read made slow (60 s asleep in the render thread, as a huge region of a
big slide would keep it busy) so that the render is surely in flight when the signals come.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from helpers import REPO, serve_port  # noqa: E402

SLIDE = REPO / "samples" / "sample-aperio-jpeg.svs"

_SLOW_SERVER = """
import sys, time
import wsitool.serve.app as app

def slow_read(*args, **kwargs):  # a render that takes a minute
    time.sleep(60)
    raise RuntimeError("the render was not cut short")

app.read_scaled = slow_read
from wsitool.__main__ import main
main(sys.argv[1:])
"""


def _default_signals() -> None:
    """SIGINT as a terminal's foreground job has it (a background test runner passes it on ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_rendering(port: int, deadline: float = 30.0) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if httpx.get(f"http://127.0.0.1:{port}/status", timeout=10).json().get("rendering") == 1:
            return
        time.sleep(0.05)
    raise AssertionError("the render never started")


@pytest.mark.parametrize("first, second, code", [(signal.SIGINT, signal.SIGINT, 130),
                                                 (signal.SIGTERM, signal.SIGINT, 143),
                                                 (signal.SIGINT, signal.SIGTERM, 130)])
def test_a_second_signal_stops_the_server_during_a_render(first, second, code):
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_SERVER, "serve", str(SLIDE), "--port", "0",
                             "--threads", "1", "--cache-mb", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, preexec_fn=_default_signals)
    seen: list[str] = []
    answers: list[object] = []
    try:
        port = serve_port(proc, 60.0, seen)
        url = f"http://127.0.0.1:{port}/iiif/3/sample-aperio-jpeg.svs/full/256,/0/default.jpg"

        def client() -> None:
            try:
                answers.append(httpx.get(url, timeout=90).status_code)
            except httpx.HTTPError as exc:  # the connection closed: also fine
                answers.append(type(exc).__name__)

        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        _wait_rendering(port)
        proc.send_signal(first)
        time.sleep(1.5)
        assert proc.poll() is None  # graceful: waiting for the render
        proc.send_signal(second)
        t0 = time.monotonic()
        try:
            _out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            raise AssertionError("the second signal did not stop the server within 15 s") from None
        took = time.monotonic() - t0
        thread.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(seen) + err
    assert proc.returncode == code, err
    assert took < 10.0, (took, err)  # not the 60 s of the render
    assert "Traceback" not in err and "not cut short" not in err, err
    # one line for each signal
    assert len(re.findall(r"shutting down \(SIG\w+\): .* a second Ctrl-C or signal stops now", err)) == 1, err
    assert len(re.findall(r"stopping now \(SIG\w+\)", err)) == 1, err
    assert answers and answers[0] != 200, answers  # 503, or the connection closed
    print(f"stopped {took:.2f} s after the second signal; the client got {answers[0]}")
