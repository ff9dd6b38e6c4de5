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

Prints the times and the ratios sequential / cluster (above 1 = the cluster is
faster).  Outputs go to a temporary folder, deleted at the end.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("slides", nargs="*", type=Path)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--compression", default="jpeg")
    ap.add_argument("--format", default="tiff")
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

    with tempfile.TemporaryDirectory(prefix="wsitool-bench-dask-") as tmp:
        seq_dir = Path(tmp) / "seq"
        seq_dir.mkdir()
        t0 = time.perf_counter()
        for p in slides:
            export_pyramid(p, export_output_path(p, seq_dir, args.format), format=args.format,
                           compression=args.compression)
        t_seq = time.perf_counter() - t0

        t0 = time.perf_counter()
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                               dashboard_address=None, silence_logs=logging.ERROR)
        client = Client(cluster)
        t_start = time.perf_counter() - t0
        try:
            t1 = time.perf_counter()
            out = export_many(slides, Path(tmp) / "dask1", scheduler=client, format=args.format,
                              compression=args.compression)
            t_cluster = time.perf_counter() - t1 + t_start
            bad = [o for o in out if o.status != "ok"]
            if bad:
                sys.exit(f"export failed: {bad[0].error}")
            t1 = time.perf_counter()
            export_many(slides, Path(tmp) / "dask2", scheduler=client, format=args.format,
                        compression=args.compression)
            t_warm = time.perf_counter() - t1
        finally:
            client.close()
            cluster.close()

    print(f"sequential exports        : {t_seq:7.2f} s")
    print(f"LocalCluster (with start) : {t_cluster:7.2f} s  (start-up {t_start:.2f} s)  "
          f"ratio sequential/cluster {t_seq / t_cluster:.2f}")
    print(f"LocalCluster (warm)       : {t_warm:7.2f} s  ratio sequential/cluster {t_seq / t_warm:.2f}")


if __name__ == "__main__":
    main()
