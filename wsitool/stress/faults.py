"""Test-only fault injection of ``wsitool stress``: the switch and its kinds (floor 6, consumers).

Never set it in production: the environment variable ``WSITOOL_STRESS_FAULT``
(:data:`FAULT_ENV`) makes the child process (:mod:`wsitool.stress.worker`)
misbehave on purpose, so the tests can check that the stress report catches
each kind of failure:

* ``leak`` -- every read keeps a reference to a copy of its decoded pixels
  (at least 256 KiB, written so the pages are resident), like a decoder that
  ignores the caller's buffer and never frees its own;
* ``corrupt`` -- worker threads with an odd id flip the first byte of every
  second read they make (pixels returned wrong under concurrency);
* ``segv`` -- once a quarter of the iterations is done (or after one second
  in ``--duration`` mode), the child sends itself SIGSEGV;
* ``hang`` -- from the same point on, every worker blocks forever (a
  deadlock), so the parent's stall timeout fires.

The report records the fault in force (``run.fault_injected``).
"""

from __future__ import annotations

import os

FAULT_ENV = "WSITOOL_STRESS_FAULT"
FAULTS = ("leak", "corrupt", "segv", "hang")


def injected_fault() -> str | None:
    """The fault :data:`FAULT_ENV` asks for, or None when it is unset or empty."""
    return os.environ.get(FAULT_ENV) or None
