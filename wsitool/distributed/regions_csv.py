"""Region lists: the CSV file format of batch region reads and the safe set of region names (floor 7)."""

from __future__ import annotations

import csv
import dataclasses
import io
import os

from ..errors import InvalidRegionError
from ..ground.naming import about


@dataclasses.dataclass(frozen=True)
class RegionRequest:
    """One region to read: ``x``, ``y`` level-0 pixels; ``level``; ``width``,
    ``height`` in pixels of that level; ``name`` of its output (no extension)."""

    x: int
    y: int
    level: int
    width: int
    height: int
    name: str


#: Characters allowed in a region name (it becomes a file name): letters and
#: digits of any script, space, and ``_ - . + = , @ ( )``; first character a
#: letter, digit or ``_``; no trailing space or dot; at most
#: :data:`MAX_NAME_BYTES` bytes of UTF-8.
NAME_PUNCTUATION = " _-.+=,@()"


MAX_NAME_BYTES = 150


_REQUIRED = ("x", "y", "level", "width", "height")
#: The largest magnitude of a coordinate, level or size (a signed 64-bit integer).
_NUMBER_LIMIT = 2**63 - 1


def name_ok(name: str) -> bool:
    if not name or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return False
    if not (name[0].isalnum() or name[0] == "_") or name[-1] in " .":
        return False
    return all(ch.isalnum() or ch in NAME_PUNCTUATION for ch in name)


def check_name(name: str, where: str) -> str:
    """Refuse a region name outside the safe set (:data:`NAME_PUNCTUATION`) with ``where``."""
    if not isinstance(name, str) or not name_ok(name):
        raise InvalidRegionError(
            f"{where}: invalid region name {name!r} (allowed: letters, digits, space and "
            f"{NAME_PUNCTUATION.strip()}; starting with a letter, digit or _; at most "
            f"{MAX_NAME_BYTES} bytes)"
        )
    return name


def decode_text(data: bytes, what: str) -> str:
    """``data`` decoded as UTF-8 (a BOM allowed), or InvalidRegionError naming the line (not the
    file: the caller that read it attaches its name, :mod:`wsitool.ground.naming`)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InvalidRegionError(
            f"line {line}: {what} is not UTF-8 text (byte 0x{data[exc.start]:02x}); "
            "save it as UTF-8"
        ) from None


def load_regions_csv(path: str | os.PathLike) -> list[RegionRequest]:
    """Read region requests from a CSV file with a header row.

    Columns (any order, names case-insensitive): ``x``, ``y`` (level-0 pixels),
    ``level``, ``width``, ``height`` (pixels of that level), and optionally
    ``name`` (output file name without extension; default
    ``NNNNNN_x<X>_y<Y>_L<level>_<W>x<H>`` with the 1-based data row number).
    Blank lines are ignored.

    Returns:
        The requests in file order.

    Raises:
        FileNotFoundError: no such file.
        InvalidRegionError: text that is not UTF-8, a row that is not CSV, a
            missing column, a value that is not an integer (or is beyond a signed
            64-bit integer), a non-positive width/height or negative level, an
            invalid (see :data:`NAME_PUNCTUATION`) or duplicate name — the message
            names the file and line.
    """
    path = os.fspath(path)
    out: list[RegionRequest] = []
    seen: dict[str, int] = {}

    with open(path, "rb") as fb, about(path):
        text = decode_text(fb.read(), "the regions file")
    reader = csv.reader(io.StringIO(text, newline=""))
    header = None
    try:
        for row in reader:
            if not row or all(not c.strip() for c in row):
                continue
            if header is None:
                header = _header(row, f"{path}: line {reader.line_num}")
                continue
            where = f"{path}: line {reader.line_num}"
            req = _request(row, header, where, len(out) + 1)
            if req.name in seen:
                raise InvalidRegionError(f"{where}: duplicate region name {req.name!r} (also on line "
                                         f"{seen[req.name]})")
            seen[req.name] = reader.line_num
            out.append(req)
    except csv.Error as exc:  # a NUL byte, an unterminated quote at the end, a huge field
        raise InvalidRegionError(f"{path}: line {reader.line_num}: not a valid CSV row ({exc})") from None
    if header is None:
        raise InvalidRegionError(f"{path}: empty regions file (expected a header x,y,level,width,height[,name])")
    return out


def _header(row: list[str], where: str) -> list[str]:
    """The column names of the header ``row`` (stripped, lower case); InvalidRegionError when a required
    one is missing."""
    header = [c.strip().lower() for c in row]
    missing = [c for c in _REQUIRED if c not in header]
    if missing:
        raise InvalidRegionError(
            f"{where}: missing column(s) {', '.join(missing)} "
            f"(the header must name x, y, level, width, height and optionally name)"
        )
    return header


def _request(row: list[str], header: list[str], where: str, n: int) -> RegionRequest:
    """The request of data row number ``n`` (1-based; its default name); InvalidRegionError naming
    ``where`` for a value that is not an integer, a size or level out of range, a bad name."""
    if len(row) < len(header):
        row = row + [""] * (len(header) - len(row))
    rec = dict(zip(header, (c.strip() for c in row), strict=False))
    vals = {}
    for col in _REQUIRED:
        text = rec[col]
        try:
            vals[col] = int(text)
        except ValueError:  # (also a number of over 4,300 digits, which int() refuses)
            shown = repr(text) if len(text) <= 40 else f"{text[:32]!r}... ({len(text)} characters)"
            raise InvalidRegionError(f"{where}: column {col} must be an integer, got {shown}") from None
        if abs(vals[col]) > _NUMBER_LIMIT:
            raise InvalidRegionError(f"{where}: column {col} is out of range (a number of {len(text)} "
                                     f"characters; at most {_NUMBER_LIMIT})")
    if vals["width"] <= 0 or vals["height"] <= 0:
        raise InvalidRegionError(
            f"{where}: width and height must be positive, got {vals['width']}x{vals['height']}"
        )
    if vals["level"] < 0:
        raise InvalidRegionError(f"{where}: level must be >= 0, got {vals['level']}")
    name = rec.get("name") or (
        f"{n:06d}_x{vals['x']}_y{vals['y']}_L{vals['level']}_{vals['width']}x{vals['height']}"
    )
    check_name(name, where)
    return RegionRequest(name=name, **vals)


