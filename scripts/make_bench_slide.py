#!/usr/bin/env python3
"""Build a large pyramidal Aperio-style slide out of REAL encoded tissue tiles, for benchmarks.

Usage::

    python scripts/make_bench_slide.py OUT.svs [--width 40000 --height 30000]
                                             [--codec jpeg|j2k] [--seed 0] [--samples DIR]
                                             [--levels N] [--mpp 0.499] [--margin 0.1]

The tiles are not re-encoded: their compressed bytes are read through the TIFF tile
offsets of a real slide in ``../shared/samples`` (or ``--samples DIR``) and copied
into a bigger tile grid, so compression ratios and decode costs are those of real
tissue:

* ``--codec jpeg`` (default): tiles of ``aperio-cmu1-small-region-jpeg.svs``
  (CMU-1-Small-Region: 240 x 240 JPEG tiles coded in RGB, 4:4:4, shared
  JPEGTables; tagged like the source: photometric RGB, with the YCbCrSubSampling
  tag (2, 2) that Aperio writes too and readers ignore for RGB).
* ``--codec j2k``: tiles of ``aperio-tcga-cr-7395-jp2k-33005-2level.svs``
  (256 x 256 Aperio JPEG 2000 tiles, compression 33005, RGB).

Only interior source tiles (no padded edge tiles) that hold tissue are used: a tile
is kept if at most 60 % of its pixels are near-white background (all channels
>= 215).  Each cell of the new grid gets a tile drawn at random (``--seed``) from
that set.

Layout (the Aperio layout OpenSlide expects, openslide.org/formats/aperio): IFD 0
is level 0 (tiled); IFD 1 a stripped JPEG thumbnail; then the lower levels, tiled,
at downsamples 4, 16, ... while a level is at least 4 tiles wide and high.  Lower
levels are filled the same way, with copied level-0-resolution tiles (their content
is not a true downsample, which does not matter for read benchmarks).  ``--levels N``
keeps at most N levels (``--levels 1``: a single-level slide; its thumbnail is then
written after level 0).  The first ImageDescription starts with ``Aperio`` and carries
``AppMag = 20|MPP = 0.499``; ``--margin F`` fills the cells within ``F`` of the width
and height from each edge with the source's most background tile, at every level (so a
tissue mask from any level finds a margin); ``--mpp`` sets another level-0 resolution in micrometres
per pixel (AppMag becomes ``round(10 / mpp)``, the 10 um/px at 1x that Aperio's
20x = 0.5 um/px pairing implies).

The file is written next to OUT under a temporary name and renamed when complete.
Nothing here is meant to be committed: write OUT outside the repository (``/tmp``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import tifffile

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SAMPLES = Path(os.environ.get("WSITOOL_SHARED", REPO.parent / "shared")) / "samples"

SOURCES = {
    "jpeg": "aperio-cmu1-small-region-jpeg.svs",
    "j2k": "aperio-tcga-cr-7395-jp2k-33005-2level.svs",
}
WHITE_LEVEL = 215      # a pixel is background when all of R, G, B are >= this
MAX_WHITE_FRACTION = 0.6


def tissue_tiles(path: Path):
    """Encoded bytes of the interior tissue tiles of level 0 of ``path``, the page, its JPEG
    tables, the tiles' pixels, and ``(bytes, pixels)`` of its most background (whitest) tile."""
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        if not page.is_tiled:
            raise SystemExit(f"{path}: level 0 is not tiled")
        th, tw = page.tilelength, page.tilewidth
        across = -(-page.imagewidth // tw)
        down = -(-page.imagelength // th)
        fh = tif.filehandle
        tiles, pixels = [], []
        whitest, white_max = None, -1.0
        for row in range(page.imagelength // th):          # full rows only
            for col in range(page.imagewidth // tw):       # full columns only
                index = row * across + col
                offset, count = page.dataoffsets[index], page.databytecounts[index]
                if not offset or not count:
                    continue
                fh.seek(offset)
                data = fh.read(count)
                arr, _, _ = page.decode(data, index, jpegtables=page.jpegtables)
                arr = np.asarray(arr).reshape(th, tw, -1)[..., :3]
                white = np.all(arr >= WHITE_LEVEL, axis=2).mean()
                if white > white_max:
                    whitest, white_max = (data, arr), white
                if white <= MAX_WHITE_FRACTION:
                    tiles.append(data)
                    pixels.append(arr)
        if not tiles:
            raise SystemExit(f"{path}: no tissue tile found among {across}x{down} tiles")
        return tiles, page, page.jpegtables, pixels, whitest


def level_sizes(width: int, height: int, tile: int) -> list[tuple[int, int]]:
    """Level 0 and the levels at downsample 4, 16, 64, ... that are still at
    least 4 tiles wide and high (Aperio's factor-4 pyramids)."""
    sizes = [(width, height)]
    d = 4
    while True:
        w, h = -(-width // d), -(-height // d)
        if w < 4 * tile or h < 4 * tile:
            return sizes
        sizes.append((w, h))
        d *= 4


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="slide to write (outside the repository, e.g. /tmp)")
    ap.add_argument("--width", type=int, default=40000, help="level-0 width in pixels (default 40000)")
    ap.add_argument("--height", type=int, default=30000, help="level-0 height in pixels (default 30000)")
    ap.add_argument("--codec", choices=sorted(SOURCES), default="jpeg",
                    help="whose tiles to copy (default jpeg)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the tile draw (default 0)")
    ap.add_argument("--levels", type=int, default=None,
                    help="keep at most this many levels (default: all, down to 4 tiles a side)")
    ap.add_argument("--mpp", type=float, default=0.499,
                    help="level-0 micrometres per pixel written to the description (default 0.499)")
    ap.add_argument("--margin", type=float, default=0.0,
                    help="fraction of the width and height on each side filled with a background tile "
                         "at every level (tissue-detection checks; default 0)")
    ap.add_argument("--samples", type=Path, default=DEFAULT_SAMPLES,
                    help=f"folder of the source slides (default {DEFAULT_SAMPLES}; "
                         "or set WSITOOL_SHARED to the folder holding samples/)")
    args = ap.parse_args(argv)
    if args.width <= 0 or args.height <= 0:
        ap.error("--width and --height must be positive")
    if not 0 <= args.margin < 0.5:
        ap.error("--margin must be in [0, 0.5)")
    if args.levels is not None and args.levels < 1:
        ap.error("--levels must be at least 1")
    if not (args.mpp > 0 and np.isfinite(args.mpp)):
        ap.error("--mpp must be a positive number")
    src = args.samples / SOURCES[args.codec]
    if not src.exists():
        ap.error(f"source slide {src} not found (set --samples or WSITOOL_SHARED)")
    t0 = time.perf_counter()
    tiles, page, jpegtables, pixels, whitest = tissue_tiles(src)
    tw, th = page.tilewidth, page.tilelength
    rng = np.random.default_rng(args.seed)
    sizes = level_sizes(args.width, args.height, tw)[:args.levels]
    print(f"{src.name}: {len(tiles)} tissue tiles of {tw}x{th}; levels {sizes}")

    # thumbnail: assembled from the pixels of the smallest level's tiles, subsampled
    grids = []
    if args.margin:  # the background tile, index len(tiles), around the tissue at every level
        tiles = [*tiles, whitest[0]]
        pixels = [*pixels, whitest[1]]
    for w, h in sizes:
        across, down = -(-w // tw), -(-h // th)
        grid = rng.integers(0, len(tiles) - (1 if args.margin else 0), size=(down, across))
        if args.margin:
            cy = (np.arange(down) + 0.5) / down
            cx = (np.arange(across) + 0.5) / across
            edge = ((cy[:, None] < args.margin) | (cy[:, None] > 1 - args.margin)
                    | (cx[None, :] < args.margin) | (cx[None, :] > 1 - args.margin))
            grid[edge] = len(tiles) - 1
        grids.append(grid)
    lw, lh = sizes[-1]
    small = np.concatenate(
        [np.concatenate([pixels[i] for i in r], axis=1) for r in grids[-1]], axis=0
    )[:lh, :lw]
    step = max(1, int(np.ceil(max(lw, lh) / 1024)))
    thumb = np.ascontiguousarray(small[::step, ::step])

    compression = 7 if args.codec == "jpeg" else 33005
    codec_name = "JPEG/RGB Q=30" if args.codec == "jpeg" else "J2K/KDU Q=70"
    desc0 = (f"Aperio Image Library v12.0.0 \r\n{args.width}x{args.height} [0,0 {args.width}x"
             f"{args.height}] ({tw}x{th}) {codec_name}|AppMag = {round(10 / args.mpp)}|"
             f"MPP = {args.mpp:g}|"
             f"Filename = wsitool-bench-{args.codec}|Source = {src.name} (tiles copied)")

    out = args.out
    tmp = out.with_name(out.name + ".partial")
    try:
        with tifffile.TiffWriter(tmp, bigtiff=True) as tif:
            def write_thumbnail() -> None:
                tif.write(thumb, photometric="rgb", compression="jpeg", rowsperstrip=16,
                          description=f"Aperio Image Library v12.0.0 \n{args.width}x"
                                      f"{args.height} -> {thumb.shape[1]}x{thumb.shape[0]} - ",
                          metadata=None)

            for i, ((w, h), grid) in enumerate(zip(sizes, grids, strict=True)):
                if i == 1:
                    write_thumbnail()
                desc = desc0 if i == 0 else (
                    f"Aperio Image Library v12.0.0 \r\n{args.width}x{args.height} [0,0 "
                    f"{args.width}x{args.height}] ({tw}x{th}) -> {w}x{h} {codec_name}")
                tif.write(
                    (tiles[k] for k in grid.ravel()),
                    shape=(h, w, 3), dtype=np.uint8, tile=(th, tw),
                    compression=compression, photometric="rgb",
                    # tifffile tags JPEG-compressed RGB as YCbCr unless told the
                    # stored colour space; these tiles are coded in RGB.
                    compressionargs={"outcolorspace": "rgb"} if args.codec == "jpeg" else None,
                    jpegtables=jpegtables if args.codec == "jpeg" else None,
                    description=desc, metadata=None,
                )
            if len(sizes) == 1:
                write_thumbnail()
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    size_mb = out.stat().st_size / 1e6
    print(f"wrote {out} ({size_mb:.0f} MB) in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
