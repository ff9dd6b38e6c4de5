"""Fixtures and hooks shared by every test folder (helpers to import live in helpers.py).

Real slides written by others live in ``../shared/samples`` and the field-fault
files in ``../shared/bug-inputs`` (beside the repository).  They are read from
there, never copied; tests that need them skip with a reason when the folder
is absent.  Test modules import helpers and constants from ``helpers``
(``from helpers import shared_sample``), never from this file.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from helpers import (
    BUG_INPUTS,
    REPO_SAMPLES,
    SHARED_SAMPLES,
    bug_input_problem,
    sample_problem,
    shared_manifest,
    shared_sample,
)

# The fixtures of the server tests (serve_slides; nginx_factory, scripted), registered here for
# tests/serve and tests/remote.  Not a conftest.py in those folders: without packages, pytest
# imports every conftest.py as the module `conftest`, so a second one would take the place of
# this one in sys.modules.  Appended to sys.path (pytest prepends
# a test module's folder only when it imports that module), after everything else.
# scripts/ too: the tests import the fuzz mutators (scripts/fuzzlib.py) and harness by name.
for _folder in (Path(__file__).resolve().parent / "serve", Path(__file__).resolve().parent / "remote",
                Path(__file__).resolve().parents[1] / "scripts"):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))
pytest_plugins = ["serve_helpers", "remote_helpers"]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Skip a case parametrized with a shared sample (``SHARED_SAMPLES / name``, a path or its
    string) that is absent or differs from tests/shared_samples.json, naming the sample.

    The check runs when the case runs, not at collection (nothing is read at import), so the
    cases stay listed, as skips, without ../shared.
    """
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return
    listed = shared_manifest()
    for value in callspec.params.values():
        if not isinstance(value, (str, Path)):
            continue
        path = Path(value)
        why = None
        if path.parent == SHARED_SAMPLES and path.name in listed:
            why = sample_problem(path.name)
        elif path.parent == BUG_INPUTS:
            why = bug_input_problem(path.name)
        if why:
            pytest.skip(why)


@pytest.fixture(autouse=True)
def _restore_limits():
    """Every test starts and ends with the limits in force before it (set_limits is process-wide)."""
    import wsitool

    before = wsitool.get_limits()
    yield
    wsitool.set_limits(max_region_pixels=before.max_region_pixels,
                       max_region_bytes=before.max_region_bytes,
                       max_tile_pixels=before.max_tile_pixels)


@pytest.fixture
def cmu1() -> Path:
    """Aperio CMU-1-Small-Region: JPEG tiles, photometric RGB, 240x240 tiles."""
    return shared_sample("aperio-cmu1-small-region-jpeg.svs")


@pytest.fixture
def tcga_j2k() -> Path:
    """Aperio TCGA slide with JPEG 2000 (33005) tiles, 2 levels."""
    return shared_sample("aperio-tcga-cr-7395-jp2k-33005-2level.svs")


@pytest.fixture
def sample_jpeg() -> Path:
    """The repo's own Aperio-style JPEG pyramid (3 levels)."""
    return REPO_SAMPLES / "sample-aperio-jpeg.svs"


@pytest.fixture
def python_path(monkeypatch):
    """Turn the compiled JPEG tile loop off for this test, and decode JPEG with nvImageCodec:
    for tests of the Python read path's own machinery (its nvImageCodec batches, scratch
    images, block destinations)."""
    from wsitool.codec.paths import decode_paths

    with decode_paths(native=False, libjpeg=False):
        yield


@pytest.fixture(params=["compiled", "python"])
def read_path(request, monkeypatch):
    """Run the test on both JPEG read paths: the compiled tile loop (skipped, with
    the reason, where it is not built) and the Python path."""
    from wsitool.codec import jpegloop
    from wsitool.codec.paths import decode_paths

    with decode_paths(native=request.param == "compiled"):
        if request.param == "compiled" and jpegloop._load() is None:
            pytest.skip(f"compiled JPEG loop: {jpegloop.status()}")
        yield request.param
