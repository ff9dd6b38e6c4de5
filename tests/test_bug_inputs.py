"""Every check of ../shared/bug-inputs/manifest.json as an assertion.

The manifest lists, per field-fault file, what a correct reader must do
(see ../shared/bug-inputs/README.md).  One parametrised test runs each check;
the check kinds map to assertions as follows:

* ``open``: the slide opens (``expect: ok``).
* ``level_count`` / ``level_dimensions`` / ``level_downsamples`` (``rel_tol``).
* ``best_level``: :meth:`Slide.get_best_level_for_downsample` (OpenSlide policy).
* ``property``: ``mpp_x`` / ``mpp_y`` -> :attr:`Slide.mpp_x` / :attr:`Slide.mpp_y`.
* ``associated`` / ``associated_image``: names, and pixels against the reference.
* ``region``: ``read_region`` against the reference array (``mae`` or
  ``exact`` within ``tol``); ``raw: true`` reads ``mode="raw"`` and checks the
  dtype; ``alpha_ref`` checks the alpha channel; ``forbid_rgb`` asserts a colour
  never appears; regions wholly inside the level must be opaque.
* ``region_fails_cleanly``: the read either succeeds (``fill`` / ``ok``) or
  raises a documented :class:`wsitool.WsiError`; where the manifest names a
  ``preferred`` behaviour, that one is required.  Our behaviours: missing
  tiles (offset/byte count 0) are filled transparent and counted
  (``tiles_missing``); corrupt tiles raise :class:`TileDecodeError` naming
  level, column and row, or with ``on_error="fill"`` are filled with a
  :class:`TileWarning` and counted (``tiles_failed``); oversized requests raise
  :class:`ResourceLimitError`.
* ``good_read_after_error``: the same open slide still reads a good region
  after a bad tile.
* ``export``: runs once ``wsitool.export`` exists (issue #4), skipped before.
"""

from __future__ import annotations

import inspect
import json
import math
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

import wsitool
from wsitool.codec.pool import get_pool
from wsitool.errors import ResourceLimitError, TileDecodeError, TileWarning, WsiError
from wsitool.ground.geometry import level_rect
from wsitool.slide import pyramid_levels

from helpers import BUG_INPUTS, NO_BUGS, bug_input_checks, bug_input_problem

MANIFEST_PATH = BUG_INPUTS / "manifest.json"
ARRAYS_PATH = BUG_INPUTS / "expected_arrays.npz"


def _manifest() -> dict:
    if not MANIFEST_PATH.exists():
        return {}
    return json.loads(MANIFEST_PATH.read_text())


MANIFEST = _manifest()
# the ids from tests/shared_samples.json (not the folder): without ../shared the cases are listed, as skips
CHECKS = [pytest.param(name, i, id=f"{name.split('_', 1)[0]}-{Path(name).stem[4:]}-{i}-{kind}")
          for name, i, kind in bug_input_checks()]


@pytest.fixture(scope="module")
def refs():
    if not ARRAYS_PATH.exists():
        pytest.skip(NO_BUGS)
    with np.load(ARRAYS_PATH) as npz:
        return {k: npz[k] for k in npz.files}


def _compare(actual: np.ndarray, ref: np.ndarray, metric: str, tol: float, what: str) -> None:
    assert actual.shape == ref.shape, f"{what}: shape {actual.shape} != reference {ref.shape}"
    if metric == "exact" or tol == 0:
        diff = np.abs(actual.astype(np.int64) - ref.astype(np.int64))
        assert diff.max() <= tol, f"{what}: max abs difference {diff.max()} > {tol}"
    elif metric == "mae":
        mae = float(np.abs(actual.astype(np.float64) - ref.astype(np.float64)).mean())
        assert mae <= tol, f"{what}: mean abs error {mae:.3f} > {tol}"
    else:  # pragma: no cover - a new metric must be added here
        pytest.fail(f"{what}: unknown metric {metric!r}")


def _tiles_touched(slide, level: int, location, size):
    lv = pyramid_levels(slide)[level]
    x0, y0 = level_rect(lv, *location)
    x1, y1 = min(x0 + size[0], lv.width), min(y0 + size[1], lv.height)
    x0, y0 = max(x0, 0), max(y0, 0)
    return {(c, r) for c in range(x0 // lv.tile_width, (x1 - 1) // lv.tile_width + 1)
            for r in range(y0 // lv.tile_height, (y1 - 1) // lv.tile_height + 1)}


def _missing_mask(entry: dict, slide, check: dict) -> np.ndarray:
    """Boolean ``(h, w)`` mask of the region's pixels that fall on missing tiles."""
    w, h = check["size"]
    x, y = check["location"]
    lv = pyramid_levels(slide)[check["level"]]
    mask = np.zeros((h, w), bool)
    for idx in entry.get("missing_tiles", []):
        col, row = idx % lv.tiles_across, idx // lv.tiles_across
        tx0, ty0 = col * lv.tile_width - x, row * lv.tile_height - y
        mask[max(ty0, 0):max(ty0 + lv.tile_height, 0), max(tx0, 0):max(tx0 + lv.tile_width, 0)] = True
    return mask


@pytest.mark.parametrize("name, index", CHECKS)
def test_manifest_check(name, index, refs):
    why = bug_input_problem(name)
    if why:
        pytest.skip(why)
    entry = MANIFEST[name]
    check = entry["checks"][index]
    path = BUG_INPUTS / name
    kind = check["kind"]
    if kind == "export":
        _check_export(path, check)
        return
    with wsitool.open_slide(path) as slide:
        if kind == "open":
            assert check["expect"] == "ok"
            assert slide.level_count >= 1 and not slide.closed
        elif kind == "level_count":
            assert slide.level_count == check["expect"]
        elif kind == "level_dimensions":
            assert [list(d) for d in slide.level_dimensions] == check["expect"]
        elif kind == "level_downsamples":
            got = slide.level_downsamples
            assert len(got) == len(check["expect"])
            for g, e in zip(got, check["expect"], strict=True):
                assert math.isclose(g, e, rel_tol=check.get("rel_tol", 1e-9)), (got, check["expect"])
        elif kind == "best_level":
            assert check.get("policy", "openslide") == "openslide"
            assert slide.get_best_level_for_downsample(check["downsample"]) == check["expect"]
        elif kind == "property":
            value = getattr(slide, check["name"])
            assert value is not None, f"{check['name']} unknown"
            assert math.isclose(value, check["expect"], rel_tol=check.get("rel_tol", 1e-9)), value
        elif kind == "associated":
            assert sorted(slide.associated_images) == sorted(check["expect"])
        elif kind == "associated_image":
            img = slide.associated_images[check["name"]]
            assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3
            _compare(img, refs[check["ref"]], check.get("metric", "exact"), check.get("tol", 0),
                     f"{name} {check['name']}")
        elif kind == "region":
            _check_region(slide, check, refs, name)
        elif kind == "region_fails_cleanly":
            _check_fails_cleanly(slide, entry, check, name)
        elif kind == "good_read_after_error":
            bad, good = check["bad"], check["good"]
            with pytest.raises(TileDecodeError) as info:
                slide.read_region(bad["location"], bad["level"], bad["size"])
            assert info.value.level == bad["level"]
            arr = slide.read_region(good["location"], good["level"], good["size"])
            _compare(arr[..., :3], refs[good["ref"]], "mae", good["tol"], f"{name} after error")
            assert (arr[..., 3] == 255).all()
        else:
            pytest.fail(f"{name}: check kind {kind!r} has no assertion yet")


def _check_region(slide, check, refs, name):
    level, loc, size = check["level"], check["location"], check["size"]
    ref = refs[check["ref"]]
    what = f"{name} {check.get('id', '')}"
    if check.get("raw"):
        arr = slide.read_region(loc, level, size, mode="raw")
        assert arr.dtype == np.dtype(check["dtype"]), arr.dtype
        if ref.ndim == 2:
            ref = ref[..., None]
        _compare(arr, ref, check["metric"], check["tol"], what)
        return
    arr = slide.read_region(loc, level, size)
    assert arr.shape == (size[1], size[0], 4) and arr.dtype == np.uint8
    _compare(arr[..., :3], ref, check["metric"], check["tol"], what)
    if "alpha_ref" in check:
        _compare(arr[..., 3], refs[check["alpha_ref"]], "exact", 0, what + " alpha")
    else:
        lv = pyramid_levels(slide)[level]
        xl, yl = level_rect(lv, *loc)
        if xl >= 0 and yl >= 0 and xl + size[0] <= lv.width and yl + size[1] <= lv.height:
            assert (arr[..., 3] == 255).all(), f"{what}: region inside the slide is not opaque"
    if "forbid_rgb" in check:
        hit = (arr[..., :3] == np.array(check["forbid_rgb"], np.uint8)).all(axis=2)
        assert not hit.any(), f"{what}: forbidden colour {check['forbid_rgb']} at {hit.sum()} pixels"


def _check_fails_cleanly(slide, entry, check, name):
    level, loc, size = check["level"], check["location"], check["size"]
    acceptable = set(check["acceptable"])
    pool = get_pool("cpu")
    pool.reset_stats()
    outcome = None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            arr = slide.read_region(loc, level, size)
    except WsiError as exc:
        outcome = "error"
        assert "error" in acceptable, f"{name}: {exc}"
        assert str(slide.path) in str(exc)
        if isinstance(exc, TileDecodeError):
            assert exc.level == level
            assert (exc.col, exc.row) in _tiles_touched(slide, level, loc, size)
        if "fill+warning" in acceptable:
            # The documented alternative: on_error="fill" -> background + TileWarning + counter.
            pool.reset_stats()
            with pytest.warns(TileWarning, match=rf"level {level}, tile"):
                filled = slide.read_region(loc, level, size, on_error="fill")
            assert pool.stats().tiles_failed >= 1
            assert filled.shape == (size[1], size[0], 4)
            assert (filled[..., 3] == 0).any(), "the bad tile's area is not transparent"
    else:
        assert arr.shape == (size[1], size[0], 4)
        mask = _missing_mask(entry, slide, check)
        if mask.any():
            outcome = "fill"
            assert (arr[mask] == 0).all(), "missing tiles must be transparent black"
            assert pool.stats().tiles_missing >= 1
            assert not [w for w in caught if issubclass(w.category, TileWarning)]
        else:
            warned = [w for w in caught if issubclass(w.category, TileWarning)]
            outcome = "partial+warning" if warned else "ok"
    assert outcome in acceptable, (outcome, acceptable)
    if check.get("preferred"):
        assert outcome == check["preferred"], f"{name}: got {outcome}, preferred {check['preferred']}"


# ---------------------------------------------------------------------- export (issue #4)


def _export_module():
    return wsitool.export


def _call_export(export, src: Path, out: Path, **kwargs):
    fn = getattr(export, "export_pyramid", None) or wsitool.export_pyramid
    params = inspect.signature(fn).parameters
    accepted = {k: v for k, v in kwargs.items() if k in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())}
    return fn(src, out, **accepted)


def _check_export(path: Path, check: dict) -> None:
    export = _export_module()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="wsitool-bug-export-") as d:
        d = Path(d)
        if check["format"] == "dzi":
            out = d / "out.dzi"
            _call_export(export, path, out, format="dzi", tile_size=check["tile_size"],
                         overlap=check["overlap"])
            dzi = next(d.glob("*.dzi"))
            files = next(d.glob("*_files"))
            root = ET.fromstring(dzi.read_text())
            ts = int(root.get("TileSize"))
            ov = int(root.get("Overlap"))
            fmt = root.get("Format")
            levels = sorted(int(p.name) for p in files.iterdir() if p.is_dir())
            assert len(levels) == check["expect_levels"]
            import imagecodecs

            for lvl, (ew, eh) in check["expect_level_dims"].items():
                ldir = files / str(lvl)
                tiles = [p.stem.split("_") for p in ldir.glob(f"*.{fmt}")]
                cols = max(int(c) for c, _ in tiles) + 1
                rows = max(int(r) for _, r in tiles) + 1
                last = imagecodecs.imread(ldir / f"{cols - 1}_{rows - 1}.{fmt}")
                w = last.shape[1] + ((cols - 1) * ts - ov if cols > 1 else 0)
                h = last.shape[0] + ((rows - 1) * ts - ov if rows > 1 else 0)
                assert (w, h) == (ew, eh), f"DZI level {lvl}: {w}x{h} != {ew}x{eh}"
        else:
            # B25: a 100000 x 100000 export is refused by default (max_export_pixels) and
            # with a max-pixels below its size, before any allocation and without leaving
            # anything behind.
            out = d / "out.tif"
            import tracemalloc

            tracemalloc.start()
            try:
                with pytest.raises(ResourceLimitError, match="100000x100000"):
                    _call_export(export, path, out, format=check["format"])
                with pytest.raises(ResourceLimitError, match="100000x100000"):
                    _call_export(export, path, out, format=check["format"],
                                 max_pixels=wsitool.get_limits().max_region_pixels)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert peak < 64 << 20, f"{peak} bytes traced while refusing"
            assert list(d.iterdir()) == [], "a refused export left files behind"
