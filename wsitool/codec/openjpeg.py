"""OpenJPEG window decoder: only the code-blocks and resolutions a request needs (floor 3).

JPEG 2000 lets a decoder stop early in two directions (ITU-T T.800):

* **Space.**  A tile-component is cut into code-blocks (T.800 B.7) per sub-band
  of each resolution level (B.5, B.6); a window of the tile needs only the
  code-blocks whose wavelet support reaches it.  OpenJPEG's
  ``opj_set_decode_area`` skips the others (entropy decoding dominates the
  cost) and runs the inverse DWT on the window's span only ("partial" IDWT,
  OpenJPEG >= 2.3).
* **Resolution.**  Resolution level ``r`` of a tile with ``N_L`` decomposition
  levels is its ``LL`` band after ``N_L - r`` synthesis steps (T.800 B.5,
  F.3.1): decoding it costs the code-blocks of the lower resolutions only.
  ``opj_set_decoded_resolution_factor(codec, f)`` stops ``f`` levels short of
  full resolution: a tile of ``W x H`` pixels decodes to
  ``ceil(W / 2**f) x ceil(H / 2**f)`` (T.800 equation B-14, tile at origin 0).

Which library: libopenjp2, called through :mod:`ctypes`.  Neither
nvImageCodec's CPU backend (a 64 x 64 window of a 256 x 256 tile costs about
as much as the whole tile: it decodes whole and crops) nor imagecodecs'
``jpeg2k_decode`` (whole images only) nor pylibjpeg-openjpeg (whole images,
optional ``reduce`` only) exposes a decode area.  The library loaded is the
one the required ``imagecodecs`` wheel ships (``imagecodecs.libs/libopenjp2-*``,
so a plain ``pip install`` provides it), else the system's ``libopenjp2.so.7``;
without either, :func:`available` is False and J2K tiles take the
nvImageCodec path (:mod:`.nvdecode`) as before.  Measured numbers are in the
docs (``docs/explanations/decoding.md``, "JPEG 2000: window decode").

Rules kept from the nvImageCodec path:

* **Header checks first.**  :func:`wsitool.ground.bitstream.j2k_header_problem` runs
  on every tile before OpenJPEG sees it, and the size the SIZ marker declares
  (read by ``opj_read_header``, before any tile data is decoded) must be the
  tile grid cell (:func:`.headers.check_cell`).
* **One decoder context per thread.**  An OpenJPEG codec object decodes one
  code stream (it cannot be rewound), so one is made per tile; the state that
  outlives a tile (the parameter block, the stream callbacks, the error
  message) lives in a per-thread :class:`_Context`, made under the pool's
  mutex by :meth:`ThreadState.slot` and used under the thread's lock.
* **One copy of the window.**  OpenJPEG writes its own ``int32`` planes, one
  per component, of the decoded window only; they are converted once into the
  caller's ``(h, w, 3)`` uint8 buffer (counted in ``DecodeStats.window_copies``);
  the whole tile is never materialised.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import threading
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from ..errors import TileDecodeError
from ..ground.bitstream import j2k_main_header, jp2_boxes
from ..model import PyramidLevel
from .failures import no_image_reason, outside_reason, unreadable_header_reason
from .headers import check_cell
from .paths import get_decode_paths
from .pool import DecodeStats, ThreadState

__all__ = ["available", "library_path", "version", "Unsupported", "decode_window",
           "window_shape", "decode_into"]

_SIZE_MAX = (1 << 64) - 1
_CODEC_J2K = 0
_INT32 = np.dtype(np.int32).str  # OpenJPEG's OPJ_INT32 samples, native byte order

_READ = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
_SKIP = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)
_SEEK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_void_p)
_MSG = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_void_p)


class _Comp(ctypes.Structure):
    """``opj_image_comp_t`` of OpenJPEG 2.x (``bpp`` is deprecated but still laid out)."""

    _fields_ = [("dx", ctypes.c_uint32), ("dy", ctypes.c_uint32), ("w", ctypes.c_uint32),
                ("h", ctypes.c_uint32), ("x0", ctypes.c_uint32), ("y0", ctypes.c_uint32),
                ("prec", ctypes.c_uint32), ("bpp", ctypes.c_uint32), ("sgnd", ctypes.c_uint32),
                ("resno_decoded", ctypes.c_uint32), ("factor", ctypes.c_uint32),
                ("data", ctypes.POINTER(ctypes.c_int32)), ("alpha", ctypes.c_uint16)]


class _Image(ctypes.Structure):
    """``opj_image_t``: the reference grid extent and the components."""

    _fields_ = [("x0", ctypes.c_uint32), ("y0", ctypes.c_uint32), ("x1", ctypes.c_uint32),
                ("y1", ctypes.c_uint32), ("numcomps", ctypes.c_uint32),
                ("color_space", ctypes.c_int), ("comps", ctypes.POINTER(_Comp)),
                ("icc_profile_buf", ctypes.c_void_p), ("icc_profile_len", ctypes.c_uint32)]


class Unsupported(Exception):
    """The tile is valid JPEG 2000 but not one this path decodes (not 1 or 3
    unsigned 8-bit components at full sampling, or a JP2 wrapper): the caller
    takes the nvImageCodec path."""


_lib = None
_lib_path: str | None = None
_load_lock = threading.Lock()
_loaded = False


def _candidates() -> list[str]:
    found = []
    try:
        import imagecodecs  # the required dependency that ships libopenjp2
        libs = os.path.join(os.path.dirname(os.path.dirname(imagecodecs.__file__)), "imagecodecs.libs")
        found += sorted(glob.glob(os.path.join(libs, "libopenjp2*.so*")))
    except ImportError:  # pragma: no cover - imagecodecs is required
        pass
    system = ctypes.util.find_library("openjp2")
    if system:
        found.append(system)
    return found


def _bind(lib) -> None:
    P, U32, I32 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int32
    sig = {
        "opj_version": (ctypes.c_char_p, []),
        "opj_create_decompress": (P, [ctypes.c_int]),
        "opj_destroy_codec": (None, [P]),
        "opj_set_default_decoder_parameters": (None, [P]),
        "opj_setup_decoder": (ctypes.c_int, [P, P]),
        "opj_set_error_handler": (ctypes.c_int, [P, _MSG, P]),
        "opj_stream_create": (P, [ctypes.c_size_t, ctypes.c_int]),
        "opj_stream_destroy": (None, [P]),
        "opj_stream_set_read_function": (None, [P, _READ]),
        "opj_stream_set_skip_function": (None, [P, _SKIP]),
        "opj_stream_set_seek_function": (None, [P, _SEEK]),
        "opj_stream_set_user_data_length": (None, [P, ctypes.c_uint64]),
        "opj_read_header": (ctypes.c_int, [P, P, ctypes.POINTER(ctypes.POINTER(_Image))]),
        "opj_set_decoded_resolution_factor": (ctypes.c_int, [P, U32]),
        "opj_set_decode_area": (ctypes.c_int, [P, ctypes.POINTER(_Image), I32, I32, I32, I32]),
        "opj_decode": (ctypes.c_int, [P, P, ctypes.POINTER(_Image)]),
        "opj_image_destroy": (None, [ctypes.POINTER(_Image)]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


def _load():
    """Load and bind libopenjp2 once (>= 2.3 for the partial inverse DWT); None if absent."""
    global _lib, _lib_path, _loaded
    if _loaded:
        return _lib
    with _load_lock:
        if not _loaded:
            for path in _candidates():
                try:
                    lib = ctypes.CDLL(path)
                    _bind(lib)
                    major, minor = (int(p) for p in lib.opj_version().decode().split(".")[:2])
                except (OSError, AttributeError, ValueError):
                    continue
                if (major, minor) >= (2, 3):
                    _lib, _lib_path = lib, path
                    break
            _loaded = True
    return _lib


def available() -> bool:
    """Whether a usable libopenjp2 (>= 2.3) was found (loads it on the first call)."""
    return _load() is not None


def decodes(lv: PyramidLevel) -> bool:
    """Whether ``lv``'s tiles are decoded by this OpenJPEG window decoder: JPEG 2000
    code streams, the ``openjpeg`` decode path on (:class:`wsitool.codec.paths.DecodePaths`)
    and libopenjp2 found; otherwise they take ``lv.decoder``'s path."""
    return lv.encoding.stream == "j2k" and get_decode_paths().openjpeg and available()


def decoder_name(lv: PyramidLevel) -> str:
    """Who decodes ``lv``'s tiles on a read: ``"openjpeg"`` where :func:`decodes`, else
    :attr:`wsitool.model.TileEncoding.decoder` (``"nvimagecodec"``, ``"tifffile"``, ...)."""
    return "openjpeg" if decodes(lv) else lv.decoder


def library_path() -> str | None:
    """Path of the libopenjp2 in use, or None."""
    _load()
    return _lib_path


def version() -> str | None:
    """OpenJPEG version string (e.g. ``"2.5.4"``), or None without the library."""
    lib = _load()
    return lib.opj_version().decode() if lib is not None else None


class _MemoryStream:
    """The code stream OpenJPEG reads through the callbacks: ``(addr, size)`` of
    the tile's bytes, the read position ``pos`` and OpenJPEG's first error message."""

    __slots__ = ("addr", "size", "pos", "error")

    def __init__(self):
        self.addr = self.size = self.pos = 0
        self.error: str | None = None

    def read(self, buf, nbytes, _user):
        left = self.size - self.pos
        if left <= 0:
            return _SIZE_MAX
        n = min(nbytes, left)
        ctypes.memmove(buf, self.addr + self.pos, n)
        self.pos += n
        return n

    def skip(self, nbytes, _user):
        if nbytes < 0:
            nbytes = max(nbytes, -self.pos)
        elif self.pos >= self.size:
            return -1
        else:
            nbytes = min(nbytes, self.size - self.pos)
        self.pos += nbytes
        return nbytes

    def seek(self, where, _user):
        if not 0 <= where <= self.size:
            return 0
        self.pos = where
        return 1

    def message(self, msg, _user):
        if self.error is None:
            self.error = msg.decode("utf-8", "replace").strip() if msg else "error"


class _Context:
    """One thread's OpenJPEG state: parameters, memory-stream callbacks, last error.

    The callbacks (ctypes thunks, native memory) are bound to ``io``, which
    holds no reference back: the context is freed by reference counting as soon
    as its thread's state goes, not at a later cyclic garbage collection.  Use
    only under the owning thread's :class:`ThreadState` lock.
    """

    def __init__(self):
        lib = _load()
        self.lib = lib
        self.params = ctypes.create_string_buffer(16384)  # > sizeof(opj_dparameters_t)
        lib.opj_set_default_decoder_parameters(self.params)
        self.io = io = _MemoryStream()
        self.read_fn = _READ(io.read)
        self.skip_fn = _SKIP(io.skip)
        self.seek_fn = _SEEK(io.seek)
        self.msg_fn = _MSG(io.message)


def _context() -> _Context:
    return _Context()


def window_shape(rect: tuple[int, int, int, int], reduce: int) -> tuple[int, int]:
    """``(height, width)`` OpenJPEG decodes for the full-resolution window ``rect``
    ``(x0, y0, x1, y1)`` of a tile at origin 0 reduced by ``reduce`` levels:
    ``ceil(x / 2**reduce)`` of each edge (T.800 B-14)."""
    x0, y0, x1, y1 = rect
    k = 1 << reduce
    return -(-y1 // k) - -(-y0 // k), -(-x1 // k) - -(-x0 // k)


def _plain_jp2(data: bytes, codestream_start: int) -> bool:
    """Whether a JP2 file's header asks for no colour work after decoding: a
    ``colr`` box (I.5.3.3) with the enumerated sRGB (16) or greyscale (17)
    space, and no palette (``pclr``) or channel definition (``cdef``) box."""
    enum = None
    try:
        for tbox, a, b in jp2_boxes(data, 0, codestream_start):
            if tbox != b"jp2h":
                continue
            for sub, c, d in jp2_boxes(data, a, b):
                if sub in (b"pclr", b"cdef", b"cmap"):
                    return False
                if sub == b"colr" and d - c >= 7 and data[c] == 1 and enum is None:
                    enum = int.from_bytes(data[c + 3:c + 7], "big")
    except ValueError:  # a malformed header box: leave the stream to the fallback decoder
        return False
    return enum in (16, 17)


class _PlaneView:
    """An ``__array_interface__`` (version 3) over OpenJPEG's ``int32`` plane of one
    component: numpy wraps it without copying and without making a type.

    ``np.ctypeslib.as_array(pointer, shape)`` made a new ctypes array type for
    each ``(h, w)`` and ``ctypes.POINTER`` keeps every such type for the life of
    the process (``ctypes._pointer_type_cache``): about 6 KiB per distinct
    window shape, which random regions never run out of (the leak of issue 24).
    """

    __slots__ = ("__array_interface__",)

    def __init__(self, addr: int, h: int, w: int):
        self.__array_interface__ = {"version": 3, "shape": (h, w), "typestr": _INT32,
                                    "data": (addr, True), "strides": None}


def _plane(comp: _Comp, h: int, w: int) -> np.ndarray:
    """``(h, w)`` int32 view of a decoded component's samples (read-only; valid
    until ``opj_image_destroy``)."""
    addr = cast(int, ctypes.cast(comp.data, ctypes.c_void_p).value)  # (not NULL: checked by the caller)
    return np.asarray(_PlaneView(addr, h, w))


def decode_window(ctx: _Context, data: bytes | np.ndarray,
                  rect: tuple[int, int, int, int] | Callable[[int, int], tuple[int, int, int, int]],
                  reduce: int, dst: np.ndarray) -> tuple[int, int]:
    """Decode the window ``rect`` of one JPEG 2000 code stream into ``dst``.

    Args:
        ctx: the calling thread's :class:`_Context`.
        data: the raw code stream (``bytes`` or a 1-D uint8 array; SOC + SIZ
            first, no JP2 boxes).  The caller has run ``j2k_header_problem``.
        rect: ``(x0, y0, x1, y1)``, the window in full-resolution pixels of the
            image (half-open; the image origin is added here); or a callable
            ``rect(width, height)`` called with the size the SIZ marker
            declares, before any tile data is decoded, that returns the window
            (or raises to refuse the stream).
        reduce: resolution levels to drop (0 = full resolution; T.800 B.5).
        dst: ``window_shape(rect, reduce) + (3,)`` uint8 (a strided sub-view of
            the output is fine); a single-component image is written as grey
            in all three channels.

    Returns:
        ``(width, height)`` the SIZ marker declares.

    Raises:
        Unsupported: a valid stream this path does not decode (see the class).
        ValueError: ``rect`` outside the image (message: the reason), ``dst``
            of the wrong shape, or OpenJPEG failed (message: OpenJPEG's words).
    """
    lib = ctx.lib
    arr = data if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)
    io = ctx.io
    io.addr = arr.__array_interface__["data"][0]
    io.size = len(arr)
    io.pos = 0
    io.error = None
    codec = lib.opj_create_decompress(_CODEC_J2K)
    stream = lib.opj_stream_create(max(io.size, 64), 1)
    image = ctypes.POINTER(_Image)()
    try:
        if not codec or not stream:
            raise MemoryError("OpenJPEG could not allocate a decoder")
        width, height = _read_header(ctx, codec, stream, image)
        window = rect(width, height) if callable(rect) else rect
        ncomp = _check_components(image.contents)
        shape = _set_window(ctx, codec, image, window, reduce, dst)
        if not lib.opj_decode(codec, stream, image):
            raise ValueError(no_image_reason(io.error))
        _copy_planes(image.contents, ncomp, shape, dst)
        return width, height
    finally:
        if image:
            lib.opj_image_destroy(image)
        if stream:
            lib.opj_stream_destroy(stream)
        if codec:
            lib.opj_destroy_codec(codec)
        io.addr = io.size = 0


def _read_header(ctx: _Context, codec: int, stream: int, image: Any) -> tuple[int, int]:
    """Bind ``ctx``'s callbacks to ``codec`` and ``stream``, read the main header into
    ``image``; return the image's ``(width, height)`` (the SIZ marker's)."""
    lib, io = ctx.lib, ctx.io
    lib.opj_set_error_handler(codec, ctx.msg_fn, None)
    lib.opj_stream_set_read_function(stream, ctx.read_fn)
    lib.opj_stream_set_skip_function(stream, ctx.skip_fn)
    lib.opj_stream_set_seek_function(stream, ctx.seek_fn)
    lib.opj_stream_set_user_data_length(stream, io.size)
    if not lib.opj_setup_decoder(codec, ctx.params):
        raise ValueError(io.error or "OpenJPEG refused the decoder set-up")
    if not lib.opj_read_header(stream, codec, ctypes.byref(image)):
        raise ValueError(unreadable_header_reason(io.error or "OpenJPEG"))
    img = image.contents
    return img.x1 - img.x0, img.y1 - img.y0


def _check_components(img: _Image) -> int:
    """The number of components (1 or 3); :class:`Unsupported` for others, or for
    components that are not unsigned 8-bit at full sampling."""
    ncomp = img.numcomps
    if ncomp not in (1, 3):
        raise Unsupported(f"{ncomp} components")
    for c in range(ncomp):
        comp = img.comps[c]
        if comp.prec != 8 or comp.sgnd or comp.dx != 1 or comp.dy != 1:
            raise Unsupported("not unsigned 8-bit at full sampling")
    return ncomp


def _set_window(ctx: _Context, codec: int, image: Any, rect: tuple[int, int, int, int],
                reduce: int, dst: np.ndarray) -> tuple[int, int]:
    """Ask ``codec`` for the window ``rect`` of ``image`` at ``reduce`` levels below full
    resolution, checking that it lies in the image and that ``dst`` has its shape; return
    the ``(height, width)`` it will decode (:func:`window_shape`)."""
    lib, io = ctx.lib, ctx.io
    img = image.contents
    width, height = img.x1 - img.x0, img.y1 - img.y0
    x0, y0, x1, y1 = rect
    if not (0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height):
        raise ValueError(outside_reason(rect, width, height))
    shape = window_shape(rect, reduce)
    if dst.shape != (*shape, 3):
        raise ValueError(f"destination shape {dst.shape} does not match {shape} for {rect}")
    if reduce and not lib.opj_set_decoded_resolution_factor(codec, reduce):
        raise ValueError(io.error or f"cannot drop {reduce} resolution levels")
    if (x0, y0, x1, y1) != (0, 0, width, height) and not lib.opj_set_decode_area(
            codec, image, img.x0 + x0, img.y0 + y0, img.x0 + x1, img.y0 + y1):
        raise ValueError(io.error or "OpenJPEG refused the decode area")
    return shape


def _copy_planes(img: _Image, ncomp: int, shape: tuple[int, int], dst: np.ndarray) -> None:
    """Convert the decoded ``int32`` planes of ``img`` (each ``shape``) into ``dst``
    (``(h, w, 3)`` uint8; one component is written as grey in all three channels)."""
    h, w = shape
    for c in range(ncomp):
        comp = img.comps[c]
        if (comp.h, comp.w) != shape or not comp.data:
            raise ValueError(no_image_reason(f"OpenJPEG decoded {comp.w}x{comp.h}, wanted {w}x{h}"))
    if ncomp == 3:
        for c in range(3):
            np.copyto(dst[..., c], _plane(img.comps[c], h, w), casting="unsafe")
    else:
        np.copyto(dst, _plane(img.comps[0], h, w)[..., None], casting="unsafe")


def decode_into(level: PyramidLevel, col: int, row: int, data: Any, dst: np.ndarray,
                src_rect: tuple[int, int, int, int], state: ThreadState, *,
                caller_buffer: bool = True, complete: bool = False, image: Any = None,
                reduce: int = 0) -> bool:
    """Decode the part ``src_rect`` of one J2K tile into ``dst`` through OpenJPEG.

    Same arguments, checks and errors as :func:`wsitool.codec.nvdecode.decode_into`
    (``image`` and ``complete`` are accepted for that signature and not used),
    plus ``reduce``: with ``reduce = f > 0``, ``src_rect`` is in pixels of the
    tile at ``1 / 2**f`` scale and ``dst`` is ``(y1 - y0, x1 - x0, 3)`` of that
    scale (the tile's resolution level ``N_L - f``, T.800 B.5).

    Returns:
        True when decoded; False when this path does not apply (no library,
        a JP2 wrapper, components other than 1 or 3 unsigned 8-bit ones, or
        ``reduce`` above the stream's decomposition levels): the caller takes
        another path.

    Raises:
        TileDecodeError: header problem, SIZ size not the grid cell, window
            outside the tile, or OpenJPEG could not decode the tile.
    """
    if _load() is None:
        return False
    raw = _code_stream(level, col, row, data, reduce)
    if raw is None:
        return False
    ctx = state.slot("openjpeg", _context)
    with state.lock:
        try:
            decode_window(ctx, raw, _window_rule(level, col, row, src_rect, reduce), reduce, dst)
        except Unsupported:
            return False
        except TileDecodeError:
            raise
        except ValueError as exc:
            raise TileDecodeError(level.path, level.index, col, row, str(exc)) from None
    _count(state.stats, reduce, caller_buffer)
    return True


def _code_stream(level: PyramidLevel, col: int, row: int, data: Any, reduce: int) -> bytes | None:
    """The J2K code stream of tile ``(col, row)``'s bytes ``data`` (a JP2 file's contiguous
    code stream box), or None where this path does not apply (a JP2 header asking for colour
    work, or ``reduce`` above the stream's decomposition levels).

    Raises:
        TileDecodeError: the main header's problem (:func:`wsitool.ground.bitstream.j2k_main_header`).
    """
    raw = data if isinstance(data, bytes) else bytes(data)
    header = j2k_main_header(raw)  # one walk: the checks, the code stream range, N_L
    if header.problem:
        raise TileDecodeError(level.path, level.index, col, row, header.problem)
    if header.start:  # a JP2 file
        if not _plain_jp2(raw, header.start):
            return None  # palette, channel definitions or a colour space to convert
        raw = raw[header.start:header.end]
    if reduce > header.levels:
        return None
    return raw


def _window_rule(level: PyramidLevel, col: int, row: int, src_rect: tuple[int, int, int, int],
                 reduce: int) -> Callable[[int, int], tuple[int, int, int, int]]:
    """The ``rect(width, height)`` of :func:`decode_window` for tile ``(col, row)``: the SIZ
    size checked against the grid cell (:func:`.headers.check_cell`), then ``src_rect`` (in
    pixels at ``1 / 2**reduce``) as a full-resolution window."""
    x0, y0, x1, y1 = src_rect
    k = 1 << reduce

    def window(width: int, height: int) -> tuple[int, int, int, int]:
        if width != level.tile_width or height != level.tile_height:
            check_cell(level, col, row, width, height)
        # a reduced window's last row / column ends at the code stream's edge
        return (x0 * k, y0 * k, min(x1 * k, width) if reduce else x1,
                min(y1 * k, height) if reduce else y1)

    return window


def _count(stats: DecodeStats, reduce: int, caller_buffer: bool) -> None:
    """Count one tile decoded by OpenJPEG in the thread's ``stats``."""
    stats.tiles_decoded += 1
    stats.tiles_openjpeg += 1
    stats.window_copies += 1
    if reduce:
        stats.tiles_reduced += 1
    if not caller_buffer:
        stats.tiles_scratch += 1
