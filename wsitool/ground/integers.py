"""Coercion of caller arguments to integers, with one wording for every API that takes them.

Ground floor (standard library, numpy and :mod:`wsitool.errors`).
"""

from __future__ import annotations

import numbers
from typing import SupportsInt, cast

import numpy as np

from ..errors import InvalidRegionError

__all__ = ["as_int", "int_pair"]


def as_int(value, what: str, where: str | None = None, error: type[Exception] = InvalidRegionError) -> int:
    """``value`` as an ``int``: integers and integral floats pass (``2.0`` -> 2).

    Args:
        value: the caller's value.
        what: its name in the message (``"level"``, ``"tile_size"``).
        where: prefix of the message (the slide's path), or None.
        error: the exception class raised (default :class:`InvalidRegionError`,
            a ``ValueError``).

    Raises:
        InvalidRegionError: (or the ``error`` class given) ``value`` is a bool, not a
            number, or a float with a fraction.
    """
    if type(value) is int:  # the common case, without the ABC checks below
        return value
    prefix = f"{where}: " if where else ""
    if isinstance(value, (bool, np.bool_)):
        raise error(f"{prefix}{what} must be an integer, got {value!r}")
    if not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and float(value).is_integer():
            return int(cast(SupportsInt, value))  # (numbers.Real as typed has no __int__)
        raise error(f"{prefix}{what} must be an integer, got {value!r}")
    return int(value)


def int_pair(value, what: str, where: str | None = None) -> tuple[int, int]:
    """``value`` (any 2-sequence) as two ints; :class:`InvalidRegionError` otherwise."""
    try:
        a, b = value
    except (TypeError, ValueError):
        prefix = f"{where}: " if where else ""
        raise InvalidRegionError(f"{prefix}{what} must be a pair of integers, got {value!r}") from None
    return as_int(a, what, where), as_int(b, what, where)
