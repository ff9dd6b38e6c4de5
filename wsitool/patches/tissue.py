"""Tissue detection on a low-resolution thumbnail, and user masks (floor 6).

The rule (a common one in the field; CLAM's segmentation is the best-known form):

1. a thumbnail at about :attr:`TissueParams.mpp` micrometres per pixel (8 by
   default): the pyramid level closest to it from the finer side, read in
   strips (at 1/2, 1/4 or 1/8 scale where the level is large, see
   :mod:`wsitool.read.reduced`), used as it is when within a factor
   :data:`CLOSE_ENOUGH`, else reduced by the exact area filter; level 0 of a
   pyramid is never read;
2. the HSV saturation of each pixel (``max(R, G, B) - min(R, G, B)`` scaled by
   ``255 / max``: stained tissue is coloured, glass and background are grey or
   white), median-blurred (:attr:`TissueParams.median` pixels);
3. a threshold: Otsu's (the one that best separates two classes of the
   histogram), or a fixed value.  Where the two classes' means are closer than
   :data:`MIN_SEPARATION` the thumbnail is taken as one class: all tissue if its
   median saturation is at least :data:`MIN_TISSUE_SATURATION`, else none (Otsu
   always splits, even an empty slide or a field full of tissue);
4. morphological closing with a disk (:attr:`TissueParams.close` pixels), then
   pieces of tissue smaller than :attr:`TissueParams.min_area` and holes smaller
   than :attr:`TissueParams.min_hole` removed (both in level-0 pixels squared,
   so the result does not depend on the thumbnail's scale).

:meth:`TissueParams.clam` gives CLAM's published defaults (fixed threshold 8,
median 7, closing 4, area 100 and holes 16 reference patches of 512 x 512
level-0 pixels).  A user's mask (array, image file or callable) replaces steps
2-4 (:func:`load_mask`).

Masks use OpenCV (``opencv-python-headless``, the ``patches`` extra): its exact 8-bit median
filter, closing, connected components and contours.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import InvalidRegionError
from ..ground.areafilter import AreaReducer
from ..ground.geometry import level0_coordinate

__all__ = ["TissueParams", "TissueMask", "detect_tissue", "load_mask", "read_thumbnail",
           "MIN_SEPARATION", "MIN_TISSUE_SATURATION", "ASSUMED_MPP"]

#: Otsu's two classes closer than this (saturation levels, 0-255) are one class.
MIN_SEPARATION = 25.0
#: A one-class thumbnail is tissue when its median saturation is at least this.
MIN_TISSUE_SATURATION = 20.0
#: Level-0 MPP assumed for the thumbnail's scale of a slide without resolution
#: metadata and no override (40x); the mask is still correct, only its scale differs.
ASSUMED_MPP = 0.25
#: A level (or its 1/2, 1/4, 1/8 reading) at least ``1 / CLOSE_ENOUGH`` of the thumbnail's
#: downsample is used as the thumbnail without resampling (8 um/px asked, 6.2 to 8 given).
CLOSE_ENOUGH = 1.3
#: Rows of the chosen level read per strip of the thumbnail.
_STRIP_ROWS = 512


@dataclass(frozen=True)
class TissueParams:
    """Parameters of :func:`detect_tissue`.

    Attributes:
        mpp: micrometres per pixel of the thumbnail (default 8).
        median: side of the median filter on the saturation, thumbnail pixels (odd; 1: none).
        threshold: fixed saturation threshold (0-255; tissue is above it), or None for Otsu's.
        close: radius of the closing disk, thumbnail pixels (0: none).
        min_area: smallest piece of tissue kept, level-0 pixels squared.
        min_hole: smallest hole kept open, level-0 pixels squared (smaller ones are filled).
    """

    mpp: float = 8.0
    median: int = 7
    threshold: float | None = None
    close: int = 2
    min_area: float = 512 * 512
    min_hole: float = 256 * 256

    @classmethod
    def clam(cls) -> TissueParams:
        """CLAM's defaults (``create_patches_fp.py``: ``sthresh=8, mthresh=7, close=4,
        use_otsu=False, a_t=100, a_h=16``, areas in 512 x 512 reference patches)."""
        return cls(threshold=8, median=7, close=4, min_area=100 * 512 * 512, min_hole=16 * 512 * 512)

    def check(self) -> TissueParams:
        """Return self; raise :class:`~wsitool.errors.InvalidRegionError` for a bad value."""
        if not (self.mpp > 0 and math.isfinite(self.mpp)):
            raise InvalidRegionError(f"tissue mpp must be positive, got {self.mpp!r}")
        if self.median < 1 or self.median % 2 == 0:
            raise InvalidRegionError(f"tissue median must be an odd number >= 1, got {self.median!r}")
        if self.threshold is not None and not 0 <= self.threshold <= 255:
            raise InvalidRegionError(f"tissue threshold must be in 0..255, got {self.threshold!r}")
        if self.close < 0 or self.min_area < 0 or self.min_hole < 0:
            raise InvalidRegionError("tissue close, min_area and min_hole must be >= 0")
        return self


@dataclass
class TissueMask:
    """A tissue mask of a slide.

    Attributes:
        mask: ``(h, w)`` bool, True on tissue.
        downsample: ``(dx, dy)``, level-0 pixels per mask pixel along x and y.
        thumbnail: the ``(h, w, 3)`` uint8 thumbnail it was computed from, or None.
        threshold: the saturation threshold used, or None (a user's mask).
    """

    mask: np.ndarray
    downsample: tuple[float, float]
    thumbnail: np.ndarray | None = None
    threshold: float | None = None
    _integral: np.ndarray | None = field(default=None, repr=False)

    def fraction(self, x: np.ndarray, y: np.ndarray, w: float, h: float) -> np.ndarray:
        """Tissue fraction (0..1, float32) of level-0 rectangles ``[x, x + w) x [y, y + h)``.

        ``x``, ``y``: ``(n,)`` level-0 corners; ``w``, ``h``: the size in level-0
        pixels.  Counted over the mask pixels the rectangle covers (its edges
        rounded outward to whole mask pixels); parts outside the mask count as
        background.
        """
        if self._integral is None:  # (h + 1, w + 1) sums of the mask above and left of each corner
            import cv2  # optional: the patches extra

            self._integral = cv2.integral(self.mask.astype(np.uint8), sdepth=cv2.CV_64F).astype(np.int64)
        dx, dy = self.downsample
        mh, mw = self.mask.shape
        x = np.asarray(x, np.float64)
        y = np.asarray(y, np.float64)
        x0 = np.clip(np.floor(x / dx), 0, mw).astype(np.int64)
        y0 = np.clip(np.floor(y / dy), 0, mh).astype(np.int64)
        x1 = np.clip(np.ceil((x + w) / dx), 0, mw).astype(np.int64)
        y1 = np.clip(np.ceil((y + h) / dy), 0, mh).astype(np.int64)
        full = np.maximum(np.ceil((x + w) / dx) - np.floor(x / dx), 1) * np.maximum(
            np.ceil((y + h) / dy) - np.floor(y / dy), 1)
        s = self._integral
        count = s[y1, x1] - s[y0, x1] - s[y1, x0] + s[y0, x0]
        return (count / full).astype(np.float32)

    def geojson(self) -> dict:
        """The tissue as a GeoJSON ``FeatureCollection`` of polygons in level-0 pixels.

        One feature per connected piece of tissue: its outline, then its holes
        (OpenCV's border following, ``cv2.findContours`` with a two-level hierarchy),
        each ring closed, through the corners of the mask's pixels.
        """
        import cv2  # optional: the patches extra

        dx, dy = self.downsample
        m = np.pad(self.mask.astype(np.uint8), 1)
        contours, hierarchy = cv2.findContours(m, cv2.RETR_CCOMP, cv2.CHAIN_APPROX_SIMPLE)
        features = []
        if hierarchy is None:
            return {"type": "FeatureCollection", "features": features}
        hierarchy = hierarchy[0]

        def ring(c) -> list:
            pts = c[:, 0, :].astype(np.float64) - 1 + 0.5   # pixel centres, the padding removed
            xy = np.round(np.stack([pts[:, 0] * dx, pts[:, 1] * dy], 1), 2).tolist()
            return [*xy, xy[0]]

        for i, (_next, _prev, child, parent) in enumerate(hierarchy):
            if parent != -1:
                continue   # a hole: listed with its outline
            rings = [ring(contours[i])]
            j = child
            while j != -1:
                rings.append(ring(contours[j]))
                j = hierarchy[j][0]
            features.append({"type": "Feature", "geometry": {"type": "Polygon", "coordinates": rings},
                             "properties": {"area_px": float(cv2.contourArea(contours[i]) * dx * dy)}})
        return {"type": "FeatureCollection", "features": features}

    def save_geojson(self, path: str | os.PathLike) -> None:
        """Write :meth:`geojson` to ``path`` (created exclusively: an existing file is an error)."""
        with open(path, "x", encoding="utf-8") as fh:
            json.dump(self.geojson(), fh)


def _best_level(slide, target_ds: float) -> int:
    """The coarsest level whose downsample is at most ``target_ds`` (level 0 if none)."""
    best = 0
    for i, ds in enumerate(slide.level_downsamples):
        if ds <= target_ds * 1.001:
            best = i
    return best


def read_thumbnail(slide, target_ds: float, *, threads: int | None = None) -> tuple[np.ndarray, tuple[float, float]]:
    """The slide at about ``target_ds`` level-0 pixels per pixel, as ``(h, w, 3)`` uint8, and its
    exact ``(dx, dy)`` level-0 pixels per pixel.

    Reads the coarsest level at or below ``target_ds`` in strips (large levels at
    1/2, 1/4 or 1/8 scale, :mod:`wsitool.read.reduced`).  Where that is within a
    factor :data:`CLOSE_ENOUGH` of ``target_ds`` it is the thumbnail as read (no
    resampling); else each strip is reduced by the area filter onto the
    ``target_ds`` grid, so only one strip is in memory besides the thumbnail.
    """
    level = _best_level(slide, target_ds)
    lv = slide.levels[level]
    ds = lv.downsample
    k = 1
    for f in (2, 4, 8):
        if ds * f <= target_ds * 1.001 and lv.width * lv.height > (1 << 24):
            k = f
    vw, vh = -(-lv.width // k), -(-lv.height // k)
    W0, H0 = slide.dimensions
    if ds * k * CLOSE_ENOUGH >= target_ds:
        ow, oh = vw, vh
        out = np.empty((vh, vw, 3), np.uint8)
        feed = None
    else:
        ow, oh = max(1, round(W0 / target_ds)), max(1, round(H0 / target_ds))
        reducer = AreaReducer(vw, vh, (0, 0, vw, vh), ow, oh, 3)
        out, feed = reducer.out, reducer.feed
    for row in range(0, vh, _STRIP_ROWS):
        rows = min(_STRIP_ROWS, vh - row)
        y0 = level0_coordinate(row, ds * k)
        if feed is None:
            slide.read_region((0, y0), level, (vw, rows), mode="rgb", threads=threads, downsample=k,
                              out=out[row:row + rows])
        else:
            feed(slide.read_region((0, y0), level, (vw, rows), mode="rgb", threads=threads, downsample=k))
    return out, (W0 / ow, H0 / oh)


def _saturation(rgb: np.ndarray) -> np.ndarray:
    """HSV saturation, 0..255 uint8, of ``(h, w, 3)`` uint8 pixels: ``255 * (max - min) / max``
    rounded, 0 where black (OpenCV's RGB to HSV for 8 bits)."""
    import cv2  # optional: the patches extra

    return np.ascontiguousarray(cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2HSV)[..., 1])


def _otsu(values: np.ndarray) -> tuple[float, float]:
    """Otsu's threshold of ``values`` (0..255) and the distance between its two class means."""
    hist = np.bincount(np.clip(values, 0, 255).astype(np.int64).ravel(), minlength=256).astype(np.float64)
    total = hist.sum()
    levels = np.arange(256, dtype=np.float64)
    w0 = np.cumsum(hist)
    m0 = np.cumsum(hist * levels)
    w1 = total - w0
    mean0 = np.divide(m0, w0, out=np.zeros(256), where=w0 > 0)
    mean1 = np.divide(m0[-1] - m0, w1, out=np.zeros(256), where=w1 > 0)
    between = w0 * w1 * (mean0 - mean1) ** 2
    t = int(np.argmax(between))
    return t + 0.5, float(mean1[t] - mean0[t]) if w0[t] > 0 and w1[t] > 0 else 0.0


def _clean(mask: np.ndarray, params: TissueParams, px_area: float) -> np.ndarray:
    """Closing with a disk, then small pieces of tissue removed and small holes filled (OpenCV)."""
    import cv2  # optional: the patches extra

    m: np.ndarray = mask.astype(np.uint8)
    if params.close > 0:
        r = params.close
        m = cv2.morphologyEx(m, cv2.MORPH_CLOSE, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * r + 1, 2 * r + 1)))
    min_area = params.min_area / px_area
    if min_area > 1:
        _, labels, stats, _ = cv2.connectedComponentsWithStats(m, connectivity=8)
        small = np.flatnonzero(stats[:, cv2.CC_STAT_AREA] < min_area)
        small = small[small > 0]                      # label 0 is the background
        if len(small):
            m[np.isin(labels, small)] = 0
    min_hole = params.min_hole / px_area
    if min_hole > 1:
        _, labels, stats, _ = cv2.connectedComponentsWithStats((m == 0).astype(np.uint8), connectivity=4)
        h, w = m.shape
        x, y, bw, bh = (stats[:, k] for k in (cv2.CC_STAT_LEFT, cv2.CC_STAT_TOP, cv2.CC_STAT_WIDTH,
                                              cv2.CC_STAT_HEIGHT))
        inner = (x > 0) & (y > 0) & (x + bw < w) & (y + bh < h)   # not touching the border: a hole
        holes = np.flatnonzero(inner & (stats[:, cv2.CC_STAT_AREA] < min_hole))
        holes = holes[holes > 0]
        if len(holes):
            m[np.isin(labels, holes)] = 1
    return m.astype(bool)


def _level0_mpp(slide, mpp_override: float | None) -> float | None:
    if mpp_override is not None:
        return float(mpp_override)
    mpp = slide.mpp
    return None if mpp is None else float(math.sqrt(mpp[0] * mpp[1]))


def detect_tissue(slide, params: TissueParams | None = None, *, mpp_override: float | None = None,
                  threads: int | None = None) -> TissueMask:
    """The tissue mask of ``slide`` (see the module docstring for the rule).

    Args:
        slide: an open :class:`wsitool.Slide`.
        params: :class:`TissueParams` (default ``TissueParams()``; CLAM's:
            ``TissueParams.clam()``).
        mpp_override: level-0 micrometres per pixel for a slide without
            resolution metadata (else :data:`ASSUMED_MPP` sets the thumbnail's scale).
        threads: decode threads for the thumbnail.

    Returns:
        A :class:`TissueMask` with the thumbnail it was computed from.

    Raises:
        InvalidRegionError: a bad parameter.
        ImportError: OpenCV absent (``pip install 'wsitool[patches]'``).
    """
    import cv2  # optional: the patches extra (opencv-python-headless)

    params = (params or TissueParams()).check()
    mpp0 = _level0_mpp(slide, mpp_override) or ASSUMED_MPP
    thumb, (dx, dy) = read_thumbnail(slide, max(1.0, params.mpp / mpp0), threads=threads)
    sat = _saturation(thumb)
    if params.median > 1:  # exact median, edges replicated (OpenCV's O(1) histogram filter for 8 bits)
        sat = cv2.medianBlur(sat, params.median)
    if params.threshold is not None:
        threshold = float(params.threshold)
        mask = sat > threshold
    else:
        threshold, separation = _otsu(sat)
        if separation < MIN_SEPARATION:
            tissue = float(np.median(sat)) >= MIN_TISSUE_SATURATION
            threshold = -1.0 if tissue else 256.0
            mask = np.full(sat.shape, tissue)
        else:
            mask = sat > threshold
    mask = _clean(mask, params, dx * dy)
    return TissueMask(mask, (dx, dy), thumb, threshold)


def load_mask(source, slide, *, params: TissueParams | None = None, mpp_override: float | None = None,
              threads: int | None = None) -> TissueMask:
    """A user's tissue mask for ``slide``.

    Args:
        source: a :class:`TissueMask` (returned as is); a 2-D array (nonzero is
            tissue) covering the whole slide at any scale (its downsample is the
            slide's size over the array's); a path to an image file of the same
            kind (read with Pillow; nonzero is tissue); or a callable taking the
            ``(h, w, 3)`` uint8 thumbnail at ``params.mpp`` and returning a 2-D
            bool array of its shape.
        slide: the open slide the mask belongs to.
        params, mpp_override, threads: for the thumbnail a callable receives.

    Raises:
        InvalidRegionError: not a 2-D mask, or a callable's result of another shape.
        FileNotFoundError: an image path that does not exist.
    """
    if isinstance(source, TissueMask):
        return source
    W0, H0 = slide.dimensions
    if callable(source):
        params = (params or TissueParams()).check()
        mpp0 = _level0_mpp(slide, mpp_override) or ASSUMED_MPP
        thumb, ds = read_thumbnail(slide, max(1.0, params.mpp / mpp0), threads=threads)
        mask = np.asarray(source(thumb))
        if mask.shape != thumb.shape[:2]:
            raise InvalidRegionError(f"{slide.path}: the mask callable returned shape {mask.shape}; "
                                     f"the thumbnail is {thumb.shape[:2]}")
        return TissueMask(mask.astype(bool), ds, thumb)
    if isinstance(source, (str, os.PathLike)):
        from PIL import Image

        with Image.open(source) as img:
            source = np.asarray(img.convert("L"))
    mask = np.asarray(source)
    if mask.ndim == 3 and mask.shape[2] == 1:
        mask = mask[..., 0]
    if mask.ndim != 2 or mask.size == 0:
        raise InvalidRegionError(f"{slide.path}: a tissue mask must be a non-empty 2-D array, got shape {mask.shape}")
    return TissueMask(mask != 0, (W0 / mask.shape[1], H0 / mask.shape[0]))


def mask_params_from(params: TissueParams | None, **changes) -> TissueParams:
    """``params`` (default ``TissueParams()``) with ``changes`` (None values ignored)."""
    base = params or TissueParams()
    return replace(base, **{k: v for k, v in changes.items() if v is not None})


MaskSource = TissueMask | np.ndarray | str | os.PathLike | Callable[[np.ndarray], np.ndarray]
