"""``Slidedat.ini``: the MIRAX key file, read as OpenSlide 4.0.1 reads it (floor 3).

OpenSlide loads it with GLib's key-file parser after two clean-ups of its own
(``_openslide_read_key_file``): a UTF-8 byte-order mark is skipped and lines whose key is
empty (``=value``, which real files contain) are removed.  Python's configparser refuses
such files (and treats ``;``, ``%`` and case differently), so this module parses the text
itself, by GLib's rules as far as OpenSlide's reader sees them:

* the file is at most :data:`MAX_BYTES` (OpenSlide's limit for this file, 1 MiB);
* lines end with LF, a CR before it dropped; blank lines and lines starting with ``#`` are
  skipped; ``[name]`` starts a group (groups of the same name are merged);
* ``key=value``: the key without the white space before ``=``, the value without the white
  space after it (kept raw: no escapes resolved, trailing white space kept); a later value of
  a key replaces the earlier one;
* a line that is none of these makes the file unreadable for GLib (and OpenSlide): here it is
  a :class:`~wsitool.errors.CorruptFileError` naming the line.

Typed reads follow GLib's: an integer is a decimal ``strtol`` number that may be followed by
white space only; a double is a whole ``g_ascii_strtod`` number (C locale, nothing after it).
"""

from __future__ import annotations

import math
import re

from ...errors import CorruptFileError

__all__ = ["KeyFile", "parse", "MAX_BYTES"]

#: Largest Slidedat.ini read (OpenSlide's SLIDEDAT_MAX_SIZE).
MAX_BYTES = 1 << 20

_INT = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)([ \t\n\v\f\r].*)?", re.S)
_DOUBLE = re.compile(r"[ \t\n\v\f\r]*([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan))",
                     re.I)


class KeyFile:
    """The groups of a parsed key file: ``groups[name][key] = raw value`` (in file order)."""

    def __init__(self, groups: dict[str, dict[str, str]]):
        self.groups = groups

    def has(self, group: str) -> bool:
        """Whether the file has ``[group]``."""
        return group in self.groups

    def value(self, group: str, key: str) -> str:
        """The raw value of ``key`` in ``group``.

        Raises:
            CorruptFileError: no such group or key (named).
        """
        try:
            return self.groups[group][key]
        except KeyError:
            where = f"group [{group}]" if group not in self.groups else f"key {key} in [{group}]"
            raise CorruptFileError(f"Slidedat.ini: no {where}") from None

    def get(self, group: str, key: str) -> str | None:
        """The raw value, or None where the group or key is absent."""
        return self.groups.get(group, {}).get(key)

    def integer(self, group: str, key: str) -> int:
        """The value as GLib's ``g_key_file_get_integer`` reads it (a C int).

        Raises:
            CorruptFileError: absent, not an integer, or outside 32 bits.
        """
        text = self.value(group, key)
        m = _INT.fullmatch(text)
        v = int(m.group(1)) if m else None
        if v is None or not -(1 << 31) <= v < (1 << 31):
            raise CorruptFileError(f"Slidedat.ini: {key} in [{group}] is not an integer: {text[:40]!r}")
        return v

    def double(self, group: str, key: str) -> float:
        """The value as GLib's ``g_key_file_get_double`` reads it.

        Raises:
            CorruptFileError: absent or not a number.
        """
        text = self.value(group, key)
        m = _DOUBLE.fullmatch(text)
        if not m:
            raise CorruptFileError(f"Slidedat.ini: {key} in [{group}] is not a number: {text[:40]!r}")
        return float(m.group(1))

    def properties(self) -> dict[str, str]:
        """``mirax.<group>.<key>`` -> raw value, every key of every group (OpenSlide's names)."""
        return {f"mirax.{g}.{k}": v for g, keys in self.groups.items() for k, v in keys.items()}


def parse(data: bytes) -> KeyFile:
    """Parse the bytes of a Slidedat.ini (module docstring).

    Raises:
        CorruptFileError: larger than :data:`MAX_BYTES`, not UTF-8, a key before the first
            group, or a line that is no group, key or comment.
    """
    if len(data) > MAX_BYTES:
        raise CorruptFileError(f"Slidedat.ini: {len(data)} bytes, more than a key file holds "
                               f"({MAX_BYTES})")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptFileError(f"Slidedat.ini: not UTF-8 text (byte {exc.start})") from None
    groups: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw[:-1] if raw.endswith("\r") else raw
        body = line.lstrip(" \t\n\v\f\r")
        if not body or body.startswith("#"):
            continue
        if body.startswith("["):
            end = body.find("]")
            if end < 0 or body[end + 1:].strip(" \t\v\f\r"):
                raise CorruptFileError(f"Slidedat.ini line {number}: not a group header: {body[:60]!r}")
            current = groups.setdefault(body[1:end], {})
            continue
        eq = body.find("=")
        if eq < 0:
            raise CorruptFileError(f"Slidedat.ini line {number}: not a key, group or comment: {body[:60]!r}")
        key = body[:eq].rstrip(" \t\n\v\f\r")
        if not key:
            continue  # OpenSlide removes key-less lines before parsing
        if current is None:
            raise CorruptFileError(f"Slidedat.ini line {number}: key {key[:40]!r} before the first group")
        current[key] = body[eq + 1:].lstrip(" \t\n\v\f\r")
    return KeyFile(groups)


def finite(v: float, what: str) -> float:
    """``v`` when finite, else CorruptFileError naming ``what``."""
    if not math.isfinite(v):
        raise CorruptFileError(f"Slidedat.ini: {what} is {v}")
    return v
