"""A local level's stored tiles read in long runs for passthrough, each checked before it is copied (floor 6).

:func:`copied_tiles <wsitool.export.passthrough.copied_tiles>` reads and checks
one tile at a time: a ``pread`` and a header parse per tile, which on a slide of
tens of thousands of 20 KB tiles costs more than moving the bytes.  Writers
usually store a level's tiles one after the other in grid order (Aperio,
Philips, generic tiled TIFF), so :func:`stored_runs` reads a run of
consecutive tiles with one ``pread`` of up to :data:`RUN_BYTES` and hands them
out as views into it (:class:`TileRun`; :func:`stored_tiles` gives them one at
a time).

Every tile is still checked as the read path would check it before a decode
(:class:`~wsitool.export.passthrough.TileChecker`), in two ways that accept
the same tiles:

* the *signature*: the first present tile passes the full check, and its
  header, up to where the coded data begin, is kept (JPEG: from SOI through
  the SOS segment, ITU-T T.81 B.2; JPEG 2000: from SOC through the first SOT
  marker and its length, ITU-T T.800 A.4.2).  A tile whose leading bytes are
  exactly those, and which is long enough to hold them (and, JPEG 2000, its
  whole 12-byte SOT segment), has the same header: every check before a
  decode looks at nothing past it (markers, frame size against the tile cell,
  the JPEG 2000 main-header walk), so it passes them the same way.  The
  signature is kept only when the first tile declares the whole tile cell,
  which is right at any grid position.
* any other tile (a cropped edge tile, other tables, another writer's
  layout) goes through the full check, and then through ``accept`` (the
  caller's own test, such as "the same DICOM coding as the first tile").

Runs: the present tiles in grid order are cut where the bytes passed reach
:data:`RUN_BYTES`; a run is read whole when its span in the file is at most
twice the bytes of its tiles (a layout that jumps around is read tile by
tile).  One thread reads the next run while the caller copies the current one, into a buffer that no
tile handed out refers to any more (:data:`POOL` buffers are kept for that); peak memory: the runs whose
tiles the caller still holds, plus two.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from ..errors import TileDecodeError
from ..ground.bitstream import j2k_main_header, jpeg_frame_size, jpeg_segments
from ..model import PyramidLevel
from ..storage import ByteSource
from .passthrough import TileChecker

__all__ = ["POOL", "RUN_BYTES", "TileRun", "header_signature", "stored_runs", "stored_tiles", "supported"]

#: most bytes one read of a run takes (4 MiB; a tile larger than that is a run of its own)
RUN_BYTES = 4 << 20
#: run buffers kept for reuse (of RUN_BYTES each)
POOL = 8


def header_signature(lv: PyramidLevel, tile: bytes) -> tuple[bytes, int] | None:
    """``(signature, least length)`` of a tile that passed the full check, or None (no fast check).

    ``signature``: the tile's leading bytes up to where its coded data begin (module docstring);
    ``least length``: how long another tile must be to be judged by it.  None where the level's
    tiles are not JPEG streams or JPEG 2000 code streams, where the header is not in the tile
    (a JPEG whose frame header sits in the JPEGTables), or where the tile declares a size other
    than the whole tile cell.
    """
    enc = lv.encoding
    cell = (lv.tile_width, lv.tile_height)
    if enc.stream == "jpeg" and not enc.jpeg_scan_segments:
        sos = [end for marker, _start, end in jpeg_segments(tile) if marker == 0xDA]
        if not sos or jpeg_frame_size(tile) != cell:
            return None
        return bytes(tile[:sos[0]]), sos[0]
    if enc.stream == "j2k":
        head = j2k_main_header(tile)
        if head.problem or (head.width, head.height) != cell or head.start:
            return None
        return bytes(tile[:head.sot + 4]), head.sot + 12
    return None


def supported(lv: PyramidLevel) -> bool:
    """Whether :func:`stored_runs` can read ``lv``: a local file (``fileno()``) whose tile index gives each
    tile's exact byte range (not a source of frames, whose counts are upper bounds:
    :meth:`~wsitool.storage.source.ByteSource.read_segment`)."""
    return (lv.source.fileno() is not None
            and type(lv.source).read_segment is ByteSource.read_segment)


class TileRun(NamedTuple):
    """Consecutive present tiles of a level, in grid order, as they lie in one buffer: tile ``grid[k]``
    (row-major grid index) is ``data[starts[k]:starts[k] + counts[k]]``.

    Attributes:
        data: the buffer (a read-only view of a run's long read, or one tile's bytes).
        grid: ``(n,)`` int64 grid indices (``row * tiles_across + col``), increasing.
        starts: ``(n,)`` int64 offsets in ``data``.
        counts: ``(n,)`` int64 byte counts.
    """

    data: memoryview | bytes
    grid: np.ndarray
    starts: np.ndarray
    counts: np.ndarray


def stored_runs(lv: PyramidLevel, check: TileChecker, counter,
                accept: Callable[[bytes, int, int], None] | None = None) -> Iterator[TileRun]:
    """The stored bytes of every present tile of ``lv``, in row-major order, a run of tiles at a time.

    Args:
        lv: a level that :func:`supported` accepts (else ``ValueError``).
        check: the level's :class:`~wsitool.export.passthrough.TileChecker` (full checks).
        counter: ``counter.add(n)`` is called with the grid positions each run covers, missing
            tiles too (all of them by the end).
        accept: called as ``accept(data, col, row)`` with each tile the signature did not vouch
            for, after the full check (and with the first tile); raises to refuse it.

    Yields:
        :class:`TileRun` s: the tiles the signature vouched for as views of the run's buffer (valid
        as long as the caller keeps them), every other tile as a run of its own.

    Raises:
        TileDecodeError: a tile past the end of the file, a short read, or a tile failing the
            full check (the read path's message, naming level, column and row); and whatever
            ``accept`` raises.
        OSError: a run's read failed (``filename``: the slide's path).
    """
    fd = lv.source.fileno()
    if fd is None or not supported(lv):
        raise ValueError(f"{lv.path}: stored_runs needs a local file with exact tile byte ranges")
    n = lv.tiles_across * lv.tiles_down
    offs = np.asarray(lv.tiles.offsets[:n], np.int64)
    cnts = np.asarray(lv.tiles.bytecounts[:n], np.int64)
    hits = np.flatnonzero(present := (offs != 0) & (cnts != 0))
    sig = _signature(lv, _checked(lv, check, int(hits[0]), accept)) if hits.size else None
    runs = list(_runs(cnts, present))
    spans, whole = _spans(offs, cnts, runs, lv.source.size, sig is not None)

    pool: list[bytearray] = []

    def read(j: int) -> memoryview:
        return _read_span(lv, fd, pool, *spans[j]) if whole[j] else memoryview(b"")

    done = 0
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="wsitool-runs") as reader:
        ahead: Future | None = reader.submit(read, 0) if runs else None
        for j, run in enumerate(runs):
            assert ahead is not None  # submitted for run j before this step
            buf = ahead.result()
            ahead = reader.submit(read, j + 1) if j + 1 < len(runs) else None
            lo, hi = spans[j]
            if sig is not None and whole[j] and len(buf) == hi - lo:
                yield from _vouched(lv, check, accept, run, buf, offs[run] - lo, cnts[run], sig)
            else:  # tile by tile (not read whole, or a short read: the tile's own read then names it)
                for i in run.tolist():
                    yield _single(_checked(lv, check, i, accept), i)
            counter.add(int(run[-1]) + 1 - done)
            done = int(run[-1]) + 1
    if n > done:  # trailing missing tiles
        counter.add(n - done)


def _read_span(lv: PyramidLevel, fd: int, pool: list[bytearray], lo: int, hi: int) -> memoryview:
    """Bytes ``lo:hi`` of the level's file, in an idle buffer of ``pool`` (fewer at the end of the file)."""
    buf = memoryview(_idle_buffer(pool, hi - lo))[:hi - lo]
    try:
        with lv.source.reading():
            got = os.preadv(fd, [buf], lo)
    except OSError as exc:  # (EIO of a failing disk: the one line names the slide, not the output)
        raise OSError(exc.errno, exc.strerror, str(lv.path)) from exc
    return buf[:got]  # (a view from the buffer's first byte: _matches relies on it)


def _spans(offs: np.ndarray, cnts: np.ndarray, runs: list[np.ndarray], size: int,
           signed: bool) -> tuple[list[tuple[int, int]], list[bool]]:
    """Each run's byte range ``(lo, hi)`` in the file and whether it is read whole (a signature, every tile
    inside the file, a span of at most twice its tiles' bytes)."""
    # (inside: offset + count <= size, tested without adding, which overflows int64 for an offset near
    # 2**63; a run with a tile outside is read tile by tile, and that tile's read names it)
    inside = (cnts <= size) & (offs <= size - np.minimum(cnts, size))
    spans = [(int(offs[r].min()), int((offs[r] + cnts[r]).max())) if inside[r].all() else (0, 0) for r in runs]
    whole = [signed and bool(inside[r].all()) and hi - lo <= 2 * int(cnts[r].sum())
             for r, (lo, hi) in zip(runs, spans, strict=True)]
    return spans, whole


def stored_tiles(lv: PyramidLevel, check: TileChecker, counter,
                 accept: Callable[[bytes, int, int], None] | None = None) -> Iterator[memoryview | bytes | None]:
    """:func:`stored_runs` a tile at a time: the bytes of every tile of ``lv`` in row-major order (a view or
    bytes), None for a missing tile.  Same arguments and errors."""
    n = lv.tiles_across * lv.tiles_down
    nxt = 0
    for run in stored_runs(lv, check, counter, accept):
        view = memoryview(run.data)
        for i, s, c in zip(run.grid.tolist(), run.starts.tolist(), run.counts.tolist(), strict=True):
            yield from (None for _ in range(nxt, i))
            yield view[s:s + c]
            nxt = i + 1
    yield from (None for _ in range(nxt, n))


def _vouched(lv: PyramidLevel, check: TileChecker, accept, run: np.ndarray, buf: memoryview, starts: np.ndarray,
             counts: np.ndarray, sig: tuple[bytes, int]) -> Iterator[TileRun]:
    """The tiles of one run read whole: stretches the signature vouches for as runs of ``buf``, each other
    tile fully checked, as a run of its own."""
    ok = _matches(buf, starts, counts, sig)
    if ok.all():
        yield TileRun(buf, run, starts, counts)
        return
    edges = np.flatnonzero(np.diff(ok.astype(np.int8))) + 1
    for a, b in zip([0, *edges.tolist()], [*edges.tolist(), len(ok)], strict=True):
        if ok[a]:
            yield TileRun(buf, run[a:b], starts[a:b], counts[a:b])
        else:
            for i in run[a:b].tolist():
                yield _single(_checked(lv, check, i, accept), i)


def _single(data: bytes, i: int) -> TileRun:
    return TileRun(data, np.array([i], np.int64), np.zeros(1, np.int64), np.array([len(data)], np.int64))


def _idle_buffer(pool: list[bytearray], size: int) -> bytearray:
    """A buffer of at least ``size`` bytes from ``pool`` that nothing refers to any more, else a new one (kept
    in the pool, at most :data:`POOL` of them).

    Reusing the buffers spares fresh memory (page faults, zeroing) for every run.  A buffer is
    idle when no view of it is alive (the frames the writer still holds are views): a bytearray with
    live views cannot change size (``BufferError``), which is the test.
    """
    for buf in pool:
        if len(buf) >= size and _unviewed(buf):
            return buf
    buf = bytearray(max(size, RUN_BYTES))
    if len(pool) < POOL:
        pool.append(buf)
    return buf


def _unviewed(buf: bytearray) -> bool:
    try:
        buf.append(0)
    except BufferError:
        return False
    del buf[-1]
    return True


def _runs(cnts: np.ndarray, present: np.ndarray) -> Iterator[np.ndarray]:
    """Indices of the present tiles, in runs of at most :data:`RUN_BYTES` (one tile at least)."""
    idx = np.flatnonzero(present)
    if not idx.size:
        return
    ends = np.cumsum(cnts[idx])
    start = 0
    while start < idx.size:
        base = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, base + RUN_BYTES, side="right")))
        yield idx[start:stop]
        start = stop


def _signature(lv: PyramidLevel, data) -> tuple[bytes, int] | None:
    return header_signature(lv, bytes(data))


def _matches(buf: memoryview, starts: np.ndarray, counts: np.ndarray, sig: tuple[bytes, int]) -> np.ndarray:
    """Which tiles (byte ``starts`` and ``counts`` in ``buf``) begin with the signature's bytes."""
    head, least = sig
    # (``buf`` views its buffer from the first byte, as ``read`` makes it: search the buffer itself)
    data = buf.obj if isinstance(buf.obj, bytearray) else bytes(buf)
    return np.fromiter((c >= least and data.startswith(head, s)
                        for s, c in zip(starts.tolist(), counts.tolist(), strict=True)), bool, len(starts))


def _checked(lv: PyramidLevel, check: TileChecker, i: int, accept: Callable[[bytes, int, int], None] | None):
    col, row = i % lv.tiles_across, i // lv.tiles_across
    data = check.read(col, row)
    if data is None:  # pragma: no cover - present tiles have an offset and a count
        raise TileDecodeError(lv.path, lv.index, col, row, "tile vanished")
    if accept is not None:
        accept(data, col, row)
    return data
