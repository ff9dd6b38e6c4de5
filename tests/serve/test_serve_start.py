"""``wsitool serve`` at start-up: a port in use, folders of symbolic links (issue 28, items 3 and 5)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("uvicorn")

import wsitool
from wsitool.serve.registry import SlideRegistry

from helpers import REPO

SLIDE = REPO / "samples" / "sample-aperio-jpeg.svs"
SLIDE2 = REPO / "samples" / "sample-aperio-j2k.svs"


def _wsitool(*args, timeout=60):
    return subprocess.run([sys.executable, "-c", "from wsitool.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_a_port_in_use_is_one_line_exit_9():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _wsitool("serve", str(SLIDE), "--port", str(port), "--cache-mb", "0")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 9, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("wsitool: error:"), proc.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "already in use" in lines[0] and "--port" in lines[0]


def test_an_unresolvable_host_is_one_line_exit_9():
    proc = _wsitool("serve", str(SLIDE), "--host", "no-such-host.invalid", "--port", "0")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 9 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("wsitool: error: no-such-host.invalid:0:"), proc.stderr


def test_the_start_up_line_brackets_an_ipv6_host():
    """``--host ::1`` announced ``http://::1:8000/`` (not a URL a browser or curl takes)."""
    from wsitool.serve.runner import base_url

    assert base_url(("::1", 8000, 0, 0)) == "http://[::1]:8000/"
    assert base_url(("127.0.0.1", 8000)) == "http://127.0.0.1:8000/"


def test_bind_gives_one_port_for_port_0():
    from wsitool.serve.runner import bind

    sockets = bind("127.0.0.1", 0)
    try:
        port = sockets[0].getsockname()[1]
        assert len(sockets) == 1 and port > 0
        sockets[0].listen()
        with pytest.raises(OSError) as info:  # (SO_REUSEADDR does not share a listening port)
            bind("127.0.0.1", port)
        assert info.value.filename == f"127.0.0.1:{port}" and "already in use" in info.value.strerror
    finally:
        for s in sockets:
            s.close()


@pytest.fixture
def linked(tmp_path):
    """A data set assembled from links: two slide links and a linked folder, all leading elsewhere."""
    elsewhere = tmp_path / "store"
    (elsewhere / "cases").mkdir(parents=True)
    os.symlink(SLIDE2, elsewhere / "cases" / "c.svs")
    root = tmp_path / "dataset"
    root.mkdir()
    os.symlink(SLIDE, root / "a.svs")
    os.symlink(SLIDE2, root / "b.svs")
    os.symlink(elsewhere / "cases", root / "cases")
    os.symlink(root, root / "loop")  # a cycle: walked once with --follow-links
    return root


def test_links_leaving_the_folder_are_counted_not_served(linked):
    registry = SlideRegistry([linked], wsitool.open_slide)
    try:
        assert len(registry) == 0
        assert sorted(os.path.basename(p) for p in registry.links_skipped) == ["a.svs", "b.svs", "cases"]
    finally:
        registry.close()


def test_follow_links_serves_them_under_the_links_ids(linked):
    registry = SlideRegistry([linked], wsitool.open_slide, follow_links=True)
    try:
        assert list(registry.entries) == ["a.svs", "b.svs", "cases~c.svs"]
        assert not registry.links_skipped and not registry.skipped
    finally:
        registry.close()


def test_serve_says_how_many_links_it_skipped(linked):
    proc = _wsitool("serve", str(linked), "--port", "0")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 3 and len(lines) == 1, proc.stderr
    assert "no slide to serve" in lines[0] and "skipped 3 symbolic links" in lines[0]
    assert "--follow-links" in lines[0]


def test_serve_warns_of_skipped_links_beside_served_slides(tmp_path, linked):
    import shutil
    import signal
    import time

    shutil.copy(SLIDE, linked / "real.svs")
    proc = subprocess.Popen([sys.executable, "-c", "from wsitool.cli import main; main()", "serve",
                             str(linked), "--port", "0", "--cache-mb", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        end = time.monotonic() + 60
        while time.monotonic() < end:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "serving" in line:
                break
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines)
    assert "serving 1 slide(s)" in text, text
    assert "WARNING: skipped 3 symbolic links" in text and "--follow-links" in text, text


def _serving_line(proc: subprocess.Popen) -> str:
    """The server's stderr line saying where it serves ("" if it ended or took over 60 s)."""
    import time

    line = ""
    end = time.monotonic() + 60
    while time.monotonic() < end and "serving" not in line:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
    return line


def test_workers_share_the_port_and_the_budget_and_stop_on_sigterm():
    """--workers 2: one start-up line, the workers answer on one port, each with half the
    cache budget; SIGTERM to the parent stops them all (exit 143, no worker left)."""
    import re
    import signal

    import httpx
    import psutil

    proc = subprocess.Popen([sys.executable, "-c", "from wsitool.cli import main; main()", "serve", str(SLIDE),
                             "--port", "0", "--workers", "2", "--threads", "2", "--cache-mb", "64"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = _serving_line(proc)
        m = re.search(r"serving 1 slide\(s\) at http://127\.0\.0\.1:(\d+)/ \(2 workers x 1 threads, "
                      r"cache 32 MiB each\)", line)
        assert m, line
        url = f"http://127.0.0.1:{m.group(1)}"
        workers = psutil.Process(proc.pid).children()
        assert len(workers) == 2
        with httpx.Client(base_url=url, timeout=30) as client:
            for _ in range(4):
                r = client.get("/iiif/3/sample-aperio-jpeg.svs/full/128,/0/default.jpg")
                assert r.status_code == 200 and r.content[:2] == b"\xff\xd8"
            status = client.get("/status").json()
        assert status["pid"] in {w.pid for w in workers}           # a worker answered
        assert status["cache"]["max_bytes"] == 32 << 20 and status["threads"] == 1
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in workers)


def test_workers_each_accept_on_a_socket_of_their_own():
    """--workers 2: a burst of 16 connections opened at once is spread over both workers (each
    listens on its own SO_REUSEPORT socket); on one shared socket the worker that woke first
    took whole bursts (bench_serve: one of two processes busy)."""
    import http.client
    import json
    import re
    import signal

    if not hasattr(socket, "SO_REUSEPORT"):
        pytest.skip("this system has no SO_REUSEPORT")
    proc = subprocess.Popen([sys.executable, "-c", "from wsitool.cli import main; main()", "serve", str(SLIDE),
                             "--port", "0", "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = _serving_line(proc)
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert m, line
        conns = [http.client.HTTPConnection("127.0.0.1", int(m.group(1)), timeout=30) for _ in range(16)]
        for c in conns:
            c.connect()
        pids = []
        for c in conns:
            c.request("GET", "/status")
            pids.append(json.loads(c.getresponse().read())["pid"])
            c.close()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(set(pids)) == 2, pids


def _dicom_build():
    import importlib.util

    pytest.importorskip("pydicom")
    pytest.importorskip("imagecodecs")
    spec = importlib.util.spec_from_file_location(
        "wsitool_test_dicom_build", REPO / "tests" / "formats" / "dicom_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def linked_series(tmp_path):
    """A served folder holding a DICOM series whose level 0 is a link to an instance of a
    series elsewhere (of the same series UID: what the outside file says is taken in)."""
    import shutil

    build = _dicom_build()
    outside = tmp_path / "elsewhere"
    files = build.write_series(outside, build.make_image(300, 200), 64, levels=2, series="1.2.3.4",
                               study="1.2.3")
    root = tmp_path / "served"
    (root / "series").mkdir(parents=True)
    for f in files[1:]:
        shutil.copy(f, root / "series" / f.name)
    os.symlink(files[0], root / "series" / files[0].name)  # level 0 comes from elsewhere
    shutil.copy(SLIDE, root / "a.svs")
    return root


def test_a_dicom_instance_linked_in_from_outside_is_not_served(linked_series):
    """Issue 47 item 4: the series was assembled with the outside file as its level 0 and served
    (1 entry more, no link counted); now the series is left out, the link counted and why said."""
    registry = SlideRegistry([linked_series], wsitool.open_slide)
    try:
        assert list(registry.entries) == ["a.svs"]
        assert registry.links_skipped == [str(linked_series / "series" / "level-0.dcm")]
        (path, why), = registry.skipped
        assert path == str(linked_series / "series") and "--follow-links" in why
    finally:
        registry.close()
    registry = SlideRegistry([linked_series], wsitool.open_slide, follow_links=True)
    try:
        assert list(registry.entries) == ["a.svs", "series"]
        assert registry.get("series").slide.dimensions == (300, 200)
    finally:
        registry.close()


def test_a_link_added_to_a_listed_series_is_refused_when_it_opens(linked_series, serve_slides):
    """Slides open on first use: a series listed clean that takes in an outside instance by
    the time it opens is refused then (404, one log line), not served."""
    import shutil

    import httpx

    target = os.readlink(linked_series / "series" / "level-0.dcm")
    os.unlink(linked_series / "series" / "level-0.dcm")
    shutil.copy(target, linked_series / "series" / "level-0.dcm")
    with serve_slides([linked_series], threads=1, cache_mb=0) as (url, state):
        assert [e.id for e in state.registry] == ["a.svs", "series"]
        os.unlink(linked_series / "series" / "level-0.dcm")
        os.symlink(target, linked_series / "series" / "level-0.dcm")
        r = httpx.get(f"{url}/iiif/3/series/info.json", timeout=30)
        assert r.status_code == 404 and "elsewhere" not in r.text
        assert [e.id for e in state.registry] == ["a.svs"]
        assert "symbolic link leading outside" in state.registry.get("series").failed
