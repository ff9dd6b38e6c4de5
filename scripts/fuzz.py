#!/usr/bin/env python
"""Mutation fuzzer for wsitool's readers (open, metadata, associated images, region reads).

Usage::

    python scripts/fuzz.py --minutes 20 [--seed S] [--out DIR] [--files A.tif B.svs ...]

It takes real slides (``../shared/samples``), the field-fault files
(``../shared/bug-inputs``), the vendor-layout fixtures (``scripts/make_vendor_samples.py``:
Philips, Ventana, Leica SCN) and the files of the MIRAX fixtures' folders (``scripts/make_mirax_samples.py``:
each mutated inside a copy of its slide, the ``.mrxs`` opened) as seeds, mutates their bytes where it matters and
hands each mutated file to a *worker child process* that opens it and reads
metadata, associated images and random regions of every level.  The only
exceptions allowed out of wsitool are its documented ones
(:class:`wsitool.WsiError` and subclasses).  A fault is one of:

* ``exception`` -- any other exception type escaped (traceback recorded);
* ``crash`` -- the worker died (signal, e.g. SIGSEGV / SIGABRT, or a non-zero
  exit), i.e. a native decoder or library crashed;
* ``hang`` -- no answer within the per-input timeout (the worker is killed).

Every fault is saved under ``--out`` as the mutated file plus a ``.json`` with
the mutation recipe (seed file, byte patches, truncation) and the details, so
it can be replayed with ``--replay FILE.json``.  A recipe is pure data:
:func:`apply_recipe` rebuilds the mutated bytes from the original file, so
tests can regenerate an input without copying any file into the repository.

Mutations target the places readers trip over, located with tifffile: the
TIFF header, IFD entries (type, count, value/offset fields), the values of
structural tags (ImageWidth, TileWidth, BitsPerSample, Compression,
SamplesPerPixel, SubIFDs, JPEGTables, ...), tile/strip offsets and byte
counts, the tile bytes themselves (bit flips, zeroed runs, JPEG SOF sizes and
marker lengths), plus random bytes and truncation.

The worker applies tight limits (``wsitool.set_limits``) and an address-space
cap so a missing limit check shows up as a ``MemoryError`` fault instead of
exhausting the machine.

``--cli-batch`` fuzzes the CLI's batch inputs instead: generated and damaged
``--regions`` CSV files (names with path traversal, terminal escapes,
newlines, NUL, bidi overrides; non-UTF-8 bytes, bad numbers, broken quoting),
``--pack`` stores and ``export-pyramid --from-list`` files, each run through
the CLI in a fresh sandbox folder.  A fault is an exception escaping the CLI,
an undocumented exit code, an error that is not one ``wsitool: error:`` line,
a raw control character printed, or a write outside the output folder (or a
link or partial left in it) -- see :func:`check_batch_case`.

The mutators (:func:`seed_targets`, :func:`make_recipe`, :func:`apply_recipe`,
:func:`make_batch_case`) live in ``scripts/fuzzlib.py``, a module the tests import; the
harness (:class:`Worker`, :func:`check_batch_case`) is imported by ``tests/test_fuzz.py``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from fuzzlib import (
    REPO,
    SEED_DIRS,
    apply_recipe,
    make_batch_case,
    make_recipe,
    seed_files,
    seed_targets,
)

RESULT_PREFIX = "@@FUZZ "

# --------------------------------------------------------------------------- worker side


def exercise(path: str, seed: int) -> dict:
    """Open ``path`` with wsitool and read everything; returns a result dict.

    ``{"status": "ok" | "documented" | "exception", "errors": [...], ...}``;
    "exception" means an undocumented exception type escaped (a fault).
    """
    import warnings

    import numpy as np

    import wsitool
    from wsitool.slide import pyramid_levels

    rng = random.Random(seed)
    documented: list[str] = []

    def guarded(fn):
        try:
            return fn()
        except wsitool.WsiError as exc:
            documented.append(type(exc).__name__)
            return None

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            slide = wsitool.open_slide(path)
        except wsitool.WsiError as exc:
            return {"status": "documented", "errors": [type(exc).__name__], "where": "open"}
        except Exception as exc:
            return _exc_result(exc, "open")
        try:
            with slide:
                where = "metadata"
                dict(slide.properties)
                _ = (slide.mpp, slide.objective_power, slide.level_dimensions, slide.level_downsamples)
                for d in (1.0, 3.0, 1e9):
                    slide.get_best_level_for_downsample(d)
                where = "associated"
                for name in list(slide.associated_images):
                    img = guarded(lambda name=name: slide.associated_images[name])
                    if img is not None:
                        assert img.ndim == 3 and img.shape[2] == 3 and img.dtype == np.uint8, img.shape
                for lv in pyramid_levels(slide)[:8]:
                    where = f"level {lv.index}"
                    ds = lv.downsample
                    for _ in range(3):
                        w = rng.randint(1, min(600, lv.width + 64))
                        h = rng.randint(1, min(600, lv.height + 64))
                        x = rng.randint(-w, lv.width + 16)
                        y = rng.randint(-h, lv.height + 16)
                        mode = rng.choice(("rgba", "rgb", "raw"))
                        on_error = rng.choice(("raise", "fill"))
                        threads = rng.choice((1, 2))
                        loc = (int(x * ds), int(y * ds))
                        arr = guarded(functools.partial(slide.read_region, loc, lv.index, (w, h), mode=mode,
                                                        on_error=on_error, threads=threads))
                        if arr is not None:
                            want_c = 4 if mode == "rgba" else 3 if mode == "rgb" else lv.samples
                            assert arr.shape == (h, w, want_c), (arr.shape, (h, w, want_c))
        except wsitool.WsiError as exc:  # e.g. from metadata
            documented.append(type(exc).__name__)
        except Exception as exc:
            return _exc_result(exc, where)
    if any(issubclass(w.category, wsitool.TileWarning) for w in caught):
        documented.append("TileWarning")  # on_error="fill" reported a bad tile
    return {"status": "documented" if documented else "ok", "errors": sorted(set(documented))}


def _exc_result(exc: BaseException, where: str) -> dict:
    tb = traceback.extract_tb(exc.__traceback__)
    frame = tb[-1] if tb else None
    sig = f"{type(exc).__name__} at {Path(frame.filename).name}:{frame.lineno}" if frame else type(exc).__name__
    return {
        "status": "exception",
        "type": type(exc).__name__,
        "message": str(exc)[:500],
        "where": where,
        "signature": sig,
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:],
    }


def worker_main(mem_limit_mb: int) -> None:
    """Child-process loop: one JSON request per stdin line, one result line per request."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash is reported, not dumped
    import faulthandler

    faulthandler.enable()  # the Python stack of a native crash goes to stderr (signature)
    if mem_limit_mb > 0:
        lim = mem_limit_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    sys.path.insert(0, str(REPO))
    import wsitool

    wsitool.set_limits(max_region_pixels=2**22, max_region_bytes=2**26, max_tile_pixels=2**24)
    out = sys.stdout
    out.write(RESULT_PREFIX + json.dumps({"status": "ready"}) + "\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        selftest = req.get("selftest")  # proves the harness sees each fault kind (tests)
        if selftest == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif selftest == "hang":
            time.sleep(3600)
        try:
            if selftest == "exception":
                raise TypeError("self-test exception")
            res = exercise(req["path"], req["seed"])
        except Exception as exc:  # exercise() classifies wsitool errors itself; last resort
            res = _exc_result(exc, "worker")
        out.write(RESULT_PREFIX + json.dumps(res) + "\n")
        out.flush()


# --------------------------------------------------------------------------- parent side


class Worker:
    """A child process that runs :func:`exercise` on files; survives crashes by restarting.

    ``check(path, seed)`` returns the result dict, or for a dead worker
    ``{"status": "crash", "signal"/"returncode", "stderr_tail"}``, or for a
    timeout ``{"status": "hang"}`` (the worker is then killed and restarted).
    """

    def __init__(self, timeout: float = 30.0, mem_limit_mb: int = 6144, env: dict | None = None):
        self.timeout = timeout
        self.env = dict(env or {})  # extra environment of the child (e.g. WSITOOL_NATIVE=0)
        self.mem_limit_mb = mem_limit_mb
        self.proc: subprocess.Popen | None = None
        self._buf = b""
        self._eof = False
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - the runner's for its life: close() closes it

    def _start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("OMP_NUM_THREADS", "1")
        env.update(self.env)
        self._stderr.seek(0)
        self._stderr.truncate()
        self.proc = subprocess.Popen(
            [sys.executable, "-u", str(Path(__file__).resolve()), "--worker",
             "--mem-limit-mb", str(self.mem_limit_mb)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env,
        )
        self._buf = b""
        ready = self._read_result(120.0)
        if ready is None or ready.get("status") != "ready":
            raise RuntimeError(f"fuzz worker did not start: {ready} {self._stderr_tail()}")

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-2000:].decode("utf-8", "replace")

    def _read_result(self, timeout: float) -> dict | None:
        """Next result line, or None on timeout / EOF."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                text = line.decode("utf-8", "replace")
                if text.startswith(RESULT_PREFIX):
                    return json.loads(text[len(RESULT_PREFIX):])
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # the worker closed its stdout: it died
                self._eof = True
                return None
            self._buf += chunk

    def check(self, path: str, seed: int = 0, selftest: str | None = None) -> dict:
        """Exercise ``path`` in the worker (``seed`` picks the regions); see the class doc."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        req = {"path": str(path), "seed": seed}
        if selftest:
            req["selftest"] = selftest
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        self._eof = False
        res = self._read_result(self.timeout)
        if res is not None:
            return res
        rc = self.proc.poll()
        if rc is None and self._eof:  # dying: its exit status is not collected yet
            try:
                rc = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                rc = None
        if rc is None:  # alive but silent: a hang
            self.kill()
            return {"status": "hang", "timeout_s": self.timeout, "stderr_tail": self._stderr_tail()}
        self.proc = None
        tail = self._stderr_tail()
        out = {"status": "crash", "returncode": rc, "stderr_tail": tail}
        if rc < 0:
            from wsitool.ground.signals import signal_name  # "signal N" for a number without a name

            out["signal"] = signal_name(-rc)
        out["signature"] = f"crash {out.get('signal', rc)}" + _crash_frame(tail)
        return out

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except Exception:
                pass
        self.kill()
        self._stderr.close()


FAULTS = ("exception", "crash", "hang")


def _crash_frame(stderr_tail: str) -> str:
    """`` at file:line`` of the innermost frame of the crashing thread (faulthandler's dump)."""
    lines = stderr_tail.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Current thread") and i + 1 < len(lines):
            frame = lines[i + 1].strip()  # File "/path/x.py", line 123 in func
            if frame.startswith("File "):
                try:
                    fname = frame.split('"')[1]
                    lineno = frame.split(", line ")[1].split()[0]
                    return f" at {Path(fname).name}:{lineno}"
                except IndexError:
                    return ""
    return ""


def save_fault(out_dir: Path, n: int, recipe: dict, result: dict, data: bytes) -> Path:
    """Write the mutated input and a JSON with recipe and result; return the input's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = Path(recipe["seed_file"]).suffix or ".tif"
    stem = f"fault-{n:04d}-{result['status']}-{Path(recipe['seed_file']).stem}"
    inp = out_dir / (stem + suffix)
    inp.write_bytes(data)
    (out_dir / (stem + ".json")).write_text(json.dumps({"recipe": recipe, "result": result}, indent=1))
    return inp


def vendor_seeds(folder: Path) -> list[Path]:
    """The vendor-layout fixtures of ``scripts/make_vendor_samples.py`` (Philips, Ventana, Leica) and
    ``scripts/make_czi_samples.py`` (Zeiss CZI: header, directory, subblock and attachment
    segments; mutated by the header, random-bytes and truncate kinds), written into ``folder``
    from the shared CMU slide (kept beside the faults, so a fault's recipe replays); none where
    that slide is absent."""
    import make_czi_samples
    from make_vendor_samples import SOURCE, write_all

    if not SOURCE.is_file():
        return []
    return write_all(folder) + make_czi_samples.write_all(folder)


#: The files of a MIRAX slide's folder the fuzzer mutates (one at a time, the others intact).
MIRAX_MEMBERS = ("Slidedat.ini", "Index.dat", "Data0002.dat")


def mirax_seeds(folder: Path) -> list[Path]:
    """The MIRAX fixtures of ``scripts/make_mirax_samples.py``, written into ``folder`` (beside the
    faults, so recipes replay): a MIRAX slide is several files, so its seeds are the members of its
    folder (:data:`MIRAX_MEMBERS`: the key file, the index, the data file of the higher levels and
    records); :func:`stage` puts a mutated member back in a copy of its slide.  None where the
    shared CMU slide is absent."""
    from make_mirax_samples import SOURCE, write_all

    if not SOURCE.is_file():
        return []
    return [mrxs.with_suffix("") / name for mrxs in write_all(folder) for name in MIRAX_MEMBERS]


def _mirax_slide(seed_file: Path) -> Path | None:
    """The ``.mrxs`` whose folder holds ``seed_file``, or None (a file seed)."""
    mrxs = seed_file.parent.with_suffix(".mrxs")
    return mrxs if mrxs.is_file() and seed_file.parent.is_dir() else None


def stage(work: Path, seed_file: str, data: bytes) -> Path:
    """Write the mutated ``data`` of ``seed_file`` into ``work`` and return the path to check: the
    file itself, or for a member of a MIRAX folder a copy of its slide (in ``work``, made once)
    with that member replaced and the others as generated."""
    seed = Path(seed_file)
    mrxs = _mirax_slide(seed)
    if mrxs is None:
        path = work / ("input" + seed.suffix)
        path.write_bytes(data)
        return path
    folder = work / seed.parent.name
    if not folder.is_dir():
        shutil.copytree(seed.parent, folder)
        shutil.copyfile(mrxs, work / mrxs.name)
    for member in MIRAX_MEMBERS:  # (the member mutated last time restored)
        shutil.copyfile(seed.parent / member, folder / member)
    (folder / seed.name).write_bytes(data)
    return work / mrxs.name


def fuzz(minutes: float, seed: int, out_dir: Path, files: list[Path] | None = None,
         timeout: float = 30.0, log=print) -> dict:
    """Run the fuzz loop for ``minutes``; return a summary dict.  Without ``files``, the seeds are
    the shared slides and bug inputs plus the vendor-layout fixtures (:func:`vendor_seeds`) and the
    members of the MIRAX fixtures' folders (:func:`mirax_seeds`)."""
    files = files or seed_files() + vendor_seeds(out_dir / "vendor-seeds") + mirax_seeds(out_dir / "mirax-seeds")
    if not files:
        raise SystemExit(f"no seed files found under {', '.join(map(str, SEED_DIRS))}")
    rng = random.Random(seed)
    targets = {str(p): seed_targets(p) for p in files}
    work = Path(tempfile.mkdtemp(prefix="wsitool-fuzz-work-"))
    worker = Worker(timeout=timeout)
    counts = {"tried": 0, "ok": 0, "documented": 0, "exception": 0, "crash": 0, "hang": 0}
    by_kind: dict[str, int] = {}
    signatures: dict[str, dict] = {}
    start = time.monotonic()
    deadline = start + minutes * 60
    last_log = start
    n_fault = 0
    interrupted = False
    try:
        # the unmutated seeds first
        queue = [{"seed_file": str(p), "kinds": ["none"], "patches": [], "truncate": None} for p in files]
        try:
            while time.monotonic() < deadline:
                recipe = queue.pop(0) if queue else make_recipe(targets[str(rng.choice(files))], rng)
                data = apply_recipe(recipe)
                path = stage(work, recipe["seed_file"], data)
                case_seed = rng.getrandbits(32)
                recipe["case_seed"] = case_seed
                res = worker.check(str(path), case_seed)
                counts["tried"] += 1
                counts[res["status"]] = counts.get(res["status"], 0) + 1
                for k in recipe["kinds"]:
                    by_kind[k] = by_kind.get(k, 0) + 1
                if res["status"] in FAULTS:
                    n_fault += 1
                    sig = res.get("signature") or f"{res['status']} {res.get('signal', res.get('returncode', ''))}"
                    saved = save_fault(out_dir, n_fault, recipe, res, data)
                    first = sig not in signatures
                    signatures.setdefault(sig, {"count": 0, "example": str(saved)})["count"] += 1
                    if first:
                        log(f"FAULT {res['status']}: {sig} ({res.get('message', '')[:160]}) -> {saved}")
                now = time.monotonic()
                if now - last_log >= 60:
                    last_log = now
                    log(f"[{(now - start) / 60:5.1f} min] tried {counts['tried']}, ok {counts['ok']}, "
                        f"documented errors {counts['documented']}, faults "
                        f"{counts['exception'] + counts['crash'] + counts['hang']} "
                        f"({len(signatures)} distinct)")
        except KeyboardInterrupt:  # Ctrl-C: stop and summarise what was tried
            interrupted = True
            log("interrupted")
    finally:
        worker.close()
        shutil.rmtree(work, ignore_errors=True)
    summary = {
        "minutes": round((time.monotonic() - start) / 60, 2),
        "seed": seed,
        "seed_files": len(files),
        "counts": counts,
        "faults": counts["exception"] + counts["crash"] + counts["hang"],
        "distinct_faults": signatures,
        "mutations_by_kind": by_kind,
        "out_dir": str(out_dir),
        "interrupted": interrupted,
    }
    return summary


def replay(json_path: Path, timeout: float = 30.0) -> dict:
    """Re-run a saved fault (its ``.json``) in a fresh worker; return the result."""
    info = json.loads(Path(json_path).read_text())
    recipe = info["recipe"]
    data = apply_recipe(recipe)
    with tempfile.TemporaryDirectory(prefix="wsitool-fuzz-replay-") as d:
        path = stage(Path(d), recipe["seed_file"], data)
        w = Worker(timeout=timeout)
        try:
            return w.check(str(path), recipe.get("case_seed", 0))
        finally:
            w.close()


# --------------------------------------------------------------------------- CLI batch inputs

def _tree(root: Path, skip: Path | None = None) -> dict:
    """Every path under ``root`` (links not followed) -> (type, size, mtime_ns), ``skip`` left out."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        if skip is not None and (d == skip or skip in d.parents):
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            p = d / name
            if skip is not None and p == skip:
                continue
            st = os.lstat(p)
            out[str(p)] = (st.st_mode >> 12, st.st_size, st.st_mtime_ns)
    return out


#: What each line the CLI prints in a batch starts with (one line per message).
_BATCH_LINE_PREFIXES = ("wsitool: error:", "wsitool: warning:", "failed ", "ok ", "skipped ", "wrote ",
                        "Dask is not installed")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def check_batch_case(case: dict, work: Path, slide: Path) -> dict:
    """Run one :func:`make_batch_case` input through the CLI (in this process) in a fresh
    sandbox under ``work``; returns ``{"status": "ok" | "documented" | fault kind, ...}``.

    Faults: ``exception`` (an exception escaped the CLI), ``exit`` (an undocumented exit
    code), ``lines`` (an error that is not exactly one ``wsitool: error:`` line),
    ``control`` (a raw control character printed), ``escape`` (a write outside the
    output folder, a link or a partial left in it).
    """
    from typer.testing import CliRunner

    from wsitool.cli import app

    box = Path(tempfile.mkdtemp(prefix="case-", dir=work))
    (box / "slide.svs").symlink_to(slide)
    out = box / "out"
    inp = box / ("list.txt" if case["kind"] == "from-list" else "regions.csv")
    inp.write_bytes(bytes.fromhex(case["data"]))
    opts = case["opts"]
    if case["kind"] == "from-list":
        argv = ["export-pyramid", str(out), "--from-list", str(inp), "--scheduler", "sequential",
                "--region", "0", "0", "32", "32", "--compression", "deflate", "--quiet"]
    else:
        argv = ["read-region", str(box / "slide.svs"), "--regions", str(inp), "--output-dir", str(out),
                "--format", opts["format"], "--threads", "2", "--quiet"]
        if case["kind"] == "pack":
            argv.append("--pack")
    if opts.get("overwrite"):
        argv.append("--overwrite")
    outside_before = _tree(work.parent if work.parent != Path("/") else work, skip=out)
    runner = CliRunner()
    results = []
    old = os.getcwd()
    os.chdir(box)  # relative names in the inputs resolve inside the sandbox
    try:
        for _ in range(2 if opts.get("twice") else 1):
            results.append(runner.invoke(app, argv))
    finally:
        os.chdir(old)
    res = {"status": "ok", "argv": argv}
    for r in results:
        text = r.output
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            return dict(res, status="exception", error=repr(r.exception),
                        traceback="".join(traceback.format_exception(r.exception))[-3000:])
        if r.exit_code not in range(0, 10):
            return dict(res, status="exit", exit_code=r.exit_code, output=text[-2000:])
        lines = [ln for ln in text.splitlines() if ln.strip()]
        errs = [ln for ln in lines if ln.startswith("wsitool: error:")]
        failed = [ln for ln in lines if ln.startswith("failed ")]
        stray = [ln for ln in lines if not ln.startswith(_BATCH_LINE_PREFIXES)
                 and not re.match(r"\d+ exported, \d+ skipped, \d+ failed of \d+ slide", ln)]
        if ("Traceback" in text or stray or len(errs) > 1 or (r.exit_code != 0 and not errs and not failed)
                or (r.exit_code == 0 and (errs or failed))):
            return dict(res, status="lines", exit_code=r.exit_code, output=text[-2000:], stray=stray[:5])
        if _CONTROL.search(text):
            return dict(res, status="control", output=text[-2000:])
        if r.exit_code:
            res.update(status="documented", exit_code=r.exit_code)
    outside_after = _tree(work.parent if work.parent != Path("/") else work, skip=out)
    changed = sorted(p for p in set(outside_after) ^ set(outside_before)
                     if not p.startswith(str(box) + os.sep + "out"))
    changed += sorted(p for p in set(outside_after) & set(outside_before)
                      if outside_after[p] != outside_before[p] and Path(p) != box and
                      not p.startswith(str(out)) and p != str(inp))
    if changed:
        return dict(res, status="escape", paths=changed[:20])
    if out.exists():
        for p in out.rglob("*"):
            if p.is_symlink() or ".partial-" in p.name:
                return dict(res, status="escape", paths=[str(p)])
            if not p.resolve().is_relative_to(out.resolve()):
                return dict(res, status="escape", paths=[str(p)])
    shutil.rmtree(box, ignore_errors=True)
    return res


BATCH_FAULTS = ("exception", "exit", "lines", "control", "escape")


def fuzz_cli_batch(minutes: float, seed: int, out_dir: Path, log=print) -> dict:
    """Fuzz the CLI's batch inputs (``--regions`` CSV bytes and names, ``--pack``,
    ``export-pyramid --from-list``) for ``minutes``; faults are saved as JSON under ``out_dir``
    (replay with ``--replay-batch FILE``)."""
    slide = REPO / "samples" / "sample-aperio-jpeg.svs"
    if not slide.exists():
        raise SystemExit(f"{slide} is missing (python scripts/make_samples.py)")
    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp(prefix="wsitool-fuzz-batch-"))
    work = root / "work"
    work.mkdir()
    counts = dict.fromkeys(("tried", "ok", "documented", *BATCH_FAULTS), 0)
    distinct: dict[str, dict] = {}
    deadline = time.monotonic() + minutes * 60
    out_dir.mkdir(parents=True, exist_ok=True)
    while time.monotonic() < deadline:
        case = make_batch_case(rng)
        res = check_batch_case(case, work, slide)
        counts["tried"] += 1
        counts[res["status"]] += 1
        if res["status"] in BATCH_FAULTS:
            n = counts["tried"]
            (out_dir / f"batch-{n:06d}.json").write_text(json.dumps({"case": case, "result": res}, indent=1))
            sig = f"{res['status']} {case['kind']}"
            d = distinct.setdefault(sig, {"count": 0, "example": str(out_dir / f"batch-{n:06d}.json")})
            d["count"] += 1
            log(f"fault {sig}: {res.get('error') or res.get('paths') or res.get('output', '')[-200:]!r}")
    shutil.rmtree(root, ignore_errors=True)
    faults = sum(counts[k] for k in BATCH_FAULTS)
    return {"minutes": minutes, "seed": seed, "counts": counts, "faults": faults,
            "distinct_faults": distinct, "out": str(out_dir)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=1.0, help="how long to fuzz (default 1)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--out", type=Path, default=None, help="where faults are saved (default: a new temp dir)")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per input before it counts as a hang")
    ap.add_argument("--files", type=Path, nargs="*",
                    help="seed files (default: ../shared samples + bug inputs + vendor fixtures)")
    ap.add_argument("--replay", type=Path, help="re-run one saved fault .json and print the result")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    ap.add_argument("--cli-batch", action="store_true",
                    help="fuzz the CLI's batch inputs instead (--regions CSV bytes and names, --pack, "
                         "--from-list): one-line errors, documented exit codes, no raw control "
                         "characters printed, no writes outside the output folder")
    ap.add_argument("--replay-batch", type=Path, help="re-run one saved CLI-batch fault .json")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mem-limit-mb", type=int, default=6144, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker_main(args.mem_limit_mb)
        return 0
    if args.replay:
        res = replay(args.replay, args.timeout)
        print(json.dumps(res, indent=1))
        return 1 if res["status"] in FAULTS else 0
    if args.replay_batch:
        saved = json.loads(args.replay_batch.read_text())
        with tempfile.TemporaryDirectory(prefix="wsitool-fuzz-replay-") as d:
            (Path(d) / "work").mkdir()
            res = check_batch_case(saved["case"], Path(d) / "work", REPO / "samples" / "sample-aperio-jpeg.svs")
        print(json.dumps(res, indent=1))
        return 1 if res["status"] in BATCH_FAULTS else 0
    if args.cli_batch:
        out = args.out or Path(tempfile.mkdtemp(prefix="wsitool-fuzz-batch-faults-"))
        summary = fuzz_cli_batch(args.minutes, args.seed, out, log=lambda m: print(m, flush=True))
        if args.json:
            print(json.dumps(summary, indent=1))
        else:
            c = summary["counts"]
            print(f"CLI batch inputs tried: {c['tried']} in {args.minutes} min (seed {args.seed}); ok {c['ok']}, "
                  f"refused with a documented error {c['documented']}; faults {summary['faults']}")
            for sig, d in summary["distinct_faults"].items():
                print(f"    {d['count']:5d} x {sig}  e.g. {d['example']}")
            print(f"  faults saved under: {out}")
        return 1 if summary["faults"] else 0
    out = args.out or Path(tempfile.mkdtemp(prefix="wsitool-fuzz-faults-"))
    summary = fuzz(args.minutes, args.seed, out, args.files, args.timeout,
                   log=lambda m: print(m, flush=True))
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        c = summary["counts"]
        print(f"inputs tried: {c['tried']} in {summary['minutes']} min from {summary['seed_files']} seed files "
              f"(seed {args.seed})")
        print(f"  opened/read without error: {c['ok']}; refused with a documented wsitool error: {c['documented']}")
        print(f"  faults: {summary['faults']} (exceptions {c['exception']}, crashes {c['crash']}, "
              f"hangs {c['hang']}), distinct: {len(summary['distinct_faults'])}")
        for sig, d in summary["distinct_faults"].items():
            print(f"    {d['count']:5d} x {sig}  e.g. {d['example']}")
        print(f"  mutations by kind: {summary['mutations_by_kind']}")
        print(f"  faults saved under: {out}")
    return 1 if summary["faults"] else 0


if __name__ == "__main__":
    sys.exit(main())
