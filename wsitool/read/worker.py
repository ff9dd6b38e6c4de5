"""The Python tile path of region reads: read, check and decode a region's tiles into the caller's buffer (floor 4).

This is the reference path: the compiled JPEG loop (:mod:`wsitool.codec.jpegloop`)
and the GPU path (:mod:`wsitool.read.cuda`) are pinned to it by parity tests.

Output modes:

* ``"rgb"``: ``(height, width, 3)`` uint8, decoded in place.
* ``"rgba"``: ``(height, width, 4)`` uint8, OpenSlide's layout; alpha is 255
  inside the slide and 0 outside it and on missing tiles.  nvImageCodec's CPU
  backend cannot decode into 4-channel strided buffers (we saw it write the
  wrong pixels), so RGBA decodes each tile into a per-thread RGB scratch buffer
  (hot in cache) and widens it to RGBA in one vectorised pass (:func:`widen_rgba`);
  on 240 x 240 JPEG tiles that pass costs about a sixth of a tile decode.
* ``"raw"``: ``(height, width, samples)`` in the level's native dtype, values
  exactly as stored.

The decoded-tile cache (:mod:`wsitool.read.cache`) sits between
:func:`wsitool.ground.geometry.plan_tiles` and this path: on a miss :func:`decode_tile`
decodes one whole tile with a :class:`TileWorker` (the jobs are the cache's keys:
level, col, row).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ..codec import jpegloop, openjpeg
from ..codec.failures import tile_failed
from ..codec.generic import decode_array
from ..codec.jpegloop import libjpeg_decoder
from ..codec.library import decode_params, nv
from ..codec.mosaic import paint
from ..codec.nvdecode import check_decoded, count_decoded, decode_checked, decode_into, plan_decode
from ..codec.paths import get_decode_paths
from ..codec.pool import DecoderPool, ThreadState
from ..codec.tilebytes import read_tile_stream
from ..errors import TileDecodeError
from ..ground.color import to_rgb8, ycbcr_to_rgb
from ..ground.geometry import TileJob
from ..model import PyramidLevel

__all__ = ["BATCH_TILES", "TileWorker", "decode_tile", "widen_rgba"]


#: Most tiles one thread hands to nvImageCodec in one decode call.  One call per
#: batch instead of one per tile saves the per-call cost on both sides of the
#: Python/C++ boundary (measured here: about 8 % of a 1024 x 1024 read of
#: 240 x 240 JPEG tiles on one thread).
BATCH_TILES = 16


#: Alpha byte of an RGBA pixel read as a little-endian 32-bit word.
_OPAQUE = np.uint32(0xFF000000)


class TileWorker:
    """Decodes a list of tile jobs of one region (runs on any thread)."""

    def __init__(self, lv: PyramidLevel, out: np.ndarray, mode: str, on_error: str, pool: DecoderPool,
                 batch: int = 1):
        self.lv = lv
        self.out = out
        self.mode = mode
        self.on_error = on_error
        self.pool = pool
        # Decode straight into the output: 3-channel uint8 output, no colour transform.
        self.in_place = mode in ("rgb", "raw") and not lv.encoding.ycbcr_after_decode
        # RGBA from an RGB decode: the tile is decoded into a per-thread RGB
        # scratch and widened to RGBA in one vectorised pass (see _widen_rgba).
        self.rgba = mode == "rgba" and not lv.encoding.ycbcr_after_decode and lv.encoding.codec == "nv"
        if self.rgba:
            h, w = out.shape[:2]
            self.out32 = out.view("<u4").reshape(h, w)
        # Batched decoding for tiles decoded straight into the output (RGBA
        # keeps one decode per tile: a batch would need one RGB scratch per
        # tile of the batch, megabytes per thread).  The test switches that
        # force the scratch path turn it off.
        paths = get_decode_paths()
        # JPEG 2000 through OpenJPEG's window decoder (nvImageCodec as fallback)
        self.decode = _decode_j2k if openjpeg.decodes(lv) else decode_into
        # (libjpeg-turbo's own API decodes one tile a call: no batches to make)
        self.batch = batch if (
            batch > 1 and lv.encoding.codec == "nv" and self.in_place
            and not paths.force_scratch and paths.roi_decode and libjpeg_decoder(lv) is None
        ) else 0

    def run(self, jobs: Iterable[TileJob]) -> None:
        """Decode ``jobs`` on this thread (a failed tile: raised, or background with ``fill``)."""
        state = self.pool.state()
        if self.batch:
            self._run_batched(jobs, state)
            return
        for job in jobs:
            try:
                self._one(job, state)
            except TileDecodeError as exc:
                self._failed(exc, job, state)

    def _failed(self, exc: TileDecodeError, job: TileJob, state: ThreadState) -> None:
        tile_failed(exc, self.on_error, state.stats)
        job.view(self.out)[...] = 0

    def _run_batched(self, jobs: Iterable[TileJob], state: ThreadState) -> None:
        """Same work and checks as :meth:`_one` per job, but the decodes of up to
        ``self.batch`` tiles go to nvImageCodec in one call (a list of code
        streams and a list of destination images).

        The destinations are described to nvImageCodec by :class:`_Block`
        objects (the output's address plus offsets) instead of numpy sub-views:
        wrapping a numpy view costs about 2 microseconds more per tile, for the
        ``__array_interface__`` dict numpy builds on each access."""
        lv = self.lv
        out = self.out
        base = out.__array_interface__["data"][0]
        typestr = out.dtype.str
        channels = out.shape[2]
        # The strides of the C-contiguous layout, computed rather than taken
        # from ``out.strides``: numpy calls an array C-contiguous whatever the
        # stride of a length-1 axis (a transposed (h, 1, 3) buffer, say), and
        # nvImageCodec refuses any pixel stride that is not packed.
        strides = (out.shape[1] * channels * out.itemsize, channels * out.itemsize, out.itemsize)
        s0, s1 = strides[0], strides[1]
        across = lv.tiles_across
        pending: list[tuple] = []
        for job in jobs:
            col, row, src, (dx0, dy0, dx1, dy1) = job
            try:
                data = read_tile_stream(lv, row * across + col, col, row, state, len(pending))
                if data is None:
                    _missing(out[dy0:dy1, dx0:dx1], state)
                    continue
                cs, how, _size = plan_decode(lv, col, row, data, src, complete=True)
            except TileDecodeError as exc:
                if pending and self.on_error != "fill":
                    # an earlier tile's decode error comes first (tile order)
                    self.flush(pending, state)
                    pending = []
                self._failed(exc, job, state)
                continue
            if how == "scratch":  # decoded whole and cropped (nvdecode.narrow_jpeg_crop): alone,
                if pending:      # after the tiles before it (errors in tile order)
                    self.flush(pending, state)
                    pending = []
                try:
                    decode_into(lv, col, row, data, out[dy0:dy1, dx0:dx1], src, state, complete=True)
                except TileDecodeError as exc:
                    self._failed(exc, job, state)
                continue
            shape = (dy1 - dy0, dx1 - dx0, channels)
            pending.append((job, cs, how, shape,
                            _Block(out, base + dy0 * s0 + dx0 * s1, shape, strides, typestr)))
            if len(pending) == self.batch:
                self.flush(pending, state)
                pending = []
        if pending:
            self.flush(pending, state)

    def flush(self, pending: list[tuple], state: ThreadState) -> None:
        """Decode the ``(job, stream, how, shape, block)`` entries of ``pending`` with one call."""
        lv = self.lv
        as_image = nv().as_image  # (one call per block: faster than as_images here)
        images = [None] * len(pending)
        with state.lock:
            try:
                images = [as_image(p[4]) for p in pending]
                results = state.decoder.decode([p[1] for p in pending], images=images,
                                                   params=decode_params())
            except Exception:  # one bad stream failed the call: decode one by one
                results = None
        if results is None or len(results) != len(pending):
            results = [None] * len(pending)
            retry = True
        else:
            retry = False
        stats = state.stats
        for (job, cs, how, shape, _block), image, result in zip(pending, images, results, strict=True):
            try:
                if retry:
                    decode_checked(lv, job.col, job.row, cs, job.view(self.out), state)
                else:
                    check_decoded(lv, job.col, job.row, result, image, shape)
            except TileDecodeError as exc:
                self._failed(exc, job, state)
                continue
            count_decoded(stats, how)

    def _one(self, job: TileJob, state: ThreadState) -> None:
        lv = self.lv
        col, row, src, (dx0, dy0, dx1, dy1) = job
        dst = self.out[dy0:dy1, dx0:dx1]
        if lv.mosaic is not None:
            self._mosaic(job, dst, state)
            return
        if lv.encoding.codec == "nv":
            data = read_tile_stream(lv, row * lv.tiles_across + col, col, row, state)
            if data is None:
                _missing(dst, state)
                return
            if self.in_place:
                self.decode(lv, col, row, data, dst, src, state, complete=True)
                return
            if self.rgba:
                h, w = dy1 - dy0, dx1 - dx0
                flat, rgb, image = state.tile_rgb(lv.tile_height, lv.tile_width, h, w)
                self.decode(lv, col, row, data, rgb, src, state, caller_buffer=False,
                            complete=True, image=image)
                widen_rgba(flat, h, w, self.out32[dy0:dy1, dx0:dx1])
                return
            scratch = state.scratch((lv.tile_height, lv.tile_width, 3))
            rgb = scratch[: dy1 - dy0, : dx1 - dx0]
            self.decode(lv, col, row, data, rgb, src, state, caller_buffer=False,
                        complete=True)
            if lv.encoding.ycbcr_after_decode:
                rgb = ycbcr_to_rgb(rgb)
            if self.mode == "raw":
                dst[...] = rgb
                return
            dst[..., :3] = rgb
            if self.mode == "rgba":
                dst[..., 3] = 255
            return
        arr = decode_array(lv, col, row, state)
        if arr is None:
            _missing(dst, state)
            return
        sx0, sy0, sx1, sy1 = src
        sub = arr[sy0:sy1, sx0:sx1]
        if lv.encoding.ycbcr_after_decode and sub.dtype == np.uint8 and sub.shape[2] == 3:
            # Aperio 33003 on the imagecodecs path (no nvImageCodec, library.fallback_encoding):
            # converted as the nvImageCodec branch above does, raw included
            sub = ycbcr_to_rgb(sub)
        if self.mode == "raw":
            dst[...] = sub
            return
        enc = lv.encoding
        rgb, alpha = to_rgb8(sub, enc.photometric_code, enc.bits, enc.colormap, enc.extrasamples)
        dst[..., :3] = rgb
        if self.mode == "rgba":
            dst[..., 3] = 255 if alpha is None else alpha


    def _mosaic(self, job: TileJob, dst: np.ndarray, state: ThreadState) -> None:
        """A job of a mosaic level: its window painted from the placed images
        (:func:`wsitool.codec.mosaic.paint`); unpainted pixels transparent (0, alpha 0)."""
        lv = self.lv
        painted = paint(lv, job.col, job.row, job.src, state)
        if painted is None:
            dst[...] = 0
            return
        pixels, covered = painted
        if self.mode == "raw":
            dst[...] = pixels
            return
        enc = lv.encoding
        rgb, _alpha = to_rgb8(pixels, enc.photometric_code, enc.bits, enc.colormap, enc.extrasamples)
        dst[..., :3] = rgb
        if self.mode == "rgba":
            dst[..., 3] = 255 if covered is None else covered * np.uint8(255)


def decode_tile(lv: PyramidLevel, col: int, row: int, mode: str, pool: DecoderPool) -> np.ndarray:
    """Decode tile ``(col, row)`` of ``lv`` whole, in ``mode``, into a new array (the cache's loader).

    Returns:
        ``(h, w, channels)``: the part of the tile inside the level (edge tiles
        are cut at the level's edge), channels and dtype as ``mode`` gives them
        (:func:`wsitool.read.request.output_shape`).

    Raises:
        TileDecodeError: the tile is corrupt (counted in the thread's
            ``tiles_failed``, as on the uncached path).
    """
    tw = min(lv.tile_width, lv.width - col * lv.tile_width)
    th = min(lv.tile_height, lv.height - row * lv.tile_height)
    if mode == "raw":
        out = np.empty((th, tw, lv.samples), lv.dtype)
    else:
        out = np.empty((th, tw, 4 if mode == "rgba" else 3), np.uint8)
    if tw > 1 and jpegloop.applies(lv, mode, out):  # (a 1-column tile: see plan.ends_one_column_into_a_tile)
        # the compiled loop, where it applies: the same pixels, checks and counters as the
        # Python path (tests/codec/test_jpegloop.py), a third of its time on a tile
        x0, y0 = col * lv.tile_width, row * lv.tile_height
        region = jpegloop.RegionJobs(lv, out, x0, y0, (x0, y0, x0 + tw, y0 + th), "raise")
        region.run(pool)
        return out
    rect = (0, 0, tw, th)
    TileWorker(lv, out, mode, "raise", pool).run([TileJob(col, row, rect, rect)])
    return out


class _Block:
    """A strided block of a host array, described by ``__array_interface__``
    (numpy's array interface protocol, version 3) for ``nv().as_image``.

    ``owner`` is the C-contiguous array the block lies in: the block keeps it
    alive, and the nvImageCodec image keeps the block alive.  ``address`` is the
    block's first byte; ``shape`` is ``(height, width, channels)``; ``strides``
    (bytes) are those of the owner's C-contiguous layout; ``typestr`` is the
    owner's dtype string (e.g. ``"|u1"``).
    """

    __slots__ = ("__array_interface__", "owner")

    def __init__(self, owner: np.ndarray, address: int, shape: tuple[int, ...], strides: tuple[int, ...],
                 typestr: str):
        self.owner = owner
        self.__array_interface__ = {"version": 3, "shape": shape, "typestr": typestr,
                                    "data": (address, False), "strides": strides}


def _decode_j2k(lv: PyramidLevel, col: int, row: int, data: Any, dst: np.ndarray, src: tuple[int, int, int, int],
                state: ThreadState, **kw: Any) -> None:
    """:func:`wsitool.codec.openjpeg.decode_into` (only the window ``src`` of the
    tile is decoded), else :func:`decode_into` where that path does not apply."""
    if not openjpeg.decode_into(lv, col, row, data, dst, src, state, **kw):
        decode_into(lv, col, row, data, dst, src, state, **kw)


def _missing(dst: np.ndarray, state: ThreadState) -> None:
    """A missing tile (offset or byte count 0): transparent background, counted."""
    state.stats.tiles_missing += 1
    dst[...] = 0


def widen_rgba(flat: np.ndarray, h: int, w: int, dst32: np.ndarray) -> None:
    """Write the ``(h, w, 3)`` RGB pixels at the start of ``flat`` as opaque RGBA.

    ``flat`` is a 1-D uint8 buffer holding the packed RGB pixels followed by at
    least one spare byte; ``dst32`` is the ``(h, w)`` little-endian uint32 view of
    the RGBA destination.  Pixel ``i`` is read as the 32-bit word at byte ``3 i``
    (its R, G, B and one byte of the next pixel) and OR-ed with ``0xFF000000``,
    which replaces that fourth byte by alpha 255: one vectorised pass instead
    of a 3-of-4-channel strided copy plus an alpha fill (about 9x faster).
    """
    src32 = np.ndarray((h, w), dtype="<u4", buffer=flat, strides=(w * 3, 3))
    np.bitwise_or(src32, _OPAQUE, out=dst32)


