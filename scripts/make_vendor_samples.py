#!/usr/bin/env python3
"""Write small vendor-layout TIFFs (Philips, Ventana BIF and TIFF, Leica SCN) from the shared CMU SVS's real pixels.

Usage::

    python scripts/make_vendor_samples.py OUTDIR [--source ../shared/samples/aperio-cmu1-small-region-jpeg.svs]

No real Philips file is small enough to fetch; these follow the layout OpenSlide 4.0.1's
Philips reader and its format notes describe (:mod:`wsitool.formats.tiff.philips`):

* ``philips-multilevel.tiff`` (BigTIFF): three tiled JPEG levels (256 x 256 tiles, downsamples
  1, 2, 4) cut from the SVS's level 0; each lower level's stored size padded to whole tiles,
  as Philips writes it, its true size given by the XML's pixel spacings.  The first IFD's
  Software is ``Philips DP v1.0``, its ImageDescription the ``DataObject ObjectType=
  "DPUfsImport"`` XML: barcode (base64), derivation description (``levels=40,...``: the
  objective), the WSI image with its pixel spacing and pixel-data representation sequence,
  and the label and macro as base64 JPEG (``PIM_DP_IMAGE_DATA`` of ``LABELIMAGE`` /
  ``MACROIMAGE`` images).
* ``philips-sparse.tiff`` (classic TIFF): two levels whose TileByteCounts (and TileOffsets)
  are 0 for a block of tiles (a scan of several regions of interest); the label and macro as
  stripped JPEG IFDs whose ImageDescription starts with ``Label`` / ``Macro``; a derivation
  description whose first level number is no objective.
* ``ventana-tiff.tif``: a Ventana TIFF (OpenSlide 4.0.1's Ventana reader,
  :mod:`wsitool.formats.tiff.ventana`): the first IFD the ``Label Image`` (stripped JPEG)
  carrying the ``iScan`` XMP packet (tag 700: scan resolution, magnification, barcode),
  then the ``Thumbnail``, then three tiled JPEG levels described ``level=N mag=M
  quality=90`` (mag 40, 20, 10) of sizes not whole tiles; no XMP in level 0 (no tile map).
* ``ventana-bif.bif``: a BIF: the same, with level 0's XMP an ``EncodeInfo`` tile map of
  one area of interest (4 x 6 tiles of 256, at tile 0, 0; ``Pos-Y`` counted from below)
  whose tile joints (right and up, numbered from the bottom row in a serpentine) overlap by
  0; the stored levels larger than the area (OpenSlide shows the area's extent).
* ``ventana-overlap.bif``: that BIF with joints overlapping by 3 pixels (OpenSlide places the
  tiles at steps of 253 pixels: 126.5 and 63.25 on levels 1 and 2).
* ``ventana-areas.bif``: that BIF with two areas of interest and joints overlapping by 2: 2 x 6
  tiles at tile 0, 0 and 2 x 4 tiles at tile 2, 1 whose ``Pos-X`` / ``Pos-Y`` put it 22 pixels
  right and 288 down of its stored place (a gap between the areas; steps of 254 pixels, 63.5
  on level 2).
* ``leica-brightfield.scn`` (BigTIFF; OpenSlide 4.0.1's Leica reader,
  :mod:`wsitool.formats.tiff.leica`): the first IFD's ImageDescription the SCN XML
  (``.../scn/2010/10/01``: collection 2048 x 2560 pixels of 500 nm, a base64 ``barcode``
  element); IFDs 0-1 the brightfield macro (view = the whole collection; 2 tiled
  dimensions), IFDs 2-4 the one main image (1024 x 1536 pixels at 500 nm, dimensions of
  downsample 1, 2, 4, 128 x 128 JPEG tiles) at the view offset 512, 512 pixels; level 0's
  resolution tags give 0.5 um per pixel.  OpenSlide shows the collection (2048 x 2560) with the
  main image placed in it, ``openslide.bounds-*`` its extent.
* ``leica-two-main.scn``: the ``.../scn/2010/03/10`` namespace (barcode as an attribute) and two
  brightfield main images (1024 x 1024 at 512, 512; 1024 x 512 at 512, 2048): both composited
  on one canvas; the quickhash is the macro's smallest dimension.
* ``leica-fluorescence.scn``: a brightfield macro and one fluorescence main image (three
  channels, the SVS's red, green and blue, 8-bit Deflate tiles): one IFD per channel per
  resolution (``c`` and ``r`` attributes).  OpenSlide refuses it; Bio-Formats reads it.
* ``leica-offgrid.scn``: as SCN400 writes it, one main image (1000 x 1300 pixels at 500 nm, so
  not whole 128-pixel tiles) at the view offset 300, 437 pixels (no tile boundary; 218.5 and
  109.25 pixels at the lower levels, which OpenSlide truncates), its tiles YCbCr JPEG (2 x 2
  chroma subsampling) whose quantisation and Huffman tables are shared in the JPEGTables tag.
* ``leica-overlap.scn``: that main image and a second one (803 x 601 at 901, 1501) overlapping
  its lower right corner (OpenSlide paints the first in front).

``--large-philips WxH`` writes instead ``philips-large.tiff``, a large Philips TIFF for the read
benchmark (``scripts/bench_vendor.py``): the encoded tissue tiles of the shared CMU SVS
(``scripts/make_bench_slide.py``'s, 240 x 240 JPEG, shared JPEGTables) copied, not re-encoded,
into a level-0 grid drawn at random (``--seed``), with lower levels at downsamples 2 and 4 of the
same tiles; not among :data:`MAKERS` (no test writes it).
"""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path

import imagecodecs
import numpy as np
import tifffile
from PIL import Image

SOURCE = Path(__file__).resolve().parents[1] / ".." / "shared" / "samples" / "aperio-cmu1-small-region-jpeg.svs"
TILE = 256
SPACING_MM = 0.000499  # level 0's pixel spacing (mm), the SVS's MPP


def _attr(name: str, value: str, pmsvr: str = "IString") -> str:
    return f'<Attribute Name="{name}" Group="0x0000" Element="0x0000" PMSVR="{pmsvr}">{value}</Attribute>'


def _representation(k: int, spacing: float) -> str:
    return ('<DataObject ObjectType="PixelDataRepresentation">'
            + _attr("DICOM_PIXEL_SPACING", f'"{spacing:.9g}" "{spacing:.9g}"', "IDoubleArray")
            + _attr("PIIM_PIXEL_DATA_REPRESENTATION_NUMBER", str(k), "IUInt16")
            + "</DataObject>")


def philips_xml(levels: int, derivation: str, barcode: str, label: bytes | None,
                macro: bytes | None) -> str:
    """The ``DPUfsImport`` XML of a slide of ``levels`` levels (downsamples ``2**k``); ``label`` /
    ``macro``: JPEG bytes carried as base64, or None."""
    reps = "".join(_representation(k, SPACING_MM * 2 ** k) for k in range(levels))
    wsi = ('<DataObject ObjectType="DPScannedImage">'
           + _attr("DICOM_DERIVATION_DESCRIPTION", derivation)
           + _attr("DICOM_PIXEL_SPACING", f'"{SPACING_MM}" "{SPACING_MM}"', "IDoubleArray")
           + _attr("PIM_DP_IMAGE_TYPE", "WSI")
           + _attr("DICOM_LOSSY_IMAGE_COMPRESSION_METHOD", '"PHILIPS_DP_1_0"', "IStringArray")
           + '<Attribute Name="PIIM_PIXEL_DATA_REPRESENTATION_SEQUENCE" PMSVR="IDataObjectArray"><Array>'
           + reps + "</Array></Attribute></DataObject>")
    images = [wsi]
    for kind, data in (("LABELIMAGE", label), ("MACROIMAGE", macro)):
        if data is not None:
            images.append('<DataObject ObjectType="DPScannedImage">'
                          + _attr("PIM_DP_IMAGE_TYPE", kind)
                          + _attr("PIM_DP_IMAGE_DATA", base64.b64encode(data).decode("ascii"))
                          + "</DataObject>")
    return ('<?xml version="1.0" encoding="UTF-8" ?>\n<DataObject ObjectType="DPUfsImport">'
            + _attr("DICOM_MANUFACTURER", "PHILIPS")
            + _attr("DICOM_SOFTWARE_VERSIONS", '"1.6.6186" "20150402_R48"', "IStringArray")
            + _attr("PIM_DP_UFS_BARCODE", base64.b64encode(barcode.encode()).decode("ascii"))
            + _attr("PIM_DP_UFS_INTERFACE_VERSION", "3.0")
            + '<Attribute Name="PIM_DP_SCANNED_IMAGES" PMSVR="IDataObjectArray"><Array>'
            + "".join(images) + "</Array></Attribute></DataObject>")


def _pixels(source: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(level 0, label, macro)`` RGB arrays of the SVS."""
    with tifffile.TiffFile(source) as tif:
        return tif.pages[0].asarray(), tif.pages[2].asarray(), tif.pages[3].asarray()


def _level(base: np.ndarray, k: int) -> np.ndarray:
    """Level ``k``: level 0 reduced ``2**k`` times; a lower level padded with white to whole
    tiles (its stored size; the XML gives its true one)."""
    if k == 0:
        return base
    h, w = base.shape[:2]
    lw, lh = -(-w // 2 ** k), -(-h // 2 ** k)
    img = np.asarray(Image.fromarray(base).resize((lw, lh), Image.Resampling.BOX))
    pw, ph = -(-lw // TILE) * TILE, -(-lh // TILE) * TILE
    out = np.full((ph, pw, 3), 255, np.uint8)
    out[:lh, :lw] = img
    return out


def _jpeg(rgb: np.ndarray) -> bytes:
    return bytes(imagecodecs.jpeg8_encode(rgb, level=90))


def _write_levels(tif: tifffile.TiffWriter, arrays: list[np.ndarray], xml: str) -> None:
    for k, arr in enumerate(arrays):
        tif.write(arr, tile=(TILE, TILE), compression="jpeg", compressionargs={"level": 90},
                  photometric="rgb", subfiletype=0 if k == 0 else 1,
                  description=xml if k == 0 else f"level={k} mag={40 >> k} quality=90",
                  software="Philips DP v1.0" if k == 0 else None, metadata=None)


def philips_multilevel(out: Path, source: Path = SOURCE) -> Path:
    """Write ``philips-multilevel.tiff`` into the folder ``out`` (module docstring); its path."""
    base, label, macro = _pixels(source)
    base = base[:1500, :1100]
    xml = philips_xml(3, 'tiff-useBigTIFF=1-useRgb=0-levels=40,20,10-processing=0-q80=-1-sourceFilename="T-1"',
                      "PHILIPS-TEST-1", _jpeg(label), _jpeg(macro))
    path = out / "philips-multilevel.tiff"
    with tifffile.TiffWriter(path, bigtiff=True) as tif:
        _write_levels(tif, [_level(base, k) for k in range(3)], xml)
    return path


def philips_sparse(out: Path, source: Path = SOURCE) -> Path:
    """Write ``philips-sparse.tiff`` into the folder ``out`` (module docstring); its path."""
    base, label, macro = _pixels(source)
    base = base[:1200, :1000]
    xml = philips_xml(2, "tiff-useBigTIFF=0-useRgb=0-levels=10003,10002-processing=0", "PHILIPS-SPARSE",
                      None, None)
    path = out / "philips-sparse.tiff"
    with tifffile.TiffWriter(path) as tif:
        _write_levels(tif, [_level(base, k) for k in range(2)], xml)
        for name, img in (("Label", label), ("Macro", macro)):
            tif.write(img, compression="jpeg", compressionargs={"level": 90}, photometric="rgb",
                      rowsperstrip=img.shape[0], description=f"{name} image", metadata=None)
    _drop_tiles(path, {0: [(1, 1), (1, 2), (2, 1), (2, 2), (4, 0)], 1: [(1, 1)]})
    return path


def _drop_tiles(path: Path, drop: dict[int, list[tuple[int, int]]]) -> None:
    """Zero the TileOffsets and TileByteCounts entries of the ``(row, col)`` tiles of each IFD."""
    with tifffile.TiffFile(path) as tif:
        edits = []
        for index, cells in drop.items():
            page = tif.pages[index]
            across = -(-page.imagewidth // page.tilewidth)
            for code in (324, 325):
                tag = page.tags[code]
                size = tifffile.TIFF.DATA_FORMATS[tag.dtype]
                width = int(np.dtype(tif.byteorder + size[-1]).itemsize)
                for row, col in cells:
                    edits.append((tag.valueoffset + (row * across + col) * width, width))
    with open(path, "r+b") as fh:
        for offset, width in edits:
            fh.seek(offset)
            fh.write(b"\0" * width)


VENTANA_ISCAN = ('<?xml version="1.0" encoding="utf-8"?><iScan Magnification="40" ScanRes="0.499" '
                 'BarCode1D="VENTANA-TEST" UnitNumber="BI10N0001" Mode="Brightfield" ZLayers="1" '
                 'Empty="" BuildVersion="3.3.1.1"></iScan>')


def _joints(across: int, down: int, overlap: float) -> str:
    """The TileJointInfo elements of an area: tiles numbered from 1 along the bottom row, every
    second row from the bottom right to left; one RIGHT joint per neighbour pair, one UP."""
    number = {}
    for r in range(down):  # r: row from the bottom
        for c in range(across):
            col = c if r % 2 == 0 else across - 1 - c
            number[(col, down - 1 - r)] = r * across + c + 1
    out = []
    for (col, row), n in sorted(number.items(), key=lambda kv: kv[1]):
        if col + 1 < across:
            out.append(f'<TileJointInfo FlagJoined="1" Confidence="95" Direction="RIGHT" Tile1="{n}" '
                       f'Tile2="{number[(col + 1, row)]}" OverlapX="{overlap}" OverlapY="0"/>')
        if row > 0:
            out.append(f'<TileJointInfo FlagJoined="1" Confidence="90" Direction="UP" Tile1="{n}" '
                       f'Tile2="{number[(col, row - 1)]}" OverlapX="0" OverlapY="{overlap}"/>')
    return "".join(out)


def encode_info(across: int, down: int, overlap: float,
                areas: list[tuple[int, int, int, int, float, float]] | None = None) -> str:
    """Level 0's ``EncodeInfo`` XMP: one scanned area of ``across`` x ``down`` tiles at tile 0, 0,
    or ``areas``: ``(first column, first row, across, down, Pos-X, Pos-Y)`` each."""
    areas = areas or [(0, 0, across, down, 0, 1234)]
    origins = "".join(f'<AOI{i} OriginX="{c * TILE}" OriginY="{r * TILE}"/>' for i, (c, r, *_) in enumerate(areas))
    infos = "".join(f'<ImageInfo AOIScanned="1" AOIIndex="{i}" Width="{TILE}" Height="{TILE}" NumRows="{d}" '
                    f'NumCols="{a}" Pos-X="{x}" Pos-Y="{y}">{_joints(a, d, overlap)}</ImageInfo>'
                    for i, (_, _, a, d, x, y) in enumerate(areas))
    return ('<?xml version="1.0" encoding="utf-8"?><EncodeInfo Ver="2"><SlideInfo/>'
            f'<AoiOrigin>{origins}</AoiOrigin><SlideStitchInfo>{infos}</SlideStitchInfo></EncodeInfo>')


def _xmp(text: str) -> list[tuple[int, int, int, bytes, bool]]:
    data = text.encode("utf-8")
    return [(700, 1, len(data), data, True)]


def _ventana(path: Path, source: Path, size: tuple[int, int], level0_xmp: str | None,
             descriptions: list[str] | None = None) -> Path:
    base, label, _macro = _pixels(source)
    base = base[:size[1], :size[0]]
    descs = descriptions or [f"level={k} mag={40 >> k} quality=90" for k in range(3)]
    with tifffile.TiffWriter(path) as tif:
        tif.write(label, compression="jpeg", compressionargs={"level": 90}, photometric="rgb",
                  rowsperstrip=label.shape[0], description="Label Image", extratags=_xmp(VENTANA_ISCAN),
                  software="ScanOutputManager 1.1.0.15854", metadata=None)
        thumb = np.asarray(Image.fromarray(base).resize((base.shape[1] // 8, base.shape[0] // 8),
                                                        Image.Resampling.BOX))
        tif.write(thumb, compression="jpeg", compressionargs={"level": 90}, photometric="rgb",
                  rowsperstrip=16, description="Thumbnail", metadata=None)
        for k, desc in enumerate(descs):
            img = base if k == 0 else np.asarray(Image.fromarray(base).resize(
                (-(-base.shape[1] // 2 ** k), -(-base.shape[0] // 2 ** k)), Image.Resampling.BOX))
            extra = _xmp(level0_xmp) if k == 0 and level0_xmp is not None else []
            tif.write(img, tile=(TILE, TILE), compression="jpeg", compressionargs={"level": 90},
                      photometric="rgb", description=desc, extratags=extra, metadata=None,
                      software="ScanOutputManager 1.1.0.15854", datetime="2026:01:02 03:04:05")
    return path


def ventana_tiff(out: Path, source: Path = SOURCE) -> Path:
    """Write ``ventana-tiff.tif`` into the folder ``out`` (module docstring); its path."""
    return _ventana(out / "ventana-tiff.tif", source, (1100, 1500), None)


def ventana_bif(out: Path, source: Path = SOURCE) -> Path:
    """Write ``ventana-bif.bif`` into the folder ``out`` (module docstring); its path."""
    return _ventana(out / "ventana-bif.bif", source, (1100, 1600), encode_info(4, 6, 0))


def ventana_overlap(out: Path, source: Path = SOURCE) -> Path:
    """Write ``ventana-overlap.bif`` into the folder ``out`` (module docstring); its path."""
    return _ventana(out / "ventana-overlap.bif", source, (1100, 1600), encode_info(4, 6, 3))


def ventana_areas(out: Path, source: Path = SOURCE) -> Path:
    """Write ``ventana-areas.bif`` into the folder ``out`` (module docstring); its path."""
    areas = [(0, 0, 2, 6, 0, 1234), (2, 1, 2, 4, 530.0, 1200)]
    return _ventana(out / "ventana-areas.bif", source, (1100, 1600), encode_info(0, 0, 2, areas))


LEICA_NS = {"new": "http://www.leica-microsystems.com/scn/2010/10/01",
            "old": "http://www.leica-microsystems.com/scn/2010/03/10"}
LEICA_TILE = 128
LEICA_NM = 500  # nm per pixel of level 0


def _leica_image(name: str, view: tuple[int, int, int, int], dims: list[tuple[int, int, int, int, int]],
                 illumination: str = "brightfield", objective: str = "20") -> str:
    """An SCN ``image`` element: ``view`` (sizeX, sizeY, offsetX, offsetY in nm), ``dims``
    (sizeX, sizeY, ifd, c, r) of its dimension elements."""
    w, h, ox, oy = view
    dim_xml = "".join(f'<dimension sizeX="{dw}" sizeY="{dh}" r="{r}" c="{c}" ifd="{ifd}"/>'
                      for dw, dh, ifd, c, r in dims)
    return (f'<image name="{name}" uuid="urn:uuid:{name}">'
            '<creationDate>2026-01-02T03:04:05.00Z</creationDate>'
            '<device model="Leica SCN400;Leica SCN" version="1.4.0.10003 2011/06/20 10:28:40;1.4.0.10106"/>'
            f'<pixels sizeX="{dims[0][0]}" sizeY="{dims[0][1]}">{dim_xml}</pixels>'
            f'<view sizeX="{w}" sizeY="{h}" offsetX="{ox}" offsetY="{oy}" spacingZ="0"/>'
            f'<scanSettings><objectiveSettings><objective>{objective}</objective></objectiveSettings>'
            '<illuminationSettings><numericalAperture>0.4</numericalAperture>'
            f'<illuminationSource>{illumination}</illuminationSource></illuminationSettings></scanSettings>'
            '</image>')


def leica_xml(ns: str, canvas: tuple[int, int], barcode: str, images: list[str]) -> str:
    """The SCN XML of a collection ``canvas`` pixels (of :data:`LEICA_NM`) holding ``images``."""
    cw, ch = canvas[0] * LEICA_NM, canvas[1] * LEICA_NM
    code = (f"<barcode>{base64.b64encode(barcode.encode()).decode('ascii')}</barcode>" if ns == "new" else "")
    attr = f' barcode="{barcode}"' if ns == "old" else ""
    return (f'<?xml version="1.0" encoding="utf-8"?>\n<scn xmlns="{LEICA_NS[ns]}">'
            f'<collection name="test" uuid="urn:uuid:test" sizeX="{cw}" sizeY="{ch}"{attr}>{code}'
            + "".join(images) + "</collection></scn>")


def _reduce(img: np.ndarray, k: int) -> np.ndarray:
    if k == 0:
        return img
    h, w = img.shape[:2]
    return np.asarray(Image.fromarray(img).resize((-(-w // 2 ** k), -(-h // 2 ** k)), Image.Resampling.BOX))


def _leica_macro(macro: np.ndarray, canvas: tuple[int, int]) -> tuple[list[np.ndarray], str]:
    """The macro's two dimensions (the SVS macro scaled to the canvas's shape) and its image XML (IFDs 0, 1)."""
    w, h = canvas[0] // 4, canvas[1] // 4
    big = np.asarray(Image.fromarray(macro).resize((w, h), Image.Resampling.BILINEAR))
    arrays = [big, _reduce(big, 1)]
    dims = [(a.shape[1], a.shape[0], k, 0, k) for k, a in enumerate(arrays)]
    xml = _leica_image("macro", (canvas[0] * LEICA_NM, canvas[1] * LEICA_NM, 0, 0), dims, objective="0.5")
    return arrays, xml


def _write_leica(path: Path, xml: str, ifds: list[tuple[np.ndarray, dict]]) -> Path:
    """Write the IFDs (array, tifffile keywords) of an SCN, the XML in the first."""
    with tifffile.TiffWriter(path, bigtiff=True) as tif:
        for k, (arr, kw) in enumerate(ifds):
            tif.write(arr, tile=(LEICA_TILE, LEICA_TILE), description=xml if k == 0 else None, metadata=None, **kw)
    return path


_JPEG = {"compression": "jpeg", "compressionargs": {"level": 90}, "photometric": "rgb"}
_RES = {"resolution": (1e7 / LEICA_NM, 1e7 / LEICA_NM), "resolutionunit": "CENTIMETER"}


def _main_levels(img: np.ndarray, first_ifd: int, offset: tuple[int, int]) -> tuple[list[tuple[np.ndarray, dict]], str]:
    """A brightfield main image at ``offset`` (level-0 pixels): three dimensions and its XML."""
    arrays = [_reduce(img, k) for k in range(3)]
    dims = [(a.shape[1], a.shape[0], first_ifd + k, 0, k) for k, a in enumerate(arrays)]
    view = (img.shape[1] * LEICA_NM, img.shape[0] * LEICA_NM, offset[0] * LEICA_NM, offset[1] * LEICA_NM)
    ifds = [(a, {**_JPEG, **(_RES if k == 0 else {}), "software": "Leica SCN" if k == 0 else None})
            for k, a in enumerate(arrays)]
    return ifds, _leica_image(f"main{first_ifd}", view, dims)


def leica_brightfield(out: Path, source: Path = SOURCE) -> Path:
    """Write ``leica-brightfield.scn`` into the folder ``out`` (module docstring); its path."""
    base, _label, macro = _pixels(source)
    canvas = (2048, 2560)
    macro_arrays, macro_xml = _leica_macro(macro, canvas)
    main_ifds, main_xml = _main_levels(base[:1536, :1024], 2, (512, 512))
    xml = leica_xml("new", canvas, "LEICA-TEST-1", [macro_xml, main_xml])
    return _write_leica(out / "leica-brightfield.scn", xml, [(a, _JPEG) for a in macro_arrays] + main_ifds)


def leica_two_main(out: Path, source: Path = SOURCE) -> Path:
    """Write ``leica-two-main.scn`` into the folder ``out`` (module docstring); its path."""
    base, _label, macro = _pixels(source)
    canvas = (2048, 2560)
    macro_arrays, macro_xml = _leica_macro(macro, canvas)
    first_ifds, first_xml = _main_levels(base[:1024, :1024], 2, (512, 512))
    second_ifds, second_xml = _main_levels(base[1536:2048, 1024:2048], 5, (512, 2048))
    xml = leica_xml("old", canvas, "LEICA-TEST-2", [macro_xml, first_xml, second_xml])
    return _write_leica(out / "leica-two-main.scn", xml,
                        [(a, _JPEG) for a in macro_arrays] + first_ifds + second_ifds)


def leica_fluorescence(out: Path, source: Path = SOURCE) -> Path:
    """Write ``leica-fluorescence.scn`` into the folder ``out`` (module docstring); its path."""
    base, _label, macro = _pixels(source)
    canvas = (2048, 2560)
    macro_arrays, macro_xml = _leica_macro(macro, canvas)
    img = base[:1024, :768]
    ifds: list[tuple[np.ndarray, dict]] = [(a, _JPEG) for a in macro_arrays]
    dims = []
    for r in range(2):
        level = _reduce(img, r)
        for c in range(3):
            dims.append((level.shape[1], level.shape[0], len(ifds), c, r))
            ifds.append((np.ascontiguousarray(level[..., c]),
                         {"compression": "adobe_deflate", "photometric": "minisblack", **(_RES if r == 0 else {})}))
    view = (img.shape[1] * LEICA_NM, img.shape[0] * LEICA_NM, 512 * LEICA_NM, 512 * LEICA_NM)
    xml = leica_xml("new", canvas, "LEICA-FLUO", [macro_xml, _leica_image("fluo", view, dims, "fluorescence")])
    return _write_leica(out / "leica-fluorescence.scn", xml, ifds)


def _abbreviated_jpeg_tiles(img: np.ndarray, quality: int = 90) -> tuple[list[bytes], bytes, tuple[int, int]]:
    """``(tiles, JPEGTables, (h, v) chroma subsampling)`` of ``img`` cut into :data:`LEICA_TILE`
    tiles (edge tiles padded by repeating the edge), each a YCbCr JPEG (``quality``, standard
    Huffman tables) whose tables are moved into one shared JPEGTables stream, as SCN400 writes
    them (TIFF Technical Note #2: a tile is SOI, SOF, SOS, scan, EOI)."""
    from wsitool.ground.bitstream import jpeg_segments

    t = LEICA_TILE
    h, w = img.shape[:2]
    padded = np.pad(img, ((0, -h % t), (0, -w % t), (0, 0)), mode="edge")
    tiles, tables = [], None
    for r in range(0, padded.shape[0], t):
        for c in range(0, padded.shape[1], t):
            full = bytes(imagecodecs.jpeg8_encode(np.ascontiguousarray(padded[r:r + t, c:c + t]), level=quality,
                                                  optimize=False))
            segs = list(jpeg_segments(full))
            shared = b"".join(full[s - 4:e] for m, s, e in segs if m in (0xDB, 0xC4))
            own = b"".join(full[s - 4:e] for m, s, e in segs if m in (0xC0, 0xDA))
            sos_end = segs[-1][2]
            if tables is None:
                tables = shared
                sof = next(full[s:e] for m, s, e in segs if m == 0xC0)
                sampling = (sof[7] >> 4, sof[7] & 15)
            assert shared == tables, "tiles of other tables"
            tiles.append(b"\xff\xd8" + own + full[sos_end:])
    assert tables is not None
    return tiles, b"\xff\xd8" + tables + b"\xff\xd9", sampling


def _write_leica_jpegtables(tif: tifffile.TiffWriter, img: np.ndarray, **tags) -> None:
    """One tiled IFD of ``img`` stored as :func:`_abbreviated_jpeg_tiles` (YCbCr, JPEGTables)."""
    tiles, tables, sampling = _abbreviated_jpeg_tiles(img)
    tif.write(iter(tiles), shape=img.shape, dtype=np.uint8, tile=(LEICA_TILE, LEICA_TILE), compression=7,
              photometric="ycbcr", subsampling=sampling, jpegtables=tables, metadata=None, **tags)


def _offgrid(out: Path, source: Path, name: str, mains: list[tuple[np.ndarray, tuple[int, int]]]) -> Path:
    """An SCN400-like file: the macro, then each main image (array, level-0 offset) of three
    dimensions stored as YCbCr JPEG tiles with shared JPEGTables."""
    _base, _label, macro = _pixels(source)
    canvas = (2048, 2560)
    macro_arrays, macro_xml = _leica_macro(macro, canvas)
    ifd, images, xmls = len(macro_arrays), [], [macro_xml]
    for img, offset in mains:
        ifds, xml = _main_levels(img, ifd, offset)
        images += [a for a, _ in ifds]
        xmls.append(xml)
        ifd += len(ifds)
    xml = leica_xml("new", canvas, f"LEICA-{name.upper()}", xmls)
    path = out / f"leica-{name}.scn"
    with tifffile.TiffWriter(path, bigtiff=True) as tif:
        for k, arr in enumerate(macro_arrays):
            tif.write(arr, tile=(LEICA_TILE, LEICA_TILE), description=xml if k == 0 else None, metadata=None, **_JPEG)
        for k, arr in enumerate(images):
            _write_leica_jpegtables(tif, arr, **(_RES if k == 0 else {}), software="Leica SCN" if k == 0 else None)
    return path


def leica_offgrid(out: Path, source: Path = SOURCE) -> Path:
    """Write ``leica-offgrid.scn`` into the folder ``out`` (module docstring); its path."""
    base, _label, _macro = _pixels(source)
    return _offgrid(out, source, "offgrid", [(base[100:1400, 200:1200], (300, 437))])


def leica_overlap(out: Path, source: Path = SOURCE) -> Path:
    """Write ``leica-overlap.scn`` into the folder ``out`` (module docstring); its path."""
    base, _label, _macro = _pixels(source)
    return _offgrid(out, source, "overlap", [(base[100:1400, 200:1200], (300, 437)),
                                             (base[1500:2101, 1000:1803], (901, 1501))])


def bench_tiles(source: Path = SOURCE) -> tuple[list[bytes], bytes | None, tuple[int, int]]:
    """``(encoded tissue tiles, their JPEGTables, (tile width, height))`` of the SVS's level 0
    (:func:`make_bench_slide.tissue_tiles`)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from make_bench_slide import tissue_tiles

    tiles, page, tables, _pixels, _white = tissue_tiles(source)
    return tiles, tables, (int(page.tilewidth), int(page.tilelength))


def bench_grid(count: int, across: int, down: int, seed: int) -> np.ndarray:
    """``(down, across)`` tile numbers (of ``count`` tiles) drawn with ``seed``: the same draw
    for the Philips file and its Aperio twin (``scripts/bench_vendor.py``)."""
    return np.random.default_rng(seed).integers(0, count, size=(down, across))


def write_copied_tiles(tif: tifffile.TiffWriter, tiles: list[bytes], grid: np.ndarray, shape: tuple[int, int],
                       tile: tuple[int, int], tables: bytes | None, **tags) -> None:
    """One tiled JPEG IFD of ``shape`` (width, height) whose tiles are ``tiles[grid]``, copied."""
    tif.write((tiles[k] for k in grid.ravel()), shape=(shape[1], shape[0], 3), dtype=np.uint8,
              tile=(tile[1], tile[0]), compression=7, photometric="rgb",
              compressionargs={"outcolorspace": "rgb"}, jpegtables=tables, metadata=None, **tags)


def philips_large(out: Path, source: Path = SOURCE, size: tuple[int, int] = (20000, 15000), seed: int = 0) -> Path:
    """Write ``philips-large.tiff`` (module docstring) into ``out``; its path."""
    tiles, tables, (tw, th) = bench_tiles(source)
    xml = philips_xml(3, 'tiff-useBigTIFF=1-useRgb=0-levels=40,20,10-processing=0-q80=-1-sourceFilename="B"',
                      "PHILIPS-BENCH", None, None)
    path = out / "philips-large.tiff"
    with tifffile.TiffWriter(path, bigtiff=True) as tif:
        for k in range(3):
            w, h = -(-size[0] // 2 ** k), -(-size[1] // 2 ** k)
            across, down = -(-w // tw), -(-h // th)
            grid = bench_grid(len(tiles), across, down, seed + k)
            # (a lower level's stored size is whole tiles, as Philips writes it)
            write_copied_tiles(tif, tiles, grid, (w if k == 0 else across * tw, h if k == 0 else down * th),
                               (tw, th), tables, description=xml if k == 0 else None,
                               software="Philips DP v1.0" if k == 0 else None, subfiletype=0 if k == 0 else 1)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--source", type=Path, default=SOURCE)
    parser.add_argument("--large-philips", metavar="WxH", default=None,
                        help="write only philips-large.tiff of this level-0 size (benchmarks)")
    parser.add_argument("--seed", type=int, default=0, help="seed of --large-philips's tile draw")
    args = parser.parse_args(argv)
    if args.large_philips:
        w, _, h = args.large_philips.partition("x")
        args.outdir.mkdir(parents=True, exist_ok=True)
        print(philips_large(args.outdir, args.source, (int(w), int(h)), args.seed))
        return 0
    for path in write_all(args.outdir, args.source):
        print(path)
    return 0


#: Every fixture this script writes, in order.
MAKERS = (philips_multilevel, philips_sparse, ventana_tiff, ventana_bif, ventana_overlap, ventana_areas,
          leica_brightfield, leica_two_main, leica_fluorescence, leica_offgrid, leica_overlap)


def write_all(outdir: Path, source: Path = SOURCE) -> list[Path]:
    """Write every fixture (:data:`MAKERS`) into ``outdir`` (made where missing); their paths."""
    outdir.mkdir(parents=True, exist_ok=True)
    return [make(outdir, source) for make in MAKERS]


if __name__ == "__main__":
    sys.exit(main())
