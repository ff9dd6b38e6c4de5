"""What both datasets share: the plans, the slides, the cache and the batch reads."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os

import numpy as np

from ..errors import InvalidRegionError
from ._torch import get_worker_info, torch
from .buffers import _COORD_KEYS, _adopt_board, _BatchPool, _empty, _release_board, _view
from .slides import _INHERITED, _SlidePool, _Table


class _Reader:
    """What both datasets share: the table, the per-process slides, the conversion to tensors."""

    def __init__(self, plans, *, transform, channels_last: bool, max_open_slides: int, cache_bytes: int,
                 threads: int):
        self._table = _Table(plans)
        if int(max_open_slides) < 1:
            raise InvalidRegionError(f"max_open_slides must be >= 1, got {max_open_slides!r}")
        if int(cache_bytes) < 0:
            raise InvalidRegionError(f"cache_bytes must be >= 0, got {cache_bytes!r}")
        if int(threads) < 1:
            raise InvalidRegionError(f"threads must be >= 1, got {threads!r}")
        self.transform = transform
        self.channels_last = bool(channels_last)
        self.max_open_slides = int(max_open_slides)
        self.cache_bytes = int(cache_bytes)
        self.threads = int(threads)
        self._pool: _SlidePool | None = None
        self._batches: _BatchPool | None = None
        self._wbuf: np.ndarray | None = None     # the window buffer (_read_window), per process
        _release_board()     # made here, in the main process, before any worker starts

    # -- pickling: by path, never with open slides; the release board only to processes being started
    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_pool"] = None
        state["_batches"] = None
        state["_wbuf"] = None
        if multiprocessing.context.get_spawning_popen() is not None:
            state["_board"] = _release_board()
        return state

    def __setstate__(self, state: dict) -> None:
        _adopt_board(state.pop("_board", None))
        self.__dict__.update(state)

    @property
    def paths(self) -> list[str]:
        """The slide path of each plan, in the order of the ``slide`` coordinate."""
        return self._table.paths()

    @property
    def patch_shape(self) -> tuple[int, int, int]:
        """Shape of one patch as returned (before ``transform``): ``(3, h, w)``."""
        s = self._table.size
        return (3, s, s)

    def _slides(self) -> _SlidePool:
        pool = self._pool
        if pool is None or pool.pid != os.getpid():
            if pool is not None:      # inherited through fork: never used nor closed here
                _INHERITED.append(pool)
            pool = self._pool = _SlidePool(self.max_open_slides, self.cache_bytes)
        return pool

    def close(self) -> None:
        """Close the slides this process opened (they are opened again on the next read)."""
        pool = self._pool
        if pool is not None and pool.pid == os.getpid():
            pool.close()
        self._pool = None

    def _read_sorted(self, idx: np.ndarray, out: np.ndarray) -> None:
        """Fill ``out[k]`` with patch ``idx[k]``; ``idx`` grouped by slide (each slide's run is read at once)."""
        t = self._table
        pool = self._slides()
        sl = t.slide[idx]
        starts = np.flatnonzero(np.r_[True, sl[1:] != sl[:-1]])
        ends = np.r_[starts[1:], len(idx)]
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            s = int(sl[a])
            ref = t.refs[s]
            slide = pool.get(ref, s)
            sel = idx[a:b]
            locs = np.stack([t.x[sel], t.y[sel]], 1)
            slide.read_patches(locs, **ref.read_kwargs(), batch_size=max(1, min(b - a, 256)),
                               threads=self.threads, out=out[a:b])

    def _read_window(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Patches ``idx`` read in row-major order: ``(buf, where)``, patch ``idx[k]`` being ``buf[where[k]]``.

        ``buf`` is this reader's window buffer, overwritten by the next call (the callers copy the
        patches out first).  A fresh array per window (38.5 MB for 4 x 64 patches of 224) made
        glibc raise its mmap threshold on the first free and keep later windows on the heap:
        +23 MB of resident memory per worker after the first epoch (scripts/bench_torch.py
        ``--only rss``), flat with one buffer kept."""
        idx = np.asarray(idx, np.int64)
        s = self._table.size
        reading = np.argsort(self._table.rank[idx], kind="stable")
        need = len(idx) * s * s * 3
        if self._wbuf is None or self._wbuf.size < need:
            self._wbuf = np.empty(need, np.uint8)
        buf = self._wbuf[:need].reshape(len(idx), s, s, 3)
        self._read_sorted(idx[reading], buf)
        where = np.empty_like(reading)
        where[reading] = np.arange(len(idx))
        return buf, where

    def _stream(self, idx: np.ndarray, batch_size: int):
        """``(b, h, w, 3)`` arrays of patches ``idx`` (in row-major order) in batches of ``batch_size``
        (the last may be shorter), each slide's run read by one ``read_patches`` iteration, so a
        batch shares decoded tiles with the next one (:class:`wsitool.read.patches.PatchReader`)."""
        t = self._table
        pool = self._slides()
        sl = t.slide[idx]
        starts = np.flatnonzero(np.r_[True, sl[1:] != sl[:-1]]) if len(idx) else np.empty(0, np.int64)
        ends = np.r_[starts[1:], len(idx)]
        pending: list[np.ndarray] = []
        held = 0
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            s = int(sl[a])
            ref = t.refs[s]
            slide = pool.get(ref, s)
            if held:                       # complete the batch the last slide left open
                head = min(batch_size - held, b - a)
                buf = np.empty((head, t.size, t.size, 3), np.uint8)
                self._read_sorted(idx[a:a + head], buf)
                pending.append(buf)
                held += head
                a += head
                if held == batch_size:
                    yield np.concatenate(pending)
                    pending, held = [], 0
            if a < b:
                sel = idx[a:b]
                for arr in slide.read_patches(np.stack([t.x[sel], t.y[sel]], 1), **ref.read_kwargs(),
                                              batch_size=batch_size, threads=self.threads):
                    if len(arr) == batch_size:
                        yield arr
                    else:                  # the run's last, shorter batch
                        pending, held = [arr], len(arr)
        if held:
            yield np.concatenate(pending)

    def _coords4(self, idx: np.ndarray, shared: bool):
        """``(4, n)`` int64 tensor: rows index, slide, x, y of patches ``idx`` (one storage, so a
        worker sends one, not four; in shared memory with ``shared``)."""
        t = self._table
        out = _empty((4, len(idx)), torch.int64, shared)
        dst = out.numpy()
        dst[0] = idx
        dst[1] = t.slide[idx]
        dst[2] = t.x[idx]
        dst[3] = t.y[idx]
        return out

    def _coords(self, idx: np.ndarray, shared: bool = False) -> dict:
        return dict(zip(_COORD_KEYS, self._coords4(idx, shared), strict=True))

    def _tensor(self, src: np.ndarray, rows: np.ndarray | None = None, *, shared: bool = False,
                storage=None):
        """Patches ``src[rows]`` (``src``: ``(n, h, w, 3)`` uint8; all of it without ``rows``) as an
        ``(n, 3, h, w)`` uint8 tensor: contiguous, or in ``torch.channels_last`` memory format
        (no copy of ``src`` then, unless ``rows``, ``shared`` or ``storage``).  ``shared``: in a
        ``DataLoader`` worker, made in shared memory (what the worker sends is then not copied
        again).  ``storage``: an untyped storage of at least ``n * h * w * 3`` bytes to put it in."""
        share = shared and get_worker_info() is not None
        if self.channels_last and rows is None and not share and storage is None:
            return torch.from_numpy(src).permute(0, 3, 1, 2)
        n = len(src) if rows is None else len(rows)
        h, w = src.shape[1:3]
        shape = (n, h, w, 3) if self.channels_last else (n, 3, h, w)
        out = _empty(shape, torch.uint8, share) if storage is None else _view(storage, shape, torch.uint8)
        dst = out.numpy()
        if self.channels_last:
            if rows is None:
                np.copyto(dst, src)
            else:
                np.take(src, rows, axis=0, out=dst)
            return out.permute(0, 3, 1, 2)
        picked = src if rows is None else src[rows]
        np.copyto(dst, picked.transpose(0, 3, 1, 2))
        return out
