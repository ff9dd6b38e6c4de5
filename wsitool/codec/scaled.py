"""Scaled JPEG decoding: a JPEG tile decoded at 1/2, 1/4 or 1/8 of its size by libjpeg's DCT scaling (floor 3).

Why: OpenSlide shows Hamamatsu slides with more levels than the file stores;
below each stored level it adds the levels libjpeg makes by decoding the same
JPEG data at a reduced scale (OpenSlide's Hamamatsu format notes;
``create_scaled_jpeg_levels`` in its ``openslide-vendor-hamamatsu.c``).  libjpeg
(IJG libjpeg 7+ and libjpeg-turbo, ``scale_num / scale_denom``) computes such an
output from the low-frequency DCT coefficients of each block: an 8 x 8 block
becomes 4 x 4, 2 x 2 or 1 x 1 pixels, without decoding the full-size image first.
nvImageCodec and imagecodecs offer no such scaling.  wsitool's compiled extension
decodes it through libjpeg-turbo's own API (``scale_denom = 2**k``, the default
accurate integer DCT and fancy upsampling, as OpenSlide decodes), where corrupt
entropy-coded data is an error (:func:`wsitool.codec.jpegloop.libjpeg_decode`);
without the extension, Pillow does it through ``Image.draft()``, which sets the same
``scale_denom`` with the same DCT and upsampling (Pillow's ``JpegImagePlugin``) but
decodes corrupt data without a word.  Both give the same pixels
(``tests/formats/test_ndpi_scaled.py``).

The tiles: a level with :attr:`~wsitool.model.TileEncoding.codec` ``"scaled-jpeg"``
shares the segments of the stored level it is scaled from (for NDPI: one
restart interval each, made a complete stream by
:func:`wsitool.codec.tilebytes.jpeg_stream`); its tile is that segment at scale
``1 / 2**scale_log2``.  Checks before decoding: the stream's frame header (SOF,
ITU-T T.81 B.2.2) declares exactly the stored tile cell, ``(tile_width <<
scale_log2, tile_height << scale_log2)``, so a hostile SOF cannot make the
decoder allocate more; after: the decoded image is exactly the level's tile
cell, 3 samples of 8 bits.  Any failure is a
:class:`~wsitool.errors.TileDecodeError` naming level, column and row.

Pillow creates and frees its decoder within each call (no native state is
kept between calls; ``tests/leaks`` checks the process's memory stays flat).
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from ..errors import TileDecodeError
from ..ground.bitstream import jpeg_frame_size
from ..model import PyramidLevel
from .failures import libjpeg_reason
from .jpegloop import libjpeg_decode
from .pool import ThreadState
from .tilebytes import jpeg_stream, read_tile_bytes

__all__ = ["SCALES_LOG2", "decode_scaled", "decode_scaled_stream"]

#: The scales libjpeg's DCT scaling gives as ``k`` of ``1 / 2**k`` (1/2, 1/4, 1/8).
SCALES_LOG2 = (1, 2, 3)


def decode_scaled(level: PyramidLevel, col: int, row: int, state: ThreadState) -> np.ndarray | None:
    """Decode tile ``(col, row)`` of a scaled JPEG level (``level.encoding.codec == "scaled-jpeg"``).

    Reads the tile's segment (:func:`~wsitool.codec.tilebytes.read_tile_bytes`:
    offset and byte count inside the file), makes it a complete JPEG stream
    (:func:`~wsitool.codec.tilebytes.jpeg_stream`), checks its frame header and
    decodes it at ``1 / 2**level.encoding.scale_log2``
    (:func:`decode_scaled_stream`).  Counts ``tiles_decoded`` and
    ``tiles_scaled`` in ``state.stats``.

    Returns:
        ``(tile_height, tile_width, 3)`` uint8 RGB (the whole tile cell, in
        pixels of ``level``; the caller crops an edge tile to the level), or
        None for a missing tile (offset or byte count 0).

    Raises:
        TileDecodeError: the segment lies outside the file or reads short; the
            stream has no readable frame header or declares a size other than
            the cell scaled up; Pillow cannot decode it; or the decoded image is
            not the tile cell in RGB.
    """
    index = row * level.tiles_across + col
    data = read_tile_bytes(level, index, col, row, state.stats)
    if data is None:
        return None
    arr = decode_scaled_stream(level, col, row, jpeg_stream(level, data, col, row))
    state.stats.tiles_scaled += 1
    state.stats.tiles_decoded += 1
    return arr


def decode_scaled_stream(level: PyramidLevel, col: int, row: int, stream: bytes) -> np.ndarray:
    """Decode the complete JPEG ``stream`` of tile ``(col, row)`` of the scaled ``level``.

    The frame header must declare ``(level.tile_width << k, level.tile_height
    << k)`` pixels (``k = level.encoding.scale_log2``, 1 to 3); the scaled decode
    (libjpeg-turbo's API through the extension, else Pillow's ``Image.draft``; libjpeg
    ``scale_denom = 2**k``) must give ``(tile_width, tile_height)`` RGB pixels.

    Returns:
        ``(tile_height, tile_width, 3)`` uint8.

    Raises:
        TileDecodeError: naming ``level.index``, ``col`` and ``row``, as
            :func:`decode_scaled` describes.
    """
    k = level.encoding.scale_log2
    tw, th = level.tile_width, level.tile_height

    def fail(reason: str) -> TileDecodeError:
        return TileDecodeError(level.path, level.index, col, row, reason)

    if k not in SCALES_LOG2:
        raise fail(f"scale_log2 {k} is not 1, 2 or 3 (libjpeg scales by 1/2, 1/4, 1/8)")
    frame = jpeg_frame_size(stream)
    if frame is None:
        raise fail("JPEG stream without a readable frame header")
    want = (tw << k, th << k)
    if frame != want:
        raise fail(f"JPEG frame {frame[0]}x{frame[1]} is not the {want[0]}x{want[1]} tile this "
                   f"level decodes at 1/{1 << k}")
    decode = libjpeg_decode()
    if decode is not None:
        out = np.empty((th, tw, 3), np.uint8)
        message = decode(stream, out, 0, 0, tw, th, k)
        if message is not None:
            raise fail(libjpeg_reason(message))
        return out
    try:
        with Image.open(io.BytesIO(stream), formats=("JPEG",)) as im:
            im.draft("RGB", (tw, th))
            if im.size != (tw, th) or im.mode != "RGB":
                raise fail(f"scaled JPEG decode gives {im.size[0]}x{im.size[1]} {im.mode}, "
                           f"not the {tw}x{th} RGB tile")
            im.load()
            arr = np.asarray(im)
    except TileDecodeError:
        raise
    except Exception as exc:  # Pillow's errors: OSError, SyntaxError, ValueError, ...
        raise fail(f"scaled JPEG decode failed: {type(exc).__name__}: {exc}") from None
    if arr.shape != (th, tw, 3) or arr.dtype != np.uint8:
        raise fail(f"scaled JPEG decode gives {arr.shape} {arr.dtype}, not ({th}, {tw}, 3) uint8")
    return arr
