"""``wsitool serve`` of remote slides: a URL per slide (nginx), an S3 prefix (moto), start-up errors."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys

import pytest

pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")
httpx = pytest.importorskip("httpx", reason="httpx is not installed")
pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")

from wsitool.serve.registry import url_slide_id  # noqa: E402

from helpers import NO_SHARED, REPO, SHARED_SAMPLES, environ  # noqa: E402
from remote_helpers import servers  # noqa: E402
from serve_helpers import running_server  # noqa: E402

# nginx_factory, scripted: fixtures of remote_helpers (registered by tests/conftest.py)

SAMPLES = REPO / "samples"
SERIES = SHARED_SAMPLES / "dicom-cmu1-small-region-12level"  # a DICOM series: one file per level
SLIDE = SAMPLES / "sample-aperio-jpeg.svs"
SLIDE2 = SAMPLES / "sample-aperio-j2k.svs"
REGION = "/full/256,/0/default.png", "/512,256,700,600/350,/0/default.png", "/0,0,512,512/max/0/default.jpg"


@pytest.fixture(scope="module")
def s3():
    """moto's S3 with bucket ``serve``: two slides under ``cases/`` (one a level down), a text file
    there, one slide under ``other/``; yields the environment that points clients at it."""
    pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")
    boto3 = pytest.importorskip("boto3", reason="boto3 (with moto[server]) is not installed")
    if not servers.moto_available():
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    with servers.moto_s3() as srv, environ(srv.extra["env"]):
        client = boto3.client("s3")
        client.create_bucket(Bucket="serve")
        client.upload_file(str(SLIDE), "serve", f"cases/{SLIDE.name}")
        client.upload_file(str(SLIDE2), "serve", f"cases/sub/{SLIDE2.name}")
        client.put_object(Bucket="serve", Key="cases/notes.txt", Body=b"not a slide")
        client.upload_file(str(SLIDE), "serve", "other/c.svs")
        for part in sorted(SERIES.iterdir()) if SERIES.is_dir() else ():
            client.upload_file(str(part), "serve", f"dicom/cmu1/{part.name}")
        yield srv.extra["env"]


@contextlib.contextmanager
def _client(sources, **options):
    """``(httpx client, ServerState)`` of a server of ``sources`` on 127.0.0.1."""
    with running_server(sources, cache_mb=16, threads=2, **options) as (base, state), \
            httpx.Client(base_url=base, timeout=30) as client:
        yield client, state


def _same_as_local(client, remote_id: str, local_id: str) -> None:
    """info.json sizes and every region of :data:`REGION` equal between the two ids."""
    got = client.get(f"/iiif/3/{remote_id}/info.json")
    want = client.get(f"/iiif/3/{local_id}/info.json")
    assert got.status_code == want.status_code == 200, got.text
    g, w = got.json(), want.json()
    assert (g["width"], g["height"], g["sizes"], g["tiles"]) == (w["width"], w["height"], w["sizes"], w["tiles"])
    assert g["id"].endswith("/iiif/3/" + remote_id)
    for region in REGION:
        got = client.get(f"/iiif/3/{remote_id}{region}")
        want = client.get(f"/iiif/3/{local_id}{region}")
        assert got.status_code == want.status_code == 200, (region, got.text)
        assert got.content == want.content, region


def _wsitool(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-c", "from wsitool.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_url_ids_never_carry_credentials_or_queries():
    assert url_slide_id("https://user:pw@host:8443/a/b/slide%20one.svs?X-Amz-Signature=abc#f") == "slide one.svs"
    assert url_slide_id("s3://bucket/cases/a.svs") == "a.svs"
    assert url_slide_id("s3://bucket") == "bucket"


def test_a_url_per_slide_serves_what_the_local_file_serves(nginx_factory):
    srv = nginx_factory(SAMPLES)
    port = srv.url.split(":")[-1].split("/")[0]
    secret_url = f"http://reader:hunter2@127.0.0.1:{port}/{SLIDE.name}?token=s3cr3t"
    with _client([str(SLIDE), secret_url, srv.url + SLIDE2.name]) as (client, state):
        ids = [e.id for e in state.registry]
        assert ids == [SLIDE.name, SLIDE.name + "~2", SLIDE2.name]  # unique as local files are
        shown = [e.path for e in state.registry]
        assert not any("hunter2" in p or "s3cr3t" in p for p in shown), shown
        _same_as_local(client, SLIDE.name + "~2", SLIDE.name)
        page = client.get("/").text + client.get("/status").text
        assert "hunter2" not in page and "s3cr3t" not in page
        # a request naming the URL is no id: nothing but the listed ids is reachable
        assert client.get(f"/iiif/3/{secret_url}/info.json").status_code == 404


def test_an_s3_prefix_serves_the_slides_under_it(s3):
    with _client(["s3://serve/cases/", str(SLIDE), str(SLIDE2)]) as (client, state):
        ids = [e.id for e in state.registry]
        assert ids[:2] == [SLIDE.name, "sub~" + SLIDE2.name], ids  # notes.txt and other/ are not served
        assert [e.path for e in state.registry][:2] == [f"s3://serve/cases/{SLIDE.name}",
                                                        f"s3://serve/cases/sub/{SLIDE2.name}"]
        assert state.registry.get("sub~" + SLIDE2.name).slide.remote["protocol"] == "s3"
        _same_as_local(client, SLIDE.name, SLIDE.name + "~2")
        _same_as_local(client, "sub~" + SLIDE2.name, SLIDE2.name)


def test_a_whole_bucket_and_storage_options(s3):
    endpoint = s3["AWS_ENDPOINT_URL"]
    with _client(["s3://serve/"], storage_options={"endpoint_url": endpoint, "retries": 1}) as (client, state):
        series = ["dicom~cmu1"] if SERIES.is_dir() else []
        assert [e.id for e in state.registry] == [f"cases~{SLIDE.name}", f"cases~sub~{SLIDE2.name}",
                                                  *series, "other~c.svs"]
        assert client.get("/iiif/3/other~c.svs/full/128,/0/default.jpg").status_code == 200


def test_dicom_series_under_a_prefix_are_one_slide_each(s3):
    if not SERIES.is_dir():
        pytest.skip(NO_SHARED)
    for url, sid in (("s3://serve/dicom/", "cmu1"), ("s3://serve/dicom/cmu1/", "cmu1")):
        with _client([url, str(SERIES)]) as (client, state):
            assert [e.id for e in state.registry] == [sid, SERIES.name], url
            assert state.registry.get(sid).path == "s3://serve/dicom/cmu1/"
            _same_as_local(client, sid, SERIES.name)


def test_a_missing_object_or_empty_prefix_is_one_line_exit_9(s3):
    for url in ("s3://serve/cases/missing.svs", "s3://serve/nothing-here/", "s3://no-such-bucket/a/"):
        proc = _wsitool("serve", url, "--port", "0", env=s3)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 9, (url, proc.stderr)
        assert len(lines) == 1 and url in lines[0], proc.stderr


def test_storage_option_on_the_command_line(s3):
    proc = _wsitool("serve", "s3://serve/cases/missing.svs", "--port", "0",
                    "--storage-option", "no_such_option=1", env=s3)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "no_such_option" in lines[0], proc.stderr


def test_an_http_prefix_is_refused_in_one_line(nginx_factory):
    srv = nginx_factory(SAMPLES)
    proc = _wsitool("serve", srv.url, "--port", "0")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and srv.url in lines[0] and "no listing" in lines[0], proc.stderr


def test_a_denied_url_is_exit_16_and_a_failing_one_17(scripted):
    data = SLIDE.read_bytes()
    for action, code in ((403, 16), (503, 17)):
        url, script = scripted(data)
        script.default = action
        proc = _wsitool("serve", url + "?sig=s3cr3t", "--port", "0",
                        "--storage-option", "retries=0", "--storage-option", "timeout=5")
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == code, proc.stderr
        assert len(lines) == 1 and url in lines[0] and "s3cr3t" not in proc.stderr, proc.stderr


def test_a_remote_slide_failing_later_gives_the_usual_error(scripted):
    url, script = scripted(SLIDE.read_bytes())
    with _client([url], storage_options={"retries": 0, "timeout": 5}) as (client, _state):
        assert client.get("/iiif/3/slide.svs/info.json").status_code == 200
        script.default = 503
        r = client.get("/iiif/3/slide.svs/full/max/0/default.jpg")
        assert r.status_code == 500 and "image failed: RemoteUnavailableError" in r.text and "127.0.0.1" not in r.text
        assert client.get("/iiif/3/slide.svs/info.json").status_code == 200  # still served


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() on this platform")
def test_workers_serve_an_s3_prefix(s3):
    """The workers are forked from a parent that never started obstore (its runtime does not
    survive a fork): they answer, and a missing object still stops the start with exit 9."""
    proc = subprocess.Popen([sys.executable, "-c", "from wsitool.cli import main; main()", "serve",
                             "s3://serve/cases/", "--port", "0", "--workers", "2", "--threads", "2"],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **s3})
    try:
        port = None
        for _ in range(200):
            line = proc.stderr.readline()
            found = re.search(r"serving 2 slide\(s\) at http://127\.0\.0\.1:(\d+)/", line)
            if found:
                port = int(found.group(1))
                break
            if not line and proc.poll() is not None:
                break
        assert port, proc.stderr.read() if proc.poll() is not None else "no start-up line"
        codes = {httpx.get(f"http://127.0.0.1:{port}/iiif/3/{sid}/full/128,/0/default.jpg", timeout=30).status_code
                 for sid in (SLIDE.name, "sub~" + SLIDE2.name) for _ in range(4)}
        assert codes == {200}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stderr.close()
    missing = _wsitool("serve", "s3://serve/cases/missing.svs", "--port", "0", "--workers", "2", env=s3)
    assert missing.returncode == 9 and "s3://serve/cases/missing.svs: not found" in missing.stderr
