"""One object-store listing for ``serve`` prefixes and DICOM series prefixes (``listing.list_keys``).

A scripted stand-in for obstore's ``list`` gives the failures a real store gives
(status texts as obstore words them), so the retry and error mapping are pinned
without a server; the real listings run against moto in test_serve_remote.py and
test_remote_dicom_prefix.py.
"""

from __future__ import annotations

import types

import pytest

from wsitool.errors import RemoteAccessError, RemoteNotFoundError, RemoteUnavailableError
from wsitool.storage.remote import RemoteOptions
from wsitool.storage.remote.transports import listing, obstore_client
from wsitool.storage.remote.transports.listing import list_keys
from wsitool.storage.remote.transports.objectstore import BucketURL

pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")


class _Base(Exception):
    pass


def _fake_obstore(failures: list[Exception], keys: list[str]):
    """An obstore stand-in whose ``list`` raises ``failures`` in turn, then pages ``keys``."""
    calls = []
    exc = types.SimpleNamespace(
        BaseError=_Base, NotFoundError=type("NotFoundError", (_Base,), {}),
        PermissionDeniedError=type("PermissionDeniedError", (_Base,), {}),
        UnauthenticatedError=type("UnauthenticatedError", (_Base,), {}),
        UnknownConfigurationKeyError=type("UnknownConfigurationKeyError", (_Base,), {}),
        InvalidPathError=type("InvalidPathError", (_Base,), {}))

    def list_(store, prefix=None, chunk_size=1000):
        calls.append(prefix)
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]
        for i in range(0, len(keys), chunk_size):
            yield [{"path": k, "size": 10} for k in keys[i:i + chunk_size]]

    return types.SimpleNamespace(exceptions=exc, list=list_), calls


@pytest.fixture
def where():
    return BucketURL.parse("s3://bucket/series/?X-Amz-Signature=secret")


def _run(monkeypatch, failures, keys, where, **options):
    fake, calls = _fake_obstore(failures, keys)
    monkeypatch.setattr(listing, "obstore_module", lambda: fake)
    opts = RemoteOptions.take({"backoff": 0, **options})
    return calls, lambda limit=None: list_keys(object(), where, opts, limit=limit)


def test_transient_failures_are_retried_then_listed_sorted(monkeypatch, where):
    calls, run = _run(monkeypatch, [_Base("Generic S3 error: status: 503 Slow Down"), TimeoutError("timed out")],
                      ["series/b.dcm", "series/a.dcm"], where, retries=2)
    assert run() == [("series/a.dcm", 10), ("series/b.dcm", 10)]
    assert calls == ["series/", "series/", "series/"]


def test_a_store_that_keeps_failing_gives_up_after_the_retries(monkeypatch, where):
    calls, run = _run(monkeypatch, [_Base("status: 500 Internal")] * 5, [], where, retries=2)
    with pytest.raises(RemoteUnavailableError) as info:
        run()
    assert len(calls) == 3 and "gave up after 3 attempts" in str(info.value)
    assert "secret" not in str(info.value) and "s3://bucket/series/" in str(info.value)


@pytest.mark.parametrize("failure, error", [
    (_Base("Client error with status: 403 Forbidden"), RemoteAccessError),
    (_Base("Client error with status 401"), RemoteAccessError),
    (_Base("status: 404 NoSuchBucket"), RemoteNotFoundError),
    (FileNotFoundError("gone"), RemoteNotFoundError),
])
def test_permanent_failures_are_not_retried(monkeypatch, where, failure, error):
    calls, run = _run(monkeypatch, [failure] * 3, [], where, retries=3)
    with pytest.raises(error) as info:
        run()
    assert len(calls) == 1 and "secret" not in str(info.value)


def test_a_bounded_listing_stops_past_its_limit(monkeypatch, where):
    keys = [f"series/{i:05d}.dcm" for i in range(2500)]
    _, run = _run(monkeypatch, [], keys, where)
    assert len(run(limit=1000)) == 2000   # two pages read: the second shows the bound is passed
    assert len(run()) == 2500


def test_the_urls_a_listing_returns_round_trip_to_their_keys(where):
    key = "series/a b#c?.dcm"
    url = where.url_of(key)
    assert url.startswith("s3://bucket/series/") and "#" not in url and "?" not in url
    assert BucketURL.parse(url).key == key


@pytest.mark.parametrize("text, status", [
    ("Generic S3 error: Client error with status 403 Forbidden: <Error>...", 403),
    ("Server returned non-2xx status code: 401 Unauthorized: ", 401),
    ("status: 404 NoSuchBucket", 404),
    ("HTTP status server error (503 Service Unavailable) for url (http://h/b)", 503),
    ("416 Range Not Satisfiable", 416),
    # a timing is not a status (CI saw this read as 401, 'access denied', for a refused connection)
    ("Generic GCS error: Error performing GET http://127.0.0.1:9/bucket/slide%2Esvs in 401.173µs - "
     "HTTP error: error sending request", 0),
    ("request timed out after 403 ms", 0),
])
def test_the_status_is_read_from_its_words_not_from_any_digits(text, status):
    assert obstore_client.status_of(text) == status


def test_a_refused_connection_whose_timing_reads_401_is_retried_not_denied(monkeypatch, where):
    text = "Error performing GET http://127.0.0.1:9/bucket/x in 401.173µs - HTTP error: error sending request"
    calls, run = _run(monkeypatch, [_Base(text)] * 3, [], where, retries=1)
    with pytest.raises(RemoteUnavailableError):
        run()
    assert len(calls) == 2


@pytest.mark.parametrize("text, shown", [
    ("Error performing GET http://u:PASSWORD@h:8/a.svs?sig=TOKEN in 1 ms",
     "Error performing GET http://***@h:8/a.svs?<redacted> in 1 ms"),
    ("Error performing GET https://h/a.svs?X-Amz-Signature=TOKEN - HTTP error",
     "Error performing GET https://h/a.svs?<redacted> - HTTP error"),
    ("Generic S3 error: GET s3://bucket/a.svs failed", "Generic S3 error: GET s3://bucket/a.svs failed"),
])
def test_obstore_texts_show_urls_without_secrets(text, shown):
    assert obstore_client.first_line(Exception(text)) == shown


def test_a_failure_without_a_status_says_its_kind():
    """obstore's first line of a timeout says only "error sending request"; its kind is in the
    debug text after it (the tail is taken before the line is cut: a long URL does not hide it)."""
    url = "http://127.0.0.1:9/" + "a" * 300 + ".svs"
    text = (f"Generic HTTP error: Error performing GET {url} in 1.001s - HTTP error: error "
            "sending request\n\nDebug source:\nGeneric {\n    inner: Http(\n        HttpError {\n"
            "            kind: Timeout,\n")
    first = obstore_client.first_line(text, 4000)
    assert obstore_client._cause(text, first) == "timed out (HTTP error: error sending request)"
    assert obstore_client._cause("status 503", "status 503") == "status 503"
