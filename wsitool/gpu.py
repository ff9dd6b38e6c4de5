"""GPU support: device discovery and the backend report.

Without a usable CUDA device (no CuPy, no driver, no GPU), every GPU entry
point raises :class:`~wsitool.errors.DeviceUnavailableError` with the message
"no CUDA device available"; nothing else changes.
"""

from __future__ import annotations

import functools

from .errors import DeviceUnavailableError

__all__ = ["cuda_available", "cuda_device_id", "backend_report", "read_region_cuda"]

NO_CUDA = "no CUDA device available"


@functools.lru_cache(maxsize=1)
def _cuda_probe() -> tuple[bool, str]:
    """(available, reason) -- CuPy importable and at least one CUDA device."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # ImportError, or CUDA libraries missing
        return False, f"CuPy not importable ({type(exc).__name__})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return False, f"CUDA runtime error ({exc})"
    if count < 1:
        return False, "no CUDA device"
    return True, f"{count} CUDA device(s)"


def cuda_available() -> bool:
    """True if CuPy imports and sees at least one CUDA device."""
    return _cuda_probe()[0]


def cuda_device_id(device: str) -> int:
    """Parse ``"cuda"`` / ``"cuda:N"`` into a device index; raise if unusable."""
    if not cuda_available():
        raise DeviceUnavailableError(f"{NO_CUDA} ({_cuda_probe()[1]})")
    _, _, index = device.partition(":")
    try:
        return int(index) if index else 0
    except ValueError:
        raise ValueError(f"bad device {device!r}: use 'cuda' or 'cuda:N'") from None


def backend_report() -> list[dict]:
    """Which decode backends exist here and what each decodes (for ``wsitool info``)."""
    ok, reason = _cuda_probe()
    return [
        {"name": "nvImageCodec CPU (libjpeg-turbo, OpenJPEG)", "available": True,
         "decodes": "JPEG RGB/YCbCr, JPEG 2000 (33003, 33005, 34712)"},
        {"name": "nvImageCodec CUDA (nvJPEG, nvJPEG2000)", "available": ok,
         "decodes": "JPEG, JPEG 2000 with device='cuda'" + ("" if ok else f" -- {reason}")},
        {"name": "tifffile + imagecodecs (CPU)", "available": True,
         "decodes": "none, LZW, deflate, zstd, WebP, JPEG gray/CMYK, predictors, 16-bit"},
    ]


def read_region_cuda(slide, level, x, y, w, h, *, out=None, mode="rgba", threads=None,
                     on_error="raise", device="cuda"):
    """GPU region read (CuPy output).  Raises DeviceUnavailableError without CUDA."""
    cuda_device_id(device)
    raise DeviceUnavailableError(f"{slide.path}: GPU region reads are not implemented yet")
