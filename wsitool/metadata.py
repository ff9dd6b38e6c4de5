"""What an open slide says of itself: levels, dimensions, properties, MPP, objective power,
associated images and ICC profiles (floor 5, below the facade).

:class:`SlideMetadata` answers from what the format described (:class:`wsitool.model.Pyramid`):
the read-only :class:`~wsitool.model.Level` views, the properties mapping, the lazy associated
images.  :class:`wsitool.Slide` is one, and adds reading and the slide's lifetime.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from . import model
from .ground.geometry import best_level_for_downsample
from .model import AssociatedImage, AssociatedImages, Level
from .opening import Location, ObjectUrl
from .storage import ByteSource

__all__ = ["SlideMetadata"]


class SlideMetadata:
    """The metadata of an open slide (the base of :class:`wsitool.Slide`; not made on its own).

    Attributes:
        vendor: ``"aperio"``, ``"hamamatsu"`` (NDPI), ``"generic-tiff"``, ``"ome-tiff"``, ``"qptiff"``, ``"dicom"``.
        problems: what the parser reported while reading the structure (e.g.
            "invalid page offset 828578": an IFD past the end of the file, i.e.
            a truncated file); each is also emitted as a
            :class:`~wsitool.errors.SlideWarning`.
    """

    path: str
    location: Location
    vendor: str
    problems: list[str]
    _source: ByteSource | None
    _open_stats: dict | None
    _pyramid: model.Pyramid | None
    _views: tuple[Level, ...]
    _properties: Mapping[str, str]
    _associated: AssociatedImages

    def __init__(self, pyramid: model.Pyramid, decode: Callable[[AssociatedImage], np.ndarray],
                 subject: str) -> None:
        """Describe ``pyramid``; ``decode`` decodes one of its associated images (on first access),
        whose errors name ``subject`` (the slide, as shown)."""
        self._pyramid = pyramid
        self.vendor = pyramid.vendor
        self.problems = list(pyramid.problems)
        self._properties = types.MappingProxyType(pyramid.properties)
        self._associated = AssociatedImages(pyramid.associated, decode, subject=subject)
        self._views = tuple(Level.of(lv, pyramid.levels[0], self.mpp) for lv in pyramid.levels)

    def _pyramid_open(self) -> model.Pyramid:
        """The format's pyramid (set by the constructor, which raises rather than leave it unset)."""
        assert self._pyramid is not None
        return self._pyramid

    @property
    def levels(self) -> tuple[Level, ...]:
        """The levels, largest first, as read-only :class:`Level` views (geometry, tiling,
        compression, dtype, channels, mpp)."""
        return self._views

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
    def channels(self) -> tuple[model.Channel, ...]:
        """The :class:`~wsitool.model.Channel` s of a multi-channel (fluorescence) slide, in
        the slide's order (name, description, wavelengths in nm, display colour); ``()``
        for RGB and other single-image slides."""
        return self.levels[0].channels

    @property
    def properties(self) -> Mapping[str, str]:
        """Read-only metadata mapping.

        OpenSlide-compatible keys: ``openslide.vendor``, ``openslide.mpp-x``,
        ``openslide.mpp-y`` (micrometres per pixel), ``openslide.objective-power``,
        ``openslide.level-count``, ``openslide.level[N].width|height|downsample|
        tile-width|tile-height``; raw TIFF tags as ``tiff.<TagName>``; vendor
        fields as ``aperio.<Key>`` or ``ome.<Attribute>``.  ``openslide.quickhash-1``
        (OpenSlide's identity of the slide, :mod:`wsitool.formats.quickhash`) is
        listed from the start but read from the file the first time its value is
        asked for, which needs the slide open (else :class:`WsiError`).
        """
        return self._properties

    @property
    def identifying_properties(self) -> frozenset[str]:
        """Names of :attr:`properties` that identify a patient, person, institution or
        specimen (DICOM's PatientID, PatientName, AccessionNumber, ...: the Basic
        Application Level Confidentiality Profile, PS3.15 E.1-1); empty for TIFF."""
        return self._pyramid_open().identifying

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

    @property
    def color_profile(self) -> bytes | None:
        """The slide's embedded ICC profile (raw bytes), or None.

        TIFF: tag 34675 ICCProfile of level 0's IFD (Aperio and generic TIFF; the
        bytes OpenSlide 4 returns).  DICOM: ICC Profile (0028,2000) of the first
        item of the Optical Path Sequence (0048,0105), PS3.3 C.8.12.5.  ``read_region(..., color="icc")`` converts
        pixels from it to sRGB.  See :meth:`associated_color_profile` for the
        associated images' own profiles."""
        return self._pyramid_open().color_profile

    def associated_color_profile(self, name: str) -> bytes | None:
        """The ICC profile embedded with associated image ``name`` (its own IFD's
        tag 34675), or None.  Raises ``KeyError`` for an unknown name."""
        return self._pyramid_open().associated[name].color_profile

    def get_best_level_for_downsample(self, downsample: float) -> int:
        """Index of the largest level whose downsample is <= ``downsample``.

        OpenSlide semantics: a value below level 0's downsample gives 0, one
        above the last level's gives the last level
        (:func:`wsitool.ground.geometry.best_level_for_downsample`).
        """
        return best_level_for_downsample(self.level_downsamples, downsample)

    @property
    def remote(self) -> dict[str, Any] | None:
        """Where a slide opened from a URL is read from, and what reading it cost; None for a local slide.

        Keys: ``url`` (without credentials or query), ``protocol`` (``"http"``,
        ``"s3"``, ``"gs"``, ``"az"``), ``size`` (bytes), ``etag`` and
        ``last_modified`` (pinned at open; either may be None), ``open_requests``
        and ``open_bytes`` (what opening took: the head fetch, the IFD chain, the
        tile offsets), ``requests`` and ``bytes`` (so far, open included).
        """
        if not isinstance(self.location, ObjectUrl):
            return None
        src: Any = self._source  # a RemoteSource
        now = src.stats()
        opened = self._open_stats or now
        return {"url": self.path, "protocol": src.protocol, "size": src.size, "etag": src.etag,
                "last_modified": src.modified, "open_requests": opened["requests"],
                "open_bytes": opened["bytes"], "requests": now["requests"], "bytes": now["bytes"]}
