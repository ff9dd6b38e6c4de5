#!/usr/bin/env python3
"""Where the time of a region read goes: peel wsitool's read path apart, one step at a time.

Usage::

    python scripts/profile_read_region.py SLIDE [--size 1024] [--regions 16] [--rounds 7]

For the same seeded random ``size x size`` regions of level 0 (one thread, RGB,
one reused output buffer, tile bytes in the page cache) it times, in turns, with
``time.thread_time`` (CPU time of this thread), best of ``--rounds``:

* ``floor``: the whole-tile decode floor of ``bench_read_region.py``: prepared
  complete code streams of every tile the regions touch, each decoded whole into
  one small reused buffer (no placement);
* ``decode``: the decode calls of wsitool's plan alone: prepared code streams
  (sub-regions for partial tiles) and prepared destination images in the output;
* ``+images``: the destination images wrapped per tile (``as_image`` of a numpy
  sub-view; wsitool's batched path wraps a lighter array-interface object,
  about 2 us a tile cheaper);
* ``+streams``: the code streams (and sub-region streams) also made per tile,
  from tile bytes already in memory;
* ``+reads``: the tile bytes also read per tile with ``os.preadv`` into a
  reused buffer (JPEG tables merged in front);
* ``read_region py``: ``Slide.read_region(..., mode="rgb", threads=1, out=...)``
  on the Python path (``wsitool.codec.paths.decode_paths(native=False)``);
* ``read_region``: the same call as users make it: through the compiled JPEG
  tile loop (:mod:`wsitool.codec.jpegloop`) where it is built and applies, else the
  Python path again.

Each line prints megapixels of region per CPU-second, the ratio to the floor and
the cost per tile added over ``decode`` by all steps up to it (cumulative), so
the gap between ``decode`` and ``read_region py`` is split into image wrapping,
code-stream parsing, file reads and the rest (wsitool's own checks, counters
and bookkeeping), and the last line shows what the compiled loop leaves of it.
Only nvImageCodec-decoded levels (JPEG, JPEG 2000) are supported.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("slide", help="a slide whose level 0 is JPEG or JPEG 2000 (e.g. from make_bench_slide.py)")
    ap.add_argument("--size", type=int, default=1024, help="region width = height in pixels (default 1024)")
    ap.add_argument("--regions", type=int, default=16, help="random regions per pass (default 16)")
    ap.add_argument("--rounds", type=int, default=7, help="timed passes per step; the best counts (default 7)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the region draw (default 0)")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(REPO))
    import wsitool
    from wsitool.codec import jpegloop as native
    from wsitool.codec.library import nv
    from wsitool.codec.paths import decode_paths
    from wsitool.slide import pyramid_levels

    nvimgcodec = nv()
    from wsitool.ground.geometry import plan_tiles

    if not Path(args.slide).is_file():
        ap.error(f"{args.slide}: no such file")
    slide = wsitool.open_slide(args.slide)
    lv = pyramid_levels(slide)[0]
    if lv.decoder != "nvimagecodec":
        print(f"{args.slide}: level 0 is not decoded by nvImageCodec ({lv.compression})")
        return 2
    size = args.size
    rng = np.random.default_rng([args.seed, size])
    locs = [(int(x), int(y)) for x, y in zip(rng.integers(0, max(1, lv.width - size), args.regions),
                                             rng.integers(0, max(1, lv.height - size), args.regions), strict=True)]
    decoder = nvimgcodec.Decoder(device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY,
                                 max_num_cpu_threads=1,
                                 backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.CPU_ONLY)])
    prefix = lv.encoding.jpeg_prefix
    start = len(prefix) - 2 if prefix else 0
    out = np.empty((size, size, 3), np.uint8)

    # Every tile job of every region: (offset, count, src rect, dst slice, complete stream bytes)
    jobs = []
    for x, y in locs:
        for col, row, src, (dx0, dy0, dx1, dy1) in plan_tiles(lv, x, y, size, size)[1]:
            dst = (dy0, dy1, dx0, dx1)  # row slice, then column slice
            i = row * lv.tiles_across + col
            off, cnt = int(lv.tiles.offsets[i]), int(lv.tiles.bytecounts[i])
            data = os.pread(lv.source.fileno(), cnt, off)
            jobs.append((off, cnt, src, dst, prefix + data[2:] if prefix else data))
    ntiles = len(jobs)

    def stream(data, src):
        cs = nvimgcodec.CodeStream(data)
        x0, y0, x1, y1 = src
        if (x0, y0, x1, y1) != (0, 0, cs.width, cs.height):
            cs = cs.get_sub_code_stream(region=nvimgcodec.Region(y0, x0, y1, x1))
        return cs

    whole = [nvimgcodec.CodeStream(j[4]) for j in jobs]
    tile_buf = np.empty((lv.tile_height, lv.tile_width, 3), np.uint8)
    tile_img = nvimgcodec.as_image(tile_buf)
    streams = [stream(j[4], j[2]) for j in jobs]
    images = [nvimgcodec.as_image(out[d[0]:d[1], d[2]:d[3]]) for _o, _c, _s, d, _b in jobs]
    read_buf = np.empty(start + max(j[1] for j in jobs) + 16, np.uint8)
    read_view = memoryview(read_buf)

    def floor():
        for cs in whole:
            decoder.decode(cs, image=tile_img)

    def decode():
        for cs, img in zip(streams, images, strict=True):
            decoder.decode(cs, image=img)

    def plus_images():
        for cs, (_o, _c, _s, (dy0, dy1, dx0, dx1), _b) in zip(streams, jobs, strict=True):
            decoder.decode(cs, image=nvimgcodec.as_image(out[dy0:dy1, dx0:dx1]))

    def plus_streams():
        for _o, _c, src, (dy0, dy1, dx0, dx1), data in jobs:
            decoder.decode(stream(data, src), image=nvimgcodec.as_image(out[dy0:dy1, dx0:dx1]))

    def plus_reads():
        for off, cnt, src, (dy0, dy1, dx0, dx1), _b in jobs:
            os.preadv(lv.source.fileno(), [read_view[start:start + cnt]], off)
            if prefix:
                read_view[:start + 2] = prefix
            decoder.decode(stream(read_buf[:start + cnt], src),
                           image=nvimgcodec.as_image(out[dy0:dy1, dx0:dx1]))

    def read_region():
        for loc in locs:
            slide.read_region(loc, 0, (size, size), mode="rgb", threads=1, out=out)

    def read_region_py():  # (WSITOOL_NATIVE=0 turns the compiled loop off for both lines)
        with decode_paths(native=False):
            read_region()

    steps = [("floor", floor), ("decode", decode), ("+images", plus_images),
             ("+streams", plus_streams), ("+reads", plus_reads), ("read_region py", read_region_py),
             ("read_region", read_region)]
    best = {name: float("inf") for name, _f in steps}
    for fn in (f for _n, f in steps):  # warm-up
        fn()
    for _ in range(args.rounds):
        for name, fn in steps:
            t0 = time.thread_time()
            fn()
            best[name] = min(best[name], time.thread_time() - t0)

    mp = size * size * len(locs) / 1e6
    print(f"{Path(args.slide).name}: {len(locs)} regions of {size}x{size}, {ntiles / len(locs):.1f} "
          f"tiles/region, {lv.compression} {lv.tile_width}x{lv.tile_height} tiles; one thread, "
          f"best of {args.rounds}; {os.cpu_count()} CPU cores, load avg {os.getloadavg()[0]:.1f}")
    uses = native.applies(lv, "rgb", out)
    print(f"read_region: compiled JPEG tile loop {native.status()}; "
          f"{'used' if uses else 'not used'} for this level")
    print(f"{'step':15s} {'MP/cpu-s':>9s} {'/floor':>7s} {'us/tile over decode':>20s}")
    for name, _f in steps:
        t = best[name]
        extra = (t - best["decode"]) / ntiles * 1e6
        print(f"{name:15s} {mp / t:9.1f} {best['floor'] / t:6.2f}x "
              f"{'' if name in ('floor', 'decode') else f'{extra:+.1f}':>20s}")
    slide.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
