"""PyTorch datasets over patch plans (floor 8: a consumer of the facade and of
:mod:`wsitool.patches`; ``wsitool.torchdata`` re-exports its names).

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

from .iterable import PatchIterableDataset
from .mapstyle import PatchDataset, collate_patches
from .order import epoch_order, rank_shard

__all__ = ["PatchDataset", "PatchIterableDataset", "collate_patches", "epoch_order", "rank_shard"]
