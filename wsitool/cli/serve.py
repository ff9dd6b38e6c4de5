"""``wsitool serve``: IIIF Image API 3.0 (level 2) and Deep Zoom tile server with a viewer (floor 9).

The web stack (Starlette, uvicorn) is the optional ``serve`` extra: the server
package is imported when the command runs.
"""

from __future__ import annotations

import importlib
from typing import Any

import typer

from ..ground.extras import needs_extra
from .console import STORAGE_OPTION_HELP, fail, handle_errors, storage_options
from .group import app


@app.command("serve")
@handle_errors
def serve_cmd(
    sources: list[str] = typer.Argument(..., help="Slide files, folders of slides, slide URLs "
                                                   "(https://, s3://, gs://, az://) and object-store "
                                                   "prefixes ending in / (s3://bucket/cases/)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (default: loopback only)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port (0: any free port)."),
    threads: int | None = typer.Option(None, "--threads", min=1,
                                          help="Decode threads in all (default: CPU count); split over --workers."),
    cache_mb: int = typer.Option(256, "--cache-mb", min=0,
                                 help="Decoded-tile cache budget in MiB (0: off); split over --workers."),
    workers: int = typer.Option(1, "--workers", min=1,
                                help="Server processes sharing the port, each with its share of --threads and "
                                     "--cache-mb (POSIX; default 1)."),
    viewer_js: str | None = typer.Option(None, "--viewer-js",
                                            help="OpenSeadragon script: a URL, or a local file the server serves "
                                                 "(default: the pinned jsDelivr release)."),
    tile_size: int = typer.Option(512, "--tile-size", min=16, help="IIIF tile size advertised in info.json."),
    render_memory_mb: int = typer.Option(768, "--render-memory-mb", min=128,
                                         help="Memory the renders in flight may hold together, MiB (split "
                                              "over --workers): each reserves its bound first or waits; "
                                              "larger requests are refused, and maxArea follows."),
    max_decode_pixels: int | None = typer.Option(None, "--max-decode-pixels", min=1,
                                                 help="Most source pixels one request may read (default: "
                                                      "wsitool's region limit, 268435456); info.json lists "
                                                      "only the sizes and tile scale factors within it."),
    follow_links: bool = typer.Option(False, "--follow-links",
                                      help="Serve slides that symbolic links in the folders lead to, even "
                                           "outside them (default: skipped, and counted at start)."),
    storage_option: list[str] | None = typer.Option(None, "--storage-option", metavar="KEY=VALUE",
                                                    help=STORAGE_OPTION_HELP),
    allowed_host: list[str] | None = typer.Option(None, "--allowed-host", metavar="NAME",
                                                  help="Also answer requests whose Host is NAME (repeatable; "
                                                       "'*': any). Default: the --host address, and localhost "
                                                       "for a loopback or wildcard one; other Hosts get 400."),
    cors_origin: str | None = typer.Option(None, "--cors-origin", metavar="ORIGIN",
                                           help="Send Access-Control-Allow-Origin: ORIGIN (or *) with IIIF and "
                                                "Deep Zoom answers, for a viewer on another origin (default: none)."),
    max_open_files: int | None = typer.Option(None, "--max-open-files", min=1,
                                              help="Descriptors the open slides may hold (2 per TIFF slide, 1 per "
                                                   "DICOM file); least recently used closed first. Default: 3/8 of "
                                                   "ulimit -n, at most 1024."),
    max_connections: int | None = typer.Option(None, "--max-connections", min=1,
                                               help="Connections held at once; more get 503 (default: 1/4 of "
                                                    "ulimit -n, at most 1024)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only warnings and errors."),
    debug: bool = typer.Option(False, "--debug", help="Log every request (debug level)."),
) -> None:
    """Serve slides over IIIF Image API 3.0 (level 2) and Deep Zoom, with a viewer page at /.

    Routes: /iiif/3/{id}/info.json, /iiif/3/{id}/{region}/{size}/{rotation}/{quality}.{format},
    /dz/{id}.dzi, /dz/{id}_files/{level}/{col}_{row}.jpeg, /view/{id}, /status.  Stops
    cleanly on SIGINT / SIGTERM / SIGHUP (exit 130 / 143 / 129); a port in use is exit 9.
    Slides are listed at start and opened on first use.  A connection that sends no complete
    request within 60 s is closed.
    A slide URL serves that slide; an s3://, gs:// or az:// URL ending in / serves the slides
    under that prefix.  A URL not found is exit 9, access denied 16, a server failing 17.
    Needs the 'serve' extra.
    """
    with needs_extra("serve", "serve needs the web stack ({name}): ", lambda message: fail(message, 2)):
        importlib.import_module("starlette")
        importlib.import_module("uvicorn")

        from ..serve.config import DEFAULT_VIEWER_JS, ServeConfig
        from ..serve.runner import serve
    options: dict[str, Any] = dict(cache_mb=cache_mb, viewer_js=viewer_js or DEFAULT_VIEWER_JS, tile_size=tile_size,
                   follow_links=follow_links, allowed_hosts=tuple(allowed_host or ()), cors_origin=cors_origin,
                   max_open_files=max_open_files, max_connections=max_connections,
                   render_memory_mb=render_memory_mb, max_decode_pixels=max_decode_pixels)
    if threads is not None:
        options["threads"] = threads
    remote_options = storage_options(storage_option)
    if remote_options:
        options["storage_options"] = remote_options
    config = ServeConfig(**options)
    code = serve(sources, config=config, host=host, port=port, quiet=quiet, debug=debug, workers=workers)
    if code:
        raise typer.Exit(code)
