"""The flattened patch plans and the slides a process has open for them (least recently used closed first)."""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidRegionError, WsiError
from ..patches.plan import load_plans
from ..read.cache import TileCache
from ..slide import Slide, open_slide

#: Slides (pools) a forked child inherited from its parent: kept referenced and never
#: used or closed there (closing could wait on a lock a parent thread held at fork time).
_INHERITED: list[object] = []


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
