#!/usr/bin/env python3
"""Read benchmark: a large Philips TIFF against an Aperio SVS of the same tiles, per pixel (issue 50).

Usage::

    python scripts/bench_vendor.py [--out /tmp/wsitool-bench-vendor] [--size 20000x15000]
        [--region 1024] [--regions 24] [--rounds 5] [--threads 1] [--seed 0] [--json out.json]

Writes (once; kept in ``--out`` and reused) ``philips-large.tiff``
(``scripts/make_vendor_samples.py --large-philips``) and ``aperio-twin.svs``: an Aperio-layout
SVS whose level 0 holds the very same encoded tiles in the same places (the same draw, the same
JPEGTables), so the two files differ only in their layout.  Then, in one process, reads the
same seeded random ``R x R`` regions of level 0 from each with ``Slide.read_region(...,
mode="rgb")``: every region once untimed (page cache and decoders warm), then ``--rounds``
timed passes, the files taking turns inside each round so that a load change on a shared
machine hits both alike.  The Aperio file is also read through a second, separate slide
(``aperio-again``): the ratio of the two Aperio handles is the noise of the measurement.
Reported: megapixels per second of the median pass of each, and the
ratio Philips / Aperio (at least 1 means Philips is read at least as fast per pixel); the same
per process CPU second (less sensitive to other processes on a busy machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import tifffile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_vendor_samples import SOURCE, bench_grid, bench_tiles, philips_large, write_copied_tiles


def aperio_twin(out: Path, size: tuple[int, int], seed: int, source: Path = SOURCE) -> Path:
    """Write ``aperio-twin.svs``: level 0 the Philips file's level-0 tiles (same draw), one level."""
    tiles, tables, (tw, th) = bench_tiles(source)
    w, h = size
    grid = bench_grid(len(tiles), -(-w // tw), -(-h // th), seed)
    desc = (f"Aperio Image Library v12.0.0 \r\n{w}x{h} [0,0 {w}x{h}] ({tw}x{th}) JPEG/RGB Q=30|AppMag = 20|"
            "MPP = 0.499|Filename = wsitool-bench-twin")
    path = out / "aperio-twin.svs"
    with tifffile.TiffWriter(path, bigtiff=True) as tif:
        write_copied_tiles(tif, tiles, grid, (w, h), (tw, th), tables, description=desc)
    return path


def regions(size: tuple[int, int], edge: int, n: int, seed: int) -> list[tuple[int, int]]:
    """``n`` seeded top-left corners of ``edge`` x ``edge`` regions inside level 0."""
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(0, size[0] - edge)), int(rng.integers(0, size[1] - edge))) for _ in range(n)]


def one_pass(slide, corners: list[tuple[int, int]], edge: int, threads: int) -> tuple[float, float]:
    """``(wall seconds, process CPU seconds)`` to read every region once."""
    t0, c0 = time.perf_counter(), time.process_time()
    for x, y in corners:
        slide.read_region((x, y), 0, (edge, edge), mode="rgb", threads=threads)
    return time.perf_counter() - t0, time.process_time() - c0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/wsitool-bench-vendor"))
    ap.add_argument("--size", default="20000x15000", help="level-0 WxH of both files (default 20000x15000)")
    ap.add_argument("--region", type=int, default=1024, help="region edge in pixels (default 1024)")
    ap.add_argument("--regions", type=int, default=24, help="regions a pass (default 24)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    ap.add_argument("--threads", type=int, default=1, help="decode threads of a read (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write the numbers here too")
    args = ap.parse_args(argv)
    w, _, h = args.size.partition("x")
    size = (int(w), int(h))
    args.out.mkdir(parents=True, exist_ok=True)
    philips = args.out / "philips-large.tiff"
    twin = args.out / "aperio-twin.svs"
    if not philips.exists():
        philips_large(args.out, SOURCE, size, args.seed)
    if not twin.exists():
        aperio_twin(args.out, size, args.seed)

    import wsitool

    corners = regions(size, args.region, args.regions, args.seed)
    times: dict[str, list[tuple[float, float]]] = {"philips": [], "aperio": [], "aperio-again": []}
    with wsitool.open_slide(philips) as ps, wsitool.open_slide(twin) as aps, wsitool.open_slide(twin) as again:
        assert ps.vendor == "philips" and aps.vendor == "aperio", (ps.vendor, aps.vendor)
        x, y = corners[0]
        a = ps.read_region((x, y), 0, (args.region, args.region), mode="rgb")
        b = aps.read_region((x, y), 0, (args.region, args.region), mode="rgb")
        assert np.array_equal(a, b), "the two files do not hold the same pixels"
        slides = {"philips": ps, "aperio": aps, "aperio-again": again}
        for slide in slides.values():
            one_pass(slide, corners, args.region, args.threads)  # warm
        for r in range(args.rounds):
            order = list(slides) if r % 2 == 0 else list(reversed(slides))
            for name in order:
                times[name].append(one_pass(slides[name], corners, args.region, args.threads))
    mp = args.regions * args.region * args.region / 1e6
    result = {}
    for name, passes in times.items():
        wall = statistics.median(t for t, _ in passes)
        cpu = statistics.median(c for _, c in passes)
        result[name] = {"median_s": wall, "mp_per_s": mp / wall, "median_cpu_s": cpu, "mp_per_cpu_s": mp / cpu,
                        "passes": passes}
    ratio = result["philips"]["mp_per_s"] / result["aperio"]["mp_per_s"]
    cpu_ratio = result["philips"]["mp_per_cpu_s"] / result["aperio"]["mp_per_cpu_s"]
    noise = result["aperio-again"]["mp_per_cpu_s"] / result["aperio"]["mp_per_cpu_s"]
    summary = {"size": size, "region": args.region, "regions": args.regions, "rounds": args.rounds,
               "threads": args.threads, "results": result, "philips_over_aperio": ratio,
               "philips_over_aperio_cpu": cpu_ratio, "aperio_again_over_aperio_cpu": noise}
    for name, r in result.items():
        print(f"{name:12s} {r['mp_per_s']:8.1f} MP/s, {r['mp_per_cpu_s']:8.1f} MP/cpu-s "
              f"(median pass {r['median_s']:.3f} s, {r['median_cpu_s']:.3f} cpu-s, of {mp:.1f} MP)")
    print(f"Philips / Aperio per pixel: {ratio:.3f} (wall), {cpu_ratio:.3f} (CPU); "
          f"noise (Aperio, second handle / first): {noise:.3f} (CPU)")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
