"""Painting a mosaic level's virtual tiles from its placed images (floor 3).

A mosaic level (:mod:`wsitool.mosaic`) has no stored tiles: :func:`paint` renders a window of
it by finding the placements that overlap it (the mosaic's spatial index), decoding each of
their images once (kept in the mosaic's :class:`~wsitool.mosaic.DecodedImages` cache, so the
virtual tiles an image spans decode it once) and copying them in paint order into a fresh
array.  Only the images the window needs are read.

The codecs of the images, by name (:data:`CODECS`; a format picks one per image):

* ``"jpeg"``: a complete JPEG stream (libjpeg-turbo, its default DCT and upsampling, as
  OpenSlide decodes MIRAX images); ``"png"``; ``"bmp"`` (BMP24, bottom-up rows);
* ``"raw"``: uncompressed little-endian samples, pixel-interleaved; ``"raw-bgr"``: the same
  with the colour samples in BGR order (CZI ``Bgr24``, ``Bgra32``: reversed to RGB order);
* ``"zstd"``, ``"zstd-bgr"``: a zstd frame holding ``"raw"`` / ``"raw-bgr"`` samples;
* ``"jpegxr"``, ``"jpegxr-bgr"``: a JPEG XR stream (jxrlib through imagecodecs).

More can be added with :func:`register_codec`.  Every image's declared size is checked before
its decoder allocates anything where the stream states one (JPEG, PNG, BMP), and its decoded
shape always: an image of another size is a :class:`~wsitool.errors.TileDecodeError`, as a
short read is; an image past the end of its file (a truncated data file) is a
:class:`~wsitool.errors.TruncatedDataError` (a tile error that is also a corrupt file).
"""

from __future__ import annotations

import posixpath
import struct
from collections.abc import Callable

import imagecodecs
import numpy as np

from ..errors import TileDecodeError, TruncatedDataError
from ..ground.bitstream import jpeg_frame_size, jpeg_with_prefix
from ..model import PyramidLevel
from ..mosaic import Mosaic
from .czi import CZI_CODECS
from .pool import ThreadState
from .strictjpeg import decode_jpeg

__all__ = ["CODECS", "MosaicImageError", "register_codec", "decode_image", "paint"]


class MosaicImageError(Exception):
    """An image could not be read or decoded; ``str()`` is the reason."""


class TruncatedImage(MosaicImageError):
    """An image lies past the end of its file (a truncated data file)."""


#: ``decoder(data, width, height, samples, dtype) -> (height, width, samples) array``.
Decoder = Callable[[bytes, int, int, int, np.dtype], np.ndarray]


def _declared(name: str, size: tuple[int, int] | None, width: int, height: int) -> None:
    if size is None:
        raise MosaicImageError(f"not a {name} stream (no frame header)")
    if size != (width, height):
        raise MosaicImageError(f"{name} stream declares {size[0]}x{size[1]} pixels, "
                               f"the image is {width}x{height}")


def _samples(arr: np.ndarray, samples: int, dtype: np.dtype) -> np.ndarray:
    """``arr`` (2-D or 3-D) as ``samples`` samples of ``dtype``: grey widened to RGB, alpha dropped."""
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.shape[2] == 1 and samples == 3:
        arr = np.repeat(arr, 3, axis=2)
    elif arr.shape[2] == 4 and samples == 3:
        arr = arr[:, :, :3]
    if arr.shape[2] != samples or arr.dtype != dtype:
        raise MosaicImageError(f"decoded {arr.shape[2]} x {arr.dtype} samples, the mosaic holds "
                               f"{samples} x {dtype}")
    return arr


def _jpeg(data: bytes, width: int, height: int, samples: int, dtype: np.dtype) -> np.ndarray:
    _declared("JPEG", jpeg_frame_size(data), width, height)
    if samples != 3 or dtype != np.uint8:
        return _samples(np.asarray(imagecodecs.jpeg8_decode(data)), samples, dtype)
    out = np.empty((height, width, 3), np.uint8)
    problem = decode_jpeg(data, out, 0, 0, width, height)
    if problem is not None:
        raise MosaicImageError(f"JPEG decode failed: {problem}")
    return out


def _png(data: bytes, width: int, height: int, samples: int, dtype: np.dtype) -> np.ndarray:
    if len(data) < 24 or data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise MosaicImageError("not a PNG stream (no IHDR)")
    _declared("PNG", struct.unpack(">II", data[16:24]), width, height)
    return _samples(np.asarray(imagecodecs.png_decode(data)), samples, dtype)


def _bmp(data: bytes, width: int, height: int, samples: int, dtype: np.dtype) -> np.ndarray:
    if len(data) < 26 or data[:2] != b"BM":
        raise MosaicImageError("not a BMP stream")
    w, h = struct.unpack("<ii", data[18:26])
    _declared("BMP", (w, h), width, height)  # (bottom-up rows only, as OpenSlide reads BMP)
    return _samples(np.asarray(imagecodecs.bmp_decode(data)), samples, dtype)


def _raw(bgr: bool) -> Decoder:
    def decode(data: bytes, width: int, height: int, samples: int, dtype: np.dtype) -> np.ndarray:
        need = width * height * samples * dtype.itemsize
        if len(data) < need:
            raise MosaicImageError(f"uncompressed image of {len(data)} bytes, {need} expected")
        arr = np.frombuffer(data, dtype.newbyteorder("<"), width * height * samples)
        arr = arr.reshape(height, width, samples).astype(dtype, copy=False)
        if bgr and samples >= 3:
            arr = np.concatenate([arr[:, :, 2::-1], arr[:, :, 3:]], axis=2)
        return np.ascontiguousarray(arr)
    return decode


def _zstd(bgr: bool) -> Decoder:
    raw = _raw(bgr)

    def decode(data: bytes, width: int, height: int, samples: int, dtype: np.dtype) -> np.ndarray:
        need = width * height * samples * dtype.itemsize
        try:
            plain = imagecodecs.zstd_decode(data, out=need)  # (never more than the image's bytes)
        except Exception as exc:
            raise MosaicImageError(f"zstd decode failed: {type(exc).__name__}: {exc}") from None
        return raw(bytes(plain), width, height, samples, dtype)
    return decode


def _jpegxr(bgr: bool) -> Decoder:
    def decode(data: bytes, width: int, height: int, samples: int, dtype: np.dtype) -> np.ndarray:
        arr = _samples(np.asarray(imagecodecs.jpegxr_decode(data)), samples, dtype)
        if bgr and samples >= 3:
            arr = np.ascontiguousarray(np.concatenate([arr[:, :, 2::-1], arr[:, :, 3:]], axis=2))
        return arr
    return decode


#: The image codecs by name (see the module docstring).
CODECS: dict[str, Decoder] = {
    "jpeg": _jpeg, "png": _png, "bmp": _bmp, "raw": _raw(False), "raw-bgr": _raw(True),
    "zstd": _zstd(False), "zstd-bgr": _zstd(True), "jpegxr": _jpegxr(False), "jpegxr-bgr": _jpegxr(True),
    **CZI_CODECS,  # Zeiss CZI subblocks (their whole segment: :mod:`.czi`)
}


def register_codec(name: str, decoder: Decoder) -> None:
    """Add (or replace) the image codec ``name``: ``decoder(data, width, height, samples, dtype)``
    returns the ``(height, width, samples)`` array of ``dtype`` and raises
    :class:`MosaicImageError` (or any exception: it becomes the tile's error) on bad data.  It
    must refuse a stream declaring another size before allocating for it."""
    CODECS[name] = decoder


def decode_image(mosaic: Mosaic, k: int, state: ThreadState | None = None) -> np.ndarray:
    """Image ``k`` of ``mosaic`` decoded (``(height, width, samples)`` of the mosaic's dtype),
    from the mosaic's cache or read and decoded (its bytes counted in ``state.stats.bytes_read``).

    Raises:
        MosaicImageError: the image lies past the end of its file, the read is short, the
            decoder failed or gave another size.
    """
    cached = mosaic.cached(k)
    if cached is not None:
        return cached
    source = mosaic.sources[int(mosaic.image_source[k])]
    offset, length = int(mosaic.image_offset[k]), int(mosaic.image_length[k])
    width, height = int(mosaic.image_width[k]), int(mosaic.image_height[k])
    name = mosaic.codecs[int(mosaic.image_codec[k])]
    shown = posixpath.basename((source.path or "").split("?")[0]) or "its file"  # (never a URL's secrets)
    where = f"image {k} ({name}, {length} bytes at offset {offset} of {shown})"
    if offset + length > source.size:
        raise TruncatedImage(f"{where} lies past the end of the file ({source.size} bytes): truncated file")
    with source.reading():  # (the slide's close waits for it)
        data = source.read(offset, length)
    if len(data) != length:
        raise MosaicImageError(f"{where}: short read of {len(data)} bytes")
    if state is not None:
        state.stats.bytes_read += length
    decoder = CODECS.get(name)
    if decoder is None:
        raise MosaicImageError(f"{where}: no image codec named {name!r}")
    data = bytes(data)
    if name == "jpeg" and mosaic.jpeg_prefix:
        data = jpeg_with_prefix(mosaic.jpeg_prefix, data)  # (TIFF tiles: the level's JPEGTables)
    try:
        arr = decoder(data, width, height, mosaic.samples, mosaic.dtype)
    except MosaicImageError as exc:
        raise MosaicImageError(f"{where}: {exc}") from None
    except Exception as exc:  # a decoder's own failure on bad bytes
        raise MosaicImageError(f"{where}: {type(exc).__name__}: {exc}") from None
    if arr.shape != (height, width, mosaic.samples):
        raise MosaicImageError(f"{where}: decoded shape {arr.shape}, expected {(height, width, mosaic.samples)}")
    mosaic.keep(k, arr)
    return arr


def paint(level: PyramidLevel, col: int, row: int, rect: tuple[int, int, int, int],
          state: ThreadState) -> tuple[np.ndarray, np.ndarray | None] | None:
    """Render the window ``rect`` (``(x0, y0, x1, y1)``, pixels of virtual tile ``(col, row)``,
    inside the level) of mosaic level ``level``.

    Returns:
        ``(pixels, covered)``: a new ``(y1 - y0, x1 - x0, samples)`` array of the level's dtype
        (0 where no placement paints) and a bool ``(h, w)`` mask of the painted pixels (None
        when all are); or None when no placement touches the window (counted as missing).

    Raises:
        TileDecodeError: an image the window needs could not be read or decoded.
    """
    mosaic: Mosaic = level.mosaic
    bx, by = col * level.tile_width, row * level.tile_height
    x0, y0, x1, y1 = bx + rect[0], by + rect[1], bx + rect[2], by + rect[3]
    hits = mosaic.query(x0, y0, x1, y1)
    if not len(hits):
        state.stats.tiles_missing += 1
        return None
    out = np.zeros((y1 - y0, x1 - x0, mosaic.samples), mosaic.dtype)
    covered = np.zeros((y1 - y0, x1 - x0), bool)
    for p in hits.tolist():
        try:
            img = decode_image(mosaic, int(mosaic.image[p]), state)
        except MosaicImageError as exc:
            cls = TruncatedDataError if isinstance(exc, TruncatedImage) else TileDecodeError
            raise cls(level.path, level.index, col, row, str(exc)) from None
        px, py = int(mosaic.px[p]), int(mosaic.py[p])
        ax0, ay0 = max(x0, px), max(y0, py)
        ax1, ay1 = min(x1, px + int(mosaic.w[p])), min(y1, py + int(mosaic.h[p]))
        sx, sy = int(mosaic.sx[p]) + ax0 - px, int(mosaic.sy[p]) + ay0 - py
        out[ay0 - y0:ay1 - y0, ax0 - x0:ax1 - x0] = img[sy:sy + ay1 - ay0, sx:sx + ax1 - ax0]
        covered[ay0 - y0:ay1 - y0, ax0 - x0:ax1 - x0] = True
    state.stats.tiles_generic += 1
    state.stats.tiles_decoded += 1
    return out, (None if covered.all() else covered)
