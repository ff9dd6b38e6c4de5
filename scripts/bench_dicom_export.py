#!/usr/bin/env python3
"""Benchmark the DICOM export's passthrough (``export-pyramid --format dicom -c copy``) against ``cp`` + ``sync``
and wsidicomizer (issue 52).

Usage::

    python scripts/bench_dicom_export.py [SLIDE] [--repeat N] [--workers N] [--baseline DIR] [--no-orthanc]
                                         [--json]

Without SLIDE, a 30000 x 20000 Aperio JPEG slide made of real tissue tiles is
built once under /tmp (``scripts/make_bench_slide.py --width 30000 --height
20000``).  Each round runs, one after the other, into a fresh folder under
/tmp (removed afterwards):

* ``startup``: ``wsitool --version`` (the command's own start-up: Python,
  imports);
* ``wsitool``: ``wsitool export-pyramid SLIDE OUT --format dicom --compression
  copy --quiet`` then ``sync`` (every level passed through, label, overview
  and thumbnail instances);
* ``cp``: ``cp SLIDE OUT`` then ``sync`` (the least a conversion that moves
  the same bytes costs);
* ``wsidicomizer``: ``wsidicomizer -i SLIDE -o OUT -w WORKERS`` (from
  /work/venv-peers, or WSIDICOMIZER), then ``sync``;
* ``orthanc``: ``OrthancWSIDicomizer --folder OUT SLIDE`` then ``sync``, where
  that program is on PATH.

* ``baseline`` (with ``--baseline DIR``): the same export by the wsitool of
  another checkout (``DIR`` holds its ``wsitool`` package with the compiled
  helpers built), so that a change is measured before and after in one
  interleaved run.

Every timed run starts after a ``sync``.  Printed: the best and the median wall
time of each over ``--repeat`` rounds, the export less the start-up, and the
ratios (export less start-up) / (cp + sync) and wsidicomizer / export (from the
best times, and from the medians).  Timings compare tools on one machine; they
are not pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_SLIDE = Path(tempfile.gettempdir()) / "wsitool-bench-dicom-30000x20000.svs"
PEERS = Path(os.environ.get("WSIDICOMIZER", "/work/venv-peers/bin/wsidicomizer"))


def timed(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> float:
    """Wall time of ``cmd`` then ``sync`` (seconds); raises if ``cmd`` fails."""
    t0 = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=cwd)
    if run.returncode:
        raise RuntimeError(f"{cmd[0]} failed ({run.returncode}): {(run.stderr or run.stdout)[-800:]}")
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - t0


def folder_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def ensure_slide(path: Path) -> Path:
    if not path.exists():
        print(f"building {path} (30000 x 20000 JPEG) ...", flush=True)
        subprocess.run([sys.executable, str(HERE / "make_bench_slide.py"), "--width", "30000", "--height", "20000",
                        "--codec", "jpeg", str(path)], check=True)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("slide", nargs="?", type=Path, default=DEFAULT_SLIDE)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="wsidicomizer worker threads (default 2)")
    ap.add_argument("--baseline", type=Path, help="another checkout's folder holding its wsitool package")
    ap.add_argument("--no-orthanc", action="store_true", help="leave out OrthancWSIDicomizer (5 s a round)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    slide = ensure_slide(args.slide)
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    wsitool = [sys.executable, "-m", "wsitool"]
    orthanc = None if args.no_orthanc else shutil.which("OrthancWSIDicomizer")
    times: dict[str, list[float]] = {}
    sizes: dict[str, int] = {}
    work = Path(tempfile.mkdtemp(prefix="bench-dicom-", dir=tempfile.gettempdir()))
    try:
        for _ in range(max(1, args.repeat)):
            runs = {
                "startup": ([*wsitool, "--version"], None),
                "wsitool": ([*wsitool, "export-pyramid", str(slide), str(work / "wsitool"), "--format", "dicom",
                             "--compression", "copy", "--quiet"], work / "wsitool"),
                "cp": (["cp", str(slide), str(work / "copy.svs")], work / "copy.svs"),
            }
            if args.baseline is not None:
                runs["baseline"] = ([*wsitool, "export-pyramid", str(slide), str(work / "baseline"), "--format",
                                     "dicom", "--compression", "copy", "--quiet"], work / "baseline")
            if PEERS.exists():
                runs["wsidicomizer"] = ([str(PEERS), "-i", str(slide), "-o", str(work / "wsidicomizer"),
                                         "-w", str(args.workers)], work / "wsidicomizer")
            if orthanc:
                runs["orthanc"] = ([orthanc, f"--folder={work / 'orthanc'}", str(slide)], work / "orthanc")
            for name, (cmd, out) in runs.items():
                if name == "orthanc" and out is not None:
                    out.mkdir()
                subprocess.run(["sync"], check=True)
                # (run from the work folder: ``python -m`` puts the current folder first on sys.path, which
                # from the repository root would import this checkout's wsitool for the baseline too)
                seconds = timed(cmd, dict(env, PYTHONPATH=str(args.baseline)) if name == "baseline" else env,
                                cwd=work)
                times.setdefault(name, []).append(seconds)
                if out is not None:
                    sizes[name] = folder_bytes(out)
                    shutil.rmtree(out) if out.is_dir() else out.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    best = {name: min(t) for name, t in times.items()}
    median = {name: statistics.median(t) for name, t in times.items()}
    ratios = {f"{kind}_{name}": value for kind, table in (("best", best), ("median", median))
              for name, value in _ratios(table).items()}
    if args.json:
        print(json.dumps({"slide": str(slide), "slide_bytes": slide.stat().st_size, "seconds": times,
                          "output_bytes": sizes, "ratios": ratios}, indent=2))
        return 0
    print(f"slide {slide} ({slide.stat().st_size / 1e6:.1f} MB), {args.repeat} rounds, machine load "
          f"{os.getloadavg()[0]:.2f}")
    print(f"{'run':<14}{'best s':>9}{'median s':>10}{'output MB':>11}  runs")
    for name, seconds in best.items():
        size = f"{sizes[name] / 1e6:.1f}" if name in sizes else "-"
        runs_text = " ".join(f"{t:.2f}" for t in times[name])
        print(f"{name:<14}{seconds:>9.3f}{median[name]:>10.3f}{size:>11}  {runs_text}")
    print(f"export less start-up: best {best['wsitool'] - best['startup']:.3f} s, "
          f"median {median['wsitool'] - median['startup']:.3f} s")
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}")
    return 0


def _ratios(table: dict[str, float]) -> dict[str, float]:
    """(export less start-up) / (cp + sync), and each peer's time over the export's."""
    out = {"export_less_startup_over_cp_sync": (table["wsitool"] - table["startup"]) / table["cp"]}
    for name in ("baseline", "wsidicomizer", "orthanc"):
        if name in table:
            out[f"{name}_over_wsitool"] = table[name] / table["wsitool"]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
