#!/usr/bin/env python3
"""Benchmark region reads: wsitool against OpenSlide, tiffslide and the decode floor.

Usage::

    python scripts/bench_read_region.py SLIDE [--size 256,1024,4096] [--threads 1,2]
        [--regions N] [--budget-mp 24] [--reps 3] [--level 0] [--seed 0]
        [--tools wsitool,openslide,tiffslide,floor] [--json out.json]

Make a slide first with ``scripts/make_bench_slide.py`` (real tissue tiles).

What one run does:

* Draws, per region size ``S``, the same seeded random ``S x S`` regions inside
  level ``--level`` (``--regions N`` of them, or by default as many as fill
  ``--budget-mp`` megapixels, at least 2).
* Runs each tool in its own subprocess (so peak RSS is per tool): a warm-up pass
  over the first regions, then ``--reps`` timed passes over all regions; the
  reported time is the median pass.  Throughput = region megapixels / median time.
* Peak RSS: before the timed passes of each configuration the process's high-water
  mark is reset (``/proc/self/clear_refs``, Linux); ``peak+`` is VmHWM minus the
  RSS of the idle (opened, warmed-up) process, next to the size of one output.
  Each pass drops a region's array before reading the next.
* Tools and what is timed:

  - ``wsitool``: ``Slide.read_region(..., mode="rgb" | "rgba")`` -> numpy.  With 2
    threads two ways are measured and both printed: ``threads=2`` inside each read
    (regions one after another), and a pool of 2 threads over regions with
    ``threads=1`` per read (how a data loader parallelises patches).
  - OpenSlide (openslide-python + openslide-bin): ``read_region`` -> PIL RGBA image
    (the numpy conversion is NOT timed, in OpenSlide's favour).  2 threads: a pool
    of 2 threads over regions sharing one ``OpenSlide`` object.
  - tiffslide: ``read_region(..., as_array=True)`` -> RGB numpy.  2 threads: a pool
    of 2 threads over regions sharing one ``TiffSlide``.
  - ``floor``: the decode floor.  The whole tiles each region touches (counted once
    per region, as a reader without a cache must) are read into memory first and
    made complete code streams (JPEGTables merged, as wsitool does); the timed part
    is only ``Decoder.decode`` of each whole tile into one reused tile buffer, one
    nvImageCodec CPU decoder (libjpeg-turbo / OpenJPEG), one thread, no placement.
    ``wsitool / floor`` > 1 means wsitool is faster than merely decoding the tiles
    (possible because partial tiles are decoded as sub-regions).

A checksum of the first region of each size is compared between tools and a
mismatch is reported (the tools must read the same pixels).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TOOLS = ("wsitool", "openslide", "tiffslide", "floor")


# ----------------------------------------------------------------------------- memory


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def rss_mib() -> float:
    return _status_kib("VmRSS") / 1024.0


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_mib() -> float:
    return _status_kib("VmHWM") / 1024.0


# ----------------------------------------------------------------------------- regions


def make_regions(width: int, height: int, size: int, count: int, seed: int, downsample: float):
    """``count`` (x0, y0) level-0 locations of ``size x size`` regions inside the level."""
    rng = np.random.default_rng([seed, size])
    xs = rng.integers(0, max(1, width - size), count)
    ys = rng.integers(0, max(1, height - size), count)
    return [(int(round(x * downsample)), int(round(y * downsample))) for x, y in zip(xs, ys)]


# ----------------------------------------------------------------------------- workers


def _timed_passes(read_one, regions, reps: int, threads: int, warm: int):
    """Warm up, reset the peak, run ``reps`` passes; return (times, idle MiB, peak MiB)."""
    for loc in regions[:warm]:
        arr = read_one(loc)
        del arr
    gc.collect()
    idle = rss_mib()
    reset_peak()
    times = []
    pool = ThreadPoolExecutor(threads) if threads > 1 else None
    try:
        for _ in range(reps):
            t0 = time.perf_counter()
            if pool is None:
                for loc in regions:
                    arr = read_one(loc)
                    del arr
            else:
                for arr in pool.map(read_one, regions):
                    del arr
            times.append(time.perf_counter() - t0)
    finally:
        if pool is not None:
            pool.shutdown()
    return times, idle, peak_mib()


def _checksum(arr) -> int:
    a = np.asarray(arr)
    return int(a[..., :3].astype(np.uint64).sum())


def worker(spec: dict) -> list[dict]:
    tool = spec["tool"]
    path, level, reps = spec["slide"], spec["level"], spec["reps"]
    results = []

    def record(size, threads, config, regions, times, idle, peak, out_bytes, checksum):
        px = size * size * len(regions)
        med = statistics.median(times)
        results.append(dict(
            tool=tool, config=config, size=size, threads=threads, regions=len(regions),
            times_s=times, median_s=med, mp_per_s=px / med / 1e6,
            idle_rss_mib=idle, peak_rss_mib=peak, peak_over_idle_mib=peak - idle,
            output_mib=out_bytes / 2**20, checksum=checksum,
        ))

    if tool == "wsitool":
        import wsitool

        slide = wsitool.open_slide(path)
        for size_s, regions in spec["regions"].items():
            size = int(size_s)
            for mode in spec["modes"]:
                chans = 3 if mode == "rgb" else 4
                first = slide.read_region(regions[0], level, (size, size), mode=mode, threads=1)
                cks = _checksum(first)
                del first
                for threads in spec["threads"]:
                    variants = [("threads=1", 1, 1)] if threads == 1 else [
                        (f"threads={threads}", threads, 1),
                        (f"pool{threads}", 1, threads),
                    ]
                    for name, intra, pool in variants:
                        def read_one(loc, intra=intra, mode=mode, size=size):
                            return slide.read_region(loc, level, (size, size), mode=mode,
                                                     threads=intra)
                        t, idle, peak = _timed_passes(read_one, regions, reps, pool, spec["warm"])
                        record(size, threads, f"{mode} {name}", regions, t, idle, peak,
                               size * size * chans, cks)
    elif tool == "openslide":
        import openslide

        slide = openslide.OpenSlide(path)
        for size_s, regions in spec["regions"].items():
            size = int(size_s)
            cks = _checksum(slide.read_region(regions[0], level, (size, size)))
            for threads in spec["threads"]:
                def read_one(loc, size=size):
                    return slide.read_region(loc, level, (size, size))
                t, idle, peak = _timed_passes(read_one, regions, reps, threads, spec["warm"])
                record(size, threads, "rgba PIL" + (f" pool{threads}" if threads > 1 else ""),
                       regions, t, idle, peak, size * size * 4, cks)
    elif tool == "tiffslide":
        import tiffslide

        slide = tiffslide.TiffSlide(path)
        for size_s, regions in spec["regions"].items():
            size = int(size_s)
            cks = _checksum(slide.read_region(regions[0], level, (size, size), as_array=True))
            for threads in spec["threads"]:
                def read_one(loc, size=size):
                    return slide.read_region(loc, level, (size, size), as_array=True)
                t, idle, peak = _timed_passes(read_one, regions, reps, threads, spec["warm"])
                record(size, threads, "rgb numpy" + (f" pool{threads}" if threads > 1 else ""),
                       regions, t, idle, peak, size * size * 3, cks)
    elif tool == "floor":
        results.extend(floor_worker(spec))
    else:
        raise SystemExit(f"unknown tool {tool}")
    return results


def floor_worker(spec: dict) -> list[dict]:
    """Whole-tile decode floor: one nvImageCodec CPU decoder, one thread, no placement."""
    import wsitool
    from wsitool.decode import nvimgcodec

    slide = wsitool.open_slide(spec["slide"])
    lv = slide.levels[spec["level"]]
    if lv.decoder != "nvimagecodec":
        return []
    tw, th = lv.tile_width, lv.tile_height
    decoder = nvimgcodec.Decoder(device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY,
                                 max_num_cpu_threads=1,
                                 backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.CPU_ONLY)])
    buf = np.empty((th, tw, 3), np.uint8)
    image = nvimgcodec.as_image(buf)
    prefix = lv._jpeg_prefix
    out = []
    for size_s, regions in spec["regions"].items():
        size = int(size_s)
        streams = []
        for x0, y0 in regions:
            x, y = int(x0 // lv.downsample), int(y0 // lv.downsample)
            for row in range(y // th, (y + size - 1) // th + 1):
                for col in range(x // tw, (x + size - 1) // tw + 1):
                    i = row * lv.tiles_across + col
                    off, cnt = int(lv._offsets[i]), int(lv._bytecounts[i])
                    data = os.pread(lv._fd, cnt, off)
                    if prefix:
                        data = prefix + data[2:]
                    streams.append(nvimgcodec.CodeStream(data))
        tiles_per_region = len(streams) / len(regions)

        def one_pass():
            for cs in streams:
                r = decoder.decode(cs, image=image)
                if r is None:
                    raise RuntimeError("floor decode failed")

        one_pass()  # warm-up
        gc.collect()
        idle = rss_mib()
        reset_peak()
        times = []
        for _ in range(spec["reps"]):
            t0 = time.perf_counter()
            one_pass()
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        px = size * size * len(regions)
        out.append(dict(
            tool="floor", config=f"decode {tiles_per_region:.1f} whole tiles/region", size=size,
            threads=1, regions=len(regions), times_s=times, median_s=med,
            mp_per_s=px / med / 1e6, idle_rss_mib=idle, peak_rss_mib=peak_mib(),
            peak_over_idle_mib=peak_mib() - idle, output_mib=0.0, checksum=None,
            tile_mp_per_s=len(streams) * tw * th / med / 1e6,
        ))
    return out


# ----------------------------------------------------------------------------- parent


def run_tool(tool: str, spec: dict, timeout: float) -> list[dict]:
    spec = dict(spec, tool=tool)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, __file__, "--worker"], input=json.dumps(spec), text=True,
        capture_output=True, env=env, timeout=timeout,
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-5:]
        print(f"[{tool}] failed (exit {proc.returncode}): " + " | ".join(tail), file=sys.stderr)
        return []
    return json.loads(proc.stdout.strip().splitlines()[-1])


def print_table(results: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    def best(tool, size, threads, prefix=""):
        cands = [r for r in results if r["tool"] == tool and r["size"] == size
                 and r["threads"] == threads and r["config"].startswith(prefix)]
        return max(cands, key=lambda r: r["mp_per_s"]) if cands else None

    table = Table(title=title)
    for col in ("size", "thr", "tool", "config", "MP/s", "/OpenSlide", "/tiffslide", "/floor",
                "peak+ MiB", "out MiB"):
        table.add_column(col, justify="left" if col in ("tool", "config") else "right")
    sizes = sorted({r["size"] for r in results})
    threads_list = sorted({r["threads"] for r in results})
    order = {t: i for i, t in enumerate(TOOLS)}
    for size in sizes:
        floor = best("floor", size, 1)
        for threads in threads_list:
            osl, tsl = best("openslide", size, threads), best("tiffslide", size, threads)
            rows = [r for r in results if r["size"] == size and r["threads"] == threads]
            rows.sort(key=lambda r: (order.get(r["tool"], 9), r["config"]))
            for r in rows:
                ratio = lambda ref: f"{r['mp_per_s'] / ref['mp_per_s']:.2f}x" if ref else "-"
                is_ws = r["tool"] == "wsitool"
                table.add_row(
                    str(size), str(threads), r["tool"], r["config"], f"{r['mp_per_s']:.1f}",
                    ratio(osl) if is_ws else "", ratio(tsl) if is_ws else "",
                    ratio(floor) if is_ws else "",
                    f"{r['peak_over_idle_mib']:.1f}", f"{r['output_mib']:.1f}",
                )
        table.add_section()
    Console(width=150).print(table)
    # checksums
    for size in sizes:
        sums = {(r["tool"], r["config"].split()[0]): r["checksum"] for r in results
                if r["size"] == size and r["checksum"] is not None}
        if len(set(sums.values())) > 1:
            print(f"WARNING: tools read different pixels for the first {size}x{size} region: {sums}")


def main(argv=None) -> int:
    if argv is None and "--worker" in sys.argv[1:]:
        spec = json.loads(sys.stdin.read())
        print(json.dumps(worker(spec)))
        return 0
    ap = argparse.ArgumentParser(description="wsitool vs OpenSlide vs tiffslide vs decode floor")
    ap.add_argument("slide")
    ap.add_argument("--size", default="256,1024,4096", help="region sizes (square), comma list")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma list")
    ap.add_argument("--regions", type=int, default=None,
                    help="regions per size (default: fill --budget-mp, at least 2)")
    ap.add_argument("--budget-mp", type=float, default=24.0,
                    help="megapixels per timed pass when --regions is not given")
    ap.add_argument("--reps", type=int, default=3, help="timed passes (median reported)")
    ap.add_argument("--level", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--modes", default="rgb,rgba", help="wsitool output modes")
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per tool subprocess")
    ap.add_argument("--json", type=Path, default=None, help="write all results here")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(REPO))
    import wsitool

    with wsitool.open_slide(args.slide) as slide:
        lv = slide.levels[args.level]
        lw, lh, ds = lv.width, lv.height, lv.downsample
        desc = f"{Path(args.slide).name}: level {args.level} {lw}x{lh}, {lv.compression}, " \
               f"tiles {lv.tile_width}x{lv.tile_height}"
    sizes = [int(s) for s in args.size.split(",") if s]
    threads = [int(t) for t in args.threads.split(",") if t]
    regions = {}
    for s in sizes:
        n = args.regions or max(2, int(round(args.budget_mp * 1e6 / (s * s))))
        regions[str(s)] = make_regions(lw, lh, s, n, args.seed, ds)
    spec = dict(slide=str(Path(args.slide).resolve()), level=args.level, reps=args.reps,
                regions=regions, threads=threads, modes=args.modes.split(","),
                warm=2)
    results = []
    for tool in args.tools.split(","):
        t0 = time.perf_counter()
        results.extend(run_tool(tool, spec, args.timeout))
        print(f"[{tool}] done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    title = (f"{desc}; {when}; {os.cpu_count()} CPU cores; medians of {args.reps} passes; "
             f"regions per size: " + ", ".join(f"{s}:{len(r)}" for s, r in regions.items()))
    print_table(results, title)
    if args.json:
        args.json.write_text(json.dumps(dict(
            slide=args.slide, description=desc, date=when, cpu_count=os.cpu_count(),
            machine=platform.platform(), reps=args.reps, regions=regions, results=results,
        ), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
