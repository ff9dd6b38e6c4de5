"""Shared fixtures: real slides from ../shared, the repo's own samples, helpers.

Real slides written by others live in ``../shared/samples`` and the field-fault
files in ``../shared/bug-inputs`` (beside the repository).  They are read from
there, never copied; tests that need them skip with a reason when the folder
is absent.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("WSITOOL_SHARED", REPO.parent / "shared"))
SHARED_SAMPLES = SHARED / "samples"
BUG_INPUTS = SHARED / "bug-inputs"
REPO_SAMPLES = REPO / "samples"

NO_SHARED = f"real slides folder {SHARED_SAMPLES} is absent"
NO_BUGS = f"bug-inputs folder {BUG_INPUTS} is absent"

# The fixtures of the server tests (serve_slides; nginx_factory, scripted), registered here for
# tests/serve and tests/remote.  Not a conftest.py in those folders: without packages, pytest
# imports every conftest.py as the module `conftest`, so a second one would take the place of
# this one for the tests that `from conftest import ...`.  Appended to sys.path (pytest prepends
# a test module's folder only when it imports that module), after everything else.
for _folder in ("serve", "remote"):
    _path = str(Path(__file__).resolve().parent / _folder)
    if _path not in sys.path:
        sys.path.append(_path)
pytest_plugins = ["serve_helpers", "remote_helpers"]


def script_module(name: str):
    """``scripts/NAME.py`` imported as a module, loaded once (tests share it)."""
    import importlib.util
    import sys

    key = f"wsitool_script_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, REPO / "scripts" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]


def fuzz_script():
    """``scripts/fuzz.py`` imported as a module (the fuzz tests share it)."""
    return script_module("fuzz")


def shared_sample(name: str) -> Path:
    """Path of a real slide in ../shared/samples; skips the test if absent."""
    path = SHARED_SAMPLES / name
    if not path.exists():
        pytest.skip(f"{NO_SHARED} (needs {name})")
    return path


def tiff_samples() -> list[Path]:
    """Every TIFF-based file in ../shared/samples (not DICOM, not the notes)."""
    if not SHARED_SAMPLES.is_dir():
        return []
    return sorted(
        p for p in SHARED_SAMPLES.iterdir()
        if p.is_file() and p.suffix.lower() in (".svs", ".tif", ".tiff", ".qptiff")
    )


def repo_samples() -> list[Path]:
    """The slides the project generates itself (scripts/make_samples.py)."""
    return sorted(REPO_SAMPLES.glob("sample-*"))


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


def random_regions(rng: np.random.Generator, level_w: int, level_h: int, n: int, max_size: int = 600):
    """``n`` regions ``(xl, yl, w, h)`` in level pixels: inside, straddling the
    right/bottom edges, and partly outside (negative and beyond)."""
    out = []
    for i in range(n):
        w = int(rng.integers(1, min(max_size, level_w + 64) + 1))
        h = int(rng.integers(1, min(max_size, level_h + 64) + 1))
        kind = i % 4
        if kind == 0:  # inside
            x = int(rng.integers(0, max(1, level_w - w + 1)))
            y = int(rng.integers(0, max(1, level_h - h + 1)))
        elif kind == 1:  # straddles right/bottom edge
            x = int(rng.integers(max(0, level_w - w), level_w))
            y = int(rng.integers(max(0, level_h - h), level_h))
        elif kind == 2:  # partly outside top-left
            x = int(rng.integers(-w + 1, 1))
            y = int(rng.integers(-h + 1, 1))
        else:  # anywhere, possibly wholly outside
            x = int(rng.integers(-w, level_w + 32))
            y = int(rng.integers(-h, level_h + 32))
        out.append((x, y, w, h))
    return out


def with_tile_bytes(src: Path, tmp_path: Path, index: int, mutate, name: str = "mut") -> Path:
    """A copy of ``src`` (under ``tmp_path``) with tile ``index`` of level 0 rewritten
    by ``mutate(bytes) -> bytes`` (same length)."""
    import tifffile

    data = bytearray(src.read_bytes())
    with tifffile.TiffFile(src) as tf:
        page = tf.pages[0]
        off, count = page.dataoffsets[index], page.databytecounts[index]
    new = mutate(bytes(data[off:off + count]))
    assert len(new) == count
    data[off:off + count] = new
    out = tmp_path / f"{name}-{src.name}"
    out.write_bytes(bytes(data))
    return out


def with_byte_count(src: Path, tmp_path: Path, index: int, count: int, name: str = "count") -> Path:
    """A copy of ``src`` (under ``tmp_path``) whose TileByteCounts entry ``index`` of
    level 0 says ``count`` (0: a missing tile; less than the tile: a cut tile;
    past the end of the file: a truncated one)."""
    import tifffile

    data = bytearray(src.read_bytes())
    with tifffile.TiffFile(src) as tf:
        tag = tf.pages[0].tags["TileByteCounts"]
        item = {3: 2, 4: 4, 16: 8}[int(tag.dtype)]
        pos = tag.valueoffset + index * item
    data[pos:pos + item] = count.to_bytes(item, "little")
    out = tmp_path / f"{name}-{index}-{src.name}"
    out.write_bytes(bytes(data))
    return out


@pytest.fixture
def python_path(monkeypatch):
    """Turn the compiled JPEG tile loop off for this test: for tests of the Python
    read path's own machinery (its batches, scratch images, block destinations)."""
    from wsitool.settings import decode_paths

    with decode_paths(native=False):
        yield


@pytest.fixture(params=["compiled", "python"])
def read_path(request, monkeypatch):
    """Run the test on both JPEG read paths: the compiled tile loop (skipped, with
    the reason, where it is not built) and the Python path."""
    from wsitool.codec import jpegloop
    from wsitool.settings import decode_paths

    with decode_paths(native=request.param == "compiled"):
        if request.param == "compiled" and jpegloop._load() is None:
            pytest.skip(f"compiled JPEG loop: {jpegloop.status()}")
        yield request.param
