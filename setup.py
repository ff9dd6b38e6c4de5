"""Build of the optional compiled parts; everything else is in pyproject.toml.

* ``wsitool._jpegloop``: the JPEG tile loop of region reads (below).
* ``wsitool._boxfilter``: the export pyramid's 2:1 box sums (plain C, no
  headers needed); without it ``wsitool.export.downsample`` uses numpy.


The extension is compiled against nvImageCodec's C header (``include/nvimgcodec.h``
of the ``nvidia-nvimgcodec-cu12`` package, a build requirement) and does not link
the library: ``wsitool.native`` hands it the path of the library the package
loads.  Without a C compiler or without the header the build skips it
(``optional=True``) and wsitool reads JPEG tiles on its Python path; ``python -c
"import wsitool.native as n; print(n.status())"`` says which is in use.
"""

import importlib.util
import os

from setuptools import Extension, setup


def _nvimgcodec_include() -> str | None:
    """The folder holding nvimgcodec.h in the installed nvidia-nvimgcodec package, or None."""
    try:
        spec = importlib.util.find_spec("nvidia.nvimgcodec")  # imports only the 'nvidia' namespace
    except (ImportError, ValueError):
        return None
    for base in (spec.submodule_search_locations or []) if spec else []:
        include = os.path.join(base, "include")
        if os.path.isfile(os.path.join(include, "nvimgcodec.h")):
            return include
    return None


include = _nvimgcodec_include()
ext_modules = [Extension(
    "wsitool._boxfilter",
    sources=["wsitool/_native/boxfilter.c"],
    extra_compile_args=["-O3", "-std=c11", "-Wall"],
    optional=True,
)]
if include is not None:
    ext_modules.append(Extension(
        "wsitool._jpegloop",
        sources=["wsitool/_native/jpegloop.c"],
        # wsitool/_native first: its cuda_runtime_api.h stands in for CUDA's.
        include_dirs=["wsitool/_native", include],
        libraries=["dl", "pthread"],
        extra_compile_args=["-O3", "-std=c11", "-Wall"],
        optional=True,
    ))

setup(ext_modules=ext_modules)
