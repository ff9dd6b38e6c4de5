"""Build of the optional compiled parts; everything else is in pyproject.toml.

* ``wsitool._jpegloop``: the JPEG tile loop of region reads
  (:mod:`wsitool.codec.jpegloop`), which decodes through libjpeg-turbo's
  libjpeg API: linked with ``-ljpeg``, its ``jpeglib.h`` needed at build time
  (Debian/Ubuntu ``libjpeg-dev``, Fedora ``libjpeg-turbo-devel``, Homebrew
  ``jpeg-turbo``).  Compiled against nvImageCodec's C header
  (``include/nvimgcodec.h`` of the ``nvidia-nvimgcodec-cu12`` package, a build
  requirement where that package has wheels); it does not link the library:
  :mod:`wsitool.codec.jpegloop` hands it the path of the library the package
  loads.  POSIX only (``dlopen``, ``pread``).
* ``wsitool._boxfilter``: the export pyramid's 2:1 box sums (plain C, no
  headers needed); without it ``wsitool.export.downsample`` uses numpy.

Both are optional: the build never fails for them.  When one is skipped (no
header, not POSIX, no C compiler, a compile error) the build prints one line,
``wsitool build: skipped optional extension NAME: WHY; WHAT TAKES ITS PLACE``
(``pip install -v`` shows it; ``wsitool info --backends`` says at run time which
JPEG path is in use).

Environment:
    WSITOOL_NVIMGCODEC_INCLUDE: a folder holding ``nvimgcodec.h`` to build
        ``wsitool._jpegloop`` against instead of the installed package's; a
        folder without it (an empty one) builds without the header, as on a
        platform without nvImageCodec (tests/test_packaging.py does so).
"""

import importlib.util
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import BaseError, CCompilerError

#: What takes the place of each optional extension when it is skipped.
INSTEAD = {
    "wsitool._jpegloop": ("JPEG tiles are decoded on the Python path by nvImageCodec (the same pixels, but "
                          "corrupt JPEG data is not detected)"),
    "wsitool._boxfilter": "the export pyramid halves levels with numpy (the same pixels)",
}


def skipped(name: str, why: str) -> None:
    """Say in one line (on stderr, in the build log) that extension ``name`` is not built, and why."""
    print(f"wsitool build: skipped optional extension {name}: {why}; {INSTEAD[name]}", file=sys.stderr)


def jpeglib_found() -> bool:
    """True when ``jpeglib.h`` is in a folder the C compiler searches by default (or in
    ``CPATH`` / ``C_INCLUDE_PATH``): libjpeg-turbo's development files are installed."""
    folders = ["/usr/include", "/usr/local/include", "/opt/homebrew/include"]
    folders += [os.path.join("/usr/include", d) for d in os.listdir("/usr/include")
                if d.endswith("-linux-gnu")] if os.path.isdir("/usr/include") else []
    for var in ("CPATH", "C_INCLUDE_PATH"):
        folders += [f for f in os.environ.get(var, "").split(os.pathsep) if f]
    return any(os.path.isfile(os.path.join(f, "jpeglib.h")) for f in folders)


def nvimgcodec_include() -> tuple[str | None, str]:
    """``(folder holding nvimgcodec.h, "")``, or ``(None, why it was not found)``."""
    override = os.environ.get("WSITOOL_NVIMGCODEC_INCLUDE")
    if override is not None:
        if os.path.isfile(os.path.join(override, "nvimgcodec.h")):
            return override, ""
        return None, f"no nvimgcodec.h in WSITOOL_NVIMGCODEC_INCLUDE={override!r}"
    try:
        spec = importlib.util.find_spec("nvidia.nvimgcodec")  # imports only the 'nvidia' namespace
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None, ("nvImageCodec's C header is not available: nvidia-nvimgcodec-cu12 is not installed "
                      "in the build environment (it has wheels for Linux x86_64 / aarch64 and Windows x86_64)")
    for base in spec.submodule_search_locations or []:
        include = os.path.join(base, "include")
        if os.path.isfile(os.path.join(include, "nvimgcodec.h")):
            return include, ""
    return None, "the installed nvidia-nvimgcodec-cu12 has no include/nvimgcodec.h"


class OptionalBuildExt(build_ext):
    """``build_ext`` that turns a failed optional extension into the one line of :func:`skipped`.

    (setuptools itself only logs a warning for ``optional=True``, which pip hides.)
    """

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except (CCompilerError, BaseError, OSError) as exc:
            if not ext.optional:
                raise
            lines = str(exc).strip().splitlines()
            skipped(ext.name, f"the C build failed ({type(exc).__name__}: {lines[0] if lines else 'no message'})")


ext_modules = [Extension(
    "wsitool._boxfilter",
    sources=["wsitool/_native/boxfilter.c"],
    extra_compile_args=["-O3", "-std=c11", "-Wall"] if os.name == "posix" else [],
    optional=True,
)]

include, why_not = nvimgcodec_include()
if os.name != "posix":
    skipped("wsitool._jpegloop", f"it needs dlopen and pread (POSIX), not available on {sys.platform}")
elif include is None:
    skipped("wsitool._jpegloop", why_not)
elif not jpeglib_found():
    skipped("wsitool._jpegloop", "libjpeg-turbo's jpeglib.h is not installed (Debian/Ubuntu: apt install libjpeg-dev; "
            "Fedora: dnf install libjpeg-turbo-devel)")
else:
    ext_modules.append(Extension(
        "wsitool._jpegloop",
        sources=["wsitool/_native/jpegloop.c"],
        # wsitool/_native first: its cuda_runtime_api.h stands in for CUDA's
        # (named in depends so that the sdist carries it).
        include_dirs=["wsitool/_native", include],
        depends=["wsitool/_native/cuda_runtime_api.h"],
        libraries=["jpeg", "dl", "pthread"],
        extra_compile_args=["-O3", "-std=c11", "-Wall"],
        optional=True,
    ))

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
