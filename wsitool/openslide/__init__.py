"""A drop-in for openslide-python: ``import wsitool.openslide as openslide`` (consumer floor).

Existing OpenSlide code runs unchanged on wsitool's reader: the same classes
(:class:`OpenSlide`, :class:`ImageSlide`, :class:`OpenSlideCache`,
:class:`AbstractSlide`), functions (:func:`open_slide`), exceptions
(:class:`OpenSlideError`, :class:`OpenSlideUnsupportedFormatError`), property
name constants and :mod:`wsitool.openslide.deepzoom`, with the same types:
PIL images (mode ``RGBA`` for regions and associated images, ``RGB`` for
thumbnails), properties as strings under OpenSlide's key names.  The API is
that of openslide-python 1.4 (``openslide/__init__.py``) with OpenSlide 4.

This is a thin layer over :class:`wsitool.Slide`: it converts (numpy -> PIL,
numbers -> OpenSlide's strings, wsitool's errors -> OpenSlide's) and decides
nothing of its own.  Needs Pillow: ``pip install "wsitool[openslide]"``.

Deliberate differences from openslide-python (``docs/guides/openslide-migration.md``):

* **Fractional level positions** are read as OpenSlide paints them (its
  sub-pixel bilinear blend, :mod:`wsitool.deepzoom.subpixel`), not with
  wsitool's nearest-pixel rule (:meth:`wsitool.Slide.read_region`).
* **Vendor names** are wsitool's: an OME-TIFF pyramid is ``"ome-tiff"`` with
  all its levels (OpenSlide sees level 0 only, as ``"generic-tiff"``).
* ``openslide.quickhash-1`` is OpenSlide's value for Aperio, NDPI, generic
  tiled TIFF and DICOM (:mod:`wsitool.formats.quickhash`), computed the first
  time it is read rather than at open; absent where OpenSlide has none (a
  smallest level over 5 MiB, TIFF formats wsitool does not follow such as
  Philips or Leica).  ``openslide.background-color`` and ``openslide.bounds-*``
  appear only where the format records them (not Aperio or generic TIFF, as in
  OpenSlide).
* **Cache**: without :meth:`OpenSlide.set_cache` reads use no tile cache (the
  compiled JPEG loop decodes straight into the region, faster for one-off
  regions than OpenSlide's default 32 MiB cache); ``set_cache(OpenSlideCache(n))``
  attaches wsitool's decoded-tile cache (:class:`wsitool.read.cache.TileCache`).
* ``__version__`` and ``__library_version__`` are wsitool's version.

Errors: every wsitool error surfaces as :class:`OpenSlideError` (format errors
as :class:`OpenSlideUnsupportedFormatError`), with the wsitool exception as
``__cause__``.  After :meth:`OpenSlide.close` every call raises
:class:`OpenSlideError` (also a ``ValueError``, as openslide-python's
"Passing closed slide object" is).
"""

from __future__ import annotations

import ast
import contextlib
import threading
from collections.abc import Iterator, Mapping
from io import BytesIO

import numpy as np

from ..ground.extras import needs_extra

with needs_extra("openslide", "wsitool.openslide needs Pillow: "):
    from PIL import Image, ImageCms

from ..deepzoom.subpixel import read_openslide_rgba
from ..errors import UnsupportedFormatError, WsiError
from ..read.cache import TileCache
from ..slide import Slide
from ..version import __version__

__all__ = [
    "AbstractSlide", "OpenSlide", "ImageSlide", "OpenSlideCache", "open_slide",
    "OpenSlideError", "OpenSlideUnsupportedFormatError", "OpenSlideVersionError",
    "PROPERTY_NAME_COMMENT", "PROPERTY_NAME_VENDOR", "PROPERTY_NAME_QUICKHASH1",
    "PROPERTY_NAME_BACKGROUND_COLOR", "PROPERTY_NAME_OBJECTIVE_POWER", "PROPERTY_NAME_MPP_X",
    "PROPERTY_NAME_MPP_Y", "PROPERTY_NAME_BOUNDS_X", "PROPERTY_NAME_BOUNDS_Y",
    "PROPERTY_NAME_BOUNDS_WIDTH", "PROPERTY_NAME_BOUNDS_HEIGHT", "PROPERTY_NAME_BARCODE",
    "__version__", "__library_version__",
]

#: wsitool's version (openslide-python reports the C library's here)
__library_version__ = __version__

# Property names (openslide.h, OpenSlide 4)
PROPERTY_NAME_COMMENT = "openslide.comment"
PROPERTY_NAME_VENDOR = "openslide.vendor"
PROPERTY_NAME_QUICKHASH1 = "openslide.quickhash-1"
PROPERTY_NAME_BACKGROUND_COLOR = "openslide.background-color"
PROPERTY_NAME_OBJECTIVE_POWER = "openslide.objective-power"
PROPERTY_NAME_MPP_X = "openslide.mpp-x"
PROPERTY_NAME_MPP_Y = "openslide.mpp-y"
PROPERTY_NAME_BOUNDS_X = "openslide.bounds-x"
PROPERTY_NAME_BOUNDS_Y = "openslide.bounds-y"
PROPERTY_NAME_BOUNDS_WIDTH = "openslide.bounds-width"
PROPERTY_NAME_BOUNDS_HEIGHT = "openslide.bounds-height"
PROPERTY_NAME_BARCODE = "aperio.Barcode"  # no generic barcode key; Aperio's, the common one


class OpenSlideError(Exception):
    """An error from the slide reader (any :class:`wsitool.WsiError`, mapped)."""


class OpenSlideUnsupportedFormatError(OpenSlideError):
    """The file is not a slide this reader opens (or does not exist)."""


class OpenSlideVersionError(OpenSlideError):
    """Kept for code that names it; wsitool never raises it (every feature is present)."""


class _ClosedSlideError(OpenSlideError, ValueError):
    """A call on a closed slide."""


@contextlib.contextmanager
def _mapped() -> Iterator[None]:
    """Turn wsitool's errors into OpenSlide's (the original as ``__cause__``)."""
    try:
        yield
    except UnsupportedFormatError as exc:
        raise OpenSlideUnsupportedFormatError(str(exc)) from exc
    except WsiError as exc:
        raise OpenSlideError(str(exc)) from exc


def _number(value: str) -> str:
    """OpenSlide's text for a double: C ``%.17g`` (``2.0`` -> ``"2"``)."""
    try:
        return format(float(value), ".17g")
    except (TypeError, ValueError):
        return value


def _resolution(value: str) -> str:
    """``tiff.X/YResolution`` as OpenSlide prints it: libtiff's float (32 bits) with ``%.17g``.

    wsitool keeps the tag's RATIONAL as ``"(num, den)"``."""
    try:
        v = ast.literal_eval(value)
        f = v[0] / v[1] if isinstance(v, tuple) else float(v)
        return format(float(np.float32(f)), ".17g")
    except (ValueError, SyntaxError, TypeError, ZeroDivisionError, IndexError):
        return value


def openslide_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """wsitool's properties with numbers written as OpenSlide writes them.

    ``openslide.level[N].downsample``, ``openslide.mpp-x|y`` -> ``%.17g``;
    ``tiff.XResolution|YResolution`` -> float32 ``%.17g``; everything else unchanged.
    """
    return {key: _openslide_text(key, value) for key, value in properties.items()}


def _openslide_text(key: str, value: str) -> str:
    """One property's value as OpenSlide writes it (see :func:`openslide_properties`)."""
    if key in (PROPERTY_NAME_MPP_X, PROPERTY_NAME_MPP_Y) or (
            key.startswith("openslide.level[") and key.endswith("].downsample")):
        return _number(value)
    if key in ("tiff.XResolution", "tiff.YResolution"):
        return _resolution(value)
    return value


def _profile_object(profile: bytes | None):
    return None if profile is None else ImageCms.ImageCmsProfile(BytesIO(profile))


class _ReadOnlyMap(Mapping):
    """A read-only mapping whose reads go through ``owner._check()`` (raises once closed)."""

    def __init__(self, owner, keys, getter, label):
        self._owner, self._keys, self._get, self._label = owner, tuple(keys), getter, label

    def __getitem__(self, key):
        self._owner._check()
        if key not in self._keys:
            raise KeyError(key)
        return self._get(key)

    def __contains__(self, key) -> bool:
        self._owner._check()
        return key in self._keys  # without reading the value (a deferred property, an image)

    def __iter__(self):
        self._owner._check()
        return iter(self._keys)

    def __len__(self):
        self._owner._check()
        return len(self._keys)

    def __repr__(self):
        if self._label == "_PropertyMap":
            return f"<{self._label} {dict(self)!r}>"
        return f"<{self._label} {list(self._keys)!r}>"


class AbstractSlide:
    """The interface :class:`OpenSlide` and :class:`ImageSlide` share (as openslide-python's)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @classmethod
    def detect_format(cls, filename) -> str | None:  # pragma: no cover - overridden
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def level_count(self) -> int:
        """Number of levels."""
        return len(self.level_dimensions)

    @property
    def dimensions(self) -> tuple[int, int]:
        """``(width, height)`` of level 0."""
        return self.level_dimensions[0]

    @property
    def level_dimensions(self) -> tuple[tuple[int, int], ...]:  # pragma: no cover - overridden
        """``(width, height)`` of each level."""
        raise NotImplementedError

    @property
    def level_downsamples(self) -> tuple[float, ...]:  # pragma: no cover - overridden
        """Downsample of each level relative to level 0."""
        raise NotImplementedError

    @property
    def properties(self) -> Mapping[str, str]:  # pragma: no cover - overridden
        """The slide's metadata, as OpenSlide names it."""
        raise NotImplementedError

    def get_best_level_for_downsample(self, downsample: float) -> int:  # pragma: no cover - overridden
        """Index of the level to read for ``downsample``."""
        raise NotImplementedError

    def read_region(self, location, level: int, size) -> Image.Image:  # pragma: no cover - overridden
        """An RGBA PIL image of a region (OpenSlide semantics)."""
        raise NotImplementedError

    def _profile_bytes(self) -> bytes | None:  # pragma: no cover - overridden
        raise NotImplementedError

    def get_thumbnail(self, size) -> Image.Image:
        """An RGB PIL thumbnail fitting in ``size = (width, height)`` (aspect kept).

        As openslide-python: the whole best level for ``max(W0 / width, H0 / height)``
        is read, composited on the background colour (``openslide.background-color``,
        default white) and shrunk with PIL's Lanczos ``thumbnail``; the slide's ICC
        profile goes into ``info["icc_profile"]``.
        """
        downsample = max(d / s for d, s in zip(self.dimensions, size, strict=False))
        level = self.get_best_level_for_downsample(downsample)
        region = self.read_region((0, 0), level, self.level_dimensions[level])
        background = "#" + self.properties.get(PROPERTY_NAME_BACKGROUND_COLOR, "ffffff")
        thumb = Image.new("RGB", region.size, background)
        thumb.paste(region, None, region)
        thumb.thumbnail(tuple(size), Image.Resampling.LANCZOS)
        profile = self._profile_bytes()
        if profile is not None:
            thumb.info["icc_profile"] = profile
        return thumb

    def set_cache(self, cache: OpenSlideCache) -> None:
        """Accepted and ignored (this class keeps no decoded tiles)."""


class OpenSlide(AbstractSlide):
    """A whole-slide image opened with wsitool (openslide-python's ``OpenSlide``).

    Args:
        filename: the slide file (str or path-like).

    Raises:
        OpenSlideUnsupportedFormatError: not a slide wsitool reads, or missing.
        OpenSlideError: the file is a slide but broken.

    Attributes as openslide-python's: ``level_count``, ``dimensions``,
    ``level_dimensions``, ``level_downsamples``, ``properties`` (read-only
    mapping of strings), ``associated_images`` (lazy read-only mapping of PIL
    ``RGBA`` images), ``color_profile`` (``PIL.ImageCms.ImageCmsProfile`` or None).
    """

    def __init__(self, filename):
        self._filename = filename
        try:
            slide = Slide(filename)
        except FileNotFoundError as exc:
            raise OpenSlideUnsupportedFormatError(f"Unsupported or missing image file: {exc}") from exc
        except IsADirectoryError as exc:  # pragma: no cover - Slide reports directories itself
            raise OpenSlideUnsupportedFormatError(str(exc)) from exc
        except UnsupportedFormatError as exc:
            raise OpenSlideUnsupportedFormatError(str(exc)) from exc
        except WsiError as exc:
            raise OpenSlideError(str(exc)) from exc
        self._slide: Slide | None = slide
        self._cache_scope = None
        self._profile = _profile_object(slide.color_profile)
        props = slide.properties  # converted on each read: a deferred value is computed only when read
        self._properties = _ReadOnlyMap(self, props, lambda key: _openslide_text(key, props[key]),
                                        "_PropertyMap")
        self._associated = _ReadOnlyMap(self, sorted(slide.associated_images),
                                        self._associated_image, "_AssociatedImageMap")

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self._filename!r})"

    @classmethod
    def detect_format(cls, filename) -> str | None:
        """The vendor of ``filename`` (``"aperio"``, ``"generic-tiff"``, ``"ome-tiff"``)
        or None when wsitool does not open it as a slide."""
        try:
            with Slide(filename) as slide:
                return slide.vendor
        except (OSError, WsiError):
            return None

    # ------------------------------------------------------------ lifetime

    def _check(self) -> Slide:
        slide = self._slide
        if slide is None:
            raise _ClosedSlideError("Passing closed slide object")
        return slide

    def close(self) -> None:
        """Release the file; every later call raises :class:`OpenSlideError`."""
        slide = self._check()
        self._slide = None
        slide.close()

    # ------------------------------------------------------------ metadata

    @property
    def level_count(self) -> int:
        """Number of levels."""
        return self._check().level_count

    @property
    def dimensions(self) -> tuple[int, int]:
        """``(width, height)`` of level 0 in pixels."""
        return self._check().dimensions

    @property
    def level_dimensions(self) -> tuple[tuple[int, int], ...]:
        """``(width, height)`` of each level."""
        return self._check().level_dimensions

    @property
    def level_downsamples(self) -> tuple[float, ...]:
        """Downsample of each level, ``(W0 / w + H0 / h) / 2`` (OpenSlide's formula)."""
        return self._check().level_downsamples

    @property
    def properties(self) -> Mapping[str, str]:
        """Read-only mapping of property name -> string (OpenSlide's key names)."""
        self._check()
        return self._properties

    @property
    def associated_images(self) -> Mapping[str, Image.Image]:
        """Lazy read-only mapping of name -> PIL ``RGBA`` image (alpha 255), with
        ``info["icc_profile"]`` where the image has a profile."""
        self._check()
        return self._associated

    @property
    def color_profile(self):
        """The slide's ICC profile as a ``PIL.ImageCms.ImageCmsProfile``, or None."""
        self._check()
        return self._profile

    def get_thumbnail(self, size) -> Image.Image:
        """An RGB PIL thumbnail fitting in ``size = (width, height)`` (aspect kept): the
        pixels of :meth:`wsitool.Slide.get_thumbnail` (OpenSlide's recipe, see
        :meth:`AbstractSlide.get_thumbnail`), the ICC profile in ``info["icc_profile"]``."""
        thumb = Image.fromarray(self._check().get_thumbnail(size), "RGB")
        profile = self._profile_bytes()
        if profile is not None:
            thumb.info["icc_profile"] = profile
        return thumb

    def _profile_bytes(self) -> bytes | None:
        return self._check().color_profile

    def _associated_image(self, name: str) -> Image.Image:
        slide = self._check()
        with _mapped():
            rgb = slide.associated_images[name]
        image = Image.fromarray(np.ascontiguousarray(rgb), "RGB").convert("RGBA")
        profile = slide.associated_color_profile(name)
        if profile is not None:
            image.info["icc_profile"] = profile
        return image

    def get_best_level_for_downsample(self, downsample: float) -> int:
        """The largest level whose downsample is <= ``downsample`` (OpenSlide's rule)."""
        return self._check().get_best_level_for_downsample(downsample)

    # ------------------------------------------------------------ reading

    def read_region(self, location, level: int, size) -> Image.Image:
        """A region as a PIL ``RGBA`` image (not premultiplied).

        Args:
            location: ``(x, y)`` top-left in level-0 pixels (may lie outside).
            level: level index; one out of range gives a transparent image, as
                OpenSlide 4 does.
            size: ``(width, height)`` in pixels of ``level``; 0 allowed.

        Pixels outside the slide are ``(0, 0, 0, 0)``.  A fractional level
        position (``x / downsample`` not whole) gives OpenSlide's sub-pixel
        blend (:func:`wsitool.deepzoom.subpixel.read_openslide_rgba`), not
        wsitool's nearest stored pixel.  ``info["icc_profile"]`` holds the
        slide's ICC profile when it has one (pixels are not converted).

        Raises:
            OpenSlideError: negative size, a corrupt tile, a region over
                wsitool's limits, a closed slide.
        """
        slide = self._check()
        w, h = (int(v) for v in size)
        if w < 0 or h < 0:
            raise OpenSlideError(f"negative width ({w}) or negative height ({h}) not allowed")
        if w == 0 or h == 0 or not 0 <= level < slide.level_count:
            image = Image.new("RGBA", (w, h), (0, 0, 0, 0))
        else:
            with _mapped():
                arr = read_openslide_rgba(slide, location, level, (w, h))
            image = Image.frombuffer("RGBA", (w, h), arr, "raw", "RGBA", 0, 1)
        profile = slide.color_profile
        if profile is not None:
            image.info["icc_profile"] = profile
        return image

    def set_cache(self, cache: OpenSlideCache) -> None:
        """Keep decoded tiles in ``cache`` (wsitool's :class:`~wsitool.read.cache.TileCache`).

        Raises:
            TypeError: ``cache`` is not an :class:`OpenSlideCache`.
        """
        slide = self._check()
        if not isinstance(cache, OpenSlideCache):
            raise TypeError("Not a cache object")
        old = slide._tile_cache
        slide._tile_cache = cache._cache.scope()
        if old is not None:
            old.close()


class OpenSlideCache:
    """A decoded-tile cache of ``capacity`` bytes that slides share (:meth:`OpenSlide.set_cache`).

    Backed by :class:`wsitool.read.cache.TileCache` (LRU, thread-safe).

    Raises:
        ValueError: negative or non-integer capacity.
    """

    def __init__(self, capacity: int):
        self._capacity = capacity
        self._cache = TileCache(capacity)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self._capacity!r})"


class ImageSlide(AbstractSlide):
    """A PIL image (or an image file Pillow opens) as a one-level slide.

    Args:
        file: a ``PIL.Image.Image`` (not closed by :meth:`close`) or a filename.

    ``properties`` and ``associated_images`` are empty; ``color_profile`` is the
    image's embedded profile (``info["icc_profile"]``) or None.
    """

    def __init__(self, file):
        self._file_arg = file
        self._image: Image.Image | None
        if isinstance(file, Image.Image):
            self._close = False
            self._image = file
        else:
            self._close = True
            self._image = Image.open(file)
        raw = self._image.info.get("icc_profile")
        self._profile = raw if raw else None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self._file_arg!r})"

    @classmethod
    def detect_format(cls, filename) -> str | None:
        """Pillow's format name for ``filename`` (e.g. ``"PNG"``), or None."""
        try:
            with Image.open(filename) as img:
                return img.format
        except OSError:
            return None

    def _check(self):
        if self._image is None:
            raise _ClosedSlideError("Cannot read from a closed slide")
        return self._image

    def close(self) -> None:
        """Release the image (when opened from a file)."""
        if self._close and self._image is not None:
            self._image.close()
        self._image = None

    @property
    def level_count(self) -> int:
        self._check()
        return 1

    @property
    def level_dimensions(self) -> tuple[tuple[int, int], ...]:
        return (self._check().size,)

    @property
    def level_downsamples(self) -> tuple[float, ...]:
        self._check()
        return (1.0,)

    @property
    def properties(self) -> Mapping[str, str]:
        self._check()
        return _ReadOnlyMap(self, (), None, "_PropertyMap")

    @property
    def associated_images(self) -> Mapping[str, Image.Image]:
        self._check()
        return _ReadOnlyMap(self, (), None, "_AssociatedImageMap")

    @property
    def color_profile(self):
        self._check()
        return _profile_object(self._profile)

    def _profile_bytes(self) -> bytes | None:
        return self._profile

    def get_best_level_for_downsample(self, downsample: float) -> int:
        self._check()
        return 0

    def read_region(self, location, level: int, size) -> Image.Image:
        """A region of the image, transparent outside; ``level`` must be 0.

        Raises:
            OpenSlideError: level other than 0, negative size, closed slide.
        """
        image = self._check()
        if level != 0:
            raise OpenSlideError("Invalid level")
        w, h = (int(v) for v in size)
        if w < 0 or h < 0:
            raise OpenSlideError(f"Size {tuple(size)} must be non-negative")
        x, y = (int(v) for v in location)
        tile = Image.new("RGBA", (w, h), (0, 0, 0, 0))
        iw, ih = image.size
        x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + w, iw), min(y + h, ih)
        if x1 > x0 and y1 > y0:
            with self._lock:  # Pillow decodes lazily on first access
                crop = image.crop((x0, y0, x1, y1))
            if crop.mode != "RGBA":
                crop = crop.convert("RGBA")
            tile.paste(crop, (x0 - x, y0 - y))
        if self._profile is not None:
            tile.info["icc_profile"] = self._profile
        return tile


def open_slide(filename) -> OpenSlide | ImageSlide:
    """An :class:`OpenSlide` for a whole-slide image, else an :class:`ImageSlide` (Pillow).

    Raises:
        OSError, PIL.UnidentifiedImageError: neither wsitool nor Pillow opens it.
        OpenSlideError: a slide wsitool recognises but cannot open.
    """
    try:
        return OpenSlide(filename)
    except OpenSlideUnsupportedFormatError:
        return ImageSlide(filename)
