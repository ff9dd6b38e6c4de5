"""Reads of multi-channel (fluorescence) levels: channel selection, stacking, the composite (floor 4).

A multi-channel :class:`~wsitool.model.PyramidLevel` holds one single-sample plane
per channel (:attr:`~wsitool.model.PyramidLevel.planes`), each an ordinary level with
its own tiles.  A read fills each selected plane through the usual tile path
(:func:`wsitool.read.fill.fill_region` in ``raw`` mode: the compiled JPEG
loop never applies to one-sample planes, the decoded-tile cache keys each plane
apart) and then:

* ``raw``: ``(h, w, C)`` in the level's dtype, channel ``k`` of the selection
  in ``[..., k]``, values exactly as stored;
* ``rgb`` / ``rgba``: the composite, ``(h, w, 3 | 4)`` uint8: each channel's
  value is scaled to 0..255 (:func:`to_8bit`), mapped through its
  :meth:`~wsitool.model.Channel.table` (its palette, or the ramp from black to
  its display colour), the channels' colours are added and clipped at 255.
  Alpha is 255 inside the level and 0 outside it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidRegionError
from ..model import PyramidLevel

__all__ = ["select_channels", "fill_channels", "composite", "to_8bit"]


def select_channels(lv: PyramidLevel, channels: Any) -> PyramidLevel:
    """``lv`` restricted to ``channels`` (None: all), by index or name, in the order given.

    Args:
        lv: a level of the slide.
        channels: None, or an int / str or a sequence of ints (``0 .. C-1``,
            negative counts from the end) and names (``Channel.name``, exact,
            then case-insensitive).

    Returns:
        ``lv`` itself for None, else a :class:`PyramidLevel` with the chosen planes.

    Raises:
        InvalidRegionError: ``channels`` on a level that is not multi-channel, an
            empty selection, an unknown name or an index out of range.
    """
    if channels is None:
        return lv
    if lv.planes is None:
        raise InvalidRegionError(f"channels= applies to multi-channel slides; level {lv.index} "
                                 f"has {lv.samples} {lv.photometric} sample(s) without channels")
    items = [channels] if isinstance(channels, (int, str, np.integer)) else list(channels)
    if not items:
        raise InvalidRegionError("channels= selects no channel")
    names = [c.name for c in lv.channels]
    count = len(names)
    picked: list[int] = []
    for item in items:
        if isinstance(item, (bool, np.bool_)):
            raise InvalidRegionError(f"channel {item!r} is neither an index nor a name")
        if isinstance(item, (int, np.integer)):
            k = int(item)
            if not -count <= k < count:
                raise InvalidRegionError(f"channel {k} out of range (the slide has {count} "
                                         f"channel(s): 0..{count - 1})")
            picked.append(k % count)
        elif isinstance(item, str):
            found = _by_name(names, item)
            if found is None:
                raise InvalidRegionError(f"no channel named {item!r} (channels: {', '.join(names)})")
            picked.append(found)
        else:
            raise InvalidRegionError(f"channel {item!r} is neither an index nor a name")
    return lv.select(picked)


def _by_name(names: Sequence[str], name: str) -> int | None:
    if name in names:
        return names.index(name)
    folded = [n.casefold() for n in names]
    return folded.index(name.casefold()) if name.casefold() in folded else None


def to_8bit(plane: np.ndarray) -> np.ndarray:
    """A channel's values as uint8 0..255 for the composite: uint8 as is; wider unsigned
    integers scaled by their dtype's range (``v * 255 // max``); signed integers below 0
    as 0; floats clipped to 0..1 then times 255."""
    if plane.dtype == np.uint8:
        return plane
    if plane.dtype.kind in "ui":
        top = np.iinfo(plane.dtype).max
        wide = np.clip(plane.astype(np.int64), 0, top)
        return (wide * 255 // top).astype(np.uint8)
    return (np.clip(np.nan_to_num(plane.astype(np.float64)), 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def composite(raw: np.ndarray, lv: PyramidLevel, out: np.ndarray) -> None:
    """Write the composite of ``raw`` (``(h, w, C)``, the channels of ``lv`` in order) into
    ``out[..., :3]`` (uint8): the sum of each channel's table entry, clipped at 255."""
    acc = np.zeros((*raw.shape[:2], 3), np.uint16)
    for k, channel in enumerate(lv.channels):
        acc += channel.table()[to_8bit(raw[..., k])]
    np.minimum(acc, 255, out=acc)
    out[..., :3] = acc


def fill_channels(fill_plane: Callable[[PyramidLevel, np.ndarray], None], lv: PyramidLevel, mode: str, rx: int, ry: int,
                  out: np.ndarray) -> None:
    """Fill ``out`` (``(h, w, c)``) with the rectangle at ``(rx, ry)`` (pixels of ``lv``) of the
    multi-channel level ``lv`` in ``mode`` (see the module's notes); ``fill_plane(plane, buffer)``
    fills an ``(h, w, 1)`` buffer with that rectangle of one plane in ``raw`` mode (the region
    read of :func:`wsitool.read.fill.fill_region`)."""
    h, w = out.shape[:2]
    planes = lv.planes
    assert planes is not None  # (the caller's test)
    if mode == "raw" and len(planes) == 1:
        fill_plane(planes[0], out)
        return
    raw = out if mode == "raw" else np.empty((h, w, len(planes)), lv.dtype)
    scratch = np.empty((h, w, 1), lv.dtype)
    for k, plane in enumerate(planes):
        fill_plane(plane, scratch)
        raw[..., k] = scratch[..., 0]
    if mode == "raw":
        return
    composite(raw, lv, out)
    if mode == "rgba":
        out[..., 3] = 0
        x0, y0 = max(rx, 0), max(ry, 0)
        x1, y1 = min(rx + w, lv.width), min(ry + h, lv.height)
        if x1 > x0 and y1 > y0:
            out[y0 - ry:y1 - ry, x0 - rx:x1 - rx, 3] = 255
