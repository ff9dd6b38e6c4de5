#!/usr/bin/env python3
"""Benchmark batch patch reads: ``Slide.read_patches`` against per-patch reads, cuCIM, OpenSlide and the decode floor.

Usage::

    python scripts/make_bench_slide.py /tmp/pb-jpeg.svs --width 30000 --height 20000 --mpp 0.25
    python scripts/make_bench_slide.py /tmp/pb-j2k.svs --codec j2k --width 30000 --height 20000 --mpp 0.25
    python scripts/bench_patches.py /tmp/pb-jpeg.svs /tmp/pb-j2k.svs [--threads 1,2] [--rounds 3]
        [--window 8192] [--offset 37] [--patch 224] [--batch 64]
        [--tools wsitool,per-patch,cucim,openslide,floor] [--resample] [--rss-passes 20] [--json OUT]

The grid: ``patch x patch`` patches side by side (no overlap) over a ``window x window``
square of level 0 starting ``offset`` pixels past the slide's centre minus half the
window, so that patches do not line up with tiles (8192 / 224: 36 x 36 = 1,296
patches).  Every tool reads the same coordinates, in the same (row-major) order.

Method (robust to a shared, noisy machine without favouring any tool): each tool and
thread count runs in a process of its own that stays up for the whole grid: an untimed
warm-up pass (which also brings the tiles into the page cache), then one timed pass each
time the parent asks.  The parent asks the processes in turn, one pass at a time (a
*round* is one pass of each; every other round in the reverse order, so that no tool
always follows the same one), so that a load change on the machine hits neighbouring
passes of every tool alike.  ``gc.collect()`` runs, untimed, before each timed pass.
The table's rate is patches / median pass time and ``cpu s`` the median CPU seconds of a
pass (user + system, all threads: ``time.process_time``).  A target compares two tools
by the **median of the per-round ratios** (the two passes of a round ran seconds apart,
under about the same load) of their rates, ``[met]`` when that median reaches the target;
between one-thread runs the median per-round ratio of CPU seconds is printed too (it is
blind to the time a process waited for a core).  More rounds (``--rounds 15``) narrow it.

* ``wsitool``: ``Slide.read_patches(locations, (224, 224), threads=k, batch_size=64)``,
  each batch a numpy ``(b, 224, 224, 3)`` uint8 array (``mode="rgb"``).
* ``per-patch``: ``Slide.read_region(..., mode="rgb", threads=1, out=buf)`` per patch; with
  k threads a pool of k threads over the patches (one decoder per thread).
* ``cucim``: cuCIM's batch reader ``CuImage.read_region(locations, size, 0,
  num_workers=k, batch_size=64)``, each batch turned into a numpy array (CPU decode).
* ``openslide``: ``OpenSlide.read_region`` per patch (PIL RGBA; not converted to numpy,
  in OpenSlide's favour), its tile cache off; k threads: a pool sharing one object.
* ``floor``: every tile the grid touches, once: the tiles' bytes read into memory
  first (untimed; JPEGTables merged into each stream as wsitool does), then only the
  decode of each whole tile into one reused tile buffer is timed, by the library wsitool
  decodes with: libjpeg-turbo through its own API (``wsitool._jpegloop.decode_jpeg``,
  one C call a tile; nvImageCodec's CPU decoder where the extension is not built), or
  OpenJPEG for JPEG 2000; one thread, nothing assembled.

``--resample``: also the grid at half the resolution of level 0 (a 0.5 um/px grid on a
0.25 um/px slide): 224 x 224 patches each read as 448 x 448 (``read_size=448``) and
area-filtered; its floor is the tiles decoded once plus the area filter of every
window (``wsitool.ground.areafilter.AreaFilter``, timed on one pre-assembled window per patch).

``--rss-passes N``: ``read_patches`` over the grid N times in one process; the RSS after
the first pass and after the last (MiB) and the growth.

``--plan``: also time ``wsitool.patches.plan_patches(slide, mpp=0.5, size=224)`` (tissue
mask plus coordinates) on each slide, in its own process, and count the regions it reads
at level 0 (issue 34: under 2 s on a 40000 x 30000 pyramid, never level 0).

Targets (issue 31, JPEG): one thread at least 0.9x the floor and 3x cuCIM with one
worker; two threads at least 1.6x wsitool's own one-thread rate and 3x cuCIM with 2
workers; the resampled grid at least 0.8x its floor.  J2K: the floor's rate within 10 %.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def grid(width: int, height: int, window: int, offset: int, patch: int, step: int) -> list[tuple[int, int]]:
    """Row-major level-0 top-left corners of a ``window``-square grid of patches
    ``step`` level-0 pixels apart, ``offset`` past the window centred on the slide."""
    x0 = max(0, width // 2 - window // 2) + offset
    y0 = max(0, height // 2 - window // 2) + offset
    n = window // step
    return [(x0 + i * step, y0 + j * step) for j in range(n) for i in range(n)]


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# ----------------------------------------------------------------------------- workers


def _pool_map(k: int, fn, items) -> None:
    if k == 1:
        for it in items:
            fn(it)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(k) as ex:
        for _ in ex.map(fn, items, chunksize=16):
            pass


def reader(spec: dict):
    """A function running one pass of ``spec["tool"]`` over ``spec["locations"]``."""
    tool, k, path = spec["tool"], spec["threads"], spec["slide"]
    locs = spec["locations"]
    size, read = spec["patch"], spec.get("read_size")
    if tool == "wsitool":
        import wsitool

        slide = wsitool.open_slide(path)
        arr = np.asarray(locs, np.int64)

        def one_pass():
            for batch in slide.read_patches(arr, (size, size), threads=k, batch_size=spec["batch"],
                                            read_size=None if read is None else (read, read)):
                del batch
        return one_pass
    if tool == "per-patch":
        import threading

        import wsitool

        slide = wsitool.open_slide(path)
        local = threading.local()

        def one(loc):
            buf = getattr(local, "buf", None)
            if buf is None:
                buf = local.buf = np.empty((size, size, 3), np.uint8)
            slide.read_region(loc, 0, (size, size), mode="rgb", threads=1, out=buf)

        return lambda: _pool_map(k, one, locs)
    if tool == "cucim":
        from cucim import CuImage

        img = CuImage(path)
        tuples = [tuple(p) for p in locs]

        def one_pass():
            for batch in img.read_region(tuples, (size, size), 0, num_workers=k, batch_size=spec["batch"]):
                np.asarray(batch)
        return one_pass
    if tool == "openslide":
        import openslide

        slide = openslide.OpenSlide(path)
        slide.set_cache(openslide.OpenSlideCache(0))
        return lambda: _pool_map(k, lambda loc: slide.read_region(loc, 0, (size, size)), locs)
    if tool == "floor":
        return floor_pass(spec)
    raise SystemExit(f"unknown tool {tool!r}")


def floor_pass(spec: dict):
    """The decode floor: the grid's tiles, each once, decoded into one reused buffer."""
    import wsitool
    from wsitool.codec import jpegloop, openjpeg
    from wsitool.codec.library import nv
    from wsitool.slide import pyramid_levels

    slide = wsitool.open_slide(spec["slide"])
    lv = pyramid_levels(slide)[0]
    tw, th = lv.tile_width, lv.tile_height
    win = spec["read_size"] or spec["patch"]
    tiles = set()
    for x, y in spec["locations"]:
        for row in range(max(0, y) // th, min(lv.height - 1, y + win - 1) // th + 1):
            for col in range(max(0, x) // tw, min(lv.width - 1, x + win - 1) // tw + 1):
                tiles.add((row, col))
    fd = lv.source.fileno()
    raw = []
    for row, col in sorted(tiles):
        i = row * lv.tiles_across + col
        raw.append(os.pread(fd, int(lv.tiles.bytecounts[i]), int(lv.tiles.offsets[i])))
    buf = np.empty((th, tw, 3), np.uint8)
    if lv.encoding.stream == "j2k" and openjpeg.available():
        ctx = openjpeg._Context()

        def decode_all():
            for data in raw:
                openjpeg.decode_window(ctx, data, (0, 0, tw, th), 0, buf)
    elif jpegloop.libjpeg_decoder(lv) is not None:
        decode_jpeg = jpegloop.libjpeg_decoder(lv)
        prefix = lv.encoding.jpeg_prefix
        complete = [prefix + d[2:] if prefix else d for d in raw]

        def decode_all():
            for stream in complete:
                if decode_jpeg(stream, buf, 0, 0, tw, th) is not None:
                    raise RuntimeError("floor decode failed")
    else:
        nvimgcodec = nv()
        decoder = nvimgcodec.Decoder(device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=1,
                                     backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.CPU_ONLY)])
        image = nvimgcodec.as_image(buf)
        prefix = lv.encoding.jpeg_prefix
        streams = [nvimgcodec.CodeStream(prefix + d[2:] if prefix else d) for d in raw]

        def decode_all():
            for cs in streams:
                if decoder.decode(cs, image=image) is None:
                    raise RuntimeError("floor decode failed")
    if spec["read_size"] is None:
        return decode_all
    from wsitool.ground.areafilter import AreaFilter

    read, size = spec["read_size"], spec["patch"]
    window = np.random.default_rng(0).integers(0, 256, (read, read, 3), dtype=np.uint8)
    out = np.empty((size, size, 3), np.uint8)
    filt = AreaFilter(read, read, (0, 0, read, read), size, size, 3)  # the taps once, as read_patches
    n = len(spec["locations"])

    def decode_and_filter():
        decode_all()
        for _ in range(n):
            filt.apply(window, out)
    return decode_and_filter


def plan_worker(spec: dict) -> dict:
    """Time one plan of ``spec["slide"]``; count read_region calls per level."""
    import wsitool
    from wsitool.patches import plan_patches

    levels: list[int] = []
    original = wsitool.Slide.read_region

    def counted(self, location, level, size, **kwargs):
        levels.append(level)
        return original(self, location, level, size, **kwargs)

    wsitool.Slide.read_region = counted
    t0 = time.perf_counter()
    with wsitool.open_slide(spec["slide"]) as slide:
        plan = plan_patches(slide, mpp=0.5, size=224, mpp_override=None if slide.mpp else 0.25)
    return dict(plan_s=time.perf_counter() - t0, patches=len(plan), level=plan.level,
                level0_reads=levels.count(0), reads=len(levels), read_levels=sorted(set(levels)))


def worker(spec: dict) -> dict:
    """One-shot work of a subprocess: a plan timing or an RSS series."""
    if spec["tool"] == "plan":
        return plan_worker(spec)
    one_pass = reader(spec)
    one_pass()  # warm-up: page cache, decoders, buffers
    gc.collect()
    one_pass()
    first = rss_mib()
    for _ in range(spec["rss_passes"] - 1):
        one_pass()
    gc.collect()
    last = rss_mib()
    return dict(first_mib=first, last_mib=last, growth_mib=last - first)


def serve_passes(spec: dict) -> None:
    """The timed passes of one tool, one each time a line ``pass`` comes on stdin: an untimed
    warm-up first (then ``ready``), then per pass a JSON line of wall and CPU seconds."""
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the tool prints goes to stderr, not into the answers
    one_pass = reader(spec)
    one_pass()  # warm-up: page cache, decoders, buffers
    print("ready", file=answer, flush=True)
    for line in sys.stdin:
        if line.strip() != "pass":
            break
        gc.collect()
        t0 = time.perf_counter()
        c0 = time.process_time()
        one_pass()
        res = dict(time_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0)
        print(json.dumps(res), file=answer, flush=True)


# ----------------------------------------------------------------------------- parent


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


class PassWorker:
    """A tool's process (:func:`serve_passes`), asked for one timed pass at a time."""

    def __init__(self, spec: dict, timeout: float):
        self.spec, self.timeout = spec, timeout
        self.proc: subprocess.Popen | None = subprocess.Popen(
            [sys.executable, __file__, "--serve-passes"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=_env())
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(spec) + "\n")
        self.proc.stdin.flush()
        if self._line() != "ready":
            self.close()

    def _line(self) -> str | None:
        proc = self.proc
        if proc is None or proc.stdout is None:
            return None
        ready, _, _ = select.select([proc.stdout], [], [], self.timeout)
        line = proc.stdout.readline().strip() if ready else None
        if not line:
            self._failed("timed out" if not ready else f"exit {proc.wait()}")
            return None
        return line

    def _failed(self, why: str) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.kill()
        tail = " | ".join((proc.communicate()[1] or "").strip().splitlines()[-3:])
        print(f"  [{self.spec['tool']} {self.spec['threads']} thr] failed ({why}): {tail}", file=sys.stderr)

    def one_pass(self) -> dict | None:
        """``{"time_s", "cpu_s"}`` of one timed pass, or None (the process failed: see stderr)."""
        if self.proc is None or self.proc.stdin is None:
            return None
        self.proc.stdin.write("pass\n")
        self.proc.stdin.flush()
        line = self._line()
        return None if line is None else json.loads(line)

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.communicate("", timeout=self.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def run_worker(spec: dict, timeout: float) -> dict | None:
    proc = subprocess.run([sys.executable, __file__, "--worker"], input=json.dumps(spec), text=True,
                          capture_output=True, env=_env(), timeout=timeout)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        print(f"  [{spec['tool']}] failed (exit {proc.returncode}): {tail}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def available(tool: str) -> str | None:
    mod = {"cucim": "cucim", "openslide": "openslide"}.get(tool)
    if mod is None:
        return None
    try:
        __import__(mod)
    except Exception as exc:  # absent, or its native library cannot load
        return f"{mod} not importable ({type(exc).__name__})"
    return None


def interleaved_passes(configs: list[dict], rounds: int, timeout: float) -> list[list[dict | None]]:
    """Per round, one timed pass of each config (None where its process failed), asked of
    the configs' processes in turn: each process warmed up once, one after another; every
    other round in the reverse order."""
    workers = []
    try:
        for spec in configs:
            workers.append(PassWorker(spec, timeout))
        out = []
        for r in range(rounds):
            order = range(len(workers)) if r % 2 == 0 else range(len(workers) - 1, -1, -1)
            got: dict[int, dict | None] = {i: workers[i].one_pass() for i in order}
            out.append([got[i] for i in range(len(workers))])
        return out
    finally:
        for w in workers:
            w.close()


def bench_slide(path: str, args, tools: list[str], threads: list[int], resample: bool) -> list[dict]:
    import wsitool
    from wsitool.slide import pyramid_levels

    with wsitool.open_slide(path) as slide:
        width, height = slide.dimensions
        codec = pyramid_levels(slide)[0].encoding.stream
    grids = [("grid", None, args.patch)]
    if resample:
        grids.append(("resampled", 2 * args.patch, 2 * args.patch))
    results = []
    for name, read, step in grids:
        locs = grid(width, height, args.window, args.offset, args.patch, step)
        configs = []
        for tool in tools:
            why = available(tool)
            if why:
                print(f"  {tool}: skipped ({why})")
                continue
            if name == "resampled" and tool not in ("wsitool", "floor"):
                continue
            for k in ([1] if tool == "floor" else threads):
                configs.append(dict(tool=tool, threads=k, slide=path, locations=locs, patch=args.patch,
                                    read_size=read, batch=args.batch))
        rounds = interleaved_passes(configs, args.rounds, args.timeout)
        for i, spec in enumerate(configs):
            times = [r[i]["time_s"] for r in rounds if r[i] is not None]
            if not times:
                continue
            t = statistics.median(times)
            results.append(dict(slide=Path(path).name, codec=codec, grid=name, tool=spec["tool"],
                                threads=spec["threads"], patches=len(locs), median_s=t,
                                cpu_s=statistics.median(r[i]["cpu_s"] for r in rounds if r[i] is not None),
                                patches_per_s=len(locs) / t, passes=len(times),
                                round_s=[None if r[i] is None else r[i]["time_s"] for r in rounds],
                                round_cpu_s=[None if r[i] is None else r[i]["cpu_s"] for r in rounds]))
        if args.rss_passes and "wsitool" in tools:
            res = run_worker(dict(configs[0] if configs[0]["tool"] == "wsitool" else
                                  dict(tool="wsitool", threads=1, slide=path, locations=locs, patch=args.patch,
                                       read_size=read, batch=args.batch), rss_passes=args.rss_passes),
                             args.timeout)
            if res is not None:
                results.append(dict(slide=Path(path).name, codec=codec, grid=name, tool="wsitool-rss",
                                    threads=1, passes=args.rss_passes, **res))
    return results


def paired_ratio(a: dict | None, b: dict | None, key: str = "round_s") -> float | None:
    """The median over the rounds where both ran of ``b``'s pass time (or CPU seconds: key
    ``round_cpu_s``) over ``a``'s: ``a``'s rate over ``b``'s, pass by pass."""
    if a is None or b is None:
        return None
    ratios = [tb / ta for ta, tb in zip(a.get(key, ()), b.get(key, ()), strict=False) if ta and tb]
    return statistics.median(ratios) if ratios else None


def report(results: list[dict]) -> list[tuple[str, bool]]:
    """Print the table and the target lines; return ``(line, met)`` per target."""
    def row(slide, grid_name, tool, k):
        for r in results:
            if (r["slide"], r["grid"], r["tool"], r["threads"]) == (slide, grid_name, tool, k):
                return r
        return None

    print(f"\n{'slide':<16} {'grid':<10} {'tool':<10} {'thr':>3} {'patches/s':>10} {'x floor':>8} {'cpu s':>6}"
          "   (x floor: median of the per-round ratios)")
    for r in results:
        if r["tool"] == "wsitool-rss":
            continue
        fl = paired_ratio(r, row(r["slide"], r["grid"], "floor", 1))
        ratio = f"{fl:8.2f}" if fl else f"{'':>8}"
        print(f"{r['slide'][:16]:<16} {r['grid']:<10} {r['tool']:<10} {r['threads']:>3} "
              f"{r['patches_per_s']:>10.0f} {ratio} {r.get('cpu_s', float('nan')):6.3f}")
    for r in results:
        if r["tool"] == "wsitool-rss":
            print(f"{r['slide'][:16]:<16} {r['grid']:<10} RSS over {r['passes']} passes: "
                  f"{r['first_mib']:.1f} -> {r['last_mib']:.1f} MiB ({r['growth_mib']:+.1f} MiB)")
    lines = []

    def target(what, a, b, need):
        ratio = paired_ratio(a, b)
        if ratio is None:
            return
        line = f"{what}: {ratio:.2f}x (target >= {need}; median of {a['passes']} per-round ratios"
        if a["threads"] == b["threads"] == 1:
            line += f", CPU time {paired_ratio(a, b, 'round_cpu_s'):.2f}x"
        lines.append((line + ")", ratio >= need))

    for slide in dict.fromkeys(r["slide"] for r in results):
        codec = next(r["codec"] for r in results if r["slide"] == slide)
        w1, w2 = row(slide, "grid", "wsitool", 1), row(slide, "grid", "wsitool", 2)
        fl = row(slide, "grid", "floor", 1)
        if codec == "jpeg":
            target(f"{slide} 1 thread vs floor", w1, fl, 0.9)
            target(f"{slide} 1 thread vs cuCIM 1 worker", w1, row(slide, "grid", "cucim", 1), 3.0)
            target(f"{slide} 2 threads vs own 1 thread", w2, w1, 1.6)
            target(f"{slide} 2 threads vs cuCIM 2 workers", w2, row(slide, "grid", "cucim", 2), 3.0)
            target(f"{slide} resampled vs its floor", row(slide, "resampled", "wsitool", 1),
                   row(slide, "resampled", "floor", 1), 0.8)
        else:
            target(f"{slide} 1 thread vs floor", w1, fl, 0.9)
    print()
    for line, met in lines:
        print(f"  [{'met' if met else 'NOT met'}] {line}")
    return lines


def main(argv=None) -> int:
    if argv is None and sys.argv[1:] == ["--worker"]:
        print(json.dumps(worker(json.loads(sys.stdin.read()))))
        return 0
    if argv is None and sys.argv[1:] == ["--serve-passes"]:
        serve_passes(json.loads(sys.stdin.readline()))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("slides", nargs="+", help="bench slides (scripts/make_bench_slide.py)")
    ap.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds: timed passes per tool, interleaved pass by pass (default 3; 15 for the targets)")
    ap.add_argument("--window", type=int, default=8192, help="side of the grid's square, level-0 pixels")
    ap.add_argument("--offset", type=int, default=37, help="offset of the grid from the tile grid, pixels")
    ap.add_argument("--patch", type=int, default=224, help="patch side, pixels (default 224)")
    ap.add_argument("--batch", type=int, default=64, help="patches per batch (wsitool, cuCIM)")
    ap.add_argument("--tools", default="wsitool,per-patch,cucim,openslide,floor")
    ap.add_argument("--resample", action="store_true", help="also the 0.5-from-0.25 um/px grid (JPEG slides)")
    ap.add_argument("--rss-passes", type=int, default=0, help="RSS over this many read_patches passes")
    ap.add_argument("--plan", action="store_true", help="also time plan_patches (mask + coordinates)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per pass (and per warm-up)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    tools = args.tools.split(",")
    print(f"{time.strftime('%Y-%m-%d %H:%M')}  {os.cpu_count()} CPUs  {os.uname().machine}  "
          f"python {sys.version.split()[0]}")
    results = []
    for path in args.slides:
        print(f"{path}:")
        import wsitool
        from wsitool.slide import pyramid_levels

        with wsitool.open_slide(path) as s:
            codec = pyramid_levels(s)[0].encoding.stream
        results += bench_slide(path, args, tools, threads, args.resample and codec == "jpeg")
        if args.plan:
            res = run_worker(dict(tool="plan", slide=path), args.timeout)
            if res is not None:
                print(f"  plan_patches(mpp=0.5, size=224): {res['plan_s']:.2f} s, {res['patches']} patches, "
                      f"reads at levels {res['read_levels']} ({res['level0_reads']} at level 0)")
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
