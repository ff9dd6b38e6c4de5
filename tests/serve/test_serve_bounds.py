"""Issue 47 items 2 and 3 against a real server process: a heavy render's memory (the child's
peak RSS above its idle RSS, the kernel's high-water mark), renders in flight held to the render
memory, a render stopped when its client leaves (``/status``), and a request that would read too
many source pixels refused at once (with ``info.json`` listing only what is served)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from helpers import REPO, serve_port  # noqa: E402

SLIDE = REPO / "samples" / "sample-aperio-jpeg.svs"   # 1536 x 1152, levels 1, 2, 4
SID = SLIDE.name
MiB = 1 << 20

_LINUX_HWM = sys.platform.startswith("linux") and os.access("/proc/self/clear_refs", os.W_OK)


def _start(*options: str, code: str | None = None) -> tuple[subprocess.Popen, int]:
    """``wsitool serve SLIDE --port 0 options`` (or ``code`` run with those arguments); its port."""
    head = [sys.executable, "-c", code] if code else [sys.executable, "-m", "wsitool"]
    proc = subprocess.Popen([*head, "serve", str(SLIDE), "--port", "0", *options], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    return proc, serve_port(proc, 60.0)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _rss(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key}")


def _peak_above_idle(pid: int, run) -> tuple[int, object]:
    """Run ``run()``; the server's RSS high-water mark during it above its RSS before (bytes)."""
    time.sleep(0.3)
    idle = _rss(pid, "VmRSS")
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")   # the high-water mark starts again from the RSS now
    result = run()
    return _rss(pid, "VmHWM") - idle, result


@pytest.mark.slow
@pytest.mark.skipif(not _LINUX_HWM, reason="needs Linux's /proc/PID/clear_refs (resettable peak RSS)")
def test_heavy_renders_hold_their_image_and_a_strip_and_the_renders_in_flight_fit_the_render_memory():
    """Before: the gray conversion, the rotation and the upscaling filter each made a full-size
    copy (floats among them): ~500 MB above idle for a 25-megapixel gray PNG.  Now the image
    (1 byte a pixel), a strip and the encoder: under 3 bytes a pixel + 64 MiB, as the bound says;
    two color PNGs whose bounds do not fit the render memory together run one after the other."""
    w, h = 5760, 4320                  # 24.9 megapixels, upscaled from the 1536 x 1152 slide
    pixels = w * h
    proc, port = _start("--threads", "2", "--cache-mb", "0", "--render-memory-mb", "320")
    base = f"http://127.0.0.1:{port}/iiif/3/{SID}/full"
    try:
        with httpx.Client(timeout=120) as client:
            assert client.get(f"{base}/64,/0/default.jpg").status_code == 200   # (first-use imports, buffers)

            peak, r = _peak_above_idle(proc.pid, lambda: client.get(f"{base}/^{w},{h}/!90/gray.png"))
            assert r.status_code == 200 and r.content[:4] == b"\x89PNG", r.text
            assert peak < 3 * pixels + 64 * MiB, f"{peak / MiB:.0f} MiB above idle"

            answers: list[httpx.Response] = []

            def two():
                threads = [threading.Thread(target=lambda q=q: answers.append(
                    client.get(f"{base}/^{w},{h}/0/{q}.png"))) for q in ("default", "color")]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()

            peak2, _ = _peak_above_idle(proc.pid, two)
            assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
            status = client.get(f"http://127.0.0.1:{port}/status").json()
            memory = status["render_memory"]
            assert memory["budget_bytes"] == 320 * MiB
            assert 9 * pixels < memory["peak_reserved_bytes"] <= memory["budget_bytes"]   # one at a time
            assert peak2 < 9 * pixels + 64 * MiB, f"{peak2 / MiB:.0f} MiB above idle"

            # lossless WebP of that size needs more than the whole render memory: refused, saying why
            r = client.get(f"{base}/^{w},{h}/0/default.webp")
            assert r.status_code == 400 and "render memory (320 MiB" in r.text and "WebP" in r.text, r.text
            print(f"gray PNG {peak / MiB:.0f} MiB, two color PNGs {peak2 / MiB:.0f} MiB above idle")
    finally:
        _stop(proc)


_SLOW_SERVER = """
import sys, time
import wsitool.serve.render as render
import wsitool.slide

render.STRIP_BYTES = 1 << 16   # strips of 28 rows of the 768-pixel-wide level 1
read_region = wsitool.slide.Slide.read_region

def slow_read(self, *args, **kwargs):  # each strip takes a second: the render takes ~21 s
    time.sleep(1.0)
    return read_region(self, *args, **kwargs)

wsitool.slide.Slide.read_region = slow_read
from wsitool.__main__ import main
main(sys.argv[1:])
"""


def _status(port: int) -> dict:
    return httpx.get(f"http://127.0.0.1:{port}/status", timeout=10).json()


def test_a_render_stops_soon_after_its_client_leaves():
    """Before: a render went on to its end (here ~21 s) after the client closed the connection.
    Now the server sees the connection gone, the render stops at its next strip, and /status
    counts it; the worker is free again (the next request is answered)."""
    proc, port = _start("--threads", "1", "--cache-mb", "0", code=_SLOW_SERVER)
    try:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(f"GET /iiif/3/{SID}/full/700,/0/default.jpg HTTP/1.1\r\n"
                     f"Host: 127.0.0.1:{port}\r\n\r\n".encode())
        end = time.monotonic() + 30
        while _status(port)["rendering"] != 1:
            assert time.monotonic() < end, "the render never started"
            time.sleep(0.05)
        sock.close()
        end = time.monotonic() + 12   # (the render alone would take ~20 s more)
        while (st := _status(port))["rendering"] != 0:
            assert time.monotonic() < end, f"the render went on after its client left: {st}"
            time.sleep(0.1)
        assert st["cancelled_while_rendering"] == 1 and st["cancelled_before_render"] == 0, st
        assert st["render_memory"]["reserved_bytes"] == 0, st
    finally:
        _stop(proc)


def test_a_request_reading_too_many_source_pixels_is_refused_at_once(serve_slides):
    """Before: a thumbnail of a slide without small levels decoded all of level 0 (1.6 gigapixels,
    18 s, for 40960 x 40960).  Now a request reading more than --max-decode-pixels is a 400 that
    says so, and info.json lists only the sizes and tile scale factors within the limit."""
    limit = 100_000   # less than all of level 2 (384 x 288 = 110592), the slide's smallest
    with serve_slides([str(SLIDE)], threads=1, cache_mb=0, tile_size=128, max_decode_pixels=limit) as (url, state):
        with httpx.Client(timeout=60) as client:
            r = client.get(f"{url}/iiif/3/{SID}/full/384,/0/default.jpg")   # all of level 2
            assert r.status_code == 400, r.text
            assert "reads 384x288 pixels of level 2" in r.text and "--max-decode-pixels" in r.text, r.text
            assert str(SLIDE) not in r.text
            assert client.get(f"{url}/iiif/3/{SID}/full/1536,/0/default.jpg").status_code == 400   # level 0
            assert client.get(f"{url}/iiif/3/{SID}/0,0,1024,768/256,/0/default.jpg").status_code == 200
            r = client.get(f"{url}/dz/{SID}_files/0/0_0.jpeg")   # the 1 x 1 Deep Zoom tile: all of level 2
            assert r.status_code == 400 and "reads 384x288 pixels of level 2" in r.text, r.text
            assert client.get(f"{url}/dz/{SID}_files/11/0_0.jpeg").status_code == 200
            info = client.get(f"{url}/iiif/3/{SID}/info.json").json()
            assert info["sizes"] == []   # each whole-image size reads all of a level
            assert info["tiles"][0]["scaleFactors"] == [1, 2, 4, 8]   # 16: its one tile is all of level 2
            for f in info["tiles"][0]["scaleFactors"]:   # the tiles of each factor listed are served
                span = 128 * f
                size = -(-min(span, 1152) // f)
                r = client.get(f"{url}/iiif/3/{SID}/0,{1152 - min(span, 1152)},{span},{span}/{size},/0/default.jpg")
                assert r.status_code == 200, (f, r.text)
        assert state.counters.tiles_rendered >= 6
