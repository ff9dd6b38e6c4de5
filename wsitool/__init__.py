"""wsitool: read, convert and stress-test tiled pyramidal whole-slide images.

Quick start::

    import wsitool
    with wsitool.open_slide("slide.svs") as slide:
        print(slide.level_dimensions, slide.mpp)
        tile = slide.read_region((1000, 2000), 0, (512, 512))  # (512, 512, 4) uint8 RGBA

See :class:`wsitool.Slide`.  The names in ``__all__`` here, and those of
:mod:`wsitool.openslide`, :mod:`wsitool.patches` and :mod:`wsitool.torchdata`,
are the stable API; every other module is internal and may change.
"""

from .errors import (
    CorruptFileError,
    DaskUnavailableError,
    DeviceUnavailableError,
    InvalidOptionError,
    InvalidRegionError,
    OutputExistsError,
    OutputIsSourceError,
    RemoteAccessError,
    RemoteChangedError,
    RemoteNotFoundError,
    RemoteUnavailableError,
    ResourceLimitError,
    SlideWarning,
    TileDecodeError,
    TileWarning,
    UnsupportedFormatError,
    WsiError,
)
from .export import ExportResult, export_pyramid
from .model import Channel
from .read.cache import TileCache
from .settings import Limits, get_limits, limits, set_limits
from .slide import Level, Slide, open_slide
from .version import __version__ as __version__

__all__ = [
    "__version__",
    "open_slide",
    "Slide",
    "Level",
    "Channel",
    "TileCache",
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
    "DaskUnavailableError",
    "OutputExistsError",
    "OutputIsSourceError",
    "RemoteNotFoundError",
    "RemoteAccessError",
    "RemoteUnavailableError",
    "RemoteChangedError",
    "TileWarning",
    "SlideWarning",
    "export_pyramid",
    "ExportResult",
]
