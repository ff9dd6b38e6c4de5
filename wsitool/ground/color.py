"""Colour conversion of decoded samples to 8-bit RGB (the ``rgb`` / ``rgba`` read modes).

Ground floor (imports numpy only; CuPy only when handed a CuPy array).

Rules (``docs/guides/colour.md``): integer samples are scaled
linearly, ``round(v * 255 / (2**BitsPerSample - 1))`` (so 16-bit 65535 -> 255);
floats are clipped to [0, 1] and scaled by 255; one-sample images (MinIsBlack)
are replicated to grey RGB, MinIsWhite is inverted; palette images go through
their ColorMap; CMYK (photometric Separated, InkSet CMYK, 4 samples) becomes
``R = 255 (1 - C)(1 - K)`` etc.; an ExtraSamples alpha channel becomes alpha.

CMYK sample convention: inside a TIFF the samples mean what TIFF 6.0 section 16
says (0 = no ink, 2**bits - 1 = full ink), whatever the codec.  For JPEG CMYK
tiles the decoder (libjpeg via imagecodecs) returns the stored components; an
Adobe APP14 marker with transform 2 (YCCK) is turned into CMYK by the decoder,
transform 0 means the components are CMYK as stored.  The "inverted CMYK" habit
of stand-alone Adobe Photoshop JPEG files is *not* applied: no marker field
signals it, and it contradicts the TIFF definition of the samples.
"""

from __future__ import annotations

import numpy as np

__all__ = ["to_rgb8", "ycbcr_to_rgb", "array_module"]


def array_module(arr):
    """The array library of ``arr``: ``numpy``, or ``cupy`` for a CuPy array.

    CuPy is only imported when ``arr`` already is a CuPy array.
    """
    if isinstance(arr, np.ndarray):
        return np
    if type(arr).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def ycbcr_to_rgb(ycc):
    """Full-range YCbCr -> RGB (ITU-R BT.601 / JFIF coefficients), uint8 in and out.

    ``ycc`` is an ``(h, w, 3)`` uint8 numpy or CuPy array; the result is a new
    ``(h, w, 3)`` uint8 array of the same library (on the GPU for CuPy).
    Used for Aperio JPEG 2000 compression 33003, whose code streams hold
    YCbCr components without the JPEG 2000 colour transform.
    """
    xp = array_module(ycc)
    f = ycc.astype(xp.float32)
    y, cb, cr = f[..., 0], f[..., 1] - 128.0, f[..., 2] - 128.0
    rgb = xp.empty((*ycc.shape[:2], 3), xp.float32)
    rgb[..., 0] = y + 1.402 * cr
    rgb[..., 1] = y - 0.344136 * cb - 0.714136 * cr
    rgb[..., 2] = y + 1.772 * cb
    return xp.clip(xp.rint(rgb), 0, 255).astype(xp.uint8)


def _to_uint8(arr: np.ndarray, bits: int) -> np.ndarray:
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8) * 255
    if np.issubdtype(arr.dtype, np.floating):
        return np.clip(np.rint(np.nan_to_num(arr.astype(np.float64)) * 255.0), 0, 255).astype(np.uint8)
    if np.issubdtype(arr.dtype, np.signedinteger):
        info = np.iinfo(arr.dtype)
        f = (arr.astype(np.float64) - info.min) * (255.0 / (info.max - info.min))
        return np.clip(np.rint(f), 0, 255).astype(np.uint8)
    bits = bits if 0 < bits <= arr.dtype.itemsize * 8 else arr.dtype.itemsize * 8
    maxv = float((1 << bits) - 1)
    return np.clip(np.rint(arr.astype(np.float64) * (255.0 / maxv)), 0, 255).astype(np.uint8)


def to_rgb8(arr: np.ndarray, photometric: int, bits: int, colormap=None,
            extrasamples: tuple = ()) -> tuple[np.ndarray, np.ndarray | None]:
    """Convert ``(h, w, samples)`` native pixels to ``(h, w, 3)`` uint8 RGB and optional alpha.

    Args:
        arr: decoded samples, any integer or float dtype.
        photometric: TIFF PhotometricInterpretation code (TIFF 6.0 section 3-6):
            0 MinIsWhite, 1 MinIsBlack, 2 RGB, 3 Palette, 5 Separated (CMYK).
        bits: BitsPerSample, for the linear scaling of integer samples.
        colormap: ``(3, 2**bits)`` uint16 ColorMap of palette images.
        extrasamples: ExtraSamples codes; 1 (associated) or 2 (unassociated)
            alpha make the first extra sample the alpha channel.

    Returns:
        ``(rgb, alpha)``: ``(h, w, 3)`` uint8 and ``(h, w)`` uint8 or None.
    """
    samples = arr.shape[2]
    if photometric == 3 and colormap is not None:
        lut = np.asarray(colormap)
        lut8 = (lut >> 8).astype(np.uint8) if lut.max() > 255 else lut.astype(np.uint8)
        idx = np.clip(arr[..., 0].astype(np.intp), 0, lut8.shape[1] - 1)
        return np.ascontiguousarray(lut8[:, idx].transpose(1, 2, 0)), None
    a8 = _to_uint8(arr, bits)
    alpha = None
    if photometric == 5 and samples >= 4:
        cmyk = a8[..., :4].astype(np.float32) / 255.0
        k = 1.0 - cmyk[..., 3:4]
        rgb = np.rint(255.0 * (1.0 - cmyk[..., :3]) * k)
        if samples > 4 and extrasamples and extrasamples[0] in (1, 2):
            alpha = a8[..., 4]
        return rgb.astype(np.uint8), alpha
    if samples >= 3 and photometric not in (0, 1):
        rgb = a8[..., :3]
        n_color = 3
    else:
        gray = a8[..., 0]
        if photometric == 0:
            gray = 255 - gray
        rgb = np.repeat(gray[..., None], 3, axis=2)
        n_color = 1
    if samples > n_color and extrasamples and extrasamples[0] in (1, 2):
        alpha = a8[..., n_color]
    return rgb, alpha


def icc_bytes(value) -> bytes | None:
    """``value`` (bytes, or a sequence of byte values) as an ICC profile, or None when it
    cannot be one: shorter than the 128-byte ICC header (ICC.1:2022 section 7.2), or a
    declared profile size (header bytes 0-3, big-endian) under 128 or past the data."""
    if isinstance(value, (tuple, list)):
        try:
            value = bytes(value)
        except (TypeError, ValueError):
            return None
    if not isinstance(value, (bytes, bytearray)) or len(value) < 128:
        return None
    declared = int.from_bytes(value[:4], "big")
    if declared < 128 or declared > len(value):
        return None
    return bytes(value)
