"""The console script's process settings (wsitool.__main__.main): OpenBLAS kept to one thread unless the
user says otherwise, and the imported modules' objects frozen out of the cyclic collector's walks."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = """
import gc, os, sys
from wsitool.__main__ import main
sys.argv = ["wsitool", "--version"]
try:
    main()
except SystemExit as exc:
    code = exc.code
print("RESULT", code, os.environ.get("OPENBLAS_NUM_THREADS"), gc.get_freeze_count() > 1000)
"""


def _probe(env_extra: dict) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"} | env_extra
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT"))
    return line.split()[1:]


def test_openblas_one_thread_by_default_and_objects_frozen():
    assert _probe({}) == ["0", "1", "True"]


def test_a_users_openblas_setting_is_kept():
    assert _probe({"OPENBLAS_NUM_THREADS": "3"}) == ["0", "3", "True"]
