"""Decoding a Zeiss CZI subblock: its segment's bytes to pixels (floor 3).

A CZI level is a mosaic (:mod:`wsitool.mosaic`) whose images are subblocks; each image's bytes
are its whole ``ZISRAWSUBBLOCK`` segment (from its 32-byte segment header up to the next
segment the file lists), so that where the pixel data starts (after the fixed fields, the
directory entry padded to 256 bytes and the subblock's own metadata) is read from the bytes
of the one read that fetches it, never at open.  The decoders, by codec name
(:data:`CZI_CODECS`, ``czi-<compression>`` with ``-bgr`` where the colour samples are
stored blue first, ``Bgr24`` and ``Bgr48``, reversed here to RGB order, or ``-bgra``:
``Bgra32``, reversed and its alpha dropped, 3 samples):

* ``czi-raw``: uncompressed little-endian samples, pixel-interleaved;
* ``czi-zstd0``: a zstd frame holding them;
* ``czi-zstd1``: a header (its length ``n`` in the first byte, 1 or 3; with 3, chunk type 1
  and a flag byte whose bit 0 is *hi-lo packing*: the low byte of every 16-bit sample
  stored first, then all the high bytes), then a zstd frame;
* ``czi-jpegxr``: a JPEG XR stream (jxrlib through imagecodecs, after its container and image
  header are checked against the subblock, :func:`jpegxr_problem`; the format converter gives
  a ``24bppBGR`` / ``32bppBGRA`` stream in RGB order: no ``-bgr`` variant);
* ``czi-jpeg``: a JPEG stream (libjpeg-turbo through imagecodecs, RGB order; its frame header
  is checked against the subblock's size first).

Every decoder refuses a payload whose size disagrees with the subblock's (a zstd frame is
never decompressed to more than the subblock's bytes) and raises :class:`ValueError` naming
the problem.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import imagecodecs
import numpy as np

from ..ground.bitstream import jpeg_frame_size

__all__ = ["CZI_CODECS", "payload", "unpack_hilo", "jpegxr_size", "jpegxr_problem"]

_SEGMENT = struct.Struct("<16sqq")


def payload(segment: bytes) -> bytes:
    """The pixel data of a ``ZISRAWSUBBLOCK`` segment's bytes (``segment``, from its header on).

    Raises:
        ValueError: not a subblock segment, cut short, or sizes that leave it.
    """
    if len(segment) < _SEGMENT.size + 48 or segment[:16].rstrip(b"\0") != b"ZISRAWSUBBLOCK":
        raise ValueError("not a ZISRAWSUBBLOCK segment")
    meta, attach, data = struct.unpack_from("<iiq", segment, _SEGMENT.size)
    ndims = struct.unpack_from("<i", segment, _SEGMENT.size + 16 + 28)[0]
    if not 0 <= ndims <= 64:
        raise ValueError(f"subblock header lists {ndims} dimensions")
    start = _SEGMENT.size + 16 + max(240, 32 + 20 * ndims) + meta
    if meta < 0 or attach < 0 or data <= 0 or start + data > len(segment):
        raise ValueError(f"subblock declares {data} data bytes after {meta} metadata bytes; the segment "
                         f"holds {len(segment)}")
    return segment[start:start + data]


#: jxrlib's pixel format GUIDs 6fddc324-4e03-4bfe-b185-3d77768dc9XX (as stored: little-endian
#: fields): the first 15 bytes, and the last byte of those a CZI subblock is stored in (8bppGray,
#: 16bppGray, 24bppBGR, 24bppRGB, 32bppBGR, 32bppBGRA, 48bppRGB).
_JXR_GUID = bytes.fromhex("24c3dd6f034efe4bb1853d77768dc9")
_JXR_FORMATS = frozenset({0x08, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F, 0x15})
#: The codestream's OUTPUT_CLR_FMT and OUTPUT_BITDEPTH of those: YONLY or RGB, BD8 or BD16.
_JXR_OUTPUT = frozenset({(0, 1), (0, 2), (7, 1), (7, 2)})


def _jxr_tags(data: bytes) -> dict[int, int] | None:
    """The container's IFD entries (ITU-T T.832 annex A) as tag -> value or offset, or None."""
    if len(data) < 8 or data[:3] != b"II\xbc":
        return None
    ifd = struct.unpack_from("<I", data, 4)[0]
    if ifd + 2 > len(data):
        return None
    count = struct.unpack_from("<H", data, ifd)[0]
    tags: dict[int, int] = {}
    for k in range(min(count, (len(data) - ifd - 2) // 12)):
        tag, kind, _n, value = struct.unpack_from("<HHII", data, ifd + 2 + 12 * k)
        tags[tag] = value & 0xFFFF if kind == 3 else value
    return tags


def jpegxr_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` a JPEG XR stream's container declares (ITU-T T.832 annex A: ``II``,
    0xBC, version, the IFD offset; tags 0xBC80 ImageWidth and 0xBC81 ImageHeight), or None."""
    tags = _jxr_tags(data)
    if tags is None or 0xBC80 not in tags or 0xBC81 not in tags:
        return None
    return tags[0xBC80], tags[0xBC81]


def jpegxr_problem(data: bytes, width: int, height: int) -> str | None:
    """Why the JPEG XR stream ``data`` must not reach jxrlib as a ``width x height`` subblock, or
    None.  jxrlib trusts its headers (a codestream declaring an undefined output format or bit
    depth crashes it with SIGFPE: found by scripts/fuzz.py), so only what a CZI subblock is stored
    as passes: the container's size, a pixel format of :data:`_JXR_FORMATS`, and an image
    header (T.832 8.3: ``WMPHOTO``, flags, OUTPUT_CLR_FMT and OUTPUT_BITDEPTH, WIDTH_MINUS1 and
    HEIGHT_MINUS1) of :data:`_JXR_OUTPUT` and the same size, its overlap mode defined, not tiled
    (a tile and index table jxrlib misreads crashes it with SIGSEGV: also found by the fuzzer)."""
    tags = _jxr_tags(data)
    if tags is None:
        return "not a JPEG XR container"
    if (tags.get(0xBC80), tags.get(0xBC81)) != (width, height):
        return f"jpegxr stream declares {(tags.get(0xBC80), tags.get(0xBC81))}, the subblock is {width}x{height}"
    guid_at = tags.get(0xBC01, len(data))
    guid = data[guid_at:guid_at + 16]
    if len(guid) != 16 or guid[:15] != _JXR_GUID or guid[15] not in _JXR_FORMATS:
        return f"JPEG XR pixel format {guid.hex() or 'missing'} is not one of a CZI subblock"
    at = tags.get(0xBCC0, len(data))
    head = data[at:at + 20]
    if len(head) < 16 or head[:8] != b"WMPHOTO\0":
        return "JPEG XR image header missing"
    if head[9] & 3 == 3:
        return "JPEG XR image header declares the reserved overlap mode 3"
    if head[9] & 0x80:  # TILING_FLAG: a broken tile and index table crashes jxrlib (SIGSEGV)
        return "tiled JPEG XR codestreams are not supported"
    output = (head[11] >> 4, head[11] & 15)
    if output not in _JXR_OUTPUT:
        return f"JPEG XR output colour format {output[0]}, bit depth {output[1]}: not one of a CZI subblock"
    if head[10] & 0x80:  # SHORT_HEADER_FLAG: 16-bit sizes
        w, h = struct.unpack_from(">HH", head, 12)
    elif len(head) < 20:
        return "JPEG XR image header cut short"
    else:
        w, h = struct.unpack_from(">II", head, 12)
    if (w + 1, h + 1) != (width, height):
        return f"JPEG XR image header declares {w + 1}x{h + 1}, the subblock is {width}x{height}"
    return None


def unpack_hilo(data: bytes) -> bytes:
    """Undo hi-lo packing: ``data`` is the low bytes of its 16-bit samples, then the high bytes.

    Raises:
        ValueError: an odd byte count.
    """
    if len(data) % 2:
        raise ValueError(f"hi-lo packed data of an odd byte count ({len(data)})")
    half = len(data) // 2
    out = np.empty((half, 2), np.uint8)
    out[:, 0] = np.frombuffer(data, np.uint8, half)
    out[:, 1] = np.frombuffer(data, np.uint8, half, half)
    return out.tobytes()


def _samples(raw: bytes, width: int, height: int, samples: int, dtype: np.dtype, order: str) -> np.ndarray:
    stored = 4 if order == "bgra" else samples
    need = width * height * stored * dtype.itemsize
    if len(raw) != need:
        raise ValueError(f"{len(raw)} bytes of samples, {need} expected for {width}x{height}x{stored} {dtype}")
    arr = np.frombuffer(raw, dtype.newbyteorder("<"), width * height * stored).reshape(height, width, stored)
    if order:  # blue, green, red (, alpha): to red, green, blue
        arr = arr[:, :, 2::-1]
    return np.ascontiguousarray(arr, dtype=dtype)


def _zstd(data: bytes, need: int) -> bytes:
    try:
        return bytes(imagecodecs.zstd_decode(data, out=need))
    except Exception as exc:
        raise ValueError(f"zstd decode failed: {type(exc).__name__}: {exc}") from None


Decoder = Callable[[bytes, int, int, int, np.dtype], np.ndarray]


def _codec(kind: str, order: str) -> Decoder:
    def decode(segment: bytes, width: int, height: int, samples: int, dtype: np.dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        data = payload(segment)
        need = width * height * (4 if order == "bgra" else samples) * dtype.itemsize
        if kind == "raw":
            return _samples(data, width, height, samples, dtype, order)
        if kind == "zstd0":
            return _samples(_zstd(data, need), width, height, samples, dtype, order)
        if kind == "zstd1":
            head = data[0] if data else 0
            if head not in (1, 3) or len(data) < head:
                raise ValueError(f"zstd1 header of length {head}")
            hilo = False
            if head == 3:
                if data[1] != 1:
                    raise ValueError(f"zstd1 chunk type {data[1]}, 1 expected")
                hilo = bool(data[2] & 1)
            raw = _zstd(data[head:], need)
            return _samples(unpack_hilo(raw) if hilo else raw, width, height, samples, dtype, order)
        if kind == "jpegxr":  # (before jxrlib: it trusts its headers)
            problem = jpegxr_problem(data, width, height)
            if problem:
                raise ValueError(problem)
        elif jpeg_frame_size(data) != (width, height):  # (before the decoder allocates for it)
            raise ValueError(f"jpeg stream declares {jpeg_frame_size(data)}, the subblock is {width}x{height}")
        try:
            arr = np.asarray(imagecodecs.jpeg8_decode(data) if kind == "jpeg" else imagecodecs.jpegxr_decode(data))
        except Exception as exc:
            raise ValueError(f"{kind} decode failed: {type(exc).__name__}: {exc}") from None
        if arr.ndim == 2:
            arr = arr[:, :, None]
        if arr.shape[2] == 4 and samples == 3:  # (Bgra32: the alpha dropped)
            arr = arr[:, :, :3]
        if arr.shape != (height, width, samples) or arr.dtype != dtype:
            raise ValueError(f"{kind} stream decodes to {arr.shape} {arr.dtype}, the subblock is "
                             f"{(height, width, samples)} {dtype}")
        return np.ascontiguousarray(arr)  # (jxrlib's and libjpeg's output is in RGB order already)
    return decode


def _one(decoder: Decoder, k: int) -> Decoder:
    """``decoder`` of a colour subblock giving sample ``k`` (0 red, 1 green, 2 blue) alone."""
    def decode(segment: bytes, width: int, height: int, samples: int, dtype: np.dtype) -> np.ndarray:
        if samples != 1:
            raise ValueError(f"one sample of a colour subblock, not {samples}")
        return np.ascontiguousarray(decoder(segment, width, height, 3, dtype)[:, :, k:k + 1])
    return decode


_WHOLE: dict[str, Decoder] = {
    **{f"czi-{kind}{'-' if order else ''}{order}": _codec(kind, order)
       for kind in ("raw", "zstd0", "zstd1") for order in ("", "bgr", "bgra")},
    "czi-jpegxr": _codec("jpegxr", ""), "czi-jpeg": _codec("jpeg", "")}

#: The subblock decoders by codec name (module notes): ``decoder(segment bytes, width, height,
#: samples, dtype) -> (height, width, samples) array of dtype``; a name with ``.r``, ``.g`` or
#: ``.b`` gives that sample of a colour subblock alone (a colour channel among several).
CZI_CODECS: dict[str, Decoder] = {
    **_WHOLE, **{f"{name}.{c}": _one(dec, k) for name, dec in _WHOLE.items() for k, c in enumerate("rgb")}}
