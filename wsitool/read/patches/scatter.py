"""The compiled path of a batch: each run decoded and its pieces copied into the patches in C (floor 4)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...codec import jpegloop
from ..cache import CacheScope
from ..plan import ends_one_column_into_a_tile
from .request import PatchRequest
from .runs import Task

__all__ = ["SCATTER_TILES", "native_scatter"]


#: Tiles per call of the compiled loop when it also copies the pieces (:func:`native_scatter`)
#: of RGBA patches: 4 tiles of 240 x 240 (900 KiB) decoded into the run buffer are still in a
#: 1 MiB L2 cache when they are copied.  RGB tiles are decoded one at a time into the loop's
#: tile scratch and their pieces copied from it at once, a whole run a call.
SCATTER_TILES = 4


def _pieces_array(pieces: np.ndarray, into: np.ndarray) -> np.ndarray:
    """``pieces`` (as :class:`Task`'s) as :func:`wsitool.codec.jpegloop.scatter` takes them,
    ``(k, 6)`` int64, for windows in ``into`` (``(b, h, w, c)`` uint8, C-contiguous)."""
    patch, stride, px = into.strides[:3]
    out = np.empty((len(pieces), 6), np.int64)
    out[:, 0] = pieces[:, 0] * patch + pieces[:, 1] * stride + pieces[:, 3] * px
    out[:, 1] = stride
    out[:, 2:] = pieces[:, 5:]
    return out


def native_scatter(req: PatchRequest, dest: Any, dest_next: Any,
                    cache: CacheScope | None) -> Callable[[Task, np.ndarray, Any], bool] | None:
    """The compiled path of one batch, or None where it does not apply (a decoded-tile cache,
    multi-channel or non-JPEG levels, the loop not loaded or switched off, ``dest`` or
    ``dest_next`` not a C-contiguous uint8 numpy array).

    The function returned, ``(task, buf, pool) -> bool``, decodes a fresh task's run and
    copies its pieces into ``dest`` and ``dest_next``; the run's pixels land in ``buf``
    (``(h, w, c)`` uint8) only where the task keeps the run (``task.keep``: RGB tiles are
    otherwise decoded into the loop's tile scratch and copied from there).  For a carried
    task (its pixels in ``buf``) it copies the next pieces.  It returns False, having done
    nothing, for a fresh run the loop does not take (:func:`~wsitool.read.fill.fill_region`'s
    rule).  Raises as :meth:`wsitool.codec.jpegloop.RegionJobs.run`."""
    lv = req.level
    if cache is not None or lv.planes is not None:
        return None
    for a in (dest, dest_next):
        if a is not None and (type(a) is not np.ndarray or a.dtype != np.uint8 or not a.flags.c_contiguous):
            return None
    probe = np.empty((1, 1, req.shape[2]), np.uint8)
    if not jpegloop.applies(lv, req.mode, probe):
        return None

    def decode_and_copy(task: Task, buf: np.ndarray, pool: Any) -> bool:
        x0, y0, x1, y1 = task.run.rect
        if task.fresh and ends_one_column_into_a_tile(lv, x0, x1 - x0):
            return False
        ahead = () if not len(task.next_pieces) else (dest_next, _pieces_array(task.next_pieces, dest_next))
        if not task.fresh:
            if ahead:
                jpegloop.scatter(buf, *ahead)
            return True
        region = jpegloop.RegionJobs(lv, buf, x0, y0, (x0, y0, x1, y1), "raise")  # (failures: one by one)
        region.chunk = SCATTER_TILES if buf.shape[2] != 3 else min(region.count, jpegloop.MAX_CHUNK)
        region.scatter = (dest, _pieces_array(task.pieces, dest), task.keep, *ahead)
        region.run(pool)  # (its tiles advised with the batch's: PatchReader._advise)
        return True

    return decode_and_copy
