"""The frames of a DICOM export: which transfer syntax and photometric interpretation a level's tiles get,
passed through or re-encoded (floor 6).

Passthrough (``compression="copy"``): a level's compressed tiles become the
instance's frames without being decoded.  What passes through:

* **JPEG baseline** (SOF0, 8-bit, 3 components), transfer syntax
  1.2.840.10008.1.2.4.50 (PS3.5 A.4.1).  A DICOM frame is a complete JPEG
  stream (PS3.5 8.2.1), so tiles that share their tables in the TIFF
  JPEGTables tag (TIFF Technical Note 2; Aperio, most tiled TIFFs) get them
  merged in: the frame is the level's ``jpeg_prefix`` (SOI, the tables'
  segments, and an Adobe APP14 marker with transform 0 where the samples are
  RGB-coded, as the read path builds it) followed by the tile after its SOI.
  The frame header (SOF), the tables and the entropy-coded data are the
  source's bytes.  Photometric Interpretation (PS3.3 C.7.6.3.1.2) follows the
  stream's colour transform: an Adobe APP14 marker's transform flag, else a
  JFIF marker (YCbCr), else the source's photometric (TIFF RGB or YCbCr,
  DICOM's own): ``RGB`` for untransformed samples (what OpenSlide's DICOM
  reader decodes as RGB), ``YBR_FULL_422`` for YCbCr.
* **JPEG 2000** (a raw code stream: Aperio 33003 / 33005, TIFF 34712, DICOM
  .90 / .91 frames), transfer syntax 1.2.840.10008.1.2.4.91 ("lossless or
  lossy": a passed-through stream's losslessness is not known) with the
  photometric its COD marker segment says (ITU-T T.800 A.6.1: the multiple
  component transform flag of ``SGcod`` and the wavelet of ``SPcod``):
  ``YBR_ICT`` (transform, 9-7 irreversible wavelet), ``YBR_RCT`` (transform,
  5-3 reversible), ``RGB`` (no transform), as PS3.5 8.2.4 defines them and
  OpenSlide's DICOM reader accepts them for .91.  Aperio 33003 (YCbCr samples
  without the transform) has no DICOM photometric that readers decode, and
  is refused.  The frames are the tiles, byte for byte.

Anything else (NDPI's restart-interval JPEG, lossless TIFF codecs, progressive
or 12-bit JPEG, JPEG-LS, a JP2 file wrapper, 33003) cannot pass through: the
export fails before writing, with one line naming the level
(:class:`~wsitool.errors.UnsupportedFormatError`, exit 4).

Re-encoding (``jpeg``, ``jpeg2000``), with the export's encoders (libjpeg-turbo
and OpenJPEG through imagecodecs, as :mod:`wsitool.export.encode`): JPEG
baseline at quality 90 and above without chroma subsampling, as the TIFF export
(subsampling costs up to 60-110 grey levels at saturated edges, e.g. the
shared NDPI's fluorescence), which DICOM readers take only untransformed:
RGB samples with an Adobe APP14 marker (transform 0), photometric ``RGB``
(OpenSlide's DICOM reader decodes JPEG as ``RGB`` or ``YBR_FULL_422`` only,
not ``YBR_FULL``); below quality 90 JFIF YCbCr subsampled 2x1, as
``YBR_FULL_422`` says (PS3.3 C.7.6.3.1.2).  JPEG 2000 with the colour
transform: ``YBR_ICT`` under .91 (lossy, the target PSNR), ``YBR_RCT`` under
.90 (lossless, ``psnr=0``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import imagecodecs
import numpy as np

from ...errors import UnsupportedFormatError, WsiError
from ...ground.bitstream import SOI, jpeg_frame_kind, jpeg_segments, jpeg_with_prefix
from ...model import PyramidLevel
from ..encode import DEFAULT_PSNR
from .framestream import FrameRun

if TYPE_CHECKING:
    from ..storedruns import TileRun

JPEG_BASELINE = "1.2.840.10008.1.2.4.50"
J2K_LOSSLESS = "1.2.840.10008.1.2.4.90"
J2K = "1.2.840.10008.1.2.4.91"
EXPLICIT_LE = "1.2.840.10008.1.2.1"

_JPEG = 7
_J2K_CODES = frozenset({33003, 33005, 34712})
_SOC_SIZ = b"\xff\x4f\xff\x51"


@dataclasses.dataclass(frozen=True)
class FrameCoding:
    """How an instance's frames are coded.

    Attributes:
        transfer_syntax: the Transfer Syntax UID.
        photometric: Photometric Interpretation (``RGB``, ``YBR_FULL_422``, ``YBR_ICT``, ``YBR_RCT``).
        lossy: Lossy Image Compression ``"01"`` (True) or ``"00"``.
        method: Lossy Image Compression Method (``ISO_10918_1``, ``ISO_15444_1``) or ``""``.
        prefix: bytes that replace each passed-through JPEG tile's SOI (empty: the tile as it is).
    """

    transfer_syntax: str
    photometric: str
    lossy: bool
    method: str
    prefix: bytes = b""

    def frame(self, tile: bytes) -> bytes:
        """The frame for one passed-through tile (``tile`` unchanged, or ``prefix`` + ``tile[2:]``)."""
        return b"".join(self.frame_parts(tile))

    def frame_run(self, run: TileRun) -> FrameRun | None:
        """The frames of a run of passed-through tiles, each as :meth:`frame` makes it; None where some
        tile of a JPEG run does not start with SOI (then take them one by one, :meth:`frame_parts`)."""
        starts, counts = run.starts, run.counts
        if not self.prefix:
            return FrameRun(run.data, starts, counts)
        head = np.frombuffer(run.data, np.uint8)
        if not (counts >= 2).all() or not ((head[starts] == 0xFF) & (head[starts + 1] == 0xD8)).all():
            return None
        return FrameRun(run.data, starts + 2, counts - 2, self.prefix)

    def frame_parts(self, tile: bytes | memoryview) -> tuple[bytes | memoryview, ...]:
        """:meth:`frame` as pieces laid end to end, without copying the tile (bytes or a view)."""
        if self.prefix and tile[:2] == SOI:
            return self.prefix, memoryview(tile)[2:]
        return (tile,)


def _refuse(lv: PyramidLevel, why: str) -> UnsupportedFormatError:
    return UnsupportedFormatError(f"{lv.path}: level {lv.index}: compression copy to DICOM: {why}")


def passthrough_coding(lv: PyramidLevel, first: bytes | None) -> FrameCoding:
    """The :class:`FrameCoding` of level ``lv``'s tiles passed through (module notes).

    Args:
        lv: the source level.
        first: the bytes of its first present tile as stored (None: no tile present).

    Raises:
        UnsupportedFormatError: the tiles cannot pass through (one line naming the level and why).
    """
    enc = lv.encoding
    if not lv.tiled:
        raise _refuse(lv, "the level is stripped, not tiled")
    if lv.samples != 3 or lv.dtype != np.uint8 or lv.tiles.planes != 1 or enc.extrasamples:
        raise _refuse(lv, f"{lv.samples} x {lv.dtype} samples; DICOM passthrough takes 3 interleaved 8-bit samples")
    if enc.compression_problem:
        raise _refuse(lv, enc.compression_problem)
    if enc.jpeg_scan_segments:
        raise _refuse(lv, "the tiles are restart intervals of one JPEG scan (Hamamatsu NDPI), not JPEG streams; "
                          "re-encode with --compression jpeg or jpeg2000")
    code = enc.compression_code
    if code == _JPEG and enc.stream == "jpeg":
        return _jpeg_coding(lv, first)
    if code in _J2K_CODES:
        return _j2k_coding(lv, first)
    raise _refuse(lv, f"{enc.compression} tiles are not a DICOM transfer syntax; re-encode with "
                      "--compression jpeg or jpeg2000")


def _jpeg_coding(lv: PyramidLevel, first: bytes | None) -> FrameCoding:
    enc = lv.encoding
    prefix = enc.jpeg_prefix or b""
    if first is not None:
        whole = jpeg_with_prefix(prefix, first)
        kind = jpeg_frame_kind(whole)
        if kind is None or kind[0] != 0xC0 or kind[1] != 8 or kind[2] != 3:
            what = "no frame header" if kind is None else f"SOF{kind[0] - 0xC0} {kind[1]}-bit {kind[2]} components"
            raise _refuse(lv, f"the JPEG tiles are not baseline 8-bit colour ({what}); re-encode with "
                              "--compression jpeg")
        photometric = _jpeg_photometric(whole, enc.photometric_code)
    else:
        photometric = "RGB" if enc.photometric_code == 2 else "YBR_FULL_422"
    return FrameCoding(JPEG_BASELINE, photometric, True, "ISO_10918_1", prefix)


def _jpeg_photometric(stream: bytes, photometric_code: int) -> str:
    """``RGB`` or ``YBR_FULL_422`` from the stream's markers, else the source's photometric (module notes)."""
    jfif = False
    for marker, start, end in jpeg_segments(stream):
        if marker == 0xDA or (0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC)):
            break
        body = stream[start:end]
        if marker == 0xEE and body[:5] == b"Adobe" and len(body) >= 12:
            return "RGB" if body[11] == 0 else "YBR_FULL_422"
        if marker == 0xE0 and body[:5] == b"JFIF\0":
            jfif = True
    if jfif:
        return "YBR_FULL_422"
    return "RGB" if photometric_code == 2 else "YBR_FULL_422"


def _j2k_coding(lv: PyramidLevel, first: bytes | None) -> FrameCoding:
    if lv.encoding.compression_code == 33003 or lv.encoding.ycbcr_after_decode:
        raise _refuse(lv, "Aperio 33003 JPEG 2000 holds YCbCr samples without the JPEG 2000 colour transform, "
                          "which no DICOM photometric interpretation describes; re-encode with "
                          "--compression jpeg2000")
    if first is None:
        return FrameCoding(J2K, "YBR_ICT", True, "ISO_15444_1")
    if not first.startswith(_SOC_SIZ):
        raise _refuse(lv, "the JPEG 2000 tiles are not raw code streams (DICOM frames hold code streams, "
                          "PS3.5 A.4.4); re-encode with --compression jpeg2000")
    mct, reversible = j2k_transform(first)
    if mct is None:
        raise _refuse(lv, "the first JPEG 2000 tile has no COD marker segment in its main header")
    photometric = ("YBR_RCT" if reversible else "YBR_ICT") if mct else "RGB"
    return FrameCoding(J2K, photometric, True, "ISO_15444_1")


def j2k_transform(stream: bytes) -> tuple[bool | None, bool]:
    """``(multiple component transform, reversible 5-3 wavelet)`` from the COD marker segment of a JPEG 2000
    code stream's main header (ITU-T T.800 A.6.1: ``Scod``, ``SGcod`` = progression order, layers (2 bytes),
    MCT; ``SPcod`` = decomposition levels, code-block width and height, style, transformation (1: 5-3)).
    ``(None, False)`` when there is no COD before the first tile part (SOT)."""
    i, n = 2, len(stream)
    while i + 4 <= n and stream[i] == 0xFF:
        marker = stream[i + 1]
        if marker == 0x90:
            break
        length = int.from_bytes(stream[i + 2:i + 4], "big")
        if marker == 0x52 and length >= 12 and i + 2 + length <= n:
            seg = stream[i + 4:i + 2 + length]
            return bool(seg[4]), seg[9] == 1
        i += 2 + length
    return None, False


#: JPEG quality from which re-encoded frames are not chroma subsampled (RGB samples; module notes)
RGB_JPEG_QUALITY = 90


def reencode_coding(compression: str, psnr: float | None, quality: int = 90) -> FrameCoding:
    """The :class:`FrameCoding` of re-encoded frames (``compression`` ``jpeg`` or ``jpeg2000``;
    ``psnr`` 0: lossless JPEG 2000; ``quality``: JPEG's, which decides RGB or YCbCr, module notes)."""
    if compression == "jpeg":
        return FrameCoding(JPEG_BASELINE, "RGB" if quality >= RGB_JPEG_QUALITY else "YBR_FULL_422", True,
                           "ISO_10918_1")
    if compression == "jpeg2000":
        if psnr is not None and float(psnr) <= 0:
            return FrameCoding(J2K_LOSSLESS, "YBR_RCT", False, "")
        return FrameCoding(J2K, "YBR_ICT", True, "ISO_15444_1")
    raise UnsupportedFormatError(f"compression {compression} does not write DICOM frames: use jpeg, jpeg2000, "
                                 "jpeg2000-lossless or copy")


class FrameEncoder:
    """Encodes ``(h, w, 3)`` uint8 tiles as frames of a :func:`reencode_coding` (any thread).

    JPEG: libjpeg-turbo baseline at ``quality``: RGB samples (Adobe marker, transform 0) from quality 90,
    else YCbCr with 4:2:2 chroma subsampling (``YBR_FULL_422``).
    JPEG 2000: OpenJPEG code streams with the colour transform, at ``psnr`` dB (0: lossless 5-3).
    """

    def __init__(self, compression: str, quality: int, psnr: float | None):
        self.compression = compression
        self.quality = quality
        self.psnr = DEFAULT_PSNR if psnr is None else float(psnr)

    def encode(self, tile: np.ndarray) -> bytes:
        """The frame of ``tile``.

        Raises:
            WsiError: the encoder failed.
        """
        tile = np.ascontiguousarray(tile)
        try:
            if self.compression == "jpeg":
                if self.quality >= RGB_JPEG_QUALITY:
                    return bytes(imagecodecs.jpeg8_encode(tile, level=self.quality, colorspace="RGB",
                                                          outcolorspace="RGB", subsampling="444"))
                return bytes(imagecodecs.jpeg8_encode(tile, level=self.quality, subsampling="422"))
            if self.psnr > 0:
                return bytes(imagecodecs.jpeg2k_encode(
                    tile, level=self.psnr,  # type: ignore[arg-type]  # imagecodecs' stub: int only
                    codecformat="j2k", reversible=False, mct=True, numthreads=1))
            return bytes(imagecodecs.jpeg2k_encode(tile, level=0, codecformat="j2k", reversible=True, mct=True,
                                                   numthreads=1))
        except Exception as exc:  # imagecodecs' codec errors
            raise WsiError(f"could not encode a {tile.shape[1]}x{tile.shape[0]} {self.compression} frame: "
                           f"{exc}") from None
