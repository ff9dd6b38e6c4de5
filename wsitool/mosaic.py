"""Mosaic levels: a level made of images placed at arbitrary positions (floor 3, above the model).

Some containers do not store a level as a regular grid of tiles: a MIRAX level is the
camera images (or parts of them) each at its own stitched position, a Zeiss CZI level the
subblocks of a mosaic; the images may overlap and are drawn in a defined order.  A format
describes such a level as a :class:`Mosaic` (the placed images, built with
:class:`MosaicBuilder`) and attaches it to a :class:`~wsitool.model.PyramidLevel` made by
:func:`mosaic_level`.  The level then has a *virtual* tile grid
(``tile_width x tile_height``, the format's choice): virtual tile ``(col, row)`` is painted from
the placed images that overlap it (:mod:`wsitool.codec.mosaic`), so the decoded-tile cache,
threads, ``read_patches``, Deep Zoom, export and the drop-in read it as any tiled level.

Terms:

* an **image** is one stored, encoded picture: ``(source, offset, length)`` in one of the
  mosaic's byte sources, its decoded size ``(width, height)`` and its codec (a name of
  :data:`wsitool.codec.mosaic.CODECS`, per image: CZI mixes uncompressed, zstd and JPEG XR);
* a **placement** paints the rectangle ``(sx, sy, w, h)`` of one decoded image (a MIRAX
  camera image is cut into several placements at lower levels) with its top-left corner at
  level position ``(x, y)``.  ``x``, ``y`` are floats where the container places at fractional
  positions (OpenSlide's MIRAX positions divided by the level's concatenation factor); they are
  painted at the nearest level pixel, ``floor(v + 0.5)`` (OpenSlide samples such images
  bilinearly, see ``Mosaic.fractional``);
* **paint order**: placements are painted in ascending ``z`` (ties: the order they were
  added); a later one covers an earlier one where they overlap.  Pixels no placement covers
  are transparent (0, alpha 0), as a missing tile is.

The spatial index is a bin grid (cells of the largest placement's size): a region looks up
the cells it touches, so finding a region's placements costs the same on a 100,000-image slide
as on a small one.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from .model import PyramidLevel, TileEncoding, TileIndex

__all__ = ["Mosaic", "MosaicBuilder", "DecodedImages", "mosaic_level", "MOSAIC", "DECODED_CACHE_BYTES"]

#: :attr:`~wsitool.model.TileEncoding.codec` of a mosaic level's virtual tiles.
MOSAIC = "mosaic"

#: Bytes of decoded images a :class:`Mosaic` keeps by default (per mosaic, least recently used
#: dropped first): an image is decoded once while the virtual tiles it overlaps are painted.
DECODED_CACHE_BYTES = 64 << 20


class DecodedImages:
    """A thread-safe least-recently-used store of decoded images, bounded in bytes.

    Args:
        max_bytes: the most bytes (``ndarray.nbytes``) it holds; an image bigger than
            that is never kept.
    """

    def __init__(self, max_bytes: int = DECODED_CACHE_BYTES):
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> np.ndarray | None:
        """The decoded image ``key`` (a mosaic's key for one of its images), or None."""
        with self._lock:
            arr = self._items.get(key)
            if arr is not None:
                self._items.move_to_end(key)
            return arr

    def put(self, key: Hashable, arr: np.ndarray) -> None:
        """Keep ``arr`` as image ``key`` (dropping the least recently used to make room)."""
        if arr.nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._items[key] = arr
            self._bytes += arr.nbytes
            while self._bytes > self.max_bytes:
                _k, dropped = self._items.popitem(last=False)
                self._bytes -= dropped.nbytes

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def clear(self) -> None:
        """Drop everything."""
        with self._lock:
            self._items.clear()
            self._bytes = 0


_TOKENS = itertools.count()


class Mosaic:
    """The placed images of one level (build it with :class:`MosaicBuilder`): numpy arrays of its
    ``n`` images and ``m`` placements (in paint order).

    Attributes:
        sources: the :class:`~wsitool.storage.ByteSource` objects images are read from
            (the format opens and releases them).
        codecs: the codec names images use (:data:`wsitool.codec.mosaic.CODECS`).
        image_source, image_codec: ``(n,)`` int32 indices into ``sources`` and ``codecs``.
        image_offset, image_length: ``(n,)`` int64 byte offset and length of each image.
        image_width, image_height: ``(n,)`` int32 decoded size in pixels.
        x, y: ``(m,)`` float64 level position of each placement's top-left corner.
        px, py: ``(m,)`` int64 the level pixel it is painted at (``floor(v + 0.5)``).
        sx, sy, w, h: ``(m,)`` int32 the painted rectangle of the decoded image.
        image: ``(m,)`` int64 the image each placement paints.
        fractional: True when some placement lies at a fractional position (painted at the
            nearest pixel; OpenSlide blends there, as the drop-in does: :mod:`wsitool.codec.mosaic_blend`).
        rgb24_whole: True where OpenSlide paints a placement that shows its whole image from an
            opaque RGB24 surface (MIRAX), which pixman may sample on its 8-bit path.
        bounds: ``(x0, y0, x1, y1)`` level pixels covered by some placement (the union's
            bounding box; the exact float extent is :meth:`float_bounds`), or None when empty.
        decoded: the :class:`DecodedImages` cache this mosaic keeps its decoded images in (its
            own, or one shared with the other levels of its slide); use :meth:`cached` /
            :meth:`keep`, which key the images apart from other mosaics'.
        samples, dtype: what an image decodes to (``(h, w, samples)`` of ``dtype``).
        jpeg_prefix: bytes put in place of each ``"jpeg"`` image's SOI before decoding (the
            JPEGTables of TIFF tiles placed as images); empty: the images are complete streams.
    """

    def __init__(self, *, sources: Sequence[Any], codecs: Sequence[str], images: dict[str, np.ndarray],
                 places: dict[str, np.ndarray], samples: int, dtype: Any, decoded: DecodedImages,
                 jpeg_prefix: bytes = b"", rgb24_whole: bool = False):
        self.sources = tuple(sources)
        self.codecs = tuple(codecs)
        self.image_source = images["source"]
        self.image_codec = images["codec"]
        self.image_offset = images["offset"]
        self.image_length = images["length"]
        self.image_width = images["width"]
        self.image_height = images["height"]
        self.x, self.y = places["x"], places["y"]
        self.sx, self.sy = places["sx"], places["sy"]
        self.w, self.h = places["w"], places["h"]
        self.image = places["image"]
        self.px = np.floor(self.x + 0.5).astype(np.int64)
        self.py = np.floor(self.y + 0.5).astype(np.int64)
        self.fractional = bool(np.any(self.px != self.x) or np.any(self.py != self.y))
        self.samples = samples
        self.dtype = np.dtype(dtype)
        self.decoded = decoded
        self.jpeg_prefix = jpeg_prefix
        self.rgb24_whole = rgb24_whole
        self._token = next(_TOKENS)
        self._build_index()

    def cached(self, k: int) -> np.ndarray | None:
        """Decoded image ``k`` from :attr:`decoded`, or None."""
        return self.decoded.get((self._token, k))

    def keep(self, k: int, arr: np.ndarray) -> None:
        """Keep decoded image ``k`` in :attr:`decoded`."""
        self.decoded.put((self._token, k), arr)

    def __len__(self) -> int:
        return len(self.x)

    @property
    def image_count(self) -> int:
        """Number of images."""
        return len(self.image_offset)

    def _build_index(self) -> None:
        m = len(self.x)
        if m == 0:
            self.bounds = None
            self._cell = (1, 1)
            self._origin = (0, 0)
            self._grid = (0, 0)
            self._starts = np.zeros(1, np.int64)
            self._members = np.zeros(0, np.int64)
            return
        x1, y1 = self.px + self.w, self.py + self.h
        self.bounds = (int(self.px.min()), int(self.py.min()), int(x1.max()), int(y1.max()))
        cw, ch = max(1, int(self.w.max())), max(1, int(self.h.max()))
        ox, oy = self.bounds[0], self.bounds[1]
        across = (self.bounds[2] - ox) // cw + 1
        down = (self.bounds[3] - oy) // ch + 1
        while across * down > 4 * m + 1024:  # far-flung placements: coarser cells, bounded memory
            cw, ch = cw * 2, ch * 2
            across, down = (self.bounds[2] - ox) // cw + 1, (self.bounds[3] - oy) // ch + 1
        c0, r0 = (self.px - ox) // cw, (self.py - oy) // ch
        c1, r1 = (x1 - 1 - ox) // cw, (y1 - 1 - oy) // ch
        # each placement spans at most 2 x 2 cells (the cells are as large as the largest one)
        cells, owners = [], []
        for dc in (0, 1):
            for dr in (0, 1):
                ok = (c0 + dc <= c1) & (r0 + dr <= r1) if (dc or dr) else np.ones(m, bool)
                idx = np.nonzero(ok)[0]
                cells.append((r0[idx] + dr) * across + c0[idx] + dc)
                owners.append(idx)
        cell = np.concatenate(cells)
        owner = np.concatenate(owners)
        order = np.lexsort((owner, cell))
        cell, owner = cell[order], owner[order]
        self._starts = np.searchsorted(cell, np.arange(across * down + 1)).astype(np.int64)
        self._members = owner.astype(np.int64)
        self._cell = (cw, ch)
        self._origin = (ox, oy)
        self._grid = (across, down)

    def float_bounds(self) -> tuple[float, float, float, float] | None:
        """``(x0, y0, x1, y1)`` of the placements' union as placed (floats), or None when empty."""
        if not len(self.x):
            return None
        return (float(self.x.min()), float(self.y.min()), float((self.x + self.w).max()),
                float((self.y + self.h).max()))

    def query(self, x0: int, y0: int, x1: int, y1: int) -> np.ndarray:
        """The placements that paint some pixel of ``[x0, x1) x [y0, y1)`` (level pixels), as
        an int64 array of placement indices in paint order (ascending)."""
        if self.bounds is None or x1 <= x0 or y1 <= y0:
            return np.zeros(0, np.int64)
        (cw, ch), (ox, oy), (across, down) = self._cell, self._origin, self._grid
        ca, cb = max(0, (x0 - ox) // cw), min(across - 1, (x1 - 1 - ox) // cw)
        ra, rb = max(0, (y0 - oy) // ch), min(down - 1, (y1 - 1 - oy) // ch)
        if ca > cb or ra > rb:
            return np.zeros(0, np.int64)
        parts = []
        for r in range(ra, rb + 1):
            a, b = self._starts[r * across + ca], self._starts[r * across + cb + 1]
            if b > a:
                parts.append(self._members[a:b])
        if not parts:
            return np.zeros(0, np.int64)
        cand = np.unique(np.concatenate(parts))
        px, py = self.px[cand], self.py[cand]
        hit = (px < x1) & (py < y1) & (px + self.w[cand] > x0) & (py + self.h[cand] > y0)
        return cand[hit]

    def images_in(self, x0: int, y0: int, x1: int, y1: int) -> np.ndarray:
        """The distinct images (int64 indices, ascending) the region ``[x0, x1) x [y0, y1)`` needs."""
        return np.unique(self.image[self.query(x0, y0, x1, y1)])

    def ranges(self, images: np.ndarray) -> dict[int, list[tuple[int, int]]]:
        """``{source index: [(offset, length), ...]}`` of ``images`` (for a byte source's advice)."""
        out: dict[int, list[tuple[int, int]]] = {}
        for k in images.tolist():
            out.setdefault(int(self.image_source[k]), []).append(
                (int(self.image_offset[k]), int(self.image_length[k])))
        return out

    def __repr__(self) -> str:
        return f"Mosaic({len(self)} placements of {self.image_count} images, bounds={self.bounds})"


def mosaic_level(mosaic: Mosaic, *, index: int, width: int, height: int, downsample: float,
                 tile_width: int = 512, tile_height: int = 512, photometric: str = "RGB",
                 photometric_code: int = 2) -> PyramidLevel:
    """A :class:`~wsitool.model.PyramidLevel` of ``width x height`` pixels read from ``mosaic``
    through a virtual grid of ``tile_width x tile_height`` tiles.

    Its :class:`~wsitool.model.TileEncoding` has ``codec`` :data:`MOSAIC` (the read layer paints
    its tiles, :mod:`wsitool.codec.mosaic`), compression ``"MOSAIC"`` (never copied as
    compressed tiles); its :class:`~wsitool.model.TileIndex` (computed on first use) marks the
    virtual tiles no placement touches as missing (offset 0) and gives the others offset 1 and,
    as byte count, the compressed bytes of the images that touch them (an estimate for
    planners; never read as a file range).  ``source`` is the mosaic's first byte source (what
    the region layer holds open while reading: the format keeps all of them open).

    Raises:
        ValueError: a size or tile size below 1, or a mosaic without byte sources.
    """
    if min(width, height, tile_width, tile_height) < 1 or not mosaic.sources:
        raise ValueError(f"bad mosaic level {width}x{height}, tile {tile_width}x{tile_height}")
    encoding = TileEncoding(compression="MOSAIC", compression_code=0, photometric=photometric,
                            photometric_code=photometric_code, bits=mosaic.dtype.itemsize * 8,
                            stream=None, codec=MOSAIC)
    across, down = -(-width // tile_width), -(-height // tile_height)
    tiles = TileIndex(None, None, load=lambda: _virtual_index(mosaic, across, down, tile_width, tile_height))
    level = PyramidLevel(index=index, width=width, height=height, downsample=downsample,
                         tile_width=tile_width, tile_height=tile_height, tiled=True,
                         samples=mosaic.samples, dtype=mosaic.dtype, encoding=encoding, tiles=tiles,
                         source=mosaic.sources[0])
    level.mosaic = mosaic
    return level


def _virtual_index(mosaic: Mosaic, across: int, down: int, tw: int, th: int) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, bytecounts)`` of the virtual grid (see :func:`mosaic_level`)."""
    counts = np.zeros(across * down, np.uint64)
    if len(mosaic):
        x0 = np.clip(mosaic.px, 0, None)
        y0 = np.clip(mosaic.py, 0, None)
        x1 = np.clip(mosaic.px + mosaic.w, None, across * tw)
        y1 = np.clip(mosaic.py + mosaic.h, None, down * th)
        ok = (x1 > x0) & (y1 > y0)
        c0, r0 = x0 // tw, y0 // th
        c1, r1 = (x1 - 1) // tw, (y1 - 1) // th
        length = mosaic.image_length[mosaic.image].astype(np.uint64)
        span_c = int((c1 - c0)[ok].max(initial=0)) + 1
        span_r = int((r1 - r0)[ok].max(initial=0)) + 1
        for dc in range(span_c):
            for dr in range(span_r):
                sel = ok & (c0 + dc <= c1) & (r0 + dr <= r1)
                np.add.at(counts, ((r0 + dr) * across + c0 + dc)[sel], length[sel])
    offsets = (counts > 0).astype(np.uint64)
    counts[(offsets > 0) & (counts == 0)] = 1
    return offsets, counts


class MosaicBuilder:
    """Collects images and placements, then :meth:`build` s a :class:`Mosaic`.

    Args:
        samples, dtype: what every image decodes to (3, uint8 for RGB).
        cache_bytes: the size of the mosaic's own decoded-image cache (:data:`DECODED_CACHE_BYTES`);
        decoded: a :class:`DecodedImages` to share instead (one per slide, for all its levels).
        jpeg_prefix: for ``"jpeg"`` images that are TIFF tiles sharing a JPEGTables tag: the
            bytes that replace each one's SOI (:func:`wsitool.ground.bitstream.jpeg_with_prefix`;
            a TIFF level's ``encoding.jpeg_prefix``).
        rgb24_whole: OpenSlide paints whole images from opaque RGB24 surfaces (MIRAX; only the
            drop-in's OpenSlide painting reads it, ``Mosaic.rgb24_whole``).

    Example (a format)::

        b = MosaicBuilder()
        src = b.source(data_file)              # a ByteSource, once per file
        k = b.image(src, offset, length, 1024, 768, "jpeg")
        b.place(k, x=1000.5, y=20)             # the whole image; z = the order added
        mosaic = b.build()
    """

    def __init__(self, samples: int = 3, dtype: Any = np.uint8, cache_bytes: int = DECODED_CACHE_BYTES,
                 decoded: DecodedImages | None = None, jpeg_prefix: bytes = b"", rgb24_whole: bool = False):
        self.samples = samples
        self.rgb24_whole = rgb24_whole
        self.jpeg_prefix = jpeg_prefix
        self.dtype = np.dtype(dtype)
        self.cache_bytes = cache_bytes
        self.decoded = decoded
        self._sources: list[Any] = []
        self._source_ids: dict[int, int] = {}
        self._codecs: list[str] = []
        self._images: list[tuple[int, int, int, int, int, int]] = []  # (not yet in _image_rows)
        self._places: list[tuple[float, float, int, int, int, int, int, float]] = []  # (not in _place_rows)
        self._image_rows: list[np.ndarray] = []  # (n, 6) int64: source, codec, offset, length, width, height
        self._place_rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (xy, ints, z) as build() takes
        self._image_starts: list[int] = []  # the first image index of each of _image_rows
        self._flushed_images = 0
        self._flushed_places = 0

    def source(self, source: Any) -> int:
        """The index of byte source ``source`` (added on first use)."""
        key = id(source)
        if key not in self._source_ids:
            self._source_ids[key] = len(self._sources)
            self._sources.append(source)
        return self._source_ids[key]

    def image(self, source: int, offset: int, length: int, width: int, height: int, codec: str) -> int:
        """Add an encoded image; returns its index.

        Args:
            source: an index from :meth:`source`.
            offset, length: where its bytes are in that source.
            width, height: its decoded size in pixels (a decode of another size is an error).
            codec: a name of :data:`wsitool.codec.mosaic.CODECS` (``"jpeg"``, ``"png"``, ...).

        Raises:
            ValueError: a negative offset or length, a size below 1, an unknown source.
        """
        if offset < 0 or length < 0 or width < 1 or height < 1 or not 0 <= source < len(self._sources):
            raise ValueError(f"bad image: source {source}, offset {offset}, length {length}, "
                             f"size {width}x{height}")
        self._images.append((source, self._codec(codec), offset, length, width, height))
        return self._flushed_images + len(self._images) - 1

    def _codec(self, codec: str) -> int:
        if codec not in self._codecs:
            self._codecs.append(codec)
        return self._codecs.index(codec)

    def _flush(self) -> None:
        """Move the images and placements added one by one into the row arrays."""
        if self._images:
            self._image_starts.append(self._flushed_images)
            self._image_rows.append(np.array(self._images, np.int64).reshape(-1, 6))
            self._flushed_images += len(self._images)
            self._images = []
        if self._places:
            self._place_rows.append((np.array([p[:2] for p in self._places], np.float64).reshape(-1, 2),
                                     np.array([p[2:7] for p in self._places], np.int64).reshape(-1, 5),
                                     np.array([p[7] for p in self._places], np.float64)))
            self._flushed_places += len(self._places)
            self._places = []

    def _image_size(self, image: int) -> tuple[int, int]:
        if image >= self._flushed_images:
            _s, _c, _o, _l, iw, ih = self._images[image - self._flushed_images]
            return iw, ih
        seg = bisect.bisect_right(self._image_starts, image) - 1
        row = self._image_rows[seg][image - self._image_starts[seg]]
        return int(row[4]), int(row[5])

    def place_images(self, source: int, offsets: Any, lengths: Any, width: int, height: int, codec: str, *,
                     x: Any, y: Any, w: Any, h: Any, z: float | None = None) -> np.ndarray:
        """Add ``n`` images of ``width x height`` pixels, each placed once: :meth:`image` and
        :meth:`place` for many at a time (a grid of stored tiles), without a Python object per image.

        Args:
            source, width, height, codec: as :meth:`image`, for all of them.
            offsets, lengths: ``(n,)`` integers, where each image's bytes are.
            x, y: ``(n,)`` level positions of their top-left corners.
            w, h: ``(n,)`` the painted part of each, ``(0, 0, w, h)`` of the decoded image.
            z: the paint order of all of them (None: after everything added so far, in order).

        Returns:
            ``(n,)`` int64 indices of the images.

        Raises:
            ValueError: arrays of other lengths, a negative offset or length, a size below 1,
                a painted part outside the image, an unknown source.
        """
        cols = [np.asarray(a).reshape(-1) for a in (offsets, lengths, x, y, w, h)]
        n = len(cols[0])
        if any(len(c) != n for c in cols) or width < 1 or height < 1 or not 0 <= source < len(self._sources):
            raise ValueError(f"bad images: source {source}, size {width}x{height}, {[len(c) for c in cols]} values")
        offs, lens, ws, hs = (c.astype(np.int64) for c in (cols[0], cols[1], cols[4], cols[5]))
        if n and (offs.min() < 0 or lens.min() < 0 or ws.min() < 1 or hs.min() < 1
                  or ws.max() > width or hs.max() > height):
            raise ValueError("bad images: a negative offset or length, or a painted part outside an image")
        self._flush()
        rows = np.empty((n, 6), np.int64)
        rows[:, 0], rows[:, 1] = source, self._codec(codec)
        rows[:, 2], rows[:, 3], rows[:, 4], rows[:, 5] = offs, lens, width, height
        first = self._flushed_images
        self._image_starts.append(first)
        self._image_rows.append(rows)
        self._flushed_images += n
        ints = np.zeros((n, 5), np.int64)
        ints[:, 2], ints[:, 3], ints[:, 4] = ws, hs, np.arange(first, first + n)
        order = (np.arange(n, dtype=np.float64) + self._flushed_places) if z is None else np.full(n, float(z))
        xy = np.stack([cols[2].astype(np.float64), cols[3].astype(np.float64)], axis=1)
        self._place_rows.append((xy, ints, order))
        self._flushed_places += n
        return ints[:, 4].copy()

    def place(self, image: int, x: float, y: float, rect: tuple[int, int, int, int] | None = None,
              z: float | None = None) -> None:
        """Paint ``rect`` (``(sx, sy, w, h)`` of the decoded image; None: all of it) of image
        ``image`` with its top-left corner at level position ``(x, y)``, in paint order ``z``
        (None: after everything added so far; higher is painted later, on top).

        Raises:
            ValueError: an unknown image, or a rectangle outside the image or empty.
        """
        if not 0 <= image < self._flushed_images + len(self._images):
            raise ValueError(f"no image {image}")
        iw, ih = self._image_size(image)
        sx, sy, w, h = (0, 0, iw, ih) if rect is None else rect
        if w < 1 or h < 1 or sx < 0 or sy < 0 or sx + w > iw or sy + h > ih:
            raise ValueError(f"rectangle {(sx, sy, w, h)} outside image {image} of {iw}x{ih}")
        order = float(self._flushed_places + len(self._places)) if z is None else float(z)
        self._places.append((float(x), float(y), sx, sy, w, h, image, order))

    def build(self) -> Mosaic:
        """The :class:`Mosaic` (placements sorted by ``z``, stably)."""
        self._flush()
        imgs = np.concatenate(self._image_rows) if self._image_rows else np.zeros((0, 6), np.int64)
        images: dict[str, np.ndarray] = {"source": imgs[:, 0].astype(np.int32), "codec": imgs[:, 1].astype(np.int32),
                  "offset": imgs[:, 2].copy(), "length": imgs[:, 3].copy(),
                  "width": imgs[:, 4].astype(np.int32), "height": imgs[:, 5].astype(np.int32)}
        if self._place_rows:
            xy = np.concatenate([p[0] for p in self._place_rows])
            ints = np.concatenate([p[1] for p in self._place_rows])
            z = np.concatenate([p[2] for p in self._place_rows])
        else:
            xy, ints, z = np.zeros((0, 2)), np.zeros((0, 5), np.int64), np.zeros(0)
        order = np.argsort(z, kind="stable")
        xy, ints = xy[order], ints[order]
        places = {"x": xy[:, 0].copy(), "y": xy[:, 1].copy(), "sx": ints[:, 0].astype(np.int32),
                  "sy": ints[:, 1].astype(np.int32), "w": ints[:, 2].astype(np.int32),
                  "h": ints[:, 3].astype(np.int32), "image": ints[:, 4].copy()}
        return Mosaic(sources=self._sources, codecs=self._codecs, images=images, places=places,
                      samples=self.samples, dtype=self.dtype,
                      decoded=self.decoded if self.decoded is not None else DecodedImages(self.cache_bytes),
                      jpeg_prefix=self.jpeg_prefix, rgb24_whole=self.rgb24_whole)
