"""``read_region``: the entry of the region layer (floor 4).

The path of one region read: validate everything before any I/O
(:mod:`.request`); map the level-0 location to the level and plan the tiles
(:mod:`wsitool.geometry`); fill the caller's buffer on the CPU (:mod:`.fill`,
with the compiled JPEG loop or the Python path of :mod:`.worker`) or on a GPU
(:mod:`.cuda`).  It takes the pyramid's levels, whose byte source it reads
through, never a ``Slide``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..arguments import as_int
from ..codec.pool import get_pool
from ..errors import InvalidRegionError
from ..model import Level
from .cuda import read_region_cuda
from .fill import fill_region
from .reduced import fill_reduced
from .request import check_downsample, check_out, output_shape, validate_request

__all__ = ["read_region"]


def read_region(levels: Sequence[Level], path: str, location, level, size, *, out=None,
                mode: str = "rgba", threads: int | None = None, on_error: str = "raise",
                device: str = "cpu", cache=None, downsample: int = 1, channels=None):
    """Read a region of a pyramid into a new or caller-provided array.

    Args:
        levels: the pyramid's levels (their byte source is open).
        path: the slide's path, named in messages.
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
    if on_error not in ("raise", "fill"):
        raise InvalidRegionError(f"{path}: on_error must be 'raise' or 'fill', got {on_error!r}")
    k = check_downsample(downsample, path, device)
    lv, x, y, w, h = validate_request(levels, path, location, level, size, mode, channels)
    if threads is not None:
        threads = as_int(threads, "threads", path)
        if threads < 1:
            raise InvalidRegionError(f"{path}: threads must be >= 1, got {threads}")
    if device != "cpu":
        if lv.planes is not None:
            raise InvalidRegionError(f"{path}: multi-channel levels read on the CPU only (device='cpu')")
        with lv.source.reading():
            return read_region_cuda(path, lv, x, y, w, h, out=out, mode=mode, threads=threads,
                                    on_error=on_error, device=device)
    shape, dtype = output_shape(lv, (w, h), mode)
    if out is None:
        out = np.empty(shape, dtype)
    else:
        check_out(out, shape, dtype, path)
    with lv.source.reading():
        if k > 1:
            fill_reduced(lv, x, y, w, h, k, out, mode, threads, on_error, get_pool("cpu"))
        else:
            fill_region(lv, x, y, w, h, out, mode, threads, on_error, get_pool("cpu"), cache)
    return out


