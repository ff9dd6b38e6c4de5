"""Servers for the remote-reading tests (imported by them): nginx, moto's S3, a scripted HTTP server for faults."""

from __future__ import annotations

import http.server
import importlib.util
import re
import socket
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest


def _servers():
    name = "wsitool_test_remote_servers"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[2] / "scripts" / "remote_servers.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


servers = _servers()


def dicomweb_servers():
    """``scripts/dicomweb_servers.py`` (Orthanc with its DICOMweb plugin), imported once."""
    name = "wsitool_test_dicomweb_servers"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[2] / "scripts" / "dicomweb_servers.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module")
def orthanc_server():
    """An empty Orthanc with its DICOMweb plugin on a free port of 127.0.0.1, for one test module
    (``root``: ``http://127.0.0.1:PORT/dicom-web``; ``load(paths)``: STOW-RS of files, their series
    URLs); stopped after the module.  Skips where Orthanc or its plugin is not installed."""
    module = dicomweb_servers()
    why = module.missing()
    if why:
        pytest.skip(why)
    with module.orthanc() as server:
        yield server


@pytest.fixture(scope="session")
def nginx_factory():
    """``nginx_factory(root)`` -> a started nginx over ``root`` (stopped at the end of the session)."""
    if servers.NGINX is None:
        pytest.skip("nginx is not installed (Debian: apt-get install nginx-light)")
    import contextlib
    stack = contextlib.ExitStack()
    started = {}

    def start(root):
        key = str(root)
        if key not in started:
            started[key] = stack.enter_context(servers.nginx(root))
        return started[key]

    with stack:
        yield start


class ScriptedServer(http.server.ThreadingHTTPServer):
    """The scripted servers' HTTP server: daemon threads, and a client that leaves mid-answer
    (what the hostile tests make readers do) is no error printed on the test's terminal;
    any other handler error is printed as ``http.server`` prints it."""

    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class Script:
    """What the scripted server does: ``actions`` is a list consumed one per request
    (then ``default``); each is "ok", a status code, "short", "reset", "hang", "slow", "trickle"
    (the body 1 KiB every 0.3 s, never idle for a second), "whole"
    (200 with the whole object, Range ignored), "redirect" (302 to the same path with
    ``moved=1`` added to its query) or "chunked" (the 206 body chunked, no Content-Length);
    hostile answers (:func:`endless`): "overlong" (206 with the range asked for, a
    Content-Length of 10 GiB and a body without end), "overlong-chunked" (206 with the range
    asked for, chunked, without end), "longer" (206 of 1 MiB more than asked, range and length
    agreeing) and "endless" (200, chunked, without end: Range ignored).
    ``etag`` (None: no ETag header) and ``modified`` (a Last-Modified header, or None) go with
    every 2xx answer; a request whose ``If-Match`` is not ``etag`` gets 412, as a server checks
    it.  ``seen``: each request's path and headers (names in lower case)."""

    def __init__(self, data: bytes, etag: str | None = '"v1"', modified: str | None = None):
        self.data = data
        self.etag = etag
        self.modified = modified
        self.actions: list = []
        self.default = "ok"
        self.log: list[tuple[str, str]] = []  # (action, Range)
        self.seen: list[tuple[str, dict]] = []  # (path with query, headers)
        self.sent: list[int] = []  # bytes each hostile answer (:func:`endless`) sent
        self.lock = threading.Lock()

    def next(self):
        with self.lock:
            return self.actions.pop(0) if self.actions else self.default


#: What a hostile answer of :func:`endless` sends at the most (then it stops: a bounded loop).
ENDLESS_BYTES = 4 << 30
ENDLESS_SECONDS = 60


def endless(wfile, chunked: bool, head: bytes = b"") -> int:
    """Write ``head``, then zeros without end (chunked or not) until the client goes away,
    :data:`ENDLESS_BYTES` are sent or :data:`ENDLESS_SECONDS` pass; the bytes sent."""
    piece = bytes(64 * 1024)
    sent = 0
    end = time.monotonic() + ENDLESS_SECONDS
    try:
        for data in ([head] if head else []) + [piece] * (ENDLESS_BYTES // len(piece)):
            wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n" if chunked else data)
            sent += len(data)
            if time.monotonic() > end:
                break
    except OSError:  # (the client closed the connection: what a bounded reader does)
        pass
    return sent


def _handler(script: Script):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            action = script.next()
            rng = self.headers.get("Range", "")
            script.log.append((str(action), rng))
            script.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
            match = self.headers.get("If-Match")
            if match is not None and match != script.etag and not isinstance(action, int):
                action = 412
            if action == "redirect":
                self.send_response(302)
                self.send_header("Location", self.path + ("&" if "?" in self.path else "?") + "moved=1")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if isinstance(action, int):
                body = b"no"
                self.send_response(action)
                if action == 416:
                    self.send_header("Content-Range", f"bytes */{len(script.data)}")
                if action in (429, 503):
                    self.send_header("Retry-After", "0")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if action == "hang":
                time.sleep(30)
                return
            if action == "slow":
                time.sleep(0.5)  # a slow first byte, within the timeout
            if action == "endless":  # a server that ignores Range and sends a body without end
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self._identity()
                self.end_headers()
                script.sent.append(endless(self.wfile, chunked=True))
                self.close_connection = True
                return
            if action == "whole":  # a server that ignores Range
                self.send_response(200)
                self.send_header("Content-Length", str(len(script.data)))
                self._identity()
                self.end_headers()
                self.wfile.write(script.data)
                return
            m = re.match(r"bytes=(\d+)-(\d+)", rng)
            start, end = (int(m.group(1)), int(m.group(2)) + 1) if m else (0, len(script.data))
            end = min(end, len(script.data))
            if action == "longer":
                end = min(end + (1 << 20), len(script.data))
            body = script.data[start:end]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(script.data)}")
            self._identity()
            if action in ("overlong", "overlong-chunked"):  # the range as asked, then no end
                if action == "overlong":
                    self.send_header("Content-Length", str(10 << 30))
                else:
                    self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                script.sent.append(endless(self.wfile, chunked=action == "overlong-chunked", head=body))
                self.close_connection = True
                return
            if action == "chunked":
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for k in range(0, len(body), 8192):
                    piece = body[k:k + 8192]
                    self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")
                return
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if action == "trickle":
                try:
                    for k in range(0, len(body), 1024):
                        self.wfile.write(body[k:k + 1024])
                        self.wfile.flush()
                        time.sleep(0.3)
                except (BrokenPipeError, ConnectionResetError):  # (the client gave up)
                    self.close_connection = True
                return
            if action == "short":
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            if action == "reset":
                self.wfile.write(body[: len(body) // 3])
                self.wfile.flush()
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                self.connection.close()
                self.close_connection = True
                return
            self.wfile.write(body)

        def _identity(self):
            if script.etag is not None:
                self.send_header("ETag", script.etag)
            if script.modified is not None:
                self.send_header("Last-Modified", script.modified)

    return Handler


@pytest.fixture
def scripted():
    """``scripted(data, etag='"v1"', modified=None, tls=None)`` -> ``(url, Script)`` of a threaded
    HTTP server serving ``data``; ``tls``: an ``ssl.SSLContext`` of the server (an https:// URL)."""
    started = []

    def start(data: bytes, etag: str | None = '"v1"', modified: str | None = None, tls=None):
        script = Script(data, etag, modified)
        srv = ScriptedServer(("127.0.0.1", 0), _handler(script))
        if tls is not None:
            srv.socket = tls.wrap_socket(srv.socket, server_side=True)
        srv.daemon_threads = True
        t = threading.Thread(target=srv.serve_forever, daemon=True)
        t.start()
        started.append((srv, t))
        scheme = "https" if tls is not None else "http"
        return f"{scheme}://127.0.0.1:{srv.server_address[1]}/slide.svs", script

    yield start
    for srv, t in started:
        srv.shutdown()
        srv.server_close()
        t.join(5)


def client_connections(port: int) -> int:
    """TCP connections of this process to 127.0.0.1:``port`` that are open."""
    return sum(1 for c in psutil.Process().net_connections("tcp")
               if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def remote_threads() -> int:
    """Live threads of wsitool's remote fetch pools."""
    return sum(1 for t in threading.enumerate() if t.name.startswith("wsitool-remote"))
