"""Slides read from an S3 server (moto_server, started here) equal the local reads; S3 errors."""

from __future__ import annotations

import os
import signal
import sys
import warnings

import numpy as np
import pytest

import wsitool
from wsitool.cli.console import exit_code_for
from wsitool.errors import RemoteChangedError, RemoteNotFoundError

from helpers import NO_SHARED, SHARED_SAMPLES, environ, present, tiff_samples
from remote_helpers import servers

pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")
boto3 = pytest.importorskip("boto3", reason="boto3 (with moto[server]) is not installed")
if not servers.moto_available():
    pytest.skip("moto_server is not installed (pip install 'moto[server]')", allow_module_level=True)


@pytest.fixture(scope="module")
def s3():
    if not SHARED_SAMPLES.is_dir():
        pytest.skip(NO_SHARED)
    with servers.moto_s3() as srv, environ(srv.extra["env"]):
        client = boto3.client("s3")
        client.create_bucket(Bucket="slides")
        for p in present(tiff_samples()):
            client.upload_file(str(p), "slides", p.name)
        yield client


@pytest.mark.parametrize("sample", tiff_samples(), ids=lambda p: p.name)
def test_every_sample_reads_the_same_from_s3(sample, s3):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            local = wsitool.open_slide(sample)
        except wsitool.WsiError as exc:
            with pytest.raises(type(exc)):
                wsitool.open_slide(f"s3://slides/{sample.name}")
            return
        remote = wsitool.open_slide(f"s3://slides/{sample.name}")
    with local, remote:
        assert remote.remote["protocol"] == "s3" and remote.remote["etag"]
        assert dict(remote.properties) == dict(local.properties)
        for i, (w, h) in enumerate(local.level_dimensions):
            size = (min(w, 2048), min(h, 2048))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    want = local.read_region((0, 0), i, size, mode="raw", on_error="fill")
                except wsitool.WsiError as exc:
                    with pytest.raises(type(exc)):
                        remote.read_region((0, 0), i, size, mode="raw", on_error="fill")
                    continue
                got = remote.read_region((0, 0), i, size, mode="raw", on_error="fill")
            assert np.array_equal(got, want), (sample.name, i)


def test_s3_errors(s3):
    with pytest.raises(RemoteNotFoundError) as info:
        wsitool.open_slide("s3://slides/missing.svs")
    assert exit_code_for(info.value) == 9
    name = "aperio-cmu1-small-region-jpeg.svs"
    s3.upload_file(str(SHARED_SAMPLES / name), "slides", "changing.svs")
    with wsitool.open_slide("s3://slides/changing.svs", storage_options={"retries": 0}) as s:
        s.read_region((0, 0), 0, (256, 256))
        s3.put_object(Bucket="slides", Key="changing.svs", Body=(SHARED_SAMPLES / name).read_bytes()[:-10] + b"0" * 10)
        with pytest.raises(RemoteChangedError) as info:
            s.read_region((1500, 1500), 0, (600, 600))
        assert exit_code_for(info.value) == 18


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() on this platform")
def test_a_forked_child_gets_one_clear_error_not_a_hang(s3):
    """obstore's runtime, started by the parent's first request, has no threads in a forked
    child: a request there never returned (a DataLoader worker hung for good).  Now one error
    naming the way out; the parent reads on."""
    name = "aperio-cmu1-small-region-jpeg.svs"
    with wsitool.open_slide(f"s3://slides/{name}") as s:
        want = s.read_region((0, 0), 0, (256, 256))
        read_end, write_end = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: its error's class and text through the pipe
            os.close(read_end)
            signal.alarm(60)  # (a hang fails the test instead of stopping the suite)
            try:
                s.read_region((1000, 600), 0, (300, 300))
                text = "read"
            except BaseException as exc:
                text = f"{type(exc).__name__}|{exc}"
            finally:
                os.write(write_end, text.encode())
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            text = pipe.read().decode()
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status), f"child killed by signal {os.WTERMSIG(status)} (hung)"
        kind, _, message = text.partition("|")
        assert kind == "WsiError" and "fork" in message and "spawn" in message, text
        assert message.startswith(f"s3://slides/{name}: ") and len(message.splitlines()) == 1
        assert np.array_equal(s.read_region((0, 0), 0, (256, 256)), want)  # the parent is unharmed
