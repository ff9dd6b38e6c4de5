"""``read_pyramid_region``: the entry of the region layer (floor 4).

The path of one region read: validate everything before any I/O
(:mod:`.request`); map the level-0 location to the level and plan the tiles
(:mod:`wsitool.ground.geometry`); fill the caller's buffer on the CPU (:mod:`.fill`,
with the compiled JPEG loop or the Python path of :mod:`.worker`) or on a GPU
(:mod:`.cuda`).  It takes the pyramid's levels, whose byte source it reads
through, never a ``Slide``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..codec.pool import get_pool
from ..model import PyramidLevel
from .cache import CacheScope
from .cuda import read_region_cuda
from .fill import fill_region
from .reduced import fill_reduced
from .request import ReadRequest, check_out, region_request

__all__ = ["read_pyramid_region", "fill_request"]


def read_pyramid_region(levels: Sequence[PyramidLevel], location: Any, level: Any, size: Any, *,
                        out: Any = None, mode: str = "rgba", threads: int | None = None,
                        on_error: str = "raise", device: str = "cpu", cache: CacheScope | None = None,
                        downsample: int = 1, channels: Any = None) -> Any:
    """Read a region of a pyramid into a new or caller-provided array.

    Args:
        levels: the pyramid's levels (their byte source is open).
        location: ``(x, y)`` of the top-left pixel in the level-0 reference
            frame; may be negative or beyond the slide.
        level: level index, ``0 <= level < slide.level_count``.
        size: ``(width, height)`` in pixels of ``level``, both > 0.
        out: optional output array; must be C-contiguous, writeable, of the
            exact shape and dtype of the result (see ``mode``).  It is filled in
            place and returned; tiles are decoded straight into it.
        mode: ``"rgba"`` -> ``(height, width, 4)`` uint8 (default);
            ``"rgb"`` -> ``(height, width, 3)`` uint8 (fastest);
            ``"raw"`` -> ``(height, width, samples)`` in the level's dtype.
            On a multi-channel (fluorescence) level ``raw`` gives every channel
            (or those of ``channels``) in the slide's order and ``rgb`` /
            ``rgba`` their composite (:mod:`wsitool.read.channels`).
        threads: number of threads decoding this region (default: the CPU count).
        on_error: ``"raise"`` (default) raises :class:`TileDecodeError` for a
            corrupt tile; ``"fill"`` fills it with background (transparent),
            emits a :class:`TileWarning` and counts it in the decoder statistics
            (``tiles_failed``).
        device: ``"cpu"``; ``"cuda"`` returns a CuPy array (see :mod:`wsitool.read.cuda`).
        cache: a :class:`~wsitool.read.cache.CacheScope` (the slide's view of a
            decoded-tile cache) or None; CPU reads only (see :mod:`wsitool.read.cache`).
        downsample: 1 (default), 2, 4 or 8: read ``level`` at ``1/downsample``
            scale; ``size`` is then in pixels of that scale (see
            :mod:`wsitool.read.reduced` for the pixel grid; JPEG 2000 tiles are
            decoded at the matching wavelet resolution, others area-filtered).
        channels: None (all), or channel indices / names of a multi-channel
            level, in the order wanted (:func:`wsitool.read.channels.select_channels`).

    Returns:
        The region; pixels outside the slide and missing tiles (offset or byte
        count 0) are 0 with alpha 0.

    Raises:
        InvalidRegionError: malformed request or ``out`` (also a ``ValueError``), a
            bad ``channels``, or ``device="cuda"`` on a multi-channel level.
        ResourceLimitError: output over the configured limits (before allocating).
        UnsupportedFormatError: ``rgb`` / ``rgba`` for samples without an RGB
            conversion (e.g. CIELab); use ``mode="raw"``.
        TileDecodeError: a corrupt tile, with ``on_error="raise"``.
        DeviceUnavailableError: ``device="cuda"`` without a usable GPU.
    """
    req = region_request(levels, location, level, size, mode=mode, threads=threads,
                         on_error=on_error, device=device, downsample=downsample, channels=channels)
    if device != "cpu":
        with req.level.source.reading():
            return read_region_cuda(req, out=out)
    return fill_request(req, out, cache)


def fill_request(req: ReadRequest, out: np.ndarray | None = None, cache: CacheScope | None = None) -> np.ndarray:
    """Fill ``out`` (None: a new array; else checked by :func:`~wsitool.read.request.check_out`)
    with the CPU read ``req`` and return it (``cache``: the slide's
    :class:`~wsitool.read.cache.CacheScope`, full-scale reads only).

    Raises:
        InvalidRegionError: ``out`` of the wrong type, shape, dtype or layout.
        TileDecodeError: a corrupt tile, with ``on_error="raise"``.
    """
    shape, dtype = req.shape, req.dtype
    if out is None:
        out = np.empty(shape, dtype)
    else:
        check_out(out, shape, dtype)
    with req.level.source.reading():
        if req.downsample > 1:
            fill_reduced(req, out, get_pool("cpu"))
        else:
            fill_region(req, out, get_pool("cpu"), cache)
    return out
