#!/usr/bin/env python3
"""Where the time of a re-encoding ``export-pyramid`` goes: decode, box filter, encode, write.

Usage::

    python scripts/profile_export.py SLIDE [--region X Y W H] [--format tiff|ome-tiff|dzi]
                                           [--tile-size N] [--quality Q] [--threads N]

The pipeline of :func:`wsitool.export.export_pyramid` is run four times on the
same region, each run adding one stage, and each stage's cost is the
difference between two runs (wall clock; the pipeline overlaps the encoder
threads with the main thread, so these are marginal costs, not CPU times):

1. ``decode``: the level-0 strips read (``StripSource.read``: tile reads,
   decodes, compositing) into the level-0 window;
2. ``box filter``: 1 plus the pyramid (``PyramidBuilder.advance``: halving,
   window trims, tile crops and edge padding);
3. ``encode``: 2 plus the encoder pool (``encoded_tiles``), tiles dropped;
4. ``write``: the whole export to a file in a temporary folder (tifffile
   or Deep Zoom tile files, the spill file of the lower levels, thumbnail,
   associated images, atomic rename).

The first run is preceded by one untimed read of the region so the page
cache holds the source for every run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's wsitool, installed or not

import wsitool
from wsitool.export import export_pyramid, pyramid_dimensions
from wsitool.export.downsample import PyramidBuilder
from wsitool.export.encode import TileCodec, encoded_tiles
from wsitool.export.source import StripSource
from wsitool.slide import pyramid_levels

REPO = Path(__file__).resolve().parents[1]


def _strips(src: StripSource, H: int):
    sy = 0
    while sy < H:
        rows = min(src.first if sy == 0 else src.strip, H - sy)
        yield sy, rows
        sy += rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("slide")
    p.add_argument("--region", type=int, nargs=4, metavar=("X", "Y", "W", "H"), default=None)
    p.add_argument("--format", default="tiff", choices=["tiff", "ome-tiff", "dzi"])
    p.add_argument("--tile-size", type=int, default=256)
    p.add_argument("--quality", type=int, default=90)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)

    slide = wsitool.open_slide(args.slide)
    lv = pyramid_levels(slide)[0]
    x, y, w, h = args.region or (0, 0, lv.width, lv.height)
    T, n = args.tile_size, args.threads
    bg = np.array([255, 255, 255], np.uint8)
    dims = pyramid_dimensions(w, h, T, args.format)
    print(f"{args.slide}: region {x},{y} {w}x{h}, {len(dims)} levels, tile {T}, {args.format}, "
          f"quality {args.quality}, threads {n}, load {os.getloadavg()[0]:.2f}")

    def source() -> StripSource:
        return StripSource(slide, 0, x, y, w, h, T, n, bg)

    def run_decode() -> None:
        src = source()
        buf = np.empty((src.strip, w, 3), np.uint8)
        for sy, rows in _strips(src, h):
            src.read(sy, buf[:rows])

    def run_filter() -> int:
        src = source()
        pyr = PyramidBuilder(dims, T, 0, pad_tiles=args.format != "dzi", strip=src.strip)
        lv0 = pyr.levels[0]
        count = 0
        for sy, rows in _strips(src, h):
            src.read(sy, lv0.tail(rows))
            lv0.n += rows
            for _ in pyr.advance():
                count += 1
        return count

    def run_encode() -> None:
        src = source()
        pyr = PyramidBuilder(dims, T, 0, pad_tiles=args.format != "dzi", strip=src.strip)
        codec = TileCodec(args.format, "jpeg", args.quality)
        for _ in encoded_tiles(src, pyr, codec, n):
            pass

    def run_write(folder: str) -> None:
        name = {"tiff": "p.svs", "ome-tiff": "p.ome.tif", "dzi": "p.dzi"}[args.format]
        export_pyramid(slide, Path(folder) / name, format=args.format, tile_size=T,
                       quality=args.quality, region=(x, y, w, h), threads=n, overwrite=True,
                       associated=False)

    run_decode()  # warm the page cache
    times = {}
    t0 = time.perf_counter()
    run_decode()
    times["decode"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    tiles = run_filter()
    times["filter"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_encode()
    times["encode"] = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="profile-export-") as folder:
        t0 = time.perf_counter()
        run_write(folder)
        times["write"] = time.perf_counter() - t0
    slide.close()
    total = times["write"]
    stages = {"decode": times["decode"], "box filter + crop": times["filter"] - times["decode"],
              "encode": times["encode"] - times["filter"], "write": times["write"] - times["encode"]}
    print(f"{tiles} tiles; full export {total:.2f} s")
    for name, sec in stages.items():
        print(f"  {name:18} {sec:7.2f} s  {100 * sec / total:5.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
