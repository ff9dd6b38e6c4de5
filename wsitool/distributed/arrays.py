"""Lazy Dask arrays of slide levels, by path (floor 7); built by :meth:`wsitool.Slide.to_dask`
(:func:`wsitool.read.lazy.level_array`)."""

from __future__ import annotations

from ..slide import Slide
from .held import cached_slide


def level_to_dask(slide, level: int = 0, *, chunks="tile", threads: int = 1):
    """A level of a slide as a lazy ``dask.array.Array`` ``(height, width, 3)`` uint8.

    Args:
        slide: an open :class:`~wsitool.slide.Slide`, a path or a slide URL.  Only its
            location goes into the graph; each worker process opens it once
            (:func:`~wsitool.distributed.held.cached_slide`).
        level, chunks, threads: as :meth:`wsitool.Slide.to_dask`.

    Raises:
        DaskUnavailableError: ``dask[array]`` is not installed.
        InvalidRegionError: bad level or chunks.
        WsiError: at compute time, the file changed since the array was built.
    """
    if not isinstance(slide, Slide):
        slide = cached_slide(slide)
    return slide.to_dask(level, chunks=chunks, threads=threads)


