"""Orthanc with its DICOMweb plugin on 127.0.0.1, for the DICOMweb tests and benchmarks.

``orthanc()`` is a context manager: a temporary configuration (a free HTTP
port, no DICOM port, remote access off, storage in a temporary folder, the
DICOMweb plugin), the server started and waited for, stopped on exit.  It
yields an object with ``root`` (``http://127.0.0.1:PORT/dicom-web``),
``port`` and ``load(paths)`` (STOW-RS of DICOM files through
:func:`wsitool.formats.dicom.web.upload`; returns their series URLs).
Debian: ``apt-get install orthanc orthanc-dicomweb``.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

ORTHANC = shutil.which("Orthanc")


def plugin() -> str | None:
    """The DICOMweb plugin's shared library, or None."""
    for pattern in ("/usr/share/orthanc/plugins/libOrthancDicomWeb.so*",
                    "/usr/lib/orthanc/libOrthancDicomWeb.so*",
                    "/usr/local/share/orthanc/plugins/libOrthancDicomWeb.so*"):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def missing() -> str | None:
    """Why Orthanc cannot run here, or None."""
    if ORTHANC is None:
        return "Orthanc is not installed (Debian: apt-get install orthanc orthanc-dicomweb)"
    if plugin() is None:
        return "Orthanc's DICOMweb plugin is not installed (Debian: apt-get install orthanc-dicomweb)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, port: int, pid: int | None = None):
        self.port = port
        self.pid = pid  # (the server's process id: the benchmarks read its CPU time)
        self.root = f"http://127.0.0.1:{port}/dicom-web"

    def load(self, paths) -> list[str]:
        """Store the DICOM files ``paths`` (STOW-RS); the series URLs they form, sorted."""
        import pydicom

        from wsitool.formats.dicom.web import upload

        paths = [str(p) for p in paths]
        upload(self.root, paths)
        urls = set()
        for p in paths:
            ds = pydicom.dcmread(p, stop_before_pixels=True, specific_tags=["StudyInstanceUID",
                                                                           "SeriesInstanceUID"])
            urls.add(f"{self.root}/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}")
        return sorted(urls)


@contextlib.contextmanager
def orthanc(threads: int | None = None):
    """A started Orthanc with DICOMweb on a free port of 127.0.0.1 (see the module docstring)."""
    why = missing()
    if why:
        raise RuntimeError(why)
    with tempfile.TemporaryDirectory(prefix="wsitool-orthanc-") as tmp:
        port = free_port()
        config = {
            "Name": "wsitool-test", "HttpPort": port, "DicomPort": 0, "DicomServerEnabled": False,
            "RemoteAccessAllowed": False, "AuthenticationEnabled": False,
            "StorageDirectory": os.path.join(tmp, "db"), "IndexDirectory": os.path.join(tmp, "db"),
            "Plugins": [plugin()], "HttpCompressionEnabled": False,
            "DicomWeb": {"Enable": True, "Root": "/dicom-web/"},
        }
        if threads:
            config["HttpThreadsCount"] = threads
        path = os.path.join(tmp, "orthanc.json")
        with open(path, "w") as fp:
            json.dump(config, fp)
        with open(os.path.join(tmp, "orthanc.log"), "wb") as log:
            proc = subprocess.Popen([ORTHANC, path], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
            try:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/system", timeout=2):
                            break
                    except OSError:
                        if proc.poll() is not None or time.monotonic() > deadline:
                            log.close()
                            with open(os.path.join(tmp, "orthanc.log"), "rb") as fp:
                                tail = fp.read()[-2000:].decode("utf-8", "replace")
                            raise RuntimeError(f"Orthanc did not start:\n{tail}") from None
                        time.sleep(0.1)
                yield Server(port, proc.pid)
            finally:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
