"""Dask clients for batch work: a LocalCluster sized to the machine, an existing scheduler, or threads (floor 7).

Dask (``dask.distributed``) is optional: imported inside the functions that need it.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import tempfile

from ..errors import DaskUnavailableError, InvalidOptionError, WsiError
from ..ground import outputs as atomic
from ..read.lazy import INSTALL_HINT


class BatchOptionError(InvalidOptionError):
    """A bad option of a batch call: unknown scheduler or format, or two
    sources that would be written to the same output (a usage error; an
    :class:`~wsitool.errors.InvalidOptionError`, so a ``WsiError`` and a ``ValueError``)."""


def import_distributed():
    try:
        import distributed
    except ImportError as exc:
        raise DaskUnavailableError(f"a Dask cluster needs dask.distributed ({exc}); {INSTALL_HINT}") from None
    return distributed


def dask_available() -> bool:
    """True when both ``dask.array`` and ``distributed`` import."""
    try:
        importlib.import_module("dask.array")
        importlib.import_module("distributed")
    except ImportError:
        return False
    return True


class ClientHandle:
    """A distributed Client, plus the LocalCluster we started (closed on exit).

    ``partials_in``: the output folder of the tasks.  When the block ends by an
    exception (Ctrl-C, SIGTERM / SIGHUP through :mod:`wsitool.ground.signals`, a
    failure), the LocalCluster is closed, which ends its worker processes in
    the middle of their writes; the temporary outputs they leave there are then
    removed (:func:`wsitool.ground.outputs.clean_stale_partials`: this host, dead
    processes only).
    """

    def __init__(self, scheduler, n_tasks: int, partials_in: str | os.PathLike | None = None):
        distributed = import_distributed()
        self.cluster = None
        self.owned = True
        self.partials_in = partials_in
        self._scratch: str | None = None
        if isinstance(scheduler, distributed.Client):
            self.client = scheduler
            self.owned = False
        elif scheduler == "local":

            n = max(1, min(n_tasks, os.cpu_count() or 1))
            # The workers' scratch space in a folder of our own, removed on exit
            # even when they were stopped mid-task (Dask leaves lock files then).
            self._scratch = tempfile.mkdtemp(prefix="wsitool-dask-")
            try:
                import dask

                with dask.config.set({"temporary-directory": self._scratch}):
                    self.cluster = distributed.LocalCluster(
                        n_workers=n, threads_per_worker=1, processes=True,
                        # CRITICAL: a worker's ERROR lines are noise here (a task's failure comes
                        # back through its future and gets wsitool's one line); on a busy machine a
                        # worker stopped with the cluster (Ctrl-C, SIGTERM) logged a heartbeat
                        # traceback to the terminal
                        dashboard_address=":0", silence_logs=logging.CRITICAL,
                        local_directory=self._scratch,
                    )
                self.client = distributed.Client(self.cluster)
            except BaseException:
                if self.cluster is not None:
                    self.cluster.close()
                shutil.rmtree(self._scratch, ignore_errors=True)
                raise
        else:
            try:
                self.client = distributed.Client(str(scheduler), timeout="10s")
            except (OSError, TimeoutError) as exc:
                raise WsiError(f"cannot connect to the Dask scheduler at {scheduler}: {exc}") from None

    def n_workers(self) -> int:
        try:
            return max(1, sum(w.get("nthreads", 1) for w in
                              self.client.scheduler_info().get("workers", {}).values()))
        except Exception:
            return 1

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.owned:
            try:
                self.client.close()
            finally:
                if self.cluster is not None:
                    self.cluster.close()
                    if exc_type is not None and self.partials_in is not None:
                        atomic.clean_stale_partials(self.partials_in)
                if self._scratch is not None:
                    shutil.rmtree(self._scratch, ignore_errors=True)


def is_client(obj) -> bool:
    return type(obj).__name__ == "Client" and hasattr(obj, "submit")


def check_scheduler(scheduler, allowed_local: tuple[str, ...]) -> None:
    if scheduler is None or is_client(scheduler):
        return
    if not isinstance(scheduler, str) or not scheduler:
        raise BatchOptionError(f"scheduler must be a string or a distributed.Client, got {scheduler!r}")
    if scheduler in allowed_local or scheduler == "local" or "://" in scheduler:
        if (scheduler == "local" or "://" in scheduler) and not dask_available():
            raise DaskUnavailableError(f"scheduler {scheduler!r} needs dask.distributed; {INSTALL_HINT}")
        return
    raise BatchOptionError(
        f"unknown scheduler {scheduler!r} (use {', '.join(allowed_local)}, local, "
        "or a scheduler address such as tcp://HOST:PORT)"
    )


def quiet_tifffile() -> None:
    """Silence tifffile's warnings in worker processes, as the CLI does in its own."""

    logging.getLogger("tifffile").setLevel(logging.ERROR)


def error_record(exc: BaseException) -> tuple[str, tuple[str, ...]]:
    """``(message, class names of the exception's MRO)`` — picklable, for reports."""
    msg = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and not isinstance(exc, WsiError) and exc.strerror:
        msg = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return msg, tuple(c.__name__ for c in type(exc).__mro__)


