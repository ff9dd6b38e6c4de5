#!/usr/bin/env python3
"""Write a synthetic but realistic Hamamatsu NDPI from the shared sample's real pixels.

Usage::

    python scripts/make_ndpi.py OUT.ndpi [--width 100352] [--height 2048] [--interval 512]
        [--levels 4] [--quality 80] [--subsampling 444|420] [--offset-above-4g] [--no-macro]
        [--source ../shared/samples/ndpi-hamamatsu-stritt-dapi-fluor-3.5mb.ndpi]

The name must end in ``.ndpi`` (tifffile recognises NDPI by extension plus tag 65420).

What it writes, as NDP.scan does (OpenSlide's Hamamatsu format notes; the tag
set and values of the shared sample, listed with tifffile):

* **Pixels**: the sample's level 0 (read with tifffile) tiled across the canvas;
  each horizontal copy takes a different vertical window of the sample, so no
  two restart intervals of a row repeat.  Level ``k`` is the ``2^k`` box
  average of level 0 (``width >> k`` x ``height >> k``).
* **Each level is ONE baseline JPEG scan with restart markers.**  Every restart
  interval (``--interval`` pixels wide, one MCU row high: 8 rows at 4:4:4, 16 at
  4:2:0) is encoded as its own small JPEG by imagecodecs' ``jpeg8_encode`` at a
  fixed quality without optimised Huffman tables, so all intervals share the same
  quantisation and Huffman tables (checked); each small JPEG's entropy-coded
  segment (after its SOS header, before its EOI) is spliced into one scan,
  separated by RST0..RST7 cycling, under one header (SOI, DQT, SOF0 with the
  level's size, DHT, DRI with the interval in MCUs, SOS) and a final EOI.  A
  restart resets the DC predictors exactly as a new image does, so the spliced
  scan decodes to the same pixels as the small JPEGs (libjpeg-turbo refuses to
  *encode* widths past 65,500, hence the splicing).  Where a size passes 65,535
  the SOF holds 0 for it, as NDPI does.  A level's interval is ``--interval`` or,
  where the level's width is not a multiple of it, the largest whole number of
  MCUs below it that divides the width (OpenSlide refuses intervals that do not
  tile a row: "Inconsistent restart marker spacing within row").
* **The TIFF wrapper** (NDPI: classic little-endian TIFF with 64-bit offsets):
  the header's first-IFD offset is 8 bytes; each IFD is the entry count, 12-byte
  entries, an 8-byte next-IFD offset and then one 4-byte *extension* per entry
  that holds the high 32 bits of that entry's value/offset field (that is where
  NDPI keeps the high bits of StripOffsets and of every out-of-line value
  pointer; tifffile and OpenSlide's tifflike both read it).  ASCII values are
  always stored out of line (OpenSlide reads NDPI ASCII values as offsets).
  Tags: the sample's first-page tags copied byte for byte (Make, Model,
  Software, the 65420.. Hamamatsu tags, the property map 65449, ...) with the
  level's own ImageWidth/Length, StripOffsets/ByteCounts (one strip: the JPEG
  stream), RowsPerStrip, resolution (px/cm, halved per level), YCbCrSubSampling,
  SourceLens (40, 20, 10, ...), McuStarts (65426: the byte offset of each
  restart interval inside the strip) and, with ``--offset-above-4g``,
  McuStartsHighBytes (65432, their high 32 bits).  Each level's IFD follows its
  strip, as in NDP.scan files; the macro page (the sample's own macro JPEG and
  tags, SourceLens -1) comes last.
* ``--offset-above-4g``: the lower levels and the macro are written first, then
  the file position jumps (seek, no bytes written: the file is sparse) past
  4 GiB and level 0's strip and IFD are written there, so its StripOffsets, its
  IFD offset and its out-of-line value pointers all need their high bits.

Library use: :func:`make_ndpi` returns a dict describing what it wrote.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from itertools import pairwise
from pathlib import Path

import imagecodecs
import numpy as np
import tifffile

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO.parent / "shared" / "samples" / "ndpi-hamamatsu-stritt-dapi-fluor-3.5mb.ndpi"
GIB4 = 1 << 32
JPEG_SIZE_LIMIT = 65535  # above this NDPI writes 0 in the SOF

# TIFF types: size of one value
_TYPE_SIZE = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 16: 8, 17: 8}
BYTE, ASCII, SHORT, LONG, RATIONAL, SLONG, FLOAT = 1, 2, 3, 4, 5, 9, 11

# tags the generator writes itself for each level (the rest are copied from the sample)
_OWN = {256, 257, 273, 278, 279, 282, 283, 530, 65421, 65426, 65432}

# ---------------------------------------------------------------- JPEG splicing


def _segments(jpeg: bytes):
    """Yield ``(marker, start, end)`` of the marker segments up to and including SOS."""
    i = 2
    while i < len(jpeg):
        marker = jpeg[i + 1]
        length = int.from_bytes(jpeg[i + 2:i + 4], "big")
        yield marker, i, i + 2 + length
        if marker == 0xDA:
            return
        i += 2 + length
    raise ValueError("no SOS in JPEG")


class IntervalEncoder:
    """Encodes restart intervals as small JPEGs; keeps the shared tables and checks they never change."""

    def __init__(self, quality: int, subsampling: str):
        self.quality = quality
        self.subsampling = subsampling
        self.tables: bytes | None = None  # DQT + DHT + SOS segments of the first interval
        self.sof: bytes | None = None
        self.prefix = b""  # the whole header (SOI .. SOS) of the last interval parsed

    def encode(self, pixels: np.ndarray) -> bytes:
        """The entropy-coded segment of ``pixels`` (one restart interval)."""
        jpeg = imagecodecs.jpeg8_encode(pixels, level=self.quality, subsampling=self.subsampling,
                                        optimize=False)
        if self.prefix and jpeg.startswith(self.prefix) and jpeg.endswith(b"\xff\xd9"):
            return jpeg[len(self.prefix):-2]  # the same header as the last interval checked in full
        dqt, dht, sof, sos, end = [], [], b"", b"", 0
        for marker, start, end in _segments(jpeg):
            seg = jpeg[start:end]
            if marker == 0xDB:
                dqt.append(seg)
            elif marker == 0xC4:
                dht.append(seg)
            elif marker == 0xC0:
                sof = seg
            elif marker == 0xDA:
                sos = seg
            elif 0xC1 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                raise ValueError(f"not a baseline JPEG (SOF marker {marker:02x})")
            elif marker == 0xDD:
                raise ValueError("the small JPEG has its own restart interval")
        if not jpeg.endswith(b"\xff\xd9"):
            raise ValueError("small JPEG without EOI")
        tables = b"".join(dqt) + b"\0" + b"".join(dht) + b"\0" + sos
        if self.tables is None:
            self.tables, self.sof, self._dqt, self._dht, self._sos = tables, sof, dqt, dht, sos
        elif tables != self.tables or sof[9:] != self.sof[9:]:
            raise ValueError("interval JPEGs do not share their tables (optimised Huffman tables?)")
        self.prefix = jpeg[:end]
        return jpeg[end:-2]

    def header(self, width: int, height: int, interval_mcus: int) -> bytes:
        """SOI, DQT, SOF0 (the level's size; 0 past 65,535), DHT, DRI, SOS of the spliced scan."""
        sof = bytearray(self.sof)
        sof[5:7] = (height if height <= JPEG_SIZE_LIMIT else 0).to_bytes(2, "big")
        sof[7:9] = (width if width <= JPEG_SIZE_LIMIT else 0).to_bytes(2, "big")
        dri = b"\xff\xdd\x00\x04" + interval_mcus.to_bytes(2, "big")
        return b"\xff\xd8" + b"".join(self._dqt) + bytes(sof) + b"".join(self._dht) + dri + self._sos


# ---------------------------------------------------------------- pixels


class Canvas:
    """Level-0 pixels: the sample's level 0 tiled; copy ``k`` (horizontally) takes rows from ``offset[k]``."""

    def __init__(self, source: Path, width: int, height: int):
        with tifffile.TiffFile(source) as tf:
            self.sample = tf.series[0].levels[0].asarray()
        sh, sw = self.sample.shape[:2]
        self.width, self.height = width, height
        copies = -(-width // sw)
        span = max(sh - height, 1)
        k = np.arange(copies)
        self.offsets = (k * 1531 + (k // 3) * 97) % span  # first sample row of copy k

    def rows(self, y0: int, y1: int, factor: int = 1) -> np.ndarray:
        """Level pixels of rows ``y0:y1`` of the level ``factor`` times smaller (box average)."""
        sh, sw = self.sample.shape[:2]
        ys = np.arange(y0 * factor, y1 * factor) % self.height
        full = np.empty((len(ys), self.width, 3), np.uint8)
        for k, off in enumerate(self.offsets):
            x0 = k * sw
            x1 = min(x0 + sw, self.width)
            full[:, x0:x1] = self.sample[(ys + off) % sh, :x1 - x0]
        if factor == 1:
            return full
        h, w = y1 - y0, self.width // factor
        acc = np.zeros((h, w, 3), np.uint32)
        for dy in range(factor):
            for dx in range(factor):
                acc += full[dy::factor, dx:w * factor:factor]
        return ((acc + (factor * factor) // 2) // (factor * factor)).astype(np.uint8)


# ---------------------------------------------------------------- TIFF (NDPI flavour)


def _pack(dtype: int, values) -> bytes:
    fmt = {BYTE: "B", SHORT: "H", LONG: "I", SLONG: "i", FLOAT: "f"}
    if dtype == ASCII:
        return values.encode("latin-1") + b"\0"
    if dtype == RATIONAL:
        return b"".join(struct.pack("<II", int(n), int(d)) for n, d in values)
    values = list(np.atleast_1d(values))
    return struct.pack(f"<{len(values)}{fmt[dtype]}", *values)


class Entry:
    def __init__(self, code: int, dtype: int, count: int, raw: bytes, wide: int | None = None):
        """``raw``: the value bytes; ``wide``: a single 64-bit LONG value (StripOffsets) stored low + extension."""
        self.code, self.dtype, self.count, self.raw, self.wide = code, dtype, count, raw, wide


def entry(code: int, dtype: int, values) -> Entry:
    raw = _pack(dtype, values)
    return Entry(code, dtype, len(raw) // _TYPE_SIZE[dtype], raw)


def ifd_size(entries: list[Entry]) -> int:
    """Bytes of an NDPI IFD with its out-of-line values (which follow it)."""
    n = len(entries)
    size = 2 + 12 * n + 8 + 4 * n
    return size + sum(len(e.raw) + (len(e.raw) & 1) for e in entries if _out_of_line(e))


def _out_of_line(e: Entry) -> bool:
    return e.wide is None and (len(e.raw) > 4 or e.dtype == ASCII)


def ifd_bytes(entries: list[Entry], at: int) -> tuple[bytes, int]:
    """The IFD written at file offset ``at`` (next-IFD offset 0); returns it and the next field's offset."""
    entries = sorted(entries, key=lambda e: e.code)
    n = len(entries)
    values_at = at + 2 + 12 * n + 8 + 4 * n
    body, ext, tail = [struct.pack("<H", n)], [], []
    for e in entries:
        if e.wide is not None:
            field = e.wide
        elif _out_of_line(e):
            field = values_at
            tail.append(e.raw + b"\0" * (len(e.raw) & 1))
            values_at += len(tail[-1])
        else:
            field = int.from_bytes(e.raw.ljust(4, b"\0"), "little")
        body.append(struct.pack("<HHII", e.code, e.dtype, e.count, field & 0xFFFFFFFF))
        ext.append(struct.pack("<I", field >> 32))
    next_at = at + 2 + 12 * n
    blob = b"".join(body) + struct.pack("<Q", 0) + b"".join(ext) + b"".join(tail)
    assert len(blob) == ifd_size(entries)
    return blob, next_at


def copied_tags(page, fh, skip: set[int]) -> list[Entry]:
    """The page's tags other than ``skip``, their value bytes read raw from the file."""
    out = []
    for tag in page.tags:
        if tag.code in skip:
            continue
        size = tag.count * _TYPE_SIZE[int(tag.dtype)]
        fh.seek(tag.valueoffset)
        raw = fh.read(size)
        if int(tag.dtype) == ASCII and len(raw) <= 4:
            continue  # cannot be stored the way both readers agree on; none in the sample
        out.append(Entry(tag.code, int(tag.dtype), tag.count, raw))
    return out


# ---------------------------------------------------------------- the file


def level_interval(width: int, interval: int, mcu_w: int) -> int:
    """Interval width (pixels) of a level: ``interval`` or the largest whole-MCU width below it dividing ``width``."""
    mcus = width // mcu_w
    n = max(1, min(interval // mcu_w, mcus))
    while mcus % n:
        n -= 1
    return n * mcu_w


def write_strip(fh, canvas: Canvas, factor: int, width: int, height: int, interval: int,
                enc: IntervalEncoder, mcu_h: int) -> tuple[int, list[int]]:
    """Write one level's JPEG stream at the current position; return (byte count, McuStarts)."""
    start = fh.tell()
    across = width // interval
    rows = -(-height // mcu_h)
    # the header needs the tables: encode the first interval before writing it
    band = canvas.rows(0, min(mcu_h, height), factor)
    first = enc.encode(_pad(band[:, :interval], mcu_h))
    header = enc.header(width, height, interval // (enc_mcu_w(enc)))
    fh.write(header)
    starts, pos, n, total = [], len(header), 0, across * rows
    for r in range(rows):
        if r:
            band = canvas.rows(r * mcu_h, min((r + 1) * mcu_h, height), factor)
        for c in range(across):
            seg = first if (r, c) == (0, 0) else enc.encode(_pad(band[:, c * interval:(c + 1) * interval], mcu_h))
            starts.append(pos)
            n += 1
            marker = b"\xff" + bytes([0xD0 + (n - 1) % 8]) if n < total else b"\xff\xd9"
            fh.write(seg)
            fh.write(marker)
            pos += len(seg) + 2
    return fh.tell() - start, starts


def enc_mcu_w(enc: IntervalEncoder) -> int:
    return 8 if enc.subsampling == "444" else 16


def _pad(pixels: np.ndarray, mcu_h: int) -> np.ndarray:
    """The interval's pixels, bottom rows repeated to one whole MCU row (the last band of a level)."""
    if pixels.shape[0] == mcu_h:
        return np.ascontiguousarray(pixels)
    return np.concatenate([pixels, np.repeat(pixels[-1:], mcu_h - pixels.shape[0], axis=0)])


def make_ndpi(path, width: int = 100352, height: int = 2048, interval: int = 512, levels: int = 4,
              quality: int = 80, subsampling: str = "444", offset_above_4g: bool = False,
              macro: bool = True, source: Path | str = SAMPLE) -> dict:
    """Write the NDPI; return ``{"levels": [(w, h, interval, strip offset, bytes), ...], "size": ...}``."""
    path = Path(path)
    if path.suffix.lower() != ".ndpi":
        raise ValueError("the file name must end in .ndpi (tifffile detects NDPI by it)")
    if subsampling not in ("444", "420"):
        raise ValueError("--subsampling is 444 or 420")
    mcu_w = mcu_h = 8 if subsampling == "444" else 16
    if width % (mcu_w << (levels - 1)) or height % (1 << (levels - 1)):
        raise ValueError(f"width must be a multiple of {mcu_w << (levels - 1)} and height of "
                         f"{1 << (levels - 1)} for {levels} levels")
    if interval % mcu_w:
        raise ValueError(f"--interval must be a multiple of the MCU width {mcu_w}")
    canvas = Canvas(Path(source), width, height)
    enc = IntervalEncoder(quality, subsampling)
    with tifffile.TiffFile(source) as tf, open(source, "rb") as sfh:
        first = tf.pages[0]
        common = copied_tags(first, sfh, _OWN)
        xres = first.tags.valueof(282)
        px_per_cm = xres[0] / xres[1]
        lens0 = float(first.tags.valueof(65421))
        macro_page = next((p for p in tf.pages if p.tags.valueof(65421) == -1.0), None) if macro else None
        macro_tags = copied_tags(macro_page, sfh, {273, 279}) if macro_page is not None else []
        if macro_page is not None:
            sfh.seek(macro_page.dataoffsets[0])
            macro_bytes = sfh.read(macro_page.databytecounts[0])

    pages = []  # IFD order: levels (largest first), macro
    order = [*range(1, levels), "macro", 0] if offset_above_4g else [*range(levels), "macro"]
    written = {}
    with open(path, "wb") as fh:
        fh.write(b"II*\0" + struct.pack("<Q", 0))
        for item in order:
            if item == "macro":
                if macro_page is None:
                    continue
                strip_at = fh.tell()
                fh.write(macro_bytes)
                entries = [*macro_tags, Entry(273, LONG, 1, b"", wide=strip_at),
                           entry(279, LONG, len(macro_bytes))]
            else:
                k = item
                if k == 0 and offset_above_4g:
                    fh.seek(max(fh.tell(), GIB4 + 4096))  # sparse: nothing written in between
                w, h = width >> k, height >> k
                iw = level_interval(w, interval, mcu_w)
                strip_at = fh.tell()
                count, starts = write_strip(fh, canvas, 1 << k, w, h, iw, enc, mcu_h)
                starts = np.asarray(starts, np.uint64)
                res = (int(round(px_per_cm / (1 << k))), 1)
                entries = [
                    *common,
                    entry(256, LONG, w), entry(257, LONG, h),
                    Entry(273, LONG, 1, b"", wide=strip_at), entry(278, LONG, h), entry(279, LONG, count),
                    entry(282, RATIONAL, [res]), entry(283, RATIONAL, [res]),
                    entry(530, SHORT, [1, 1] if subsampling == "444" else [2, 2]),
                    entry(65421, FLOAT, lens0 / (1 << k)),
                    entry(65426, LONG, (starts & np.uint64(0xFFFFFFFF)).astype(np.uint32)),
                ]
                if offset_above_4g:
                    entries.append(entry(65432, LONG, (starts >> np.uint64(32)).astype(np.uint32)))
                written[k] = (w, h, iw, strip_at, count)
            if fh.tell() & 1:
                fh.write(b"\0")
            at = fh.tell()
            blob, next_at = ifd_bytes(entries, at)
            fh.write(blob)
            pages.append((0 if item == "macro" else 1, item, at, next_at))
        # chain the IFDs: levels by size, then the macro
        pages.sort(key=lambda p: (p[0] == 0, p[1] if p[1] != "macro" else 0))
        fh.seek(4)
        fh.write(struct.pack("<Q", pages[0][2]))
        for (_, _, _, next_at), (_, _, at, _) in pairwise(pages):
            fh.seek(next_at)
            fh.write(struct.pack("<Q", at))
        fh.seek(0, 2)
        size = fh.tell()
    return {"path": str(path), "size": size, "levels": [written[k] for k in range(levels)],
            "macro": macro_page is not None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="output file, ending in .ndpi")
    ap.add_argument("--width", type=int, default=100352, help="level-0 width (a whole number of intervals)")
    ap.add_argument("--height", type=int, default=2048)
    ap.add_argument("--interval", type=int, default=512, help="restart interval width in pixels")
    ap.add_argument("--levels", type=int, default=4, help="pyramid levels, each half the one above")
    ap.add_argument("--quality", type=int, default=80)
    ap.add_argument("--subsampling", default="444", choices=("444", "420"))
    ap.add_argument("--offset-above-4g", action="store_true",
                    help="put level 0's strip past 4 GiB (sparse file; high offset bits in use)")
    ap.add_argument("--no-macro", action="store_true")
    ap.add_argument("--source", type=Path, default=SAMPLE, help="NDPI whose level-0 pixels and tags are used")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    info = make_ndpi(a.out, a.width, a.height, a.interval, a.levels, a.quality, a.subsampling,
                     a.offset_above_4g, not a.no_macro, a.source)
    print(f"wrote {info['path']}: {info['size']} bytes in {time.perf_counter() - t0:.1f} s")
    for k, (w, h, iw, at, count) in enumerate(info["levels"]):
        mcu_h = 8 if a.subsampling == "444" else 16
        print(f"  level {k}: {w} x {h}, intervals {iw} px ({w // iw} x {-(-h // mcu_h)}),"
              f" strip at {at} (+{count} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
