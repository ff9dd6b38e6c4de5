#!/usr/bin/env python3
"""Benchmark ``wsitool export-pyramid`` against pyvips (libvips) on one slide.

Usage::

    python scripts/bench_export.py SLIDE [--format passthrough|tiff|tiff-source-levels|ome-tiff|dzi|all] [--tile-size N]
                                         [--quality Q] [--threads N] [--repeat N] [--json]
                                         [--baseline DIR]

Each export runs in its own fresh Python subprocess, so that its peak resident
memory (``ru_maxrss``) is its own.  For every format both tools write the same
kind of output from the slide's level 0:

* ``tiff``: wsitool ``format="tiff"`` (Aperio-style) vs
  ``tiffsave(tile=True, pyramid=True, compression="jpeg")``;
* ``ome-tiff``: wsitool ``format="ome-tiff"`` vs the same ``tiffsave`` with
  ``subifd=True``;
* ``dzi``: wsitool ``format="dzi"`` vs ``dzsave`` (same tile size, overlap 1,
  JPEG tiles at the same quality).
* ``tiff-source-levels``: wsitool ``format="tiff", from_source_levels=True``
  (output levels read from the source's power-of-two levels, the rest halved
  from them) vs the same ``tiffsave`` as ``tiff`` (which shrinks from level 0).
* ``passthrough``: wsitool ``format="tiff", compression="copy"`` (the source's
  tiles copied, the levels below the source's smallest one computed) vs the
  same ``tiffsave`` as ``tiff`` (libvips has no tile copy: it decodes and
  re-encodes, which is the job the copy replaces).

libvips always shrinks from level 0, and so does wsitool's re-encode in the
``tiff``, ``ome-tiff`` and ``dzi`` rows.  The
wsitool and pyvips runs of each format alternate (``--repeat`` rounds of
wsitool, pyvips), and the load average is printed before and after, so that
ratios come from one interleaved run on a shared machine.

JPEG quality, tile size and thread count are the same for both (libvips threads
via ``VIPS_CONCURRENCY``).  Printed per format: wall time of the export
alone (best of ``--repeat``), its CPU seconds (user + system of all the child's
threads during the export, the least of ``--repeat``; each run's pair is printed
too), peak RSS of the process and the peak minus the RSS after imports, and the
ratios wsitool / pyvips (below 1: wsitool is faster or smaller).  On a loaded
machine the wall ratio drifts with the other work; the CPU ratio does not.

``--baseline DIR``: a third tool, ``baseline``, the wsitool of another checkout
(``DIR`` holds its ``wsitool`` package with the compiled helpers built, e.g.
``git archive HEAD wsitool | tar -x -C DIR`` plus the ``.so`` files), run in the
same rounds, so that a change is measured before/after in one interleaved run.
Timing figures are for comparison on one machine, not pass/fail.

If pyvips or libvips is missing (``pip install pyvips pyvips-binary``), or libvips
cannot read the slide (for example Aperio JPEG 2000 tiles, which libtiff does not
decode without OpenSlide), the script says so and reports wsitool alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _rss_now() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _cpu() -> float:
    """CPU seconds (user + system, all threads) this process has used so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _child(args: argparse.Namespace) -> None:
    """Run one export in this process and print a JSON line with the figures."""
    out_dir = Path(args.out_dir)
    if args.tool in ("wsitool", "baseline"):
        sys.path.insert(0, str(REPO if args.tool == "wsitool" else Path(args.baseline)))
        from wsitool.export import export_pyramid

        base = _rss_now()
        name = {"tiff": "out.svs", "ome-tiff": "out.ome.tif", "dzi": "out.dzi",
                "passthrough": "out.svs", "tiff-source-levels": "out.svs"}[args.format]
        fmt = "tiff" if args.format in ("passthrough", "tiff-source-levels") else args.format
        extra: dict[str, Any] = {"compression": "copy"} if args.format == "passthrough" else {}
        if args.format == "tiff-source-levels":
            extra = {"from_source_levels": True}
        c0 = _cpu()
        t0 = time.perf_counter()
        export_pyramid(args.slide, out_dir / name, format=fmt, tile_size=args.tile_size,
                       quality=args.quality, overlap=1 if args.format == "dzi" else 0,
                       threads=args.threads, overwrite=True, **extra)
        seconds = time.perf_counter() - t0
    else:
        os.environ["VIPS_CONCURRENCY"] = str(args.threads)
        import pyvips

        base = _rss_now()
        c0 = _cpu()
        t0 = time.perf_counter()
        image = pyvips.Image.new_from_file(args.slide, access="sequential")
        if image.bands == 4:
            image = image.flatten(background=[255, 255, 255])
        if args.format == "dzi":
            image.dzsave(str(out_dir / "out"), tile_size=args.tile_size, overlap=1,
                         suffix=f".jpeg[Q={args.quality}]")
        else:
            image.tiffsave(str(out_dir / "out.tif"), tile=True, pyramid=True, compression="jpeg",
                           Q=args.quality, tile_width=args.tile_size, tile_height=args.tile_size,
                           subifd=args.format == "ome-tiff", bigtiff=False)
        seconds = time.perf_counter() - t0
    cpu = _cpu() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    size = sum(p.stat().st_size for p in out_dir.rglob("*") if p.is_file())
    print(json.dumps({"seconds": seconds, "cpu": cpu, "peak_rss": peak, "base_rss": base, "bytes": size}))


def _run(tool: str, slide: str, fmt: str, opts: argparse.Namespace) -> dict:
    out_dir = Path(tempfile.mkdtemp(prefix=f"bench-{tool}-", dir=opts.work_dir))
    try:
        cmd = [sys.executable, __file__, "--child", tool, slide, "--format", fmt,
               "--tile-size", str(opts.tile_size), "--quality", str(opts.quality),
               "--threads", str(opts.threads), "--out-dir", str(out_dir)]
        if tool == "baseline":
            cmd += ["--baseline", opts.baseline]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=opts.timeout)
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            reason = next((ln for ln in reversed(lines) if ln.strip()), f"exit {proc.returncode}")
            return {"error": reason[-300:]}
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {opts.timeout} s"}
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def _best(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    best = dict(min(ok, key=lambda r: r["seconds"]))
    best["peak_rss"] = max(r["peak_rss"] for r in ok)
    best["cpu"] = min(r["cpu"] for r in ok)  # (the least CPU of the runs, as the least wall time)
    best["runs"] = [(round(r["seconds"], 2), round(r["cpu"], 2)) for r in ok]
    return best


def _interleaved(tools: list[str], slide: str, fmt: str, opts: argparse.Namespace) -> dict:
    """``--repeat`` rounds of one run per tool, alternating; the best of each tool's runs."""
    runs: dict[str, list[dict]] = {t: [] for t in tools}
    for _ in range(opts.repeat):
        for t in tools:
            runs[t].append(_run(t, slide, fmt, opts))
    return {t: _best(r) for t, r in runs.items()}


def _load() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"


#: the issue's targets for wsitool / libvips (time, RSS above imports)
TARGETS = {"passthrough": 0.1, "tiff": 0.8, "tiff-source-levels": 0.8, "ome-tiff": 0.8, "dzi": 0.5}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("slide")
    p.add_argument("--format", default="all",
                   choices=["passthrough", "tiff", "tiff-source-levels", "ome-tiff", "dzi", "all"])
    p.add_argument("--tile-size", type=int, default=None,
                   help="default 256 for TIFF formats, 254 for dzi")
    p.add_argument("--quality", type=int, default=90)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--work-dir", default=None, help="folder for the temporary outputs")
    p.add_argument("--json", action="store_true", help="print the figures as JSON too")
    p.add_argument("--baseline", default=None, metavar="DIR",
                   help="also run the wsitool of another checkout (its compiled helpers built), "
                        "interleaved, as the tool 'baseline': a before/after comparison in one run")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.tool = args.child  # the parent always passes --tile-size
        _child(args)
        return 0

    try:
        import pyvips

        have_vips = True
        vips_note = f"pyvips {pyvips.__version__}, libvips {pyvips.version(0)}.{pyvips.version(1)}.{pyvips.version(2)}"
    except Exception as exc:  # ImportError, or libvips not loadable
        have_vips = False
        vips_note = f"pyvips unavailable ({type(exc).__name__}: {exc}); reporting wsitool alone"
    formats = (["passthrough", "tiff", "tiff-source-levels", "ome-tiff", "dzi"] if args.format == "all"
               else [args.format])
    sys.path.insert(0, str(REPO))
    from wsitool.export.downsample import kernel_status

    print(f"slide {args.slide}  threads {args.threads}  quality {args.quality}  {vips_note}  "
          f"wsitool box filter: {kernel_status()}")
    print(f"cpus {os.cpu_count()}  load average before {_load()}  libvips shrinks from level 0; so does "
          "wsitool except tiff-source-levels (the source's own 2**k levels) and passthrough")
    results = {}
    header = (f"{'format':18} {'tool':8} {'seconds':>8} {'CPU s':>7} {'peak RSS MB':>12} "
              f"{'above import MB':>16} {'output MB':>10}")
    print(header)
    for fmt in formats:
        opts = argparse.Namespace(**vars(args))
        opts.tile_size = args.tile_size or (254 if fmt == "dzi" else 256)
        tools = ["wsitool"] + (["baseline"] if args.baseline else []) + (["pyvips"] if have_vips else [])
        row = _interleaved(tools, args.slide, fmt, opts)
        for tool, r in row.items():
            if "error" in r:
                print(f"{fmt:18} {tool:8} failed: {r['error']}")
            else:
                print(f"{fmt:18} {tool:8} {r['seconds']:8.2f} {r['cpu']:7.2f} {r['peak_rss'] / 1e6:12.1f} "
                      f"{(r['peak_rss'] - r['base_rss']) / 1e6:16.1f} {r['bytes'] / 1e6:10.2f}  "
                      f"runs (s, CPU s): {r['runs']}")
        w, v = row["wsitool"], row.get("pyvips")
        if v and "error" not in v and "error" not in w:
            row["ratios"] = {
                "time": w["seconds"] / v["seconds"],
                "peak_rss": w["peak_rss"] / v["peak_rss"],
                "rss_above_import": (w["peak_rss"] - w["base_rss"]) / max(1, v["peak_rss"] - v["base_rss"]),
            }
            r = row["ratios"]
            r["cpu"] = w["cpu"] / v["cpu"]
            print(f"{fmt:18} ratio wsitool/pyvips: time {r['time']:.2f}x (target <= {TARGETS[fmt]}x)  "
                  f"CPU {r['cpu']:.2f}x  "
                  f"peak RSS {r['peak_rss']:.2f}x  RSS above imports {r['rss_above_import']:.2f}x "
                  "(target <= 1.0x)")
        results[fmt] = row
    print(f"load average after {_load()}")
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
