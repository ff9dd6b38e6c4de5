"""PyTorch for the datasets: imported here once, with the hint to install it where it is missing.

Raises:
    ImportError: PyTorch is not installed (``pip install 'wsitool[torch]'``).
"""

from __future__ import annotations

from ..ground.extras import needs_extra

with needs_extra("torch", "wsitool.datasets needs PyTorch ({exc}); install the optional extra: "):
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils.data import Dataset, IterableDataset, get_worker_info

__all__ = ["torch", "StorageWeakRef", "Dataset", "IterableDataset", "get_worker_info"]
