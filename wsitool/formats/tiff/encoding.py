"""How the tiles of a TIFF image are encoded, and the PyramidLevel / AssociatedImage descriptions of its IFDs (floor 3).

Codec policy (what the codec layer is told): JPEG (compression 7) with 3
samples of 8 bits, photometric RGB or YCbCr, and JPEG 2000 (Aperio 33003,
33005; 34712) with 3 samples of 8 bits go to nvImageCodec; everything else
(none, LZW, deflate, zstd, WebP, gray / CMYK / 2-sample JPEG, predictors,
big-endian, planar-separate) to tifffile's ``TiffPage.decode`` over imagecodecs.

JPEG facts: abbreviated JPEG tiles share the DQT/DHT segments stored once in
the JPEGTables tag (TIFF Technical Note #2, "JPEGTables"); the tile stream and
the tables are merged by inserting the tables after the tile's SOI marker.
Aperio writes RGB JPEG tiles (photometric RGB, no colour transform) with
component ids 0, 1, 2 and neither a JFIF nor an Adobe marker, so libjpeg guesses
YCbCr; an Adobe APP14 segment with transform flag 0 (Adobe Technical Note #5116)
tells the decoder the components are RGB.

Hamamatsu NDPI stores each level as one JPEG stream with restart markers
(OpenSlide's Hamamatsu format notes); tifffile turns its McuStarts tag (65426)
into one segment per restart interval and builds the header those segments
share (``TiffPage.jpegheader``, only set for such pages): the level's tiles are
then bare scan data, see :attr:`wsitool.model.TileEncoding.jpeg_scan_segments`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tifffile
from tifffile import COMPRESSION, PHOTOMETRIC, PLANARCONFIG

from ...errors import CorruptFileError, UnsupportedFormatError
from ...ground.bitstream import ADOBE_RGB_MARKER, SOI
from ...ground.color import icc_bytes
from ...model import AssociatedImage, PyramidLevel, TileEncoding
from ...storage import ByteSource
from .tables import EAGER, DeferredTables
from .tags import enum_name

__all__ = ["level_from_page", "associated_from_page", "rgb_problem", "JPEG", "LZW", "J2K_COMPRESSIONS"]

JPEG = COMPRESSION.JPEG  # 7
LZW = COMPRESSION.LZW  # 5
#: Aperio 33003 (YCbCr) and 33005 (RGB), and 34712 (JPEG 2000)
J2K_COMPRESSIONS = frozenset({COMPRESSION.APERIO_JP2000_YCBC, COMPRESSION.APERIO_JP2000_RGB, COMPRESSION.JPEG2000})
#: 50001, and 34927, the older code of WebP
WEBP_COMPRESSIONS = frozenset({COMPRESSION.WEBP_DEPRECATED, COMPRESSION.WEBP})


def _extrasamples(page: tifffile.TiffPage) -> tuple[int, ...]:
    return tuple(np.atleast_1d(page.extrasamples).tolist()) if page.extrasamples is not None else ()


def page_encoding(page: tifffile.TiffPage, samples: int, planes: int, dtype: np.dtype | None) -> TileEncoding:
    """The :class:`~wsitool.model.TileEncoding` of an IFD's segments (codec policy of the module docstring)."""
    comp = int(page.compression)
    photometric = int(page.photometric)
    eight_bit_rgb = samples == 3 and planes == 1 and dtype == np.uint8
    stream = ("jpeg" if comp == JPEG
              else "j2k" if comp in J2K_COMPRESSIONS
              else "webp" if comp in WEBP_COMPRESSIONS
              else "lzw" if comp == LZW
              else None)
    if eight_bit_rgb and ((comp == JPEG and photometric in (PHOTOMETRIC.RGB, PHOTOMETRIC.YCBCR))
                          or comp in J2K_COMPRESSIONS):
        codec = "nv"
    else:
        codec = "generic"
    jpeg_prefix = b""
    scan_segments = comp == JPEG and getattr(page, "jpegheader", None) is not None
    if scan_segments:
        # NDPI: tifffile cut the level's one JPEG scan into restart intervals and
        # built their header (SOI .. SOS, the SOF sized to one interval)
        jpeg_prefix = bytes(page.jpegheader or b"")
    elif comp == JPEG:
        tables = page.jpegtables
        prefix = SOI
        if photometric == PHOTOMETRIC.RGB and codec == "nv":
            prefix += ADOBE_RGB_MARKER
        if tables and len(tables) > 4:
            prefix += bytes(tables[2:-2])
        jpeg_prefix = prefix if prefix != SOI else b""
    return TileEncoding(
        compression=enum_name(page.compression), compression_code=comp,
        photometric=enum_name(page.photometric), photometric_code=photometric,
        bits=int(page.bitspersample), stream=stream, codec=codec, jpeg_prefix=jpeg_prefix,
        jpeg_scan_segments=scan_segments,
        # Aperio 33003 stores YCbCr J2K without the JPEG 2000 colour transform
        ycbcr_after_decode=comp == COMPRESSION.APERIO_JP2000_YCBC,
        colormap=page.colormap, extrasamples=_extrasamples(page),
        rgb_problem=rgb_problem(page),
        compression_problem=(None if codec == "nv" or comp in tifffile.TIFF.DECOMPRESSORS
                             else f"unsupported compression {enum_name(page.compression)}"),
        page=page,
    )


def level_from_page(source: ByteSource, index: int, page: tifffile.TiffPage,
                    base_size: tuple[int, int], tables: DeferredTables = EAGER) -> PyramidLevel:
    """The :class:`~wsitool.model.PyramidLevel` of one IFD.

    Args:
        source: the slide's byte source.
        index: the level number; page: the IFD.
        base_size: ``(width, height)`` of level 0 in pixels.
        tables: the tile tables tifffile left unread (:mod:`.tables`): the level's
            :class:`~wsitool.model.TileIndex` reads them on first use.

    Raises:
        CorruptFileError: zero tile size, or fewer tile offsets than the grid has tiles.
        UnsupportedFormatError: an unsupported sample format or a volumetric image.
    """
    width, height = int(page.imagewidth), int(page.imagelength)
    w0, h0 = base_size
    tiled = bool(page.is_tiled)
    if tiled:
        tile_width, tile_height = int(page.tilewidth), int(page.tilelength)
    else:
        rps = int(page.rowsperstrip or height)
        tile_width, tile_height = width, max(1, min(rps, height))
    if tile_width <= 0 or tile_height <= 0:
        raise CorruptFileError(f"level {index} has a zero tile size")
    samples = int(page.samplesperpixel)
    dtype = np.dtype(page.dtype).newbyteorder("=") if page.dtype is not None else None
    if dtype is None:
        raise UnsupportedFormatError(
            f"level {index}: unsupported sample format "
            f"({page.bitspersample} bits, SampleFormat {page.sampleformat})"
        )
    if page.imagedepth > 1:
        raise UnsupportedFormatError(f"level {index}: volumetric TIFF (ImageDepth > 1)")
    planes = samples if (int(page.planarconfig) == PLANARCONFIG.SEPARATE and samples > 1) else 1
    # (a deferred table's length is its tag's count: tifffile's parse read zeros in its place)
    n_offsets, n_counts = len(page.dataoffsets), len(page.databytecounts)
    expected = planes * -(-width // tile_width) * -(-height // tile_height)
    if n_offsets < expected or n_counts < expected:
        raise CorruptFileError(
            f"level {index}: {n_offsets} tile offsets for a grid of {expected} tiles"
        )
    return PyramidLevel(index=index, width=width, height=height,
                 downsample=(w0 / width + h0 / height) / 2.0,
                 tile_width=tile_width, tile_height=tile_height, tiled=tiled, samples=samples,
                 dtype=dtype, encoding=page_encoding(page, samples, planes, dtype),
                 tiles=tables.index(page, planes), source=source)  # (its path: named by the opener)


def associated_from_page(name: str, page: tifffile.TiffPage, tables: DeferredTables = EAGER) -> AssociatedImage:
    """The :class:`~wsitool.model.AssociatedImage` of a stripped or tiled IFD (label, macro, thumbnail);
    a tiled one's tables that tifffile left unread (``tables``) are read now, and given to the
    page too (tifffile decodes the image from them: :func:`wsitool.codec.associated.decode_associated`)."""
    if tables.table(page.tags.get(324)) is not None or tables.table(page.tags.get(325)) is not None:
        page.dataoffsets = tuple(int(v) for v in _table(page, 324, page.dataoffsets, tables))
        page.databytecounts = tuple(int(v) for v in _table(page, 325, page.databytecounts, tables))
    samples = int(page.samplesperpixel)
    itemsize = np.dtype(page.dtype).itemsize if page.dtype is not None else 8
    planar = int(page.planarconfig) == PLANARCONFIG.SEPARATE and samples > 1
    dtype = np.dtype(page.dtype) if page.dtype is not None else None
    return AssociatedImage(
        name=name, width=int(page.imagewidth), height=int(page.imagelength), samples=samples,
        itemsize=itemsize, planar=planar,
        encoding=page_encoding(page, samples, samples if planar else 1, dtype),
        offsets=tuple(int(v) for v in page.dataoffsets),
        bytecounts=tuple(int(v) for v in page.databytecounts),
        max_segment=(max(int(page.imagewidth), int(page.tilewidth or 0)),
                     max(int(page.imagelength), int(page.tilelength or 0))),
        color_profile=icc_profile(page),
    )


def _table(page: tifffile.TiffPage, code: int, parsed: Any, tables: DeferredTables) -> Any:
    """The values of a page's tile table ``code`` (324, 325): read now where it was deferred."""
    tag = page.tags.get(code)
    return tables.values(tag) if tables.table(tag) is not None else parsed


ICC_PROFILE_TAG = 34675  # ICCProfile / InterColorProfile (Adobe TIFF Technical Note, ICC.1 annex B.4)


def icc_profile(page: tifffile.TiffPage) -> bytes | None:
    """The ICC profile embedded in ``page`` (tag 34675, UNDEFINED bytes), or None.

    A tag that cannot hold a profile (:func:`wsitool.ground.color.icc_bytes`) is
    ignored (None), as a malformed profile cannot be used for conversion.
    """
    tag = page.tags.get(ICC_PROFILE_TAG)
    return None if tag is None else icc_bytes(tag.value)


_INKSET_TAG = 332
_CMYK_INKSET = 1  # TIFF 6.0 section 16, InkSet: 1 = CMYK, 2 = not CMYK


def rgb_problem(page: tifffile.TiffPage) -> str | None:
    """Why the samples of ``page`` cannot be shown as RGB, or None if they can.

    wsitool converts to 8-bit RGB (see :func:`wsitool.ground.color.to_rgb8`):
    MinIsWhite / MinIsBlack (1 colour sample), RGB (3), Palette, CMYK
    (Separated with InkSet 1 and 4 colour samples, TIFF 6.0 section 16), and
    YCbCr when the codec itself returns RGB (JPEG, JPEG 2000).  Other
    photometric interpretations (CIELab, LogLuv, CFA, Separated inks that are
    not CMYK, ...) are readable only with ``mode="raw"``.
    """
    photometric = int(page.photometric)
    samples = int(page.samplesperpixel)
    extras = len(np.atleast_1d(page.extrasamples)) if page.extrasamples is not None else 0
    colour = samples - extras
    if photometric in (PHOTOMETRIC.MINISWHITE, PHOTOMETRIC.MINISBLACK, PHOTOMETRIC.PALETTE):
        return None if colour >= 1 else "no colour sample"
    if photometric == PHOTOMETRIC.RGB:
        return None if colour >= 3 else f"photometric RGB with {colour} colour sample(s)"
    if photometric == PHOTOMETRIC.SEPARATED:
        inkset = page.tags.valueof(_INKSET_TAG, _CMYK_INKSET)
        if inkset == _CMYK_INKSET and samples >= 4:
            return None
        return (f"photometric Separated with InkSet {inkset} and {samples} samples is not CMYK; "
                "no RGB conversion is defined")
    if photometric == PHOTOMETRIC.YCBCR and int(page.compression) in (JPEG, *J2K_COMPRESSIONS) and samples >= 3:
        return None
    return f"no RGB conversion for photometric {enum_name(page.photometric)}"


