#!/usr/bin/env python
"""PyTorch DataLoader over a patch plan versus ``read_patches`` in one process; memory over epochs.

    python scripts/make_bench_slide.py /tmp/b.svs --width 20000 --height 20000 --mpp 0.5
    python scripts/bench_torch.py /tmp/b.svs [--size 224] [--limit 4000] [--workers 2] [--epochs 10]

1. **rate**: patches per second of ``Slide.read_patches`` (``threads=2``, plan
   order, batch 64) in this process, against a ``DataLoader`` of ``--workers``
   workers (one decode thread each, ``persistent_workers=True``) over
   :class:`wsitool.torchdata.PatchIterableDataset` (no shuffle; window shuffle;
   full shuffle; the first two also with ``channels_last=True``, the layout
   ``read_patches`` gives, the default being a transposed copy) and
   :class:`~wsitool.torchdata.PatchDataset` (sequential and random sampler,
   ``__getitems__``).  Each is timed over whole epochs after a first epoch that
   starts the workers; the best of ``--repeat`` is kept.
2. **rss**: the resident memory of the main process plus its workers
   (``persistent_workers=True``, window shuffle, ``set_epoch`` each epoch) after
   epoch 1 and after epoch ``--epochs``.

The plan is ``plan_patches(slide, mpp=<the slide's>, size, mask=None)`` cut to
its first ``--limit`` rows (a band at the top of the slide).  Needs torch (the
``torch`` extra) and psutil.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import psutil
import torch
from torch.utils.data import DataLoader

import wsitool
from wsitool.patches.plan import PatchPlan, plan_patches
from wsitool.torchdata import PatchDataset, PatchIterableDataset, collate_patches


def make_plan(path: str, size: int, limit: int) -> PatchPlan:
    with wsitool.open_slide(path) as s:
        mpp = float(np.sqrt(s.mpp[0] * s.mpp[1])) if s.mpp else 0.5
        p = plan_patches(s, mpp=mpp, size=size, mask=None, mpp_override=None if s.mpp else 0.5)
    n = min(limit, len(p))
    return PatchPlan(p.slide, p.params, p.level, p.size, p.read_size, p.effective_mpp, p.x[:n], p.y[:n],
                     p.tissue[:n])


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU time of this process and its live children."""
    t = proc.cpu_times()
    total = t.user + t.system
    for child in proc.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.NoSuchProcess:
            pass
    return total


def rate_read_patches(plan: PatchPlan, threads: int, repeat: int) -> tuple[float, float]:
    """``(best patches per wall second, best patches per CPU second)``."""
    best = cpu_best = 0.0
    proc = psutil.Process()
    with wsitool.open_slide(plan.slide.path) as s:
        for _ in range(repeat + 1):
            t, c = time.perf_counter(), cpu_seconds(proc)
            n = sum(len(b) for b in plan.read_patches(s, batch_size=64, threads=threads))
            best = max(best, n / (time.perf_counter() - t))
            cpu_best = max(cpu_best, n / (cpu_seconds(proc) - c))
    return best, cpu_best


def rate_loader(loader, set_epoch, repeat: int) -> tuple[float, float, float]:
    """``(first epoch rate incl. worker start, best later epoch rate, best patches per CPU second)``:
    CPU time of the main process and its (persistent) workers, a measure a busy machine does not skew."""
    rates, cpu_rates = [], []
    proc = psutil.Process()
    for epoch in range(repeat + 1):
        set_epoch(epoch)
        t, c = time.perf_counter(), cpu_seconds(proc)
        n = 0
        for patches, _ in loader:
            n += len(patches)
        rates.append(n / (time.perf_counter() - t))
        cpu_rates.append(n / (cpu_seconds(proc) - c))
    return rates[0], max(rates[1:]), max(cpu_rates[1:])


def family_rss(proc: psutil.Process) -> int:
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += child.memory_info().rss
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("slide")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--limit", type=int, default=4000, help="patches of the plan used (default 4000)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--only", choices=("rate", "rss"), default=None)
    ap.add_argument("--cases", default="all", help="comma-separated subset of: nos,noscl,win,wincl,full,mapseq,maprand")
    args = ap.parse_args()
    torch.set_num_threads(1)
    plan = make_plan(args.slide, args.size, args.limit)
    print(f"{args.slide}: {len(plan)} patches of {args.size} px, level {plan.level}, "
          f"read_size {plan.read_size:g}; {os.cpu_count()} CPUs; torch {torch.__version__}")
    nw = args.workers
    if args.only in (None, "rate"):
        base, base_cpu = rate_read_patches(plan, nw, args.repeat)
        print(f"read_patches threads={nw}, one process:            {base:8.0f} patches/s, "
              f"{base_cpu:.0f} per CPU-second")
        cases = [
            ("nos", "iterable, no shuffle", lambda: PatchIterableDataset(plan, batch_size=64, shuffle=False), None),
            ("noscl", "iterable, no shuffle, channels_last",
             lambda: PatchIterableDataset(plan, batch_size=64, shuffle=False, channels_last=True), None),
            ("win", "iterable, window shuffle (4 batches)", lambda: PatchIterableDataset(plan, batch_size=64), None),
            ("wincl", "iterable, window shuffle, channels_last",
             lambda: PatchIterableDataset(plan, batch_size=64, channels_last=True), None),
            ("full", "iterable, full shuffle",
             lambda: PatchIterableDataset(plan, batch_size=64, shuffle_window=None), None),
            ("mapseq", "map, sequential sampler", lambda: PatchDataset(plan), False),
            ("maprand", "map, random sampler", lambda: PatchDataset(plan), True),
        ]
        wanted = None if args.cases == "all" else set(args.cases.split(","))
        for key, name, make, shuffle in cases:
            if wanted is not None and key not in wanted:
                continue
            ds = make()
            if shuffle is None:
                loader = DataLoader(ds, batch_size=None, num_workers=nw, persistent_workers=True)
                set_epoch = ds.set_epoch
            else:
                loader = DataLoader(ds, batch_size=64, shuffle=shuffle, num_workers=nw, persistent_workers=True,
                                    collate_fn=collate_patches)
                def set_epoch(e):
                    return None
            first, best, cpu = rate_loader(loader, set_epoch, args.repeat)
            print(f"DataLoader {nw} workers, {name:38s} {best:8.0f} patches/s  ({best / base:.2f}x; "
                  f"first epoch with worker start {first:.0f}/s); {cpu:.0f} per CPU-second "
                  f"({cpu / base_cpu:.2f}x)")
            del loader
    if args.only in (None, "rss"):
        proc = psutil.Process()
        ds = PatchIterableDataset(plan, batch_size=64, seed=0)
        loader = DataLoader(ds, batch_size=None, num_workers=nw, persistent_workers=True)
        rss = []
        for epoch in range(args.epochs):
            ds.set_epoch(epoch)
            for _ in loader:
                pass
            rss.append(family_rss(proc))
        mb = [r / 2**20 for r in rss]
        print(f"RSS main + {nw} persistent workers over {args.epochs} epochs of {len(plan)} patches: "
              f"after epoch 1 {mb[0]:.1f} MB, after epoch {args.epochs} {mb[-1]:.1f} MB, growth "
              f"{mb[-1] - mb[0]:+.1f} MB (per epoch: {', '.join(f'{m:.0f}' for m in mb)})")


if __name__ == "__main__":
    main()
