"""STOW-RS upload (``wsitool stow``, :func:`wsitool.formats.dicom.web.stow`): to a real Orthanc and read
back through DICOMweb equal to the local read; against a scripted server that fails, hangs or lies;
memory bounded while the files stream (a child's peak RSS)."""

from __future__ import annotations

import base64
import http.server
import json
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

import wsitool
from wsitool.cli.console import exit_code_for
from wsitool.errors import RemoteAccessError, RemoteStoreError, RemoteUnavailableError

from helpers import child_peak_rss, shared_sample
from remote_helpers import ScriptedServer, endless

pydicom = pytest.importorskip("pydicom", reason="pydicom is not installed")
pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")

from wsitool.formats.dicom.web import stow  # noqa: E402  (after the skips: it needs urllib3 when used)

SERIES = "dicom-cmu1-small-region-12level"
SINGLE = "dicom-google-jpeg-ybr-957x715.dcm"
REPO = Path(__file__).resolve().parents[2]


def _open(location, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return wsitool.open_slide(location, **kw)


def _series_url(root: str, path: Path) -> str:
    first = sorted(path.glob("*.dcm"))[0] if path.is_dir() else path
    ds = pydicom.dcmread(first, stop_before_pixels=True)
    return f"{root}/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}"


def _assert_same_slide(remote, local):
    assert remote.level_dimensions == local.level_dimensions
    for lv, (w, h) in enumerate(local.level_dimensions):
        size = (min(w, 1200), min(h, 1200))
        a = local.read_region((0, 0), lv, size)
        b = remote.read_region((0, 0), lv, size)
        assert np.array_equal(a, b), lv
    assert sorted(remote.associated_images) == sorted(local.associated_images)
    for name in local.associated_images:
        assert np.array_equal(remote.associated_images[name], local.associated_images[name]), name


# ------------------------------------------------------------------ a real Orthanc


def test_a_series_stowed_to_orthanc_reads_back_equal(orthanc_server):
    """The 12-level series in batches of 5 files (3 requests), through a URL carrying basic
    credentials (Orthanc here asks none): every instance stored, the series read back over
    DICOMweb equal to the local read."""
    folder = shared_sample(SERIES)
    with_user = orthanc_server.root.replace("http://", "dicomweb+http://alice:s3cret@")
    report = stow([folder], with_user, batch_files=5)
    assert report.ok and len(report.stored) == 12 and report.requests == 3, report.summary()
    assert "s3cret" not in report.summary() and "alice" not in report.url
    assert report.bytes_sent > sum(p.stat().st_size for p in folder.glob("*.dcm"))
    with _open("dicomweb+" + _series_url(orthanc_server.root, folder)) as remote, _open(folder) as local:
        _assert_same_slide(remote, local)


def test_the_cli_stows_one_file_to_a_study_url(orthanc_server):
    """``wsitool stow FILE URL/studies/{its study}``: exit 0, the summary line; read back equal."""
    path = shared_sample(SINGLE)
    study = pydicom.dcmread(path, stop_before_pixels=True).StudyInstanceUID
    args = ["stow", str(path), f"{orthanc_server.root}/studies/{study}"]
    proc = subprocess.run([sys.executable, "-m", "wsitool", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "1 of 1 instance(s) stored" in proc.stdout
    with _open(_series_url(orthanc_server.root, path)) as remote, _open(path) as local:
        _assert_same_slide(remote, local)


def test_export_dicom_with_stow_sends_the_series_it_wrote(orthanc_server, tmp_path):
    """``export-pyramid SLIDE OUT --format dicom --compression copy --stow URL``: the series is
    written, then sent; read back over DICOMweb it equals the folder on disk and the source."""
    src = shared_sample("aperio-cmu1-small-region-jpeg.svs")
    out = tmp_path / "series"
    args = ["export-pyramid", str(src), str(out), "--format", "dicom", "--compression", "copy", "--quiet",
            "--stow", orthanc_server.root, "--stow-option", "timeout=60"]
    proc = subprocess.run([sys.executable, "-m", "wsitool", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    files = sorted(out.glob("*.dcm"))
    assert files and f"{len(files)} of {len(files)} instance(s) stored" in proc.stdout
    with (_open("dicomweb+" + _series_url(orthanc_server.root, out)) as remote, _open(out) as local,
          _open(src) as source):
        _assert_same_slide(remote, local)
        w, h = source.dimensions
        assert np.array_equal(remote.read_region((w // 3, h // 3), 0, (300, 200)),
                              source.read_region((w // 3, h // 3), 0, (300, 200)))


def test_stow_on_export_is_refused_where_it_cannot_apply(tmp_path):
    """``--stow`` with a TIFF export, or ``--stow-option`` alone: exit 2 before any work, no output."""
    src = shared_sample("aperio-cmu1-small-region-jpeg.svs")
    for extra, out in ((["--stow", "http://127.0.0.1:9/"], tmp_path / "a.tiff"),
                       (["--format", "dicom", "--stow-option", "timeout=5"], tmp_path / "b")):
        proc = subprocess.run([sys.executable, "-m", "wsitool", "export-pyramid", str(src), str(out), *extra],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert "--stow" in proc.stderr and not out.exists()


# ------------------------------------------------------------------ a scripted STOW-RS server


class StowScript:
    """What the scripted STOW-RS server does with each POST: ``actions`` consumed one a request
    (then ``default``): "ok" (200 listing every SOP Instance UID of :attr:`sops`), "fewer" (200
    listing all but the last), "partial" (202: the first listed as failed, 0xA700), "conflict"
    (409: every one failed, 0xA900), an HTTP status (an empty body), "endless" (200, chunked,
    without end), "hang" (no answer for 30 s, or until the test ends), "early" (413 before the
    body is read).  The request's body is
    read and kept in :attr:`bodies` where ``keep``, else only counted."""

    def __init__(self, sops: list[str], keep: bool = True):
        self.sops = sops
        self.keep = keep
        self.actions: list = []
        self.default: object = "ok"
        self.seen: list[dict] = []  # each request's headers (lower-case names)
        self.bodies: list[bytes] = []
        self.received: list[int] = []
        self.sent: list[int] = []
        self.stop = threading.Event()

    def next(self):
        return self.actions.pop(0) if self.actions else self.default


def _answer(sops: list[str], failed: list[tuple[str, int]]) -> bytes:
    doc = {}
    if sops:
        doc["00081199"] = {"vr": "SQ", "Value": [{"00081150": {"vr": "UI", "Value": ["1.2.840.10008.5.1.4.1.1.77.1.6"]},
                                                  "00081155": {"vr": "UI", "Value": [s]}} for s in sops]}
    if failed:
        doc["00081198"] = {"vr": "SQ", "Value": [{"00081155": {"vr": "UI", "Value": [s]},
                                                  "00081197": {"vr": "US", "Value": [code]}} for s, code in failed]}
    return json.dumps(doc).encode()


def _stow_handler(script: StowScript):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _read_body(self):
            left = int(self.headers.get("Content-Length") or 0)
            kept, got = [], 0
            while left:
                piece = self.rfile.read(min(left, 1 << 20))
                if not piece:
                    break
                left -= len(piece)
                got += len(piece)
                if script.keep:
                    kept.append(piece)
            script.received.append(got)
            script.bodies.append(b"".join(kept))

        def _send(self, status, body=b""):
            self.send_response(status)
            self.send_header("Content-Type", "application/dicom+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            script.seen.append({k.lower(): v for k, v in self.headers.items()})
            act = script.next()
            if act == "early":  # 413 at once, the body never read, the connection closed
                self.send_response(413)
                self.send_header("Content-Length", "0")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                return
            self._read_body()
            if act == "hang":
                script.stop.wait(30)
                self.close_connection = True
                return
            if act == "endless":
                self.send_response(200)
                self.send_header("Content-Type", "application/dicom+json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                script.sent.append(endless(self.wfile, chunked=True, head=b'{"00081199": '))
                self.close_connection = True
                return
            if isinstance(act, int):
                return self._send(act)
            if act == "fewer":
                return self._send(200, _answer(script.sops[:-1], []))
            if act == "partial":
                return self._send(202, _answer(script.sops[1:], [(script.sops[0], 0xA700)]))
            if act == "conflict":
                return self._send(409, _answer([], [(s, 0xA900) for s in script.sops]))
            return self._send(200, _answer(script.sops, []))

    return Handler


def _write_dicom(path: Path, extra: int = 0) -> str:
    """A small DICOM Part-10 file (VL WSI SOP class, no pixels) and ``extra`` bytes of an OB
    element after it, written piece by piece; its SOP Instance UID."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    ds = Dataset()
    ds.SOPClassUID = "1.2.840.10008.5.1.4.1.1.77.1.6"
    ds.SOPInstanceUID = generate_uid()
    ds.StudyInstanceUID = "1.2.3.4"
    ds.SeriesInstanceUID = "1.2.3.4.5"
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.save_as(path, enforce_file_format=True)
    if extra:
        with open(path, "ab") as fp:
            fp.write(b"\x09\x00\x10\x10OB\x00\x00" + extra.to_bytes(4, "little"))
            piece = bytes(1 << 20)
            for _ in range(extra >> 20):
                fp.write(piece)
    return str(ds.SOPInstanceUID)


@pytest.fixture
def stow_server(tmp_path):
    """``(url, script, files)``: a scripted STOW-RS server (``http://127.0.0.1:PORT/dicom-web``)
    and three small DICOM files (their SOP Instance UIDs the server's answers list)."""
    files = [tmp_path / f"f{k}.dcm" for k in range(3)]
    sops = [_write_dicom(p) for p in files]
    script = StowScript(sops)
    srv = ScriptedServer(("127.0.0.1", 0), _stow_handler(script))
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/dicom-web", script, files
    script.stop.set()
    srv.shutdown()
    srv.server_close()
    thread.join(5)


def _parts(body: bytes, content_type: str) -> list[bytes]:
    boundary = content_type.split("boundary=")[1].strip('"').encode()
    chunks = body.split(b"--" + boundary)
    assert chunks[-1] == b"--\r\n"
    out = []
    for chunk in chunks[1:-1]:
        head, _, data = chunk.partition(b"\r\n\r\n")
        assert b"Content-Type: application/dicom" in head
        out.append(data[:-2])
    return out


def test_the_request_is_multipart_dicom_with_basic_credentials(stow_server):
    url, script, files = stow_server
    report = stow(files, url.replace("http://", "http://alice:s3cret@"))
    assert report.ok and report.requests == 1
    (headers,) = script.seen
    assert headers["authorization"] == "Basic " + base64.b64encode(b"alice:s3cret").decode()
    assert headers["content-type"].startswith('multipart/related; type="application/dicom"; boundary=')
    assert _parts(script.bodies[0], headers["content-type"]) == [p.read_bytes() for p in files]
    assert report.url == url + "/studies" and report.bytes_sent == len(script.bodies[0])


def test_a_bearer_token_and_headers_are_sent_and_batches_are_bounded(stow_server):
    url, script, files = stow_server
    report = stow(files, url, {"token": "t0ken", "headers": {"X-Site": "a"}}, batch_files=2)
    assert report.ok and report.requests == 2
    assert [h["authorization"] for h in script.seen] == ["Bearer t0ken"] * 2
    assert [h["x-site"] for h in script.seen] == ["a"] * 2
    assert [len(_parts(b, h["content-type"])) for b, h in zip(script.bodies, script.seen, strict=True)] == [2, 1]


def test_progress_counts_every_body_byte(stow_server):
    url, script, files = stow_server
    calls = []
    stow(files, url, batch_files=2, progress=lambda sent, total: calls.append((sent, total)))
    total = sum(script.received)
    assert calls[-1] == (total, total)
    assert all(b[1] == total for b in calls) and [c[0] for c in calls] == sorted(c[0] for c in calls)


def test_a_failing_server_is_17_after_the_retries_without_credentials(stow_server):
    url, script, files = stow_server
    script.default = 500
    with pytest.raises(RemoteUnavailableError) as info:
        stow(files, url.replace("http://", "http://alice:s3cret@"), {"retries": 1, "backoff": 0})
    message = str(info.value)
    assert "s3cret" not in message and "alice" not in message
    assert message.startswith(url + "/studies: ") and "HTTP 500 (2 attempt(s))" in message
    assert exit_code_for(info.value) == 17 and len(script.seen) == 2


@pytest.mark.parametrize("status", [401, 403])
def test_denied_is_16(stow_server, status):
    url, script, files = stow_server
    script.default = status
    with pytest.raises(RemoteAccessError, match="access denied") as info:
        stow(files, url, {"token": "t0ken"})
    assert exit_code_for(info.value) == 16 and "t0ken" not in str(info.value)


def test_a_refusal_without_failures_listed_is_16(stow_server):
    url, script, files = stow_server
    script.default = 415
    with pytest.raises(RemoteAccessError, match=r"refused the upload \(HTTP 415") as info:
        stow(files, url)
    assert exit_code_for(info.value) == 16


def test_a_refusal_before_the_body_is_read_is_16(stow_server, tmp_path):
    """A server answering 413 while 32 MiB are still being sent, then closing: its answer is read
    (not a connection reset retried)."""
    url, script, _files = stow_server
    script.default = "early"
    big = tmp_path / "big.dcm"
    _write_dicom(big, 32 << 20)
    with pytest.raises(RemoteAccessError, match=r"refused the upload \(HTTP 413"):
        stow([big], url, {"retries": 1, "backoff": 0})
    assert len(script.seen) == 1


def test_202_with_a_failure_is_reported_per_instance(stow_server):
    url, script, files = stow_server
    script.default = "partial"
    report = stow(files, url)
    assert [i.stored for i in report.instances] == [False, True, True]
    assert "0xA700 (out of resources)" in report.failed[0].reason and "HTTP 202" in report.failed[0].reason
    with pytest.raises(RemoteStoreError, match=r"1 of 3 instance\(s\) not stored") as info:
        report.raise_for_failures()
    assert exit_code_for(info.value) == 19 and str(files[0]) in str(info.value)


def test_409_lists_every_instance_failed(stow_server):
    url, script, files = stow_server
    script.default = "conflict"
    report = stow(files, url)
    assert not report.stored and all("0xA900" in i.reason for i in report.failed)


def test_a_200_listing_fewer_instances_is_caught(stow_server):
    """A server answering 200 while it lists 2 of the 3 instances sent: the third is not stored."""
    url, script, files = stow_server
    script.default = "fewer"
    report = stow(files, url)
    assert [i.stored for i in report.instances] == [True, True, False]
    assert report.failed[0].reason == "not listed as stored in the server's answer (HTTP 200)"


def test_the_cli_names_each_instance_not_stored_and_exits_19(stow_server):
    url, script, files = stow_server
    script.default = "partial"
    proc = subprocess.run([sys.executable, "-m", "wsitool", "stow", str(files[0].parent), url],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 19, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith(f"wsitool: not stored: {files[0]} (SOP Instance UID {script.sops[0]}): ")
    assert lines[-1].startswith(f"wsitool: error: {url}/studies: 1 of 3 instance(s) not stored")
    assert "1 of 3" not in proc.stdout and "2 of 3 instance(s) stored" in proc.stdout


def test_an_endless_answer_is_one_error_17_read_within_its_bound(stow_server):
    url, script, files = stow_server
    script.default = "endless"
    with pytest.raises(RemoteUnavailableError, match="more than the 1048576 bytes read at most") as info:
        stow(files, url, {"metadata_limit_mb": 1})
    assert exit_code_for(info.value) == 17 and str(info.value).startswith(url + "/studies: ")
    script.stop.set()


def test_a_hanging_server_is_17_by_the_timeout(stow_server):
    url, script, files = stow_server
    script.default = "hang"
    with pytest.raises(RemoteUnavailableError, match="timed out") as info:
        stow(files, url, {"timeout": 1, "retries": 0})
    assert exit_code_for(info.value) == 17 and str(info.value).startswith(url + "/studies: ")


def test_the_cli_refuses_bad_inputs_before_sending(stow_server, tmp_path):
    """Not a DICOM file (3), a file of another study than the URL's (2), a series URL (2): nothing sent."""
    url, script, files = stow_server
    text = tmp_path / "notes.txt"
    text.write_text("not DICOM")
    cases = [([str(text), url], 3, "not a DICOM Part-10 file"),
             ([str(files[0]), url + "/studies/9.9"], 2, "not the study of"),
             ([str(files[0]), url + "/studies/1.2.3.4/series/1.2.3.4.5"], 2, "not to a series")]
    for args, code, words in cases:
        proc = subprocess.run([sys.executable, "-m", "wsitool", "stow", *args], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == code and words in proc.stderr, (args, proc.stderr)
    for bad in ({"batch_mb": 0}, {"batch_mb": float("nan")}, {"batch_files": 0}, {"batch_files": 1.5}):
        with pytest.raises(wsitool.InvalidOptionError, match="batch_"):
            stow(files, url, **bad)
    assert not script.seen


# ------------------------------------------------------------------ memory, in a child


_CHILD = textwrap.dedent("""
    import sys
    from wsitool.cli import main
    main(["stow", sys.argv[1], sys.argv[2], "--batch-mb", "1024"])
""")


def _peak_rss(folder: Path, url: str, tmp_path: Path) -> tuple[int, int, str]:
    """``(exit code, peak RSS in bytes, stderr)`` of ``wsitool stow folder url`` in a child
    process: its own peak (:func:`helpers.child_peak_rss`)."""
    return child_peak_rss(_CHILD, [str(folder), url], tmp_path, timeout=300)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak from /proc (Linux)")
def test_files_stream_from_disk_with_bounded_memory(stow_server, tmp_path):
    """Three files of 64 MiB in one request: the child's peak RSS within 32 MiB of the same
    command's sending one small file (the body is never held whole)."""
    url, script, _files = stow_server
    small, big = tmp_path / "small", tmp_path / "big"
    small.mkdir()
    big.mkdir()
    script.keep = False
    script.sops = [_write_dicom(small / "a.dcm")]
    small_size = (small / "a.dcm").stat().st_size
    code, base, err = _peak_rss(small, url, tmp_path)
    assert code == 0, err
    script.sops = [_write_dicom(big / f"b{k}.dcm", 64 << 20) for k in range(3)]
    code, peak, err = _peak_rss(big, url, tmp_path)
    assert code == 0, err
    assert script.received[-1] > 3 * (64 << 20)
    print(f"peak RSS: {base >> 20} MiB sending {small_size} bytes, {peak >> 20} MiB sending "
          f"{script.received[-1] >> 20} MiB")
    assert peak < base + (32 << 20), (peak >> 20, base >> 20)
