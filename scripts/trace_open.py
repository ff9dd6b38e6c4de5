#!/usr/bin/env python3
"""Which modules ``open_slide`` passes through on its way to a format (issue 48 item 1's figure).

Usage::

    python scripts/trace_open.py [--json] [--kinds file,folder,http,prefix,dicomweb]

Opens one slide of each kind of location (a local SVS, a DICOM folder, the SVS by HTTP from
nginx, the DICOM folder under a bucket prefix on moto's S3, the DICOM series from Orthanc's
DICOMweb) once to load what it imports, then once more under :func:`sys.setprofile`, and
counts, for that second open:

* ``way``: the wsitool modules entered before the first call into a format's own package
  (``wsitool/formats/<format>/``): the modules the open passes through to reach a format;
* ``chain``: the wsitool modules on the call stack at that first call (open_slide down to the
  format's entry point), in order;
* ``calls``: calls of wsitool functions before that first call (the work on the way);
* ``modules``: every wsitool module entered during the whole open (the format's own included).

A kind whose server is not installed (nginx, moto_server, Orthanc with its DICOMweb plugin) is
left out with the reason.  Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO.parent / "shared" / "samples"
PACKAGE = str(REPO / "wsitool") + os.sep
SVS = "aperio-cmu1-small-region-jpeg.svs"
SERIES = "dicom-openslide-boxes"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _rel(filename: str) -> str | None:
    return filename[len(PACKAGE) - len("wsitool/"):] if filename.startswith(PACKAGE) else None


def _format_package(rel: str) -> bool:
    parts = rel.split("/")
    return len(parts) > 3 and parts[1] == "formats"  # wsitool/formats/<format>/<module>.py


def trace(location, **kwargs) -> dict:
    """The figures of one ``open_slide(location, **kwargs)`` (after one untraced open)."""
    import wsitool

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wsitool.open_slide(location, **kwargs).close()
        seen: list[str] = []
        way: list[str] = []
        chain: list[str] = []
        calls = [0]

        def profile(frame, event, arg):
            if event != "call":
                return
            rel = _rel(frame.f_code.co_filename)
            if rel is None:
                return
            if rel not in seen:
                seen.append(rel)
            if not chain and not _format_package(rel):
                calls[0] += 1
            if not chain and _format_package(rel):
                stack, f = [], frame
                while f is not None:
                    r = _rel(f.f_code.co_filename)
                    if r is not None and (not stack or stack[-1] != r):
                        stack.append(r)
                    f = f.f_back
                chain.extend(reversed(stack))
                way.extend(m for m in seen if not _format_package(m))

        sys.setprofile(profile)
        try:
            slide = wsitool.open_slide(location, **kwargs)
        finally:
            sys.setprofile(None)
        slide.close()
    return {"way": len(way), "calls": calls[0], "chain": chain, "modules": len(seen), "way_modules": way,
            "all_modules": seen}


def _servers(kinds: list[str], stack: contextlib.ExitStack) -> dict:
    """``{kind: (location, kwargs) or reason}``."""
    out: dict = {"file": (str(SAMPLES / SVS), {}), "folder": (str(SAMPLES / SERIES), {})}
    remote = _load("remote_servers")
    if "http" in kinds:
        if remote.NGINX is None:
            out["http"] = "nginx is not installed"
        else:
            srv = stack.enter_context(remote.nginx(SAMPLES))
            out["http"] = (srv.url + SVS, {})
    if "prefix" in kinds:
        if not remote.moto_available():
            out["prefix"] = "moto_server is not installed"
        else:
            import boto3

            srv = stack.enter_context(remote.moto_s3())
            os.environ.update(srv.extra["env"])
            client = boto3.client("s3")
            client.create_bucket(Bucket="series")
            for p in sorted((SAMPLES / SERIES).iterdir()):
                client.upload_file(str(p), "series", f"{SERIES}/{p.name}")
            out["prefix"] = (f"s3://series/{SERIES}/", {})
    if "dicomweb" in kinds:
        web = _load("dicomweb_servers")
        why = web.missing()
        if why:
            out["dicomweb"] = why
        else:
            server = stack.enter_context(web.orthanc())
            (url,) = server.load(sorted((SAMPLES / SERIES).glob("*.dcm")))
            out["dicomweb"] = (url, {})
    return {k: v for k, v in out.items() if k in kinds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--kinds", default="file,folder,http,prefix,dicomweb")
    args = ap.parse_args(argv)
    kinds = args.kinds.split(",")
    results = {}
    with contextlib.ExitStack() as stack:
        for kind, what in _servers(kinds, stack).items():
            results[kind] = {"skipped": what} if isinstance(what, str) else trace(what[0], **what[1])
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    union: set[str] = set()
    whole: set[str] = set()
    for kind, r in results.items():
        if "skipped" in r:
            print(f"{kind}: skipped ({r['skipped']})")
            continue
        union.update(r["way_modules"])
        whole.update(r["all_modules"])
        print(f"{kind}: {r['way']} modules and {r['calls']} calls on the way to the format, "
              f"{r['modules']} modules in the whole open")
        print("    chain: " + " -> ".join(m.removeprefix("wsitool/") for m in r["chain"]))
        print("    way:   " + ", ".join(m.removeprefix("wsitool/") for m in r["way_modules"]))
    print(f"all kinds: {len(union)} distinct modules on the way to a format, {len(whole)} in the whole opens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
