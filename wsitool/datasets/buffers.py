"""Batches in shared memory, reused once the main process lets go of them (see the comment below)."""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.context
import os
import threading

from ._torch import StorageWeakRef, torch


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


def current_board():
    """This process's release board, or None where none was made or adopted yet."""
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
