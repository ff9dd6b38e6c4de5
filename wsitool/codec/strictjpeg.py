"""JPEG tiles decoded by libjpeg-turbo through simplejpeg, corrupt data an error: where the compiled
loop is absent (floor 3).

The compiled extension (``wsitool._jpegloop``) decodes JPEG tiles through libjpeg-turbo's own API
and fails a tile whose entropy-coded data is corrupt (libjpeg-turbo only warns; nvImageCodec's CPU
backend, imagecodecs and Pillow return pixels).  Where the extension is not built (no C compiler,
macOS, Windows), :func:`decode_jpeg` does the same through simplejpeg (a wheel on every platform:
libjpeg-turbo's TurboJPEG API with ``strict=True``, which turns those warnings into errors), with
the extension's ``decode_jpeg`` signature, so the Python path takes either
(:func:`wsitool.codec.jpegloop.libjpeg_decode`).  The pixels are libjpeg-turbo's with its default
settings (accurate DCT, fancy upsampling), as the extension's: a tile is decoded whole and the
window copied.  The GIL is released while simplejpeg decodes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["available", "decode_jpeg"]


def _simplejpeg() -> Any:
    try:
        import simplejpeg
    except ImportError:  # (a dependency: only a broken installation lacks it)
        return None
    return simplejpeg


def available() -> bool:
    """Whether simplejpeg can be imported."""
    return _simplejpeg() is not None


def decode_jpeg(stream: Any, out: np.ndarray, x0: int, y0: int, x1: int, y1: int, scale_log2: int = 0) -> str | None:
    """Decode the window ``[x0, x1) x [y0, y1)`` of the complete JPEG code stream ``stream`` at scale
    ``1 / 2**scale_log2`` (0 to 3: libjpeg-turbo's DCT scaling; the window in pixels of that scale)
    as RGB into ``out``, a ``(y1 - y0, x1 - x0, 3)`` uint8 array (rows may be padded).

    Returns:
        None when decoded; else why not (libjpeg-turbo's message: corrupt or truncated data, a
        frame that does not hold the window); ``out``'s pixels are then undefined.

    Raises:
        ValueError: ``out`` of another shape, or ``scale_log2`` outside 0..3 (a caller's error).
        ImportError: simplejpeg is not installed (:func:`available` says).
    """
    sj = _simplejpeg()
    if sj is None:
        raise ImportError("simplejpeg is not installed: pip install simplejpeg")
    if not 0 <= scale_log2 <= 3 or out.shape != (y1 - y0, x1 - x0, 3) or out.dtype != np.uint8:
        raise ValueError("out must be a (y1 - y0, x1 - x0, 3) uint8 array; scale_log2 0 to 3")
    data = bytes(stream) if not isinstance(stream, bytes) else stream
    try:
        if scale_log2:
            height, width, _, _ = sj.decode_jpeg_header(data)
            f = 1 << scale_log2
            # the smallest decoded size at least 1/f of the frame with a factor of at least f: 1/f
            rgb = sj.decode_jpeg(data, "RGB", min_height=math.ceil(height / f), min_width=math.ceil(width / f),
                                 min_factor=f, strict=True)
        else:
            rgb = sj.decode_jpeg(data, "RGB", strict=True)
    except ValueError as exc:
        return str(exc) or type(exc).__name__
    if rgb.shape[0] < y1 or rgb.shape[1] < x1:
        return f"the frame ({rgb.shape[1]} x {rgb.shape[0]} at 1/{1 << scale_log2}) does not hold the window"
    out[...] = rgb[y0:y1, x0:x1]
    return None
