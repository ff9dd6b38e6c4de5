"""Benchmark: batch export of N slides on a Dask LocalCluster vs N sequential exports.

Usage::

    python scripts/bench_distributed.py [SLIDE ...] [--workers N] [--compression jpeg]

Without slides, uses the repo's generated samples and the small real slides of
../shared/samples that exist.  Three timings (wall clock, seconds):

* ``sequential``: ``wsitool.export.export_pyramid`` called once per slide in
  this process, one after another, each with the default threads (all cores);
* ``cluster``: ``wsitool.distributed.export_many`` on a new LocalCluster of
  ``--workers`` single-threaded processes (default: CPU count), cluster
  start-up included;
* ``cluster (warm)``: the same batch again on the already started cluster.

Each timing is the best of ``--repeat`` runs (sequential and warm-cluster runs
alternate, so background load hits both alike).  Prints the times and the
ratios sequential / cluster (above 1 = the cluster is faster), and the load
average, since a shared machine skews wall times.  Outputs go to a temporary
folder, deleted at the end.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT = [
    REPO / "samples" / "sample-aperio-jpeg.svs",
    REPO / "samples" / "sample-aperio-j2k.svs",
    REPO / "samples" / "sample-ome-pyramid.ome.tif",
    REPO.parent / "shared" / "samples" / "aperio-cmu1-small-region-jpeg.svs",
    REPO.parent / "shared" / "samples" / "aperio-tcga-cr-7395-jp2k-33005-2level.svs",
    REPO.parent / "shared" / "samples" / "qptiff-perkinelmer-vectra-small.qptiff",
]


def _cpu() -> float:
    """User + system CPU seconds of this process (all its threads)."""
    t = os.times()
    return t.user + t.system


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("slides", nargs="*", type=Path)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--compression", default="jpeg")
    ap.add_argument("--format", default="tiff")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    slides = [p for p in (args.slides or DEFAULT) if p.exists()]
    if not slides:
        sys.exit("no slides found")

    from distributed import Client, LocalCluster

    import wsitool
    from wsitool.distributed import export_many, export_output_path
    from wsitool.export import export_pyramid

    logging.getLogger("tifffile").setLevel(logging.ERROR)
    mpx = 0.0
    for p in slides:
        with wsitool.open_slide(p) as s:
            w, h = s.dimensions
            mpx += w * h / 1e6
            print(f"  {p.name}: {w} x {h}, {s.levels[0].compression}")
    print(f"{len(slides)} slides, {mpx:.1f} Mpx at level 0, {os.cpu_count()} CPUs, "
          f"{args.workers} worker process(es)")

    print(f"load average before: {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="wsitool-bench-dask-") as tmp:
        cpu = {"seq": [], "dask": []}

        def sequential(k: int) -> float:
            d = Path(tmp) / f"seq{k}"
            d.mkdir()
            c0 = _cpu()
            t0 = time.perf_counter()
            for p in slides:
                export_pyramid(p, export_output_path(p, d, args.format), format=args.format,
                               compression=args.compression)
            cpu["seq"].append(_cpu() - c0)
            return time.perf_counter() - t0

        def batch(client, k: int) -> float:
            w0 = sum(client.run(_cpu).values())
            c0 = _cpu()
            t0 = time.perf_counter()
            out = export_many(slides, Path(tmp) / f"dask{k}", scheduler=client, format=args.format,
                              compression=args.compression)
            dt = time.perf_counter() - t0
            cpu["dask"].append(sum(client.run(_cpu).values()) - w0 + _cpu() - c0)
            bad = [o for o in out if o.status != "ok"]
            if bad:
                sys.exit(f"export failed: {bad[0].error}")
            return dt

        t_seq = [sequential(0)]
        t0 = time.perf_counter()
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                               dashboard_address=":0", silence_logs=logging.ERROR)
        client = Client(cluster)
        t_start = time.perf_counter() - t0
        try:
            t_cold = batch(client, 0) + t_start
            t_warm = []
            for k in range(1, args.repeat + 1):
                t_warm.append(batch(client, k))
                if k < args.repeat:
                    t_seq.append(sequential(k))
        finally:
            client.close()
            cluster.close()
    seq, warm = min(t_seq), min(t_warm)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    print(f"sequential exports (best of {len(t_seq)})     : {seq:7.2f} s")
    print(f"LocalCluster, first batch with start-up: {t_cold:7.2f} s  (start-up {t_start:.2f} s)  "
          f"ratio sequential/cluster {seq / t_cold:.2f}")
    print(f"LocalCluster warm (best of {len(t_warm)})      : {warm:7.2f} s  "
          f"ratio sequential/cluster {seq / warm:.2f}")
    print(f"CPU time (user+sys, least of the runs): sequential {min(cpu['seq']):.2f} s, "
          f"cluster workers + client {min(cpu['dask'][1:] or cpu['dask']):.2f} s")


if __name__ == "__main__":
    main()
