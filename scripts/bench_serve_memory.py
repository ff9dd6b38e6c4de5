#!/usr/bin/env python3
"""Memory and time of single heavy requests to ``wsitool serve`` (issue 47, items 2 and 3).

Usage::

    python scripts/bench_serve_memory.py [--big SLIDE] [--samples DIR] [--threads 2]
                                         [--cache-mb 256] [--repo DIR] [--only NAME,...]
                                         [--server-arg=--opt ...] [--json OUT.json]

Each case runs against a fresh server (``wsitool serve --threads 2 --quiet`` on
127.0.0.1, a free port, the default 256 MiB tile cache) serving three slides:

* ``A``: ``generic-bigtiff-zstd-5level-10000x5000.tiff`` (shared samples);
* ``C``: ``aperio-cmu1-small-region-jpeg.svs`` (2220 x 2967, single level);
* ``S``: a single-level 40960 x 40960 JPEG slide, ``--big`` (default
  ``/tmp/srv-bench/single-40960.svs``; made once with ``scripts/make_bench_slide.py
  SLIDE --width 40960 --height 40960 --levels 1`` when missing: 640 MB, not committed).

The cases: the requests of issue 47 item 2 (``bitonal.png`` of ``A`` at ``max``, ``^8191,8191``
``gray.png``, ``^8192,8192`` WebP, ``C``'s ``^8192,8192/!90/gray.webp``, two of them at once,
``^16383,16`` WebP) and item 3 (``S``'s ``full/64,``), then two requests served before and
after (a 4096 x 4096 lossless WebP of tissue, the largest JPEG).

Printed per case: the status code(s), the server's idle RSS (after start-up, before
the first request), its peak RSS above idle during the case (the kernel's exact
high-water mark, ``VmHWM`` of ``/proc/PID/status``, reset after the idle reading by
writing 5 to ``/proc/PID/clear_refs``), the wall time of the request(s) and the
size of the body.  The ``client-leaves`` case sends ``S``'s ``full/64,`` request on
a raw socket, closes it after 1 s, and prints how long the server went on
rendering after that (``/status`` ``rendering`` back to 0; at most 60 s) and its
counters.  The targets: each request answered (200, or a 4xx saying why) within
10 s (5 s for ``S``) with peak < idle + 400 MB, two at once < idle + 600 MB, a
render whose client left stopped within 5 s.

``--repo DIR`` runs the server from another checkout (the code before a change:
``git archive BASE | tar -x -C DIR``, compiled extensions copied in).
``--server-arg=ARG`` (repeatable) adds ARG to the server's command line for the
``client-leaves`` case only (e.g. a larger decode budget, so that a render long
enough to be cancelled is allowed).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
from bench_serve import free_port, wait_until_serving

REPO = Path(__file__).resolve().parents[1]
SAMPLES = Path(os.environ.get("WSITOOL_SHARED", REPO.parent / "shared")) / "samples"
A = "generic-bigtiff-zstd-5level-10000x5000.tiff"
C = "aperio-cmu1-small-region-jpeg.svs"

#: (name, [request paths after /iiif/3/]) of the cases answered normally.
CASES = [
    ("bitonal-max", [f"{A}/full/max/0/bitonal.png"]),
    ("gray-8191", [f"{A}/full/^8191,8191/0/gray.png"]),
    ("webp-8192", [f"{A}/full/^8192,8192/0/default.webp"]),
    ("cmu1-webp-90-gray", [f"{C}/full/^8192,8192/!90/gray.webp"]),
    ("two-at-once", [f"{A}/full/^8192,8192/0/default.webp", f"{C}/full/^8192,8192/!90/gray.webp"]),
    ("two-gray-png", [f"{A}/full/^8191,8191/0/gray.png", f"{A}/full/max/0/bitonal.png"]),
    ("webp-16383x16", [f"{A}/full/^16383,16/0/default.webp"]),
    ("single-64", ["{S}/full/64,/0/default.jpg"]),
    # served before and after: lossless WebP of real tissue within the render memory, the largest JPEG
    ("webp-tissue-4096", ["{S}/0,0,4096,4096/max/0/default.webp"]),
    ("jpg-8192", [f"{A}/full/^8192,8192/0/default.jpg"]),
]


class Server:
    """``wsitool serve`` of the three slides in a subprocess; idle RSS and the peak above it."""

    def __init__(self, slides: list[str], threads: int, cache_mb: int, repo: Path, extra: list[str]):
        self.port = free_port()
        env = dict(os.environ, PYTHONPATH=str(repo))
        cmd = [sys.executable, "-c", "from wsitool.cli import main; main()", "serve", *slides,
               "--port", str(self.port), "--quiet", "--threads", str(threads),
               "--cache-mb", str(cache_mb), *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                                     cwd=str(repo), start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_until_serving(self.proc, self.url)
        self.ps = psutil.Process(self.proc.pid)
        time.sleep(0.5)
        self.idle = self.ps.memory_info().rss
        with open(f"/proc/{self.proc.pid}/clear_refs", "w") as f:
            f.write("5")  # the high-water mark starts again from the RSS now

    def peak(self) -> int:
        """The RSS high-water mark since the idle reading (bytes)."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM")

    def status(self) -> dict:
        return httpx.get(self.url + "/status", timeout=10).json()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_case(server: Server, paths: list[str]) -> dict:
    """Send ``paths`` at once; statuses, wall time (s), body bytes, peak above idle (MB)."""
    results: list[tuple[int, int, str]] = [(0, 0, "")] * len(paths)

    def one(i: int, path: str) -> None:
        try:
            r = httpx.get(f"{server.url}/iiif/3/{path}", timeout=300)
            results[i] = (r.status_code, len(r.content),
                          r.text.strip()[:120] if r.status_code >= 400 else "")
        except httpx.HTTPError as exc:
            results[i] = (-1, 0, type(exc).__name__)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(paths)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"status": [r[0] for r in results], "bytes": [r[1] for r in results],
            "why": [r[2] for r in results if r[2]], "wall_s": round(wall, 2),
            "idle_mb": round(server.idle / 2**20), "peak_mb": round((server.peak() - server.idle) / 2**20)}


def client_leaves(server: Server, path: str) -> dict:
    """Send ``path``, close the connection after 1 s; how long the render went on (s)."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(f"GET /iiif/3/{path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
    time.sleep(1.0)
    sock.close()
    t0 = time.perf_counter()
    went_on = None
    while time.perf_counter() - t0 < 60:
        st = server.status()
        if st["rendering"] == 0:
            went_on = time.perf_counter() - t0
            break
        time.sleep(0.1)
    st = server.status()
    return {"went_on_s": None if went_on is None else round(went_on, 2),
            "counters": {k: st.get(k) for k in ("cancelled_while_rendering", "cancelled_before_render",
                                                "images_rendered", "status_codes")},
            "idle_mb": round(server.idle / 2**20), "peak_mb": round((server.peak() - server.idle) / 2**20)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--big", type=Path, default=Path("/tmp/srv-bench/single-40960.svs"))
    ap.add_argument("--samples", type=Path, default=SAMPLES)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-mb", type=int, default=256)
    ap.add_argument("--repo", type=Path, default=REPO, help="checkout whose wsitool runs the server")
    ap.add_argument("--only", default=None, help="comma-separated case names")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra server argument for the client-leaves case (repeatable)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if not args.big.exists():
        args.big.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(REPO / "scripts" / "make_bench_slide.py"), str(args.big),
                        "--width", "40960", "--height", "40960", "--levels", "1"], check=True)
    slides = [str(args.samples / A), str(args.samples / C), str(args.big)]
    only = set(args.only.split(",")) if args.only else None
    rows = []
    print(f"{'case':<20} {'status':<10} {'idle MB':>8} {'peak-idle MB':>13} {'wall s':>7} {'bytes':>12}  note")
    for name, paths in [*CASES, ("client-leaves", ["{S}/full/64,/0/default.jpg"])]:
        if only and name not in only:
            continue
        paths = [p.format(S=args.big.name) for p in paths]
        server = Server(slides, args.threads, args.cache_mb, args.repo,
                        args.server_arg if name == "client-leaves" else [])
        try:
            res = client_leaves(server, paths[0]) if name == "client-leaves" else run_case(server, paths)
        finally:
            server.stop()
        res["case"] = name
        rows.append(res)
        if name == "client-leaves":
            print(f"{name:<20} {'-':<10} {res['idle_mb']:>8} {res['peak_mb']:>13} {'-':>7} {'-':>12}  "
                  f"rendered on {res['went_on_s']} s after the client left; {res['counters']}")
        else:
            print(f"{name:<20} {','.join(map(str, res['status'])):<10} {res['idle_mb']:>8} {res['peak_mb']:>13} "
                  f"{res['wall_s']:>7} {','.join(map(str, res['bytes'])):>12}  {' | '.join(res['why'])}")
        sys.stdout.flush()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
