"""The format-neutral pyramid: what a container format describes and the layers above read (floor 2).

A format (:mod:`wsitool.formats`) turns a file into a :class:`Pyramid`: its
:class:`PyramidLevel` objects (geometry, tile grid, where each tile's bytes are and how
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import pairwise
from typing import Any

import numpy as np

from .ground.naming import attach
from .storage import ByteSource

__all__ = ["TileEncoding", "TileIndex", "Channel", "PyramidLevel", "LevelSizes", "Level", "AssociatedImage",
           "AssociatedImages", "Pyramid", "level_properties", "multichannel_level", "SCALED_JPEG",
           "DEFAULT_CHANNEL_COLORS", "wavelength_color", "channel_color"]

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
            (ITU-T T.81 B.2.1, B.2.4.4; :func:`wsitool.ground.bitstream.ends_with_restart`).
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
        return "imagecodecs" if (self.page is None and self.imagecodec) or self.codec == "mosaic" else "tifffile"


class TileIndex:
    """Where each segment's bytes are.

    Attributes:
        offsets, bytecounts: ``(n,)`` C-contiguous uint64 arrays, byte offset and
            length of each segment in the source; offset or count 0 marks a
            missing tile (transparent).  At least ``planes * tiles_across *
            tiles_down`` entries (the two arrays may differ in length beyond that).
        planes: 1, or the sample count for planar-separate data (one segment per
            sample plane of each tile).

    Args:
        offsets, bytecounts: the two arrays; None for both when ``load`` gives them.
        planes: as above.
        load: a function of no arguments returning ``(offsets, bytecounts)``, called
            on the first use of either (a remote TIFF's tables are fetched when their
            level is first read: :mod:`wsitool.formats.tiff.tables`).  Threads that
            first use it at the same time may each call it (the result is the same);
            an exception it raises goes to the reader and the next use tries again.
    """

    __slots__ = ("_arrays", "_load", "planes")

    def __init__(self, offsets: np.ndarray | None, bytecounts: np.ndarray | None, planes: int = 1, *,
                 load: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None):
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None
        if load is None:
            if offsets is None or bytecounts is None:
                raise TypeError("TileIndex needs offsets and bytecounts, or load")
            self._arrays = (offsets, bytecounts)
        self._load = load
        self.planes = planes

    @property
    def loaded(self) -> bool:
        """False while the arrays wait for their first use (nothing fetched yet)."""
        return self._arrays is not None

    def _tables(self) -> tuple[np.ndarray, np.ndarray]:
        arrays = self._arrays
        if arrays is None:
            assert self._load is not None
            arrays = self._arrays = self._load()
        return arrays

    @property
    def offsets(self) -> np.ndarray:
        """``(n,)`` uint64 byte offsets of the segments (loads the tables on first use)."""
        return self._tables()[0]

    @property
    def bytecounts(self) -> np.ndarray:
        """``(n,)`` uint64 byte counts of the segments (loads the tables on first use)."""
        return self._tables()[1]

    def __repr__(self) -> str:
        state = "loaded" if self.loaded else "not loaded"
        return f"TileIndex(planes={self.planes}, {state})"


#: Display colours ``(r, g, b)`` given, in this order, to the channels of a
#: multi-channel slide that name neither a colour nor a wavelength: blue, green,
#: red, cyan, magenta, yellow, then white for every further channel.  (A single
#: channel without a colour is shown white, i.e. grey.)
DEFAULT_CHANNEL_COLORS = ((0, 0, 255), (0, 255, 0), (255, 0, 0), (0, 255, 255), (255, 0, 255),
                          (255, 255, 0))


@dataclasses.dataclass(frozen=True, eq=False)
class Channel:
    """One channel (stain, fluorophore) of a multi-channel level.

    Attributes:
        name: short name (``"DAPI"``); never empty (``"C0"``, ``"C1"``, ... when
            the file names none).
        description: longer text from the file, or None.
        excitation_nm, emission_nm: wavelengths in nanometres where the file
            gives them (a value of 0 or less counts as not given), else None.
        color: display colour ``(r, g, b)``, 0..255: what a channel value at the
            top of its range adds to the composite.
        color_source: where ``color`` came from: ``"palette"`` (DICOM palette
            LUT), ``"file"`` (a colour stored in the file: QPTIFF, OME-XML),
            ``"wavelength"`` (emission, else excitation, wavelength) or
            ``"default"`` (:data:`DEFAULT_CHANNEL_COLORS`).
        lut: ``(256, 3)`` uint8 lookup table of the composite (value scaled to
            0..255 -> colour), e.g. a decoded DICOM palette; None means the
            linear ramp from black to ``color``.
    """

    name: str
    description: str | None = None
    excitation_nm: float | None = None
    emission_nm: float | None = None
    color: tuple[int, int, int] = (255, 255, 255)
    color_source: str = "default"
    lut: Any = dataclasses.field(default=None, repr=False)

    def table(self) -> np.ndarray:
        """The ``(256, 3)`` uint8 table of this channel's contribution to the composite."""
        if self.lut is not None:
            return self.lut
        ramp = np.arange(256, dtype=np.uint32)
        return ((ramp[:, None] * np.asarray(self.color, np.uint32)[None, :] + 127) // 255).astype(np.uint8)


class LevelSizes:
    """``dimensions`` and ``tile_size`` of a level, from its ``width``, ``height``,
    ``tile_width`` and ``tile_height`` (shared by the internal :class:`PyramidLevel` and the
    public read-only view, :class:`wsitool.Level`)."""

    width: int
    height: int
    tile_width: int
    tile_height: int

    @property
    def dimensions(self) -> tuple[int, int]:
        """``(width, height)`` in pixels of this level."""
        return (self.width, self.height)

    @property
    def tile_size(self) -> tuple[int, int]:
        """``(tile_width, tile_height)`` in pixels."""
        return (self.tile_width, self.tile_height)


class PyramidLevel(LevelSizes):
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
        path: the file named in its tile errors (:class:`~wsitool.errors.TileDecodeError`):
            ``""`` as a format makes it, then the slide as the opener names it
            (:func:`wsitool.opening.open_location`), or the file a format names itself (a DICOM
            level: its instance file).
        source: the :class:`~wsitool.storage.ByteSource` the tiles are read from.
        tiles: the :class:`TileIndex`; encoding: the :class:`TileEncoding`.
        channels: the :class:`Channel` s of a multi-channel (fluorescence) level,
            one per sample, in the slide's order; ``()`` for every other level
            (RGB, a plain grey image), which reads exactly as before.
        planes: for a multi-channel level, one single-sample :class:`PyramidLevel` per
            channel (same geometry; each its own :class:`TileIndex`, encoding and
            byte source: a DICOM optical path, a QPTIFF page); reads decode
            each plane and stack them (``raw``) or compose them (``rgb`` /
            ``rgba``, :mod:`wsitool.read.channels`).  None for other levels.
            ``tiles``, ``encoding`` and ``source`` of a multi-channel level
            are its first plane's (for what only describes the level).
        plane: in a plane of a multi-channel level, its channel index (the
            decoded-tile cache keys it apart from the other planes); else None.
        mosaic: a :class:`wsitool.mosaic.Mosaic` (placed images) whose virtual tiles this
            level reads (:func:`wsitool.mosaic.mosaic_level`), else None.
    """

    def __init__(self, *, index: int, width: int, height: int, downsample: float,
                 tile_width: int, tile_height: int, tiled: bool, samples: int, dtype: np.dtype,
                 encoding: TileEncoding, tiles: TileIndex, source: ByteSource,
                 channels: tuple = (), planes: tuple | None = None, plane: int | None = None):
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
        self.path = ""
        self.channels = tuple(channels)
        self.planes = None if planes is None else tuple(planes)
        self.plane = plane
        self.mosaic: Any = None

    # the encoding's facts, read through (one place holds them)
    compression = property(lambda self: self.encoding.compression)
    photometric = property(lambda self: self.encoding.photometric)
    decoder = property(lambda self: self.encoding.decoder)
    compression_problem = property(lambda self: self.encoding.compression_problem)

    @property
    def cache_key(self) -> int | tuple[int, int]:
        """The level's key in the decoded-tile cache: its index, or ``(index, plane)`` for a plane."""
        return self.index if self.plane is None else (self.index, self.plane)

    def select(self, picked: Sequence[int]) -> PyramidLevel:
        """This multi-channel level restricted to channels ``picked`` (indices, in that
        order; checked by the caller): a new :class:`PyramidLevel` sharing the planes."""
        assert self.planes is not None
        planes = tuple(self.planes[k] for k in picked)
        level = PyramidLevel(index=self.index, width=self.width, height=self.height,
                             downsample=self.downsample, tile_width=self.tile_width,
                             tile_height=self.tile_height, tiled=self.tiled, samples=len(planes),
                             dtype=self.dtype, encoding=self.encoding, tiles=planes[0].tiles,
                             source=planes[0].source, channels=tuple(self.channels[k] for k in picked),
                             planes=planes)
        level.path = self.path
        return level

    def __repr__(self) -> str:
        return (
            f"PyramidLevel({self.index}, {self.width}x{self.height}, downsample={self.downsample:.4g}, "
            f"tile={self.tile_width}x{self.tile_height}, {self.compression}/{self.photometric}, "
            f"{self.samples}x{self.dtype})"
        )


#: ``(wavelength nm, (r, g, b))`` anchors of :func:`wavelength_color`, linearly
#: interpolated between them (violet, blue, cyan, green, yellow, red; red above).
_SPECTRUM = ((380.0, (130, 0, 200)), (440.0, (0, 0, 255)), (490.0, (0, 255, 255)),
             (510.0, (0, 255, 0)), (580.0, (255, 255, 0)), (645.0, (255, 0, 0)))


@dataclasses.dataclass(frozen=True)
class Level(LevelSizes):
    """A read-only description of one pyramid level (what :attr:`wsitool.Slide.levels` holds:
    a view of a :class:`PyramidLevel` without its byte source, tile index or encoding).

    Attributes:
        index: level number, 0 = full resolution.
        width, height: size in pixels of this level.
        downsample: ``(W0 / width + H0 / height) / 2`` relative to level 0 (as OpenSlide).
        tile_width, tile_height: tile size in pixels; for a stripped level the
            image width and the rows per strip.
        tiles_across, tiles_down: the tile grid (columns, rows).
        tiled: False for a stripped level.
        samples: samples per pixel (what a ``mode="raw"`` read gives).
        dtype: numpy dtype of one sample.
        compression: compression name, e.g. ``"JPEG"``, ``"APERIO_JP2000_RGB"``.
        photometric: photometric name, e.g. ``"RGB"``, ``"YCBCR"``, ``"MINISBLACK"``.
        decoder: ``"nvimagecodec"``, ``"pillow"``, ``"tifffile"`` or ``"imagecodecs"``.
        compression_problem: None, or why no decoder reads this level's tiles.
        channels: the :class:`~wsitool.Channel` s of a multi-channel level, else ``()``.
        mpp: ``(mpp_x, mpp_y)`` micrometres per pixel of this level (level 0's times
            ``W0 / width`` and ``H0 / height``), or None where the slide gives none.
    """

    index: int
    width: int
    height: int
    downsample: float
    tile_width: int
    tile_height: int
    tiles_across: int
    tiles_down: int
    tiled: bool
    samples: int
    dtype: np.dtype
    compression: str
    photometric: str
    decoder: str
    compression_problem: str | None
    channels: tuple[Channel, ...]
    mpp: tuple[float, float] | None

    @classmethod
    def of(cls, lv: PyramidLevel, level0: PyramidLevel, mpp: tuple[float, float] | None) -> Level:
        """The view of pyramid level ``lv`` (``level0``: the pyramid's first, for the mpp)."""
        scaled = None if mpp is None else (mpp[0] * level0.width / lv.width, mpp[1] * level0.height / lv.height)
        return cls(index=lv.index, width=lv.width, height=lv.height, downsample=lv.downsample,
                   tile_width=lv.tile_width, tile_height=lv.tile_height, tiles_across=lv.tiles_across,
                   tiles_down=lv.tiles_down, tiled=lv.tiled, samples=lv.samples, dtype=np.dtype(lv.dtype),
                   compression=lv.compression, photometric=lv.photometric, decoder=lv.decoder,
                   compression_problem=lv.compression_problem, channels=tuple(lv.channels), mpp=scaled)


def wavelength_color(nm: float) -> tuple[int, int, int]:
    """A display colour ``(r, g, b)`` for light of ``nm`` nanometres: linear between the
    anchors of :data:`_SPECTRUM` (440 nm blue, 510 nm green, 580 nm yellow, 645 nm red),
    the end colours beyond them (far red and infrared stay red)."""
    if nm <= _SPECTRUM[0][0]:
        return _SPECTRUM[0][1]
    for (w0, c0), (w1, c1) in pairwise(_SPECTRUM):
        if nm <= w1:
            t = (nm - w0) / (w1 - w0)
            r, g, b = (int(round(lo + (hi - lo) * t)) for lo, hi in zip(c0, c1, strict=True))
            return r, g, b
    return _SPECTRUM[-1][1]


def channel_color(index: int, count: int, emission_nm: float | None = None,
                  excitation_nm: float | None = None) -> tuple[tuple[int, int, int], str]:
    """``(colour, source)`` of channel ``index`` of ``count`` that has no colour of its own:
    from its emission wavelength, else its excitation wavelength
    (:func:`wavelength_color`; source ``"wavelength"``), else white for a single channel
    or :data:`DEFAULT_CHANNEL_COLORS` in order, white past its end (``"default"``)."""
    for nm in (emission_nm, excitation_nm):
        if nm is not None and nm > 0:
            return wavelength_color(nm), "wavelength"
    if count == 1 or index >= len(DEFAULT_CHANNEL_COLORS):
        return (255, 255, 255), "default"
    return DEFAULT_CHANNEL_COLORS[index], "default"


def multichannel_level(planes: Sequence[PyramidLevel], channels: Sequence[Channel]) -> PyramidLevel:
    """One multi-channel :class:`PyramidLevel` of single-sample ``planes`` (one per channel, same
    index, size, tile size and dtype; their ``plane`` is set here), described by ``channels``.

    Raises:
        ValueError: no planes, a plane count other than the channel count, planes of
            several sizes, tile sizes or dtypes, or a plane of more than one sample
            (a format bug, not a file problem: formats check first).
    """
    if not planes or len(planes) != len(channels):
        raise ValueError(f"{len(planes)} plane(s) for {len(channels)} channel(s)")
    first = planes[0]
    for p in planes:
        if (p.width, p.height, p.tile_width, p.tile_height, p.dtype, p.samples) != (
                first.width, first.height, first.tile_width, first.tile_height, first.dtype, 1):
            raise ValueError(f"plane {p!r} differs from {first!r}")
    for k, p in enumerate(planes):
        p.plane = k
    level = PyramidLevel(index=first.index, width=first.width, height=first.height,
                         downsample=first.downsample, tile_width=first.tile_width,
                         tile_height=first.tile_height, tiled=first.tiled, samples=len(planes),
                         dtype=first.dtype, encoding=dataclasses.replace(first.encoding, rgb_problem=None),
                         tiles=first.tiles, source=first.source, channels=tuple(channels), planes=tuple(planes))
    level.path = first.path
    return level


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


class AssociatedImages(Mapping[str, np.ndarray]):
    """Lazy read-only mapping of a pyramid's associated images: name -> ``(height, width, 3)``
    uint8 RGB array, each decoded on first access by ``decode(image)`` and kept.

    The slide's ``decode`` holds what decoding needs (the byte source and lock), not the
    slide: a reference back would make the slide a reference cycle, whose levels and tile
    tables would then wait for a cyclic garbage collection after ``close`` (about 0.7 KiB per
    open and close of a small slide).  Reading an entry raises ``KeyError`` for an unknown
    name, else what ``decode`` raises, with ``subject`` (the slide as messages name it)
    attached (:func:`wsitool.ground.naming.attach`).
    """

    def __init__(self, images: Mapping[str, AssociatedImage], decode: Callable[[AssociatedImage], np.ndarray],
                 subject: str | None = None):
        self._images = images
        self._decode = decode
        self._subject = subject
        self._cache: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._images:
            raise KeyError(name)
        if name not in self._cache:
            try:
                self._cache[name] = self._decode(self._images[name])
            except BaseException as exc:
                if self._subject is not None:
                    attach(exc, self._subject)
                raise
        return self._cache[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._images)

    def __len__(self) -> int:
        return len(self._images)

    def __repr__(self) -> str:
        return f"<associated images {list(self._images)}>"


@dataclasses.dataclass(eq=False)
class Pyramid:
    """What a format makes of a file.

    Attributes:
        vendor: ``"aperio"``, ``"generic-tiff"``, ``"ome-tiff"``, ...
        levels: the levels, largest first.
        associated: name -> :class:`AssociatedImage`.
        properties: metadata (OpenSlide's key names, see :attr:`wsitool.Slide.properties`);
            read-only for its users (a format may compute some values on first access,
            :class:`wsitool.formats.deferred.DeferredProperties`).
        problems: what the parser reported while reading the structure.
        release: releases the format's own resources (e.g. a tifffile handle).
        identifying: names of the properties that identify a patient, person,
            institution or specimen (DICOM PS3.15 E.1-1); ``wsitool info``
            hides them unless asked (``--show-phi``).
        color_profile: the pyramid's embedded ICC profile (raw bytes; TIFF: tag
            34675 ICCProfile of level 0's IFD, as OpenSlide reads it), or None.
    """

    vendor: str
    levels: tuple[PyramidLevel, ...]
    associated: dict[str, AssociatedImage]
    properties: Mapping[str, str]
    problems: list[str] = dataclasses.field(default_factory=list)
    release: Callable[[], None] | None = None
    color_profile: bytes | None = None
    identifying: frozenset[str] = frozenset()

    def close(self) -> None:
        """Call :attr:`release` once (later calls do nothing); the caller serialises concurrent calls."""
        release, self.release = self.release, None
        if release is not None:
            release()


def level_properties(levels: Sequence[PyramidLevel]) -> dict[str, str]:
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
