"""wsitool stress: output folders checked first, per-worker warm-up, slope interval,
and the ``inconclusive`` verdict (issue 14 item 13); usage errors exit 2 (item 10)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from wsitool.cli import app
from wsitool.stress import (
    EXIT_CODES,
    LEAK_SLOPE_MB_PER_1K,
    MIN_MEASURED_ITERATIONS,
    MIN_MEASURED_SAMPLES,
    OK_SLOPE_MB_PER_1K,
    WARMUP_READS_PER_WORKER,
    report_schema,
    validate_report,
)
from wsitool.stress.faults import FAULT_ENV
from wsitool.stress.memory import memory_verdict, slope_ci95

from helpers import REPO, REPO_SAMPLES, SHARED_SAMPLES, shared_sample

JPEG = str(REPO_SAMPLES / "sample-aperio-jpeg.svs")
runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_fault(monkeypatch):
    monkeypatch.delenv(FAULT_ENV, raising=False)


def invoke(args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("option", ["--report", "--plot"])
@pytest.mark.parametrize("where", ["missing", "readonly", "directory"])
def test_report_and_plot_folders_are_checked_before_the_run(tmp_path, option, where):
    pytest.importorskip("matplotlib")
    if where == "missing":
        target = tmp_path / "no-such-folder" / "out.png"
    elif where == "readonly":
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o555)
        target = folder / "out.png"
        import os
        if os.access(folder, os.W_OK):  # root ignores permissions
            pytest.skip("running as root: a read-only folder is still writable")
    else:
        target = tmp_path / "adir.png"
        target.mkdir()
    t0 = time.monotonic()
    res = invoke(["stress", JPEG, "--iterations", "200000", option, target])
    assert res.exit_code == 9, res.output
    assert time.monotonic() - t0 < 30  # refused before 200,000 reads
    assert str(target) in res.output and option in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("args", [["--iterations", "0"], ["--region-size", "0"], ["--warmup", "1.5"],
                                  ["--warmup", "-0.1"], ["--duration", "0"], ["--workers", "0"],
                                  ["--verify-every", "0"], ["--seed", "-1"]])
def test_bad_stress_options_are_usage_errors(args):
    res = invoke(["stress", JPEG, *args])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("wsitool: error:"), res.output


def test_slope_interval_brackets_the_slope():
    xs = list(range(0, 2000, 100))
    ys = [50.0 + 0.002 * x + (0.3 if i % 2 else -0.3) for i, x in enumerate(xs)]
    lo, hi = slope_ci95(xs, ys)
    assert lo < 0.002 < hi and hi - lo < 0.001
    flat = [50.0 + (0.3 if i % 2 else -0.3) for i in range(len(xs))]
    lo, hi = slope_ci95(xs, flat)
    assert lo < 0 < hi
    assert slope_ci95([1, 2], [1, 2]) is None


def _measured(n: int, every: int = 200) -> list[dict]:
    """``n`` measured samples, ``every`` iterations apart."""
    return [{"iterations": 1000 + i * every} for i in range(n)]


def _per_it(lo_mb_per_1k: float, hi_mb_per_1k: float) -> tuple[float, float]:
    """A slope interval in MiB per 1,000 iterations as memory_verdict takes it (per iteration)."""
    return lo_mb_per_1k / 1000.0, hi_mb_per_1k / 1000.0


def test_memory_verdict_rules():
    """The documented rules (wsitool.stress.memory.memory_verdict), one case each."""
    enough = _measured(MIN_MEASURED_SAMPLES)
    # 1. growth over the limit, rising steadily (or too few samples for an interval): leak
    assert memory_verdict(enough, 100.0, None, _per_it(0.01, 0.02), 64, 8)[0] == "leak"
    assert memory_verdict(enough[:2], 100.0, None, None, 64, 8)[0] == "leak"
    assert memory_verdict(enough, 1.0, 200.0, None, 64, 8)[0] == "leak"  # GPU memory
    # 2. too few samples or iterations after warm-up: inconclusive, whatever the slope
    short = memory_verdict(enough[:1], 1.0, None, None, 64, 64)
    assert short[0] == "inconclusive" and "64 workers" in short[1]
    few = memory_verdict(enough[:MIN_MEASURED_SAMPLES - 1], 0.1, None, _per_it(-0.1, 0.1), 64, 8)
    assert few[0] == "inconclusive" and "run longer" in few[1]
    dense = _measured(50, every=(MIN_MEASURED_ITERATIONS - 1) // 49)  # many samples, too few iterations
    assert memory_verdict(dense, 0.1, None, _per_it(-0.1, 0.1), 64, 8)[0] == "inconclusive"
    # 3. the interval wholly above the leak threshold: leak, even with growth under the limit
    small_leak = memory_verdict(enough, 20.0, None, _per_it(LEAK_SLOPE_MB_PER_1K + 0.1, 19.3), 64, 8)
    assert small_leak[0] == "leak" and "lies above" in small_leak[1]
    # 4. ok only with the upper bound under the ok threshold and growth within the limit
    assert memory_verdict(enough, 3.0, None, _per_it(-0.01, OK_SLOPE_MB_PER_1K - 0.01), 64, 8) == ("ok", None)
    # 5. otherwise inconclusive: a step over the limit, or an interval between the thresholds
    step = memory_verdict(enough, 100.0, None, _per_it(-0.01, 0.02), 64, 8)
    assert step[0] == "inconclusive" and "steadily" in step[1]
    between = memory_verdict(enough, 3.0, None, _per_it(0.5, OK_SLOPE_MB_PER_1K + 0.5), 64, 8)
    assert between[0] == "inconclusive" and "noise" in between[1]
    wide = memory_verdict(enough, 3.0, None, _per_it(-5.0, 5.0), 64, 8)
    assert wide[0] == "inconclusive"


def test_issue_24_leak_is_never_ok():
    """The leak of issue 24 measured +19.1 MB / 1k (interval +18.9 to +19.3) with growth
    under the 64 MB limit and said ok: a 15 s run (a few hundred iterations measured) is now
    inconclusive, and a run that measures 1,000 iterations or more says leak."""
    short = memory_verdict(_measured(40, every=10), 4.0, None, _per_it(18.9, 19.3), 64, 16)
    assert short[0] == "inconclusive"
    long = memory_verdict(_measured(40, every=70), 52.0, None, _per_it(18.9, 19.3), 64, 16)
    assert long[0] == "leak"


def _section(curve, n: int = 200, last: int = 10000, workers: int = 16) -> dict:
    """The memory section of ``n`` synthetic samples up to ``last`` iterations, RSS
    ``curve(iterations)`` MiB plus a small deterministic jitter, warm-up at 10 %."""
    from wsitool.stress.memory import WarmUp, memory_section

    samples = []
    for i in range(n + 1):
        it = round(last * i / n)
        jitter = 0.02 * ((i * 7919) % 13 - 6) / 6
        samples.append({"t": i * 0.1, "iterations": it, "rss": (curve(it) + jitter) * 1048576,
                        "min_worker_reads": it // workers})
    return memory_section(samples, WarmUp(20 * workers, last // 10, None), 0.1, 64, workers)


def test_plateau_test_extends_warm_up_for_a_slowing_rise_never_for_a_leak():
    """Threads still growing their buffers after the fixed warm-up make RSS rise ever more
    slowly: the plateau test moves the start on (at most to half the run) and the rest is
    ok.  A steady leak, alone or on top of such a rise, is measured from the fixed warm-up
    and stays a leak."""
    import math

    slowing = _section(lambda it: 100 + 12 * (1 - math.exp(-it / 1800)))
    assert slowing["warmup_plateau_iterations"] > 0
    assert slowing["warmup_iterations"] <= 5000
    assert slowing["verdict"] == "ok", slowing["note"]
    leak = _section(lambda it: 100 + 0.004 * it)  # 4 MB / 1,000 iterations
    assert leak["warmup_plateau_iterations"] == 0 and leak["warmup_iterations"] == 1000
    assert leak["verdict"] == "leak" and "lies above" in leak["note"]
    both = _section(lambda it: 100 + 12 * (1 - math.exp(-it / 1800)) + 0.003 * it)
    assert both["verdict"] == "leak", both["note"]


def test_every_worker_reads_before_memory_is_measured():
    """Warm-up lasts until each worker has read WARMUP_READS_EACH times (a thread that starts
    late makes its decoders late), and a slope needs 50 reads per worker measured."""
    from wsitool.stress.memory import WARMUP_READS_EACH, WarmUp, min_measured_iterations

    warm = WarmUp(per_worker=320, iterations=1000, seconds=None)
    assert not warm.over({"iterations": 5000, "t": 9.0, "min_worker_reads": WARMUP_READS_EACH - 1})
    assert warm.over({"iterations": 5000, "t": 9.0, "min_worker_reads": WARMUP_READS_EACH})
    assert not warm.over({"iterations": 999, "t": 9.0, "min_worker_reads": 50})
    assert min_measured_iterations(16) == MIN_MEASURED_ITERATIONS
    assert min_measured_iterations(64) == 64 * 50 > MIN_MEASURED_ITERATIONS
    meas = _measured(40, every=75)  # 2,925 iterations: enough for 16 workers, not for 64
    assert memory_verdict(meas, 1.0, None, _per_it(-0.1, 0.1), 64, 16)[0] == "ok"
    assert memory_verdict(meas, 1.0, None, _per_it(-0.1, 0.1), 64, 64)[0] == "inconclusive"


def test_too_short_for_its_workers_is_inconclusive_exit_15(tmp_path):
    """64 workers, 300 iterations: fewer than WARMUP_READS_PER_WORKER reads a worker, so
    memory cannot be judged: 'inconclusive' (15), neither 'leak' nor 'ok'."""
    report = tmp_path / "r.json"
    res = invoke(["stress", JPEG, "--workers", "64", "--iterations", "300", "--region-size", "96",
                  "--sample-interval", "0.05", "--report", report])
    assert res.exit_code == EXIT_CODES["inconclusive"] == 15, res.output
    d = json.loads(report.read_text())
    validate_report(d)
    assert d["verdict"] == "inconclusive" and d["problems"] == ["inconclusive"]
    assert d["memory"]["verdict"] == "inconclusive" and "run longer" in d["memory"]["note"]
    assert d["memory"]["warmup_reads_per_worker"] == WARMUP_READS_PER_WORKER
    assert d["exit_code"] == 15


def _noisy(last: int, seed: int = 5, workers: int = 16, every: int = 50) -> dict:
    """A clean run's memory section: flat RSS plus allocator-like noise (2 MiB), a sample every
    ``every`` iterations up to ``last``, warm-up at 10 %."""
    import numpy as np

    from wsitool.stress.memory import WarmUp, memory_section

    rng = np.random.default_rng(seed)
    samples = [{"t": it / 400.0, "iterations": it, "rss": (100 + 2.0 * rng.standard_normal()) * 1048576,
                "min_worker_reads": it // workers} for it in range(0, last + 1, every)]
    return memory_section(samples, WarmUp(20 * workers, last // 10, None), 0.1, 64, workers)


def test_an_inconclusive_run_says_how_many_iterations_a_verdict_needs_and_that_many_suffice():
    """A clean run too short for its noise is inconclusive; its note names the iterations a verdict
    needs on this slide (and the seconds at its pace), and a run that long of the same slide
    decides ok (issue 49: `stress --iterations 3000` exited 15 with 'run longer' and no number)."""
    short = _noisy(3000)
    assert short["verdict"] == "inconclusive", short
    need = short["iterations_needed"]
    assert need > 3000 and need % 1000 == 0
    assert f"--iterations {need:,}" in short["note"] and " s at this run's " in short["note"]
    for seed in (4, 6, 8):  # (other runs of the same slide: the same noise, other draws)
        again = _noisy(need, seed=seed)
        assert again["verdict"] == "ok", (need, seed, again["slope_ci95_mb_per_1k"], again["note"])
    validate_report_memory = report_schema()["properties"]["memory"]
    assert "iterations_needed" in validate_report_memory["properties"]


def test_too_few_iterations_after_warm_up_names_the_count_too():
    few = _noisy(1000, every=25, workers=64)  # 64 workers need 3,200 measured iterations
    assert few["verdict"] == "inconclusive" and "run longer" in few["note"]
    assert few["iterations_needed"] >= 64 * 50 / 0.9 and f"--iterations {few['iterations_needed']:,}" in few["note"]


def test_schema_knows_inconclusive():
    schema = report_schema()
    assert "inconclusive" in schema["$defs"]["verdict"]["enum"]
    assert schema["properties"]["exit_code"]["enum"] == sorted(EXIT_CODES.values())


def test_many_workers_on_bench_slide_are_not_a_false_leak(tmp_path):
    """Issue 14: 64 workers, 3,000 iterations on a bench slide reported +70-94 MB
    'leak' (exit 10) because a 10 % warm-up gave each worker about 5 reads.
    The per-worker warm-up measures the steady state: ok, with a slope interval."""
    shared_sample("aperio-cmu1-small-region-jpeg.svs")
    slide = tmp_path / "bench.svs"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_bench_slide.py"), str(slide),
                    "--width", "8000", "--height", "6000", "--samples", str(SHARED_SAMPLES)],
                   check=True, capture_output=True, timeout=120)
    report = tmp_path / "r.json"
    res = invoke(["stress", slide, "--workers", "64", "--iterations", "3000", "--report", report])
    d = json.loads(report.read_text())
    mem = d["memory"]
    # never a leak; "inconclusive" only when the threads were scheduled so unevenly
    # that warm-up took nearly the whole run
    assert res.exit_code in (0, 15), (res.output, mem["growth_mb"], mem["note"])
    assert d["verdict"] == mem["verdict"] in ("ok", "inconclusive")
    if mem["verdict"] == "ok":
        assert mem["growth_mb"] < mem["max_growth_mb"]
        if mem["samples_measured"] >= 3:
            lo, hi = mem["slope_ci95_mb_per_1k"]
            assert lo <= mem["slope_mb_per_1k"] <= hi
    first = next(s for s in mem["samples"] if s["measured"]) if mem["samples_measured"] else None
    if first is not None:
        assert first["iterations"] >= 64 * WARMUP_READS_PER_WORKER  # not the 10 % alone


def test_samples_reach_the_parent_in_the_order_they_were_taken(monkeypatch):
    """The fault path samples from a worker thread while the sampler thread samples too: a
    sample taken first but sent second made ``measured_iterations`` negative (seen in CI as
    a report that failed its schema)."""
    import io
    import json
    import threading

    from wsitool.stress import worker as worker_mod

    cfg = {"levels": [{"index": 0}], "mode": "rgb", "device": "cpu", "read_threads": 1, "seed": 1,
           "verify_every": 10, "iterations": 100, "duration": None, "workers": 1}
    pipe = io.BytesIO()
    w = worker_mod.Workload(cfg, slide=None, pipe=pipe)
    blocked, go = threading.Event(), threading.Event()
    real_rss = worker_mod.rss

    def slow_first_rss():
        if not blocked.is_set():  # the first sample stalls after it counted the iterations
            blocked.set()
            go.wait(5)
        return real_rss()

    monkeypatch.setattr(worker_mod, "rss", slow_first_rss)
    first = threading.Thread(target=w.sample)
    first.start()
    assert blocked.wait(5)
    with w.claim_lock:
        w.completed = 5
    second = threading.Thread(target=w.sample)
    second.start()
    second.join(0.3)
    go.set()
    first.join(5)
    second.join(5)
    sent = [json.loads(line)["iterations"] for line in pipe.getvalue().decode().splitlines()]
    assert sent == [0, 5]
