"""nvImageCodec, loaded once and quietly, and the decode parameters of slide tiles (floor 3).

nvImageCodec (``nvidia-nvimgcodec-cu12``) is a required dependency; it is loaded
on first use rather than at import so that importing wsitool changes nothing
in the process: loading sets the quiet defaults of :mod:`wsitool.silence` and
keeps the library's "Failed to load nvjpeg library" lines (expected on machines
without CUDA) off the terminal.  ``importlib.import_module`` inside
:func:`nv` is that deferred load, the one import of a required library that
is not at the top of a module.
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType

from ..errors import raise_if_os_resource
from ..silence import quiet_environment, stderr_silenced

__all__ = ["nv", "decode_params"]

_lock = threading.Lock()
_module: ModuleType | None = None
_params = None


def nv() -> ModuleType:
    """The ``nvidia.nvimgcodec`` module (loaded on the first call, quietly).

    Raises:
        OSError: the process is out of descriptors or memory while loading
            (EMFILE, ENOMEM, ...: worded by :func:`wsitool.errors.os_resource_error`).
    """
    global _module
    if _module is None:
        with _lock:
            if _module is None:
                quiet_environment()
                try:
                    with stderr_silenced():
                        _module = importlib.import_module("nvidia.nvimgcodec")
                except OSError as exc:
                    raise_if_os_resource(exc)
                    raise
    return _module


def decode_params():
    """Decode parameters of slide tiles: an EXIF orientation inside a tile's code
    stream is ignored (TIFF 6.0 section 8: the Orientation tag of the IFD says how
    the image lies, and wsitool reports the stored pixel grid, as OpenSlide does)."""
    global _params
    if _params is None:
        _params = nv().DecodeParams(apply_exif_orientation=False)
    return _params
