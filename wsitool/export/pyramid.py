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

The steps, one function each: the options checked (:class:`~.options.ExportOptions`), the
output names checked (``_checked_output``), the slide opened, the region checked
(``_checked_region``), then one of the multi-channel export (:mod:`.channels`), the copy
(``_export_copy``, :mod:`.passthrough`) or the re-encoding export (``_export_reencoded``).

Output layout of ``tiff`` (as Aperio writes SVS; OpenSlide's Aperio notes,
openslide.org/formats/aperio, quoting Aperio's "Digital Slides and Third-party
Data Interchange" p. 14): IFD 0 the full resolution (tiled); IFD 1 a stripped
JPEG thumbnail, the size of the smallest level
(:func:`~wsitool.export.associated.thumbnail_level`); then the other levels
(tiled, NewSubfileType 0); then ``label`` (LZW, NewSubfileType 1) and
``macro`` (JPEG, NewSubfileType 9), stripped, each with ImageDescription
``Aperio Image Library ...`` and a second line ``label WxH`` / ``macro WxH``.
``ome-tiff``: the pyramid is the first OME Image (levels in SubIFDs);
``label`` and ``macro`` follow as further Images with those ``Name`` s, as
bioformats2raw / raw2ometiff write them.
"""

from __future__ import annotations

import copy
import dataclasses
import errno
import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..errors import InvalidRegionError, ResourceLimitError, TileWarning
from ..ground import outputs as atomic
from ..ground.geometry import level_rect
from ..ground.integers import as_int
from ..ground.limits import get_limits
from ..ground.naming import about
from ..opening import Location, parse_location
from ..read.request import level_index
from ..slide import Slide, open_slide
from .associated import LevelImage, associated_for_export, thumbnail_level
from .channels import export_channels
from .downsample import PyramidBuilder
from .dzi import dzi_paths, write_dzi
from .encode import TileCodec, TileCounter, TileStream, encoded_tiles
from .options import ExportOptions
from .passthrough import CopiedLevel, CopyPlan, plan_copy
from .plan import (
    ExportResult,
    Segment,
    copy_memory_bound,
    memory_bound,
    output_metadata,
    pyramid_dimensions,
    source_level_segments,
)
from .source import StripSource
from .tiff import write_tiff, write_tiff_copy


def export_pyramid(
    source, output, *, format: str = "tiff", tile_size: int = 256, compression: str = "jpeg",
    quality: int = 90, psnr: float | None = None, region: Sequence[int] | None = None, level: int = 0,
    overlap: int = 0, threads: int | None = None, overwrite: bool = False,
    background: Sequence[int] = (255, 255, 255), progress: Callable[[int, int], None] | None = None,
    max_pixels: int | None = None, on_error: str = "raise", label: bool = True, associated: bool = True,
    verify: bool = False, from_source_levels: bool = False, storage_options: dict | None = None,
    overview: bool = True, add_levels: bool = False, mpp: float | tuple[float, float] | None = None,
    dicom_metadata: str | os.PathLike | None = None, dicom_attributes: dict[str, str] | None = None,
) -> ExportResult:
    """Write a slide, or a region of it, as a new tiled pyramid (the steps: the module notes).

    Args:
        source: path of a slide, a slide URL (``http(s)://``, ``s3://``, ``gs://``,
            ``az://``; the output stays local), a :class:`~wsitool.opening.Location`, or an open
            :class:`~wsitool.slide.Slide` (left open).
        output: ``tiff`` / ``ome-tiff``: the file (``out.svs``, ``out.ome.tif``); ``dzi``:
            ``NAME.dzi`` (or ``NAME``, to which ``.dzi`` is added), tiles in ``NAME_files/``;
            ``dicom``: the folder of the series (:mod:`wsitool.export.dicom`), made by the export.
        region: ``(x, y, w, h)``: ``x, y`` the top-left in level-0 pixels, ``w, h`` the size in
            pixels of ``level``; default the whole level.  Parts outside the slide become
            background; it must overlap the slide.
        level: source level read; the output's full resolution is this level's.
        progress: called as ``progress(tiles_done, tiles_total)`` from the calling thread.
        storage_options: for a slide URL, as :func:`~wsitool.slide.open_slide`.

    The other keywords (``format``, ``tile_size``, ``compression``, ``quality``, ``psnr``,
    ``overlap``, ``threads``, ``overwrite``, ``background``, ``max_pixels``, ``on_error``,
    ``label``, ``associated``, ``verify``, ``from_source_levels``, and for ``dicom`` ``overview``,
    ``add_levels``, ``mpp``, ``dicom_metadata``, ``dicom_attributes``) are the fields of
    :class:`~wsitool.export.options.ExportOptions` (each documented there), checked before the
    source is opened.

    Returns :class:`ExportResult`; the output layouts: the module notes, :mod:`~wsitool.export.dzi`.

    Raises:
        InvalidOptionError: an invalid option (a ``ValueError``; see :class:`ExportOptions`).
        OutputIsSourceError: the output is the source slide (also through a link), whatever
            ``overwrite``; also a ``ValueError``.
        InvalidRegionError: bad level or region (also a ``ValueError``).
        ResourceLimitError: the area exceeds ``max_pixels`` (or the default export limit), or
            ``tile_size**2`` the tile limit; checked before anything is read or written.
        OutputExistsError: the output (or a Deep Zoom ``_files`` folder) exists and ``overwrite``
            is False; a ``FileExistsError``.  IsADirectoryError: the output is a directory.
        FileNotFoundError: the source or the output folder does not exist (source first).
        UnsupportedFormatError, CorruptFileError: the source is not readable.
        TileDecodeError: an undecodable source tile (``on_error="raise"``); with ``compression=
            "copy"`` also a copied tile that fails its checks (with ``verify``, its decode).
        WsiError: an encoder failure; an unreadable associated image (``on_error="raise"``).

    Any error leaves nothing under the output name (nor a Deep Zoom ``_files`` folder); an
    existing output replaced with ``overwrite`` is only replaced once the new one is complete.
    """
    t_start = time.perf_counter()
    options = ExportOptions(
        format=format, tile_size=tile_size, compression=compression, quality=quality, psnr=psnr,
        overlap=overlap, threads=threads, overwrite=overwrite, background=background,
        max_pixels=max_pixels, on_error=on_error, label=label, associated=associated, verify=verify,
        from_source_levels=from_source_levels, overview=overview, add_levels=add_levels, mpp=mpp,
        dicom_metadata=dicom_metadata, dicom_attributes=dicom_attributes)
    where = source if isinstance(source, Slide) else parse_location(source, storage_options)
    out = _checked_output(where, output, options)
    slide = open_slide(where) if isinstance(where, Location) else where
    try:
        with about(slide.path):  # (what the reads below raise is named as the facade names it)
            return _export_slide(slide, out, options, level, region, progress, t_start)
    finally:
        if slide is not source:
            slide.close()


@dataclasses.dataclass
class _Output:
    """Where an export goes: ``final`` (the file, or the ``.dzi``), the Deep Zoom tiles folder
    (or None), and the ``sources`` it must never replace (paths, for :mod:`wsitool.ground.outputs`)."""

    final: Path
    files_dir: Path | None
    sources: list[str]


def _checked_output(where: Slide | Location, output, options: ExportOptions) -> _Output:
    """The output names, checked before the slide is read: one rule for every output
    (:mod:`wsitool.ground.outputs`): never the source, an existing output only with ``overwrite``."""
    output = Path(os.fspath(output))
    if options.format == "dzi":
        final, files_dir = dzi_paths(output)
    else:
        final, files_dir = output, None
    remote = isinstance(where, Location) and where.remote
    sources = [] if remote else [where.path if isinstance(where, Slide) else where.target]
    if isinstance(where, Location) and not remote and not os.path.exists(sources[0]):
        # the source first: with the arguments swapped, the error names the missing slide,
        # not the existing one given as the output
        raise FileNotFoundError(errno.ENOENT, "source slide not found", sources[0])
    atomic.check_output(final, sources, options.overwrite, kind="dir" if options.format == "dicom" else "file")
    if files_dir is not None:
        atomic.check_output(files_dir, sources, options.overwrite, kind="dir")
    atomic.clean_stale_partials(final.parent)
    return _Output(final, files_dir, sources)


def _export_slide(slide: Slide, out: _Output, options: ExportOptions, level, region,
                  progress: Callable[[int, int], None] | None, t_start: float) -> ExportResult:
    """The export of the open ``slide``: the output checked again against its path, the
    region checked, then the multi-channel, copy or re-encoding export."""
    if slide.remote is None:
        out.sources.append(slide.path)
    kind = "dir" if options.format == "dicom" else "file"
    atomic.check_output(out.final, out.sources, options.overwrite, kind=kind)
    L, rect = _checked_region(slide, level, region, options.max_pixels)
    if options.format == "dicom":
        from .dicom import export_dicom  # (pydicom's writer: loaded by a DICOM export only, not every command)

        return export_dicom(slide, out.final, L, rect, options, out.sources, progress, t_start)
    if options.format == "ome-tiff" and slide.channels:  # every channel kept, named and coloured
        return export_channels(slide, out.final, L, rect, options, out.sources, progress=progress)
    if options.compression == "copy":
        return _export_copy(slide, out, L, rect, options, progress, t_start)
    return _export_reencoded(slide, out, L, rect, options, progress, t_start)


def _checked_region(slide: Slide, level, region: Sequence[int] | None,
                    max_pixels: int | None) -> tuple[int, tuple[int, int, int, int]]:
    """``(L, (rx, ry, w, h))``: the level index and the region in pixels of that level.

    Raises:
        InvalidRegionError: a bad level, a region that is not 4 integers, of no area, or
            entirely outside the level.
        ResourceLimitError: ``w * h`` over ``max_pixels`` (default: the export limit).
    """
    with about(slide.path):
        L = level_index(level, slide.level_count)
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
    return L, (rx, ry, w, h)


def _export_reencoded(slide: Slide, out: _Output, L: int, rect: tuple[int, int, int, int],
                      options: ExportOptions, progress: Callable[[int, int], None] | None,
                      t_start: float) -> ExportResult:
    """Decode, reduce and re-encode (module notes): segment by segment, then written."""
    T, fmt = options.tile_size, options.format
    if options.from_source_levels:
        segments = source_level_segments(slide.levels, L, rect, T, fmt)
    else:
        segments = [Segment(L, rect, 0, pyramid_dimensions(rect[2], rect[3], T, fmt))]
    dims = [d for seg in segments for d in seg.dims]
    srcs = [StripSource(slide, seg.level, *seg.rect, T, options.thread_count, options.background_rgb,
                        options.on_error) for seg in segments]
    missing = sum(s.missing_tiles() for s in srcs)
    counter = TileCounter(sum(_tile_count(lw, lh, T) for lw, lh in dims), progress)
    extra = _associated(slide, options) if fmt != "dzi" else []
    thumb = _thumbnail(dims, T) if fmt == "tiff" else None
    # segments run one after the other: the bound is that of the largest one's buffers
    bound = max(_strip_bound(slide.levels[seg.level], seg.rect[2], len(seg.dims), options, thumb, extra,
                             tile=T, overlap=options.overlap) for seg in segments)
    codec = TileCodec(fmt, options.compression, options.quality, options.psnr)
    tiles = _segment_tiles(segments, srcs, codec, options, thumb)

    def failed_count() -> int:
        return sum(len(s.failed) for s in srcs)

    # with "fill", the count of painted tiles is recorded in the output once known
    meta = _metadata(slide, L, extra, thumb, failed_count if options.fill else None)
    if out.files_dir is not None:
        nbytes = write_dzi(tiles, out.final, out.files_dir, dims, counter, options,
                           sources=out.sources, painted=meta["painted"])
    else:
        nbytes = write_tiff(tiles, out.final, dims, meta, counter, options, sources=out.sources)
    counter.finish()
    if failed_count():
        first = next(s.first_error for s in srcs if s.first_error)
        warnings.warn(f"{slide.path}: {failed_count()} undecodable source tile(s) painted with "
                      f"the background (first: {first})", TileWarning, stacklevel=_CALLER)
    return ExportResult(
        output=out.final, format=fmt, level_dimensions=[(w, h) for w, h in dims],
        tiles_written=counter.done, tiles_missing=missing, tiles_failed=failed_count(),
        seconds=time.perf_counter() - t_start, tile_size=T, compression=options.compression,
        bytes_written=nbytes, memory_bound=bound,
        source_levels=[seg.level for seg in segments for _ in seg.dims],
    )


#: ``stacklevel`` of the warnings of the export steps (``_export_reencoded``, ``_export_copy``,
#: called by ``_export_slide``, called by ``export_pyramid``): the frame that called export_pyramid
_CALLER = 4


def _tile_count(w: int, h: int, T: int) -> int:
    """Tiles of ``T`` x ``T`` pixels covering a ``w`` x ``h`` level."""
    return -(-w // T) * -(-h // T)


def _associated(slide: Slide, options: ExportOptions) -> list[tuple[str, np.ndarray]]:
    """The label and macro carried over (:func:`~wsitool.export.associated.associated_for_export`),
    its warnings attributed to the caller of :func:`export_pyramid`."""
    return associated_for_export(slide, options.label, options.associated, options.on_error,
                                 stacklevel=_CALLER + 2)


def _thumbnail(dims: Sequence[tuple[int, int]], T: int) -> LevelImage:
    """The level kept for the Aperio thumbnail (:func:`~wsitool.export.associated.thumbnail_level`)."""
    kt = thumbnail_level(dims)
    return LevelImage(kt, dims[kt][0], dims[kt][1], T)


def _strip_bound(slv, width: int, levels: int, options: ExportOptions, thumb: LevelImage | None,
                 extra: list[tuple[str, np.ndarray]], *, tile: int, overlap: int = 0) -> int:
    """:func:`~wsitool.export.plan.memory_bound` of a pyramid of ``levels`` levels ``width``
    pixels wide, read from source level ``slv``."""
    return memory_bound(width, tile, overlap=overlap, levels=levels, threads=options.thread_count,
                        source_tile=(slv.tile_width, slv.tile_height),
                        source_pixel_bytes=slv.samples * slv.dtype.itemsize,
                        source_itemsize=slv.dtype.itemsize,
                        thumbnail_pixels=thumb.image.shape[0] * thumb.image.shape[1] if thumb else 0,
                        associated_pixels=sum(a.shape[0] * a.shape[1] for _, a in extra))


def _metadata(slide: Slide, L: int, extra: list[tuple[str, np.ndarray]], thumb: LevelImage | None,
              painted: Callable[[], int] | None) -> dict:
    """The writers' ``meta`` (:func:`~wsitool.export.plan.output_metadata`, the associated
    images, the thumbnail level and the painted-tile count, a callable or None)."""
    meta = output_metadata(slide, L)
    meta["associated"] = extra
    meta["thumbnail"] = thumb
    meta["painted"] = painted
    return meta


def _export_copy(slide: Slide, out: _Output, L: int, rect: tuple[int, int, int, int],
                 options: ExportOptions, progress: Callable[[int, int], None] | None,
                 t_start: float) -> ExportResult:
    """``compression="copy"``: copied levels (:mod:`.passthrough`), then computed ones."""
    plan = plan_copy(slide, L, *rect, options.format)
    T = plan.tile
    cdims = pyramid_dimensions(plan.base_rect[2], plan.base_rect[3], T, options.format)
    src = StripSource(slide, plan.base, *plan.base_rect, T, options.thread_count, options.background_rgb,
                      options.on_error)
    copied_total = sum(cl.tiles for cl in plan.copied)
    counter = TileCounter(copied_total + sum(_tile_count(lw, lh, T) for lw, lh in cdims[1:]), progress)
    extra = _associated(slide, options)
    thumb = _thumbnail(cdims, T) if options.format == "tiff" else None
    bound = _copy_bound(slide, plan, cdims, options, thumb, extra)
    computed = _computed_tiles(src, plan, cdims, options, thumb)
    failed: set = set()

    def failures() -> set:
        return failed | {(plan.base, c, r) for c, r in src.failed}

    meta = _metadata(slide, L, extra, thumb, (lambda: len(failures())) if options.fill else None)
    nbytes = write_tiff_copy(slide, plan, computed, out.final, cdims, meta, counter, options,
                             failed=failed, sources=out.sources)
    counter.finish()
    bad = failures()
    if bad:
        first = src.first_error or "header, byte range or decode check failed"
        warnings.warn(f"{slide.path}: {len(bad)} source tile(s) that failed their checks were "
                      f"written as missing or painted with the background (first: {first})",
                      TileWarning, stacklevel=_CALLER)
    dims = [(cl.width, cl.height) for cl in plan.copied] + [(w, h) for w, h in cdims[1:]]
    return ExportResult(
        output=out.final, format=options.format, level_dimensions=dims, tiles_written=counter.done,
        tiles_missing=src.missing_tiles() + sum(_missing(cl) for cl in plan.copied[:-1]),
        tiles_failed=len(bad), seconds=time.perf_counter() - t_start,
        tile_size=plan.copied[0].level.tile_width, compression="copy", bytes_written=nbytes,
        memory_bound=bound, tiles_copied=copied_total,
        source_levels=[cl.level.index for cl in plan.copied] + [plan.base] * (len(cdims) - 1),
    )


def _copy_bound(slide: Slide, plan: CopyPlan, cdims, options: ExportOptions, thumb: LevelImage | None,
                extra: list[tuple[str, np.ndarray]]) -> int:
    """The memory bound of a copy: the computed levels' buffers plus the copy's own."""
    base = slide.levels[plan.base]
    bound = _strip_bound(base, plan.base_rect[2], len(cdims), options, thumb, extra, tile=plan.tile)
    return bound + copy_memory_bound(
        [(cl.cols, cl.width, cl.level.tile_height,
          int(np.asarray(cl.level.tiles.bytecounts).max(initial=0))) for cl in plan.copied],
        options.verify, options.thread_count)


def _computed_tiles(src: StripSource, plan: CopyPlan, cdims, options: ExportOptions,
                    thumb: LevelImage | None) -> TileStream:
    """The tiles of the levels computed below the copied ones (the base level skipped)."""
    if len(cdims) == 1 and thumb is None:
        return _no_tiles()  # nothing to compute, no thumbnail: the base level is not decoded at all
    codec = TileCodec(options.format, plan.reencode, options.quality, options.psnr)
    pyramid = PyramidBuilder(cdims, plan.tile, 0, pad_tiles=True, strip=src.strip)
    return encoded_tiles(src, pyramid, codec, options.thread_count, keep=thumb, skip=1)


def _segment_tiles(segments: list[Segment], srcs: list[StripSource], codec: TileCodec,
                   options: ExportOptions, thumb: LevelImage | None) -> TileStream:
    """``(level, col, row, bytes)`` of every output level, segment after segment (each one
    a pyramid of its own, from its source level), levels numbered across the segments."""
    T, OV, fmt = options.tile_size, options.overlap, options.format
    for seg, src in zip(segments, srcs, strict=True):
        pyramid = PyramidBuilder(seg.dims, T, OV, pad_tiles=fmt != "dzi", strip=src.strip)
        keep = None
        if thumb is not None and seg.first <= thumb.level < seg.first + len(seg.dims):
            keep = copy.copy(thumb)  # the same pixels, numbered in the segment
            keep.level = thumb.level - seg.first
        for k, c, r, data in encoded_tiles(src, pyramid, codec, options.thread_count, keep=keep):
            yield seg.first + k, c, r, data


def _no_tiles() -> TileStream:
    yield from ()


def _missing(cl: CopiedLevel) -> int:
    """Missing tiles (offset or byte count 0) in the copied sub-grid of a level."""
    return int(((cl.subgrid(cl.level.tiles.offsets) == 0) | (cl.subgrid(cl.level.tiles.bytecounts) == 0)).sum())
