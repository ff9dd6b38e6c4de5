"""Reduced-resolution region reads: a level at 1/2, 1/4 or 1/8 scale, which the pyramid does not store (floor 4).

The pixel grid (:class:`wsitool.ground.geometry.ScaledGrid`): reading level ``L``
with ``downsample=k`` reads the *virtual level* ``L/k`` of
``ceil(W / k) x ceil(H / k)`` pixels and downsample ``d_L * k``.  The level-0
``location`` maps to virtual pixel ``floor(x / (d_L k) + 0.5)`` (the rule of
:func:`wsitool.ground.geometry.level_rect`); ``size`` is in virtual pixels.  Virtual
pixel ``u`` summarises level pixels ``[k u, k u + k)`` (per axis, clipped to
the level); one wholly outside the level is 0 (alpha 0), as in any read.

What a virtual pixel holds depends on the backend:

* **Reference: area filter** (every codec; JPEG too: neither nvImageCodec nor
  imagecodecs exposes libjpeg-turbo's DCT scaling).  The level's pixels are
  decoded at full resolution, in bands of at most :data:`BAND_BYTES`, and each
  output sample is the mean of its ``k x k`` block's samples inside the level,
  rounded half up (``(sum + n // 2) // n`` for integers).  :func:`area_reduce`.
* **JPEG 2000: the wavelet LL band** (:mod:`wsitool.codec.openjpeg`, ``reduce
  = log2 k``).  Each tile is decoded at resolution level ``N_L - log2 k``
  (ITU-T T.800 B.5, F.3): the code-blocks of the finer resolutions are never
  decoded.  That is the 9/7 (or 5/3) low-pass filter cascade, not a box:
  sample ``u`` is centred on level pixel ``k u`` (even samples are the
  low-pass ones, T.800 F.3.7), the box on ``k u + (k - 1) / 2``, and the
  filter's support is wider.  Pinned to the area filter by
  ``tests/read/test_reduced_read.py``, whose tolerances (mean and 99.9th
  percentile absolute difference per sample on tissue of the TCGA 33005
  sample) are measured, not assumed.  Needs ``k`` to divide the tile size
  and the tile to have at least ``log2 k`` decomposition levels; otherwise
  that tile takes the area filter.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import numpy as np

from ..codec import openjpeg
from ..codec.failures import tile_failed
from ..codec.paths import get_decode_paths
from ..codec.pool import DecoderPool, ThreadState
from ..codec.tilebytes import read_tile_stream
from ..errors import TileDecodeError
from ..ground.color import ycbcr_to_rgb
from ..ground.geometry import ScaledGrid, TileGrid, TileJob, plan_tiles, scaled_grid
from ..model import PyramidLevel
from .fill import fill_outside, fill_region
from .request import ReadRequest
from .threads import run_jobs, thread_count

__all__ = ["BAND_BYTES", "area_reduce", "fill_reduced", "uses_wavelet"]

#: Most bytes of full-resolution pixels the area filter decodes at a time.
BAND_BYTES = 16 << 20


def uses_wavelet(lv: PyramidLevel, k: int) -> bool:
    """Whether reads of ``lv`` at ``1/k`` decode J2K tiles at a reduced resolution."""
    return (k > 1 and lv.planes is None and lv.encoding.stream == "j2k" and lv.encoding.codec == "nv"
            and get_decode_paths().openjpeg and openjpeg.available()
            and lv.tile_width % k == 0 and lv.tile_height % k == 0)


def area_reduce(src: np.ndarray, k: int, rx: int, ry: int, width: int, height: int,
                out: np.ndarray) -> None:
    """Area-filter ``src`` by ``k`` into ``out`` (the reference of reduced reads).

    Args:
        src: ``(h * k, w * k, c)`` full-resolution pixels of level pixels
            ``[rx, rx + w k) x [ry, ry + h k)`` (any dtype); samples outside the
            level must be 0, as reads leave them, and are not counted.
        k: the factor (>= 1).
        rx, ry: level pixel of ``src[0, 0]``.
        width, height: the level's size in pixels.
        out: ``(h, w, c)`` of ``src``'s dtype: each sample the mean of the
            ``k x k`` block's samples inside the level, integers rounded half
            up; 0 where no sample of the block is inside.
    """
    h, w, c = out.shape
    xs = rx + k * np.arange(w + 1)
    ys = ry + k * np.arange(h + 1)
    nx = np.diff(np.clip(xs, 0, width))
    ny = np.diff(np.clip(ys, 0, height))
    n = (ny[:, None] * nx[None, :])[..., None].astype(np.uint64)
    blocks = src.reshape(h, k, w, k, c)
    if np.issubdtype(out.dtype, np.integer):
        total = blocks.sum(axis=(1, 3), dtype=np.uint64)
        np.floor_divide(total + n // 2, np.maximum(n, 1), out=total)
    else:
        total = blocks.sum(axis=(1, 3), dtype=np.float64) / np.maximum(n, 1)
    total[np.broadcast_to(n == 0, total.shape)] = 0
    out[...] = total


def _area_fill(req: ReadRequest, out: np.ndarray, pool: DecoderPool) -> None:
    """Fill ``out`` with the virtual pixels ``[x, x + width) x [y, y + height)`` of ``req``
    (pixels of its level at ``1 / req.downsample``) by the area filter, decoding the
    full-resolution level in bands of at most :data:`BAND_BYTES`."""
    lv, k, u0, v0, w, h = req.level, req.downsample, req.x, req.y, req.width, req.height
    c = out.shape[2]
    rows = max(1, BAND_BYTES // max(1, k * k * w * c * out.itemsize))
    for j in range(0, h, rows):
        hh = min(rows, h - j)
        band = np.empty((hh * k, w * k, c), out.dtype)
        fill_region(req.part(k * u0, k * (v0 + j), w * k, hh * k, downsample=1), band, pool)
        area_reduce(band, k, k * u0, k * (v0 + j), lv.width, lv.height, out[j:j + hh])


def fill_reduced(req: ReadRequest, out: np.ndarray, pool: DecoderPool) -> None:
    """Fill ``out`` (``(h, w, c)``, validated) with the region ``req`` of ``req.level`` read at
    ``1 / req.downsample`` scale, its location in pixels of that scale (see the module
    docstring for the grid).

    J2K levels (:func:`uses_wavelet`): tile by tile at the matching wavelet
    resolution, on ``threads`` threads sharing the jobs; other levels: the
    area filter.

    Raises:
        TileDecodeError: a corrupt tile, with ``on_error="raise"``.
    """
    lv, k = req.level, req.downsample
    if not uses_wavelet(lv, k):
        _area_fill(req, out, pool)
        return
    grid = scaled_grid(lv, k)
    # (a ScaledGrid is a TileGrid: geometry's Protocol declares settable members, a NamedTuple's are read-only)
    inside, jobs = plan_tiles(cast(TileGrid, grid), req.x, req.y, req.width, req.height)
    fill_outside(out, req.x, req.y, inside)
    if not jobs:
        return
    worker = _ReducedWorker(req, grid, out, pool)
    run_jobs(jobs, thread_count(req.threads, len(jobs)), worker.run)


class _ReducedWorker:
    """Decodes tile jobs of a virtual level at reduced resolution (any thread)."""

    def __init__(self, req: ReadRequest, grid: ScaledGrid, out: np.ndarray, pool: DecoderPool):
        lv = req.level
        self.req, self.lv, self.grid, self.u0, self.v0 = req, lv, grid, req.x, req.y
        self.out, self.mode, self.on_error, self.pool = out, req.mode, req.on_error, pool
        self.reduce = grid.factor.bit_length() - 1
        self.in_place = req.mode in ("rgb", "raw") and not lv.encoding.ycbcr_after_decode

    def run(self, jobs: Iterable[TileJob]) -> None:
        """Decode ``jobs`` on this thread (a failed tile: raised, or background with ``fill``)."""
        state = self.pool.state()
        for job in jobs:
            try:
                self._one(job, state)
            except TileDecodeError as exc:
                tile_failed(exc, self.on_error, state.stats)
                job.view(self.out)[...] = 0

    def _one(self, job: TileJob, state: ThreadState) -> None:
        lv = self.lv
        col, row, src, (dx0, dy0, dx1, dy1) = job
        dst = self.out[dy0:dy1, dx0:dx1]
        data = read_tile_stream(lv, row * lv.tiles_across + col, col, row, state)
        if data is None:
            state.stats.tiles_missing += 1
            dst[...] = 0
            return
        hh, ww = dy1 - dy0, dx1 - dx0
        target = dst if self.in_place else state.scratch(
            (self.grid.tile_height, self.grid.tile_width, 3))[:hh, :ww]
        if not openjpeg.decode_into(lv, col, row, data, target, src, state,
                                    caller_buffer=self.in_place, reduce=self.reduce):
            # this tile cannot drop the levels: the area filter, for its part only
            _area_fill(self.req.part(self.u0 + dx0, self.v0 + dy0, ww, hh, threads=1), dst, self.pool)
            return
        if self.in_place:
            return
        rgb = ycbcr_to_rgb(target) if lv.encoding.ycbcr_after_decode else target
        dst[..., :3] = rgb
        if self.mode == "rgba":
            dst[..., 3] = 255
