"""A forked child reads a remote slide through connections of its own; gs:// and az:// URLs and
their credential options (their emulators are not run here: the URL parsing and the translation
of fsspec / tiffslide option names to obstore's are what wsitool adds)."""

from __future__ import annotations

import os
import signal
import sys

import numpy as np
import pytest

import wsitool
from wsitool.errors import WsiError
from wsitool.storage import redact

from helpers import NO_SHARED, SHARED_SAMPLES
from remote_helpers import client_connections

# scripted: a fixture of remote_helpers (registered by tests/conftest.py)

NAME = "aperio-cmu1-small-region-jpeg.svs"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() on this platform")
def test_a_forked_child_reads_through_new_connections(scripted):
    pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")
    path = SHARED_SAMPLES / NAME
    if not path.is_file():
        pytest.skip(NO_SHARED)
    url, script = scripted(path.read_bytes())
    port = int(url.split(":")[2].split("/")[0])
    with wsitool.open_slide(path) as local:
        want_parent = local.read_region((0, 0), 0, (512, 512))
        want_child = local.read_region((1000, 600), 0, (700, 500))
    with wsitool.open_slide(url) as s:
        assert np.array_equal(s.read_region((0, 0), 0, (512, 512)), want_parent)
        parent_client = s._source.transport._client
        assert type(parent_client).__name__ == "_ObstoreClient"
        assert client_connections(port) > 0  # the parent holds pooled connections
        before = len(script.log)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: report through the exit status only
            code = 1
            try:
                signal.alarm(60)  # (obstore's client would hang here: fail, never wait forever)
                got = s.read_region((1000, 600), 0, (700, 500))
                client = s._source.transport._client
                # obstore's runtime, started by the parent, does not survive fork: urllib3 reads here
                fresh = client is not parent_client and type(client).__name__ == "_Urllib3Client"
                code = 0 if (np.array_equal(got, want_child) and fresh) else 3
            except BaseException:
                code = 4
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status), f"child killed by signal {os.WTERMSIG(status)} (hung?)"
        assert os.WEXITSTATUS(status) == 0, "child: 3 wrong pixels or the parent's client, 4 an error"
        assert len(script.log) > before  # the child fetched its region over the network
        # the parent still reads through its own client
        assert s._source.transport._client is parent_client
        assert np.array_equal(s.read_region((1000, 600), 0, (700, 500)), want_child)



@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() on this platform")
def test_a_forked_child_keeps_a_last_modified_pin(scripted):
    """A server with Last-Modified and no ETag: the parent pinned the date through obstore, the
    child compares it through urllib3; one form of the date (was: every read in the child said
    the object changed, as the two clients wrote the same date differently)."""
    pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")
    path = SHARED_SAMPLES / NAME
    if not path.is_file():
        pytest.skip(NO_SHARED)
    url, _ = scripted(path.read_bytes(), etag=None, modified="Wed, 02 Dec 2026 10:00:00 GMT")
    with wsitool.open_slide(path) as local:
        want = local.read_region((1000, 600), 0, (300, 300))
    with wsitool.open_slide(url) as s:
        s.read_region((0, 0), 0, (256, 256))
        assert s._source.pin.modified == "Wed, 02 Dec 2026 10:00:00 GMT" and s._source.pin.etag is None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.alarm(60)
                got = s.read_region((1000, 600), 0, (300, 300))
                code = 0 if np.array_equal(got, want) else 3
            except BaseException:
                code = 4
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "child: 3 wrong pixels, 4 an error"


def test_a_child_forked_before_any_obstore_request_uses_obstore(scripted):
    """Only a runtime that made requests is broken by fork: a child of a process that never
    read through obstore reads through it (in a fresh interpreter: this one has)."""
    pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")
    import subprocess

    from helpers import REPO

    url, script = scripted(b"x" * 200_000)
    code = f"""
import os, sys
from wsitool.storage.opener import open_source
pid = os.fork()
if pid == 0:
    src = open_source({url!r})
    ok = src.read(1000, 10) == b"x" * 10 and type(src.transport._client).__name__ == "_ObstoreClient"
    src.close()
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert script.seen  # the child's requests reached the server


# ---------------------------------------------------------------------- gs:// and az://

obstore = pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")
from wsitool.storage.remote.transports.objectstore import ObjectStoreTransport, store_config  # noqa: E402


@pytest.mark.parametrize("url,protocol,root,key", [
    ("gs://bucket/dir/slide.svs", "gs", "gs://bucket", "dir/slide.svs"),
    ("gcs://bucket/a%20b.svs", "gs", "gs://bucket", "a b.svs"),
    ("az://container/x/y.svs", "az", "az://container", "x/y.svs"),
    ("azure://container/y.svs", "az", "az://container", "y.svs"),
    ("abfs://container/y.svs", "az", "abfs://container", "y.svs"),
])
def test_cloud_urls_name_bucket_and_key(url, protocol, root, key):
    options = {"account_name": "acct", "account_key": "a2V5"} if protocol == "az" else {"anon": True}
    t = ObjectStoreTransport(url, redact(url), options)
    assert t.protocol == protocol and t.key == key and f"{t._where.store_scheme}://{t._where.bucket}" == root


@pytest.mark.parametrize("url", ["gs://bucket", "gs://bucket/", "az://container/", "s3:///key.svs"])
def test_a_cloud_url_without_an_object_is_one_clear_error(url):
    with pytest.raises(WsiError, match="names a bucket and an object"):
        ObjectStoreTransport(url, url, {})


def test_gcs_options_translate():
    config, client = store_config("gs", {"token": "/keys/sa.json", "anon": True})
    assert config == {"google_service_account": "/keys/sa.json", "skip_signature": True}
    assert "allow_http" not in client
    config, client = store_config("gs", {"google_service_account_key": "{}",
                                         "client_options": {"allow_http": True}})
    assert config == {"google_service_account_key": "{}"} and client == {"allow_http": True}


def test_gcs_emulator_endpoints(monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    config, client = store_config("gs", {"endpoint_url": "http://127.0.0.1:9", "token": "anon"})  # gcsfs names
    assert config == {"google_base_url": "http://127.0.0.1:9", "skip_signature": True}
    assert client["allow_http"] is True
    config, client = store_config("gs", {"base_url": "https://gcs.example"})
    assert config == {"base_url": "https://gcs.example"} and "allow_http" not in client
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "localhost:4443")  # Google's clients' variable
    config, client = store_config("gs", {})
    assert config == {"google_base_url": "http://localhost:4443", "skip_signature": True}
    assert client["allow_http"] is True
    config, _ = store_config("gs", {"endpoint_url": "https://other:1"})  # an option wins over the variable
    assert config == {"google_base_url": "https://other:1"}


def test_azure_endpoint_and_connection_string_variable(monkeypatch):
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    config, client = store_config("az", {"azure_endpoint": "http://127.0.0.1:9/devstoreaccount1"})
    assert client["allow_http"] is True  # a plain-HTTP endpoint (Azurite) needs it
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "AccountName=a;AccountKey=k;BlobEndpoint=http://h:1/a")
    config, client = store_config("az", {})
    assert config == {"azure_storage_account_name": "a", "azure_storage_account_key": "k",
                      "azure_endpoint": "http://h:1/a"} and client["allow_http"] is True
    config, _ = store_config("az", {"account_name": "b", "account_key": "k2"})  # options win
    assert config == {"azure_storage_account_name": "b", "azure_storage_account_key": "k2"}


def test_azure_options_translate():
    config, _ = store_config("az", {"account_name": "acct", "account_key": "k", "sas_token": "sv=1&sig=2"})
    assert config == {"azure_storage_account_name": "acct", "azure_storage_account_key": "k",
                      "azure_storage_sas_key": "sv=1&sig=2"}
    config, client = store_config("az", {"use_emulator": True})  # Azurite
    assert config == {"use_emulator": True} and client["allow_http"] is True
    config, _ = store_config("az", {"connection_string": "DefaultEndpointsProtocol=https;AccountName=acct;"
                                                         "AccountKey=k;EndpointSuffix=core.chinacloudapi.cn"})
    assert config == {"azure_storage_account_name": "acct", "azure_storage_account_key": "k",
                      "azure_endpoint": "https://acct.blob.core.chinacloudapi.cn"}
    config, client = store_config("az", {"connection_string": "UseDevelopmentStorage=true"})
    assert config == {"use_emulator": True} and client["allow_http"] is True
    for bad in ("DefaultEndpointsProtocol=https;...", "Protocol=https"):
        with pytest.raises(WsiError, match="connection_string"):
            store_config("az", {"connection_string": bad})


@pytest.mark.parametrize("protocol,key", [("gs", "sas_token"), ("az", "key"), ("gs", "account_key"),
                                          ("az", "nonsense")])
def test_an_option_of_another_store_is_refused(protocol, key):
    with pytest.raises(WsiError, match=f"storage option {key}: not an option for {protocol}://"):
        store_config(protocol, {key: "x"})


def test_s3_names_and_the_endpoint_variable(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    config, client = store_config("s3", {"key": "AK", "secret": "SK", "token": "ST",
                                         "client_kwargs": {"region_name": "eu-west-1"}})
    assert config == {"aws_access_key_id": "AK", "aws_secret_access_key": "SK",
                      "aws_session_token": "ST", "aws_region": "eu-west-1"}
    assert client["allow_http"] is True  # the variable names a plain-HTTP local server


def test_cloud_urls_with_tokens_are_redacted():
    sas = "az://container/s.svs?sv=2024-01-01&sig=SECRET"
    assert redact(sas) == "az://container/s.svs?<redacted>"
    assert redact("gs://user:pw@bucket/s.svs") == "gs://***@bucket/s.svs"


def test_an_unreachable_gcs_endpoint_is_unavailable_17_naming_the_url():
    from wsitool.cli.console import exit_code_for

    url = "gs://bucket/slide.svs?token=SECRET"
    options = {"anon": True, "google_base_url": "http://127.0.0.1:9", "client_options": {"allow_http": True},
               "retries": 0, "timeout": 2, "operation_timeout": 5}
    with pytest.raises(WsiError) as info:
        wsitool.open_slide(url, storage_options=options)
    assert exit_code_for(info.value) == 17
    assert "gs://bucket/slide.svs" in str(info.value) and "SECRET" not in str(info.value)
