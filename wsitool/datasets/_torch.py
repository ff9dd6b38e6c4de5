"""PyTorch for the datasets: imported here once, with the hint to install it where it is missing.

Raises:
    ImportError: PyTorch is not installed (``pip install 'wsitool[torch]'``).
"""

from __future__ import annotations

try:
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils.data import Dataset, IterableDataset, get_worker_info
except ImportError as _exc:  # pragma: no cover - exercised only without torch
    raise ImportError(f"wsitool.datasets needs PyTorch ({_exc}); install the optional extra: "
                      "pip install 'wsitool[torch]'") from None

__all__ = ["torch", "StorageWeakRef", "Dataset", "IterableDataset", "get_worker_info"]
