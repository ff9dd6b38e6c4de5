"""Bad values of the remote storage options and malformed slide URLs: one InvalidOptionError
(exit 2), never a traceback, a hang, or a secret in the message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from wsitool.errors import InvalidOptionError
from wsitool.storage.remote import MAX_CONCURRENCY, RemoteOptions

REPO = Path(__file__).resolve().parents[2]


def test_concurrency_has_an_upper_bound():
    """concurrency=100000000 made a pool of that many connections (minutes, GBs) before any request."""
    assert RemoteOptions.take({"concurrency": MAX_CONCURRENCY}).concurrency == MAX_CONCURRENCY
    with pytest.raises(InvalidOptionError, match="at most 256"):
        RemoteOptions.take({"concurrency": 10**8})


@pytest.mark.parametrize("key,raw", [("retries", 1.5), ("concurrency", "2.5"), ("retries", True),
                                     ("timeout", float("nan")), ("operation_timeout", "inf")])
def test_counts_are_whole_and_times_finite(key, raw):
    """``retries=1.5`` was silently 1 retry; a NaN or infinite timeout would let a read hang."""
    with pytest.raises(InvalidOptionError, match=key):
        RemoteOptions.take({key: raw})
    assert getattr(RemoteOptions.take({key: "3"}), key) == 3


@pytest.mark.parametrize("raw", ["SECRETVALUE", ["SECRETVALUE", "x"], 5, {"X": ["SECRETVALUE"]}, {"X": None}])
def test_headers_that_are_not_name_text_pairs(raw):
    pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")
    pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")
    from wsitool.storage.http import HttpTransport

    with pytest.raises(InvalidOptionError) as info:
        HttpTransport("http://127.0.0.1:1/x.svs", "http://127.0.0.1:1/x.svs", {"headers": raw})
    assert "headers" in str(info.value) and "SECRETVALUE" not in str(info.value)


def test_header_numbers_become_text():
    pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")
    pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")
    from wsitool.storage.http import HttpTransport

    t = HttpTransport("http://127.0.0.1:1/x.svs", "http://127.0.0.1:1/x.svs", {"headers": {"X-Test": 1}})
    assert t.headers == {"X-Test": "1"}


def test_cli_bad_headers_is_one_line_exit_2():
    pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")
    proc = subprocess.run([sys.executable, "-m", "wsitool.cli", "info", "http://127.0.0.1:1/x.svs",
                           "--storage-option", "headers=SECRETVALUE"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "SECRETVALUE" not in proc.stderr
    assert proc.stderr.strip().startswith("wsitool: error: http://127.0.0.1:1/x.svs: storage option headers")


@pytest.mark.parametrize("url", ["http://u:PW@127.0.0.1:99999/x.svs?sig=SECRETVALUE",
                                 "http://u:PW@exa mple/x.svs?sig=SECRETVALUE", "http:///x.svs?sig=SECRETVALUE"])
def test_a_bad_port_or_host_is_a_usage_error_without_the_query(url):
    """Was RemoteUnavailableError (exit 17, 'gave up after N attempts') quoting urllib3's
    'LocationParseError: 99999/x.svs?sig=SECRETVALUE'."""
    pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")
    pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")
    from wsitool.storage.http import HttpTransport
    from wsitool.storage.urls import redact

    with pytest.raises(InvalidOptionError) as info:
        HttpTransport(url, redact(url), {})
    assert "not a valid URL" in str(info.value)
    assert "SECRETVALUE" not in str(info.value) and "PW" not in str(info.value)


def test_an_unsplittable_url_is_redacted_and_refused():
    """An unclosed '[' made urllib.parse raise ValueError: a traceback from redact() itself."""
    import wsitool
    from wsitool.storage.urls import redact

    url = "http://u:SECRETVALUE@[::1/x.svs?sig=SECRETVALUE#frag"
    assert redact(url) == "http://***@[::1/x.svs?<redacted>"
    with pytest.raises(InvalidOptionError) as info:
        wsitool.Slide(url)
    assert "not a valid URL" in str(info.value) and "SECRETVALUE" not in str(info.value)


def test_an_object_store_url_without_an_object_is_a_usage_error_shown_as_given():
    """'s3://bucket' was exit 1 (a plain WsiError); 's3:///x.svs' was shown as 's3:/x.svs' and
    's3://' as 's3:' (urlunsplit drops an empty host's '//')."""
    from wsitool.storage.urls import redact

    assert redact("s3:///x.svs") == "s3:///x.svs" and redact("s3://") == "s3://"
    assert redact("s3://u:PW@b/k.svs?sig=S#f") == "s3://***@b/k.svs?<redacted>"
    pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")
    from wsitool.storage.objectstore import ObjectStoreTransport

    for url in ("s3://bucket", "s3:///x.svs"):
        with pytest.raises(InvalidOptionError, match="names a bucket and an object"):
            ObjectStoreTransport(url, redact(url), {"anon": True})
