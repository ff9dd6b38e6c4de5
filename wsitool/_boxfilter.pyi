"""Type stub of ``wsitool._boxfilter``, compiled from ``wsitool/_native/boxfilter.c``.

The 2:1 integer box sums of the export pyramid and their uint8 means; the numpy
reference and the callers are in :mod:`wsitool.export.downsample`.  Optional:
the module is absent where it was not built (see ``setup.py``).  Both functions
release the GIL for the whole call.
"""

from _typeshed import ReadableBuffer, WriteableBuffer

def halve(
    src: ReadableBuffer, dst: WriteableBuffer, rows: int, width: int, src_itemsize: int, dst_itemsize: int, /
) -> None:
    """2:1 box sums of RGB rows (``wsitool.export.downsample.halve_rows_numpy`` is the reference).

    Reads ``rows`` rows of ``width`` RGB pixels of ``src`` (C-contiguous unsigned
    integers of ``src_itemsize`` bytes) and writes ``ceil(rows / 2)`` rows of
    ``ceil(width / 2)`` pixels to ``dst`` (C-contiguous, ``dst_itemsize`` bytes,
    at least the source's): each sample the sum of the up to 2 x 2 it covers.

    Raises:
        ValueError: an unsupported itemsize pair (1->2, 2->2, 2->4, 4->4, 4->8,
            8->8 are supported), a buffer that is not C-contiguous or too small,
            or sizes too large to address.
    """

def means(
    src: ReadableBuffer,
    dst: WriteableBuffer,
    rows: int,
    width: int,
    src_itemsize: int,
    k: int,
    cov_x: int,
    cov_y: int,
    last_row: bool,
    /,
) -> None:
    """uint8 means, rounded half up, of level-``k`` sums (``means_numpy`` is the reference).

    ``src``: ``(rows, width, 3)`` sums of ``src_itemsize`` bytes (2, 4 or 8);
    ``dst``: ``(rows, width, 3)`` uint8; ``cov_x`` / ``cov_y``: level-0 columns /
    rows the last column / row covers (1 .. ``2**k``), ``cov_y`` used when
    ``last_row``.

    Raises:
        ValueError: ``k`` outside 1 .. 31, a coverage outside 1 .. ``2**k``,
            ``width`` < 1, an unsupported itemsize, or a bad buffer.
    """
