"""The per-thread nvImageCodec decoder pool: one decoder per thread, created and used under a mutex (floor 3).

Rules this module exists to keep:

* **One decoder per thread.**  nvImageCodec decoders are not safe to share: one
  decoder used by several threads without a lock returned ``None`` for some
  decodes in our tests, and shared decoders are the cause of the loader-thread
  crashes reported by users of other readers.  Each thread that decodes gets
  its own ``nvidia.nvimgcodec.Decoder``, created under the pool's mutex and
  always called while holding its thread state's lock.  A decoder lives as
  long as its thread (``threading.local``).
* **One pool per device and process.**  :func:`get_pool` hands out the
  process's pool; a forked child gets new pools (:mod:`wsitool.ground.forksafe`).
* Per-thread scratch and read buffers are made once and reused; their
  allocations are counted in :class:`DecodeStats`.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import DeviceUnavailableError, InvalidOptionError
from ..ground.device import cuda_device_id
from ..ground.forksafe import PerProcess
from .library import nv

__all__ = ["DecodeStats", "ThreadState", "DecoderPool", "get_pool"]


@dataclasses.dataclass
class DecodeStats:
    """Counters of one thread's decoding work; :meth:`DecoderPool.stats` sums them.

    Fields (all counts): ``decoders_created``; ``tiles_decoded`` (all tiles);
    ``tiles_direct`` (whole tile decoded straight into the caller's buffer);
    ``tiles_roi`` (sub-region of a tile decoded straight into the caller's
    buffer); ``tiles_scratch`` (decoded into a scratch buffer and copied);
    ``tiles_generic`` (decoded by tifffile/imagecodecs); ``tiles_missing``
    (offset or byte count 0, filled with background); ``tiles_failed`` (raised
    or filled after an error); ``scratch_allocations``; ``bytes_read``;
    ``tiles_openjpeg`` (J2K tiles decoded by the OpenJPEG window path,
    :mod:`wsitool.codec.openjpeg`), ``window_copies`` (its copies of a decoded
    window into the destination: one per such tile, never of a whole tile
    unless the whole tile was wanted) and ``tiles_reduced`` (of those, decoded
    at a reduced resolution); ``tiles_scaled`` (JPEG tiles of a scaled level
    decoded at 1/2, 1/4 or 1/8 by Pillow, :mod:`wsitool.codec.scaled`);
    ``tiles_spliced`` (of ``tiles_decoded``, NDPI restart intervals the compiled
    loop decoded in a band spliced into one JPEG code stream, :mod:`wsitool.codec.jpegloop`).
    """

    decoders_created: int = 0
    tiles_decoded: int = 0
    tiles_direct: int = 0
    tiles_roi: int = 0
    tiles_scratch: int = 0
    tiles_generic: int = 0
    tiles_missing: int = 0
    tiles_failed: int = 0
    scratch_allocations: int = 0
    bytes_read: int = 0
    tiles_openjpeg: int = 0
    window_copies: int = 0
    tiles_reduced: int = 0
    tiles_scaled: int = 0
    tiles_spliced: int = 0

    def add(self, other: DecodeStats) -> None:
        """Add ``other``'s counters to these (in place)."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


class ThreadState:
    """Decoder, its lock, scratch buffers and counters of one thread."""

    def __init__(self, pool: DecoderPool, stats: DecodeStats):
        self.pool = pool
        self.stats = stats
        self.lock = threading.Lock()
        self._decoder: Any = None
        self._slots: dict[str, Any] = {}
        self._encoder: Any = None
        self._scratch: dict[tuple, np.ndarray] = {}
        self._tile_views: dict[tuple, tuple] = {}
        self._read_bufs: dict[int, tuple[np.ndarray, memoryview]] = {}

    @property
    def decoder(self):
        if self._decoder is None:
            self._decoder = self.pool._create_decoder()
            self.stats.decoders_created += 1
        return self._decoder

    def slot(self, key: str, factory: Callable[[], Any]) -> Any:
        """This thread's object ``key`` (e.g. the compiled loop's decoder), made by
        ``factory()`` on first use under the pool's mutex and counted in
        ``decoders_created``; call under ``lock``."""
        obj = self._slots.get(key)
        if obj is None:
            with self.pool._create_lock:
                obj = self._slots[key] = factory()
            self.stats.decoders_created += 1
        return obj

    @property
    def encoder(self):
        """This thread's nvImageCodec encoder (created on first use; call under ``lock``)."""
        if self._encoder is None:
            self._encoder = self.pool._create_encoder()
        return self._encoder

    def scratch(self, shape: tuple[int, ...], dtype=np.uint8) -> np.ndarray:
        """A C-contiguous buffer of ``shape``, reused across calls on this thread."""
        key = (shape, np.dtype(dtype).str)
        buf = self._scratch.get(key)
        if buf is None:
            buf = np.empty(shape, dtype)
            self._scratch[key] = buf
            self.stats.scratch_allocations += 1
        return buf

    def tile_rgb(self, tile_h: int, tile_w: int, h: int, w: int):
        """``(flat, view, image)``: this thread's RGB scratch for tiles of
        ``tile_h x tile_w`` pixels, ``flat`` a 1-D uint8 buffer of
        ``tile_h * tile_w * 3 + 4`` bytes (the spare bytes let
        :func:`wsitool.read.worker.widen_rgba` read whole 32-bit words), ``view`` its
        first ``h * w`` pixels as ``(h, w, 3)`` uint8 and ``image`` the nvImageCodec
        image of ``view``.  The triple for the whole-tile shape is made once per
        thread and reused (wrapping a numpy view costs about 6-7 us, against
        about 300 us for decoding a 240 x 240 JPEG tile); other shapes are made
        per call, so the cache holds one entry per tile size."""
        key = (tile_h, tile_w, h, w)
        hit = self._tile_views.get(key)
        if hit is None:
            flat = self.scratch((tile_h * tile_w * 3 + 4,))
            view = flat[: h * w * 3].reshape(h, w, 3)
            hit = (flat, view, nv().as_image(view))
            if (h, w) == (tile_h, tile_w):
                self._tile_views[key] = hit
        return hit

    def tile_shapes(self) -> list[tuple[int, int, int, int]]:
        """Keys ``(tile_h, tile_w, h, w)`` of the wrapped RGB scratch views this thread keeps."""
        return list(self._tile_views)

    def read_buffer(self, nbytes: int, slot: int = 0) -> tuple[np.ndarray, memoryview]:
        """A uint8 buffer of at least ``nbytes`` bytes (and its memoryview), reused
        by this thread for tile bytes.  ``slot`` selects one of several buffers
        (a batch of tiles needs one per tile).  A buffer larger than
        :data:`_READ_BUFFER_KEEP` is a one-off allocation that is not kept."""
        kept = self._read_bufs.get(slot)
        if kept is not None and len(kept[0]) >= nbytes:
            return kept
        size = max(nbytes, 2 * len(kept[0]) if kept is not None else 65536)
        buf = np.empty(size, np.uint8)
        pair = (buf, memoryview(buf))  # type: ignore[arg-type]  # numpy's stubs: no __buffer__ before 3.12
        if size <= _READ_BUFFER_KEEP:
            self._read_bufs[slot] = pair
            self.stats.scratch_allocations += 1
        return pair


#: Largest per-thread tile-bytes buffer kept between reads (bytes).
_READ_BUFFER_KEEP = 16 << 20


class DecoderPool:
    """Per-thread nvImageCodec decoders for one device.

    Args:
        device: ``"cpu"`` (CPU backends only, ``device_id=NVIMGCODEC_DEVICE_CPU_ONLY``)
            or ``"cuda"`` / ``"cuda:N"`` (GPU backends, CPU as fallback).

    Each thread calling :meth:`state` gets its own decoder, created lazily
    under the pool's mutex; the pool keeps only the per-thread counters, so a
    decoder is released when its thread ends.  The same per-thread state
    also holds an nvImageCodec encoder (``state().encoder``, used by
    :mod:`wsitool.export`), created the same way on first use; the pool
    counts them in ``encoders_created``.

    Raises:
        DeviceUnavailableError: ``device`` is a CUDA device and none is usable.
    """

    def __init__(self, device: str = "cpu"):
        self.device = device
        self._create_lock = threading.Lock()
        self._local = threading.local()
        self._all_stats: list[DecodeStats] = []  # of the live threads' states
        self._retired = DecodeStats()  # counters of threads that have ended
        # states whose threads ended, waiting to be folded into _retired: filled by a finalizer,
        # which the garbage collector may run inside any critical section of this pool (even one
        # holding _create_lock, a plain Lock): so it takes no lock (list.append is atomic)
        self._retiring: list[DecodeStats] = []
        self.encoders_created = 0
        if device == "cpu":
            self._device_id = None  # nvImageCodec's CPU-only id, looked up at the first decoder
        elif device.startswith("cuda"):
            self._device_id = cuda_device_id(device)
        else:
            raise InvalidOptionError(f"unknown device {device!r}: use 'cpu' or 'cuda[:N]'")

    def _create(self, cls, what: str):
        """One nvImageCodec ``Decoder`` or ``Encoder`` for this pool's device.

        CPU: the CPU backend only (``device_id=NVIMGCODEC_DEVICE_CPU_ONLY``;
        without it the library tries the GPU and fails on machines without
        one).  CUDA: GPU backends first (the hardware JPEG engine for
        decoders), the CPU backend as fallback.  One CPU thread per instance:
        parallelism comes from our own per-thread instances.
        """
        kinds = [nv().BackendKind.CPU_ONLY]
        # (a pool for the imagecodecs path, without nvImageCodec, never gets here)
        device_id = nv().NVIMGCODEC_DEVICE_CPU_ONLY if self._device_id is None else self._device_id
        if self.device != "cpu":
            gpu = [nv().BackendKind.GPU_ONLY, nv().BackendKind.HYBRID_CPU_GPU]
            if cls is nv().Decoder:
                gpu.insert(0, nv().BackendKind.HW_GPU_ONLY)
            kinds = gpu + kinds
        with self._create_lock:
            try:
                return cls(device_id=device_id, max_num_cpu_threads=1,
                           backends=[nv().Backend(k) for k in kinds])
            except Exception as exc:  # pragma: no cover - depends on the machine
                raise DeviceUnavailableError(
                    f"could not create an nvImageCodec {what} for {self.device}: {exc}"
                ) from exc

    def _create_encoder(self):
        """A new per-thread encoder (see :meth:`_create`); counted in ``encoders_created``."""
        encoder = self._create(nv().Encoder, "encoder")
        with self._create_lock:
            self.encoders_created += 1
        return encoder

    def _create_decoder(self):
        """A new per-thread decoder (see :meth:`_create`)."""
        return self._create(nv().Decoder, "decoder")

    def state(self) -> ThreadState:
        """The calling thread's decoder state (created on first use)."""
        st = getattr(self._local, "state", None)
        if st is None:
            stats = DecodeStats()
            with self._create_lock:
                self._fold_retired()   # (so that the list stays as long as the live threads)
                self._all_stats.append(stats)
            st = ThreadState(self, stats)
            self._local.state = st
            # a thread's state goes with the thread (threading.local); its counters stay,
            # folded into one total, so that exports and reads that start threads do not
            # grow this pool's bookkeeping
            weakref.finalize(st, self._retire, stats)
        return st

    def _retire(self, stats: DecodeStats) -> None:
        """A thread's state was collected: its counters are folded in later (:meth:`_fold_retired`).

        Runs as a ``weakref.finalize`` callback, at any allocation of any thread:
        taking ``_create_lock`` here deadlocked a thread that held it while creating a
        decoder (the collection ran inside ``factory()``)."""
        self._retiring.append(stats)

    def _fold_retired(self) -> None:
        """Move the states of ended threads into ``_retired``; call under ``_create_lock``."""
        while self._retiring:
            stats = self._retiring.pop()
            for i, s in enumerate(self._all_stats):
                if s is stats:
                    del self._all_stats[i]
                    self._retired.add(stats)
                    break

    def stats(self) -> DecodeStats:
        """Sum of all threads' counters (a snapshot, new object)."""
        total = DecodeStats()
        with self._create_lock:
            self._fold_retired()
            total.add(self._retired)
            for s in self._all_stats:
                total.add(s)
        return total

    def reset_stats(self) -> None:
        """Zero every thread's counters.  Call it while no thread decodes: the
        counters are updated without a lock, so a concurrent update may be lost."""
        with self._create_lock:
            self._fold_retired()
            for s in [*self._all_stats, self._retired]:
                for f in dataclasses.fields(s):
                    setattr(s, f.name, 0)


class _Pools:
    """This process's pools by device name."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_device: dict[str, DecoderPool] = {}


_pools: PerProcess[_Pools] = PerProcess(_Pools)


def get_pool(device: str = "cpu") -> DecoderPool:
    """This process's :class:`DecoderPool` of ``device`` (created once; anew in a forked child).

    Raises:
        InvalidOptionError: unknown device string (also a ValueError).
        DeviceUnavailableError: a CUDA device without a usable GPU.
    """
    pools = _pools.get()
    with pools.lock:
        pool = pools.by_device.get(device)
        if pool is None:
            pool = pools.by_device[device] = DecoderPool(device)
        return pool
