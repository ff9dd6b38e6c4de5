"""OS resource errors (EMFILE, ENOMEM, EIO) are I/O errors, exit 9, never corruption,
never "decoder returned no image", never painted over by --on-error fill (issue 14 item 11).

Descriptor exhaustion is produced for real with ``resource.setrlimit(RLIMIT_NOFILE)``
in a subprocess (so the test process keeps its own limit).
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import textwrap

import pytest

from wsitool.errors import CorruptFileError
from wsitool.ground.oserrors import descriptors_exhausted, os_resource_error

from helpers import REPO, REPO_SAMPLES

JPEG = str(REPO_SAMPLES / "sample-aperio-jpeg.svs")

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX resource limits")


#: child-process prelude: a 64-descriptor limit, all of them taken but one
#: (``fillers`` keeps them open)
_ONE_FD_LEFT = """\
import os, resource
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
fillers = []
while True:
    try:
        fillers.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        break
os.close(fillers.pop())  # exactly one descriptor free
"""


def _child(code: str, prelude: str = "") -> dict:
    proc = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_open_with_one_descriptor_left_is_emfile_not_corrupt():
    """Slide() takes two descriptors (its own and tifffile's): with exactly one
    free, the second open fails with EMFILE; that used to be CorruptFileError."""
    got = _child(f"""
        import json
        import wsitool
        from wsitool.errors import CorruptFileError
        try:
            wsitool.open_slide({JPEG!r})
            out = {{"type": None}}
        except Exception as exc:
            out = {{"type": type(exc).__name__, "errno": getattr(exc, "errno", None),
                   "corrupt": isinstance(exc, CorruptFileError), "message": str(exc)}}
        print(json.dumps(out))
    """, prelude=_ONE_FD_LEFT)
    assert got["type"] == "OSError" and not got["corrupt"], got
    assert got["errno"] == errno.EMFILE
    assert "Too many open files" in got["message"] and "ulimit -n" in got["message"]


@pytest.mark.parametrize("on_error", ["raise", "fill"])
def test_read_with_descriptors_exhausted_is_io_error_exit_9_not_filled(tmp_path, on_error):
    """``ulimit -n 6``: the slide opens, then nvImageCodec finds no descriptor for
    its work and returns no image.  That was "decoder returned no image (corrupt
    or truncated tile data)", exit 7, and with --on-error fill a transparent
    image, exit 0.  It is EMFILE, exit 9, whatever --on-error says."""
    import resource

    seen = set()
    for limit in (6, 7, 8, 9):
        out = tmp_path / f"r{limit}.png"
        proc = subprocess.run(
            [sys.executable, "-m", "wsitool.cli", "read-region", JPEG, "--size", "512", "512",
             "-o", str(out), "--on-error", on_error],
            preexec_fn=lambda n=limit: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)),
            capture_output=True, text=True, timeout=120, cwd=REPO)
        seen.add(proc.returncode)
        assert proc.returncode in (0, 9), (limit, proc.stderr[-2000:])
        assert "no image" not in proc.stderr and "filled" not in proc.stderr, proc.stderr
        if proc.returncode == 9:
            assert "Too many open files" in proc.stderr
            assert proc.stderr.count("sample-aperio-jpeg.svs") == 1, proc.stderr  # named once, by the facade
            assert not out.exists()
    assert 0 in seen  # enough descriptors: the read works


def test_resource_errors_are_worded_with_their_cause():
    e = os_resource_error(OSError(errno.EMFILE, "Too many open files", "/x/slide.svs"))
    assert e.errno == errno.EMFILE and e.filename == "/x/slide.svs" and "ulimit -n" in e.strerror
    assert os_resource_error(MemoryError()).errno == errno.ENOMEM
    assert os_resource_error(OSError(errno.EIO, "Input/output error")).errno == errno.EIO
    assert os_resource_error(OSError(errno.ENOENT, "No such file")) is None
    assert os_resource_error(CorruptFileError("x")) is None
    assert descriptors_exhausted() is None


def test_descriptors_exhausted_sees_a_near_full_table():
    """The probe the decode path runs before blaming a tile (codec/failures.py): with one
    descriptor free it reports EMFILE, with plenty free None, in the same process."""
    got = _child("""
        import json
        from wsitool.ground.oserrors import descriptors_exhausted
        near_full = descriptors_exhausted()
        for fd in fillers[:32]:
            os.close(fd)
        roomy = descriptors_exhausted()
        print(json.dumps({"near_full": getattr(near_full, "errno", None),
                          "name": getattr(near_full, "filename", None),
                          "roomy": None if roomy is None else roomy.errno}))
    """, prelude=_ONE_FD_LEFT)
    assert got == {"near_full": errno.EMFILE, "name": None, "roomy": None}  # (the facade names the slide)


def test_cli_maps_emfile_to_exit_9_with_one_line(tmp_path):
    code = f"""
        import json, contextlib, io
        from wsitool.cli import main
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                main(["info", {JPEG!r}])
            c = 0
        except SystemExit as e:
            c = e.code
        print(json.dumps({{"code": c, "err": err.getvalue()}}))
    """
    got = _child(code, prelude=_ONE_FD_LEFT)
    assert got["code"] == 9, got
    assert "Too many open files" in got["err"] and "corrupt" not in got["err"].lower()
