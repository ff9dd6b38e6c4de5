"""Type stub of ``wsitool._jpegloop``, compiled from ``wsitool/_native/jpegloop.c``.

The per-tile loop of JPEG region reads against nvImageCodec's C API; its Python
face and contract are in :mod:`wsitool.codec.jpegloop`.  Optional: the module is
absent where it was not built (see ``setup.py``).
"""

from typing import final

from _typeshed import ReadableBuffer, WriteableBuffer

#: ``NVIMGCODEC_VER`` of the nvimgcodec.h the module was compiled against
#: (major * 1000 + minor * 100 + patch); ``load`` refuses another library version.
HEADER_VERSION: int
#: Most tiles one ``Decoder.decode_tiles`` call decodes per nvImageCodec call.
MAX_BATCH: int
#: Present (1) when ``decode_tiles`` takes ``scan_segments`` (NDPI restart intervals).
SCAN_SEGMENTS: int
#: Present (1) when ``decode_tiles`` takes ``dest, pieces`` and :func:`scatter` exists.
SCATTER: int
#: Present (1) when ``decode_tiles`` splices an NDPI band's restart intervals into one code
#: stream and returns the ``spliced`` count.
SPLICE: int

# Failure codes of the ``(job, code, a, b)`` entries ``decode_tiles`` returns
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
    ``(y0, x0)`` goes to ``dest + offset``.  Raises ValueError when ``src`` is not
    such a buffer or a piece reads outside ``src`` or writes outside ``dest`` (checked
    before any copy).
    """

def _fail_batch_calls(n: int, /) -> None:
    """Test hook: the next ``n`` decode calls of more than one tile fail as a whole."""

@final
class Decoder:
    """One CPU-only nvImageCodec decoder (one libjpeg-turbo thread) and its reusable buffers.

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
        /,
    ) -> tuple[int, int, int, int, int, int, int, int, list[tuple[int, int, int, int]]]:
        """Decode jobs ``[j0, j1)`` of a region's tiles into ``out``, GIL released.

        Args:
            fd: the slide's file descriptor (read with ``pread``).
            prefix: bytes put in front of each tile (the JPEG prefix, or ``b""``).
            out: writable C-contiguous ``(h, w, 3 or 4)`` uint8 buffer.
            offsets, counts: the level's segment offsets and byte counts, uint64.
            level: ``(tile_w, tile_h, level_w, level_h, tiles_across, file_size)``.
            region: ``(rx, ry, cx0, cy0, cx1, cy1)`` in level pixels: the region's
                origin and its part inside the level.
            j0, j1: the jobs (row-major over the region's tiles).
            batch: tiles per nvImageCodec decode call, 1 .. ``MAX_BATCH``.
            scan_segments: 1 when the tiles are NDPI restart intervals.  Without chroma
                subsampling, the intervals of each band of the call (the rest of a row, or
                whole rows) are then decoded as one code stream spliced from them (a band
                that cannot be, or fails, is decoded interval by interval).
            dest, pieces: optional, as for :func:`scatter` (pieces of ``out``): after each
                decode call the decoded tiles' parts of every piece are copied into ``dest``
                while still in the cache.

        Returns:
            ``(direct, roi, scratch, missing, bytes_read, decoded, allocations,
            spliced, failures)``: tile counts, bytes read, buffers (re)allocated, the
            intervals decoded in spliced bands (counted in ``decoded`` too), and the
            failed tiles as ``(job, code, a, b)`` with ``code`` one of ``F_*``.
            A bad tile never raises.

        Raises:
            ValueError: ``level`` or ``region`` is not a 6-tuple; a piece outside ``out`` or ``dest``.
            RuntimeError: the decoder is not initialised.
            MemoryError: the failure list itself cannot be allocated.
        """
