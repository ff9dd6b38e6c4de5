"""Running the server: uvicorn on one process, graceful shutdown on signals.

:func:`serve` opens the slides (one shared decoded-tile cache), starts uvicorn
on the Starlette app (:mod:`.app`) and returns the process's exit code when it
stops: 0 when it stopped by itself, 128 + the signal number after SIGINT (130),
SIGTERM (143) or SIGHUP (129).  On a signal uvicorn stops accepting
connections, lets the requests in flight finish, then the worker threads are
joined and the slides closed.  A second SIGINT forces the exit.

One process only: ``--threads`` decode threads share one cache.  (Several
processes behind a load balancer would each need their own share of the cache
budget; that is not offered.)
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys

from ..errors import UnsupportedFormatError
from .app import ServerState, create_app
from .config import ServeConfig
from .registry import SlideRegistry

__all__ = ["serve", "build_state", "tune_malloc"]

log = logging.getLogger("wsitool.serve")

_SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP"))
                 if s is not None)


def tune_malloc() -> bool:
    """glibc only: two malloc arenas and a fixed 1 MiB mmap threshold, set once at start-up.

    A long-running server allocates and frees strip and image buffers (1-8 MiB)
    on many threads.  glibc by default gives each thread its own arena and
    raises the mmap threshold after such frees, so freed buffers stay in the
    arenas and the process's RSS grows well past what is live.  With these
    settings (``mallopt(M_ARENA_MAX, 2)``, ``mallopt(M_MMAP_THRESHOLD, 1 MiB)``)
    buffers of 1 MiB and more go back to the system when freed; cached tiles
    (smaller) stay on the heap.  Measured with ``scripts/bench_serve.py`` on the
    JPEG bench slide, 8 clients, every 8th tile: peak RSS above idle 84 -> 72 MiB
    with the cache off, 373 -> 359 MiB with a 256 MiB cache (and with 4 MiB
    strips, :data:`wsitool.serve.render.STRIP_BYTES`, 50 and 329 MiB).  Returns False where ``mallopt``
    is not available (not glibc); ``MALLOC_ARENA_MAX`` / ``MALLOC_MMAP_THRESHOLD_``
    in the environment win over these values.
    """
    import ctypes
    import ctypes.util
    import os

    name = ctypes.util.find_library("c")
    if not name or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    M_ARENA_MAX, M_MMAP_THRESHOLD = -8, -3
    if "MALLOC_ARENA_MAX" not in os.environ:
        mallopt(M_ARENA_MAX, 2)
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        mallopt(M_MMAP_THRESHOLD, 1 << 20)
    return True


def build_state(sources, config: ServeConfig) -> ServerState:
    """Open the slides of ``sources`` (files and folders) with one shared cache.

    Raises:
        FileNotFoundError: a source (or ``--viewer-js`` file) does not exist.
    """
    from ..read.cache import TileCache
    from ..slide import open_slide

    cache = TileCache(config.cache_mb << 20) if config.cache_mb > 0 else None
    registry = SlideRegistry(sources, lambda path: open_slide(path, cache=cache))
    return ServerState(registry, config, cache)


def serve(sources, config: ServeConfig, host: str = "127.0.0.1", port: int = 8000,
          quiet: bool = False, debug: bool = False, state: ServerState | None = None,
          ready=None) -> int:
    """Serve ``sources`` until a signal; return the exit code (see the module docstring).

    ``ready``: called with the bound ``(host, port)`` once the server listens
    (tests pass port 0 and learn the port here).
    """
    import uvicorn

    level = logging.WARNING if quiet else (logging.DEBUG if debug else logging.INFO)
    _log_to_stderr(level)
    tune_malloc()
    if state is None:
        state = build_state(sources, config)
    reasons = [why if str(why).startswith(str(path)) else f"{path}: {why}"  # (most name the file)
               for path, why in state.registry.skipped]
    if not len(state.registry):
        raise UnsupportedFormatError("no slide to serve: " + ("; ".join(reasons) or
                                                              "no slide file in the folders given"))
    for why in reasons:
        log.warning("not served: %s", why)
    app = create_app(state)
    uconfig = uvicorn.Config(app, host=host, port=port, log_level=level, access_log=False,
                             lifespan="off", log_config=None, timeout_graceful_shutdown=10)
    server = _Server(uconfig)

    def on_ready(bound):
        log.info("serving %d slide(s) at http://%s:%d/ (%d threads, cache %s)", len(state.registry),
                 bound[0], bound[1], config.threads,
                 f"{config.cache_mb} MiB" if state.cache is not None else "off")
        if ready is not None:
            ready(bound)

    server.on_ready = on_ready
    try:
        server.run()
    finally:
        state.close()
    if server.signalled:
        return 128 + int(server.signalled)
    return 0 if server.started else 1


class _Server:
    """A uvicorn server that records the first signal instead of re-raising it after shutdown."""

    def __new__(cls, config):
        import uvicorn

        class Server(uvicorn.Server):
            signalled = None
            on_ready = None

            @contextlib.contextmanager
            def capture_signals(self):
                import threading

                if threading.current_thread() is not threading.main_thread():
                    yield
                    return
                previous = {s: signal.signal(s, self._on_signal) for s in _SIGNALS}
                try:
                    yield
                finally:
                    for s, handler in previous.items():
                        signal.signal(s, handler)

            def _on_signal(self, sig, frame):
                if self.signalled is None:
                    self.signalled = sig
                self.handle_exit(sig, frame)

            async def startup(self, sockets=None):
                await super().startup(sockets)
                if self.started and self.servers and self.on_ready is not None:
                    self.on_ready(tuple(self.servers[0].sockets[0].getsockname()[:2]))

        return Server(config)


def _log_to_stderr(level: int) -> None:
    """One handler on the ``wsitool.serve`` logger (idempotent)."""
    log.setLevel(level)
    if not any(getattr(h, "_wsitool_serve", False) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("wsitool serve: %(levelname)s: %(message)s"))
        handler._wsitool_serve = True
        log.addHandler(handler)
        log.propagate = False
    for h in log.handlers:
        h.setLevel(level)
