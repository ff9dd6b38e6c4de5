"""HTTPS slides and the ``verify`` storage option, through each HTTP client, against a scripted
server with a certificate of a test CA made here (openssl)."""

from __future__ import annotations

import shutil
import ssl
import subprocess

import numpy as np
import pytest

import wsitool
from wsitool.errors import InvalidOptionError, RemoteUnavailableError

from helpers import NO_SHARED, SHARED_SAMPLES

pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")
pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")

SAMPLE = "aperio-cmu1-small-region-jpeg.svs"
FAST = {"timeout": 2, "operation_timeout": 6, "retries": 0}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """``(CA file, server SSLContext)``: a test CA and a 127.0.0.1 certificate it signed."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl (the command) is not installed")
    d = tmp_path_factory.mktemp("pki")

    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=wsitool test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                           "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "leaf.pem", "-days", "2", "-extfile", "ext")
    # a bundle with a comment in UTF-8 before the certificate (as some bundles carry)
    (d / "bundle.pem").write_bytes("# Prüf-CA für die Tests\n".encode() + (d / "ca.pem").read_bytes())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(d / "leaf.pem", d / "leaf.key")
    return d / "bundle.pem", context


@pytest.fixture
def data():
    if not SHARED_SAMPLES.is_dir():
        pytest.skip(NO_SHARED)
    return (SHARED_SAMPLES / SAMPLE).read_bytes()


@pytest.fixture(params=["obstore", "urllib3"])
def http_client(request, monkeypatch):
    from wsitool.storage.remote.transports.http import HttpTransport

    monkeypatch.setattr(HttpTransport, "force_client", request.param)
    return request.param


def test_https_with_the_ca_file_or_without_verification(pki, scripted, data, http_client):
    bundle, context = pki
    url, _ = scripted(data, tls=context)
    assert url.startswith("https://")
    with wsitool.open_slide(SHARED_SAMPLES / SAMPLE) as local:
        want = local.read_region((0, 0), 0, (600, 600), mode="rgb")
    for verify in (str(bundle), bundle, False, "false", 0):
        with wsitool.open_slide(url, storage_options={**FAST, "verify": verify}) as s:
            assert np.array_equal(s.read_region((0, 0), 0, (600, 600), mode="rgb"), want), verify
            assert type(s._source.transport._client).__name__.lower().startswith("_" + http_client)


def test_https_with_an_unknown_ca_fails_in_one_line(pki, scripted, data, http_client):
    _, context = pki
    url, _ = scripted(data, tls=context)
    with pytest.raises(RemoteUnavailableError) as info:
        wsitool.open_slide(url + "?token=SECRET", storage_options=FAST)
    assert "SECRET" not in str(info.value) and len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize("raw, want", [(True, True), (None, True), ("TRUE", True), (1, True),
                                       (False, False), ("false", False), ("0", False), (0, False)])
def test_verify_values(raw, want):
    from wsitool.storage.remote.transports.http import verify_option as _verify

    assert _verify("u", raw) is want


@pytest.mark.parametrize("raw", [2, 1.5, ["x"], {"a": 1}])
def test_verify_other_types_are_refused(raw):
    from wsitool.storage.remote.transports.http import verify_option as _verify

    with pytest.raises(InvalidOptionError, match="verify"):
        _verify("u", raw)


def test_verify_a_missing_or_non_pem_file_is_refused(tmp_path):
    from wsitool.storage.remote.transports.http import verify_option as _verify

    with pytest.raises(InvalidOptionError, match="cannot read the CA file"):
        _verify("u", str(tmp_path / "missing.pem"))
    (tmp_path / "x.pem").write_text("not a certificate\n")
    with pytest.raises(InvalidOptionError, match="holds no PEM certificate"):
        _verify("u", str(tmp_path / "x.pem"))
