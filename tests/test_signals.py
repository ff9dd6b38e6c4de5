"""SIGINT, SIGTERM and SIGHUP: one clean shutdown (wsitool.ground.signals), issue 14 item 6.

Each subprocess test starts a long workload through the real entry point
(``python -m wsitool.cli``), waits (bounded) until it is writing, sends the
signal and checks the exit status (128 + signal number), that nothing partial
is left in the output folder and that no temporary folder is left in TMPDIR.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wsitool.ground import signals

from helpers import REPO, SHARED_SAMPLES, shared_sample

WAIT_S = 60.0  # for the workload to start writing
END_S = 90.0  # for the process to end after the signal


# --------------------------------------------------------------------------- unit


def test_install_turns_sigterm_into_interrupted_and_restore_puts_back():
    before = signal.getsignal(signal.SIGTERM)
    previous = signals.install()
    try:
        with pytest.raises(signals.Interrupted) as info:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1.0)  # the handler runs between bytecodes
        assert isinstance(info.value, KeyboardInterrupt)  # unwinds like Ctrl-C
        assert info.value.exit_code == 143 and signals.exit_code(info.value) == 143
        assert signals.received() == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal while unwinding is ignored
        time.sleep(0.2)
    finally:
        signals.restore(previous)
    assert signal.getsignal(signal.SIGTERM) is before
    assert signals.received() is None
    assert signals.exit_code(KeyboardInterrupt()) == 130


def test_importing_wsitool_installs_no_handler():
    code = ("import signal, wsitool, wsitool.cli, wsitool.export, wsitool.stress\n"
            "print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=REPO)
    assert out.stdout.strip() == "True", out.stderr


_SELF_KILL = """
import os, signal, sys, time
from wsitool.cli import app, main
from wsitool.cli.console import handle_errors

@app.command("selfkill")
@handle_errors
def selfkill(convert: bool = False) -> None:
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    except KeyboardInterrupt:
        if convert:  # as an extension module's import does: "initialization failed"
            raise ImportError("initialization failed")
        raise

try:
    main(["selfkill"] + sys.argv[1:])
except SystemExit as exc:
    code = exc.code
os.kill(os.getpid(), signal.SIGTERM)  # after the command: still ignored, not a kill
time.sleep(0.2)
print("alive", code)
"""


@pytest.mark.parametrize("args", [[], ["--convert"]])
def test_signal_exit_is_one_line_even_when_a_library_converts_it(args):
    out = subprocess.run([sys.executable, "-c", _SELF_KILL, *args], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "alive 143"
    assert out.stderr.strip() == "wsitool: error: interrupted by SIGTERM"


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def bench_slide(tmp_path_factory) -> Path:
    """A 8000 x 6000 Aperio slide of real JPEG tiles (scripts/make_bench_slide.py), in tmp."""
    shared_sample("aperio-cmu1-small-region-jpeg.svs")
    out = tmp_path_factory.mktemp("bench") / "bench.svs"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_bench_slide.py"), str(out),
                    "--width", "8000", "--height", "6000", "--samples", str(SHARED_SAMPLES)],
                   check=True, capture_output=True, timeout=120)
    return out


def _env(tmp: Path) -> dict:
    env = dict(os.environ)
    env["TMPDIR"] = str(tmp)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("WSITOOL_STRESS_FAULT", None)
    return env


def _partials(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial" in p.name) if folder.is_dir() else []


def _default_signals() -> None:
    """In the child: SIGINT and SIGHUP as a terminal's foreground job has them.  A test
    runner started in the background (``&``) or under ``nohup`` passes them on
    ignored, and wsitool keeps an ignored signal ignored (wsitool.ground.signals)."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _signal_when(args: list, sig: int, ready, tmp: Path, cwd: Path) -> tuple[int, str]:
    """Run ``wsitool ARGS``; once ``ready()`` is true send ``sig``; return (status, stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "wsitool.cli", *map(str, args)], cwd=cwd,
                            env=_env(tmp), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_default_signals)
    try:
        deadline = time.monotonic() + WAIT_S
        while not ready():
            if proc.poll() is not None:
                pytest.fail(f"finished before the signal (status {proc.returncode}): "
                            f"{proc.stderr.read()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail("the workload did not start writing in time")
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=END_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


def _no_temp_left(tmp: Path) -> None:
    left = [p.name for p in tmp.iterdir() if p.name.startswith(("wsitool-", "dask-", "tmp"))]
    assert not left, f"temporary folders left in TMPDIR: {left}"


SIGNALS = [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)]


# --------------------------------------------------------------------------- workloads


@pytest.mark.parametrize("sig,code", SIGNALS, ids=["SIGTERM", "SIGHUP", "SIGINT"])
def test_signal_mid_single_export_leaves_nothing(bench_slide, tmp_path, sig, code):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    status, err = _signal_when(
        ["export-pyramid", bench_slide, out_dir / "x.tiff", "--compression", "jpeg2000",
         "--threads", "1", "--quiet"], sig, lambda: bool(_partials(out_dir)), tmp, tmp_path)
    assert status == code, err
    assert "Traceback" not in err and "interrupted" in err
    assert list(out_dir.iterdir()) == []
    _no_temp_left(tmp)


def test_sigterm_mid_dask_batch_closes_cluster_and_leaves_nothing(bench_slide, tmp_path):
    pytest.importorskip("distributed")
    second = tmp_path / "second.svs"
    shutil.copyfile(bench_slide, second)  # a generated slide, not a shared one
    out_dir = tmp_path / "out"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    status, err = _signal_when(
        ["export-pyramid", bench_slide, second, out_dir, "--scheduler", "local",
         "--compression", "jpeg2000", "--quiet"], signal.SIGTERM,
        lambda: len(_partials(out_dir)) >= 1, tmp, tmp_path)
    assert status == 143, err
    assert "leaked semaphore" not in err and "Traceback" not in err
    assert _partials(out_dir) == []
    assert not [p for p in out_dir.iterdir() if p.suffix == ".tiff"]
    _no_temp_left(tmp)


def _regions_csv(path: Path, n: int = 3000) -> Path:
    import random

    rng = random.Random(0)
    rows = ["x,y,level,width,height"] + [
        f"{rng.randrange(0, 7000)},{rng.randrange(0, 5000)},0,1024,1024" for _ in range(n)]
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("pack", [False, True], ids=["png", "pack"])
def test_sigterm_mid_regions_leaves_no_partial(bench_slide, tmp_path, pack):
    csv_path = _regions_csv(tmp_path / "regions.csv")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    args = ["read-region", bench_slide, "--regions", csv_path, "--output-dir", out_dir,
            "--threads", "2", "--quiet"] + (["--pack"] if pack else [])
    ready = (lambda: bool(_partials(out_dir))) if pack else \
        (lambda: sum(1 for p in out_dir.iterdir() if p.suffix == ".png") >= 3)
    status, err = _signal_when(args, signal.SIGTERM, ready, tmp, tmp_path)
    assert status == 143, err
    assert _partials(out_dir) == []
    if pack:
        assert list(out_dir.iterdir()) == []
    _no_temp_left(tmp)


@pytest.mark.parametrize("sig,code,tries", [(signal.SIGINT, 130, 3), (signal.SIGTERM, 143, 1)],
                         ids=["SIGINT", "SIGTERM"])
def test_signal_mid_stress_on_jpeg2000_exits_cleanly(tmp_path, sig, code, tries):
    """The verifier thread (decoding JPEG 2000) is stopped and joined: never an abort (134)."""
    slide = shared_sample("aperio-tcga-cr-7395-jp2k-33005-2level.svs")
    for i in range(tries):
        tmp = tmp_path / f"tmp{i}"
        tmp.mkdir()
        started: list[float] = []

        def ready(started=started, tmp=tmp) -> bool:  # the child is running; give the verifier a backlog to chew on
            if not started and any(p.name.startswith("wsitool-stress-") for p in tmp.iterdir()):
                started.append(time.monotonic())
            return bool(started) and time.monotonic() - started[0] > 3.0

        status, err = _signal_when(
            ["stress", slide, "--workers", "8", "--iterations", "200000", "--verify-every", "1"],
            sig, ready, tmp, tmp_path)
        assert status == code, err
        assert "terminate called" not in err
        _no_temp_left(tmp)


# ------------------------------------------------ issue 47 item 8: a signal at every step of a partial

#: Run in a child process (it signals itself): each workload once per bytecode instruction that
#: wsitool.ground.outputs and the pack writer execute in it, SIGTERM raised just before that instruction
#: (a trace function with ``f_trace_opcodes``), then the command line's clean-up
#: (signals.cleanup_partials).  Prints one JSON line per workload: the instructions counted and,
#: for every step whose folder afterwards held a partial, or neither the state before nor the
#: state after the write, that step, where it was and what the folder held.
_INJECT = r'''
import json, os, signal, sys, tempfile
from pathlib import Path
import numpy as np
from wsitool.ground import outputs as atomic, partials, signals
from wsitool.distributed import pack

TRACED = {os.path.realpath(m.__file__) for m in (atomic, partials, pack)}
DATA, OLD = b"n" * 200_000, b"old"

def listing(folder):
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            out[p.relative_to(folder).as_posix()] = p.read_bytes()[:3].decode("latin-1")
    return out

def write(folder):
    atomic.write_bytes(folder / "out.bin", DATA)

def overwrite(folder):
    atomic.write_bytes(folder / "out.bin", DATA, overwrite=True)

def folder_overwrite(folder):
    partial = atomic.create_dir(folder / "out")
    with partial:
        (partial.path / "new").write_bytes(DATA)
        partial.commit(overwrite=True)

def packed(folder):
    w = pack.PackWriter(folder / "out.npz", "npz")
    try:
        w.add("a", np.zeros((4, 4, 3), np.uint8))
        w.add("b", np.ones((4, 4, 3), np.uint8))
    except BaseException:
        w.abort()
        raise
    w.commit()

def old_folder(folder):
    (folder / "out").mkdir()
    (folder / "out" / "old").write_bytes(OLD)

WORKLOADS = {"write": (write, None), "overwrite": (overwrite, lambda f: (f / "out.bin").write_bytes(OLD)),
             "folder_overwrite": (folder_overwrite, old_folder), "pack": (packed, None)}

def run(name, step, root):
    work, setup = WORKLOADS[name]
    folder = Path(tempfile.mkdtemp(dir=root))
    if setup:
        setup(folder)
    seen = [0]
    where = [None]

    def tracer(frame, event, arg):
        if os.path.realpath(frame.f_code.co_filename) not in TRACED:
            return None
        frame.f_trace_opcodes = True
        if event == "opcode":
            seen[0] += 1
            if seen[0] == step:
                where[0] = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} {frame.f_code.co_name}"
                signal.raise_signal(signal.SIGTERM)
        return tracer

    before = listing(folder)
    with signals.handling():
        sys.settrace(tracer)
        try:
            work(folder)
        except BaseException:
            if signals.received() is None:
                raise
            signals.cleanup_partials()  # as the command line does after the unwinding
        finally:
            sys.settrace(None)
    return seen[0], where[0], before, listing(folder), [p.name for p in folder.iterdir()]

root = Path(sys.argv[1])
for name in sys.argv[2:]:
    _, _, before, after, _ = run(name, 0, root)  # no signal: the count and the state after
    total, bad = 0, []
    step = 1
    while step < 100_000:
        n, where, start, got, names = run(name, step, root)
        total = max(total, n)
        if where is None:
            break
        partials = [x for x in names if atomic.is_partial_name(x)]
        if partials or got not in (before, after) or atomic.live_partials():
            bad.append({"step": step, "at": where, "partials": partials, "left": sorted(got)})
        step += 1
    print(json.dumps({"workload": name, "steps": total, "bad": bad[:20], "nbad": len(bad)}), flush=True)
'''


def test_sigterm_at_every_step_of_a_partial_leaves_none(tmp_path):
    """SIGTERM before each instruction of wsitool.ground.outputs (and the pack writer) while a partial is
    created, written and renamed: afterwards no partial is left, and the output is as before or
    complete (a signal between creating the file and recording it left it behind: issue 47)."""
    import json

    workloads = ["write", "overwrite", "folder_overwrite", "pack"]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _INJECT, str(tmp_path), *workloads], capture_output=True,
                          text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Exception ignored" not in proc.stderr, proc.stderr[-3000:]  # (an unfinished zip's __del__)
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["workload"] for r in results] == workloads
    for r in results:
        assert r["steps"] > 50, r  # the trace saw the create, write and rename
        assert r["nbad"] == 0, r
