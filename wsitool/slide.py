"""The facade: ``open_slide`` / :class:`Slide` (floor 5).

:class:`Slide` takes what the opener returns (:func:`wsitool.opening.open_location`, given the
location :func:`wsitool.opening.parse_location` sorted once: byte source, pyramid, identity)
and hands region reads down to the region layer (:mod:`wsitool.read`) and associated images
to the codec layer.  Level detection, vendor rules and metadata are the format's; the
downsample of a level is ``(W0 / w + H0 / h) / 2``, as OpenSlide computes it.  Tasks that
reopen a slide elsewhere carry its ``Slide.location`` and ``Slide.identity``
(:mod:`wsitool.opening.held`).  :attr:`Slide.levels` gives read-only :class:`Level` views;
the pyramid's own levels (byte source, tile index, encoding) stay inside wsitool
(:func:`pyramid_levels`).
"""

from __future__ import annotations

import functools
import os
import threading
import types
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast, overload

import numpy as np

from . import model
from .codec.associated import decode_associated
from .codec.mosaic_blend import paint_openslide
from .deepzoom.subpixel import set_mosaic_painter
from .errors import InvalidOptionError, InvalidRegionError, SlideWarning
from .ground.naming import attach
from .metadata import SlideMetadata
from .model import AssociatedImage, Level
from .opening import Location, OpenedSlide, open_location, parse_location, read_chunk
from .read.cache import CacheScope, TileCache, scope_for
from .read.icc import COLOR_MODES, IccTransform
from .read.lazy import level_array
from .read.patches import check_patch_request, fill_all, read_patch_batches
from .read.region import read_pyramid_region
from .read.thumbnail import compose_thumbnail, thumbnail_background, thumbnail_level
from .storage import ByteSource
from .types import Chunks, Color, CupyArray, Device, Mode, OnError

if TYPE_CHECKING:
    import dask.array

__all__ = ["Level", "Slide", "open_slide", "pyramid_levels"]

set_mosaic_painter(paint_openslide)  # (the drop-in's and Deep Zoom's OpenSlide painting of mosaic levels)

#: ``(x, y)`` or ``(width, height)``: two integers.
Pair = Sequence[int]
#: Channels of a multi-channel read: an index or name, or a sequence of them.
ChannelSelection = int | str | Sequence[int | str]
_Method = TypeVar("_Method", bound=Callable[..., Any])


def _named(method: _Method) -> _Method:
    """Name the slide in what ``method`` raises (:func:`wsitool.ground.naming.attach`): the layers below
    the facade raise without it.  A method that returns an iterator gets one that names the slide
    in what its iteration raises."""
    @functools.wraps(method)
    def named(self: Slide, *args: Any, **kwargs: Any) -> Any:
        try:
            result = method(self, *args, **kwargs)
        except BaseException as exc:
            attach(exc, self.path)
            raise
        if isinstance(result, types.GeneratorType):
            return _named_iteration(result, self.path)
        return result
    return cast(_Method, named)


def _named_iteration(batches: Iterator[Any], shown: str) -> Iterator[Any]:
    """``batches``, with ``shown`` attached to what their iteration raises."""
    try:
        yield from batches
    except BaseException as exc:
        attach(exc, shown)
        raise


def _decode(source: ByteSource | None, lock: threading.Lock, image: AssociatedImage) -> np.ndarray:
    """Decode the associated image ``image`` of the slide whose source is ``source`` (a slide without a
    source of its own, a DICOM folder, has images with their own); see
    :func:`~wsitool.codec.associated.decode_associated`.  A slide's
    :class:`~wsitool.model.AssociatedImages` holds it with the source and lock bound, not the slide,
    and names the slide in its errors."""
    return decode_associated(image, cast(ByteSource, source), lock)


class Slide(SlideMetadata):
    """An open whole-slide image.  Use :func:`open_slide` to create one.

    Coordinates: ``location`` arguments are ``(x, y)`` of the top-left pixel in
    the level-0 reference frame; ``size`` arguments are ``(width, height)`` in
    pixels of the requested level.  Arrays are ``(height, width, channels)``.

    A ``Slide`` is safe to share between threads for reading regions; close it
    (or use it as a context manager) to release the file.

    Attributes:
        path: the path given; for a URL, the URL without credentials or query
            (:func:`wsitool.storage.redact`), as every message names it.
        location: where the slide is (:class:`wsitool.opening.Location`: its kind, the path or
            URL, the storage options it is read with); picklable, what a task that reopens the
            slide elsewhere carries (internal type: :mod:`wsitool.opening`).
        identity: one version of the slide, taken at open: ``(mtime_ns, size)`` of a local
            file or folder, ``(url, size, etag)`` of an object by URL, ``(url, total size,
            digest)`` of a bucket prefix or DICOMweb series
            (:func:`wsitool.opening.opener.slide_identity`).

    Its metadata (``vendor``, ``levels``, ``properties``, ``mpp``, ``problems``, ...) is
    :class:`~wsitool.metadata.SlideMetadata`'s.

    Raises:
        FileNotFoundError: (from the constructor, as all below) the path does not exist.
        UnsupportedFormatError: not a slide format wsitool reads (e.g. random
            bytes, a DICOM file that is not a whole-slide image), a directory
            without one DICOM series, or a file without a usable image.
        CorruptFileError: the container's structure is broken.
    """

    def __init__(self, path: str | os.PathLike[str] | Location | OpenedSlide, cache: TileCache | int | None = None,
                 storage_options: dict[str, Any] | None = None, scene: int | None = None) -> None:
        self._closed = False
        self._tile_cache: CacheScope | None = scope_for(cache)
        if isinstance(path, OpenedSlide):
            if storage_options or scene is not None:
                raise InvalidOptionError(f"{path.location.shown}: the slide is open already; its location "
                                         "carries its storage and format options")
            opened = path
        else:
            opened = open_location(parse_location(path, storage_options, scene_options(scene)))
        self.location = opened.location
        self.identity = opened.identity
        self.path = opened.location.shown
        #: the file's byte source (None where the format opened its own: a folder, a prefix, a series)
        self._source: ByteSource | None = opened.source
        #: requests and bytes the open took (a remote file)
        self._open_stats = opened.open_stats
        #: held while a format's own decoder (tifffile) reads associated images
        self._lock = threading.Lock()
        super().__init__(opened.pyramid, functools.partial(_decode, self._source, self._lock), self.path)
        #: the pyramid's own levels (byte source, tile index, encoding): wsitool's, see pyramid_levels
        self._levels: tuple[model.PyramidLevel, ...] = opened.pyramid.levels
        self._icc: IccTransform | None = None  # built on the first color="icc" read
        kind = "DICOM series" if self.vendor == "dicom" else "TIFF structure"
        for message in self.problems:
            warnings.warn(f"{self.path}: {kind}: {message} (opened anyway, with "
                          f"{self.level_count} level(s))", SlideWarning, stacklevel=3)

    # ------------------------------------------------------------------ reading

    @overload
    def read_region(self, location: Pair, level: int, size: Pair, *, out: np.ndarray | None = None,
                    mode: Mode = "rgba", threads: int | None = None, on_error: OnError = "raise",
                    device: Literal["cpu"] = "cpu", color: Color | None = None, downsample: int = 1,
                    channels: ChannelSelection | None = None) -> np.ndarray: ...

    @overload
    def read_region(self, location: Pair, level: int, size: Pair, *, out: CupyArray | None = None,
                    mode: Mode = "rgba", threads: int | None = None, on_error: OnError = "raise",
                    device: Literal["cuda"] | str, color: Color | None = None, downsample: int = 1,
                    channels: ChannelSelection | None = None) -> CupyArray: ...

    @_named
    def read_region(self, location: Pair, level: int, size: Pair, *, out: np.ndarray | CupyArray | None = None,
                    mode: Mode = "rgba", threads: int | None = None, on_error: OnError = "raise",
                    device: Device | str = "cpu", color: Color | None = None, downsample: int = 1,
                    channels: ChannelSelection | None = None) -> np.ndarray | CupyArray:
        """Read a region: a NumPy array, or a CuPy array with ``device="cuda"``.

        Args:
            location: ``(x, y)`` of the top-left pixel in the level-0 reference frame.
            level: level index.
            size: ``(width, height)`` in pixels of ``level``.
            out: optional preallocated C-contiguous array of the exact output
                shape and dtype, filled in place and returned.
            mode: ``"rgba"`` -> ``(height, width, 4)`` uint8 (default, OpenSlide);
                ``"rgb"`` -> ``(height, width, 3)`` uint8; ``"raw"`` ->
                ``(height, width, samples)`` in the level's native dtype.
            threads: worker threads for this read (default: CPU count).
            on_error: ``"raise"`` or ``"fill"`` (corrupt tiles become background).
            device: ``"cpu"`` (numpy output) or ``"cuda"`` (CuPy output).
            color: None (default: the stored pixels, untouched) or ``"icc"``:
                convert from the slide's embedded ICC profile to sRGB with
                LittleCMS (:mod:`wsitool.read.icc`); for ``rgb`` / ``rgba`` on
                the CPU; a slide without a profile is returned unchanged.
            downsample: 1, 2, 4 or 8: ``level`` read at ``1/downsample`` scale
                (``size`` in pixels of that scale; :mod:`wsitool.read.reduced`).
            channels: a multi-channel (fluorescence) slide's channels to read
                (:attr:`channels`): None (all), an index or name, or a sequence
                of them in the order wanted.  ``raw`` then gives ``(height,
                width, len(channels))``; ``rgb`` / ``rgba`` the composite of those
                channels (each through its display colour, added, clipped; see
                :mod:`wsitool.read.channels`).

        Returns:
            The filled array (``out`` itself when given).

        Raises:
            InvalidRegionError: malformed request or ``out`` (also ``ValueError``).
            ResourceLimitError: output over the configured limits (before allocating).
            TileDecodeError: a corrupt tile, with ``on_error="raise"``.
            UnsupportedFormatError: ``rgb``/``rgba`` for samples without an RGB conversion.
            DeviceUnavailableError: ``device="cuda"`` without a usable GPU.
        """
        if color not in COLOR_MODES:
            raise InvalidRegionError(f"{self.path}: color must be None or 'icc', got {color!r}")
        if color is not None and (mode == "raw" or device != "cpu"):
            raise InvalidRegionError(f"{self.path}: color='icc' applies to mode 'rgb' / 'rgba' on the CPU")
        region = read_pyramid_region(self._levels, location, level, size, out=out, mode=mode,
                                     threads=threads, on_error=on_error, device=device,
                                     cache=self._tile_cache, downsample=downsample, channels=channels)
        if color == "icc" and self.color_profile is not None:
            if self._icc is None:
                self._icc = IccTransform(self.color_profile)
            self._icc.apply(region)
        return region

    @overload
    def read_patches(self, locations: Sequence[Pair] | np.ndarray, size: Pair, *, level: int = 0,
                     read_size: Sequence[float] | None = None, batch_size: int = 64, mode: Mode = "rgb",
                     threads: int | None = None, on_error: OnError = "raise", device: Device | str = "cpu",
                     out: None = None, channels: ChannelSelection | None = None) -> Iterator[Any]: ...

    @overload
    def read_patches(self, locations: Sequence[Pair] | np.ndarray, size: Pair, *, level: int = 0,
                     read_size: Sequence[float] | None = None, batch_size: int = 64, mode: Mode = "rgb",
                     threads: int | None = None, on_error: OnError = "raise", device: Device | str = "cpu",
                     out: np.ndarray | CupyArray, channels: ChannelSelection | None = None) -> Any: ...

    @_named
    def read_patches(self, locations: Sequence[Pair] | np.ndarray, size: Pair, *, level: int = 0,
                     read_size: Sequence[float] | None = None, batch_size: int = 64, mode: Mode = "rgb",
                     threads: int | None = None, on_error: OnError = "raise", device: Device | str = "cpu",
                     out: Any = None, channels: ChannelSelection | None = None) -> Iterator[Any] | Any:
        """Read many patches of one size, decoding each tile once per batch.

        The patches of a batch are grouped by the tiles they touch and each tile
        is decoded once (on ``threads`` threads, with the compiled JPEG loop where
        it applies), then copied into every patch that needs it; see
        :mod:`wsitool.read.patches`.  Each patch equals
        ``read_region(location, level, size, mode=mode)`` bit for bit.  Sort the
        locations (row by row) when their order is free: only patches of the same
        batch share decoded tiles.

        Args:
            locations: level-0 ``(x, y)`` of each patch's top-left corner: a
                sequence of pairs or an ``(n, 2)`` integer array; may lie partly
                or wholly outside the slide (those pixels are 0, alpha 0).
            size: ``(width, height)`` of each patch, pixels.
            level: the level read.
            read_size: None (default), or ``(width, height)`` of the window read
                at ``level`` for each patch (floats allowed, e.g. 448 or 490.8),
                then reduced to ``size`` by the exact area filter
                (:mod:`wsitool.ground.areafilter`: the mean over each output pixel's
                footprint).  The window is ``ceil(read_size)`` pixels; the filter
                maps ``[0, read_size)`` onto the patch.  8-bit samples, CPU only.
            batch_size: patches per batch (the last batch may be smaller).
            mode: ``"rgb"`` (default) -> ``(b, h, w, 3)`` uint8; ``"rgba"`` ->
                ``(b, h, w, 4)`` uint8; ``"raw"`` -> ``(b, h, w, samples)`` in the
                level's dtype.
            threads: decode threads (default: the CPU count).
            on_error: ``"raise"`` or ``"fill"``, per patch as :meth:`read_region`'s: a
                corrupt tile fails (or becomes background in, with a
                :class:`~wsitool.errors.TileWarning`) the patches whose windows meet
                its corrupt data; a patch that needs only clean rows of it gets them.
            device: ``"cpu"`` (numpy) or ``"cuda"`` / ``"cuda:N"`` (CuPy; each
                patch is one GPU region read for now: tiles are not yet shared
                between patches on the GPU).
            out: None (default: return an iterator of batches), or an ``(n, h, w, c)``
                C-contiguous array of the output dtype, filled in place and returned.
            channels: as :meth:`read_region`'s (multi-channel slides, CPU only).

        Returns:
            Without ``out``: an iterator of ``(b, h, w, c)`` arrays, in input
            order, ``b <= batch_size``.  With ``out``: ``out``.

        Raises:
            InvalidRegionError: malformed locations, size, read_size, batch_size,
                threads, mode, level or ``out`` (also ``ValueError``); raised by
                the call itself, before any tile is read.
            ResourceLimitError: a window or one batch over the configured limits.
            UnsupportedFormatError: ``rgb``/``rgba`` of samples without an RGB conversion.
            TileDecodeError: a corrupt tile, with ``on_error="raise"`` (from the
                iteration that reaches it).
            DeviceUnavailableError: ``device="cuda"`` without a usable GPU.
        """
        req = check_patch_request(self._levels, locations, size, level=level, read_size=read_size,
                                  batch_size=batch_size, mode=mode, threads=threads, on_error=on_error,
                                  device=device, channels=channels)
        if out is not None:
            return fill_all(req, out, self._tile_cache)
        return read_patch_batches(req, self._tile_cache)

    @_named
    def to_dask(self, level: int = 0, *, chunks: Chunks = "tile", threads: int = 1) -> dask.array.Array:
        """Level ``level`` as a lazy ``dask.array.Array`` ``(height, width, 3)`` uint8.

        Each chunk is read with ``read_region(..., mode="rgb")`` when computed;
        the graph holds this slide's :attr:`location` (a local path made absolute) and
        :attr:`identity`, not the open file, so it runs on remote Dask workers (each opens
        the slide once, :func:`wsitool.opening.held.cached_slide`, and refuses a slide
        changed since it was opened here).  A URL's location holds its ``storage_options``,
        credentials included (as an fsspec file system pickled into a graph would): give
        workers their credentials through their environment instead where the graph must
        not carry them.
        See :func:`wsitool.read.lazy.level_array` (chunking).  Needs the
        optional extra ``wsitool[dask]``.  ``threads``: decode threads per chunk
        read (default 1: Dask already runs chunks in parallel).

        Raises:
            DaskUnavailableError: dask is not installed.
            InvalidRegionError: ``level`` out of range or bad ``chunks``.
        """
        return level_array(self._levels, self.location.resolved(), level,
                           functools.partial(read_chunk, opener=open_slide), stamp=self.identity, chunks=chunks,
                           threads=threads)

    @_named
    def get_thumbnail(self, size: Pair, *, background: tuple[int, int, int] | None = None) -> np.ndarray:
        """An RGB thumbnail that fits within ``size = (width, height)``, aspect ratio kept.

        As OpenSlide: the whole level best suited to ``max(W0 / width, H0 / height)``
        (:meth:`get_best_level_for_downsample`) is read as RGBA, laid over the
        background colour and shrunk with Lanczos resampling (Pillow's
        ``Image.thumbnail``: each side at most the asked one, never enlarged).

        Args:
            size: ``(width, height)``, the largest thumbnail wanted, pixels (positive).
            background: ``(r, g, b)`` behind transparent pixels; default the
                slide's ``openslide.background-color`` property, else white.

        Returns:
            ``(height, width, 3)`` uint8.

        Raises:
            InvalidOptionError: ``size`` is not two positive integers (also ``ValueError``).
            ResourceLimitError: the level read is over the configured limits.
            TileDecodeError: a corrupt tile.
        """
        wh, level = thumbnail_level(size, self.dimensions, self.level_downsamples)
        rgba = self.read_region((0, 0), level, self.level_dimensions[level])
        return compose_thumbnail(rgba, thumbnail_background(self.properties) if background is None else background, wh)

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Release the file.  Reading afterwards raises :class:`WsiError`.

        Idempotent and safe to call from any thread.  Region reads already
        running in other threads finish first (``close`` waits for them), and
        reads started once ``close`` was called raise :class:`WsiError`; so no
        read ever uses the descriptor after it was released (the process may
        give its number to another file).  Do not call it from inside a read
        of the same slide (it would wait for itself).
        """
        self._closed = True
        source = getattr(self, "_source", None)
        if source is not None:
            source.close()
        scope = getattr(self, "_tile_cache", None)
        if scope is not None:
            scope.close()
        pyramid = getattr(self, "_pyramid", None)
        if pyramid is not None and pyramid.release is not None:
            with self._lock:
                pyramid.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def __enter__(self) -> Slide:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        # no module globals here (contextlib, ...): at interpreter exit they may already be None
        try:  # noqa: SIM105 - contextlib may be gone at interpreter exit
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"Slide({self.path!r}, vendor={self.vendor!r}, levels={self.level_count})"


def scene_options(scene: int | None) -> dict[str, Any] | None:
    """The format options of ``scene`` (:func:`open_slide`): ``{"scene": scene}``, or None."""
    return None if scene is None else {"scene": scene}


def open_slide(path: str | os.PathLike | Location, cache: TileCache | int | None = None,
               storage_options: dict | None = None, scene: int | None = None) -> Slide:
    """Open a whole-slide image (Aperio SVS and the other TIFF-based vendors, generic tiled TIFF,
    OME-TIFF, DICOM WSI, Zeiss CZI).

    ``path`` is a file, or for DICOM a file of the series (the other instances
    are found beside it) or a folder holding one series; or the URL of a
    TIFF-based slide: ``http://``, ``https://`` (presigned URLs too), ``s3://``,
    ``gs://``, ``az://`` (needs ``pip install 'wsitool[remote]'``; see
    :mod:`wsitool.storage.remote` for how it is read); or a location parsed before
    (:func:`wsitool.opening.parse_location`, carrying its storage options).

    ``storage_options`` (URLs only): ``timeout`` (seconds per request, default
    20), ``operation_timeout`` (seconds per read, default 120), ``retries``
    (default 4), ``concurrency`` (requests in flight per slide, default 16);
    HTTP(S): ``headers``, ``verify``; object stores: obstore's keys or the
    fsspec names tiffslide takes (``anon``, ``key``, ``secret``, ``token``,
    ``endpoint_url``, ``region_name``, ``account_name``, ``account_key``,
    ``sas_token``; :mod:`wsitool.storage.remote.transports.objectstore`).

    ``scene`` (Zeiss CZI only): the scene to read alone (0, 1, ...; ``wsitool info`` lists
    them); None (default) reads every scene on one canvas, as OpenSlide shows the slide
    (``openslide.region[N].*`` say where each is).  A slide of another format refuses it
    (:class:`~wsitool.errors.InvalidOptionError`).

    Returns a :class:`Slide`, usable as a context manager.

    ``cache``: a :class:`~wsitool.read.cache.TileCache` to keep decoded tiles in
    (shared by every slide opened with it, each in its own scope), an int (the
    byte budget of a cache of this slide's own), or None (default: no cache; reads
    decode every tile they touch).  See :mod:`wsitool.read.cache`.

    Raises:
        FileNotFoundError: ``path`` does not exist (for a URL:
            :class:`~wsitool.errors.RemoteNotFoundError`, a subclass).
        UnsupportedFormatError: not a slide format wsitool reads (random bytes, a
            folder without exactly one DICOM series).
        CorruptFileError: broken container structure (bad header or IFD, zero-size image).
        RemoteAccessError: access denied, expired credentials or presigned URL.
        RemoteUnavailableError: the server kept failing after the retries.
        InvalidOptionError: storage options for a local path, or a bad one; a ``scene`` the
            slide does not have, or for a format without scenes.
        WsiError: a URL without the ``wsitool[remote]`` extra installed.
    """
    return Slide(path, cache=cache, storage_options=storage_options, scene=scene)


def pyramid_levels(slide: Slide) -> tuple[model.PyramidLevel, ...]:
    """The pyramid's own levels of ``slide`` (byte source, tile index, encoding), largest first.

    For wsitool's own layers (export, the server, batch reads); not part of the
    stable API: users read :attr:`Slide.levels`, the read-only views."""
    return slide._levels
