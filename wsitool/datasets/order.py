"""Epoch orders and rank shards: pure functions of the plans' order, the seed and the epoch."""

from __future__ import annotations

import numpy as np

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
