"""Writing one region array as PNG, JPEG, WebP, TIFF or ``.npy`` (``read-region``, batch region reads) (floor 6).

JPEG (``.jpg`` / ``.jpeg``, libjpeg-turbo through imagecodecs: baseline, no
chroma subsampling at quality >= 90, 4:2:0 below, as the export's JPEG tiles)
has no alpha: an RGBA region is composited onto white (the transparent
pixels are those outside the slide or of missing tiles).  WebP (``.webp``,
libwebp) keeps the alpha; quality 100 is lossless.  Both hold 8-bit samples
only: 16-bit or float raw reads go to ``.tif`` or ``.npy``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import cast

import imagecodecs
import numpy as np
import tifffile

from ..errors import InvalidOptionError
from ..ground import outputs as atomic
from ..ground.naming import about

#: File types :func:`write_image` writes, by extension.
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".tif", ".tiff", ".npy")

#: Default quality (1..100) of ``.jpg`` and ``.webp`` outputs.
DEFAULT_QUALITY = 90


def check_image_extension(path: Path) -> None:
    """Refuse a ``path`` whose extension :func:`write_image` cannot write (call it
    before reading anything).

    Raises:
        InvalidOptionError: the extension is not one of :data:`IMAGE_EXTENSIONS` (a ``ValueError``).
    """
    ext = path.suffix.lower()
    if ext not in IMAGE_EXTENSIONS:
        raise InvalidOptionError(f"{path}: unknown output extension {ext!r} (use .png, .jpg, .jpeg, .webp, "
                                 ".tif, .tiff or .npy)")


def write_image(path: Path, array, *, overwrite: bool = True, sources=(),
                quality: int = DEFAULT_QUALITY) -> None:
    """Write one region, ``array`` (``(height, width, channels)`` numpy, e.g. uint8
    RGB/RGBA or the level's dtype for raw reads), to PNG, JPEG, WebP, TIFF (zlib)
    or ``.npy`` by the extension of ``path``, atomically (:mod:`wsitool.ground.outputs`): the data
    goes to a new exclusive temporary file in the destination folder, renamed
    onto ``path`` only when complete.

    Args:
        path: the output file.
        array: the pixels.
        overwrite: replace an existing ``path`` (never one of ``sources``).
        sources: paths read to make ``array`` (the slide); ``path`` must not
            be one of them, also through a link.
        quality: 1..100, for ``.jpg`` / ``.jpeg`` / ``.webp`` (WebP: 100 is
            lossless); ignored by the other types.

    Raises:
        InvalidOptionError: (a ``ValueError``) unknown extension; a JPEG or WebP of
            samples that are not uint8, or of other than 1 (JPEG: also 2), 3 or 4
            channels; a quality outside 1..100.
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
    elif ext in (".jpg", ".jpeg", ".webp"):
        with about(os.fspath(path)):
            data = _encode_8bit(np.asarray(array), ext, quality)
    partial, fh = atomic.open_file(path, sources)
    with partial:
        with fh:
            if ext == ".npy":
                np.save(fh, array)
            elif ext in (".png", ".jpg", ".jpeg", ".webp"):
                fh.write(data)
            else:

                photometric = "rgb" if array.ndim == 3 and array.shape[2] in (3, 4) else "minisblack"
                extrasamples = ("unassalpha",) if array.ndim == 3 and array.shape[2] == 4 else None
                tifffile.imwrite(fh, array, photometric=photometric, extrasamples=extrasamples,
                                 compression="zlib")
        partial.commit(overwrite)




def _encode_8bit(arr: np.ndarray, ext: str, quality: int) -> bytes:
    """``arr`` as JPEG or WebP bytes (see the module notes); InvalidOptionError (without the
    file's name: :func:`write_image` attaches it) for what the format cannot hold."""
    kind = "WebP" if ext == ".webp" else "JPEG"
    if isinstance(quality, bool) or not isinstance(quality, (int, np.integer)) or not 1 <= quality <= 100:
        raise InvalidOptionError(f"quality must be 1..100, got {quality!r}")
    if arr.dtype != np.uint8:
        raise InvalidOptionError(f"{kind} holds 8-bit samples, this region is {arr.dtype} "
                                 "(write .tif or .npy)")
    if arr.ndim == 2:
        arr = arr[..., None]
    channels = arr.shape[2]
    if kind == "JPEG":
        if channels in (2, 4):  # no alpha in JPEG: composite onto white
            rgb = arr[..., :-1].astype(np.uint16)
            a = arr[..., -1:].astype(np.uint16)
            arr = ((rgb * a + 255 * (255 - a) + 127) // 255).astype(np.uint8)
            channels -= 1
        if channels not in (1, 3):
            raise InvalidOptionError(f"JPEG holds 1 or 3 channels, this region has {channels}")
        sub = "444" if quality >= 90 else "420"
        # (cast: imagecodecs' stubs say bytes | bytearray, bytearray only when given one as out=)
        pixels = np.ascontiguousarray(arr if channels == 3 else arr[..., 0])
        return cast(bytes, imagecodecs.jpeg8_encode(pixels, level=int(quality), subsampling=sub))
    if channels not in (3, 4):
        if channels == 1:
            arr = np.repeat(arr, 3, axis=2)
        else:
            raise InvalidOptionError(f"WebP holds 3 or 4 channels, this region has {channels}")
    if quality >= 100:
        return cast(bytes, imagecodecs.webp_encode(np.ascontiguousarray(arr), lossless=True))
    return cast(bytes, imagecodecs.webp_encode(np.ascontiguousarray(arr), level=int(quality)))
