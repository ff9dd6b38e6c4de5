"""Patch plans on Dask: a lazy array of patches, or a bag of patch batches (floor 7).

The patches of one or many :class:`~wsitool.patches.plan.PatchPlan` are cut into
batches of ``batch_size`` consecutive rows of one plan (a plan's rows are in
row-major order, so a batch's patches are neighbours and share decoded tiles);
each batch is one task, which reads it with :meth:`wsitool.Slide.read_patches`
on the slide opened by path in its worker process
(:func:`wsitool.distributed.held.cached_slide`: once per process, keyed by location and the
file's ``(mtime_ns, size)``).  The graph holds locations, coordinates and numbers,
never an open slide, so it runs on a ``LocalCluster`` or a remote cluster whose
workers see the same paths.

* :func:`patches_to_dask`: a ``dask.array.Array`` ``(n, h, w, 3)`` uint8, one
  chunk per batch; row ``i`` is row ``i`` of the plans, concatenated in order.
* :func:`patches_to_bag`: a ``dask.bag.Bag`` with one element per batch, a dict
  ``{"patches": (b, h, w, 3) uint8, "index", "slide", "x", "y": (b,) int64}``.

Needs the optional extra ``wsitool[dask]``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..errors import DaskUnavailableError, InvalidRegionError, WsiError
from ..opening import LocalFile, Location, file_stamp, parse_location
from ..patches.plan import load_plans
from ..read.lazy import INSTALL_HINT, import_dask_array
from .held import cached_slide

__all__ = ["patches_to_dask", "patches_to_bag", "read_patch_batch"]


def read_patch_batch(where: Location, stamp: tuple[int, int], locations: np.ndarray, size: int, level: int,
                     read_size: float | None, threads: int) -> np.ndarray:
    """Dask task: ``(b, size, size, 3)`` uint8, the patches at level-0 ``locations`` (``(b, 2)`` int64)
    of the slide at ``where``.

    ``read_size`` as :meth:`wsitool.Slide.read_patches` (None: the patch is read
    as it is); ``stamp`` as :func:`wsitool.distributed.held.cached_slide` (a changed file is
    refused with :class:`~wsitool.errors.WsiError`).
    """
    slide = cached_slide(where, stamp)
    out = np.empty((len(locations), size, size, 3), np.uint8)
    return slide.read_patches(locations, (size, size), level=level,
                              read_size=None if read_size is None else (read_size, read_size),
                              batch_size=max(1, len(locations)), threads=threads, out=out)




def _batches(plans, batch_size: int, threads: int):
    """``(size, [(plan index, row0, row1, task tuple)...])`` of the plans, checked."""
    plans = load_plans(plans)
    if not plans:
        raise InvalidRegionError("no patch plans given")
    if int(batch_size) < 1:
        raise InvalidRegionError(f"batch_size must be >= 1, got {batch_size!r}")
    if int(threads) < 1:
        raise InvalidRegionError(f"threads must be >= 1, got {threads!r}")
    sizes = {p.size for p in plans}
    if len(sizes) != 1:
        raise InvalidRegionError(f"the plans have different patch sizes {sorted(sizes)}; one array needs "
                                 "one size")
    size = sizes.pop()
    out = []
    for k, p in enumerate(plans):
        path = os.path.abspath(p.slide.path)
        where = parse_location(path)
        stamp = file_stamp(path)    # FileNotFoundError passes through
        if p.slide.size is not None and isinstance(where, LocalFile) and stamp[1] != p.slide.size:
            raise WsiError(f"{path}: the slide is {stamp[1]} bytes, the plan was made for {p.slide.size}; "
                           "plan it again")
        read_size = p.read_size if p.resampled else None
        locs = p.locations
        for a in range(0, len(p), int(batch_size)):
            b = min(len(p), a + int(batch_size))
            out.append((k, a, b, (read_patch_batch, where, stamp, locs[a:b], size, p.level, read_size,
                                  int(threads))))
    return plans, size, out


def patches_to_dask(plans, *, batch_size: int = 64, threads: int = 1):
    """The patches of ``plans`` as a lazy ``dask.array.Array`` ``(n, h, w, 3)`` uint8.

    Args:
        plans: a :class:`~wsitool.patches.plan.PatchPlan`, a plan file
            (``.parquet`` / ``.h5``), or a sequence of those; one patch size.
        batch_size: patches per chunk (a plan's last chunk may be shorter; a
            chunk never spans two plans).
        threads: decode threads per task (default 1: Dask runs the tasks in parallel).

    Returns:
        The array, chunked ``((b0, b1, ...), h, w, 3)``; row ``i`` equals
        ``read_patches`` of row ``i`` of the plans, concatenated in order.

    Raises:
        DaskUnavailableError: ``dask[array]`` is not installed.
        InvalidRegionError: no plans, plans of different patch sizes, a bad option.
        WsiError: a slide whose size differs from its plan's record (now), or a
            file changed after the array was built (at compute time).
        FileNotFoundError: a plan's slide is gone.
    """
    da = import_dask_array()
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    plans, size, tasks = _batches(plans, batch_size, threads)
    name = "wsitool-patches-" + tokenize([t[3][1:] for t in tasks])
    dsk: dict[Any, Any] = {(name, i, 0, 0, 0): task for i, (_, _, _, task) in enumerate(tasks)}
    if not tasks:
        return da.zeros((0, size, size, 3), np.uint8, chunks=(1, size, size, 3))
    chunks = (tuple(b - a for _, a, b, _ in tasks), (size,), (size,), (3,))
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
    return da.Array(graph, name, chunks, dtype=np.uint8, meta=np.empty((0, 0, 0, 0), np.uint8))


def _batch_record(where: Location, stamp: tuple[int, int], locs: np.ndarray, size: int, level: int,
                  read_size: float | None, threads: int, index0: int, slide: int) -> list[dict]:
    """Dask task: one partition of :func:`patches_to_bag`, a list of one batch record."""
    patches = read_patch_batch(where, stamp, locs, size, level, read_size, threads)
    n = len(locs)
    return [{"patches": patches, "index": np.arange(index0, index0 + n, dtype=np.int64),
             "slide": np.full(n, slide, np.int64), "x": locs[:, 0].copy(), "y": locs[:, 1].copy()}]


def patches_to_bag(plans, *, batch_size: int = 64, threads: int = 1):
    """The patches of ``plans`` as a ``dask.bag.Bag`` of batches, one batch per partition.

    Each element is a dict: ``patches`` ``(b, h, w, 3)`` uint8; ``index`` (the
    rows' positions in the plans, concatenated), ``slide`` (the plan's
    position), ``x``, ``y`` (level-0), each ``(b,)`` int64.  Arguments and
    errors as :func:`patches_to_dask` (``DaskUnavailableError`` without
    ``dask.bag``).
    """
    try:
        import dask.bag as db
        from dask.base import tokenize
        from dask.highlevelgraph import HighLevelGraph
    except ImportError as exc:
        raise DaskUnavailableError(f"Dask bags need dask ({exc}); {INSTALL_HINT}") from None

    plans, _, tasks = _batches(plans, batch_size, threads)
    starts = np.cumsum([0] + [len(p) for p in plans])
    name = "wsitool-patch-bag-" + tokenize([t[3][1:] for t in tasks])
    dsk: dict[Any, Any] = {(name, i): (_batch_record, *task[1:], int(starts[k]) + a, k)
           for i, (k, a, _, task) in enumerate(tasks)}
    if not tasks:
        return db.from_sequence([], npartitions=1)
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
    return db.Bag(graph, name, len(tasks))
