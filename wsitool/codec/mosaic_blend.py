"""Mosaic levels painted as OpenSlide 4 paints them: each placed image at its own fractional offset
(what :func:`wsitool.deepzoom.subpixel.read_openslide_rgba` paints a mosaic level with).

A mosaic level (:mod:`wsitool.mosaic`: MIRAX camera images, overlapping Ventana BIF tiles) places
its images at float level positions.  wsitool's native read paints them at the nearest pixel;
OpenSlide's tile map instead paints every image as a cairo surface translated by its offset from
the region (``x - lx`` with ``lx`` the region's level position, both fractional), which pixman
samples with the same rule :mod:`wsitool.deepzoom.subpixel` reproduces for a regular grid (16.16
offset, float bilinear weights, ``trunc(v * 256)`` stores, nearest copy within 1/512 of a whole
pixel).  Here each image is painted on its own:

* **Surface**: the placement's rectangle of the decoded image (OpenSlide's sub-tile copy, or the
  whole image), opaque inside and transparent outside, so its fractional edges blend with
  nothing and leave partial alpha.
* **Order and operator**: OpenSlide walks its tile grid from the last row to the first, right to
  left, and composites with SATURATE (the first painted keeps its pixels; a later image only
  fills the alpha left, ``s * min(1, (1 - da) / sa) + d`` in float, stored back in 8 bits).  The
  mosaic's paint order puts that first-painted image on top, so the placements are painted in
  reverse paint order.
* **8-bit path**: a MIRAX photo painted whole is an opaque RGB24 surface
  (:attr:`wsitool.mosaic.Mosaic.rgb24_whole`); where every sample of the box cairo composites
  (the photo's extents padded by 1/2 and rounded half up, within the destination surface) lies
  inside the photo, pixman samples it on its 8-bit path instead: 7-bit weights
  (``f >> 9``), each row ``l * (128 - wx) + r * wx``, then ``(top + ((bottom - top) * wy >> 7)) >> 7``,
  composited with the 8-bit SATURATE.  A photo whose box reaches an edge of it (or a sub-tile
  copy, ARGB32) takes the float path.
* **Result**: premultiplied ARGB un-premultiplied as openslide-python does (``255 * c // a``).

Every region of a mosaic level is painted so, except a whole-pixel region of a level whose images
all lie at whole pixels (the plain read, :attr:`wsitool.mosaic.Mosaic.fractional` False).  Pixels
OpenSlide would paint before the origin of a region that starts there (an image at negative level
coordinates) are left transparent.
"""

from __future__ import annotations

import math

import numpy as np

from ..deepzoom.subpixel import _INV255, BLEND_ROWS, _exact, _offset, _unorm, _unpremultiply
from ..errors import TileDecodeError, TruncatedDataError
from .mosaic import MosaicImageError, TruncatedImage, decode_image

__all__ = ["paint_openslide"]

_ONE = np.float32(1)
_TINY = np.finfo(np.float32).tiny


def paint_openslide(level, lx: float, ly: float, w: int, h: int, margin: tuple[int, int] = (0, 0)) -> np.ndarray:
    """``(h, w, 4)`` uint8 RGBA (not premultiplied): mosaic level ``level`` (a
    :class:`~wsitool.model.Level` whose ``_mosaic`` is set, 3-sample uint8) painted at level
    position ``(lx, ly)`` (floats) as OpenSlide paints it (module docstring); ``w``, ``h`` >= 0;
    ``margin``: the ``(x, y)`` pixels of OpenSlide's destination surface before this part (a region
    starting before the origin), which bound the box it composites.

    Pixels no image reaches are ``(0, 0, 0, 0)``.  Memory: the output plus, per image, the float
    work of :data:`~wsitool.deepzoom.subpixel.BLEND_ROWS` rows of its overlap with the region.

    Raises:
        TruncatedDataError: an image lies past the end of its file.
        TileDecodeError: an image could not be read or decoded.
    """
    mosaic = level._mosaic
    x0, y0 = math.floor(lx), math.floor(ly)
    hits = mosaic.query(x0 - 2, y0 - 2, x0 + w + 2, y0 + h + 2)
    dest = np.zeros((h, w, 4), np.uint8)  # premultiplied, as cairo's surface
    for p in hits[::-1].tolist():  # (OpenSlide's first painted is the mosaic's top)
        crop = _crop(level, p)
        narrow = mosaic.rgb24_whole and crop.shape[:2] == (int(mosaic.image_height[mosaic.image[p]]),
                                                           int(mosaic.image_width[mosaic.image[p]]))
        _composite(dest, crop, lx - float(mosaic.x[p]), ly - float(mosaic.y[p]), narrow, margin)
    return _unpremultiply(dest)


def _crop(level, p: int) -> np.ndarray:
    """The painted rectangle of placement ``p`` (``(h, w, 3)`` uint8)."""
    mosaic = level._mosaic
    try:
        img = decode_image(mosaic, int(mosaic.image[p]))
    except MosaicImageError as exc:
        cls = TruncatedDataError if isinstance(exc, TruncatedImage) else TileDecodeError
        col, row = int(mosaic.px[p]) // level.tile_width, int(mosaic.py[p]) // level.tile_height
        path = mosaic.sources[int(mosaic.image_source[int(mosaic.image[p])])].path or ""
        raise cls(path, level.index, col, row, str(exc)) from None
    sx, sy, pw, ph = (int(v[p]) for v in (mosaic.sx, mosaic.sy, mosaic.w, mosaic.h))
    return img[sy:sy + ph, sx:sx + pw]


def _composite(dest: np.ndarray, crop: np.ndarray, dx: float, dy: float, narrow: bool,
               margin: tuple[int, int]) -> None:
    """Paint ``crop`` onto ``dest`` (premultiplied uint8, in place) with SATURATE, output pixel
    ``(i, j)`` sampling the crop at ``(i + dx, j + dy)`` (pixman's rule, module docstring)."""
    h, w = dest.shape[:2]
    ch, cw = crop.shape[:2]
    if _exact(dx) and _exact(dy):  # cairo copies: the nearest whole offset
        (bx, fx), (by, fy) = (round(dx * 256) // 256, 0), (round(dy * 256) // 256, 0)
    else:
        (bx, fx), (by, fy) = _offset(dx), _offset(dy)
    # output pixels whose neighbours (bx + i, bx + i + 1) reach the crop
    i0, i1 = max(0, -bx - (1 if fx else 0)), min(w, cw - bx)
    j0, j1 = max(0, -by - (1 if fy else 0)), min(h, ch - by)
    if i1 <= i0 or j1 <= j0:
        return
    if narrow and (fx or fy):
        # pixman's 8-bit path only where every sample of the composited box lies in the image:
        # the box is cairo's extents of the image (padded by 1/2, rounded half up) within the
        # destination surface (which starts ``margin`` pixels before the painted part)
        c0, c1 = max(-margin[0], math.floor(-dx)), min(w, math.floor(cw - dx + 1))
        r0, r1 = max(-margin[1], math.floor(-dy)), min(h, math.floor(ch - dy + 1))
        narrow = bx + c0 >= 0 and bx + c1 <= cw - 1 and by + r0 >= 0 and by + r1 <= ch - 1
    one = _ONE
    wx, wy = np.float32(fx / 65536), np.float32(fy / 65536)
    weights = ((one - wx) * (one - wy), wx * (one - wy), (one - wx) * wy, wx * wy)
    for r in range(j0, j1, BLEND_ROWS):
        r1 = min(j1, r + BLEND_ROWS)
        if narrow:
            _narrow(dest[r:r1, i0:i1], crop, bx + i0, by + r, fx, fy)
            continue
        src = _padded(crop, bx + i0, by + r, i1 - i0 + 1, r1 - r + 1)
        if fx or fy:
            s = src[:-1, :-1] * weights[0]
            for q, wq in zip(((slice(None, -1), slice(1, None)), (slice(1, None), slice(None, -1)),
                              (slice(1, None), slice(1, None))), weights[1:], strict=True):
                s += src[q] * wq
        else:
            s = src[:-1, :-1]
        out = dest[r:r1, i0:i1]
        d = out.astype(np.float32) * _INV255
        sa, da = s[..., 3:], d[..., 3:]
        with np.errstate(divide="ignore", invalid="ignore"):
            fa = np.where(np.abs(sa) < _TINY, one, np.minimum(one, (one - da) / sa))
        out[...] = _unorm(np.minimum(one, s * fa + d))


def _padded(crop: np.ndarray, cx: int, cy: int, n: int, m: int) -> np.ndarray:
    """``(m, n, 4)`` float32 premultiplied pixels of ``crop`` from ``(cx, cy)`` times ``1/255``
    (opaque inside, transparent outside)."""
    ch, cw = crop.shape[:2]
    out = np.zeros((m, n, 4), np.float32)
    a0, a1 = max(0, cx), min(cw, cx + n)
    b0, b1 = max(0, cy), min(ch, cy + m)
    if a1 > a0 and b1 > b0:
        part = out[b0 - cy:b1 - cy, a0 - cx:a1 - cx]
        part[..., :3] = crop[b0:b1, a0:a1]
        part[..., 3] = 255
        part *= _INV255
    return out


def _narrow(out: np.ndarray, crop: np.ndarray, cx: int, cy: int, fx: int, fy: int) -> None:
    """Paint ``crop`` (an opaque RGB24 surface) onto ``out`` (premultiplied uint8, in place) with
    pixman's 8-bit path: bilinear weights of 7 bits (``fx >> 9``, as 8-bit ``256`` units), each
    channel ``floor(sum / 65536)``, then the 8-bit SATURATE (``s * da / sa`` where the source
    alpha ``sa`` exceeds the alpha left ``da``, rounded as pixman does, added with saturation);
    output pixel ``(i, j)`` samples crop pixels ``(cx + i, cy + j)`` .. ``(cx + i + 1, cy + j + 1)``."""
    m, n = out.shape[:2]
    src = np.zeros((m + 1, n + 1, 4), np.int32)
    ch, cw = crop.shape[:2]
    a0, a1 = max(0, cx), min(cw, cx + n + 1)
    b0, b1 = max(0, cy), min(ch, cy + m + 1)
    if a1 > a0 and b1 > b0:
        part = src[b0 - cy:b1 - cy, a0 - cx:a1 - cx]
        part[..., :3] = crop[b0:b1, a0:a1]
        part[..., 3] = 255
    if fx or fy:
        wx, wy = fx >> 9, fy >> 9  # (7-bit weights)
        top = src[:-1, :-1] * (128 - wx) + src[:-1, 1:] * wx
        bottom = src[1:, :-1] * (128 - wx) + src[1:, 1:] * wx
        s = (top + (((bottom - top) * wy) >> 7)) >> 7  # (rows at 1/128, then the vertical step)
    else:
        s = src[:-1, :-1]
    d = out.astype(np.int32)
    sa, da = s[..., 3:], 255 - d[..., 3:]
    over = sa > da
    ss = (da * 255 + sa // 2) // np.maximum(sa, 1)
    t = s * ss + 0x80
    s = np.where(over, (t + (t >> 8)) >> 8, s)
    out[...] = np.minimum(255, d + s)
