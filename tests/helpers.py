"""Helpers and constants the test modules import by name (``from helpers import ...``).

pytest puts ``tests/`` on ``sys.path`` (the folder of the top ``conftest.py``), so this module
is importable from every test folder.  ``conftest.py`` keeps only fixtures and hooks; anything
a test module imports lives here.

Real slides written by others live in ``../shared/samples`` and the field-fault files in
``../shared/bug-inputs`` (beside the repository; ``WSITOOL_SHARED`` names another folder).
They are read from there, never copied.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import types
from collections.abc import Iterator
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


#: The shared samples the tests use, with their SHA-256 (scripts/shared_manifest.py writes it).
SAMPLES_MANIFEST = REPO / "tests" / "shared_samples.json"
TIFF_SUFFIXES = (".svs", ".tif", ".tiff", ".qptiff")
_problems: dict[str, str | None] = {}


@functools.cache
def shared_manifest() -> dict[str, dict]:
    """``name -> {"sha256", "size"}`` of every listed sample in ../shared/samples (a dict, sorted)."""
    import json

    return json.loads(SAMPLES_MANIFEST.read_text())["samples"]


def shared_names(prefix: str = "", suffixes: tuple[str, ...] = ()) -> list[str]:
    """Names of the listed shared samples starting with ``prefix`` and ending in one of
    ``suffixes`` (any when empty), sorted.  From the manifest: the same list whether or not
    ../shared is there, so the tests over them show as skipped, not absent, without it."""
    return [n for n in shared_manifest()
            if n.startswith(prefix) and (not suffixes or n.lower().endswith(suffixes))]


def bug_input_checks() -> list[tuple[str, int, str]]:
    """``(file name, check index, kind)`` of every check of ../shared/bug-inputs/manifest.json,
    from tests/shared_samples.json: the same list whether or not the folder is there."""
    import json

    listed = json.loads(SAMPLES_MANIFEST.read_text()).get("bug_inputs", {})
    return [(name, int(i), kind) for name, i, kind in listed.get("checks", [])]


def bug_input_problem(name: str) -> str | None:
    """Why the bug input ``name`` (or the folder's ``manifest.json``) cannot be used, or None."""
    import json

    if not BUG_INPUTS.is_dir():
        return NO_BUGS
    listed = json.loads(SAMPLES_MANIFEST.read_text()).get("bug_inputs", {}).get("files", {})
    for file in ("manifest.json", name):
        path = BUG_INPUTS / file
        if not path.is_file():
            return f"bug input {file} is missing from {BUG_INPUTS}"
        if file in listed and path.stat().st_size != listed[file]["size"]:
            return f"bug input {file} differs from tests/shared_samples.json (size)"
    return None


def sample_problem(name: str) -> str | None:
    """Why the shared sample ``name`` cannot be used (a skip reason naming it), or None.

    None when ``SHARED_SAMPLES/name`` exists with the size and SHA-256 listed in
    tests/shared_samples.json (hashed once per process).  Raises ``KeyError`` for a name the
    manifest does not list (run scripts/shared_manifest.py after adding a sample).
    """
    entry = shared_manifest()[name]
    if name not in _problems:
        path = SHARED_SAMPLES / name
        if not SHARED_SAMPLES.is_dir():
            why = f"real slides folder {SHARED_SAMPLES} is absent (needs {name})"
        elif not path.exists():
            why = f"shared sample {name} is missing from {SHARED_SAMPLES}"
        else:
            manifest_script = script_module("shared_manifest")
            size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() \
                else path.stat().st_size
            found = manifest_script.digest(path) if size == entry["size"] else {"size": size}
            why = None if found == entry else (
                f"shared sample {name} differs from tests/shared_samples.json "
                f"(size {size} / {entry['size']}, sha256 {found.get('sha256', '?')[:12]} / {entry['sha256'][:12]})")
        _problems[name] = why
    return _problems[name]


def shared_sample(name: str) -> Path:
    """Path of a real slide in ../shared/samples; skips the test, naming the sample, if it is
    absent or differs from tests/shared_samples.json; fails it if the manifest does not list it.
    ``name`` may name a file inside a folder sample (``"dicom-openslide-boxes/boxes_0.dcm"``):
    the folder is the sample the manifest lists."""
    sample = name.split("/", 1)[0]
    if sample not in shared_manifest():
        pytest.fail(f"shared sample {sample} is not listed in {SAMPLES_MANIFEST.name} "
                    "(run scripts/shared_manifest.py)")
    why = sample_problem(sample)
    if why:
        pytest.skip(why)
    return SHARED_SAMPLES / name


def shared_params(names: list[str] | None = None) -> list:
    """``pytest.param(path, id=name)`` per listed shared sample (all when ``names`` is None):
    for ``parametrize``; tests/conftest.py skips each case whose sample is absent or differs."""
    return [pytest.param(SHARED_SAMPLES / n, id=n) for n in (shared_manifest() if names is None else names)]


def tiff_samples() -> list[Path]:
    """The TIFF-based shared samples (not DICOM), from the manifest: present or not (tests over
    them are skipped by tests/conftest.py where a sample is absent; see :func:`present`)."""
    return [SHARED_SAMPLES / n for n in shared_names(suffixes=TIFF_SUFFIXES)]


def present(paths: list[Path]) -> list[Path]:
    """The paths of ``paths`` that can be used: repo samples, and shared samples that are present
    and match the manifest (for tests that loop over samples inside one case)."""
    return [p for p in paths if p.parent != SHARED_SAMPLES or sample_problem(p.name) is None]


#: OpenSlide's pixels of fixed regions of the shared samples (scripts/make_region_hashes.py).
REGION_HASHES = REPO / "tests" / "region_hashes.json"


@functools.cache
def region_hashes() -> dict:
    """tests/region_hashes.json: ``samples`` (name -> format, level_dimensions, regions with the
    SHA-256 of OpenSlide's RGBA bytes), ``rejected`` (names OpenSlide does not open) and
    ``unread`` (names it opens but cannot read), as recorded with OpenSlide ``openslide``."""
    import json

    return json.loads(REGION_HASHES.read_text())


def openslide_samples(kind: str = "samples", suffixes: tuple[str, ...] = TIFF_SUFFIXES) -> list[Path]:
    """Paths of the shared samples OpenSlide reads (``kind="samples"``), does not open
    (``"rejected"``) or opens without reading (``"unread"``), as tests/region_hashes.json records
    it, ending in one of ``suffixes`` (TIFF by default): the oracle sets of the parity tests,
    known without opening anything at import."""
    return [SHARED_SAMPLES / n for n in region_hashes()[kind] if n.lower().endswith(suffixes)]


def repo_samples() -> list[Path]:
    """The slides the project generates itself (scripts/make_samples.py)."""
    return sorted(REPO_SAMPLES.glob("sample-*"))


def slides_where(paths: list[Path], keep) -> list[Path]:
    """The slides of ``paths`` that open and for which ``keep(slide)`` is true (others skipped)."""
    import wsitool

    found = []
    for p in paths:
        try:
            with wsitool.open_slide(p) as slide:
                if keep(slide):
                    found.append(p)
        except wsitool.WsiError:
            continue
    return found


def serve_port(proc, deadline: float = 30.0, seen: list[str] | None = None) -> int:
    """The port of a ``wsitool serve`` child from its start-up line on stderr (the lines read
    go to ``seen``); kills it and fails the test when none comes within ``deadline`` seconds."""
    import re
    import time

    seen = [] if seen is None else seen
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        line = proc.stderr.readline()
        seen.append(line)
        m = re.search(r"serving 1 slide\(s\) at http://127\.0\.0\.1:(\d+)/", line)
        if m:
            return int(m.group(1))
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"no start-up line; stderr: {''.join(seen)}{proc.stderr.read()}")


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


@contextlib.contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the block (module-scoped fixtures, where pytest's
    ``monkeypatch`` is not available), then put back what was there, unset ones unset."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def prose(text: str) -> str:
    """``text`` with every run of white space one space: a report's sentences as one line.
    ``info`` wraps its prose between words to the terminal's width ($COLUMNS), so a phrase
    checked in it may be split over lines; error and warning lines never are."""
    return " ".join(text.split())


#: The first bytes of :func:`fake_format`'s index file.
FAKE_MAGIC = b"FAKE-INDEX\n"


def fake_format() -> types.ModuleType:
    """A slide format of two files, as MIRAX: an index file naming its data file, which lies in a
    folder beside it (here a TIFF), read through the location's siblings; it takes the option
    ``scene`` (only scene 0 exists).  ``calls``: ``(shown, options)`` of each open.  Register it
    with :func:`wsitool.opening.opener.register` (and unregister it after)."""
    from wsitool.errors import InvalidOptionError
    from wsitool.formats import tiff

    fmt = types.ModuleType("fake_format")
    fmt.NAME, fmt.READS_URLS, fmt.OPTIONS, fmt.calls = "FAKE", True, frozenset({"scene"}), []

    def open_pyramid(source):
        raise AssertionError("a placed format is opened with open_placed")

    def open_placed(place, source, options):
        fmt.calls.append((place.shown, dict(options)))
        if options.get("scene", 0) != 0:
            raise InvalidOptionError(f"{place.shown}: no scene {options['scene']}")
        data = place.open_sibling(source.read(len(FAKE_MAGIC), source.size).decode().strip())
        try:
            pyramid = tiff.open_pyramid(data)
        except BaseException:
            data.close()
            raise
        release = pyramid.release

        def release_both():
            if release is not None:
                release()
            data.close()

        pyramid.release, pyramid.associated = release_both, {}
        return pyramid

    fmt.sniff = lambda head: head.startswith(FAKE_MAGIC)
    fmt.open_pyramid, fmt.open_placed = open_pyramid, open_placed
    return fmt


def fake_slide_files(folder: Path) -> tuple[Path, Path]:
    """``(svs, index)``: a :func:`fake_format` slide in ``folder``: ``slide.fake`` naming
    ``slide/Data 0000.tif``, a copy of the shared CMU-1 small region SVS."""
    svs = shared_sample("aperio-cmu1-small-region-jpeg.svs")
    (folder / "slide").mkdir()
    shutil.copyfile(svs, folder / "slide" / "Data 0000.tif")
    (folder / "slide.fake").write_bytes(FAKE_MAGIC + b"slide/Data 0000.tif\n")
    return svs, folder / "slide.fake"


@contextlib.contextmanager
def openslide_pair(path: Path):
    """``(OpenSlide, wsitool.openslide.OpenSlide)`` of ``path``, closed afterwards; the test
    skips where the two detect different formats (the parity tests compare like with like)."""
    import warnings

    import openslide as real

    import wsitool.openslide as ws

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fmt, ours = real.OpenSlide.detect_format(str(path)), ws.OpenSlide.detect_format(str(path))
        if fmt is None or fmt != ours:
            pytest.skip(f"{path.name}: OpenSlide detects {fmt}, wsitool.openslide {ours}: not the same format")
        o, w = real.OpenSlide(str(path)), ws.OpenSlide(str(path))
    try:
        yield o, w
    finally:
        o.close()
        w.close()


def assert_reads_equal_openslide(o, w, seed: int = 50, regions: int = 12) -> None:
    """``read_region`` RGBA of ``w`` (wsitool's drop-in) equal to OpenSlide's ``o`` on every level:
    a region before the origin, one past the far corner, the whole level and ``regions`` random
    ones (level-0 locations on the level's grid), then the associated images' pixels."""
    rng = np.random.default_rng(seed)
    for level, (width, height) in enumerate(o.level_dimensions):
        ds = int(o.level_downsamples[level])
        boxes = [((-37, -11), (120, 90)), ((width - 60, height - 50), (200, 170)), ((0, 0), (width, height))]
        for _ in range(regions):
            boxes.append(((int(rng.integers(-80, width)), int(rng.integers(-80, height))),
                          (int(rng.integers(1, 380)), int(rng.integers(1, 380)))))
        for (x, y), size in boxes:
            a = np.asarray(o.read_region((x * ds, y * ds), level, size))
            b = np.asarray(w.read_region((x * ds, y * ds), level, size))
            assert np.array_equal(a, b), (level, x, y, size)
    assert sorted(w.associated_images) == sorted(o.associated_images)
    for image in o.associated_images:
        assert np.array_equal(np.asarray(w.associated_images[image]), np.asarray(o.associated_images[image]))


def assert_offgrid_reads_equal_openslide(o, w, seed: int = 60, regions: int = 16) -> None:
    """``read_region`` RGBA of ``w`` (wsitool's drop-in) equal to OpenSlide's ``o`` on every level
    at level-0 locations off the level's grid (fractional level offsets, which OpenSlide samples
    bilinearly): before the origin, across the far corner, the whole level and ``regions`` random
    ones."""
    rng = np.random.default_rng(seed)
    for level, (width, height) in enumerate(o.level_dimensions):
        ds = o.level_downsamples[level]
        far_x, far_y = int((width - 60) * ds) + 1, int((height - 50) * ds) + 1
        boxes = [((-37, -11), (120, 90)), ((-int(3 * ds) - 1, 3), (width + 9, 40)), ((far_x, far_y), (200, 170)),
                 ((1, 1), (width, height))]
        for _ in range(regions):
            boxes.append(((int(rng.integers(-90, int(width * ds))), int(rng.integers(-90, int(height * ds)))),
                          (int(rng.integers(1, 380)), int(rng.integers(1, 380)))))
        for (x, y), size in boxes:
            a = np.asarray(o.read_region((x, y), level, size))
            b = np.asarray(w.read_region((x, y), level, size))
            assert np.array_equal(a, b), (level, x, y, size, int(np.abs(a.astype(int) - b).max()))


#: put before a child's code by :func:`child_peak_rss`: at exit, the child writes its own peak RSS
#: (VmHWM, KiB) to the file named by its last argument
_PEAK_PROLOGUE = '''
import atexit as _atexit, sys as _sys
_peak_file = _sys.argv.pop()

def _write_peak():
    with open("/proc/self/status") as fp:
        line = next(line for line in fp if line.startswith("VmHWM:"))
    with open(_peak_file, "w") as out:
        out.write(line.split()[1])

_atexit.register(_write_peak)
'''


def child_peak_rss(code: str, args: list[str], folder: Path, timeout: float = 120.0) -> tuple[int, int, str]:
    """Run ``python -c code args...``; return ``(exit code, its peak RSS in bytes, stderr)``.

    The peak is the child's own high-water mark (``VmHWM`` of ``/proc/self/status``, read as it
    exits), not ``os.wait4``'s ``ru_maxrss``: that counts the pages of the process it was
    started from (a child started by a 400 MB test process would show 400 MB however little it
    used itself).  Linux only (callers skip elsewhere).  The child is killed past ``timeout``
    seconds (a bound on the wait, not a speed target): exit code -9, and the test says so.
    """
    import subprocess
    import sys
    import tempfile

    with tempfile.NamedTemporaryFile(dir=folder, prefix="peak-", suffix=".txt", delete=False) as fp:
        peak_file = Path(fp.name)
    proc = subprocess.Popen([sys.executable, "-c", _PEAK_PROLOGUE + code, *args, str(peak_file)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    text = peak_file.read_text().strip()
    peak_file.unlink()
    assert text, f"the child wrote no peak (exit {proc.returncode}): {err.decode(errors='replace')[-500:]}"
    return proc.returncode, int(text) << 10, err.decode(errors="replace")


def vendor_pair_fixture(names, made: str = "made"):
    """A ``pair`` fixture (assign it to ``pair`` in a test module) over the fixtures ``names``,
    keys of the session fixture ``made`` (``made`` or ``mirax_made``, tests/formats/conftest.py):
    ``(name, openslide.OpenSlide, wsitool.openslide.OpenSlide)`` of each, closed after the test."""

    @pytest.fixture(params=names)
    def pair(request):
        import openslide as real

        import wsitool.openslide as ws

        path = request.getfixturevalue(made)[request.param]
        o, w = real.OpenSlide(str(path)), ws.OpenSlide(str(path))
        yield request.param, o, w
        o.close()
        w.close()

    return pair
