#!/usr/bin/env python3
"""Compare GPU and CPU region reads of the sample slides; optionally time both.

Usage::

    python scripts/gpu_compare.py [SLIDE_OR_DIR ...] [--device cuda] [--regions 6]
                                  [--json out.json] [--bench] [--bench-slide SLIDE]

For every slide (default: the TIFF-based files of ``../shared/samples`` and
``samples/``, skipping ``broken-*``), every level, the same seeded random
regions (inside, on the edges, partly outside) are read with ``device="cpu"``
and with ``--device`` in RGB and RGBA, and the absolute pixel differences are
summarised per slide: maximum and mean over all pixels.  Targets: nvJPEG vs
libjpeg-turbo (JPEG) max 4 and mean below 0.5 (different IDCT and chroma
upsampling); nvJPEG2000 vs OpenJPEG (JPEG 2000) max 2; levels decoded by
tifffile on the CPU (then copied to the GPU) exactly equal.  The alpha
channel must always be identical.

``--bench`` also times the reads (megapixels per second, median of 3 passes
after a warm-up pass) per region size on both devices: the device column of
the benchmark when ``scripts/bench_read_region.py`` has no ``--device``.

Exit status: 0 when every slide meets its target, 1 when one does not, 2 on
a usage error.  ``--device cpu`` compares the CPU path with itself (a check
of this script's plumbing on machines without a GPU).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's wsitool, installed or not

import wsitool
from wsitool.errors import WsiError
from wsitool.slide import pyramid_levels

REPO = Path(__file__).resolve().parents[1]

TOLERANCES = {"jpeg": (4, 0.5), "j2k": (2, 0.5), "cpu": (0, 0.0)}
SUFFIXES = (".svs", ".tif", ".tiff", ".qptiff")


def codec_class(compression: str, decoder: str = "nvimagecodec") -> str:
    """``"jpeg"`` / ``"j2k"`` for levels nvImageCodec decodes, ``"cpu"`` for tifffile levels."""
    if decoder != "nvimagecodec":
        return "cpu"
    return "jpeg" if compression.upper() == "JPEG" else "j2k"


def diff_stats(a: np.ndarray, b: np.ndarray) -> dict:
    """``{"max", "mean", "pixels"}`` of ``|a - b|`` over all samples (no uint8 wrap-around)."""
    d = np.abs(a.astype(np.int32) - b.astype(np.int32))
    return {"max": int(d.max()) if d.size else 0, "mean": float(d.mean()) if d.size else 0.0,
            "pixels": int(d.size)}


def verdict(compression: str, stats: dict, decoder: str | None = None) -> bool:
    """True when ``stats`` meet the target of ``compression``'s class (see module doc)."""
    if decoder is None:
        decoder = "nvimagecodec" if compression.upper() == "JPEG" or "JP" in compression.upper() \
            else "tifffile"
    max_tol, mean_tol = TOLERANCES[codec_class(compression, decoder)]
    return stats["max"] <= max_tol and stats["mean"] <= mean_tol


def slides_from(args_paths: list[str]) -> list[Path]:
    paths = [Path(p) for p in args_paths] or [REPO.parent / "shared" / "samples", REPO / "samples"]
    found: list[Path] = []
    for p in paths:
        if p.is_dir():
            found += sorted(q for q in p.iterdir() if q.suffix.lower() in SUFFIXES
                            and not q.name.startswith("broken-"))
        elif p.exists():
            found.append(p)
    return found


def regions_for(lv, n: int, rng: np.random.Generator, max_size: int = 700):
    out = []
    for i in range(n):
        w = int(rng.integers(1, min(max_size, lv.width + 64) + 1))
        h = int(rng.integers(1, min(max_size, lv.height + 64) + 1))
        kind = i % 3
        if kind == 0:
            x, y = int(rng.integers(0, max(1, lv.width - w + 1))), int(rng.integers(0, max(1, lv.height - h + 1)))
        elif kind == 1:
            x = int(rng.integers(max(0, lv.width - w), lv.width))
            y = int(rng.integers(max(0, lv.height - h), lv.height))
        else:
            x, y = int(rng.integers(-w + 1, lv.width)), int(rng.integers(-h + 1, lv.height))
        out.append((round(x * lv.downsample), round(y * lv.downsample), w, h))
    return out


def to_host(arr) -> np.ndarray:
    return arr if isinstance(arr, np.ndarray) else arr.get()


def compare_slide(path: Path, device: str, n: int, seed: int) -> dict:
    """Per-slide comparison record (see ``main`` for the fields)."""
    rng = np.random.default_rng(seed)
    rec = {"slide": path.name, "levels": [], "max": 0, "mean": 0.0, "regions": 0, "ok": True,
           "alpha_equal": True}
    total_pixels, total_sum = 0, 0.0
    with wsitool.open_slide(path) as s:
        for lv in pyramid_levels(s):
            cls = codec_class(lv.compression, lv.decoder)
            lrec = {"level": lv.index, "compression": lv.compression, "class": cls, "max": 0, "mean": 0.0}
            lpix, lsum = 0, 0.0
            for x, y, w, h in regions_for(lv, n, rng):
                for mode in ("rgb", "rgba"):
                    ref = s.read_region((x, y), lv.index, (w, h), mode=mode)
                    got = to_host(s.read_region((x, y), lv.index, (w, h), mode=mode, device=device))
                    if got.shape != ref.shape or got.dtype != ref.dtype:
                        raise SystemExit(f"{path}: shape/dtype {got.shape} {got.dtype} != {ref.shape} {ref.dtype}")
                    if mode == "rgba":
                        rec["alpha_equal"] &= bool(np.array_equal(got[..., 3], ref[..., 3]))
                        continue
                    st = diff_stats(got, ref)
                    lrec["max"] = max(lrec["max"], st["max"])
                    lpix += st["pixels"]
                    lsum += st["mean"] * st["pixels"]
                rec["regions"] += 1
            lrec["mean"] = lsum / lpix if lpix else 0.0
            lrec["ok"] = verdict(lv.compression, lrec, lv.decoder)
            rec["levels"].append(lrec)
            rec["max"] = max(rec["max"], lrec["max"])
            rec["ok"] &= lrec["ok"]
            total_pixels += lpix
            total_sum += lsum
    rec["mean"] = total_sum / total_pixels if total_pixels else 0.0
    rec["ok"] &= rec["alpha_equal"]
    rec["classes"] = sorted({lv["class"] for lv in rec["levels"]})
    return rec


def bench(path: Path, device: str, sizes: list[int], count: int, seed: int) -> list[dict]:
    """Megapixels/s of RGB reads of ``count`` random level-0 regions per size, CPU vs ``device``."""
    rows = []
    with wsitool.open_slide(path) as s:
        lv = pyramid_levels(s)[0]
        for size in sizes:
            rng = np.random.default_rng(seed + size)
            n = max(2, min(count, int(64e6 // (size * size))))
            regs = [(int(rng.integers(0, max(1, lv.width - size))), int(rng.integers(0, max(1, lv.height - size))))
                    for _ in range(n)]
            row = {"slide": path.name, "size": size, "regions": n}
            for key, dev in (("cpu_mps", "cpu"), ("device_mps", device)):
                out = None
                times = []
                for rep in range(4):
                    t0 = time.perf_counter()
                    for x, y in regs:
                        out = s.read_region((x, y), 0, (size, size), mode="rgb", out=out, device=dev)
                    if dev != "cpu":
                        import cupy

                        cupy.cuda.Device().synchronize()
                    if rep:  # first pass is the warm-up
                        times.append(time.perf_counter() - t0)
                row[key] = n * size * size / 1e6 / statistics.median(times)
            row["ratio"] = row["device_mps"] / row["cpu_mps"]
            rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="slides or folders (default: ../shared/samples and samples/)")
    ap.add_argument("--device", default="cuda", help="device to compare with the CPU (default cuda)")
    ap.add_argument("--regions", type=int, default=6, help="random regions per level")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write the full results here")
    ap.add_argument("--bench", action="store_true", help="also time CPU vs device reads")
    ap.add_argument("--bench-slide", type=Path, default=None, help="slide to time (default: largest JPEG sample)")
    ap.add_argument("--bench-sizes", default="256,1024,4096")
    ap.add_argument("--bench-regions", type=int, default=32)
    args = ap.parse_args(argv)
    logging.getLogger("tifffile").setLevel(logging.ERROR)

    if args.device != "cpu":
        from wsitool.ground.device import cuda_device_id

        try:
            cuda_device_id(args.device)
        except (WsiError, ValueError) as exc:
            print(f"gpu_compare: {exc}", file=sys.stderr)
            return 1
    slides = slides_from(args.paths)
    if not slides:
        print("gpu_compare: no slides found", file=sys.stderr)
        return 2
    records = []
    for path in slides:
        try:
            records.append(compare_slide(path, args.device, args.regions, args.seed))
        except WsiError as exc:
            records.append({"slide": path.name, "skipped": str(exc), "ok": True})
    print(f"{'slide':48} {'classes':10} {'regions':>7} {'max':>4} {'mean':>8} {'alpha':>5}  result")
    for r in records:
        if "skipped" in r:
            print(f"{r['slide'][:48]:48} skipped: {r['skipped'][:60]}")
            continue
        print(f"{r['slide'][:48]:48} {','.join(r['classes']):10} {r['regions']:>7} {r['max']:>4} "
              f"{r['mean']:>8.4f} {'same' if r['alpha_equal'] else 'DIFF':>5}  {'ok' if r['ok'] else 'FAIL'}")
    result = {"device": args.device, "slides": records}
    if args.device != "cpu":
        from wsitool.read.cuda import gpu_stats

        # levels_on_cpu > 0 or tiles_cpu_fallback > 0 means some pixels above
        # were not decoded on the GPU at all (see wsitool/read/cuda.py).
        result["gpu_stats"] = gpu_stats()
        print("gpu_stats: " + " ".join(f"{k}={v}" for k, v in result["gpu_stats"].items()))
    if args.bench:
        bench_slide = args.bench_slide
        if bench_slide is None:
            jpeg = [r for r in records if r.get("classes") == ["jpeg"]]
            names = {r["slide"] for r in jpeg}
            cands = [p for p in slides if p.name in names] or slides
            bench_slide = max(cands, key=lambda p: p.stat().st_size)
        sizes = [int(v) for v in args.bench_sizes.split(",")]
        rows = bench(bench_slide, args.device, sizes, args.bench_regions, args.seed)
        result["bench"] = rows
        print(f"\nthroughput, {bench_slide.name}, level 0, RGB, megapixels/s (median of 3)")
        print(f"{'size':>6} {'regions':>7} {'cpu':>9} {args.device:>9} {'ratio':>6}")
        for row in rows:
            print(f"{row['size']:>6} {row['regions']:>7} {row['cpu_mps']:>9.1f} {row['device_mps']:>9.1f} "
                  f"{row['ratio']:>6.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
