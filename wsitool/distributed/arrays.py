"""Lazy Dask arrays of slide levels, by path (floor 7); built by :func:`wsitool.read.lazy.level_array`."""

from __future__ import annotations

import os

from ..read.lazy import level_array
from ..slide import Slide, cached_slide, file_stamp, read_chunk_by_path


def level_to_dask(slide, level: int = 0, *, chunks="tile", threads: int = 1):
    """A level of a slide as a lazy ``dask.array.Array`` ``(height, width, 3)`` uint8.

    Args:
        slide: an open :class:`~wsitool.slide.Slide` or a path.  Only its path
            goes into the graph; each worker process opens it once
            (:func:`~wsitool.slide.cached_slide`).
        level, chunks, threads: as :func:`wsitool.read.lazy.level_array`.

    Raises:
        DaskUnavailableError: ``dask[array]`` is not installed.
        InvalidRegionError: bad level or chunks.
        WsiError: at compute time, the file changed since the array was built.
    """
    if isinstance(slide, Slide):
        path = os.path.abspath(slide.path)
        lvls = slide.levels
    else:
        path = os.path.abspath(os.fspath(slide))
        lvls = cached_slide(path).levels
    return level_array(lvls, path, level, read_chunk_by_path, stamp=file_stamp(path),
                       chunks=chunks, threads=threads)


