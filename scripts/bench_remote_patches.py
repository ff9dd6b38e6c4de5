#!/usr/bin/env python3
"""Patch batches of a remote slide: ``read_patches`` against patch-by-patch reads (issue 30).

Usage::

    python scripts/bench_remote_patches.py --slide /tmp/b.svs [--delays 0,20,50]
        [--readers read_patches,read_region,tiffslide] [--patches 512] [--size 224]
        [--threads 8] [--seconds 20] [--rounds 3] [--json OUT.json]

Make the slide first (outside the repository)::

    python scripts/make_bench_slide.py /tmp/b.svs

The slide is served by nginx (Debian ``nginx-light``) behind the delay proxy of
scripts/remote_servers.py (``delay`` ms before each request is passed on; it counts the
requests and the bytes answered).  The patches are a training-set grid: ``--patches``
patches of ``--size`` pixels side by side at level 0, 64 to a row, sorted row by row, from
a point inside the tissue of the bench slide.  Readers, each on a slide opened afresh:

* ``read_patches``: ``Slide.read_patches(locations, size)`` (batches of 64, its default
  threads), every batch consumed;
* ``read_region``: ``Slide.read_region`` of each patch on a pool of ``--threads`` threads;
* ``tiffslide``: ``tiffslide.TiffSlide(url).read_region`` of each patch on the same pool
  (fsspec's HTTP defaults).

For each: patches/s, requests and MiB answered by the proxy, and the time: the round of
median time of ``--rounds`` (each round runs every reader once, in turn).  A reader stops
after ``--seconds`` (its rate is over the patches it read).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import remote_servers as rs

READERS = ("read_patches", "read_region", "tiffslide")


def grid(count: int, size: int, origin: tuple[int, int] = (5000, 7000)) -> np.ndarray:
    """``(count, 2)`` level-0 corners: rows of 64 patches of ``size`` pixels side by side."""
    j = np.arange(count)
    return np.stack([origin[0] + (j % 64) * size, origin[1] + (j // 64) * size], 1)


def run_reader(reader: str, url: str, locs: np.ndarray, size: int, threads: int, seconds: float) -> int:
    """Patches read by ``reader`` within ``seconds`` (all of them, if it is fast enough)."""
    end = time.perf_counter() + seconds
    if reader == "read_patches":
        import wsitool
        done = 0
        with wsitool.open_slide(url) as s:
            for batch in s.read_patches(locs, (size, size), mode="rgb"):
                done += len(batch)
                if time.perf_counter() > end:
                    break
        return done
    if reader == "read_region":
        import wsitool
        slide = wsitool.open_slide(url)

        def one(xy):
            return slide.read_region(xy, 0, (size, size), mode="rgb")
    else:
        import tiffslide
        slide = tiffslide.TiffSlide(url)

        def one(xy):
            return slide.read_region(xy, 0, (size, size), as_array=True)
    done = 0
    try:
        with ThreadPoolExecutor(threads) as pool:
            for k in range(0, len(locs), threads):  # (a chunk a thread, then the clock is read)
                list(pool.map(one, [tuple(int(v) for v in xy) for xy in locs[k:k + threads]]))
                done += len(locs[k:k + threads])
                if time.perf_counter() > end:
                    break
    finally:
        slide.close()
    return done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slide", required=True, help="the JPEG bench slide (make_bench_slide.py)")
    ap.add_argument("--delays", default="0,20,50", help="ms added per request")
    ap.add_argument("--readers", default=",".join(READERS))
    ap.add_argument("--patches", type=int, default=512)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--threads", type=int, default=8, help="pool of the patch-by-patch readers")
    ap.add_argument("--seconds", type=float, default=20.0, help="most time one reader gets")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each cell (the median is reported)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    slide = Path(args.slide).resolve()
    if rs.NGINX is None:
        print("nginx is not installed (Debian: apt-get install nginx-light)", file=sys.stderr)
        return 1
    locs = grid(args.patches, args.size)
    import wsitool  # noqa: F401  (imported before the clocks start: its import is not a reader's time)
    if "tiffslide" in args.readers:
        import tiffslide  # noqa: F401
    results = []
    with rs.nginx(slide.parent) as srv:
        # each library's first-use costs (obstore's runtime and client, fsspec's session) paid
        # before the clocks start, on the server itself
        for reader in args.readers.split(","):
            run_reader(reader, f"{srv.url}{slide.name}", locs[:8], args.size, args.threads, 0.0)
        for delay in (float(d) for d in args.delays.split(",")):
            with rs.delay_proxy(srv.port, delay / 1000, counted=True) as proxy:
                url = f"http://127.0.0.1:{proxy.port}/{slide.name}"
                runs: dict[str, list[dict]] = {}
                for _ in range(args.rounds):
                    for reader in args.readers.split(","):
                        r0, b0, t0 = proxy.requests, proxy.bytes, time.perf_counter()
                        done = run_reader(reader, url, locs, args.size, args.threads, args.seconds)
                        dt = time.perf_counter() - t0
                        runs.setdefault(reader, []).append(
                            {"delay_ms": delay, "reader": reader, "patches": done, "seconds": round(dt, 3),
                             "patches_per_s": round(done / dt, 1), "requests": proxy.requests - r0,
                             "mib": round((proxy.bytes - b0) / 2**20, 1)})
                for reader, rounds in runs.items():
                    row = sorted(rounds, key=lambda r: r["seconds"])[len(rounds) // 2]
                    row["rounds_patches_per_s"] = [r["patches_per_s"] for r in rounds]
                    results.append(row)
                    print(f"{delay:4.0f} ms  {reader:13s} {row['patches_per_s']:8.1f} patches/s  "
                          f"{row['requests']:5d} requests  {row['mib']:8.1f} MiB  ({row['patches']} patches, "
                          f"{row['seconds']:.2f} s, open included; rounds: {row['rounds_patches_per_s']})", flush=True)
    print()
    print("| delay ms | reader | patches/s (median round) | each round | requests | MiB | patches | s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        each = ", ".join(f"{v:g}" for v in r["rounds_patches_per_s"])
        print(f"| {r['delay_ms']:g} | {r['reader']} | {r['patches_per_s']} | {each} | {r['requests']} | {r['mib']} | "
              f"{r['patches']} | {r['seconds']} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": os.uname().nodename, "cpus": os.cpu_count(),
                                               "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
