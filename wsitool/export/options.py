"""The options of an export, checked once: :class:`ExportOptions` (floor 6).

:func:`~wsitool.export.export_pyramid` builds one from its keywords before it
opens the slide, and hands it to the steps and writers (:mod:`.tiff`,
:mod:`.dzi`, :mod:`.channels`) instead of their long argument lists.  An
``ExportOptions`` is always valid: the checks run in ``__post_init__``, in the
order ``export_pyramid`` has always run them, and the values are stored
normalised (lower-case names, integers, the thread count resolved, the
background as three integers).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidOptionError, ResourceLimitError
from ..ground.integers import as_int
from ..ground.limits import get_limits
from .plan import COMPRESSIONS, DICOM_COMPRESSIONS, FORMATS, ON_ERROR, background_color

__all__ = ["ExportOptions"]


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """How an export is written (every option but the source, the output and the region).

    Attributes:
        format: ``"tiff"`` (Aperio-style SVS that OpenSlide reads with vendor
            ``aperio``), ``"ome-tiff"`` (levels in SubIFDs) or ``"dzi"``
            (any case; stored lower-case).
        tile_size: output tile size in pixels; a multiple of 16 for TIFF
            formats, any size >= 1 for Deep Zoom (254 with overlap 1 is the
            usual choice there); ``tile_size**2`` at most the
            ``max_tile_pixels`` limit (:mod:`wsitool.ground.limits`).
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
            fixed-quality mode), 0..200, default
            :data:`~wsitool.export.encode.DEFAULT_PSNR` (40 dB); higher is
            closer to the source and larger (about +5 % size per dB on H&E);
            ``0`` is lossless.  Ignored by the other codecs.
        overlap: Deep Zoom tile overlap in pixels, at most ``tile_size // 2``
            (0 for TIFF formats).
        threads: encoder threads and decoder threads per strip read (None:
            the CPU count, resolved when the options are made); one more
            thread reads the next strip while the current one is reduced and
            encoded.
        overwrite: replace an existing output; without it an existing output
            raises ``FileExistsError`` before any work.
        background: ``(r, g, b)`` 0..255 painted where the source is
            transparent (outside the slide, missing or undecodable tiles);
            stored as a tuple of three ints.
        max_pixels: refuse exports of more than this many level-0 pixels
            (``w * h``); None: ``max_export_pixels`` of :mod:`wsitool.ground.limits`
            (``2**33``), read when the export is checked.
        on_error: ``"raise"``: the first undecodable source tile stops the
            export with its :class:`~wsitool.errors.TileDecodeError` and
            nothing is left under the output name.  ``"fill"``: undecodable
            tiles are painted with ``background``, a
            :class:`~wsitool.errors.TileWarning` gives their count,
            ``tiles_failed`` counts them, and the count is recorded in the
            output (:data:`~wsitool.export.PAINTED_KEY`; read it back with
            :func:`~wsitool.export.painted_tiles`; ``wsitool info`` shows it).
        label: carry the source's ``label`` image over (``tiff`` and
            ``ome-tiff``; labels often show patient identifiers: False drops it).
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
        overview: (``dicom``) carry the source's macro over as the OVERVIEW
            instance (it usually shows the label; ``label=False`` leaves it
            out too).
        add_levels: (``dicom``) also write the levels below the smallest
            source level, each half the one above, down to one tile, computed
            from that level.
        mpp: (``dicom``) micrometres per pixel of the exported level, one
            number or ``(x, y)``, for sources that do not say (every DICOM WSI
            instance carries a pixel spacing); None: the source's.
        dicom_metadata: (``dicom``) path of a DICOM JSON file (PS3.18 F.2)
            of patient, study, series, specimen and equipment attributes
            (:mod:`wsitool.export.dicom.metadata`).
        dicom_attributes: (``dicom``) ``{keyword: value}`` attributes, applied
            after ``dicom_metadata``; stored as a tuple of pairs.

    Raises:
        InvalidOptionError: an invalid option (format, compression and the
            pairs of them that do not go together, tile size, quality, psnr,
            overlap, threads, background, max_pixels, on_error); the message
            names the option and what it accepts.  Also a ``ValueError``.
        ResourceLimitError: ``tile_size**2`` over the ``max_tile_pixels`` limit.
    """

    format: str = "tiff"
    tile_size: int = 256
    compression: str = "jpeg"
    quality: int = 90
    psnr: float | None = None
    overlap: int = 0
    threads: int | None = None
    overwrite: bool = False
    background: Sequence[int] = (255, 255, 255)
    max_pixels: int | None = None
    on_error: str = "raise"
    label: bool = True
    associated: bool = True
    verify: bool = False
    from_source_levels: bool = False
    overview: bool = True
    add_levels: bool = False
    mpp: float | tuple[float, float] | None = None
    dicom_metadata: str | os.PathLike | None = None
    dicom_attributes: Any = None

    def __post_init__(self) -> None:
        _check_names(self)
        _check_dicom(self)
        _check_tile_size(self)
        _check_quality(self)
        _check_overlap(self)
        _check_threads(self)
        self._set("background", tuple(int(v) for v in background_color(self.background)))
        if self.max_pixels is not None:
            limit = as_int(self.max_pixels, "max_pixels", error=InvalidOptionError)
            if limit <= 0:
                raise InvalidOptionError(f"max_pixels must be positive, got {self.max_pixels}")
            self._set("max_pixels", limit)
        if self.on_error not in ON_ERROR:
            raise InvalidOptionError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}")
        for name in ("overwrite", "label", "associated", "verify", "from_source_levels", "overview", "add_levels"):
            self._set(name, bool(getattr(self, name)))

    def _set(self, name: str, value: object) -> None:
        """Store a normalised value in this frozen instance (only while it is made)."""
        object.__setattr__(self, name, value)

    @property
    def thread_count(self) -> int:
        """``threads``, resolved (the CPU count where None was given)."""
        return self.threads if self.threads is not None else (os.cpu_count() or 1)

    @property
    def background_rgb(self) -> np.ndarray:
        """``background`` as a ``(3,)`` uint8 array."""
        return np.array(self.background, np.uint8)

    @property
    def fill(self) -> bool:
        """True when undecodable tiles are painted (``on_error="fill"``)."""
        return self.on_error == "fill"


def _check_names(o: ExportOptions) -> None:
    """format and compression, and the pairs of them (and from_source_levels) that clash."""
    fmt = str(o.format).lower()
    if fmt not in FORMATS:
        raise InvalidOptionError(f"format must be one of {FORMATS}, got {o.format!r}")
    compression = str(o.compression).lower()
    if compression not in COMPRESSIONS:
        raise InvalidOptionError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    if fmt == "dicom" and compression not in DICOM_COMPRESSIONS:
        raise InvalidOptionError(f"DICOM frames are JPEG or JPEG 2000: compression must be one of "
                                 f"{DICOM_COMPRESSIONS}, got {compression!r}")
    if compression == "jpeg2000-lossless":
        if o.psnr not in (None, 0, 0.0):
            raise InvalidOptionError("compression jpeg2000-lossless takes no psnr (it is psnr 0)")
        compression = "jpeg2000"
        o._set("psnr", 0.0)
    if fmt == "dzi" and compression == "jpeg2000":
        raise InvalidOptionError("Deep Zoom tiles are JPEG or PNG: use compression jpeg, deflate or none")
    if o.from_source_levels and fmt == "dzi":
        raise InvalidOptionError("from_source_levels applies to tiff and ome-tiff: Deep Zoom level sizes "
                                 "are fixed by halving the full size")
    if o.from_source_levels and fmt == "dicom":
        raise InvalidOptionError("from_source_levels applies to tiff and ome-tiff: a DICOM export always reads "
                                 "each level from its own source level")
    if fmt == "dzi" and compression == "copy":
        raise InvalidOptionError("compression copy writes TIFF formats (tiff, ome-tiff); Deep Zoom tiles are "
                                 "re-encoded: use compression jpeg, deflate or none")
    o._set("format", fmt)
    o._set("compression", compression)


def _check_dicom(o: ExportOptions) -> None:
    """The DICOM-only options: refused for the other formats; mpp positive; the attributes as pairs."""
    given = [name for name, default in (("add_levels", False), ("mpp", None), ("dicom_metadata", None),
                                        ("dicom_attributes", None), ("overview", True))
             if getattr(o, name) not in (default, ()) and getattr(o, name) != {}]
    if o.format != "dicom":
        if given:
            raise InvalidOptionError(f"{given[0]} applies to format dicom only")
        return
    if o.mpp is not None:
        values = o.mpp if isinstance(o.mpp, (tuple, list)) else (o.mpp, o.mpp)
        try:
            mx, my = (float(v) for v in values)
        except (TypeError, ValueError):
            raise InvalidOptionError(f"mpp must be a number of micrometres per pixel or (x, y), got {o.mpp!r}") \
                from None
        if not (0 < mx < 1e6 and 0 < my < 1e6):
            raise InvalidOptionError(f"mpp must be positive micrometres per pixel, got {o.mpp!r}")
        o._set("mpp", (mx, my))
    if o.dicom_metadata is not None:
        o._set("dicom_metadata", os.fspath(o.dicom_metadata))
    pairs = dict(o.dicom_attributes or {})
    o._set("dicom_attributes", tuple((str(k), str(v)) for k, v in pairs.items()))


def _check_tile_size(o: ExportOptions) -> None:
    """tile_size: >= 1 (Deep Zoom) or a multiple of 16 (TIFF), within max_tile_pixels."""
    T = as_int(o.tile_size, "tile_size", error=InvalidOptionError)
    if o.format == "dzi":
        if T < 1:
            raise InvalidOptionError(f"tile_size must be >= 1, got {T}")
    elif T < 16 or T % 16:
        raise InvalidOptionError(
            f"tile_size must be a positive multiple of 16 for TIFF (TIFF 6.0 section 15), got {T}")
    if T * T > get_limits().max_tile_pixels:
        raise ResourceLimitError(f"tile_size {T} exceeds the max_tile_pixels limit {get_limits().max_tile_pixels}")
    o._set("tile_size", T)


def _check_quality(o: ExportOptions) -> None:
    """quality 1..100, psnr None or 0..200 dB."""
    q = as_int(o.quality, "quality", error=InvalidOptionError)
    if not 1 <= q <= 100:
        raise InvalidOptionError(f"quality must be 1..100, got {q}")
    o._set("quality", q)
    if o.psnr is not None:
        try:
            psnr = float(o.psnr)
        except (TypeError, ValueError):
            raise InvalidOptionError(f"psnr must be a number of dB (0: lossless), got {o.psnr!r}") from None
        if not 0 <= psnr <= 200:
            raise InvalidOptionError(f"psnr must be 0 (lossless) .. 200 dB, got {psnr:g}")
        o._set("psnr", psnr)


def _check_overlap(o: ExportOptions) -> None:
    """overlap: >= 0, Deep Zoom only, at most half the tile size."""
    OV = as_int(o.overlap, "overlap", error=InvalidOptionError)
    if OV < 0:
        raise InvalidOptionError(f"overlap must be >= 0, got {OV}")
    if OV and o.format != "dzi":
        raise InvalidOptionError("overlap applies to Deep Zoom (format dzi) only")
    if 2 * OV > o.tile_size:
        raise InvalidOptionError(f"overlap must be at most half the tile size ({o.tile_size // 2}), got {OV}")
    o._set("overlap", OV)


def _check_threads(o: ExportOptions) -> None:
    """threads: None (the CPU count) or >= 1; stored resolved."""
    n = (os.cpu_count() or 1) if o.threads is None else as_int(o.threads, "threads", error=InvalidOptionError)
    if n < 1:
        raise InvalidOptionError(f"threads must be >= 1, got {n}")
    o._set("threads", n)
