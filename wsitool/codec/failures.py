"""When a tile fails: one wording for each cause, and the ``on_error`` policy (floor 3).

The Python decode path and the compiled JPEG loop build their
:class:`~wsitool.errors.TileDecodeError` reasons with these functions, so a
failure reads the same whichever path ran.
"""

from __future__ import annotations

import warnings

from ..errors import TileDecodeError, TileWarning
from ..ground.oserrors import descriptors_exhausted
from ..model import PyramidLevel

__all__ = [
    "past_eof_reason", "short_read_reason", "not_soi_reason", "grid_reason", "outside_reason",
    "unreadable_header_reason", "unusable_stream_reason", "no_image_reason", "libjpeg_reason", "tile_failed",
]


def past_eof_reason(offset: int, count: int, file_size: int) -> str:
    """A segment of ``count`` bytes at ``offset`` beyond a ``file_size``-byte file."""
    return (f"tile data at offset {offset} (+{count} bytes) lies past the end of the "
            f"file ({file_size} bytes): truncated file")


def short_read_reason(got: int, count: int, offset: int) -> str:
    """A read of ``count`` bytes at ``offset`` that returned ``got``."""
    return f"short read: {got} of {count} bytes at offset {offset}"


def not_soi_reason(first: bytes) -> str:
    """A JPEG tile whose first (up to two) bytes ``first`` are not SOI (ITU-T T.81 B.2.1)."""
    return f"not a JPEG stream (starts with {first.hex()} instead of ffd8)"


def grid_reason(level: PyramidLevel, width: int, height: int) -> str:
    """A code stream declaring ``width x height`` pixels, not the tile grid cell."""
    return (f"code stream declares {width}x{height} pixels but the tile grid cell is "
            f"{level.tile_width}x{level.tile_height}; refusing to decode")


def outside_reason(src_rect: tuple[int, int, int, int], width: int, height: int) -> str:
    """A wanted ``(x0, y0, x1, y1)`` tile sub-region outside a ``width x height`` tile."""
    return f"requested tile sub-region {src_rect} is outside the {width}x{height} tile"


def unreadable_header_reason(detail) -> str:
    """A code stream header nvImageCodec could not parse (``detail``: its message or status)."""
    return f"unreadable code stream header ({detail})"


def unusable_stream_reason(detail) -> str:
    """A sub-region code stream nvImageCodec could not make."""
    return f"unusable code stream ({detail})"


def no_image_reason(detail: str | None = None) -> str:
    """A decode that produced no image (libjpeg-turbo / OpenJPEG gave up on the data)."""
    return ("decoder returned no image (corrupt or truncated tile data"
            + (f"; {detail})" if detail else ")"))


#: libjpeg-turbo's messages (jerror.h) for a JPEG process, precision or colour conversion it
#: does not implement ("Unsupported marker type" is left out: a damaged header gives it)
UNSUPPORTED_JPEG = ("Unsupported JPEG process", "Unsupported JPEG data precision",
                    "Unsupported color conversion request")


def libjpeg_reason(message: str) -> str:
    """A JPEG decode libjpeg-turbo stopped, with its ``message``: an error, or a warning
    that the entropy-coded data is corrupt (``Corrupt JPEG data: ...``), which the
    compiled decode treats as an error (see ``lj_decode`` in wsitool/_native/jpegloop.c).
    libjpeg-turbo's errors for a kind of JPEG it does not decode (``UNSUPPORTED_JPEG``: a
    lossless or 12-bit JPEG, a CMYK one to convert to RGB) are said so, not called damage."""
    if message.startswith(UNSUPPORTED_JPEG):
        return f"a JPEG tile libjpeg-turbo does not decode (libjpeg-turbo: {message})"
    return f"corrupt or truncated tile data (libjpeg-turbo: {message})"


def tile_failed(exc: TileDecodeError, on_error: str, stats) -> None:
    """Count a failed tile in ``stats``; re-raise ``exc`` or, for ``on_error="fill"``,
    emit it as a :class:`TileWarning` (the caller then fills the tile with background).

    A decoder that failed because the process is out of file descriptors or
    memory is not a bad tile: that raises the OSError (EMFILE, ENOMEM, ...)
    instead, whatever ``on_error`` says (see :func:`wsitool.ground.oserrors.descriptors_exhausted`).
    """
    exhausted = descriptors_exhausted()  # (named by the facade, as it leaves the read)
    if exhausted is not None:
        raise exhausted from None
    stats.tiles_failed += 1
    if on_error != "fill":
        raise exc
    warnings.warn(str(exc), TileWarning, stacklevel=3)


