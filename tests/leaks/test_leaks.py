"""No decode path leaks memory: one child process per path measures the RSS slope, then proves a leak of
1 KiB would show.

What is measured, and the thresholds, are in ``tests/leaks/leakcheck.py``
(:func:`leakcheck.measure`): a path passes when the 95 % interval of its RSS
slope lies below :data:`leakcheck.THRESHOLD_BYTES_PER_STEP` bytes per step,
and its leaking variant (1 KiB of native memory kept per call of a function
on the path) must then lie above it, each after at least :data:`leakcheck.MIN_STEPS`
measured steps (the time taken is not asserted: a shared CI machine measures
longer).  The children run two at a time (the paths are independent processes;
RSS is per process).
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

import leakcheck
from helpers import REPO

# RSS slopes: run on their own, not beside other tests (`pytest -m leak`; the README's test command)
pytestmark = pytest.mark.leak

SCRIPT = REPO / "tests" / "leaks" / "leakcheck.py"
PATHS = list(leakcheck.PATHS)


def _run(name: str) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPT), name], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    if proc.returncode != 0:
        return {"path": name, "error": proc.stderr[-3000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def results() -> dict:
    with ThreadPoolExecutor(max_workers=2) as pool:
        return {r["path"]: r for r in pool.map(_run, PATHS)}


@pytest.mark.parametrize("path", PATHS)
def test_path_does_not_leak_and_a_leak_would_show(results, path):
    r = results[path]
    assert "error" not in r, r.get("error")
    if "skip" in r:
        pytest.skip(r["skip"])
    clean, leaky = r["clean"], r["injected"]
    assert clean["verdict"] == "clean", (path, clean)
    # the threshold: THRESHOLD_BYTES_PER_STEP, or a path's own where one step calls
    # the wrapped function many times (an export: the box filter ~18 times)
    assert clean["threshold_bytes_per_step"] <= 4 * leakcheck.THRESHOLD_BYTES_PER_STEP
    assert clean["slope_ci95_bytes_per_step"][1] < clean["threshold_bytes_per_step"]
    # the leaking variant ran through the path's own function and was caught
    assert leaky["target_calls"] >= leaky["steps"] > 0, (path, leaky)
    assert leaky["verdict"] == "leak", (path, leaky)
    assert leaky["slope_ci95_bytes_per_step"][0] > leaky["threshold_bytes_per_step"]
    calls_per_step = leaky["target_calls"] / (leaky["steps"] + leaky["warmup_steps"])
    assert leaky["slope_ci95_bytes_per_step"][0] >= leakcheck.LEAK_BYTES * calls_per_step / 2  # the leak, seen
    # both decided on enough steps (a slow machine measures longer, up to 3x MAX_MEASURE_S: no time is asserted)
    assert clean["steps"] >= leakcheck.MIN_STEPS and leaky["steps"] >= leakcheck.MIN_STEPS, (path, clean, leaky)


def test_robust_slope_ignores_a_step_but_not_a_steady_rise():
    """The leak check's slope: a one-off 1 MiB step of RSS (a heap growing once) leaves a
    flat series below the threshold; a steady 1 KiB per step rise is above it, step or not."""
    xs = list(range(0, 6000, 20))
    flat = [50e6 + (1 << 20) * (x > 3000) + 4096 * ((x // 20) % 3) for x in xs]
    lo, hi = leakcheck.theil_sen_ci95(xs, flat)
    assert hi < leakcheck.THRESHOLD_BYTES_PER_STEP
    rising = [y + 1024 * x for x, y in zip(xs, flat, strict=True)]
    lo, hi = leakcheck.theil_sen_ci95(xs, rising)
    assert leakcheck.THRESHOLD_BYTES_PER_STEP < lo < 1024 * 1.1 < hi


def test_openjpeg_planes_make_no_ctypes_types():
    """The root cause of issue 24's leak: wrapping each decoded plane made a ctypes
    array type per window shape, kept for the life of the process.  Decoding windows
    of 60 distinct shapes must not grow ctypes' pointer-type cache."""
    import ctypes

    import numpy as np

    import wsitool
    from wsitool.codec import openjpeg

    if not openjpeg.available():
        pytest.skip("libopenjp2 >= 2.3 not found")
    from wsitool.codec.pool import get_pool

    with wsitool.open_slide(leakcheck.J2K) as slide:
        slide.read_region((0, 0), 0, (7, 9), mode="rgb")
        before = len(ctypes._pointer_type_cache)
        decoded = get_pool().stats().tiles_openjpeg
        for i in range(60):
            out = np.empty((10 + i, 11 + i, 3), np.uint8)
            slide.read_region((i, i), 0, (11 + i, 10 + i), out=out, mode="rgb", threads=1)
        assert get_pool().stats().tiles_openjpeg >= decoded + 60  # the OpenJPEG path ran
        assert len(ctypes._pointer_type_cache) == before


def test_openjpeg_context_goes_with_its_thread_without_gc():
    """A thread's OpenJPEG context holds ctypes callbacks (native thunks); it must be
    freed by reference counting when the thread's state goes, not wait for a cyclic GC."""
    import gc
    import weakref

    from wsitool.codec import openjpeg

    if not openjpeg.available():
        pytest.skip("libopenjp2 >= 2.3 not found")
    gc.disable()
    try:
        ctx = openjpeg._Context()
        ref = weakref.ref(ctx)
        del ctx
        assert ref() is None
    finally:
        gc.enable()


def test_thread_state_goes_with_its_thread():
    """Per-thread decoders and buffers are released when their thread ends, by reference
    counting alone: 24 threads each read JPEG tiles (the compiled loop or nvImageCodec) and
    JPEG 2000 tiles (OpenJPEG); once they have ended, none of their thread states nor
    OpenJPEG contexts is alive with the cyclic garbage collector off, and the pool keeps no
    record per ended thread (the RSS of threads that come and go is too noisy to judge)."""
    import gc
    import threading
    import weakref

    import numpy as np

    import wsitool
    from wsitool.codec.pool import get_pool

    pool = get_pool("cpu")
    refs: list = []
    errors: list = []
    with wsitool.open_slide(leakcheck.JPEG) as jpeg, wsitool.open_slide(leakcheck.J2K) as j2k:
        def work(i):
            try:
                read(i)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        def read(i):
            out = np.empty((100 + i, 90 + i, 3), np.uint8)
            jpeg.read_region((i * 7, i * 5), 0, (90 + i, 100 + i), out=out, mode="rgb", threads=1)
            j2k.read_region((i * 7, i * 5), 0, (90 + i, 100 + i), out=out, mode="rgb", threads=1)
            state = pool.state()
            refs.append(weakref.ref(state))
            # (the compiled loop's decoder, a C object, takes no weak reference)
            refs.extend(weakref.ref(obj) for obj in state._slots.values() if type(obj).__weakrefoffset__)

        gc.collect()
        gc.disable()
        try:
            before = pool.stats().decoders_created
            for i in range(24):
                t = threading.Thread(target=work, args=(i,))
                t.start()
                t.join()
            alive = [r() for r in refs if r() is not None]
        finally:
            gc.enable()
    assert not errors, errors
    assert len(refs) >= 2 * 24  # each thread's state and its OpenJPEG context
    assert not alive, alive
    assert pool.stats().decoders_created >= before + 2 * 24  # the threads did make their decoders
    assert len(pool._all_stats) <= threading.active_count()  # no record per ended thread
