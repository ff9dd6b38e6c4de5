"""Random regions of a DICOMweb series: wsitool vs wsidicom's web source vs the server's own floor.

Builds an 8192x8192 JPEG series (256x256 frames; tests/formats/dicom_build.py),
starts Orthanc with its DICOMweb plugin on 127.0.0.1 (scripts/dicomweb_servers.py;
Debian: apt-get install orthanc orthanc-dicomweb), stores the series by STOW-RS,
and reads random level-0 regions through a local proxy (a process of its own)
that adds 0 or 20 ms to every request, from 1 and 8 threads:

* ``wsitool``: ``open_slide(series URL).read_region`` (one multipart frames request per region);
* ``wsidicom``: ``WsiDicom.open_web(...).read_region`` (if wsidicom is installed);
* ``floor``: the same frame requests as wsitool, every one sent (no frame cache), from
  wsitool's ``DicomWebClient`` alone (urllib3 and the multipart split), nothing decoded;

Each (delay, threads) cell runs every reader ``--repeat`` times, interleaved (the
order rotates), and reports the median of: regions/s, requests per region, and
CPU milliseconds per region (user + system) of the reading process
(``*_cpu_ms``), of Orthanc (``*_orthanc_cpu_ms``) and of the proxy
(``*_proxy_cpu_ms``), and the requests in flight at the proxy when each
arrived (``*_in_flight``, mean; 8 threads reading well keep about 8).  On a
shared machine CPU per region is the robust figure: the wall-clock rates move
with the load.  Prints one JSON report.  Usage:
``python scripts/bench_dicomweb.py [--delays 0,20] [--threads 1,8] [--regions 200] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import http.server
import importlib.util
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COUNT_PATH = "/_bench/requests"  # (the proxy's request count; not counted, not forwarded)


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def serve_proxy(target: str, delay: float) -> None:
    """Run a threaded HTTP proxy to ``target`` adding ``delay`` seconds to each request
    (this process: ``--proxy``); prints its port, serves until stdin closes."""
    import urllib3

    pool = urllib3.PoolManager(maxsize=64, retries=False)
    count = [0, 0, 0]  # requests, requests in flight now, the sum of those in flight at each arrival
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path == COUNT_PATH:
                body = f"{count[0]} {count[2]}".encode()
                self.send_response(200)
            else:
                with lock:
                    count[0] += 1
                    count[1] += 1
                    count[2] += count[1]
                time.sleep(delay)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                try:
                    r = pool.request("GET", target + self.path, headers=headers, preload_content=True)
                finally:
                    with lock:
                        count[1] -= 1
                body = r.data
                self.send_response(r.status)
                for k, v in r.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    print(httpd.server_address[1], flush=True)
    sys.stdin.read()
    httpd.shutdown()


class Proxy:
    """The proxy of :func:`serve_proxy` in a child process: ``url``, ``pid``, ``requests``."""

    def __init__(self, target: str, delay: float):
        self.proc = subprocess.Popen([sys.executable, __file__, "--proxy", target, str(delay)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"
        import urllib3

        self._pool = urllib3.PoolManager(retries=False)

    @property
    def requests(self) -> tuple[int, int]:
        """Requests so far, and the sum over them of the requests in flight when each arrived."""
        count, inflight = self._pool.request("GET", self.url + COUNT_PATH).data.split()
        return int(count), int(inflight)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(10)


def timed(fn, locs, threads: int) -> float:
    """Seconds to run ``fn(x, y)`` over ``locs`` on ``threads`` threads."""
    t0 = time.perf_counter()
    if threads == 1:
        for x, y in locs:
            fn(x, y)
    else:
        with cf.ThreadPoolExecutor(threads) as ex:
            list(ex.map(lambda p: fn(*p), locs))
    return time.perf_counter() - t0


def _cpu(pid: int | None) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


class Cell:
    """What the readers of one (delay, threads) cell share: the proxied series URL, the
    level-0 instance, its transfer syntax and the grid."""

    def __init__(self, args, purl: str, sop: str, syntax: str):
        self.args, self.purl, self.sop, self.syntax = args, purl, sop, syntax


def _wsitool(cell: Cell) -> tuple[Callable, Callable]:
    import wsitool

    slide = wsitool.open_slide(cell.purl)  # a fresh slide per run: a cold frame cache
    n = cell.args.region
    return (lambda x, y: slide.read_region((x, y), 0, (n, n), threads=1)), slide.close


def _floor(cell: Cell) -> tuple[Callable, Callable]:
    from wsitool.formats.dicom.web import DicomWebClient
    from wsitool.storage.urls import parse_series_url

    client = DicomWebClient(parse_series_url(cell.purl), {"frame_cache_mb": 0})
    t, n, across = cell.args.tile, cell.args.region, -(-cell.args.size // cell.args.tile)

    def frames(x, y):
        c0, c1, r0, r1 = x // t, (x + n - 1) // t, y // t, (y + n - 1) // t
        client.frames(cell.sop, [r * across + c + 1 for r in range(r0, r1 + 1) for c in range(c0, c1 + 1)],
                      cell.syntax)

    return frames, client.close


def _wsidicom(cell: Cell) -> tuple[Callable, Callable]:
    from wsidicom import WsiDicom, WsiDicomWebClient

    from wsitool.storage.urls import parse_series_url

    series = parse_series_url(cell.purl)
    client = WsiDicomWebClient.create_client(series.base)
    slide = WsiDicom.open_web(client, series.study, series.series, requested_transfer_syntax=cell.syntax)
    n = cell.args.region
    return (lambda x, y: slide.read_region((x, y), 0, (n, n))), slide.close


#: reader name -> factory(cell) -> (read(x, y), close()); a harness may add its own.
READERS: dict[str, Callable[[Cell], tuple[Callable, Callable]]] = {
    "wsitool": _wsitool, "wsidicom": _wsidicom, "floor": _floor}


def measure(name: str, cell: Cell, locs, threads: int, proxy: Proxy, orthanc_pid: int) -> dict:
    """One timed pass of reader ``name``: regions/s, requests and CPU ms per region."""
    read, close = READERS[name](cell)
    try:
        before = proxy.requests
        cpu = (_cpu(None), _cpu(orthanc_pid), _cpu(proxy.pid))
        seconds = timed(read, locs, threads)
        spent = [(_cpu(p) - c) * 1000 / len(locs) for p, c in zip((None, orthanc_pid, proxy.pid), cpu,
                                                                   strict=True)]
        after = proxy.requests
    finally:
        close()
    asked = after[0] - before[0]
    return {"rps": len(locs) / seconds, "requests_per_region": asked / len(locs),
            "in_flight": (after[1] - before[1]) / max(1, asked), "cpu_ms": spent[0],
            "orthanc_cpu_ms": spent[1], "proxy_cpu_ms": spent[2]}


def run_cell(cell: Cell, readers: list[str], locs, threads: int, proxy: Proxy, orthanc_pid: int) -> dict:
    """Every reader ``--repeat`` times, interleaved; the medians, by ``reader_figure``."""
    got: dict[str, list[dict]] = {r: [] for r in readers}
    for rep in range(cell.args.repeat):
        for name in readers[rep % len(readers):] + readers[:rep % len(readers)]:
            got[name].append(measure(name, cell, locs, threads, proxy, orthanc_pid))
    out = {}
    for name, runs in got.items():
        for key in runs[0]:
            value = statistics.median(r[key] for r in runs)
            out[f"{name}_{key}"] = round(value, 2 if key in ("requests_per_region", "in_flight") else 1)
    return out


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--proxy":
        serve_proxy(sys.argv[2], float(sys.argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--tile", type=int, default=256)
    ap.add_argument("--region", type=int, default=256)
    ap.add_argument("--regions", type=int, default=200)
    ap.add_argument("--delays", default="0,20", help="milliseconds added per request")
    ap.add_argument("--threads", default="1,8")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved passes of each reader (medians)")
    ap.add_argument("--readers", default="wsitool,wsidicom,floor", help=f"some of {', '.join(READERS)}")
    args = ap.parse_args()
    from wsitool.slide import pyramid_levels

    servers = _module("dicomweb_servers", REPO / "scripts" / "dicomweb_servers.py")
    build = _module("dicom_build", REPO / "tests" / "formats" / "dicom_build.py")
    if servers.missing():
        print(servers.missing(), file=sys.stderr)
        return 2
    readers = [r for r in args.readers.split(",") if r]
    if "wsidicom" in readers and importlib.util.find_spec("wsidicom") is None:
        readers.remove("wsidicom")
    report = {"size": args.size, "tile": args.tile, "region": args.region, "regions": args.regions,
              "repeat": args.repeat, "runs": []}
    rng = random.Random(7)
    locs = [(rng.randrange(0, args.size - args.region), rng.randrange(0, args.size - args.region))
            for _ in range(args.regions)]
    with tempfile.TemporaryDirectory() as tmp, servers.orthanc(threads=16) as server:
        img = build.make_image(args.size, args.size)
        files = build.write_series(Path(tmp) / "series", img, args.tile, levels=2)
        import pydicom

        import wsitool

        for f in files:  # the imaged volume's size (mm), which wsidicom requires of a VOLUME
            ds = pydicom.dcmread(f)
            ds.ImagedVolumeWidth, ds.ImagedVolumeHeight = args.size * 0.00025, args.size * 0.00025
            ds.save_as(f)
        (url,) = server.load(files)
        with wsitool.open_slide(url) as slide:
            level0 = pyramid_levels(slide)[0].source
            sop, syntax = level0.sop, level0.syntax
        for delay in [float(d) for d in args.delays.split(",")]:
            proxy = Proxy(f"http://127.0.0.1:{server.port}", delay / 1000)
            cell = Cell(args, url.replace(f"http://127.0.0.1:{server.port}", proxy.url), sop, syntax)
            try:
                measure("floor", cell, locs, 8, proxy, server.pid)  # (untimed: the server's caches warm)
                for threads in [int(t) for t in args.threads.split(",")]:
                    run = {"delay_ms": delay, "threads": threads}
                    run.update(run_cell(cell, readers, locs, threads, proxy, server.pid))
                    report["runs"].append(run)
                    print(json.dumps(run), file=sys.stderr)
            finally:
                proxy.close()
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
