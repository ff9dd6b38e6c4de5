"""Optical paths as channels: names, wavelengths and the palette colour of each (floor 3).

A fluorescence DICOM WSI has one optical path per channel (PS3.3 C.8.12.5,
Optical Path Sequence (0048,0105)); each item may carry a Palette Color
Lookup Table Sequence (0048,0120) giving the colour to show the channel in.
The table (PS3.3 C.7.6.3.1.5 and C.7.9) has three descriptors (entries, first
mapped value, bits per entry; 0 entries means 65536) and per colour either
the entries themselves or a segmented form (C.7.9.2), decoded here by
:func:`expand_segments`.

Segmented data is a list of segments, each starting with an opcode word:

* 0, discrete: a count ``n``, then ``n`` entries;
* 1, linear: a count ``n`` and an end value: ``n`` entries stepping
  linearly from the last entry so far to the end value (the last of them is
  the end value);
* 2, indirect: a count ``n`` and a 32-bit byte offset (two words, low word
  first) into the segmented data: the ``n`` segments found there are
  expanded again.

The words are 16-bit per the data element (OW); some writers (3DHISTECH among
them) do so while the descriptor says 8 bits per entry, others pack 8-bit
segments: both widths are tried, the descriptor's first, and the one that
yields the declared number of entries wins.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ...model import Channel, channel_color

__all__ = ["expand_segments", "palette_lut", "path_channels"]

#: Deepest chain of indirect segments followed (a loop in a corrupt table ends here).
_MAX_INDIRECTION = 4


def expand_segments(words: Iterable[Any], limit: int = 65536, word_bytes: int = 2) -> list[int]:
    """The entries of segmented palette data ``words`` (a sequence of ints, one word each).

    Args:
        words: the segments (see the module's notes).
        limit: most entries accepted (a table has at most 65536).
        word_bytes: bytes per word (2, or 1 for packed 8-bit data), to turn an
            indirect segment's byte offset into a word index.

    Raises:
        ValueError: an unknown opcode, a segment cut short, a linear segment first,
            an indirect offset outside the data or not on a word, indirection
            nested too deep, or more than ``limit`` entries.
    """
    words = [int(w) for w in words]
    out: list[int] = []
    _walk(words, 0, None, out, limit, word_bytes, 0)
    return out


def _walk(words: list[int], i: int, count: int | None, out: list[int], limit: int,
          word_bytes: int, depth: int) -> None:
    """Expand the segments of ``words`` from word ``i`` into ``out``: ``count`` of them,
    or all up to the end (None)."""
    done = 0
    while (count is None and i < len(words)) or (count is not None and done < count):
        if i + 1 >= len(words):
            raise ValueError(f"segment at word {i} cut short")
        op, n = words[i], words[i + 1]
        if op == 0:
            if i + 2 + n > len(words):
                raise ValueError(f"discrete segment at word {i} cut short")
            out.extend(words[i + 2:i + 2 + n])
            i += 2 + n
        elif op == 1:
            if i + 2 >= len(words):
                raise ValueError(f"linear segment at word {i} cut short")
            if not out:
                raise ValueError("a linear segment with no entry before it")
            y0, y1 = out[-1], words[i + 2]
            out.extend(int(round(y0 + (y1 - y0) * (k + 1) / n)) for k in range(n))
            i += 3
        elif op == 2:
            if depth >= _MAX_INDIRECTION or i + 3 >= len(words):
                raise ValueError(f"indirect segment at word {i} cut short or nested too deep")
            offset = words[i + 2] | (words[i + 3] << 16)
            if offset % word_bytes or not 0 <= offset // word_bytes < len(words):
                raise ValueError(f"indirect offset {offset} outside the data")
            _walk(words, offset // word_bytes, n, out, limit, word_bytes, depth + 1)
            i += 4
        else:
            raise ValueError(f"unknown segment opcode {op} at word {i}")
        if len(out) > limit:
            raise ValueError(f"more than {limit} entries")
        done += 1


def _words(raw: bytes, width: int) -> list[int]:
    if width == 16:
        return np.frombuffer(raw[:len(raw) // 2 * 2], "<u2").tolist()
    return list(raw)


def _decode(raw: bytes, entries: int, bits: int) -> np.ndarray | None:
    """The ``(entries,)`` values of one colour's segmented data, trying both word widths."""
    for width in ((8, 16) if bits == 8 else (16, 8)):
        try:
            values = expand_segments(_words(raw, width), entries, width // 8)
        except ValueError:
            continue
        if len(values) == entries:
            return np.asarray(values, np.int64)
    return None


def _plain(raw: bytes, entries: int, bits: int) -> np.ndarray | None:
    """The entries of a plain (not segmented) palette data element."""
    if bits == 8 and len(raw) >= entries and len(raw) < 2 * entries:
        return np.frombuffer(raw[:entries], np.uint8).astype(np.int64)
    if len(raw) >= 2 * entries:
        return np.frombuffer(raw[:2 * entries], "<u2").astype(np.int64)
    return None


def palette_lut(item: Any, image_bits: int = 8) -> np.ndarray | None:
    """The ``(256, 3)`` uint8 composite table of a Palette Color Lookup Table item, or None.

    Entry ``v`` is the palette's colour for the image value that scales to ``v``
    (``v`` for 8-bit images; ``v * (2**image_bits - 1) // 255`` for wider ones),
    values below the first mapped value take the first entry, above the last the
    last.  Entries of 16 bits (or any above 255) are reduced to 8 by their high byte.
    None when the item lacks a colour's descriptor or data, or the data does not
    decode to the declared number of entries.
    """
    colours = []
    for colour in ("Red", "Green", "Blue"):
        desc = item.get(f"{colour}PaletteColorLookupTableDescriptor")
        if desc is None or len(desc) < 3:
            return None
        entries = int(desc[0]) or 65536
        first, bits = int(desc[1]), int(desc[2])
        seg = item.get(f"Segmented{colour}PaletteColorLookupTableData")
        plain = item.get(f"{colour}PaletteColorLookupTableData")
        if seg is not None:
            values = _decode(bytes(seg), entries, bits)
        elif plain is not None:
            values = _plain(bytes(plain), entries, bits)
        else:
            return None
        if values is None:
            return None
        if bits > 8 or values.max(initial=0) > 255:
            values = values >> 8
        scaled = np.arange(256, dtype=np.int64)
        if image_bits > 8:
            scaled = scaled * ((1 << image_bits) - 1) // 255
        colours.append(np.clip(values[np.clip(scaled - first, 0, entries - 1)], 0, 255))
    return np.stack(colours, axis=1).astype(np.uint8)


def _wavelength(item: Any, keyword: str) -> float | None:
    value = item.get(keyword)
    try:
        nm = float(value) if value is not None and value != "" else None
    except (TypeError, ValueError):
        return None
    return nm if nm is not None and nm > 0 else None


def _short_name(description: str | None, ident: str, index: int) -> str:
    """The channel's name: its description without a trailing ``(...)`` note
    (``"DAPI (Blue)"`` -> ``"DAPI"``), else ``"Path <identifier>"``, else ``"C<index>"``."""
    if description:
        short = re.sub(r"\s*\([^()]*\)\s*$", "", description).strip()
        return short or description.strip()
    return f"Path {ident}" if ident else f"C{index}"


def path_channels(items: Sequence[Any], image_bits: int = 8) -> list[Channel]:
    """One :class:`~wsitool.model.Channel` per Optical Path Sequence item, in order.

    Name: from Optical Path Description (0048,0107) (:func:`_short_name`), the
    description kept whole; excitation: Illumination Wave Length (0022,0055);
    emission: Image Path Filter Pass-Through Wavelength (0022,0002); both in nm,
    0 or absent meaning unknown.  Colour: the palette's top entry (its table is
    the channel's ``lut``), else
    :func:`~wsitool.model.channel_color`.
    """
    out = []
    for k, item in enumerate(items):
        ident = str(item.get("OpticalPathIdentifier", "") or "")
        desc = str(item.get("OpticalPathDescription", "") or "") or None
        excitation = _wavelength(item, "IlluminationWaveLength")
        emission = _wavelength(item, "ImagePathFilterPassThroughWavelength")
        lut = None
        seq = item.get("PaletteColorLookupTableSequence")
        if seq:
            try:
                lut = palette_lut(seq[0], image_bits)
            except (TypeError, ValueError, KeyError, AttributeError):
                lut = None
        if lut is not None:
            color, source = (int(lut[255][0]), int(lut[255][1]), int(lut[255][2])), "palette"
        else:
            color, source = channel_color(k, len(items), emission, excitation)
        out.append(Channel(name=_short_name(desc, ident, k), description=desc, excitation_nm=excitation,
                           emission_nm=emission, color=color, color_source=source, lut=lut))
    return out
