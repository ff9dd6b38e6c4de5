#!/usr/bin/env python3
"""Benchmark the DICOM export's passthrough (``export-pyramid --format dicom -c copy``) against ``cp`` + ``sync``
and wsidicomizer (issue 52).

Usage::

    python scripts/bench_dicom_export.py [SLIDE] [--repeat N] [--workers N] [--json]

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

Printed: the best wall time of each over ``--repeat`` rounds, the export less
the start-up, and the ratios (export less start-up) / (cp + sync) and
wsidicomizer / export.  Timings compare tools on one machine; they are not
pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_SLIDE = Path(tempfile.gettempdir()) / "wsitool-bench-dicom-30000x20000.svs"
PEERS = Path(os.environ.get("WSIDICOMIZER", "/work/venv-peers/bin/wsidicomizer"))


def timed(cmd: list[str], env: dict | None = None) -> float:
    """Wall time of ``cmd`` then ``sync`` (seconds); raises if ``cmd`` fails."""
    t0 = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
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
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    slide = ensure_slide(args.slide)
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    wsitool = [sys.executable, "-m", "wsitool"]
    orthanc = shutil.which("OrthancWSIDicomizer")
    best: dict[str, float] = {}
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
            if PEERS.exists():
                runs["wsidicomizer"] = ([str(PEERS), "-i", str(slide), "-o", str(work / "wsidicomizer"),
                                         "-w", str(args.workers)], work / "wsidicomizer")
            if orthanc:
                runs["orthanc"] = ([orthanc, f"--folder={work / 'orthanc'}", str(slide)], work / "orthanc")
            for name, (cmd, out) in runs.items():
                if name == "orthanc" and out is not None:
                    out.mkdir()
                seconds = timed(cmd, env)
                best[name] = min(best.get(name, float("inf")), seconds)
                if out is not None:
                    sizes[name] = folder_bytes(out)
                    shutil.rmtree(out) if out.is_dir() else out.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    export = best["wsitool"] - best["startup"]
    ratios = {"export_less_startup_over_cp_sync": export / best["cp"]}
    if "wsidicomizer" in best:
        ratios["wsidicomizer_over_wsitool"] = best["wsidicomizer"] / best["wsitool"]
    if "orthanc" in best:
        ratios["orthanc_over_wsitool"] = best["orthanc"] / best["wsitool"]
    if args.json:
        print(json.dumps({"slide": str(slide), "slide_bytes": slide.stat().st_size, "best_seconds": best,
                          "output_bytes": sizes, "ratios": ratios}, indent=2))
        return 0
    print(f"slide {slide} ({slide.stat().st_size / 1e6:.1f} MB), best of {args.repeat}, cwd machine load "
          f"{os.getloadavg()[0]:.2f}")
    print(f"{'run':<14}{'seconds':>9}{'output MB':>11}")
    for name, seconds in best.items():
        size = f"{sizes[name] / 1e6:.1f}" if name in sizes else "-"
        print(f"{name:<14}{seconds:>9.3f}{size:>11}")
    print(f"{'export - start-up':<18}{export:>5.3f}")
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
