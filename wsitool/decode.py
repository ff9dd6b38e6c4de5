"""Tile reading and decoding: the per-thread nvImageCodec decoder pool.

Design (the rules this module exists to keep):

* **One decoder per thread.**  nvImageCodec decoders are not safe to share:
  one decoder used by several threads without a lock returned ``None`` for
  some decodes in our tests, and shared decoders are the cause of the
  loader-thread crashes reported by users of other readers.  Each thread that
  decodes gets its own :class:`nvidia.nvimgcodec.Decoder`, created under a
  process-wide mutex and always called while holding that decoder's own
  lock.  A decoder lives as long as its thread (``threading.local``).
* **Caller buffers are honoured.**  :func:`decode_into` decodes straight into
  the array it is given (usually a strided sub-view of the caller's output),
  through ``nvimgcodec.as_image``; the result is checked to be that very
  buffer, never a replacement.  Partial tiles are decoded as a sub-region of
  the JPEG / JPEG 2000 code stream (``CodeStream.get_sub_code_stream(region=)``),
  also straight into the output.  Only where that is not possible (RGBA
  output, colour transforms, forced by :data:`FORCE_SCRATCH` for parity tests)
  is a per-thread scratch buffer used, allocated once per thread and shape.
* **Every decode is checked.**  A decode returning ``None``, an image of the
  wrong size, or a code stream whose header disagrees with the TIFF tile grid
  (a decompression bomb such as an 8000 x 8000 SOF inside a 256 x 256 tile)
  raises :class:`~wsitool.errors.TileDecodeError` naming level, column and row.
* **No shared file position.**  Tile bytes are read with :func:`os.pread`.

Which codec decodes what:

* JPEG (TIFF compression 7) with 3 samples (photometric RGB or YCbCr) and
  JPEG 2000 (Aperio 33003, 33005; 34712) with 3 samples, 8 bits: nvImageCodec
  (CPU backends libjpeg-turbo and OpenJPEG here; nvJPEG / nvJPEG2000 on a GPU).
* Everything else (none, LZW, deflate, zstd, WebP, JPEG gray / CMYK / 2-sample,
  predictors, big-endian samples, planar-separate data): tifffile's
  ``TiffPage.decode`` over imagecodecs.

JPEG facts used here: abbreviated JPEG tiles share the DQT/DHT segments stored
once in the page's JPEGTables tag (TIFF Technical Note #2, "JPEGTables"); the
tile stream and the tables are merged by inserting the tables after the tile's
SOI marker.  Aperio writes RGB JPEG tiles (photometric RGB, no colour
transform) with component ids 0, 1, 2 and neither a JFIF nor an Adobe marker;
libjpeg then guesses YCbCr.  An Adobe APP14 segment whose transform flag is 0
(Adobe Technical Note #5116, "APP14") tells the decoder the components are RGB.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import DeviceUnavailableError, ResourceLimitError, TileDecodeError
from .settings import get_limits

if TYPE_CHECKING:  # pragma: no cover
    from .slide import Level

__all__ = [
    "DecodeStats",
    "DecoderPool",
    "get_pool",
    "nvimgcodec",
    "read_tile_bytes",
    "read_tile_stream",
    "decode_into",
    "decode_array",
    "plan_decode",
    "count_decoded",
    "check_decoded",
    "FORCE_SCRATCH",
    "USE_ROI_DECODE",
]

# Quiet by default: nvImageCodec's Python layer logs failed decodes (which we
# report as exceptions) and OpenCV's OpenJPEG wrapper warns once per JPEG 2000
# tile that the colour space is unspecified.  Users who want the logs can set
# these variables themselves before importing wsitool.
os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
os.environ.setdefault("OPENCV_LOG_LEVEL", "ERROR")


@contextlib.contextmanager
def _stderr_silenced():
    """Redirect file descriptor 2 to /dev/null (native libraries print there)."""
    try:
        saved = os.dup(2)
    except OSError:  # no stderr at all
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


# Importing nvImageCodec prints one "Failed to load nvjpeg library" line per
# missing GPU extension on machines without CUDA; those are expected there.
with _stderr_silenced():
    from nvidia import nvimgcodec  # noqa: E402

# Test hooks (module-level switches, not part of the public API).
#: When True, every nvImageCodec tile is decoded whole into scratch and copied.
FORCE_SCRATCH = False
#: When False, partial tiles are decoded whole into scratch instead of as a
#: sub-region of the code stream.
USE_ROI_DECODE = True

_ADOBE_RGB = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00"  # APP14, transform 0
_SOI = b"\xff\xd8"


@dataclasses.dataclass
class DecodeStats:
    """Counters of one thread's decoding work; :meth:`DecoderPool.stats` sums them.

    Fields (all counts): ``decoders_created``; ``tiles_decoded`` (all tiles);
    ``tiles_direct`` (whole tile decoded straight into the caller's buffer);
    ``tiles_roi`` (sub-region of a tile decoded straight into the caller's
    buffer); ``tiles_scratch`` (decoded into a scratch buffer and copied);
    ``tiles_generic`` (decoded by tifffile/imagecodecs); ``tiles_missing``
    (offset or byte count 0, filled with background); ``tiles_failed`` (raised
    or filled after an error); ``scratch_allocations``; ``bytes_read``.
    """

    decoders_created: int = 0
    tiles_decoded: int = 0
    tiles_direct: int = 0
    tiles_roi: int = 0
    tiles_scratch: int = 0
    tiles_generic: int = 0
    tiles_missing: int = 0
    tiles_failed: int = 0
    scratch_allocations: int = 0
    bytes_read: int = 0

    def add(self, other: "DecodeStats") -> None:
        """Add ``other``'s counters to these (in place)."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


class _ThreadState:
    """Decoder, its lock, scratch buffers and counters of one thread."""

    def __init__(self, pool: "DecoderPool", stats: DecodeStats):
        self.pool = pool
        self.stats = stats
        self.lock = threading.Lock()
        self._decoder: Any = None
        self._native: Any = None
        self._encoder: Any = None
        self._scratch: dict[tuple, np.ndarray] = {}
        self._tile_views: dict[tuple, tuple] = {}
        self._read_bufs: dict[int, tuple[np.ndarray, memoryview]] = {}

    @property
    def decoder(self):
        if self._decoder is None:
            self._decoder = self.pool._create_decoder()
            self.stats.decoders_created += 1
        return self._decoder

    def native_decoder(self):
        """This thread's decoder of the compiled JPEG tile loop (:mod:`wsitool.native`),
        created on first use under the pool's mutex and counted in
        ``decoders_created``; call under ``lock``."""
        if self._native is None:
            from .native import new_decoder

            with self.pool._create_lock:
                self._native = new_decoder()
            self.stats.decoders_created += 1
        return self._native

    @property
    def encoder(self):
        """This thread's nvImageCodec encoder (created on first use; call under ``lock``)."""
        if self._encoder is None:
            self._encoder = self.pool._create_encoder()
        return self._encoder

    def scratch(self, shape: tuple[int, ...], dtype=np.uint8) -> np.ndarray:
        """A C-contiguous buffer of ``shape``, reused across calls on this thread."""
        key = (shape, np.dtype(dtype).str)
        buf = self._scratch.get(key)
        if buf is None:
            buf = np.empty(shape, dtype)
            self._scratch[key] = buf
            self.stats.scratch_allocations += 1
        return buf

    def tile_rgb(self, tile_h: int, tile_w: int, h: int, w: int):
        """``(flat, view, image)``: this thread's RGB scratch for tiles of
        ``tile_h x tile_w`` pixels, ``flat`` a 1-D uint8 buffer of
        ``tile_h * tile_w * 3 + 4`` bytes (the spare bytes let
        :func:`wsitool.region._widen_rgba` read whole 32-bit words), ``view`` its
        first ``h * w`` pixels as ``(h, w, 3)`` uint8 and ``image`` the nvImageCodec
        image of ``view``.  The triple for the whole-tile shape is made once per
        thread and reused (wrapping a numpy view costs about 6-7 us, against
        about 300 us for decoding a 240 x 240 JPEG tile); other shapes are made
        per call, so the cache holds one entry per tile size."""
        key = (tile_h, tile_w, h, w)
        hit = self._tile_views.get(key)
        if hit is None:
            flat = self.scratch((tile_h * tile_w * 3 + 4,))
            view = flat[: h * w * 3].reshape(h, w, 3)
            hit = (flat, view, nvimgcodec.as_image(view))
            if (h, w) == (tile_h, tile_w):
                self._tile_views[key] = hit
        return hit

    def read_buffer(self, nbytes: int, slot: int = 0) -> tuple[np.ndarray, memoryview]:
        """A uint8 buffer of at least ``nbytes`` bytes (and its memoryview), reused
        by this thread for tile bytes.  ``slot`` selects one of several buffers
        (a batch of tiles needs one per tile).  A buffer larger than
        :data:`_READ_BUFFER_KEEP` is a one-off allocation that is not kept."""
        kept = self._read_bufs.get(slot)
        if kept is not None and len(kept[0]) >= nbytes:
            return kept
        size = max(nbytes, 2 * len(kept[0]) if kept is not None else 65536)
        buf = np.empty(size, np.uint8)
        pair = (buf, memoryview(buf))
        if size <= _READ_BUFFER_KEEP:
            self._read_bufs[slot] = pair
            self.stats.scratch_allocations += 1
        return pair


#: Decode parameters of TIFF tiles: an EXIF orientation inside a tile's code
#: stream is ignored (TIFF 6.0 section 8: the Orientation tag of the IFD says
#: how the image is oriented, and wsitool reports the stored pixel grid).
TILE_DECODE_PARAMS = nvimgcodec.DecodeParams(apply_exif_orientation=False)

#: Largest per-thread tile-bytes buffer kept between reads (bytes).
_READ_BUFFER_KEEP = 16 << 20


class DecoderPool:
    """Per-thread nvImageCodec decoders for one device.

    Args:
        device: ``"cpu"`` (CPU backends only, ``device_id=NVIMGCODEC_DEVICE_CPU_ONLY``)
            or ``"cuda"`` / ``"cuda:N"`` (GPU backends, CPU as fallback).

    Each thread calling :meth:`state` gets its own decoder, created lazily
    under the pool's mutex; the pool keeps only the per-thread counters, so a
    decoder is released when its thread ends.  The same per-thread state
    also holds an nvImageCodec encoder (``state().encoder``, used by
    :mod:`wsitool.export`), created the same way on first use; the pool
    counts them in ``encoders_created``.

    Raises:
        DeviceUnavailableError: ``device`` is a CUDA device and none is usable.
    """

    def __init__(self, device: str = "cpu"):
        self.device = device
        self._create_lock = threading.Lock()
        self._local = threading.local()
        self._all_stats: list[DecodeStats] = []
        self.encoders_created = 0
        if device == "cpu":
            self._device_id = nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY
        elif device.startswith("cuda"):
            from .gpu import cuda_device_id

            self._device_id = cuda_device_id(device)
        else:
            raise ValueError(f"unknown device {device!r}: use 'cpu' or 'cuda[:N]'")

    def _create(self, cls, what: str):
        """One nvImageCodec ``Decoder`` or ``Encoder`` for this pool's device.

        CPU: the CPU backend only (``device_id=NVIMGCODEC_DEVICE_CPU_ONLY``;
        without it the library tries the GPU and fails on machines without
        one).  CUDA: GPU backends first (the hardware JPEG engine for
        decoders), the CPU backend as fallback.  One CPU thread per instance:
        parallelism comes from our own per-thread instances.
        """
        kinds = [nvimgcodec.BackendKind.CPU_ONLY]
        if self.device != "cpu":
            gpu = [nvimgcodec.BackendKind.GPU_ONLY, nvimgcodec.BackendKind.HYBRID_CPU_GPU]
            if cls is nvimgcodec.Decoder:
                gpu.insert(0, nvimgcodec.BackendKind.HW_GPU_ONLY)
            kinds = gpu + kinds
        with self._create_lock:
            try:
                return cls(device_id=self._device_id, max_num_cpu_threads=1,
                           backends=[nvimgcodec.Backend(k) for k in kinds])
            except Exception as exc:  # pragma: no cover - depends on the machine
                raise DeviceUnavailableError(
                    f"could not create an nvImageCodec {what} for {self.device}: {exc}"
                ) from exc

    def _create_encoder(self):
        """A new per-thread encoder (see :meth:`_create`); counted in ``encoders_created``."""
        encoder = self._create(nvimgcodec.Encoder, "encoder")
        with self._create_lock:
            self.encoders_created += 1
        return encoder

    def _create_decoder(self):
        """A new per-thread decoder (see :meth:`_create`)."""
        return self._create(nvimgcodec.Decoder, "decoder")

    def state(self) -> _ThreadState:
        """The calling thread's decoder state (created on first use)."""
        st = getattr(self._local, "state", None)
        if st is None:
            stats = DecodeStats()
            with self._create_lock:
                self._all_stats.append(stats)
            st = _ThreadState(self, stats)
            self._local.state = st
        return st

    def stats(self) -> DecodeStats:
        """Sum of all threads' counters (a snapshot, new object)."""
        total = DecodeStats()
        with self._create_lock:
            for s in self._all_stats:
                total.add(s)
        return total

    def reset_stats(self) -> None:
        """Zero every thread's counters.  Call it while no thread decodes: the
        counters are updated without a lock, so a concurrent update may be lost."""
        with self._create_lock:
            for s in self._all_stats:
                for f in dataclasses.fields(s):
                    setattr(s, f.name, 0)


_pools: dict[str, DecoderPool] = {}
_pools_lock = threading.Lock()
# Pools of a parent process, kept (never used, never freed) in a forked child.
_forked_pools: list[DecoderPool] = []


def _new_pools_after_fork() -> None:
    """In a forked child: make new decoders.  The parent's decoders may count on
    threads that do not exist in the child (nvImageCodec's executors), so they
    are neither used nor destroyed there; they stay referenced in
    ``_forked_pools``.  (PyTorch DataLoader workers are forked children.)"""
    global _pools_lock
    _forked_pools.extend(_pools.values())
    _pools.clear()
    _pools_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_pools_after_fork)


def get_pool(device: str = "cpu") -> DecoderPool:
    """The process-wide :class:`DecoderPool` of ``device`` (created once)."""
    with _pools_lock:
        pool = _pools.get(device)
        if pool is None:
            pool = _pools[device] = DecoderPool(device)
        return pool


# --------------------------------------------------------------------------
# Reading tile bytes
# --------------------------------------------------------------------------


def read_tile_bytes(level: "Level", index: int, col: int, row: int, stats: DecodeStats) -> bytes | None:
    """Read the encoded bytes of segment ``index`` (tile or strip) of ``level``.

    Returns ``None`` for a missing tile (offset 0 or byte count 0, which TIFF
    writers use for sparse slides).  Raises :class:`TileDecodeError` if the
    segment lies outside the file (truncated file) or the read is short.
    """
    where = _segment(level, index, col, row)
    if where is None:
        return None
    offset, count = where
    data = os.pread(level._fd, count, offset)
    _check_read(level, col, row, len(data), count, offset)
    stats.bytes_read += count
    return data


# Why a tile failed, in one wording for the Python path and the compiled JPEG
# loop (wsitool.native builds its TileDecodeErrors with these too).

def past_eof_reason(offset: int, count: int, file_size: int) -> str:
    """A segment of ``count`` bytes at ``offset`` beyond a ``file_size``-byte file."""
    return (f"tile data at offset {offset} (+{count} bytes) lies past the end of the "
            f"file ({file_size} bytes): truncated file")


def short_read_reason(got: int, count: int, offset: int) -> str:
    """A read of ``count`` bytes at ``offset`` that returned ``got``."""
    return f"short read: {got} of {count} bytes at offset {offset}"


def not_soi_reason(first: bytes) -> str:
    """A JPEG tile whose first (up to two) bytes ``first`` are not SOI (ITU-T T.81 B.2.1)."""
    return f"not a JPEG stream (starts with {first.hex()} instead of ffd8)"


def grid_reason(level: "Level", width: int, height: int) -> str:
    """A code stream declaring ``width x height`` pixels, not the tile grid cell."""
    return (f"code stream declares {width}x{height} pixels but the tile grid cell is "
            f"{level.tile_width}x{level.tile_height}; refusing to decode")


def outside_reason(src_rect: tuple[int, int, int, int], width: int, height: int) -> str:
    """A wanted ``(x0, y0, x1, y1)`` tile sub-region outside a ``width x height`` tile."""
    return f"requested tile sub-region {src_rect} is outside the {width}x{height} tile"


def unreadable_header_reason(detail) -> str:
    """A code stream header nvImageCodec could not parse (``detail``: its message or status)."""
    return f"unreadable code stream header ({detail})"


def unusable_stream_reason(detail) -> str:
    """A sub-region code stream nvImageCodec could not make."""
    return f"unusable code stream ({detail})"


def no_image_reason(detail: str | None = None) -> str:
    """A decode that produced no image (libjpeg-turbo / OpenJPEG gave up on the data)."""
    return ("decoder returned no image (corrupt or truncated tile data"
            + (f"; {detail})" if detail else ")"))


def _segment(level: "Level", index: int, col: int, row: int) -> tuple[int, int] | None:
    """``(offset, byte count)`` of segment ``index``, None if missing; checked against the file size."""
    offset = int(level._offsets[index])
    count = int(level._bytecounts[index])
    if offset == 0 or count == 0:
        return None
    if offset + count > level._file_size:
        raise TileDecodeError(level._path, level.index, col, row,
                              past_eof_reason(offset, count, level._file_size))
    return offset, count


def _check_read(level: "Level", col: int, row: int, got: int, count: int, offset: int) -> None:
    if got != count:
        raise TileDecodeError(level._path, level.index, col, row,
                              short_read_reason(got, count, offset))


def read_tile_stream(level: "Level", index: int, col: int, row: int,
                     state: _ThreadState, slot: int = 0) -> np.ndarray | None:
    """Read tile ``index`` of an nvImageCodec level as a complete code stream.

    Same checks, errors and statistics as :func:`read_tile_bytes`, plus the
    JPEG start-of-image check of the tile, but the bytes land in the calling
    thread's reusable read buffer with the JPEG prefix (SOI, Adobe marker,
    JPEGTables) already in front, with one ``preadv`` and no intermediate
    ``bytes`` objects.  Returns a ``(n,)`` uint8 view of that buffer (valid
    until this thread's next read into the same ``slot``), or ``None`` for a
    missing tile.

    Raises:
        TileDecodeError: segment past the end of the file, short read, or a
            JPEG tile that does not start with SOI.
    """
    where = _segment(level, index, col, row)
    if where is None:
        return None
    offset, count = where
    jpeg = level._stream_kind == "jpeg"
    prefix = level._jpeg_prefix if jpeg else b""
    start = len(prefix) - 2 if prefix else 0  # the tile's SOI lands under the prefix's end
    buf, view = state.read_buffer(start + count, slot)
    got = os.preadv(level._fd, [view[start:start + count]], offset)
    _check_read(level, col, row, got, count, offset)
    state.stats.bytes_read += count
    if jpeg:
        # (memoryview indexing gives plain ints: cheaper than numpy scalars)
        if count < 2 or view[start] != 0xFF or view[start + 1] != 0xD8:
            raise TileDecodeError(level._path, level.index, col, row,
                                  not_soi_reason(bytes(buf[start:start + min(count, 2)])))
        if prefix:
            view[:start + 2] = prefix
    return buf[:start + count]


def _jpeg_stream(level: "Level", data: bytes, col: int, row: int) -> bytes:
    """Complete JPEG stream for nvImageCodec: tile + JPEGTables (+ Adobe RGB marker)."""
    if not data.startswith(_SOI):
        raise TileDecodeError(level._path, level.index, col, row, not_soi_reason(data[:2]))
    prefix = level._jpeg_prefix
    return prefix + data[2:] if prefix else data


_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def jpeg_frame_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from the first SOF segment of a JPEG stream, or None.

    Walks the marker segments from SOI (ITU-T T.81 annex B.1.1): every
    segment but SOI/RSTn/TEM carries a 2-byte big-endian length.  Returns
    None if the scan reaches SOS or the end of the data without a frame header.
    """
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    i = 2
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:
            i += 2
            continue
        if marker == 0xDA or marker == 0xD9:
            return None
        length = (data[i + 2] << 8) | data[i + 3]
        if marker in _SOF_MARKERS:
            if i + 9 > n or length < 7:
                return None
            height = (data[i + 5] << 8) | data[i + 6]
            width = (data[i + 7] << 8) | data[i + 8]
            return width, height
        i += 2 + length
    return None


def webp_frame_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from a WebP stream's first image chunk, or None.

    RFC 9649 (WebP container): ``RIFF <size> WEBP`` then a chunk.  ``VP8X``
    stores canvas width - 1 and height - 1 as 24-bit little-endian values at
    payload bytes 4 and 7; ``VP8L`` has the signature byte 0x2F and then
    14-bit width - 1 and height - 1; ``VP8 `` (lossy) has a 3-byte frame tag,
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


def j2k_header_problem(data: bytes) -> str | None:
    """Why a JPEG 2000 tile's main header is unusable, or None if it is complete.

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
    i = 0
    if data.startswith(_JP2_SIGNATURE):
        while True:
            if i + 8 > n:
                return "JP2 file without a code stream box (truncated)"
            lbox = int.from_bytes(data[i:i + 4], "big")
            tbox = data[i + 4:i + 8]
            header = 8
            if lbox == 1:
                if i + 16 > n:
                    return "truncated JP2 box header"
                lbox = int.from_bytes(data[i + 8:i + 16], "big")
                header = 16
            elif lbox == 0:
                lbox = n - i
            if lbox < header:
                return f"invalid JP2 box length {lbox}"
            if tbox == b"jp2c":
                i += header
                break
            i += lbox
    if data[i:i + 4] != b"\xff\x4f\xff\x51":
        return "not a JPEG 2000 code stream (no SOC + SIZ markers)"
    i += 2
    csiz = 0
    seen: set[int] = set()
    while True:
        if i + 4 > n:
            return "JPEG 2000 main header truncated"
        if data[i] != 0xFF:
            return f"invalid JPEG 2000 marker {data[i:i + 2].hex()} in the main header"
        marker = data[i + 1]
        if marker == 0x90:  # SOT: Lsot = 10, segment of 12 bytes
            # COD and QCD are required in the main header (T.800 A.2, table A.1);
            # OpenJPEG inside nvImageCodec crashed the process without COD (fuzzing)
            missing = [name for code, name in ((0x52, "COD"), (0x5C, "QCD")) if code not in seen]
            if missing:
                return f"invalid JPEG 2000 main header: required {' and '.join(missing)} missing"
            return None if i + 12 <= n else "JPEG 2000 tile-part header truncated"
        if marker not in _J2K_MAIN_HEADER_MARKERS:
            # OpenJPEG skips unknown markers by searching for the next known one;
            # when that runs off the end, nvImageCodec's decoder crashed (SIGSEGV,
            # scripts/fuzz.py: a COM marker FF64 turned into FF40)
            return f"invalid JPEG 2000 main header: unknown marker ff{marker:02x}"
        seen.add(marker)
        length = int.from_bytes(data[i + 2:i + 4], "big")
        if length < 2:
            return f"invalid JPEG 2000 marker segment length {length}"
        if i + 2 + length > n:
            return "JPEG 2000 main header truncated"
        seg = data[i + 4:i + 2 + length]
        if marker == 0x51:
            problem, csiz = _j2k_siz_problem(seg)
        elif marker == 0x52:  # COD: Scod, SGcod (4 bytes), SPcod
            problem = _j2k_coding_problem(seg, 0, "COD") if len(seg) >= 10 else "short COD"
            if problem is None and (seg[0] > 7 or (seg[0] & 1 and len(seg) < 11 + seg[5])):
                problem = f"invalid Scod {seg[0]} (or precinct sizes missing)"
            if problem is None and seg[1] > 4:
                problem = f"invalid progression order {seg[1]}"
            if problem is None and int.from_bytes(seg[2:4], "big") == 0:
                problem = "zero quality layers"
        elif marker == 0x53:  # COC: Ccoc (1 or 2 bytes), Scoc, SPcoc
            k = 1 if csiz < 257 else 2
            problem = (_j2k_coding_problem(seg, k - 4, "COC") if len(seg) >= k + 6
                       else "short COC")
            if problem is None and (seg[k] > 1 or (seg[k] & 1 and len(seg) < k + 7 + seg[k + 1])):
                problem = f"invalid Scoc {seg[k]} (or precinct sizes missing)"
        elif marker == 0x5C:  # QCD: Sqcd, quantisation style in the low 5 bits
            problem = (None if seg and (seg[0] & 0x1F) in (0, 1, 2)
                       else "invalid QCD quantisation style")
        else:
            problem = None
        if problem:
            return f"invalid JPEG 2000 main header: {problem}"
        i += 2 + length


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


def _check_cell(level: "Level", col: int, row: int, width: int, height: int) -> None:
    """Refuse a code stream whose declared size is not the tile cell (or its cropped part)."""
    cell_w, cell_h = level.tile_width, level.tile_height
    inner_w = min(cell_w, level.width - col * cell_w)
    inner_h = min(cell_h, level.height - row * cell_h)
    if width not in (cell_w, inner_w) or height not in (cell_h, inner_h):
        raise TileDecodeError(level._path, level.index, col, row,
                              grid_reason(level, width, height))


def check_header(level: "Level", data: bytes, col: int, row: int) -> None:
    """Check a JPEG / JPEG 2000 / WebP tile header against the grid before a tifffile decode.

    Raises :class:`TileDecodeError` when the header is unreadable or declares a
    size other than the tile cell (or its part inside the image), so a
    decompression bomb is refused before the decoder allocates its output.
    """
    kind = level._stream_kind
    if kind in ("jpeg", "webp"):
        size = jpeg_frame_size(data) if kind == "jpeg" else webp_frame_size(data)
        if size is None:
            raise TileDecodeError(level._path, level.index, col, row,
                                  f"{kind.upper()} stream without a readable frame header")
        _check_cell(level, col, row, *size)
    elif kind == "j2k":
        _codestream(level, data, col, row)
    elif kind == "lzw":
        problem = lzw_problem(data)
        if problem:
            raise TileDecodeError(level._path, level.index, col, row, problem)


def _codestream(level: "Level", data, col: int, row: int, complete: bool = False):
    """Parse the code stream header and check it against the tile grid.

    ``data`` is the tile's bytes, or with ``complete=True`` a complete stream
    from :func:`read_tile_stream`.  The expected size is the full tile cell, or
    for the last row/column the part inside the image (some writers crop edge
    tiles; strips are cropped).
    """
    if level._stream_kind == "jpeg" and not complete:
        data = _jpeg_stream(level, data, col, row)
    elif level._stream_kind == "j2k":
        # read_tile_stream hands a numpy view; the header walk wants bytes (one
        # copy of a J2K tile costs microseconds against milliseconds of decoding)
        problem = j2k_header_problem(data if isinstance(data, bytes) else bytes(data))
        if problem:
            raise TileDecodeError(level._path, level.index, col, row, problem)
    try:
        cs = nvimgcodec.CodeStream(data)
        width, height = cs.width, cs.height
    except Exception as exc:
        raise TileDecodeError(
            level._path, level.index, col, row, unreadable_header_reason(exc)
        ) from None
    if width != level.tile_width or height != level.tile_height:  # else a whole cell: fine
        _check_cell(level, col, row, width, height)
    return cs, width, height


def plan_decode(level: "Level", col: int, row: int, data,
                src_rect: tuple[int, int, int, int], complete: bool = False):
    """Prepare one nvImageCodec tile for decoding the part ``src_rect`` of it.

    Shared by the per-tile CPU path (:func:`decode_into`) and the batched GPU
    path (:mod:`wsitool.gpu`).  Checks the code stream header against the tile
    grid and ``src_rect`` against the code stream.

    Args:
        level, col, row: the tile.
        data: its encoded bytes (:func:`read_tile_bytes`), or with
            ``complete=True`` the complete stream of :func:`read_tile_stream`.
        src_rect: ``(x0, y0, x1, y1)`` in pixels of the tile.
        complete: ``data`` already has the JPEG prefix merged and SOI checked.

    Returns:
        ``(code_stream, how, (width, height))``: ``how`` is ``"direct"`` (the
        whole tile, decode straight into a ``(y1 - y0, x1 - x0, 3)``
        destination), ``"roi"`` (``code_stream`` is the sub-region, same
        destination) or ``"scratch"`` (decode the whole ``(height, width, 3)``
        tile into a scratch buffer, then copy ``src_rect`` out of it);
        ``width, height`` is the code stream's declared size.

    Raises:
        TileDecodeError: unreadable header, header/grid mismatch, or
            ``src_rect`` outside the tile.
    """
    x0, y0, x1, y1 = src_rect
    cs, width, height = _codestream(level, data, col, row, complete)
    if not (0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height):
        raise TileDecodeError(
            level._path, level.index, col, row,
            outside_reason(src_rect, width, height),
        )
    whole = (x0, y0, x1, y1) == (0, 0, width, height)
    if FORCE_SCRATCH or not (whole or USE_ROI_DECODE):
        return cs, "scratch", (width, height)
    if whole:
        return cs, "direct", (width, height)
    try:
        sub = cs.get_sub_code_stream(region=nvimgcodec.Region(y0, x0, y1, x1))
    except Exception as exc:
        raise TileDecodeError(
            level._path, level.index, col, row, unusable_stream_reason(exc)
        ) from None
    return sub, "roi", (width, height)


def count_decoded(stats: DecodeStats, how: str, caller_buffer: bool = True) -> None:
    """Count one decoded tile in ``stats`` by the way :func:`plan_decode` chose."""
    if how == "scratch" or not caller_buffer:
        stats.tiles_scratch += 1
    elif how == "direct":
        stats.tiles_direct += 1
    else:
        stats.tiles_roi += 1
    stats.tiles_decoded += 1


def decode_into(
    level: "Level",
    col: int,
    row: int,
    data: bytes,
    dst: np.ndarray,
    src_rect: tuple[int, int, int, int],
    state: _ThreadState,
    *,
    caller_buffer: bool = True,
    complete: bool = False,
    image=None,
) -> None:
    """Decode part of one nvImageCodec-decodable tile into ``dst``.

    Args:
        level: the :class:`~wsitool.slide.Level` the tile belongs to.
        col, row: tile column and row in the level's grid.
        data: the tile's encoded bytes (see :func:`read_tile_bytes`), or with
            ``complete=True`` the uint8 array of :func:`read_tile_stream`.
        dst: ``(y1 - y0, x1 - x0, 3)`` uint8 array, C-contiguous except for
            row padding (a sub-view of a C-contiguous ``(H, W, 3)`` array is
            fine).  It receives the pixels.
        src_rect: ``(x0, y0, x1, y1)`` in pixels of the tile (0 <= x0 < x1 <=
            tile width, same for y), the part of the tile wanted.
        state: the calling thread's :class:`_ThreadState`.
        caller_buffer: True when ``dst`` is (a view of) the caller's output;
            only used to count ``tiles_direct`` / ``tiles_roi`` versus
            ``tiles_scratch`` in :class:`DecodeStats`.
        complete: ``data`` is already a complete code stream (JPEG prefix
            merged, SOI checked) from :func:`read_tile_stream`.
        image: the nvImageCodec image of ``dst``, when the caller keeps one
            (:meth:`_ThreadState.tile_rgb`); made here otherwise.

    Raises:
        TileDecodeError: header/grid mismatch, decoder failure, or a decoder
            that did not write into ``dst``.
        ValueError: ``dst`` does not have the shape of ``src_rect`` (a caller bug).
    """
    x0, y0, x1, y1 = src_rect
    cs, how, (width, height) = plan_decode(level, col, row, data, src_rect, complete)
    if dst.shape[:2] != (y1 - y0, x1 - x0):
        raise ValueError(f"destination shape {dst.shape} does not match {src_rect}")
    if how == "scratch":
        scratch = state.scratch((height, width, 3))
        _decode_checked(level, col, row, cs, scratch, state)
        dst[...] = scratch[y0:y1, x0:x1]
    else:
        _decode_checked(level, col, row, cs, dst, state, image)
    count_decoded(state.stats, how, caller_buffer)


def check_decoded(level: "Level", col: int, row: int, result, image, shape) -> None:
    """Verify a decode result: an image, the very ``image`` that wraps the target, of ``shape``.

    ``image`` is the ``nvimgcodec.as_image`` wrapper of the caller's (or the
    scratch) buffer; a decoder that honours it hands back that same object.
    The check is by identity, not through ``result.__array_interface__``: in
    nvImageCodec 0.9.0 every read of that attribute leaks one Python int
    (32 bytes per tile), found by ``wsitool stress``.

    Raises:
        TileDecodeError: ``result`` is None (the decoder could not decode the
            tile) or is not ``image`` / not of ``shape`` (a replacement buffer).
    """
    if result is None:
        raise TileDecodeError(
            level._path, level.index, col, row,
            no_image_reason(),
        )
    if result is not image or tuple(result.shape) != tuple(shape):
        raise TileDecodeError(
            level._path, level.index, col, row,
            "decoder did not write into the caller's buffer",
        )


def _decode_checked(level, col, row, cs, dst: np.ndarray, state: _ThreadState,
                    image=None) -> None:
    """Run one decode into ``dst`` (through ``image``, its nvImageCodec image, if
    given) under the thread's decoder lock and verify it."""
    if image is None:
        image = nvimgcodec.as_image(dst)
    decoder = state.decoder
    with state.lock:
        try:
            result = decoder.decode(cs, image=image, params=TILE_DECODE_PARAMS)
        except Exception as exc:
            raise TileDecodeError(
                level._path, level.index, col, row, f"decoder error: {exc}"
            ) from None
    check_decoded(level, col, row, result, image, dst.shape)


def decode_array(level: "Level", col: int, row: int, state: _ThreadState) -> np.ndarray | None:
    """Decode one tile (all planes) of a generic level with tifffile/imagecodecs.

    Returns a ``(h, w, samples)`` array in the level's native dtype, where
    ``h, w`` is the decoded segment's size (the full tile cell for tiles; for
    strips the strip's rows), or ``None`` when the tile is missing (any plane
    with offset/byte count 0).  Byte order, predictors, JPEGTables and bit
    depths are handled by tifffile.

    Raises:
        TileDecodeError: the bytes could not be decoded, or the decoded size
            disagrees with the tile grid.
    """
    planes = level._planes
    per_plane = level.tiles_across * level.tiles_down
    index = row * level.tiles_across + col
    parts = []
    for plane in range(planes):
        seg = plane * per_plane + index
        data = read_tile_bytes(level, seg, col, row, state.stats)
        if data is None:
            return None
        check_header(level, data, col, row)
        try:
            arr, _idx, _shape = level._page.decode(
                data, seg, jpegtables=level._page.jpegtables
            )
        except Exception as exc:
            raise TileDecodeError(
                level._path, level.index, col, row,
                f"{level.compression} decode failed: {type(exc).__name__}: {exc}",
            ) from None
        if arr is None:
            raise TileDecodeError(level._path, level.index, col, row, "decoder returned no data")
        arr = np.asarray(arr)
        arr = arr.reshape(arr.shape[-3], arr.shape[-2], arr.shape[-1])
        parts.append(arr)
    arr = parts[0] if planes == 1 else np.concatenate(parts, axis=2)
    exp_h = min(level.tile_height, level.height - row * level.tile_height)
    exp_w = min(level.tile_width, level.width - col * level.tile_width)
    if arr.shape[0] < exp_h or arr.shape[1] < exp_w or arr.shape[2] != level.samples:
        raise TileDecodeError(
            level._path, level.index, col, row,
            f"decoded size {arr.shape[1]}x{arr.shape[0]}x{arr.shape[2]} does not cover the "
            f"tile cell {exp_w}x{exp_h}x{level.samples}",
        )
    state.stats.tiles_generic += 1
    state.stats.tiles_decoded += 1
    return arr


def check_tile_limit(level: "Level") -> None:
    """Raise :class:`ResourceLimitError` if one tile of ``level`` is too large to decode.

    A tile (or strip) is refused when its pixel count exceeds ``max_tile_pixels``
    or its decoded size (pixels x samples x bytes per sample) exceeds
    ``max_region_bytes``, since a tile is decoded whole into memory; both are
    checked before any tile is read.
    """
    pixels = level.tile_width * level.tile_height
    lim = get_limits()
    if pixels > lim.max_tile_pixels:
        raise ResourceLimitError(
            f"{level._path}: level {level.index} has {level.tile_width}x{level.tile_height} "
            f"tiles ({pixels} pixels), over the max_tile_pixels limit {lim.max_tile_pixels}"
        )
    nbytes = pixels * level.samples * level.dtype.itemsize
    if nbytes > lim.max_region_bytes:
        raise ResourceLimitError(
            f"{level._path}: level {level.index} tiles decode to {nbytes} bytes "
            f"({level.tile_width}x{level.tile_height}x{level.samples} {level.dtype}), over the "
            f"max_region_bytes limit {lim.max_region_bytes}"
        )
