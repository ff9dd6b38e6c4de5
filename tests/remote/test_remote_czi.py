"""A Zeiss CZI file by URL (served by nginx) reads as the local file: levels, properties,
pixels, associated images, and the ``scene`` option."""

from __future__ import annotations

import numpy as np
import pytest

import wsitool

from helpers import script_module, shared_sample

pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")


def test_a_czi_url_reads_as_the_local_file(nginx_factory, tmp_path):
    gen = script_module("make_czi_samples")
    path = gen.two_scene_pyramid(tmp_path, shared_sample("aperio-cmu1-small-region-jpeg.svs"))
    url = nginx_factory(tmp_path).url + path.name
    for scene in (None, 1):
        with wsitool.open_slide(path, scene=scene) as local, \
                wsitool.open_slide(url, storage_options={"timeout": 10}, scene=scene) as remote:
            assert remote.vendor == "zeiss" and remote.remote is not None
            assert [lv.dimensions for lv in remote.levels] == [lv.dimensions for lv in local.levels]
            assert dict(remote.properties) == dict(local.properties)
            for level, lv in enumerate(local.levels):
                want = local.read_region((0, 0), level, lv.dimensions)
                assert np.array_equal(remote.read_region((0, 0), level, lv.dimensions), want), (scene, level)
            for name in local.associated_images:
                assert np.array_equal(remote.associated_images[name], local.associated_images[name]), name
