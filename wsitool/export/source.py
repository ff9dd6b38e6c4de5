"""Reading the source for an export: level-0 strips composited on the background, undecodable tiles policy (floor 6)."""

from __future__ import annotations

import numpy as np

from ..errors import TileDecodeError
from ..ground.geometry import level0_coordinate
from ..slide import pyramid_levels
from .plan import strip_rows


class StripSource:
    """Reads region rows of the source level, composited on the background, as uint8 RGB.

    Sources without an alpha channel are read in ``"rgb"`` mode straight into
    the caller's buffer; the pixels ``"rgba"`` mode would make transparent
    (outside the level, missing tiles) are then painted with the background,
    which gives exactly the ``"rgba"`` composite without the RGBA copy.
    Sources with an alpha channel (ExtraSamples 1 or 2) are read in
    ``"rgba"`` mode and composited.  With ``on_error="raise"`` the first
    undecodable tile's :class:`TileDecodeError` ends the export; with
    ``"fill"`` a strip with an undecodable tile is read again tile by tile,
    and the tiles that fail stay background and are counted (``failed``,
    ``first_error``).
    """

    def __init__(self, slide, level: int, rx: int, ry: int, w: int, h: int, tile: int,
                 threads: int, background: np.ndarray, on_error: str = "raise"):
        lv = pyramid_levels(slide)[level]
        #: rows per strip, and the rows of the first strip (up to the source tile grid)
        self.strip = strip_rows(tile, lv.tile_height)
        aligned = self.strip % lv.tile_height == 0
        self.first = self.strip - (ry % self.strip) if aligned else self.strip
        self.slide = slide
        self.level = level
        self.lv = lv
        self.rx, self.ry, self.w, self.h = rx, ry, w, h
        self.threads = threads
        self.background = background
        self.on_error = on_error
        self.failed: set[tuple[int, int]] = set()
        self.first_error: str | None = None  # message of the first tile painted over
        # (a mosaic level's painted tiles are transparent between its images: composited as alpha is)
        self.alpha = lv.mosaic is not None or any(code in (1, 2) for code in self.lv.encoding.extrasamples)
        self._rgba = np.empty((min(self.strip, h), w, 4), np.uint8) if self.alpha else None
        self._missing = self._missing_grid()

    def _loc(self, lx: int, ly: int) -> tuple[int, int]:
        ds = self.lv.downsample
        return level0_coordinate(lx, ds), level0_coordinate(ly, ds)

    def _missing_grid(self) -> np.ndarray:
        """Boolean (tiles_down, tiles_across): tile absent from the file (offset or count 0)."""
        lv = self.lv
        n = lv.tiles_across * lv.tiles_down
        planes = lv.tiles.planes
        shape = (planes, lv.tiles_down, lv.tiles_across)
        offs = np.asarray(lv.tiles.offsets[:planes * n]).reshape(shape)
        cnts = np.asarray(lv.tiles.bytecounts[:planes * n]).reshape(shape)
        return ((offs == 0) | (cnts == 0)).any(axis=0)

    def _tile_span(self, y0: int, y1: int):
        """Tile rows and columns of the level inside the region rows [y0, y1), or None."""
        lv = self.lv
        cx0, cy0 = max(self.rx, 0), max(y0, 0)
        cx1, cy1 = min(self.rx + self.w, lv.width), min(y1, lv.height)
        if cx0 >= cx1 or cy0 >= cy1:
            return None
        return ((cy0 // lv.tile_height, (cy1 - 1) // lv.tile_height + 1),
                (cx0 // lv.tile_width, (cx1 - 1) // lv.tile_width + 1), (cx0, cy0, cx1, cy1))

    def missing_tiles(self) -> int:
        """Source tiles inside the region whose offset or byte count is 0."""
        span = self._tile_span(self.ry, self.ry + self.h)
        if span is None:
            return 0
        (r0, r1), (c0, c1), _ = span
        return int(self._missing[r0:r1, c0:c1].sum())

    def read(self, sy: int, out: np.ndarray) -> None:
        """Fill ``out`` ((rows, w, 3) uint8, C-contiguous) with region rows ``sy ...``."""
        rows = out.shape[0]
        ly = self.ry + sy
        loc = self._loc(self.rx, ly)
        try:
            if self._rgba is not None:  # self.alpha
                rgba = self._rgba[:rows]
                self.slide.read_region(loc, self.level, (self.w, rows), out=rgba, mode="rgba",
                                       threads=self.threads, on_error="raise")
                composite(rgba, out, self.background)
                return
            self.slide.read_region(loc, self.level, (self.w, rows), out=out, mode="rgb",
                                   threads=self.threads, on_error="raise")
        except TileDecodeError:
            if self.on_error != "fill":
                raise
            self._read_tilewise(ly, out)
            return
        self._paint_transparent(ly, out)

    def _paint_transparent(self, ly: int, out: np.ndarray) -> None:
        """Background where an ``"rgba"`` read would be transparent: outside, missing tiles."""
        lv, bg, rows = self.lv, self.background, out.shape[0]
        top = min(max(0, -ly), rows)
        bottom = min(max(0, lv.height - ly), rows)
        left = min(max(0, -self.rx), self.w)
        right = min(max(0, lv.width - self.rx), self.w)
        out[:top] = bg
        out[max(bottom, top):] = bg
        out[top:bottom, :left] = bg
        out[top:bottom, max(right, left):] = bg
        span = self._tile_span(ly, ly + rows)
        if span is None:
            return
        (r0, r1), (c0, c1), (cx0, cy0, cx1, cy1) = span
        holes = np.argwhere(self._missing[r0:r1, c0:c1])
        for dr, dc in holes:
            row, col = r0 + int(dr), c0 + int(dc)
            y0, y1 = max(row * lv.tile_height, cy0), min((row + 1) * lv.tile_height, cy1)
            x0, x1 = max(col * lv.tile_width, cx0), min((col + 1) * lv.tile_width, cx1)
            out[y0 - ly:y1 - ly, x0 - self.rx:x1 - self.rx] = bg

    def _read_tilewise(self, ly: int, out: np.ndarray) -> None:
        """Slow path after a decode error: read source tile by tile, keep what decodes."""
        rows = out.shape[0]
        rgba = np.zeros((rows, self.w, 4), np.uint8)
        span = self._tile_span(ly, ly + rows)
        if span is not None:
            lv = self.lv
            (r0, r1), (c0, c1), (cx0, cy0, cx1, cy1) = span
            for row in range(r0, r1):
                y0, y1 = max(row * lv.tile_height, cy0), min((row + 1) * lv.tile_height, cy1)
                for col in range(c0, c1):
                    x0, x1 = max(col * lv.tile_width, cx0), min((col + 1) * lv.tile_width, cx1)
                    try:
                        part = self.slide.read_region(self._loc(x0, y0), self.level,
                                                      (x1 - x0, y1 - y0), mode="rgba", threads=1,
                                                      on_error="raise")
                    except TileDecodeError as exc:
                        self.failed.add((col, row))
                        if self.first_error is None:
                            self.first_error = str(exc)
                        continue
                    rgba[y0 - ly:y1 - ly, x0 - self.rx:x1 - self.rx] = part
        composite(rgba, out, self.background)


def composite(rgba: np.ndarray, out: np.ndarray, background: np.ndarray) -> None:
    """``out[...] = rgb over background`` with alpha: ``(c * a + bg * (255 - a) + 127) // 255``.

    ``rgba`` ``(h, w, 4)`` uint8, ``out`` ``(h, w, 3)`` uint8 (written), ``background``
    ``(3,)`` uint8."""
    out[...] = rgba[..., :3]
    alpha = rgba[..., 3]
    partial = alpha != 255
    if not partial.any():
        return
    bg = background.astype(np.uint16)
    for r in np.flatnonzero(partial.any(axis=1)):
        a = alpha[r].astype(np.uint16)[:, None]
        mix = rgba[r, :, :3].astype(np.uint16) * a + bg * (255 - a) + 127
        out[r] = mix // 255


