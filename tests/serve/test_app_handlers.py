"""The server's route handlers called one by one, without a server: each is a module-level
coroutine taking a Starlette ``Request`` whose app holds the state at ``app.state.wsitool``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("starlette")

from starlette.requests import Request

from wsitool.serve import app as serve_app
from wsitool.serve.config import ServeConfig
from wsitool.serve.iiif import IIIFError
from wsitool.serve.runner import build_state

SLIDE = Path(__file__).resolve().parents[2] / "samples" / "sample-aperio-jpeg.svs"
SID = SLIDE.name


@pytest.fixture
def starlette_app():
    """The Starlette app (inside the request-log middleware) serving the JPEG sample."""
    state = build_state([SLIDE], ServeConfig(threads=1, cache_mb=8))
    try:
        yield serve_app.create_app(state).app
    finally:
        state.close()


def request(app, path: str, disconnected: bool = False, **path_params) -> Request:
    """A GET ``Request`` for ``path`` on ``app``; its client is gone when ``disconnected``."""
    message = {"type": "http.disconnect"} if disconnected else {"type": "http.request", "body": b""}

    async def receive():
        return message

    scope = {"type": "http", "method": "GET", "path": path, "root_path": "", "scheme": "http",
             "query_string": b"", "headers": [(b"host", b"testserver")], "server": ("testserver", 80),
             "path_params": path_params, "app": app}
    return Request(scope, receive)


def call(handler, req):
    return asyncio.run(handler(req))


def test_create_app_assembles_the_module_level_routes(starlette_app):
    endpoints = {r.path: r.endpoint for r in starlette_app.routes}
    assert endpoints == {
        "/": serve_app.index_route, "/view/{sid:path}": serve_app.view_route,
        "/viewer.js": serve_app.viewer_js_route, "/viewer-images/{name}": serve_app.viewer_image_route,
        "/status": serve_app.status_route, "/iiif/3/{rest:path}": serve_app.iiif_route,
        "/dz/{rest:path}": serve_app.dz_route,
    }
    assert serve_app.app_state(request(starlette_app, "/")) is starlette_app.state.wsitool


def test_iiif_route_redirects_then_describes(starlette_app):
    r = call(serve_app.iiif_route, request(starlette_app, f"/iiif/3/{SID}", rest=SID))
    assert r.status_code == 303
    assert r.headers["location"] == f"http://testserver/iiif/3/{SID}/info.json"
    r = call(serve_app.iiif_route, request(starlette_app, "/", rest=f"{SID}/info.json"))
    doc = json.loads(r.body)
    assert r.status_code == 200 and doc["id"] == f"http://testserver/iiif/3/{SID}"
    width, height = serve_app.lookup(starlette_app.state.wsitool, SID).slide.dimensions
    assert (doc["width"], doc["height"]) == (width, height) and width > 64
    assert "access-control-allow-origin" not in r.headers  # (none by default: --cors-origin adds it)


def test_iiif_route_renders_an_image_and_counts_it(starlette_app):
    state = starlette_app.state.wsitool
    r = call(serve_app.iiif_route, request(starlette_app, "/", rest=f"{SID}/full/64,/0/default.png"))
    assert r.status_code == 200 and r.media_type == "image/png"
    assert r.body[:8] == b"\x89PNG\r\n\x1a\n"
    assert 'rel="canonical"' in r.headers["link"]
    assert state.counters.tiles_rendered == 1 and state.counters.rendering == 0


def test_iiif_route_errors_are_short_plain_text(starlette_app):
    r = call(serve_app.iiif_route, request(starlette_app, "/", rest="nope.svs/info.json"))
    assert (r.status_code, r.body) == (404, b"unknown identifier\n")
    r = call(serve_app.iiif_route, request(starlette_app, "/", rest=f"{SID}/full/max"))
    assert r.status_code == 400 and b"expected {region}" in r.body


def test_a_client_that_left_is_not_rendered_for(starlette_app):
    state = starlette_app.state.wsitool
    req = request(starlette_app, "/", disconnected=True, rest=f"{SID}/full/64,/0/default.jpg")
    r = call(serve_app.iiif_route, req)
    assert r.status_code == 499
    assert state.counters.cancelled == 1 and state.counters.tiles_rendered == 0


def test_render_answers_503_past_the_queue_limit(starlette_app):
    state = starlette_app.state.wsitool
    state.counters.waiting = state.config.max_queue
    entry = serve_app.lookup(state, SID)
    with pytest.raises(IIIFError) as info:
        asyncio.run(serve_app.render(request(starlette_app, "/"), lambda: b"", "image", entry))
    assert info.value.status == 503


def test_dz_route_gives_the_dzi_and_a_tile(starlette_app):
    r = call(serve_app.dz_route, request(starlette_app, "/", rest=f"{SID}.dzi"))
    assert r.status_code == 200 and b'TileSize="254"' in r.body
    r = call(serve_app.dz_route, request(starlette_app, "/", rest=f"{SID}_files/0/0_0.jpeg"))
    assert r.status_code == 200 and r.body[:2] == b"\xff\xd8"
    r = call(serve_app.dz_route, request(starlette_app, "/", rest=f"{SID}_files/0/5_5.jpeg"))
    assert r.status_code == 404


def test_pages_and_status(starlette_app):
    r = call(serve_app.index_route, request(starlette_app, "/"))
    assert r.status_code == 200 and SID.encode() in r.body
    r = call(serve_app.view_route, request(starlette_app, "/", sid=SID))
    assert r.status_code == 200 and b"openseadragon" in r.body.lower()
    r = call(serve_app.view_route, request(starlette_app, "/", sid="nope"))
    assert (r.status_code, r.body) == (404, b"unknown identifier\n")
    assert call(serve_app.viewer_js_route, request(starlette_app, "/")).status_code == 404
    assert call(serve_app.viewer_image_route, request(starlette_app, "/", name="x.png")).status_code == 404
    status = json.loads(call(serve_app.status_route, request(starlette_app, "/status")).body)
    assert status["slides"] == 1 and status["threads"] == 1 and status["cache"] is not None


def test_a_request_cancelled_at_shutdown_answers_503_without_a_traceback(caplog):
    """uvicorn cancels requests still rendering when its graceful shutdown times out (or at a
    second signal); the cancellation reached it and it logged "Exception in ASGI application"
    with a traceback per request.  Now: one warning line, a 503, and the task ends normally."""
    from wsitool.serve.status import ServerCounters

    class Slow:
        state = None

        async def __call__(self, scope, receive, send):
            await asyncio.sleep(3600)

    sent = []

    async def send(message):
        sent.append(message)

    async def main():
        scope = {"type": "http", "method": "GET", "path": "/iiif/3/x/full/max/0/default.jpg"}
        task = asyncio.ensure_future(serve_app._RequestLog(Slow(), ServerCounters())(scope, None, send))
        await asyncio.sleep(0.01)
        task.cancel()
        await task   # raised CancelledError before

    with caplog.at_level("WARNING", logger="wsitool.serve"):
        asyncio.run(main())
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 503
    assert "cancelled, the server is stopping" in caplog.text
