"""Which decode backends exist on this machine and what each decodes (``wsitool info``) (floor 3).

CuPy (optional, the ``gpu`` extra) is imported inside the probes.
"""

from __future__ import annotations

import ctypes.util
import dataclasses
import functools
import glob
import importlib.util
import os
from typing import Any

import numpy as np

from ..ground.device import NO_CUDA, cuda_probe
from . import jpegloop, strictjpeg
from .library import available as nv_available
from .library import nv, unavailable_reason
from .paths import get_decode_paths

__all__ = ["backend_report"]


#: GPUs with the hardware JPEG decoder that nvJPEG's hardware backend uses
#: (NVIDIA nvJPEG documentation, "Hardware Acceleration": A100, A30, H100;
#: the H200 and GH200 carry the same Hopper NVJPG engines).  Only a hint: the
#: report probes the hardware backend with a real decode when a GPU is present.
_HW_JPEG_GPUS = ("A100", "A30", "A800", "H100", "H200", "H800", "GH200")


def _library_found(package: str, soname: str) -> bool:
    """True if ``soname`` is in the pip package ``nvidia.<package>`` or on the loader path."""
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        if glob.glob(os.path.join(root, package, "lib", soname + "*")):
            return True
    return ctypes.util.find_library(soname[3:].split(".")[0]) is not None


@functools.lru_cache(maxsize=1)
def _tiny_streams() -> dict:
    """A 64 x 64 baseline JPEG and a JPEG 2000 code stream for the backend probes.

    Encoded by nvImageCodec's CPU encoders (libjpeg-turbo / OpenJPEG), so the
    probes need nothing beyond nvImageCodec.
    """
    yy, xx = np.mgrid[0:64, 0:64]
    img = np.stack([xx * 4, yy * 4, (xx + yy) * 2], axis=-1).astype(np.uint8)
    encoder = nv().Encoder(device_id=nv().NVIMGCODEC_DEVICE_CPU_ONLY,
                                 backends=[nv().Backend(nv().BackendKind.CPU_ONLY)])
    return {"jpeg": encoder.encode(img, "jpeg"), "j2k": encoder.encode(img, "jpeg2k")}


@functools.lru_cache(maxsize=4)
def _probe_backend(kind: str, codec: str, device_id: int) -> tuple[bool, str]:
    """Decode a tiny ``codec`` stream with only backend ``kind`` on the GPU."""
    try:
        import cupy

        data = _tiny_streams()[codec]
        backend = nv().Backend(getattr(nv().BackendKind, kind))
        with cupy.cuda.Device(device_id):
            decoder = nv().Decoder(device_id=device_id, max_num_cpu_threads=1,
                                         backends=[backend])
            result = decoder.decode(data)
            if result is None:
                return False, "backend present but declined a baseline test image"
            decoded = cupy.asnumpy(cupy.asarray(result))
        if decoded.shape != (64, 64, 3):
            return False, f"test decode returned shape {decoded.shape}"
        return True, "test decode ok"
    except Exception as exc:
        return False, f"test decode failed ({type(exc).__name__}: {exc})"


def gpu_name(device_id: int) -> str:
    try:
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(device_id)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return "unknown GPU"


def _native_entry() -> dict:
    """The compiled JPEG tile loop's row of :func:`backend_report`."""
    status = jpegloop.status()
    return {"name": "CPU: compiled JPEG tile loop (wsitool._jpegloop)", "device": "cpu",
            "available": status.startswith("in use"),
            "decodes": "JPEG (7) RGB/YCbCr tiles, through libjpeg-turbo's own API: straight into the "
                       "output, corrupt data an error (nvImageCodec's CPU backend decodes it silently); "
                       "device cpu",
            "detail": status}


def _strict_entry() -> dict:
    """The row of libjpeg-turbo through simplejpeg (:mod:`wsitool.codec.strictjpeg`): JPEG tiles
    where the compiled loop is absent, corrupt data an error all the same."""
    loop = jpegloop.status().startswith("in use")
    have = strictjpeg.available()
    if loop:
        detail = "not needed: the compiled loop decodes JPEG tiles"
    elif not get_decode_paths().libjpeg:
        detail = "off (wsitool.codec.paths.decode_paths(libjpeg=False))"
    elif have:
        detail = "in use: JPEG tiles are decoded by libjpeg-turbo through simplejpeg, corrupt data an error"
    else:
        detail = ("simplejpeg is not installed (pip install simplejpeg): nvImageCodec decodes JPEG tiles and "
                  "corrupt JPEG data goes undetected")
    return {"name": "CPU: libjpeg-turbo through simplejpeg", "device": "cpu",
            "available": have,
            "decodes": "JPEG (7) RGB/YCbCr tiles where the compiled loop is absent: whole tiles, corrupt data "
                       "an error (strict); device cpu",
            "detail": detail}


def backend_report(probe: bool = True) -> list[dict]:
    """Which decode backends exist here and what each decodes (for ``wsitool info``).

    Args:
        probe: with a GPU present, check each GPU backend with a tiny real
            decode (done once per process, a fraction of a second).

    Returns:
        A list of dicts, one per backend: ``name``, ``device`` (``"cpu"`` or
        ``"cuda"``), ``available`` (bool), ``decodes`` (which compressions it
        decodes and for which ``device=`` argument) and ``detail`` (why it is
        or is not available: the GPU's name, the missing library or
        package).  JSON-serialisable.
    """
    ok, reason = cuda_probe()
    nvjpeg_lib = _library_found("nvjpeg", "libnvjpeg.so")
    nvjpeg2k_lib = _library_found("nvjpeg2k", "libnvjpeg2k.so")
    here = _Cuda(ok, reason, gpu_name(0) if ok else None, probe)
    hw_hint = any(tag in (here.gpu or "") for tag in _HW_JPEG_GPUS)
    hw = here.entry("CUDA: nvJPEG hardware engine", "HW_GPU_ONLY", "jpeg", nvjpeg_lib,
                    "nvidia-nvjpeg-cu12", "baseline JPEG (7); device cuda, tried first")
    if ok:
        hw["detail"] += "; this GPU model " + ("has" if hw_hint else "is not listed with") + \
            " a JPEG engine (nvJPEG docs)"
    nv_ok = nv_available()
    return [
        _nvimagecodec_entry(nv_ok),
        here.entry("CUDA: nvJPEG", "GPU_ONLY", "jpeg", nvjpeg_lib, "nvidia-nvjpeg-cu12",
                   "JPEG (7) RGB/YCbCr; device cuda"),
        hw,
        here.entry("CUDA: nvJPEG2000", "GPU_ONLY", "j2k", nvjpeg2k_lib, "nvidia-nvjpeg2k-cu12",
                   "JPEG 2000 (33003, 33005, 34712); device cuda"),
        _native_entry(),
        _strict_entry(),
        _tifffile_entry(nv_ok),
    ]


@dataclasses.dataclass(frozen=True)
class _Cuda:
    """What :func:`backend_report` found of CUDA: usable (``ok``) or why not (``reason``),
    device 0's name, and whether to probe the GPU backends with a real decode."""

    ok: bool
    reason: str
    gpu: str | None
    probe: bool

    def entry(self, name: str, kind: str, codec: str, lib_found: bool, lib_pkg: str,
              decodes: str) -> dict[str, Any]:
        """The row of GPU backend ``kind`` (nvImageCodec's ``BackendKind``) decoding ``codec``."""
        if not self.ok:
            missing = "" if lib_found else f"; {lib_pkg} not installed"
            return {"name": name, "device": "cuda", "available": False, "decodes": decodes,
                    "detail": f"{NO_CUDA}: {self.reason}{missing}"}
        # The probe (a real decode) is authoritative; the library search is a
        # hint only (nvImageCodec also finds its libraries by other paths).
        if self.probe:
            works, why = _probe_backend(kind, codec, 0)
        else:
            works, why = lib_found, "library found, not probed" if lib_found else "not probed"
        if not works and not lib_found:
            why += f"; library not found (pip install {lib_pkg})"
        return {"name": name, "device": "cuda", "available": bool(works), "decodes": decodes,
                "detail": f"{self.gpu}: {why}"}


def _nvimagecodec_entry(nv_ok: bool) -> dict[str, Any]:
    """The row of nvImageCodec's CPU decoders."""
    return {"name": "CPU: nvImageCodec (libjpeg-turbo, OpenJPEG)", "device": "cpu", "available": nv_ok,
            "decodes": "JPEG (7) headers; JPEG tiles where the compiled loop is not built and "
                       "lossless / CMYK JPEG; JPEG 2000 (33003, 33005, 34712) where OpenJPEG is not "
                       "found; device cpu, and fallback for device cuda",
            "detail": "loaded" if nv_ok else
                      f"{unavailable_reason()}; JPEG and JPEG 2000 tiles are decoded by imagecodecs "
                      "(the same pixels, slower)"}


def _tifffile_entry(nv_ok: bool) -> dict[str, Any]:
    """The row of the tifffile / imagecodecs path (always there)."""
    return {"name": "CPU: tifffile + imagecodecs", "device": "cpu", "available": True,
            "decodes": ("all other compressions (none, LZW, deflate, zstd, WebP, gray/CMYK JPEG, "
                        "16-bit)" if nv_ok else
                        "every compression, JPEG and JPEG 2000 included (nvImageCodec is not "
                        "importable)") + "; device cuda: decoded on the CPU, then copied",
            "detail": "always available"}
