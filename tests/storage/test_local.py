"""The local byte source: positional reads, read-ahead advice, close waiting for reads in flight."""

from __future__ import annotations

import threading
import time

import pytest

from wsitool.errors import WsiError
from wsitool.storage import ByteSource, LocalFile


def test_reads_and_size(tmp_path):
    path = tmp_path / "f.bin"
    data = bytes(range(256)) * 40
    path.write_bytes(data)
    with LocalFile(path) as src:
        assert isinstance(src, ByteSource)
        assert src.size == len(data) and src.path == str(path)
        assert src.read(10, 5) == data[10:15]
        assert src.read(len(data) - 2, 10) == data[-2:]  # short at the end
        buf = bytearray(7)
        assert src.readinto(100, memoryview(buf)) == 7 and bytes(buf) == data[100:107]
        assert src.fileno() is not None
        src.advise([(0, 100), (5000, 10)])  # advisory: never raises
    assert src.closed and src.fileno() is None
    src.advise([(0, 10)])
    with pytest.raises(WsiError, match="slide is closed"), src.reading():
        pass


def test_close_waits_for_reads_in_flight(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 100)
    src = LocalFile(path)
    entered, release, closed_at = threading.Event(), threading.Event(), []

    def reader():
        with src.reading():
            entered.set()
            release.wait(5)
            assert src.read(0, 4) == b"xxxx"  # the descriptor is still ours

    t = threading.Thread(target=reader)
    t.start()
    entered.wait(5)
    closer = threading.Thread(target=lambda: (src.close(), closed_at.append(time.monotonic())))
    closer.start()
    time.sleep(0.2)
    assert not closed_at  # waiting for the reader
    released = time.monotonic()
    release.set()
    t.join(5)
    closer.join(5)
    assert closed_at and closed_at[0] >= released and src.closed
    src.close()  # idempotent


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        LocalFile(tmp_path / "nope")


def test_only_regular_files_are_opened(tmp_path):
    """A FIFO's open waited for a writer forever (`info`, `read-region`, `export-pyramid`, `serve`
    hung); /dev/zero was read as a header of zeros. Both are refused before any read (exit 3)."""
    import os

    from wsitool.errors import UnsupportedFormatError
    from wsitool.storage.local import open_regular

    fifo = tmp_path / "pipe.svs"
    os.mkfifo(fifo)
    with pytest.raises(UnsupportedFormatError, match=r"pipe\.svs: not a slide wsitool reads \(a FIFO"):
        LocalFile(fifo)
    if os.path.exists("/dev/zero"):
        with pytest.raises(UnsupportedFormatError, match="a character device"):
            LocalFile("/dev/zero")
    regular = tmp_path / "f.bin"
    regular.write_bytes(b"abc")
    fd = open_regular(regular)
    try:
        assert os.get_blocking(fd) and os.read(fd, 3) == b"abc"
    finally:
        os.close(fd)
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "none")


def test_messages_redact_every_scheme():
    """Only the URLs wsitool reads were redacted: `info ftp://user:PW@host/x.svs` showed PW."""
    from wsitool.storage.urls import redact_text

    cases = {
        "ftp://user:PW@host/x.svs: No such file": "ftp://***@host/x.svs: No such file",
        "ftp:/user:PW@host/x.svs: No such file": "ftp:/***@host/x.svs: No such file",  # a Path of it
        "'sftp://u:p@ss@h/x?token=T': bad.": "'sftp://***@h/x?<redacted>': bad.",
        "(s3://b/k.svs?X-Amz-Signature=T)": "(s3://b/k.svs?<redacted>)",
        "/data/run:/x@y?z: a path": "/data/run:/x@y?z: a path",
        "C:/Users/a@b/x and http://h/x? plain": "C:/Users/a@b/x and http://h/x? plain",
    }
    for text, want in cases.items():
        assert redact_text(text) == want
        assert redact_text(want) == want


def test_a_local_file_applies_its_own_advice_rule(tmp_path, monkeypatch):
    """The storage policy of a local file: ``fadvise`` for each range advised, unless the advice
    is fewer than ADVISE_MIN_RANGES ranges under ADVISE_MIN_BYTES (a few tiles: not worth the
    calls) or read-ahead of a later batch.  A segment reads as its index entry says; a parser's
    file is clamped to the file."""
    from wsitool.storage import local

    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 2048)
    calls = []
    monkeypatch.setattr(local.os, "posix_fadvise", lambda fd, off, n, advice: calls.append((off, n)),
                        raising=False)
    monkeypatch.setattr(local.os, "POSIX_FADV_WILLNEED", 3, raising=False)
    with LocalFile(path) as src:
        src.advise([(0, 1000)])
        assert calls == []
        src.advise([(0, local.ADVISE_MIN_BYTES)])
        assert calls == [(0, local.ADVISE_MIN_BYTES)]
        calls.clear()
        src.advise([(0, 100), (5000, 10)])
        assert calls == []
        src.advise([(0, 100), (5000, 10), (9000, 10)])
        assert calls == [(0, 100), (5000, 10), (9000, 10)]
        calls.clear()
        src.advise([(0, 100), (5000, 10), (9000, 10)], ahead=True)
        assert calls == []
        assert src.read_segment(256, 4) == (bytes([0, 1, 2, 3]), 4)
        buf = bytearray(8)
        assert src.read_segment_into(1, 3, lambda n: memoryview(buf)[:n]) == (3, 3) and buf[:3] == b"\x01\x02\x03"
        with src.open_file() as fh:
            fh.seek(src.size - 2)
            assert fh.read(1 << 40) == bytes([254, 255])  # clamped to the file (BoundedFile)
