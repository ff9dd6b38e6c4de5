#!/usr/bin/env python3
"""Write small MIRAX slides (``.mrxs`` + folder) from the real pixels of the shared CMU SVS.

Usage::

    python scripts/make_mirax_samples.py OUTDIR [--source ../shared/samples/aperio-cmu1-small-region-jpeg.svs]

No real MIRAX slide is small enough to fetch; these follow the layout OpenSlide 4.0.1's MIRAX
reader (``openslide-vendor-mirax.c``) and its format notes describe (:mod:`wsitool.formats.mirax`):
a ``<name>.mrxs`` (a small JPEG, as the scanner writes) beside a folder ``<name>/`` holding

* ``Slidedat.ini``: UTF-8 with a byte-order mark, CRLF line ends and a key-less ``=...`` line
  (as real ones have); ``[GENERAL]`` (slide id, camera images across and down, objective,
  ``CameraImageDivisionsPerSide``), ``[HIERARCHICAL]`` (the ``Slide zoom level`` hierarchy, the
  non-hierarchical records: position data and ``Scan data layer`` images), ``[DATAFILE]`` and
  one section per zoom level (image size, format, concatenation factor, overlaps, MPP);
* ``Index.dat``: version ``01.02`` and the slide id, then the hierarchical root (a pointer per
  zoom level to a list of data pages of ``(image index, offset, length, file number)``
  records; level 0's records are split over two pages) and the non-hierarchical root (a
  pointer per record to one page naming ``(offset, length, file number)``);
* ``Data0000.dat`` ...: the camera images (each level's images in its own format) and the
  records' data.

The slide is cut from the SVS's level 0 as a microscope would photograph it: camera photos of
``divisions`` x ``divisions`` images at stitched positions (a nominal step less the overlap,
plus a small displacement each), each higher level's images made from 2 x 2 images of the
level below reduced by 2 (per image, as the scanner concatenates them), so overlapping photos
and level images that hold several photos place as OpenSlide places them (no photo reaches past
the level's size: OpenSlide paints that part, wsitool's levels end at their size).  One photo is left
out (its area is transparent; OpenSlide skips its part of the higher levels too).

Fixtures (:data:`MAKERS`):

* ``mirax-vimslide``: JPEG images of 256 x 256, 2 divisions per side (photos of 512 x 512),
  4 levels, overlap 32, displacements multiples of 8: every level's positions whole pixels
  (OpenSlide's pixels reproduced exactly); positions as a ``VIMSLIDE_POSITION_BUFFER``
  record (9-byte records); label, macro and thumbnail; images spread over three data files.
* ``mirax-stitching``: one division per side, images of 240 x 160, level 0 JPEG, level 1 PNG,
  level 2 BMP24, level 3 JPEG; positions as the zlib-compressed ``StitchingIntensityLayer``
  record; whole-pixel positions; a label only.
* ``mirax-nominal``: no position record, so OpenSlide places the photos on the nominal grid
  (step: photo size less the overlap); an overlap of 22 on images of 256 makes the positions
  fractional at level 2 (OpenSlide blends there; wsitool paints at the nearest pixel).
"""

from __future__ import annotations

import argparse
import io
import struct
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import imagecodecs
import numpy as np
import tifffile
from PIL import Image

SOURCE = Path(__file__).resolve().parents[1] / ".." / "shared" / "samples" / "aperio-cmu1-small-region-jpeg.svs"
MPP = 0.499
MARGIN = 16  # truth pixels kept left of and above position (0, 0) (room for negative displacements)


@dataclass
class Layout:
    """One fixture's geometry and choices."""

    name: str
    image: tuple[int, int]              # camera image (DIGITIZER_WIDTH, _HEIGHT)
    divisions: int                      # CameraImageDivisionsPerSide
    images: tuple[int, int]             # IMAGENUMBER_X, _Y (camera images across, down at level 0)
    overlap: tuple[int, int]            # OVERLAP_X, _Y of level 0 (pixels, per photo)
    formats: tuple[str, ...]            # IMAGE_FORMAT of each level
    positions: str                      # "vimslide", "stitching" or "none"
    displacement: int                   # displacements are multiples of it (0: none)
    associated: tuple[str, ...] = ("macro", "label", "thumbnail")
    missing_photo: tuple[int, int] | None = (1, 2)
    slide_id: str = "4b3c2a1f-0e9d-4c8b-a7f6-5e4d3c2b1a09"
    extra: dict = field(default_factory=dict)


def _photos(lay: Layout) -> tuple[int, int]:
    return lay.images[0] // lay.divisions, lay.images[1] // lay.divisions


def photo_positions(lay: Layout) -> np.ndarray:
    """``(photos, 2)`` int level-0 positions of the camera photos, row-major (what the position
    record stores; the nominal grid for ``positions == "none"``)."""
    across, down = _photos(lay)
    iw, ih = lay.image
    step = (iw * lay.divisions - lay.overlap[0], ih * lay.divisions - lay.overlap[1])
    rng = np.random.default_rng(7)
    out = np.zeros((across * down, 2), np.int64)
    for p in range(across * down):
        px, py = p % across, p // across
        dx = dy = 0
        if lay.displacement:  # (the first photo moved too: OpenSlide's bounds start past 0)
            dx, dy = (int(v) * lay.displacement for v in ((1, 2) if p == 0 else rng.integers(0, 3, 2)))
            # the last column and row moved back: no photo reaches past the level's size (OpenSlide
            # paints such a photo's part beyond the level; wsitool's levels end at their size)
            dx, dy = (-dx if px == across - 1 else dx), (-dy if py == down - 1 else dy)
        out[p] = (px * step[0] + dx, py * step[1] + dy)
    return out


def _encode(rgb: np.ndarray, fmt: str) -> bytes:
    if fmt == "JPEG":
        return bytes(imagecodecs.jpeg8_encode(rgb, level=88))
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG" if fmt == "PNG" else "BMP")
    return buf.getvalue()


def _reduce(rgb: np.ndarray, factor: int) -> np.ndarray:
    if factor == 1:
        return rgb
    h, w = rgb.shape[:2]
    return np.asarray(Image.fromarray(rgb).resize((w // factor, h // factor), Image.Resampling.BOX))


def level0_images(lay: Layout, truth: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
    """The level-0 camera images by ``(x, y)`` image index (the missing photo's left out)."""
    iw, ih = lay.image
    pos = photo_positions(lay)
    across = _photos(lay)[0]
    out = {}
    for y in range(lay.images[1]):
        for x in range(lay.images[0]):
            xp, yp = x // lay.divisions, y // lay.divisions
            if (xp, yp) == lay.missing_photo:
                continue
            px, py = pos[yp * across + xp]
            ox = MARGIN + px + iw * (x - xp * lay.divisions)
            oy = MARGIN + py + ih * (y - yp * lay.divisions)
            out[(x, y)] = truth[oy:oy + ih, ox:ox + iw]
    return out


def level_images(lay: Layout, base: dict[tuple[int, int], np.ndarray], k: int) -> dict[tuple[int, int], np.ndarray]:
    """Level ``k``'s images by the ``(x, y)`` level-0 index of their first image: 2**k x 2**k
    level-0 images reduced 2**k times, side by side (white where an image is missing)."""
    iw, ih = lay.image
    f = 1 << k
    sw, sh = iw // f, ih // f
    out = {}
    for y in range(0, lay.images[1], f):
        for x in range(0, lay.images[0], f):
            parts = [(i, j) for j in range(f) for i in range(f) if (x + i, y + j) in base]
            if not parts:
                continue
            img = np.full((ih, iw, 3), 255, np.uint8)
            for i, j in parts:
                img[j * sh:(j + 1) * sh, i * sw:(i + 1) * sw] = _reduce(base[(x + i, y + j)], f)
            out[(x, y)] = img
    return out


class _Data:
    """The data files being written: ``add(fileno, bytes) -> (offset, length)``."""

    def __init__(self, count: int):
        self.files = [bytearray(b"MRXS-DATA-FILE\0\0" + bytes(240)) for _ in range(count)]

    def add(self, fileno: int, data: bytes) -> tuple[int, int, int]:
        f = self.files[fileno]
        off = len(f)
        f.extend(data)
        return off, len(data), fileno


def _index(slide_id: str, levels: list[list[tuple[int, int, int, int]]],
           records: list[tuple[int, int, int]]) -> bytes:
    """Index.dat: header, hierarchical root (per level: a list of data pages, level 0 split over
    two pages), non-hierarchical root (per record: one page)."""
    head = b"01.02" + slide_id.encode()
    buf = bytearray(head + bytes(8))  # hier root pointer, nonhier root pointer

    def i32(*vals: int) -> bytes:
        return struct.pack(f"<{len(vals)}i", *vals)

    def at(pos: int, value: int) -> None:
        buf[pos:pos + 4] = i32(value)

    hier_table = len(buf)
    buf.extend(bytes(4 * len(levels)))
    at(len(head), hier_table)
    for k, recs in enumerate(levels):
        head_pos = len(buf)
        buf.extend(i32(0, 0))
        at(hier_table + 4 * k, head_pos)
        pages = [recs[:len(recs) // 2], recs[len(recs) // 2:]] if k == 0 and len(recs) > 1 else [recs]
        prev_next = head_pos + 4
        for page in pages:
            at(prev_next, len(buf))
            buf.extend(i32(len(page), 0))
            prev_next = len(buf) - 4
            for rec in page:
                buf.extend(i32(*rec))
        # (the last page's "next" pointer stays 0)
    nonhier_table = len(buf)
    buf.extend(bytes(4 * len(records)))
    at(len(head) + 4, nonhier_table)
    for r, (off, length, fileno) in enumerate(records):
        rec_pos = len(buf)
        buf.extend(i32(0, rec_pos + 8))
        buf.extend(i32(1, 0, 0, 0, off, length, fileno))
        at(nonhier_table + 4 * r, rec_pos)
    return bytes(buf)


def _ini(sections: list[tuple[str, list[tuple[str, str]]]]) -> bytes:
    lines = []
    for name, items in sections:
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {v}" if k else f"={v}" for k, v in items)
        lines.append("")
    return b"\xef\xbb\xbf" + "\r\n".join(lines).encode()


def write_mirax(out: Path, lay: Layout, source: Path = SOURCE) -> Path:
    """Write ``<lay.name>.mrxs`` and its folder into ``out``; the ``.mrxs`` path."""
    with tifffile.TiffFile(source) as tif:
        truth, label, macro = tif.pages[0].asarray(), tif.pages[2].asarray(), tif.pages[3].asarray()
    base = level0_images(lay, truth)
    nlevels = len(lay.formats)
    data = _Data(3)
    level_recs: list[list[tuple[int, int, int, int]]] = []
    for k in range(nlevels):
        imgs = base if k == 0 else level_images(lay, base, k)
        recs = []
        for (x, y), img in sorted(imgs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            fileno = (x // lay.divisions + y) % 2 if k == 0 else 2
            off, length, fn = data.add(fileno, _encode(np.ascontiguousarray(img), lay.formats[k]))
            recs.append((y * lay.images[0] + x, off, length, fn))
        level_recs.append(recs)
    # non-hierarchical records: a filler, the positions, the scan data layer images
    nonhier: list[tuple[str, list[tuple[str, str, bytes]]]] = [
        ("Scan info", [("ScanInfoData", "SCAN_INFO", b"\0" * 8)])]
    pos = photo_positions(lay)
    if lay.positions != "none":
        buf = b"".join(struct.pack("<Bii", 1, int(x), int(y)) for x, y in pos)
        if lay.positions == "vimslide":
            nonhier.append(("VIMSLIDE_POSITION_BUFFER", [("default", "VIMSLIDE_POSITION_DATA", buf)]))
        else:
            nonhier.append(("StitchingIntensityLayer", [("StitchingIntensityLevel", "STITCHING_DATA",
                                                         zlib.compress(buf))]))
    pictures = {"macro": ("ScanDataLayer_SlideThumbnail", "THUMBNAIL", macro),
                "label": ("ScanDataLayer_SlideBarcode", "BARCODE", np.ascontiguousarray(np.rot90(label))),
                "thumbnail": ("ScanDataLayer_SlidePreview", "PREVIEW", _reduce(truth, 8))}
    layer = [(value, f"{prefix}_SECTION", bytes(imagecodecs.jpeg8_encode(np.ascontiguousarray(img), level=85)))
             for name, (value, prefix, img) in pictures.items() if name in lay.associated]
    if layer:
        nonhier.append(("Scan data layer", layer))
    records = [data.add(2, blob) for _name, vals in nonhier for _v, _s, blob in vals]
    levels_sec = [f"LAYER_0_LEVEL_{k}_SECTION" for k in range(nlevels)]
    hier = [("HIER_COUNT", "1"), ("NONHIER_COUNT", str(len(nonhier))), ("INDEXFILE", "Index.dat"),
            ("HIER_0_NAME", "Slide zoom level"), ("HIER_0_COUNT", str(nlevels))]
    hier += [(f"HIER_0_VAL_{k}", f"ZoomLevel_{k}") for k in range(nlevels)]
    hier += [(f"HIER_0_VAL_{k}_SECTION", s) for k, s in enumerate(levels_sec)]
    sections: list[tuple[str, list[tuple[str, str]]]] = []
    for i, (name, vals) in enumerate(nonhier):
        hier += [(f"NONHIER_{i}_NAME", name), (f"NONHIER_{i}_COUNT", str(len(vals)))]
        for j, (value, section, _blob) in enumerate(vals):
            hier += [(f"NONHIER_{i}_VAL_{j}", value), (f"NONHIER_{i}_VAL_{j}_SECTION", section)]
            kind = section.split("_", 1)[0]
            items = [(f"{kind}_IMAGE_TYPE", "JPEG")] if name == "Scan data layer" else [("VERSION", "1")]
            sections.append((section, items))
    general = [("SLIDE_VERSION", "1.9"), ("SLIDE_ID", lay.slide_id), ("SLIDE_NAME", lay.name),
               ("", "a line without a key"), ("IMAGENUMBER_X", str(lay.images[0])),
               ("IMAGENUMBER_Y", str(lay.images[1])), ("OBJECTIVE_MAGNIFICATION", "20"),
               ("CameraImageDivisionsPerSide", str(lay.divisions))]
    datafile = [("FILE_COUNT", "3")] + [(f"FILE_{i}", f"Data{i:04d}.dat") for i in range(3)]
    for k, s in enumerate(levels_sec):
        ov = lay.overlap if k == 0 else (lay.overlap[0] / (1 << k), lay.overlap[1] / (1 << k))
        sections.append((s, [("OVERLAP_X", f"{ov[0]:g}"), ("OVERLAP_Y", f"{ov[1]:g}"),
                             ("MICROMETER_PER_PIXEL_X", f"{MPP * (1 << k):g}"),
                             ("MICROMETER_PER_PIXEL_Y", f"{MPP * (1 << k):g}"),
                             ("IMAGE_FORMAT", lay.formats[k]), ("IMAGE_FILL_COLOR_BGR", "16777215"),
                             ("DIGITIZER_WIDTH", str(lay.image[0])), ("DIGITIZER_HEIGHT", str(lay.image[1])),
                             ("IMAGE_CONCAT_FACTOR", "0" if k == 0 else "1")]))
    ini = _ini([("GENERAL", general), ("HIERARCHICAL", hier), ("DATAFILE", datafile), *sections])
    folder = out / lay.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Slidedat.ini").write_bytes(ini)
    (folder / "Index.dat").write_bytes(_index(lay.slide_id, level_recs, records))
    for i, f in enumerate(data.files):
        (folder / f"Data{i:04d}.dat").write_bytes(bytes(f))
    mrxs = out / f"{lay.name}.mrxs"
    mrxs.write_bytes(bytes(imagecodecs.jpeg8_encode(np.ascontiguousarray(_reduce(truth, 16)), level=80)))
    return mrxs


VIMSLIDE = Layout("mirax-vimslide", image=(256, 256), divisions=2, images=(8, 10), overlap=(32, 32),
                  formats=("JPEG",) * 4, positions="vimslide", displacement=8)
STITCHING = Layout("mirax-stitching", image=(240, 160), divisions=1, images=(8, 14), overlap=(16, 16),
                   formats=("JPEG", "PNG", "BMP24", "JPEG"), positions="stitching", displacement=8,
                   associated=("label",), missing_photo=(6, 3))
NOMINAL = Layout("mirax-nominal", image=(256, 256), divisions=1, images=(7, 9), overlap=(22, 22),
                 formats=("JPEG",) * 3, positions="none", displacement=0, associated=("macro", "thumbnail"),
                 missing_photo=None)


def mirax_vimslide(out: Path, source: Path = SOURCE) -> Path:
    """``mirax-vimslide.mrxs`` (module docstring)."""
    return write_mirax(out, VIMSLIDE, source)


def mirax_stitching(out: Path, source: Path = SOURCE) -> Path:
    """``mirax-stitching.mrxs`` (module docstring)."""
    return write_mirax(out, STITCHING, source)


def mirax_nominal(out: Path, source: Path = SOURCE) -> Path:
    """``mirax-nominal.mrxs`` (module docstring)."""
    return write_mirax(out, NOMINAL, source)


MAKERS = (mirax_vimslide, mirax_stitching, mirax_nominal)


def write_all(outdir: Path, source: Path = SOURCE) -> list[Path]:
    """Write every fixture (:data:`MAKERS`) into ``outdir`` (made where missing); their paths."""
    outdir.mkdir(parents=True, exist_ok=True)
    return [make(outdir, source) for make in MAKERS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--source", type=Path, default=SOURCE)
    args = parser.parse_args(argv)
    for path in write_all(args.outdir, args.source):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
