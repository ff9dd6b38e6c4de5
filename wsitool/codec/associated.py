"""Decoding an associated image (label, macro, thumbnail) to RGB, with the same guards as tiles (floor 3).

Its strips or tiles are checked before tifffile hands them to imagecodecs, as
tiles are checked before decoding: LZW data that imagecodecs' decoder crashes on
(:func:`wsitool.bitstream.lzw_problem`; found by scripts/fuzz.py on a mutated
Aperio label), and JPEG frames without a readable header or declaring more
pixels than the image (decompression bombs).  The image is then decoded whole by
tifffile (the format's page handle) and converted with :func:`wsitool.color.to_rgb8`.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np

from ..bitstream import jpeg_frame_size, lzw_problem
from ..color import to_rgb8
from ..errors import CorruptFileError, ResourceLimitError, UnsupportedFormatError, WsiError, raise_if_os_resource
from ..model import AssociatedImage
from ..settings import get_limits
from ..storage import ByteSource

__all__ = ["decode_associated"]

_JPEG, _LZW = 7, 5


def _check_segments(where: str, image: AssociatedImage, source: ByteSource) -> None:
    comp = image.encoding.compression_code
    if comp not in (_LZW, _JPEG):
        return
    max_w, max_h = image.max_segment
    for off, count in zip(image.offsets, image.bytecounts):
        if off == 0 or count == 0:
            continue
        if off + count > source.size:
            raise CorruptFileError(f"{where}: data at offset {off} (+{count} bytes) lies past "
                                   f"the end of the file ({source.size} bytes): truncated file")
        data = source.read(off, count)
        if comp == _LZW:
            problem = lzw_problem(data)
            if problem:
                raise CorruptFileError(f"{where}: {problem}")
            continue
        size = jpeg_frame_size(data)
        if size is None:
            raise CorruptFileError(f"{where}: JPEG stream without a readable frame header")
        if size[0] > max_w or size[1] > max_h:
            raise CorruptFileError(f"{where}: a JPEG frame declares {size[0]}x{size[1]} pixels, "
                                   f"more than the {image.width}x{image.height} image")


def decode_associated(path: str, image: AssociatedImage, source: ByteSource,
                      lock: threading.Lock) -> np.ndarray:
    """Decode ``image`` to a ``(height, width, 3)`` uint8 RGB array.

    Args:
        path: the slide's path (named in messages).
        image: the description from the format.
        source: the slide's byte source (the segment checks read through it).
        lock: held while tifffile decodes (its file handle is shared by the slide).

    Raises:
        ResourceLimitError: the image is larger than the region limits
            (checked before decoding, see :mod:`wsitool.settings`).
        UnsupportedFormatError: samples without an RGB conversion.
        CorruptFileError: a strip or tile fails the checks above, or the decoded
            data does not have the declared ``height x width x samples`` shape.
        WsiError: the image could not be decoded.
    """
    name = image.name
    enc = image.encoding
    if enc.rgb_problem:
        raise UnsupportedFormatError(f"{path}: associated image {name!r}: {enc.rgb_problem}")
    h, w, s = image.height, image.width, image.samples
    lim = get_limits()
    if h * w > lim.max_region_pixels or h * w * s * image.itemsize > lim.max_region_bytes:
        raise ResourceLimitError(
            f"{path}: associated image {name!r} is {w}x{h}x{s}, over the region limits "
            f"({lim.max_region_pixels} pixels, {lim.max_region_bytes} bytes)"
        )
    _check_segments(f"{path}: associated image {name!r}", image, source)
    try:
        with lock, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            arr = enc.page.asarray()
    except Exception as exc:
        raise_if_os_resource(exc, path)
        raise WsiError(f"{path}: associated image {name!r} could not be decoded: {exc}") from None
    arr = np.asarray(arr)
    if arr.size != h * w * s:
        raise CorruptFileError(
            f"{path}: associated image {name!r} decoded to shape {arr.shape}, "
            f"not the declared {w}x{h}x{s}"
        )
    arr = arr.reshape(s, h, w).transpose(1, 2, 0) if image.planar else arr.reshape(h, w, s)
    rgb, _alpha = to_rgb8(arr, enc.photometric_code, enc.bits, enc.colormap, enc.extrasamples)
    return np.ascontiguousarray(rgb)
