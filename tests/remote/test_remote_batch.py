"""Commands and batch paths that read a slide from S3 and write locally: export-pyramid (one slide,
and a Dask batch on a LocalCluster), read-region --regions, stress.  The S3 server (moto) is
reached only through storage options, never the environment, so a pass shows that the options
travel with each task to the Dask workers and to the stress child."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from typer.testing import CliRunner

import wsitool
from wsitool.cli import app

from helpers import NO_SHARED, SHARED_SAMPLES
from remote_helpers import servers

pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")
boto3 = pytest.importorskip("boto3", reason="boto3 (with moto[server]) is not installed")
if not servers.moto_available():
    pytest.skip("moto_server is not installed (pip install 'moto[server]')", allow_module_level=True)

NAME = "aperio-cmu1-small-region-jpeg.svs"
_AWS_VARS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
             "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE")


@pytest.fixture(scope="module")
def bucket():
    """``(url of the sample in S3, storage options)``; the AWS variables are unset meanwhile."""
    if not (SHARED_SAMPLES / NAME).is_file():
        pytest.skip(NO_SHARED)
    saved = {k: os.environ.pop(k) for k in _AWS_VARS if k in os.environ}
    try:
        with servers.moto_s3() as srv:
            client = boto3.client("s3", endpoint_url=srv.url, aws_access_key_id="testing",
                                  aws_secret_access_key="testing", region_name="us-east-1")
            client.create_bucket(Bucket="batch")
            client.upload_file(str(SHARED_SAMPLES / NAME), "batch", NAME)
            options = {"endpoint_url": srv.url, "key": "testing", "secret": "testing",
                       "region_name": "us-east-1"}
            yield f"s3://batch/{NAME}", options
    finally:
        os.environ.update(saved)


def _cli_options(options: dict) -> list[str]:
    out = []
    for k, v in options.items():
        out += ["--storage-option", f"{k}={v}"]
    return out


def _level0(path) -> np.ndarray:
    with wsitool.open_slide(path) as s:
        return s.read_region((0, 0), 0, s.dimensions, mode="rgb")


def test_without_options_the_url_does_not_resolve(bucket):
    # the premise of the tests below: nothing in the environment points at the server
    url, _ = bucket
    with pytest.raises(wsitool.WsiError):
        wsitool.open_slide(url, storage_options={"retries": 0, "timeout": 2, "operation_timeout": 5})


def test_export_pyramid_cli_reads_s3_writes_locally(bucket, tmp_path):
    url, options = bucket
    want = tmp_path / "local.svs"
    wsitool.export_pyramid(SHARED_SAMPLES / NAME, want, quality=80)
    out = tmp_path / "remote.svs"
    r = CliRunner().invoke(app, ["export-pyramid", url, str(out), "--quiet", "--quality", "80",
                                 *_cli_options(options)])
    assert r.exit_code == 0, r.output
    assert np.array_equal(_level0(out), _level0(want))


def test_dask_batch_export_from_s3_on_local_workers(bucket, tmp_path):
    pytest.importorskip("distributed", reason="dask.distributed is not installed")
    from wsitool.distributed import export_many

    url, options = bucket
    want = tmp_path / "local.svs"
    wsitool.export_pyramid(SHARED_SAMPLES / NAME, want, quality=80)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcomes = export_many([url], tmp_path / "out", scheduler="local", quality=80,
                               storage_options=options)
    assert [o.status for o in outcomes] == ["ok"], [o.error for o in outcomes]
    assert outcomes[0].worker and not outcomes[0].worker.endswith(f":{os.getpid()}")  # ran on a worker
    got = tmp_path / "out" / NAME.replace(".svs", ".tiff")
    assert np.array_equal(_level0(got), _level0(want))
    # the manifest records the source, never the credentials
    manifest = (tmp_path / "out" / ".wsitool-manifest.json").read_text()
    assert "testing" not in manifest


def test_read_region_regions_cli_from_s3(bucket, tmp_path):
    url, options = bucket
    csv = tmp_path / "r.csv"
    csv.write_text("x,y,level,width,height,name\n0,0,0,300,200,a\n500,400,0,256,256,b\n")
    r = CliRunner().invoke(app, ["read-region", url, "--regions", str(csv), "--output-dir",
                                 str(tmp_path / "out"), "--format", "npy", "--quiet", *_cli_options(options)])
    assert r.exit_code == 0, r.output
    with wsitool.open_slide(SHARED_SAMPLES / NAME) as s:
        a = s.read_region((0, 0), 0, (300, 200))
        b = s.read_region((500, 400), 0, (256, 256))
    assert np.array_equal(np.load(tmp_path / "out" / "a.npy"), a)
    assert np.array_equal(np.load(tmp_path / "out" / "b.npy"), b)


def test_stress_cli_on_s3(bucket, tmp_path):
    url, options = bucket
    report = tmp_path / "report.json"
    r = CliRunner().invoke(app, ["stress", url, "--iterations", "60", "--workers", "2", "--region-size", "128",
                                 "--warmup", "0.1", "--report", str(report), *_cli_options(options)])
    # 0 ok, or 15: too short to judge memory; never a mismatch, read error or crash
    assert r.exit_code in (0, 15), r.output
    import json

    data = json.loads(report.read_text())
    assert data["slide"]["path"] == url
    assert "testing" not in report.read_text()


def test_dask_array_of_an_s3_url_computes_on_a_worker_process(bucket):
    """``Slide.to_dask`` of a URL opened with storage options: the tasks carry the options, so
    a worker in another process (which never saw them) opens the slide as its maker did."""
    distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed")
    url, options = bucket
    with wsitool.open_slide(url, storage_options=options) as s:
        arr = s.to_dask(0)
        w, h = s.dimensions
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                      dashboard_address=None, host="127.0.0.1") as cluster, \
                distributed.Client(cluster) as client:
            got = client.compute(arr[: min(h, 700), : min(w, 900)]).result(timeout=120)
            pids = client.run(os.getpid)
    assert all(pid != os.getpid() for pid in pids.values())  # (the worker is another process)
    with wsitool.open_slide(SHARED_SAMPLES / NAME) as local:
        want = local.read_region((0, 0), 0, (min(w, 900), min(h, 700)), mode="rgb")
    np.testing.assert_array_equal(got, want)
