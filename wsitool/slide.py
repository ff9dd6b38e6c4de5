"""The slide container: open a TIFF-based whole-slide image and describe its pyramid.

tifffile parses the TIFF structure (IFDs, SubIFDs, tags); this module decides
which images are pyramid levels and which are associated images, gathers the
metadata (vendor, MPP, objective power), and hands region reads to
:mod:`wsitool.region`.

Level-detection rule (one rule for every layout):

1. Candidates are all IFDs of the file, top-level and SubIFDs (TIFF tag 330,
   used by OME-TIFF pyramids), with non-zero width and height that are not
   transparency masks (NewSubfileType bit 2).
2. Vendor layouts first remove associated images.  Aperio (ImageDescription
   starting with "Aperio"): every stripped IFD is an associated image: the
   second IFD is the thumbnail, the others are named "label" / "macro" from
   their ImageDescription or, when it lacks the word, from NewSubfileType
   (1 = label, 9 = macro, as written by Aperio GT450 scanners).  Source:
   OpenSlide's Aperio format notes (openslide.org/formats/aperio).
   OME-TIFF: the OME Images after the first (each a tifffile series) are
   associated images named by their ``Name`` (``label``, ``macro``), never
   levels.
3. Level 0 is the candidate with the largest area (the first one in file order
   on a tie).  Every other candidate is a level if it has the same samples
   per pixel and sample type, a strictly smaller area than the previous level,
   and the same aspect ratio within one pixel of rounding: some single factor
   ``d`` gives both ``|W0 / d - w| < 1`` and ``|H0 / d - h| < 1`` (the ranges
   of factors allowed by each axis overlap).  Neither the reduced-resolution flag, nor tiling, nor
   power-of-two factors are required: stripped levels are read strip by strip
   as one-column tile grids, and downsamples such as 3 or 12 are valid.
   Candidates that fail the test (e.g. a 200 x 200 stripped overview in a
   1024 x 768 pyramid) are not levels.

The downsample of a level is ``(W0 / w + H0 / h) / 2``, as OpenSlide computes it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import struct
import threading
import types
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any, Iterator

import numpy as np
import tifffile

from .errors import (
    CorruptFileError,
    ResourceLimitError,
    SlideWarning,
    UnsupportedFormatError,
    WsiError,
    raise_if_os_resource,
)

__all__ = ["Level", "Slide", "open_slide"]

_JPEG = 7
_LZW = 5
_J2K_COMPRESSIONS = {33003, 33005, 34712}
_WEBP_COMPRESSIONS = {34927, 50001}  # tifffile COMPRESSION.WEBP (50001) and the older code
_ADOBE_RGB = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00"  # APP14, transform 0
_PHOTOMETRIC_RGB = 2
_PHOTOMETRIC_YCBCR = 6


class Level:
    """One pyramid level: geometry, tile grid and encoding.

    Public attributes (read-only by convention):
        index: level number, 0 = full resolution.
        width, height: level size in pixels of this level.
        downsample: ``(W0 / width + H0 / height) / 2`` relative to level 0.
        tile_width, tile_height: tile size in pixels; for a stripped level the
            image width and RowsPerStrip.
        tiles_across, tiles_down: size of the tile grid (columns, rows).
        tiled: False for a stripped level.
        compression: TIFF compression name, e.g. ``"JPEG"``, ``"APERIO_JP2000_RGB"``.
        photometric: TIFF photometric name, e.g. ``"RGB"``, ``"YCBCR"``, ``"MINISBLACK"``.
        samples: samples per pixel.
        dtype: numpy dtype of one sample (native byte order).
        decoder: ``"nvimagecodec"`` or ``"tifffile"``, who decodes the tiles.
        compression_problem: None, or why no decoder reads this level's tiles
            (``"unsupported compression 52479"``); reads then raise
            :class:`UnsupportedFormatError`.
    """

    def __init__(self, slide_path: str, fd: int, file_size: int, index: int,
                 page: tifffile.TiffPage, base_size: tuple[int, int]):
        self._path = slide_path
        self._fd = fd
        self._file_size = file_size
        self._page = page
        self.index = index
        self.width = int(page.imagewidth)
        self.height = int(page.imagelength)
        w0, h0 = base_size
        self.downsample = (w0 / self.width + h0 / self.height) / 2.0
        self.tiled = bool(page.is_tiled)
        if self.tiled:
            self.tile_width = int(page.tilewidth)
            self.tile_height = int(page.tilelength)
        else:
            rps = int(page.rowsperstrip or self.height)
            self.tile_width = self.width
            self.tile_height = max(1, min(rps, self.height))
        if self.tile_width <= 0 or self.tile_height <= 0:
            raise CorruptFileError(f"{slide_path}: level {index} has a zero tile size")
        self.tiles_across = -(-self.width // self.tile_width)
        self.tiles_down = -(-self.height // self.tile_height)
        self.samples = int(page.samplesperpixel)
        self.dtype = np.dtype(page.dtype).newbyteorder("=") if page.dtype is not None else None
        if self.dtype is None:
            raise UnsupportedFormatError(
                f"{slide_path}: level {index}: unsupported sample format "
                f"({page.bitspersample} bits, SampleFormat {page.sampleformat})"
            )
        if page.imagedepth > 1:
            raise UnsupportedFormatError(f"{slide_path}: level {index}: volumetric TIFF (ImageDepth > 1)")
        self.compression = _enum_name(page.compression)
        self.photometric = _enum_name(page.photometric)
        self._compression_code = int(page.compression)
        self._photometric_code = int(page.photometric)
        self._planes = self.samples if (int(page.planarconfig) == 2 and self.samples > 1) else 1
        self._offsets = np.asarray(page.dataoffsets, dtype=np.uint64)
        self._bytecounts = np.asarray(page.databytecounts, dtype=np.uint64)
        expected = self._planes * self.tiles_across * self.tiles_down
        if len(self._offsets) < expected or len(self._bytecounts) < expected:
            raise CorruptFileError(
                f"{slide_path}: level {index}: {len(self._offsets)} tile offsets for a grid "
                f"of {expected} tiles"
            )
        comp = self._compression_code
        eight_bit_rgb = (
            self.samples == 3 and self._planes == 1 and self.dtype == np.uint8
        )
        self._stream_kind = (
            "jpeg" if comp == _JPEG
            else "j2k" if comp in _J2K_COMPRESSIONS
            else "webp" if comp in _WEBP_COMPRESSIONS
            else "lzw" if comp == _LZW
            else None
        )
        # Colour transform wsitool applies after decoding: Aperio 33003 stores YCbCr J2K.
        self._ycbcr_after_decode = comp == 33003
        if comp == _JPEG and eight_bit_rgb and self._photometric_code in (
            _PHOTOMETRIC_RGB, _PHOTOMETRIC_YCBCR
        ):
            self._codec = "nv"
        elif comp in _J2K_COMPRESSIONS and eight_bit_rgb:
            self._codec = "nv"
        else:
            self._codec = "generic"
        self.decoder = "nvimagecodec" if self._codec == "nv" else "tifffile"
        self.compression_problem = (
            None if self._codec == "nv" or comp in tifffile.TIFF.DECOMPRESSORS
            else f"unsupported compression {self.compression}"
        )
        self._jpeg_prefix = b""
        if comp == _JPEG:
            tables = page.jpegtables
            prefix = b"\xff\xd8"
            if self._photometric_code == _PHOTOMETRIC_RGB and self._codec == "nv":
                prefix += _ADOBE_RGB
            if tables and len(tables) > 4:
                prefix += bytes(tables[2:-2])
            self._jpeg_prefix = prefix if prefix != b"\xff\xd8" else b""
        self._extrasamples = (tuple(np.atleast_1d(page.extrasamples).tolist())
                              if page.extrasamples is not None else ())
        self._colormap = page.colormap
        self._bits = int(page.bitspersample)
        #: Why ``rgb`` / ``rgba`` reads of this level are refused (None: they work).
        self._rgb_problem = _rgb_problem(page)

    @property
    def dimensions(self) -> tuple[int, int]:
        """``(width, height)`` in pixels of this level."""
        return (self.width, self.height)

    @property
    def tile_size(self) -> tuple[int, int]:
        """``(tile_width, tile_height)`` in pixels."""
        return (self.tile_width, self.tile_height)

    def __repr__(self) -> str:
        return (
            f"Level({self.index}, {self.width}x{self.height}, downsample={self.downsample:.4g}, "
            f"tile={self.tile_width}x{self.tile_height}, {self.compression}/{self.photometric}, "
            f"{self.samples}x{self.dtype})"
        )


def _enum_name(value) -> str:
    return getattr(value, "name", str(value))


class _AssociatedImages(Mapping):
    """Lazy read-only mapping: name -> ``(height, width, 3)`` uint8 RGB array."""

    def __init__(self, slide: "Slide", pages: dict[str, tifffile.TiffPage]):
        self._slide = slide
        self._pages = pages
        self._cache: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._pages:
            raise KeyError(name)
        if name not in self._cache:
            self._cache[name] = self._slide._read_associated(name, self._pages[name])
        return self._cache[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._pages)

    def __len__(self) -> int:
        return len(self._pages)

    def __repr__(self) -> str:
        return f"<associated images {list(self._pages)}>"


class Slide:
    """An open whole-slide image.  Use :func:`open_slide` to create one.

    Coordinates: ``location`` arguments are ``(x, y)`` of the top-left pixel in
    the level-0 reference frame; ``size`` arguments are ``(width, height)`` in
    pixels of the requested level.  Arrays are ``(height, width, channels)``.

    A ``Slide`` is safe to share between threads for reading regions; close it
    (or use it as a context manager) to release the file.

    Raises (from the constructor):
        FileNotFoundError: the path does not exist.
        UnsupportedFormatError: not a TIFF (e.g. DICOM, random bytes), a
            directory, or a TIFF without a usable image.
        CorruptFileError: the TIFF structure is broken.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if os.path.isdir(self.path):
            raise UnsupportedFormatError(
                f"{self.path}: is a directory (multi-file formats such as DICOM folders "
                "are not supported yet)"
            )
        self._fd = os.open(self.path, os.O_RDONLY)  # FileNotFoundError passes through
        self._lock = threading.Lock()
        # Reads in flight (see _reading): close() waits for them, so a read never
        # uses a descriptor number the process has meanwhile given to another file.
        self._readers = 0
        self._closing = False
        self._idle = threading.Condition(self._lock)
        self._tiff: tifffile.TiffFile | None = None
        #: What tifffile reported while parsing the structure (e.g. "invalid page
        #: offset 828578": an IFD past the end of the file, i.e. a truncated
        #: file); each is also emitted as a :class:`~wsitool.errors.SlideWarning`.
        self.problems: list[str] = []
        try:
            self._file_size = os.fstat(self._fd).st_size
            with _tifffile_messages() as messages:
                self._open()
        except BaseException:
            self.close()
            raise
        for message in messages:
            self.problems.append(message)
            warnings.warn(f"{self.path}: TIFF structure: {message} (opened anyway, with "
                          f"{self.level_count} level(s))", SlideWarning, stacklevel=3)

    # ------------------------------------------------------------------ opening

    def _open(self) -> None:
        head = os.pread(self._fd, 132, 0)
        if len(head) >= 132 and head[128:132] == b"DICM":
            raise UnsupportedFormatError(f"{self.path}: DICOM files are not supported yet (unsupported format)")
        if head[:4] not in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
            raise UnsupportedFormatError(
                f"{self.path}: not a TIFF file (unsupported format; header {head[:4]!r})"
            )
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._tiff = tifffile.TiffFile(self.path)
                pages = list(self._tiff.pages)
        except tifffile.TiffFileError as exc:
            raise CorruptFileError(f"{self.path}: unreadable TIFF structure: {exc}") from None
        except _MALFORMED as exc:
            raise_if_os_resource(exc, self.path)  # EMFILE, ENOMEM, EIO: the machine's, not the file's
            # tifffile trusts tag types and counts; a tag of the wrong type or
            # count surfaces as TypeError/ValueError/... deep inside it.
            raise CorruptFileError(
                f"{self.path}: unreadable TIFF structure: {type(exc).__name__}: {exc}"
            ) from None
        try:
            self._find_levels(pages)
        except WsiError:
            raise
        except _MALFORMED as exc:
            raise_if_os_resource(exc, self.path)
            raise CorruptFileError(
                f"{self.path}: malformed TIFF tags: {type(exc).__name__}: {exc}"
            ) from None

    def _find_levels(self, pages: list) -> None:
        """Apply the level-detection rule of the module docstring to ``pages``."""
        if not pages:
            # TIFF 6.0 section 2 requires at least one IFD; none readable means a
            # truncated file or a first-IFD offset pointing nowhere.
            raise CorruptFileError(
                f"{self.path}: no readable image file directory (truncated or corrupt TIFF)"
            )
        first_desc = _description(pages[0])
        self.vendor = "generic-tiff"
        if first_desc.startswith("Aperio"):
            self.vendor = "aperio"
        elif self._tiff.is_ome:
            self.vendor = "ome-tiff"

        candidates: list[tuple[tifffile.TiffPage, int]] = []  # (page, top-level index)
        for i, page in enumerate(pages):
            if not isinstance(page, tifffile.TiffPage):
                continue
            candidates.append((page, i))
            if page.subifds:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        for sub in tifffile.TiffPages(page):
                            if isinstance(sub, tifffile.TiffPage):
                                candidates.append((sub, i))
                except Exception as exc:
                    raise CorruptFileError(f"{self.path}: unreadable SubIFD: {exc}") from None

        associated: dict[str, tifffile.TiffPage] = {}
        level_pool: list[tifffile.TiffPage] = []
        ome_other = _ome_other_images(self._tiff) if self.vendor == "ome-tiff" else {}
        for page, top_index in candidates:
            _check_page(self.path, page, top_index)
            if page.imagewidth <= 0 or page.imagelength <= 0:
                continue
            if int(page.subfiletype) & 4:  # transparency mask
                continue
            if top_index in ome_other:  # a further OME Image (label, macro): never a level
                if page is pages[top_index]:
                    associated.setdefault(ome_other[top_index], page)
                continue
            name = self._associated_name(page, top_index) if self.vendor == "aperio" else None
            if name is not None:
                associated.setdefault(name, page)
            else:
                level_pool.append(page)
        if not level_pool:
            if any(p.imagewidth <= 0 or p.imagelength <= 0 for p, _ in candidates):
                raise CorruptFileError(f"{self.path}: image has zero width or height")
            raise UnsupportedFormatError(f"{self.path}: no image usable as a slide level")

        base = max(level_pool, key=lambda p: p.imagewidth * p.imagelength)  # first on ties
        w0, h0 = int(base.imagewidth), int(base.imagelength)
        chosen = [base]
        for page in sorted(level_pool, key=lambda p: -(p.imagewidth * p.imagelength)):
            if page is base:
                continue
            last = chosen[-1]
            w, h = int(page.imagewidth), int(page.imagelength)
            if w * h >= last.imagewidth * last.imagelength:
                continue
            if page.samplesperpixel != base.samplesperpixel or page.dtype != base.dtype:
                continue
            if _same_aspect(w0, h0, w, h):
                chosen.append(page)
        self.levels: tuple[Level, ...] = tuple(
            Level(self.path, self._fd, self._file_size, i, page, (w0, h0))
            for i, page in enumerate(chosen)
        )
        self._associated = _AssociatedImages(self, associated)
        self._properties = types.MappingProxyType(self._build_properties(base, first_desc))

    def _associated_name(self, page: tifffile.TiffPage, top_index: int) -> str | None:
        """Aperio rule: stripped IFDs are associated images (see module docstring)."""
        if page.is_tiled:
            return None
        desc = _description(page).lower()
        if re.search(r"\blabel\b", desc):
            return "label"
        if re.search(r"\bmacro\b", desc):
            return "macro"
        subfile = int(page.subfiletype)
        if subfile == 9:
            return "macro"
        if subfile == 1 and top_index != 1:
            return "label"
        if top_index == 1:
            return "thumbnail"
        return f"associated-{top_index}"

    def _build_properties(self, base: tifffile.TiffPage, desc: str) -> dict[str, str]:
        props: dict[str, str] = {"openslide.vendor": self.vendor}
        tags = base.tags
        for tag_name in ("ImageDescription", "Make", "Model", "Software", "DateTime", "Artist",
                         "Copyright", "HostComputer", "DocumentName"):
            tag = tags.get(tag_name)
            if tag is not None and isinstance(tag.value, str):
                props[f"tiff.{tag_name}"] = tag.value
        res = _resolution_mpp(base)
        if res is not None:
            xres, yres, unit, mppx, mppy = res
            props["tiff.XResolution"] = repr(xres)
            props["tiff.YResolution"] = repr(yres)
            props["tiff.ResolutionUnit"] = unit
        mpp_x = mpp_y = None
        objective = None
        if self.vendor == "aperio":
            fields = desc.split("|")
            for field in fields[1:]:
                if "=" in field:
                    key, _, value = field.partition("=")
                    props[f"aperio.{key.strip()}"] = value.strip()
            mpp_x = mpp_y = _positive_float(props.get("aperio.MPP"))
            objective = _positive_float(props.get("aperio.AppMag"))
        elif self.vendor == "ome-tiff":
            mpp_x, mpp_y, objective = _ome_metadata(self._tiff.ome_metadata or "", props)
        if mpp_x is None and self.vendor != "aperio" and res is not None:
            mpp_x, mpp_y = res[3], res[4]
        if mpp_x is not None and mpp_y is not None:
            props["openslide.mpp-x"] = repr(float(mpp_x))
            props["openslide.mpp-y"] = repr(float(mpp_y))
        if objective is not None:
            props["openslide.objective-power"] = _num_str(objective)
        props["openslide.level-count"] = str(len(self.levels))
        for lv in self.levels:
            p = f"openslide.level[{lv.index}]"
            props[f"{p}.width"] = str(lv.width)
            props[f"{p}.height"] = str(lv.height)
            props[f"{p}.downsample"] = repr(lv.downsample)
            props[f"{p}.tile-width"] = str(lv.tile_width)
            props[f"{p}.tile-height"] = str(lv.tile_height)
        return props

    # ------------------------------------------------------------------ metadata

    @property
    def level_count(self) -> int:
        """Number of pyramid levels."""
        return len(self.levels)

    @property
    def dimensions(self) -> tuple[int, int]:
        """``(width, height)`` of level 0 in pixels."""
        return self.levels[0].dimensions

    @property
    def level_dimensions(self) -> tuple[tuple[int, int], ...]:
        """``(width, height)`` of each level in pixels."""
        return tuple(lv.dimensions for lv in self.levels)

    @property
    def level_downsamples(self) -> tuple[float, ...]:
        """Downsample factor of each level relative to level 0."""
        return tuple(lv.downsample for lv in self.levels)

    @property
    def properties(self) -> Mapping[str, str]:
        """Read-only metadata mapping.

        OpenSlide-compatible keys: ``openslide.vendor``, ``openslide.mpp-x``,
        ``openslide.mpp-y`` (micrometres per pixel), ``openslide.objective-power``,
        ``openslide.level-count``, ``openslide.level[N].width|height|downsample|
        tile-width|tile-height``; raw TIFF tags as ``tiff.<TagName>``; vendor
        fields as ``aperio.<Key>`` or ``ome.<Attribute>``.
        """
        return self._properties

    @property
    def mpp(self) -> tuple[float, float] | None:
        """``(mpp_x, mpp_y)`` in micrometres per level-0 pixel, or None if unknown.

        Sources, in order: Aperio ``MPP`` field of the ImageDescription; OME
        ``PhysicalSizeX/Y`` (converted from their unit); TIFF XResolution /
        YResolution rationals with ResolutionUnit centimetre (1e4 / res) or
        inch (25400 / res) (TIFF 6.0, section 8).
        """
        x = self._properties.get("openslide.mpp-x")
        y = self._properties.get("openslide.mpp-y")
        return (float(x), float(y)) if x is not None and y is not None else None

    @property
    def mpp_x(self) -> float | None:
        """Micrometres per level-0 pixel horizontally, or None."""
        return self.mpp[0] if self.mpp else None

    @property
    def mpp_y(self) -> float | None:
        """Micrometres per level-0 pixel vertically, or None."""
        return self.mpp[1] if self.mpp else None

    @property
    def objective_power(self) -> float | None:
        """Scanner objective magnification (e.g. 20.0), or None if unknown."""
        v = self._properties.get("openslide.objective-power")
        return float(v) if v is not None else None

    @property
    def associated_images(self) -> Mapping[str, np.ndarray]:
        """Lazy mapping of associated image name (``label``, ``macro``,
        ``thumbnail``) to a ``(height, width, 3)`` uint8 RGB array.

        Each image is decoded on first access.  Reading an entry raises
        ``KeyError`` for an unknown name, :class:`ResourceLimitError` for an
        image over the region limits, :class:`UnsupportedFormatError` for
        samples without an RGB conversion, :class:`CorruptFileError` or
        :class:`WsiError` when it cannot be decoded."""
        return self._associated

    def get_best_level_for_downsample(self, downsample: float) -> int:
        """Index of the largest level whose downsample is <= ``downsample``.

        OpenSlide semantics: a value below level 0's downsample gives 0, one
        above the last level's gives the last level.
        """
        ds = self.level_downsamples
        if downsample < ds[0]:
            return 0
        for i in range(1, len(ds)):
            if downsample < ds[i]:
                return i - 1
        return len(ds) - 1

    # ------------------------------------------------------------------ reading

    def read_region(self, location, level, size, *, out=None, mode="rgba", threads=None,
                    on_error="raise", device="cpu"):
        """Read a region; see :func:`wsitool.region.read_region` for the full contract.

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

        Returns:
            The filled array (``out`` itself when given).

        Raises:
            InvalidRegionError: malformed request or ``out`` (also ``ValueError``).
            ResourceLimitError: output over the configured limits (before allocating).
            TileDecodeError: a corrupt tile, with ``on_error="raise"``.
            UnsupportedFormatError: ``rgb``/``rgba`` for samples without an RGB conversion.
            DeviceUnavailableError: ``device="cuda"`` without a usable GPU.
        """
        from .region import read_region

        return read_region(self, location, level, size, out=out, mode=mode, threads=threads,
                           on_error=on_error, device=device)

    def to_dask(self, level=0, *, chunks="tile"):
        """Level ``level`` as a lazy ``dask.array.Array`` ``(height, width, 3)`` uint8.

        Each chunk is read with ``read_region(..., mode="rgb")`` when computed;
        the graph holds this slide's path, not the open file, so it runs on
        remote Dask workers.  See :func:`wsitool.distributed.level_to_dask`
        (chunking, errors).  Needs the optional extra ``wsitool[dask]``.

        Raises:
            DaskUnavailableError: dask is not installed.
            InvalidRegionError: ``level`` out of range or bad ``chunks``.
        """
        from .distributed import level_to_dask

        return level_to_dask(self, level, chunks=chunks)

    def _check_associated_segments(self, name: str, page: tifffile.TiffPage) -> None:
        """Check the strips / tiles of an LZW or JPEG associated image before
        tifffile hands them to imagecodecs, as tiles are checked before decoding
        (:func:`wsitool.decode.check_header`): LZW data that imagecodecs' decoder
        crashes on (:func:`~wsitool.decode.lzw_problem`; found by scripts/fuzz.py
        on a mutated Aperio label), and JPEG frames without a readable header or
        declaring more pixels than the image (decompression bombs).

        Raises:
            CorruptFileError: a segment lies past the end of the file or fails a check.
        """
        comp = int(page.compression)
        if comp not in (_LZW, _JPEG):
            return
        from .decode import jpeg_frame_size, lzw_problem

        max_w = max(int(page.imagewidth), int(page.tilewidth or 0))
        max_h = max(int(page.imagelength), int(page.tilelength or 0))
        where = f"{self.path}: associated image {name!r}"
        for off, count in zip(page.dataoffsets, page.databytecounts):
            off, count = int(off), int(count)
            if off == 0 or count == 0:
                continue
            if off + count > self._file_size:
                raise CorruptFileError(f"{where}: data at offset {off} (+{count} bytes) lies past "
                                       f"the end of the file ({self._file_size} bytes): truncated file")
            data = os.pread(self._fd, count, off)
            if comp == _LZW:
                problem = lzw_problem(data)
                if problem:
                    raise CorruptFileError(f"{where}: {problem}")
                continue
            size = jpeg_frame_size(data)
            if size is None:
                raise CorruptFileError(f"{where}: JPEG stream without a readable frame header")
            if size[0] > max_w or size[1] > max_h:
                raise CorruptFileError(f"{where}: a JPEG frame declares {size[0]}x{size[1]} pixels, "
                                       f"more than the {int(page.imagewidth)}x{int(page.imagelength)} image")

    def _read_associated(self, name: str, page: tifffile.TiffPage) -> np.ndarray:
        """Decode an associated image to ``(height, width, 3)`` uint8 RGB.

        Raises:
            ResourceLimitError: the image is larger than the region limits
                (checked before decoding, see :mod:`wsitool.settings`).
            UnsupportedFormatError: samples without an RGB conversion.
            CorruptFileError: a strip or tile fails the checks of
                :meth:`_check_associated_segments`, or the decoded data does
                not have the declared ``height x width x samples`` shape.
            WsiError: the image could not be decoded.
        """
        from .region import to_rgb8
        from .settings import get_limits

        problem = _rgb_problem(page)
        if problem:
            raise UnsupportedFormatError(f"{self.path}: associated image {name!r}: {problem}")
        h, w, s = int(page.imagelength), int(page.imagewidth), int(page.samplesperpixel)
        itemsize = np.dtype(page.dtype).itemsize if page.dtype is not None else 8
        lim = get_limits()
        if h * w > lim.max_region_pixels or h * w * s * itemsize > lim.max_region_bytes:
            raise ResourceLimitError(
                f"{self.path}: associated image {name!r} is {w}x{h}x{s}, over the region limits "
                f"({lim.max_region_pixels} pixels, {lim.max_region_bytes} bytes)"
            )
        self._check_associated_segments(name, page)
        try:
            with self._lock, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                arr = page.asarray()
        except Exception as exc:
            raise_if_os_resource(exc, self.path)
            raise WsiError(f"{self.path}: associated image {name!r} could not be decoded: {exc}") from None
        arr = np.asarray(arr)
        if arr.size != h * w * s:
            raise CorruptFileError(
                f"{self.path}: associated image {name!r} decoded to shape {arr.shape}, "
                f"not the declared {w}x{h}x{s}"
            )
        if int(page.planarconfig) == 2 and s > 1:
            arr = arr.reshape(s, h, w).transpose(1, 2, 0)
        else:
            arr = arr.reshape(h, w, s)
        rgb, _alpha = to_rgb8(arr, int(page.photometric), int(page.bitspersample), page.colormap,
                              tuple(np.atleast_1d(page.extrasamples).tolist())
                              if page.extrasamples is not None else ())
        return np.ascontiguousarray(rgb)

    # ------------------------------------------------------------------ lifetime

    @contextlib.contextmanager
    def _reading(self):
        """Keep the file open for the duration of one read (region reads enter here).

        Raises:
            WsiError: the slide is closed or closing.
        """
        with self._lock:
            if self._fd < 0 or self._closing:
                raise WsiError(f"{self.path}: slide is closed")
            self._readers += 1
        try:
            yield
        finally:
            with self._lock:
                self._readers -= 1
                if self._readers == 0:
                    self._idle.notify_all()

    def close(self) -> None:
        """Release the file.  Reading afterwards raises :class:`WsiError`.

        Idempotent and safe to call from any thread.  Region reads already
        running in other threads finish first (``close`` waits for them), and
        reads started once ``close`` was called raise :class:`WsiError`; so no
        read ever uses the descriptor after it was released (the process may
        give its number to another file).  Do not call it from inside a read
        of the same slide (it would wait for itself).
        """
        lock = getattr(self, "_lock", None)
        idle = getattr(self, "_idle", None)
        if idle is not None:
            with idle:
                self._closing = True
                while self._readers:
                    idle.wait()
        with lock if lock is not None else contextlib.nullcontext():
            if getattr(self, "_tiff", None) is not None:
                self._tiff.close()
                self._tiff = None
            fd = getattr(self, "_fd", -1)
            if fd >= 0:
                # mark closed before releasing the descriptor, so no new read uses it
                self._fd = -1
                for lv in getattr(self, "levels", ()):
                    lv._fd = -1
                os.close(fd)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._fd < 0

    def __enter__(self) -> "Slide":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"Slide({self.path!r}, vendor={self.vendor!r}, levels={self.level_count})"


def open_slide(path: str | os.PathLike) -> Slide:
    """Open a TIFF-based whole-slide image (Aperio SVS, generic tiled TIFF, OME-TIFF).

    Returns a :class:`Slide`, usable as a context manager.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        UnsupportedFormatError: not a TIFF-based slide (DICOM, random bytes, directory).
        CorruptFileError: broken TIFF structure (bad header or IFD, zero-size image).
    """
    return Slide(path)


# ---------------------------------------------------------------------- helpers


class _TifffileCapture(logging.Handler):
    """Routes each tifffile log record to the message list of the thread that emitted it."""

    def __init__(self):
        super().__init__(logging.WARNING)  # problems, not tifffile's debug chatter
        self.lists: dict[int, list[str]] = {}  # thread id -> messages (under _capture_lock)

    def emit(self, record: logging.LogRecord) -> None:
        messages = self.lists.get(record.thread)
        if messages is not None:
            # tifffile prefixes the object that complains: "<tifffile.TiffPages @8> ..."
            messages.append(re.sub(r"^<[^>]*>\s*", "", record.getMessage()))


_capture = _TifffileCapture()
_capture_lock = threading.Lock()
_capture_state: dict[str, Any] = {"users": 0, "level": logging.NOTSET, "propagate": True}


@contextlib.contextmanager
def _tifffile_messages():
    """Collect, as a list of strings, what tifffile logs from this thread meanwhile.

    Whatever logging the application configured, while any thread is inside
    this block the "tifffile" logger passes WARNING and above to the capture
    handler only (its level is lowered to WARNING if it was higher, and records
    do not propagate to the application's handlers or to Python's last-resort
    handler, which would print them on stderr); both settings are restored when
    the last thread leaves.  Records of other threads meanwhile are dropped.
    """
    logger = logging.getLogger("tifffile")
    me = threading.get_ident()
    messages: list[str] = []
    with _capture_lock:
        _capture.lists[me] = messages
        if _capture_state["users"] == 0:
            _capture_state["level"], _capture_state["propagate"] = logger.level, logger.propagate
            logger.addHandler(_capture)
            logger.propagate = False
            if logger.getEffectiveLevel() > logging.WARNING:
                logger.setLevel(logging.WARNING)
        _capture_state["users"] += 1
    try:
        yield messages
    finally:
        with _capture_lock:
            del _capture.lists[me]
            _capture_state["users"] -= 1
            if _capture_state["users"] == 0:
                logger.removeHandler(_capture)
                logger.setLevel(_capture_state["level"])
                logger.propagate = _capture_state["propagate"]

_CMYK_INKSET = 1  # TIFF 6.0 section 16, InkSet: 1 = CMYK, 2 = not CMYK


def _rgb_problem(page) -> str | None:
    """Why the samples of ``page`` cannot be shown as RGB, or None if they can.

    wsitool converts to 8-bit RGB (see :func:`wsitool.region.to_rgb8`):
    MinIsWhite / MinIsBlack (1 colour sample), RGB (3), Palette, CMYK
    (Separated with InkSet 1 and 4 colour samples, TIFF 6.0 section 16), and
    YCbCr when the codec itself returns RGB (JPEG, JPEG 2000).  Other
    photometric interpretations (CIELab, LogLuv, CFA, Separated inks that are
    not CMYK, ...) are readable only with ``mode="raw"``.
    """
    photometric = int(page.photometric)
    samples = int(page.samplesperpixel)
    extras = len(np.atleast_1d(page.extrasamples)) if page.extrasamples is not None else 0
    colour = samples - extras
    if photometric in (0, 1, 3):
        return None if colour >= 1 else "no colour sample"
    if photometric == 2:
        return None if colour >= 3 else f"photometric RGB with {colour} colour sample(s)"
    if photometric == 5:
        inkset = page.tags.valueof(332, _CMYK_INKSET)
        if inkset == _CMYK_INKSET and samples >= 4:
            return None
        return (f"photometric Separated with InkSet {inkset} and {samples} samples is not CMYK; "
                "no RGB conversion is defined")
    if photometric == 6 and int(page.compression) in (_JPEG, *_J2K_COMPRESSIONS) and samples >= 3:
        return None
    return f"no RGB conversion for photometric {_enum_name(page.photometric)}"


#: Exception types that tifffile (or our own arithmetic on its values) raises
#: for tags of the wrong type, count or range; they mean "malformed file".
_MALFORMED = (ValueError, TypeError, OverflowError, ZeroDivisionError, IndexError, KeyError,
              AttributeError, UnicodeError, EOFError, OSError, struct.error)

# Tags read as one unsigned integer (TIFF 6.0 section 8 gives them SHORT or
# LONG; BigTIFF adds LONG8).  tifffile keeps whatever type and count the file
# declares, so a mutated entry can hand back a string, a float or a tuple.
_SCALAR_INT_TAGS = (
    ("imagewidth", "ImageWidth"), ("imagelength", "ImageLength"), ("tilewidth", "TileWidth"),
    ("tilelength", "TileLength"), ("rowsperstrip", "RowsPerStrip"),
    ("samplesperpixel", "SamplesPerPixel"), ("compression", "Compression"),
    ("photometric", "PhotometricInterpretation"), ("planarconfig", "PlanarConfiguration"),
    ("subfiletype", "NewSubfileType"), ("imagedepth", "ImageDepth"),
    ("bitspersample", "BitsPerSample"), ("sampleformat", "SampleFormat"),
    ("predictor", "Predictor"),
)


def _is_uint(value, limit: int = 2**63) -> bool:
    return (isinstance(value, (int, np.integer)) and not isinstance(value, bool)
            and 0 <= int(value) < limit)


def _check_page(path: str, page, ifd: int) -> None:
    """Refuse an IFD whose structural tags have the wrong type, count or range.

    Checked (TIFF 6.0 section 8, TIFF Technical Note 2): the scalar tags of
    :data:`_SCALAR_INT_TAGS` are one non-negative integer; Tile/Strip offsets
    and byte counts are sequences of non-negative integers; JPEGTables is a
    byte string; ExtraSamples are integers; a palette image (photometric 3)
    has a ``(3, N)`` ColorMap.  This turns every "tag of the wrong shape" fault
    into one :class:`CorruptFileError` naming the IFD and the tag, instead of a
    TypeError deep inside tifffile or numpy.
    """
    where = f"{path}: IFD {ifd}"
    for attr, tag in _SCALAR_INT_TAGS:
        value = getattr(page, attr, 0)
        if not _is_uint(value, 2**32 if attr not in ("imagewidth", "imagelength") else 2**63):
            raise CorruptFileError(
                f"{where}: tag {tag} holds {str(value)[:40]!r}, expected one non-negative integer"
            )
    for attr, tag in (("dataoffsets", "TileOffsets/StripOffsets"),
                      ("databytecounts", "TileByteCounts/StripByteCounts")):
        values = getattr(page, attr, ())
        ok = isinstance(values, (tuple, list, np.ndarray))
        if ok and len(values):
            try:
                arr = np.asarray(values)
            except (ValueError, TypeError, OverflowError):
                arr = None
            ok = (arr is not None and arr.ndim == 1 and arr.dtype.kind in "iu"
                  and int(arr.min()) >= 0)
        if not ok:
            raise CorruptFileError(f"{where}: tag {tag} does not hold non-negative integers")
    tables = page.jpegtables
    if tables is not None and not isinstance(tables, (bytes, bytearray)):
        raise CorruptFileError(f"{where}: tag JPEGTables is not a byte string")
    extras = page.extrasamples
    if extras is not None and not all(_is_uint(v) for v in np.atleast_1d(extras).tolist()):
        raise CorruptFileError(f"{where}: tag ExtraSamples does not hold integers")
    if int(page.photometric) == 3:
        cmap = page.colormap
        if not (isinstance(cmap, np.ndarray) and cmap.ndim == 2 and cmap.shape[0] == 3
                and cmap.shape[1] >= 2 and np.issubdtype(cmap.dtype, np.integer)):
            raise CorruptFileError(f"{where}: palette image without a valid (3, N) ColorMap")


def _factor_range(full: int, reduced: int) -> tuple[float, float]:
    """Downsample factors ``d`` for which ``reduced`` is ``full / d`` within one pixel."""
    low = full / (reduced + 1)
    high = full / (reduced - 1) if reduced > 1 else math.inf
    return low, high


def _same_aspect(w0: int, h0: int, w: int, h: int) -> bool:
    """True if ``w x h`` is ``w0 x h0`` reduced by one factor, within one pixel of
    rounding on each axis: the factor ranges of the two axes overlap.  Small
    levels of elongated images (e.g. 16 x 3 from 2000 x 300) pass; an overview
    of another aspect (200 x 200 in a 1024 x 768 pyramid) does not."""
    lx, hx = _factor_range(w0, w)
    ly, hy = _factor_range(h0, h)
    return max(lx, ly) <= min(hx, hy)


def _ome_other_images(tiff: tifffile.TiffFile) -> dict[int, str]:
    """Top-level IFD index -> lower-case Name of the OME Images after the first.

    Each OME ``Image`` is one tifffile series; the pyramid is the first, and
    further Images are associated images, named ``label`` / ``macro`` as
    bioformats2raw / raw2ometiff write them (OME-TIFF specification; an
    Image without a Name becomes ``associated-<n>``).  Empty when the file
    has one Image or its series are not all OME series.
    """
    try:
        series = tiff.series
    except Exception:  # noqa: BLE001 - an unreadable OME-XML: fall back to every IFD
        return {}
    if len(series) < 2 or any(s.kind != "ome" for s in series):
        return {}

    def top(page) -> int | None:
        idx = getattr(page, "index", None)
        if isinstance(idx, tuple):
            idx = idx[0] if idx else None
        return idx if isinstance(idx, int) else None

    first = {top(p) for p in series[0].pages if p is not None}
    out: dict[int, str] = {}
    for n, s in enumerate(series[1:], 1):
        name = (s.name or "").strip().lower() or f"associated-{n}"
        for p in s.pages:
            i = top(p) if p is not None else None
            if i is not None and i not in first:
                out.setdefault(i, name)
    return out


def _description(page) -> str:
    desc = page.description if hasattr(page, "description") else ""
    return desc or ""


def _positive_float(value) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v > 0 else None


def _num_str(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _rational(value) -> float | None:
    if isinstance(value, tuple) and len(value) == 2:
        num, den = value
        if den == 0:
            return None
        return num / den
    return _positive_float(value)


def _resolution_mpp(page) -> tuple[Any, Any, str, float, float] | None:
    """(XResolution, YResolution, unit name, mpp_x, mpp_y) from TIFF tags, or None.

    TIFF 6.0 section 8: X/YResolution are RATIONALs (pixels per ResolutionUnit);
    ResolutionUnit 2 = inch, 3 = centimetre, 1 = no absolute unit.
    """
    tags = page.tags
    xt, yt, ut = tags.get("XResolution"), tags.get("YResolution"), tags.get("ResolutionUnit")
    if xt is None or yt is None:
        return None
    unit = int(ut.value) if ut is not None else 2
    x, y = _rational(xt.value), _rational(yt.value)
    if not x or not y or x <= 0 or y <= 0:
        return None
    per_unit_um = {2: 25400.0, 3: 10000.0}.get(unit)
    if per_unit_um is None:
        return None
    name = {2: "inch", 3: "centimeter"}[unit]
    return xt.value, yt.value, name, per_unit_um / x, per_unit_um / y


_OME_UNITS_UM = {"pm": 1e-6, "nm": 1e-3, "µm": 1.0, "um": 1.0, "mm": 1e3, "cm": 1e4, "m": 1e6}


def _ome_metadata(xml: str, props: dict[str, str]) -> tuple[float | None, float | None, float | None]:
    """MPP and objective power from OME-XML (OME schema: Pixels@PhysicalSizeX/Y,
    PhysicalSizeXUnit default "µm"; Objective@NominalMagnification)."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return None, None, None
    mpp = [None, None]
    objective = None
    for el in root.iter():
        tag = el.tag.rsplit("}", 1)[-1]
        if tag == "Pixels" and mpp[0] is None:
            for i, axis in enumerate("XY"):
                v = _positive_float(el.get(f"PhysicalSize{axis}"))
                unit = el.get(f"PhysicalSize{axis}Unit", "µm")
                if v is not None and unit in _OME_UNITS_UM:
                    mpp[i] = v * _OME_UNITS_UM[unit]
                    props[f"ome.PhysicalSize{axis}"] = el.get(f"PhysicalSize{axis}")
                    props[f"ome.PhysicalSize{axis}Unit"] = unit
        elif tag == "Objective" and objective is None:
            objective = _positive_float(el.get("NominalMagnification"))
    return mpp[0], mpp[1], objective
