"""A batch patch request, checked whole before any tile is read (floor 4).

:func:`check_patch_request` validates the arguments of :meth:`wsitool.Slide.read_patches`
(locations, sizes, level, mode, batch size, threads, device) against the limits, once, into a
:class:`PatchRequest` the reader (:mod:`.reader`) works from.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import InvalidRegionError, ResourceLimitError
from ...ground.integers import as_int
from ...ground.limits import get_limits
from ...model import PyramidLevel
from ..request import check_threads, output_shape, validate_request

__all__ = ["PatchRequest", "check_patch_request"]


@dataclass(frozen=True)
class PatchRequest:
    """A validated batch request (everything checked before any tile is read).

    Attributes:
        level: the :class:`~wsitool.model.PyramidLevel` read.
        locations: ``(n, 2)`` int64, level-0 ``(x, y)`` of each patch's top-left corner.
        size: ``(width, height)`` of each output patch, pixels.
        read: ``(width, height)`` of the window read at ``level`` before the area
            filter (floats allowed), or None (the window is the patch).
        window: ``(width, height)`` of the window decoded, ``ceil(read)`` (or ``size``).
        mode: ``"rgb"``, ``"rgba"`` or ``"raw"``.
        shape: ``(height, width, channels)`` of one output patch.
        dtype: the output's dtype (uint8, or the level's for ``raw``).
        batch_size: patches per batch.
        threads: decode threads, or None (the CPU count).
        on_error: ``"raise"`` or ``"fill"``.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    """

    level: PyramidLevel
    locations: np.ndarray
    size: tuple[int, int]
    read: tuple[float, float] | None
    window: tuple[int, int]
    mode: str
    shape: tuple[int, int, int]
    dtype: np.dtype
    batch_size: int
    threads: int | None
    on_error: str
    device: str


def _locations(locations: Any) -> np.ndarray:
    """``locations`` as an ``(n, 2)`` int64 array (integral floats allowed)."""
    try:
        arr = np.asarray(locations)
    except (TypeError, ValueError) as exc:
        raise InvalidRegionError(f"locations must be (x, y) pairs: {exc}") from None
    if arr.size == 0:
        return np.empty((0, 2), np.int64)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise InvalidRegionError(f"locations must be a sequence of (x, y) pairs or an (n, 2) array, "
                                 f"got shape {arr.shape}")
    if arr.dtype.kind in "iu":
        if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
            raise InvalidRegionError("locations beyond the int64 range")
        return arr.astype(np.int64, copy=False)
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all() or (arr != np.floor(arr)).any():
            raise InvalidRegionError("locations must be whole level-0 pixels")
        if np.abs(arr).max() >= 2.0**62:
            raise InvalidRegionError("locations beyond the int64 range")
        return arr.astype(np.int64)
    raise InvalidRegionError(f"locations must be integers, got dtype {arr.dtype}")


def _positive_pair(value: Any, what: str, whole: bool) -> tuple[Any, Any]:
    try:
        a, b = value
    except (TypeError, ValueError):
        raise InvalidRegionError(f"{what} must be a (width, height) pair, got {value!r}") from None
    pair: tuple[float, float]
    if whole:
        pair = (as_int(a, what), as_int(b, what))
    else:
        try:
            if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in (a, b)):
                raise TypeError  # text and bytes too, which float() would take
            pair = (float(a), float(b))
        except (TypeError, ValueError):
            raise InvalidRegionError(f"{what} must be two numbers, got {value!r}") from None
    if not all(math.isfinite(v) and v > 0 for v in pair):
        raise InvalidRegionError(f"{what} must be positive, got {value!r}")
    return pair


def check_patch_request(levels: Sequence[PyramidLevel], locations: Any, size: Any, *, level: Any = 0,
                        read_size: Any = None, batch_size: Any = 64, mode: str = "rgb", threads: Any = None,
                        on_error: str = "raise", device: str = "cpu", channels: Any = None) -> PatchRequest:
    """Validate a batch request; see :meth:`wsitool.Slide.read_patches` for the arguments.

    ``channels`` selects channels of a multi-channel level (as ``read_region``'s);
    the request's ``level`` is then the selection (:meth:`wsitool.model.PyramidLevel.select`).

    Raises:
        InvalidRegionError: a malformed argument (also a ``ValueError``).
        UnsupportedFormatError: ``rgb``/``rgba`` of samples without an RGB conversion,
            or a level whose compression has no decoder.
        ResourceLimitError: one window, or one batch of outputs (or of windows),
            over the configured limits.
    """
    if on_error not in ("raise", "fill"):
        raise InvalidRegionError(f"on_error must be 'raise' or 'fill', got {on_error!r}")
    if device != "cpu":
        from ..cuda import device_index  # InvalidRegionError / DeviceUnavailableError before any decode

        device_index(device)
    w, h = _positive_pair(size, "size", whole=True)
    read = None if read_size is None else _positive_pair(read_size, "read_size", whole=False)
    window = (w, h) if read is None else (math.ceil(read[0]), math.ceil(read[1]))
    if read is not None and window[0] * window[1] > get_limits().max_region_pixels:
        raise ResourceLimitError(f"read_size {read[0]:g}x{read[1]:g} exceeds the max_region_pixels "
                                 f"limit {get_limits().max_region_pixels}")
    # level, mode, decoder and per-window limits: the checks of a region read of one window
    lv = validate_request(levels, (0, 0), level, window, mode, channels)[0]
    if lv.planes is not None and device != "cpu":
        raise InvalidRegionError("multi-channel levels read on the CPU only (device='cpu')")
    shape, dtype = output_shape(lv, (w, h), mode)
    if read is not None:
        if dtype != np.uint8:
            raise InvalidRegionError(f"read_size needs 8-bit samples (the area filter is for uint8); "
                                     f"level {lv.index} is {dtype}")
        if device != "cpu":
            raise InvalidRegionError("read_size reads only on the CPU (device='cpu')")
    b = as_int(batch_size, "batch_size")
    if b < 1:
        raise InvalidRegionError(f"batch_size must be >= 1, got {b}")
    threads = check_threads(threads)
    locs = _locations(locations)
    b_eff = max(1, min(b, len(locs)))
    per_patch = shape[0] * shape[1] * shape[2] * dtype.itemsize
    per_window = 0 if read is None else window[0] * window[1] * shape[2]
    need = b_eff * (per_patch + per_window)
    if need > get_limits().max_region_bytes:
        raise ResourceLimitError(f"a batch of {b_eff} patches needs {need} bytes, over the "
                                 f"max_region_bytes limit {get_limits().max_region_bytes} (lower batch_size)")
    return PatchRequest(lv, locs, (w, h), read, window, mode, shape, dtype, b, threads, on_error, device)
