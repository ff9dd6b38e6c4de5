"""A pyramid level as a lazy Dask array, each chunk one region read, and the slides the tasks read (floor 4).

Dask (the optional ``dask`` extra) is imported inside the functions that build
arrays.  The graph holds the slide's path and a read function (a module-level,
picklable callable, :func:`read_chunk` bound to the facade's opener), never an
open file, so it runs on remote Dask workers; :meth:`wsitool.Slide.to_dask` and
:mod:`wsitool.distributed` build their arrays with :func:`level_array`.

The tasks open slides by path once per process (:func:`cached_slide`).  This
module sits below the facade, so it is handed the facade's opener (an
:data:`Opener`: ``opener(location, storage_options) -> (slide, identity)``)
rather than importing it; the opener is a module-level function, so a task
holding it pickles by reference.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import DaskUnavailableError, InvalidRegionError, WsiError
from ..ground.extras import install_hint
from ..ground.geometry import level0_coordinate
from ..ground.integers import int_pair
from ..model import PyramidLevel
from ..storage import is_url
from .request import level_index

__all__ = ["INSTALL_HINT", "import_dask_array", "level_array", "Opener", "cached_slide", "file_stamp",
           "read_chunk", "chunk_read_count"]

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


def level_array(levels: Sequence[PyramidLevel], path: str, level: int, read_chunk: Callable[..., np.ndarray], *,
                stamp: tuple, chunks: Any = "tile", threads: int = 1) -> Any:
    """Level ``level`` of a pyramid as a lazy ``dask.array.Array``.

    Args:
        levels: the pyramid's levels (geometry only is used here).
        path: the slide's absolute path, put into the graph.
        level: level index.
        read_chunk: ``read_chunk(path, stamp, level, x0, y0, w, h, threads)`` ->
            ``(h, w, 3)`` uint8, ``(x0, y0)`` in level-0 pixels and ``(w, h)`` in
            pixels of the level; called by each task.
        stamp: ``(mtime_ns, size)`` of the file when the array was built (the
            read function refuses a changed file).
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

    level = level_index(level, len(levels), path)  # the rule read_region applies
    lv = levels[level]
    rows, cols = _chunk_shape(lv, chunks)
    ychunks = _axis_chunks(lv.height, rows)
    xchunks = _axis_chunks(lv.width, cols)
    name = "wsitool-level-" + tokenize(path, stamp, level, rows, cols, threads)
    dsk: dict[Any, Any] = {}
    y = 0
    for i, h in enumerate(ychunks):
        x = 0
        y0 = level0_coordinate(y, lv.downsample)
        for j, w in enumerate(xchunks):
            dsk[(name, i, j, 0)] = (read_chunk, path, stamp, level, level0_coordinate(x, lv.downsample),
                                    y0, w, h, threads)
            x += w
        y += h
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
    return da.Array(graph, name, (ychunks, xchunks, (3,)), dtype=np.uint8,
                    meta=np.empty((0, 0, 0), np.uint8))


# ---------------------------------------------------------------------- slides by path, for the tasks


#: ``opener(location, storage_options) -> (slide, identity)``: the facade's way to open a
#: slide for tasks (a module-level function: tasks pickle it by reference); ``identity``
#: is ``(url, size, etag)`` for a URL (:meth:`wsitool.storage.remote.RemoteSource.identity`).
Opener = Callable[[str, "dict | None"], "tuple[Any, tuple]"]


def _stamp(path: str) -> tuple[int, int]:
    """``(mtime_ns, size in bytes)`` of ``path``; identifies one version of a file."""
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=16)
def _open_cached(opener: Opener, path: str, stamp: tuple[int, int]) -> Any:
    return opener(path, None)[0]


#: storage options of the URLs opened in this process, for the slides cached_slide opens by URL
_url_options: dict[str, dict | None] = {}
#: (url, options key) -> (slide, identity); the 16 used last (an evicted or replaced slide is
#: not closed here: a task may still read it; it closes when the last reference goes)
_remote_slides: dict[tuple[str, str], tuple[Any, tuple]] = {}
#: (url, options key) -> the lock one thread holds while it opens that slide (the others wait
#: and take its slide instead of opening, and closing, their own)
_opening: dict[tuple[str, str], threading.Lock] = {}
_remote_lock = threading.Lock()
#: most slides held by URL
REMOTE_HELD = 16


def remember_options(url: str, options: dict | None) -> None:
    """Keep the storage options ``url`` was opened with, for the tasks that open it again here."""
    with _remote_lock:
        _url_options[url] = options


def _options_key(options: dict | None) -> str:
    """A text that two equal option mappings share (values of any type, compared as text)."""
    return json.dumps(options, sort_keys=True, default=repr)


def _cached_remote(opener: Opener, url: str, stamp: Sequence | None,
                   storage_options: dict | None = None) -> tuple[Any, tuple]:
    """:func:`cached_slide` of a URL, with its identity: keyed by the URL and its storage
    options (a task with other options, new credentials say, gets a slide opened with them),
    checked against ``(url, size, etag)``.  Threads asking for the same slide at once open it
    once."""
    with _remote_lock:
        if storage_options is not None:
            _url_options[url] = dict(storage_options)
        options = _url_options.get(url)
        key = (url, _options_key(options))
        opening = _opening.setdefault(key, threading.Lock())
    with opening:
        with _remote_lock:
            held = _remote_slides.get(key)
            if held is not None and not held[0].closed and (stamp is None or held[1] == tuple(stamp)):
                _remote_slides[key] = _remote_slides.pop(key)  # (the most recently used last)
                return held
        fresh, now = opener(url, options)
        if stamp is not None and tuple(stamp) != now:
            fresh.close()
            raise WsiError(f"{fresh.path}: the object changed since the task was built (size/ETag "
                           f"{tuple(stamp)[1:]} -> {now[1:]}); rebuild the Dask array")
        with _remote_lock:
            _remote_slides.pop(key, None)
            _remote_slides[key] = (fresh, now)
            while len(_remote_slides) > REMOTE_HELD:
                gone = next(iter(_remote_slides))
                del _remote_slides[gone]
                _opening.pop(gone, None)
        return fresh, now


def cached_slide(opener: Opener, path: str | os.PathLike, stamp: Sequence | None = None,
                 storage_options: dict | None = None) -> Any:
    """This process's shared open slide for ``path``, opened with ``opener``
    (:func:`wsitool.slide.cached_slide` binds the facade's; its contract is there).

    Raises:
        WsiError: ``stamp`` is given and the file (object) changed since it was taken.
        FileNotFoundError, UnsupportedFormatError, CorruptFileError: as the opener.
    """
    if is_url(path):
        return _cached_remote(opener, str(path), stamp, storage_options)[0]
    path = os.path.abspath(os.fspath(path))
    now = _stamp(path)
    if stamp is not None and tuple(stamp) != now:
        raise WsiError(
            f"{path}: the file changed since the task was built (mtime/size "
            f"{tuple(stamp)} -> {now}); rebuild the Dask array"
        )
    return _open_cached(opener, path, now)


def file_stamp(opener: Opener, path: str | os.PathLike) -> tuple:
    """``(mtime_ns, size in bytes)`` of ``path``, as :func:`cached_slide` compares it
    (a URL: ``(url, size, etag)`` of the object, opened through :func:`cached_slide`)."""
    if is_url(path):
        return _cached_remote(opener, str(path), None)[1]
    return _stamp(os.path.abspath(os.fspath(path)))


_chunk_reads = 0
_chunk_reads_lock = threading.Lock()


def chunk_read_count() -> int:
    """Number of chunk reads done by Dask arrays of levels (:func:`read_chunk`) in this process."""
    return _chunk_reads


def read_chunk(path: str, stamp: tuple, level: int, x0: int, y0: int, w: int, h: int, threads: int, *,
               opener: Opener, storage_options: dict | None = None) -> np.ndarray:
    """Dask task: one chunk ``(h, w, 3)`` uint8 of a level, read by path.

    ``(x0, y0)`` is the chunk's top-left in level-0 pixels, ``(w, h)`` its size in
    pixels of ``level``; ``stamp`` as in :func:`cached_slide`.  Bind ``opener``
    (``functools.partial(read_chunk, opener=...)``) to get the ``read_chunk``
    :func:`level_array` takes; a URL's ``storage_options`` are bound the same way, so
    that a worker in another process opens the slide as the array's maker did.
    """
    global _chunk_reads
    slide = cached_slide(opener, path, stamp, storage_options)
    with _chunk_reads_lock:
        _chunk_reads += 1
    return slide.read_region((x0, y0), level, (w, h), mode="rgb", threads=threads)
