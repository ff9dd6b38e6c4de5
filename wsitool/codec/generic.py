"""The tifffile / imagecodecs tile path: every compression nvImageCodec does not take (floor 3).

None, LZW, deflate, zstd, WebP, JPEG gray / CMYK / 2-sample, predictors,
big-endian samples, planar-separate data: decoded by tifffile's
``TiffPage.decode`` (the page is the format's handle in
``PyramidLevel.encoding.page``), after the header checks of :mod:`.headers`.
Segments of containers without a tifffile page (DICOM frames) are decoded by
the imagecodecs decoder their ``encoding.imagecodec`` names (:mod:`.frames`).
Levels decoded at a reduced JPEG scale (``encoding.codec == "scaled-jpeg"``)
go to :mod:`.scaled` (Pillow), from here as well: every tile the Python path
does not give nvImageCodec comes through :func:`decode_array`.
"""

from __future__ import annotations

import numpy as np

from ..errors import TileDecodeError
from ..model import SCALED_JPEG, PyramidLevel
from .frames import FrameError, decode_frame
from .headers import check_header
from .pool import ThreadState
from .scaled import decode_scaled
from .tilebytes import jpeg_stream, read_tile_bytes

__all__ = ["decode_array"]


def decode_array(level: PyramidLevel, col: int, row: int, state: ThreadState) -> np.ndarray | None:
    """Decode one tile (all planes) of a generic level with tifffile/imagecodecs.

    Returns a ``(h, w, samples)`` array in the level's native dtype, where
    ``h, w`` is the decoded segment's size (the full tile cell for tiles; for
    strips the strip's rows), or ``None`` when the tile is missing (any plane
    with offset/byte count 0).  Byte order, predictors, JPEGTables and bit
    depths are handled by tifffile.  A scaled JPEG level's tile is decoded by
    :func:`wsitool.codec.scaled.decode_scaled` (``(tile_height, tile_width, 3)``
    uint8).

    Raises:
        TileDecodeError: the bytes could not be decoded, or the decoded size
            disagrees with the tile grid.
    """
    if level.encoding.codec == SCALED_JPEG:
        return decode_scaled(level, col, row, state)
    planes = level.tiles.planes
    per_plane = level.tiles_across * level.tiles_down
    index = row * level.tiles_across + col
    parts = []
    for plane in range(planes):
        seg = plane * per_plane + index
        data = read_tile_bytes(level, seg, col, row, state.stats)
        if data is None:
            return None
        check_header(level, data, col, row)
        if level.encoding.page is None:
            parts.append(_decode_frame(level, data, col, row))
            continue
        try:
            page = level.encoding.page
            # jpegheader: tifffile's header of an NDPI page's restart intervals (else None)
            arr, _idx, _shape = page.decode(data, seg, jpegtables=page.jpegtables,
                                            jpegheader=getattr(page, "jpegheader", None))
        except Exception as exc:
            raise TileDecodeError(
                level.path, level.index, col, row,
                f"{level.compression} decode failed: {type(exc).__name__}: {exc}",
            ) from None
        if arr is None:
            raise TileDecodeError(level.path, level.index, col, row, "decoder returned no data")
        arr = np.asarray(arr)
        arr = arr.reshape(arr.shape[-3], arr.shape[-2], arr.shape[-1])
        parts.append(arr)
    arr = parts[0] if planes == 1 else np.concatenate(parts, axis=2)
    exp_h = min(level.tile_height, level.height - row * level.tile_height)
    exp_w = min(level.tile_width, level.width - col * level.tile_width)
    if arr.shape[0] < exp_h or arr.shape[1] < exp_w or arr.shape[2] != level.samples:
        raise TileDecodeError(
            level.path, level.index, col, row,
            f"decoded size {arr.shape[1]}x{arr.shape[0]}x{arr.shape[2]} does not cover the "
            f"tile cell {exp_w}x{exp_h}x{level.samples}",
        )
    state.stats.tiles_generic += 1
    state.stats.tiles_decoded += 1
    return arr


def _decode_frame(level: PyramidLevel, data: bytes, col: int, row: int) -> np.ndarray:
    """One segment of an encoding without a tifffile page (``encoding.imagecodec``,
    see :mod:`.frames`): a ``(tile_height, tile_width, samples)`` array."""
    enc = level.encoding
    if enc.stream == "jpeg" and enc.jpeg_prefix:
        data = jpeg_stream(level, data, col, row)
    try:
        return decode_frame(enc.imagecodec or "", data, level.tile_height, level.tile_width,
                            level.samples, level.dtype)
    except FrameError as exc:
        raise TileDecodeError(level.path, level.index, col, row, str(exc)) from None
