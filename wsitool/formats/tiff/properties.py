"""Slide properties of a TIFF pyramid: OpenSlide's ``openslide.*`` keys, ``tiff.*`` tags, MPP (floor 3).

MPP sources, in order: the vendor's own metadata (Aperio ``MPP``, OME
``PhysicalSizeX/Y``), then TIFF XResolution / YResolution rationals with
ResolutionUnit centimetre (1e4 / res) or inch (25400 / res) (TIFF 6.0 section 8).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import tifffile
from tifffile import RESUNIT

from ...model import PyramidLevel, level_properties

__all__ = ["build_properties", "positive_float", "num_str", "resolution_mpp"]

_TAG_PROPERTIES = ("ImageDescription", "Make", "Model", "Software", "DateTime", "Artist",
                   "Copyright", "HostComputer", "DocumentName")


def build_properties(vendor: str, base: tifffile.TiffPage, levels: Sequence[PyramidLevel], vendor_props: dict[str, str],
                     vendor_mpp: tuple[float | None, float | None],
                     objective: float | None) -> dict[str, str]:
    """The properties mapping of a slide.

    Args:
        vendor: ``"aperio"``, ``"ome-tiff"`` or ``"generic-tiff"``.
        base: level 0's tifffile page.
        levels: the :class:`~wsitool.model.PyramidLevel` objects.
        vendor_props: the vendor's own keys (``aperio.*``, ``ome.*``).
        vendor_mpp: ``(mpp_x, mpp_y)`` in micrometres from the vendor's metadata
            (None where absent); objective: its objective power, or None.
    """
    props: dict[str, str] = {"openslide.vendor": vendor}
    tags = base.tags
    for tag_name in _TAG_PROPERTIES:
        tag = tags.get(tag_name)
        if tag is not None and isinstance(tag.value, str):
            props[f"tiff.{tag_name}"] = tag.value
    res = resolution_mpp(base)
    if res is not None:
        xres, yres, unit, _mppx, _mppy = res
        props["tiff.XResolution"] = repr(xres)
        props["tiff.YResolution"] = repr(yres)
        props["tiff.ResolutionUnit"] = unit
    props.update(vendor_props)
    mpp_x, mpp_y = vendor_mpp
    if mpp_x is None and vendor not in ("aperio", "philips", "ventana") and res is not None:
        mpp_x, mpp_y = res[3], res[4]
    if mpp_x is not None and mpp_y is not None:
        props["openslide.mpp-x"] = repr(float(mpp_x))
        props["openslide.mpp-y"] = repr(float(mpp_y))
    if objective is not None:
        props["openslide.objective-power"] = num_str(objective)
    props.update(level_properties(levels))
    return props


def positive_float(value: Any) -> float | None:
    """``value`` as a finite float above 0, else None."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v > 0 else None


def num_str(v: float) -> str:
    """``v`` as text: without a fraction where it is whole (``"20"``), else its repr."""
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def rational(value: Any) -> float | None:
    """A TIFF RATIONAL ``(numerator, denominator)`` (or one number) as a float; None for
    a zero denominator or a value that is no positive number."""
    if isinstance(value, tuple) and len(value) == 2:
        num, den = value
        if den == 0:
            return None
        return num / den
    return positive_float(value)


#: micrometres per ResolutionUnit, and the unit's name (TIFF 6.0 section 8)
_UM_PER_UNIT: dict[int, float] = {RESUNIT.INCH: 25400.0, RESUNIT.CENTIMETER: 10000.0}
_UNIT_NAMES: dict[int, str] = {RESUNIT.INCH: "inch", RESUNIT.CENTIMETER: "centimeter"}


def resolution_mpp(page: tifffile.TiffPage) -> tuple[Any, Any, str, float, float] | None:
    """(XResolution, YResolution, unit name, mpp_x, mpp_y) from TIFF tags, or None.

    TIFF 6.0 section 8: X/YResolution are RATIONALs (pixels per ResolutionUnit);
    ResolutionUnit 2 = inch, 3 = centimetre, 1 = no absolute unit.
    """
    tags = page.tags
    xt, yt, ut = tags.get("XResolution"), tags.get("YResolution"), tags.get("ResolutionUnit")
    if xt is None or yt is None:
        return None
    unit = int(ut.value) if ut is not None else RESUNIT.INCH
    x, y = rational(xt.value), rational(yt.value)
    if not x or not y or x <= 0 or y <= 0:
        return None
    per_unit_um = _UM_PER_UNIT.get(unit)
    if per_unit_um is None:
        return None
    name = _UNIT_NAMES[unit]
    return xt.value, yt.value, name, per_unit_um / x, per_unit_um / y
