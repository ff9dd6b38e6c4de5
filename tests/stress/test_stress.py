"""Tests of ``wsitool stress`` (the wsitool/stress/ package).

Short runs (a few hundred iterations, small regions) on the repo's own samples;
each failure kind is injected through the test-only ``WSITOOL_STRESS_FAULT``
variable that the child process honours, and must show in the verdict, the
report and the exit code.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from wsitool import open_slide
from wsitool.cli import app
from wsitool.errors import InvalidOptionError
from wsitool.slide import pyramid_levels
from wsitool.stress import EXIT_CODES, report_schema, run_stress, validate_report
from wsitool.stress.faults import FAULT_ENV
from wsitool.stress.regions import checksum, region_for, size_bounds

from helpers import REPO_SAMPLES, shared_sample

runner = CliRunner()

JPEG = REPO_SAMPLES / "sample-aperio-jpeg.svs"
OME = REPO_SAMPLES / "sample-ome-pyramid.ome.tif"
SHORT = ["--workers", "8", "--iterations", "300", "--region-size", "128", "--sample-interval", "0.05"]


def invoke(args, fault=None):
    env = {FAULT_ENV: fault} if fault else {FAULT_ENV: ""}
    return runner.invoke(app, [str(a) for a in args], env=env)


def load(path):
    data = json.loads(path.read_text())
    validate_report(data)
    return data


@pytest.fixture(autouse=True)
def _no_fault(monkeypatch):
    monkeypatch.delenv(FAULT_ENV, raising=False)


#: long enough to be judged ok: 10 samples over 1,000 iterations after warm-up, and enough
#: more that a step of the allocator's heap (a few hundred KiB) keeps the slope under 1 MB / 1k
CLEAN = ["--workers", "4", "--iterations", "4000", "--region-size", "128", "--sample-interval", "0.02"]


def test_clean_run_passes_with_valid_report_and_plot(tmp_path):
    report, plot = tmp_path / "r.json", tmp_path / "rss.png"
    res = invoke(["stress", JPEG, *CLEAN, "--verify-every", "3", "--report", report, "--plot", plot])
    assert res.exit_code == 0, res.output
    d = load(report)
    assert d["verdict"] == "ok" and d["problems"] == [] and d["exit_code"] == 0
    assert d["run"]["iterations_completed"] == 4000
    assert d["run"]["reads_ok"] == 4000
    assert d["run"]["fault_injected"] is None
    # every level read, every 3rd iteration verified by the fresh reader
    assert sorted(d["run"]["reads_by_level"]) == ["0", "1", "2"]
    assert sum(d["run"]["reads_by_level"].values()) == 4000
    assert d["verification"]["checked"] == 1334
    assert d["verification"]["mismatches"] == 0
    mem = d["memory"]
    th = mem["thresholds"]
    assert mem["samples_measured"] >= th["min_measured_samples"]
    assert mem["measured_iterations"] >= th["min_measured_iterations"]
    assert mem["growth_mb"] is not None and mem["growth_mb"] <= mem["max_growth_mb"]
    assert mem["slope_ci95_mb_per_1k"][1] < th["ok_slope_mb_per_1k"]
    assert mem["samples"][-1]["iterations"] == 4000
    dec = d["decoder"]
    # per worker thread that decoded: the compiled loop's decoder and the Python path's
    assert 1 <= dec["decoders_created"] <= 2 * 4
    assert dec["tiles_decoded"] > 0
    # mode rgb: nvImageCodec tiles land straight in the workers' buffers, but for the
    # one-column windows at a tile's left edge, decoded whole and cropped (1 in a few hundred)
    assert dec["tiles_direct"] + dec["tiles_roi"] + dec["tiles_scratch"] == dec["tiles_decoded"]
    assert dec["tiles_scratch"] * 100 <= dec["tiles_decoded"]
    assert d["crash"] is None
    # the plot is a real PNG of a plausible size
    raw = plot.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    import imagecodecs

    img = imagecodecs.png_decode(raw)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert "ok" in res.output


def test_api_generic_tiff_levels_duration_and_progress():
    seen = []
    rep = run_stress(OME, workers=4, duration=1.0, region_size=96, levels="0,1",
                     verify_every=2, sample_interval=0.05, progress=seen.append,
                     samplers=["os:getloadavg"])  # returns a tuple: a broken sampler
    d = rep.to_dict()
    validate_report(d)
    # a 1 s run is judged only when it measured enough; never a leak, an error or a mismatch
    mem = d["memory"]
    assert rep.verdict in ("ok", "inconclusive") and rep.exit_code == EXIT_CODES[rep.verdict]
    if rep.verdict == "inconclusive":
        th = mem["thresholds"]
        assert (mem["samples_measured"] < th["min_measured_samples"]
                or mem["measured_iterations"] < th["min_measured_iterations"]), mem["note"]
    assert d["config"]["iterations"] is None and d["config"]["duration_s"] == 1.0
    assert d["run"]["iterations_completed"] > 0
    assert set(d["run"]["reads_by_level"]) <= {"0", "1"}
    assert d["decoder"]["tiles_generic"] > 0  # deflate tiles go through tifffile
    assert d["verification"]["checked"] > 0 and d["verification"]["mismatches"] == 0
    # the default extra sampler sees the 4 workers; the broken one is reported, not fatal
    extra = d["memory"]["samples"][-1]["extra"]
    assert extra["threads"] >= 4 + 1 and extra["open_fds"] > 0
    assert "os:getloadavg" in d["sampler_errors"]
    assert d["config"]["samplers"][-1] == "os:getloadavg"
    assert seen and seen[-1].phase == "done"
    assert seen[-1].iterations == d["run"]["iterations_completed"]


def test_regions_are_seeded_and_cover_edges_and_outside():
    with open_slide(JPEG) as s:
        levels = [{"index": lv.index, "width": lv.width, "height": lv.height,
                   "downsample": lv.downsample} for lv in pyramid_levels(s)]
    regs = [region_for(7, i, levels, 200) for i in range(2000)]
    assert regs == [region_for(7, i, levels, 200) for i in range(2000)]
    assert regs != [region_for(8, i, levels, 200) for i in range(2000)]
    lo, hi = size_bounds(200)
    assert all(lo <= w <= hi and lo <= h <= hi for _, _, _, w, h in regs)
    assert {lv for lv, *_ in regs} == {0, 1, 2}
    outside_left = right_edge = inside = 0
    for lv, x0, y0, w, h in regs:
        L = levels[lv]
        # the product's mapping of a level-0 location to the level (nearest pixel)
        xl = math.floor(x0 / L["downsample"] + 0.5)
        yl = math.floor(y0 / L["downsample"] + 0.5)
        outside_left += xl < 0 or yl < 0
        right_edge += xl + w > L["width"] or yl + h > L["height"]
        inside += 0 <= xl and 0 <= yl and xl + w <= L["width"] and yl + h <= L["height"]
    assert outside_left > 100 and right_edge > 100 and inside > 100


def test_leaking_reader_gives_leak(tmp_path):
    report = tmp_path / "r.json"
    # 900 iterations: the warm-up ends once every worker made its decoder, which on a
    # loaded machine can be late in a 300-iteration run (then under 64 leaking reads
    # are measured, under the 16 MB line); 900 leave hundreds measured whatever the load
    leak_run = [*SHORT[:2], "--iterations", "900", *SHORT[4:]]
    res = invoke(["stress", JPEG, *leak_run, "--max-growth-mb", "16", "--report", report], fault="leak")
    assert res.exit_code == EXIT_CODES["leak"] == 10, res.output
    d = load(report)
    assert d["verdict"] == "leak" and d["problems"] == ["leak"]
    assert d["run"]["fault_injected"] == "leak"
    mem = d["memory"]
    # the post-warm-up reads each keep >= 256 KiB alive
    assert mem["growth_mb"] > 16
    assert mem["slope_mb_per_1k"] > 100
    assert mem["rss_peak_mb"] >= mem["rss_end_mb"] > mem["rss_start_mb"]


def test_corrupting_reader_gives_mismatch_with_coordinates(tmp_path):
    report = tmp_path / "r.json"
    res = invoke(["stress", JPEG, *SHORT, "--verify-every", "2", "--report", report], fault="corrupt")
    assert res.exit_code == EXIT_CODES["mismatch"] == 11, res.output
    d = load(report)
    assert d["verdict"] == "mismatch"
    ver = d["verification"]
    assert 0 < ver["mismatches"] < ver["checked"]  # some reads, from some threads
    listed = ver["first_mismatches"]
    assert 0 < len(listed) <= 10
    assert all(m["worker"] % 2 == 1 for m in listed)
    # the listed coordinates reproduce: a fresh read gives the expected digest
    with open_slide(JPEG) as s:
        for m in listed[:3]:
            arr = s.read_region((m["x"], m["y"]), m["level"], (m["width"], m["height"]), mode="rgb",
                                threads=1)
            assert checksum(arr) == m["expected"] != m["checksum"]


def test_segfaulting_child_gives_crash(tmp_path):
    report = tmp_path / "r.json"
    res = invoke(["stress", JPEG, *SHORT, "--report", report], fault="segv")
    assert res.exit_code == EXIT_CODES["crash"] == 13, res.output
    d = load(report)
    assert d["verdict"] == "crash"
    crash = d["crash"]
    assert crash["kind"] == "signal" and crash["signal"] == "SIGSEGV" and crash["exit_status"] == -11
    assert 0 < crash["last_progress"]["iterations"] < 300
    assert "Segmentation fault" in crash["stderr_tail"]  # faulthandler's dump of the threads
    assert "SIGSEGV" in res.output


def test_hung_child_gives_hang(tmp_path):
    report = tmp_path / "r.json"
    res = invoke(["stress", JPEG, *SHORT, "--stall-timeout", "2", "--report", report], fault="hang")
    assert res.exit_code == EXIT_CODES["hang"] == 14, res.output
    d = load(report)
    assert d["verdict"] == "hang" and d["crash"]["kind"] == "hang"
    assert d["run"]["iterations_completed"] < 300


def test_unreadable_tiles_give_read_errors(tmp_path):
    slide = shared_sample("broken-aperio-unreadable-jpeg.svs")
    report = tmp_path / "r.json"
    res = invoke(["stress", slide, "--workers", "4", "--iterations", "100", "--region-size", "8",
                  "--report", report])
    assert res.exit_code == EXIT_CODES["error"] == 12, res.output
    d = load(report)
    assert d["verdict"] == "error"
    assert 0 < d["errors"]["count"] <= 100
    first = d["errors"]["first"][0]
    assert first["type"] == "TileDecodeError" and "tile (col 0, row 0)" in first["message"]


def test_bad_arguments(monkeypatch, tmp_path):
    res = invoke(["stress", JPEG, "--iterations", "10", "--duration", "1"])
    assert res.exit_code == 2
    res = invoke(["stress", JPEG, "--iterations", "10", "--plot", tmp_path / "rss.bmp"])
    assert res.exit_code == 2 and "unknown plot extension" in res.output
    import wsitool.stress

    monkeypatch.setattr(wsitool.stress, "plot_available", lambda: False)
    res = invoke(["stress", JPEG, "--iterations", "10", "--plot", tmp_path / "rss.png"])
    assert res.exit_code == 2 and "pip install 'wsitool[plot]'" in res.output
    assert not (tmp_path / "rss.png").exists()
    res = invoke(["stress", JPEG, "--levels", "0,7", "--iterations", "10"])
    assert res.exit_code == 5 and "level 7 out of range" in res.output
    with pytest.raises(InvalidOptionError, match="workers must be >= 1"):
        run_stress(JPEG, workers=0)
    res = invoke(["stress", REPO_SAMPLES / "no-such.svs", "--iterations", "10"])
    assert res.exit_code == 9


def test_cuda_without_gpu_is_one_line():
    from wsitool.ground.device import cuda_available

    if cuda_available():
        pytest.skip("a CUDA device is present")
    res = invoke(["stress", JPEG, "--iterations", "10", "--device", "cuda"])
    assert res.exit_code == 8
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no CUDA device available" in lines[0]


def test_schema_rejects_a_broken_report():
    import jsonschema

    schema = report_schema()
    assert schema["properties"]["exit_code"]["enum"] == sorted(EXIT_CODES.values())
    with pytest.raises(jsonschema.ValidationError):
        validate_report({"verdict": "fine"})


def test_reader_ignoring_out_buffer_is_a_read_error():
    """In-process: a reader that returns a new array instead of filling out= is caught."""
    import io

    from wsitool.stress.worker import Workload

    class NewArrayReader:
        def read_region(self, location, level, size, *, out=None, **kw):
            return np.zeros_like(out)

    cfg = {"levels": [{"index": 0, "width": 100, "height": 80, "downsample": 1.0}], "mode": "rgb",
           "device": "cpu", "read_threads": 1, "seed": 0, "verify_every": 1, "iterations": 20,
           "duration": None, "workers": 2, "region_size": 16, "size_bounds": list(size_bounds(16)),
           "channels": 3, "dtype": "|u1", "itemsize": 1, "sample_interval": 0.05, "samplers": [],
           "warmup_iterations": 2}
    pipe = io.BytesIO()
    pipe.close = lambda: None
    Workload(cfg, NewArrayReader(), pipe).run()
    msgs = [json.loads(line) for line in pipe.getvalue().splitlines()]
    assert msgs[-1]["type"] == "done" and msgs[-1]["errors"] == 20
    listed = [e for m in msgs if m["type"] == "sample" for e in m["error_list"]]
    assert listed and listed[0]["type"] == "OutBufferIgnored"
    assert not [r for m in msgs if m["type"] == "sample" for r in m["verify"]]


def test_nvimagecodec_reads_do_not_accumulate_python_objects():
    """Regression for the leak ``wsitool stress`` found: reading
    ``Image.__array_interface__`` after each decode leaked one Python int per
    tile (nvImageCodec 0.9.0); 600 tile decodes must not grow the traced heap."""
    import tracemalloc

    with open_slide(JPEG) as s:
        whole = np.empty((256, 256, 3), np.uint8)  # tile (0, 0) exactly
        part = np.empty((256, 192, 3), np.uint8)  # a sub-region of it (ROI decode)
        for _ in range(300):  # warm up the decoder and pybind11's caches
            s.read_region((0, 0), 0, (256, 256), out=whole, mode="rgb", threads=1)
            s.read_region((64, 0), 0, (192, 256), out=part, mode="rgb", threads=1)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(300):
                s.read_region((0, 0), 0, (256, 256), out=whole, mode="rgb", threads=1)
                s.read_region((64, 0), 0, (192, 256), out=part, mode="rgb", threads=1)
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    assert grown < 600 * 32 // 4, f"{grown} bytes of Python objects kept by 600 decodes"


def test_gpu_memory_growth_is_summarised_for_the_leak_verdict():
    """device='cuda' runs sample wsitool.read.cuda.gpu_memory_sample; its growth after
    warm-up is reported and compared with max_growth_mb like RSS."""
    from wsitool.stress import SAMPLERS
    from wsitool.stress.memory import gpu_growth

    assert "wsitool.read.cuda_arrays:gpu_memory_sample" in SAMPLERS["cuda"]
    assert "wsitool.read.cuda_arrays:gpu_memory_sample" not in SAMPLERS["cpu"]
    mib = 1024 * 1024
    measured = [
        {"extra": {"pool_used_bytes": 10 * mib + i * 50 * mib, "device_used_bytes": 500 * mib}}
        for i in range(4)
    ]
    gpu = gpu_growth(measured)
    assert gpu["pool_used_growth_mb"] == 150.0 and gpu["device_used_growth_mb"] == 0.0
    assert gpu["pool_used_start_mb"] == 10.0
    assert gpu_growth([{"extra": {"threads": 3}}, {}]) is None
