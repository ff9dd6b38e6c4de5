"""IIIF Image API 3.0: request syntax, geometry and the image information document.

Implements compliance level 2 of the IIIF Image API 3.0 (https://iiif.io/api/image/3.0/):

* §4.1 region: ``full``, ``square``, ``x,y,w,h``, ``pct:x,y,w,h`` (cut at the
  image edge; a region entirely outside the image, or of zero width or height,
  is a 400);
* §4.2 size: ``max``, ``w,``, ``,h``, ``pct:n``, ``w,h``, ``!w,h`` and each with
  the ``^`` prefix (upscaling).  Without ``^`` a size larger than the region is a
  400; any size beyond ``maxWidth`` / ``maxHeight`` / ``maxArea`` is a 400, except
  ``max``, which is scaled down to fit them;
* §4.3 rotation: ``0``, ``90``, ``180``, ``270`` (and ``360``), each optionally
  mirrored with ``!``; other angles are valid syntax but not implemented (501);
* §4.4 quality: ``default`` (= ``color``), ``color``, ``gray``, ``bitonal``;
* §4.5 format: ``jpg``, ``png``, ``webp``; ``tif``, ``gif``, ``jp2``, ``pdf`` are
  501, anything else 400;
* §4.7 canonical URI syntax (the ``Link: rel="canonical"`` header);
* §5 image information (``info.json``): ``sizes``, ``tiles`` with integer
  power-of-two ``scaleFactors``, ``maxWidth`` / ``maxHeight`` / ``maxArea``,
  ``profile`` ``level2``, ``extraQualities``, ``extraFormats``, ``extraFeatures``;
* §7.1 error conditions: 400 bad syntax, 404 unknown identifier, 501 valid but
  unsupported, each with a short plain-text body (:class:`IIIFError`; it repeats at
  most about 40 characters of the request).  A number of more than 20 digits
  (:data:`MAX_DIGITS`) anywhere in a region, size or rotation is a 400.

Coordinates: regions are ``(x, y, w, h)`` in level-0 pixels of the image;
sizes ``(w, h)`` in output pixels before rotation.  Pure functions, no I/O.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

from ..ground.limits import get_limits

__all__ = ["IIIFError", "ServiceLimits", "ImageRequest", "service_limits", "parse_region",
           "parse_size", "parse_rotation", "parse_quality_format", "parse_image_request",
           "scale_factors", "info_document", "check_numbers", "quoted", "CONTEXT", "PROFILE_URI",
           "MEDIA_TYPES", "MAX_DIGITS"]

CONTEXT = "http://iiif.io/api/image/3/context.json"
PROFILE_URI = "http://iiif.io/api/image/3/level2.json"

#: Formats served and their media types (§4.5).
MEDIA_TYPES = {"jpg": "image/jpeg", "png": "image/png", "webp": "image/webp"}
#: Formats the specification names that this server does not produce (501).
_KNOWN_FORMATS = {"tif", "gif", "jp2", "pdf"}
QUALITIES = ("default", "color", "gray", "bitonal")
#: Features beyond level 2 that this server supports (§5.3, Table "Features").
EXTRA_FEATURES = ["canonicalLinkHeader", "mirroring", "profileLinkHeader", "sizeUpscaling"]

#: The largest side every format encodes: WebP's limit is 16383, but imagecodecs'
#: webp_encode refuses 16383 itself (it checks ``side < 16383``); JPEG's is 65500.
_CODEC_MAX_SIDE = 16382
#: Largest output area by default: 64 megapixels (192 MiB as RGB before encoding).
_DEFAULT_MAX_AREA = 2**26

_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"  # ASCII digits only (\d takes any script's)
_INT4 = re.compile(r"^([0-9]+),([0-9]+),([0-9]+),([0-9]+)\Z")
_PCT4 = re.compile(rf"^pct:({_NUMBER}),({_NUMBER}),({_NUMBER}),({_NUMBER})\Z")
_ROTATION = re.compile(rf"^(!?)({_NUMBER})\Z")
#: The most digits one number of a request may have (before or after its point): more than any
#: image side or percentage needs; a longer run is a 400 before any conversion (int() refuses
#: 4,300 digits, float() makes 400 of them infinite: both were 500s).
MAX_DIGITS = 20
_LONG_NUMBER = re.compile(rf"[0-9]{{{MAX_DIGITS + 1}}}")
#: The most characters of a request's parameter an error message repeats.
_SHOWN = 40


class IIIFError(Exception):
    """A request the server answers with an error status (§7.1).

    Attributes:
        status: 400 (bad syntax or impossible request), 404 (unknown identifier),
            501 (valid but not implemented), 503 (server busy).
        message: a short human-readable cause (the response body).
    """

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclasses.dataclass(frozen=True)
class ServiceLimits:
    """``maxWidth``, ``maxHeight``, ``maxArea`` of every image served (pixels, §5.2)."""

    max_width: int
    max_height: int
    max_area: int


def service_limits(max_width: int | None = None, max_height: int | None = None,
                   max_area: int | None = None, area_cap: int | None = None) -> ServiceLimits:
    """The service limits, from wsitool's limits where not given.

    ``maxArea`` defaults to the smaller of wsitool's ``max_region_pixels`` and
    64 megapixels, and is never more than ``area_cap`` (the largest area the
    server's render memory allows, :func:`wsitool.serve.bounds.area_within`);
    ``maxWidth`` / ``maxHeight`` to the largest side every format encodes (16382),
    never more than ``maxArea``.
    """
    lim = get_limits()
    area = max_area if max_area is not None else min(lim.max_region_pixels, _DEFAULT_MAX_AREA)
    if area_cap is not None:
        area = min(area, area_cap)
    side = min(_CODEC_MAX_SIDE, area)
    return ServiceLimits(max_width if max_width is not None else side,
                         max_height if max_height is not None else side, area)


@dataclasses.dataclass(frozen=True)
class ImageRequest:
    """A parsed, validated image request.

    Attributes:
        region: ``(x, y, w, h)`` in level-0 pixels, inside the image.
        size: ``(w, h)`` of the output before rotation, pixels.
        upscaled: ``size`` is larger than the region on some axis (``^`` given).
        mirror: flip horizontally before rotating.
        rotation: 0, 90, 180 or 270 degrees clockwise.
        quality: ``"color"``, ``"gray"`` or ``"bitonal"`` (``default`` is ``color``).
        format: ``"jpg"``, ``"png"`` or ``"webp"``.
        canonical: the canonical ``region/size/rotation/quality.format`` path (§4.7).
    """

    region: tuple[int, int, int, int]
    size: tuple[int, int]
    upscaled: bool
    mirror: bool
    rotation: int
    quality: str
    format: str
    canonical: str

    @property
    def output_size(self) -> tuple[int, int]:
        """``(w, h)`` of the image sent, after rotation."""
        w, h = self.size
        return (h, w) if self.rotation in (90, 270) else (w, h)

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.format]


def _bad(message: str) -> IIIFError:
    return IIIFError(400, message)


def quoted(text: str) -> str:
    """``repr(text)``, cut to about 40 characters (a request's text in an error's short body)."""
    return repr(text) if len(text) <= _SHOWN else f"{text[:_SHOWN - 8]!r}... ({len(text)} characters)"


def check_numbers(what: str, text: str) -> None:
    """Refuse ``text`` (a request parameter) holding a number of more than :data:`MAX_DIGITS` digits.

    Raises:
        IIIFError: 400 naming ``what`` (``"region"``, ``"level"``).
    """
    if _LONG_NUMBER.search(text):
        raise _bad(f"{what} {quoted(text)}: a number of more than {MAX_DIGITS} digits")


def parse_region(text: str, width: int, height: int) -> tuple[int, int, int, int]:
    """§4.1: the region ``text`` of a ``width x height`` image as ``(x, y, w, h)``, cut at the edges.

    Raises:
        IIIFError: 400 for bad syntax (a number of more than :data:`MAX_DIGITS` digits
            included), a zero-sized region or one outside the image.
    """
    if text == "full":
        return (0, 0, width, height)
    if text == "square":
        s = min(width, height)
        return ((width - s) // 2, (height - s) // 2, s, s)
    check_numbers("region", text)
    m = _INT4.match(text)
    if m:
        x, y, w, h = (int(g) for g in m.groups())
    else:
        m = _PCT4.match(text)
        if not m:
            raise _bad(f"invalid region {quoted(text)}")
        px, py, pw, ph = (float(g) for g in m.groups())
        if px > 100 or py > 100:
            raise _bad(f"region {quoted(text)} starts outside the image")
        x, y = round(px * width / 100), round(py * height / 100)
        w, h = round(pw * width / 100), round(ph * height / 100)
        if pw > 0 and w == 0:
            w = 1
        if ph > 0 and h == 0:
            h = 1
    if w <= 0 or h <= 0:
        raise _bad(f"region {quoted(text)} has zero width or height")
    if x >= width or y >= height:
        raise _bad(f"region {quoted(text)} lies outside the {width}x{height} image")
    return (x, y, min(w, width - x), min(h, height - y))


def _fit(w: float, h: float, lim: ServiceLimits) -> tuple[int, int]:
    """Largest size of aspect ``w:h`` not above ``(w, h)`` within the limits."""
    scale = min(1.0, lim.max_width / w, lim.max_height / h, math.sqrt(lim.max_area / (w * h)))
    ow, oh = max(1, int(w * scale)), max(1, int(h * scale))
    while ow * oh > lim.max_area:  # guard rounding
        ow, oh = max(1, ow - 1), max(1, oh - 1)
    return ow, oh


def parse_size(text: str, rw: int, rh: int, lim: ServiceLimits) -> tuple[tuple[int, int], bool, str]:
    """§4.2: the size ``text`` for a ``rw x rh`` region.

    Returns:
        ``((w, h), upscaled, canonical)``: output size before rotation, whether
        it exceeds the region, and the canonical size string (§4.7).

    Raises:
        IIIFError: 400 for bad syntax (a number of more than :data:`MAX_DIGITS` digits
            included), a zero size, upscaling without ``^`` or a size over the service limits.
    """
    check_numbers("size", text)
    up = text.startswith("^")
    body = text[1:] if up else text
    if body == "max":
        w, h = _fit(rw, rh, lim)
        return (w, h), False, ("max" if (w, h) == (rw, rh) else f"{w},{h}")
    if body.startswith("pct:"):
        num = body[4:]
        if not re.fullmatch(_NUMBER, num) or float(num) == 0:
            raise _bad(f"invalid size {quoted(text)}")
        n = float(num)
        w, h = max(1, round(rw * n / 100)), max(1, round(rh * n / 100))
    elif body.startswith("!"):
        m = re.fullmatch(r"([0-9]+),([0-9]+)", body[1:])
        if not m or int(m.group(1)) == 0 or int(m.group(2)) == 0:
            raise _bad(f"invalid size {quoted(text)}")
        bw, bh = int(m.group(1)), int(m.group(2))
        scale = min(bw / rw, bh / rh)
        w, h = max(1, min(bw, round(rw * scale))), max(1, min(bh, round(rh * scale)))
    else:
        m = re.fullmatch(r"([0-9]*),([0-9]*)", body)
        if not m or not (m.group(1) or m.group(2)):
            raise _bad(f"invalid size {quoted(text)}")
        gw = int(m.group(1)) if m.group(1) else None
        gh = int(m.group(2)) if m.group(2) else None
        if gw == 0 or gh == 0:
            raise _bad(f"size {quoted(text)} is zero")
        if gw is not None and gh is not None:
            w, h = gw, gh
        elif gw is not None:
            w, h = gw, max(1, round(rh * gw / rw))
        else:  # (the pattern above leaves one of the two given)
            assert gh is not None
            w, h = max(1, round(rw * gh / rh)), gh
    upscaled = w > rw or h > rh
    if upscaled and not up:
        raise _bad(f"size {quoted(text)} is larger than the {rw}x{rh} region (use ^ to upscale)")
    if w > lim.max_width or h > lim.max_height or w * h > lim.max_area:
        raise _bad(f"size {w}x{h} exceeds the server's limits (maxWidth {lim.max_width}, "
                   f"maxHeight {lim.max_height}, maxArea {lim.max_area})")
    canonical = ("^" if upscaled else "") + ("max" if (w, h) == (rw, rh) else f"{w},{h}")
    return (w, h), upscaled, canonical


def parse_rotation(text: str) -> tuple[bool, int, str]:
    """§4.3: ``(mirror, degrees, canonical)`` for 0/90/180/270 (360 is 0), optionally ``!``.

    Raises:
        IIIFError: 400 for bad syntax (a number of more than :data:`MAX_DIGITS` digits
            included) or an angle above 360; 501 for any other angle.
    """
    check_numbers("rotation", text)
    m = _ROTATION.match(text)
    if not m:
        raise _bad(f"invalid rotation {quoted(text)}")
    mirror = m.group(1) == "!"
    value = float(m.group(2))
    if value > 360:
        raise _bad(f"rotation {quoted(text)} is over 360")
    if value not in (0, 90, 180, 270, 360):
        raise IIIFError(501, f"rotation {quoted(text)}: only multiples of 90 degrees are implemented")
    degrees = int(value) % 360
    return mirror, degrees, ("!" if mirror else "") + str(degrees)


def parse_quality_format(text: str) -> tuple[str, str, str]:
    """§4.4, §4.5: ``quality.format`` as ``(quality, format, canonical)``; ``default`` is ``color``.

    Raises:
        IIIFError: 400 for an unknown quality or format; 501 for a format of the
            specification this server does not produce (tif, gif, jp2, pdf).
    """
    quality, dot, fmt = text.rpartition(".")
    if not dot or quality not in QUALITIES:
        raise _bad(f"invalid quality and format {quoted(text)}")
    if fmt not in MEDIA_TYPES:
        if fmt in _KNOWN_FORMATS:
            raise IIIFError(501, f"format {fmt!r} is not implemented (jpg, png, webp are)")
        raise _bad(f"invalid format {quoted(fmt)}")
    return ("color" if quality == "default" else quality), fmt, f"{quality}.{fmt}"


def parse_image_request(region: str, size: str, rotation: str, quality_format: str,
                        width: int, height: int, lim: ServiceLimits) -> ImageRequest:
    """Parse the four parameters of an image request (§4) for a ``width x height`` image.

    The parameters are checked in URI order (region, size, rotation, quality
    and format), so the first bad one names the error.

    Raises:
        IIIFError: 400 / 501 as the parameter parsers do.
    """
    reg = parse_region(region, width, height)
    (w, h), upscaled, size_c = parse_size(size, reg[2], reg[3], lim)
    mirror, degrees, rot_c = parse_rotation(rotation)
    quality, fmt, qf_c = parse_quality_format(quality_format)
    reg_c = "full" if reg == (0, 0, width, height) else ",".join(map(str, reg))
    return ImageRequest(reg, (w, h), upscaled, mirror, degrees, quality, fmt,
                        f"{reg_c}/{size_c}/{rot_c}/{qf_c}")


def scale_factors(width: int, height: int, tile: int) -> list[int]:
    """Powers of two ``1, 2, 4, ...`` up to the first at which the image fits one tile."""
    factors = [1]
    while -(-max(width, height) // factors[-1]) > tile:
        factors.append(factors[-1] * 2)
    return factors


def info_document(base_id: str, width: int, height: int, tile: int, lim: ServiceLimits,
                  admit: Callable[[tuple[int, int, int, int], tuple[int, int]], bool] | None = None) -> dict:
    """The image information document (§5) of a ``width x height`` image served at ``base_id``.

    ``sizes`` lists the whole image at each scale factor (smallest first) that
    fits the limits; ``tiles`` one ``tile x tile`` grid with the power-of-two
    scale factors (the API requires integers; pyramids store downsamples such
    as 4.002, whose nearest powers of two are what clients ask for).

    ``admit(region, size)``: whether the server answers level-0 ``region`` at ``size``
    (e.g. within its budget of source pixels read per request); None: all.  Only
    sizes it admits are listed, and only the scale factors whose first tile (the
    region ``tile * f`` square at the origin, cut at the edge) it admits.
    """
    factors = scale_factors(width, height, tile)
    if admit is not None:
        factors = [f for f in factors
                   if admit((0, 0, min(width, tile * f), min(height, tile * f)),
                            (-(-min(width, tile * f) // f), -(-min(height, tile * f) // f)))]
    sizes = []
    for f in reversed(scale_factors(width, height, tile)):
        w, h = -(-width // f), -(-height // f)
        if (w <= lim.max_width and h <= lim.max_height and w * h <= lim.max_area
                and (admit is None or admit((0, 0, width, height), (w, h)))):
            sizes.append({"width": w, "height": h})
    return {
        "@context": CONTEXT,
        "id": base_id,
        "type": "ImageService3",
        "protocol": "http://iiif.io/api/image",
        "profile": "level2",
        "width": width,
        "height": height,
        "maxWidth": lim.max_width,
        "maxHeight": lim.max_height,
        "maxArea": lim.max_area,
        "sizes": sizes,
        "tiles": [{"width": tile, "height": tile, "scaleFactors": factors}],
        "extraQualities": ["color", "gray", "bitonal"],
        "extraFormats": ["png", "webp"],
        "extraFeatures": list(EXTRA_FEATURES),
        "preferredFormats": ["jpg"],
    }
