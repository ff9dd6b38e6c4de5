"""Which device a read runs on: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``, and whether CUDA is usable here.

Ground floor (standard library and :mod:`wsitool.errors`; CuPy, an optional
dependency of the ``gpu`` extra, is imported inside the functions that need it).
Without a usable CUDA device every GPU entry point raises
:class:`~wsitool.errors.DeviceUnavailableError` whose message contains
:data:`NO_CUDA`; the CLI prints it as one line and exits with code 8.
"""

from __future__ import annotations

import functools

from ..errors import DeviceUnavailableError

__all__ = ["NO_CUDA", "cuda_available", "cuda_device_id", "cuda_probe", "parse_device"]


NO_CUDA = "no CUDA device available"


@functools.lru_cache(maxsize=1)
def cuda_probe() -> tuple[bool, str]:
    """(available, reason) -- CuPy importable and at least one CUDA device."""
    try:
        import cupy
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
    return cuda_probe()[0]


def parse_device(device: str) -> int | None:
    """``"cuda"`` -> None (current device), ``"cuda:N"`` -> N; ValueError otherwise."""
    if not isinstance(device, str) or not device.startswith("cuda"):
        raise ValueError(f"bad device {device!r}: use 'cpu', 'cuda' or 'cuda:N'")
    if device == "cuda":
        return None
    head, sep, index = device.partition(":")
    if head != "cuda" or not sep or not index.isdigit():
        raise ValueError(f"bad device {device!r}: use 'cpu', 'cuda' or 'cuda:N'")
    return int(index)


def cuda_device_id(device: str) -> int:
    """Parse ``"cuda"`` / ``"cuda:N"`` into a CUDA device index.

    ``"cuda"`` is CuPy's current device (0 unless the caller selected another
    with ``cupy.cuda.Device(n).use()``).

    Raises:
        ValueError: ``device`` is not ``"cuda"`` or ``"cuda:N"``.
        DeviceUnavailableError: no usable CUDA device, or N is not one of them.
    """
    index = parse_device(device)
    ok, reason = cuda_probe()
    if not ok:
        raise DeviceUnavailableError(f"{NO_CUDA} ({reason})")
    import cupy

    if index is None:
        return int(cupy.cuda.runtime.getDevice())
    count = cupy.cuda.runtime.getDeviceCount()
    if index >= count:
        raise DeviceUnavailableError(f"{NO_CUDA}: {device} requested, {count} device(s) present")
    return index
