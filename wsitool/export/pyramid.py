"""``export_pyramid``: the entry point of an export (floor 6).

How the pyramid is built (streaming, never a whole level in memory):

1. **Level 0** of the output is the requested source level (``level``),
   cropped to ``region``.  It is read strip by strip, about one output tile
   row at a time (``R`` rows, the full region width, where ``R`` is the
   largest multiple of the source tile height up to ``tile_size``, or the
   source tile height if that is at most ``2 * tile_size``, so that strips
   follow the source tile rows and each source tile is decoded once; see
   :func:`~wsitool.export.plan.strip_rows`), with
   :meth:`Slide.read_region` straight into the level-0 row window, as the
   ``"rgba"`` read composited onto ``background``:
   ``rgb = (src * a + bg * (255 - a) + 127) // 255``, so pixels outside the
   slide, missing tiles and tiles that failed to decode become background.
   (Sources without alpha are read in ``"rgb"`` mode and the would-be
   transparent pixels painted, which is the same result without the RGBA
   copy; see :class:`~wsitool.export.source.StripSource`.)
2. **Each lower level** halves the one above with an area (box) average.
   Every output pixel of level ``k`` is the mean of the
   ``2**k x 2**k`` block of level-0 pixels it covers, clipped to the image;
   level sizes are ``ceil(W / 2**k) x ceil(H / 2**k)`` (the sizes Deep Zoom
   uses).  It is computed incrementally from pairs of rows as they arrive:
   a vertical then a horizontal 2:1 sum, the last row or column of a level
   alone where it has no partner, so the iterated result is the direct block
   sum.  The sums of levels 1 and below are integer sums of the level-0
   pixels they cover (uint16 to level 4, uint32 below: the halving is integer
   additions, and clipped edge blocks need no weights); as a level's rows of
   sums arrive they are halved into the next level and divided by the pixel
   count, rounding half up, into the level's uint8 pixels, so the error
   against a float64 box filter of the source is at most 0.5 grey level
   (:mod:`~wsitool.export.downsample`; compiled kernel, numpy reference).
3. Each level keeps only a sliding window of rows: the rows of the tile row
   it has not emitted yet (plus ``overlap`` rows either side for Deep Zoom)
   as uint8 pixels, and at most one unpaired row of sums.  While one strip
   is reduced and encoded, a reader thread decodes the next one into a
   staging strip.  As soon as a tile row is complete its tiles are
   cropped (uint8 copies) and handed to a thread pool that encodes them;
   results are consumed in submission order, so each level's tiles come out
   row by row, left to right.
4. TIFF and OME-TIFF pages must be written one after the other, but all
   levels are produced together.  Level-0 tiles stream straight into
   tifffile; encoded tiles of the lower levels go to an anonymous temporary
   file in the destination folder (deleted by the OS even on a crash) and are
   copied into their pages when level 0 is done.  Deep Zoom tiles are written
   as files immediately.
5. Output is written under a hidden temporary name in the destination folder
   and renamed into place only when complete; on any error or
   ``KeyboardInterrupt`` the temporary output is deleted, so nothing is left
   under the final name.
"""

from __future__ import annotations

import copy
import errno
import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from .. import atomic
from ..arguments import as_int
from ..errors import InvalidRegionError, ResourceLimitError, TileWarning
from ..geometry import level_rect
from ..read.request import level_index
from ..settings import get_limits
from ..slide import Slide, open_slide
from ..storage import is_url
from .associated import LevelImage, associated_for_export, thumbnail_level
from .channels import export_channels
from .downsample import PyramidBuilder
from .dzi import dzi_paths, write_dzi
from .encode import TileCodec, TileCounter, encoded_tiles
from .passthrough import plan_copy
from .plan import (
    COMPRESSIONS,
    FORMATS,
    ON_ERROR,
    ExportResult,
    Segment,
    background_color,
    copy_memory_bound,
    memory_bound,
    output_metadata,
    pyramid_dimensions,
    source_level_segments,
)
from .source import StripSource
from .tiff import write_tiff, write_tiff_copy


def export_pyramid(
    source,
    output,
    *,
    format: str = "tiff",
    tile_size: int = 256,
    compression: str = "jpeg",
    quality: int = 90,
    psnr: float | None = None,
    region: Sequence[int] | None = None,
    level: int = 0,
    overlap: int = 0,
    threads: int | None = None,
    overwrite: bool = False,
    background: Sequence[int] = (255, 255, 255),
    progress: Callable[[int, int], None] | None = None,
    max_pixels: int | None = None,
    on_error: str = "raise",
    label: bool = True,
    associated: bool = True,
    verify: bool = False,
    from_source_levels: bool = False,
    storage_options: dict | None = None,
) -> ExportResult:
    """Write a slide, or a region of it, as a new tiled pyramid.

    Args:
        source: path of a slide, a slide URL (``http(s)://``, ``s3://``,
            ``gs://``, ``az://``; the output stays local), or an open
            :class:`~wsitool.slide.Slide` (left open).
        output: output path.  ``tiff`` / ``ome-tiff``: the file (e.g.
            ``out.svs``, ``out.ome.tif``).  ``dzi``: ``NAME.dzi`` (or
            ``NAME``, to which ``.dzi`` is added); tiles go to ``NAME_files/``.
        format: ``"tiff"`` (Aperio-style SVS that OpenSlide reads with vendor
            ``aperio``), ``"ome-tiff"`` (levels in SubIFDs) or ``"dzi"``.
        tile_size: output tile size in pixels; a multiple of 16 for TIFF
            formats, any size >= 1 for Deep Zoom (254 with overlap 1 is the
            usual choice there).
        compression: ``"jpeg"``, ``"jpeg2000"`` (TIFF formats only),
            ``"deflate"`` or ``"none"``; Deep Zoom stores ``deflate`` and
            ``none`` tiles as PNG.  ``"copy"`` (TIFF formats only): the
            output levels are the source's levels from ``level`` down, their
            compressed tiles copied byte for byte with the source's tile
            size, codec tags and downsample steps, never decoded; levels
            below the smallest source level are computed from it (box
            filter) and encoded with the source's kind of codec (JPEG at
            ``quality``, JPEG 2000, deflate or none); ``tile_size`` is then
            ignored.  A ``region`` must be on the level's tile grid.  See
            :mod:`wsitool.export.passthrough` for the tags, the checks each
            copied tile passes and what cannot be copied.
        quality: 1..100.  JPEG quality.  Ignored by ``jpeg2000``, ``deflate``
            and ``none``.
        psnr: JPEG 2000 only: the target PSNR in dB of every tile (OpenJPEG's
            fixed-quality mode), default :data:`~wsitool.export.encode.DEFAULT_PSNR`
            (40 dB); higher is closer to the source and larger (about +5 %
            size per dB on H&E); ``0`` is lossless.  Ignored by the other codecs.
        region: ``(x, y, w, h)``: ``x, y`` the top-left in level-0 pixels,
            ``w, h`` the size in pixels of ``level``; default the whole level.
            Parts outside the slide become background; it must overlap the slide.
        level: source level read; the output's full resolution is this
            level's.  Lower output levels are computed from it (box filter,
            as libvips does) unless ``from_source_levels``.
        overlap: Deep Zoom tile overlap in pixels, at most ``tile_size // 2``
            (0 for TIFF formats).
        threads: encoder threads and decoder threads per strip read
            (default: the CPU count); one more thread reads the next strip
            while the current one is reduced and encoded.
        overwrite: replace an existing output; without it an existing output
            raises ``FileExistsError`` before any work.
        background: ``(r, g, b)`` 0..255 painted where the source is
            transparent (outside the slide, missing or undecodable tiles).
        progress: called as ``progress(tiles_done, tiles_total)`` from the
            calling thread as tiles are written.
        max_pixels: refuse exports of more than this many level-0 pixels
            (``w * h``); default: ``max_export_pixels`` of :mod:`wsitool.settings`
            (``2**33``).
        on_error: ``"raise"`` (default): the first undecodable source tile
            stops the export with its :class:`TileDecodeError` and nothing is
            left under the output name.  ``"fill"``: undecodable tiles are
            painted with ``background``, a :class:`~wsitool.errors.TileWarning`
            gives their count, ``tiles_failed`` counts them, and the count is
            recorded in the output (:data:`PAINTED_KEY`; read it back with
            :func:`painted_tiles`; ``wsitool info`` shows it).
        label: carry the source's ``label`` image over (``tiff`` and
            ``ome-tiff``; labels often show patient identifiers: pass False
            to drop it).
        associated: carry the source's associated images (``label`` and
            ``macro``) over; False drops both.  The ``tiff`` output always
            gets a thumbnail made from its own pyramid (the Aperio layout has
            one); the source's thumbnail is not copied.  Deep Zoom has no
            associated images.
        verify: with ``compression="copy"``, also decode every copied tile
            (through :meth:`Slide.read_region`, one tile row at a time) so
            that a tile whose header passes but whose data does not decode
            fails the export (or, with ``on_error="fill"``, is written as a
            missing tile and counted); without it copied tiles get the read
            path's byte-range and header checks only.  Ignored otherwise.
        from_source_levels: (``tiff`` / ``ome-tiff``, re-encoding) output
            level ``k`` is read from the source level whose downsample
            against ``level`` is ``2**k`` (within 2 %), and the output levels
            below it are halved from that level instead of from ``level``
            (see :func:`~wsitool.export.plan.source_level_segments`: a
            region must start on that level's grid; such an output level has
            the size halving gives, or a pixel less at the slide's edge).
            The scanner's own lower levels are then kept (re-encoded once)
            rather than recomputed; each source level read costs its decode.
            ``compression="copy"`` always uses the source's levels.
        storage_options: for a slide URL, as :func:`~wsitool.slide.open_slide`
            (credentials, endpoint, timeouts); ignored for an open Slide.

    Output layout of ``tiff`` (as Aperio writes SVS; OpenSlide's Aperio
    notes, openslide.org/formats/aperio, quoting Aperio's "Digital Slides
    and Third-party Data Interchange" p. 14): IFD 0 the full resolution
    (tiled); IFD 1 a stripped JPEG thumbnail, the size of the smallest level
    (:func:`~wsitool.export.associated.thumbnail_level`);
    then the other levels (tiled, NewSubfileType 0); then ``label`` (LZW,
    NewSubfileType 1) and ``macro`` (JPEG, NewSubfileType 9), stripped, each
    with ImageDescription ``Aperio Image Library ...`` and a second line
    ``label WxH`` / ``macro WxH``.  ``ome-tiff``: the pyramid is the first
    OME Image (levels in SubIFDs); ``label`` and ``macro`` follow as
    further Images with those ``Name`` s, as bioformats2raw / raw2ometiff
    write them.

    Returns:
        :class:`ExportResult`.

    Raises:
        ValueError: an invalid option (format, compression, tile size,
            quality, psnr, overlap, threads, background).
        OutputIsSourceError: the output is the source slide (same file, also
            through a link), whatever ``overwrite``; also a ``ValueError``.
        InvalidRegionError: bad level or region (also a ``ValueError``).
        ResourceLimitError: the exported area exceeds ``max_pixels`` (or the
            default export limit), checked before anything is read or written.
        OutputExistsError: the output (or a Deep Zoom ``_files`` folder)
            exists and ``overwrite`` is False; a ``FileExistsError``.
        IsADirectoryError: the output path (the ``.dzi`` file for Deep Zoom) is
            a directory and ``overwrite`` is True.
        FileNotFoundError: the source or the output folder does not exist (the
            source is checked first, before the output).
        UnsupportedFormatError, CorruptFileError: the source is not readable.
        TileDecodeError: a source tile cannot be decoded (``on_error="raise"``);
            with ``compression="copy"`` also a copied tile that fails its
            checks (or, with ``verify``, its decode).
        WsiError: an encoder failure; an associated image that cannot be
            read (``on_error="raise"``).

    Any error leaves nothing under the output name (nor a Deep Zoom
    ``_files`` folder); an existing output replaced with ``overwrite``
    is only replaced once the new one is complete.
    """
    t_start = time.perf_counter()
    fmt = str(format).lower()
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    compression = str(compression).lower()
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    if fmt == "dzi" and compression == "jpeg2000":
        raise ValueError("Deep Zoom tiles are JPEG or PNG: use compression jpeg, deflate or none")
    if from_source_levels and fmt == "dzi":
        raise ValueError("from_source_levels applies to tiff and ome-tiff: Deep Zoom level sizes "
                         "are fixed by halving the full size")
    if fmt == "dzi" and compression == "copy":
        raise ValueError("compression copy writes TIFF formats (tiff, ome-tiff); Deep Zoom tiles are "
                         "re-encoded: use compression jpeg, deflate or none")
    T = as_int(tile_size, "tile_size", error=ValueError)
    if fmt == "dzi":
        if T < 1:
            raise ValueError(f"tile_size must be >= 1, got {T}")
    elif T < 16 or T % 16:
        raise ValueError(f"tile_size must be a positive multiple of 16 for TIFF (TIFF 6.0 section 15), got {T}")
    if T * T > get_limits().max_tile_pixels:
        raise ResourceLimitError(f"tile_size {T} exceeds the max_tile_pixels limit {get_limits().max_tile_pixels}")
    q = as_int(quality, "quality", error=ValueError)
    if not 1 <= q <= 100:
        raise ValueError(f"quality must be 1..100, got {q}")
    if psnr is not None:
        try:
            psnr = float(psnr)
        except (TypeError, ValueError):
            raise ValueError(f"psnr must be a number of dB (0: lossless), got {psnr!r}") from None
        if not 0 <= psnr <= 200:
            raise ValueError(f"psnr must be 0 (lossless) .. 200 dB, got {psnr:g}")
    OV = as_int(overlap, "overlap", error=ValueError)
    if OV < 0:
        raise ValueError(f"overlap must be >= 0, got {OV}")
    if OV and fmt != "dzi":
        raise ValueError("overlap applies to Deep Zoom (format dzi) only")
    if 2 * OV > T:
        raise ValueError(f"overlap must be at most half the tile size ({T // 2}), got {OV}")
    nthreads = (os.cpu_count() or 1) if threads is None else as_int(threads, "threads", error=ValueError)
    if nthreads < 1:
        raise ValueError(f"threads must be >= 1, got {nthreads}")
    bg = background_color(background)
    if max_pixels is not None and as_int(max_pixels, "max_pixels", error=ValueError) <= 0:
        raise ValueError(f"max_pixels must be positive, got {max_pixels}")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")


    output = Path(os.fspath(output))
    if fmt == "dzi":
        final, files_dir = dzi_paths(output)
    else:
        final, files_dir = output, None
    # One rule for every output (wsitool.atomic): never the source, an existing
    # output only with overwrite; checked before the slide is read.
    remote = not isinstance(source, Slide) and is_url(source)
    sources = [] if remote else [source.path if isinstance(source, Slide) else os.fspath(source)]
    if not isinstance(source, Slide) and not remote and not os.path.exists(sources[0]):
        # the source first: with the arguments swapped, the error names the missing slide,
        # not the existing one given as the output
        raise FileNotFoundError(errno.ENOENT, "source slide not found", sources[0])
    atomic.check_output(final, sources, overwrite)
    if files_dir is not None:
        atomic.check_output(files_dir, sources, overwrite, kind="dir")
    atomic.clean_stale_partials(final.parent)

    own = not isinstance(source, Slide)
    slide = open_slide(source, storage_options=storage_options) if own else source
    try:
        if slide.remote is None:
            sources.append(slide.path)
        atomic.check_output(final, sources, overwrite)
        L = level_index(level, slide.level_count, slide.path)
        lv = slide.levels[L]
        if region is None:
            x0, y0, w, h = 0, 0, lv.width, lv.height
        else:
            try:
                x0, y0, w, h = (as_int(v, "region", error=ValueError) for v in region)
            except (TypeError, ValueError) as exc:
                raise InvalidRegionError(f"{slide.path}: region must be 4 integers X Y W H ({exc})") from None
        if w <= 0 or h <= 0:
            raise InvalidRegionError(f"{slide.path}: region size must be positive, got {w}x{h}")
        rx, ry = level_rect(lv, x0, y0)
        if rx >= lv.width or ry >= lv.height or rx + w <= 0 or ry + h <= 0:
            raise InvalidRegionError(
                f"{slide.path}: region {x0},{y0} {w}x{h} (level {L}) lies outside the "
                f"{lv.width}x{lv.height} level"
            )
        limit = max_pixels if max_pixels is not None else get_limits().max_export_pixels
        if w * h > limit:
            raise ResourceLimitError(
                f"{slide.path}: export of {w}x{h} ({w * h} pixels) exceeds the limit of {limit} "
                "pixels (raise it with --max-pixels / max_pixels=)"
            )
        if fmt == "ome-tiff" and slide.channels:  # every channel kept, named and coloured
            return export_channels(slide, final, L, (rx, ry, w, h), T, compression, q, sources,
                                   label=label, associated=associated, on_error=on_error,
                                   threads=nthreads, overwrite=overwrite, progress=progress)
        if compression == "copy":
            return _export_copy(slide, final, fmt, L, (rx, ry, w, h), q, psnr, nthreads, bg, overwrite,
                                progress, on_error, label, associated, bool(verify), sources, t_start)
        if from_source_levels:
            segments = source_level_segments(slide.levels, L, (rx, ry, w, h), T, fmt)
        else:
            segments = [Segment(L, (rx, ry, w, h), 0, pyramid_dimensions(w, h, T, fmt))]
        dims = [d for seg in segments for d in seg.dims]
        srcs = [StripSource(slide, seg.level, *seg.rect, T, nthreads, bg, on_error) for seg in segments]
        missing = sum(s.missing_tiles() for s in srcs)
        total = sum(-(-lw // T) * -(-lh // T) for lw, lh in dims)
        counter = TileCounter(total, progress)
        extra = associated_for_export(slide, label, associated, on_error) if fmt != "dzi" else []
        thumb = None
        if fmt == "tiff":
            kt = thumbnail_level(dims)
            thumb = LevelImage(kt, dims[kt][0], dims[kt][1], T)
        # segments run one after the other: the bound is that of the largest one's buffers
        bound = max(
            memory_bound(seg.rect[2], T, overlap=OV, levels=len(seg.dims), threads=nthreads,
                         source_tile=(slv.tile_width, slv.tile_height),
                         source_pixel_bytes=slv.samples * slv.dtype.itemsize,
                         source_itemsize=slv.dtype.itemsize,
                         thumbnail_pixels=thumb.image.shape[0] * thumb.image.shape[1] if thumb else 0,
                         associated_pixels=sum(a.shape[0] * a.shape[1] for _, a in extra))
            for seg in segments for slv in (slide.levels[seg.level],))
        codec = TileCodec(fmt, compression, q, psnr)
        tiles = _segment_tiles(segments, srcs, codec, T, OV, fmt, nthreads, thumb)
        meta = output_metadata(slide, L)
        meta["associated"] = extra
        meta["thumbnail"] = thumb
        def failed_count():
            return sum(len(s.failed) for s in srcs)

        # with "fill", the count of painted tiles is recorded in the output once known
        meta["painted"] = failed_count if on_error == "fill" else None
        if fmt == "dzi":
            nbytes = write_dzi(tiles, final, files_dir, dims, T, OV, compression, overwrite, counter,
                                sources=sources, painted=meta["painted"])
        else:
            nbytes = write_tiff(tiles, final, fmt, dims, T, compression, q, meta, overwrite, counter,
                                 sources=sources, psnr=psnr)
        counter.finish()
        if failed_count():
            first = next(s.first_error for s in srcs if s.first_error)
            warnings.warn(f"{slide.path}: {failed_count()} undecodable source tile(s) painted with "
                          f"the background (first: {first})", TileWarning, stacklevel=2)
        return ExportResult(
            output=final, format=fmt, level_dimensions=[tuple(d) for d in dims],
            tiles_written=counter.done, tiles_missing=missing, tiles_failed=failed_count(),
            seconds=time.perf_counter() - t_start, tile_size=T, compression=compression,
            bytes_written=nbytes, memory_bound=bound,
            source_levels=[seg.level for seg in segments for _ in seg.dims],
        )
    finally:
        if own:
            slide.close()




def _export_copy(slide, final: Path, fmt: str, L: int, rect, quality: int, psnr, nthreads: int, bg,
                 overwrite: bool, progress, on_error: str, label: bool, associated: bool,
                 verify: bool, sources: list, t_start: float) -> ExportResult:
    """``compression="copy"``: copied levels (:mod:`.passthrough`), then computed ones."""
    plan = plan_copy(slide, L, *rect, fmt)
    base = slide.levels[plan.base]
    bx, by, bw, bh = plan.base_rect
    T = plan.tile
    cdims = pyramid_dimensions(bw, bh, T, fmt)
    src = StripSource(slide, plan.base, bx, by, bw, bh, T, nthreads, bg, on_error)
    copied_total = sum(cl.tiles for cl in plan.copied)
    total = copied_total + sum(-(-lw // T) * -(-lh // T) for lw, lh in cdims[1:])
    counter = TileCounter(total, progress)
    extra = associated_for_export(slide, label, associated, on_error)
    thumb = None
    if fmt == "tiff":
        kt = thumbnail_level(cdims)
        thumb = LevelImage(kt, cdims[kt][0], cdims[kt][1], T)
    bound = memory_bound(bw, T, levels=len(cdims), threads=nthreads,
                         source_tile=(base.tile_width, base.tile_height),
                         source_pixel_bytes=base.samples * base.dtype.itemsize,
                         source_itemsize=base.dtype.itemsize,
                         thumbnail_pixels=thumb.image.shape[0] * thumb.image.shape[1] if thumb else 0,
                         associated_pixels=sum(a.shape[0] * a.shape[1] for _, a in extra))
    bound += copy_memory_bound(
        [(cl.cols, cl.width, cl.level.tile_height,
          int(np.asarray(cl.level.tiles.bytecounts).max(initial=0))) for cl in plan.copied],
        verify, nthreads)
    codec = TileCodec(fmt, plan.reencode, quality, psnr)
    pyramid = PyramidBuilder(cdims, T, 0, pad_tiles=True, strip=src.strip)
    if len(cdims) > 1 or thumb is not None:
        computed = encoded_tiles(src, pyramid, codec, nthreads, keep=thumb, skip=1)
    else:  # nothing to compute, no thumbnail: the base level is not decoded at all
        computed = _no_tiles()
    meta = output_metadata(slide, L)
    meta["associated"] = extra
    meta["thumbnail"] = thumb
    failed: set = set()

    def failures() -> set:
        return failed | {(plan.base, c, r) for c, r in src.failed}

    meta["painted"] = (lambda: len(failures())) if on_error == "fill" else None
    nbytes = write_tiff_copy(slide, plan, computed, final, fmt, cdims, quality, meta, overwrite,
                             counter, on_error=on_error, verify=verify, threads=nthreads,
                             failed=failed, sources=sources, psnr=psnr)
    counter.finish()
    bad = failures()
    if bad:
        first = src.first_error or "header, byte range or decode check failed"
        warnings.warn(f"{slide.path}: {len(bad)} source tile(s) that failed their checks were "
                      f"written as missing or painted with the background (first: {first})",
                      TileWarning, stacklevel=3)
    dims = [(cl.width, cl.height) for cl in plan.copied] + [tuple(d) for d in cdims[1:]]
    return ExportResult(
        output=final, format=fmt, level_dimensions=dims, tiles_written=counter.done,
        tiles_missing=src.missing_tiles() + sum(_missing(cl) for cl in plan.copied[:-1]),
        tiles_failed=len(bad), seconds=time.perf_counter() - t_start,
        tile_size=plan.copied[0].level.tile_width, compression="copy", bytes_written=nbytes,
        memory_bound=bound, tiles_copied=copied_total,
        source_levels=[cl.level.index for cl in plan.copied] + [plan.base] * (len(cdims) - 1),
    )


def _segment_tiles(segments, srcs, codec, T: int, OV: int, fmt: str, threads: int,
                   thumb: LevelImage | None):
    """``(level, col, row, bytes)`` of every output level, segment after segment (each one
    a pyramid of its own, from its source level), levels numbered across the segments."""
    for seg, src in zip(segments, srcs, strict=True):
        pyramid = PyramidBuilder(seg.dims, T, OV, pad_tiles=fmt != "dzi", strip=src.strip)
        keep = None
        if thumb is not None and seg.first <= thumb.level < seg.first + len(seg.dims):
            keep = copy.copy(thumb)  # the same pixels, numbered in the segment
            keep.level = thumb.level - seg.first
        for k, c, r, data in encoded_tiles(src, pyramid, codec, threads, keep=keep):
            yield seg.first + k, c, r, data


def _no_tiles():
    yield from ()


def _missing(cl) -> int:
    """Missing tiles (offset or byte count 0) in the copied sub-grid of a level."""
    return int(((cl.subgrid(cl.level.tiles.offsets) == 0) | (cl.subgrid(cl.level.tiles.bytecounts) == 0)).sum())
