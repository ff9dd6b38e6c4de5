"""GPU decoding: ``device="cuda"`` region reads into CuPy arrays.

``Slide.read_region(..., device="cuda")`` (or ``"cuda:N"``) returns a
``cupy.ndarray`` with the shape, dtype and pixel semantics of the CPU path
(:func:`wsitool.region.read_region`): ``(height, width, 4)`` uint8 for
``mode="rgba"``, ``(height, width, 3)`` uint8 for ``"rgb"``,
``(height, width, samples)`` in the level's dtype for ``"raw"``; pixels
outside the slide and missing tiles are 0 with alpha 0.

How one region is read on the GPU:

1. The request is validated exactly as on the CPU (same function), the tiles
   are planned with the same :func:`~wsitool.region.plan_tiles`, and each
   tile's bytes are read with :func:`~wsitool.decode.read_tile_bytes` and its
   code stream prepared and checked against the tile grid with
   :func:`~wsitool.decode.plan_decode` (shared with the CPU path).
2. **All tiles of the region are decoded by one batched call** of the calling
   thread's GPU decoder (``Decoder.decode(list_of_code_streams,
   images=list_of_targets, cuda_stream=...)``), nvJPEG for JPEG (its hardware
   engine first where the GPU has one, e.g. A100 / H100 / H200) and nvJPEG2000
   for JPEG 2000.  The decoders come from the same per-thread
   :class:`~wsitool.decode.DecoderPool` as the CPU ones (one decoder per
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
4. Every result is verified as on the CPU (:func:`~wsitool.decode.check_decoded`):
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

import ctypes.util
import functools
import glob
import importlib.util
import os
import threading
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from .decode import (
    TILE_DECODE_PARAMS,
    _codestream,
    check_decoded,
    count_decoded,
    decode_into,
    get_pool,
    nvimgcodec,
    plan_decode,
    read_tile_bytes,
)
from .errors import DeviceUnavailableError, InvalidRegionError, ResourceLimitError, TileDecodeError
from .region import (
    _check_out,
    _fill_outside,
    _fill_region,
    level_rect,
    output_shape,
    plan_tiles,
    tile_failed,
    ycbcr_to_rgb,
)

if TYPE_CHECKING:  # pragma: no cover
    from .slide import Level, Slide

__all__ = [
    "NO_CUDA",
    "cuda_available",
    "cuda_device_id",
    "backend_report",
    "read_region_cuda",
    "gpu_memory_sample",
    "gpu_stats",
    "reset_gpu_stats",
    "release_scratch",
]

NO_CUDA = "no CUDA device available"


# --------------------------------------------------------------------------
# Device discovery
# --------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _cuda_probe() -> tuple[bool, str]:
    """(available, reason) -- CuPy importable and at least one CUDA device."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # ImportError, or CUDA libraries missing
        return False, f"CuPy not importable ({type(exc).__name__})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return False, f"CUDA runtime error ({exc})"
    if count < 1:
        return False, "no CUDA device"
    return True, f"{count} CUDA device(s)"


def cuda_available() -> bool:
    """True if CuPy imports and sees at least one CUDA device."""
    return _cuda_probe()[0]


def _parse_device(device: str) -> int | None:
    """``"cuda"`` -> None (current device), ``"cuda:N"`` -> N; ValueError otherwise."""
    if not isinstance(device, str) or not device.startswith("cuda"):
        raise ValueError(f"bad device {device!r}: use 'cpu', 'cuda' or 'cuda:N'")
    if device == "cuda":
        return None
    head, sep, index = device.partition(":")
    if head != "cuda" or not sep or not index.isdigit():
        raise ValueError(f"bad device {device!r}: use 'cpu', 'cuda' or 'cuda:N'")
    return int(index)


def cuda_device_id(device: str) -> int:
    """Parse ``"cuda"`` / ``"cuda:N"`` into a CUDA device index.

    ``"cuda"`` is CuPy's current device (0 unless the caller selected another
    with ``cupy.cuda.Device(n).use()``).

    Raises:
        ValueError: ``device`` is not ``"cuda"`` or ``"cuda:N"``.
        DeviceUnavailableError: no usable CUDA device, or N is not one of them.
    """
    index = _parse_device(device)
    ok, reason = _cuda_probe()
    if not ok:
        raise DeviceUnavailableError(f"{NO_CUDA} ({reason})")
    import cupy

    if index is None:
        return int(cupy.cuda.runtime.getDevice())
    count = cupy.cuda.runtime.getDeviceCount()
    if index >= count:
        raise DeviceUnavailableError(f"{NO_CUDA}: {device} requested, {count} device(s) present")
    return index


# --------------------------------------------------------------------------
# Counters of the batched path
# --------------------------------------------------------------------------

_stats_lock = threading.Lock()
_STAT_NAMES = ("batches", "batched_tiles", "batch_retries", "tiles_cpu_fallback",
               "regions_generic", "levels_on_cpu", "scratch_bytes")
_stats = dict.fromkeys(_STAT_NAMES, 0)


def _bump(**counts: int) -> None:
    with _stats_lock:
        for name, n in counts.items():
            _stats[name] += n


def gpu_stats() -> dict[str, int]:
    """Counters of the batched region path (process-wide snapshot, all devices).

    Keys: ``batches`` (batched decode calls, one per region of an nvImageCodec
    level), ``batched_tiles`` (code streams passed to them), ``batch_retries``
    (batches that raised and were re-run tile by tile to find the bad tile),
    ``tiles_cpu_fallback`` (tiles the GPU backends could not decode that the
    CPU decoder did), ``regions_generic`` (regions of tifffile levels decoded
    on the CPU and copied, and of levels the colour check moved to the CPU),
    ``levels_on_cpu`` (levels whose GPU decode failed the colour check, see
    :data:`COLOUR_CHECK_MEAN`), ``scratch_bytes`` (bytes of scratch allocated:
    grows only while some thread reads a larger region than before).  The
    per-tile counters (tiles decoded, direct, ROI, scratch, missing, failed,
    bytes read) are in ``wsitool.decode.get_pool("cuda:N").stats()``.
    """
    with _stats_lock:
        return dict(_stats)


def reset_gpu_stats() -> None:
    """Zero the counters of :func:`gpu_stats`."""
    with _stats_lock:
        for name in _STAT_NAMES:
            _stats[name] = 0


# --------------------------------------------------------------------------
# Array back-ends of the batched path
# --------------------------------------------------------------------------


class _HostArrays:
    """numpy targets for the batched path (used by the CPU tests of the shared logic).

    Decoding a region of a CPU "device" through :func:`fill_region_batched`
    with these exercises everything but CuPy: planning, code-stream
    preparation, the one batched call, verification, scratch and colour
    handling, error filling.
    """

    xp = np
    stream_ptr = 0
    cpu_fallback = False
    #: compare the first decoded tile of each level with the CPU decoder (GPU: on)
    check_colour = False
    device_key = "cpu"
    min_scratch = 0

    def __init__(self):
        self._flat = None

    def scratch(self, nbytes: int, stats):
        """A flat uint8 buffer of at least ``nbytes``, reused; grows only when too small."""
        if self._flat is None or self._flat.nbytes < nbytes:
            self._flat = None  # give the old block back before taking a bigger one
            size = max(nbytes, self.min_scratch)
            self._flat = self.xp.empty(size, self.xp.uint8)
            stats.scratch_allocations += 1
            _bump(scratch_bytes=size)
        return self._flat

    def image(self, view):
        return nvimgcodec.as_image(view)

    def upload(self, dst, host: np.ndarray) -> None:
        dst[...] = host

    def to_host(self, arr) -> np.ndarray:
        return np.asarray(arr)

    def release(self) -> None:
        self._flat = None


class _CudaArrays(_HostArrays):
    """CuPy targets on one device, with this thread's stream and scratch."""

    cpu_fallback = True
    check_colour = True
    min_scratch = 1 << 20

    def __init__(self, device_id: int):
        import cupy

        super().__init__()
        self.xp = cupy
        self.device_id = device_id
        self.device_key = f"cuda:{device_id}"
        with cupy.cuda.Device(device_id):
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.stream_ptr = self.stream.ptr

    def image(self, view):
        return nvimgcodec.as_image(view, self.stream_ptr)

    def upload(self, dst, host: np.ndarray) -> None:
        # ``dst`` may be a strided view: copy to a contiguous device array first.
        dst[...] = self.xp.asarray(np.ascontiguousarray(host))

    def to_host(self, arr) -> np.ndarray:
        return arr.get()  # on the current (wsitool's) stream, synchronised


_local = threading.local()


def _thread_arrays(device_id: int) -> _CudaArrays:
    """This thread's CuPy back-end for ``device_id`` (stream + scratch)."""
    per_device = getattr(_local, "arrays", None)
    if per_device is None:
        per_device = _local.arrays = {}
    arrays = per_device.get(device_id)
    if arrays is None:
        arrays = per_device[device_id] = _CudaArrays(device_id)
    return arrays


def release_scratch() -> None:
    """Free the calling thread's device scratch buffers (they are reallocated on demand).

    A thread's scratch is as large as the largest RGBA region (3 bytes per
    pixel) it has read; call this after an unusually large read to give the
    memory back to CuPy's pool.  Scratch is also freed when the thread ends.
    """
    for arrays in getattr(_local, "arrays", {}).values():
        arrays.release()


# --------------------------------------------------------------------------
# The batched region read (shared by the GPU path and its CPU tests)
# --------------------------------------------------------------------------


class _Tile:
    """One tile of a batch: where it comes from and where its pixels go."""

    __slots__ = ("job", "data", "cs", "how", "size", "target", "slot")

    def __init__(self, job, data, cs, how, size, target):
        self.job = job
        self.data = data
        self.cs = cs
        self.how = how
        self.size = size  # code stream (width, height)
        self.target = target  # view of the output or of the RGB scratch
        self.slot = None  # whole-tile scratch for how == "scratch"

    @property
    def dst(self):
        return self.slot if self.how == "scratch" else self.target


def fill_region_batched(lv: "Level", x: int, y: int, w: int, h: int, out, mode: str,
                        threads: int | None, on_error: str, pool, arrays) -> None:
    """Fill ``out`` with a validated region, decoding all its tiles in one batch.

    Args:
        lv: the level; ``x, y`` level-0 location; ``w, h`` size in level pixels.
        out: ``(h, w, channels)`` output of ``arrays.xp`` (numpy or CuPy),
            C-contiguous, already checked.
        mode: ``"rgba"``, ``"rgb"`` or ``"raw"``.
        threads: CPU threads for tifffile levels (decoded on the CPU).
        on_error: ``"raise"`` or ``"fill"``.
        pool: the :class:`~wsitool.decode.DecoderPool` whose per-thread decoder
            runs the batch (``get_pool("cuda:N")`` on the GPU).
        arrays: the array back-end (:class:`_CudaArrays` / :class:`_HostArrays`).

    Raises:
        TileDecodeError: a corrupt tile with ``on_error="raise"``.
    """
    if lv._codec != "nv" or _colour_ok.get(_level_key(lv, arrays)) is False:
        _fill_on_cpu(lv, x, y, w, h, out, mode, threads, on_error, arrays)
        return
    rx, ry = level_rect(lv, x, y)
    inside, jobs = plan_tiles(lv, rx, ry, w, h)
    _fill_outside(out, rx, ry, inside)
    if not jobs:
        return
    state = pool.state()
    stats = state.stats
    direct = mode in ("rgb", "raw") and not lv._ycbcr_after_decode
    bad: list[tuple] = []  # jobs whose pixels become background

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
    if tiles and arrays.check_colour and _level_key(lv, arrays) not in _colour_ok:
        if not _check_colour(lv, tiles[0], state, arrays):
            _fill_on_cpu(lv, x, y, w, h, out, mode, threads, on_error, arrays)
            return

    # One flat scratch holds the RGB region (unless decoding straight into
    # ``out``) followed by one whole-tile slot per "scratch" tile.
    region_bytes = 0 if direct else h * w * 3
    slot_bytes = [t.size[0] * t.size[1] * 3 if t.how == "scratch" else 0 for t in tiles]
    total = region_bytes + sum(slot_bytes)
    flat = arrays.scratch(total, stats) if total else None
    rgb = out if direct else flat[:region_bytes].reshape(h, w, 3)
    offset = region_bytes
    for t, nbytes in zip(tiles, slot_bytes):
        dy0, dy1, dx0, dx1 = t.job[3]
        t.target = rgb[dy0:dy1, dx0:dx1]
        if nbytes:
            t.slot = flat[offset:offset + nbytes].reshape(t.size[1], t.size[0], 3)
            offset += nbytes

    failed = _decode_batch(lv, tiles, state, arrays)
    for t in tiles:
        col, row, src, _dst = t.job
        exc = failed.get(id(t))
        if exc is not None:
            tile_failed(exc, on_error, stats)
            bad.append(t.job)
            continue
        if t.how == "scratch":
            sx0, sy0, sx1, sy1 = src
            t.target[...] = t.slot[sy0:sy1, sx0:sx1]
        count_decoded(stats, t.how, caller_buffer=direct)

    if not direct:
        cx0, cy0, cx1, cy1 = inside
        top, bottom, left, right = cy0 - ry, cy1 - ry, cx0 - rx, cx1 - rx
        part = rgb[top:bottom, left:right]
        if lv._ycbcr_after_decode:
            part = ycbcr_to_rgb(part)
        if mode == "raw":
            out[top:bottom, left:right] = part
        else:
            out[top:bottom, left:right, :3] = part
            if mode == "rgba":
                out[top:bottom, left:right, 3] = 255
    for job in bad:  # missing and failed tiles: background, alpha 0
        dy0, dy1, dx0, dx1 = job[3]
        out[dy0:dy1, dx0:dx1] = 0


def _fill_on_cpu(lv: "Level", x: int, y: int, w: int, h: int, out, mode: str,
                 threads: int | None, on_error: str, arrays) -> None:
    """Decode the region on the CPU exactly as ``device="cpu"`` and copy it into ``out``."""
    shape, dtype = output_shape(lv, (w, h), mode)
    host = np.empty(shape, dtype)
    _fill_region(lv, x, y, w, h, host, mode, threads, on_error, get_pool("cpu"))
    arrays.upload(out, host)
    _bump(regions_generic=1)


#: Largest mean absolute difference between a GPU and a CPU decode of the same
#: tile that counts as agreement.  IDCT and chroma-upsampling differences stay
#: below 1; a wrong colour transform (e.g. a decoder that ignores the Adobe
#: APP14 "RGB" flag of Aperio tiles and converts them as YCbCr) gives tens.
COLOUR_CHECK_MEAN = 8.0

_colour_ok: dict[tuple, bool] = {}


def _level_key(lv: "Level", arrays) -> tuple:
    return (lv._path, lv.index, arrays.device_key)


def _check_colour(lv: "Level", tile: _Tile, state, arrays) -> bool:
    """Decode one whole tile of ``lv`` with the batch decoder and the CPU decoder, compare.

    Run once per level and device (result cached).  A level whose GPU decode
    disagrees is read on the CPU from then on, with a ``RuntimeWarning``;
    this guards against decoders that interpret a colour space differently
    from libjpeg-turbo / OpenJPEG (which the CPU path and its tests pin down).
    Returns True when the GPU may decode the level (also when the check could
    not run, e.g. the tile is corrupt: the region read then reports it).
    """
    col, row = tile.job[0], tile.job[1]
    try:
        cs, width, height = _codestream(lv, tile.data, col, row)
    except TileDecodeError:
        return True
    whole = (0, 0, width, height)
    probe = _Tile((col, row, whole, (0, height, 0, width)), tile.data, cs, "direct",
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
        _bump(levels_on_cpu=1)
        warnings.warn(
            f"{lv._path}: level {lv.index}: the {arrays.device_key} decode of tile (col {col}, "
            f"row {row}) differs from the CPU decode (mean |difference| {mean:.1f}); this level "
            f"is decoded on the CPU and copied to the device",
            RuntimeWarning, stacklevel=4,
        )
    return ok


def _decode_batch(lv: "Level", tiles: list[_Tile], state, arrays, *, fallback: bool = True,
                  count: bool = True) -> dict[int, TileDecodeError]:
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
            results = list(decoder.decode(streams, images=images, params=TILE_DECODE_PARAMS,
                                          cuda_stream=arrays.stream_ptr))
        except Exception:
            results = []
        if count:
            _bump(batches=1, batched_tiles=len(tiles))
        if len(results) != len(tiles):
            _bump(batch_retries=1)
            results = []
            for t, image in zip(tiles, images):
                try:
                    results.append(decoder.decode(t.cs, image=image, params=TILE_DECODE_PARAMS,
                                              cuda_stream=arrays.stream_ptr))
                except Exception as exc:
                    results.append(exc)
    for t, image, result in zip(tiles, images, results):
        col, row = t.job[0], t.job[1]
        try:
            if isinstance(result, Exception):
                raise TileDecodeError(lv._path, lv.index, col, row, f"decoder error: {result}")
            check_decoded(lv, col, row, result, image, t.dst.shape)
        except TileDecodeError as exc:
            if fallback and arrays.cpu_fallback and _cpu_fallback(lv, t, arrays):
                continue
            failed[id(t)] = exc
    return failed


def _cpu_fallback(lv: "Level", t: _Tile, arrays) -> bool:
    """Decode one tile on this thread's CPU decoder and copy it to ``t.dst``."""
    state = get_pool("cpu").state()
    col, row = t.job[0], t.job[1]
    width, height = t.size
    if t.how == "scratch":
        src = (0, 0, width, height)
    else:
        src = t.job[2]
    sx0, sy0, sx1, sy1 = src
    host = np.empty((sy1 - sy0, sx1 - sx0, 3), np.uint8)
    try:
        decode_into(lv, col, row, t.data, host, src, state, caller_buffer=False)
    except TileDecodeError:
        return False
    arrays.upload(t.dst, host)
    _bump(tiles_cpu_fallback=1)
    return True


# --------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------


def _device_for(slide: "Slide", device: str) -> int:
    try:
        return cuda_device_id(device)
    except ValueError as exc:
        raise InvalidRegionError(f"{slide.path}: {exc}") from None
    except DeviceUnavailableError as exc:
        raise DeviceUnavailableError(f"{slide.path}: {exc}") from None


def read_region_cuda(slide: "Slide", level: "Level", x: int, y: int, w: int, h: int, *,
                     out=None, mode: str = "rgba", threads: int | None = None,
                     on_error: str = "raise", device: str = "cuda"):
    """Read a validated region into a CuPy array on a CUDA device.

    Called by :func:`wsitool.region.read_region` for ``device="cuda"`` /
    ``"cuda:N"`` after it validated the request; see the module docstring
    for the decode path and the stream semantics.

    Args:
        slide: the open slide.
        level: the :class:`~wsitool.slide.Level` (already validated).
        x, y: top-left pixel in level-0 pixels; ``w, h``: size in level pixels.
        out: optional ``cupy.ndarray`` on that device, C-contiguous, of the
            exact shape and dtype of the result; filled in place and returned.
        mode: ``"rgba"`` -> ``(h, w, 4)`` uint8; ``"rgb"`` -> ``(h, w, 3)``
            uint8; ``"raw"`` -> ``(h, w, samples)`` in the level's dtype.
        threads: CPU threads for levels decoded on the CPU (tifffile levels);
            nvImageCodec levels are decoded by one batched GPU call.
        on_error: ``"raise"`` or ``"fill"`` (as on the CPU).
        device: ``"cuda"`` (CuPy's current device) or ``"cuda:N"``.

    Returns:
        ``cupy.ndarray`` (``out`` itself when given), complete on return.

    Raises:
        DeviceUnavailableError: no usable CUDA device ("no CUDA device available").
        InvalidRegionError: bad ``device`` string, or ``out`` of the wrong
            type, shape, dtype, layout or device.
        ResourceLimitError: the GPU ran out of memory for the output or scratch.
        TileDecodeError: a corrupt tile, with ``on_error="raise"``.
    """
    dev = _device_for(slide, device)
    import cupy

    shape, dtype = output_shape(level, (w, h), mode)
    with cupy.cuda.Device(dev):
        try:
            if out is None:
                out = cupy.empty(shape, dtype)
            else:
                _check_out(out, shape, dtype, slide.path, cupy.ndarray, "cupy.ndarray")
                if out.device.id != dev:
                    raise InvalidRegionError(
                        f"{slide.path}: out is on cuda:{out.device.id}, the read is on cuda:{dev}"
                    )
            arrays = _thread_arrays(dev)
            arrays.stream.wait_event(cupy.cuda.get_current_stream().record())
            try:
                with arrays.stream:
                    fill_region_batched(level, x, y, w, h, out, mode, threads, on_error,
                                        get_pool(f"cuda:{dev}"), arrays)
            finally:
                arrays.stream.synchronize()
        except cupy.cuda.memory.OutOfMemoryError as exc:
            raise ResourceLimitError(
                f"{slide.path}: out of GPU memory on cuda:{dev} reading a {w}x{h} region ({exc})"
            ) from None
    return out


def gpu_memory_sample(device: str = "cuda") -> dict[str, int]:
    """GPU memory in use now, for sampling next to RSS (``wsitool stress --device cuda``).

    Returns a dict of byte counts (ints) for the device of ``device``:

    * ``pool_used_bytes`` -- bytes of CuPy's default memory pool held by live
      arrays (``cupy.get_default_memory_pool().used_bytes()``);
    * ``pool_total_bytes`` -- bytes the pool holds from the device, used or
      cached for reuse (``.total_bytes()``);
    * ``device_used_bytes`` / ``device_total_bytes`` -- the whole device as the
      driver sees it (``cudaMemGetInfo``: total - free, and total), which also
      covers nvJPEG / nvJPEG2000 buffers allocated outside CuPy and other
      processes on the same GPU;
    * ``device`` -- the device index.

    A leak of output or scratch arrays shows in ``pool_used_bytes``; one in the
    decoders' own buffers in ``device_used_bytes``.  Cheap (no synchronisation);
    safe to call from a sampler thread.

    Raises:
        DeviceUnavailableError: no usable CUDA device.
    """
    dev = cuda_device_id(device)
    import cupy

    with cupy.cuda.Device(dev):
        pool = cupy.get_default_memory_pool()
        free, total = cupy.cuda.runtime.memGetInfo()
        return {
            "device": dev,
            "pool_used_bytes": int(pool.used_bytes()),
            "pool_total_bytes": int(pool.total_bytes()),
            "device_used_bytes": int(total - free),
            "device_total_bytes": int(total),
        }


# --------------------------------------------------------------------------
# Backend report (``wsitool info``)
# --------------------------------------------------------------------------

#: GPUs with the hardware JPEG decoder that nvJPEG's hardware backend uses
#: (NVIDIA nvJPEG documentation, "Hardware Acceleration": A100, A30, H100;
#: the H200 and GH200 carry the same Hopper NVJPG engines).  Only a hint: the
#: report probes the hardware backend with a real decode when a GPU is present.
_HW_JPEG_GPUS = ("A100", "A30", "A800", "H100", "H200", "H800", "GH200")


def _library_found(package: str, soname: str) -> bool:
    """True if ``soname`` is in the pip package ``nvidia.<package>`` or on the loader path."""
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        if glob.glob(os.path.join(root, package, "lib", soname + "*")):
            return True
    return ctypes.util.find_library(soname[3:].split(".")[0]) is not None


@functools.lru_cache(maxsize=1)
def _tiny_streams() -> dict:
    """A 64 x 64 baseline JPEG and a JPEG 2000 code stream for the backend probes.

    Encoded by nvImageCodec's CPU encoders (libjpeg-turbo / OpenJPEG), so the
    probes need nothing beyond nvImageCodec.
    """
    yy, xx = np.mgrid[0:64, 0:64]
    img = np.stack([xx * 4, yy * 4, (xx + yy) * 2], axis=-1).astype(np.uint8)
    encoder = nvimgcodec.Encoder(device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY,
                                 backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.CPU_ONLY)])
    return {"jpeg": encoder.encode(img, "jpeg"), "j2k": encoder.encode(img, "jpeg2k")}


@functools.lru_cache(maxsize=4)
def _probe_backend(kind: str, codec: str, device_id: int) -> tuple[bool, str]:
    """Decode a tiny ``codec`` stream with only backend ``kind`` on the GPU."""
    try:
        import cupy

        data = _tiny_streams()[codec]
        backend = nvimgcodec.Backend(getattr(nvimgcodec.BackendKind, kind))
        with cupy.cuda.Device(device_id):
            decoder = nvimgcodec.Decoder(device_id=device_id, max_num_cpu_threads=1,
                                         backends=[backend])
            result = decoder.decode(data)
            if result is None:
                return False, "backend present but declined a baseline test image"
            decoded = cupy.asnumpy(cupy.asarray(result))
        if decoded.shape != (64, 64, 3):
            return False, f"test decode returned shape {decoded.shape}"
        return True, "test decode ok"
    except Exception as exc:
        return False, f"test decode failed ({type(exc).__name__}: {exc})"


def _gpu_name(device_id: int) -> str:
    try:
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(device_id)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return "unknown GPU"


def _native_entry() -> dict:
    """The compiled JPEG tile loop's row of :func:`backend_report`."""
    from . import native

    status = native.status()
    return {"name": "CPU: compiled JPEG tile loop (wsitool._jpegloop)", "device": "cpu",
            "available": status.startswith("in use"),
            "decodes": "JPEG (7) RGB/YCbCr tiles of rgb/rgba/raw reads, through nvImageCodec's C API "
                       "(the same decodes, less Python per tile); device cpu",
            "detail": status}


def backend_report(probe: bool = True) -> list[dict]:
    """Which decode backends exist here and what each decodes (for ``wsitool info``).

    Args:
        probe: with a GPU present, check each GPU backend with a tiny real
            decode (done once per process, a fraction of a second).

    Returns:
        A list of dicts, one per backend: ``name``, ``device`` (``"cpu"`` or
        ``"cuda"``), ``available`` (bool), ``decodes`` (which compressions it
        decodes and for which ``device=`` argument) and ``detail`` (why it is
        or is not available: the GPU's name, the missing library or
        package).  JSON-serialisable.
    """
    ok, reason = _cuda_probe()
    nvjpeg_lib = _library_found("nvjpeg", "libnvjpeg.so")
    nvjpeg2k_lib = _library_found("nvjpeg2k", "libnvjpeg2k.so")
    gpu = _gpu_name(0) if ok else None

    def gpu_entry(name, kind, codec, lib_found, lib_pkg, decodes):
        if not ok:
            missing = "" if lib_found else f"; {lib_pkg} not installed"
            return {"name": name, "device": "cuda", "available": False, "decodes": decodes,
                    "detail": f"{NO_CUDA}: {reason}{missing}"}
        # The probe (a real decode) is authoritative; the library search is a
        # hint only (nvImageCodec also finds its libraries by other paths).
        if probe:
            works, why = _probe_backend(kind, codec, 0)
        else:
            works, why = lib_found, "library found, not probed" if lib_found else "not probed"
        if not works and not lib_found:
            why += f"; library not found (pip install {lib_pkg})"
        return {"name": name, "device": "cuda", "available": bool(works), "decodes": decodes,
                "detail": f"{gpu}: {why}"}

    hw_hint = any(tag in (gpu or "") for tag in _HW_JPEG_GPUS)
    hw = gpu_entry("CUDA: nvJPEG hardware engine", "HW_GPU_ONLY", "jpeg", nvjpeg_lib,
                   "nvidia-nvjpeg-cu12", "baseline JPEG (7); device cuda, tried first")
    if ok:
        hw["detail"] += "; this GPU model " + ("has" if hw_hint else "is not listed with") + \
            " a JPEG engine (nvJPEG docs)"
    return [
        {"name": "CPU: nvImageCodec (libjpeg-turbo, OpenJPEG)", "device": "cpu", "available": True,
         "decodes": "JPEG (7) RGB/YCbCr, JPEG 2000 (33003, 33005, 34712); device cpu, "
                    "and fallback for device cuda",
         "detail": "always available"},
        gpu_entry("CUDA: nvJPEG", "GPU_ONLY", "jpeg", nvjpeg_lib, "nvidia-nvjpeg-cu12",
                  "JPEG (7) RGB/YCbCr; device cuda"),
        hw,
        gpu_entry("CUDA: nvJPEG2000", "GPU_ONLY", "j2k", nvjpeg2k_lib, "nvidia-nvjpeg2k-cu12",
                  "JPEG 2000 (33003, 33005, 34712); device cuda"),
        _native_entry(),
        {"name": "CPU: tifffile + imagecodecs", "device": "cpu", "available": True,
         "decodes": "all other compressions (none, LZW, deflate, zstd, WebP, gray/CMYK JPEG, "
                    "16-bit); device cuda: decoded on the CPU, then copied",
         "detail": "always available"},
    ]
