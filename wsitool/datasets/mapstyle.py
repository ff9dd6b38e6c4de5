"""The map-style dataset (``dataset[i]``) and its collate function."""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np

from ..errors import InvalidOptionError
from ._torch import Dataset, get_worker_info, torch
from .buffers import _empty
from .reader import _Reader

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
