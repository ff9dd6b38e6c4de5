"""DICOMweb series read from a real Orthanc (DICOMweb plugin) equal the local reads; frame requests per region."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import wsitool
from wsitool.slide import pyramid_levels

from helpers import NO_SHARED, SHARED_SAMPLES, present, shared_names

pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")
pytest.importorskip("pydicom", reason="pydicom is not installed")

def _series_samples() -> list[Path]:
    """Each DICOM series among the shared samples: a folder, or a single-file series."""
    return [SHARED_SAMPLES / name for name in shared_names("dicom-")]


def _files(sample: Path) -> list[Path]:
    return sorted(sample.glob("*.dcm")) if sample.is_dir() else [sample]


@pytest.fixture(scope="module")
def orthanc(orthanc_server):
    """The module's Orthanc (``orthanc_server``) with every shared DICOM series stored:
    ``(server, {sample: url})``."""
    if not SHARED_SAMPLES.is_dir():
        pytest.skip(NO_SHARED)
    urls = {}
    for sample in present(_series_samples()):
        (url,) = orthanc_server.load(_files(sample))
        urls[sample.name] = url
    return orthanc_server, urls


def _open(location, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return wsitool.open_slide(location, **kw)
        except wsitool.WsiError as exc:
            return exc


#: Levels up to this many pixels are compared whole; larger ones by a corner region.
WHOLE = 4_000_000


@pytest.mark.parametrize("sample", _series_samples(), ids=lambda p: p.name)
def test_every_series_reads_the_same_over_dicomweb(sample, orthanc):
    _server, urls = orthanc
    local = _open(sample)
    remote = _open(urls[sample.name])
    if isinstance(local, Exception):  # a series the local reader refuses: the same class
        assert type(remote) is type(local), (local, remote)
        return
    assert not isinstance(remote, Exception), remote
    with local, remote:
        assert remote.level_dimensions == local.level_dimensions
        assert remote.level_downsamples == local.level_downsamples
        assert [lv.tile_width for lv in pyramid_levels(remote)] == [lv.tile_width for lv in pyramid_levels(local)]
        assert [repr(c) for c in remote.channels] == [repr(c) for c in local.channels]
        for a, b in zip(remote.channels, local.channels, strict=True):
            assert (a.lut is None) == (b.lut is None)
            assert a.lut is None or np.array_equal(a.lut, b.lut)
        for lv, (w, h) in enumerate(local.level_dimensions):
            size = (w, h) if w * h <= WHOLE else (min(w, 1500), min(h, 1500))
            modes = ("rgba", "raw")
            for mode in modes:
                a = local.read_region((0, 0), lv, size, mode=mode)
                b = remote.read_region((0, 0), lv, size, mode=mode)
                assert b.dtype == a.dtype and np.array_equal(a, b), (sample.name, lv, mode)
        lp, rp = dict(local.properties), dict(remote.properties)
        assert rp.pop("wsitool.dicom.offset-table") == "wado-rs"
        lp.pop("wsitool.dicom.offset-table")
        assert rp.keys() == lp.keys()
        for key, value in lp.items():
            if rp[key] != value:  # a Decimal String: DICOM JSON carries the number, not its text
                assert float(rp[key]) == float(value), key
        assert sorted(remote.associated_images) == sorted(local.associated_images)
        for name in local.associated_images:
            assert np.array_equal(remote.associated_images[name], local.associated_images[name])
        assert not pyramid_levels(remote)[0].source.client.closed
    assert pyramid_levels(remote)[0].source.client.closed  # closing the slide closed the client


def test_dicomweb_prefix_and_redaction(orthanc):
    _server, urls = orthanc
    url = urls["dicom-cmu1-small-region-12level"]
    with_user = url.replace("http://", "http://alice:s3cret@")
    slide = _open("dicomweb+" + with_user)
    assert not isinstance(slide, Exception), slide
    with slide:
        assert "s3cret" not in slide.path and "alice" not in slide.path
        assert slide.level_count == 12


def test_one_frames_request_per_level_per_region(orthanc):
    _server, urls = orthanc
    url = urls["dicom-cmu1-small-region-12level"]
    with _open(url, storage_options={"frame_cache_mb": 0}) as slide:
        client = pyramid_levels(slide)[0].source.client
        lv = pyramid_levels(slide)[0]
        before = client.stats()
        # a 3x3-tile region in the middle of level 0, then the same region again
        x, y = lv.tile_width * 1 + 7, lv.tile_height * 2 + 5
        slide.read_region((x, y), 0, (lv.tile_width * 2, lv.tile_height * 2), threads=4)
        after = client.stats()
        assert after["frame_requests"] - before["frame_requests"] == 1
        assert after["requests"] - before["requests"] == 1
        # two levels, one region each: one request per level
        slide.read_region((0, 0), 1, (600, 600))
        slide.read_region((0, 0), 2, (555, 741))
        assert client.stats()["frame_requests"] - after["frame_requests"] == 2


def test_frame_cache_serves_a_second_read(orthanc):
    _server, urls = orthanc
    with _open(urls["dicom-cmu1-small-region-12level"]) as slide:
        client = pyramid_levels(slide)[0].source.client
        first = slide.read_region((300, 300), 0, (700, 700))
        before = client.stats()
        again = slide.read_region((300, 300), 0, (700, 700))
        assert client.stats()["requests"] == before["requests"]
        assert np.array_equal(first, again)


def test_upload_helper_counts_files(orthanc, tmp_path):
    from wsitool.formats.dicom.web import upload

    server, _urls = orthanc
    sample = SHARED_SAMPLES / "dicom-google-jpeg-ybr-957x715.dcm"
    assert upload(server.root, [sample]) == 1  # (storing it again is accepted)
    with pytest.raises(FileNotFoundError):
        upload(server.root, [tmp_path / "absent.dcm"])


def test_patch_batches_over_dicomweb_equal_the_local_read_in_few_requests(orthanc, monkeypatch):
    """``read_patches`` of a DICOMweb series asks for each batch's frames in one request (those of
    the batches ahead with them, as they are planned), not one request per run of tiles;
    pixels equal the local files' read."""
    from wsitool.read.patches import reader
    _server, urls = orthanc
    sample = SHARED_SAMPLES / "dicom-cmu1-small-region-12level"
    with _open(urls[sample.name], storage_options={"frame_cache_mb": 0}) as remote, _open(sample) as local:
        lv = pyramid_levels(remote)[0]
        client = lv.source.client
        tw, th = lv.tile_width, lv.tile_height
        # patches of a quarter tile, four rows of tiles, runs of two tiles: many runs a batch
        xs, ys = np.meshgrid(np.arange(0, 8 * tw, tw // 2), np.arange(0, 4 * th, th // 2))
        locs = np.stack([xs.ravel(), ys.ravel()], 1)
        batch = 32  # two rows of patches: one row of tiles, eight tiles in four runs
        monkeypatch.setattr(reader, "RUN_TILES", 2)
        before = client.stats()["frame_requests"]
        got = np.concatenate(list(remote.read_patches(locs, (tw // 2, th // 2), batch_size=batch, threads=1)))
        requests = client.stats()["frame_requests"] - before
        want = np.concatenate(list(local.read_patches(locs, (tw // 2, th // 2), batch_size=batch, threads=1)))
        np.testing.assert_array_equal(got, want)
        batches = len(locs) // batch
        assert requests <= batches, (requests, batches)  # (one request a run: 12 here)
