"""Leak check of one decode path, run in a child process: ``python tests/leaks/leakcheck.py PATH [--no-inject]``.

Each path (:data:`PATHS`) is a ``step()`` that exercises one native or
decoding path of wsitool once (a region read, an associated image, an export,
a server request, ...), with varied sizes so that anything cached per shape
shows (the OpenJPEG leak of issue 24 was a ctypes type made per window shape).

The measurement, printed as one JSON line on standard output:

1. **Warm-up**: ``step()`` runs for :data:`WARMUP_S` seconds and
   :data:`WARMUP_STEPS` steps (decoders, buffers, caches and allocator arenas
   reach their working size); not measured.
2. **Measure**: ``step()`` runs on; every ``every`` steps (calibrated so that
   samples are about :data:`SAMPLE_S` apart) the resident set size is
   sampled (after glibc's ``malloc_trim``).  After at least
   :data:`MIN_SAMPLES` samples, :data:`MIN_STEPS` steps and
   :data:`MIN_MEASURE_S` seconds, the 95 % interval of the robust (Theil-Sen)
   slope of RSS against steps (:func:`theil_sen_ci95`, bytes per step; a
   one-off step of a heap does not move it, a steady leak does) decides: ``clean`` when its upper bound is below
   :data:`THRESHOLD_BYTES_PER_STEP`, ``leak`` when its lower bound is above
   it; ``undecided`` when neither holds after :data:`MAX_MEASURE_S` seconds.

Then, unless ``--no-inject`` is given, the path's ``target`` (``"module:function"``,
or a tuple of them: a function every step calls) is wrapped so that each call
also keeps 1 KiB of native memory (``malloc`` through ctypes, written so the
pages are resident, never freed), and the measurement runs again: the leaking
variant that proves the check catches a leak of that size on that path.
``target_calls`` in the output shows the wrapper was reached.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SHARED_SAMPLES = Path(os.environ.get("WSITOOL_SHARED", REPO.parent / "shared")) / "samples"
JPEG = REPO / "samples" / "sample-aperio-jpeg.svs"
J2K = REPO / "samples" / "sample-aperio-j2k.svs"
OME = REPO / "samples" / "sample-ome-pyramid.ome.tif"
DICOM = SHARED_SAMPLES / "dicom-cmu1-small-region-12level"
NDPI = SHARED_SAMPLES / "ndpi-hamamatsu-stritt-dapi-fluor-3.5mb.ndpi"

#: RSS slope (bytes per step) that decides: a clean path's 95 % interval lies
#: below it, a path leaking 1 KiB per step lies above it.
THRESHOLD_BYTES_PER_STEP = 512
#: Seconds between RSS samples (the sample period is calibrated in steps).
SAMPLE_S = 0.02
MIN_SAMPLES = 40
MIN_MEASURE_S = 2.0
MAX_MEASURE_S = 9.0
#: Warm-up before the clean measurement: at least this many seconds and steps
#: (the JPEG 2000 reduced reads grew 2 KiB a step over their first 300 steps,
#: then nothing); the leaking variant follows it with 0.2 s and 20 steps more.
WARMUP_S = 1.5
WARMUP_STEPS = 300
LEAK_BYTES = 1024
#: where the nvImageCodec path plans each tile's decode: batched reads call it by the
#: name read/worker imported, one-tile reads inside nvdecode.decode_into
NV_PLAN = ("wsitool.read.worker:plan_decode", "wsitool.codec.nvdecode:plan_decode")
#: Fewest measured steps before the slope decides either way.
MIN_STEPS = 300

_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]


def _region_reader(path, rng, *, sizes=(48, 400), level=0, **kwargs):
    """A step reading random regions (random sides in ``sizes``) of ``path`` into one buffer."""
    import wsitool

    slide = wsitool.open_slide(path)
    lv = slide.levels[level]
    hi = sizes[1]
    flat = np.empty(hi * hi * 3, np.uint8)
    down = kwargs.pop("downsample", 1)

    def step():
        w, h = rng.randint(*sizes), rng.randint(*sizes)
        x = rng.randrange(0, max(1, lv.width - w * down))
        y = rng.randrange(0, max(1, lv.height - h * down))
        ds = lv.downsample
        out = flat[: w * h * 3].reshape(h, w, 3)
        slide.read_region((int(x * ds), int(y * ds)), level, (w, h), out=out, mode="rgb",
                          downsample=down, **kwargs)

    return step, slide.close


def _levels_reader(path, rng, stack, levels, sizes):
    """A step reading a random region of one of ``levels`` of ``path`` (each level its own
    reader, closed with ``stack``)."""
    readers = [_region_reader(path, rng, threads=1, level=L, sizes=sizes) for L in levels]
    for _step, close in readers:
        stack.callback(close)

    def step():
        rng.choice(readers)[0]()

    return step


def _paths_ctx(**changes):
    from wsitool.codec import paths

    return paths.decode_paths(**changes)


def path_jpeg_loop(rng, stack):
    """Aperio JPEG tiles through the compiled loop (``wsitool._jpegloop``)."""
    from wsitool.codec import jpegloop

    stack.enter_context(_paths_ctx(native=True))
    if not jpegloop.status().startswith("in use"):
        raise Skip(f"the compiled JPEG loop is {jpegloop.status()}")
    step, close = _region_reader(JPEG, rng, threads=1)
    stack.callback(close)
    return step, "wsitool.codec.jpegloop:RegionJobs.run"


def path_jpeg_loop_remote(rng, stack):
    """Remote JPEG tiles (a real nginx on 127.0.0.1, through obstore's HTTP client) through the
    compiled loop, read from the fetched ranges (``decode_tiles(..., extents)``,
    ``RemoteSource.gather``)."""
    from wsitool.codec import jpegloop

    stack.enter_context(_paths_ctx(native=True))
    if not jpegloop.status().startswith("in use"):
        raise Skip(f"the compiled JPEG loop is {jpegloop.status()}")
    _skip_without_obstore()
    srv = _nginx(stack)
    step, close = _region_reader(srv.url + JPEG.name, rng, threads=1)
    stack.callback(close)
    return step, "wsitool.codec.jpegloop:RegionJobs.run"


def _nginx(stack):
    """A started nginx serving the JPEG sample's folder (a real server on 127.0.0.1)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("remote_servers", REPO / "scripts" / "remote_servers.py")
    servers = importlib.util.module_from_spec(spec)
    sys.modules["remote_servers"] = servers
    spec.loader.exec_module(servers)
    if servers.NGINX is None:
        raise Skip("nginx is not installed (Debian: apt-get install nginx-light)")
    return stack.enter_context(servers.nginx(JPEG.parent))


def path_remote_open(rng, stack):
    """A remote slide opened, read and closed each step (a real nginx on 127.0.0.1): obstore's
    HTTP client and its connection pool, the fetch threads, the fetched ranges and the shared
    cache's blocks are all released at close."""
    import wsitool

    _skip_without_obstore()
    url = _nginx(stack).url + JPEG.name
    out = np.empty((64, 64, 3), np.uint8)

    def step():
        with wsitool.open_slide(url) as slide:
            x, y = rng.randrange(0, 2000), rng.randrange(0, 1500)
            slide.read_region((x, y), 0, (64, 64), out=out, mode="rgb")

    # RSS rises ~2.5 MB over the first ~1,000 opens (obstore's runtime and allocator pools),
    # then stays (5,000 more: +0.2 MB, measured 2026-12-02); an open slide's parse leaves
    # reference cycles (tifffile's), collected before each sample
    step.warmup_steps = 1000
    step.collect = True
    return step, "wsitool.storage.remote.transports.http:_ObstoreClient.get"


def _skip_without_obstore() -> None:
    try:
        import obstore  # noqa: F401
    except ImportError:
        raise Skip("the remote extra (obstore) is not installed") from None


def path_ndpi_splice(rng, stack):
    """NDPI restart intervals through the compiled loop, each band's spliced into one code stream
    (the arena and RGB scratch sized by the band)."""
    from wsitool.codec import jpegloop

    if not NDPI.exists():
        raise Skip(f"real slides folder {SHARED_SAMPLES} is absent (needs {NDPI.name})")
    stack.enter_context(_paths_ctx(native=True))
    if not jpegloop.status().startswith("in use"):
        raise Skip(f"the compiled JPEG loop is {jpegloop.status()}")
    return _levels_reader(NDPI, rng, stack, (0, 1, 2), (24, 400)), "wsitool.codec.jpegloop:RegionJobs.run"


def path_jpeg_corrupt(rng, stack):
    """The compiled loop on tiles libjpeg-turbo stops on (flipped entropy-coded bytes: its
    "Corrupt JPEG data" warnings made errors, a longjmp out of the decode each), read with
    ``on_error="fill"``: every error path frees its decoder state."""
    import warnings

    from wsitool.codec import jpegloop

    stack.enter_context(_paths_ctx(native=True))
    if not jpegloop.status().startswith("in use"):
        raise Skip(f"the compiled JPEG loop is {jpegloop.status()}")
    bad = _flipped_copy(JPEG, stack)
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    step, close = _region_reader(bad, rng, threads=1, on_error="fill")
    stack.callback(close)
    return step, "wsitool.codec.jpegloop:RegionJobs.run"


def _flipped_copy(path, stack):
    """A copy of ``path`` (in a temporary folder removed with ``stack``) whose level-0 tiles,
    every other one, have 40 bytes inverted a third of the way in."""
    import wsitool
    from wsitool.slide import pyramid_levels

    with wsitool.open_slide(path) as slide:
        lv = pyramid_levels(slide)[0]
        spans = list(zip(lv.tiles.offsets.tolist(), lv.tiles.bytecounts.tolist(), strict=True))[::2]
    data = bytearray(Path(path).read_bytes())
    for offset, count in spans:
        at = offset + count // 3
        data[at:at + 40] = bytes(b ^ 0xFF for b in data[at:at + 40])
    folder = stack.enter_context(tempfile.TemporaryDirectory())
    out = Path(folder) / Path(path).name
    out.write_bytes(bytes(data))
    return out


def path_jpeg_libjpeg(rng, stack):
    """Aperio JPEG tiles through the Python path, decoded by libjpeg-turbo's API in the
    extension (``wsitool._jpegloop.decode_jpeg``; whole tiles and windows)."""
    from wsitool.codec import jpegloop

    stack.enter_context(_paths_ctx(native=False, libjpeg=True))
    if jpegloop._load() is None:
        raise Skip(f"the compiled extension: {jpegloop.status()}")
    step, close = _region_reader(JPEG, rng, threads=1)
    stack.callback(close)
    return step, "wsitool.codec.nvdecode:_decode_libjpeg"


def path_jpeg_nvimgcodec(rng, stack):
    """Aperio JPEG tiles through nvImageCodec's CPU decoder (whole tiles and ROI decodes)."""
    stack.enter_context(_paths_ctx(native=False, libjpeg=False))
    step, close = _region_reader(JPEG, rng, threads=1)
    stack.callback(close)
    return step, NV_PLAN


def path_j2k_openjpeg(rng, stack):
    """Aperio JPEG 2000 tiles through the OpenJPEG window decoder (ctypes)."""
    from wsitool.codec import openjpeg

    if not openjpeg.available():
        raise Skip("libopenjp2 >= 2.3 not found")
    stack.enter_context(_paths_ctx(openjpeg=True))
    step, close = _region_reader(J2K, rng, threads=1, sizes=(16, 128))
    stack.callback(close)
    return step, "wsitool.codec.openjpeg:decode_window"


def path_j2k_reduced(rng, stack):
    """JPEG 2000 read at 1/2 and 1/4 scale from the wavelet levels (OpenJPEG reduce)."""
    from wsitool.codec import openjpeg

    if not openjpeg.available():
        raise Skip("libopenjp2 >= 2.3 not found")
    step2, close = _region_reader(J2K, rng, threads=1, downsample=2, sizes=(16, 96))
    stack.callback(close)
    step4, close4 = _region_reader(J2K, rng, threads=1, downsample=4, sizes=(8, 48))
    stack.callback(close4)

    def step():
        step2()
        step4()

    return step, "wsitool.codec.openjpeg:decode_window"


def path_j2k_nvimgcodec(rng, stack):
    """JPEG 2000 tiles through nvImageCodec's CPU decoder (OpenJPEG path off)."""
    stack.enter_context(_paths_ctx(openjpeg=False))
    step, close = _region_reader(J2K, rng, threads=1, sizes=(16, 96))
    stack.callback(close)
    return step, NV_PLAN


def path_tifffile(rng, stack):
    """Deflate tiles of an OME-TIFF through tifffile / imagecodecs."""
    step, close = _region_reader(OME, rng, threads=1)
    stack.callback(close)
    return step, "wsitool.read.worker:decode_array"


def path_dicom(rng, stack):
    """DICOM WSI frames (JPEG) of a multi-file series."""
    if not DICOM.is_dir():
        raise Skip(f"real slides folder {SHARED_SAMPLES} is absent (needs {DICOM.name})")
    stack.enter_context(_paths_ctx(native=False))
    step, close = _region_reader(DICOM, rng, threads=1, sizes=(48, 256))
    stack.callback(close)
    return step, NV_PLAN


def path_scaled_jpeg(rng, stack):
    """NDPI levels made by scaled JPEG decoding (libjpeg-turbo's API in the extension, 1/2 to
    1/8), no cache."""
    if not NDPI.exists():
        raise Skip(f"real slides folder {SHARED_SAMPLES} is absent (needs {NDPI.name})")
    return _levels_reader(NDPI, rng, stack, (4, 5, 6), (8, 60)), "wsitool.codec.generic:decode_scaled"


def path_scaled_pillow(rng, stack):
    """The same levels decoded by Pillow's ``draft`` (where the extension is not built)."""
    if not NDPI.exists():
        raise Skip(f"real slides folder {SHARED_SAMPLES} is absent (needs {NDPI.name})")
    stack.enter_context(_paths_ctx(libjpeg=False))
    return _levels_reader(NDPI, rng, stack, (4, 5, 6), (8, 60)), "wsitool.codec.generic:decode_scaled"


def _script(name: str):
    """The module ``scripts/<name>.py`` (fixture generators)."""
    import importlib

    sys.path.insert(0, str(REPO / "scripts"))
    return importlib.import_module(name)


def _no_decoded_cache(stack) -> None:
    """Keep no decoded mosaic image (every read decodes again: the path's decoder runs each step)."""
    from wsitool.mosaic import DecodedImages

    put = DecodedImages.put
    DecodedImages.put = lambda self, key, arr: None
    stack.callback(setattr, DecodedImages, "put", put)


def path_mosaic_mirax(rng, stack):
    """MIRAX camera images (JPEG, PNG and BMP levels of ``scripts/make_mirax_samples.py``'s
    stitching fixture) painted into mosaic levels' tiles, the decoded-image cache off."""
    gen = _script("make_mirax_samples")
    source = SHARED_SAMPLES / "aperio-cmu1-small-region-jpeg.svs"
    if not source.is_file():
        raise Skip(f"real slides folder {SHARED_SAMPLES} is absent (needs {source.name})")
    folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="leak-mirax-")))
    path = gen.mirax_stitching(folder, source)
    _no_decoded_cache(stack)
    return _levels_reader(path, rng, stack, levels=(0, 1, 2), sizes=(48, 256)), "wsitool.codec.mosaic:decode_image"


def _czi_fixture(maker: str, stack) -> Path:
    gen = _script("make_czi_samples")
    source = SHARED_SAMPLES / "aperio-cmu1-small-region-jpeg.svs"
    if not source.is_file():
        raise Skip(f"real slides folder {SHARED_SAMPLES} is absent (needs {source.name})")
    folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="leak-czi-")))
    return getattr(gen, maker)(folder, source)


def path_czi_jpegxr(rng, stack):
    """CZI JPEG XR subblocks (jxrlib through imagecodecs) of ``scripts/make_czi_samples.py``'s
    JPEG XR fixture, the decoded-image cache off."""
    path = _czi_fixture("jpegxr", stack)
    _no_decoded_cache(stack)
    return _levels_reader(path, rng, stack, levels=(0, 1), sizes=(48, 256)), "wsitool.codec.mosaic:decode_image"


def path_czi_zstd(rng, stack):
    """CZI zstd subblocks (zstd1 with the hi-lo byte packing, 16-bit channels) of the fluorescence
    fixture (its channels composed to RGB), the decoded-image cache off."""
    path = _czi_fixture("fluorescence", stack)
    _no_decoded_cache(stack)
    return _levels_reader(path, rng, stack, levels=(0, 1), sizes=(48, 160)), "wsitool.codec.mosaic:decode_image"


def path_associated(rng, stack):
    """Associated images (thumbnail, label, macro), decoded anew on each step."""
    import wsitool

    paths = [JPEG, J2K]

    def step():
        with wsitool.open_slide(rng.choice(paths)) as slide:
            for name in slide.associated_images:
                assert slide.associated_images[name].size > 0

    # a slide a step: tifffile keeps each file's pages in reference cycles (a page's
    # decode closures refer back to it), which only the cyclic collector frees
    step.collect = True
    return step, "wsitool.slide:decode_associated"


def path_boxfilter(rng, stack):
    """The export's compiled 2:1 box sums and means (``wsitool._boxfilter``)."""
    from wsitool.export import downsample

    if downsample.kernel_status() != "compiled":
        raise Skip(f"the box-filter kernel is not built (exports use {downsample.kernel_status()})")

    def step():
        rows, w = rng.randint(1, 24), rng.randint(1, 300)
        a = np.full((rows, w, 3), rng.randint(0, 255), np.uint8)
        sums = np.empty(((rows + 1) // 2, (w + 1) // 2, 3), np.uint16)
        downsample.halve_rows(a, sums)
        out = np.empty(sums.shape, np.uint8)
        downsample.means(sums, out, 1, 2 - w % 2, 2 - rows % 2, True)
        assert out[0, 0, 0] == a[0, 0, 0]

    return step, ("wsitool.export.downsample:halve_rows", "wsitool.export.downsample:means")


def path_export(rng, stack):
    """``export_pyramid`` of small regions to TIFF (JPEG re-encode) and Deep Zoom, each output removed."""
    import shutil

    import wsitool
    from wsitool.export import export_pyramid

    slide = wsitool.open_slide(JPEG)
    stack.callback(slide.close)
    tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="wsitool-leak-"))
    n = [0]

    def step():
        n[0] += 1
        w, h = rng.randint(64, 300), rng.randint(64, 300)
        x, y = rng.randrange(0, slide.dimensions[0] - w), rng.randrange(0, slide.dimensions[1] - h)
        fmt = "dzi" if n[0] % 2 else "tiff"
        # a few names, used again: a new name a step would grow CPython's table of
        # interned strings (pathlib interns every part of a path), not wsitool's memory
        name = f"o{n[0] % 4}"
        out = Path(tmp) / (f"{name}.dzi" if fmt == "dzi" else f"{name}.tiff")
        export_pyramid(slide, out, format=fmt, region=(x, y, w, h), tile_size=64, threads=1,
                       associated=False, label=False)
        out.unlink()
        shutil.rmtree(Path(tmp) / f"{name}_files", ignore_errors=True)

    # each export starts its reader and encoder threads (each with its own malloc arena
    # and decoder): RSS settles over some hundreds of exports, then stays but for a
    # rare one-off step of a heap (the robust slope below is made for those). Measured
    # alone, in 200-export steps: +196, +180, +112, +1040, +80, +80, +80, +68, +40, +4, 0,
    # +4 KiB... (flat from ~2,000 exports); with another leak child beside it on 2 cores
    # the slope after 500 exports was 0.9-1.1 KiB a step and once passed 2 KiB (CI,
    # 2026-12-08), so the warm-up runs to 1,500
    step.warmup_steps = 1500
    # an export calls the box filter ~18 times: a leak of 1 KiB per call is ~18 KiB a
    # step; a slow growth of a few hundred bytes per export, thinning out over ~1,000
    # exports (threads made per export, not yet explained), stays under this
    step.threshold = 2048
    return step, "wsitool.export.downsample:halve_rows"


def path_dicom_copy(rng, stack):
    """``export_pyramid`` to DICOM with ``compression="copy"`` (the long reads into reused buffers, the reader
    and writer threads, pydicom's header), each series removed."""
    import shutil

    from wsitool.export import export_pyramid

    tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="wsitool-leak-"))
    n = [0]

    def step():
        n[0] += 1
        out = Path(tmp) / f"s{n[0] % 4}"  # (a few names, used again: see path_export)
        export_pyramid(JPEG, out, format="dicom", compression="copy", associated=False, threads=1)
        shutil.rmtree(out)

    # as path_export: each export starts a reader and a writer thread per level, whose malloc arenas
    # settle over some hundreds of exports (measured alone, RSS every 100 exports: +32, +196, +64,
    # +12, +956 KiB, then flat from ~600 to 1,500); CI measured after 300 was undecided once
    step.warmup_steps = 900
    step.threshold = 2048
    return step, "wsitool.export.storedruns:_idle_buffer"


def path_serve(rng, stack):
    """IIIF and Deep Zoom requests to the server app in this process (decode, resample,
    encode, the decoded-tile cache with an 8 MiB budget)."""
    try:
        from starlette.testclient import TestClient
    except ImportError as exc:
        raise Skip(f"the web stack is not installed: {exc}") from exc
    from wsitool.serve.app import create_app
    from wsitool.serve.config import ServeConfig
    from wsitool.serve.runner import build_state

    state = build_state([str(JPEG)], ServeConfig(threads=1, cache_mb=8))
    stack.callback(state.close)
    # (the server answers the Host names of its own address: TestClient's "testserver" is none)
    client = stack.enter_context(TestClient(create_app(state), base_url="http://127.0.0.1"))
    sid = JPEG.name  # the server's id of a slide given as a file

    width, height = state.registry.get(sid).slide.dimensions

    def step():
        size = rng.randint(32, 256)
        x, y = rng.randrange(0, width - 2 * size), rng.randrange(0, height - 2 * size)
        if rng.random() < 0.5:
            r = client.get(f"/iiif/3/{sid}/{x},{y},{size * 2},{size * 2}/{size},/0/default.jpg")
        else:
            r = client.get(f"/dz/{sid}.dzi")
            r = client.get(f"/dz/{sid}_files/{rng.randint(8, 11)}/0_0.jpeg")
        assert r.status_code == 200, r.text

    # the first requests fill the 8 MiB tile cache, Starlette's and the encoder's
    # working sets: RSS rose 2.3 MB over the first 500 requests, 44 kB over the next
    # 500 and ~20 B a request over the 4,500 after (measured here); a 300-step warm-up
    # measured the tail of that settling (a slope of 150-250 B/step here, above the
    # 512 B threshold on the slower CI machine)
    step.warmup_steps = 1000
    return step, "wsitool.serve.app:encode"


def path_openslide(rng, stack):
    """The openslide-python drop-in: ``read_region`` to a PIL image and ``get_thumbnail``."""
    from wsitool.openslide import OpenSlide

    slide = OpenSlide(str(JPEG))
    stack.callback(slide.close)

    def step():
        w, h = rng.randint(16, 300), rng.randint(16, 300)
        img = slide.read_region((rng.randrange(0, 2000), rng.randrange(0, 1500)), 0, (w, h))
        assert img.size == (w, h)
        if rng.random() < 0.1:
            slide.get_thumbnail((rng.randint(32, 128), rng.randint(32, 128)))

    # RSS (after malloc_trim) steps up by 0.84 MB between steps 250 and 500 of this seeded
    # sequence and by 0.22 MB between 1,500 and 1,750 (heap high-water marks; other seeds: up
    # to step 2,250), then rises 10-20 B a step towards a plateau (+0.4 MB over 28,000 steps,
    # measured here).  The 1.5 s warm-up ends near step 1,100 here, earlier on a slower
    # machine: a step inside the measured window is straddled by so many pairs of samples
    # that the Theil-Sen slope read it as a leak (CI, twice).
    step.warmup_steps = 2500
    return step, "wsitool.openslide:OpenSlide.read_region"


def path_patches(rng, stack):
    """Batch patch reads (``Slide.read_patches``): runs of tiles through the compiled loop,
    carried between batches, two threads, now and then area-filtered (``read_size``)."""
    stack.enter_context(_paths_ctx(native=True))
    step = _patch_batches(JPEG, rng, stack)
    # RSS settles slowly here: the run buffers kept between calls (a pool of at most 32 MiB,
    # reused only for equal sizes: random layouts keep adding sizes) and the two threads'
    # malloc arenas.  Beside another leak check (CI runs two at once) a 300-step warm-up
    # measured the tail of it: 300-900 B a step in about one run in five, old code and new
    # alike (measured here 2026-12-02), against 3 KiB a step for a 1 KiB leak in each of
    # the step's three batch fills.
    step.warmup_steps = 1500
    return step, "wsitool.read.patches:PatchReader.fill"


def path_patches_remote(rng, stack):
    """Batch patch reads of a remote slide (a real nginx on 127.0.0.1, obstore's HTTP client):
    each batch's runs advised at once and the next batch's a batch ahead
    (``PatchReader._advise``), their bytes kept in the slide's fetched ranges."""
    _skip_without_obstore()
    stack.enter_context(_paths_ctx(native=True))
    step = _patch_batches(_nginx(stack).url + JPEG.name, rng, stack)
    step.warmup_steps = 1500  # (as path_patches, plus obstore's pools: path_remote_open)
    return step, "wsitool.read.patches:PatchReader._advise"


def _patch_batches(where, rng, stack):
    """A step of path_patches's kind on the slide at ``where`` (a path or a URL)."""
    import wsitool

    slide = wsitool.open_slide(where)
    stack.callback(slide.close)
    w, h = slide.dimensions

    def step():
        x0, y0 = rng.randrange(-50, w - 200), rng.randrange(-50, h - 200)
        locs = [(x0 + 70 * i, y0 + 70 * j) for j in range(3) for i in range(3)]
        read = (rng.uniform(64, 100),) * 2 if rng.random() < 0.2 else None
        for batch in slide.read_patches(locs, (64, 64), batch_size=4, threads=2, read_size=read):
            assert batch.shape[1:] == (64, 64, 3)

    return step


PATHS = {
    "patches": path_patches,
    "patches-remote": path_patches_remote,
    "jpeg-loop": path_jpeg_loop,
    "jpeg-loop-remote": path_jpeg_loop_remote,
    "remote-open": path_remote_open,
    "ndpi-splice": path_ndpi_splice,
    "jpeg-corrupt": path_jpeg_corrupt,
    "jpeg-libjpeg": path_jpeg_libjpeg,
    "jpeg-nvimgcodec": path_jpeg_nvimgcodec,
    "j2k-openjpeg": path_j2k_openjpeg,
    "j2k-reduced": path_j2k_reduced,
    "j2k-nvimgcodec": path_j2k_nvimgcodec,
    "tifffile": path_tifffile,
    "dicom": path_dicom,
    "scaled-jpeg": path_scaled_jpeg,
    "scaled-pillow": path_scaled_pillow,
    "associated": path_associated,
    "boxfilter": path_boxfilter,
    "export": path_export,
    "dicom-copy": path_dicom_copy,
    "serve": path_serve,
    "openslide": path_openslide,
    "mosaic-mirax": path_mosaic_mirax,
    "czi-jpegxr": path_czi_jpegxr,
    "czi-zstd": path_czi_zstd,
}


class Skip(Exception):
    """The path cannot run here (a component is missing); the message says which."""


def inject_leak(targets) -> list[int]:
    """Wrap each of ``targets`` (``"module:function"`` or ``"module:Class.method"``, one
    or a tuple) so that each call keeps :data:`LEAK_BYTES` of native memory; returns
    the one-item call counter they share."""
    import importlib

    calls = [0]
    for target in (targets,) if isinstance(targets, str) else targets:
        module_name, attr = target.split(":")
        owner = importlib.import_module(module_name)
        parts = attr.split(".")
        for part in parts[:-1]:
            owner = getattr(owner, part)
        original = getattr(owner, parts[-1])

        def leaking(*args, _original=original, **kwargs):
            calls[0] += 1
            block = _libc.malloc(LEAK_BYTES)
            ctypes.memset(block, 1, LEAK_BYTES)  # resident, never freed
            return _original(*args, **kwargs)

        setattr(owner, parts[-1], leaking)
    return calls


def theil_sen_ci95(xs, ys) -> tuple[float, float]:
    """95 % interval of the Theil-Sen slope of ``ys`` against ``xs`` (Sen 1968): the
    median of the slopes of all pairs of samples, its interval from the ranks that
    Kendall's tau statistic gives.  Unlike a least-squares line it is not moved by a
    one-off step of RSS (a heap that grows once), which a steady leak never is."""
    x = np.asarray(xs, float)
    y = np.asarray(ys, float)
    i, j = np.triu_indices(len(x), 1)
    dx = x[j] - x[i]
    keep = dx != 0
    slopes = np.sort((y[j] - y[i])[keep] / dx[keep])
    n, m = len(x), len(slopes)
    c = 1.959963984540054 * np.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)
    lo = int(np.clip(np.floor((m - c) / 2), 0, m - 1))
    hi = int(np.clip(np.ceil((m + c) / 2), 0, m - 1))
    return float(slopes[lo]), float(slopes[hi])


def measure(step, rss, warmup_s: float, min_steps: int) -> dict:
    threshold = getattr(step, "threshold", THRESHOLD_BYTES_PER_STEP)
    """Warm up, then sample RSS against steps until the slope interval decides (see the module docstring)."""
    t0 = time.monotonic()
    steps = 0
    while time.monotonic() - t0 < warmup_s or steps < min_steps:
        step()
        steps += 1
    every = max(1, int(steps / (time.monotonic() - t0) * SAMPLE_S))
    xs, ys = [0], [rss()]
    t1 = time.monotonic()
    verdict, ci, n = "undecided", None, 0
    # a slow or busy machine: keep going past MAX_MEASURE_S until MIN_STEPS (at most 3x as long)
    while (time.monotonic() - t1 < MAX_MEASURE_S
           or (n < MIN_STEPS and time.monotonic() - t1 < 3 * MAX_MEASURE_S)):
        for _ in range(every):
            step()
        n += every
        xs.append(n)
        ys.append(rss())
        if (len(xs) % 5 == 0 and len(xs) >= MIN_SAMPLES and n >= MIN_STEPS
                and time.monotonic() - t1 >= MIN_MEASURE_S):
            ci = theil_sen_ci95(xs, ys)
            if ci[1] < threshold:
                verdict = "clean"
                break
            if ci[0] > threshold:
                verdict = "leak"
                break
    if verdict == "undecided" and n >= MIN_STEPS and len(xs) >= MIN_SAMPLES:
        # the loop can end between two decision points (a slow path reaches MIN_STEPS past
        # MAX_MEASURE_S on a sample whose count is not a multiple of 5): decide on all samples
        ci = theil_sen_ci95(xs, ys)
        verdict = "clean" if ci[1] < threshold else "leak" if ci[0] > threshold else verdict
    ci = theil_sen_ci95(xs, ys) if ci is None else ci
    return {"verdict": verdict, "steps": n, "samples": len(xs), "seconds": round(time.monotonic() - t1, 3),
            "warmup_steps": steps, "slope_ci95_bytes_per_step": ci,
            "growth_bytes": ys[-1] - ys[0], "threshold_bytes_per_step": threshold}


def main(argv: list[str]) -> int:
    """``PATH [--no-inject]``: measure the path, then (unless ``--no-inject``) its leaking variant."""
    name = argv[0]
    proc = psutil.Process()
    trim = getattr(_libc, "malloc_trim", None)

    collect = [False]

    def rss() -> int:
        # free heap pages go back to the system first (glibc), so RSS follows the
        # bytes in use rather than the allocator's high-water marks; a path whose
        # steps leave reference cycles of other libraries has them collected first
        if collect[0]:
            gc.collect()
        if trim is not None:
            trim(0)
        return proc.memory_info().rss

    rng = random.Random(24)
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        try:
            step, target = PATHS[name](rng, stack)
        except Skip as exc:
            print(json.dumps({"path": name, "skip": str(exc)}))
            return 0
        collect[0] = bool(getattr(step, "collect", False))
        result = {"path": name, "target": target, "setup_s": round(time.monotonic() - t0, 3),
                  "gc_before_samples": collect[0],
                  "clean": measure(step, rss, WARMUP_S, getattr(step, "warmup_steps", WARMUP_STEPS))}
        if "--no-inject" not in argv[1:]:
            calls = inject_leak(target)
            result["injected"] = measure(step, rss, 0.2, 20)
            result["injected"]["target_calls"] = calls[0]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main(sys.argv[1:]))
