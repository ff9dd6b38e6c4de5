"""What a server accepts from the network: the ``Host`` it answers to, CORS, and connections (floor 8).

**Host.**  A page on another site can make the browser send requests to a server on
this machine (DNS rebinding: ``evil.example`` first resolves to the attacker, then to
``127.0.0.1``); the browser then sends ``Host: evil.example``.  :class:`HostCheck`
answers any request whose ``Host`` names none of :class:`HostPolicy`'s names with
400.  Accepted: the name or address given to ``--host`` and the addresses bound; for
a loopback address also ``localhost``, ``127.0.0.1`` and ``[::1]``; for a wildcard
address (``0.0.0.0``, ``::``, where the server answers on every interface) any IP
literal (``192.168.1.20``, ``[fe80::1]``: no DNS name is involved, so it cannot be
rebound) and the loopback names; and every name given with ``--allowed-host``
(repeatable; ``*`` accepts any).  The port is not compared.  A request without a
``Host`` header (HTTP/1.0; no browser sends one) is accepted.

**CORS.**  No ``Access-Control-Allow-Origin`` is sent by default, so a page of
another origin cannot read the server's answers (images still show in ``<img>``
tags and in a viewer served by this server).  ``--cors-origin ORIGIN`` (or ``*``)
adds it to IIIF and Deep Zoom answers, never to the pages or ``/status``
(:mod:`.app`): needed where a viewer on another origin reads ``info.json`` or the
tiles with ``fetch`` / ``XMLHttpRequest`` (OpenSeadragon does, for ``info.json``).

**Connections.**  uvicorn closes a connection idle between requests after its
keep-alive timeout (5 s), but not one that never completes a request's headers: its
``timeout_keep_alive`` timer starts only once an answer is sent, and any byte received
cancels it; ``limit_concurrency`` answers 503 to requests once as many connections
are open, but holds the connections themselves, and a connection that sends no full
request never meets it.  A client sending nothing, or a byte of headers at a time,
was held for good; enough of them ran the process out of descriptors.  The protocol
of :func:`guarded_protocol` (uvicorn's HTTP protocol class, subclassed) closes a
connection that has not sent a complete request's headers within ``header_timeout``
seconds (60) of opening or of its previous answer, and one whose client leaves an
answer unread (the send buffer full) that long; a connection beyond
``max_connections`` is answered 503 and closed at once.  The default cap is 1/4 of
the descriptor limit (256 under ``ulimit -n 1024``), at least 16, at most 1024.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import InvalidOptionError, printable

if TYPE_CHECKING:
    import uvicorn

__all__ = ["HostPolicy", "HostCheck", "check_host_name", "check_origin", "guarded_protocol",
           "default_connections", "uvicorn_config", "LOOPBACK_NAMES", "KEEP_ALIVE_S"]

log = logging.getLogger("wsitool.serve")

#: Seconds a connection may stay idle between two requests (uvicorn's keep-alive timeout).
KEEP_ALIVE_S = 5

#: The names a loopback-bound server answers to besides its own.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})

_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*")
_ORIGIN = re.compile(r"https?://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+)(:[0-9]{1,5})?")
_HEADER = re.compile(r"(\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[^:\[\]]+))(:(?P<port>[0-9]{0,5}))?")

_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]


def default_connections(limit: int | None = None) -> int:
    """The default cap on connections: 1/4 of ``limit`` (default: the process's descriptor
    limit, :func:`~.pool.descriptor_limit`), at least 16, at most 1024."""
    from .pool import descriptor_limit

    limit = descriptor_limit() if limit is None else limit
    return max(16, min(1024, limit // 4))


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def check_host_name(name: str) -> str:
    """``name`` (``--allowed-host``) as :class:`HostPolicy` compares it: lower case, without a
    final dot or the brackets of an IPv6 literal; ``*`` as it is.

    Raises:
        InvalidOptionError: not a host name, an IP address or ``*`` (a port, a scheme, a path).
    """
    text = str(name).strip().lower()
    if text == "*":
        return text
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if _ip(bare) is not None:
        return str(_ip(bare))
    bare = bare.rstrip(".")
    if not bare or len(bare) > 253 or not _NAME.fullmatch(bare):
        raise InvalidOptionError(f"--allowed-host takes a host name or an IP address (no scheme, port "
                                 f"or path) or '*', got {name!r}")
    return bare


def check_origin(origin: str) -> str:
    """``origin`` (``--cors-origin``) if it is ``*`` or an origin (``http(s)://host[:port]``).

    Raises:
        InvalidOptionError: anything else (a path, a query, another scheme, a trailing ``/``).
    """
    if origin == "*" or _ORIGIN.fullmatch(origin):
        return origin
    raise InvalidOptionError(f"--cors-origin takes '*' or an origin such as https://viewer.example.org "
                             f"(scheme, host and port: no path, not even a final '/'), got {origin!r}")


@dataclasses.dataclass(frozen=True)
class HostPolicy:
    """The ``Host`` names a server answers to (see the module docstring).

    Attributes:
        names: host names and addresses accepted (lower case; IPv6 without brackets).
        any_ip: any IP literal is accepted (a wildcard bind).
        any_host: every ``Host`` is accepted (``--allowed-host '*'``).
    """

    names: frozenset[str]
    any_ip: bool = False
    any_host: bool = False

    @classmethod
    def for_bind(cls, host: str, addresses: Iterable[str], allowed: Iterable[str] = ()) -> HostPolicy:
        """The policy of a server bound to ``addresses`` (what ``--host host`` resolved to),
        with the ``allowed`` names (:func:`check_host_name` forms) besides."""
        names = {check_host_name(h) for h in allowed}
        given = str(host).strip().lower().strip("[]").rstrip(".")
        names.add(given or "0.0.0.0")
        any_ip = not given
        for address in addresses:
            ip = _ip(str(address).split("%", 1)[0])
            if ip is None:
                continue
            names.add(str(ip))
            any_ip = any_ip or ip.is_unspecified
            if ip.is_loopback or ip.is_unspecified:
                names |= LOOPBACK_NAMES
        if given == "localhost":
            names |= LOOPBACK_NAMES
        return cls(frozenset(names - {"*"}), any_ip, "*" in names)

    def allows(self, header: str | None) -> bool:
        """Whether a request with the ``Host`` header ``header`` (None: none) is answered."""
        if header is None or self.any_host:
            return True
        found = _HEADER.fullmatch(header.strip())
        if found is None:
            return False
        if found["v6"] is not None:
            ip = _ip(found["v6"])
            if not isinstance(ip, ipaddress.IPv6Address):
                return False
            return str(ip) in self.names or self.any_ip
        name = found["name"].lower().rstrip(".")
        if name in self.names:
            return True
        return self.any_ip and isinstance(_ip(name), ipaddress.IPv4Address)


#: What a refused request gets (the name it sent is not repeated).
_BAD_HOST = (b"this server does not answer to the host name in the request (a server on this machine "
             b"answers to its own address and to localhost; give --allowed-host NAME for another name)\n")


class HostCheck:
    """ASGI middleware: a request whose ``Host`` ``state.hosts`` (a :class:`HostPolicy`) does
    not accept is answered 400 with a short plain-text body, before any route runs.

    Args:
        app: the ASGI app to call for the requests accepted.
        state: what holds the policy, read at each request (``state.hosts``).
    """

    def __init__(self, app: Callable[[_Message, _Receive, _Send], Awaitable[None]], state: Any):
        self.app = app
        self.state = state

    async def __call__(self, scope: _Message, receive: _Receive, send: _Send) -> None:
        if scope["type"] == "http":
            hosts = [v for k, v in scope.get("headers", ()) if k == b"host"]
            header = hosts[0].decode("latin-1") if len(hosts) == 1 else (None if not hosts else "")
            if not self.state.hosts.allows(header):
                log.debug("%s: 400: Host not allowed", printable(scope.get("method")))
                await send({"type": "http.response.start", "status": 400,
                            "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                        (b"content-length", str(len(_BAD_HOST)).encode())]})
                await send({"type": "http.response.body", "body": _BAD_HOST})
                return
        await self.app(scope, receive, send)


_BUSY_TEXT = b"too many connections, retry later\n"
#: What a connection beyond the cap gets, before it is closed (whatever it sends).
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
         b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_BUSY_TEXT), _BUSY_TEXT))

#: Seconds between two warnings about refused connections.
_WARN_EVERY = 60.0


class _Guard:
    """The connection bounds of the module docstring, mixed into uvicorn's HTTP protocol class by
    :func:`guarded_protocol` (which sets the two bounds): a header deadline, a stalled-write
    deadline and a connection cap.  The attributes it uses (``connections``, ``cycle``,
    ``loop``, ``transport``) are uvicorn's protocol's."""

    header_timeout: float = 60.0
    max_connections: int = 1024
    _warned: list[float] = [-_WARN_EVERY]  # noqa: RUF012 - one per protocol class, set by guarded_protocol
    _headers_due: asyncio.TimerHandle | None = None
    _write_due: asyncio.TimerHandle | None = None
    _refused = False
    connections: Any
    cycle: Any
    loop: asyncio.AbstractEventLoop
    transport: Any

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        full = len(self.connections) >= self.max_connections
        super().connection_made(transport)  # type: ignore[misc]  # (uvicorn's, after this in the MRO)
        if full:
            self._refused = True
            self.transport.write(_BUSY)
            self.transport.close()
            now = time.monotonic()
            if now - self._warned[0] >= _WARN_EVERY:
                self._warned[0] = now
                log.warning("refused a connection: %d are open (--max-connections)", self.max_connections)
            return
        self._headers_due = self.loop.call_later(self.header_timeout, self._expire)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._headers_due is None and self._between_requests():
            self._headers_due = self.loop.call_later(self.header_timeout, self._expire)
        before = self.cycle
        super().data_received(data)  # type: ignore[misc]  # (uvicorn's)
        if self.cycle is not before and self._headers_due is not None:  # a request's headers came
            self._headers_due.cancel()
            self._headers_due = None

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _expire(self) -> None:
        self._headers_due = None
        if self._between_requests() and not self.transport.is_closing():
            log.debug("closed a connection that sent no complete request within %g s", self.header_timeout)
            self.transport.close()

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]  # (uvicorn's)
        if self._write_due is None:
            self._write_due = self.loop.call_later(self.header_timeout, self._stalled)

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]  # (uvicorn's)
        if self._write_due is not None:
            self._write_due.cancel()
            self._write_due = None

    def _stalled(self) -> None:
        self._write_due = None
        if not self.transport.is_closing():
            log.debug("closed a connection whose client left an answer unread for %g s", self.header_timeout)
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._headers_due, self._write_due):
            if timer is not None:
                timer.cancel()
        self._headers_due = self._write_due = None
        super().connection_lost(exc)  # type: ignore[misc]  # (uvicorn's)


def guarded_protocol(header_timeout: float, max_connections: int) -> type:
    """uvicorn's HTTP protocol class (``AutoHTTPProtocol``: httptools' where installed, else h11's)
    with the connection bounds of the module docstring (:class:`_Guard`), for
    ``uvicorn.Config(http=...)``.

    Raises:
        InvalidOptionError: ``header_timeout <= 0`` or ``max_connections < 1``.
    """
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    if not header_timeout > 0 or max_connections < 1:
        raise InvalidOptionError(f"header_timeout must be > 0 and max_connections >= 1, got "
                                 f"{header_timeout} and {max_connections}")
    return type("GuardedHTTP", (_Guard, AutoHTTPProtocol),
                {"header_timeout": header_timeout, "max_connections": max_connections, "_warned": [-_WARN_EVERY]})


class _Bounds(Protocol):
    """What :func:`uvicorn_config` reads of a :class:`~.config.ServeConfig`."""

    @property
    def header_timeout(self) -> float: ...

    @property
    def max_connections(self) -> int | None: ...


def uvicorn_config(app: Any, config: _Bounds, level: int = logging.WARNING, **options: Any) -> uvicorn.Config:
    """uvicorn's settings for serving ``app`` (:func:`~.app.create_app`) as ``config`` (a
    :class:`~.config.ServeConfig`) asks: the
    HTTP protocol of :func:`guarded_protocol` (``config.header_timeout``, at most
    ``config.max_connections`` connections, default :func:`default_connections`), idle connections
    closed after :data:`KEEP_ALIVE_S`, no access log, log ``level``; ``options`` are passed on
    (``host`` and ``port`` where uvicorn binds, ``timeout_graceful_shutdown``)."""
    import uvicorn

    protocol = guarded_protocol(config.header_timeout, config.max_connections or default_connections())
    return uvicorn.Config(app, log_level=level, access_log=False, lifespan="off", log_config=None,
                          http=protocol, timeout_keep_alive=KEEP_ALIVE_S, **options)
