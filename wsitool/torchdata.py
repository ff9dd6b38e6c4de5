"""PyTorch datasets over patch plans (floor 8: a consumer of the facade and of :mod:`wsitool.patches`).

Two datasets read the patches of one or many :class:`~wsitool.patches.plan.PatchPlan`
with :meth:`wsitool.Slide.read_patches` (each tile decoded once per read):

* :class:`PatchDataset`, map-style: ``dataset[i]`` is ``(patch, coords)``.  With a
  ``DataLoader`` and a batch size, PyTorch hands the whole batch of indices to
  ``__getitems__``, which reads them slide by slide in row-major order (tiles
  shared within the batch) and returns them in the sampler's order.
* :class:`PatchIterableDataset`: yields whole batches ``(patches, coords)``
  (use ``DataLoader(dataset, batch_size=None)``), sharded by distributed rank and
  by ``DataLoader`` worker, shuffled reproducibly from ``(seed, epoch)``.

Both hold plain arrays and slide *paths*, never an open slide: they pickle by
path (``spawn`` and ``forkserver`` workers), and each process opens the slides it
reads on first use, so forked workers never share a parent's file handle or
decoder.  Per process, at most ``max_open_slides`` slides are open (least
recently used closed first) and one decoded-tile cache of ``cache_bytes`` bytes
(:class:`wsitool.read.cache.TileCache`, 0 = none) serves all of them.  The memory
of a worker is thus bounded by: ``cache_bytes`` + the open slides' structures +
the batch being read (+ for the iterable dataset its shuffle window, below)
+ the batches the ``DataLoader`` prefetches.

PyTorch is an optional dependency (``pip install 'wsitool[torch]'``); importing
:mod:`wsitool` never imports it, importing this module does.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.context
import operator
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import InvalidOptionError, InvalidRegionError, WsiError
from .patches.plan import load_plans
from .read.cache import TileCache
from .slide import Slide, open_slide

try:
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils.data import Dataset, IterableDataset, get_worker_info
except ImportError as _exc:  # pragma: no cover - exercised only without torch
    raise ImportError(f"wsitool.torchdata needs PyTorch ({_exc}); install the optional extra: "
                      "pip install 'wsitool[torch]'") from None

__all__ = ["PatchDataset", "PatchIterableDataset", "collate_patches", "epoch_order", "rank_shard"]

#: Slides (pools) a forked child inherited from its parent: kept referenced and never
#: used or closed there (closing could wait on a lock a parent thread held at fork time).
_INHERITED: list[object] = []


def _empty(shape: tuple[int, ...], dtype, shared: bool):
    """An uninitialised contiguous tensor; with ``shared``, made in shared memory at once.

    A batch a ``DataLoader`` worker sends goes through shared memory.  Made on the
    heap and moved there (``share_memory_()``, or by the pickler), each batch leaves
    a heap buffer behind and the workers' resident memory grew by ~100 MB over the
    first epochs; made in shared memory from the start (as PyTorch's own
    ``default_collate`` does) it stays flat (scripts/bench_torch.py).
    """
    if shared:
        new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
        if new_shared is not None:
            nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
            strides = tuple(math.prod(max(d, 1) for d in shape[i + 1:]) for i in range(len(shape)))  # contiguous
            return torch.empty(0, dtype=dtype).set_(new_shared(nbytes), 0, shape, strides)
        return torch.empty(shape, dtype=dtype).share_memory_()   # pragma: no cover - older PyTorch
    return torch.empty(shape, dtype=dtype)


# --------------------------------------------------------------------- batches reused in shared memory
#
# Shared memory fresh for every batch (as above) costs a worker about as much as 15 % of
# decoding it: the pages are allocated, zeroed and faulted in one by one, and freed again in
# the main process (~13 ms for 64 patches of 224 pixels, scripts/bench_torch.py).  So a
# worker keeps up to _SLOTS batch buffers (:class:`_BatchPool`) and fills one again once the
# main process has let go of every tensor on it: the batch travels as a :class:`_Batch`,
# whose unpickling in the main process (:func:`_rebuild_batch`) records a weak reference to
# its storage; when that reference has expired, the main process writes the buffer's token
# (a random nonce and a use count) on the release board, an array of int64 in shared memory
# made by the main process (:func:`_release_board`) and handed to the workers with the
# dataset.  A worker reuses a buffer only when the board shows that exact token, so a lost
# or overwritten notice (workers of two loaders sharing board entries) only means a fresh
# buffer.  Buffers not released in time (a consumer keeping batches) mean fresh ones too.

_SLOTS = 4           #: batch buffers a worker keeps
_BOARD_WORKERS = 64  #: workers with board entries of their own (worker ids modulo this)
_COORD_KEYS = ("index", "slide", "x", "y")

#: This process tree's release board (made by the main process, inherited or unpickled by workers).
_BOARD = None
#: Main process: ``(weak reference, board entry, token)`` of the pooled batches received, not yet released.
_HELD: list = []
_HELD_LOCK = threading.Lock()


def _release_board():
    """The release board of this process (made on first use; a worker gets its parent's)."""
    global _BOARD
    if _BOARD is None:
        _BOARD = multiprocessing.RawArray("q", _BOARD_WORKERS * _SLOTS)
    return _BOARD


def _adopt_board(board) -> None:
    """A worker started by spawn/forkserver: use the board of the main process that started it."""
    global _BOARD
    if board is not None:
        _BOARD = board


class _BatchPool:
    """A ``DataLoader`` worker's batch buffers in shared memory, reused once released (see above)."""

    def __init__(self, board, worker: int):
        self.pid = os.getpid()
        self.board = board
        self.base = (worker % _BOARD_WORKERS) * _SLOTS
        self.nonce = int.from_bytes(os.urandom(3), "little") << 32
        self.uses = 0
        self.slots: list[list] = []    # [storage, token of its last use]

    def _token(self) -> int:
        self.uses += 1
        return self.nonce | (self.uses & 0xFFFFFFFF)

    def take(self, nbytes: int):
        """``(storage of >= nbytes bytes, board entry, token)``; entry -1: a fresh buffer, not pooled."""
        for k, slot in enumerate(self.slots):
            if self.board[self.base + k] == slot[1]:          # released by the main process
                if slot[0].nbytes() < nbytes:
                    slot[0] = torch.UntypedStorage._new_shared(nbytes)
                slot[1] = self._token()
                return slot[0], self.base + k, slot[1]
        storage = torch.UntypedStorage._new_shared(nbytes)
        if len(self.slots) >= _SLOTS:
            return storage, -1, 0
        self.slots.append([storage, self._token()])
        return storage, self.base + len(self.slots) - 1, self.slots[-1][1]


def _view(storage, shape: tuple[int, ...], dtype):
    """A contiguous tensor of ``shape`` over the start of ``storage``."""
    strides = tuple(math.prod(max(d, 1) for d in shape[i + 1:]) for i in range(len(shape)))
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape, strides)


class _Batch:
    """``patches, coords`` made by a worker on a pooled buffer (unpacks as a pair; not a
    ``Sequence``, so the ``DataLoader``'s ``default_convert`` passes it on as it is): pickles so
    that the main process reports when it has let go of it (:func:`_rebuild_batch`), where it
    is the list ``[patches, coords]`` a plain pair becomes."""

    __slots__ = ("patches", "coords4", "entry", "token")

    def __init__(self, patches, coords4, entry: int, token: int):
        self.patches, self.coords4, self.entry, self.token = patches, coords4, entry, token

    def _pair(self) -> tuple:
        return self.patches, dict(zip(_COORD_KEYS, self.coords4, strict=True))

    def __iter__(self):
        return iter(self._pair())

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i):
        return self._pair()[i]

    def __reduce__(self):
        patches = self.patches
        return (_rebuild_batch, (patches.untyped_storage(), tuple(patches.shape), patches.stride(),
                                 self.coords4, self.entry, self.token))


def _rebuild_batch(storage, shape, strides, coords4, entry: int, token: int):
    """In the main process: the ``(patches, coords)`` of a :class:`_Batch`; notes it as held and
    posts on the release board the tokens of the held batches whose storage is now free."""
    patches = torch.empty(0, dtype=torch.uint8).set_(storage, 0, tuple(shape), tuple(strides))
    board = _BOARD
    if board is not None:
        with _HELD_LOCK:
            live = []
            for ref, k, t in _HELD:
                if ref.expired():
                    board[k] = t
                else:
                    live.append((ref, k, t))
            if entry >= 0:
                live.append((StorageWeakRef(storage), entry, token))
            _HELD[:] = live
    return [patches, dict(zip(_COORD_KEYS, coords4, strict=True))]


# --------------------------------------------------------------------- the flattened plans


@dataclass(frozen=True)
class _SlideRef:
    """One plan's slide and read parameters: what a worker needs to read its patches."""

    path: str
    nbytes: int | None
    kwargs: tuple  # (size, level, read_size) for read_patches

    def read_kwargs(self) -> dict:
        size, level, read_size = self.kwargs
        return dict(size=size, level=level, read_size=read_size)

    def check(self) -> None:
        """WsiError if the file's size is not the one recorded in the plan (the slide changed)."""
        if self.nbytes is None:
            return
        if os.path.isdir(self.path):
            now = sum(e.stat().st_size for e in os.scandir(self.path) if e.is_file())
        else:
            now = os.path.getsize(self.path)  # FileNotFoundError passes through
        if now != self.nbytes:
            raise WsiError(f"{self.path}: the slide is {now} bytes, the plan was made for {self.nbytes}; "
                           "plan it again")




class _Table:
    """All patches of the plans: ``slide`` (plan index), ``x``, ``y`` arrays, plus each plan's reference.

    Plain numpy arrays (no Python object per patch), so forked workers do not
    copy pages of it by touching reference counts.
    """

    def __init__(self, plans):
        plans = load_plans(plans)
        if not plans:
            raise InvalidRegionError("no patch plans given")
        sizes = {p.size for p in plans}
        if len(sizes) != 1:
            raise InvalidRegionError(f"the plans have different patch sizes {sorted(sizes)}; a dataset "
                                     "needs one size (make one dataset per size)")
        self.size = sizes.pop()
        self.refs = [_SlideRef(os.path.abspath(p.slide.path), p.slide.size,
                               tuple(p.read_kwargs()[k] for k in ("size", "level", "read_size")))
                     for p in plans]
        self.slide = np.concatenate([np.full(len(p), i, np.int32) for i, p in enumerate(plans)])
        self.x = np.concatenate([np.asarray(p.x, np.int64) for p in plans])
        self.y = np.concatenate([np.asarray(p.y, np.int64) for p in plans])
        # row-major reading order: by plan, then y, then x
        self.sorted = np.lexsort((self.x, self.y, self.slide)).astype(np.int64)
        self.rank = np.empty(len(self.sorted), np.int64)
        self.rank[self.sorted] = np.arange(len(self.sorted))

    def __len__(self) -> int:
        return len(self.x)

    def paths(self) -> list[str]:
        return [r.path for r in self.refs]


class _SlidePool:
    """This process's open slides (LRU, at most ``max_open``) and its one tile cache."""

    def __init__(self, max_open: int, cache_bytes: int):
        self.pid = os.getpid()
        self.max_open = max_open
        self.cache = TileCache(cache_bytes) if cache_bytes > 0 else None
        self.open: OrderedDict[str, Slide] = OrderedDict()
        self.checked: set[int] = set()

    def get(self, ref: _SlideRef, index: int):
        slide = self.open.get(ref.path)
        if slide is not None:
            self.open.move_to_end(ref.path)
        else:
            while len(self.open) >= self.max_open:
                _, old = self.open.popitem(last=False)
                old.close()
            if index not in self.checked:
                ref.check()
            slide = open_slide(ref.path, cache=self.cache)
            self.open[ref.path] = slide
        self.checked.add(index)
        return slide

    def close(self) -> None:
        while self.open:
            self.open.popitem()[1].close()


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


# --------------------------------------------------------------------- map-style


class PatchDataset(_Reader, Dataset):
    """Map-style dataset of the patches of one or many plans.

    Index ``i`` runs over the plans in the order given, each plan's rows in
    order.  ``dataset[i]`` is ``(patch, coords)``:

    * ``patch``: a uint8 tensor ``(3, h, w)``, equal to ``slide.read_patches``
      of that row (``patch.permute(1, 2, 0)``); then ``transform(patch)`` if given;
    * ``coords``: ``{"index": i, "slide": plan index, "x": level-0 x, "y": level-0 y}`` (ints).

    With a ``DataLoader`` and a ``batch_size``, PyTorch calls
    :meth:`__getitems__` with the batch's indices: they are read together, per
    slide in row-major order, so patches of a batch share decoded tiles.  Use
    :func:`collate_patches` (or the default collate) to stack them.

    Args:
        plans: a :class:`~wsitool.patches.plan.PatchPlan`, a plan file
            (``.parquet`` / ``.h5``, :func:`~wsitool.patches.plan.read_plans`), or a
            sequence of those.  All plans must have the same patch size.
        transform: a callable applied to each patch tensor, or None.
        channels_last: the patches' memory layout.  False (default): contiguous
            ``(3, h, w)``, made by transposing what the reader decodes (about
            0.13 ms a 224-pixel patch).  True: the same shape in PyTorch's
            ``torch.channels_last`` memory format (strides of ``(h, w, 3)``), the
            decoded pixels as they are, no transposition; convolutions take it
            as it is, and ``patch.permute(1, 2, 0)`` is the contiguous
            ``(h, w, 3)`` array.
        max_open_slides: most slides open at once per process (least recently used closed first).
        cache_bytes: byte budget of the one decoded-tile cache per process
            (:class:`~wsitool.read.cache.TileCache`; 0, the default: none).  Useful
            when single patches are read (``batch_size=None``) on a grid finer than
            the tiles: neighbours then reuse decoded tiles.  A cache turns off the
            compiled JPEG loop (see :mod:`wsitool.read.cache`).
        threads: decode threads per read (default 1: the ``DataLoader``'s workers
            are the parallelism).

    Raises:
        InvalidRegionError: no plans, plans of different patch sizes, or a bad option.
        PlanFileError, FileNotFoundError: a plan file that cannot be read.

    Reading raises what :meth:`wsitool.Slide.read_patches` raises, the errors of
    :func:`wsitool.open_slide`, and :class:`~wsitool.errors.WsiError` when a
    slide's size differs from the one recorded in its plan (the file changed).
    """

    def __init__(self, plans, *, transform=None, channels_last: bool = False, max_open_slides: int = 8,
                 cache_bytes: int = 0, threads: int = 1):
        _Reader.__init__(self, plans, transform=transform, channels_last=channels_last,
                         max_open_slides=max_open_slides, cache_bytes=cache_bytes, threads=threads)

    def __len__(self) -> int:
        return len(self._table)

    def _index(self, i) -> int:
        n = len(self._table)
        try:
            k = operator.index(i)  # an integer (numpy's too); never a float or a string truncated
        except TypeError:
            raise TypeError(f"patch index must be an integer, got {type(i).__name__}") from None
        if not -n <= k < n:
            raise IndexError(f"patch index {k} out of range for {n} patches")
        return k + n if k < 0 else k

    def _samples(self, idx: np.ndarray) -> list:
        t = self._table
        buf, where = self._read_window(idx)
        batch = self._tensor(buf, where)
        out = []
        for k, i in enumerate(idx.tolist()):
            patch = batch[k]
            if self.transform is not None:
                patch = self.transform(patch)
            out.append((patch, {"index": i, "slide": int(t.slide[i]), "x": int(t.x[i]), "y": int(t.y[i])}))
        return out

    def __getitem__(self, i):
        return self._samples(np.array([self._index(i)], np.int64))[0]

    def __getitems__(self, indices: Sequence[int]) -> list:
        """The samples of ``indices`` (in that order), read together; see the class docstring."""
        return self._samples(np.array([self._index(i) for i in indices], np.int64))


def _stack(patches: list):
    """Stack same-shaped tensors (in shared memory in a ``DataLoader`` worker); ``(3, h, w)`` views of
    ``(h, w, 3)`` pixels stay in that layout (``torch.channels_last``).  InvalidOptionError: shapes differ."""
    shape = patches[0].shape
    if any(p.shape != shape for p in patches):
        raise InvalidOptionError(f"collate_patches: patches of different shapes, e.g. {tuple(shape)} and "
                         f"{next(tuple(p.shape) for p in patches if p.shape != shape)}")
    last = patches[0].dim() == 3 and shape[0] > 1 and patches[0].permute(1, 2, 0).is_contiguous()
    dims = (len(patches), shape[1], shape[2], shape[0]) if last else (len(patches), *shape)
    out = _empty(dims, patches[0].dtype, get_worker_info() is not None)
    if last:
        torch.stack([p.permute(1, 2, 0) for p in patches], out=out)
        return out.permute(0, 3, 1, 2)
    torch.stack(patches, out=out)
    return out


def collate_patches(samples: Sequence):
    """Stack ``(patch, coords)`` samples into one batch.

    Args:
        samples: a sequence of ``(patch, coords)`` as :class:`PatchDataset` gives
            them (patch: a tensor or numpy array, all of one shape; coords: a dict
            of ints).

    Returns:
        ``(patches, coords)``: ``patches`` the stacked tensor ``(n, 3, h, w)``
        (``(n,) + shape`` of the samples), its dtype the samples' (uint8
        without a transform); in ``torch.channels_last`` memory format where the
        samples are (``channels_last=True``); ``coords`` a dict of ``(n,)`` int64 tensors
        (``index``, ``slide``, ``x``, ``y``).  In a ``DataLoader`` worker the
        patches are stacked straight into shared memory.

    Raises:
        InvalidOptionError: no samples, or patches of different shapes (a ``ValueError``).
    """
    if len(samples) == 0:
        raise InvalidOptionError("collate_patches: no samples")
    out = _stack([torch.as_tensor(p) for p, _ in samples])
    keys = samples[0][1].keys()
    coords = {k: torch.tensor([c[k] for _, c in samples], dtype=torch.int64) for k in keys}
    return out, coords


# --------------------------------------------------------------------- ordering (pure functions)


def epoch_order(sorted_index: np.ndarray, *, shuffle: bool, seed: int, epoch: int,
                window: int | None) -> np.ndarray:
    """The order of one epoch over all patches, the same in every process.

    Args:
        sorted_index: ``(n,)`` patch indices in row-major reading order.
        shuffle: False: ``sorted_index`` itself.
        seed, epoch: non-negative ints; the random generator is
            ``numpy.random.default_rng([seed, epoch])``.
        window: None: a uniform random permutation of all patches.  An int
            ``k``: a *window shuffle*: ``sorted_index`` is cut into windows of
            ``k`` consecutive patches, the full windows are put in random order
            (a last, shorter window stays last) and the patches within each
            window are permuted.

    Returns:
        ``(n,)`` int64 patch indices.
    """
    sorted_index = np.asarray(sorted_index, np.int64)
    n = len(sorted_index)
    if not shuffle:
        return sorted_index.copy()
    rng = np.random.default_rng([int(seed), int(epoch)])
    if window is None or n == 0:
        return sorted_index[rng.permutation(n)]
    full = n // window
    win_rank = np.empty(-(-n // window), np.int64)
    win_rank[:full] = rng.permutation(full)
    win_rank[full:] = full
    key_window = win_rank[np.arange(n) // window]
    key_within = rng.random(n)
    return sorted_index[np.lexsort((key_within, key_window))]


def rank_shard(order: np.ndarray, rank: int, world_size: int, *, drop_last: bool = False) -> np.ndarray:
    """Rank ``rank``'s share of an epoch's ``order``: a contiguous range of it.

    Without ``drop_last`` the ranks' ranges partition ``order`` exactly (their
    lengths differ by at most one); with it each rank gets ``len(order) //
    world_size`` patches (the last ``len(order) % world_size`` are left out).
    """
    n = len(order)
    if drop_last:
        m = n // world_size
        return order[rank * m:(rank + 1) * m]
    return order[rank * n // world_size:(rank + 1) * n // world_size]


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
        if info is None or _BOARD is None or not self.reuse_buffers:
            return self._tensor(src, rows, shared=True), self._coords(idx, info is not None)
        pool = self._batches
        if pool is None or pool.pid != os.getpid():
            pool = self._batches = _BatchPool(_BOARD, info.id)
        n = len(src) if rows is None else len(rows)
        storage, entry, token = pool.take(n * src.shape[1] * src.shape[2] * 3)
        return _Batch(self._tensor(src, rows, storage=storage), self._coords4(idx, True), entry, token)
