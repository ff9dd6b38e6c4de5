"""The DICOM export of one slide: a folder holding one series, one file per instance (floor 6).

Instances (each file named after it): ``level-K.dcm`` for output level ``K``,
one VOLUME instance per source level from the exported one down, at that
level's size (no level added or dropped: fractional steps such as 4443 ->
2221 are kept); with ``add_levels`` the levels below the smallest one, each
half the one above (``ceil``), down to the first that fits in one tile,
computed from the smallest source level as the TIFF export computes its
lower levels (:mod:`wsitool.export.downsample`); then ``thumbnail.dcm``,
``label.dcm`` and ``overview.dcm`` from the source's thumbnail, label and
macro (where it has them, and unless left out: ``label=False`` leaves out the
label and the overview, which usually shows the label; ``overview=False`` the
overview alone; ``associated=False`` both).

Frames (:mod:`.frames`): with ``compression="copy"`` each source level's
tiles are passed through, with the source's tile size; a level with missing
tiles (offset or byte count 0) is written TILED_SPARSE, with a position for
each frame, others TILED_FULL.  Otherwise each level is read from its own
source level, strip by strip (:class:`~wsitool.export.source.StripSource`),
and encoded in ``tile_size`` frames (edge frames padded with the background).
The associated images are single JPEG frames (quality ``quality``, coded as the levels' re-encoded frames).

The folder is made as a partial (:mod:`wsitool.ground.outputs`) and renamed
into place when every instance is written: on any error nothing is left.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from ...errors import InvalidOptionError, InvalidRegionError, UnsupportedFormatError, WsiError
from ...ground import outputs as atomic
from ...ground.bitstream import j2k_main_header, jpeg_frame_size, jpeg_with_prefix
from ...model import PyramidLevel
from ...slide import Slide, pyramid_levels
from ..downsample import PyramidBuilder
from ..encode import TileCodec, TileCounter, encoded_tiles
from ..options import ExportOptions
from ..passthrough import CopiedLevel, TileChecker, copied_tiles
from ..plan import ExportResult, memory_bound, output_metadata, pyramid_dimensions
from ..source import StripSource
from ..storedruns import POOL, RUN_BYTES, stored_runs, supported
from .frames import JPEG_BASELINE, FrameCoding, FrameEncoder, passthrough_coding, reencode_coding
from .framestream import BATCH_BYTES
from .metadata import user_dataset
from .modules import ImageGeometry, SeriesFacts, acquisition_datetime, instance_dataset
from .writer import offset_table, write_instance

#: associated image of the source -> (Image Type flavour, file name)
ASSOCIATED = (("thumbnail", "THUMBNAIL"), ("label", "LABEL"), ("macro", "OVERVIEW"))


def srgb_profile() -> bytes:
    """An sRGB ICC profile (Pillow's ImageCms), for sources without a profile of their own."""
    from PIL import ImageCms

    return bytes(ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes())


class _Encoder(TileCodec):
    """A :class:`~wsitool.export.encode.TileCodec` that encodes DICOM frames (:class:`.frames.FrameEncoder`)."""

    def __init__(self, options: ExportOptions, compression: str):
        super().__init__("tiff", "none", options.quality, options.psnr)
        self.frames = FrameEncoder(compression, options.quality, options.psnr)

    def encode(self, tile: np.ndarray) -> bytes:
        return self.frames.encode(tile)


def export_dicom(slide: Slide, final: Path, L: int, rect: tuple[int, int, int, int], options: ExportOptions,
                 sources: list[str], progress: Callable[[int, int], None] | None, t_start: float) -> ExportResult:
    """Write the series of level ``L`` (and the levels below it) of ``slide`` into the new folder ``final``.

    Raises:
        InvalidRegionError: ``rect`` is not the whole level (a DICOM export writes whole levels).
        InvalidOptionError: no pixel spacing (the source has no MPP and ``options.mpp`` is None);
            ``on_error="fill"`` with ``compression="copy"``.
        UnsupportedFormatError: ``compression="copy"`` and a level whose tiles cannot pass through
            (:mod:`.frames`), raised before anything is written.
        TileDecodeError: an undecodable or (copy) failing source tile.
        OutputExistsError, OSError: as :func:`~wsitool.export.export_pyramid`.
    """
    levels = pyramid_levels(slide)[L:]
    lv0 = levels[0]
    if rect != (0, 0, lv0.width, lv0.height):
        raise InvalidRegionError(f"{slide.path}: a DICOM export writes whole levels: --region is not supported")
    copy = options.compression == "copy"
    if copy and options.fill:
        raise InvalidOptionError("on_error fill does not apply to a DICOM export with compression copy "
                                 "(a passed-through tile is never painted)")
    meta = output_metadata(slide, L)
    mpp = options.mpp if options.mpp is not None else meta["mpp"]
    if not mpp:
        raise InvalidOptionError("the slide has no pixel spacing (MPP), which every DICOM WSI "
                                 "instance carries: give it with --mpp")
    if isinstance(mpp, (int, float)):
        mpp = (float(mpp), float(mpp))
    acquired = meta.get("acquired")
    facts = SeriesFacts(user_dataset(options.dicom_metadata, dict(options.dicom_attributes or ())),
                        (float(mpp[0]), float(mpp[1])), (lv0.width, lv0.height), meta.get("mag"),
                        meta.get("icc") or srgb_profile(), acquisition_datetime(acquired))
    plans = [_plan_level(slide, lv, options, k) for k, lv in enumerate(levels)]  # refusals before writing
    extra = _added_dims(plans[-1], options)
    associated = _associated(slide, options)
    T = _added_tile(plans[-1], options)
    total = sum(p.counted for p in plans) + sum(-(-w // T) * -(-h // T) for w, h in extra)
    counter = TileCounter(total, progress)
    partial = atomic.create_dir(final, sources)
    with partial:
        nbytes = 0
        for k, plan in enumerate(plans):
            nbytes += _write_level(partial.path, facts, plan, k, options, counter)
        if extra:
            nbytes += _write_added(partial.path, slide, facts, plans[-1], extra, len(plans), options, counter)
        for number, (name, flavor, image) in enumerate(associated, len(plans) + len(extra) + 1):
            nbytes += _write_associated(partial.path, facts, name, flavor, image, number, options)
        partial.commit(options.overwrite)
    counter.finish()
    dims = [(p.level.width, p.level.height) for p in plans] + list(extra)
    return ExportResult(
        output=final, format="dicom", level_dimensions=dims, tiles_written=counter.done,
        tiles_missing=sum(p.missing for p in plans), tiles_failed=sum(len(p.failed) for p in plans),
        seconds=time.perf_counter() - t_start, tile_size=plans[0].tile[0], compression=options.compression,
        bytes_written=nbytes, memory_bound=_bound(plans, options, associated),
        tiles_copied=sum(p.counted for p in plans) if copy else 0,
        source_levels=[p.level.index for p in plans] + [plans[-1].level.index] * len(extra))


class _LevelPlan:
    """One VOLUME instance: its source level, frame coding, tile size and frames (present tiles)."""

    def __init__(self, slide: Slide, level: PyramidLevel, coding: FrameCoding, tile: tuple[int, int],
                 positions: list[tuple[int, int]] | None, frames: int, missing: int, bound: int):
        self.slide = slide
        self.level = level
        self.coding = coding
        self.tile = tile
        self.positions = positions
        self.frames = frames
        self.missing = missing
        self.bound = bound
        self.failed: set = set()
        #: tiles the progress counter counts (passthrough: every tile of the grid, missing ones too)
        self.counted = frames + missing


def _present(lv: PyramidLevel) -> np.ndarray:
    """``(tiles_down, tiles_across)`` bool: which tiles the level has (offset and byte count not 0)."""
    n = lv.tiles_across * lv.tiles_down
    offs = np.asarray(lv.tiles.offsets[:n], np.uint64)
    cnts = np.asarray(lv.tiles.bytecounts[:n], np.uint64)
    return ((offs != 0) & (cnts != 0)).reshape(lv.tiles_down, lv.tiles_across)


def _first_tile(lv: PyramidLevel, present: np.ndarray) -> bytes | None:
    hits = np.flatnonzero(present.ravel())
    if not hits.size:
        return None
    i = int(hits[0])
    off, cnt = int(lv.tiles.offsets[i]), int(lv.tiles.bytecounts[i])
    if off + cnt > lv.source.size:
        return None
    return lv.source.read(off, min(cnt, 1 << 20))


def _plan_level(slide: Slide, lv: PyramidLevel, options: ExportOptions, k: int) -> _LevelPlan:
    if options.compression != "copy":
        T = options.tile_size
        n = -(-lv.width // T) * -(-lv.height // T)
        coding = reencode_coding(options.compression, options.psnr, options.quality)
        return _LevelPlan(slide, lv, coding, (T, T), None, n, 0, n * (6 * T * T + 4096))
    present = _present(lv)
    coding = passthrough_coding(lv, _first_tile(lv, present))
    frames = int(present.sum())
    if not frames:  # (NumberOfFrames 0 is not a DICOM value, PS3.3 C.7.6.6; OpenSlide refuses the instance)
        raise UnsupportedFormatError(
            f"{lv.path}: level {lv.index}: compression copy to DICOM: the level has no stored tile (every one "
            f"missing) and a DICOM instance holds at least one frame; re-encode with --compression jpeg or jpeg2000")
    positions = None
    if frames < present.size:
        rows, cols = np.nonzero(present)
        positions = list(zip(cols.tolist(), rows.tolist(), strict=True))
    n = lv.tiles_across * lv.tiles_down
    cnts = np.asarray(lv.tiles.bytecounts[:n], np.uint64).reshape(present.shape)
    bound = int(cnts[present].sum()) + frames * (len(coding.prefix) + 9)
    return _LevelPlan(slide, lv, coding, (lv.tile_width, lv.tile_height), positions, frames,
                      int(present.size - frames), bound)


def _added_dims(last: _LevelPlan, options: ExportOptions) -> list[tuple[int, int]]:
    """The levels ``add_levels`` computes below the smallest source level (none without it)."""
    if not options.add_levels:
        return []
    return pyramid_dimensions(last.level.width, last.level.height, _added_tile(last, options))[1:]


def _added_tile(last: _LevelPlan, options: ExportOptions) -> int:
    """Frame size of the ``add_levels`` levels: the passed-through levels' own (square) tile size, as every
    level of a pyramid has one frame size for readers such as wsidicom; else ``tile_size``."""
    tw, th = last.tile
    return tw if options.compression == "copy" and tw == th else options.tile_size


def _write_level(folder: Path, facts: SeriesFacts, plan: _LevelPlan, k: int, options: ExportOptions,
                 counter: TileCounter) -> int:
    lv = plan.level
    geometry = ImageGeometry("VOLUME", lv.width, lv.height, plan.tile[0], plan.tile[1], plan.frames, k + 1,
                             original=k == 0 and options.compression == "copy", resampled=k > 0,
                             positions=plan.positions)
    ds = instance_dataset(facts, geometry, plan.coding)
    return write_instance(folder / f"level-{k}.dcm", ds, plan.coding.transfer_syntax, _frames(plan, options, counter),
                          plan.frames, offset_table(plan.frames, plan.bound),
                          raw_bytes=plan.frames * plan.tile[0] * plan.tile[1] * 3)


def _frames(plan: _LevelPlan, options: ExportOptions, counter: TileCounter) -> Iterator:
    lv = plan.level
    if options.compression == "copy" and not options.verify and supported(lv):
        # (a local file: long reads, headers checked against the first tile's; storedruns)
        for run in stored_runs(lv, TileChecker(lv), counter, accept=_same_coding(plan)):
            frames = plan.coding.frame_run(run)
            if frames is not None:
                yield frames
                continue
            view = memoryview(run.data)
            for s, c in zip(run.starts.tolist(), run.counts.tolist(), strict=True):
                yield plan.coding.frame_parts(view[s:s + c])
        return
    if options.compression == "copy":
        cl = CopiedLevel(lv, lv.width, lv.height, 0, 0, lv.tiles_across, lv.tiles_down, {}, "")
        accept = _same_coding(plan)
        for i, data in enumerate(copied_tiles(plan.slide, cl, on_error="raise", verify=options.verify,
                                              threads=options.thread_count, failed=plan.failed, counter=counter)):
            if data:
                accept(data, i % lv.tiles_across, i // lv.tiles_across)
                yield plan.coding.frame_parts(data)
        return
    T = options.tile_size
    src = StripSource(plan.slide, lv.index, 0, 0, lv.width, lv.height, T, options.thread_count,
                      options.background_rgb, options.on_error)
    plan.missing = src.missing_tiles()
    pyramid = PyramidBuilder([(lv.width, lv.height)], T, 0, pad_tiles=True, strip=src.strip)
    try:
        encoder = _Encoder(options, options.compression)
        for _k, _c, _r, data in encoded_tiles(src, pyramid, encoder, options.thread_count):
            counter.add()
            yield data
    finally:
        plan.failed |= {(lv.index, c, r) for c, r in src.failed}


def _same_coding(plan: _LevelPlan) -> Callable[[bytes, int, int], None]:
    """A check that a passed-through tile has the instance's coding (its frames share one transfer
    syntax and photometric interpretation)."""
    lv = plan.level

    def accept(data: bytes, col: int, row: int) -> None:
        data = bytes(data)  # (a view of a run's buffer: one copy for both parses below)
        try:
            same = passthrough_coding(lv, data) == plan.coding
        except UnsupportedFormatError:
            same = False
        if not same:
            raise UnsupportedFormatError(
                f"{lv.path}: level {lv.index}: compression copy to DICOM: tile ({col}, {row}) is not coded as "
                f"the level's first tile ({plan.coding.method} {plan.coding.photometric}), as the frames of one "
                f"instance must be; re-encode with --compression jpeg or jpeg2000")
        size = _declared_size(lv, plan.coding.prefix, data)
        if size != plan.tile:
            what = "no readable size" if size is None else f"{size[0]}x{size[1]} pixels"
            raise UnsupportedFormatError(
                f"{lv.path}: level {lv.index}: compression copy to DICOM: tile ({col}, {row}) declares {what}, "
                f"not the {plan.tile[0]}x{plan.tile[1]} of every frame (a cropped edge tile: a DICOM frame is "
                f"Rows x Columns, PS3.5 8.2); re-encode with --compression jpeg or jpeg2000")

    return accept


def _declared_size(lv: PyramidLevel, prefix: bytes, data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` that a passed-through tile's frame header declares (JPEG: SOF, the JPEGTables
    ``prefix`` merged in; JPEG 2000: SIZ), or None where there is none."""
    if lv.encoding.stream == "j2k":
        head = j2k_main_header(data)
        return None if head.problem else (head.width, head.height)
    return jpeg_frame_size(jpeg_with_prefix(prefix, data))


def _write_added(folder: Path, slide: Slide, facts: SeriesFacts, last: _LevelPlan, dims: list[tuple[int, int]],
                 first: int, options: ExportOptions, counter: TileCounter) -> int:
    """The ``add_levels`` levels: one pass over the smallest source level, every computed level's frames
    spilled to an anonymous file beside the output, then written instance after instance."""
    lv = last.level
    T = _added_tile(last, options)
    kind = options.compression
    if kind == "copy":  # the source's kind of codec
        kind = "jpeg" if last.coding.transfer_syntax == JPEG_BASELINE else "jpeg2000"
    coding = reencode_coding(kind, options.psnr, options.quality)
    encoder = _Encoder(options, kind)
    src = StripSource(slide, lv.index, 0, 0, lv.width, lv.height, T, options.thread_count,
                      options.background_rgb, options.on_error)
    pyramid = PyramidBuilder([(lv.width, lv.height), *dims], T, 0, pad_tiles=True, strip=src.strip)
    index: list[list[tuple[int, int]]] = [[] for _ in dims]
    nbytes = 0
    with atomic.anonymous_file(folder) as spill:
        fd, pos = spill.fileno(), 0
        for k, _c, _r, data in encoded_tiles(src, pyramid, encoder, options.thread_count, skip=1):
            os.pwrite(fd, data, pos)
            index[k - 1].append((pos, len(data)))
            pos += len(data)
            counter.add()
        for j, (w, h) in enumerate(dims):
            geometry = ImageGeometry("VOLUME", w, h, T, T, len(index[j]), first + j + 1, resampled=True)
            ds = instance_dataset(facts, geometry, coding)
            frames = (os.pread(fd, n, off) for off, n in index[j])
            bound = sum(n + 9 for _, n in index[j])
            nbytes += write_instance(folder / f"level-{first + j}.dcm", ds, coding.transfer_syntax, frames,
                                     len(index[j]), offset_table(len(index[j]), bound),
                                     raw_bytes=len(index[j]) * T * T * 3)
    return nbytes


def _associated(slide: Slide, options: ExportOptions) -> list[tuple[str, str, np.ndarray]]:
    """``(file stem, flavour, (h, w, 3) uint8)`` of the associated images carried over (module notes)."""
    out = []
    for name, flavor in ASSOCIATED:
        if name in ("label", "macro") and not (options.associated and options.label):
            continue
        if name == "macro" and not options.overview:
            continue
        if name not in slide.associated_images:
            continue
        try:
            image = slide.associated_images[name]
        except WsiError:
            if not options.fill:
                raise
            continue
        stem = "overview" if name == "macro" else name
        out.append((stem, flavor, np.ascontiguousarray(np.asarray(image)[..., :3], dtype=np.uint8)))
    return out


def _write_associated(folder: Path, facts: SeriesFacts, name: str, flavor: str, image: np.ndarray, number: int,
                      options: ExportOptions) -> int:
    """One associated image as a single-frame JPEG instance."""
    h, w = image.shape[:2]
    coding = reencode_coding("jpeg", None, options.quality)
    frame = FrameEncoder("jpeg", options.quality, None).encode(image)
    ds = instance_dataset(facts, ImageGeometry(flavor, w, h, w, h, 1, number), coding)
    return write_instance(folder / f"{name}.dcm", ds, coding.transfer_syntax, [frame], 1,
                          offset_table(1, len(frame) + 9), raw_bytes=w * h * 3)


def _bound(plans: list[_LevelPlan], options: ExportOptions, associated) -> int:
    """The memory bound: the widest level's strip buffers (:func:`~wsitool.export.plan.memory_bound`) when
    re-encoding; when copying, one tile row of encoded bytes plus the long reads of
    :mod:`~wsitool.export.storedruns` that the frames being written hold (two batches of
    :data:`~.framestream.BATCH_BYTES`), two more and the buffers kept for reuse; plus the associated images."""
    extra = sum(int(a.size) * 2 for *_, a in associated)
    if options.compression == "copy":
        return max((p.level.tiles_across + 2) * int(np.asarray(p.level.tiles.bytecounts).max(initial=0))
                   + min(2 * BATCH_BYTES + (POOL + 2) * RUN_BYTES, 3 * p.bound) for p in plans) + extra + (1 << 20)
    return max(memory_bound(p.level.width, options.tile_size, threads=options.thread_count,
                            source_tile=(p.level.tile_width, p.level.tile_height),
                            source_pixel_bytes=p.level.samples * p.level.dtype.itemsize,
                            source_itemsize=p.level.dtype.itemsize) for p in plans) + extra
