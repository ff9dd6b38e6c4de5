"""What one render may read and hold, and what the renders in flight may hold together.

Two per-request bounds, checked before a render starts (a request over either is a
400 that says which and why), and one server-wide budget:

* **Source pixels read** (``max_decode_pixels``, ``--max-decode-pixels``; default
  wsitool's ``max_region_pixels`` limit, 2**28: a 16384 x 16384 window): the window a
  request reads on the level that answers it (:class:`~wsitool.serve.render.ReadPlan`; whole tiles are decoded, so up
  to one tile more along each edge).  A slide without low-resolution levels cannot
  give a thumbnail without decoding all of level 0 (1.6 gigapixels for a
  40960 x 40960 single-level slide, 18 s): such requests are refused at once, and
  ``info.json`` lists only the ``sizes`` and tile ``scaleFactors`` within the limit
  (:func:`iiif_admits`).  Reading runs at 50-150 megapixels a second with JPEG
  tiles on two threads, so the default keeps a request's reading within a few
  seconds.
* **Memory of one render** (bytes): :func:`wsitool.serve.render.render_bytes` for an
  IIIF image (its final image, one strip's working set and the encoder's memory),
  :func:`dz_bytes` for a Deep Zoom tile (its whole read, as openslide-python's
  generator reads it, and Pillow's copies).
* **Render memory** (``render_memory_mb``, ``--render-memory-mb``; default 768 MiB,
  split over ``--workers`` as the cache is): before a render starts it reserves its
  memory bound from this budget (:class:`RenderBudget`), waiting (first come, first served, among the
  requests that wait for a render thread) until the renders in flight leave room;
  a request whose bound exceeds the whole budget is refused.  The advertised
  ``maxArea`` is at most what a color PNG or JPEG of that area needs
  (:func:`area_within`), so every JPEG and PNG request inside ``info.json``'s limits
  fits; lossless WebP takes about 27 bytes a pixel (about 27 megapixels with the
  default budget) and larger WebP requests are refused with that reason.

Counted apart: the decoded-tile cache (``--cache-mb``, its own budget), and the tile
decodes of the reads in flight (:func:`decode_bytes`: one decoded tile per decode thread,
whatever the request; not reserved, so that a slide of very large tiles stays served).
So a server process holds at most its idle memory + the cache budget + the render memory +
``threads`` decoded tiles (and HTTP buffers).
"""

from __future__ import annotations

import asyncio
import collections
import math

from ..deepzoom.subpixel import BLEND_BYTES_PER_PIXEL, whole_pixel
from .render import WEBP_BYTES_PER_PIXEL, plan_read, render_bytes

__all__ = ["RenderBudget", "dz_bytes", "decode_bytes", "area_within", "webp_area_within", "iiif_admits", "mib",
           "WORK_ALLOWANCE", "COLOR_BYTES_PER_PIXEL"]

#: Room left for a render's working set (strips, filter temporaries) when the largest
#: advertised area is derived from the render memory (:func:`area_within`).
WORK_ALLOWANCE = 64 << 20
#: Bytes a color pixel of a JPEG or PNG render may take: the image (3) and the encoder (2 x 3).
COLOR_BYTES_PER_PIXEL = 9


class RenderBudget:
    """A byte budget shared by the renders in flight: each reserves its bound before it starts.

    Used on one event loop (no locks).  Reservations are served in order: a request
    waiting for a large reservation is not overtaken by later small ones (it cannot
    starve).

    Args:
        total: the budget, bytes.

    Attributes:
        total: the budget; reserved: bytes reserved now; peak: most bytes reserved at once.
    """

    def __init__(self, total: int):
        self.total = total
        self.reserved = 0
        self.peak = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def reserve(self, n: int) -> None:
        """Wait until ``n`` bytes fit beside the reservations in flight, and reserve them.

        Raises:
            ValueError: ``n`` exceeds :attr:`total` (it would never fit).
            asyncio.CancelledError: the waiting task was cancelled (nothing stays reserved).
        """
        if n > self.total:
            raise ValueError(f"{n} bytes exceed the budget of {self.total}")
        if not self._waiting and self.reserved + n <= self.total:
            self._take(n)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, fut)
        self._waiting.append(entry)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(n)   # granted just as it was cancelled
            else:
                self._waiting.remove(entry)
                self._wake()      # the next may fit now
            raise

    def release(self, n: int) -> None:
        """Give back a reservation of ``n`` bytes and start the waiters that fit now."""
        self.reserved -= n
        self._wake()

    def _take(self, n: int) -> None:
        self.reserved += n
        self.peak = max(self.peak, self.reserved)

    def _wake(self) -> None:
        while self._waiting and self.reserved + self._waiting[0][0] <= self.total:
            n, fut = self._waiting.popleft()
            if not fut.done():
                self._take(n)
                fut.set_result(None)

    def snapshot(self) -> dict[str, int]:
        """``budget_bytes``, ``reserved_bytes``, ``peak_reserved_bytes``, ``waiting`` (JSON-ready)."""
        return {"budget_bytes": self.total, "reserved_bytes": self.reserved, "peak_reserved_bytes": self.peak,
                "waiting": len(self._waiting)}


def area_within(budget: int) -> int:
    """The largest output area (pixels) whose color JPEG or PNG render fits ``budget`` bytes
    (:data:`COLOR_BYTES_PER_PIXEL` a pixel beside :data:`WORK_ALLOWANCE`); at least 1."""
    return max(1, (budget - WORK_ALLOWANCE) // COLOR_BYTES_PER_PIXEL)


def webp_area_within(budget: int) -> int:
    """The largest output area (pixels) whose lossless WebP render fits ``budget`` bytes."""
    return max(1, (budget - WORK_ALLOWANCE) // (3 + WEBP_BYTES_PER_PIXEL))


def dz_bytes(slide, tile) -> int:
    """The memory bound of one Deep Zoom tile (bytes): its read and the copies made of it.

    ``tile`` is a :class:`~wsitool.deepzoom.geometry.DeepZoomTile`.  The tile's region is read
    whole (RGBA, 4 bytes a pixel), as openslide-python's generator reads it: at a
    whole-pixel offset kept as RGB (3) and shrunk by Pillow (its 4-byte image and a
    reduced copy): 16 bytes a pixel read; at a fractional offset
    (:func:`wsitool.deepzoom.tiles.read_blended`) blended in float32 first:
    :data:`~wsitool.deepzoom.subpixel.BLEND_BYTES_PER_PIXEL` a pixel read.  Plus the tile
    itself and its encoding (``tile.size`` x 3, twice).
    """
    location, level, (rw, rh) = tile.read_args
    per_pixel = 16 if whole_pixel(slide, location, level) else BLEND_BYTES_PER_PIXEL
    tw, th = tile.size
    return (rw + 1) * (rh + 1) * per_pixel + 3 * 3 * tw * th


def decode_bytes(level, threads: int) -> int:
    """Bytes the tile decodes of reads on ``level`` hold at once: a decoded RGBA tile per decode
    thread (``threads``), twice (the decode and its conversion).  Not part of a render's
    reservation (see the module docstring)."""
    return 2 * threads * 4 * level.tile_width * level.tile_height


def iiif_admits(slide, region: tuple[int, int, int, int], size: tuple[int, int], tolerance: float,
                max_decode_pixels: int, budget: int) -> bool:
    """Whether the color JPEG of level-0 ``region`` at ``size`` is served: its window within
    ``max_decode_pixels`` and its memory bound within ``budget`` bytes."""
    plan = plan_read(slide.level_dimensions, slide.level_downsamples, region, size, tolerance)
    _x, _y, ww, wh = plan.window
    if ww * wh > max_decode_pixels:
        return False
    return render_bytes(plan, slide.levels[plan.level].tile_height, "color", "jpg") <= budget


def mib(n: int) -> int:
    """``n`` bytes in MiB, rounded up."""
    return math.ceil(n / (1 << 20))
