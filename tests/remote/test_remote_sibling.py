"""A slide URL opens a named file beside it (a location's sibling) as a remote byte source, as a
local file does: what a format of several files reads (MIRAX), served here by nginx."""

from __future__ import annotations

import numpy as np
import pytest

import wsitool
from wsitool.errors import RemoteNotFoundError
from wsitool.opening import ObjectUrl, open_location, opener, parse_location

from helpers import fake_format, fake_slide_files

pytest.importorskip("urllib3", reason="the remote extra (urllib3) is not installed")


def test_a_url_opens_a_named_sibling(nginx_factory, tmp_path):
    (tmp_path / "slide.mrxs").write_bytes(b"[GENERAL]\n")
    (tmp_path / "slide").mkdir()
    data = bytes(range(256)) * 64
    (tmp_path / "slide" / "Data 0001.dat").write_bytes(data)
    loc = parse_location(nginx_factory(tmp_path).url + "slide.mrxs", {"timeout": 10})
    sibling = loc.sibling("slide/Data 0001.dat")
    assert isinstance(sibling, ObjectUrl) and sibling.options == loc.options
    with loc.open_sibling("slide/Data 0001.dat") as src:
        assert src.remote and src.size == len(data) and src.read(1000, 300) == data[1000:1300]
    with pytest.raises(RemoteNotFoundError):
        loc.open_sibling("slide/Index.dat")


def test_a_format_of_two_files_reads_its_sibling_by_url(nginx_factory, tmp_path):
    """The same registered format opens its index file and the data file beside it, locally and
    by URL, with its own option passed on; the pixels are the local slide's."""
    fake = fake_format()
    opener.register(fake)
    try:
        svs, index = fake_slide_files(tmp_path)
        url = nginx_factory(tmp_path).url + index.name
        with wsitool.Slide(open_location(parse_location(url), {"scene": 0})) as remote, \
                wsitool.open_slide(svs) as local:
            assert remote.path == url and remote.remote is not None
            assert remote.level_dimensions == local.level_dimensions
            np.testing.assert_array_equal(remote.read_region((500, 400), 0, (256, 256)),
                                          local.read_region((500, 400), 0, (256, 256)))
        assert fake.calls == [(url, {"scene": 0})]
    finally:
        opener.unregister(fake)
