"""Values of storage options that take text or a yes/no, whatever type they were given in.

``--storage-option KEY=VALUE`` reads VALUE as JSON when it parses (so ``secret=1234`` arrives as
the number 1234, ``token=true`` as True), and the Python API takes any value; the clients want
text for keys, secrets, tokens, endpoints and names (obstore refuses a number with a
``TypeError``).  :func:`option_text` gives such a value as the text it was written as;
:func:`option_flag` reads a yes/no option.  Neither ever shows the value in an error: it may
be a secret.

Standard library only, and :mod:`wsitool.errors`.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidOptionError

__all__ = ["option_text", "option_flag"]


def _kind(value: Any) -> str:
    """The JSON name of ``value``'s type (``null``, ``a list``, ``an object``) or Python's."""
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object (KEY.NAME=VALUE)"
    return f"type {type(value).__name__}"


def option_text(key: str, value: Any) -> str:
    """``value`` of the text option ``key`` as text: a string as is; a number or boolean as JSON
    writes it (``1234`` -> ``"1234"``, ``12.5`` -> ``"12.5"``, True -> ``"true"``), which is the
    text given on the command line (it keeps a number only where it reads back the same).

    Raises:
        InvalidOptionError: None, a list, a mapping or another type (exit 2).
    """
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return json.dumps(value)
    raise InvalidOptionError(f"storage option {key}: expected text, got {_kind(value)}")


def option_flag(key: str, value: Any) -> bool:
    """``value`` of the yes/no option ``key``: a boolean, ``0``/``1``, or ``true``/``false``,
    ``yes``/``no``, ``1``/``0`` in any case.

    Raises:
        InvalidOptionError: anything else (``anon=maybe`` was read as false; exit 2).
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "1", "false", "no", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    shown = repr(value) if isinstance(value, str) and len(value) <= 10 else _kind(value)
    raise InvalidOptionError(f"storage option {key}: expected true or false, got {shown}")
