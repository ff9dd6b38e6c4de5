#!/usr/bin/env python
"""Drive wsitool's native code paths for valgrind memcheck, and summarise what memcheck found.

Two modes:

* **Drive** one native path a bounded number of times (run under valgrind by
  ``scripts/valgrind_native.sh``; it also runs on its own, as a quick check that
  the path is really taken)::

      python scripts/valgrind_native.py --path boxfilter --calls 40
      python scripts/valgrind_native.py --path jpegloop --calls 12
      python scripts/valgrind_native.py --path openjpeg --calls 12

  ``boxfilter``: the two functions of the compiled 2:1 box filter
  (``wsitool._boxfilter.halve`` and ``.means``) through
  :func:`wsitool.export.downsample.halve_rows` / :func:`~wsitool.export.downsample.means`,
  on arrays of a few sizes and every sum width, checked against the numpy
  reference, plus the kernel's refusals (ValueError paths).

  ``jpegloop``: ``read_region(..., mode="rgb", out=buf)`` on
  ``samples/sample-aperio-jpeg.svs`` with ``decode_paths(native=True)``: the
  compiled JPEG tile loop (``wsitool._jpegloop``), whole and partial tiles, every
  level, one and two threads, and reads on short-lived threads (whose decoder
  is freed when the thread ends).  Regions whose last column is the first
  column of a tile are avoided: those take the Python path
  (``wsitool.read.plan.ends_one_column_into_a_tile``).  The driver counts the
  calls into the loop and fails if a read missed it.

  ``openjpeg``: region reads on ``samples/sample-aperio-j2k.svs`` with
  ``decode_paths(openjpeg=True)`` (the default): libopenjp2 through ctypes
  (``wsitool.codec.openjpeg``), partial-tile windows, whole tiles, regions
  reaching past the slide, and ``downsample=2`` reads (decoded at a reduced
  wavelet resolution); checked with the decoder pool's counters
  (``tiles_openjpeg``, ``tiles_reduced``).

  Each call is one region read (``boxfilter``: one round of kernel calls).  The
  driver prints one line of what it did and exits 0, or exits 2 if the native
  path was not taken.

* **Summarise** a memcheck XML file (``--xml=yes``)::

      python scripts/valgrind_native.py --summarize build/valgrind/openjpeg.xml \\
          --path openjpeg --calls 12

  Counts the bytes "definitely lost" (a record's direct + indirect bytes, as
  memcheck's loss records give them) in the loss records whose allocation stack
  goes through wsitool's native code: a frame of ``boxfilter.c`` /
  ``jpegloop.c`` or of the ``_boxfilter`` / ``_jpegloop`` extension modules, or
  of libopenjp2 / ``ffi_call`` (the ctypes calls of ``wsitool.codec.openjpeg``).
  Prints one line, e.g.::

      openjpeg: 0 bytes definitely lost in 0 records through wsitool's native code
      (12 calls; valgrind total definitely lost: 0 bytes in 0 records after 162
      suppressed; other memcheck errors: 64, 0 of them through wsitool's native code)

  (the total is that of the definite-leak records memcheck reported, i.e. after
  the suppressions in ``scripts/valgrind.supp``, whose matches are counted as
  "suppressed"; "other memcheck errors" are the non-leak errors, reported but not
  failed on), then each record that counts, with its stack.  Exits 1 if any bytes are lost through wsitool's
  native code, 3 if the XML file is missing or incomplete.

Standard library + numpy + wsitool only.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
import threading
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JPEG_SLIDE = os.path.join(REPO, "samples", "sample-aperio-jpeg.svs")
J2K_SLIDE = os.path.join(REPO, "samples", "sample-aperio-j2k.svs")
PATHS = ("boxfilter", "jpegloop", "openjpeg")


# ---------------------------------------------------------------------------------------------
# driving the native paths
# ---------------------------------------------------------------------------------------------

def _fail(message: str):
    """The native path was not taken (or gave wrong pixels): say so and exit 2."""
    print(f"valgrind_native: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def drive_boxfilter(calls: int) -> str:
    """``calls`` rounds of ``_boxfilter.halve`` (every source / sum width) and ``.means``."""
    import numpy as np

    from wsitool.export import downsample

    if downsample.kernel_status() != "compiled":
        _fail("boxfilter: wsitool._boxfilter is not built")
    native = downsample._boxfilter
    counted = {"halve": 0, "means": 0}

    class Counting:
        """Stands in for the module in wsitool.export.downsample and counts the calls."""

        def halve(self, *args):
            counted["halve"] += 1
            return native.halve(*args)

        def means(self, *args):
            counted["means"] += 1
            return native.means(*args)

    rng = np.random.default_rng(7)
    # (rows, width) of a few shapes: odd and even, one row, one column, a wider strip
    shapes = [(2, 2), (3, 5), (1, 7), (6, 1), (9, 33), (16, 64), (31, 250)]
    # (source dtype, sum dtype, level k whose means the sums give)
    widths = [(np.uint8, np.uint16, 1), (np.uint16, np.uint16, 2), (np.uint16, np.uint32, 5),
              (np.uint32, np.uint32, 6), (np.uint32, np.uint64, 9), (np.uint64, np.uint64, 10)]
    downsample._boxfilter = Counting()
    try:
        for i in range(calls):
            rows, w = shapes[i % len(shapes)]
            src_t, sum_t, k = widths[i % len(widths)]
            top = 255 if src_t is np.uint8 else 255 * 4 ** (k - 1)
            a = rng.integers(0, top + 1, (rows, w, 3), dtype=np.uint64).astype(src_t)
            out = np.empty(((rows + 1) // 2, (w + 1) // 2, 3), sum_t)
            downsample.halve_rows(a, out)
            ref = np.empty_like(out)
            downsample.halve_rows_numpy(a, ref)
            if not np.array_equal(out, ref):
                _fail(f"boxfilter: halve differs from numpy at {rows}x{w}")
            # means of level-k sums, the last row and column clipped on odd calls
            full = 1 << k
            cov_x, cov_y = (full, full) if i % 2 == 0 else (max(1, full // 2), max(1, full - 1))
            S = rng.integers(0, 255 * 4 ** k // 2, (rows, w, 3), dtype=np.uint64).astype(sum_t)
            px, ref8 = np.empty((rows, w, 3), np.uint8), np.empty((rows, w, 3), np.uint8)
            downsample.means(S, px, k, cov_x, cov_y, bool(i % 2))
            downsample.means_numpy(S, ref8, k, cov_x, cov_y, bool(i % 2))
            if not np.array_equal(px, ref8):
                _fail(f"boxfilter: means differs from numpy at {rows}x{w}")
            # the refusals: each returns through the kernel's clean-up with a ValueError set
            bad = i % 4
            try:
                if bad == 0:
                    native.halve(a, np.zeros((1, 1, 3), sum_t), rows + 4, w, a.itemsize, out.itemsize)
                elif bad == 1:
                    native.halve(a, np.zeros(out.shape, np.uint8), rows, w, a.itemsize, 1)
                elif bad == 2:
                    native.halve(np.zeros((4, 8, 3), np.uint8)[:, ::2], np.zeros((2, 2, 3), np.uint16),
                                 4, 4, 1, 2)
                else:
                    native.means(S, px, rows, w, S.itemsize, k, full + 1, 1, False)
            except ValueError:
                pass
            else:
                _fail("boxfilter: a bad call was not refused")
    finally:
        downsample._boxfilter = native
    if counted["halve"] < calls or counted["means"] < calls:
        _fail(f"boxfilter: the kernel was not called every time ({counted})")
    return f"{counted['halve']} halve + {counted['means']} means calls, {calls} refusals"


def _regions(lv, calls: int, seed: int, avoid_first_column: bool):
    """``calls`` regions ``(level-0 x, y, width, height)`` of level ``lv``: partial tiles at
    random places and sizes, tile-aligned ones, and ones reaching past the level's edge."""
    import random

    rnd = random.Random(seed)
    tw, th = lv.tile_width, lv.tile_height
    out = []
    for i in range(calls):
        kind = i % 3
        if kind == 0:  # partial tiles, a random window
            w, h = rnd.randint(17, int(1.6 * tw)), rnd.randint(9, int(1.6 * th))
            x, y = rnd.randint(0, max(0, lv.width - w)), rnd.randint(0, max(0, lv.height - h))
        elif kind == 1:  # whole tiles
            w, h = tw * rnd.randint(1, 2), th
            x = tw * rnd.randint(0, max(0, (lv.width - w) // tw))
            y = th * rnd.randint(0, max(0, (lv.height - h) // th))
        else:  # over the right / bottom edge (background outside)
            w, h = rnd.randint(40, tw), rnd.randint(40, th)
            x, y = lv.width - w // 2, lv.height - h // 3
        # the compiled loop leaves regions ending one column into a tile to the Python path
        while avoid_first_column and (min(x + w, lv.width) - 1) % tw == 0:
            w += 1
        out.append((x, y, w, h))
    return out


def _run_read(read, where: str) -> None:
    """Run ``read()`` on the calling thread or (``where == "thread"``) on a new thread that
    ends afterwards: its decoder state (``threading.local``) then goes with it."""
    if where != "thread":
        read()
        return
    errors = []

    def body():
        try:
            read()
        except BaseException as exc:  # re-raised on the calling thread
            errors.append(exc)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if errors:
        raise errors[0]


def _plans(calls: int):
    """Which thread a call reads on and with how many threads: the caller with one thread,
    a short-lived thread with one, the caller with two (the read pool's worker)."""
    cycle = [("caller", 1), ("thread", 1), ("caller", 2)]
    return [cycle[i % len(cycle)] for i in range(calls)]


def drive_jpegloop(calls: int) -> str:
    """``calls`` region reads through the compiled JPEG tile loop."""
    import numpy as np

    import wsitool
    from wsitool.codec import jpegloop
    from wsitool.codec.paths import decode_paths
    from wsitool.slide import pyramid_levels

    taken = {"runs": 0}
    run = jpegloop.RegionJobs.run

    def counting_run(self, pool):
        taken["runs"] += 1
        return run(self, pool)

    jpegloop.RegionJobs.run = counting_run
    slide = wsitool.open_slide(JPEG_SLIDE)
    tiles = 0
    try:
        with decode_paths(native=True, roi_decode=True, force_scratch=False):
            status = jpegloop.status()
            if not status.startswith("in use"):
                _fail(f"jpegloop: the compiled loop is {status}")
            plans = _plans(calls)
            per_level = [_regions(lv, calls, 11 + n, True) for n, lv in enumerate(pyramid_levels(slide))]
            for i in range(calls):
                n = i % len(pyramid_levels(slide))
                lv = pyramid_levels(slide)[n]
                rx, ry, w, h = per_level[n][i]
                x, y = round(rx * lv.downsample), round(ry * lv.downsample)
                buf = np.empty((h, w, 3), np.uint8)
                if not jpegloop.applies(lv, "rgb", buf):
                    _fail("jpegloop: the compiled loop does not apply")
                where, threads = plans[i]
                before = taken["runs"]
                _run_read(functools.partial(slide.read_region, (x, y), n, (w, h), mode="rgb", out=buf,
                                            threads=threads), where)
                if taken["runs"] == before:
                    _fail(f"jpegloop: read {i} ({x}, {y}, {w}x{h} of "
                                     f"level {n}) did not take the compiled loop")
                tiles += (-(-(min(rx + w, lv.width)) // lv.tile_width) - rx // lv.tile_width) * \
                         (-(-(min(ry + h, lv.height)) // lv.tile_height) - ry // lv.tile_height)
    finally:
        jpegloop.RegionJobs.run = run
        slide.close()
    return f"{calls} region reads through the compiled loop ({taken['runs']} loop runs, about {tiles} tiles)"


def drive_openjpeg(calls: int) -> str:
    """``calls`` region reads of J2K tiles through OpenJPEG's window decoder (ctypes)."""
    import numpy as np

    import wsitool
    from wsitool.codec import openjpeg
    from wsitool.codec.paths import decode_paths
    from wsitool.codec.pool import get_pool
    from wsitool.read.reduced import uses_wavelet
    from wsitool.slide import pyramid_levels

    if not openjpeg.available():
        _fail("openjpeg: libopenjp2 was not found")
    slide = wsitool.open_slide(J2K_SLIDE)
    pool = get_pool("cpu")
    start = pool.stats()
    reduced_reads = 0
    try:
        with decode_paths(openjpeg=True, roi_decode=True):
            plans = _plans(calls)
            regions = [_regions(lv, calls, 23 + n, False) for n, lv in enumerate(pyramid_levels(slide))]
            for i in range(calls):
                # every fourth read is at half scale: the tiles decoded at a reduced resolution
                k = 2 if i % 4 == 3 else 1
                n = (i // 2) % len(pyramid_levels(slide))
                lv = pyramid_levels(slide)[n]
                if k > 1 and not uses_wavelet(lv, k):
                    _fail(f"openjpeg: level {n} is not read at 1/{k} "
                                     "through the wavelet")
                rx, ry, w, h = regions[n][i]
                x, y = round(rx * lv.downsample), round(ry * lv.downsample)
                w, h = max(1, w // k), max(1, h // k)
                buf = np.empty((h, w, 3), np.uint8)
                where, threads = plans[i]
                before = pool.stats().tiles_openjpeg
                _run_read(functools.partial(slide.read_region, (x, y), n, (w, h), mode="rgb", out=buf,
                                            threads=threads, downsample=k), where)
                if pool.stats().tiles_openjpeg == before:
                    _fail(f"openjpeg: read {i} ({x}, {y}, {w}x{h} of "
                                     f"level {n}, 1/{k}) decoded no tile through OpenJPEG")
                reduced_reads += k > 1
    finally:
        slide.close()
    end = pool.stats()
    tiles = end.tiles_openjpeg - start.tiles_openjpeg
    reduced = end.tiles_reduced - start.tiles_reduced
    if reduced_reads and not reduced:
        _fail("openjpeg: no tile was decoded at a reduced resolution")
    return (f"{calls} region reads, {reduced_reads} of them at 1/2 "
            f"({tiles} tiles through OpenJPEG {openjpeg.version()}, {reduced} at reduced resolution)")


def drive(path: str, calls: int) -> int:
    fn = {"boxfilter": drive_boxfilter, "jpegloop": drive_jpegloop, "openjpeg": drive_openjpeg}[path]
    did = fn(calls)
    print(f"valgrind_native: {path}: {did}", flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# summarising memcheck's XML
# ---------------------------------------------------------------------------------------------

#: source files and shared objects that are wsitool's own native code
OWN_FILES = ("boxfilter.c", "jpegloop.c")
OWN_OBJECTS = ("_boxfilter", "_jpegloop")


def _frame_is_wsitool(frame: ET.Element) -> bool:
    """Whether one ``<frame>`` is in wsitool's C sources / extension modules, in libopenjp2,
    or in libffi's ``ffi_call`` (a ctypes call: wsitool's calls into OpenJPEG)."""
    obj = os.path.basename(frame.findtext("obj") or "")
    src = os.path.basename(frame.findtext("file") or "")
    fn = frame.findtext("fn") or ""
    return (src in OWN_FILES or any(obj.startswith(o + ".") or obj == o for o in OWN_OBJECTS)
            or "libopenjp2" in obj or fn.startswith("ffi_call"))


#: "74,412 (144 direct, 74,268 indirect) bytes in 3 blocks are definitely lost ..."
_DIRECT = re.compile(r"\(([\d,]+) direct, [\d,]+ indirect\)")


def _describe(frame: ET.Element) -> str:
    fn = frame.findtext("fn") or frame.findtext("ip") or "?"
    where = frame.findtext("file")
    if where:
        where += f":{frame.findtext('line')}"
    else:
        where = os.path.basename(frame.findtext("obj") or "?")
    return f"{fn} ({where})"


def summarize(xml_path: str, path: str, calls: int | None, show: int,
              print_suppressions: bool = False) -> int:
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError) as exc:
        print(f"{path}: cannot read {xml_path} ({exc}): did valgrind finish?", file=sys.stderr)
        return 3
    if root.tag != "valgrindoutput" or root.find("status[state='FINISHED']") is None:
        print(f"{path}: {xml_path} is not a finished memcheck run", file=sys.stderr)
        return 3
    total_bytes = total_direct = total_records = 0
    own_bytes = own_direct = 0
    own = []
    other_errors = other_own = 0
    foreign_suppressions = []
    for err in root.iter("error"):
        kind = err.findtext("kind") or ""
        stack = err.find("stack")
        frames = list(stack.iter("frame")) if stack is not None else []
        through_wsitool = any(_frame_is_wsitool(f) for f in frames)
        if not kind.startswith("Leak_"):
            other_errors += 1
            other_own += through_wsitool
            continue
        if kind != "Leak_DefinitelyLost":
            continue
        nbytes = int(err.findtext("xwhat/leakedbytes") or 0)  # direct + indirect
        nblocks = int(err.findtext("xwhat/leakedblocks") or 0)
        split = _DIRECT.search(err.findtext("xwhat/text") or "")
        direct = int(split.group(1).replace(",", "")) if split else nbytes
        total_bytes += nbytes
        total_direct += direct
        total_records += 1
        if through_wsitool:
            own_bytes += nbytes
            own_direct += direct
            own.append((nbytes, nblocks, frames))
        elif print_suppressions and err.find("suppression/rawtext") is not None:
            foreign_suppressions.append((nbytes, err.findtext("suppression/rawtext")))
    suppressed = sum(int(p.findtext("count") or 0) for p in root.findall("suppcounts/pair"))
    ncalls = f"{calls} calls" if calls is not None else "calls not given"
    print(f"{path}: {own_bytes} bytes definitely lost in {len(own)} records through wsitool's "
          f"native code ({ncalls}; valgrind total definitely lost: {total_bytes} bytes in "
          f"{total_records} records after {suppressed} suppressed; other memcheck errors: "
          f"{other_errors}, {other_own} of them through wsitool's native code)")
    if own_bytes or total_bytes:
        print(f"  (bytes of a record are its direct + indirect bytes; direct alone, as in "
              f"memcheck's LEAK SUMMARY: {own_direct} through wsitool's native code, "
              f"{total_direct} in all)")
    for nbytes, nblocks, frames in sorted(own, key=lambda r: -r[0])[:show]:
        print(f"  {nbytes} bytes in {nblocks} blocks:")
        for f in frames[:24]:
            mark = "*" if _frame_is_wsitool(f) else " "
            print(f"   {mark} {_describe(f)}")
    for nbytes, text in foreign_suppressions:
        print(f"# {path}: {nbytes} bytes definitely lost, not through wsitool's native code")
        print(text.strip())
    return 1 if own_bytes else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--path", choices=PATHS, required=True, help="native path to drive / name in the summary")
    ap.add_argument("--calls", type=int, default=None,
                    help="region reads (boxfilter: rounds of kernel calls) to make")
    ap.add_argument("--summarize", metavar="XML", help="summarise this memcheck XML file instead of driving")
    ap.add_argument("--show", type=int, default=10, help="loss records to print with their stacks (summary)")
    ap.add_argument("--print-suppressions", action="store_true",
                    help="(summary) print memcheck's suppression of each definite leak not through "
                         "wsitool's native code (needs --gen-suppressions=all)")
    args = ap.parse_args(argv)
    if args.summarize:
        return summarize(args.summarize, args.path, args.calls, args.show, args.print_suppressions)
    if args.calls is None or args.calls < 1:
        ap.error("--calls N (N >= 1) is needed to drive a path")
    return drive(args.path, args.calls)


if __name__ == "__main__":
    sys.exit(main())
