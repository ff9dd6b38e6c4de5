"""wsitool's pixels against OpenSlide's as recorded in tests/region_hashes.json.

scripts/make_region_hashes.py writes the file with OpenSlide: the SHA-256 of the RGBA bytes of
fixed regions (each level: top-left, centre, over the bottom-right edge) of each shared sample
OpenSlide reads.  Where openslide-python is importable, the parity tests
(tests/read/test_region.py, tests/openslide/test_openslide_parity.py) compare with it live and
this module only checks the file is still what that OpenSlide returns; where it is not, wsitool's
reads are checked against the file, so the parity is still tested.
"""

from __future__ import annotations

import hashlib

import pytest

import wsitool

from helpers import region_hashes, script_module, shared_params

try:
    import openslide
except (ImportError, OSError):  # openslide-python, or the OpenSlide library, is absent
    openslide = None

#: Samples whose recorded pixels wsitool is not meant to reproduce, with the reason.
DIFFERENT_BY_DESIGN = {
    # OpenSlide decodes it through libtiff's RGBA interface, which mirrors Orientation=6 images;
    # wsitool returns the stored pixel order (tests/read/test_region.py, EXCLUDED).
    "generic-jpeg-gray-3level-orientation6.tif": "OpenSlide mirrors the Orientation=6 tiles",
}
NAMES = sorted(region_hashes()["samples"])


def test_the_file_covers_the_oracle_samples():
    doc = region_hashes()
    assert len(NAMES) >= 10 and "aperio-cmu1-small-region-jpeg.svs" in NAMES
    for name in NAMES:
        entry = doc["samples"][name]
        levels = {r["level"] for r in entry["regions"]}
        assert levels == set(range(len(entry["level_dimensions"]))), name  # every level has regions
        assert all(len(r["sha256"]) == 64 for r in entry["regions"])


@pytest.mark.parametrize("path", shared_params([n for n in NAMES if n not in DIFFERENT_BY_DESIGN]))
def test_wsitool_reads_what_openslide_recorded(path):
    if openslide is not None:
        pytest.skip("openslide-python is importable: the parity tests compare with it live")
    entry = region_hashes()["samples"][path.name]
    with wsitool.open_slide(path) as slide:
        assert [list(d) for d in slide.level_dimensions] == entry["level_dimensions"]
        for r in entry["regions"]:
            rgba = slide.read_region(tuple(r["location"]), r["level"], tuple(r["size"]))
            assert rgba.shape == (r["size"][1], r["size"][0], 4)
            assert hashlib.sha256(rgba.tobytes()).hexdigest() == r["sha256"], (path.name, r)


@pytest.mark.parametrize("path", shared_params(NAMES))
def test_the_recorded_hashes_are_openslides(path):
    if openslide is None:
        pytest.skip("openslide-python is not importable: no OpenSlide to check the file against")
    doc = region_hashes()
    if openslide.__library_version__ != doc["openslide"]:
        pytest.skip(f"recorded with OpenSlide {doc['openslide']}, this is {openslide.__library_version__}")
    made = script_module("make_region_hashes").sample_entry(openslide, path)
    assert made == doc["samples"][path.name], f"{path.name}: run scripts/make_region_hashes.py"
