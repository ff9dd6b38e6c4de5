"""Ctrl-C (or SIGTERM) while the command line's modules are still importing: the one
"interrupted" line and exit 130 (143), as after start-up; never a KeyboardInterrupt traceback.

The console script and ``python -m wsitool`` both start in :func:`wsitool.__main__.main`,
which installs :mod:`wsitool.ground.signals` before typer, rich, numpy and the codecs are imported.
The interpreter's own start-up (``site``) comes before any wsitool code and cannot be
covered: each run is started with ``-X importtime`` and signalled only once its stderr shows
typer being imported (after the handler is in place), then after a few delays from there.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, shared_sample

SAMPLE = "aperio-cmu1-small-region-jpeg.svs"
#: as pip writes the console script of ``[project.scripts]`` (``module:function``)
CONSOLE_SCRIPT = "import sys\nfrom {module} import {function}\nsys.exit({function}())\n"


def _default_signals() -> None:
    """SIGINT as a terminal's foreground job has it (a background test runner passes it on ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _entry_point() -> tuple[str, str]:
    """``(module, function)`` of the ``wsitool`` console script in pyproject.toml."""
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    m = re.search(r'^wsitool\s*=\s*"([\w.]+):(\w+)"', section, re.M)
    assert m, section
    return m.group(1), m.group(2)


def _interrupt(cmd: list[str], sig: int, delay: float) -> tuple[int, str]:
    """Run ``cmd`` (with ``-X importtime``), send ``sig`` ``delay`` s after typer starts to import."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            preexec_fn=_default_signals)
    seen = []
    try:
        for line in proc.stderr:  # bounded: the imports end, or the process does
            seen.append(line)
            if "typer" in line:
                break
        time.sleep(delay)
        proc.send_signal(sig)
        _out, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, "".join(seen) + rest


def test_the_console_script_starts_in_the_light_entry_point():
    module, function = _entry_point()
    assert (module, function) == ("wsitool.__main__", "main")
    # (SIGINT's disposition before the import is whatever the test runner left: a background
    # job starts with it ignored; the import must leave it as it was)
    code = ("import signal, sys\nbefore = signal.getsignal(signal.SIGINT)\n"
            f"from {module} import {function}\n"
            "print(sorted(m for m in ('numpy', 'typer', 'rich', 'tifffile', 'wsitool.cli') if m in sys.modules))\n"
            "print(signal.getsignal(signal.SIGINT) is before)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.stdout.split("\n")[:2] == ["[]", "True"], out.stderr  # nothing heavy, no handler taken


@pytest.mark.parametrize("how", ["console-script", "python -m"])
@pytest.mark.parametrize("sig, delay", [(signal.SIGINT, 0.0), (signal.SIGINT, 0.02), (signal.SIGINT, 0.1),
                                        (signal.SIGINT, 0.3), (signal.SIGTERM, 0.05)])
def test_a_signal_during_start_up_is_one_line_not_a_traceback(how, sig, delay):
    slide = str(shared_sample(SAMPLE))
    if how == "python -m":
        cmd = [sys.executable, "-X", "importtime", "-m", "wsitool", "info", slide]
    else:
        module, function = _entry_point()
        cmd = [sys.executable, "-X", "importtime", "-c", CONSOLE_SCRIPT.format(module=module, function=function),
               "info", slide]
    code, err = _interrupt(cmd, sig, delay)
    lines = [line for line in err.splitlines() if not line.startswith("import time:")]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    if code == 0:  # finished before the signal
        return
    name = "" if sig == signal.SIGINT else f" by {signal.Signals(sig).name}"
    assert code == 128 + sig and lines == [f"wsitool: error: interrupted{name}"], (code, lines)


_OUTSIDE_A_COMMAND = """
import os, signal, sys, time
from wsitool.cli.group import OneLineUsage

def make_context(self, *args, **kwargs):  # the arguments being parsed: no command's body yet
    {trigger}
    return OneLineUsage.__base__.make_context(self, *args, **kwargs)

class Dropped:
    def __del__(self):  # the signal's exception raised here can only be printed ("Exception ignored")
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100000):
            pass

OneLineUsage.make_context = make_context
from wsitool.__main__ import main
main(sys.argv[1:])
"""


@pytest.mark.parametrize("trigger", [
    "os.kill(os.getpid(), signal.SIGINT); time.sleep(5)",  # typer makes it exit 130 without a word
    "Dropped()",  # raised in a __del__: Python prints it as unraisable and goes on
])
def test_an_interruption_outside_a_command_is_said_once(trigger):
    code = _OUTSIDE_A_COMMAND.format(trigger=trigger)
    slide = str(shared_sample(SAMPLE))
    out = subprocess.run([sys.executable, "-c", code, "info", slide], capture_output=True, text=True,
                         timeout=120, cwd=REPO, preexec_fn=_default_signals)
    assert out.returncode == 130, out.stderr
    assert out.stderr.splitlines() == ["wsitool: error: interrupted"], out.stderr
