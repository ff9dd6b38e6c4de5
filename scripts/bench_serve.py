#!/usr/bin/env python3
"""Load benchmark of ``wsitool serve``: the IIIF workload, 1 and 8 concurrent clients, cold and warm cache.

Usage::

    python scripts/bench_serve.py SLIDE [--clients 1,8] [--cache-mb 256] [--threads N]
                                  [--workers N] [--every K] [--scales 1,2,4] [--json OUT.json]
                                  [--no-cache-off | --no-cache-on]

The workload (as IIIF servers' benchmarks run it): every 1024 x 1024 output tile
of the image at every power-of-two scale factor (the region ``1024 * s`` level-0
pixels square at scale ``s``, cut at the image edge), requested as
``/iiif/3/{id}/{x},{y},{w},{h}/{w/s},{h/s}/0/default.jpg``.  ``--every K`` keeps
every K-th tile of each scale (a shorter run over the same geometry).

Each configuration runs against a fresh server process (``wsitool serve --quiet``
on 127.0.0.1, a free port):

* cache off (``--cache-mb 0``): each client count once (a cold cache is no cache);
* cache on: each client count cold (first pass on a fresh server), then warm
  (the same pass again).

Printed per run: tiles, errors, tiles/s, p50 / p99 latency (ms), the server's CPU
time per tile (user + system seconds of the server's process tree over the pass,
per tile: the figure that holds on a shared, noisy machine; for the external server
every descendant of its command, lighttpd included), the cores the server kept busy
on average (its CPU seconds over the pass's wall time), the load generator's own CPU
seconds, and the server's RSS: idle (after start-up with the slide open, before the first request) and peak
during the run above idle (sampled every 10 ms with psutil; with ``--workers N``
summed over the parent and its worker processes).  The targets of issues 17 and
28: with 8 clients, peak - idle <= 102 MB with the cache off and <= cache
budget + 102 MB with it on, on single-level and pyramidal slides alike (exit
status 1 otherwise); no error responses.  The load generator (httpx, asyncio,
one process) runs on the same machine and shares its cores with the server.

The operating system's page cache is not dropped between runs (the slide's
bytes are read from memory after the first run); "cold" is wsitool's decoded-tile
cache only.

The same workload against another IIIF Image API 2 server (e.g. Debian's
``iipimage-server`` behind lighttpd's FastCGI), after the wsitool runs::

    python scripts/bench_serve.py SLIDE \
        --iiif2-cmd "sh run-iip.sh {port} {cache_mb}" \
        --iiif2-base "http://127.0.0.1:{port}/fcgi-bin/iipsrv.fcgi?IIIF=slide.tif" \
        [--iiif2-procs iipsrv.fcgi] [--iiif2-label iipsrv] [--no-wsitool]

``--iiif2-cmd`` runs the server in the foreground (its own process group, ended
with SIGTERM after each configuration, so each configuration starts cold);
``{port}`` is a free port and ``{cache_mb}`` the cache budget (0 for cache off).
Requests are ``{base}/{x},{y},{w},{h}/{w/s},/0/default.jpg`` (IIIF 2 size ``w,``).
Its RSS is the sum over the started command's descendant processes named
``--iiif2-procs`` (comma-separated), idle after its first ``info.json`` answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx
import psutil

TILE = 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(proc: subprocess.Popen, url: str, tries: int = 1200) -> None:
    """Poll ``url/status`` every 50 ms until it answers 200 (at most ``tries`` times).

    Raises:
        SystemExit: the server exited first, or did not answer in time (its last stderr lines).
    """
    for _ in range(tries):
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(url + "/status", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.05)
    raise SystemExit(f"server did not start: {proc.stderr.read().decode()[-2000:]}")


def workload(width: int, height: int, every: int, scales: list[int] | None,
             iiif2: bool = False) -> list[str]:
    """The image-request paths (after the id) of every tile at every scale factor.

    ``iiif2``: sizes as IIIF Image API 2 ``w,`` (the height follows the aspect ratio).
    """
    paths = []
    s = 1
    while True:
        if scales is None or s in scales:
            span = TILE * s
            tiles = []
            for y in range(0, height, span):
                for x in range(0, width, span):
                    w, h = min(span, width - x), min(span, height - y)
                    ow, oh = max(1, math.ceil(w / s)), max(1, math.ceil(h / s))
                    size = f"{ow}," if iiif2 else f"{ow},{oh}"
                    tiles.append(f"{x},{y},{w},{h}/{size}/0/default.jpg")
            paths.extend(tiles[::every])
        if max(width, height) <= TILE * s:
            break
        s *= 2
    return paths


class Server:
    """``wsitool serve`` in a subprocess, with an RSS sampler."""

    def __init__(self, slide: str, cache_mb: int, threads: int | None, workers: int = 1):
        self.port = free_port()
        cmd = [sys.executable, "-c", "from wsitool.cli import main; main()", "serve", slide,
               "--port", str(self.port), "--quiet", "--cache-mb", str(cache_mb)]
        if threads:
            cmd += ["--threads", str(threads)]
        if workers > 1:
            cmd += ["--workers", str(workers)]
        # its own session, as the external server's: where the kernel groups CPU time by session
        # (sched_autogroup), neither server shares its group with the load generator
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_until_serving(self.proc, self.url, tries=600)
        self.ps = psutil.Process(self.proc.pid)
        time.sleep(0.3)
        self.idle = self.rss()
        self._peak = self.idle
        self._run = False

    def cpu(self) -> float:
        """CPU seconds (user + system) used so far by the server's process and all its descendants."""
        total = 0.0
        for p in [self.ps, *self.ps.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def rss(self) -> int:
        """The server's RSS: its process and its worker processes (``--workers``), summed.

        The process list is found again every 0.5 s only (listing a process's children
        scans every process of the machine: every 10 ms it would take the load generator's
        and the server's CPU)."""
        if time.monotonic() - getattr(self, "_found", 0.0) > 0.5:
            self._procs = [self.ps, *self.ps.children(recursive=True)]
            self._found = time.monotonic()
        total = 0
        for p in self._procs:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total

    def sample(self):
        self._peak = self.rss()
        self._run = True

        def loop():
            while self._run:
                try:
                    self._peak = max(self._peak, self.rss())
                except psutil.Error:
                    return
                time.sleep(0.01)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def peak(self) -> int:
        self._run = False
        self._thread.join()
        return self._peak

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class ExternalServer(Server):
    """An external IIIF 2 server run by a foreground command; RSS summed over its named processes."""

    def __init__(self, cmd: str, base: str, names: list[str], cache_mb: int):
        self.port = free_port()
        self.base = base.format(port=self.port)
        u = httpx.URL(self.base)
        self.url = f"{u.scheme}://{u.netloc.decode()}"
        self.names = set(names)
        self.proc = subprocess.Popen(cmd.format(port=self.port, cache_mb=cache_mb), shell=True,
                                     start_new_session=True, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        for _ in range(600):
            try:
                if httpx.get(self.base + "/info.json", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        else:
            self.stop()
            raise SystemExit("external server did not answer info.json")
        if self.proc.poll() is not None:
            raise SystemExit(f"external server exited: {self.proc.stderr.read().decode()[-2000:]}")
        self.ps = psutil.Process(self.proc.pid)
        self._procs: list[psutil.Process] = []
        self._found = 0.0
        time.sleep(0.3)
        self.idle = self.rss()
        self._peak = self.idle
        self._run = False

    def rss(self) -> int:
        if time.monotonic() - self._found > 0.5:  # the process set may change (respawns)
            self._procs = [p for p in self.ps.children(recursive=True) if p.name() in self.names]
            self._found = time.monotonic()
        total = 0
        for p in self._procs:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total

    def stop(self):
        try:
            os.killpg(self.proc.pid, 15)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


async def run_pass(url: str, sid: str, paths: list[str], clients: int, prefix: str | None = None,
                   timeout: float = 600):
    """``prefix``: the full URL each path is appended to (default ``/iiif/3/{sid}/`` on ``url``);
    ``timeout``: seconds one request may take (a single-level slide's smallest scales read
    the whole level)."""
    latencies: list[float] = []
    errors = 0
    queue = iter(paths)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        async def worker():
            nonlocal errors
            for path in queue:
                t0 = time.perf_counter()
                r = await client.get(f"{prefix}{path}" if prefix else f"/iiif/3/{sid}/{path}")
                latencies.append(time.perf_counter() - t0)
                if r.status_code != 200 or r.content[:2] != b"\xff\xd8":
                    errors += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - t0
    latencies.sort()
    return {"tiles": len(latencies), "errors": errors, "wall_s": wall,
            "tiles_per_s": len(latencies) / wall,
            "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("slide")
    ap.add_argument("--clients", default="1,8", help="client counts (default 1,8)")
    ap.add_argument("--cache-mb", type=int, default=256, help="cache budget of the cache-on runs")
    ap.add_argument("--threads", type=int, default=None, help="server decode threads (default CPU count)")
    ap.add_argument("--workers", type=int, default=1,
                    help="server processes (wsitool serve --workers; the budget is split between them)")
    ap.add_argument("--every", type=int, default=1, help="keep every K-th tile of each scale")
    ap.add_argument("--scales", default=None, help="only these scale factors, e.g. 1,4,16")
    ap.add_argument("--no-cache-off", action="store_true", help="skip the cache-off runs")
    ap.add_argument("--no-cache-on", action="store_true", help="skip the cache-on runs")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--iiif2-cmd", default=None,
                    help="foreground command of an external IIIF 2 server ({port}, {cache_mb})")
    ap.add_argument("--iiif2-base", default=None,
                    help="its image base URL ({port}), e.g. http://127.0.0.1:{port}/fcgi-bin/iipsrv.fcgi?IIIF=x.tif")
    ap.add_argument("--iiif2-procs", default="iipsrv.fcgi",
                    help="names of its processes whose RSS is summed (comma-separated)")
    ap.add_argument("--iiif2-label", default="iipsrv", help="its name in the output")
    ap.add_argument("--no-wsitool", action="store_true", help="only the external server's runs")
    args = ap.parse_args()
    if bool(args.iiif2_cmd) != bool(args.iiif2_base):
        ap.error("--iiif2-cmd and --iiif2-base go together")
    clients = [int(c) for c in args.clients.split(",")]
    scales = [int(s) for s in args.scales.split(",")] if args.scales else None
    sid = os.path.basename(args.slide)
    results = []

    def one(cache_mb: int, n: int, passes: list[str], external: bool = False):
        if external:
            server = ExternalServer(args.iiif2_cmd, args.iiif2_base, args.iiif2_procs.split(","), cache_mb)
        else:
            server = Server(args.slide, cache_mb, args.threads, args.workers)
        try:
            prefix = server.base + "/" if external else None
            info = httpx.get(f"{server.base}/info.json" if external else
                             f"{server.url}/iiif/3/{sid}/info.json", timeout=30).json()
            paths = workload(info["width"], info["height"], args.every, scales, iiif2=external)
            for label in passes:
                server.sample()
                cpu0, client0 = server.cpu(), time.process_time()
                res = asyncio.run(run_pass(server.url, sid, paths, n, prefix))
                cpu1, client1 = server.cpu(), time.process_time()
                peak = server.peak()
                res.update(server_cpu_s=cpu1 - cpu0, client_cpu_s=client1 - client0,
                           cpu_ms_per_tile=1000 * (cpu1 - cpu0) / max(1, res["tiles"]),
                           server_cores=(cpu1 - cpu0) / res["wall_s"])
                res.update(cache_mb=cache_mb, clients=n, cache=label, idle_rss_mb=server.idle / 2**20,
                           peak_above_idle_mb=(peak - server.idle) / 2**20,
                           server=args.iiif2_label if external else "wsitool",
                           workers=None if external else args.workers)
                results.append(res)
                print(f"{args.iiif2_label + '  ' if external else ''}"
                      f"{f'workers {args.workers}  ' if args.workers > 1 and not external else ''}"
                      f"cache {('off' if not cache_mb else f'{cache_mb} MiB ' + label):>14}  "
                      f"clients {n}  tiles {res['tiles']:5d}  errors {res['errors']}  "
                      f"{res['tiles_per_s']:7.1f} tiles/s  p50 {res['p50_ms']:7.1f} ms  "
                      f"p99 {res['p99_ms']:7.1f} ms  CPU {res['cpu_ms_per_tile']:6.1f} ms/tile  "
                      f"({res['server_cores']:4.2f} cores; client {res['client_cpu_s']:5.1f} s)  "
                      f"idle RSS {res['idle_rss_mb']:6.1f} MB  "
                      f"peak above idle {res['peak_above_idle_mb']:6.1f} MB", flush=True)
        finally:
            server.stop()

    for external in ([] if args.no_wsitool else [False]) + ([True] if args.iiif2_cmd else []):
        if not args.no_cache_off:
            for n in clients:
                one(0, n, ["off"], external)
        if not args.no_cache_on:
            for n in clients:
                one(args.cache_mb, n, ["cold", "warm"], external)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"slide": args.slide, "cpus": os.cpu_count(), "runs": results}, f, indent=1)
    bad = [r for r in results if r["errors"]]
    over = [r for r in results if r["server"] == "wsitool" and r["clients"] >= 8
            and r["peak_above_idle_mb"] > 102 + r["cache_mb"]]
    return 1 if bad or over else 0


if __name__ == "__main__":
    sys.exit(main())
