"""OME-TIFF metadata: MPP and objective power from the OME-XML (floor 3).

Source: the OME Data Model (openmicroscopy.org/Schemas/OME/2016-06):
``Pixels@PhysicalSizeX/Y`` with ``PhysicalSizeXUnit`` (default "µm"),
``Objective@NominalMagnification``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import tifffile

from .properties import positive_float

__all__ = ["ome_metadata", "other_images"]


OME_UNITS_UM = {"pm": 1e-6, "nm": 1e-3, "µm": 1.0, "um": 1.0, "mm": 1e3, "cm": 1e4, "m": 1e6}


def ome_metadata(xml: str, props: dict[str, str]) -> tuple[float | None, float | None, float | None]:
    """MPP and objective power from OME-XML (OME schema: Pixels@PhysicalSizeX/Y,
    PhysicalSizeXUnit default "µm"; Objective@NominalMagnification)."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return None, None, None
    mpp: list[float | None] = [None, None]
    objective = None
    for el in root.iter():
        tag = el.tag.rsplit("}", 1)[-1]
        if tag == "Pixels" and mpp[0] is None:
            for i, axis in enumerate("XY"):
                v = positive_float(el.get(f"PhysicalSize{axis}"))
                unit = el.get(f"PhysicalSize{axis}Unit", "µm")
                if v is not None and unit in OME_UNITS_UM:
                    mpp[i] = v * OME_UNITS_UM[unit]
                    props[f"ome.PhysicalSize{axis}"] = el.get(f"PhysicalSize{axis}", "")
                    props[f"ome.PhysicalSize{axis}Unit"] = unit
        elif tag == "Objective" and objective is None:
            objective = positive_float(el.get("NominalMagnification"))
    return mpp[0], mpp[1], objective


def other_images(tiff: tifffile.TiffFile) -> dict[int, str]:
    """Top-level IFD index -> lower-case Name of the OME Images after the first.

    Each OME ``Image`` is one tifffile series; the pyramid is the first, and
    further Images are associated images, named ``label`` / ``macro`` as
    bioformats2raw / raw2ometiff write them (OME-TIFF specification; an
    Image without a Name becomes ``associated-<n>``).  Empty when the file
    has one Image or its series are not all OME series.
    """
    try:
        series = tiff.series
    except Exception:  # an unreadable OME-XML: fall back to every IFD
        return {}
    if len(series) < 2 or any(s.kind != "ome" for s in series):
        return {}

    def top(page: Any) -> int | None:
        idx = getattr(page, "index", None)
        if isinstance(idx, tuple):
            idx = idx[0] if idx else None
        return idx if isinstance(idx, int) else None

    first = {top(p) for p in series[0].pages if p is not None}
    out: dict[int, str] = {}
    for n, s in enumerate(series[1:], 1):
        name = (s.name or "").strip().lower() or f"associated-{n}"
        for p in s.pages:
            i = top(p) if p is not None else None
            if i is not None and i not in first:
                out.setdefault(i, name)
    return out


