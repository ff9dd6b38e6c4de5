"""The ``Literal`` types of the public options, defined once (floor 0).

Type checkers reject a misspelt option (``mode="rbg"``) with these; at run time
the functions that take them still check the value and raise
:class:`~wsitool.errors.InvalidRegionError` for one outside the set.
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

__all__ = ["Mode", "OnError", "Device", "Color", "Chunks", "CupyArray"]

#: What a region read returns: ``"rgba"`` ``(h, w, 4)`` uint8, ``"rgb"`` ``(h, w, 3)`` uint8,
#: ``"raw"`` ``(h, w, samples)`` in the level's dtype.
Mode: TypeAlias = Literal["rgba", "rgb", "raw"]

#: What a corrupt tile does: ``"raise"`` a :class:`~wsitool.errors.TileDecodeError`, or
#: ``"fill"`` it with background (and a :class:`~wsitool.errors.TileWarning`).
OnError: TypeAlias = Literal["raise", "fill"]

#: Where the output lives: ``"cpu"`` (a NumPy array) or ``"cuda"`` (a CuPy array on the
#: current device).  ``"cuda:N"`` (device N) is accepted too, typed as a plain ``str``.
Device: TypeAlias = Literal["cpu", "cuda"]

#: Colour management of a read: None (the stored pixels) or ``"icc"`` (the slide's ICC
#: profile converted to sRGB).
Color: TypeAlias = Literal["icc"]

#: Chunking of a Dask array of a level: ``"tile"``, ``n`` (``n x n``) or ``(rows, cols)``.
Chunks: TypeAlias = Literal["tile"] | int | tuple[int, int]

#: A ``cupy.ndarray``.  CuPy ships no type information, so this is ``Any`` for a type
#: checker; it names what a ``device="cuda"`` read returns.
CupyArray: TypeAlias = Any
