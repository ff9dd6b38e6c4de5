"""Random regions of a DICOMweb series: wsitool vs wsidicom's web source vs the server's own floor.

Builds an 8192x8192 JPEG series (256x256 frames; tests/formats/dicom_build.py),
starts Orthanc with its DICOMweb plugin on 127.0.0.1 (scripts/dicomweb_servers.py;
Debian: apt-get install orthanc orthanc-dicomweb), stores the series by STOW-RS,
and reads random level-0 regions through a local proxy that adds 0 or 20 ms to
every request, from 1 and 8 threads:

* ``wsitool``: ``open_slide(series URL).read_region`` (one multipart frames request per region);
* ``wsidicom``: ``WsiDicom.open_web(...).read_region`` (if wsidicom is installed);
* ``floor``: the same frame requests as wsitool, from a bare urllib3 client, nothing decoded.

Prints one JSON report (regions/s, requests per region).  Usage:
``python scripts/bench_dicomweb.py [--size 8192] [--regions 200] [--region 256]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import http.server
import importlib.util
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Proxy:
    """A threaded HTTP proxy to ``target`` adding ``delay`` seconds to each request; counts requests."""

    def __init__(self, target: str, delay: float):
        import urllib3

        pool = urllib3.PoolManager(maxsize=64, retries=False)
        self.requests = 0
        lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                with lock:
                    outer.requests += 1
                time.sleep(delay)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                r = pool.request("GET", target + self.path, headers=headers, preload_content=True)
                body = r.data
                self.send_response(r.status)
                for k, v in r.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def timed(fn, locs, threads: int) -> float:
    """Regions per second of ``fn(x, y)`` over ``locs`` on ``threads`` threads."""
    t0 = time.perf_counter()
    if threads == 1:
        for x, y in locs:
            fn(x, y)
    else:
        with cf.ThreadPoolExecutor(threads) as ex:
            list(ex.map(lambda p: fn(*p), locs))
    return len(locs) / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--tile", type=int, default=256)
    ap.add_argument("--region", type=int, default=256)
    ap.add_argument("--regions", type=int, default=200)
    ap.add_argument("--delays", default="0,20", help="milliseconds added per request")
    ap.add_argument("--threads", default="1,8")
    args = ap.parse_args()
    import wsitool
    from wsitool.slide import pyramid_levels
    from wsitool.storage.dicomweb import DicomWebClient, parse_series_url

    servers = _module("dicomweb_servers", REPO / "scripts" / "dicomweb_servers.py")
    build = _module("dicom_build", REPO / "tests" / "formats" / "dicom_build.py")
    if servers.missing():
        print(servers.missing(), file=sys.stderr)
        return 2
    try:
        from wsidicom import WsiDicom, WsiDicomWebClient
    except ImportError:
        WsiDicom = None
    report = {"size": args.size, "tile": args.tile, "region": args.region, "regions": args.regions,
              "runs": []}
    rng = random.Random(7)
    locs = [(rng.randrange(0, args.size - args.region), rng.randrange(0, args.size - args.region))
            for _ in range(args.regions)]
    with tempfile.TemporaryDirectory() as tmp, servers.orthanc(threads=16) as server:
        img = build.make_image(args.size, args.size)
        files = build.write_series(Path(tmp) / "series", img, args.tile, levels=2)
        import pydicom

        for f in files:  # the imaged volume's size (mm), which wsidicom requires of a VOLUME
            ds = pydicom.dcmread(f)
            ds.ImagedVolumeWidth, ds.ImagedVolumeHeight = args.size * 0.00025, args.size * 0.00025
            ds.save_as(f)
        (url,) = server.load(files)
        series = parse_series_url(url)
        for delay in [float(d) for d in args.delays.split(",")]:
            proxy = Proxy(f"http://127.0.0.1:{server.port}", delay / 1000)
            purl = url.replace(f"http://127.0.0.1:{server.port}", proxy.url)
            for threads in [int(t) for t in args.threads.split(",")]:
                run = {"delay_ms": delay, "threads": threads}
                # wsitool: a fresh slide per run (cold frame cache), one thread per region read
                slide = wsitool.open_slide(purl)  # (a fresh frame cache, as wsidicom starts with)
                syntax = pyramid_levels(slide)[0].source.syntax
                sop = pyramid_levels(slide)[0].source.sop
                before = proxy.requests
                run["wsitool_rps"] = round(timed(
                    lambda x, y, slide=slide: slide.read_region((x, y), 0, (args.region, args.region), threads=1),
                    locs, threads), 1)
                run["wsitool_requests_per_region"] = round((proxy.requests - before) / len(locs), 2)
                slide.close()
                # the floor: the same frames requests from a bare client, nothing decoded
                client = DicomWebClient(parse_series_url(purl), {"frame_cache_mb": 0})
                t, across = args.tile, -(-args.size // args.tile)

                def frames(x, y, t=t, across=across, client=client, sop=sop, syntax=syntax):  # this run's values
                    c0, c1 = x // t, (x + args.region - 1) // t
                    r0, r1 = y // t, (y + args.region - 1) // t
                    nums = [r * across + c + 1 for r in range(r0, r1 + 1) for c in range(c0, c1 + 1)]
                    client.frames(sop, nums, syntax)

                run["floor_rps"] = round(timed(frames, locs, threads), 1)
                client.close()
                if WsiDicom is not None:
                    wclient = WsiDicomWebClient.create_client(proxy.url + "/dicom-web")
                    wslide = WsiDicom.open_web(wclient, series.study, series.series,
                                               requested_transfer_syntax=syntax)
                    before = proxy.requests
                    run["wsidicom_rps"] = round(timed(
                        lambda x, y, wslide=wslide: wslide.read_region((x, y), 0, (args.region, args.region)),
                        locs, threads), 1)
                    run["wsidicom_requests_per_region"] = round((proxy.requests - before) / len(locs), 2)
                    wslide.close()
                report["runs"].append(run)
                print(json.dumps(run), file=sys.stderr)
            proxy.close()
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
