"""Write tests/region_hashes.json: OpenSlide's pixels of fixed regions of each shared sample.

For every sample listed in tests/shared_samples.json that OpenSlide (openslide-python) opens
and reads, this records its format (``OpenSlide.detect_format``), level dimensions and, for each
level, the SHA-256 of the RGBA bytes (``(h, w, 4)`` uint8, row-major) that
``OpenSlide.read_region`` returns for a few fixed regions: the top-left corner, the centre and
one straddling the bottom-right edge (partly transparent).  Samples OpenSlide does not open
are listed under ``rejected``, those it opens but cannot read a pixel of under ``unread``.

The OpenSlide parity tests compare wsitool with OpenSlide live where openslide-python is
importable; where it is not, tests/openslide/test_region_hashes.py compares wsitool's pixels
with these hashes, so the parity is still checked.  Where OpenSlide is importable, the same
test checks this file is current.

Usage::

    python scripts/make_region_hashes.py [--samples DIR] [--out FILE]

Needs openslide-python and the OpenSlide library; reads only, from ``--samples`` (default
``$WSITOOL_SHARED/samples``, else ``../shared/samples``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "tests" / "region_hashes.json"
MANIFEST = REPO / "tests" / "shared_samples.json"
#: Side of the square regions, in level pixels (smaller where the level is smaller).
REGION = 64
#: A level-0 coordinate round(c * ds) must map back to c within this many level pixels: OpenSlide
#: interpolates sub-pixel offsets, which no reader reproduces bit for bit.
ALIGN_TOL = 0.002


def aligned(c: int, ds: float, hi: int) -> int | None:
    """The level coordinate nearest ``c`` in ``[0, hi]`` whose level-0 position ``round(c * ds)``
    maps back to it within ``ALIGN_TOL``; None if none within 4,096 steps."""
    for step in range(4096):
        for cand in (c - step, c + step):
            if 0 <= cand <= hi and abs(round(cand * ds) / ds - cand) < ALIGN_TOL:
                return cand
    return None


def level_regions(width: int, height: int, ds: float) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """``((x0, y0), (w, h))`` of the fixed regions of a level: ``(x0, y0)`` in level-0 pixels,
    ``(w, h)`` in level pixels.  Top-left, centre, and over the bottom-right edge."""
    w, h = min(REGION, width), min(REGION, height)
    wanted = [(0, 0), ((width - w) // 2, (height - h) // 2), (width - w // 2, height - h // 2)]
    out = []
    for xl, yl in wanted:
        xa, ya = aligned(xl, ds, width), aligned(yl, ds, height)
        if xa is None or ya is None:
            continue
        region = ((round(xa * ds), round(ya * ds)), (w, h))
        if region not in out:
            out.append(region)
    return out


def sample_entry(openslide, path: Path) -> dict | str:
    """The record of one sample (format, levels, regions with hashes); ``"rejected"`` where
    OpenSlide does not open it, ``"unread"`` where it cannot read its first pixel."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fmt = openslide.OpenSlide.detect_format(str(path))
            osr = openslide.OpenSlide(str(path))
        except Exception:  # any refusal means: no oracle for this sample
            return "rejected"
        try:
            osr.read_region((0, 0), 0, (1, 1))
        except Exception:
            osr.close()
            return "unread"
    regions = []
    with osr:
        for level, ((width, height), ds) in enumerate(zip(osr.level_dimensions, osr.level_downsamples, strict=True)):
            for location, size in level_regions(width, height, ds):
                rgba = osr.read_region(location, level, size).tobytes()
                regions.append({"level": level, "location": list(location), "size": list(size),
                                "sha256": hashlib.sha256(rgba).hexdigest()})
        return {"format": fmt, "level_dimensions": [list(d) for d in osr.level_dimensions], "regions": regions}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(os.environ.get("WSITOOL_SHARED", REPO.parent / "shared")) / "samples"
    parser.add_argument("--samples", type=Path, default=default)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    try:
        import openslide
    except ImportError as exc:
        print(f"openslide-python is needed to write {args.out}: {exc}", file=sys.stderr)
        return 2
    if not args.samples.is_dir():
        print(f"{args.samples}: no such folder", file=sys.stderr)
        return 2
    names = json.loads(MANIFEST.read_text())["samples"]
    samples: dict[str, dict] = {}
    refused: dict[str, list[str]] = {"rejected": [], "unread": []}
    for name in names:
        entry = sample_entry(openslide, args.samples / name)
        if isinstance(entry, str):
            refused[entry].append(name)
        else:
            samples[name] = entry
    doc = {
        "about": "SHA-256 of the RGBA bytes OpenSlide's read_region returns for fixed regions of the shared "
                 "samples (location in level-0 pixels, size in level pixels). "
                 "Regenerate with: python scripts/make_region_hashes.py",
        "openslide": openslide.__library_version__,
        "samples": samples,
        **refused,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{args.out}: {len(samples)} samples, {sum(len(e['regions']) for e in samples.values())} regions, "
          f"{len(refused['rejected'])} rejected and {len(refused['unread'])} unread by OpenSlide "
          f"{openslide.__library_version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
