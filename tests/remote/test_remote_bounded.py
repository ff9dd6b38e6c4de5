"""A server that declares or sends more than it was asked for: refused at once, in one line
(exit 17), never read on, in every client (obstore's HTTP and S3 stores, urllib3), and in
bounded memory (a child process's peak RSS)."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

import wsitool
from wsitool.cli.console import exit_code_for
from wsitool.errors import RemoteUnavailableError
from wsitool.storage.remote.body import check_length, read_body

from helpers import NO_SHARED, SHARED_SAMPLES, child_peak_rss
from remote_helpers import client_connections

pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")
pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")

SAMPLE = "aperio-cmu1-small-region-jpeg.svs"
FAST = {"timeout": 2, "operation_timeout": 15, "retries": 2, "backoff": 0.01}
HOSTILE = ["overlong", "overlong-chunked", "longer", "endless"]


@pytest.fixture
def data():
    if not SHARED_SAMPLES.is_dir():
        pytest.skip(NO_SHARED)
    return (SHARED_SAMPLES / SAMPLE).read_bytes()


def _port(url):
    return int(url.split(":")[2].split("/")[0])


def _closed(url) -> bool:
    """No connection to the server is left open (within a bounded wait: obstore drops its
    connections on its own threads)."""
    end = time.monotonic() + 10
    while client_connections(_port(url)):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def _asked(fault: str, client: str) -> int:
    """How often one range is asked for when its answer is refused (no retry): once; but obstore
    cannot read a chunked answer without a length and hands the slide to urllib3, which asks
    again (and a 200 answer, first asked for whole by obstore, is asked a third time)."""
    if client == "obstore" and fault == "endless":
        return 3
    return 2 if client == "obstore" and fault == "overlong-chunked" else 1


# ------------------------------------------------------------------ the reader itself


def test_read_body_refuses_a_body_past_its_limit_at_once():
    assert read_body(iter([b"ab", b"cd"]), 4, "u", "bytes 0-3", exact=True) == b"abcd"
    assert read_body(iter([b"ab", b"c", b""]), 4, "u", "bytes 0-3", exact=True) == b"abc"  # (short: the caller's)
    pieces = iter([b"ab", b"cd", b"e", b"never"])
    with pytest.raises(RemoteUnavailableError, match="sent more than the 4 bytes asked for"):
        read_body(pieces, 4, "u", "bytes 0-3", exact=True)
    assert next(pieces) == b"never"  # refused at the first piece past the range
    taken = []

    def endless():
        while True:
            taken.append(1)
            yield bytes(1024)

    with pytest.raises(RemoteUnavailableError) as info:
        read_body(endless(), 10 * 1024, "http://h/x.svs", "metadata")
    assert len(taken) == 11  # one piece past the limit, no more
    assert exit_code_for(info.value) == 17 and "http://h/x.svs" in str(info.value)


def test_a_single_piece_is_returned_uncopied():
    buf = bytearray(b"abcd")
    got = read_body(iter([buf]), 4, "u", "w", exact=True)
    assert isinstance(got, memoryview) and got.obj is buf


@pytest.mark.parametrize("declared, ok", [(None, True), ("4", True), ("3", False), ("5", False),
                                          ("10737418240", False), ("1e3", False), ("-1", False), ("٣", False)])
def test_check_length_refuses_what_does_not_fit_the_range(declared, ok):
    if ok:
        check_length(declared, 4, "u", "bytes 0-3", exact=True)
        return
    with pytest.raises(Exception) as info:
        check_length(declared, 4, "u", "bytes 0-3", exact=True)
    # a shorter length is a body cut short (worth a retry); anything else is refused at once
    assert type(info.value).__name__ == ("Transient" if declared == "3" else "RemoteUnavailableError")


# ------------------------------------------------------------------ every client, both length forms


@pytest.fixture(params=["obstore", "urllib3"])
def http_client(request, monkeypatch):
    from wsitool.storage.remote.transports.http import HttpTransport

    monkeypatch.setattr(HttpTransport, "force_client", request.param)
    return request.param


@pytest.mark.parametrize("fault", HOSTILE)
def test_a_hostile_answer_at_open_is_one_error_17_not_retried(fault, http_client, scripted, data):
    url, script = scripted(data)
    script.default = fault
    with pytest.raises(RemoteUnavailableError) as info:
        wsitool.open_slide(url + "?sig=SECRET", storage_options=FAST)
    text = str(info.value)
    assert exit_code_for(info.value) == 17 and len(text.splitlines()) == 1
    assert "SECRET" not in text and "slide.svs" in text
    assert ("range requests" in text) if fault == "endless" else ("more than" in text or "declared" in text)
    assert sum(1 for a, _ in script.log if a == fault) == _asked(fault, http_client)  # not retried
    assert _closed(url)  # the rest of the body was never read: its connection closed
    if fault in ("overlong", "overlong-chunked", "endless"):  # the server's count of what it wrote
        end = time.monotonic() + 30  # (it learns of the closed connection at its next write)
        while len(script.sent) < _asked(fault, http_client) and time.monotonic() < end:
            time.sleep(0.05)
        assert script.sent and max(script.sent) < 64 << 20, script.sent  # not drained (was: 4 GiB, its cap)


@pytest.mark.parametrize("fault", ["overlong", "overlong-chunked", "longer"])
def test_a_hostile_answer_to_a_tile_read_is_one_error_17(fault, http_client, scripted, data):
    url, script = scripted(data)
    with wsitool.open_slide(url, storage_options=FAST) as slide:
        script.default = fault
        with pytest.raises(RemoteUnavailableError) as info:
            slide.read_region((0, 0), 0, (1000, 1000), mode="rgb")
        assert exit_code_for(info.value) == 17
        assert "more than" in str(info.value) or "declared" in str(info.value)
        asked = [rng for a, rng in script.log if a == fault]
        assert asked and max(asked.count(rng) for rng in asked) == _asked(fault, http_client)  # not retried


def test_an_s3_store_answering_more_than_asked_is_refused(scripted, data):
    """The object stores read through the same bounded reader (obstore's S3 store here; GCS
    and Azure share its ``ranged_get``)."""
    url, script = scripted(data, modified="Wed, 21 Oct 2015 07:28:00 GMT")
    endpoint = url.rsplit("/", 1)[0]
    options = {**FAST, "endpoint_url": endpoint, "anon": True, "region_name": "us-east-1"}
    with wsitool.open_slide("s3://bucket/slide.svs", storage_options=options) as slide:
        assert slide.dimensions == (2220, 2967)  # (the scripted server answers the store's GETs)
        script.default = "overlong"
        with pytest.raises(RemoteUnavailableError, match="more than") as info:
            slide.read_region((0, 0), 0, (1000, 1000), mode="rgb")
        assert exit_code_for(info.value) == 17


# ------------------------------------------------------------------ memory and time, in a child


_CHILD = textwrap.dedent("""
    import sys
    from wsitool.storage.remote.transports.http import HttpTransport
    HttpTransport.force_client = sys.argv[1]
    from wsitool.cli import main
    main(["info", sys.argv[2], "--storage-option", "retries=1", "--storage-option", "operation_timeout=20"])
""")


def _peak_rss(client: str, url: str, folder: Path) -> tuple[int, int, str]:
    """``(exit code, peak RSS in bytes, stderr)`` of ``wsitool info url`` in a child process:
    its own peak (:func:`helpers.child_peak_rss`)."""
    code, peak, err = child_peak_rss(_CHILD, [client, url], folder)
    assert code != -9, f"wsitool info {url} did not end in 120 s against a hostile server"
    return code, peak, err


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak from /proc (Linux)")
@pytest.mark.parametrize("fault", ["overlong", "endless"])
def test_a_hostile_server_costs_the_reader_no_more_memory_than_an_honest_one(fault, http_client, scripted,
                                                                             data, tmp_path):
    """``wsitool info URL``: against a server declaring 10 GiB and sending without end (or a
    200 answer without end), one line and exit 17, the child's peak RSS within 64 MiB of the
    same command's against an honest server (it was 1.5 GB after 3 s)."""
    url, script = scripted(data)
    code, honest, err = _peak_rss(http_client, url, tmp_path)
    assert code == 0, err
    script.default = fault
    code, hostile, err = _peak_rss(http_client, url, tmp_path)
    assert code == 17, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("wsitool: error: http://127.0.0.1:"), err
    assert hostile < honest + (64 << 20), (hostile >> 20, honest >> 20)
