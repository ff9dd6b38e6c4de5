"""Local emulators of Google Cloud Storage and Azure Blob Storage for the gs:// and az:// tests.

* :func:`gcs_emulator` runs ``gcp-storage-emulator`` (PyPI, the ``test`` extra) in memory.
* :func:`azurite` runs Azurite's blob service (npm; ``scripts/install_test_servers.sh`` installs
  it into ``~/.cache/wsitool-test/azurite``, or ``WSITOOL_AZURITE_DIR``) in memory.

Each starts on 127.0.0.1 with a free port and stops when its context exits; ``*_missing()``
says why one cannot start (None when it can).  The Azure account is Azurite's well-known
development account (public test values, printed in Azurite's documentation).
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import hashlib
import hmac
import http.client
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from remote_helpers import servers

#: Azurite's development account and key (public values every Azure SDK knows)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _gcs_command() -> str | None:
    exe = Path(sys.executable).with_name("gcp-storage-emulator")
    return str(exe) if exe.exists() else shutil.which("gcp-storage-emulator")


def azurite_dir() -> Path:
    """Where ``scripts/install_test_servers.sh`` puts Azurite."""
    default = Path.home() / ".cache" / "wsitool-test" / "azurite"
    return Path(os.environ.get("WSITOOL_AZURITE_DIR") or default)


def _azurite_command() -> str | None:
    exe = azurite_dir() / "node_modules" / ".bin" / "azurite-blob"
    return str(exe) if exe.exists() else shutil.which("azurite-blob")


def gcs_missing() -> str | None:
    """Why the GCS emulator cannot start here, or None."""
    if _gcs_command() is None:
        return "gcp-storage-emulator is not installed (pip install gcp-storage-emulator; the test extra has it)"
    return None


def azurite_missing() -> str | None:
    """Why Azurite cannot start here, or None."""
    if shutil.which("node") is None:
        return "node is not installed (Azurite runs on Node.js)"
    if _azurite_command() is None:
        return f"Azurite is not installed in {azurite_dir()} (bash scripts/install_test_servers.sh)"
    return None


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    parts = urllib.parse.urlsplit(url)
    end = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the emulator exited with status {proc.returncode}")
        try:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=2)
            conn.request("GET", "/")
            conn.getresponse().read()
            conn.close()
            return
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


@contextlib.contextmanager
def gcs_emulator(bucket: str) -> Iterator[str]:
    """gcp-storage-emulator with the bucket ``bucket``; yields its base URL ``http://127.0.0.1:PORT``.

    Raises:
        RuntimeError: not installed, or it did not start.
    """
    cmd = _gcs_command()
    if cmd is None:
        raise RuntimeError(gcs_missing())
    port = servers.free_port()
    with tempfile.TemporaryDirectory(prefix="wsitool-gcs-") as tmp:
        proc = subprocess.Popen([cmd, "-d", tmp, "start", "--host", "127.0.0.1", "--port", str(port),
                                 "--in-memory", "--default-bucket", bucket, "-q"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_http(url, proc)
            yield url
        finally:
            servers._stop(proc)


def gcs_upload(base_url: str, bucket: str, name: str, data: bytes) -> None:
    """Store ``data`` as ``gs://bucket/name`` on the emulator (a JSON-API media upload)."""
    parts = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    query = urllib.parse.urlencode({"uploadType": "media", "name": name})
    conn.request("POST", f"/upload/storage/v1/b/{bucket}/o?{query}", body=data,
                 headers={"Content-Type": "application/octet-stream"})
    response = conn.getresponse()
    response.read()
    conn.close()
    if response.status != 200:
        raise RuntimeError(f"upload of {name} to the GCS emulator: HTTP {response.status}")


@contextlib.contextmanager
def azurite() -> Iterator[str]:
    """Azurite's blob service; yields the account's endpoint ``http://127.0.0.1:PORT/devstoreaccount1``.

    Raises:
        RuntimeError: not installed, or it did not start.
    """
    cmd = _azurite_command()
    if cmd is None:
        raise RuntimeError(azurite_missing())
    port = servers.free_port()
    with tempfile.TemporaryDirectory(prefix="wsitool-azurite-") as tmp:
        proc = subprocess.Popen([cmd, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
                                 "--silent", "--disableTelemetry", "--skipApiVersionCheck"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp)
        try:
            _wait_http(f"http://127.0.0.1:{port}", proc, 60)
            yield f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
        finally:
            servers._stop(proc)


def azurite_create_container(endpoint: str, container: str) -> None:
    """Create ``container`` in Azurite's development account (a request signed with its Shared Key)."""
    parts = urllib.parse.urlsplit(endpoint)
    path = f"{parts.path.rstrip('/')}/{container}"
    date = email.utils.formatdate(usegmt=True)
    version = "2021-08-06"
    # Shared Key: verb, 11 standard headers (all empty here), the x-ms- headers, the resource
    to_sign = "\n".join(["PUT", *[""] * 11, f"x-ms-date:{date}\nx-ms-version:{version}",
                         f"/{AZURITE_ACCOUNT}{path}\nrestype:container"])
    mac = hmac.new(base64.b64decode(AZURITE_KEY), to_sign.encode(), hashlib.sha256).digest()
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("PUT", f"{path}?restype=container", body=b"",
                 headers={"x-ms-date": date, "x-ms-version": version, "Content-Length": "0",
                          "Authorization": f"SharedKey {AZURITE_ACCOUNT}:{base64.b64encode(mac).decode()}"})
    response = conn.getresponse()
    response.read()
    conn.close()
    if response.status not in (201, 409):  # 409: it exists
        raise RuntimeError(f"creating the Azurite container {container}: HTTP {response.status}")
