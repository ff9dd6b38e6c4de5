#!/usr/bin/env python3
"""Generate the small sample slides in ``samples/`` (committed, so a fresh clone works).

Usage: ``python scripts/make_samples.py [OUT_DIR]`` (default: ``samples/`` beside this script's parent).

Writes three deterministic synthetic slides with H&E-like colours:

* ``sample-aperio-jpeg.svs``: Aperio-style SVS, 3 levels (1536 x 1152 -> 384 x 288),
  256 x 256 JPEG tiles (photometric RGB, as Aperio writes them), a stripped thumbnail,
  ImageDescription with ``AppMag = 20|MPP = 0.5``.
* ``sample-aperio-j2k.svs``: the same layout with Aperio JPEG 2000 tiles (compression
  33005, RGB), 2 levels.
* ``sample-ome-pyramid.ome.tif``: pyramidal OME-TIFF, 3 levels in SubIFDs, deflate,
  PhysicalSizeX/Y = 0.25 µm.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import tifffile


def tissue(width: int, height: int, seed: int = 7) -> np.ndarray:
    """``(height, width, 3)`` uint8 image: white background, pink stroma, purple nuclei."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    # smooth tissue mask from a few random blobs
    mask = np.zeros((height, width), np.float32)
    for _ in range(12):
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        r = rng.uniform(0.1, 0.3) * min(width, height)
        mask += np.exp(-(((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r)))
    tissue_mask = np.clip(mask - 0.35, 0, 1) * 3
    tissue_mask = np.clip(tissue_mask, 0, 1)[..., None]
    stroma = np.array([236, 168, 200], np.float32)
    white = np.array([246, 244, 246], np.float32)
    img = white * (1 - tissue_mask) + stroma * tissue_mask
    # nuclei: dark purple dots inside the tissue
    nuclei = np.zeros((height, width), np.float32)
    n = int(width * height / 900)
    xs = rng.integers(0, width, n)
    ys = rng.integers(0, height, n)
    nuclei[ys, xs] = 1.0
    k = 5
    pad = np.pad(nuclei, k)
    acc = np.zeros_like(nuclei)
    for dy in range(-k, k + 1):
        for dx in range(-k, k + 1):
            if dx * dx + dy * dy <= k * k:
                acc += pad[k + dy : k + dy + height, k + dx : k + dx + width]
    acc = np.clip(acc, 0, 1)[..., None] * tissue_mask
    purple = np.array([92, 52, 140], np.float32)
    img = img * (1 - acc) + purple * acc
    img += rng.normal(0, 2, img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def halve(img: np.ndarray) -> np.ndarray:
    """2x2 box average (odd edges dropped)."""
    h, w = img.shape[0] // 2 * 2, img.shape[1] // 2 * 2
    a = img[:h, :w].astype(np.uint16)
    return ((a[0::2, 0::2] + a[1::2, 0::2] + a[0::2, 1::2] + a[1::2, 1::2] + 2) // 4).astype(np.uint8)


def aperio_description(width: int, height: int, kind: str) -> str:
    # Layout of the Aperio ImageDescription: header line, then "key = value" fields
    # separated by "|" (OpenSlide's Aperio format notes).
    return (
        f"Aperio Image Library v12.0.0 (wsitool sample)\r\n{width}x{height} [0,0 {width}x{height}] "
        f"(256x256) {kind}|AppMag = 20|MPP = 0.5|Filename = wsitool-sample"
    )


def write_svs(path: Path, base: np.ndarray, levels: int, compression, photometric: str) -> None:
    h, w = base.shape[:2]
    kind = "JPEG/RGB Q=90" if compression == "jpeg" else "J2K/KDU Q=70"
    pyramid = [base]
    for _ in range(levels - 1):
        pyramid.append(halve(pyramid[-1]))
    thumb = pyramid[-1][::2, ::2]
    comp_args = (
        # RGB stored without the YCbCr transform, as Aperio scanners write it
        {"compression": "jpeg", "compressionargs": {"level": 85, "outcolorspace": "RGB"},
         "subsampling": (1, 1)}
        if compression == "jpeg"
        else {"compression": 33005, "compressionargs": {"level": 70}}
    )
    with tifffile.TiffWriter(path, bigtiff=False) as tw:
        tw.write(pyramid[0], tile=(256, 256), photometric=photometric, description=aperio_description(w, h, kind),
                 metadata=None, **comp_args)
        tw.write(thumb, photometric="rgb", description=f"Aperio Image Library v12.0.0\r\n{w}x{h} -> "
                 f"{thumb.shape[1]}x{thumb.shape[0]} - |AppMag = 20|MPP = 0.5", compression="jpeg",
                 rowsperstrip=16, metadata=None)
        for lvl in pyramid[1:]:
            tw.write(lvl, tile=(256, 256), photometric=photometric, subfiletype=0,
                     description=aperio_description(w, h, kind), metadata=None, **comp_args)


def write_ome(path: Path, base: np.ndarray, levels: int) -> None:
    pyramid = [base]
    for _ in range(levels - 1):
        pyramid.append(halve(pyramid[-1]))
    meta = {"axes": "YXS", "PhysicalSizeX": 0.25, "PhysicalSizeY": 0.25,
            "PhysicalSizeXUnit": "µm", "PhysicalSizeYUnit": "µm"}
    with tifffile.TiffWriter(path, ome=True) as tw:
        tw.write(pyramid[0], tile=(256, 256), photometric="rgb", compression="zlib",
                 subifds=levels - 1, metadata=meta)
        for lvl in pyramid[1:]:
            tw.write(lvl, tile=(256, 256), photometric="rgb", compression="zlib", subfiletype=1)


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent / "samples"
    out.mkdir(parents=True, exist_ok=True)
    base = tissue(1536, 1152)
    write_svs(out / "sample-aperio-jpeg.svs", base, 3, "jpeg", "rgb")
    write_svs(out / "sample-aperio-j2k.svs", base[:768, :1024], 2, "j2k", "rgb")
    write_ome(out / "sample-ome-pyramid.ome.tif", base[:768, :1024], 3)
    for p in sorted(out.glob("sample-*")):
        print(f"{p}  {p.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
