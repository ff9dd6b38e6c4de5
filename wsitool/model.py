"""The format-neutral pyramid: what a container format describes and the layers above read (floor 2).

A format (:mod:`wsitool.formats`) turns a file into a :class:`Pyramid`: its
:class:`Level` objects (geometry, tile grid, where each tile's bytes are and how
they are encoded) and its associated images.  It decodes nothing; the codec
layer (:mod:`wsitool.codec`) decodes what a :class:`TileEncoding` describes,
the region layer (:mod:`wsitool.read`) plans and fills reads, the facade
(:mod:`wsitool.slide`) wires them together.

Coordinates: sizes are in pixels of the level they belong to; tiles are
addressed by ``(col, row)`` in the level's grid, and segment ``index = plane *
tiles_across * tiles_down + row * tiles_across + col``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from .storage import ByteSource

__all__ = ["TileEncoding", "TileIndex", "Level", "AssociatedImage", "Pyramid", "level_properties",
           "SCALED_JPEG"]

#: :attr:`TileEncoding.codec` of levels decoded from JPEG streams at a reduced
#: scale (libjpeg DCT scaling, see :attr:`TileEncoding.scale_log2`).
SCALED_JPEG = "scaled-jpeg"


@dataclasses.dataclass(frozen=True, eq=False)
class TileEncoding:
    """How every tile (segment) of one image is encoded.

    Attributes:
        compression, compression_code: TIFF compression name and code (TIFF 6.0
            section 8 and the TIFF registry, e.g. ``"JPEG"`` 7, Aperio 33003 /
            33005, 34712 JPEG 2000); other containers map to these codes.
        photometric, photometric_code: TIFF PhotometricInterpretation name and code.
        bits: BitsPerSample.
        stream: which header check guards the decoder: ``"jpeg"``, ``"j2k"``,
            ``"webp"``, ``"lzw"`` or None.
        codec: ``"nv"`` (nvImageCodec decodes 8-bit 3-sample JPEG / JPEG 2000
            tiles into the caller's buffer), ``"generic"`` (tifffile/imagecodecs)
            or :data:`SCALED_JPEG` (``"scaled-jpeg"``: each segment is a JPEG
            stream, built as for the level it is shared with, decoded at scale
            ``1 / 2**scale_log2`` by libjpeg's DCT scaling, see
            :mod:`wsitool.codec.scaled`; the levels OpenSlide makes below a
            Hamamatsu level, :mod:`wsitool.formats.tiff.ndpi_scaled`).  Only
            ``"nv"`` levels take the compiled JPEG loop and the GPU path.
        jpeg_prefix: bytes that replace each JPEG tile's SOI to make it a
            complete stream: SOI, an Adobe APP14 "RGB" marker where the samples
            are RGB-coded, and the shared JPEGTables (TIFF Technical Note #2);
            empty when nothing is merged.  With ``jpeg_scan_segments`` the prefix
            is instead a complete header (SOI up to and including SOS) that goes
            in front of each segment whole.
        jpeg_scan_segments: each JPEG segment is bare entropy-coded scan data
            with no marker of its own but the one that ends it: Hamamatsu NDPI
            stores a level as one JPEG stream with restart markers, and tifffile
            makes one segment per restart interval from the NDPI McuStarts tag
            (65426) and a header for it (``TiffPage.jpegheader``: the stream's
            header with the SOF's size set to one interval).  A segment ends with
            its RSTn marker (the last one with EOI); the complete stream is
            ``jpeg_prefix`` + the segment with a final RSTn replaced by EOI
            (ITU-T T.81 B.2.1, B.2.4.4; :func:`wsitool.bitstream.ends_with_restart`).
        ycbcr_after_decode: the decoded samples are YCbCr to convert to RGB
            (Aperio 33003 stores YCbCr J2K without the JPEG 2000 colour transform).
        colormap: ``(3, 2**bits)`` ColorMap of palette images, else None.
        extrasamples: ExtraSamples codes (1, 2: alpha).
        rgb_problem: why ``rgb`` / ``rgba`` reads are refused, or None.
        compression_problem: None, or why no decoder reads these tiles
            (``"unsupported compression 52479"``); reads then raise
            :class:`~wsitool.errors.UnsupportedFormatError`.
        page: the format's handle for the generic path (a ``tifffile.TiffPage``
            whose ``decode`` the codec layer calls), or None.
        imagecodec: for generic segments without a ``page`` (containers other
            than TIFF, e.g. DICOM frames): which decoder the codec layer calls on
            each segment's bytes, see :mod:`wsitool.codec.frames`: ``"raw"``
            (uncompressed little-endian samples, pixel-interleaved),
            ``"raw-planar"`` (colour-by-plane), ``"jpeg8"``, ``"jpegls"``,
            ``"jpeg2k"``, ``"rle"`` (DICOM RLE, PS3.5 G), ``"jpegxl"``; None when
            ``page`` decodes.
        scale_log2: with ``codec == "scaled-jpeg"``, ``k`` of the decoding scale
            ``1 / 2**k`` (1, 2 or 3: libjpeg scales by 1/2, 1/4, 1/8): a
            segment's stream declares a frame of ``(tile_width << k,
            tile_height << k)`` pixels and decodes to one tile of the level; 0
            otherwise.
    """

    compression: str
    compression_code: int
    photometric: str
    photometric_code: int
    bits: int
    stream: str | None
    codec: str
    jpeg_prefix: bytes = b""
    jpeg_scan_segments: bool = False
    ycbcr_after_decode: bool = False
    colormap: Any = None
    extrasamples: tuple = ()
    rgb_problem: str | None = None
    compression_problem: str | None = None
    page: Any = None
    imagecodec: str | None = None
    scale_log2: int = 0

    @property
    def decoder(self) -> str:
        """``"nvimagecodec"``, ``"pillow"`` (scaled JPEG), ``"tifffile"`` or ``"imagecodecs"``
        (no page): who decodes the tiles."""
        if self.codec == "nv":
            return "nvimagecodec"
        if self.codec == SCALED_JPEG:
            return "pillow"
        return "imagecodecs" if self.page is None and self.imagecodec else "tifffile"


@dataclasses.dataclass(frozen=True, eq=False)
class TileIndex:
    """Where each segment's bytes are.

    Attributes:
        offsets, bytecounts: ``(n,)`` C-contiguous uint64 arrays, byte offset and
            length of each segment in the source; offset or count 0 marks a
            missing tile (transparent).  At least ``planes * tiles_across *
            tiles_down`` entries (the two arrays may differ in length beyond that).
        planes: 1, or the sample count for planar-separate data (one segment per
            sample plane of each tile).
    """

    offsets: np.ndarray
    bytecounts: np.ndarray
    planes: int = 1


class Level:
    """One pyramid level: geometry, tile grid, encoding and byte source.

    Attributes:
        index: level number, 0 = full resolution.
        width, height: level size in pixels of this level.
        downsample: ``(W0 / width + H0 / height) / 2`` relative to level 0 (as
            OpenSlide computes it).
        tile_width, tile_height: tile size in pixels; for a stripped level the
            image width and RowsPerStrip.
        tiles_across, tiles_down: size of the tile grid (columns, rows).
        tiled: False for a stripped level (read strip by strip).
        compression: compression name, e.g. ``"JPEG"``, ``"APERIO_JP2000_RGB"``.
        photometric: photometric name, e.g. ``"RGB"``, ``"YCBCR"``, ``"MINISBLACK"``.
        samples: samples per pixel.
        dtype: numpy dtype of one sample (native byte order).
        decoder: ``"nvimagecodec"``, ``"pillow"``, ``"tifffile"`` or ``"imagecodecs"``,
            who decodes the tiles (:attr:`TileEncoding.decoder`).
        compression_problem: None, or why no decoder reads this level's tiles
            (``"unsupported compression 52479"``); reads then raise
            :class:`~wsitool.errors.UnsupportedFormatError`.
        path: the slide's path (named in messages).
        source: the :class:`~wsitool.storage.ByteSource` the tiles are read from.
        tiles: the :class:`TileIndex`; encoding: the :class:`TileEncoding`.
    """

    def __init__(self, *, index: int, width: int, height: int, downsample: float,
                 tile_width: int, tile_height: int, tiled: bool, samples: int, dtype: np.dtype,
                 encoding: TileEncoding, tiles: TileIndex, source: ByteSource, path: str):
        self.index = index
        self.width = width
        self.height = height
        self.downsample = downsample
        self.tile_width = tile_width
        self.tile_height = tile_height
        self.tiles_across = -(-width // tile_width)
        self.tiles_down = -(-height // tile_height)
        self.tiled = tiled
        self.samples = samples
        self.dtype = dtype
        self.encoding = encoding
        self.tiles = tiles
        self.source = source
        self.path = path

    # the encoding's facts, read through (one place holds them)
    compression = property(lambda self: self.encoding.compression)
    photometric = property(lambda self: self.encoding.photometric)
    decoder = property(lambda self: self.encoding.decoder)
    compression_problem = property(lambda self: self.encoding.compression_problem)

    @property
    def dimensions(self) -> tuple[int, int]:
        """``(width, height)`` in pixels of this level."""
        return (self.width, self.height)

    @property
    def tile_size(self) -> tuple[int, int]:
        """``(tile_width, tile_height)`` in pixels."""
        return (self.tile_width, self.tile_height)

    def __repr__(self) -> str:
        return (
            f"Level({self.index}, {self.width}x{self.height}, downsample={self.downsample:.4g}, "
            f"tile={self.tile_width}x{self.tile_height}, {self.compression}/{self.photometric}, "
            f"{self.samples}x{self.dtype})"
        )


@dataclasses.dataclass(frozen=True, eq=False)
class AssociatedImage:
    """An image beside the pyramid (label, macro, thumbnail), described, not decoded.

    Attributes:
        name: ``"label"``, ``"macro"``, ``"thumbnail"`` or ``"associated-N"``.
        width, height, samples: size in pixels and samples per pixel.
        itemsize: bytes per sample (for the limits check before decoding).
        planar: planar-separate samples.
        encoding: how its strips or tiles are encoded.
        offsets, bytecounts: its segments in the source (checked before decoding).
        max_segment: ``(width, height)`` a segment's code stream may declare at most.
        source: the byte source the segments are read from when it is not the
            slide's own (a DICOM associated image is its own file), else None.
        tile_size: ``(width, height)`` of the tiles when the segments are the
            tiles of a grid in row-major order that the codec layer assembles
            (encodings without a ``page``), else None.
        color_profile: the image's own embedded ICC profile (raw bytes, e.g.
            TIFF tag 34675 ICCProfile of its IFD), or None.
    """

    name: str
    width: int
    height: int
    samples: int
    itemsize: int
    planar: bool
    encoding: TileEncoding
    offsets: tuple[int, ...]
    bytecounts: tuple[int, ...]
    max_segment: tuple[int, int]
    source: ByteSource | None = None
    tile_size: tuple[int, int] | None = None
    color_profile: bytes | None = None


@dataclasses.dataclass(eq=False)
class Pyramid:
    """What a format makes of a file.

    Attributes:
        vendor: ``"aperio"``, ``"generic-tiff"``, ``"ome-tiff"``, ...
        levels: the levels, largest first.
        associated: name -> :class:`AssociatedImage`.
        properties: metadata (OpenSlide's key names, see :attr:`wsitool.Slide.properties`).
        problems: what the parser reported while reading the structure.
        release: releases the format's own resources (e.g. a tifffile handle).
        identifying: names of the properties that identify a patient, person,
            institution or specimen (DICOM PS3.15 E.1-1); ``wsitool info``
            hides them unless asked (``--show-phi``).
        color_profile: the pyramid's embedded ICC profile (raw bytes; TIFF: tag
            34675 ICCProfile of level 0's IFD, as OpenSlide reads it), or None.
    """

    vendor: str
    levels: tuple[Level, ...]
    associated: dict[str, AssociatedImage]
    properties: dict[str, str]
    problems: list[str] = dataclasses.field(default_factory=list)
    release: Callable[[], None] | None = None
    color_profile: bytes | None = None
    identifying: frozenset[str] = frozenset()


def level_properties(levels) -> dict[str, str]:
    """The format-neutral properties of a pyramid's levels, with OpenSlide's key names:
    ``openslide.level-count`` and ``openslide.level[N].width|height|downsample|tile-width|
    tile-height`` (pixels of level N; the downsample relative to level 0)."""
    props = {"openslide.level-count": str(len(levels))}
    for lv in levels:
        key = f"openslide.level[{lv.index}]"
        props[f"{key}.width"] = str(lv.width)
        props[f"{key}.height"] = str(lv.height)
        props[f"{key}.downsample"] = repr(lv.downsample)
        props[f"{key}.tile-width"] = str(lv.tile_width)
        props[f"{key}.tile-height"] = str(lv.tile_height)
    return props
