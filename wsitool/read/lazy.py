"""A pyramid level as a lazy Dask array, each chunk one region read (floor 4).

Dask (the optional ``dask`` extra) is imported inside the functions that build
arrays.  The graph holds the slide's location and identity and a read function
(a module-level, picklable callable:
:func:`wsitool.opening.held.read_chunk` bound to the facade's opener), never an
open file, so it runs on remote Dask workers; :meth:`wsitool.Slide.to_dask` and
:mod:`wsitool.distributed` build their arrays with :func:`level_array`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import DaskUnavailableError, InvalidRegionError
from ..ground.extras import install_hint
from ..ground.geometry import level0_coordinate
from ..ground.integers import int_pair
from ..model import PyramidLevel
from .request import level_index

__all__ = ["INSTALL_HINT", "import_dask_array", "level_array"]

INSTALL_HINT = "install the optional Dask extra: " + install_hint("dask")


def import_dask_array() -> Any:
    """``dask.array``, or :class:`DaskUnavailableError` naming the extra to install."""
    try:
        import dask.array as da
    except ImportError as exc:
        raise DaskUnavailableError(f"Dask arrays need dask[array] ({exc}); {INSTALL_HINT}") from None
    return da


def _axis_chunks(total: int, step: int) -> tuple[int, ...]:
    full, rest = divmod(total, step)
    return (step,) * full + ((rest,) if rest else ())


def _chunk_shape(level: PyramidLevel, chunks: Any) -> tuple[int, int]:
    if isinstance(chunks, str):
        if chunks != "tile":
            raise InvalidRegionError(f"chunks must be 'tile', an int or (rows, cols), got {chunks!r}")
        # Whole tiles, grown to at least 128 px a side so tiny tiles do not
        # make millions of tasks; no tile is ever read by two chunks.
        th, tw = level.tile_height, level.tile_width
        return th * max(1, -(-128 // th)), tw * max(1, -(-128 // tw))
    if isinstance(chunks, (int, np.integer)) and not isinstance(chunks, bool):
        rows = cols = int(chunks)
    else:
        rows, cols = int_pair(chunks, "chunks")
    if rows <= 0 or cols <= 0:
        raise InvalidRegionError(f"chunks must be positive, got {chunks!r}")
    return rows, cols


def level_array(levels: Sequence[PyramidLevel], location: Any, level: int, read_chunk: Callable[..., np.ndarray],
                *, stamp: tuple, chunks: Any = "tile", threads: int = 1) -> Any:
    """Level ``level`` of a pyramid as a lazy ``dask.array.Array``.

    Args:
        levels: the pyramid's levels (geometry only is used here).
        location: where each task opens the slide (a picklable
            :class:`~wsitool.opening.location.Location`, local paths absolute), put into the
            graph; its ``str`` names the slide in messages.
        level: level index.
        read_chunk: ``read_chunk(location, stamp, level, x0, y0, w, h, threads)`` ->
            ``(h, w, 3)`` uint8, ``(x0, y0)`` in level-0 pixels and ``(w, h)`` in
            pixels of the level; called by each task.
        stamp: the slide's identity when the array was built (the read function refuses
            a changed slide: :func:`wsitool.opening.opener.slide_identity`).
        chunks: ``"tile"`` (default): whole tiles of the level, several tiles
            per chunk only where a tile is under 128 px a side (a stripped
            level's "tile" is a band of whole strips, full width); an int
            ``n`` for ``n x n`` chunks; or ``(rows, cols)`` in level pixels.
            Chunks aligned to the tile grid read every tile once.
        threads: decode threads per chunk read (default 1: Dask already runs
            chunks in parallel).

    Returns:
        ``dask.array.Array`` of shape ``(height, width, 3)``, dtype uint8,
        chunked ``(rows, cols, 3)``; slicing it computes only the chunks the
        slice overlaps.

    Raises:
        DaskUnavailableError: ``dask[array]`` is not installed.
        InvalidRegionError: bad level or chunks.
    """
    da = import_dask_array()
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    level = level_index(level, len(levels))  # the rule read_region applies
    lv = levels[level]
    rows, cols = _chunk_shape(lv, chunks)
    ychunks = _axis_chunks(lv.height, rows)
    xchunks = _axis_chunks(lv.width, cols)
    name = "wsitool-level-" + tokenize(location.target, stamp, level, rows, cols, threads)
    dsk: dict[Any, Any] = {}
    y = 0
    for i, h in enumerate(ychunks):
        x = 0
        y0 = level0_coordinate(y, lv.downsample)
        for j, w in enumerate(xchunks):
            dsk[(name, i, j, 0)] = (read_chunk, location, stamp, level, level0_coordinate(x, lv.downsample),
                                    y0, w, h, threads)
            x += w
        y += h
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
    return da.Array(graph, name, (ychunks, xchunks, (3,)), dtype=np.uint8,
                    meta=np.empty((0, 0, 0), np.uint8))
