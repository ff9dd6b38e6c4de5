"""Code-stream headers read without decoding: JPEG SOF, JPEG 2000 SIZ and main header, JP2 boxes, WebP, LZW.

Ground floor (imports only numpy and :mod:`wsitool.errors`).  These checks keep
streams that native decoders are known to crash on, or that declare more pixels
than their tile (decompression bombs), away from those decoders; the format
layer (associated images), the codec layer (tiles) and the exporter (JP2 output
of the encoder) share them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "ADOBE_RGB_MARKER",
    "jpegls_frame_size",
    "SOI",
    "jpeg_with_prefix",
    "EOI",
    "ends_with_restart",
    "SOF_MARKERS",
    "jpeg_frame_size",
    "jpeg_segments",
    "jpeg_sof",
    "webp_frame_size",
    "J2KHeader",
    "j2k_header_problem",
    "j2k_main_header",
    "jp2_boxes",
    "jp2_codestream_start",
    "jp2_codestream",
    "lzw_problem",
]

#: An Adobe APP14 segment with transform flag 0 (Adobe Technical Note #5116,
#: "APP14"): tells a JPEG decoder the components are RGB, not YCbCr.
ADOBE_RGB_MARKER = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00"
#: JPEG start-of-image marker (ITU-T T.81 B.2.1).
SOI = b"\xff\xd8"
#: JPEG end-of-image marker (ITU-T T.81 B.2.1).
EOI = b"\xff\xd9"

#: the frame-header markers (SOF0..SOF15 but DHT, JPG and DAC; ITU-T T.81 table B.1)
SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def jpeg_with_prefix(prefix: bytes, tile: bytes) -> bytes:
    """A complete JPEG stream from a tile whose tables live elsewhere (TIFF JPEGTables, TIFF
    Technical Note 2): ``prefix`` (SOI, the tables' segments, markers) in place of the tile's
    SOI; the tile unchanged where ``prefix`` is empty or the tile does not start with SOI."""
    if prefix and tile[:2] == SOI:
        return prefix + tile[2:]
    return tile


def ends_with_restart(data) -> bool:
    """True when ``data`` (bytes or a uint8 array) ends with a restart marker RST0..RST7
    (``ff d0`` .. ``ff d7``, ITU-T T.81 B.2.4.4 and table B.1).

    A restart interval cut out of a longer scan (Hamamatsu NDPI, see
    :attr:`wsitool.model.TileEncoding.jpeg_scan_segments`) ends with the marker
    that starts the next interval; made into a stream of its own, that marker
    becomes EOI.
    """
    n = len(data)
    return n >= 2 and int(data[n - 2]) == 0xFF and 0xD0 <= int(data[n - 1]) <= 0xD7


def jpeg_frame_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from the first SOF segment of a JPEG stream, or None.

    Walks the marker segments from SOI (ITU-T T.81 annex B.1.1): every
    segment but SOI/RSTn/TEM carries a 2-byte big-endian length.  Returns
    None if the scan reaches SOS or the end of the data without a frame header.
    """
    return _frame_size(data, SOF_MARKERS)


def jpegls_frame_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from the SOF55 segment of a JPEG-LS stream (ITU-T T.87 C.2.2), or None.

    The same marker walk as :func:`jpeg_frame_size`, looking for SOF55 (0xFFF7).
    """
    return _frame_size(data, _SOF55)


_SOF55 = frozenset({0xF7})


def jpeg_segments(data: bytes):
    """The marker segments of a JPEG stream's header, as ``(marker, start, end)``.

    ``marker`` is the second marker byte (``0xC0`` for SOF0, ...) and
    ``data[start:end]`` the segment's body after its 2-byte length (ITU-T T.81
    annex B.1.1).  The walk starts at SOI (nothing for data without one),
    skips fill bytes and the segment-less markers (TEM, RSTn), yields SOS and
    stops there, and stops at EOI, at a byte that is not a marker and at the
    end of the data.  Bodies may be cut short by the end of the data.
    """
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return
    i = 2
    while i + 4 <= n:
        if data[i] != 0xFF:
            return
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:
            i += 2
            continue
        if marker == 0xD9:
            return
        length = (data[i + 2] << 8) | data[i + 3]
        yield marker, i + 4, min(i + 2 + length, n)
        if marker == 0xDA:
            return
        i += 2 + length


def jpeg_sof(data: bytes, sof_markers: frozenset = SOF_MARKERS) -> bytes | None:
    """The body of the first frame header (SOF, or one of ``sof_markers``) before SOS, or None."""
    for marker, start, end in jpeg_segments(data):
        if marker in sof_markers:
            return data[start:end]
        if marker == 0xDA:
            return None
    return None


#: The frame headers of the DCT processes (ITU-T T.81 table B.1): baseline (SOF0), extended (SOF1) and
#: progressive (SOF2) with Huffman coding, extended (SOF9) and progressive (SOF10) with arithmetic coding.
#: The others are lossless (SOF3, SOF11) or hierarchical (SOF5-7, SOF13-15).
DCT_SOF_MARKERS = frozenset({0xC0, 0xC1, 0xC2, 0xC9, 0xCA})


def jpeg_frame_kind(data: bytes) -> tuple[int, int, int] | None:
    """``(SOF marker, sample precision P, number of components Nf)`` of the first frame header
    of a JPEG stream (ITU-T T.81 B.2.2: P, Y, X, Nf), or None (no frame header before SOS)."""
    for marker, start, end in jpeg_segments(data):
        if marker in SOF_MARKERS:
            return (marker, data[start], data[start + 5]) if end - start >= 6 else None
        if marker == 0xDA:
            return None
    return None


def _frame_size(data: bytes, sof_markers: frozenset) -> tuple[int, int] | None:
    sof = jpeg_sof(data, sof_markers)
    if sof is None or len(sof) < 5:  # precision, height, width (T.81 B.2.2)
        return None
    return (sof[3] << 8) | sof[4], (sof[1] << 8) | sof[2]


def webp_frame_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from a WebP stream's first image chunk, or None.

    RFC 9649 (WebP container): ``RIFF <size> WEBP`` then a chunk.  ``VP8X``
    stores canvas width - 1 and height - 1 as 24-bit little-endian values at
    payload bytes 4 and 7; ``VP8L`` has the signature byte 0x2F and then
    14-bit width - 1 and height - 1; ``"VP8 "`` (lossy) has a 3-byte frame tag,
    the start code 9D 01 2A and 14-bit width and height (RFC 6386 section 9.1).
    """
    if len(data) < 30 or data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        return None
    chunk, payload = data[12:16], data[20:]
    if chunk == b"VP8X":
        width = 1 + int.from_bytes(payload[4:7], "little")
        height = 1 + int.from_bytes(payload[7:10], "little")
        return width, height
    if chunk == b"VP8L":
        if payload[0] != 0x2F:
            return None
        bits = int.from_bytes(payload[1:5], "little")
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    if chunk == b"VP8 ":
        if payload[3:6] != b"\x9d\x01\x2a":
            return None
        return (int.from_bytes(payload[6:8], "little") & 0x3FFF,
                int.from_bytes(payload[8:10], "little") & 0x3FFF)
    return None


_JP2_SIGNATURE = b"\x00\x00\x00\x0cjP  \r\n\x87\n"


#: Marker segments allowed in a JPEG 2000 main header (second byte of FFxx):
#: ITU-T T.800 table A.2 (SIZ 51, COD 52, COC 53, TLM 55, PLM 57, QCD 5C,
#: QCC 5D, RGN 5E, POC 5F, PPM 60, CRG 63, COM 64), T.801 (Part 2: MCT 74,
#: MCC 75, MCO 77, CBD 78) and T.814 (HTJ2K: CAP 50, CPF 59).
_J2K_MAIN_HEADER_MARKERS = frozenset(
    (0x50, 0x51, 0x52, 0x53, 0x55, 0x57, 0x59, 0x5C, 0x5D, 0x5E, 0x5F, 0x60, 0x63, 0x64,
     0x74, 0x75, 0x77, 0x78)
)


def jp2_boxes(data: bytes, start: int = 0, end: int | None = None):
    """The JP2 boxes in ``data[start:end]``, as ``(type, content start, content end)``.

    ISO/IEC 15444-1 annex I.4: a box is a 4-byte big-endian length ``LBox`` and a
    4-byte type ``TBox``; ``LBox`` 1 means an 8-byte ``XLBox`` follows, 0 means
    "to the end".  A box running past ``end`` is clipped to it (and is the
    last); the walk stops where fewer than 8 bytes are left.

    Raises:
        ValueError: a cut extended length, or a length shorter than the box
            header (the message says which).
    """
    n = len(data) if end is None else end
    i = start
    while i + 8 <= n:
        lbox = int.from_bytes(data[i:i + 4], "big")
        tbox = data[i + 4:i + 8]
        header = 8
        if lbox == 1:
            if i + 16 > n:
                raise ValueError("truncated JP2 box header")
            lbox, header = int.from_bytes(data[i + 8:i + 16], "big"), 16
        elif lbox == 0:
            lbox = n - i
        if lbox < header:
            raise ValueError(f"invalid JP2 box length {lbox}")
        yield tbox, i + header, min(i + lbox, n)
        i += lbox


def jp2_codestream_start(data: bytes) -> tuple[int, int, str | None]:
    """Byte range ``[start, end)`` of the code stream inside ``data``, and why it cannot be found.

    ``data`` is a raw JPEG 2000 code stream (offset 0) or a JP2 file, whose code
    stream is the content of the ``jp2c`` box (:func:`jp2_boxes`; ISO/IEC
    15444-1 I.5.4).  Returns ``(start, end, None)``, or ``(0, 0, problem)`` for
    a JP2 file whose boxes are truncated or invalid.  Anything that does not
    start with the JP2 signature box is taken as a raw code stream.
    """
    if not data.startswith(_JP2_SIGNATURE):
        return 0, len(data), None
    try:
        for tbox, a, b in jp2_boxes(data):
            if tbox == b"jp2c":
                return a, b, None
    except ValueError as exc:
        return 0, 0, str(exc)
    return 0, 0, "JP2 file without a code stream box (truncated)"


def jp2_codestream(data: bytes) -> bytes:
    """The contiguous code stream of a JP2 file (the payload of its ``jp2c`` box,
    see :func:`jp2_codestream_start`); a raw code stream is returned unchanged.

    Raises:
        ValueError: ``data`` is a JP2 file without a readable ``jp2c`` box.
    """
    start, end, problem = jp2_codestream_start(data)
    if problem:
        raise ValueError(problem)
    return data[start:end] if (start, end) != (0, len(data)) else data


class J2KHeader(NamedTuple):
    """What :func:`j2k_main_header` found: ``problem`` None, or why the header is
    unusable (the other fields are then 0)."""

    problem: str | None
    #: byte range ``[start, end)`` of the code stream in the data (a JP2 file's ``jp2c`` box)
    start: int
    end: int
    #: image size in pixels from SIZ, ``Xsiz - XOsiz`` x ``Ysiz - YOsiz`` (T.800 A.5.1)
    width: int
    height: int
    #: decomposition levels ``N_L`` of COD (T.800 A.6.1, ``SPcod`` byte 0): the most
    #: resolution levels a decoder may drop
    levels: int
    #: where the first SOT marker (``FF90``, the first tile-part header) starts in the data:
    #: the main header is ``data[start:sot]``
    sot: int = 0


def j2k_header_problem(data: bytes) -> str | None:
    """Why a JPEG 2000 tile's main header is unusable, or None if it is complete
    (:func:`j2k_main_header`'s ``problem``)."""
    return j2k_main_header(data).problem


def j2k_main_header(data: bytes) -> J2KHeader:
    """Check a JPEG 2000 tile's main header in one walk and return its facts (:class:`J2KHeader`).

    Accepts a raw code stream (SOC ``FF4F`` then SIZ ``FF51``, ITU-T T.800
    annex A) or a JP2 file (ISO/IEC 15444-1 annex I: boxes of ``LBox``,
    ``TBox`` [, ``XLBox``]; the code stream is the content of the ``jp2c``
    box).  The main header is complete when every marker segment after SOC
    lies inside ``data`` (each carries a 2-byte big-endian length) up to the
    first SOT (``FF90``) segment, which must be present whole.

    Why: nvImageCodec's CPU JPEG 2000 decoder crashed the process (SIGSEGV,
    found by scripts/fuzz.py) on a tile truncated inside its main header; a
    tile truncated after that returns no image and is reported normally.
    """
    n = len(data)
    start, end, problem = jp2_codestream_start(data)
    if problem:
        return _bad(problem)
    i = start
    if data[i:i + 4] != b"\xff\x4f\xff\x51":
        return _bad("not a JPEG 2000 code stream (no SOC + SIZ markers)")
    i += 2
    csiz = width = height = levels = 0
    seen: set[int] = set()
    while True:
        if i + 4 > n:
            return _bad("JPEG 2000 main header truncated")
        if data[i] != 0xFF:
            return _bad(f"invalid JPEG 2000 marker {data[i:i + 2].hex()} in the main header")
        marker = data[i + 1]
        if marker == 0x90:  # SOT: Lsot = 10, segment of 12 bytes
            problem = _j2k_sot_problem(seen, i + 12 > n)
            if problem:
                return _bad(problem)
            return J2KHeader(None, start, end, width, height, levels, i)
        if marker not in _J2K_MAIN_HEADER_MARKERS:
            # OpenJPEG skips unknown markers by searching for the next known one;
            # when that runs off the end, nvImageCodec's decoder crashed (SIGSEGV,
            # scripts/fuzz.py: a COM marker FF64 turned into FF40)
            return _bad(f"invalid JPEG 2000 main header: unknown marker ff{marker:02x}")
        seen.add(marker)
        length = int.from_bytes(data[i + 2:i + 4], "big")
        if length < 2:
            return _bad(f"invalid JPEG 2000 marker segment length {length}")
        if i + 2 + length > n:
            return _bad("JPEG 2000 main header truncated")
        seg = data[i + 4:i + 2 + length]
        if marker == 0x51:
            problem, csiz = _j2k_siz_problem(seg)
            if problem is None:
                width, height = _j2k_siz_size(seg)
        else:
            problem = _j2k_segment_problem(marker, seg, csiz)
            if marker == 0x52:  # COD: SPcod's first byte, the decomposition levels
                levels = seg[5]
        if problem:
            return _bad(f"invalid JPEG 2000 main header: {problem}")
        i += 2 + length


def _bad(problem: str) -> J2KHeader:
    return J2KHeader(problem, 0, 0, 0, 0, 0)


def _j2k_sot_problem(seen: set[int], truncated: bool) -> str | None:
    """What is wrong where the main header ends at the first SOT: a required segment not
    ``seen`` (COD and QCD, T.800 A.2, table A.1: OpenJPEG inside nvImageCodec crashed
    the process without COD, found by fuzzing), or the SOT segment cut short."""
    missing = [name for code, name in ((0x52, "COD"), (0x5C, "QCD")) if code not in seen]
    if missing:
        return f"invalid JPEG 2000 main header: required {' and '.join(missing)} missing"
    if truncated:
        return "JPEG 2000 tile-part header truncated"
    return None


def _j2k_siz_size(seg: bytes) -> tuple[int, int]:
    """``(width, height)`` of the image a SIZ segment declares: Xsiz - XOsiz, Ysiz - YOsiz."""
    width = int.from_bytes(seg[2:6], "big") - int.from_bytes(seg[10:14], "big")
    height = int.from_bytes(seg[6:10], "big") - int.from_bytes(seg[14:18], "big")
    return width, height


def _j2k_segment_problem(marker: int, seg: bytes, csiz: int) -> str | None:
    """What is wrong with the segment ``seg`` of a main-header ``marker`` other than SIZ
    (COD, COC and QCD are checked; ``csiz``: the component count SIZ declared), or None."""
    if marker == 0x52:
        return _j2k_cod_problem(seg)
    if marker == 0x53:
        return _j2k_coc_problem(seg, csiz)
    if marker == 0x5C:  # QCD: Sqcd, quantisation style in the low 5 bits
        return (None if seg and (seg[0] & 0x1F) in (0, 1, 2)
                else "invalid QCD quantisation style")
    return None


def _j2k_cod_problem(seg: bytes) -> str | None:
    """Range checks of a COD segment: Scod, SGcod (4 bytes), SPcod (T.800 A.6.1)."""
    problem = _j2k_coding_problem(seg, 0, "COD") if len(seg) >= 10 else "short COD"
    if problem is None and (seg[0] > 7 or (seg[0] & 1 and len(seg) < 11 + seg[5])):
        problem = f"invalid Scod {seg[0]} (or precinct sizes missing)"
    if problem is None and seg[1] > 4:
        problem = f"invalid progression order {seg[1]}"
    if problem is None and int.from_bytes(seg[2:4], "big") == 0:
        problem = "zero quality layers"
    return problem


def _j2k_coc_problem(seg: bytes, csiz: int) -> str | None:
    """Range checks of a COC segment: Ccoc (1 byte, 2 with 257 or more components), Scoc,
    SPcoc (T.800 A.6.2)."""
    k = 1 if csiz < 257 else 2
    problem = (_j2k_coding_problem(seg, k - 4, "COC") if len(seg) >= k + 6
               else "short COC")
    if problem is None and (seg[k] > 1 or (seg[k] & 1 and len(seg) < k + 7 + seg[k + 1])):
        problem = f"invalid Scoc {seg[k]} (or precinct sizes missing)"
    return problem


def _j2k_siz_problem(seg: bytes) -> tuple[str | None, int]:
    """Range checks of a SIZ segment (ITU-T T.800 A.5.1); returns (problem, Csiz)."""
    if len(seg) < 36:
        return "short SIZ", 0
    xsiz, ysiz, xo, yo, xt, yt, xto, yto = (int.from_bytes(seg[2 + 4 * k:6 + 4 * k], "big")
                                            for k in range(8))
    csiz = int.from_bytes(seg[34:36], "big")
    if not 1 <= csiz <= 16384 or len(seg) < 36 + 3 * csiz:
        return f"invalid component count {csiz}", csiz
    if xsiz <= xo or ysiz <= yo or xt == 0 or yt == 0 or xto > xo or yto > yo:
        return "inconsistent image/tile geometry in SIZ", csiz
    for c in range(csiz):
        ssiz, xr, yr = seg[36 + 3 * c:39 + 3 * c]
        if (ssiz & 0x7F) + 1 > 38 or xr == 0 or yr == 0:
            return f"invalid component {c} in SIZ", csiz
    return None, csiz


def _j2k_coding_problem(seg: bytes, base: int, name: str) -> str | None:
    """Range checks of SPcod / SPcoc (T.800 A.6.1, table A.15): decomposition levels
    <= 32, code-block exponents xcb, ycb <= 8 with xcb + ycb <= 8, code-block
    style without bit 7, transform 0 or 1.
    ``seg[base + 5 ...]`` is SPcod (``base`` = 0 for COD)."""
    levels, xcb, ycb, style, transform = seg[base + 5:base + 10]
    if levels > 32:
        return f"{levels} decomposition levels in {name}"
    if style & 0x80:
        # bit 7: reserved in Part 1, "mixed" HT code-blocks in Part 15 (T.814
        # table A.4), which OpenJPEG rejects -- and that rejection crashed the
        # process inside nvImageCodec (found by fuzzing)
        return f"unsupported code-block style 0x{style:02x} in {name}"
    if xcb > 8 or ycb > 8 or xcb + ycb > 8:
        return f"code-block exponents {xcb}, {ycb} in {name}"
    if transform > 1:
        return f"wavelet transform {transform} in {name}"
    return None


# Code widths of one TIFF LZW run between Clear codes (TIFF 6.0 section 13 with
# the "early change" of libtiff and every current writer): after a Clear the
# table's next entry is 258; the width grows from 9 to 10, 11 and 12 bits one
# code before the next entry would need the wider code (entries 511, 1023, 2047).
_LZW_WIDTHS = np.array([9] * 254 + [10] * 512 + [11] * 1024 + [12] * 2306, np.int64)


_LZW_STARTS = np.concatenate([[0], np.cumsum(_LZW_WIDTHS)[:-1]])


_LZW_CLEAR, _LZW_EOI = 256, 257


def lzw_problem(data: bytes) -> str | None:
    """Why a TIFF LZW strip or tile would be unsafe to decode, or None.

    Checks that the data starts with a Clear code (the TIFF 6.0 section 13
    encoder writes one first; the first 9 bits are then ``100000000``) and
    that the first code after every Clear code is a literal (< 256) or EOI:
    the decoder builds its next table entry from that first string.
    imagecodecs' ``lzw_decode`` (2026.3.6) crashed the process (SIGSEGV) on a
    non-literal first code followed by a reference to the entry built from
    it, and on garbage starting with a zero byte, which it takes for the
    old-style (pre-TIFF 6.0, LSB-first) LZW variant -- both found by
    scripts/fuzz.py.  That variant (first byte 0, low bit of the second set;
    the same test libtiff uses) is refused: no whole-slide writer produces it.
    Other invalid codes are reported by the decoder itself.

    The code layout between two Clear codes is fixed by the widths above, so
    each run is checked with numpy (one run covers at least 5 KB of data).
    """
    nbits = len(data) * 8
    if nbits < 9:
        return None
    if data[0] == 0 and data[1] & 1:
        return "old-style (pre-TIFF 6.0, LSB-first) LZW data is not supported (or corrupt data)"
    if data[0] != 0x80 or data[1] & 0x80:
        return "LZW data does not start with a Clear code (corrupt data)"
    buf = np.frombuffer(data + b"\x00\x00\x00", np.uint8).astype(np.int64)
    pos = 9
    while pos + 9 <= nbits:
        starts = pos + _LZW_STARTS
        count = int(np.searchsorted(starts + _LZW_WIDTHS, nbits, side="right"))
        if count == 0:
            return None
        st, widths = starts[:count], _LZW_WIDTHS[:count]
        byte = st >> 3
        word = (buf[byte] << 16) | (buf[byte + 1] << 8) | buf[byte + 2]  # 24 bits hold any code
        codes = (word >> (24 - (st & 7) - widths)) & ((1 << widths) - 1)
        first = int(codes[0])
        if first == _LZW_CLEAR:  # repeated Clear
            pos += 9
            continue
        if first == _LZW_EOI:
            return None
        if first > 255:
            return f"LZW code {first} after a Clear code is not a literal (corrupt data)"
        special = np.flatnonzero(codes[1:] >= _LZW_CLEAR) + 1
        special = special[(codes[special] == _LZW_CLEAR) | (codes[special] == _LZW_EOI)]
        if len(special) == 0:
            return None
        k = int(special[0])
        if int(codes[k]) == _LZW_EOI:
            return None
        pos = int(st[k] + widths[k])
    return None
