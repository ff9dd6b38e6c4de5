"""Encoding output tiles on a thread pool, in submission order (floor 6).

Codecs: JPEG tiles are encoded by libjpeg-turbo through imagecodecs
(``jpeg8_encode``, baseline, no Huffman optimisation, JFIF YCbCr: the same bytes
nvImageCodec's CPU encoder writes for the same quality and subsampling, checked
by ``tests/export/test_encode.py``, in about 0.87 of its CPU time, with the GIL
released and no per-thread encoder to hold).  JPEG 2000 tiles are encoded by
OpenJPEG through imagecodecs (``jpeg2k_encode``, a raw code stream, ISO/IEC
15444-1 Annex A, as TIFF compressions 33005 and 34712 hold; the GIL released).
Their quality is a target PSNR in dB (:data:`DEFAULT_PSNR`; OpenJPEG's
fixed-quality mode, one quality layer, the irreversible 9/7 wavelet), or
lossless (``psnr=0``: the reversible 5/3 wavelet).  Deflate and uncompressed
TIFF tiles, and PNG tiles of Deep Zoom (``deflate`` / ``none``), are encoded
with imagecodecs.
"""

from __future__ import annotations

import collections
import contextvars
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import imagecodecs
import numpy as np

from ..errors import WsiError
from .associated import LevelImage
from .downsample import PyramidBuilder
from .plan import queue_depth
from .source import StripSource

#: Default target PSNR (dB) of JPEG 2000 output tiles.  At 40 dB the shared TCGA
#: JPEG 2000 slide (Aperio "J2K/KDU Q=70", 3.90 MB) re-exports to 4.18 MB (6 levels);
#: 40 dB is about what JPEG at quality 90 gives on H&E tissue.
DEFAULT_PSNR = 40.0


#: An output tile: ``(level, col, row, encoded bytes)``.
Tile = tuple[int, int, int, bytes]

#: The tiles of an export as the writers take them: a generator (closed on an error).
TileStream = Generator[Tile, None, None]


class TileCodec:
    """Encodes one output tile (``(h, w, 3)`` uint8, C-contiguous) to bytes.

    Runs on any thread (the encoders keep no state between tiles).

    ``psnr`` (JPEG 2000 only): the target PSNR in dB of each tile against its
    pixels, > 0; 0 for lossless.  ``quality`` (JPEG only): 1..100.
    """

    def __init__(self, fmt: str, compression: str, quality: int, psnr: float | None = None):
        self.fmt = fmt
        self.compression = compression
        self.quality = quality
        self.psnr = DEFAULT_PSNR if psnr is None else float(psnr)
        if compression == "jpeg":
            self._subsampling = "444" if jpeg_subsampling(quality) == (1, 1) else "420"

    def encode(self, tile: np.ndarray) -> bytes:
        """Encoded bytes of ``tile`` ((h, w, 3) uint8) for this format and compression.

        Raises:
            WsiError: the encoder failed or produced nothing.
        """
        if self.compression == "jpeg":
            try:
                # (imagecodecs' stubs say bytes | bytearray: bytearray only when given one as out=)
                return cast(bytes, imagecodecs.jpeg8_encode(tile, level=self.quality, subsampling=self._subsampling))
            except Exception as exc:  # imagecodecs.JpegError and friends
                raise WsiError(f"libjpeg-turbo could not encode a {tile.shape[1]}x{tile.shape[0]} "
                               f"JPEG tile: {exc}") from None
        if self.compression == "jpeg2000":
            try:
                if self.psnr > 0:
                    return cast(bytes, imagecodecs.jpeg2k_encode(  # level: the PSNR in dB, a float
                        tile, level=self.psnr,  # type: ignore[arg-type]  # imagecodecs' stub: int only
                        codecformat="j2k", reversible=False, numthreads=1))
                return cast(bytes, imagecodecs.jpeg2k_encode(tile, level=0, codecformat="j2k", reversible=True,
                                                             numthreads=1))
            except Exception as exc:  # imagecodecs.Jpeg2kError
                raise WsiError(f"OpenJPEG could not encode a {tile.shape[1]}x{tile.shape[0]} "
                               f"JPEG 2000 tile: {exc}") from None
        if self.fmt == "dzi":  # PNG tiles (deflate, or stored blocks for "none")
            return cast(bytes, imagecodecs.png_encode(tile, level=6 if self.compression == "deflate" else 0))
        if self.compression == "deflate":
            diff = tile.copy()
            diff[:, 1:] -= tile[:, :-1]  # TIFF predictor 2, modulo 256
            # (imagecodecs takes any buffer; its stub names bytes only on some Python versions)
            return cast(bytes, imagecodecs.deflate_encode(cast(Any, diff), level=6))
        return tile.tobytes()


def jpeg_subsampling(quality: int) -> tuple[int, int]:
    """Chroma subsampling of JPEG tiles: none at quality >= 90 (as libvips does), else 2x2."""
    return (1, 1) if quality >= 90 else (2, 2)


def tiff_compression(fmt: str, compression: str, quality: int,
                     psnr: float | None = None) -> tuple[dict, str]:
    """tifffile page keyword arguments for pre-encoded tiles, and the Aperio kind text
    (``psnr``: JPEG 2000's target in dB, 0 lossless; default :data:`DEFAULT_PSNR`)."""
    if compression == "jpeg":
        sub = jpeg_subsampling(quality)
        return ({"compression": "jpeg", "photometric": "ycbcr", "subsampling": sub},
                f"JPEG/YCbCr Q={quality}")
    if compression == "jpeg2000":
        code = 33005 if fmt == "tiff" else 34712
        psnr = DEFAULT_PSNR if psnr is None else float(psnr)
        return {"compression": code, "photometric": "rgb"}, \
            ("J2K/RGB lossless" if psnr <= 0 else f"J2K/RGB PSNR={psnr:g}dB")
    if compression == "deflate":
        return {"compression": "adobe_deflate", "photometric": "rgb", "predictor": 2}, "Deflate"
    return {"compression": None, "photometric": "rgb"}, "Raw"


class TileCounter:
    def __init__(self, total: int, progress):
        self.total = total
        self.done = 0
        self.progress = progress
        if progress is not None:
            progress(0, total)

    def add(self, n: int = 1) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.total)

    def finish(self) -> None:
        if self.done != self.total:  # pragma: no cover - internal consistency
            raise RuntimeError(f"wrote {self.done} tiles, expected {self.total}")


def encoded_tiles(src: StripSource, pyramid: PyramidBuilder, codec: TileCodec, threads: int,
                   keep: LevelImage | None = None, skip: int = 0) -> TileStream:
    """Every output tile as ``(level, col, row, bytes)``; each level in row-major order.

    ``keep``: the tiles of its level are also copied into it (the pixels of
    the Aperio thumbnail, :class:`LevelImage`).  ``skip``: the tiles of the
    levels before it are not encoded nor yielded (only given to ``keep``):
    with ``compression="copy"`` the pyramid's level 0 is the last copied
    level, whose tiles are the source's.
    """
    H = pyramid.dims[0][1]
    W = pyramid.dims[0][0]
    q = queue_depth(threads)
    pending: collections.deque = collections.deque()
    strips = []
    sy = 0
    while sy < H:
        rows = min(src.first if sy == 0 else src.strip, H - sy)
        strips.append((sy, rows))
        sy += rows
    # One strip ahead: the reader thread decodes strip i + 1 into ``staging`` while
    # this thread reduces strip i and the encoders work on its tiles.
    staging = np.empty((min(src.strip, H), W, 3), np.uint8)
    reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wsitool-read")
    executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="wsitool-encode")
    ahead = None
    try:
        lv0 = pyramid.levels[0]
        if strips:
            ahead = reader.submit(contextvars.copy_context().run, src.read, strips[0][0], staging[:strips[0][1]])
        for i, (_sy, rows) in enumerate(strips):
            assert ahead is not None  # submitted before the loop and at the end of each step
            ahead.result()
            ahead = None
            lv0.tail(rows)[...] = staging[:rows]
            lv0.n += rows
            if i + 1 < len(strips):
                ny, nrows = strips[i + 1]
                ahead = reader.submit(contextvars.copy_context().run, src.read, ny, staging[:nrows])
            for k, c, r, tile in pyramid.advance():
                if keep is not None and k == keep.level:
                    keep.add(c, r, tile)
                if k < skip:
                    continue
                pending.append((k, c, r, executor.submit(contextvars.copy_context().run, codec.encode, tile)))
                del tile
                while len(pending) >= q:
                    k2, c2, r2, fut = pending.popleft()
                    yield k2, c2, r2, fut.result()
        while pending:
            k2, c2, r2, fut = pending.popleft()
            yield k2, c2, r2, fut.result()
    finally:
        for *_, fut in pending:
            fut.cancel()
        if ahead is not None:
            ahead.cancel()
        reader.shutdown(wait=True, cancel_futures=True)  # no read left writing into staging
        executor.shutdown(wait=True, cancel_futures=True)
