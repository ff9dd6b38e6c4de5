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

import importlib
from typing import TYPE_CHECKING

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
    TruncatedDataError,
    UnsupportedFormatError,
    WsiError,
)
from .version import __version__ as __version__

if TYPE_CHECKING:  # at run time on first use (__getattr__ below)
    from .export import ExportResult, export_pyramid
    from .ground.limits import Limits, get_limits, limits, set_limits
    from .model import Channel, Level
    from .read.cache import TileCache
    from .slide import Slide, open_slide

#: Names of ``__all__`` whose modules (numpy, tifffile, the codecs: ~0.8 s) load on first use,
#: so that ``import wsitool.ground.signals`` and the command line's entry point stay light: name -> module.
_ON_FIRST_USE = {"ExportResult": "export", "export_pyramid": "export", "Channel": "model",
                 "TileCache": "read.cache", "Level": "model", "Slide": "slide", "open_slide": "slide",
                 "Limits": "ground.limits", "get_limits": "ground.limits", "limits": "ground.limits",
                 "set_limits": "ground.limits"}

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
    "TruncatedDataError",
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


if not TYPE_CHECKING:  # (type checkers see the names imported above; none other exists)

    def __getattr__(name: str) -> object:
        """``wsitool.Slide`` and the other names of :data:`_ON_FIRST_USE`, their modules imported on
        first use; a submodule not imported yet (``wsitool.slide``) is imported.

        Raises:
            AttributeError: ``name`` is neither (or its submodule failed to import: the
                ImportError is its ``__cause__``).
        """
        module = _ON_FIRST_USE.get(name)
        if module is not None:
            value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
            globals()[name] = value
            return value
        if not name.startswith("__"):
            try:
                return importlib.import_module(f"{__name__}.{name}")
            except ImportError as exc:
                raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from exc
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(_ON_FIRST_USE))
