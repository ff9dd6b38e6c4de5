"""Running one render on the server's worker pool: queue limit, render memory, worker slot, client gone.

:func:`run_render` is the one way a route has an image made (:func:`wsitool.serve.app.render`
calls it with the app's state):

1. a request whose memory bound exceeds the whole render memory is a 400 saying so,
   and past ``max_queue`` waiting requests a 503;
2. it reserves its bound from the render memory
   (:class:`~wsitool.serve.bounds.RenderBudget`, first come first served), then waits
   for one of the ``threads`` worker slots;
3. a client that left while its request waited is not rendered for (``/status``
   ``cancelled_before_render``);
4. while the job runs on a worker thread, the client's connection is checked every
   :data:`DISCONNECT_POLL_S`; once it is gone the job's ``cancel`` event is set, the
   job stops at its next strip (:class:`~wsitool.serve.render.RenderCancelled`;
   ``/status`` ``cancelled_while_rendering``), and only then are the worker slot and
   the reservation given back, so the memory and threads in use never exceed what
   was reserved.  A task cancelled at the server's stop sets the event too.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Protocol

from ..errors import InvalidRegionError, ResourceLimitError, printable
from .bounds import RenderBudget, mib
from .config import ServeConfig
from .iiif import IIIFError
from .render import RenderCancelled
from .status import ServerCounters

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["run_render", "DISCONNECT_POLL_S"]

log = logging.getLogger("wsitool.serve")

#: Seconds between two checks, while a render runs, that its client is still connected.
DISCONNECT_POLL_S = 0.25


class _State(Protocol):
    """What :func:`run_render` uses of the server's state (:class:`wsitool.serve.app.ServerState`)."""

    @property
    def config(self) -> ServeConfig: ...

    @property
    def counters(self) -> ServerCounters: ...

    @property
    def budget(self) -> RenderBudget: ...

    @property
    def executor(self) -> Executor: ...

    @property
    def slots(self) -> asyncio.Semaphore: ...


async def run_render(state: _State, request: Request, job: Callable[[threading.Event], bytes], what: str,
                     public: Callable[[str], str], bound: int = 0, hint: str = "") -> bytes | None:
    """Run ``job(cancel)`` (decode + encode, returns bytes) on a worker of ``state``; None if
    the client left (before or during the render).

    Args:
        state: the server's :class:`~wsitool.serve.app.ServerState`.
        request: the request rendered for (its connection is watched).
        job: the render; it checks ``cancel`` between strips.
        what: ``"image"`` or ``"tile"`` (in messages).
        public: a message with the slide's server-side path replaced by its identifier.
        bound: the render's memory bound, bytes.
        hint: what a 400 for a bound over the whole render memory adds.

    Raises:
        IIIFError: 503 when more than ``max_queue`` requests wait; 400 for an invalid
            region, a resource limit or a bound over the render memory; 500 (and one log
            line) for any other failure.
    """
    counters = state.counters
    budget = state.budget
    if bound > budget.total:
        raise IIIFError(400, f"this {what} needs up to {mib(bound)} MiB to render, more than the server's "
                             f"render memory ({mib(budget.total)} MiB, --render-memory-mb){hint}")
    if counters.waiting >= state.config.max_queue:
        raise IIIFError(503, "server busy, retry later")
    counters.add("waiting")
    try:
        await budget.reserve(bound)
        try:
            await state.slots.acquire()
        except BaseException:
            budget.release(bound)
            raise
    finally:
        counters.add("waiting", -1)
    try:
        if await request.is_disconnected():
            counters.add("cancelled")
            return None
        counters.add("rendering")
        cancel = threading.Event()
        try:
            loop = asyncio.get_running_loop()
            # in a copy of the request's context (its wsitool.limits), as every thread wsitool starts
            future = loop.run_in_executor(state.executor, contextvars.copy_context().run, job, cancel)
            return await _until_done_or_gone(request, future, cancel)
        finally:
            counters.add("rendering", -1)
            counters.add("tiles_rendered")
    except IIIFError:
        raise
    except RenderCancelled:
        counters.add("cancelled_rendering")
        return None
    except (InvalidRegionError, ResourceLimitError) as exc:
        raise IIIFError(400, public(str(exc))) from None
    except Exception as exc:  # a corrupt tile, a decoder failure: one line, the slide stays served
        log.error("%s %s: 500: %s: %s", printable(request.method), printable(request.url.path),
                  type(exc).__name__, printable(str(exc).splitlines()[0]) if str(exc) else "")
        raise IIIFError(500, f"{what} failed: {type(exc).__name__}") from None
    finally:
        state.slots.release()
        budget.release(bound)


async def _until_done_or_gone(request: Request, future: asyncio.Future[bytes], cancel: threading.Event) -> bytes:
    """The result of the render ``future``.  Sets ``cancel`` when the client has gone (checked
    every :data:`DISCONNECT_POLL_S`) and waits for the render to stop; sets it too when this
    task is cancelled (the server stopping).

    Raises:
        RenderCancelled: the client went away and the render stopped for it.
    """
    try:
        while True:
            done, _ = await asyncio.wait({future}, timeout=DISCONNECT_POLL_S)
            if done:
                return future.result()
            if await request.is_disconnected():
                cancel.set()
                await future   # the render stops at its next strip (RenderCancelled)
                raise RenderCancelled("the client went away")
    except asyncio.CancelledError:
        cancel.set()
        raise
