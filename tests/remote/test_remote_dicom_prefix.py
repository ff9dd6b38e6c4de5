"""DICOM series stored under an S3 prefix (moto_server) open like the local series folder.

Also: a dual-personality series (each file also a valid TIFF) opens with all its
levels, the errors of a prefix (no DICOM object, several series, too many keys),
and the requests an open makes (moto's request recorder).
"""

from __future__ import annotations

import importlib.util
import json
import struct
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import wsitool
from wsitool.cli import app, exit_code_for
from wsitool.errors import UnsupportedFormatError

from helpers import environ, shared_sample
from remote_helpers import servers

pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")
boto3 = pytest.importorskip("boto3", reason="boto3 (with moto[server]) is not installed")
if not servers.moto_available():
    pytest.skip("moto_server is not installed (pip install 'moto[server]')", allow_module_level=True)

SERIES = ["dicom-cmu1-small-region-12level", "dicom-3dhistech-fluorescence-3channel", "dicom-openslide-boxes"]
BUCKET = "series"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    recording = {"MOTO_ENABLE_RECORDING": "True",  # (read by the server process at start)
                 "MOTO_RECORDER_FILEPATH": str(tmp_path_factory.mktemp("moto") / "recording")}
    with environ(recording), servers.moto_s3() as srv, environ(srv.extra["env"]):
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key="nodicom/readme.txt", Body=b"not a slide " * 40)
        client.put_object(Bucket=BUCKET, Key="nodicom/deeper/x.bin", Body=b"x" * 400)
        yield client, srv.url


def _upload(client, folder: Path, prefix: str) -> int:
    files = sorted(p for p in folder.iterdir() if p.is_file())
    for p in files:
        client.upload_file(str(p), BUCKET, f"{prefix}/{p.name}")
    return len(files)


def _open(location):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return wsitool.open_slide(location)


def _regions(w: int, h: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Three regions of a level: the top-left corner, the middle, the bottom-right corner."""
    size = (min(w, 300), min(h, 300))
    return [((0, 0), size), ((w // 2 - size[0] // 2, h // 2 - size[1] // 2), size),
            ((w - size[0], h - size[1]), size)]


def _assert_same(remote, local) -> None:
    assert remote.level_dimensions == local.level_dimensions
    assert remote.level_downsamples == local.level_downsamples
    assert dict(remote.properties) == dict(local.properties)
    assert [repr(c) for c in remote.channels] == [repr(c) for c in local.channels]
    assert set(remote.associated_images) == set(local.associated_images)
    for name in local.associated_images:
        assert np.array_equal(remote.associated_images[name], local.associated_images[name]), name
    for level, (w, h) in enumerate(local.level_dimensions):
        for loc, size in _regions(w, h):
            want = local.read_region(loc, level, size, mode="raw")
            got = remote.read_region(loc, level, size, mode="raw")
            assert np.array_equal(got, want), (level, loc, size)


@pytest.mark.parametrize("name", SERIES)
def test_prefix_reads_like_the_local_folder(name, s3):
    folder = shared_sample(name)
    _upload(s3[0], folder, name)
    with _open(f"s3://{BUCKET}/{name}/") as remote, _open(folder) as local:
        assert remote.vendor == "dicom" and remote.path == f"s3://{BUCKET}/{name}/"
        _assert_same(remote, local)
        assert remote.level_count == local.level_count >= 1


def _make_dual(path: Path) -> None:
    """Make the DICOM file ``path`` also a TIFF of its frames: a TIFF header in the preamble
    pointing at an IFD held in a trailing Data Set Trailing Padding element (FFFC,FFFC)."""
    from wsitool.formats.dicom.frames import frame_table
    from wsitool.formats.dicom.instance import read_instance

    inst = read_instance(str(path))
    offsets, counts, _ = frame_table(inst, True)
    data = bytearray(path.read_bytes())
    data += b"\0" * (len(data) % 2)
    n = len(offsets)
    tags = [(256, 4, 1, inst.width), (257, 4, 1, inst.height), (258, 3, 3, None), (259, 3, 1, 7),
            (262, 3, 1, 6), (277, 3, 1, 3), (284, 3, 1, 1), (322, 3, 1, inst.frame_width),
            (323, 3, 1, inst.frame_height), (324, 4, n, None), (325, 4, n, None)]
    value_at = len(data) + 12  # the padding element's value: tag (4), "OB", 2 reserved, length (4)
    ifd_size = 2 + 12 * len(tags) + 4
    extra_at = value_at + ifd_size
    extra = struct.pack("<3H", 8, 8, 8) + b"\0\0"
    arrays = {258: value_at + ifd_size}
    arrays[324] = extra_at + len(extra)
    extra += np.asarray(offsets, "<u4").tobytes()
    arrays[325] = extra_at + len(extra)
    extra += np.asarray(counts, "<u4").tobytes()
    ifd = struct.pack("<H", len(tags))
    for tag, kind, count, value in tags:
        if value is None and (count > 1 or tag == 258):
            if count == 1:  # a one-tile level: the value itself
                value = int((offsets if tag == 324 else counts)[0])
                ifd += struct.pack("<HHII", tag, kind, 1, value)
            else:
                ifd += struct.pack("<HHII", tag, kind, count, arrays[tag])
        elif kind == 3:
            ifd += struct.pack("<HHIHH", tag, kind, count, value, 0)
        else:
            ifd += struct.pack("<HHII", tag, kind, count, value)
    ifd += struct.pack("<I", 0)
    value = ifd + extra
    data += struct.pack("<HH", 0xFFFC, 0xFFFC) + b"OB\0\0" + struct.pack("<I", len(value)) + value
    data[0:8] = b"II*\0" + struct.pack("<I", value_at)
    path.write_bytes(bytes(data))


def test_dual_personality_series_opens_with_all_levels(s3, tmp_path):
    import tifffile

    spec = importlib.util.spec_from_file_location(
        "wsitool_test_dicom_build", Path(__file__).resolve().parents[1] / "formats" / "dicom_build.py")
    dicom_build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dicom_build)
    img = dicom_build.make_image(700, 500)
    files = dicom_build.write_series(tmp_path / "dual", img, 128, levels=3)
    for f in files[:-1]:  # the levels (the label is native: left a plain DICOM file)
        _make_dual(f)
    with tifffile.TiffFile(files[0]) as tif:  # each level file is also a TIFF of one page
        assert len(tif.pages) == 1 and tif.pages[0].shape[:2] == (500, 700)
    _upload(s3[0], tmp_path / "dual", "dual")
    with _open(f"s3://{BUCKET}/dual/") as remote, _open(tmp_path / "dual") as local:
        assert remote.vendor == "dicom" and remote.level_count == 3
        _assert_same(remote, local)


def test_prefix_without_dicom_is_not_a_slide(s3):
    url = f"s3://{BUCKET}/nodicom/"
    with pytest.raises(UnsupportedFormatError) as info:
        wsitool.open_slide(url)
    message = str(info.value)
    assert message.startswith(url) and "no DICOM object" in message and "1 object(s)" in message
    assert "1 under deeper prefixes" in message
    assert exit_code_for(info.value) == 3
    res = CliRunner().invoke(app, ["info", url + "?X-Amz-Signature=secret"])
    assert res.exit_code == 3
    assert "secret" not in res.output and "no DICOM object" in res.output
    with pytest.raises(UnsupportedFormatError):
        wsitool.open_slide(f"s3://{BUCKET}/empty-prefix/")


def test_several_series_under_one_prefix(s3):
    client = s3[0]
    _upload(client, shared_sample("dicom-openslide-boxes"), "mixed")
    _upload(client, shared_sample("dicom-cmu1-small-region-12level"), "mixed")
    with pytest.raises(UnsupportedFormatError) as info:
        wsitool.open_slide(f"s3://{BUCKET}/mixed/")
    message = str(info.value)
    assert message.startswith(f"s3://{BUCKET}/mixed/: a prefix of 2 DICOM series")
    assert "give the prefix of one series" in message


def test_prefix_over_the_listing_bound(s3, monkeypatch):
    import wsitool.storage.prefix as prefix

    monkeypatch.setattr(prefix, "MAX_OBJECTS", 3)
    _upload(s3[0], shared_sample("dicom-cmu1-small-region-12level"), "big")
    with pytest.raises(UnsupportedFormatError, match="more than 3 objects under the prefix"):
        wsitool.open_slide(f"s3://{BUCKET}/big/")


def _recorder(base: str, action: str) -> bytes:
    method = "GET" if action == "download-recording" else "POST"
    req = urllib.request.Request(f"{base}/moto-api/recorder/{action}", method=method)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read()


@pytest.mark.parametrize("name", SERIES)
def test_requests_to_open_a_prefix(name, s3, capsys):
    client, base = s3
    count = _upload(client, shared_sample(name), f"counted-{name}")
    try:
        _recorder(base, "reset-recording")
        _recorder(base, "start-recording")
    except OSError as exc:  # pragma: no cover - a moto without the recorder
        pytest.skip(f"moto's request recorder is not available: {exc}")
    try:
        slide = _open(f"s3://{BUCKET}/counted-{name}/")
    finally:
        _recorder(base, "stop-recording")
    slide.close()
    lines = [json.loads(x) for x in _recorder(base, "download-recording").decode().splitlines() if x.strip()]
    lists = [x for x in lines if "list-type" in x.get("url", "") or "prefix=" in x.get("url", "")]
    heads = [x for x in lines if (x.get("headers") or {}).get("Range", "").startswith("bytes=0-")]
    with capsys.disabled():
        print(f"\n[prefix open] {name}: {count} objects, {len(lines)} requests "
              f"({len(lists)} list, {len(heads)} first-64KiB GETs, {len(lines) - len(lists) - len(heads)} more)")
    assert len(lists) == 1
    assert len(heads) == count  # each object's first request, once
    assert len(lines) <= 1 + 4 * count  # + the rest of a header over 64 KiB, the last item, the first frame
