"""OME-TIFF export of a multi-channel (fluorescence) slide: every channel kept, named and coloured (floor 6).

``export_pyramid(..., format="ome-tiff")`` of a slide with channels
(:attr:`wsitool.Slide.channels`) comes here instead of the RGB pipeline:

* one top-level IFD per channel (OME ``DimensionOrder="XYCZT"``, ``SizeC`` = the
  channel count, ``TiffData PlaneCount`` = C from IFD 0), each a tiled
  single-sample page in the slide's sample type (uint8, uint16, ...),
  photometric MINISBLACK; its reduced resolutions are its SubIFDs (the
  OME-TIFF pyramid layout), each half the size of the one above (2x2 mean,
  rounded down), down to one tile;
* the OME-XML (:mod:`.omexml`) names every channel, with its display colour and
  the excitation / emission wavelengths where known, beside the pixel size,
  scanner, objective and acquisition date the RGB export carries;
* the label and macro follow as further OME Images (RGB), as in the RGB export.

Each channel of the exported region is read whole (``read_region(...,
mode="raw", channels=[c])``) and reduced in memory: one channel of the region
must fit the ``max_region_bytes`` limit (:mod:`wsitool.ground.limits`).
Compression: ``deflate`` (the default here when ``jpeg`` is asked of a sample
type JPEG cannot hold), ``none``, or ``jpeg`` for 8-bit channels (lossy).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import tifffile

from ..errors import InvalidRegionError, ResourceLimitError, WsiError
from ..ground import outputs as atomic
from ..ground.limits import get_limits
from ..version import __version__
from . import omexml
from .associated import associated_for_export
from .options import ExportOptions
from .plan import ExportResult, output_metadata

__all__ = ["export_channels", "CHANNEL_COMPRESSIONS"]

#: compression names accepted for channel exports -> tifffile compression.
CHANNEL_COMPRESSIONS = {"deflate": "zlib", "none": None, "jpeg": "jpeg"}

SOFTWARE = f"wsitool {__version__}"


def _reduce2(plane: np.ndarray) -> np.ndarray:
    """``plane`` (h, w) halved: the mean of each 2x2 block (a last odd row or column
    averaged with itself), rounded down, in the plane's dtype."""
    h, w = plane.shape
    p = plane
    if h % 2:
        p = np.concatenate([p, p[-1:]], axis=0)
    if w % 2:
        p = np.concatenate([p, p[:, -1:]], axis=1)
    wide = p.astype(np.float64 if p.dtype.kind == "f" else np.uint64)
    s = wide[0::2, 0::2] + wide[1::2, 0::2] + wide[0::2, 1::2] + wide[1::2, 1::2]
    return (s / 4).astype(plane.dtype) if plane.dtype.kind == "f" else (s // 4).astype(plane.dtype)


def _dims(w: int, h: int, tile: int) -> list[tuple[int, int]]:
    dims = [(w, h)]
    while dims[-1][0] > tile or dims[-1][1] > tile:
        pw, ph = dims[-1]
        dims.append((max(1, -(-pw // 2)), max(1, -(-ph // 2))))
    return dims


def export_channels(slide, final: Path, L: int, rect: tuple[int, int, int, int], options: ExportOptions,
                    sources: Sequence[str], *, progress: Callable[[int, int], None] | None = None) -> ExportResult:
    """Write level ``L``'s rectangle ``rect`` (``rx, ry, w, h`` in pixels of the level) of the
    multi-channel ``slide`` as a multi-channel OME-TIFF at ``final`` (atomically).

    Of ``options``: ``tile_size``, ``compression`` (:data:`CHANNEL_COMPRESSIONS`),
    ``quality`` (JPEG), ``label`` and ``associated``, ``on_error``, ``threads`` (reads)
    and ``overwrite``; ``progress(tiles_done, tiles_total)`` after each channel.

    Raises:
        InvalidRegionError: a compression other than :data:`CHANNEL_COMPRESSIONS`.
        ResourceLimitError: one channel of the region over ``max_region_bytes``.
        TileDecodeError: an undecodable tile with ``on_error="raise"``.
        OSError: the output cannot be written (named).
    """
    t0 = time.perf_counter()
    lv = slide.levels[L]
    codec, compression = _channel_codec(slide, lv, options.compression)
    rx, ry, w, h = rect
    need = w * h * lv.dtype.itemsize
    if need > get_limits().max_region_bytes:
        raise ResourceLimitError(f"{slide.path}: one channel of the {w}x{h} region needs {need} bytes, "
                                 f"over the max_region_bytes limit {get_limits().max_region_bytes}")
    tile = options.tile_size
    dims = _dims(w, h, tile)
    meta = output_metadata(slide, L)
    extra = associated_for_export(slide, options.label, options.associated, options.on_error,
                                  stacklevel=5)  # export_pyramid's caller
    channels = slide.channels
    xml = _channels_xml(final, lv, channels, (w, h), meta, extra)
    args: dict = dict(tile=(tile, tile), compression=codec, photometric="minisblack", software=SOFTWARE,
                      metadata=None)
    if codec == "jpeg":
        args["compressionargs"] = {"level": options.quality}
    total = sum(-(-a // tile) * -(-b // tile) for a, b in dims) * len(channels)
    ds = lv.downsample
    loc = (int(round(rx * ds)), int(round(ry * ds)))

    def channel_levels(c: int) -> list[np.ndarray]:
        plane = slide.read_region(loc, L, (w, h), mode="raw", channels=[c], threads=options.thread_count,
                                  on_error=options.on_error)[..., 0]
        levels = [plane]
        for _ in dims[1:]:
            levels.append(_reduce2(levels[-1]))
        return levels

    def write(tw: tifffile.TiffWriter) -> None:
        _write_channels(tw, channel_levels, len(channels), xml, meta, dims, args, total, progress)
        _write_extra(tw, extra)

    nbytes = _write_atomically(final, sources, need * len(channels) * 2 > (1 << 31), write, options.overwrite)
    return ExportResult(
        output=final, format="ome-tiff", level_dimensions=list(dims),
        tiles_written=total, tiles_missing=0, tiles_failed=0,
        seconds=time.perf_counter() - t0, tile_size=tile, compression=compression,
        bytes_written=nbytes, memory_bound=need * 2, source_levels=[L] * len(dims))


def _write_atomically(final: Path, sources: Sequence[str], bigtiff: bool,
                      write: Callable[[tifffile.TiffWriter], None], overwrite: bool) -> int:
    """Run ``write`` on a TiffWriter of the exclusive partial of ``final`` and commit it;
    returns the bytes written.  On any error the partial is removed (an OS error
    re-raised naming ``final``)."""
    partial, fh = atomic.open_file(final, sources, read=True)
    try:
        with fh:
            with tifffile.TiffWriter(fh, bigtiff=bigtiff, ome=False) as tw:
                write(tw)
            fh.flush()
            nbytes = fh.tell()
        partial.commit(overwrite)
    except BaseException as exc:
        partial.abort()
        if isinstance(exc, OSError) and not isinstance(exc, WsiError):
            raise atomic.user_error(exc, final) from None
        raise
    return nbytes


def _channel_codec(slide, lv, compression: str) -> tuple[str | None, str]:
    """``(tifffile codec, compression name)`` of a channel export: JPEG holds 8-bit samples
    only, so ``jpeg`` of a wider sample type becomes ``deflate``.

    Raises:
        InvalidRegionError: a compression other than :data:`CHANNEL_COMPRESSIONS`.
    """
    if compression not in CHANNEL_COMPRESSIONS:
        raise InvalidRegionError(f"{slide.path}: a multi-channel OME-TIFF export takes compression "
                                 f"{', '.join(CHANNEL_COMPRESSIONS)}, not {compression!r}")
    codec = CHANNEL_COMPRESSIONS[compression]
    if codec == "jpeg" and lv.dtype != np.uint8:
        return "zlib", "deflate"  # JPEG holds 8-bit samples only
    return codec, compression


def _channels_xml(final: Path, lv, channels, size: tuple[int, int], meta: dict,
                  extra: list[tuple[str, np.ndarray]]) -> bytes:
    """The ImageDescription: the OME-XML of the channel pyramid (every channel named and
    coloured) and of the label and macro Images after it."""
    w, h = size
    images = [omexml.OmeImage(
        final.name.split(".")[0], w, h, 0, dtype=lv.dtype.name,
        channels=[omexml.OmeChannel(samples=1, name=c.name, color=tuple(c.color), emission_nm=c.emission_nm,
                                    excitation_nm=c.excitation_nm) for c in channels],
        physical_size_um=tuple(meta["mpp"]) if meta["mpp"] else None, acquired=meta.get("acquired"),
        objective=True)]
    for k, (name, image) in enumerate(extra):
        images.append(omexml.OmeImage(name, image.shape[1], image.shape[0], len(channels) + k,
                                      acquired=meta.get("acquired")))
    return omexml.as_description(omexml.ome_xml(images, instrument=meta.get("instrument"), creator=SOFTWARE))


def _write_channels(tw: tifffile.TiffWriter, channel_levels: Callable[[int], list[np.ndarray]], n: int,
                    xml: bytes, meta: dict, dims: list[tuple[int, int]], args: dict, total: int,
                    progress: Callable[[int, int], None] | None) -> None:
    """One top-level page per channel (the OME-XML on the first), its reductions as SubIFDs."""
    done = 0
    for c in range(n):
        levels = channel_levels(c)
        tw.write(levels[0], subifds=len(dims) - 1, description=xml if c == 0 else None,
                 **_resolution(meta, dims, 0), **args)
        for k in range(1, len(dims)):
            tw.write(levels[k], subfiletype=1, **_resolution(meta, dims, k), **args)
        done += total // n
        if progress is not None:
            progress(done, total)


def _write_extra(tw: tifffile.TiffWriter, extra: list[tuple[str, np.ndarray]]) -> None:
    """The label and macro, stripped and deflated, after the channels."""
    for _name, image in extra:
        tw.write(image, photometric="rgb" if image.ndim == 3 else "minisblack",
                 compression="zlib", rowsperstrip=16, metadata=None, software=SOFTWARE)


def _resolution(meta: dict, dims, k: int) -> dict:
    """X/YResolution (pixels per centimetre) of output level ``k`` from the MPP."""
    if not meta["mpp"]:
        return {}
    fx, fy = dims[0][0] / dims[k][0], dims[0][1] / dims[k][1]
    return {"resolution": (1e4 / (meta["mpp"][0] * fx), 1e4 / (meta["mpp"][1] * fy)),
            "resolutionunit": "CENTIMETER"}
