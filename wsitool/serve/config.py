"""The settings of one server process (``wsitool serve``'s options)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable

from ..errors import InvalidOptionError
from ..opening import Location, parse_location
from ..storage import is_url
from .guard import check_host_name, check_origin

__all__ = ["ServeConfig", "DEFAULT_VIEWER_JS", "OPENSEADRAGON_VERSION"]

#: The OpenSeadragon release the viewer page loads by default (jsDelivr, pinned).
OPENSEADRAGON_VERSION = "6.1.1"
DEFAULT_VIEWER_JS = (f"https://cdn.jsdelivr.net/npm/openseadragon@{OPENSEADRAGON_VERSION}"
                     "/build/openseadragon/openseadragon.min.js")


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """What a server process serves and how.

    Attributes:
        threads: decode threads (requests rendered at once; each read uses up to
            ``threads // in_flight`` of wsitool's region-read threads).
        cache_mb: decoded-tile cache budget in MiB (0: no cache; reads then take
            the fastest uncached path, the compiled JPEG loop included).
        viewer_js: URL of OpenSeadragon's script, or a local file path served at
            ``/viewer.js``.
        tile_size: the IIIF tile width/height advertised in ``info.json`` (pixels).
        max_queue: requests waiting for a decode thread before the server
            answers 503 (backpressure).
        quality: JPEG quality of encoded tiles (1..100).
        dz_tile_size, dz_overlap: Deep Zoom tile size and overlap (pixels;
            DeepZoomGenerator's defaults).
        dz_filter: how Deep Zoom tiles are shrunk: ``"lanczos"`` (as
            DeepZoomGenerator) or ``"area"`` (see :mod:`wsitool.serve.dz`).
        max_area, max_width, max_height: largest output image (pixels); None:
            from wsitool's limits (:func:`wsitool.serve.iiif.service_limits`).
        max_decode_pixels: most source pixels one request may read (the window on
            the level that answers it); None: wsitool's ``max_region_pixels``
            limit (2**28 by default).  See :mod:`wsitool.serve.bounds`.
        render_memory_mb: the render memory of the process, MiB (with ``--workers N``
            each worker gets ``// N``, at least 128): renders reserve
            their memory bound from it before they start (and wait for room); a
            request whose bound exceeds it is refused, and the advertised
            ``maxArea`` is at most what it allows (:mod:`wsitool.serve.bounds`).
        level_tolerance: relative slack when choosing a level: a level whose
            downsample is at most ``scale * (1 + level_tolerance)`` may answer
            (pyramids store downsamples such as 4.002 for a nominal 4).
        follow_links: serve slides that symbolic links in the folders lead to,
            even outside them (``--follow-links``; see :mod:`.registry`).
        storage_options: for slide URLs and object-store prefixes only: what
            :func:`wsitool.open_slide` takes (``--storage-option KEY=VALUE``); None: none.
        max_open_files: descriptors the open slides may hold at once, least recently used
            closed first (``--max-open-files``; :mod:`.pool`); None: 3/8 of the descriptor limit.
        max_connections: connections held at once; more are answered 503 and closed
            (``--max-connections``; :mod:`.guard`); None: 1/4 of the descriptor limit.
        header_timeout: seconds a connection may take to send a request's headers, counted
            from when it opens or the previous answer ends, and the longest a client may leave
            an answer unread (:mod:`.guard`; not a command-line option).
        allowed_hosts: host names a request's ``Host`` header may name besides the bound
            address (``--allowed-host``; ``"*"``: any; :mod:`.guard`).
        cors_origin: the ``Access-Control-Allow-Origin`` of IIIF and Deep Zoom answers
            (``--cors-origin``: an origin such as ``https://viewer.example.org``, or ``"*"``);
            None: none is sent.
    """

    threads: int = dataclasses.field(default_factory=lambda: max(1, os.cpu_count() or 1))
    cache_mb: int = 256
    viewer_js: str = DEFAULT_VIEWER_JS
    tile_size: int = 512
    max_queue: int = 256
    quality: int = 90
    dz_tile_size: int = 254
    dz_overlap: int = 1
    dz_filter: str = "lanczos"
    max_area: int | None = None
    max_width: int | None = None
    max_height: int | None = None
    max_decode_pixels: int | None = None
    render_memory_mb: int = 768
    level_tolerance: float = 0.01
    follow_links: bool = False
    storage_options: dict | None = dataclasses.field(default=None, hash=False)
    max_open_files: int | None = None
    max_connections: int | None = None
    header_timeout: float = 60.0
    allowed_hosts: tuple[str, ...] = ()
    cors_origin: str | None = None

    def located(self, sources: Iterable[str | os.PathLike]) -> list[str | os.PathLike | Location]:
        """``sources`` with each slide URL parsed into its :class:`~wsitool.opening.Location`, read
        with :attr:`storage_options` (local paths as given: the registry lists folders itself).

        Raises:
            InvalidOptionError: a malformed URL, or storage options that are not a mapping.
            WsiError: a ``dicomweb+`` URL that names no series.
        """
        return [parse_location(s, self.storage_options) if is_url(s) else s for s in sources]

    def __post_init__(self) -> None:
        """Check the options.

        Raises:
            InvalidOptionError: an option out of its range (also a ValueError); the
                message names it.
        """
        if self.threads < 1:
            raise InvalidOptionError(f"threads must be >= 1, got {self.threads}")
        if self.cache_mb < 0:
            raise InvalidOptionError(f"cache_mb must be >= 0, got {self.cache_mb}")
        if self.tile_size < 16:
            raise InvalidOptionError(f"tile_size must be >= 16, got {self.tile_size}")
        if not 1 <= self.dz_tile_size <= 8192:
            raise InvalidOptionError(f"dz_tile_size must be in 1..8192, got {self.dz_tile_size}")
        if self.dz_overlap < 0 or 2 * self.dz_overlap > self.dz_tile_size:
            raise InvalidOptionError(f"dz_overlap must be 0..dz_tile_size // 2 ({self.dz_tile_size // 2}), "
                             f"got {self.dz_overlap}")
        if self.dz_filter not in ("lanczos", "area"):
            raise InvalidOptionError(f"dz_filter must be 'lanczos' or 'area', got {self.dz_filter!r}")
        if self.max_decode_pixels is not None and self.max_decode_pixels < 4 * self.tile_size ** 2:
            raise InvalidOptionError(f"max_decode_pixels must be at least 4 tiles ({4 * self.tile_size ** 2} "
                                     f"pixels with tile_size {self.tile_size}), got {self.max_decode_pixels}")
        if self.render_memory_mb < 128:
            raise InvalidOptionError(f"render_memory_mb must be >= 128, got {self.render_memory_mb}")
        if not 1 <= self.quality <= 100:
            raise InvalidOptionError(f"quality must be in 1..100, got {self.quality}")
        for name in ("max_open_files", "max_connections"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InvalidOptionError(f"{name} must be >= 1, got {value}")
        if not self.header_timeout > 0:
            raise InvalidOptionError(f"header_timeout must be > 0 seconds, got {self.header_timeout}")
        object.__setattr__(self, "allowed_hosts", tuple(check_host_name(h) for h in self.allowed_hosts))
        if self.cors_origin is not None:
            check_origin(self.cors_origin)

    @property
    def viewer_js_is_file(self) -> bool:
        """True when ``viewer_js`` names a local file (served at ``/viewer.js``)."""
        return "://" not in self.viewer_js and not self.viewer_js.startswith("//")
