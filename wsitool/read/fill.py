"""Filling the caller's buffer with a validated region: outside parts, read-ahead, threads, and the choice of
tile path (floor 4).

The request (:class:`~wsitool.read.request.ReadRequest`) carries the location
already mapped to the level's frame by the nearest level pixel
(:func:`wsitool.ground.geometry.level_rect`); the part of the region inside the level
is planned tile by tile (:func:`wsitool.ground.geometry.plan_tiles`) and the parts
outside are filled with transparent black (RGBA ``0, 0, 0, 0``; 0 in ``rgb``
and ``raw`` modes).  The byte source is asked to read the tiles' bytes ahead,
then the jobs are shared by ``threads`` workers (:mod:`.threads`) running the
compiled JPEG loop where it applies, else the Python path (:mod:`.worker`).

With a decoded-tile cache (:mod:`.cache`) the same plan is filled from cached
whole tiles instead (:func:`_fill_cached`); misses are decoded on the Python
path, so the compiled loop does not apply to cached reads.  Without one the
path is the one above, unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..codec import jpegloop
from ..codec.pool import DecoderPool
from ..errors import TileDecodeError, TileWarning
from ..ground.geometry import TileJob, plan_tiles
from ..model import PyramidLevel
from .cache import CacheScope
from .channels import fill_channels
from .request import ReadRequest
from .threads import batch_size, run_jobs, run_threads, thread_count
from .worker import BATCH_TILES, TileWorker, decode_tile

__all__ = ["fill_outside", "fill_region", "advise_tiles", "NATIVE_BATCH_RGB", "NATIVE_BATCH_RGBA"]


def fill_outside(out: Any, rx: int, ry: int, inside: tuple[int, int, int, int] | None) -> None:
    """Zero the parts of ``out`` (the region at level pixel ``(rx, ry)``) outside the level's
    rectangle ``inside`` (``(x0, y0, x1, y1)`` in level pixels; None: all of it)."""
    if inside is None:
        out[...] = 0
        return
    cx0, cy0, cx1, cy1 = inside
    top, bottom = cy0 - ry, cy1 - ry
    left, right = cx0 - rx, cx1 - rx
    if top == 0 and left == 0 and bottom == out.shape[0] and right == out.shape[1]:
        return  # the region lies inside the level (the common case)
    out[:top] = 0
    out[bottom:] = 0
    out[top:bottom, :left] = 0
    out[top:bottom, right:] = 0


#: Regions touching fewer tiles are not prefetched (the first decode would
#: wait for its bytes anyway, and the advice calls cost more than they save).
_PREFETCH_MIN_TILES = 8


def _prefetch(lv: PyramidLevel, c0: int, c1: int, r0: int, r1: int) -> None:
    """Ask the byte source to start reading the tile bytes of columns ``c0..c1`` and
    rows ``r0..r1`` (inclusive) of ``lv``'s grid (``ByteSource.advise``; for a
    local file ``POSIX_FADV_WILLNEED``).

    The read-ahead runs while the first tiles decode, so a cold file's reads
    overlap the decodes; on a cached file it costs one cheap call per tile row
    of the region (the tiles of one grid row are usually adjacent in the file;
    when they are not, each tile gets its own range).  Advisory only.
    """
    advise_tiles(lv, [(c0, c1, r0, r1)])


def advise_tiles(lv: PyramidLevel, blocks: Iterable[tuple[int, int, int, int]], ahead: bool = False) -> None:
    """Advise the byte source of the tiles of every ``(c0, c1, r0, r1)`` block (columns
    ``c0..c1`` and rows ``r0..r1`` of ``lv``'s grid, inclusive) in one call, so that a
    remote source merges the ranges of neighbouring blocks into one request
    (:meth:`wsitool.storage.remote.RemoteSource.advise`; ``ahead``: read-ahead for a later
    batch, which the source may skip).  Nothing for a level of several planes.  Advisory only."""
    if lv.tiles.planes != 1:
        return
    ranges: list[tuple[int, int]] = []
    for c0, c1, r0, r1 in blocks:
        ranges.extend(_tile_ranges(lv, c0, c1, r0, r1))
    if ranges:
        lv.source.advise(ranges, ahead)


def _tile_ranges(lv: PyramidLevel, c0: int, c1: int, r0: int, r1: int) -> list[tuple[int, int]]:
    """The ``(offset, count)`` ranges of a block's tiles: a tile row's as one range where
    its tiles lie close together in the file, else one per tile (frames by number for a
    framed source)."""
    offsets, counts, across = lv.tiles.offsets, lv.tiles.bytecounts, lv.tiles_across
    ranges: list[tuple[int, int]] = []
    if lv.source.framed:  # frames by number (DICOMweb): exactly the region's, in one request
        for row in range(r0, r1 + 1):
            ranges.extend((off, 1) for off in offsets[row * across + c0:row * across + c1 + 1].tolist() if off)
        return ranges
    # the rows at once (an NDPI region has a hundred rows of restart intervals: numpy calls
    # row by row were a millisecond of each 1024 x 1024 read, under the GIL)
    n = r1 - r0 + 1
    offs = offsets[r0 * across:(r1 + 1) * across].reshape(n, across)[:, c0:c1 + 1]
    cnts = counts[r0 * across:(r1 + 1) * across].reshape(n, across)[:, c0:c1 + 1]
    ends = offs + cnts
    lo, hi = offs.min(1), ends.max(1)
    whole = ((lo > 0) & (hi - lo <= 2 * cnts.sum(1))).tolist()
    for r, (a, b, one) in enumerate(zip(lo.tolist(), hi.tolist(), whole, strict=True)):
        if one:
            ranges.append((a, b - a))
        else:
            ranges.extend((off, end - off) for off, end in zip(offs[r].tolist(), ends[r].tolist(), strict=True)
                          if off)
    return ranges


def fill_region(req: ReadRequest, out: np.ndarray, pool: DecoderPool, cache: CacheScope | None = None) -> None:
    """Decode every tile of the full-scale region ``req`` (its location in pixels of
    ``req.level``) into ``out`` (already validated); ``pool``: the CPU decoder pool.

    Work distribution: the jobs sit in one shared iterator; each of the ``k``
    threads (the caller plus ``k - 1`` pool workers) takes the next job when it
    has finished its last one, so threads that drew cheap partial tiles do not
    wait idle for one that drew whole ones.  Where the compiled JPEG tile loop
    applies (:func:`wsitool.codec.jpegloop.applies`) the same plan runs through it
    (:func:`_fill_native`); else on :class:`~wsitool.read.worker.TileWorker`, the reference.
    ``cache``: a :class:`~wsitool.read.cache.CacheScope`, or None (no cache).
    A multi-channel level fills plane by plane (:func:`wsitool.read.channels.fill_channels`).
    """
    lv, mode = req.level, req.mode
    if lv.planes is not None:
        def fill_plane(plane: PyramidLevel, buf: np.ndarray) -> None:
            fill_region(dataclasses.replace(req, level=plane, mode="raw"), buf, pool, cache)

        fill_channels(fill_plane, lv, mode, req.x, req.y, out)
        return
    if cache is not None:
        _fill_cached(req, out, pool, cache)
        return
    # a remote slide: its tiles' bytes requested first (merged, in flight at once), whichever path reads them
    hint = _prefetch_remote(req) if lv.source.remote else None
    if (jpegloop.applies(lv, mode, out, hint, advised=lv.source.remote)
            and not _ends_one_column_into_a_tile(lv, req.x, req.width)):
        _fill_native(req, out, pool, prefetched=lv.source.remote)
        return
    rx, ry = req.x, req.y
    inside, jobs = plan_tiles(lv, rx, ry, req.width, req.height)
    fill_outside(out, rx, ry, inside)
    if not jobs:
        return
    if len(jobs) >= _PREFETCH_MIN_TILES and not lv.source.remote:
        _prefetch(lv, jobs[0].col, jobs[-1].col, jobs[0].row, jobs[-1].row)
    k = thread_count(req.threads, len(jobs))
    # JPEG 2000 tiles are not batched: each takes milliseconds to decode, so
    # one call per tile costs nothing measurable, and handing out single tiles
    # keeps the threads evenly loaded (2 threads, 1024 x 1024 regions of
    # 256 x 256 tiles: 25.4 MP/s with batches of 6, 29.0 MP/s tile by tile
    # even for RGBA).
    batch = 1 if lv.encoding.stream == "j2k" else batch_size(BATCH_TILES, k, len(jobs))
    run_jobs(jobs, k, TileWorker(lv, out, mode, req.on_error, pool, batch).run)


#: Tiles per call of the compiled loop (and per nvImageCodec decode call):
#: RGB decodes straight into the output; RGBA decodes into one RGB scratch per
#: tile of the batch and widens it, so a small batch keeps the scratch in cache
#: (1024 x 1024 regions, one thread: batch 4 at 1.06x the decode floor, 16 at 1.04x).
NATIVE_BATCH_RGB = 16


NATIVE_BATCH_RGBA = 4


#: Largest RGB tile (bytes) decoded in RGBA batches; bigger ones go one by one.
_NATIVE_RGBA_BATCH_BYTES = 1 << 20


def _ends_one_column_into_a_tile(lv: PyramidLevel, rx: int, w: int) -> bool:
    """True when the region's last column is the first column of a tile: that tile's
    window is one column at its left edge, which the Python path decodes whole and
    crops where the code stream is wider (:func:`wsitool.codec.nvdecode.narrow_jpeg_crop`);
    the compiled loop has no such route, so these regions take the Python path."""
    last = min(rx + w, lv.width) - 1
    return last >= max(rx, 0) and last % lv.tile_width == 0


def _prefetch_remote(req: ReadRequest) -> int | None:
    """Advise the tile ranges of ``req``'s region (a remote slide's level, one plane); the index
    of its first tile, or None where the region holds no tile."""
    lv = req.level
    inside, _ = plan_tiles(lv, req.x, req.y, req.width, req.height, jobs=False)
    if inside is None or lv.tiles.planes != 1:
        return None
    cx0, cy0, cx1, cy1 = inside
    tw, th = lv.tile_width, lv.tile_height
    _prefetch(lv, cx0 // tw, (cx1 - 1) // tw, cy0 // th, (cy1 - 1) // th)
    return (cy0 // th) * lv.tiles_across + cx0 // tw


def _fill_native(req: ReadRequest, out: np.ndarray, pool: DecoderPool, prefetched: bool = False) -> None:
    """:func:`fill_region` through the compiled JPEG tile loop (see :mod:`wsitool.codec.jpegloop`):
    the same tiles, threads, batches, checks and counters, one C call per batch; a remote
    slide's tiles from its fetched ranges (``prefetched``: already advised)."""
    lv, mode, rx, ry = req.level, req.mode, req.x, req.y
    inside, _ = plan_tiles(lv, rx, ry, req.width, req.height, jobs=False)
    fill_outside(out, rx, ry, inside)
    if inside is None:
        return
    most = NATIVE_BATCH_RGB
    if mode == "rgba":
        # one RGB scratch per tile of a batch: big tiles go one at a time, so
        # the scratch stays one tile (peak memory near the output's size)
        most = NATIVE_BATCH_RGBA if lv.tile_width * lv.tile_height * 3 <= _NATIVE_RGBA_BATCH_BYTES else 1
    if lv.encoding.jpeg_scan_segments:
        # NDPI restart intervals (one MCU row high) are small, and the loop decodes a call's
        # whole rows of them as one spliced code stream: fewer, larger calls
        most = jpegloop.MAX_CHUNK
    region = jpegloop.RegionJobs(lv, out, rx, ry, inside, req.on_error)
    if region.count >= _PREFETCH_MIN_TILES and not prefetched:
        _prefetch(lv, region.c0, region.c0 + region.ncols - 1, region.r0, region.r0 + region.nrows - 1)
    k = thread_count(req.threads, region.count)
    # A call of the compiled loop costs a few microseconds: smaller chunks than
    # the Python path's balance the threads better (2 threads, 1024 x 1024
    # regions of 240 x 240 tiles: 249 MP/s with about 4 chunks per thread, 241
    # with 2).
    region.chunk = min(batch_size(most, k, region.count, per_thread=4), jpegloop.MAX_CHUNK)
    run_threads(k, lambda: region.run(pool), region.stop)


def _fill_cached(req: ReadRequest, out: np.ndarray, pool: DecoderPool, cache: CacheScope) -> None:
    """:func:`fill_region` from the decoded-tile cache ``cache`` (a :class:`~wsitool.read.cache.CacheScope`).

    The same plan, threads and job sharing; each job copies its part of the
    cached whole tile, decoding it first on a miss (:func:`~wsitool.read.worker.decode_tile`,
    the Python path).  A corrupt tile raises, or with ``on_error="fill"`` becomes
    background with a :class:`~wsitool.errors.TileWarning` (failed tiles are
    never cached; the decode that failed counted it in ``tiles_failed``).
    """
    lv, mode, on_error, rx, ry = req.level, req.mode, req.on_error, req.x, req.y
    inside, jobs = plan_tiles(lv, rx, ry, req.width, req.height)
    fill_outside(out, rx, ry, inside)
    if not jobs:
        return
    index = lv.cache_key  # the level's index, or (index, plane) for a channel's plane
    if lv.source.framed:  # (DICOMweb: the region's frames in one request, not one per miss)
        _prefetch(lv, jobs[0].col, jobs[-1].col, jobs[0].row, jobs[-1].row)

    def work(todo: Iterable[TileJob]) -> None:
        for job in todo:
            col, row = job.col, job.row
            try:
                tile = cache.tile(index, col, row, mode, functools.partial(decode_tile, lv, col, row, mode, pool))
            except TileDecodeError as exc:
                if on_error != "fill":
                    raise
                warnings.warn(str(exc), TileWarning, stacklevel=2)
                job.view(out)[...] = 0
                continue
            sx0, sy0, sx1, sy1 = job.src
            job.view(out)[...] = tile[sy0:sy1, sx0:sx1]

    run_jobs(jobs, thread_count(req.threads, len(jobs)), work)
