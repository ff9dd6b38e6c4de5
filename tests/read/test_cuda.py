"""GPU decoding (``device="cuda"``): CPU tests of the shared logic, GPU tests that skip without one.

The batched region path of :mod:`wsitool.read.cuda` is array-library agnostic: run
with numpy targets and the CPU decoder pool (``wsitool.read.cuda.HostArrays``) it performs
the same planning, code-stream preparation, single batched decode call,
verification, scratch handling, colour conversion and error filling as on the
GPU, so the CPU tests below compare it pixel for pixel with the per-tile CPU
path.  The tests marked ``gpu`` need CuPy and a CUDA device and skip with the
reason otherwise; ``scripts/gpu_check.sh`` runs them on a GPU machine.
"""

from __future__ import annotations

import dataclasses
import importlib.util as importlib_util
import json
import os
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest

import wsitool
from wsitool.codec import backends, nvdecode
from wsitool.codec import pool as codec_pool
from wsitool.codec.library import nv as nvimgcodec
from wsitool.codec.paths import decode_paths
from wsitool.errors import DeviceUnavailableError, InvalidRegionError, TileDecodeError, TileWarning
from wsitool.ground import device
from wsitool.ground.forksafe import PerProcess
from wsitool.read import cuda as gpu
from wsitool.read import cuda_arrays
from wsitool.read.request import region_request
from wsitool.slide import pyramid_levels

from helpers import REPO, random_regions, shared_sample

HAS_CUDA = device.cuda_available()
NO_GPU_REASON = f"no CUDA device available: {device.cuda_probe()[1]}"
needs_gpu = pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU_REASON)
needs_no_gpu = pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is present (tests the no-GPU path)")

CMU1 = "aperio-cmu1-small-region-jpeg.svs"
TCGA_J2K = "aperio-tcga-cr-7395-jp2k-33005-2level.svs"
J2K_34712 = "tiled-jp2k-34712-2pages.tif"
JPEG_YCBCR = "tiled-jpeg-ycbcr-48x32tiles-2pages.tif"
ZSTD = "generic-bigtiff-zstd-5level-10000x5000.tiff"
UNREADABLE = "broken-aperio-unreadable-jpeg.svs"


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _batched_host(slide, location, level, size, mode, on_error="raise", out=None):
    """Read a region through the batched path with numpy targets and the CPU decoder."""
    req = region_request(pyramid_levels(slide), location, level, size, mode=mode, on_error=on_error)
    lv, w, h = req.level, req.width, req.height
    shape = (h, w, {"rgba": 4, "rgb": 3}.get(mode, lv.samples))
    if out is None:
        out = np.full(shape, 77, lv.dtype if mode == "raw" else np.uint8)  # not zero: catches gaps
    gpu.fill_region_batched(req, out, codec_pool.get_pool("cpu"), gpu.HostArrays())
    return out


def _level_regions(slide, rng, n: int, max_size: int):
    """``(level, level-0 location, w, h)`` of ``n`` random regions on the first and last level."""
    for level in sorted({0, slide.level_count - 1}):
        lv = pyramid_levels(slide)[level]
        for xl, yl, w, h in random_regions(rng, lv.width, lv.height, n, max_size=max_size):
            yield level, (int(xl * lv.downsample), int(yl * lv.downsample)), w, h


class _SpyDecoder:
    """Wraps a decoder and records the number of code streams of each decode call."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[int] = []

    def decode(self, src, **kwargs):
        self.calls.append(len(src) if isinstance(src, list) else 1)
        return self.inner.decode(src, **kwargs)


# ----------------------------------------------------------------- no GPU here


@needs_no_gpu
def test_read_region_cuda_raises_device_unavailable(cmu1):
    with (wsitool.open_slide(cmu1) as s,
          pytest.raises(DeviceUnavailableError, match="no CUDA device available") as info):
        s.read_region((0, 0), 0, (64, 64), device="cuda")
    assert str(cmu1) in str(info.value)


@needs_no_gpu
def test_cli_device_cuda_one_line_exit_8(cmu1, tmp_path):
    target = tmp_path / "r.png"
    proc = subprocess.run(
        [sys.executable, "-m", "wsitool.cli", "read-region", str(cmu1), "--size", "64", "64",
         "-o", str(target), "--device", "cuda"],
        capture_output=True, text=True, env=_env(), timeout=120,
    )
    assert proc.returncode == 8
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip().startswith("wsitool")]
    assert len(lines) == 1 and "no CUDA device available" in lines[0]
    assert "Traceback" not in proc.stderr
    assert not target.exists() and not list(tmp_path.iterdir())


@needs_no_gpu
def test_gpu_memory_sample_without_gpu():
    with pytest.raises(DeviceUnavailableError, match="no CUDA device available"):
        gpu.gpu_memory_sample()


def test_bad_device_strings(cmu1):
    with wsitool.open_slide(cmu1) as s:
        for bad in ("gpu", "cuda:", "cuda:x", "cuda0", "CUDA"):
            with pytest.raises(InvalidRegionError, match="bad device"):
                s.read_region((0, 0), 0, (8, 8), device=bad)


def test_backend_report_lists_cpu_cuda_and_hardware_jpeg():
    report = backends.backend_report(probe=False)
    json.dumps(report)  # serialisable for `wsitool info --json`
    by_device = {}
    for entry in report:
        assert set(entry) >= {"name", "device", "available", "decodes", "detail"}
        by_device.setdefault(entry["device"], []).append(entry)
    assert all(e["available"] for e in by_device["cpu"])
    names = " | ".join(e["name"] for e in report)
    assert "nvJPEG2000" in names and "hardware" in names and "CUDA: nvJPEG" in names
    cuda_entries = by_device["cuda"]
    assert len(cuda_entries) == 3
    if not HAS_CUDA:
        assert not any(e["available"] for e in cuda_entries)
        assert all("no CUDA device available" in e["detail"] for e in cuda_entries)
    decodes = " ".join(e["decodes"] for e in report)
    for compression in ("33003", "33005", "34712", "JPEG", "zstd"):
        assert compression in decodes


def test_info_json_shows_backends(cmu1):
    proc = subprocess.run([sys.executable, "-m", "wsitool.cli", "info", str(cmu1), "--json"],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    backends = json.loads(proc.stdout)["backends"]
    assert {b["device"] for b in backends} == {"cpu", "cuda"}
    assert any("hardware" in b["name"] for b in backends)
    assert any(b["device"] == "cuda" for b in backends if b["available"]) == HAS_CUDA


# ------------------------------------------ shared batched logic, numpy targets


@pytest.mark.parametrize("name", [CMU1, TCGA_J2K, J2K_34712, JPEG_YCBCR, ZSTD])
def test_batched_path_matches_cpu_path(name):
    if name == ZSTD:
        pytest.importorskip("imagecodecs", reason="tifffile needs imagecodecs for zstd")
    path = shared_sample(name)
    rng = np.random.default_rng(7)
    with wsitool.open_slide(path) as s:
        for level, loc, w, h in _level_regions(s, rng, 4, 500):
            for mode in ("rgb", "rgba", "raw"):
                ref = s.read_region(loc, level, (w, h), mode=mode)
                got = _batched_host(s, loc, level, (w, h), mode)
                assert got.dtype == ref.dtype and got.shape == ref.shape
                assert np.array_equal(got, ref), (name, level, loc, w, h, mode)


def test_one_batched_decode_call_per_region(cmu1, monkeypatch):
    with wsitool.open_slide(cmu1) as s:
        state = codec_pool.get_pool("cpu").state()
        spy = _SpyDecoder(state.decoder)
        monkeypatch.setattr(state, "_decoder", spy)
        # 700 x 500 at (100, 50): columns 0..3, rows 0..2 of the 240 x 240 grid = 12 tiles.
        before = gpu.gpu_stats()
        out = _batched_host(s, (100, 50), 0, (700, 500), "rgb")
        after = gpu.gpu_stats()
    assert spy.calls == [12]
    assert after["batches"] - before["batches"] == 1
    assert after["batched_tiles"] - before["batched_tiles"] == 12
    with wsitool.open_slide(cmu1) as s:
        assert np.array_equal(out, s.read_region((100, 50), 0, (700, 500), mode="rgb"))


def test_caller_buffer_interior_direct_edges_roi(cmu1):
    pool = codec_pool.get_pool("cpu")
    with wsitool.open_slide(cmu1) as s:
        out = np.zeros((500, 700, 3), np.uint8)
        pool.reset_stats()
        res = _batched_host(s, (100, 50), 0, (700, 500), "rgb", out=out)
        stats = pool.stats()
    assert res is out
    # Tiles (1, 1) and (2, 1), at 240..720 x 240..480, lie wholly inside 100..800 x 50..550.
    assert stats.tiles_direct == 2 and stats.tiles_roi == 10 and stats.tiles_scratch == 0


@pytest.mark.parametrize("hook,value", [("force_scratch", True), ("roi_decode", False)])
def test_scratch_slots_give_the_same_pixels(cmu1, hook, value):
    with wsitool.open_slide(cmu1) as s:
        ref = s.read_region((100, 50), 0, (700, 500), mode="rgb")
        with decode_paths(**{hook: value}):
            pool = codec_pool.get_pool("cpu")
            pool.reset_stats()
            got = _batched_host(s, (100, 50), 0, (700, 500), "rgb")
            stats = pool.stats()
    assert np.array_equal(got, ref)
    assert stats.tiles_scratch == (12 if hook == "force_scratch" else 10)


def test_rgba_expands_on_the_target_with_transparent_outside(cmu1):
    with wsitool.open_slide(cmu1) as s:
        w0, h0 = s.dimensions
        got = _batched_host(s, (w0 - 100, h0 - 60), 0, (300, 200), "rgba")
        rgb = s.read_region((w0 - 100, h0 - 60), 0, (300, 200), mode="rgb")
    assert (got[:60, :100, 3] == 255).all() and (got[60:, :, 3] == 0).all() and (got[:, 100:, 3] == 0).all()
    assert (got[60:] == 0).all() and (got[:, 100:] == 0).all()
    assert np.array_equal(got[..., :3], rgb)


def test_ycbcr_after_decode_converted_like_the_cpu_path(monkeypatch):
    path = shared_sample(TCGA_J2K)
    with wsitool.open_slide(path) as s:
        lv = pyramid_levels(s)[1]
        # as for Aperio 33003
        monkeypatch.setattr(lv, "encoding", dataclasses.replace(lv.encoding, ycbcr_after_decode=True))
        loc = (int(500 * lv.downsample), int(300 * lv.downsample))
        for mode in ("rgb", "rgba", "raw"):
            ref = s.read_region(loc, 1, (400, 300), mode=mode)
            assert np.array_equal(_batched_host(s, loc, 1, (400, 300), mode), ref)
        plain = _batched_host(s, loc, 1, (400, 300), "rgb")
        monkeypatch.setattr(lv, "encoding", dataclasses.replace(lv.encoding, ycbcr_after_decode=False))
        assert not np.array_equal(plain, _batched_host(s, loc, 1, (400, 300), "rgb"))


def _truncate_tile(monkeypatch, bad_col, bad_row):
    real = gpu.read_tile_bytes

    def fake(level, index, col, row, stats):
        data = real(level, index, col, row, stats)
        if (col, row) == (bad_col, bad_row) and data is not None:
            return data[: len(data) // 3]  # header intact, entropy-coded data cut
        return data

    monkeypatch.setattr(gpu, "read_tile_bytes", fake)


def test_corrupt_tile_in_batch_raises_with_level_col_row(cmu1, monkeypatch):
    _truncate_tile(monkeypatch, 2, 1)
    with wsitool.open_slide(cmu1) as s, pytest.raises(TileDecodeError) as info:
        _batched_host(s, (100, 50), 0, (700, 500), "rgb")
    assert (info.value.level, info.value.col, info.value.row) == (0, 2, 1)


def test_corrupt_tile_in_batch_filled_others_intact(cmu1, monkeypatch):
    with wsitool.open_slide(cmu1) as s:
        ref = s.read_region((100, 50), 0, (700, 500), mode="rgba")
        _truncate_tile(monkeypatch, 2, 1)
        with pytest.warns(TileWarning, match="col 2, row 1"):
            got = _batched_host(s, (100, 50), 0, (700, 500), "rgba", on_error="fill")
    # tile (2, 1) covers level pixels 480..720 x 240..480 -> output rows 190..430, cols 380..620
    assert (got[190:430, 380:620] == 0).all()
    mask = np.ones(got.shape[:2], bool)
    mask[190:430, 380:620] = False
    assert np.array_equal(got[mask], ref[mask])


def test_unreadable_sample_raises_tile_error():
    path = shared_sample(UNREADABLE)
    with wsitool.open_slide(path) as s:
        with pytest.raises(TileDecodeError) as info:
            _batched_host(s, (0, 0), 0, (16, 16), "rgb")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TileWarning)
            filled = _batched_host(s, (0, 0), 0, (16, 16), "rgba", on_error="fill")
    assert (info.value.col, info.value.row) == (0, 0)
    assert (filled == 0).all()


class _InvertingDecoder(_SpyDecoder):
    """A decoder whose output disagrees with libjpeg-turbo (as a GPU decoder that
    ignored a colour flag would): every decoded image is inverted in place."""

    def decode(self, src, **kwargs):
        result = super().decode(src, **kwargs)
        for img in result if isinstance(result, list) else [result]:
            if img is not None:
                view = np.asarray(img)
                view[...] = 255 - view
        return result


def test_colour_check_moves_a_disagreeing_level_to_the_cpu(cmu1, monkeypatch):
    monkeypatch.setattr(gpu, "_colour_ok", {})
    pool = codec_pool.DecoderPool("cpu")  # stands for the GPU pool; the reference is get_pool("cpu")
    state = pool.state()
    spy = _InvertingDecoder(state.decoder)
    monkeypatch.setattr(state, "_decoder", spy)
    arrays = gpu.HostArrays()
    arrays.check_colour, arrays.device_key = True, "fake-gpu"
    before = gpu.gpu_stats()
    messages = []
    with wsitool.open_slide(cmu1) as s:
        for loc in ((100, 50), (1000, 900)):  # the second read skips the check (cached)
            ref = s.read_region(loc, 0, (700, 500), mode="rgb")
            req = region_request(pyramid_levels(s), loc, 0, (700, 500), mode="rgb")
            out = np.zeros((500, 700, 3), np.uint8)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                gpu.fill_region_batched(req, out, pool, arrays)
            assert np.array_equal(out, ref)
            messages += [str(c.message) for c in caught if issubclass(c.category, RuntimeWarning)]
    assert len(messages) == 1 and "differs from the CPU decode" in messages[0]
    assert len(spy.calls) == 1  # only the check's one-tile decode ran on the "GPU"
    assert gpu.gpu_stats()["levels_on_cpu"] - before["levels_on_cpu"] == 1


def test_colour_check_keeps_an_agreeing_level_on_the_device(cmu1, monkeypatch):
    monkeypatch.setattr(gpu, "_colour_ok", {})
    pool = codec_pool.DecoderPool("cpu")
    state = pool.state()
    spy = _SpyDecoder(state.decoder)
    monkeypatch.setattr(state, "_decoder", spy)
    arrays = gpu.HostArrays()
    arrays.check_colour, arrays.device_key = True, "fake-gpu"
    with wsitool.open_slide(cmu1) as s:
        ref = s.read_region((100, 50), 0, (700, 500), mode="rgb")
        req = region_request(pyramid_levels(s), (100, 50), 0, (700, 500), mode="rgb")
        out = np.zeros((500, 700, 3), np.uint8)
        gpu.fill_region_batched(req, out, pool, arrays)
    assert np.array_equal(out, ref)
    assert spy.calls == [1, 12]  # the check's tile, then the region's batch
    assert gpu._colour_ok[(str(cmu1), 0, "fake-gpu")] is True


def test_check_decoded_rejects_none_and_foreign_buffers(cmu1):
    with wsitool.open_slide(cmu1) as s:
        lv = pyramid_levels(s)[0]
        dst = np.zeros((240, 240, 3), np.uint8)
        image = nvimgcodec().as_image(dst)
        with pytest.raises(TileDecodeError, match="no image"):
            nvdecode.check_decoded(lv, 3, 4, None, image, dst.shape)
        other = nvimgcodec().as_image(np.zeros((240, 240, 3), np.uint8))
        with pytest.raises(TileDecodeError, match="did not write into the caller's buffer") as info:
            nvdecode.check_decoded(lv, 3, 4, other, image, dst.shape)
        assert (info.value.col, info.value.row) == (3, 4)
        with pytest.raises(TileDecodeError, match="did not write"):
            nvdecode.check_decoded(lv, 3, 4, image, image, (120, 240, 3))
        nvdecode.check_decoded(lv, 3, 4, image, image, dst.shape)  # its own buffer: ok


def test_gpu_check_scripts_are_ready():
    script = REPO / "scripts" / "gpu_check.sh"
    assert os.access(script, os.X_OK)
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_compare.py"), "--help"],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0 and "--device" in proc.stdout


def test_gpu_compare_diff_statistics():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gpu_compare
    finally:
        sys.path.pop(0)
    a = np.zeros((4, 4, 3), np.uint8)
    b = a.copy()
    b[0, 0, 0] = 3
    b[1, 1, 1] = 250  # wraps as uint8 if subtracted naively
    stats = gpu_compare.diff_stats(a, b)
    assert stats["max"] == 250 and stats["mean"] == pytest.approx(253 / 48)
    assert gpu_compare.verdict("JPEG", {"max": 4, "mean": 0.4})
    assert not gpu_compare.verdict("JPEG", {"max": 5, "mean": 0.1})
    assert not gpu_compare.verdict("APERIO_JP2000_RGB", {"max": 3, "mean": 0.1})
    assert gpu_compare.verdict("zstd", {"max": 0, "mean": 0.0})
    assert not gpu_compare.verdict("zstd", {"max": 1, "mean": 0.0})


# ------------------------- the CuPy-facing code, run with a numpy stand-in for CuPy


def _fake_cupy():
    """A minimal numpy-backed stand-in for the parts of CuPy that wsitool.read.cuda uses."""
    import contextlib
    import types

    class ndarray(np.ndarray):
        @property
        def device(self):
            return types.SimpleNamespace(id=0)

        def get(self):
            return np.array(self)

    class Stream:
        def __init__(self, non_blocking=False):
            self.ptr, self.waited, self.synced = 1234, 0, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def wait_event(self, event):
            self.waited += 1

        def synchronize(self):
            self.synced += 1

    class _Pool:
        def used_bytes(self):
            return 10

        def total_bytes(self):
            return 20

    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1, getDevice=lambda: 0, memGetInfo=lambda: (300, 1000),
        getDeviceProperties=lambda i: {"name": b"Fake H200"})
    cuda = types.SimpleNamespace(
        runtime=runtime, Stream=Stream, Device=lambda i=0: contextlib.nullcontext(),
        get_current_stream=lambda: types.SimpleNamespace(record=lambda: object()),
        memory=types.SimpleNamespace(OutOfMemoryError=MemoryError))
    mod = types.ModuleType("cupy")
    mod.ndarray = ndarray
    mod.cuda = cuda
    mod.uint8 = np.uint8
    mod.empty = lambda shape, dtype=np.float64: np.empty(shape, dtype).view(ndarray)
    mod.full = lambda shape, v, dtype: np.full(shape, v, dtype).view(ndarray)
    mod.asarray = lambda a: np.asarray(a).view(ndarray)
    mod.get_default_memory_pool = _Pool
    return mod


@pytest.fixture
def fake_cupy(monkeypatch):
    if HAS_CUDA:
        pytest.skip("a real CUDA device is present: the GPU tests cover this code")
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    device.cuda_probe.cache_clear()
    monkeypatch.setattr(cuda_arrays, "_local", threading.local())
    monkeypatch.setattr(gpu, "_colour_ok", {})
    monkeypatch.setattr(codec_pool, "_pools", PerProcess(codec_pool._Pools))

    def cpu_decoder(self):  # the "GPU" decoder is a CPU one here
        nv = nvimgcodec()
        return nv.Decoder(device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=1,
                          backends=[nv.Backend(nv.BackendKind.CPU_ONLY)])

    monkeypatch.setattr(codec_pool.DecoderPool, "_create_decoder", cpu_decoder)
    yield sys.modules["cupy"]
    device.cuda_probe.cache_clear()


def test_read_region_cuda_orchestration_with_stand_in(fake_cupy, cmu1):
    path = shared_sample(ZSTD)
    with wsitool.open_slide(cmu1) as s:
        for mode in ("rgb", "rgba", "raw"):
            ref = s.read_region((100, 50), 0, (700, 500), mode=mode)
            got = s.read_region((100, 50), 0, (700, 500), mode=mode, device="cuda")
            assert isinstance(got, fake_cupy.ndarray) and np.array_equal(got.get(), ref)
        out = fake_cupy.full((500, 700, 3), 9, np.uint8)
        assert s.read_region((100, 50), 0, (700, 500), mode="rgb", out=out, device="cuda:0") is out
        assert np.array_equal(out.get(), s.read_region((100, 50), 0, (700, 500), mode="rgb"))
        with pytest.raises(InvalidRegionError, match=r"cupy\.ndarray"):
            s.read_region((0, 0), 0, (700, 500), mode="rgb", out=np.zeros((500, 700, 3), np.uint8),
                          device="cuda")
        with pytest.raises(DeviceUnavailableError, match="cuda:3 requested"):
            s.read_region((0, 0), 0, (8, 8), device="cuda:3")
    arrays = cuda_arrays._local.arrays[0]
    assert arrays.stream.waited == arrays.stream.synced >= 4  # every read waited and synced
    assert codec_pool.get_pool("cuda:0").stats().tiles_decoded > 0
    if importlib_util.find_spec("imagecodecs"):
        with wsitool.open_slide(path) as s:  # a tifffile level: CPU decode, then copy
            ref = s.read_region((5000, 2000), 1, (300, 200), mode="rgba")
            got = s.read_region((5000, 2000), 1, (300, 200), mode="rgba", device="cuda")
        assert np.array_equal(got.get(), ref)


def test_gpu_memory_sample_and_report_with_stand_in(fake_cupy):
    assert gpu.gpu_memory_sample() == {"device": 0, "pool_used_bytes": 10, "pool_total_bytes": 20,
                                       "device_used_bytes": 700, "device_total_bytes": 1000}
    report = backends.backend_report(probe=False)
    hw = next(e for e in report if "hardware" in e["name"])
    assert "Fake H200" in hw["detail"] and "has a JPEG engine" in hw["detail"]


# ---------------------------------------------------------------- on a GPU


def _cupy():
    import cupy

    return cupy


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name,max_tol,mean_tol", [(CMU1, 4, 0.5), (TCGA_J2K, 2, 0.5),
                                                   (J2K_34712, 2, 0.5), (ZSTD, 0, 0.0)])
def test_gpu_matches_cpu_within_tolerance(name, max_tol, mean_tol):
    if name == ZSTD:
        pytest.importorskip("imagecodecs", reason="tifffile needs imagecodecs for zstd")
    cp = _cupy()
    path = shared_sample(name)
    rng = np.random.default_rng(3)
    with wsitool.open_slide(path) as s:
        for level, loc, w, h in _level_regions(s, rng, 4, 700):
            for mode in ("rgb", "rgba"):
                ref = s.read_region(loc, level, (w, h), mode=mode)
                got = s.read_region(loc, level, (w, h), mode=mode, device="cuda")
                assert isinstance(got, cp.ndarray) and got.shape == ref.shape
                assert got.dtype == ref.dtype
                diff = np.abs(cp.asnumpy(got).astype(np.int16) - ref.astype(np.int16))
                assert diff.max() <= max_tol and diff.mean() <= mean_tol + 1e-9
                if mode == "rgba":
                    assert np.array_equal(cp.asnumpy(got[..., 3]), ref[..., 3])


@needs_gpu
@pytest.mark.gpu
def test_gpu_out_buffer_honoured_and_decoded_in_place(cmu1):
    cp = _cupy()
    with wsitool.open_slide(cmu1) as s:
        out = cp.full((500, 700, 3), 9, cp.uint8)
        pool = codec_pool.get_pool(f"cuda:{cp.cuda.runtime.getDevice()}")
        pool.reset_stats()
        before = gpu.gpu_stats()
        res = s.read_region((100, 50), 0, (700, 500), mode="rgb", out=out, device="cuda")
        stats, after = pool.stats(), gpu.gpu_stats()
        ref = s.read_region((100, 50), 0, (700, 500), mode="rgb")
        with pytest.raises(InvalidRegionError, match=r"cupy\.ndarray"):
            s.read_region((0, 0), 0, (700, 500), mode="rgb", out=np.zeros((500, 700, 3), np.uint8),
                          device="cuda")
        with pytest.raises(InvalidRegionError, match="shape"):
            s.read_region((0, 0), 0, (70, 50), mode="rgb", out=out, device="cuda")
    assert res is out
    assert after["batches"] - before["batches"] == 1
    # every tile on the GPU, straight into the caller's CuPy buffer (no scratch, no CPU fallback)
    assert stats.tiles_decoded == 12 and stats.tiles_direct + stats.tiles_roi == 12
    assert stats.tiles_scratch == 0
    assert after["tiles_cpu_fallback"] == before["tiles_cpu_fallback"]
    assert np.abs(cp.asnumpy(out).astype(int) - ref).max() <= 4


@needs_gpu
@pytest.mark.gpu
def test_gpu_corrupt_tile_raises_with_position():
    path = shared_sample(UNREADABLE)
    with wsitool.open_slide(path) as s, pytest.raises(TileDecodeError) as info:
        s.read_region((0, 0), 0, (16, 16), device="cuda")
    assert (info.value.level, info.value.col, info.value.row) == (0, 0, 0)


@needs_gpu
@pytest.mark.gpu
def test_gpu_threads_agree_with_serial(cmu1):
    cp = _cupy()
    rng = np.random.default_rng(11)
    with wsitool.open_slide(cmu1) as s:
        regions = random_regions(rng, s.dimensions[0], s.dimensions[1], 24, max_size=600)
        serial = [cp.asnumpy(s.read_region((x, y), 0, (w, h), mode="rgb", device="cuda"))
                  for x, y, w, h in regions]
        results: dict[int, np.ndarray] = {}
        errors: list[BaseException] = []

        def work(k):
            try:
                for i in range(k, len(regions), 8):
                    x, y, w, h = regions[i]
                    results[i] = cp.asnumpy(s.read_region((x, y), 0, (w, h), mode="rgb", device="cuda"))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    for i, ref in enumerate(serial):
        assert np.array_equal(results[i], ref)


@needs_gpu
@pytest.mark.gpu
def test_gpu_memory_sample_and_backend_report():
    sample = gpu.gpu_memory_sample()
    assert sample["device_total_bytes"] > sample["device_used_bytes"] > 0
    assert sample["pool_total_bytes"] >= sample["pool_used_bytes"] >= 0
    report = backends.backend_report()
    nvjpeg = next(e for e in report if e["name"] == "CUDA: nvJPEG")
    assert nvjpeg["available"], nvjpeg["detail"]
