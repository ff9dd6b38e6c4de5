"""Which IFDs of a TIFF are pyramid levels: the level-detection rule (floor 3).

Rule (one for every layout): level 0 is the candidate with the largest area
(the first one in file order on a tie).  Every other candidate is a level if it
has the same samples per pixel and sample type, a strictly smaller area than the
previous level, and the same aspect ratio within one pixel of rounding: some
single factor ``d`` gives both ``|W0 / d - w| < 1`` and ``|H0 / d - h| < 1`` (the
ranges of factors allowed by each axis overlap).  Neither the reduced-resolution
flag, nor tiling, nor power-of-two factors are required: stripped levels are
read strip by strip as one-column tile grids, and downsamples such as 3 or 12
are valid.  Candidates that fail the test (e.g. a 200 x 200 stripped overview in
a 1024 x 768 pyramid) are not levels.
"""

from __future__ import annotations

import math

__all__ = ["choose_levels", "same_aspect"]


def factor_range(full: int, reduced: int) -> tuple[float, float]:
    """Downsample factors ``d`` for which ``reduced`` is ``full / d`` within one pixel."""
    low = full / (reduced + 1)
    high = full / (reduced - 1) if reduced > 1 else math.inf
    return low, high


def same_aspect(w0: int, h0: int, w: int, h: int) -> bool:
    """True if ``w x h`` is ``w0 x h0`` reduced by one factor, within one pixel of
    rounding on each axis: the factor ranges of the two axes overlap.  Small
    levels of elongated images (e.g. 16 x 3 from 2000 x 300) pass; an overview
    of another aspect (200 x 200 in a 1024 x 768 pyramid) does not."""
    lx, hx = factor_range(w0, w)
    ly, hy = factor_range(h0, h)
    return max(lx, ly) <= min(hx, hy)


def choose_levels(pool: list) -> list:
    """The pages of ``pool`` (tifffile pages, associated images removed) that form
    the pyramid, largest first, by the rule of the module docstring."""
    base = max(pool, key=lambda p: p.imagewidth * p.imagelength)  # first on ties
    w0, h0 = int(base.imagewidth), int(base.imagelength)
    chosen = [base]
    for page in sorted(pool, key=lambda p: -(p.imagewidth * p.imagelength)):
        if page is base:
            continue
        last = chosen[-1]
        w, h = int(page.imagewidth), int(page.imagelength)
        if w * h >= last.imagewidth * last.imagelength:
            continue
        if page.samplesperpixel != base.samplesperpixel or page.dtype != base.dtype:
            continue
        if same_aspect(w0, h0, w, h):
            chosen.append(page)
    return chosen
