"""How the frames of a DICOM instance are encoded: transfer syntax and pixel description to a TileEncoding (floor 3).

Codec policy (as for TIFF, :mod:`wsitool.formats.tiff.encoding`): JPEG baseline
and JPEG 2000 / HTJ2K frames of 3 samples of 8 bits go to nvImageCodec
(``codec="nv"``); everything else (uncompressed 8- and 16-bit, JPEG-LS, RLE,
JPEG lossless / 12-bit, grey or 16-bit JPEG 2000, JPEG XL) to imagecodecs
through :mod:`wsitool.codec.frames` (``codec="generic"``, ``imagecodec`` names
the decoder; no tifffile page).

Transfer syntaxes (PS3.5 A.4, PS3.6 annex A): 1.2.840.10008.1.2 / .1.2.1
native little endian; .4.50 JPEG baseline, .4.51 extended, .4.57 / .4.70
lossless; .4.80 / .4.81 JPEG-LS; .4.90 / .4.91 / .4.92 / .4.93 JPEG 2000;
.4.201 / .4.202 / .4.203 HTJ2K; .1.2.5 RLE; .4.110 / .4.111 / .4.112 JPEG XL.
Refused: big endian (.1.2.2, retired), deflated (.1.2.1.99: the whole data
set is compressed, frames cannot be read by offset), MPEG / HEVC video.

JPEG colour (what the decoder is told): the stream's own markers decide where
present: a JFIF APP0 segment means YCbCr-coded components (JFIF 1.02), an Adobe
APP14 segment says so in its transform flag (Adobe Technical Note #5116).  Only
without either does Photometric Interpretation (PS3.3 C.7.6.3.1.2) decide: RGB
gets an Adobe APP14 "RGB" marker in front (SOI + marker replace the frame's SOI,
as for Aperio's RGB JPEG tiles), YBR_FULL / YBR_FULL_422 nothing (decoders take
3-component streams as YCbCr).  The first frame of the instance is inspected;
a writer puts the same markers in every frame.
"""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedFormatError
from ...ground.bitstream import ADOBE_RGB_MARKER, SOF_MARKERS, SOI, jpeg_segments
from ...ground.naming import about
from ...model import TileEncoding
from .instance import Instance

__all__ = ["frame_encoding", "is_encapsulated", "jpeg_markers"]

_NATIVE = {"1.2.840.10008.1.2", "1.2.840.10008.1.2.1"}
#: transfer syntax -> (compression name, TIFF-registry code, stream check, imagecodecs decoder)
_COMPRESSED = {
    "1.2.840.10008.1.2.4.50": ("JPEG", 7, "jpeg", "jpeg8"),
    "1.2.840.10008.1.2.4.51": ("JPEG", 7, "jpeg", "jpeg8"),
    "1.2.840.10008.1.2.4.57": ("JPEG_LOSSLESS", 7, "jpeg", "jpeg8"),
    "1.2.840.10008.1.2.4.70": ("JPEG_LOSSLESS", 7, "jpeg", "jpeg8"),
    "1.2.840.10008.1.2.4.80": ("JPEGLS", 34892, "jpegls", "jpegls"),
    "1.2.840.10008.1.2.4.81": ("JPEGLS", 34892, "jpegls", "jpegls"),
    "1.2.840.10008.1.2.4.90": ("JPEG2000", 34712, "j2k", "jpeg2k"),
    "1.2.840.10008.1.2.4.91": ("JPEG2000", 34712, "j2k", "jpeg2k"),
    "1.2.840.10008.1.2.4.92": ("JPEG2000", 34712, "j2k", "jpeg2k"),
    "1.2.840.10008.1.2.4.93": ("JPEG2000", 34712, "j2k", "jpeg2k"),
    "1.2.840.10008.1.2.4.201": ("HTJ2K", 34712, "j2k", "jpeg2k"),
    "1.2.840.10008.1.2.4.202": ("HTJ2K", 34712, "j2k", "jpeg2k"),
    "1.2.840.10008.1.2.4.203": ("HTJ2K", 34712, "j2k", "jpeg2k"),
    "1.2.840.10008.1.2.5": ("RLE", 32773, None, "rle"),
    "1.2.840.10008.1.2.4.110": ("JPEGXL", 50002, None, "jpegxl"),
    "1.2.840.10008.1.2.4.111": ("JPEGXL", 50002, None, "jpegxl"),
    "1.2.840.10008.1.2.4.112": ("JPEGXL", 50002, None, "jpegxl"),
}
#: DICOM Photometric Interpretation -> TIFF photometric (name, code), as the colour layer knows them
_PHOTOMETRIC = {
    "MONOCHROME1": ("MINISWHITE", 0), "MONOCHROME2": ("MINISBLACK", 1), "RGB": ("RGB", 2),
    "YBR_FULL": ("YCBCR", 6), "YBR_FULL_422": ("YCBCR", 6), "YBR_ICT": ("YCBCR", 6),
    "YBR_RCT": ("YCBCR", 6), "YBR_PARTIAL_420": ("YCBCR", 6),
}
_JPEG_BASELINE = "1.2.840.10008.1.2.4.50"


def is_encapsulated(transfer_syntax: str) -> bool:
    """True for a compressed (encapsulated) transfer syntax, False for native.

    Raises:
        UnsupportedFormatError: a transfer syntax wsitool does not read (named with its UID).
    """
    if transfer_syntax in _NATIVE:
        return False
    if transfer_syntax in _COMPRESSED:
        return True
    if transfer_syntax == "1.2.840.10008.1.2.2":
        why = "explicit VR big endian (retired) is not supported"
    elif transfer_syntax == "1.2.840.10008.1.2.1.99":
        why = "a deflated data set cannot be read frame by frame"
    else:
        why = "unsupported transfer syntax"
    raise UnsupportedFormatError(f"transfer syntax {transfer_syntax}: {why}")


def jpeg_markers(frame: bytes) -> tuple[bool, int | None]:
    """``(jfif, adobe_transform)`` of a JPEG stream's header: whether a JFIF APP0 segment
    comes before the first SOF/SOS, and the transform flag of an Adobe APP14 (None if absent);
    the walk is :func:`wsitool.ground.bitstream.jpeg_segments`."""
    jfif, adobe = False, None
    for marker, start, end in jpeg_segments(frame):
        if marker == 0xDA or marker in SOF_MARKERS:
            break
        body = frame[start:end]
        if marker == 0xE0 and body[:5] == b"JFIF\0":
            jfif = True
        elif marker == 0xEE and body[:5] == b"Adobe" and len(body) >= 12:
            adobe = body[11]
    return jfif, adobe


def frame_encoding(inst: Instance, first_frame: bytes | None) -> tuple[TileEncoding, np.dtype]:
    """The :class:`~wsitool.model.TileEncoding` of ``inst``'s frames, and the sample dtype.

    Args:
        inst: the instance's header.
        first_frame: the bytes of its first present frame (JPEG markers), or None.

    Raises:
        UnsupportedFormatError: a transfer syntax or sample layout wsitool does not read.
    """
    ts = inst.transfer_syntax
    with about(inst.path):
        encapsulated = is_encapsulated(ts)
    bits = inst.bits_allocated
    if bits not in (8, 16, 32):
        raise UnsupportedFormatError(f"{inst.path}: {bits}-bit samples are not supported")
    dtype = np.dtype(f"{'i' if inst.signed else 'u'}{bits // 8}")
    samples = inst.samples
    photometric = inst.photometric
    name, code = _PHOTOMETRIC.get(photometric, (photometric or "UNKNOWN", -1))
    eight_bit_rgb = samples == 3 and bits == 8 and not inst.signed
    rgb_problem = None
    if code < 0:
        rgb_problem = f"no RGB conversion for photometric {photometric or '(none)'}"
    elif samples == 3 and code == 6 and not encapsulated:
        # decoders convert YBR in JPEG / JPEG 2000 streams; stored YBR samples are not converted
        rgb_problem = f"no RGB conversion for uncompressed {photometric} samples"
    elif samples not in (1, 3):
        rgb_problem = f"photometric {photometric} with {samples} samples"
    if not encapsulated:
        return TileEncoding(
            compression="NONE", compression_code=1, photometric=photometric or name,
            photometric_code=code, bits=inst.bits_stored, stream=None, codec="generic",
            rgb_problem=rgb_problem, imagecodec="raw-planar" if inst.planar else "raw",
        ), dtype
    compression, comp_code, stream, imagecodec = _COMPRESSED[ts]
    nv = eight_bit_rgb and (ts == _JPEG_BASELINE or stream == "j2k") and code in (2, 6)
    prefix = b""
    if stream == "jpeg" and first_frame is not None and first_frame.startswith(SOI):
        jfif, adobe = jpeg_markers(first_frame)
        if not jfif and adobe is None and photometric == "RGB" and samples == 3:
            prefix = SOI + ADOBE_RGB_MARKER
    return TileEncoding(
        compression=compression, compression_code=comp_code, photometric=photometric or name,
        photometric_code=code, bits=inst.bits_stored if not nv else 8, stream=stream,
        codec="nv" if nv else "generic", jpeg_prefix=prefix, rgb_problem=rgb_problem,
        imagecodec=imagecodec,
    ), dtype
