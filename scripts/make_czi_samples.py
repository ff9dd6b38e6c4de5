#!/usr/bin/env python3
"""Write small Zeiss CZI (ZISRAW) slides from the real pixels of the shared CMU SVS.

Usage::

    python scripts/make_czi_samples.py OUTDIR [--source ../shared/samples/aperio-cmu1-small-region-jpeg.svs]

No CZI writer on the package index writes pyramid subblocks or the attachment directory
OpenSlide 4.0.1 reads (pylibCZIrw adds ``T`` and ``Z`` dimensions that OpenSlide refuses), so
this script writes the segments itself, as the ZISRAW layout and OpenSlide's Zeiss reader
(``openslide-vendor-zeiss.c``) describe them: a file header segment (``ZISRAWFILE``: GUIDs and
the positions of the others), ``ZISRAWSUBBLOCK`` segments (directory entry, optional subblock
metadata, pixel data), the subblock directory (``ZISRAWDIRECTORY``), the metadata XML
(``ZISRAWMETADATA``) and the attachment directory (``ZISRAWATTDIR``) with its
``ZISRAWATTACH`` segments.  Subblock dimensions are ``X``, ``Y``, ``C``, ``S`` and ``M`` only
(what OpenSlide accepts).

* ``czi-2scene-pyramid.czi``: Bgr24 brightfield, two scenes (``S`` 0 and 1) at a negative
  ``X`` origin.  Level 0 of each scene is a mosaic of 256 x 256 camera tiles that overlap by
  32 pixels, each cut from the SVS a few pixels apart from its neighbours (so the overlaps
  differ and the paint order shows), numbered ``M`` in raster order; scene 0's tiles
  uncompressed, scene 1's zstd1 (the 3-byte header, no hi-lo packing).  Pyramid subblocks
  (pyramid type 2) at downsamples 2 and 4 for both scenes (zstd0 and uncompressed), and 8
  for scene 1 only (left out by OpenSlide, which keeps the downsamples every scene has).
  Attachments: ``Label`` (JPG), ``SlidePreview`` (an embedded CZI of one uncompressed
  subblock: OpenSlide's ``macro``) and ``Thumbnail`` (JPG).  The XML carries the scaling
  (0.499 µm), the objective (20x), a barcode and display settings.
* ``czi-fluorescence-3ch.czi``: Gray16, three channels (``C`` 0..2: DAPI, FITC and TRITC
  with colours and wavelengths in the XML), one scene, a 2 x 2 mosaic of abutting tiles at
  level 0 (zstd1 with hi-lo byte packing) and one pyramid subblock per channel at
  downsample 2 (uncompressed).  OpenSlide refuses it (``Nonzero subblock channel 1``); the
  tests check it against pylibCZIrw.
* ``czi-jpegxr.czi``: Bgr24, a 2 x 2 mosaic of abutting JPEG XR tiles (lossless, pixel format
  24bppBGR as ZEN writes them) and one JPEG XR pyramid subblock at downsample 2.  OpenSlide
  4.0.1 refuses it (``JPEG XR compression is not supported``); the tests check it against
  pylibCZIrw.
"""

from __future__ import annotations

import argparse
import struct
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import imagecodecs
import numpy as np
import tifffile
from PIL import Image

SOURCE = Path(__file__).resolve().parents[1] / ".." / "shared" / "samples" / "aperio-cmu1-small-region-jpeg.svs"
MPP_M = 0.499e-6  # the SVS's pixel size, in metres as CZI stores it
BGR24, GRAY16 = 3, 1
NONE, JPEGXR, ZSTD0, ZSTD1 = 0, 4, 5, 6
#: JPEG XR pixel format GUIDs (jxrlib's GUID_PKPixelFormat24bppRGB / 24bppBGR, as stored: little-endian)
_JXR_RGB = uuid.UUID("6fddc324-4e03-4bfe-b185-3d77768dc90d").bytes_le
_JXR_BGR = uuid.UUID("6fddc324-4e03-4bfe-b185-3d77768dc90c").bytes_le


@dataclass
class Sub:
    """One subblock: level-0 position and logical size, stored pixels, codes and dimensions."""

    x: int
    y: int
    pixels: np.ndarray  # (h, w, samples) as stored (BGR order for Bgr24)
    pixel_type: int
    compression: int
    logical: tuple[int, int] | None = None  # level-0 (w, h) covered; None: the stored size
    pyramid: int = 0
    dims: dict[str, int] = field(default_factory=dict)  # C, S, M starts
    hilo: bool = False
    metadata: bytes = b""


def _segment(sid: bytes, body: bytes) -> bytes:
    """A segment: id, allocated and used size (the body padded to 32 bytes), body."""
    padded = body + b"\0" * (-len(body) % 32)
    return struct.pack("<16sqq", sid, len(padded), len(body)) + padded


def _jpegxr_bgr(bgr: np.ndarray) -> bytes:
    """A lossless JPEG XR stream of pixel format 24bppBGR (as ZEN writes Bgr24 subblocks) holding
    the BGR pixels ``bgr``: imagecodecs encodes their RGB order as 24bppRGB, the format GUID then
    says BGR (the coded planes are the same; a decoder hands them out in BGR order)."""
    stream = bytes(imagecodecs.jpegxr_encode(np.ascontiguousarray(bgr[:, :, ::-1]), level=1.0))
    assert stream.count(_JXR_RGB) == 1
    return stream.replace(_JXR_RGB, _JXR_BGR)


def _payload(sub: Sub) -> bytes:
    if sub.compression == JPEGXR:
        return _jpegxr_bgr(sub.pixels)
    raw = np.ascontiguousarray(sub.pixels).tobytes()
    if sub.hilo:  # low bytes of every 16-bit sample first, then the high bytes
        pairs = np.frombuffer(raw, np.uint8).reshape(-1, 2)
        raw = pairs[:, 0].tobytes() + pairs[:, 1].tobytes()
    if sub.compression == NONE:
        return raw
    packed = bytes(imagecodecs.zstd_encode(raw, level=3))
    if sub.compression == ZSTD0:
        return packed
    return bytes([3, 1, 1 if sub.hilo else 0]) + packed


def _entry(sub: Sub, position: int) -> bytes:
    h, w = sub.pixels.shape[:2]
    lw, lh = sub.logical or (w, h)
    dims = [(b"X", sub.x, lw, w), (b"Y", sub.y, lh, h)]
    dims += [(name.encode(), start, 1, 1) for name, start in sub.dims.items()]
    out = struct.pack("<2siqiiBB4si", b"DV", sub.pixel_type, position, 0, sub.compression, sub.pyramid, 0,
                      b"\0" * 4, len(dims))
    for name, start, size, stored in dims:
        out += struct.pack("<4siifi", name, start, size, float(start), stored)
    return out


def _subblock(sub: Sub, position: int) -> bytes:
    data = _payload(sub)
    entry = _entry(sub, position)
    head = struct.pack("<iiq", len(sub.metadata), 0, len(data)) + entry
    head += b"\0" * max(0, 256 - len(head))
    return _segment(b"ZISRAWSUBBLOCK", head + sub.metadata + data)


def _attachment(name: str, kind: str, data: bytes, position: int) -> tuple[bytes, bytes]:
    """``(ZISRAWATTACH segment, directory entry)`` of one attachment."""
    entry = struct.pack("<2s10sqi16s8s80s", b"A1", b"", position, 0, uuid.uuid4().bytes, kind.encode(),
                        name.encode())
    body = struct.pack("<i12s", len(data), b"") + entry + b"\0" * 112 + data
    return _segment(b"ZISRAWATTACH", body), entry


def zisraw(subs: Sequence[Sub], xml: str = "", attachments: Sequence[tuple[str, str, bytes]] = (),
           guid: bytes | None = None) -> bytes:
    """The bytes of a CZI file of ``subs``, metadata ``xml`` and ``attachments``
    (``(name, content type, data)``); positions relative to its start (so it can be embedded)."""
    guid = guid or uuid.uuid4().bytes
    out = bytearray(b"\0" * 544)  # the file header segment: 32 + 512
    entries = []
    for sub in subs:
        entries.append(_entry(sub, len(out)))
        out += _subblock(sub, len(out))
    dir_pos = len(out)
    out += _segment(b"ZISRAWDIRECTORY", struct.pack("<i124s", len(subs), b"") + b"".join(entries))
    meta_pos = 0
    if xml:
        meta_pos = len(out)
        text = xml.encode()
        out += _segment(b"ZISRAWMETADATA", struct.pack("<ii248s", len(text), 0, b"") + text)
    att_entries = []
    for name, kind, data in attachments:
        seg, entry = _attachment(name, kind, data, len(out))
        att_entries.append(entry)
        out += seg
    att_pos = 0
    if attachments:
        att_pos = len(out)
        out += _segment(b"ZISRAWATTDIR", struct.pack("<i252s", len(att_entries), b"") + b"".join(att_entries))
    header = struct.pack("<iiii16s16siqqiq", 1, 0, 0, 0, guid, guid, 0, dir_pos, meta_pos, 0, att_pos)
    out[:544] = struct.pack("<16sqq", b"ZISRAWFILE", 512, 512) + header + b"\0" * (512 - len(header))
    return bytes(out)


def _pixels(source: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(level 0, label, macro)`` RGB arrays of the SVS."""
    with tifffile.TiffFile(source) as tif:
        return tif.pages[0].asarray(), tif.pages[2].asarray(), tif.pages[3].asarray()


def _reduce(rgb: np.ndarray, ds: int) -> np.ndarray:
    h, w = rgb.shape[:2]
    return np.asarray(Image.fromarray(rgb).resize((w // ds, h // ds), Image.Resampling.BOX))


def _scene(base: np.ndarray, scene: int, origin: tuple[int, int], grid: tuple[int, int], src: tuple[int, int],
           compression: int, pyramid: Sequence[tuple[int, int]], m0: int) -> list[Sub]:
    """One scene's subblocks: a ``grid`` of overlapping 256² camera tiles (step 224) at ``origin``
    (level 0), cut from ``base`` near ``src``, then pyramid subblocks ``(downsample, compression)``
    of the scene's extent, 256² stored each."""
    x0, y0 = origin
    across, down = grid
    subs = []
    for r in range(down):
        for c in range(across):
            jx, jy = (c * 3 + r) % 5, (r * 4 + c) % 6  # each tile a few pixels off its neighbours
            sy, sx = src[1] + r * 224 + jy, src[0] + c * 224 + jx
            rgb = base[sy:sy + 256, sx:sx + 256]
            subs.append(Sub(x0 + c * 224, y0 + r * 224, rgb[:, :, ::-1], BGR24, compression,
                            dims={"C": 0, "S": scene, "M": m0 + len(subs)}))
    width, height = 224 * (across - 1) + 256, 224 * (down - 1) + 256
    whole = base[src[1]:src[1] + height, src[0]:src[0] + width]
    for ds, comp in pyramid:
        small = _reduce(whole, ds)
        for ty in range(0, small.shape[0], 256):
            for tx in range(0, small.shape[1], 256):
                part = small[ty:ty + 256, tx:tx + 256]
                subs.append(Sub(x0 + tx * ds, y0 + ty * ds, part[:, :, ::-1], BGR24, comp,
                                logical=(part.shape[1] * ds, part.shape[0] * ds), pyramid=2,
                                dims={"C": 0, "S": scene, "M": m0 + len(subs)}))
    return subs


def _xml(size: tuple[int, int], scenes: int, pixel_type: str, channels: str = "", display: str = "") -> str:
    return f"""<ImageDocument>
  <Metadata>
    <Information>
      <Document><Name>wsitool fixture</Name><UserName>wsitool</UserName></Document>
      <Image>
        <ComponentBitCount>{16 if pixel_type == "Gray16" else 8}</ComponentBitCount>
        <PixelType>{pixel_type}</PixelType>
        <SizeX>{size[0]}</SizeX>
        <SizeY>{size[1]}</SizeY>
        <SizeS>{scenes}</SizeS>
        <Dimensions>{channels}
          <S><Scenes>{''.join(f'<Scene Index="{k}" Name="Scene {k + 1}"><Shape>Rectangle</Shape></Scene>'
                             for k in range(scenes))}</Scenes></S>
        </Dimensions>
        <ObjectiveSettings><ObjectiveRef Id="Objective:1" /></ObjectiveSettings>
      </Image>
      <Instrument>
        <Microscopes>
          <Microscope Id="Microscope:1" Name="Axioscan 7"><System>Axioscan 7</System></Microscope>
        </Microscopes>
        <Objectives>
          <Objective Id="Objective:1" Name="Plan-Apochromat 20x/0.8 M27">
            <NominalMagnification>20</NominalMagnification>
            <LensNA>0.8</LensNA>
          </Objective>
        </Objectives>
      </Instrument>
    </Information>
    <Scaling>
      <Items>
        <Distance Id="X"><Value>{MPP_M!r}</Value><DefaultUnitFormat>µm</DefaultUnitFormat></Distance>
        <Distance Id="Y"><Value>{MPP_M!r}</Value><DefaultUnitFormat>µm</DefaultUnitFormat></Distance>
      </Items>
    </Scaling>
    <DisplaySetting>{display}<ViewerRotations>0</ViewerRotations></DisplaySetting>
    <AttachmentInfos>
      <AttachmentInfo Id="Label:1" Name="Label"><Label><Barcodes><Barcode Id="Barcode:1">
        <Type>QR</Type><Content>CZI-FIXTURE-0001</Content></Barcode></Barcodes></Label></AttachmentInfo>
    </AttachmentInfos>
  </Metadata>
</ImageDocument>
"""


def _jpeg(rgb: np.ndarray) -> bytes:
    return bytes(imagecodecs.jpeg8_encode(rgb, level=90))


def two_scene_pyramid(out: Path, source: Path = SOURCE) -> Path:
    """Write ``czi-2scene-pyramid.czi`` into the folder ``out`` (module docstring); its path."""
    base, label, macro = _pixels(source)
    subs = _scene(base, 0, (-1024, 512), (3, 2), (40, 60), NONE, [(2, ZSTD0), (4, NONE)], 0)
    subs += _scene(base, 1, (-224, 576), (2, 2), (900, 1400), ZSTD1, [(2, NONE), (4, ZSTD0), (8, NONE)],
                   len(subs))
    subs[3].metadata = b"<METADATA><Tags><AcquisitionTime>2026-12-07</AcquisitionTime></Tags></METADATA>"
    preview = zisraw([Sub(0, 0, macro[::2, ::2, ::-1].copy(), BGR24, NONE)])
    display = ('<Channels><Channel Id="Channel:0" Name="TL Brightfield"><PixelType>Bgr24</PixelType>'
               '<ColorMode>None</ColorMode></Channel></Channels>')
    xml = _xml((1280, 544), 2, "Bgr24", display=display)
    data = zisraw(subs, xml, [("Label", "JPG", _jpeg(label)), ("SlidePreview", "CZI", preview),
                              ("Thumbnail", "JPG", _jpeg(_reduce(base[:800, :800], 8)))])
    path = out / "czi-2scene-pyramid.czi"
    path.write_bytes(data)
    return path


#: The fluorescence fixture's channels: name, colour (#AARRGGBB), excitation and emission (nm).
CHANNELS = (("DAPI", "#FF0000FF", 353, 465), ("FITC", "#FF00FF00", 493, 517), ("TRITC", "#FFFF0000", 557, 576))


def fluorescence(out: Path, source: Path = SOURCE) -> Path:
    """Write ``czi-fluorescence-3ch.czi`` into the folder ``out`` (module docstring); its path."""
    base = _pixels(source)[0][300:812, 500:1012]
    subs = []
    for c in range(3):
        plane = (base[:, :, c].astype(np.uint16) * 257 // (c + 1))[:, :, None]
        for r in range(2):
            for k in range(2):
                tile = plane[r * 256:(r + 1) * 256, k * 256:(k + 1) * 256]
                subs.append(Sub(k * 256, r * 256, tile, GRAY16, ZSTD1, hilo=True,
                                dims={"C": c, "S": 0, "M": r * 2 + k}))
        half = plane[::2, ::2]
        subs.append(Sub(0, 0, half, GRAY16, NONE, logical=(512, 512), pyramid=2, dims={"C": c, "S": 0, "M": 4}))
    info = "<Channels>" + "".join(
        f'<Channel Id="Channel:{k}" Name="{n}"><ExcitationWavelength>{ex}</ExcitationWavelength>'
        f'<EmissionWavelength>{em}</EmissionWavelength><Fluor>{n}</Fluor></Channel>'
        for k, (n, _, ex, em) in enumerate(CHANNELS)) + "</Channels>"
    display = "<Channels>" + "".join(
        f'<Channel Id="Channel:{k}" Name="{n}"><Color>{col}</Color><DyeName>{n}</DyeName></Channel>'
        for k, (n, col, _, _) in enumerate(CHANNELS)) + "</Channels>"
    xml = _xml((512, 512), 1, "Gray16", channels=info, display=display)
    path = out / "czi-fluorescence-3ch.czi"
    path.write_bytes(zisraw(subs, xml))
    return path


def jpegxr(out: Path, source: Path = SOURCE) -> Path:
    """Write ``czi-jpegxr.czi`` into the folder ``out`` (module docstring); its path."""
    base = _pixels(source)[0][900:1412, 300:812]
    subs = [Sub(c * 256, r * 256, base[r * 256:(r + 1) * 256, c * 256:(c + 1) * 256, ::-1], BGR24, JPEGXR,
                dims={"C": 0, "S": 0, "M": r * 2 + c}) for r in range(2) for c in range(2)]
    subs.append(Sub(0, 0, _reduce(base, 2)[:, :, ::-1], BGR24, JPEGXR, logical=(512, 512), pyramid=2,
                    dims={"C": 0, "S": 0, "M": 4}))
    path = out / "czi-jpegxr.czi"
    path.write_bytes(zisraw(subs, _xml((512, 512), 1, "Bgr24")))
    return path


#: Every fixture this script writes, in order; the brightfield ones OpenSlide reads.
MAKERS = (two_scene_pyramid, fluorescence, jpegxr)
BRIGHTFIELD = ("czi-2scene-pyramid.czi",)


def write_all(outdir: Path, source: Path = SOURCE) -> list[Path]:
    """Write every fixture (:data:`MAKERS`) into ``outdir`` (made where missing); their paths."""
    outdir.mkdir(parents=True, exist_ok=True)
    return [make(outdir, source) for make in MAKERS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--source", type=Path, default=SOURCE)
    args = parser.parse_args(argv)
    for path in write_all(args.outdir, args.source):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
