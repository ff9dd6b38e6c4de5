"""Running the server: uvicorn on one process (or several), graceful shutdown on signals.

:func:`serve` binds the listening socket (a port in use is an ``OSError``: exit
9 in the CLI), opens the slides (one shared decoded-tile cache), starts uvicorn
on the Starlette app (:mod:`.app`) and returns the process's exit code when it
stops: 0 when it stopped by itself, 128 + the signal number after SIGINT (130),
SIGTERM (143) or SIGHUP (129).  On a signal uvicorn stops accepting
connections, lets the requests in flight finish (at most
:data:`GRACEFUL_S`), then the worker threads are joined and the slides closed;
it says so in one line.  A second signal (SIGINT, SIGTERM or SIGHUP) stops at
once: the requests in flight are cancelled (503), and when a render thread is
still busy (a decode cannot be interrupted) the process ends there with
``os._exit`` and the first signal's exit code, not waiting for it.

``workers=1`` (default): one process, ``--threads`` decode threads share one
cache.  ``workers=N`` (``--workers N``, POSIX): the parent binds the socket and
checks the slides, then forks N worker processes, each accepting connections
on a listening socket of its own on that address (``SO_REUSEPORT``: the kernel
deals the connections out among them; :func:`worker_sockets`); each opens
the slides itself, with ``threads // N`` decode threads (at least 1), a
cache of ``cache_mb // N`` MiB and a render memory of ``render_memory_mb // N``
MiB (at least 128), so the whole server keeps to the one budget.
Each worker has its own event loop and its own interpreter lock, which is
what one process lacks under load (see scripts/bench_serve.py).  The parent
forwards SIGINT / SIGTERM / SIGHUP to the workers, waits for them and exits
128 + the signal; a worker that dies is not restarted.  ``/status`` reports
the counters of the worker that answered it.  Every worker gets the same settings
(``ServeConfig``: the Host names, CORS, the connection and open-slide bounds), each
of the bounds per process (each has its own descriptors).

The requests' ``Host`` is checked against the address bound (:meth:`~.guard.HostPolicy.for_bind`),
and connections are bounded (:func:`~.guard.uvicorn_config`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from ..errors import InvalidOptionError, UnsupportedFormatError, WsiError, printable
from ..storage import is_url
from .app import RENDER_THREADS, ServerState, create_app
from .config import ServeConfig
from .guard import HostPolicy, uvicorn_config
from .registry import SlideRegistry

if TYPE_CHECKING:
    import uvicorn

    from ..opening import Location
    from ..read.cache import TileCache
    from ..slide import Slide

__all__ = ["serve", "build_state", "open_registry", "tune_malloc", "bind", "worker_sockets", "base_url"]

log = logging.getLogger("wsitool.serve")

#: Pending connections the kernel queues per listening socket.
_BACKLOG = 2048

_SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP"))
                 if s is not None)

#: Seconds the graceful shutdown waits for the requests in flight (then they are cancelled).
GRACEFUL_S = 10

#: How long a stop forced by a second signal waits for the render threads to end.
_FORCED_JOIN_S = 0.5


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


#: What ``ready`` / ``on_ready`` are called with: the bound ``(host, port)``.
Ready = Callable[[tuple[Any, ...]], None]


def bind(host: str, port: int, reuse_port: bool = False) -> list[socket.socket]:
    """Listening sockets on every address of ``host`` at ``port`` (0: one free port for all).

    ``reuse_port``: set ``SO_REUSEPORT`` (where the system has it), so that more sockets
    can listen on the same address (:func:`worker_sockets`) and the kernel deals new
    connections out among them.

    Bound here, before uvicorn starts, so that a port in use is an ``OSError``
    that the CLI prints as one ``wsitool: error:`` line with exit code 9 (I/O),
    instead of uvicorn's own log line and exit status.  ``SO_REUSEADDR`` is set
    (a restart does not wait for the old connections' ``TIME_WAIT``).

    Raises:
        OSError: the address cannot be resolved or bound; ``filename`` is
            ``host:port`` and ``strerror`` says why (``errno`` kept).
    """
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(exc.errno, f"cannot resolve the address to listen on ({exc.strerror})",
                      where) from None
    sockets: list[socket.socket] = []
    seen: set[tuple[int, Any]] = set()
    try:
        for family, kind, proto, _, addr in infos:
            if (family, addr[0]) in seen:
                continue
            seen.add((family, addr[0]))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port and hasattr(socket, "SO_REUSEPORT"):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:  # the same free port on every address
                addr = (addr[0], sockets[0].getsockname()[1], *addr[2:])
            sock.bind(addr)
            sock.listen(_BACKLOG)  # connections wait in the backlog until a worker accepts them
    except OSError as exc:
        for sock in sockets:
            sock.close()
        why = exc.strerror or str(exc)
        if exc.errno == errno.EADDRINUSE:
            why = ("address already in use (another server listens there: choose another --port, "
                   "or --port 0 for any free one)")
        elif exc.errno == errno.EACCES:
            why = "permission denied (ports below 1024 need privileges: choose --port 1024 or above)"
        raise OSError(exc.errno, why, where) from None
    return sockets


def worker_sockets(sockets: list[socket.socket], workers: int) -> list[list[socket.socket]]:
    """One set of listening sockets per worker process: ``sockets`` itself for the first, and
    for each other one new sockets on the same addresses with ``SO_REUSEPORT`` (``sockets``
    bound by :func:`bind` with ``reuse_port``), so that the kernel spreads connections over
    the workers.  Forked workers accepting on one shared socket let whichever woke first
    take a burst of connections: with 8 keep-alive clients one of two workers often served
    them all (0.96-0.98 cores busy of 2, ``scripts/bench_serve.py --workers 2``).  Where the
    system has no ``SO_REUSEPORT`` every worker gets ``sockets`` (the shared socket).

    Raises:
        OSError: a new socket cannot be bound (then none of them is left open).
    """
    if not hasattr(socket, "SO_REUSEPORT") or not sockets or \
            not sockets[0].getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT):
        return [sockets] * workers
    sets = [sockets]
    try:
        for _ in range(workers - 1):
            own: list[socket.socket] = []
            sets.append(own)
            for sock in sockets:
                new = socket.socket(sock.family, sock.type, sock.proto)
                own.append(new)
                new.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                new.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if sock.family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                    new.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                new.bind(sock.getsockname())
                new.listen(_BACKLOG)
    except OSError:
        for own in sets[1:]:
            for new in own:
                new.close()
        raise
    return sets


def links_note(links: list[str], shown: int = 3) -> str:
    """One line on the symbolic links skipped (``""`` when none): how many, why, the first few."""
    if not links:
        return ""
    names = ", ".join(links[:shown]) + (f", ... ({len(links) - shown} more)" if len(links) > shown else "")
    return (f"skipped {len(links)} symbolic link{'s' if len(links) > 1 else ''} leading outside "
            f"the folders given ({names}): give --follow-links to serve what they lead to")


def open_registry(sources: Iterable[str | os.PathLike], config: ServeConfig,
                  cache: TileCache | None = None) -> SlideRegistry:
    """The :class:`SlideRegistry` of ``sources`` (files, folders, slide URLs, object-store prefixes).

    Slides open with ``cache``; URLs with the storage options of ``config`` (:meth:`ServeConfig.located`).

    Raises:
        FileNotFoundError: a source does not exist (a URL: RemoteNotFoundError).
        RemoteAccessError, RemoteUnavailableError, InvalidOptionError, WsiError: see
            :class:`SlideRegistry`.
    """
    from ..slide import open_slide

    def opener(location: str | Location) -> Slide:
        return open_slide(location, cache=cache)

    return SlideRegistry(config.located(sources), opener, follow_links=config.follow_links,
                         max_open_files=config.max_open_files)


def build_state(sources: Iterable[str | os.PathLike], config: ServeConfig) -> ServerState:
    """Open the slides of ``sources`` (files, folders, slide URLs, object-store prefixes) with one shared cache.

    Raises:
        FileNotFoundError: a source (or ``--viewer-js`` file) does not exist.
        RemoteAccessError, RemoteUnavailableError, InvalidOptionError, WsiError: a URL (see
            :class:`SlideRegistry`).
    """
    from ..read.cache import TileCache

    cache = TileCache(config.cache_mb << 20) if config.cache_mb > 0 else None
    return ServerState(open_registry(sources, config, cache), config, cache)


def serve(sources: Iterable[str | os.PathLike], *, config: ServeConfig, host: str = "127.0.0.1",
          port: int = 8000, quiet: bool = False, debug: bool = False, state: ServerState | None = None,
          ready: Ready | None = None, workers: int = 1) -> int:
    """Serve ``sources`` until a signal; return the exit code (see the module docstring).

    ``ready``: called with the bound ``(host, port)`` once the server listens
    (tests pass port 0 and learn the port here).  ``workers``: processes (see
    the module docstring; ``state`` is for one process only).  Every parameter after
    ``sources`` is keyword-only.

    Raises:
        OSError: the address cannot be bound (a port in use), a source is missing.
        UnsupportedFormatError: no slide to serve.
        InvalidOptionError: ``workers < 1``, or ``workers > 1`` where ``os.fork`` is missing
            (also a ValueError).
    """
    if workers < 1:
        raise InvalidOptionError(f"workers must be >= 1, got {workers}")
    if workers > 1 and (state is not None or not hasattr(os, "fork")):
        raise InvalidOptionError("several workers need os.fork (POSIX) and no prepared state")
    level = logging.WARNING if quiet else (logging.DEBUG if debug else logging.INFO)
    _log_to_stderr(level)
    tune_malloc()
    sockets = bind(host, port, reuse_port=workers > 1)  # a port in use fails here, before the slides are opened
    try:
        if workers > 1:
            return _supervise(sources, config, sockets, workers, level, ready, host)
        if state is None:
            state = build_state(sources, config)
        try:
            _check(state.registry)
        except BaseException:
            state.close()
            raise
        return _run(state, sockets, level, _announce(state, ready), host)
    finally:
        for sock in sockets:
            sock.close()


def base_url(bound: tuple[Any, ...]) -> str:
    """``http://host:port/`` of a bound ``(host, port, ...)`` address; an IPv6 host in brackets
    (``http://[::1]:8000/``; was ``http://::1:8000/``, not a URL)."""
    host = str(bound[0])
    return f"http://[{host}]:{bound[1]}/" if ":" in host else f"http://{host}:{bound[1]}/"


def _announce(state: ServerState, ready: Ready | None) -> Ready:
    """The ``on_ready`` of one process: log where it serves, then call ``ready``."""
    config = state.config

    def on_ready(bound: tuple[Any, ...]) -> None:
        log.info("serving %d slide(s) at %s (%d threads, cache %s)", len(state.registry),
                 base_url(bound), config.threads,
                 f"{config.cache_mb} MiB" if state.cache is not None else "off")
        if ready is not None:
            ready(bound)

    return on_ready


def _check(registry: SlideRegistry) -> None:
    """Log what was left out; raise when nothing is left to serve."""
    links = links_note(registry.links_skipped)
    reasons = [why if str(why).startswith(str(path)) else f"{path}: {why}"  # (most name the file)
               for path, why in registry.skipped]
    if not len(registry):
        raise UnsupportedFormatError("no slide to serve: " + "; ".join(
            [*reasons, links] if links else reasons or ["no slide file in the folders given"]))
    if links:
        log.warning("%s", printable(links))
    for why in reasons:
        log.warning("not served: %s", printable(why))


def _run(state: ServerState, sockets: list[socket.socket], level: int, on_ready: Ready | None,
         host: str) -> int:
    """uvicorn on ``sockets`` (bound to ``host``) until it stops; closes ``state``; the exit code."""
    state.hosts = HostPolicy.for_bind(host, [str(s.getsockname()[0]) for s in sockets],
                                      state.config.allowed_hosts)
    server = _server(uvicorn_config(create_app(state), state.config, level, timeout_graceful_shutdown=GRACEFUL_S))
    server.on_ready = on_ready
    try:
        server.run(sockets=sockets)
    finally:
        if server.force_exit and not _renders_ended(state):
            _exit_now(128 + int(server.signalled or signal.SIGINT))
        state.close()
    if server.signalled:
        return 128 + int(server.signalled)
    return 0 if server.started else 1


def _supervise(sources: Iterable[str | os.PathLike], config: ServeConfig, sockets: list[socket.socket],
               workers: int, level: int, ready: Ready | None, host: str) -> int:
    """Fork ``workers`` processes serving on ``sockets`` with a share of the budget each; wait."""
    import dataclasses

    count = _checked_count(sources, config)  # once, before the workers: they open the same slides quietly
    share = dataclasses.replace(config, cache_mb=config.cache_mb // workers,
                                threads=max(1, config.threads // workers),
                                render_memory_mb=max(128, config.render_memory_mb // workers))
    sets = worker_sockets(sockets, workers)
    bound = tuple(sockets[0].getsockname()[:2])
    children = []
    try:
        for own in sets:
            pid = os.fork()
            if pid == 0:  # a worker
                code = 1
                try:
                    for other in sets:
                        if other is not own:   # (accepting only on its own set)
                            for sock in other:
                                sock.close()
                    os.setpgid(0, 0)  # a terminal's Ctrl-C reaches the parent, which forwards it once
                    _exit_with_parent()
                    log.setLevel(max(level, logging.WARNING))  # (the parent says what was skipped)
                    code = _run(build_state(sources, share), own, level, None, host)
                except BaseException as exc:
                    log.error("worker %d: %s: %s", os.getpid(), type(exc).__name__, exc)
                finally:
                    os._exit(code)
            children.append(pid)
    finally:
        for own in sets[1:]:   # the workers hold them (serve() closes the first set)
            if own is not sockets:
                for sock in own:
                    sock.close()
    signalled: list[int] = []

    def forward(sig: int, frame: FrameType | None) -> None:
        signalled.append(sig)
        if len(signalled) <= 2:  # (the workers, at warning level, say nothing)
            log.info("%s", _stop_line(sig, forced=len(signalled) == 2))
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    previous = {s: signal.signal(s, forward) for s in _SIGNALS}
    try:
        log.info("serving %d slide(s) at %s (%d workers x %d threads, cache %s)", count,
                 base_url(bound), workers, share.threads,
                 f"{share.cache_mb} MiB each" if share.cache_mb > 0 else "off")
        if ready is not None:
            ready(bound)
        codes = []
        for pid in children:
            _, status = os.waitpid(pid, 0)
            codes.append(os.waitstatus_to_exitcode(status))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if signalled:
        return 128 + int(signalled[0])
    return max((c for c in codes if c > 0), default=0)


#: URL schemes read through obstore, whose runtime does not survive a fork once started (HTTP(S)
#: falls back to urllib3 in a forked child, slower: its workers should read through obstore too)
_OBSTORE_SCHEMES = ("http", "https", "s3", "gs", "gcs", "az", "azure", "abfs", "abfss")


def _checked_count(sources: Iterable[str | os.PathLike], config: ServeConfig) -> int:
    """Open the slides once, log what is left out (:func:`_check`) and return how many are served.

    Where a URL read through obstore (HTTP(S) or an object store) is among ``sources`` this
    runs in a child process:
    obstore's runtime, once started, does not work in processes forked after it
    (they hang), so the parent of the workers must never start it.  The child's
    result, or the exception it raised, comes back through a pipe.

    Raises:
        whatever :func:`open_registry` or :func:`_check` raise.
    """
    def count() -> int:
        registry = open_registry(sources, config)
        try:
            _check(registry)
            return len(registry)
        finally:
            registry.close()

    if not any(is_url(s) and str(s).split("://", 1)[0].lower() in _OBSTORE_SCHEMES for s in sources):
        return count()
    import pickle

    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: its result or its error through the pipe, then out
        os.close(read_end)
        try:
            result: tuple[bool, Any] = (True, count())
        except BaseException as exc:
            result = (False, exc)
        try:
            payload = pickle.dumps(result)
        except Exception:  # an exception that does not pickle: its class name and text
            payload = pickle.dumps((False, WsiError(f"{type(result[1]).__name__}: {result[1]}")))
        with os.fdopen(write_end, "wb") as out:
            out.write(payload)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as into:
        payload = into.read()
    os.waitpid(pid, 0)
    if not payload:
        raise WsiError("the start-up check of the slides ended without a result")
    ok, value = pickle.loads(payload)  # from our own child
    if not ok:
        raise value
    return int(value)


def _stop_line(sig: int, forced: bool) -> str:
    """What the server says on the first signal (``forced`` False) and on the second."""
    from ..ground.signals import signal_name

    if forced:
        return f"stopping now ({signal_name(sig)}): the requests in flight are cancelled"
    return (f"shutting down ({signal_name(sig)}): finishing the requests in flight (at most {GRACEFUL_S} s); "
            "a second Ctrl-C or signal stops now")


def _renders_ended(state: ServerState) -> bool:
    """After a stop forced by a second signal: cancel the queued renders and wait at most
    :data:`_FORCED_JOIN_S` for the render threads; False when one is still busy."""
    import threading
    import time

    state.executor.shutdown(wait=False, cancel_futures=True)
    end = time.monotonic() + _FORCED_JOIN_S
    for thread in threading.enumerate():
        if thread.name.startswith(RENDER_THREADS):
            thread.join(max(0.0, end - time.monotonic()))
            if thread.is_alive():
                return False
    return True


def _exit_now(code: int) -> NoReturn:
    """End the process with ``code`` now, its output flushed: a render thread is still busy, and
    the interpreter would wait for it at exit (nothing of the server's needs cleaning up: it
    writes no files, and the system closes its sockets and the slides)."""
    for stream in [*(h.stream for h in log.handlers if isinstance(h, logging.StreamHandler)),
                   sys.stdout, sys.stderr]:
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _exit_with_parent() -> None:
    """Linux: this process gets SIGTERM when its parent dies (no orphaned workers)."""
    import ctypes

    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class _SignalledServer(Protocol):
    """What :func:`_run` uses of the uvicorn server :func:`_server` makes."""

    signalled: int | None
    on_ready: Ready | None
    started: bool
    force_exit: bool

    def run(self, sockets: list[socket.socket] | None = None) -> None: ...


def _server(config: uvicorn.Config) -> _SignalledServer:
    """A uvicorn server that records the first signal instead of re-raising it after shutdown,
    and calls its ``on_ready`` with the bound ``(host, port)`` once it listens."""
    import asyncio

    import uvicorn

    class Server(uvicorn.Server):
        signalled: int | None = None
        on_ready: Ready | None = None
        _loop: asyncio.AbstractEventLoop | None = None

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
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

        def _on_signal(self, sig: int, frame: FrameType | None) -> None:
            # the first signal: a graceful shutdown; the second: stop now (any of SIGINT, SIGTERM,
            # SIGHUP; uvicorn forces only on a second SIGINT); more are ignored
            if self.signalled is None:
                self.signalled = sig
                self.should_exit = True
                log.info("%s", _stop_line(sig, forced=False))
            elif not self.force_exit:
                self.force_exit = self.should_exit = True
                log.info("%s", _stop_line(sig, forced=True))
                if self._loop is not None:  # (signal-safe: the loop's self-pipe)
                    self._loop.call_soon_threadsafe(self._cancel_in_flight)

        def _cancel_in_flight(self) -> None:
            """Cancel the requests being answered (each answers 503, see :mod:`.app`): the
            shutdown then does not wait for their connections to close."""
            for task in list(self.server_state.tasks):
                task.cancel()

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            self._loop = asyncio.get_running_loop()
            await super().startup(sockets)
            if self.started and self.servers and self.on_ready is not None:
                self.on_ready(tuple(self.servers[0].sockets[0].getsockname()[:2]))

    return Server(config)


class _ServeLogHandler(logging.StreamHandler):
    """The handler :func:`_log_to_stderr` adds (marked, so that it is added once)."""

    _wsitool_serve = True


def _log_to_stderr(level: int) -> None:
    """One handler on the ``wsitool.serve`` logger (idempotent)."""
    log.setLevel(level)
    if not any(getattr(h, "_wsitool_serve", False) for h in log.handlers):
        handler = _ServeLogHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("wsitool serve: %(levelname)s: %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    for h in log.handlers:
        h.setLevel(level)
