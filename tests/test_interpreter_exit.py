"""A slide left open (never closed, still referenced by a module global) at interpreter exit is
closed by its finalizer without a word: module globals may already be gone then, and an
"Exception ignored in ... __del__" line on stderr is noise a user cannot act on."""

from __future__ import annotations

import subprocess
import sys

from helpers import REPO, REPO_SAMPLES


def test_an_open_slide_at_exit_prints_nothing():
    # held from a module torn down after wsitool's (sys, os): the old finalizer's
    # ``contextlib.suppress`` was None by then ("TypeError: 'NoneType' object is not callable")
    code = ("import os, sys, wsitool\n"
            f"slide = wsitool.open_slide({str(REPO_SAMPLES / 'sample-aperio-jpeg.svs')!r})\n"
            "slide.read_region((0, 0), 0, (64, 64))\n"
            "sys.kept_slide = slide\n"
            "os.kept_slide = wsitool.open_slide(slide.path)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
