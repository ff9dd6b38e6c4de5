"""STOW-RS upload of a DICOM series folder to Orthanc: the uploader's peak memory and time, and the read-back.

Starts Orthanc with its DICOMweb plugin on 127.0.0.1 (scripts/dicomweb_servers.py; Debian:
apt-get install orthanc orthanc-dicomweb), runs ``wsitool stow FOLDER URL`` in a child
process ``--repeat`` times (a fresh Orthanc each time) and reports, as one JSON object: the
series' size, the child's peak RSS (its VmHWM) and wall time (median),
the same child's peak RSS storing one small file (``baseline``: what the interpreter and
its imports cost), Orthanc's own peak (VmHWM: it holds a request whole), and whether
regions read back through DICOMweb equal the local read (the whole smallest level and
``--regions`` random 1024x1024 regions of level 0).

A large series: ``python scripts/make_bench_slide.py /tmp/stow-bench/bench-jpeg.svs --width 30000
--height 20000`` then ``python scripts/make_bench_dicom.py /tmp/stow-bench/bench-jpeg.svs
/tmp/stow-bench/dicom`` (236 MB).  Usage: ``python scripts/bench_stow.py [FOLDER] [--batch-mb 128]
[--repeat 3] [--regions 5]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pydicom

import wsitool

HERE = Path(__file__).resolve().parent


def _servers():
    spec = importlib.util.spec_from_file_location("dicomweb_servers", HERE / "dicomweb_servers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: ``wsitool stow`` writing its own peak (VmHWM, in KiB) to ``argv[1]`` as it exits: ``os.wait4``'s
#: ``ru_maxrss`` would count the pages of the parent it was forked from (this script's, after a read-back).
CHILD = """
import atexit, sys
def peak():
    with open("/proc/self/status") as fp:
        line = next(line for line in fp if line.startswith("VmHWM:"))
    with open(sys.argv[1], "w") as out:
        out.write(line.split()[1])
atexit.register(peak)
from wsitool.cli import main
main(["stow", *sys.argv[2:]])
"""


def child_stow(paths: list[str], url: str, batch_mb: float) -> tuple[int, float, float]:
    """``(exit code, peak RSS MiB, seconds)`` of ``wsitool stow PATHS URL`` in a child."""
    with tempfile.NamedTemporaryFile("r") as out:
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", CHILD, out.name, *paths, url, "--batch-mb", str(batch_mb)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        seconds = time.perf_counter() - start
        if proc.returncode:
            sys.exit(f"wsitool stow exited {proc.returncode}: {proc.stderr.decode(errors='replace')}")
        return proc.returncode, int(out.read()) / 1024, seconds


def peak_of(pid: int) -> float:
    """VmHWM of process ``pid`` in MiB (0 where not readable)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def read_back(root: str, folder: Path, regions: int) -> bool:
    """Whether the series read through DICOMweb equals the local read (smallest level whole, random regions)."""
    first = sorted(folder.glob("*.dcm"))[0]
    ds = pydicom.dcmread(first, stop_before_pixels=True)
    url = f"{root}/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}"
    rng = random.Random(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with wsitool.open_slide(url) as remote, wsitool.open_slide(folder) as local:
            if remote.level_dimensions != local.level_dimensions:
                return False
            last = remote.level_count - 1
            if not np.array_equal(remote.read_region((0, 0), last, local.level_dimensions[last]),
                                  local.read_region((0, 0), last, local.level_dimensions[last])):
                return False
            w, h = local.level_dimensions[0]
            for _ in range(regions):
                x, y = rng.randrange(max(1, w - 1024)), rng.randrange(max(1, h - 1024))
                if not np.array_equal(remote.read_region((x, y), 0, (1024, 1024)),
                                      local.read_region((x, y), 0, (1024, 1024))):
                    return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("folder", nargs="?", default="/tmp/stow-bench/dicom")
    ap.add_argument("--batch-mb", type=float, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--regions", type=int, default=5)
    args = ap.parse_args()
    folder = Path(args.folder)
    files = sorted(p for p in folder.iterdir() if p.is_file())
    size = sum(p.stat().st_size for p in files)
    servers = _servers()
    peaks, times, orthanc_peaks, equal = [], [], [], True
    baseline = 0.0
    for k in range(args.repeat):
        with servers.orthanc() as server:
            if k == 0:
                baseline = child_stow([str(files[-1])], server.root, args.batch_mb)[1]
            _, peak, seconds = child_stow([str(folder)], server.root, args.batch_mb)
            peaks.append(peak)
            times.append(seconds)
            orthanc_peaks.append(peak_of(server.pid))
            if k == 0:
                equal = read_back(server.root, folder, args.regions)
    print(json.dumps({
        "series_mb": round(size / (1 << 20), 1), "files": len(files), "largest_file_mb":
        round(max(p.stat().st_size for p in files) / (1 << 20), 1), "batch_mb": args.batch_mb,
        "stow_peak_rss_mb": round(statistics.median(peaks), 1), "stow_peak_rss_mb_runs": [round(p, 1) for p in peaks],
        "baseline_peak_rss_mb (one small file)": round(baseline, 1),
        "stow_seconds": round(statistics.median(times), 2),
        "mb_per_s": round(size / (1 << 20) / statistics.median(times), 1),
        "orthanc_peak_rss_mb": round(statistics.median(orthanc_peaks), 1),
        "read_back_equal": equal,
    }, indent=2))


if __name__ == "__main__":
    main()
