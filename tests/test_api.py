"""The public surface: exports, types, the read-only level view, thumbnails, Dask arrays and
limits per context (issue 29)."""

from __future__ import annotations

import contextvars
import dataclasses
import threading
import typing
from pathlib import Path

import numpy as np
import pytest

import wsitool
from wsitool import errors
from wsitool import types as literals
from wsitool.ground import oserrors
from wsitool.openslide import AbstractSlide, OpenSlide
from wsitool.read import threads as read_threads
from wsitool.slide import pyramid_levels

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------- exports and types


def test_all_names_exist_and_are_the_documented_stable_ones():
    assert len(set(wsitool.__all__)) == len(wsitool.__all__)
    missing = [n for n in wsitool.__all__ if not hasattr(wsitool, n)]
    assert not missing
    assert {"TileCache", "__version__", "Level", "InvalidOptionError", "DaskUnavailableError",
            "RemoteNotFoundError"} <= set(wsitool.__all__)
    assert wsitool.TileCache.__module__ == "wsitool.read.cache"
    # every exception class of wsitool.errors is exported from the package
    classes = {n for n in errors.__all__ if isinstance(getattr(errors, n), type)}
    assert classes <= set(wsitool.__all__), classes - set(wsitool.__all__)
    page = (REPO / "docs" / "reference" / "stable-api.md").read_text()
    for name in wsitool.__all__:
        assert f"`{name}`" in page or f"`wsitool.{name}`" in page, name


def test_py_typed_is_in_the_package():
    assert (Path(wsitool.__file__).parent / "py.typed").is_file()


def test_read_region_options_are_literal_types():
    hints = typing.get_type_hints(wsitool.Slide.read_region)
    assert set(typing.get_args(hints["mode"])) == {"rgba", "rgb", "raw"}
    assert set(typing.get_args(hints["on_error"])) == {"raise", "fill"}
    device = typing.get_args(hints["device"])
    assert typing.Literal["cpu", "cuda"] in device and str in device  # "cuda:N" too
    assert hints["location"] == hints["size"]
    for name in ("location", "level", "size", "out", "threads", "color", "downsample", "channels"):
        assert name in hints, name
    assert typing.get_args(literals.Mode) == ("rgba", "rgb", "raw")


def test_device_overloads_return_numpy_for_cpu():
    overloads = typing.get_overloads(wsitool.Slide.read_region)
    assert len(overloads) == 2
    ns = vars(__import__("wsitool.slide", fromlist=["x"]))
    cpu, cuda = (typing.get_type_hints(f, globalns=ns) for f in overloads)
    assert cpu["device"] == typing.Literal["cpu"] and cpu["return"] is np.ndarray
    assert cuda["return"] is typing.Any  # CuPy has no type information: CupyArray = Any


def test_errors_module_keeps_only_exceptions_and_printable():
    for name in ("os_resource_error", "raise_if_os_resource", "descriptors_exhausted", "RESOURCE_ERRNOS"):
        assert not hasattr(errors, name), name
        assert hasattr(oserrors, name), name
    functions = [n for n, v in vars(errors).items()
                 if callable(v) and not isinstance(v, type) and getattr(v, "__module__", "") == "wsitool.errors"]
    assert functions == ["printable"]


# ---------------------------------------------------------------------- the level view


def test_levels_are_frozen_views(sample_jpeg):
    with wsitool.open_slide(sample_jpeg) as s:
        views, internal = s.levels, pyramid_levels(s)
        assert len(views) == len(internal) == s.level_count
        for v, lv in zip(views, internal, strict=True):
            assert isinstance(v, wsitool.Level)
            assert (v.index, v.dimensions, v.tile_size, v.downsample, v.compression, v.samples) == (
                lv.index, lv.dimensions, lv.tile_size, lv.downsample, lv.compression, lv.samples)
            assert not hasattr(v, "source") and not hasattr(v, "tiles") and not hasattr(v, "encoding")
            with pytest.raises(dataclasses.FrozenInstanceError):
                v.width = 1  # type: ignore[misc]
        assert s.level_dimensions == tuple(v.dimensions for v in views)
        if s.mpp is not None:
            assert views[0].mpp == pytest.approx(s.mpp)
            last = views[-1]
            assert last.mpp == pytest.approx((s.mpp[0] * views[0].width / last.width,
                                              s.mpp[1] * views[0].height / last.height))


# ---------------------------------------------------------------------- thumbnails


def test_thumbnail_fits_keeps_aspect_and_reads_the_best_level(sample_jpeg, monkeypatch):
    with wsitool.open_slide(sample_jpeg) as s:
        W, H = s.dimensions
        seen = []
        real = wsitool.Slide.read_region

        def spy(self, location, level, size, **kw):
            seen.append(level)
            return real(self, location, level, size, **kw)

        monkeypatch.setattr(wsitool.Slide, "read_region", spy)
        for size in ((200, 200), (64, 300), (W, H)):
            seen.clear()
            t = s.get_thumbnail(size)
            assert t.dtype == np.uint8 and t.ndim == 3 and t.shape[2] == 3
            h, w = t.shape[:2]
            assert w <= size[0] and h <= size[1] and (w == size[0] or h == size[1])
            assert abs(w / h - W / H) < 0.02 * max(1, W / H) + 1 / min(w, h)
            assert seen == [s.get_best_level_for_downsample(max(W / size[0], H / size[1]))]
        with pytest.raises(wsitool.InvalidOptionError, match="thumbnail size"):
            s.get_thumbnail((0, 10))
        with pytest.raises(ValueError):
            s.get_thumbnail((10,))


def test_openslide_thumbnail_is_unchanged_by_the_move(sample_jpeg):
    pytest.importorskip("PIL")
    with OpenSlide(sample_jpeg) as o:
        for size in ((120, 120), (300, 50)):
            moved = o.get_thumbnail(size)
            generic = AbstractSlide.get_thumbnail(o, size)  # the recipe as it was, in the drop-in
            assert moved.mode == generic.mode == "RGB" and moved.size == generic.size
            assert np.array_equal(np.asarray(moved), np.asarray(generic))
            assert moved.info.get("icc_profile") == generic.info.get("icc_profile")


# ---------------------------------------------------------------------- one way to build a Dask array


def test_to_dask_and_level_to_dask_build_the_same_graph(sample_jpeg):
    pytest.importorskip("dask.array")
    from wsitool.distributed import level_to_dask

    with wsitool.open_slide(sample_jpeg) as s:
        a = s.to_dask(1)
        b = level_to_dask(s, 1)
        c = level_to_dask(str(sample_jpeg), 1)
        assert a.name == b.name == c.name
        lw, lh = s.level_dimensions[1]
        assert a.shape == (lh, lw, 3)
        window = a[10:60, 20:90].compute(scheduler="sync")
        assert np.array_equal(window, s.read_region((0, 0), 1, (lw, lh), mode="rgb")[10:60, 20:90])


# ---------------------------------------------------------------------- limits per context


def test_limits_block_in_one_thread_leaves_another_threads_limits():
    default = wsitool.get_limits()
    inside = threading.Event()
    release = threading.Event()
    seen = {}

    def holder():
        with wsitool.limits(max_region_pixels=1234):
            seen["holder"] = wsitool.get_limits().max_region_pixels
            inside.set()
            release.wait(10)
        seen["holder_after"] = wsitool.get_limits().max_region_pixels

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert inside.wait(10)
        assert wsitool.get_limits() == default  # this thread does not see the other's block
        seen["other"] = contextvars.Context().run(lambda: wsitool.get_limits().max_region_pixels)
    finally:
        release.set()
        t.join(10)
    assert seen == {"holder": 1234, "holder_after": default.max_region_pixels,
                    "other": default.max_region_pixels}


def test_set_limits_sets_the_default_a_block_overrides_it():
    before = wsitool.get_limits()
    wsitool.set_limits(max_region_pixels=777_777)
    with wsitool.limits(max_region_bytes=4096) as inner:
        assert inner.max_region_pixels == 777_777 and inner.max_region_bytes == 4096
        with wsitool.limits(max_region_pixels=5):
            assert wsitool.get_limits() == dataclasses.replace(inner, max_region_pixels=5)
        assert wsitool.get_limits() == inner
    assert wsitool.get_limits() == dataclasses.replace(before, max_region_pixels=777_777)
    with pytest.raises(ValueError, match="positive integer"), wsitool.limits(max_region_pixels=0):
        pass


def test_a_block_applies_in_the_decode_pool_threads():
    """The decode pool a region read spreads its tiles over runs each job in a copy of the
    caller's context: the caller's block is in force there, and only there."""
    seen = []
    lock = threading.Lock()
    started = threading.Barrier(3, timeout=10)

    def work():
        started.wait()  # three threads at once: the caller and two pool threads
        with lock:
            seen.append((threading.current_thread().name, wsitool.get_limits().max_tile_pixels))

    with wsitool.limits(max_tile_pixels=77):
        read_threads.run_threads(3, work, lambda: None)
    assert len(seen) == 3 and all(limit == 77 for _, limit in seen), seen
    assert sum(name.startswith("wsitool-decode") for name, _ in seen) == 2
    # afterwards the same pool threads have the default again
    seen.clear()
    started.reset()
    read_threads.run_threads(3, work, lambda: None)
    assert {limit for _, limit in seen} == {wsitool.get_limits().max_tile_pixels}


def test_a_block_applies_in_dask_tasks_and_in_a_multithreaded_read(sample_jpeg):
    pytest.importorskip("dask.array")
    with wsitool.open_slide(sample_jpeg) as s:
        arr = s.to_dask(0, chunks=256)
        assert arr[:10, :10].compute(scheduler="threads").shape == (10, 10, 3)
        with wsitool.limits(max_region_pixels=100):
            with pytest.raises(wsitool.ResourceLimitError):  # the chunk read, in a Dask thread
                arr[:20, :20].compute(scheduler="threads")
            with pytest.raises(wsitool.ResourceLimitError):
                s.read_region((0, 0), 0, (512, 512), threads=4)
        s.read_region((0, 0), 0, (512, 512), threads=4)  # the default again
