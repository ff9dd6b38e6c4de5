"""Writing one region array as PNG, TIFF or ``.npy`` (``read-region``, batch region reads) (floor 6)."""

from __future__ import annotations

import os
from pathlib import Path

import imagecodecs
import numpy as np
import tifffile

from .. import atomic


#: File types :func:`write_image` writes, by extension.
IMAGE_EXTENSIONS = (".png", ".tif", ".tiff", ".npy")


def check_image_extension(path: Path) -> None:
    """Refuse a ``path`` whose extension :func:`write_image` cannot write (call it
    before reading anything).

    Raises:
        ValueError: the extension is not one of :data:`IMAGE_EXTENSIONS`.
    """
    ext = path.suffix.lower()
    if ext not in IMAGE_EXTENSIONS:
        raise ValueError(f"{path}: unknown output extension {ext!r} (use .png, .tif, .tiff or .npy)")


def write_image(path: Path, array, *, overwrite: bool = True, sources=()) -> None:
    """Write one region, ``array`` (``(height, width, channels)`` numpy, e.g. uint8
    RGB/RGBA or the level's dtype for raw reads), to PNG, TIFF (zlib) or ``.npy``
    by the extension of ``path``, atomically (:mod:`wsitool.atomic`): the data
    goes to a new exclusive temporary file in the destination folder, renamed
    onto ``path`` only when complete.

    Args:
        path: the output file.
        array: the pixels.
        overwrite: replace an existing ``path`` (never one of ``sources``).
        sources: paths read to make ``array`` (the slide); ``path`` must not
            be one of them, also through a link.

    Raises:
        ValueError: unknown extension.
        OutputIsSourceError: ``path`` is one of ``sources`` (also a ValueError).
        OutputExistsError: ``path`` exists and ``overwrite`` is False (a FileExistsError).
        IsADirectoryError: ``path`` is an existing folder.
        FileNotFoundError: the destination folder does not exist.
        OSError: a write error (disk full, permission), naming ``path``.
    """

    path = Path(os.fspath(path))
    check_image_extension(path)
    ext = path.suffix.lower()
    atomic.check_output(path, sources, overwrite)
    if ext == ".png":
        arr = array
        if arr.ndim == 3 and arr.shape[2] not in (1, 2, 3, 4):
            arr = arr[..., :3]
        data = imagecodecs.png_encode(np.ascontiguousarray(arr))  # encode before creating the file
    partial, fh = atomic.open_file(path, sources)
    with partial:
        with fh:
            if ext == ".npy":
                np.save(fh, array)
            elif ext == ".png":
                fh.write(data)
            else:

                photometric = "rgb" if array.ndim == 3 and array.shape[2] in (3, 4) else "minisblack"
                extrasamples = ("unassalpha",) if array.ndim == 3 and array.shape[2] == 4 else None
                tifffile.imwrite(fh, array, photometric=photometric, extrasamples=extrasamples,
                                 compression="zlib")
        partial.commit(overwrite)


