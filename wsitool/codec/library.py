"""nvImageCodec, loaded once and quietly, and the decode parameters of slide tiles (floor 3).

nvImageCodec (``nvidia-nvimgcodec-cu12``) is a dependency on the platforms it
has wheels for (Linux and Windows, x86_64 and aarch64); it is loaded on first
use rather than at import so that importing wsitool changes nothing in the
process: loading sets the quiet defaults of :mod:`wsitool.codec.silence` and keeps
the library's "Failed to load nvjpeg library" lines (expected on machines
without CUDA) off the terminal.  ``importlib.import_module`` inside :func:`nv`
is that deferred load.

Where it cannot be imported (macOS, an other platform without its wheel, a
broken install), :func:`available` is False and :func:`unavailable_reason`
says why: :class:`wsitool.Slide` then hands its JPEG and JPEG 2000 levels to
the tifffile / imagecodecs path (:func:`fallback_encoding`), which decodes
the same pixels (libjpeg-turbo and OpenJPEG on both paths), more slowly.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from types import ModuleType

from ..ground.oserrors import raise_if_os_resource
from ..model import TileEncoding
from .silence import quiet_environment, stderr_silenced

__all__ = ["nv", "decode_params", "available", "unavailable_reason", "fallback_encoding"]

#: The distribution that provides ``nvidia.nvimgcodec`` (for messages).
PACKAGE = "nvidia-nvimgcodec-cu12"

_lock = threading.Lock()
_module: ModuleType | None = None
_failure: str | None = None  # why the import failed (it is tried once per process)
_params = None


def nv() -> ModuleType:
    """The ``nvidia.nvimgcodec`` module (loaded on the first call, quietly).

    Raises:
        ImportError: nvImageCodec cannot be imported here (not installed, no
            wheel for this platform, or its library does not load); the
            message says why, and so does :func:`unavailable_reason`.  The
            import is tried once: later calls raise the same message.
        OSError: the process is out of descriptors or memory while loading
            (EMFILE, ENOMEM, ...: worded by :func:`wsitool.ground.oserrors.os_resource_error`).
    """
    global _module, _failure
    if _module is None:
        with _lock:
            if _module is None:
                if _failure is not None:
                    raise ImportError(_failure)
                quiet_environment()
                try:
                    with stderr_silenced():
                        _module = importlib.import_module("nvidia.nvimgcodec")
                except ImportError as exc:
                    _failure = (f"nvImageCodec ({PACKAGE}) cannot be imported: "
                                f"{type(exc).__name__}: {exc}")
                    raise ImportError(_failure) from exc
                except OSError as exc:
                    raise_if_os_resource(exc)
                    raise
    return _module


def available() -> bool:
    """True if nvImageCodec is (or can be) loaded in this process; loads it if it was not.

    False where the import fails (see :func:`unavailable_reason`).  An
    :class:`OSError` from an exhausted process (descriptors, memory) is not
    swallowed: it propagates as from :func:`nv`.
    """
    try:
        nv()
    except ImportError:
        return False
    return True


def unavailable_reason() -> str | None:
    """None when nvImageCodec loads here; else one line saying why it does not."""
    return None if available() else _failure


def fallback_encoding(encoding: TileEncoding) -> TileEncoding:
    """``encoding`` as decoded without nvImageCodec: an ``"nv"`` encoding becomes ``"generic"``.

    The generic path decodes JPEG and JPEG 2000 tiles with imagecodecs
    (through the format's tifffile page, or ``encoding.imagecodec`` for DICOM
    frames), which links the same libjpeg-turbo and OpenJPEG: the same pixels.
    What is lost is speed (no decode into the caller's buffer, no batched or
    compiled JPEG loop, no OpenJPEG window decode, no GPU decode).  Other
    encodings are returned unchanged.
    """
    if encoding.codec != "nv":
        return encoding
    return dataclasses.replace(encoding, codec="generic")


def decode_params():
    """Decode parameters of slide tiles: an EXIF orientation inside a tile's code
    stream is ignored (TIFF 6.0 section 8: the Orientation tag of the IFD says how
    the image lies, and wsitool reports the stored pixel grid, as OpenSlide does)."""
    global _params
    if _params is None:
        _params = nv().DecodeParams(apply_exif_orientation=False)
    return _params
