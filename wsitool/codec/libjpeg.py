"""Which libjpeg-turbo the compiled JPEG loop uses, and why there is no loop where there is none (floor 3).

The compiled loop (``wsitool._jpegloop``) is built against libjpeg-turbo's API-62 headers, which
wsitool carries (``third_party/libjpeg-turbo``), and links no JPEG library: it loads one at run
time (``_jpegloop.load_libjpeg``), the first of :func:`candidates` that loads and is libjpeg-turbo
of that API (the library itself checks the API version and the decompressor's structure size).
So neither building nor using the loop needs a system JPEG package.

Where the loop is absent, the build said why in ``wsitool/_build.json`` (``setup.py`` records each
optional extension it skipped and the reason); :func:`build_reason` reads it, so the message is
the build's own, never a guess.
"""

from __future__ import annotations

import ctypes.util
import glob
import json
import os
import sys
from typing import Any

__all__ = ["candidates", "load", "build_reason", "ENVIRONMENT"]

#: An environment variable naming the libjpeg-turbo to load (a path), tried first.
ENVIRONMENT = "WSITOOL_LIBJPEG"


def _pillow_copies() -> list[str]:
    """The libjpeg-turbo Pillow's wheels carry (``pillow.libs/libjpeg-*.so.62*`` beside ``PIL``
    on Linux, ``PIL/.dylibs/libjpeg.62*.dylib`` on macOS), where this Pillow has one; a Pillow
    built against the system's library carries none."""
    import importlib.util

    spec = importlib.util.find_spec("PIL")
    if spec is None or not spec.submodule_search_locations:
        return []
    found: list[str] = []
    for pil in spec.submodule_search_locations:
        site = os.path.dirname(pil)
        found += sorted(glob.glob(os.path.join(site, "pillow.libs", "libjpeg-*.so.62*")))
        found += sorted(glob.glob(os.path.join(pil, ".dylibs", "libjpeg.62*.dylib")))
    return found


def _system_copy() -> list[str]:
    """The system's ``libjpeg.so.62`` (or ``libjpeg.62.dylib``), where the loader finds one."""
    name = ctypes.util.find_library("jpeg")
    if not name:
        return []
    if sys.platform.startswith("linux") and not name.endswith(".so.62"):
        return ["libjpeg.so.62"]  # (a newer libjpeg is another API; ask for the 62 one by its soname)
    return [name]


def candidates() -> list[str]:
    """The libraries to try, in order: :data:`ENVIRONMENT`'s path where set, Pillow's copy,
    the system's ``libjpeg.so.62``."""
    out = [os.environ[ENVIRONMENT]] if os.environ.get(ENVIRONMENT) else []
    out += _pillow_copies() + _system_copy()
    return list(dict.fromkeys(out))


def load(extension: Any) -> tuple[str | None, list[str]]:
    """Open libjpeg-turbo in ``extension`` (``wsitool._jpegloop``): ``(the path loaded, [])``, or
    ``(None, why each candidate was refused)``."""
    refused = []
    for path in candidates():
        try:
            extension.load_libjpeg(path)
        except ImportError as exc:
            refused.append(str(exc))
            continue
        return path, refused
    return None, refused or ["no libjpeg-turbo found (not in Pillow's wheel, no libjpeg.so.62 on the system)"]


def build_reason(name: str = "wsitool._jpegloop") -> str | None:
    """Why the build skipped extension ``name``, as ``wsitool/_build.json`` records it; None where
    the record names no reason for it (it was built) or there is no record."""
    record = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_build.json")
    try:
        with open(record, encoding="utf-8") as src:
            skipped = json.load(src).get("skipped", {})
    except (OSError, ValueError, AttributeError):
        return None
    why = skipped.get(name) if isinstance(skipped, dict) else None
    return str(why) if why else None
