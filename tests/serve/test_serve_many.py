"""Folders of many slides (issue 47 item 9): listed at start, opened on first use, at most a
budget of descriptors open (least recently used closed first, never one a request holds)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import threading

import pytest

from wsitool.errors import ResourceLimitError
from wsitool.serve.pool import OpenSlides, default_open_files
from wsitool.serve.registry import SlideEntry

from helpers import REPO

SLIDE = REPO / "samples" / "sample-aperio-jpeg.svs"


class _Slide:
    """A stand-in for an open slide: knows whether it was closed."""

    def __init__(self, name: str):
        self.name = name
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _entries(n: int, files: int = 2) -> list[SlideEntry]:
    return [SlideEntry(f"s{i}", f"/x/s{i}", f"/x/s{i}", files=files) for i in range(n)]


def test_the_least_recently_used_unpinned_slides_close_first():
    opened: list[_Slide] = []

    def opener(entry):
        opened.append(_Slide(entry.id))
        return opened[-1]

    pool = OpenSlides(opener, budget=6)
    a, b, c, d = _entries(4)
    for e in (a, b, c):
        pool.acquire(e)
        pool.release(e)
    pool.acquire(a)  # a is used again (and held): b is now the least recently used
    pool.release(a)
    pool.acquire(d)
    assert [s.name for s in opened if s.closed] == ["s1"]
    assert pool.stats()["files"] == 6 and pool.stats()["evicted"] == 1
    pool.acquire(b)  # reopened: c goes now (a and d are held or newer)
    assert [s.name for s in opened if s.closed] == ["s1", "s2"] and len(opened) == 5
    pool.close()
    assert all(s.closed for s in opened)


def test_a_slide_in_use_is_never_closed_and_a_full_budget_is_refused():
    pool = OpenSlides(lambda e: _Slide(e.id), budget=4)
    a, b, c = _entries(3)
    held_a, held_b = pool.acquire(a), pool.acquire(b)  # both pinned: the budget is full
    with pytest.raises(ResourceLimitError):
        pool.acquire(c)
    assert not held_a.closed and not held_b.closed and pool.stats()["files"] == 4
    pool.release(b)
    assert pool.acquire(c) is not None and held_b.closed and not held_a.closed
    big = SlideEntry("series", "/x/series", "/x/series", files=50)  # larger than the budget
    with pytest.raises(ResourceLimitError):
        pool.acquire(big)
    pool.release(a)
    pool.release(c)
    assert pool.acquire(big) is not None  # alone, it opens
    assert pool.stats()["open"] == 1


def test_threads_asking_at_once_open_a_slide_once():
    gate = threading.Event()
    calls = []

    def opener(entry):
        calls.append(entry.id)
        gate.wait(10)
        return _Slide(entry.id)

    pool = OpenSlides(opener, budget=8)
    entry, = _entries(1)
    got = []
    threads = [threading.Thread(target=lambda: got.append(pool.acquire(entry))) for _ in range(4)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(10)
    assert calls == ["s0"] and len(got) == 4 and len({id(s) for s in got}) == 1


def test_the_default_budget_follows_the_descriptor_limit():
    assert default_open_files(1024) == 384 and default_open_files(256) == 96
    assert default_open_files(64) == 24 and default_open_files(10) == 16 and default_open_files(10**6) == 1024


def test_a_slide_that_fails_on_first_use_is_404_and_one_log_line(tmp_path, serve_slides):
    import httpx

    shutil.copy(SLIDE, tmp_path / "good.svs")
    (tmp_path / "broken.svs").write_bytes(b"II*\x00" + b"\xff" * 60)  # a TIFF header, no structure
    (tmp_path / "junk.svs").write_bytes(b"not a slide at all")  # told apart at listing
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("wsitool.serve")
    logger.addHandler(handler)
    try:
        with serve_slides([tmp_path], threads=1, cache_mb=0) as (url, state):
            assert [e.id for e in state.registry] == ["broken.svs", "good.svs"]
            assert [p for p, _ in state.registry.skipped] == [str(tmp_path / "junk.svs")]
            with httpx.Client(base_url=url, timeout=30) as client:
                for path in ("/iiif/3/broken.svs/info.json", "/dz/broken.svs.dzi", "/view/broken.svs",
                             "/iiif/3/broken.svs/full/64,/0/default.jpg"):
                    r = client.get(path)
                    assert r.status_code == 404 and str(tmp_path) not in r.text, path
                assert client.get("/iiif/3/good.svs/info.json").status_code == 200
                assert "broken.svs" not in client.get("/").text
                assert client.get("/status").json()["slides"] == 1
    finally:
        logger.removeHandler(handler)
    said = [line for line in lines if "broken.svs" in line]
    assert len(said) == 1 and said[0].startswith("not served: ") and str(tmp_path) in said[0], lines


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd") or not hasattr(os, "fork"),
                    reason="needs /proc and fork (Linux)")
def test_many_slides_under_a_low_descriptor_limit(tmp_path):
    """400 slides (hard links) under ``ulimit -n 256``: every slide was opened at start, two
    descriptors each, so most were "not served" (or the start failed).  Now all are listed,
    60 of them served, and the server holds at most its budget (96 descriptors) of slides."""
    import resource

    import httpx

    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(400):
        os.link(SLIDE, folder / f"s{i:03d}.svs")
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 256:
        pytest.skip(f"the hard descriptor limit is {hard}")

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    proc = subprocess.Popen([sys.executable, "-c", "from wsitool.cli import main; main()", "serve", str(folder),
                             "--port", "0", "--cache-mb", "0", "--threads", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=lower)
    try:
        said = []
        for _ in range(2000):
            line = proc.stderr.readline()
            said.append(line)
            if "serving" in line or (not line and proc.poll() is not None):
                break
        found = re.search(r"serving (\d+) slide\(s\) at http://127\.0\.0\.1:(\d+)/", said[-1])
        refused = [line for line in said if "not served" in line]
        assert not refused, f"{len(refused)} not served, the first: {refused[0]}"
        assert found and int(found.group(1)) == 400, "".join(said[-3:])
        with httpx.Client(base_url=f"http://127.0.0.1:{found.group(2)}", timeout=60) as client:
            for i in range(0, 400, 400 // 60)[:60]:
                r = client.get(f"/iiif/3/s{i:03d}.svs/full/64,/0/default.jpg")
                assert r.status_code == 200 and r.content[:2] == b"\xff\xd8", (i, r.text)
            held = client.get("/status").json()["open_slides"]
            fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        assert held["budget"] == 96 and held["files"] <= 96 and held["evicted"] >= 60 - 48, held
        assert fds < 96 + 40, fds  # the slides' budget, plus the interpreter's, the socket, the pipes
        proc.terminate()
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc (Linux)")
def test_tasks_hold_a_bounded_number_of_slides(tmp_path):
    """The other walkers of many slides were checked: Dask tasks and batch reads open slides
    through ``cached_slide`` (16 local files per process; the ones dropped close when no task
    holds them), ``export-many`` opens and closes one slide per export."""
    import gc

    from wsitool.distributed import cached_slide
    from wsitool.opening import held as lazy

    def held() -> int:
        return sum(1 for fd in os.listdir("/proc/self/fd")
                   if os.path.realpath(f"/proc/self/fd/{fd}").startswith(str(tmp_path)))

    for i in range(40):
        os.link(SLIDE, tmp_path / f"s{i:02d}.svs")
    try:
        for i in range(40):
            assert cached_slide(tmp_path / f"s{i:02d}.svs").read_region((0, 0), 0, (16, 16)).shape == (16, 16, 4)
        gc.collect()
        assert held() <= 2 * 16
    finally:
        lazy._open_local.cache_clear()  # (the process's cache: its slides close once collected)
        gc.collect()
