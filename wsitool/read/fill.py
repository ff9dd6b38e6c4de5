"""Filling the caller's buffer with a validated region: outside parts, read-ahead, threads, and the choice of
tile path (floor 4).

The request (:class:`~wsitool.read.request.ReadRequest`) carries the location
already mapped to the level's frame by the nearest level pixel
(:func:`wsitool.ground.geometry.level_rect`); the region is planned once
(:class:`~wsitool.read.plan.TilePlan`) and the parts outside the level are filled with
transparent black (RGBA ``0, 0, 0, 0``; 0 in ``rgb`` and ``raw`` modes).  The byte source
is told the tiles the plan reads (:meth:`~wsitool.read.plan.TilePlan.advise`: it decides
what to do), then the plan goes to one route: the compiled JPEG loop where it applies
(:func:`_fill_native`), else the Python path (:func:`_fill_python`, :mod:`.worker`), the
tiles shared by ``threads`` workers (:mod:`.threads`).

With a decoded-tile cache (:mod:`.cache`) the plan is filled from cached whole tiles
instead (:func:`_fill_cached`: the source is told only the tiles the cache misses); misses
are decoded on the Python path, so the compiled loop does not apply to cached reads.
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
from ..ground.geometry import TileJob
from ..model import PyramidLevel
from .cache import CacheScope
from .channels import fill_channels
from .plan import TilePlan, advise_mosaic
from .request import ReadRequest
from .threads import batch_size, run_jobs, run_threads, thread_count
from .worker import BATCH_TILES, TileWorker, decode_tile

__all__ = ["fill_outside", "fill_region", "NATIVE_BATCH_RGB", "NATIVE_BATCH_RGBA"]


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


def fill_region(req: ReadRequest, out: np.ndarray, pool: DecoderPool, cache: CacheScope | None = None) -> None:
    """Decode every tile of the full-scale region ``req`` (its location in pixels of
    ``req.level``) into ``out`` (already validated); ``pool``: the CPU decoder pool.

    The region is planned once (:class:`~wsitool.read.plan.TilePlan`), the byte source told
    its tiles, and the plan handed to one route.  Work distribution: the jobs sit in one
    shared iterator; each of the ``k`` threads (the caller plus ``k - 1`` pool workers) takes
    the next job when it has finished its last one, so threads that drew cheap partial tiles
    do not wait idle for one that drew whole ones.  Where the compiled JPEG tile loop applies
    (:func:`wsitool.codec.jpegloop.applies`) the plan runs through it (:func:`_fill_native`);
    else on :class:`~wsitool.read.worker.TileWorker`, the reference (:func:`_fill_python`).
    ``cache``: a :class:`~wsitool.read.cache.CacheScope`, or None (no cache).
    A multi-channel level fills plane by plane (:func:`wsitool.read.channels.fill_channels`).
    """
    lv, mode = req.level, req.mode
    if lv.planes is not None:
        def fill_plane(plane: PyramidLevel, buf: np.ndarray) -> None:
            fill_region(dataclasses.replace(req, level=plane, mode="raw"), buf, pool, cache)

        fill_channels(fill_plane, lv, mode, req.x, req.y, out)
        return
    plan = TilePlan(lv, req.x, req.y, req.width, req.height)
    fill_outside(out, req.x, req.y, plan.inside)
    if plan.inside is None:
        return
    if cache is not None:
        _fill_cached(req, plan, out, pool, cache)
        return
    # the source told the tiles first (it decides: a local file's fadvise, a remote one's
    # requests in flight at once, a source of frames' one request), whichever route reads them
    plan.advise()
    if jpegloop.applies(lv, mode, out, plan.first, advised=True) and not plan.ends_one_column_into_a_tile():
        _fill_native(req, plan, out, pool)
    else:
        _fill_python(req, plan, out, pool)


def _fill_python(req: ReadRequest, plan: TilePlan, out: np.ndarray, pool: DecoderPool) -> None:
    """:func:`fill_region` on the Python path: the plan's jobs shared by the threads, batches
    of tiles per worker call (:class:`~wsitool.read.worker.TileWorker`)."""
    lv = req.level
    jobs = plan.jobs()
    k = thread_count(req.threads, len(jobs))
    # JPEG 2000 tiles are not batched: each takes milliseconds to decode, so
    # one call per tile costs nothing measurable, and handing out single tiles
    # keeps the threads evenly loaded (2 threads, 1024 x 1024 regions of
    # 256 x 256 tiles: 25.4 MP/s with batches of 6, 29.0 MP/s tile by tile
    # even for RGBA).
    batch = 1 if lv.encoding.stream == "j2k" else batch_size(BATCH_TILES, k, len(jobs))
    run_jobs(jobs, k, TileWorker(lv, out, req.mode, req.on_error, pool, batch).run)


#: Tiles per call of the compiled loop (and per nvImageCodec decode call):
#: RGB decodes straight into the output; RGBA decodes into one RGB scratch per
#: tile of the batch and widens it, so a small batch keeps the scratch in cache
#: (1024 x 1024 regions, one thread: batch 4 at 1.06x the decode floor, 16 at 1.04x).
NATIVE_BATCH_RGB = 16


NATIVE_BATCH_RGBA = 4


#: Largest RGB tile (bytes) decoded in RGBA batches; bigger ones go one by one.
_NATIVE_RGBA_BATCH_BYTES = 1 << 20


def _fill_native(req: ReadRequest, plan: TilePlan, out: np.ndarray, pool: DecoderPool) -> None:
    """:func:`fill_region` through the compiled JPEG tile loop (see :mod:`wsitool.codec.jpegloop`):
    the same tiles, threads, batches, checks and counters, one C call per batch; a source
    without a descriptor gives the loop the plan's tiles from its fetched ranges
    (:meth:`~wsitool.storage.ByteSource.gather`)."""
    lv, mode = req.level, req.mode
    most = NATIVE_BATCH_RGB
    if mode == "rgba":
        # one RGB scratch per tile of a batch: big tiles go one at a time, so
        # the scratch stays one tile (peak memory near the output's size)
        most = NATIVE_BATCH_RGBA if lv.tile_width * lv.tile_height * 3 <= _NATIVE_RGBA_BATCH_BYTES else 1
    if lv.encoding.jpeg_scan_segments:
        # NDPI restart intervals (one MCU row high) are small, and the loop decodes a call's
        # whole rows of them as one spliced code stream: fewer, larger calls
        most = jpegloop.MAX_CHUNK
    region = jpegloop.RegionJobs(lv, out, req.x, req.y, plan.inside, req.on_error)
    k = thread_count(req.threads, region.count)
    # A call of the compiled loop costs a few microseconds: smaller chunks than
    # the Python path's balance the threads better (2 threads, 1024 x 1024
    # regions of 240 x 240 tiles: 249 MP/s with about 4 chunks per thread, 241
    # with 2).
    region.chunk = min(batch_size(most, k, region.count, per_thread=4), jpegloop.MAX_CHUNK)
    run_threads(k, lambda: region.run(pool), region.stop)


def _fill_cached(req: ReadRequest, plan: TilePlan, out: np.ndarray, pool: DecoderPool, cache: CacheScope) -> None:
    """:func:`fill_region` from the decoded-tile cache ``cache`` (a :class:`~wsitool.read.cache.CacheScope`).

    The same plan, threads and job sharing; each job copies its part of the
    cached whole tile, decoding it first on a miss (:func:`~wsitool.read.worker.decode_tile`,
    the Python path).  The byte source is told the tiles the cache misses (its hits need no
    bytes).  A corrupt tile raises, or with ``on_error="fill"`` becomes
    background with a :class:`~wsitool.errors.TileWarning` (failed tiles are
    never cached; the decode that failed counted it in ``tiles_failed``).
    """
    lv, mode, on_error = req.level, req.mode, req.on_error
    jobs = plan.jobs()
    index = lv.cache_key  # the level's index, or (index, plane) for a channel's plane
    if lv.mosaic is not None:
        tw, th = lv.tile_width, lv.tile_height
        advise_mosaic(lv, [(j.col * tw, j.row * th, (j.col + 1) * tw, (j.row + 1) * th) for j in jobs
                           if not cache.holds(index, j.col, j.row, mode)])
    elif lv.tiles.planes == 1:
        offsets, counts, across = lv.tiles.offsets, lv.tiles.bytecounts, lv.tiles_across
        missing = [(int(offsets[k]), int(counts[k])) for k in (job.row * across + job.col for job in jobs
                                                               if not cache.holds(index, job.col, job.row, mode))
                   if offsets[k] and counts[k]]
        if missing:
            lv.source.advise(missing)

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
