"""Decoding one self-contained segment (a DICOM frame) by name with imagecodecs, without a tifffile page (floor 3).

Containers other than TIFF describe their generic segments by
:attr:`wsitool.model.TileEncoding.imagecodec`; :func:`decode_frame` turns the
segment's bytes into a ``(rows, columns, samples)`` array of the level's dtype.
The names and what they mean:

* ``"raw"``: uncompressed samples, little-endian, pixel-interleaved
  (DICOM Native format, PS3.5 8.1.1 and PS3.3 C.7.6.3.1.3 Planar Configuration 0);
  ``"raw-planar"``: the same, colour-by-plane (Planar Configuration 1).
  A straight copy.
* ``"jpeg8"``: JPEG (ITU-T T.81: baseline, extended 12-bit, lossless) through
  libjpeg-turbo; the stream's JFIF / Adobe markers decide the colour transform.
* ``"jpegls"``: JPEG-LS (ITU-T T.87) through CharLS.
* ``"jpeg2k"``: JPEG 2000 / HTJ2K code streams (ISO 15444-1, -15) through OpenJPEG.
* ``"rle"``: DICOM RLE Lossless (PS3.5 annex G): a 64-byte header of 16
  little-endian uint32 (segment count, then segment offsets), one PackBits
  segment per byte plane, most significant byte first.
* ``"jpegxl"``: JPEG XL (ISO 18181) through libjxl.
* ``"czi-..."``: a Zeiss CZI subblock segment (:mod:`.czi`: an embedded CZI attachment).

Every failure is a :class:`~wsitool.errors.TileDecodeError`-ready reason
string raised as :class:`FrameError`; callers add the level, column and row.
"""

from __future__ import annotations

import imagecodecs
import numpy as np

from .czi import CZI_CODECS

__all__ = ["FrameError", "decode_frame", "IMAGECODECS"]

#: The names :func:`decode_frame` knows.
IMAGECODECS = frozenset({"raw", "raw-planar", "jpeg8", "jpegls", "jpeg2k", "rle", "jpegxl", *CZI_CODECS})


class FrameError(Exception):
    """A segment could not be decoded; ``str()`` is the reason."""


def _rle(data: bytes, rows: int, cols: int, samples: int, dtype: np.dtype) -> np.ndarray:
    if len(data) < 64:
        raise FrameError(f"RLE frame of {len(data)} bytes is shorter than its 64-byte header")
    header = np.frombuffer(data[:64], "<u4")
    count = int(header[0])
    itemsize = dtype.itemsize
    if count != samples * itemsize:
        raise FrameError(f"RLE frame has {count} segments, {samples * itemsize} expected")
    offsets = [int(v) for v in header[1:1 + count]] + [len(data)]
    pixels = rows * cols
    planes = np.empty((count, pixels), np.uint8)
    for k in range(count):
        start, stop = offsets[k], offsets[k + 1]
        if not 64 <= start <= stop <= len(data):
            raise FrameError(f"RLE segment {k} offset {start} outside the frame")
        plane = np.frombuffer(imagecodecs.packbits_decode(data[start:stop]), np.uint8)
        if plane.size < pixels:
            raise FrameError(f"RLE segment {k} decodes to {plane.size} bytes, {pixels} expected")
        planes[k] = plane[:pixels]
    # segments: sample 0 MSB .. LSB, sample 1 MSB .. LSB, ... (PS3.5 G.2)
    out = planes.reshape(samples, itemsize, rows, cols)[:, ::-1]  # LSB first = little-endian
    out = np.ascontiguousarray(out.transpose(2, 3, 0, 1)).view(dtype.newbyteorder("<"))
    return out.reshape(rows, cols, samples).astype(dtype, copy=False)


def decode_frame(name: str, data: bytes, rows: int, cols: int, samples: int,
                 dtype: np.dtype) -> np.ndarray:
    """Decode one segment to a ``(rows, cols, samples)`` array of ``dtype`` (native order).

    Args:
        name: the :attr:`~wsitool.model.TileEncoding.imagecodec` name.
        data: the segment's bytes (for JPEG with any prefix already merged).
        rows, cols, samples, dtype: the segment's declared geometry and sample type.

    Raises:
        FrameError: unknown name, the decoder failed, or the decoded array does
            not hold ``rows x cols x samples`` samples (a code stream of another
            size is refused by the header checks before this is called).
    """
    dtype = np.dtype(dtype)
    if name in ("raw", "raw-planar"):
        need = rows * cols * samples * dtype.itemsize
        if len(data) < need:
            raise FrameError(f"uncompressed frame of {len(data)} bytes, {need} expected")
        arr = np.frombuffer(data, dtype.newbyteorder("<"), rows * cols * samples)
        if name == "raw-planar":
            arr = arr.reshape(samples, rows, cols).transpose(1, 2, 0)
        return np.ascontiguousarray(arr.reshape(rows, cols, samples), dtype=dtype)
    if name == "rle":
        return _rle(data, rows, cols, samples, dtype)
    if name in CZI_CODECS:
        try:
            return CZI_CODECS[name](data, cols, rows, samples, dtype)
        except ValueError as exc:
            raise FrameError(f"{name}: {exc}") from None
    decoders = {"jpeg8": "jpeg8_decode", "jpegls": "jpegls_decode",
                "jpeg2k": "jpeg2k_decode", "jpegxl": "jpegxl_decode"}
    if name not in decoders:
        raise FrameError(f"no decoder named {name!r}")
    try:
        arr = np.asarray(getattr(imagecodecs, decoders[name])(data))
    except Exception as exc:
        raise FrameError(f"{name} decode failed: {type(exc).__name__}: {exc}") from None
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3 or arr.shape[0] < rows or arr.shape[1] < cols or arr.shape[2] != samples:
        raise FrameError(f"decoded shape {arr.shape} is not the frame's {rows}x{cols}x{samples}")
    if arr.dtype != dtype:
        if arr.dtype.kind not in "ui" or arr.dtype.itemsize > dtype.itemsize:
            raise FrameError(f"decoded samples are {arr.dtype}, the frame declares {dtype}")
        arr = arr.astype(dtype)
    return arr
