#!/usr/bin/env python
"""Fuzz the DICOM format: mutated headers, frame offsets and frame bytes of real DICOM seeds.

Each mutated file is opened and read (every level, a few regions, associated
images) in a fresh subprocess, so a crash (segfault, abort) of a native decoder
is caught as a non-zero signal exit instead of killing the fuzzer.  Allowed
outcomes: the read works, or it raises a :class:`wsitool.WsiError` subclass.
Anything else (another exception, a crash, a hang past the timeout) is a
finding; the input is kept under ``--out``.

Seeds: every DICOM file in ../shared/samples (and the files of its series
folders).  Mutations:

* header: random bytes of the first ``pixel_pos`` bytes flipped / set to 0xFF
  / 0x00, or a 4-byte value replaced by an extreme integer;
* offsets: bytes of the Basic Offset Table and of fragment item headers (the
  8 bytes before each frame) mutated;
* frames: bytes inside a frame flipped, a frame truncated by moving the end
  of the file, a frame's SOI / SIZ header mutated.

Usage: python scripts/fuzz_dicom.py --seconds 300 --out /tmp/fuzz-dicom
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLES = Path(os.environ.get("WSITOOL_SHARED", REPO.parent / "shared")) / "samples"

CHILD = r"""
import sys, warnings
warnings.simplefilter("ignore")
import wsitool
from wsitool.slide import pyramid_levels
from wsitool.errors import WsiError
path = sys.argv[1]
try:
    with wsitool.open_slide(path) as s:
        for lv in pyramid_levels(s):
            for (x, y, w, h) in ((0, 0, 300, 300), (lv.width - 50, lv.height - 50, 100, 100)):
                try:
                    s.read_region((int(x * lv.downsample), int(y * lv.downsample)), lv.index,
                                  (w, h), on_error="raise")
                except WsiError:
                    pass
                try:
                    s.read_region((0, 0), lv.index, (min(lv.width, 256), min(lv.height, 256)), mode="raw")
                except WsiError:
                    pass
        for name in s.associated_images:
            try:
                s.associated_images[name]
            except WsiError:
                pass
except WsiError:
    pass
print("OK")
"""


def seeds() -> list[Path]:
    out = sorted(SAMPLES.glob("dicom-*.dcm"))
    for folder in sorted(SAMPLES.glob("dicom-*")):
        if folder.is_dir():
            out.extend(sorted(folder.glob("*.dcm"))[:3])
    return [p for p in out if p.stat().st_size < 2_500_000]


def layout(path: Path):
    """``(pixel_pos, frame ranges)`` of a seed, from wsitool itself (unmutated)."""
    # (wsitool imported here, not at the top: the parent stays light)
    from wsitool.formats.dicom.encoding import is_encapsulated
    from wsitool.formats.dicom.frames import frame_table
    from wsitool.formats.dicom.instance import read_instance

    inst = read_instance(str(path))
    offsets, counts, _ = frame_table(inst, is_encapsulated(inst.transfer_syntax))
    return inst.pixel_pos, [(int(o), int(c)) for o, c in zip(offsets, counts, strict=True)]


def mutate(data: bytearray, pixel_pos: int, frames, rng: random.Random) -> tuple[bytearray, str]:
    kind = rng.choice(["header", "header", "offsets", "frames", "truncate", "frame-head"])
    d = bytearray(data)
    if kind == "header":
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(132, max(133, pixel_pos))
            if rng.random() < 0.3 and i + 4 <= len(d):
                d[i:i + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\xff\xff\xff\x7f",
                                         b"\x01\x00\x00\x00"])
            else:
                d[i] = rng.randrange(256)
    elif kind == "offsets":
        for _ in range(rng.randint(1, 4)):
            if frames and rng.random() < 0.7:
                off, _count = rng.choice(frames)
                i = off - 8 + rng.randrange(8)
            else:
                i = pixel_pos + rng.randrange(40)
            if 0 <= i < len(d):
                d[i] = rng.randrange(256)
    elif kind == "frames" and frames:
        off, count = rng.choice(frames)
        for _ in range(rng.randint(1, 16)):
            if count:
                d[off + rng.randrange(count)] = rng.randrange(256)
    elif kind == "truncate":
        cut = rng.randrange(pixel_pos, len(d)) if pixel_pos < len(d) else len(d) // 2
        d = d[:cut]
    elif kind == "frame-head" and frames:
        off, count = rng.choice(frames)
        for _ in range(rng.randint(1, 6)):
            i = off + rng.randrange(min(count, 64) or 1)
            if i < len(d):
                d[i] = rng.randrange(256)
    return d, kind


def run_one(path: Path, timeout: float) -> tuple[str, str]:
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "hang", ""
    if proc.returncode < 0:
        return f"crash (signal {-proc.returncode})", proc.stderr[-2000:]
    if proc.returncode != 0 or "OK" not in proc.stdout:
        return "exception", proc.stderr[-2000:]
    return "ok", ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=30)
    ap.add_argument("--out", default="/tmp/fuzz-dicom")
    ap.add_argument("--replay", nargs="*", help="re-run saved inputs instead of fuzzing")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.replay:
        bad = 0
        for p in args.replay:
            verdict, err = run_one(Path(p), args.timeout)
            print(p, verdict, err.strip().splitlines()[-1:] if err else "")
            bad += verdict != "ok"
        return 1 if bad else 0
    rng = random.Random(args.seed)
    pool = []
    for s in seeds():
        try:
            pool.append((s, bytearray(s.read_bytes()), *layout(s)))
        except Exception as exc:  # a seed wsitool refuses is still a seed for the header
            print(f"seed {s.name}: {exc}")
    findings = []
    n = 0
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="wsitool-fuzz-dicom-") as tmp:
        while time.monotonic() - start < args.seconds:
            seed, data, pixel_pos, frames = rng.choice(pool)
            mutated, kind = mutate(data, pixel_pos, frames, rng)
            # each input alone in its folder: siblings of a series are not mutated
            case = Path(tmp) / f"case-{n}"
            case.mkdir()
            target = case / seed.name
            target.write_bytes(bytes(mutated))
            verdict, err = run_one(target, args.timeout)
            n += 1
            if verdict != "ok":
                keep = out / f"{n:05d}-{kind}-{seed.name}"
                shutil.copy(target, keep)
                last = err.strip().splitlines()[-1] if err.strip() else ""
                findings.append({"input": str(keep), "seed": seed.name, "mutation": kind,
                                 "verdict": verdict, "error": last})
                print(f"[{n}] {verdict}: {keep.name}: {last}", flush=True)
            shutil.rmtree(case, ignore_errors=True)
    summary = {"inputs": n, "seconds": round(time.monotonic() - start, 1), "findings": findings}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"{n} inputs, {len(findings)} findings; summary in {out / 'summary.json'}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
