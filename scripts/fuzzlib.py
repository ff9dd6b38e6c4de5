"""The mutators of scripts/fuzz.py: seed files, byte targets, recipes, CLI batch inputs.

Pure functions and data, importable by the fuzzer (``scripts/fuzz.py``, which runs them
against wsitool in a child process) and by the tests (``tests/test_fuzz.py``,
``tests/test_fuzz_batch.py``: tests/conftest.py puts ``scripts/`` on ``sys.path``).  Nothing
here imports wsitool.

A recipe is pure data (seed file, byte patches, truncation): :func:`apply_recipe` rebuilds the
mutated bytes from the original file, so a test can regenerate an input without copying any
file into the repository.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("WSITOOL_SHARED", REPO.parent / "shared"))
SEED_DIRS = (SHARED / "samples", SHARED / "bug-inputs")
SEED_SUFFIXES = (".svs", ".tif", ".tiff", ".qptiff", ".ndpi", ".czi")

#: Mutation kinds (each recipe stacks one to three of them).
KINDS = (
    "header", "ifd_entry", "tag_value", "tile_offset", "tile_bytecount",
    "tile_bytes", "jpeg_header", "random_bytes", "truncate",
)

# Tags whose values steer structure and decoding (TIFF 6.0 + TIFF/EP + Adobe tech notes).
STRUCT_TAGS = {
    254: "NewSubfileType", 256: "ImageWidth", 257: "ImageLength", 258: "BitsPerSample",
    259: "Compression", 262: "PhotometricInterpretation", 273: "StripOffsets",
    277: "SamplesPerPixel", 278: "RowsPerStrip", 279: "StripByteCounts",
    284: "PlanarConfiguration", 317: "Predictor", 320: "ColorMap", 322: "TileWidth",
    323: "TileLength", 324: "TileOffsets", 325: "TileByteCounts", 330: "SubIFDs",
    332: "InkSet", 338: "ExtraSamples", 339: "SampleFormat", 347: "JPEGTables",
    530: "YCbCrSubSampling", 270: "ImageDescription", 282: "XResolution", 296: "ResolutionUnit",
    32997: "ImageDepth",
}
_INTERESTING = (0, 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 127, 128, 255, 256,
                257, 511, 512, 1023, 1024, 4095, 4096, 32767, 32768, 65535, 65536,
                2**24, 2**31 - 1, 2**31, 2**32 - 1)
_DTYPE_SIZE = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8,
               13: 4, 16: 8, 17: 8, 18: 8}


# --------------------------------------------------------------------------- targets


@dataclasses.dataclass
class Targets:
    """Byte locations in one seed file where mutations are most telling."""

    path: str
    size: int
    byteorder: str  # "<" or ">"
    header_len: int
    entry_size: int  # 12 (classic TIFF) or 20 (BigTIFF)
    count_size: int  # 4 or 8
    entries: list  # file offsets of IFD entries
    tag_values: list  # (valueoffset, item size, count, code) of structural tags
    offset_arrays: list  # (valueoffset, item size, count) of Tile/StripOffsets
    count_arrays: list  # same for Tile/StripByteCounts
    segments: list  # (offset, bytecount) of tile/strip data
    jpeg_tables: list  # (valueoffset, count) of JPEGTables


def _all_pages(tif):
    import tifffile

    out = []
    for page in tif.pages:
        if not isinstance(page, tifffile.TiffPage):
            continue
        out.append(page)
        if page.subifds:
            with contextlib.suppress(Exception):
                out.extend(p for p in tifffile.TiffPages(page) if isinstance(p, tifffile.TiffPage))
    return out


def seed_targets(path: str | os.PathLike) -> Targets:
    """Locate header, IFD entries, structural tag values and tile data of a TIFF with tifffile."""
    import logging
    import warnings

    import tifffile

    logging.getLogger("tifffile").setLevel(logging.CRITICAL)
    path = str(path)
    size = os.path.getsize(path)
    t = Targets(path, size, "<", 8, 12, 4, [], [], [], [], [], [])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with tifffile.TiffFile(path) as tif:
                t.byteorder = tif.byteorder
                t.header_len = 16 if tif.is_bigtiff else 8
                t.entry_size = tif.tiff.tagsize
                t.count_size = 8 if tif.is_bigtiff else 4
                for page in _all_pages(tif):
                    for tag in page.tags.values():
                        t.entries.append(tag.offset)
                        isize = _DTYPE_SIZE.get(int(tag.dtype), 1)
                        if tag.code in STRUCT_TAGS:
                            t.tag_values.append((tag.valueoffset, isize, tag.count, tag.code))
                        if tag.code in (273, 324):
                            t.offset_arrays.append((tag.valueoffset, isize, tag.count))
                        elif tag.code in (279, 325):
                            t.count_arrays.append((tag.valueoffset, isize, tag.count))
                        elif tag.code == 347:
                            t.jpeg_tables.append((tag.valueoffset, tag.count))
                    for off, cnt in zip(page.dataoffsets, page.databytecounts, strict=False):
                        if off and cnt and off + cnt <= size:
                            t.segments.append((int(off), int(cnt)))
    except Exception:
        pass  # not a (readable) TIFF: header / random / truncate mutations still apply
    return t


def seed_files(limit_bytes: int = 8 * 2**20) -> list[Path]:
    """Seed files from ../shared (samples and bug inputs: TIFF-based and CZI), smallest first."""
    files = []
    for d in SEED_DIRS:
        if d.is_dir():
            files += [p for p in d.iterdir()
                      if p.is_file() and p.suffix.lower() in SEED_SUFFIXES
                      and p.stat().st_size <= limit_bytes]
    return sorted(files, key=lambda p: (p.stat().st_size, p.name))


# --------------------------------------------------------------------------- recipes


def _pack(value: int, nbytes: int, byteorder: str) -> bytes:
    value &= (1 << (8 * nbytes)) - 1
    return value.to_bytes(nbytes, "little" if byteorder == "<" else "big")


def _interesting(rng: random.Random, original: int | None = None, file_size: int | None = None) -> int:
    r = rng.random()
    if original is not None and r < 0.3:
        return max(0, original + rng.choice((-1, 1, -2, 2, -8, 8, -256, 256, original, -original)))
    if file_size is not None and r < 0.45:
        return file_size + rng.choice((-1, 0, 1, -16, 100))
    if r < 0.85:
        return rng.choice(_INTERESTING)
    return rng.getrandbits(32)


def _read_int(data: bytes, off: int, nbytes: int, byteorder: str) -> int:
    return int.from_bytes(data[off:off + nbytes], "little" if byteorder == "<" else "big")


def _one_mutation(t: Targets, data: bytes, rng: random.Random, kind: str) -> tuple[list, int | None]:
    """Patches ``[(offset, hex)]`` and optional truncation length for one mutation."""
    bo, size = t.byteorder, t.size
    patches: list[tuple[int, str]] = []
    truncate = None

    def put(off: int, raw: bytes) -> None:
        if 0 <= off < size:
            patches.append((off, raw[: size - off].hex()))

    if kind == "header":
        for _ in range(rng.randint(1, 3)):
            put(rng.randrange(min(t.header_len, size) or 1), bytes([rng.getrandbits(8)]))
    elif kind == "ifd_entry" and t.entries:
        e = rng.choice(t.entries)
        field = rng.choice(("code", "type", "count", "value"))
        if field == "code":
            put(e, _pack(rng.choice([*STRUCT_TAGS, rng.getrandbits(16)]), 2, bo))
        elif field == "type":
            put(e + 2, _pack(rng.choice((0, 1, 2, 3, 4, 5, 7, 11, 12, 13, 16, 17, 18, 19, 255)), 2, bo))
        elif field == "count":
            orig = _read_int(data, e + 4, t.count_size, bo)
            put(e + 4, _pack(_interesting(rng, orig), t.count_size, bo))
        else:
            vo = e + 4 + t.count_size
            orig = _read_int(data, vo, t.count_size, bo)
            put(vo, _pack(_interesting(rng, orig, size), t.count_size, bo))
    elif kind == "tag_value" and t.tag_values:
        vo, isize, count, _code = rng.choice(t.tag_values)
        idx = rng.randrange(max(1, min(count, 64)))
        off = vo + idx * isize
        n = min(isize, 8)
        orig = _read_int(data, off, n, bo)
        put(off, _pack(_interesting(rng, orig, size), n, bo))
    elif kind in ("tile_offset", "tile_bytecount") and (t.offset_arrays if kind == "tile_offset" else t.count_arrays):
        vo, isize, count = rng.choice(t.offset_arrays if kind == "tile_offset" else t.count_arrays)
        n = min(isize, 8)
        for _ in range(rng.randint(1, 3)):
            idx = rng.randrange(max(1, count))
            off = vo + idx * isize
            orig = _read_int(data, off, n, bo)
            if kind == "tile_bytecount" and rng.random() < 0.4:
                new = max(0, int(orig * rng.choice((0.0, 0.1, 0.5, 0.9, 1.5, 4.0))))
            elif kind == "tile_offset" and rng.random() < 0.3 and count > 1:
                new = _read_int(data, vo + rng.randrange(count) * isize, n, bo)  # alias another tile
            else:
                new = _interesting(rng, orig, size)
            put(off, _pack(new, n, bo))
    elif kind == "tile_bytes" and t.segments:
        off, cnt = rng.choice(t.segments)
        how = rng.random()
        if how < 0.5:
            for _ in range(rng.randint(1, 8)):
                p = off + rng.randrange(cnt)
                put(p, bytes([data[p] ^ (1 << rng.randrange(8))]))
        elif how < 0.75:
            p = off + rng.randrange(cnt)
            put(p, bytes([rng.choice((0, 0xFF))]) * rng.randint(1, 64))
        else:
            p = off + rng.randrange(min(cnt, 16))
            put(p, bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 16))))
    elif kind == "jpeg_header" and (t.segments or t.jpeg_tables):
        regions = [(o, c) for o, c in t.segments[:2000]] + list(t.jpeg_tables)
        off, cnt = rng.choice(regions)
        blob = data[off:off + min(cnt, 2048)]
        markers = [i for i in range(len(blob) - 3) if blob[i] == 0xFF and 0xC0 <= blob[i + 1] <= 0xFE]
        if markers:
            i = rng.choice(markers)
            mk = blob[i + 1]
            if 0xC0 <= mk <= 0xCF and mk not in (0xC4, 0xC8, 0xCC) and i + 9 <= len(blob):
                field = rng.choice((5, 7, 4, 9))  # height, width, precision, components
                nbytes = 2 if field in (5, 7) else 1
                put(off + i + field, _pack(_interesting(rng, _read_int(blob, i + field, nbytes, ">")), nbytes, ">"))
            elif rng.random() < 0.5:
                put(off + i + 2, _pack(_interesting(rng, _read_int(blob, i + 2, 2, ">")), 2, ">"))
            else:
                markers = (0xC0, 0xC1, 0xC2, 0xC3, 0xC4, 0xD9, 0xDA, 0xDB, 0xDD, 0xEE, 0xD0)
                put(off + i + 1, bytes([rng.choice(markers)]))
        else:
            put(off + rng.randrange(max(1, min(cnt, 32))), bytes([rng.getrandbits(8)]))
    elif kind == "truncate":
        truncate = rng.randrange(max(1, size))
    else:  # random_bytes (also the fallback when a file lacks the targeted structure)
        for _ in range(rng.randint(1, 16)):
            put(rng.randrange(max(1, size)), bytes([rng.getrandbits(8)]))
    return patches, truncate


def make_recipe(t: Targets, rng: random.Random, kinds: list[str] | None = None) -> dict:
    """A mutation recipe for seed ``t``: ``{"seed_file", "kinds", "patches", "truncate"}``.

    ``patches`` is a list of ``[offset, hex bytes]`` applied in order; ``truncate``
    (or None) cuts the file to that many bytes after patching.
    """
    with open(t.path, "rb") as fh:
        data = fh.read()
    if kinds is None:
        kinds = [rng.choice(KINDS) for _ in range(rng.choice((1, 1, 1, 2, 3)))]
    patches: list = []
    truncate = None
    for kind in kinds:
        p, tr = _one_mutation(t, data, rng, kind)
        patches += [list(x) for x in p]
        if tr is not None:
            truncate = tr
    return {"seed_file": t.path, "kinds": list(kinds), "patches": patches, "truncate": truncate}


def apply_recipe(recipe: dict, original: bytes | None = None) -> bytes:
    """Rebuild the mutated bytes of ``recipe`` from its seed file (or ``original``)."""
    if original is None:
        with open(recipe["seed_file"], "rb") as fh:
            original = fh.read()
    buf = bytearray(original)
    for off, hexbytes in recipe["patches"]:
        raw = bytes.fromhex(hexbytes)
        buf[off:off + len(raw)] = raw[: max(0, len(buf) - off)]
    if recipe.get("truncate") is not None:
        del buf[recipe["truncate"]:]
    return bytes(buf)


#: Pieces of region names and list-file paths that have hurt batch tools: path
#: traversal, hidden and option-like names, terminal escapes, newlines, NUL,
#: bidi overrides, non-ASCII, reserved and over-long names.
BATCH_NAME_PIECES = (
    "a", "tumor 1", "Gewebe_äöü", "x.y", "slide", "../x", "..", ".", ".hidden", "-rf", "a/b", "a\\b",
    "/etc/passwd", "\x1b]0;pwned\x07", "\x1b[2K", "\x1b[31m", "l1\nl2", "\r", "\x00", "\u202e", "\u200b",
    "\x85", "\x7f", "CON", "a:b", "*", "?", "😀", "x" * 300, "", " ", "a ", "a.", "%s%n", "$(id)",
)
_SAFE_PIECES = ("a", "tumor 1", "Gewebe_äöü", "x.y", "slide", "b-2", "c+d", "(e)", "_f")
_BATCH_HEADERS = (
    b"x,y,level,width,height,name", b"X,Y,Level,Width,Height,Name", b"\xef\xbb\xbfx,y,level,width,height,name",
    b"x,y,level,width,height", b"name,height,width,level,y,x", b"x,y,level,width", b"", b"x;y;level;width;height",
)
_BATCH_NUMBERS = ("0", "1", "8", "16", "-1", "-8", "99", "1e3", "1.5", "", " 4 ", "10000000000000000000000",
                  "0x10", "nan", "٣")  # the last: an Arabic-Indic digit


def _csv_field(rng: random.Random, text: str) -> str:
    if rng.random() < 0.4 or any(c in text for c in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text


def make_batch_case(rng: random.Random) -> dict:
    """One CLI batch input: the command kind, its file bytes and options (pure data, JSON-able)."""
    kind = rng.choice(("regions", "regions", "regions", "pack", "from-list"))
    clean = rng.random() < 0.4  # mostly valid input, so that outputs really get written
    pieces = _SAFE_PIECES if clean else BATCH_NAME_PIECES
    if kind == "from-list":
        lines = []
        for _ in range(rng.randint(0, 4)):
            pick = rng.random()
            if pick < 0.3:
                lines.append("slide.svs")
            elif pick < 0.5:
                lines.append("# " + rng.choice(BATCH_NAME_PIECES))
            else:
                lines.append("".join(rng.choice(BATCH_NAME_PIECES) for _ in range(rng.randint(1, 3))) + ".svs")
        data = "\n".join(lines).encode("utf-8", "surrogateescape")
    else:
        header = _BATCH_HEADERS[0] if clean else rng.choice(_BATCH_HEADERS)
        rows = [header]
        for _ in range(rng.randint(0, 5)):
            nums = [rng.choice(_BATCH_NUMBERS) if rng.random() < 0.3 and not clean
                    else str(rng.randint(0, 64) + (3 <= k)) for k in range(5)]
            nums[2] = nums[2] if rng.random() < 0.3 and not clean else rng.choice(("0", "1"))
            name = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 2)))
            fields = [_csv_field(rng, v) for v in nums]
            if rng.random() < 0.8:
                fields.append(_csv_field(rng, name))
            rows.append(",".join(fields).encode("utf-8"))
        data = rng.choice((b"\n", b"\r\n", b"\r")).join(rows) + rng.choice((b"\n", b""))
    # byte-level damage: non-UTF-8 bytes, NUL, an unterminated quote, truncation
    for _ in range(0 if clean else rng.choice((0, 0, 1, 2))):
        op = rng.choice(("insert", "truncate", "quote"))
        pos = rng.randint(0, len(data))
        if op == "insert":
            data = data[:pos] + rng.choice((b"\xff", b"\xe9", b"\x00", b"\xc3", b"\xed\xa0\x80", b'"')) + data[pos:]
        elif op == "truncate":
            data = data[:pos]
        else:
            data = data + b',"unterminated'
    opts = {"overwrite": rng.random() < 0.3, "twice": rng.random() < 0.3}
    if kind == "regions":
        opts["format"] = rng.choice(("png", "npy", "tif"))
    elif kind == "pack":
        opts["format"] = rng.choice(("npz", "npz", "zarr"))
    return {"kind": kind, "data": data.hex(), "opts": opts}
