"""Build of the optional compiled parts; everything else is in pyproject.toml.

* ``wsitool._jpegloop``: the JPEG tile loop of region reads
  (:mod:`wsitool.codec.jpegloop`), which decodes through libjpeg-turbo's
  libjpeg API: compiled against that API's headers in ``third_party/libjpeg-turbo``
  (no JPEG package needed on the build machine), not linked: the library is
  loaded at run time (Pillow's bundled libjpeg-turbo, or the system's
  ``libjpeg.so.62``).  Compiled against nvImageCodec's C header
  (``include/nvimgcodec.h`` of the ``nvidia-nvimgcodec-cu12`` package, a build
  requirement where that package has wheels); it does not link the library:
  :mod:`wsitool.codec.jpegloop` hands it the path of the library the package
  loads.  POSIX only (``dlopen``, ``pread``).
* ``wsitool._boxfilter``: the export pyramid's 2:1 box sums (plain C, no
  headers needed); without it ``wsitool.export.downsample`` uses numpy.

Both are optional: the build never fails for them.  When one is skipped (no
header, not POSIX, no C compiler, a compile error) the build prints one line,
``wsitool build: skipped optional extension NAME: WHY; WHAT TAKES ITS PLACE``
(``pip install -v`` shows it) and records why in ``wsitool/_build.json`` beside the
built modules (the source tree for an editable install), which the package
carries: ``wsitool info --backends`` says that reason at run time, never a guess.

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
    """Say in one line (on stderr, in the build log) that extension ``name`` is not built, and why;
    note it for ``wsitool/_build.json`` (:func:`record`)."""
    print(f"wsitool build: skipped optional extension {name}: {why}; {INSTEAD[name]}", file=sys.stderr)
    SKIPPED[name] = why


#: Why each optional extension was not built (written to wsitool/_build.json; read by
#: wsitool.codec.jpegloop to say why the loop is absent).
SKIPPED: dict = {}
BUILD_RECORD = os.path.join("wsitool", "_build.json")


def record(folder: str) -> None:
    """Write :data:`SKIPPED` to ``wsitool/_build.json`` under ``folder``: the build's output (what
    a wheel carries), or the source tree for a build in place or an editable install."""
    import json

    target = os.path.join(folder, BUILD_RECORD)
    if os.path.isdir(os.path.dirname(target)):
        with open(target, "w", encoding="utf-8") as out:
            out.write(json.dumps({"skipped": SKIPPED}, indent=1, sort_keys=True) + "\n")


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


def failure_text(exc: BaseException) -> str:
    """Why a C build failed, in words: the compiler's exit status (its messages are in the
    build log), or the error's first line."""
    import re

    text = str(exc).strip()
    status = re.search(r"exit status (\d+)", text)
    if status is not None:
        return (f"the C compiler failed ({type(exc).__name__}, exit status {status.group(1)}; "
                "`pip install -v .` shows its messages)")
    lines = text.splitlines()
    return f"the C build failed ({type(exc).__name__}: {lines[0][:200] if lines else 'no message'})"


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
            skipped(ext.name, failure_text(exc))

    def run(self):
        try:
            super().run()
        finally:
            in_place = self.inplace or getattr(self, "editable_mode", False)
            record("." if in_place else self.build_lib)


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
else:
    ext_modules.append(Extension(
        "wsitool._jpegloop",
        sources=["wsitool/_native/jpegloop.c"],
        # wsitool/_native first: its cuda_runtime_api.h stands in for CUDA's
        # (named in depends so that the sdist carries it); libjpeg-turbo's API-62
        # headers before any the system has (the library loaded at run time is that API).
        include_dirs=["wsitool/_native", "third_party/libjpeg-turbo/include", include],
        depends=["wsitool/_native/cuda_runtime_api.h", "third_party/libjpeg-turbo/include/jpeglib.h",
                 "third_party/libjpeg-turbo/include/jconfig.h", "third_party/libjpeg-turbo/include/jmorecfg.h",
                 "third_party/libjpeg-turbo/include/jerror.h"],
        libraries=["dl", "pthread"],
        extra_compile_args=["-O3", "-std=c11", "-Wall"],
        optional=True,
    ))

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
