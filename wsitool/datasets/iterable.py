"""The iterable dataset: whole batches, sharded by rank and worker, shuffled from (seed, epoch)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os

import numpy as np

from ..errors import InvalidRegionError
from ._torch import IterableDataset, get_worker_info
from .buffers import _Batch, _BatchPool, current_board
from .mapstyle import _stack
from .order import epoch_order, rank_shard
from .reader import _Reader

# --------------------------------------------------------------------- iterable


def _shared_int(value: int):
    return multiprocessing.RawValue("q", int(value))


class PatchIterableDataset(_Reader, IterableDataset):
    """Batches of patches of one or many plans, sharded by rank and worker, shuffled per epoch.

    Use it with ``DataLoader(dataset, batch_size=None, num_workers=...)``: it
    yields whole batches ``(patches, coords)``, ``patches`` a uint8 tensor
    ``(b, 3, h, w)`` (contiguous, or in ``torch.channels_last`` memory format
    with ``channels_last``; through ``transform`` per patch if given), ``coords`` a dict of ``(b,)`` int64
    tensors ``index``, ``slide``, ``x``, ``y``; ``b == batch_size`` except for
    the last batch of a rank (none shorter with ``drop_last``).

    Each epoch (:meth:`set_epoch`):

    1. the order of all patches (:func:`epoch_order`): row-major without
       ``shuffle``; with it, from ``default_rng([seed, epoch])``, the same on every
       rank and worker: a *window shuffle* (default), or a full permutation
       with ``shuffle_window=None``;
    2. this rank's contiguous share of it (:func:`rank_shard`), the ranks
       partitioning the patches exactly; the rank and world size come from
       ``rank``/``world_size`` if given, else from ``torch.distributed`` when it
       is initialised, else 0 and 1;
    3. with ``shuffle``, the share is cut into windows of ``shuffle_window *
       batch_size`` patches (``batch_size`` with ``shuffle_window=None``), dealt
       to the ``DataLoader``'s workers in turn; a worker reads a window's
       patches with one ``read_patches`` call in row-major order (tiles shared
       between them) and yields its batches in the shuffled order.  Without
       ``shuffle``, the share's batches are split into one contiguous run per
       worker, which the worker streams (``read_patches`` batch by batch, tiles
       shared also with the next batch).

    The window shuffle is the trade between randomness and decoding: patches
    of one window are neighbours on the slide (tiles shared), taken in random
    order and the windows in random order; a batch mixes the patches of one
    window.  A full permutation decodes up to ~4x the tiles for patches smaller
    than the tiles.  Which patches form each batch depends on the plans,
    ``batch_size``, ``shuffle``, ``shuffle_window``, ``seed``, the epoch, the rank and the
    world size; the order in which the batches arrive also on ``num_workers``
    (the ``DataLoader`` takes one batch from each worker in turn).

    Memory per worker: with ``shuffle``, the window being read
    (``shuffle_window * batch_size`` patches, e.g. 4 x 64 x 224 x 224 x 3 =
    38.5 MB), without it one batch; plus the batch being yielded, the open
    slides and ``cache_bytes``.

    The epoch is kept in shared memory: :meth:`set_epoch` in the main process
    reaches workers started before it (``persistent_workers=True``).

    Args:
        plans, transform, channels_last, max_open_slides, cache_bytes, threads: as
            :class:`PatchDataset`.
        batch_size: patches per batch.
        shuffle: shuffle per epoch (default True).
        seed: the shuffle's seed (an int >= 0).
        shuffle_window: batches per window (default 4), or None for a full permutation.
        drop_last: every rank yields the same number of full batches
            (``len(plans) // world_size // batch_size``).
        rank, world_size: this process's rank and the number of ranks (both or neither).
        reuse_buffers: in ``DataLoader`` workers, fill a batch's shared memory again once the
            main process has dropped every tensor on it (default True; about 20 % less CPU a
            patch).  A batch the main process keeps is never overwritten; one it hands on to
            another process (a ``multiprocessing`` queue, say) and then drops may be, so clone
            such batches or pass False (fresh shared memory for every batch).

    Raises:
        InvalidRegionError: as :class:`PatchDataset`, or a bad batch_size, seed,
            shuffle_window, rank or world_size.
    """

    def __init__(self, plans, *, batch_size: int = 64, shuffle: bool = True, seed: int = 0,
                 shuffle_window: int | None = 4, drop_last: bool = False, rank: int | None = None,
                 world_size: int | None = None, transform=None, channels_last: bool = False,
                 max_open_slides: int = 8, cache_bytes: int = 0, threads: int = 1, reuse_buffers: bool = True):
        _Reader.__init__(self, plans, transform=transform, channels_last=channels_last,
                         max_open_slides=max_open_slides, cache_bytes=cache_bytes, threads=threads)
        self.reuse_buffers = bool(reuse_buffers)
        if int(batch_size) < 1:
            raise InvalidRegionError(f"batch_size must be >= 1, got {batch_size!r}")
        if int(seed) < 0:
            raise InvalidRegionError(f"seed must be >= 0, got {seed!r}")
        if shuffle_window is not None and int(shuffle_window) < 1:
            raise InvalidRegionError(f"shuffle_window must be >= 1 or None, got {shuffle_window!r}")
        if (rank is None) != (world_size is None):
            raise InvalidRegionError("give both rank and world_size, or neither")
        if world_size is not None and rank is not None and not (int(world_size) >= 1 and
                                                                0 <= int(rank) < int(world_size)):
            raise InvalidRegionError(f"need world_size >= 1 and 0 <= rank < world_size, got rank {rank!r}, "
                                     f"world_size {world_size!r}")
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.shuffle_window = None if shuffle_window is None else int(shuffle_window)
        self.drop_last = bool(drop_last)
        self._explicit = None if rank is None or world_size is None else (int(rank), int(world_size))
        self._dist_seen = (0, 1)
        self._dist_seen = self._dist()
        self._epoch = _shared_int(0)

    # -- pickling: the shared epoch travels only to processes being started
    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_dist_seen"] = self._dist()
        if multiprocessing.context.get_spawning_popen() is None:   # not starting a process: a plain int
            state["_epoch"] = self.epoch
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        if isinstance(self._epoch, int):
            self._epoch = _shared_int(self._epoch)

    @property
    def epoch(self) -> int:
        """The current epoch (:meth:`set_epoch`)."""
        return int(self._epoch.value)

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch`` (an int >= 0) from the next iteration on, in this process and its workers."""
        if int(epoch) < 0:
            raise InvalidRegionError(f"epoch must be >= 0, got {epoch!r}")
        self._dist_seen = self._dist()
        self._epoch.value = int(epoch)

    def _dist(self) -> tuple[int, int]:
        if self._explicit is not None:
            return self._explicit
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return dist.get_rank(), dist.get_world_size()
        except (ImportError, RuntimeError):  # pragma: no cover - torch built without distributed
            pass
        return self._dist_seen

    @property
    def _window(self) -> int:
        return self.batch_size * (self.shuffle_window or 1)

    def _window_param(self) -> int | None:
        return None if self.shuffle_window is None else self._window

    def shard(self, epoch: int | None = None) -> np.ndarray:
        """This rank's patch indices for ``epoch`` (default: the current one), in the epoch's order.

        Returns ``(m,)`` int64 indices into the plans' concatenated rows (the
        ``index`` coordinate); with ``drop_last``, cut to whole batches.
        """
        rank, world = self._dist()
        order = epoch_order(self._table.sorted, shuffle=self.shuffle, seed=self.seed,
                            epoch=self.epoch if epoch is None else int(epoch), window=self._window_param())
        share = rank_shard(order, rank, world, drop_last=self.drop_last)
        if self.drop_last:
            share = share[:len(share) // self.batch_size * self.batch_size]
        return share

    def __len__(self) -> int:
        """Batches this rank yields per epoch."""
        rank, world = self._dist()
        n = len(self._table)
        m = n // world if self.drop_last else (rank + 1) * n // world - rank * n // world
        return m // self.batch_size if self.drop_last else -(-m // self.batch_size)

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        share = self.shard()
        bs = self.batch_size
        if not self.shuffle:
            # worker w streams the w-th of `workers` contiguous runs of whole batches
            nb = -(-len(share) // bs)
            part = share[worker * nb // workers * bs:(worker + 1) * nb // workers * bs]
            done = 0
            for arr in self._stream(part, bs):
                yield self._emit(arr, None, part[done:done + len(arr)])
                done += len(arr)
            return
        win = self._window
        for start in range(worker * win, len(share), workers * win):
            part = share[start:start + win]
            buf, where = self._read_window(part)     # row-major within the window
            for b in range(0, len(part), bs):
                yield self._emit(buf, where[b:b + bs], part[b:b + bs])
            del buf

    def _emit(self, src: np.ndarray, rows: np.ndarray | None, idx: np.ndarray):
        info = get_worker_info()
        if self.transform is not None:
            patches = _stack([self.transform(p) for p in self._tensor(src, rows)])
            return patches, self._coords(idx, info is not None)
        if info is None or current_board() is None or not self.reuse_buffers:
            return self._tensor(src, rows, shared=True), self._coords(idx, info is not None)
        pool = self._batches
        if pool is None or pool.pid != os.getpid():
            pool = self._batches = _BatchPool(current_board(), info.id)
        n = len(src) if rows is None else len(rows)
        storage, entry, token = pool.take(n * src.shape[1] * src.shape[2] * 3)
        return _Batch(self._tensor(src, rows, storage=storage), self._coords4(idx, True), entry, token)
