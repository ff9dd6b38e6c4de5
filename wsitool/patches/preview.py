"""The picture a user checks before extracting: thumbnail, tissue mask and patch grid (floor 6).

:func:`render_preview` draws, on the tissue thumbnail (about 8 micrometres per
pixel, :func:`~wsitool.patches.tissue.read_thumbnail`), the mask as a green
tint and every planned patch as a yellow outline, enlarged so that patches of
a few thumbnail pixels stay visible; :func:`save_preview` writes it as PNG
(created exclusively, :mod:`wsitool.ground.outputs`).
"""

from __future__ import annotations

import io
import os

import numpy as np

from ..ground.outputs import write_bytes
from .plan import PatchPlan
from .tissue import ASSUMED_MPP, TissueParams, read_thumbnail

__all__ = ["render_preview", "save_preview"]

#: Largest side of the preview, pixels.
MAX_SIDE = 2048


def render_preview(slide, plan: PatchPlan, *, threads: int | None = None) -> np.ndarray:
    """The preview of ``plan`` on ``slide`` as an ``(h, w, 3)`` uint8 array.

    Uses the plan's tissue mask and thumbnail where it has them (a plan just
    made with a mask), else reads a thumbnail at the tissue parameters' MPP.
    """
    from PIL import Image, ImageDraw

    mask = plan.mask
    if mask is not None and mask.thumbnail is not None:
        thumb, (dx, dy) = mask.thumbnail, mask.downsample
    else:
        params = TissueParams()
        mpp0 = plan.params.get("level0_mpp") or ASSUMED_MPP
        thumb, (dx, dy) = read_thumbnail(slide, max(1.0, params.mpp / mpp0), threads=threads)
    h, w = thumb.shape[:2]
    scale = max(1, min(4, MAX_SIDE // max(h, w, 1)))
    img = Image.fromarray(thumb).resize((w * scale, h * scale), Image.Resampling.NEAREST)
    if mask is not None and mask.mask.shape == thumb.shape[:2]:
        tint = np.zeros((h, w, 4), np.uint8)
        tint[mask.mask] = (0, 200, 0, 60)
        img = Image.alpha_composite(img.convert("RGBA"),
                                    Image.fromarray(tint).resize(img.size, Image.Resampling.NEAREST)).convert("RGB")
    draw = ImageDraw.Draw(img)
    side = plan.read_size * plan.params.get("level_downsample", 1.0)
    for x, y in zip(plan.x.tolist(), plan.y.tolist(), strict=True):
        x0, y0 = x / dx * scale, y / dy * scale
        draw.rectangle([x0, y0, x0 + side / dx * scale - 1, y0 + side / dy * scale - 1], outline=(255, 210, 0))
    return np.asarray(img)


def save_preview(slide, plan: PatchPlan, path: str | os.PathLike, *, overwrite: bool = False,
                 threads: int | None = None) -> None:
    """Write :func:`render_preview` to ``path`` as PNG.

    Raises:
        OutputExistsError: ``path`` exists and not ``overwrite``.
    """
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(render_preview(slide, plan, threads=threads)).save(buf, "PNG")
    write_bytes(path, buf.getvalue(), overwrite=overwrite, sources=[slide.path])
