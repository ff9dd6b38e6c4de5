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
    from wsitool.storage.remote.transports.http import HttpTransport

    with pytest.raises(InvalidOptionError) as info:
        HttpTransport("http://127.0.0.1:1/x.svs", "http://127.0.0.1:1/x.svs", {"headers": raw})
    assert "headers" in str(info.value) and "SECRETVALUE" not in str(info.value)


def test_header_numbers_become_text():
    pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")
    pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")
    from wsitool.storage.remote.transports.http import HttpTransport

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
    from wsitool.storage.remote.transports.http import HttpTransport
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
    from wsitool.storage.remote.transports.objectstore import ObjectStoreTransport

    for url in ("s3://bucket", "s3:///x.svs"):
        with pytest.raises(InvalidOptionError, match="names a bucket and an object"):
            ObjectStoreTransport(url, redact(url), {"anon": True})


# ------------------------------------------------------------------ issue 47, item 7: values of any type


def test_cli_keeps_a_number_as_typed():
    """``--storage-option`` values are JSON where they parse; a number that JSON would write
    otherwise stays the text typed (a secret 1.50 is not 1.5)."""
    from wsitool.cli.console import storage_options

    got = storage_options(["secret=1234", "a=1.50", "b=1e3", "c=-0", "d=12.5", "e=true", "f=null", "g=007"])
    assert got == {"secret": 1234, "a": "1.50", "b": "1e3", "c": "-0", "d": 12.5, "e": True, "f": None, "g": "007"}


@pytest.mark.parametrize("value,text", [(1234, "1234"), (12.5, "12.5"), ("s3cr3t", "s3cr3t"),
                                        (10**30, "1" + "0" * 30)])
def test_object_store_text_options_take_numbers_and_booleans(value, text):
    """obstore refused a number (TypeError: 'int' object is not an instance of 'str', exit 1);
    a boolean it takes as it is (its own text, "true")."""
    from wsitool.storage.remote.transports.objectstore import store_config

    config, _ = store_config("s3", {"secret": value, "key": value, "region_name": value})
    assert config["aws_secret_access_key"] == text and config["aws_access_key_id"] == text
    config, client = store_config("gs", {"token": value, "client_options": {"user_agent": value}})
    assert config["google_service_account"] == text and client["user_agent"] == text


@pytest.mark.parametrize("value,kind", [(None, "null"), ([1, "SECRETVALUE"], "a list"),
                                        ({"x": "SECRETVALUE"}, "an object")])
def test_object_store_text_options_refuse_other_types(value, kind):
    from wsitool.storage.remote.transports.objectstore import store_config

    with pytest.raises(InvalidOptionError, match=f"storage option secret: expected text, got {kind}") as info:
        store_config("s3", {"secret": value})
    assert "SECRETVALUE" not in str(info.value)


@pytest.mark.parametrize("raw,flag", [(True, True), ("TRUE", True), ("yes", True), (1, True), ("1", True),
                                      (False, False), ("false", False), ("No", False), (0, False)])
def test_anon_is_a_yes_or_no(raw, flag):
    from wsitool.storage.remote.transports.objectstore import store_config

    config, _ = store_config("s3", {"anon": raw})
    assert config.get("skip_signature", False) is flag


@pytest.mark.parametrize("raw", ["maybe", 2, None, [True]])
def test_anon_that_is_neither_is_refused(raw):
    """``anon=maybe`` (or ``anon=yes`` before) was read as false, silently."""
    from wsitool.storage.remote.transports.objectstore import store_config

    with pytest.raises(InvalidOptionError, match="storage option anon: expected true or false"):
        store_config("s3", {"anon": raw})


def test_cli_numeric_secret_reads_on_exit_17_not_1():
    """``--storage-option secret=1234`` exited 1 with obstore's type error; now the secret is the
    text 1234 and the read goes on (here to a closed port: exit 17)."""
    pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends
    args = ["info", "s3://bucket/x.svs"]
    for item in ("key=1234", "secret=5678", f"endpoint_url=http://127.0.0.1:{port}", "retries=0",
                 "operation_timeout=10"):
        args += ["--storage-option", item]
    proc = subprocess.run([sys.executable, "-m", "wsitool.cli", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 17, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "5678" not in proc.stderr
    bad = subprocess.run([sys.executable, "-m", "wsitool.cli", "info", "s3://bucket/x.svs", "--storage-option",
                          "secret=[1]"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert bad.returncode == 2 and bad.stderr.splitlines() == [
        "wsitool: error: s3://bucket/x.svs: storage option secret: expected text, got a list"], bad.stderr


def test_dicomweb_text_options_and_cache_size():
    """DICOMweb's credentials as typed (``password=1234``, ``token=true`` was "Bearer True"); a
    ``frame_cache_mb`` of ``1e400`` raised OverflowError (exit 1), ``true`` was 1 MiB."""
    pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")
    import base64

    from wsitool.formats.dicom.web import DicomWebClient
    from wsitool.storage.urls import parse_series_url

    url = parse_series_url("dicomweb+http://127.0.0.1:1/dicom-web/studies/1.2/series/3.4")
    client = DicomWebClient(url, {"username": 42, "password": 1234})
    assert client._headers["Authorization"] == "Basic " + base64.b64encode(b"42:1234").decode()
    assert DicomWebClient(url, {"token": True})._headers["Authorization"] == "Bearer true"
    for raw in (float("inf"), float("nan"), -1, True, "x", 10**400):
        with pytest.raises(InvalidOptionError, match="frame_cache_mb"):
            DicomWebClient(url, {"frame_cache_mb": raw})
    with pytest.raises(InvalidOptionError, match="password: expected text, got a list"):
        DicomWebClient(url, {"username": "u", "password": ["SECRETVALUE"]})
