"""GPU decoding: ``device="cuda"`` region reads into CuPy arrays (floor 4).

``Slide.read_region(..., device="cuda")`` (or ``"cuda:N"``) returns a
``cupy.ndarray`` with the shape, dtype and pixel semantics of the CPU path
(:func:`wsitool.read.region.read_pyramid_region`): ``(height, width, 4)`` uint8 for
``mode="rgba"``, ``(height, width, 3)`` uint8 for ``"rgb"``,
``(height, width, samples)`` in the level's dtype for ``"raw"``; pixels
outside the slide and missing tiles are 0 with alpha 0.

How one region is read on the GPU:

1. The request is validated exactly as on the CPU (same function), the tiles
   are planned with the same :func:`~wsitool.ground.geometry.plan_tiles`, and each
   tile's bytes are read with :func:`~wsitool.codec.tilebytes.read_tile_bytes` and its
   code stream prepared and checked against the tile grid with
   :func:`~wsitool.codec.nvdecode.plan_decode` (shared with the CPU path).
2. **All tiles of the region are decoded by one batched call** of the calling
   thread's GPU decoder (``Decoder.decode(list_of_code_streams,
   images=list_of_targets, cuda_stream=...)``), nvJPEG for JPEG (its hardware
   engine first where the GPU has one, e.g. A100 / H100 / H200) and nvJPEG2000
   for JPEG 2000.  The decoders come from the same per-thread
   :class:`~wsitool.codec.pool.DecoderPool` as the CPU ones (one decoder per
   thread, called under its lock; ``device_id`` of the chosen GPU; backends
   hardware GPU, GPU, hybrid CPU/GPU, then CPU).
3. Targets: in ``rgb`` / ``raw`` mode interior tiles decode straight into the
   strided sub-view of the output (``nvimgcodec.as_image`` over the CuPy view)
   and edge tiles decode as a sub-region of their code stream
   (``CodeStream.get_sub_code_stream(region=...)``), also straight into the
   output.  RGBA output and levels that need a colour transform (Aperio
   33003) decode RGB into a per-thread device scratch buffer which is then
   expanded / converted on the device: nvImageCodec's CPU backend writes
   wrong pixels into 4-channel strided buffers and we assume the same risk on
   the GPU, since nothing documents otherwise.  The scratch buffer is one
   flat device allocation per thread that only grows (to the largest region
   that thread read), so repeated reads allocate nothing.
4. Every result is verified as on the CPU (:func:`~wsitool.codec.nvdecode.check_decoded`):
   a ``None`` result or an image that is not the target buffer raises
   :class:`~wsitool.errors.TileDecodeError` naming level, column and row
   (or, with ``on_error="fill"``, warns and fills that tile).  Before giving
   up on a tile the GPU backends could not decode, it is decoded once more by
   the thread's CPU decoder and copied to the device (counted in
   :func:`gpu_stats` as ``tiles_cpu_fallback``); a corrupt tile fails both.
5. Colour check: the first time a level is read on a device, one whole tile
   is decoded by the GPU decoder and by the CPU decoder and compared; if the
   mean absolute difference exceeds :data:`COLOUR_CHECK_MEAN` (a colour
   transform applied differently, e.g. the Adobe APP14 "RGB" flag of Aperio
   JPEG tiles ignored), that level is read on the CPU from then on, with a
   ``RuntimeWarning`` (counted in :func:`gpu_stats` as ``levels_on_cpu``).
   GPU pixels otherwise differ from the CPU's only by the decoders' rounding
   (JPEG: IDCT and chroma upsampling, a few levels at most).
6. Levels that nvImageCodec does not decode (tifffile levels: LZW, deflate,
   zstd, WebP, gray or CMYK JPEG, 16-bit...) are decoded on the CPU exactly as
   by ``device="cpu"`` (``threads`` applies there) and the result is copied
   to the device.  Their pixels are therefore identical to the CPU path.

Stream semantics of the output: the work runs on a per-thread, non-blocking
CUDA stream owned by wsitool, which first waits for the caller's current
CuPy stream (so work the caller queued on a provided ``out`` buffer before
the call is finished before we write to it).  The stream is synchronised
before :func:`read_region_cuda` returns, even when it raises: the returned
array is complete and can be used on any stream without further
synchronisation.  A new output array is allocated on the caller's current
stream (CuPy's memory pool ties a block to the stream it was allocated on).

Without a usable CUDA device (no CuPy, no driver, no GPU), every GPU entry
point raises :class:`~wsitool.errors.DeviceUnavailableError` whose message
contains "no CUDA device available"; the CLI prints it as one line and exits
with code 8.  Nothing else changes.

Stress integration: :func:`gpu_memory_sample` returns CuPy's memory-pool and
the device's memory use, to be sampled next to RSS by ``wsitool stress
--device cuda``.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ..codec.failures import tile_failed
from ..codec.headers import codestream
from ..codec.library import decode_params
from ..codec.nvdecode import check_decoded, count_decoded, decode_into, plan_decode
from ..codec.pool import DecoderPool, DecodeStats, ThreadState, get_pool
from ..codec.tilebytes import read_tile_bytes
from ..errors import InvalidRegionError, ResourceLimitError, TileDecodeError
from ..ground.color import ycbcr_to_rgb
from ..ground.device import cuda_device_id
from ..ground.geometry import TileJob, plan_tiles
from ..model import PyramidLevel
from .cuda_arrays import HostArrays, bump, gpu_memory_sample, gpu_stats, release_scratch, reset_gpu_stats, thread_arrays
from .fill import fill_outside, fill_region
from .request import ReadRequest, check_out

__all__ = [
    "read_region_cuda",
    "device_index",
    "fill_region_batched",
    "HostArrays",
    "gpu_memory_sample",
    "gpu_stats",
    "reset_gpu_stats",
    "release_scratch",
]


class _Tile:
    """One tile of a batch: where it comes from and where its pixels go."""

    __slots__ = ("job", "data", "cs", "how", "size", "target", "slot")

    def __init__(self, job: TileJob, data: Any, cs: Any, how: str, size: tuple[int, int], target: Any):
        self.job = job
        self.data = data
        self.cs = cs
        self.how = how
        self.size = size  # code stream (width, height)
        self.target = target  # view of the output or of the RGB scratch
        self.slot: Any = None  # whole-tile scratch for how == "scratch"

    @property
    def dst(self) -> Any:
        """Where the decoder writes: the whole-tile slot (``"scratch"``) or the target."""
        return self.slot if self.how == "scratch" else self.target


def fill_region_batched(req: ReadRequest, out: Any, pool: DecoderPool, arrays: HostArrays) -> None:
    """Fill ``out`` with the validated region ``req``, decoding all its tiles in one batch.

    Args:
        req: the read (its location in pixels of ``req.level``; ``req.threads``: CPU
            threads for tifffile levels, decoded on the CPU).
        out: ``(height, width, channels)`` output of ``arrays.xp`` (numpy or CuPy),
            C-contiguous, already checked.
        pool: the :class:`~wsitool.codec.pool.DecoderPool` whose per-thread decoder
            runs the batch (``get_pool("cuda:N")`` on the GPU).
        arrays: the array back-end (:class:`CudaArrays` / :class:`HostArrays`).

    Raises:
        TileDecodeError: a corrupt tile with ``on_error="raise"``.
    """
    lv = req.level
    if lv.encoding.codec != "nv" or _colour_ok.get(_level_key(lv, arrays)) is False:
        _fill_on_cpu(req, out, arrays)
        return
    inside, jobs = plan_tiles(lv, req.x, req.y, req.width, req.height)
    fill_outside(out, req.x, req.y, inside)
    if not jobs:
        return
    assert inside is not None  # (jobs lie inside the level)
    state = pool.state()
    direct = req.mode in ("rgb", "raw") and not lv.encoding.ycbcr_after_decode
    tiles, bad = _read_batch(lv, jobs, req.on_error, state.stats)
    if (tiles and arrays.check_colour and _level_key(lv, arrays) not in _colour_ok
            and not _check_colour(lv, tiles[0], state, arrays)):
        _fill_on_cpu(req, out, arrays)
        return
    rgb = _place_targets(req, tiles, out if direct else None, state.stats, arrays)
    bad += _decode_and_crop(req, tiles, state, arrays, direct)
    if not direct:
        _copy_rgb(req, rgb, out, inside)
    for job in bad:  # missing and failed tiles: background, alpha 0
        job.view(out)[...] = 0


def _read_batch(lv: PyramidLevel, jobs: list[TileJob], on_error: str,
                stats: DecodeStats) -> tuple[list[_Tile], list[TileJob]]:
    """Read and plan the tiles of ``jobs``: ``(tiles to decode, jobs that become background)``
    (missing tiles, counted; tiles whose header is refused, raised or counted as failed)."""
    bad: list[TileJob] = []
    tiles: list[_Tile] = []
    for job in jobs:
        col, row, src, _dst = job
        try:
            data = read_tile_bytes(lv, row * lv.tiles_across + col, col, row, stats)
            if data is None:
                stats.tiles_missing += 1
                bad.append(job)
                continue
            cs, how, size = plan_decode(lv, col, row, data, src)
        except TileDecodeError as exc:
            tile_failed(exc, on_error, stats)
            bad.append(job)
            continue
        tiles.append(_Tile(job, data, cs, how, size, None))
    return tiles, bad


def _place_targets(req: ReadRequest, tiles: list[_Tile], direct_out: Any, stats: DecodeStats,
                   arrays: HostArrays) -> Any:
    """Point each tile at its target; return the RGB image the tiles decode into.

    One flat scratch holds the RGB region (unless decoding straight into the output,
    ``direct_out``) followed by one whole-tile slot per ``"scratch"`` tile."""
    h, w = req.height, req.width
    region_bytes = 0 if direct_out is not None else h * w * 3
    slot_bytes = [t.size[0] * t.size[1] * 3 if t.how == "scratch" else 0 for t in tiles]
    total = region_bytes + sum(slot_bytes)
    flat: Any = arrays.scratch(total, stats) if total else None
    rgb = direct_out if direct_out is not None else flat[:region_bytes].reshape(h, w, 3)
    offset = region_bytes
    for t, nbytes in zip(tiles, slot_bytes, strict=True):
        t.target = t.job.view(rgb)
        if nbytes:
            t.slot = flat[offset:offset + nbytes].reshape(t.size[1], t.size[0], 3)
            offset += nbytes
    return rgb


def _decode_and_crop(req: ReadRequest, tiles: list[_Tile], state: ThreadState, arrays: HostArrays,
                     direct: bool) -> list[TileJob]:
    """Decode ``tiles`` in one batch, crop the whole-tile slots into their targets and count
    the decodes; return the jobs of the tiles that failed (raised with ``on_error="raise"``)."""
    failed = _decode_batch(req.level, tiles, state, arrays)
    bad: list[TileJob] = []
    for t in tiles:
        exc = failed.get(id(t))
        if exc is not None:
            tile_failed(exc, req.on_error, state.stats)
            bad.append(t.job)
            continue
        if t.how == "scratch":
            sx0, sy0, sx1, sy1 = t.job.src
            t.target[...] = t.slot[sy0:sy1, sx0:sx1]
        count_decoded(state.stats, t.how, caller_buffer=direct)
    return bad


def _copy_rgb(req: ReadRequest, rgb: Any, out: Any, inside: tuple[int, int, int, int]) -> None:
    """Copy the part of the decoded RGB region inside the level into ``out`` in ``req.mode``
    (colour-converted where the level needs it after decoding; RGBA opaque)."""
    cx0, cy0, cx1, cy1 = inside
    top, bottom, left, right = cy0 - req.y, cy1 - req.y, cx0 - req.x, cx1 - req.x
    part = rgb[top:bottom, left:right]
    if req.level.encoding.ycbcr_after_decode:
        part = ycbcr_to_rgb(part)
    if req.mode == "raw":
        out[top:bottom, left:right] = part
    else:
        out[top:bottom, left:right, :3] = part
        if req.mode == "rgba":
            out[top:bottom, left:right, 3] = 255


def _fill_on_cpu(req: ReadRequest, out: Any, arrays: HostArrays) -> None:
    """Decode the region on the CPU exactly as ``device="cpu"`` and copy it into ``out``."""
    host = np.empty(req.shape, req.dtype)
    fill_region(req, host, get_pool("cpu"))
    arrays.upload(out, host)
    bump(regions_generic=1)


#: Largest mean absolute difference between a GPU and a CPU decode of the same
#: tile that counts as agreement.  IDCT and chroma-upsampling differences stay
#: below 1; a wrong colour transform (e.g. a decoder that ignores the Adobe
#: APP14 "RGB" flag of Aperio tiles and converts them as YCbCr) gives tens.
COLOUR_CHECK_MEAN = 8.0


_colour_ok: dict[tuple[str, int, str], bool] = {}


def _level_key(lv: PyramidLevel, arrays: HostArrays) -> tuple[str, int, str]:
    return (lv.path, lv.index, arrays.device_key)


def _check_colour(lv: PyramidLevel, tile: _Tile, state: ThreadState, arrays: HostArrays) -> bool:
    """Decode one whole tile of ``lv`` with the batch decoder and the CPU decoder, compare.

    Run once per level and device (result cached).  A level whose GPU decode
    disagrees is read on the CPU from then on, with a ``RuntimeWarning``;
    this guards against decoders that interpret a colour space differently
    from libjpeg-turbo / OpenJPEG (which the CPU path and its tests pin down).
    Returns True when the GPU may decode the level (also when the check could
    not run, e.g. the tile is corrupt: the region read then reports it).
    """
    col, row = tile.job.col, tile.job.row
    try:
        cs, width, height = codestream(lv, tile.data, col, row)
    except TileDecodeError:
        return True
    whole = (0, 0, width, height)
    probe = _Tile(TileJob(col, row, whole, whole), tile.data, cs, "direct",
                  (width, height), arrays.xp.empty((height, width, 3), arrays.xp.uint8))
    if _decode_batch(lv, [probe], state, arrays, fallback=False, count=False):
        return True
    host = np.empty((height, width, 3), np.uint8)
    try:
        decode_into(lv, col, row, tile.data, host, whole, get_pool("cpu").state(), caller_buffer=False)
    except TileDecodeError:
        return True
    mean = float(np.abs(arrays.to_host(probe.target).astype(np.int16) - host).mean())
    ok = mean <= COLOUR_CHECK_MEAN
    _colour_ok[_level_key(lv, arrays)] = ok
    if not ok:
        bump(levels_on_cpu=1)
        warnings.warn(
            f"{lv.path}: level {lv.index}: the {arrays.device_key} decode of tile (col {col}, "
            f"row {row}) differs from the CPU decode (mean |difference| {mean:.1f}); this level "
            f"is decoded on the CPU and copied to the device",
            RuntimeWarning, stacklevel=4,
        )
    return ok


def _decode_batch(lv: PyramidLevel, tiles: list[_Tile], state: ThreadState, arrays: HostArrays, *,
                  fallback: bool = True, count: bool = True) -> dict[int, TileDecodeError]:
    """Decode ``tiles`` with one batched call; return the failures by ``id(tile)``.

    If the batched call raises as a whole, the tiles are decoded one by one
    (still on the same decoder and stream) so that the error names the tile.
    Tiles the GPU could not decode are retried on the thread's CPU decoder
    when ``fallback`` and ``arrays.cpu_fallback`` are set.  ``count``: add
    the call to :func:`gpu_stats`.
    """
    failed: dict[int, TileDecodeError] = {}
    if not tiles:
        return failed
    images = [arrays.image(t.dst) for t in tiles]
    streams = [t.cs for t in tiles]
    decoder = state.decoder
    results: list[Any]
    with state.lock:
        try:
            results = list(decoder.decode(streams, images=images, params=decode_params(),
                                          cuda_stream=arrays.stream_ptr))
        except Exception:
            results = []
        if count:
            bump(batches=1, batched_tiles=len(tiles))
        if len(results) != len(tiles):
            bump(batch_retries=1)
            results = []
            for t, image in zip(tiles, images, strict=True):
                try:
                    results.append(decoder.decode(t.cs, image=image, params=decode_params(),
                                              cuda_stream=arrays.stream_ptr))
                except Exception as exc:
                    results.append(exc)
    for t, image, result in zip(tiles, images, results, strict=True):
        col, row = t.job.col, t.job.row
        try:
            if isinstance(result, Exception):
                raise TileDecodeError(lv.path, lv.index, col, row, f"decoder error: {result}")
            check_decoded(lv, col, row, result, image, t.dst.shape)
        except TileDecodeError as exc:
            if fallback and arrays.cpu_fallback and _cpu_fallback(lv, t, arrays):
                continue
            failed[id(t)] = exc
    return failed


def _cpu_fallback(lv: PyramidLevel, t: _Tile, arrays: HostArrays) -> bool:
    """Decode one tile on this thread's CPU decoder and copy it to ``t.dst``."""
    state = get_pool("cpu").state()
    col, row = t.job.col, t.job.row
    width, height = t.size
    src = (0, 0, width, height) if t.how == "scratch" else t.job.src
    sx0, sy0, sx1, sy1 = src
    host = np.empty((sy1 - sy0, sx1 - sx0, 3), np.uint8)
    try:
        decode_into(lv, col, row, t.data, host, src, state, caller_buffer=False)
    except TileDecodeError:
        return False
    arrays.upload(t.dst, host)
    bump(tiles_cpu_fallback=1)
    return True


def device_index(device: str) -> int:
    """The CUDA device index of ``device`` (``"cuda"`` / ``"cuda:N"``).

    Raises:
        InvalidRegionError: ``device`` is not ``"cuda"`` or ``"cuda:N"``.
        DeviceUnavailableError: no usable CUDA device, or N is not one of them.
    """
    try:
        return cuda_device_id(device)
    except ValueError as exc:
        raise InvalidRegionError(str(exc)) from None


def read_region_cuda(req: ReadRequest, *, out: Any = None) -> Any:
    """Read a validated region into a CuPy array on a CUDA device.

    Called by :func:`wsitool.read.region.read_pyramid_region` for ``device="cuda"`` /
    ``"cuda:N"`` after it validated the request; see the module docstring
    for the decode path and the stream semantics.

    Args:
        req: the read (:class:`~wsitool.read.request.ReadRequest`, validated): its
            level, location in pixels of that level and size; ``mode``
            (``"rgba"`` -> ``(h, w, 4)`` uint8; ``"rgb"`` -> ``(h, w, 3)`` uint8;
            ``"raw"`` -> ``(h, w, samples)`` in the level's dtype); ``threads``
            (CPU threads for levels decoded on the CPU, tifffile levels;
            nvImageCodec levels are decoded by one batched GPU call);
            ``on_error`` (as on the CPU); ``device`` (``"cuda"``: CuPy's current
            device, or ``"cuda:N"``).
        out: optional ``cupy.ndarray`` on that device, C-contiguous, of the
            exact shape and dtype of the result; filled in place and returned.

    Returns:
        ``cupy.ndarray`` (``out`` itself when given), complete on return.

    Raises:
        DeviceUnavailableError: no usable CUDA device ("no CUDA device available").
        InvalidRegionError: bad ``device`` string, or ``out`` of the wrong
            type, shape, dtype, layout or device.
        ResourceLimitError: the GPU ran out of memory for the output or scratch.
        TileDecodeError: a corrupt tile, with ``on_error="raise"``.
    """
    dev = device_index(req.device)
    import cupy

    shape, dtype = req.shape, req.dtype
    with cupy.cuda.Device(dev):
        try:
            if out is None:
                out = cupy.empty(shape, dtype)
            else:
                check_out(out, shape, dtype, cupy.ndarray, "cupy.ndarray")
                if out.device.id != dev:
                    raise InvalidRegionError(
                        f"out is on cuda:{out.device.id}, the read is on cuda:{dev}"
                    )
            arrays = thread_arrays(dev)
            arrays.stream.wait_event(cupy.cuda.get_current_stream().record())
            try:
                with arrays.stream:
                    fill_region_batched(req, out, get_pool(f"cuda:{dev}"), arrays)
            finally:
                arrays.stream.synchronize()
        except cupy.cuda.memory.OutOfMemoryError as exc:
            raise ResourceLimitError(
                f"out of GPU memory on cuda:{dev} reading a {req.width}x{req.height} region ({exc})"
            ) from None
    return out


