"""Per-sample measurements of the ``wsitool stress`` child: RSS and the extra samplers (floor 6, consumers).

:data:`SAMPLERS` maps a device kind to ``"module:function"`` names; each
function is imported in the child (:func:`load_samplers`) and called at every
sample with no argument, and must return a mapping of name to number (e.g.
``{"gpu_used_mb": 812.0}``), stored under the sample's ``extra``.
``run_stress(samplers=...)`` adds more for one run.  The default,
:func:`process_counts`, records the child's thread count and open file
descriptors.  A sampler that raises is reported in ``sampler_errors`` and does
not stop the run.
"""

from __future__ import annotations

import contextlib
import importlib
import threading

#: Extra per-sample measurement functions run in the child, by device kind
#: (``"cpu"`` or ``"cuda"``): ``"module:function"`` names, each returning a
#: mapping ``{name: number}``.  The GPU memory sampler registers itself here.
SAMPLERS: dict[str, list[str]] = {
    "cpu": ["wsitool.stress.samplers:process_counts"],
    "cuda": ["wsitool.stress.samplers:process_counts", "wsitool.read.cuda_arrays:gpu_memory_sample"],
}


def rss() -> int:
    """Resident set size of this process, in bytes."""
    import psutil  # (loaded by the stress run, not by every command that imports this module)

    return psutil.Process().memory_info().rss


def process_counts() -> dict[str, float]:
    """Default extra sampler: ``{"threads": live Python threads, "open_fds": open file descriptors}``.

    A count that climbs through a run points at a thread or file-handle leak.
    """
    import psutil

    out = {"threads": float(threading.active_count())}
    with contextlib.suppress(AttributeError, psutil.Error):  # num_fds is POSIX-only
        out["open_fds"] = float(psutil.Process().num_fds())
    return out


def load_samplers(names):
    """Import ``"module:function"`` sampler names (see :data:`SAMPLERS`): ``[(name, function)]``."""
    out = []
    for name in names:
        mod, _, fn = name.partition(":")
        out.append((name, getattr(importlib.import_module(mod), fn)))
    return out
