"""Header checks before any decode: a code stream must declare the size of its tile grid cell (floor 3).

A JPEG SOF, JPEG-LS SOF55, JPEG 2000 SIZ or WebP header declaring another size (a
decompression bomb such as an 8000 x 8000 SOF inside a 256 x 256 tile), an
unreadable header, a JPEG 2000 main header that OpenJPEG crashes on, or LZW
data that imagecodecs crashes on (:mod:`wsitool.ground.bitstream`) raises
:class:`~wsitool.errors.TileDecodeError` before the decoder sees the stream.
"""

from __future__ import annotations

from ..errors import TileDecodeError
from ..ground.bitstream import (
    j2k_header_problem,
    j2k_main_header,
    jpeg_frame_size,
    jpegls_frame_size,
    lzw_problem,
    webp_frame_size,
)
from ..model import PyramidLevel
from .failures import grid_reason, unreadable_header_reason
from .library import nv
from .tilebytes import jpeg_stream

__all__ = ["check_cell", "check_header", "codestream"]


def check_cell(level: PyramidLevel, col: int, row: int, width: int, height: int) -> None:
    """Refuse a code stream whose declared size is not the tile cell (or its cropped part)."""
    cell_w, cell_h = level.tile_width, level.tile_height
    inner_w = min(cell_w, level.width - col * cell_w)
    inner_h = min(cell_h, level.height - row * cell_h)
    if width not in (cell_w, inner_w) or height not in (cell_h, inner_h):
        raise TileDecodeError(level.path, level.index, col, row,
                              grid_reason(level, width, height))


def check_header(level: PyramidLevel, data: bytes, col: int, row: int) -> None:
    """Check a JPEG / JPEG-LS / JPEG 2000 / WebP tile header against the grid before a tifffile decode.

    Raises :class:`TileDecodeError` when the header is unreadable or declares a
    size other than the tile cell (or its part inside the image), so a
    decompression bomb is refused before the decoder allocates its output.
    """
    kind = level.encoding.stream
    if kind == "jpeg" and level.encoding.jpeg_scan_segments:
        data = jpeg_stream(level, data, col, row)  # an NDPI restart interval: its frame header is the level's
    if kind in ("jpeg", "webp", "jpegls"):
        size = (jpeg_frame_size(data) if kind == "jpeg" else webp_frame_size(data) if kind == "webp"
                else jpegls_frame_size(data))
        if size is None:
            raise TileDecodeError(level.path, level.index, col, row,
                                  f"{kind.upper()} stream without a readable frame header")
        check_cell(level, col, row, *size)
    elif kind == "j2k":
        # the SIZ size of the header walk (no nvImageCodec: this path is also the
        # fallback where it cannot be imported, library.fallback_encoding)
        head = j2k_main_header(data if isinstance(data, bytes) else bytes(data))
        if head.problem:
            raise TileDecodeError(level.path, level.index, col, row, head.problem)
        check_cell(level, col, row, head.width, head.height)
    elif kind == "lzw":
        problem = lzw_problem(data)
        if problem:
            raise TileDecodeError(level.path, level.index, col, row, problem)


def codestream(level: PyramidLevel, data, col: int, row: int, complete: bool = False):
    """Parse the code stream header and check it against the tile grid.

    ``data`` is the tile's bytes, or with ``complete=True`` a complete stream
    from :func:`read_tile_stream`.  The expected size is the full tile cell, or
    for the last row/column the part inside the image (some writers crop edge
    tiles; strips are cropped).
    """
    if level.encoding.stream == "jpeg" and not complete:
        data = jpeg_stream(level, data, col, row)
    elif level.encoding.stream == "j2k":
        # read_tile_stream hands a numpy view; the header walk wants bytes (one
        # copy of a J2K tile costs microseconds against milliseconds of decoding)
        problem = j2k_header_problem(data if isinstance(data, bytes) else bytes(data))
        if problem:
            raise TileDecodeError(level.path, level.index, col, row, problem)
    try:
        cs = nv().CodeStream(data)
        width, height = cs.width, cs.height
    except Exception as exc:
        raise TileDecodeError(
            level.path, level.index, col, row, unreadable_header_reason(exc)
        ) from None
    if width != level.tile_width or height != level.tile_height:  # else a whole cell: fine
        check_cell(level, col, row, width, height)
    return cs, width, height


