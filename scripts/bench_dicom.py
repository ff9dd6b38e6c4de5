#!/usr/bin/env python
"""Read throughput of 1024x1024 regions of a large DICOM series: wsitool vs OpenSlide vs fastslide.

The series comes from scripts/make_bench_dicom.py (the JPEG bench slide's own
tiles).  Every reader reads the same seeded level-0 regions (distinct, spread
over the slide, so caches help little) after one warm-up read; the page cache
is warm for all (the file is read once before timing).  Reported: megapixels
per second of each reader and the ratios to wsitool, plus a pixel check of
wsitool against OpenSlide on one region (same JPEG bytes: must be equal).

Usage: python scripts/bench_dicom.py [/tmp/bench-dicom] [--regions 12] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import wsitool


def regions(w, h, n, size, seed=7):
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(0, w - size)), int(rng.integers(0, h - size))) for _ in range(n)]


def timed(read, locs):
    read(locs[0])  # warm-up (decoder set-up, first touch)
    t = time.perf_counter()
    for loc in locs:
        read(loc)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("series", nargs="?", default="/tmp/bench-dicom")
    ap.add_argument("--regions", type=int, default=12)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--threads", default="1,2")
    args = ap.parse_args()
    folder = Path(args.series)
    level0 = sorted(folder.glob("level-0*.dcm"))[0]
    for p in folder.glob("*.dcm"):  # warm the page cache for every reader alike
        with open(p, "rb") as fp:
            while fp.read(1 << 24):
                pass
    size = args.size
    t = time.perf_counter()
    slide = wsitool.open_slide(folder)
    open_s = time.perf_counter() - t
    locs = regions(*slide.dimensions, args.regions, size)
    mpix = len(locs) * size * size / 1e6
    results = {}
    for k in (int(v) for v in args.threads.split(",")):
        results[f"wsitool threads={k}"] = timed(
            lambda loc, k=k: slide.read_region(loc, 0, (size, size), threads=k), locs)
    try:
        import openslide

        osr = openslide.OpenSlide(str(level0))
        results["openslide"] = timed(lambda loc: osr.read_region(loc, 0, (size, size)), locs)
        ours = slide.read_region(locs[0], 0, (size, size))
        theirs = np.asarray(osr.read_region(locs[0], 0, (size, size)))
        check = int(np.abs(ours.astype(int) - theirs).max())
    except Exception as exc:  # report and go on
        results["openslide"] = f"unavailable: {exc}"
        check = None
    try:
        import fastslide

        fs = fastslide.FastSlide.from_file_path(str(level0))
        results["fastslide"] = timed(lambda loc: fs.read_region(loc, 0, (size, size)).numpy(), locs)
    except Exception as exc:
        results["fastslide"] = f"unavailable: {exc}"
    base = results[next(iter(results))]
    report = {"series": str(folder), "dimensions": slide.dimensions, "open_s": round(open_s, 4),
              "regions": len(locs), "size": size, "max_diff_vs_openslide": check, "readers": {}}
    for name, secs in results.items():
        if isinstance(secs, str):
            report["readers"][name] = secs
            continue
        report["readers"][name] = {"seconds": round(secs, 3), "mpix_per_s": round(mpix / secs, 1),
                                   "time_vs_wsitool_1_thread": round(secs / base, 2)}
    print(json.dumps(report, indent=2))
    slide.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
