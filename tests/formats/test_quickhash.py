"""``openslide.quickhash-1``: equal to OpenSlide 4's on every sample it opens, read lazily and bounded.

The oracle is openslide-python with openslide-bin 4.0.1.  Every shared sample
(``../shared/samples``, ``../shared/bug-inputs``) and the repo's own samples are
compared, through :class:`wsitool.Slide` and the ``wsitool.openslide`` drop-in;
a sample OpenSlide does not open is skipped with OpenSlide's reason.  Small TIFFs
written here pin the 5 MiB limit at its edge and the formats whose detection
decides which IFD is hashed (Huron, Trestle, a ``Philips`` Software tag).
"""

from __future__ import annotations

import hashlib
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import tifffile

from wsitool import Slide
from wsitool.errors import WsiError
from wsitool.formats.deferred import DeferredProperties
from wsitool.formats.quickhash import KEY, feed_string
from wsitool.formats.tiff import quickhash as tiff_quickhash
from wsitool.storage import LocalFile

from helpers import BUG_INPUTS, NO_SHARED, SHARED_SAMPLES, bug_input_checks, repo_samples, shared_params

real = pytest.importorskip("openslide")
ws = pytest.importorskip("wsitool.openslide")


def _samples() -> list:
    """Every listed shared sample (skipped by tests/conftest.py where absent), the bug inputs, the repo's."""
    bugs = sorted({name for name, _, _ in bug_input_checks() if name.endswith(".tif")})
    return (shared_params() + [pytest.param(BUG_INPUTS / n, id=n) for n in bugs]
            + [pytest.param(p, id=p.name) for p in repo_samples()])


def _target(path: Path) -> Path:
    """What OpenSlide is given: the file, or the first file of a DICOM series folder."""
    return path if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())[0]


def _openslide_quickhash(path: Path) -> str | None:
    try:
        with real.OpenSlide(str(_target(path))) as slide:
            return slide.properties.get(KEY)
    except real.OpenSlideError as exc:
        pytest.skip(f"OpenSlide 4 does not open {path.name}: {exc}")


def _wsitool_quickhash(path: Path) -> str | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Slide(path) as slide:
            return slide.properties.get(KEY)


def _dropin_quickhash(path: Path) -> str | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with ws.OpenSlide(str(path)) as slide:
            return slide.properties.get(KEY)


@pytest.mark.parametrize("path", _samples())
def test_equals_openslide(path):
    want = _openslide_quickhash(path)
    assert _wsitool_quickhash(path) == want
    assert _dropin_quickhash(path) == want
    if path.is_dir():  # a series opened from one of its files: the same identity
        assert _wsitool_quickhash(_target(path)) == want


def test_over_the_limit_has_none(tmp_path):
    """OpenSlide hashes a smallest level of at most 5 MiB: exactly 5 MiB is hashed, one tile more is not."""
    tile = 256 * 256  # bytes of one uncompressed 8-bit tile
    assert tiff_quickhash.LIMIT % tile == 0
    tiles = tiff_quickhash.LIMIT // tile  # 80 tiles: a 10 x 8 grid
    rng = np.random.default_rng(7)
    at = tmp_path / "at-limit.tif"
    over = tmp_path / "over-limit.tif"
    tifffile.imwrite(at, rng.integers(0, 255, (8 * 256, tiles // 8 * 256), np.uint8), tile=(256, 256))
    tifffile.imwrite(over, rng.integers(0, 255, (9 * 256, tiles // 8 * 256), np.uint8), tile=(256, 256))
    assert _openslide_quickhash(at) is not None
    assert _wsitool_quickhash(at) == _openslide_quickhash(at)
    assert _openslide_quickhash(over) is None
    with Slide(over) as slide:
        assert KEY not in slide.properties


def _pyramid(path: Path, first_page: dict, **later) -> None:
    """A three-level tiled RGB pyramid; ``first_page``: extra arguments of the first IFD."""
    img = np.random.default_rng(3).integers(0, 255, (512, 768, 3), np.uint8)
    with tifffile.TiffWriter(path) as tw:
        tw.write(img, tile=(128, 128), photometric="rgb", compression="deflate", **first_page)
        for step in (2, 4):
            tw.write(img[::step, ::step], tile=(128, 128), photometric="rgb", subfiletype=1,
                     compression="deflate", **later)


@pytest.mark.parametrize("name, first_page, vendor", [
    ("huron", {"extratags": [(271, "s", 0, "Huron Digital Pathology", True)]}, "huron"),
    ("trestle", {"software": "MedScan 1.0", "description": "Background Color=FFFFFF;Objective Power=20"},
     "trestle"),
    ("philips-software-only", {"software": "Philips x", "description": "not XML"}, "generic-tiff"),
    ("artist-and-copyright", {"extratags": [(315, "s", 0, "someone", True), (33432, "s", 0, "(c) x", True)]},
     "generic-tiff"),
])
def test_tiff_formats_equal_openslide(tmp_path, name, first_page, vendor):
    """The format OpenSlide reads a TIFF as picks the IFD hashed; tifffile's second
    ImageDescription (a repeated tag: OpenSlide keeps the last) is part of the hash."""
    path = tmp_path / f"{name}.tif"
    _pyramid(path, first_page)
    with real.OpenSlide(str(path)) as slide:
        assert slide.properties["openslide.vendor"] == vendor
    assert _wsitool_quickhash(path) == _openslide_quickhash(path) is not None


def test_format_not_followed_has_none(tmp_path):
    """A TIFF that OpenSlide would read as Argos (its XML in tag 65000) gets no property."""
    path = tmp_path / "argos-like.tif"
    _pyramid(path, {"extratags": [(65000, "s", 0, "<Argos.Scan.Metadata/>", True)]})
    with Slide(path) as slide:
        assert KEY not in slide.properties


def test_not_tiled_has_none():
    path = SHARED_SAMPLES / "stripped-deflate-gray-10000x5000.tif"
    if not path.exists():
        pytest.skip(f"{NO_SHARED} (needs {path.name})")
    with Slide(path) as slide:
        assert KEY not in slide.properties


def _repo_svs() -> Path:
    path = next((p for p in repo_samples() if p.name == "sample-aperio-jpeg.svs"), None)
    if path is None:
        pytest.skip("samples/sample-aperio-jpeg.svs is absent (scripts/make_samples.py)")
    return path


def test_read_on_first_use_only(monkeypatch):
    """The key is there at open; the bytes are read on the first read of the value, once."""
    calls = []
    digest = tiff_quickhash.QuickHash.digest
    monkeypatch.setattr(tiff_quickhash.QuickHash, "digest",
                        lambda self, source: calls.append(1) or digest(self, source))
    with Slide(_repo_svs()) as slide:
        props = slide.properties
        assert KEY in props and KEY in list(props) and len(props) == len(list(props.keys()))
        assert "no such key" not in props
        repr(props)
        assert calls == []
        value = props[KEY]
        assert len(value) == 64 and int(value, 16) >= 0
        assert props.get(KEY) == value and dict(props)[KEY] == value and props.copy()[KEY] == value
        assert calls == [1]
    with ws.OpenSlide(str(_repo_svs())) as slide:  # the drop-in: the same
        assert KEY in slide.properties and calls == [1]
        assert slide.properties[KEY] == value and calls == [1, 1]


def test_reads_only_the_smallest_level_and_text_tags(monkeypatch):
    """The bytes read for the value: the last level's tiles and the nine text tags, nothing else."""
    path = _repo_svs()
    with tifffile.TiffFile(path) as tif:
        smallest = [p for p in tif.pages if p.is_tiled][-1]
        want = sum(smallest.tags["TileByteCounts"].value)
        want += sum(tif.pages[0].tags[code].count for _, code in tiff_quickhash.TEXT_TAGS
                    if code in tif.pages[0].tags)
    with Slide(path) as slide:
        got = []
        read = LocalFile.read
        monkeypatch.setattr(LocalFile, "read", lambda self, offset, count: got.append(count) or
                            read(self, offset, count))
        slide.properties[KEY]
    assert sum(got) == want


def test_needs_the_slide_open():
    path = _repo_svs()
    slide = Slide(path)
    slide.close()
    assert KEY in slide.properties
    with pytest.raises(WsiError):
        slide.properties[KEY]
    with Slide(path) as slide:
        value = slide.properties[KEY]
    assert slide.properties[KEY] == value  # kept once read


def test_feed_string():
    h = hashlib.sha256()
    feed_string(h, b"abc\0def")
    feed_string(h, None)
    assert h.hexdigest() == hashlib.sha256(b"abc\0\0").hexdigest()


def test_deferred_properties():
    calls = []

    def compute():
        calls.append(1)
        if len(calls) == 1:
            raise OSError("first try fails")
        return "v"

    props = DeferredProperties({"a": "1", "b": "2"}, {"b": compute})
    assert list(props) == ["a", "b"] and list(reversed(props)) == ["b", "a"] and len(props) == 2
    assert "b" in props and "c" not in props and calls == []
    assert "computed on first access" in repr(props)
    with pytest.raises(OSError):
        props["b"]
    assert props["b"] == "v" and props["b"] == "v" and calls == [1, 1]  # not cached on failure, then kept
    assert props | {"c": "3"} == {"a": "1", "b": "v", "c": "3"}
    assert {"b": "0"} | props == {"b": "v", "a": "1"}
    with pytest.raises(KeyError):
        props["c"]


def test_deferred_properties_computes_once_across_threads():
    calls = []
    gate = threading.Event()

    def compute():
        calls.append(1)
        gate.wait(5)
        return "v"

    props = DeferredProperties({}, {"k": compute})
    out = []
    threads = [threading.Thread(target=lambda: out.append(props["k"])) for _ in range(8)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join()
    assert out == ["v"] * 8 and calls == [1]
