"""Where the GPU path's pixels live: numpy or CuPy targets per thread, device scratch, counters, memory
samples (floor 4).

CuPy (the optional ``gpu`` extra) is imported inside the functions and classes
that need a device.  :class:`HostArrays` gives the batched path numpy targets, so
its logic runs (and is tested) without a GPU.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..codec.library import nv
from ..codec.pool import DecodeStats
from ..ground.device import cuda_device_id

__all__ = ["HostArrays", "CudaArrays", "thread_arrays", "release_scratch", "bump", "gpu_stats",
           "reset_gpu_stats", "gpu_memory_sample"]


_stats_lock = threading.Lock()


_STAT_NAMES = ("batches", "batched_tiles", "batch_retries", "tiles_cpu_fallback",
               "regions_generic", "levels_on_cpu", "scratch_bytes")


_stats = dict.fromkeys(_STAT_NAMES, 0)


def bump(**counts: int) -> None:
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
    bytes read) are in ``wsitool.codec.pool.get_pool("cuda:N").stats()``.
    """
    with _stats_lock:
        return dict(_stats)


def reset_gpu_stats() -> None:
    """Zero the counters of :func:`gpu_stats`."""
    with _stats_lock:
        for name in _STAT_NAMES:
            _stats[name] = 0


class HostArrays:
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

    def __init__(self) -> None:
        self._flat: Any = None

    def scratch(self, nbytes: int, stats: DecodeStats) -> Any:
        """A flat uint8 buffer of at least ``nbytes``, reused; grows only when too small."""
        if self._flat is None or self._flat.nbytes < nbytes:
            self._flat = None  # give the old block back before taking a bigger one
            size = max(nbytes, self.min_scratch)
            self._flat = self.xp.empty(size, self.xp.uint8)
            stats.scratch_allocations += 1
            bump(scratch_bytes=size)
        return self._flat

    def image(self, view: Any) -> Any:
        """The nvImageCodec image over ``view`` (the decoder's target)."""
        return nv().as_image(view)

    def upload(self, dst: Any, host: np.ndarray) -> None:
        """Copy the host array ``host`` into ``dst``."""
        dst[...] = host

    def to_host(self, arr: Any) -> np.ndarray:
        """``arr`` as a numpy array."""
        return np.asarray(arr)

    def release(self) -> None:
        self._flat = None


class CudaArrays(HostArrays):
    """CuPy targets on one device, with this thread's stream and scratch."""

    cpu_fallback = True
    check_colour = True
    min_scratch = 1 << 20

    def __init__(self, device_id: int) -> None:
        import cupy

        super().__init__()
        self.xp = cupy
        self.device_id = device_id
        self.device_key = f"cuda:{device_id}"
        with cupy.cuda.Device(device_id):
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.stream_ptr = self.stream.ptr

    def image(self, view: Any) -> Any:
        return nv().as_image(view, self.stream_ptr)

    def upload(self, dst: Any, host: np.ndarray) -> None:
        # ``dst`` may be a strided view: copy to a contiguous device array first.
        dst[...] = self.xp.asarray(np.ascontiguousarray(host))

    def to_host(self, arr: Any) -> np.ndarray:
        return arr.get()  # on the current (wsitool's) stream, synchronised


_local = threading.local()


def thread_arrays(device_id: int) -> CudaArrays:
    """This thread's CuPy back-end for ``device_id`` (stream + scratch)."""
    per_device = getattr(_local, "arrays", None)
    if per_device is None:
        per_device = _local.arrays = {}
    arrays = per_device.get(device_id)
    if arrays is None:
        arrays = per_device[device_id] = CudaArrays(device_id)
    return arrays


def release_scratch() -> None:
    """Free the calling thread's device scratch buffers (they are reallocated on demand).

    A thread's scratch is as large as the largest RGBA region (3 bytes per
    pixel) it has read; call this after an unusually large read to give the
    memory back to CuPy's pool.  Scratch is also freed when the thread ends.
    """
    for arrays in getattr(_local, "arrays", {}).values():
        arrays.release()


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


