"""Type stub of ``wsitool._jpegloop``, compiled from ``wsitool/_native/jpegloop.c``.

The per-tile loop of JPEG region reads: header checks through nvImageCodec's C API,
decoding through libjpeg-turbo's libjpeg API (corrupt data an error); its Python
face and contract are in :mod:`wsitool.codec.jpegloop`.  Optional: the module is
absent where it was not built (see ``setup.py``).
"""

from collections.abc import Sequence
from typing import final

from _typeshed import ReadableBuffer, WriteableBuffer

#: ``NVIMGCODEC_VER`` of the nvimgcodec.h the module was compiled against
#: (major * 1000 + minor * 100 + patch); ``load`` refuses another library version.
HEADER_VERSION: int
#: Most tiles one ``Decoder.decode_tiles`` call reads before it decodes them.
MAX_BATCH: int
#: Present (1) when ``decode_tiles`` takes ``scan_segments`` (NDPI restart intervals).
SCAN_SEGMENTS: int
#: Present (1) when ``decode_tiles`` takes ``dest, pieces`` and :func:`scatter` exists.
SCATTER: int
#: Present (1) when ``decode_tiles`` takes ``keep`` (pieces copied from a tile scratch) and
#: ``dest2, pieces2``.
SCATTER_KEEP: int
#: Present (1) when ``decode_tiles`` takes ``extents`` (tile bytes from memory, ``fd`` -1).
EXTENTS: int
#: Present (1) when ``decode_tiles`` splices an NDPI band's restart intervals into one code
#: stream and returns the ``spliced`` count.
SPLICE: int
#: Present (1) when tiles are decoded by libjpeg-turbo's API (failures carry its message) and
#: :func:`decode_jpeg` exists.
LIBJPEG: int
#: ``JPEG_LIB_VERSION`` of the jpeglib.h the module was compiled against (62 for libjpeg-turbo's
#: default ABI: third_party/libjpeg-turbo).
LIBJPEG_VERSION: int
#: Present (1) when libjpeg-turbo is not linked but opened by :func:`load_libjpeg`.
LIBJPEG_LOADED_AT_RUN_TIME: int

# Failure codes of the ``(job, code, a, b, message)`` entries ``decode_tiles`` returns
# (the meaning of ``a`` and ``b`` per code: wsitool.codec.jpegloop.RegionJobs._failed).
F_PAST_EOF: int
F_SHORT_READ: int
F_IO_ERROR: int
F_NOT_SOI: int
F_HEADER: int
F_GRID: int
F_OUTSIDE: int
F_SUBSTREAM: int
F_IMAGE: int
F_DECODE: int
F_NO_SEGMENT: int
F_NO_MEMORY: int

def load_libjpeg(path: str, /) -> int:
    """Open libjpeg-turbo at ``path`` and look up its functions (once: a later call returns at once).

    Returns the libjpeg API version (``LIBJPEG_VERSION``).  Raises ImportError when the library does
    not load, is not libjpeg-turbo's libjpeg API (a function missing), or is another API version or
    structure size than the module was compiled for (the library's own check).
    """

def load(lib_path: str, extensions_path: str, /) -> int:
    """Open ``libnvimgcodec`` at ``lib_path`` and create the process-wide instance (once).

    Returns the library's version.  Raises ImportError when the library does not
    load, lacks a function of the C API, is not the ``HEADER_VERSION`` release,
    or the instance cannot be created.
    """

def scatter(src: ReadableBuffer, dest: WriteableBuffer, pieces: ReadableBuffer, /) -> None:
    """Copy pieces of ``src`` (C-contiguous ``(h, w, c)`` uint8) into ``dest``, GIL released.

    ``pieces``: int64, 6 a piece: ``(dest byte offset, dest row stride in bytes, y0,
    y1, x0, x1)``, the rectangle ``[y0, y1) x [x0, x1)`` of ``src`` whose pixel
    ``(y0, x0)`` goes to ``dest + offset``; copied and checked once, at the call (``dest``
    may overlap them).  Raises ValueError when ``src`` is not such a buffer or a piece
    reads outside ``src`` or writes outside ``dest`` (checked before any copy), TypeError
    when ``pieces`` is not of int64.
    """

def decode_jpeg(stream: ReadableBuffer, out: WriteableBuffer, x0: int, y0: int, x1: int, y1: int,
                scale_log2: int = 0, /) -> str | None:
    """Decode the window ``[x0, x1) x [y0, y1)`` of a complete JPEG code stream as RGB into ``out``,
    at scale ``1 / 2**scale_log2`` (0 to 3: libjpeg's DCT scaling; the window in pixels of that scale).

    ``out``: a writable ``(y1 - y0, x1 - x0, 3)`` uint8 buffer, pixels packed, rows at
    least a row apart (a numpy view of a larger C-contiguous array).  The GIL is released.
    Returns None when decoded, else libjpeg-turbo's message: an error, or one of its warnings
    that the entropy-coded data is corrupt (``Corrupt JPEG data: ...``), which stop the
    decode here; the window's pixels are then undefined.  Raises ValueError for an ``out``
    of another shape, dtype or layout, an empty window, or ``scale_log2`` outside 0 to 3.
    """

@final
class Decoder:
    """The reusable buffers of one thread's tile loop (tile bytes, RGB scratch, a crop row).

    Raises RuntimeError when created before :func:`load`.  Calls are serialised
    by the decoder's own mutex; wsitool keeps one per thread.
    """

    def __init__(self) -> None: ...
    def decode_tiles(
        self,
        fd: int,
        prefix: ReadableBuffer,
        out: WriteableBuffer,
        offsets: ReadableBuffer,
        counts: ReadableBuffer,
        level: tuple[int, int, int, int, int, int],
        region: tuple[int, int, int, int, int, int],
        j0: int,
        j1: int,
        batch: int,
        scan_segments: int = 0,
        dest: WriteableBuffer | None = None,
        pieces: ReadableBuffer | None = None,
        keep: bool = True,
        dest2: WriteableBuffer | None = None,
        pieces2: ReadableBuffer | None = None,
        extents: Sequence[tuple[int, ReadableBuffer]] | None = None,
        /,
    ) -> tuple[int, int, int, int, int, int, int, int, list[tuple[int, int, int, int, str]]]:
        """Decode jobs ``[j0, j1)`` of a region's tiles into ``out``, GIL released.

        Args:
            fd: the slide's file descriptor (read with ``pread``), or -1 with ``extents``.
            prefix: bytes put in front of each tile (the JPEG prefix, or ``b""``).
            out: writable C-contiguous ``(h, w, 3 or 4)`` uint8 buffer.
            offsets, counts: the level's segment offsets and byte counts, uint64.
            level: ``(tile_w, tile_h, level_w, level_h, tiles_across, file_size)``.
            region: ``(rx, ry, cx0, cy0, cx1, cy1)`` in level pixels: the region's
                origin and its part inside the level.
            j0, j1: the jobs (row-major over the region's tiles).
            batch: tiles read before they are decoded, 1 .. ``MAX_BATCH``.
            scan_segments: 1 when the tiles are NDPI restart intervals.  Without chroma
                subsampling, the intervals of each band of the call (the rest of a row, or
                whole rows) are then decoded as one code stream spliced from them (a band
                that cannot be, or fails, is decoded interval by interval).
            dest, pieces: optional, as for :func:`scatter` (pieces of ``out``): after each
                decode call the decoded tiles' parts of every piece are copied into ``dest``
                while still in the cache.
            keep: with ``pieces``: False when ``out``'s pixels are not wanted besides the
                pieces.  RGB tiles are then decoded one at a time into a tile-sized scratch
                that is still in the CPU cache when the pieces are copied from it (decoding
                into a large ``out`` costs up to 10-20 % more, in cache misses), and ``out``
                holds only the zeros of failed and missing tiles.  True (the default): the
                scratch's pixels are also copied into ``out``.
            dest2, pieces2: optional, with ``pieces``: more pieces, into ``dest2`` (the
                patches of the next batch that need the same tiles).
            extents: with ``fd`` -1: the tiles' bytes, ``(start, data)`` pairs in ascending
                ``start``, ``data`` holding the file's bytes from ``start`` on (a remote
                slide's fetched ranges); a tile in none of them fails as an I/O error
                (``ENODATA``).  ValueError for extents without ``fd`` -1 or the reverse.

        Returns:
            ``(direct, roi, scratch, missing, bytes_read, decoded, allocations,
            spliced, failures)``: tile counts, bytes read, buffers (re)allocated, the
            intervals decoded in spliced bands (counted in ``decoded`` too), and the
            failed tiles as ``(job, code, a, b, message)`` with ``code`` one of ``F_*``
            (``message``: libjpeg-turbo's, for ``F_DECODE``; else empty).
            A bad tile never raises.

        Raises:
            ValueError: ``level`` or ``region`` is not a 6-tuple; a piece outside ``out`` or ``dest``.
            RuntimeError: the decoder is not initialised.
            MemoryError: the failure list itself cannot be allocated.
        """
