"""What a server accepts from the network (issue 47 items 5 and 6): the ``Host`` it answers to,
CORS only where asked for and only on IIIF / Deep Zoom, idle and slow connections closed, a cap
on connections.  Browser-free: raw sockets and httpx against servers on free ports."""

from __future__ import annotations

import http.client
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from wsitool.errors import InvalidOptionError
from wsitool.serve.guard import HostPolicy, check_host_name, check_origin

from helpers import REPO

SLIDE = REPO / "samples" / "sample-aperio-jpeg.svs"
SID = SLIDE.name
IIIF_DZ = [f"/iiif/3/{SID}/info.json", f"/iiif/3/{SID}/full/64,/0/default.jpg", f"/dz/{SID}.dzi",
           f"/dz/{SID}_files/0/0_0.jpeg", "/iiif/3/nope/info.json"]
PAGES = ["/", f"/view/{SID}", "/status"]


def _get(url: str, path: str, host: str | None = None):
    import httpx

    return httpx.get(url + path, headers={"Host": host} if host is not None else {}, timeout=30)


def test_a_foreign_host_gets_400_and_the_loopback_names_are_answered(serve_slides):
    with serve_slides([SLIDE], threads=1, cache_mb=0) as (url, _state):
        port = url.rsplit(":", 1)[1]
        for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1.nip.io:{port}", "192.168.1.7",
                     "[fe80::1]", "localhost.evil.example", "", "a b"):
            for path in PAGES + IIIF_DZ[:1]:
                r = _get(url, path, host)
                assert r.status_code == 400, (host, path, r.status_code)
                assert "--allowed-host" in r.text and "evil" not in r.text
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", "localhost.", f"[::1]:{port}"):
            assert _get(url, "/status", host).status_code == 200, host


def test_allowed_host_adds_names(serve_slides):
    with serve_slides([SLIDE], threads=1, cache_mb=0, allowed_hosts=("Slides.Lab.Example",)) as (url, _state):
        assert _get(url, "/", "slides.lab.example:8000").status_code == 200
        assert _get(url, "/", "other.lab.example").status_code == 400
    with serve_slides([SLIDE], threads=1, cache_mb=0, allowed_hosts=("*",)) as (url, _state):
        assert _get(url, "/", "anything.example").status_code == 200


def test_the_host_policy_of_each_kind_of_bind():
    loop = HostPolicy.for_bind("127.0.0.1", ["127.0.0.1"])
    assert loop.allows("localhost:1") and loop.allows("[::1]") and loop.allows(None)
    assert not loop.allows("10.0.0.1") and not loop.allows("evil.example")
    lan = HostPolicy.for_bind("192.168.1.20", ["192.168.1.20"], ["ws.lab"])
    assert lan.allows("192.168.1.20:8000") and lan.allows("ws.lab")
    assert not lan.allows("localhost") and not lan.allows("192.168.1.21") and not lan.allows("evil.example")
    named = HostPolicy.for_bind("ws.lab", ["192.168.1.20"])
    assert named.allows("ws.lab:80") and named.allows("192.168.1.20") and not named.allows("ws2.lab")
    wild = HostPolicy.for_bind("0.0.0.0", ["0.0.0.0"])  # any IP literal: no DNS name to rebind
    assert wild.allows("10.1.2.3:8000") and wild.allows("[2001:db8::1]:80") and wild.allows("localhost")
    assert not wild.allows("evil.example") and not wild.allows("10.1.2.3.nip.io")
    assert HostPolicy.for_bind("::", ["::"]).allows("172.17.0.2")
    assert not wild.allows("[not-v6]") and not wild.allows("[::1") and not wild.allows("a:b:c")


def test_option_forms_are_checked():
    assert check_host_name("[::1]") == "::1" and check_host_name("Lab.Example.") == "lab.example"
    assert check_origin("https://viewer.example.org:8443") and check_origin("*")
    for bad in ("lab.example:80", "https://lab.example", "a/b", ""):
        with pytest.raises(InvalidOptionError):
            check_host_name(bad)
    for bad in ("https://viewer.example.org/", "viewer.example.org", "ftp://x", "https://x/path", "null"):
        with pytest.raises(InvalidOptionError):
            check_origin(bad)


def test_no_cors_header_by_default(serve_slides):
    with serve_slides([SLIDE], threads=1, cache_mb=0) as (url, _state):
        for path in PAGES + IIIF_DZ:
            r = _get(url, path)
            assert r.status_code in (200, 404), (path, r.status_code)
            assert "access-control-allow-origin" not in r.headers, path


def test_cors_origin_goes_on_iiif_and_deep_zoom_only(serve_slides):
    origin = "https://viewer.example.org"
    with serve_slides([SLIDE], threads=1, cache_mb=0, cors_origin=origin) as (url, _state):
        for path in [*IIIF_DZ, f"/iiif/3/{SID}/full/99999,/0/default.jpg"]:  # errors too (a 404, a 400)
            r = _get(url, path)
            assert r.headers.get("access-control-allow-origin") == origin, (path, r.status_code)
        for path in PAGES:
            r = _get(url, path)
            assert r.status_code == 200 and "access-control-allow-origin" not in r.headers, path


def _closed_within(sock: socket.socket, limit: float) -> bool:
    """Whether the server closes ``sock`` within ``limit`` seconds (EOF or reset; bounded wait)."""
    sock.settimeout(limit)
    try:
        while True:
            if not sock.recv(4096):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _address(url: str) -> tuple[str, int]:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


def test_idle_and_slow_header_connections_are_closed(serve_slides):
    """Issue 47 item 6: a connection that never sent a byte, and one sending its headers a byte
    at a time, were held for good (uvicorn's keep-alive timer starts only after an answer and
    any byte cancels it).  With a 1 s header timeout (60 s by default) both are closed."""
    with serve_slides([SLIDE], threads=1, cache_mb=0, header_timeout=1.0) as (url, _state):
        address = _address(url)
        with socket.create_connection(address) as idle:
            assert _closed_within(idle, 20)
        with socket.create_connection(address) as slow:
            request = b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"x" * 400
            closed = False
            for i in range(len(request)):  # 0.05 s a byte: 20 s in all, unless closed first
                try:
                    slow.sendall(request[i:i + 1])
                except OSError:
                    closed = True
                    break
                slow.settimeout(0.05)
                try:
                    if not slow.recv(4096):
                        closed = True
                        break
                except TimeoutError:
                    pass
                except ConnectionResetError:
                    closed = True
                    break
            assert closed, "a byte-a-time sender kept its connection"
        # a connection that sends its requests in time is answered, and kept between them
        good = http.client.HTTPConnection(*address, timeout=20)
        try:
            for _ in range(3):
                good.request("GET", "/status")
                answer = good.getresponse()
                assert answer.status == 200 and answer.read()
        finally:
            good.close()


def test_connections_past_the_cap_get_503(serve_slides):
    with serve_slides([SLIDE], threads=1, cache_mb=0, max_connections=4, header_timeout=30) as (url, _state):
        address = _address(url)
        held = [socket.create_connection(address) for _ in range(4)]
        try:
            with socket.create_connection(address) as extra:
                extra.settimeout(20)
                assert extra.recv(200).startswith(b"HTTP/1.1 503")
                assert _closed_within(extra, 20)
        finally:
            for sock in held:
                sock.close()
        for _ in range(100):  # the server sees the four close (bounded wait)
            if _get(url, "/status").status_code == 200:
                break
            time.sleep(0.05)
        assert _get(url, "/status").status_code == 200


def test_cli_options_reach_every_worker():
    """``--workers 2 --cors-origin ... --allowed-host ...``: both workers answer with the header
    and accept the name (settings are carried to each worker); a bad origin is exit 2."""
    import httpx

    bad = subprocess.run([sys.executable, "-c", "from wsitool.cli import main; main()", "serve", str(SLIDE),
                          "--port", "0", "--cors-origin", "https://viewer.example.org/"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--cors-origin" in bad.stderr, bad.stderr
    if not hasattr(socket, "SO_REUSEPORT"):
        pytest.skip("this system has no SO_REUSEPORT")
    proc = subprocess.Popen([sys.executable, "-c", "from wsitool.cli import main; main()", "serve", str(SLIDE),
                             "--port", "0", "--workers", "2", "--threads", "2", "--cors-origin", "*",
                             "--allowed-host", "slides.lab.example"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for _ in range(200):
            line = proc.stderr.readline()
            found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
            if found or (not line and proc.poll() is not None):
                port = found and int(found.group(1))
                break
        assert port, "no start-up line"
        pids, origins, named = set(), set(), set()
        for _ in range(24):  # a new connection each: the kernel deals them to both workers
            r = httpx.get(f"http://127.0.0.1:{port}/iiif/3/{SID}/info.json", timeout=30)
            origins.add(r.headers.get("access-control-allow-origin"))
            named.add(httpx.get(f"http://127.0.0.1:{port}/status", headers={"Host": "slides.lab.example"},
                                timeout=30).status_code)
            pids.add(httpx.get(f"http://127.0.0.1:{port}/status", timeout=30).json()["pid"])
        assert len(pids) == 2 and origins == {"*"} and named == {200}
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
