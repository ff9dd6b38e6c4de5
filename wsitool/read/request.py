"""Validating a region request before any I/O, and the shape of its output (floor 4).

Everything is checked before a byte is read: level index, integer location and
positive integer size, mode, the caller's ``out`` buffer (type, shape, dtype,
contiguity, writability) and the pixel / byte / tile limits of
:mod:`wsitool.ground.limits` (raising :class:`~wsitool.errors.ResourceLimitError`
before any allocation).  Messages name the request, not the slide: the facade
(:class:`wsitool.Slide`) attaches the slide's name as an error leaves it
(:mod:`wsitool.ground.naming`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from ..errors import InvalidRegionError, ResourceLimitError, UnsupportedFormatError, WsiError
from ..ground.geometry import TileGrid, level_rect, scaled_grid
from ..ground.integers import as_int, int_pair
from ..ground.limits import get_limits
from ..model import PyramidLevel
from .channels import select_channels

__all__ = ["MODES", "DOWNSAMPLES", "ReadRequest", "region_request", "output_shape", "level_index",
           "validate_request", "check_out", "check_tile_limit", "check_downsample", "check_threads"]


MODES = ("rgba", "rgb", "raw")

#: Factors a region may be read at below its level (``read_region(downsample=)``):
#: the resolution levels a JPEG 2000 tile can drop (1/2, 1/4, 1/8) and 1.
DOWNSAMPLES = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReadRequest:
    """A validated region read, built once (:func:`region_request`) and carried to the fill paths.

    Attributes:
        level: the :class:`~wsitool.model.PyramidLevel` read (for ``channels=``, the selection).
        x, y: top-left pixel of the region in pixels of ``level`` as read: the
            level's own pixels, or with ``downsample = k > 1`` those of the
            level at ``1/k`` scale (:func:`wsitool.ground.geometry.scaled_grid`); may be
            negative or beyond the level.
        width, height: the region's size in those pixels (> 0).
        mode: ``"rgba"``, ``"rgb"`` or ``"raw"``.
        on_error: ``"raise"`` or ``"fill"``.
        threads: decode threads (>= 1), or None (the CPU count).
        downsample: 1, 2, 4 or 8 (:data:`DOWNSAMPLES`).
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    """

    level: PyramidLevel
    x: int
    y: int
    width: int
    height: int
    mode: str
    on_error: str = "raise"
    threads: int | None = None
    downsample: int = 1
    device: str = "cpu"

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(height, width, channels)`` of the output (:func:`output_shape`)."""
        return output_shape(self.level, (self.width, self.height), self.mode)[0]

    @property
    def dtype(self) -> np.dtype:
        """The output's dtype: uint8, or the level's for ``raw``."""
        return output_shape(self.level, (self.width, self.height), self.mode)[1]

    def part(self, x: int, y: int, width: int, height: int, **changes: Any) -> ReadRequest:
        """The same read of the rectangle ``(x, y, width, height)`` (pixels of the level as
        read), with the other ``changes`` of fields (``level=``, ``mode=``, ``threads=``)."""
        return dataclasses.replace(self, x=x, y=y, width=width, height=height, **changes)


def region_request(levels: Sequence[PyramidLevel], location: Any, level: Any, size: Any, *,
                   mode: str = "rgba", threads: Any = None, on_error: str = "raise", device: str = "cpu",
                   downsample: Any = 1, channels: Any = None) -> ReadRequest:
    """Check a region read of the pyramid ``levels`` (see :func:`wsitool.read.region.read_pyramid_region`
    for the arguments) and return it as a :class:`ReadRequest`, the level-0 ``location``
    mapped to pixels of the level as read (:func:`wsitool.ground.geometry.level_rect`).

    Raises:
        InvalidRegionError: a bad ``on_error``, ``downsample``, level, location, size,
            mode, channels or ``threads``, or a multi-channel level with a ``device``
            other than ``"cpu"``.
        UnsupportedFormatError, ResourceLimitError, WsiError: as :func:`validate_request`.
    """
    if on_error not in ("raise", "fill"):
        raise InvalidRegionError(f"on_error must be 'raise' or 'fill', got {on_error!r}")
    k = check_downsample(downsample, device)
    lv, x, y, w, h = validate_request(levels, location, level, size, mode, channels)
    threads = check_threads(threads)
    if device != "cpu" and lv.planes is not None:
        raise InvalidRegionError("multi-channel levels read on the CPU only (device='cpu')")
    rx, ry = level_rect(lv if k == 1 else cast(TileGrid, scaled_grid(lv, k)), x, y)  # (Protocol: see reduced)
    return ReadRequest(level=lv, x=rx, y=ry, width=w, height=h, mode=mode, on_error=on_error,
                       threads=threads, downsample=k, device=device)


def check_threads(threads: Any) -> int | None:
    """``threads`` as an int >= 1, or None.

    Raises:
        InvalidRegionError: not an integer, or below 1.
    """
    if threads is None:
        return None
    count = as_int(threads, "threads")
    if count < 1:
        raise InvalidRegionError(f"threads must be >= 1, got {count}")
    return count


def check_downsample(downsample: Any, device: str = "cpu") -> int:
    """``downsample`` as an int of :data:`DOWNSAMPLES`.

    Raises:
        InvalidRegionError: not an integer, not one of :data:`DOWNSAMPLES`, or
            above 1 with a ``device`` other than ``"cpu"``.
    """
    k = as_int(downsample, "downsample")
    if k not in DOWNSAMPLES:
        raise InvalidRegionError(f"downsample must be one of {DOWNSAMPLES}, got {k}")
    if k > 1 and device != "cpu":
        raise InvalidRegionError(f"downsample={k} reads only on the CPU (device='cpu')")
    return k


def output_shape(level: PyramidLevel, size: tuple[int, int], mode: str) -> tuple[tuple[int, int, int], np.dtype]:
    """``((height, width, channels), dtype)`` of a read of ``size`` in ``mode``."""
    w, h = size
    if mode == "raw":
        return (h, w, level.samples), level.dtype
    return (h, w, 4 if mode == "rgba" else 3), np.dtype(np.uint8)


def level_index(level: Any, count: int) -> int:
    """``level`` as an int index of a slide with ``count`` levels.

    Raises:
        InvalidRegionError: not an integer, or not in ``0 .. count - 1``.
    """
    lvl = as_int(level, "level")
    if not 0 <= lvl < count:
        raise InvalidRegionError(
            f"level {lvl} out of range (the slide has {count} level(s): 0..{count - 1})"
        )
    return lvl


def validate_request(levels: Sequence[PyramidLevel], location: Any, level: Any, size: Any, mode: str,
                     channels: Any = None) -> tuple[PyramidLevel, int, int, int, int]:
    """Check a region request of a slide whose levels are ``levels``; return ``(PyramidLevel, x, y, w, h)``.

    ``channels`` (None: all) selects channels of a multi-channel level
    (:func:`wsitool.read.channels.select_channels`); the returned level is then
    the selection, whose ``samples`` is the number of channels chosen.

    Raises:
        InvalidRegionError: bad level, location, size, mode or channels.
        UnsupportedFormatError: ``rgb`` / ``rgba`` requested for samples without
            an RGB conversion (see :func:`wsitool.ground.color.to_rgb8`), or the level's
            compression has no decoder (``PyramidLevel.compression_problem``).
        ResourceLimitError: the output would exceed the configured limits.
        WsiError: the slide is closed.
    """
    if levels and levels[0].source.closed:
        raise WsiError("slide is closed")
    if mode not in MODES:
        raise InvalidRegionError(f"mode must be one of {MODES}, got {mode!r}")
    lvl = level_index(level, len(levels))
    x, y = int_pair(location, "location")
    w, h = int_pair(size, "size")
    if w <= 0 or h <= 0:
        raise InvalidRegionError(f"size must be positive, got {w}x{h}")
    lv = select_channels(levels[lvl], channels)
    if lv.compression_problem:
        raise UnsupportedFormatError(f"level {lvl}: {lv.compression_problem}")
    if mode != "raw" and lv.encoding.rgb_problem:
        raise UnsupportedFormatError(
            f"level {lvl}: {lv.encoding.rgb_problem} (read it with mode='raw')"
        )
    shape, dtype = output_shape(lv, (w, h), mode)
    lim = get_limits()
    pixels = w * h
    nbytes = pixels * shape[2] * dtype.itemsize
    if pixels > lim.max_region_pixels:
        raise ResourceLimitError(
            f"region {w}x{h} ({pixels} pixels) exceeds the max_region_pixels limit "
            f"{lim.max_region_pixels} (raise it with wsitool.set_limits or --max-pixels)"
        )
    if nbytes > lim.max_region_bytes:
        raise ResourceLimitError(
            f"region {w}x{h} needs {nbytes} bytes, over the max_region_bytes limit "
            f"{lim.max_region_bytes}"
        )
    check_tile_limit(lv)
    return lv, x, y, w, h


def check_out(out: Any, shape: tuple[int, ...], dtype: np.dtype, array_type: type[Any] = np.ndarray,
              type_name: str = "numpy.ndarray") -> Any:
    """Check a caller's ``out`` buffer (numpy, or CuPy for ``device="cuda"``)."""
    if not isinstance(out, array_type):
        raise InvalidRegionError(f"out must be a {type_name}, got {type(out).__name__}")
    if out.shape != shape or out.dtype != dtype:
        raise InvalidRegionError(
            f"out has shape {out.shape} dtype {out.dtype}; expected {shape} {dtype}"
        )
    # CuPy arrays have no "writeable" flag (device memory is always writable).
    if not out.flags.c_contiguous or not getattr(out.flags, "writeable", True):
        raise InvalidRegionError("out must be C-contiguous and writeable")
    return out


def check_tile_limit(level: PyramidLevel) -> None:
    """Raise :class:`ResourceLimitError` if one tile of ``level`` is too large to decode.

    A tile (or strip) is refused when its pixel count exceeds ``max_tile_pixels``
    or its decoded size (pixels x samples x bytes per sample) exceeds
    ``max_region_bytes``, since a tile is decoded whole into memory; both are
    checked before any tile is read.
    """
    pixels = level.tile_width * level.tile_height
    lim = get_limits()
    if pixels > lim.max_tile_pixels:
        raise ResourceLimitError(
            f"level {level.index} has {level.tile_width}x{level.tile_height} "
            f"tiles ({pixels} pixels), over the max_tile_pixels limit {lim.max_tile_pixels}"
        )
    nbytes = pixels * level.samples * level.dtype.itemsize
    if nbytes > lim.max_region_bytes:
        raise ResourceLimitError(
            f"level {level.index} tiles decode to {nbytes} bytes "
            f"({level.tile_width}x{level.tile_height}x{level.samples} {level.dtype}), over the "
            f"max_region_bytes limit {lim.max_region_bytes}"
        )


