"""The Starlette application of ``wsitool serve``.

Routes:

* ``GET /``: the slide list; ``GET /view/{id}``: the viewer page; ``GET /viewer.js``
  (and ``/viewer-images/{name}``): the local OpenSeadragon file, when one was given;
* ``GET /iiif/3/{id}`` (303 to ``info.json``), ``/iiif/3/{id}/info.json``,
  ``/iiif/3/{id}/{region}/{size}/{rotation}/{quality}.{format}`` (IIIF Image API 3.0,
  :mod:`.iiif`);
* ``GET /dz/{id}.dzi``, ``/dz/{id}_files/{level}/{col}_{row}.{jpeg|png}`` (:mod:`.dz`);
* ``GET /status``: JSON counters (cache hits, misses, bytes; requests in flight).

Concurrency and memory: decoding and encoding run on a pool of ``threads``
worker threads (``concurrent.futures``), never on the event loop; each request
first reserves its memory bound from the render memory (:mod:`.bounds`) and
then waits for a worker on an ``asyncio.Semaphore``, so at most ``threads``
images are in the making at once and together within ``render_memory_mb``;
more than ``max_queue`` waiting requests are answered 503 (backpressure).  A
request that would read more than ``max_decode_pixels`` source pixels, or whose
bound exceeds the whole render memory, is a 400 saying so.  A client that went
away while its request waited is not rendered for; one that goes away while its
image is rendered stops the render at its next strip (the server checks every
:data:`wsitool.serve.dispatch.DISCONNECT_POLL_S`; ``/status`` counts both).  Responses are encoded
bytes; no pixel buffer outlives its request.  A region read uses up to
``threads // rendering`` of wsitool's decode threads, so one client gets every
core and many share them.

Errors never stop the server: bad requests get 400 / 404 / 501 with a short
plain-text body; an exception while rendering (a corrupt tile, say) is a 500
and one log line, and the slide stays served.

Slides open on first use (:mod:`.registry`, :mod:`.pool`): a route holds its slide
(:func:`leased`) from before its render is queued until its answer is made, so the
slide is not closed under it; a slide that cannot be opened is a 404 (one ``not
served`` log line, the first time), a failure that may pass (out of descriptors, a
remote server failing) a 503 or 500 and one log line.

Every request's ``Host`` is checked first, and CORS headers go on IIIF and Deep Zoom
answers only where ``--cors-origin`` asks for them (:mod:`.guard`).

The routes are module-level handlers (``iiif_route``, ``dz_route``, ``index_route``,
``view_route``, ``viewer_js_route``, ``viewer_image_route``, ``status_route``): each
reads the :class:`ServerState` from ``request.app.state.wsitool`` (:func:`app_state`), so
each can be called on its own with a Starlette ``Request``; :func:`create_app` only
assembles them and the request-counting middleware.

Starlette is imported inside the functions (the optional extra ``serve``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote

from ..deepzoom.geometry import DeepZoomGeometry
from ..errors import ResourceLimitError, printable
from ..ground.limits import get_limits
from ..ground.oserrors import RESOURCE_ERRNOS
from .bounds import RenderBudget, area_within, dz_bytes, iiif_admits, webp_area_within
from .config import ServeConfig
from .dispatch import run_render
from .dz import DZ_MEDIA_TYPES, geometry_for, parse_dz_path, render_dz_tile
from .guard import HostCheck, HostPolicy
from .iiif import CONTEXT, PROFILE_URI, IIIFError, info_document, parse_image_request, service_limits
from .registry import SlideEntry, SlideRegistry
from .render import Finisher, check_cancel, encode, plan_read, read_rows, read_scaled, render_bytes
from .status import ServerCounters
from .viewer import index_page, view_page

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

    from ..read.cache import TileCache
    from ..slide import Slide

__all__ = ["create_app", "ServerState", "app_state", "iiif_route", "dz_route", "index_route", "view_route",
           "viewer_js_route", "viewer_image_route", "status_route", "leased", "cors"]

#: An ASGI message, scope, receive and send (the middleware's types).
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]

log = logging.getLogger("wsitool.serve")

#: The names of the render threads start with this (the runner finds them by it at a forced stop).
RENDER_THREADS = "wsitool-serve"


class ServerState:
    """What the routes share: slides, cache, limits, counters and the worker pool.

    Args:
        registry: a :class:`~wsitool.serve.registry.SlideRegistry`.
        config: the :class:`~wsitool.serve.config.ServeConfig`.
        cache: the shared :class:`~wsitool.read.cache.TileCache`, or None.
    """

    def __init__(self, registry: SlideRegistry, config: ServeConfig, cache: TileCache | None = None):
        self.registry = registry
        self.config = config
        self.cache = cache
        self.budget = RenderBudget(config.render_memory_mb << 20)
        #: most source pixels one request may read
        self.max_decode_pixels = (config.max_decode_pixels if config.max_decode_pixels is not None
                                  else get_limits().max_region_pixels)
        self.limits = service_limits(config.max_width, config.max_height, config.max_area,
                                     area_within(self.budget.total))
        self.counters = ServerCounters()
        #: the Host names answered (:mod:`.guard`); the runner sets those of the address it binds
        self.hosts = HostPolicy.for_bind("127.0.0.1", ["127.0.0.1"], config.allowed_hosts)
        #: the CORS header of IIIF and Deep Zoom answers (``--cors-origin``), else none
        self.cors: dict[str, str] = ({"Access-Control-Allow-Origin": config.cors_origin}
                                     if config.cors_origin else {})
        self.executor = ThreadPoolExecutor(max_workers=config.threads,
                                           thread_name_prefix=RENDER_THREADS)
        self._slots: asyncio.Semaphore | None = None
        self._dz: dict[str, DeepZoomGeometry] = {}
        self.viewer_file: str | None = None
        self.viewer_images: dict[str, str] = {}
        if config.viewer_js_is_file:
            path = os.path.abspath(config.viewer_js)
            if not os.path.isfile(path):
                raise FileNotFoundError(2, "No such file (--viewer-js)", config.viewer_js)
            self.viewer_file = path
            images = os.path.join(os.path.dirname(path), "images")
            if os.path.isdir(images):  # OpenSeadragon's button images, listed once
                self.viewer_images = {n: os.path.join(images, n) for n in os.listdir(images)
                                      if n.endswith(".png")}

    @property
    def slots(self) -> asyncio.Semaphore:
        """The semaphore of the ``threads`` render slots (made on first use, on the server's loop)."""
        if self._slots is None:  # made on the server's event loop
            self._slots = asyncio.Semaphore(self.config.threads)
        return self._slots

    def dz_geometry(self, entry: SlideEntry) -> DeepZoomGeometry:
        """The Deep Zoom geometry of ``entry``'s slide (computed once per slide)."""
        geom = self._dz.get(entry.id)
        if geom is None:
            geom = self._dz[entry.id] = geometry_for(entry.slide, self.config.dz_tile_size,
                                                     self.config.dz_overlap)
        return geom

    def read_threads(self) -> int:
        """Region-read threads for one render now: the worker threads shared by those rendering."""
        return max(1, self.config.threads // max(1, self.counters.rendering))

    def status(self) -> dict[str, Any]:
        """The JSON of ``/status``: the counters, slides served, process id, threads, cache stats,
        the open slides (``open_slides``: :meth:`~.pool.OpenSlides.stats`)."""
        data = self.counters.snapshot()
        data["slides"] = len(self.registry)
        data["open_slides"] = self.registry.slides.stats()
        data["pid"] = os.getpid()  # (which worker answered, with --workers)
        data["threads"] = self.config.threads
        data["render_memory"] = self.budget.snapshot()
        data["max_decode_pixels"] = self.max_decode_pixels
        data["cache"] = self.cache.stats().as_dict() if self.cache is not None else None
        return data

    def close(self) -> None:
        """Join the worker threads (queued renders cancelled) and close the slides."""
        self.executor.shutdown(wait=True, cancel_futures=True)
        self.registry.close()


def _public(message: str, entry: SlideEntry) -> str:
    """``message`` with the slide's server-side path replaced by its served identifier."""
    path = str(entry.path)
    return message.replace(path, entry.id) if path else message


# --- the steps the routes share ----------------------------------------------------------------


def app_state(request: Request) -> ServerState:
    """The :class:`ServerState` of the app answering ``request`` (``app.state.wsitool``)."""
    return cast(ServerState, request.app.state.wsitool)


def cors(request: Request) -> dict[str, str]:
    """The CORS header of an IIIF or Deep Zoom answer: ``Access-Control-Allow-Origin`` where
    ``--cors-origin`` gives one (:mod:`.guard`), else none."""
    return app_state(request).cors


def error_response(exc: IIIFError, headers: Mapping[str, str] | None = None) -> Response:
    """A short plain-text answer for ``exc``: its status and message, with ``headers`` (CORS)."""
    from starlette.responses import PlainTextResponse

    return PlainTextResponse(exc.message + "\n", status_code=exc.status, headers=dict(headers or {}))


def lookup(state: ServerState, sid: str) -> SlideEntry:
    """The served slide ``sid``.

    Raises:
        IIIFError: 404 when no slide is served under ``sid``.
    """
    entry = state.registry.get(sid)
    if entry is None:
        raise IIIFError(404, "unknown identifier")
    return entry


@contextlib.asynccontextmanager
async def leased(request: Request, entry: SlideEntry) -> AsyncIterator[Slide]:
    """``entry``'s slide, open and pinned while the block runs (:meth:`~.pool.OpenSlides.lease`:
    opened on a worker thread where it is not open).

    Raises:
        IIIFError: 404 for a slide that cannot be opened (the registry logs why, once); 503
            when the open slides in use fill their budget or the process is out of
            descriptors; 500 (one log line) for any other failure to open.
    """
    state = app_state(request)
    pool = state.registry.slides
    if entry.failed is not None:
        raise IIIFError(404, "slide cannot be read")
    try:
        slide = await pool.lease(entry, state.executor)
    except ResourceLimitError:
        raise IIIFError(503, "server busy, retry later") from None
    except Exception as exc:
        if entry.failed is not None:
            raise IIIFError(404, "slide cannot be read") from None
        log.error("%s %s: opening %s failed: %s: %s", printable(request.method), printable(request.url.path),
                  printable(entry.path), type(exc).__name__, printable(str(exc).splitlines()[0]) if str(exc) else "")
        if isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS:
            raise IIIFError(503, "server busy, retry later") from None
        raise IIIFError(500, f"opening the slide failed: {type(exc).__name__}") from None
    try:
        yield slide
    finally:
        pool.release(entry)


def base_id(request: Request, sid: str) -> str:
    """The IIIF base URI of slide ``sid`` as the client reached this server."""
    return str(request.base_url).rstrip("/") + "/iiif/3/" + quote(sid, safe="")


async def render(request: Request, job: Callable[[threading.Event], bytes], what: str, entry: SlideEntry,
                 bound: int = 0, hint: str = "") -> bytes | None:
    """Run ``job(cancel)`` (decode + encode, returns bytes) on a worker; None if the client left.

    :func:`wsitool.serve.dispatch.run_render` with this app's state: ``bound`` (bytes) is
    reserved from the render memory first; the render stops at its next strip once the
    client has gone.  A 400's text names the slide by its identifier, never by its path
    on the server.

    Raises:
        IIIFError: 503 when more than ``max_queue`` requests wait; 400 for an invalid
            region, a resource limit or a bound over the render memory; 500 (and one log
            line) for any other failure.
    """
    return await run_render(app_state(request), request, job, what, lambda text: _public(text, entry), bound, hint)


# --- the routes --------------------------------------------------------------------------------


async def iiif_route(request: Request) -> Response:
    """``/iiif/3/{id}``: 303 to ``info.json``; ``/iiif/3/{id}/info.json``; an image request."""
    from starlette.responses import RedirectResponse

    state = app_state(request)
    parts = request.path_params["rest"].split("/")
    try:
        entry = lookup(state, parts[0])
        if len(parts) == 1 or (len(parts) == 2 and parts[1] == ""):
            return RedirectResponse(base_id(request, entry.id) + "/info.json", status_code=303,
                                    headers=cors(request))
        if len(parts) == 2 and parts[1] == "info.json":
            async with leased(request, entry):
                return info_response(request, entry)
        if len(parts) != 5:
            raise IIIFError(400, "expected {region}/{size}/{rotation}/{quality}.{format}")
        async with leased(request, entry):
            return await image_response(request, entry, parts[1:])
    except IIIFError as exc:
        return error_response(exc, cors(request))


async def image_response(request: Request, entry: SlideEntry, params: Sequence[str]) -> Response:
    """The image of an IIIF request: ``params`` are its region, size, rotation and ``quality.format``.

    Raises:
        IIIFError: a bad request (400), a busy server (503), a failed render (500).
    """
    from starlette.responses import Response

    state = app_state(request)
    cfg = state.config
    slide = entry.slide
    w, h = slide.dimensions
    region, size, rotation, quality_format = params
    req = parse_image_request(region, size, rotation, quality_format, w, h, state.limits)
    plan = plan_read(slide.level_dimensions, slide.level_downsamples, req.region, req.size,
                     cfg.level_tolerance)
    _wx, _wy, ww, wh = plan.window
    if ww * wh > state.max_decode_pixels:
        raise IIIFError(400, f"this request reads {ww}x{wh} pixels of level {plan.level} (the level that "
                             f"answers its scale), more than the server reads for one request "
                             f"({state.max_decode_pixels} pixels, --max-decode-pixels): ask for a smaller region, "
                             f"or one of the sizes or tile scale factors in info.json")
    level = slide.levels[plan.level]
    banded = req.quality != "color" or req.mirror or bool(req.rotation)
    bound = render_bytes(plan, level.tile_height, req.quality, req.format, req.mirror, req.rotation)
    hint = ""
    if req.format == "webp":
        hint = (f"; lossless WebP takes about 27 bytes a pixel (up to {webp_area_within(state.budget.total)} "
                f"pixels here), PNG and JPEG 9 at most")

    def job(cancel: threading.Event) -> bytes:
        if not banded:  # the image is the read: no copy (encoded before this thread's next reuse read)
            img = read_scaled(slide, plan, state.read_threads(), reuse=True, cancel=cancel)
        else:  # quality, mirror and rotation applied band by band as the rows come
            ow, oh = req.size
            finisher = Finisher(ow, oh, req.mirror, req.rotation, req.quality, rgb_out=req.format == "webp")
            read_rows(slide, plan, finisher.put, state.read_threads(), cancel=cancel)
            img = finisher.image
            del finisher
        check_cancel(cancel)
        return encode(img, req.format, cfg.quality)

    body = await render(request, job, "image", entry, bound, hint)
    if body is None:
        return Response(status_code=499)
    links = (f'<{base_id(request, entry.id)}/{req.canonical}>;rel="canonical", '
             f'<{PROFILE_URI}>;rel="profile"')
    return Response(body, media_type=req.media_type,
                    headers={**cors(request), "Link": links, "Cache-Control": "public, max-age=3600"})


def info_response(request: Request, entry: SlideEntry) -> Response:
    """``info.json`` of ``entry`` (JSON-LD media type when the client accepts it)."""
    from starlette.responses import JSONResponse

    state = app_state(request)
    slide = entry.slide
    w, h = slide.dimensions

    def admit(region: tuple[int, int, int, int], size: tuple[int, int]) -> bool:
        return iiif_admits(slide, region, size, state.config.level_tolerance, state.max_decode_pixels,
                           state.budget.total)

    doc = info_document(base_id(request, entry.id), w, h, state.config.tile_size, state.limits, admit)
    ld = "application/ld+json" in request.headers.get("accept", "")
    media = f'application/ld+json;profile="{CONTEXT}"' if ld else "application/json"
    return JSONResponse(doc, media_type=media,
                        headers={**cors(request), "Link": f'<{PROFILE_URI}>;rel="profile"'})


async def dz_route(request: Request) -> Response:
    """``/dz/{id}.dzi`` (the XML) and ``/dz/{id}_files/{level}/{col}_{row}.{jpeg|png}`` (a tile)."""
    from starlette.responses import Response

    state = app_state(request)
    cfg = state.config
    try:
        parsed = parse_dz_path(request.path_params["rest"])
        entry = lookup(state, parsed[1])
        async with leased(request, entry) as slide:
            geom = state.dz_geometry(entry)
            if parsed[0] == "dzi":
                return Response(geom.dzi_xml("jpeg"), media_type="application/xml", headers=cors(request))
            _, _, level, col, row, fmt = parsed
            try:
                tile = geom.tile(level, (col, row))
            except ValueError as exc:
                raise IIIFError(404, str(exc)) from None
            rw, rh = tile.read_size
            if rw * rh > state.max_decode_pixels:
                raise IIIFError(400, f"this tile reads {rw}x{rh} pixels of level {tile.read_args[1]}, more than "
                                     f"the server reads for one request ({state.max_decode_pixels} pixels, "
                                     f"--max-decode-pixels)")
            bound = dz_bytes(slide, tile)

            def job(cancel: threading.Event) -> bytes:
                check_cancel(cancel)
                rgb = render_dz_tile(slide, geom, level, col, row, state.read_threads(), cfg.dz_filter)
                check_cancel(cancel)
                return encode(rgb, "jpg" if fmt == "jpeg" else "png", cfg.quality)

            body = await render(request, job, "tile", entry, bound)
        if body is None:
            return Response(status_code=499)
        return Response(body, media_type=DZ_MEDIA_TYPES[fmt],
                        headers={**cors(request), "Cache-Control": "public, max-age=3600"})
    except IIIFError as exc:
        return error_response(exc, cors(request))


async def index_route(request: Request) -> Response:
    """``/``: the list of the served slides (HTML)."""
    from starlette.responses import HTMLResponse

    return HTMLResponse(index_page(app_state(request).registry))


async def view_route(request: Request) -> Response:
    """``/view/{id}``: the viewer page of one slide (HTML), 404 for an unknown id."""
    from starlette.responses import HTMLResponse, PlainTextResponse

    state = app_state(request)
    entry = state.registry.get(request.path_params["sid"])
    if entry is None:
        return PlainTextResponse("unknown identifier\n", status_code=404)
    images: str | None
    if state.viewer_file:
        script, images = "/viewer.js", ("/viewer-images/" if state.viewer_images else None)
    else:
        script = state.config.viewer_js
        images = script.rsplit("/", 1)[0] + "/images/"
    try:
        async with leased(request, entry) as slide:
            return HTMLResponse(view_page(entry, slide, script, images))
    except IIIFError as exc:
        return PlainTextResponse(exc.message + "\n", status_code=exc.status)


async def viewer_js_route(request: Request) -> Response:
    """``/viewer.js``: the local OpenSeadragon script (``--viewer-js FILE``), else 404."""
    from starlette.responses import FileResponse, PlainTextResponse

    state = app_state(request)
    if not state.viewer_file:
        return PlainTextResponse("not found\n", status_code=404)
    return FileResponse(state.viewer_file, media_type="text/javascript")


async def viewer_image_route(request: Request) -> Response:
    """``/viewer-images/{name}``: one of OpenSeadragon's button images beside the local script."""
    from starlette.responses import FileResponse, PlainTextResponse

    path = app_state(request).viewer_images.get(request.path_params["name"])
    if path is None:
        return PlainTextResponse("not found\n", status_code=404)
    return FileResponse(path, media_type="image/png")


async def status_route(request: Request) -> Response:
    """``/status``: the JSON counters (:meth:`ServerState.status`)."""
    from starlette.responses import JSONResponse

    return JSONResponse(app_state(request).status())


def create_app(state: ServerState) -> _RequestLog:
    """The Starlette app serving ``state``'s slides (see the module docstring for the routes),
    wrapped in the request-counting middleware; the routes find ``state`` at ``app.state.wsitool``.
    Inside the app, before the routes: the ``Host`` check (:class:`~.guard.HostCheck` on
    ``state.hosts``)."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Route

    pages = ["GET", "HEAD"]
    routes = [
        Route("/", index_route, methods=pages),
        Route("/view/{sid:path}", view_route, methods=pages),
        Route("/viewer.js", viewer_js_route, methods=pages),
        Route("/viewer-images/{name}", viewer_image_route, methods=pages),
        Route("/status", status_route, methods=["GET"]),
        Route("/iiif/3/{rest:path}", iiif_route, methods=pages),
        Route("/dz/{rest:path}", dz_route, methods=pages),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(HostCheck, state=state)])
    app.state.wsitool = state
    return _RequestLog(app, state.counters)


async def _send_stopping(send: _Send) -> None:
    """A ``503 server stopping`` answer to a request cancelled at shutdown (nothing if the
    connection is gone)."""
    body = b"server stopping, retry later"
    try:
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
    except Exception:  # the transport closed meanwhile
        pass


class _RequestLog:
    """ASGI middleware: counts requests in flight and logs one debug line per request (its path's
    non-printable characters escaped: :func:`wsitool.errors.printable`)."""

    def __init__(self, app: Starlette, counters: ServerCounters):
        self.app = app
        self.counters = counters
        self.state = app.state

    async def __call__(self, scope: _Message, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        counters = self.counters
        counters.begin()
        t0 = time.perf_counter()
        status = [500]
        sent = [0]
        started = [False]

        async def send_wrapper(message: _Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                started[0] = True
            elif message["type"] == "http.response.body":
                sent[0] += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except asyncio.CancelledError:
            # uvicorn cancels the requests still running when its graceful shutdown times out
            # (or at a second signal): one log line and a 503, not its "Exception in ASGI
            # application" traceback
            log.warning("%s %s: cancelled, the server is stopping", printable(scope.get("method")),
                        printable(scope.get("path", "")))
            if not started[0]:
                status[0] = 503
                await _send_stopping(send)
        finally:
            path = scope.get("path", "")
            kind = ("info" if path.endswith("/info.json") else "iiif" if path.startswith("/iiif/")
                    else "dz" if path.startswith("/dz/") else "status" if path == "/status"
                    else "page" if path == "/" or path.startswith("/view/") else "other")
            counters.end(kind, status[0], sent[0])
            if log.isEnabledFor(logging.DEBUG):
                # the path as sent, its control and other non-printable characters escaped
                # (a %0A or %1B in a request must not start a line of its own or move the cursor)
                log.debug("%s %s %d %d bytes %.1f ms", printable(scope.get("method")), printable(path),
                          status[0], sent[0], (time.perf_counter() - t0) * 1000)
