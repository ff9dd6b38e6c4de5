"""The TIFF writers: Aperio-layout TIFF/SVS and OME-TIFF, one page after the other (floor 6).

Format facts used here:

* Aperio SVS: the first IFD's ImageDescription starts with ``Aperio``; the
  text after the first line is ``|``-separated ``key = value`` fields, of
  which ``MPP`` (micrometres per pixel) and ``AppMag`` (objective power) give
  OpenSlide's ``openslide.mpp-x/y`` and ``openslide.objective-power``;
  pyramid levels are tiled IFDs (OpenSlide's Aperio format notes,
  openslide.org/formats/aperio).  Layout (the same notes, quoting Aperio's
  "Digital Slides and Third-party Data Interchange" p. 14): the first IFD
  is the full resolution, the second a stripped thumbnail, then the other
  levels, then the stripped label (NewSubfileType 1) and macro
  (NewSubfileType 9), named on the second line of their ImageDescription;
  tifffile and tiffslide take IFD 1 as the thumbnail whatever it holds.  JPEG 2000 tiles use compression 33005
  (Aperio "JP2K RGB": a raw JPEG 2000 code stream, ISO/IEC 15444-1 Annex A).
* OME-TIFF: OME-XML (:mod:`.omexml`: MPP, objective, scanner, acquisition
  date, channels) in the first ImageDescription; the reduced levels are SubIFDs (TIFF tag
  330) of the full-resolution IFD with NewSubfileType 1 (OME-TIFF
  specification, "Sub-resolutions").  JPEG 2000 tiles use compression 34712.
* TIFF 6.0: TileWidth and TileLength must be multiples of 16 (section 15);
  JPEG tiles are complete JPEG streams in YCbCr (photometric YCbCr; TIFF
  Technical Note 2), without chroma subsampling at quality >= 90 (as libvips
  does: it costs PSNR on stained tissue) and 2x2 below (YCbCrSubSampling);
  deflate tiles use compression 8 with the horizontal differencing predictor
  2 (section 14); both ResolutionUnit centimetre and X/YResolution are set
  from the MPP (section 8).  BigTIFF is used when the uncompressed pyramid
  could exceed 4 GiB.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tifffile

from ..errors import WsiError
from ..formats.tiff import aperio
from ..ground import outputs as atomic
from ..version import __version__
from . import omexml
from .associated import PAINTED_KEY, PAINTED_NAMESPACE
from .encode import TileCounter, TileStream, jpeg_subsampling, tiff_compression
from .options import ExportOptions
from .passthrough import CopyPlan, copied_tiles

#: The writer named in the Software tag and Aperio descriptions.
SOFTWARE = f"wsitool {__version__}"


@contextlib.contextmanager
def _tiff_output(final: Path, sources, generators: list):
    """``(partial, out_fh, spill)``: the exclusive partial of ``final`` open read-write
    (:func:`wsitool.ground.outputs.open_file`) and an anonymous spill file beside it for the
    lower levels' tiles.  On any error the ``generators`` (appended by the caller as it
    makes them) are closed, the partial removed, and an OS error re-raised naming
    ``final``; the spill file is always closed."""
    partial, out_fh = atomic.open_file(final, sources, read=True)
    try:
        spill = atomic.anonymous_file(final.parent, final)
    except BaseException:
        out_fh.close()
        partial.abort()
        raise
    try:
        yield partial, out_fh, spill
    except BaseException as exc:
        for gen in generators:
            gen.close()
        out_fh.close()
        partial.abort()
        if isinstance(exc, OSError) and not isinstance(exc, WsiError):
            raise atomic.user_error(exc, final) from None
        raise
    finally:
        spill.close()


def _finish(tw, out_fh, fmt: str, meta: dict) -> None:
    """After the pyramid's pages: the label and macro pages, then (tifffile closed) the
    painted-tile count in place of its placeholder (``meta["painted"]``, or none)."""
    for name, image in meta.get("associated", ()):
        write_associated(tw, fmt, name, image)
    tw.close()
    painted = meta.get("painted")
    count = painted() if painted is not None else 0
    if count:
        record_painted(out_fh, count)


def write_tiff(tiles: TileStream, final: Path, dims: Sequence[tuple[int, int]],
               meta: dict, counter: TileCounter, options: ExportOptions, *, sources: Sequence[str] = ()) -> int:
    """Write a re-encoded ``tiff`` / ``ome-tiff`` export; returns the output's size in bytes.

    ``tiles`` yields ``(level, col, row, bytes)`` for levels ``dims`` (``(width, height)``
    in pixels, full resolution first), level 0 in page order; the lower levels' tiles go
    to a spill file until level 0's page is written.  ``options``: the format, tile size,
    compression, quality, psnr and overwrite; ``sources``: paths the output must not be.
    """
    fmt, T = options.format, options.tile_size
    page_args, kind = tiff_compression(fmt, options.compression, options.quality, options.psnr)
    raw = sum(-(-w // T) * -(-h // T) * T * T * 3 for w, h in dims)
    bigtiff = _needs_bigtiff(raw)
    index: list[list[tuple[int, int]]] = [[] for _ in dims]
    generators: list[Generator[Any, None, None]] = [tiles]
    with _tiff_output(final, sources, generators) as (partial, out_fh, spill):
        fd = spill.fileno()
        spill_pos = 0

        def level0() -> Generator[bytes, None, None]:
            nonlocal spill_pos
            for k, _c, _r, data in tiles:
                if k == 0:
                    counter.add()
                    yield data
                else:
                    os.pwrite(fd, data, spill_pos)
                    index[k].append((spill_pos, len(data)))
                    spill_pos += len(data)
                    counter.add()

        gen0 = level0()
        generators.insert(0, gen0)
        with out_fh:
            tw = tifffile.TiffWriter(out_fh, bigtiff=bigtiff, ome=False)  # OME-XML: .omexml
            args = dict(tile=(T, T), **page_args)
            _first_page(tw, fmt, final, meta, dims, _Feed(gen0), T, kind, args)
            for _ in gen0:  # run the pipeline to its end: the rest goes to the spill file
                raise RuntimeError("level-0 tile after the level-0 page")  # pragma: no cover
            if fmt == "tiff":  # Aperio: the thumbnail is the second IFD (its level now complete)
                write_thumbnail(tw, meta["thumbnail"].image, *dims[0])
            for k in range(1, len(dims)):
                w, h = dims[k]
                if len(index[k]) != -(-w // T) * -(-h // T):  # pragma: no cover
                    raise RuntimeError(f"level {k}: {len(index[k])} tiles spilled")
                _level_page(tw, fmt, meta, dims, k, _spilled(fd, index[k]), T, kind, args)
            _finish(tw, out_fh, fmt, meta)
        nbytes = partial.path.stat().st_size
        partial.commit(options.overwrite)
        return nbytes


class _Feed:
    """An iterator over ``gen``'s items without a ``close()``: tifffile reads the page's
    tiles through its own ``yield from`` wrapper, whose closing would close ``gen`` too
    (PEP 380), and ``gen`` must run on after the page (the lower levels' tiles)."""

    def __init__(self, gen):
        self._next = gen.__next__

    def __iter__(self):
        return self

    def __next__(self):
        return self._next()


def _first_page(tw, fmt: str, final: Path, meta: dict, dims, data, tile: int, kind: str,
                args: dict) -> None:
    """The full-resolution page: ``tiff`` with the Aperio description (the painted-tile
    placeholder when counted), ``ome-tiff`` with the OME-XML and its levels as SubIFDs;
    ICC profile and resolution on both.  ``data`` yields its tiles, ``args`` are its
    tifffile keywords (tile, compression, photometric, ...)."""
    w0, h0 = dims[0]
    painted = meta.get("painted")  # callable giving the painted-tile count ("fill"), or None
    common = dict(shape=(h0, w0, 3), dtype=np.uint8, software=SOFTWARE, iccprofile=meta.get("icc"),
                  **_resolution(meta, dims, 0), **args)
    if fmt == "tiff":
        mpp = meta["mpp"][0] if meta["mpp"] else None
        desc = aperio.description_text(w0, h0, tile, kind, mpp, meta["mag"], SOFTWARE,
                                       extra={PAINTED_KEY: 0} if painted is not None else None)
        # NewSubfileType 0 written out: Bio-Formats' SVS reader takes an IFD without the tag
        # for a label or macro (it reads the missing tag as -1), which costs the pyramid a level
        tw.write(data, description=desc, metadata=None, subfiletype=0, **common)
    else:
        tw.write(data, subifds=len(dims) - 1, metadata=None,
                 description=omexml.as_description(_ome_xml(final, meta, dims[0], painted)), **common)


def _level_page(tw, fmt: str, meta: dict, dims, k: int, data, tile: int, kind: str,
                args: dict) -> None:
    """Lower level ``k``: an Aperio level page (NewSubfileType 0) or an OME SubIFD (1)."""
    w, h = dims[k]
    common = dict(shape=(h, w, 3), dtype=np.uint8, software=SOFTWARE, **_resolution(meta, dims, k),
                  **args)
    if fmt == "tiff":
        desc = aperio.level_description_text(dims[0], (w, h), tile, kind, SOFTWARE)
        tw.write(data, description=desc, metadata=None, subfiletype=0, **common)
    else:
        tw.write(data, subfiletype=1, **common)


def _needs_bigtiff(raw: int) -> bool:
    """True when a TIFF of ``raw`` bytes of tiles (plus 1/16 and 16 MiB of slack for
    tags and offsets) could pass the 4 GiB that classic TIFF offsets address (TIFF 6.0
    section 2: 32-bit offsets)."""
    return raw + (raw >> 4) + (1 << 24) >= 2**32


def _spilled(fd: int, entries: list[tuple[int, int]]) -> Iterator[bytes]:
    """The tiles ``(offset, length)`` read back from the spill file ``fd``, in order."""
    for off, n in entries:
        yield os.pread(fd, n, off)


def write_thumbnail(tw, image: np.ndarray, w0: int, h0: int) -> None:
    """The Aperio thumbnail IFD: stripped JPEG (RGB), NewSubfileType 0, ImageDescription
    ``Aperio Image Library ...`` then ``"W0xH0 -> WxH - "`` as Aperio writes it (OpenSlide's
    Aperio notes: "the thumbnail image is always stripped").  Quality 90 without chroma
    subsampling, as the JPEG tiles at that quality."""

    h, w = image.shape[:2]
    tw.write(image, photometric="rgb", compression="jpeg", compressionargs={"level": 90},
             subsampling=jpeg_subsampling(90), rowsperstrip=16, subfiletype=0, metadata=None, software=SOFTWARE,
             description=aperio.thumbnail_description_text((w0, h0), (w, h), SOFTWARE))


def write_associated(tw, fmt: str, name: str, image: np.ndarray) -> None:
    """Append associated image ``name`` (``label`` or ``macro``), stripped.

    ``tiff`` (OpenSlide's Aperio notes): NewSubfileType 1 for the label and 9
    for the macro; ImageDescription ``Aperio Image Library ...`` with the
    name and size on its second line (OpenSlide names associated images
    from it); the label LZW-compressed (lossless, as Aperio stores it), the
    macro JPEG.  ``ome-tiff``: a further OME Image with ``Name`` ``label`` /
    ``macro`` (as bioformats2raw / raw2ometiff write them), same compressions.
    """

    h, w = image.shape[:2]
    comp = {"compression": "lzw"} if name == "label" else {
        "compression": "jpeg", "compressionargs": {"level": 90}, "subsampling": jpeg_subsampling(90)}
    if fmt == "tiff":
        tw.write(image, photometric="rgb", rowsperstrip=16, metadata=None,
                 subfiletype=1 if name == "label" else 9, software=SOFTWARE,
                 description=aperio.associated_description_text(name, (w, h), SOFTWARE), **comp)
    else:
        tw.write(image, photometric="rgb", rowsperstrip=16, software=SOFTWARE, metadata=None,
                 **comp)  # its OME Image (Name, IFD) is in the first IFD's OME-XML


def record_painted(fh, count: int) -> None:
    """Put ``count`` in place of the ``0`` written as :data:`PAINTED_KEY` in the first
    ImageDescription of the TIFF open read-write in ``fh`` (tifffile ``TiffTag.overwrite``)."""


    fh.flush()
    fh.seek(0)  # tifffile reads a file object from its current position
    with tifffile.TiffFile(fh) as tf:
        tag = tf.pages.first.tags["ImageDescription"]
        text = tag.value
        new = re.sub(r"(\|" + PAINTED_KEY + r" = )0\b", lambda m: m.group(1) + str(count), text, count=1)
        if new == text:
            new = text.replace(f'<M K="{PAINTED_KEY}">0</M>', f'<M K="{PAINTED_KEY}">{count}</M>', 1)
        if new == text:  # pragma: no cover - the placeholder is always written
            raise RuntimeError("no place for the painted-tile count in the ImageDescription")
        tag.overwrite(new.encode("utf-8"))  # OME-XML is UTF-8 ("µm"), as tifffile wrote it
    fh.flush()


def _resolution(meta: dict, dims, k: int) -> dict:
    """X/YResolution (pixels per centimetre, TIFF 6.0 section 8) of level ``k`` from the MPP."""
    if not meta["mpp"]:
        return {}
    fx, fy = dims[0][0] / dims[k][0], dims[0][1] / dims[k][1]
    return {"resolution": (1e4 / (meta["mpp"][0] * fx), 1e4 / (meta["mpp"][1] * fy)),
            "resolutionunit": "CENTIMETER"}


def _ome_xml(final: Path, meta: dict, size0, painted) -> str:
    """The OME-XML of an ``ome-tiff`` export (:mod:`.omexml`): the pyramid (level 0 in
    IFD 0, the other levels its SubIFDs) with the MPP, acquisition date, scanner and
    objective of the source, then the label and macro in the next IFDs; the painted-
    tile placeholder (0) where counted."""
    images = [omexml.OmeImage(final.name.split(".")[0], size0[0], size0[1], 0,
                              physical_size_um=tuple(meta["mpp"]) if meta["mpp"] else None,
                              acquired=meta.get("acquired"), objective=True)]
    for k, (name, image) in enumerate(meta.get("associated", ())):
        images.append(omexml.OmeImage(name, image.shape[1], image.shape[0], k + 1,
                                      acquired=meta.get("acquired")))
    instrument = meta.get("instrument") or omexml.Instrument(magnification=meta.get("mag"))
    annotation = (PAINTED_NAMESPACE, {PAINTED_KEY: "0"}) if painted is not None else None
    return omexml.ome_xml(images, instrument=instrument, annotation=annotation, creator=SOFTWARE)


def write_tiff_copy(slide, plan: CopyPlan, computed: TileStream, final: Path,
                    cdims: Sequence[tuple[int, int]], meta: dict, counter: TileCounter, options: ExportOptions, *,
                    failed: set, sources: Sequence[str] = ()) -> int:
    """Write a ``compression="copy"`` export (:mod:`.passthrough`); returns the output's size in bytes.

    Layout as :func:`write_tiff`: output levels ``0 .. len(plan.copied) - 1``
    are the copied source levels (each page with its source's tile size and
    codec tags), then the computed levels ``cdims[1:]`` (``cdims[0]`` is the
    last copied level), re-encoded as ``plan.reencode`` at ``options.quality`` (JPEG 2000:
    ``options.psnr``) in
    ``plan.tile`` tiles.  ``computed`` yields their ``(k, col, row, bytes)``,
    ``k >= 1`` numbered from the last copied level; they are made first (into
    the anonymous spill file), so that a source tile the downsampler cannot
    decode fails the export before the copy starts.  ``failed`` collects
    copied tiles that failed their checks (``options.on_error="fill"``; ``options.verify``
    also decodes them, on ``options.threads`` threads).
    """
    copied = plan.copied
    m = len(copied)
    fmt = options.format
    dims = [(cl.width, cl.height) for cl in copied] + [(int(w), int(h)) for w, h in cdims[1:]]
    T = plan.tile
    c_args, c_kind = tiff_compression(fmt, plan.reencode, options.quality, options.psnr)
    raw = sum(int(cl.subgrid(cl.level.tiles.bytecounts).astype(np.uint64).sum()) for cl in copied)
    raw += sum(-(-w // T) * -(-h // T) * T * T * 3 for w, h in cdims[1:])
    bigtiff = _needs_bigtiff(raw)
    index: list[list[tuple[int, int]]] = [[] for _ in cdims]

    def tiles_of(cl) -> Iterator[bytes]:
        return copied_tiles(slide, cl, on_error=options.on_error, verify=options.verify,
                            threads=options.thread_count, failed=failed, counter=counter)

    with _tiff_output(final, sources, [computed]) as (partial, out_fh, spill):
        fd = spill.fileno()
        pos = 0
        for k, _c, _r, data in computed:
            os.pwrite(fd, data, pos)
            index[k].append((pos, len(data)))
            pos += len(data)
            counter.add()
        with out_fh:
            tw = tifffile.TiffWriter(out_fh, bigtiff=bigtiff, ome=False)  # OME-XML: .omexml
            first = copied[0]
            _first_page(tw, fmt, final, meta, dims, tiles_of(first), first.level.tile_width,
                        first.kind, first.page)
            if fmt == "tiff":
                write_thumbnail(tw, meta["thumbnail"].image, *dims[0])
            for k in range(1, len(dims)):
                if k < m:
                    cl = copied[k]
                    _level_page(tw, fmt, meta, dims, k, tiles_of(cl), cl.level.tile_width, cl.kind,
                                cl.page)
                else:
                    _level_page(tw, fmt, meta, dims, k, _spilled(fd, index[k - m + 1]), T, c_kind,
                                dict(c_args, tile=(T, T)))
            _finish(tw, out_fh, fmt, meta)
        nbytes = partial.path.stat().st_size
        partial.commit(options.overwrite)
        return nbytes
