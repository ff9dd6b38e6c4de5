"""The nvImageCodec tile path: decode (part of) a JPEG / JPEG 2000 tile straight into the caller's buffer (floor 3).

* **Caller buffers are honoured.**  :func:`decode_into` decodes into the array
  it is given (usually a strided sub-view of the caller's output) through
  ``nvimgcodec.as_image``; the result is checked to be that very buffer, never a
  replacement.  Partial tiles are decoded as a sub-region of the code stream
  (``CodeStream.get_sub_code_stream(region=)``), also straight into the output.
  Only where that is not possible (RGBA output, colour transforms, or forced by
  :class:`wsitool.codec.paths.DecodePaths` for parity tests) is a per-thread scratch
  buffer used, allocated once per thread and shape.
* **Every decode is checked.**  A decode returning ``None``, an image of the
  wrong size, or a code stream whose header disagrees with the tile grid raises
  :class:`~wsitool.errors.TileDecodeError` naming level, column and row.
* The per-thread decoder of :mod:`wsitool.codec.pool` is always called under
  its thread state's lock.
"""

from __future__ import annotations

import numpy as np

from ..errors import TileDecodeError
from ..ground.bitstream import jpeg_frame_kind
from ..model import PyramidLevel
from .failures import libjpeg_reason, no_image_reason, outside_reason, unusable_stream_reason
from .headers import codestream
from .jpegloop import libjpeg_decoder, libjpeg_kind
from .library import decode_params, nv
from .paths import get_decode_paths
from .pool import DecodeStats, ThreadState
from .tilebytes import jpeg_stream

__all__ = ["plan_decode", "narrow_jpeg_crop", "count_decoded", "decode_into", "check_decoded", "decode_checked"]


def plan_decode(level: PyramidLevel, col: int, row: int, data,
                src_rect: tuple[int, int, int, int], complete: bool = False, substream: bool = True):
    """Prepare one nvImageCodec tile for decoding the part ``src_rect`` of it.

    Shared by the per-tile CPU path (:func:`decode_into`) and the batched GPU
    path (:mod:`wsitool.read.cuda`).  Checks the code stream header against the tile
    grid and ``src_rect`` against the code stream.

    Args:
        level, col, row: the tile.
        data: its encoded bytes (:func:`read_tile_bytes`), or with
            ``complete=True`` the complete stream of :func:`read_tile_stream`.
        src_rect: ``(x0, y0, x1, y1)`` in pixels of the tile.
        complete: ``data`` already has the JPEG prefix merged and SOI checked.
        substream: make the sub-region code stream of a ``"roi"`` decode; when
            False ``code_stream`` is the whole tile's (for a decoder given the window).

    Returns:
        ``(code_stream, how, (width, height))``: ``how`` is ``"direct"`` (the
        whole tile, decode straight into a ``(y1 - y0, x1 - x0, 3)``
        destination), ``"roi"`` (``code_stream`` is the sub-region, same
        destination) or ``"scratch"`` (decode the whole ``(height, width, 3)``
        tile into a scratch buffer, then copy ``src_rect`` out of it);
        ``width, height`` is the code stream's declared size.

    Raises:
        TileDecodeError: unreadable header, header/grid mismatch, or
            ``src_rect`` outside the tile.
    """
    x0, y0, x1, y1 = src_rect
    cs, width, height = codestream(level, data, col, row, complete)
    if not (0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height):
        raise TileDecodeError(
            level.path, level.index, col, row,
            outside_reason(src_rect, width, height),
        )
    whole = (x0, y0, x1, y1) == (0, 0, width, height)
    paths = get_decode_paths()
    if paths.force_scratch or not (whole or paths.roi_decode) or narrow_jpeg_crop(level, src_rect, width):
        return cs, "scratch", (width, height)
    if whole:
        return cs, "direct", (width, height)
    if not substream:
        return cs, "roi", (width, height)
    try:
        sub = cs.get_sub_code_stream(region=nv().Region(y0, x0, y1, x1))
    except Exception as exc:
        raise TileDecodeError(
            level.path, level.index, col, row, unusable_stream_reason(exc)
        ) from None
    return sub, "roi", (width, height)


def narrow_jpeg_crop(level: PyramidLevel, src_rect: tuple[int, int, int, int], width: int) -> bool:
    """True for a JPEG window one column wide at the tile's left edge (of a tile wider
    than that): libjpeg-turbo (nvImageCodec's CPU JPEG backend, 0.9.0) decodes such a
    crop without the fancy upsampling of subsampled chroma, up to 111 grey levels off
    the whole-tile decode on 4:2:0 tiles (measured; other widths and offsets are
    exact).  Those windows are decoded whole and cropped instead."""
    x0, _y0, x1, _y1 = src_rect
    return level.encoding.stream == "jpeg" and x0 == 0 and x1 == 1 and width > 1


def count_decoded(stats: DecodeStats, how: str, caller_buffer: bool = True) -> None:
    """Count one decoded tile in ``stats`` by the way :func:`plan_decode` chose."""
    if how == "scratch" or not caller_buffer:
        stats.tiles_scratch += 1
    elif how == "direct":
        stats.tiles_direct += 1
    else:
        stats.tiles_roi += 1
    stats.tiles_decoded += 1


def decode_into(
    level: PyramidLevel,
    col: int,
    row: int,
    data: bytes | np.ndarray,
    dst: np.ndarray,
    src_rect: tuple[int, int, int, int],
    state: ThreadState,
    *,
    caller_buffer: bool = True,
    complete: bool = False,
    image=None,
) -> None:
    """Decode part of one nvImageCodec-decodable tile into ``dst``.

    Args:
        level: the :class:`~wsitool.model.PyramidLevel` the tile belongs to.
        col, row: tile column and row in the level's grid.
        data: the tile's encoded bytes (see :func:`read_tile_bytes`), or with
            ``complete=True`` the uint8 array of :func:`read_tile_stream`.
        dst: ``(y1 - y0, x1 - x0, 3)`` uint8 array, C-contiguous except for
            row padding (a sub-view of a C-contiguous ``(H, W, 3)`` array is
            fine).  It receives the pixels.
        src_rect: ``(x0, y0, x1, y1)`` in pixels of the tile (0 <= x0 < x1 <=
            tile width, same for y), the part of the tile wanted.
        state: the calling thread's :class:`ThreadState`.
        caller_buffer: True when ``dst`` is (a view of) the caller's output;
            only used to count ``tiles_direct`` / ``tiles_roi`` versus
            ``tiles_scratch`` in :class:`DecodeStats`.
        complete: ``data`` is already a complete code stream (JPEG prefix
            merged, SOI checked) from :func:`read_tile_stream`.
        image: the nvImageCodec image of ``dst``, when the caller keeps one
            (:meth:`ThreadState.tile_rgb`); made here otherwise.

    Raises:
        TileDecodeError: header/grid mismatch, decoder failure, or a decoder
            that did not write into ``dst``.
        ValueError: ``dst`` does not have the shape of ``src_rect`` (a caller bug).
    """
    x0, y0, x1, y1 = src_rect
    libjpeg = libjpeg_decoder(level)
    if libjpeg is not None:
        if not complete:  # (bytes of read_tile_bytes: bytes() of bytes is that object, no copy)
            data = jpeg_stream(level, bytes(data), col, row)
        complete = True
        # (bytes: the stream may be a uint8 array, whose items would be numpy scalars)
        head = data if isinstance(data, bytes) else bytes(data)
        if not libjpeg_kind(jpeg_frame_kind(head)):  # lossless, 12-bit, CMYK: nvImageCodec's
            libjpeg = None
    cs, how, (width, height) = plan_decode(level, col, row, data, src_rect, complete, substream=libjpeg is None)
    if dst.shape[:2] != (y1 - y0, x1 - x0):
        raise ValueError(f"destination shape {dst.shape} does not match {src_rect}")
    if libjpeg is not None:
        _decode_libjpeg(libjpeg, level, col, row, data, dst, src_rect, how, (width, height), state)
    elif how == "scratch":
        scratch = state.scratch((height, width, 3))
        decode_checked(level, col, row, cs, scratch, state)
        dst[...] = scratch[y0:y1, x0:x1]
    else:
        decode_checked(level, col, row, cs, dst, state, image)
    count_decoded(state.stats, how, caller_buffer)


def _decode_libjpeg(libjpeg, level: PyramidLevel, col: int, row: int, stream, dst: np.ndarray,
                    src_rect: tuple[int, int, int, int], how: str, size: tuple[int, int],
                    state: ThreadState) -> None:
    """Decode window ``src_rect`` of the complete JPEG ``stream`` into ``dst`` with
    libjpeg-turbo (:func:`wsitool.codec.jpegloop.libjpeg_decoder`); ``how == "scratch"``:
    the whole ``size`` tile into the thread's scratch, then the window copied.

    Raises:
        TileDecodeError: libjpeg-turbo stopped (corrupt or truncated data), with its message.
    """
    x0, y0, x1, y1 = src_rect
    width, height = size
    if how == "scratch":
        scratch = state.scratch((height, width, 3))
        message = libjpeg(stream, scratch, 0, 0, width, height)
        if message is None:
            dst[...] = scratch[y0:y1, x0:x1]
    else:
        message = libjpeg(stream, dst, x0, y0, x1, y1)
    if message is not None:
        raise TileDecodeError(level.path, level.index, col, row, libjpeg_reason(message))


def check_decoded(level: PyramidLevel, col: int, row: int, result, image, shape) -> None:
    """Verify a decode result: an image, the very ``image`` that wraps the target, of ``shape``.

    ``image`` is the ``nv().as_image`` wrapper of the caller's (or the
    scratch) buffer; a decoder that honours it hands back that same object.
    The check is by identity, not through ``result.__array_interface__``: in
    nvImageCodec 0.9.0 every read of that attribute leaks one Python int
    (32 bytes per tile), found by ``wsitool stress``.

    Raises:
        TileDecodeError: ``result`` is None (the decoder could not decode the
            tile) or is not ``image`` / not of ``shape`` (a replacement buffer).
    """
    if result is None:
        raise TileDecodeError(
            level.path, level.index, col, row,
            no_image_reason(),
        )
    if result is not image or tuple(result.shape) != tuple(shape):
        raise TileDecodeError(
            level.path, level.index, col, row,
            "decoder did not write into the caller's buffer",
        )


def decode_checked(level, col, row, cs, dst: np.ndarray, state: ThreadState,
                    image=None) -> None:
    """Run one decode into ``dst`` (through ``image``, its nvImageCodec image, if
    given) under the thread's decoder lock and verify it."""
    if image is None:
        image = nv().as_image(dst)
    decoder = state.decoder
    with state.lock:
        try:
            result = decoder.decode(cs, image=image, params=decode_params())
        except Exception as exc:
            raise TileDecodeError(
                level.path, level.index, col, row, f"decoder error: {exc}"
            ) from None
    check_decoded(level, col, row, result, image, dst.shape)


