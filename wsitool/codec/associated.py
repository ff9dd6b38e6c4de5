"""Decoding an associated image (label, macro, thumbnail) to RGB, with the same guards as tiles (floor 3).

Its strips or tiles are checked before tifffile hands them to imagecodecs, as
tiles are checked before decoding (and the same for the tiles of formats
without a tifffile page, e.g. DICOM frames, decoded by :mod:`.frames`): LZW data that imagecodecs' decoder crashes on
(:func:`wsitool.ground.bitstream.lzw_problem`; found by scripts/fuzz.py on a mutated
Aperio label), and JPEG frames without a readable header or declaring more
pixels than the image (decompression bombs).  The image is then decoded whole by
tifffile (the format's page handle) and converted with :func:`wsitool.ground.color.to_rgb8`.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np
import tifffile

from ..errors import CorruptFileError, ResourceLimitError, UnsupportedFormatError, WsiError
from ..ground.bitstream import j2k_main_header, jpeg_frame_size, jpeg_with_prefix, jpegls_frame_size, lzw_problem
from ..ground.color import to_rgb8
from ..ground.limits import get_limits
from ..ground.oserrors import raise_if_os_resource
from ..model import AssociatedImage
from ..storage import ByteSource
from .frames import FrameError, decode_frame

__all__ = ["decode_associated"]

_JPEG, _LZW = tifffile.COMPRESSION.JPEG, tifffile.COMPRESSION.LZW


def _segment_bytes(where: str, what: str, off: int, count: int, source: ByteSource) -> bytes:
    """The ``count`` bytes at ``off``; CorruptFileError when they pass the end of the file."""
    if off + count > source.size:
        raise CorruptFileError(f"{where}: {what} at offset {off} (+{count} bytes) lies past "
                               f"the end of the file ({source.size} bytes): truncated file")
    return source.read(off, count)


def _segment_problem(data: bytes, image: AssociatedImage) -> str | None:
    """Why one LZW or JPEG segment of ``image`` must not reach its decoder, or None (other
    compressions: None): an LZW stream that fails :func:`~wsitool.ground.bitstream.lzw_problem`,
    a JPEG stream without a frame header or whose frame passes ``image.max_segment``."""
    comp = image.encoding.compression_code
    if comp == _LZW:
        return lzw_problem(data)
    if comp != _JPEG:
        return None
    size = jpeg_frame_size(data)
    if size is None:
        return "JPEG stream without a readable frame header"
    max_w, max_h = image.max_segment
    if size[0] > max_w or size[1] > max_h:
        return (f"a JPEG frame declares {size[0]}x{size[1]} pixels, "
                f"more than the {image.width}x{image.height} image")
    return None


def _check_segments(where: str, image: AssociatedImage, source: ByteSource) -> None:
    """:func:`_segment_problem` of every present segment, before tifffile decodes them."""
    if image.encoding.compression_code not in (_LZW, _JPEG):
        return
    for off, count in zip(image.offsets, image.bytecounts, strict=False):
        if off == 0 or count == 0:
            continue
        problem = _segment_problem(_segment_bytes(where, "data", off, count, source), image)
        if problem:
            raise CorruptFileError(f"{where}: {problem}")


def decode_associated(image: AssociatedImage, source: ByteSource, lock: threading.Lock) -> np.ndarray:
    """Decode ``image`` to a ``(height, width, 3)`` uint8 RGB array.  Errors name the image,
    not the slide: the caller does (the facade: :class:`~wsitool.model.AssociatedImages`).

    Args:
        image: the description from the format.
        source: the slide's byte source (the segment checks read through it);
            ``image.source`` instead where the image has its own.
        lock: held while tifffile decodes (its file handle is shared by the slide).

    Raises:
        ResourceLimitError: the image, or the array tifffile would decode for its
            page, is larger than the region limits (checked before decoding, see
            :mod:`wsitool.ground.limits`).
        UnsupportedFormatError: samples without an RGB conversion; a TIFF page with
            ImageDepth > 1 (a volume, not one plane).
        CorruptFileError: a strip or tile fails the checks above, or the decoded
            data does not have the declared ``height x width x samples`` shape.
        WsiError: the image could not be decoded.
    """
    name = image.name
    where = f"associated image {name!r}"
    enc = image.encoding
    if enc.rgb_problem:
        raise UnsupportedFormatError(f"{where}: {enc.rgb_problem}")
    h, w, s = image.height, image.width, image.samples
    lim = get_limits()
    if h * w > lim.max_region_pixels or h * w * s * image.itemsize > lim.max_region_bytes:
        raise ResourceLimitError(
            f"{where} is {w}x{h}x{s}, over the region limits "
            f"({lim.max_region_pixels} pixels, {lim.max_region_bytes} bytes)"
        )
    source = image.source if image.source is not None else source
    if enc.page is None:  # each frame is checked as it is read (one read a frame)
        arr = _decode_tiles(where, image, source)
    else:
        _check_segments(where, image, source)
        _check_page(where, enc.page, lim)
        try:
            with lock, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                arr = enc.page.asarray()
        except WsiError:  # a remote source's failure, named as such (its own exit code)
            raise
        except Exception as exc:
            raise_if_os_resource(exc)
            raise WsiError(f"{where} could not be decoded: {exc}") from None
    arr = np.asarray(arr)
    if arr.size != h * w * s:
        raise CorruptFileError(
            f"{where} decoded to shape {arr.shape}, "
            f"not the declared {w}x{h}x{s}"
        )
    arr = arr.reshape(s, h, w).transpose(1, 2, 0) if image.planar else arr.reshape(h, w, s)
    rgb, _alpha = to_rgb8(arr, enc.photometric_code, enc.bits, enc.colormap, enc.extrasamples)
    return np.ascontiguousarray(rgb)


def _check_page(where: str, page, lim) -> None:
    """Refuse what tifffile would decode as more than the one plane declared: a page with
    ImageDepth > 1 (SGI's tag 32997 for volumes: tifffile reads depth x height x width),
    or any page whose decoded array would pass the region limits."""
    depth = int(getattr(page, "imagedepth", 1) or 1)
    if depth != 1:
        raise UnsupportedFormatError(
            f"{where} declares ImageDepth {depth} (a volume); "
            "an associated image is one plane")
    nbytes = int(np.prod(page.shape, dtype=np.uint64)) * page.dtype.itemsize if page.dtype else 0
    if nbytes > lim.max_region_bytes:
        raise ResourceLimitError(
            f"{where} would decode to {nbytes} bytes, over the "
            f"max_region_bytes limit ({lim.max_region_bytes})")


def _frame_size(data: bytes, imagecodec: str | None) -> tuple[int, int] | None:
    """The size a frame's code stream declares, where its kind has a header (JPEG-LS SOF55,
    JPEG 2000 SIZ: ``Xsiz - XOsiz``, ``Ysiz - YOsiz``, ISO 15444-1 A.5.1), else None.

    Raises:
        ValueError: a JPEG 2000 main header that fails the checks tiles get
            (:func:`wsitool.ground.bitstream.j2k_main_header`), naming the problem.
    """
    if imagecodec == "jpegls":
        return jpegls_frame_size(data) or (0, 0)
    if imagecodec == "jpeg2k":  # the same main-header checks as tiles (crash guards included)
        header = j2k_main_header(data)
        if header.problem:
            raise ValueError(header.problem)
        return (header.width, header.height)
    return None


def _decode_tiles(where: str, image: AssociatedImage, source: ByteSource) -> np.ndarray:
    """The ``(height, width, samples)`` image assembled from its tiles (segments in
    row-major order over a grid of ``image.tile_size`` cells, missing ones 0)."""
    enc = image.encoding
    tw, th = image.tile_size or (image.width, image.height)
    across = -(-image.width // tw)
    down = -(-image.height // th)
    dtype = np.dtype(f"u{image.itemsize}")
    out = np.zeros((image.height, image.width, image.samples), dtype)
    for k, (off, count) in enumerate(zip(image.offsets, image.bytecounts, strict=False)):
        if k >= across * down:
            break
        if off == 0 or count == 0:
            continue
        data = _segment_bytes(where, f"frame {k}", off, count, source)
        problem = _segment_problem(data, image)
        if problem:
            raise CorruptFileError(f"{where}: frame {k}: {problem}")
        try:
            size = _frame_size(data, enc.imagecodec)
        except ValueError as exc:
            raise CorruptFileError(f"{where}: frame {k}: {exc}") from None
        if size is not None and size != (tw, th):
            raise CorruptFileError(f"{where}: frame {k} declares {size[0]}x{size[1]} pixels, "
                                   f"not the {tw}x{th} frame size")
        if enc.stream == "jpeg":
            data = jpeg_with_prefix(enc.jpeg_prefix, data)
        try:
            arr = decode_frame(enc.imagecodec or "", data, th, tw, image.samples, dtype)
        except FrameError as exc:
            raise CorruptFileError(f"{where}: frame {k}: {exc}") from None
        r, c = divmod(k, across)
        y0, x0 = r * th, c * tw
        h, w = min(th, image.height - y0), min(tw, image.width - x0)
        out[y0:y0 + h, x0:x0 + w] = arr[:h, :w]
    return out
