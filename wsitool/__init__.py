"""wsitool: read, convert and stress-test tiled pyramidal whole-slide images.

Quick start::

    import wsitool
    with wsitool.open_slide("slide.svs") as slide:
        print(slide.level_dimensions, slide.mpp)
        tile = slide.read_region((1000, 2000), 0, (512, 512))  # (512, 512, 4) uint8 RGBA

See :class:`wsitool.slide.Slide` and :func:`wsitool.read.region.read_region`.
"""

from .errors import (
    CorruptFileError,
    DeviceUnavailableError,
    InvalidOptionError,
    InvalidRegionError,
    ResourceLimitError,
    SlideWarning,
    TileDecodeError,
    TileWarning,
    UnsupportedFormatError,
    WsiError,
)
from .export import ExportResult, export_pyramid
from .settings import Limits, get_limits, limits, set_limits
from .slide import Level, Slide, open_slide
from .version import __version__ as __version__

__all__ = [
    "open_slide",
    "Slide",
    "Level",
    "set_limits",
    "get_limits",
    "limits",
    "Limits",
    "WsiError",
    "UnsupportedFormatError",
    "CorruptFileError",
    "InvalidOptionError",
    "InvalidRegionError",
    "ResourceLimitError",
    "TileDecodeError",
    "DeviceUnavailableError",
    "TileWarning",
    "SlideWarning",
    "export_pyramid",
    "ExportResult",
]
