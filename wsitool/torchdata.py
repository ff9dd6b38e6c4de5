"""PyTorch datasets over patch plans: the stable names of :mod:`wsitool.datasets`, where they live.

Kept so that ``from wsitool.torchdata import PatchDataset`` keeps working (the stable API,
docs/reference/stable-api.md); importing it imports PyTorch.
"""

from __future__ import annotations

from .datasets import PatchDataset, PatchIterableDataset, collate_patches, epoch_order, rank_shard

__all__ = ["PatchDataset", "PatchIterableDataset", "collate_patches", "epoch_order", "rank_shard"]
