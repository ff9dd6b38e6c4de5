"""The compiled JPEG loop on a machine with no JPEG package (issue 49): built against the libjpeg-turbo
headers wsitool carries (third_party/libjpeg-turbo), the library loaded at run time (Pillow's copy,
or the system's libjpeg.so.62), and a wheel that carries the loop and uses it.

"No JPEG package" is made with a private mount namespace (``unshare -m``, root): ``/dev/null`` is
mounted over the system's ``jpeglib.h`` & co. and ``libjpeg.so*``, so neither the build nor the
process can see them; the tests skip, saying why, where that cannot be done.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import REPO

SAMPLE = REPO / "samples" / "sample-aperio-jpeg.svs"
#: What a system's JPEG development package and library put where the compiler and loader look.
HIDDEN = sorted({path for pattern in ("/usr/include/jpeglib.h", "/usr/include/jconfig.h", "/usr/include/jerror.h",
                                      "/usr/include/jmorecfg.h", "/usr/include/*-linux-gnu/jconfig.h",
                                      "/usr/local/include/jpeglib.h", "/usr/lib/*-linux-gnu/libjpeg.so*",
                                      "/lib/*-linux-gnu/libjpeg.so*", "/usr/lib/libjpeg.so*")
                 for path in glob.glob(pattern)})
_HIDE = 'for f in $WSITOOL_HIDE; do mount --bind /dev/null "$f" || exit 97; done; exec "$0" "$@"'


def _hiding_works() -> str | None:
    """None where a private mount namespace can hide files here, else why not."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return "needs Linux's unshare (util-linux) to hide the system's JPEG files"
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "--", "sh", "-c", _HIDE, "true"],
                           env={**os.environ, "WSITOOL_HIDE": " ".join(HIDDEN)}, capture_output=True, timeout=60)
    if probe.returncode != 0:
        return f"cannot hide files in a private mount namespace here (unshare -m: {probe.stderr.decode()[:120]!r})"
    return None


def hidden(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """``cmd`` run where the system's JPEG headers and libraries are hidden (see the module)."""
    why = _hiding_works()
    if why:
        pytest.skip(why)
    env = {**kw.pop("env", os.environ), "WSITOOL_HIDE": " ".join(HIDDEN)}
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    return subprocess.run(["unshare", "-m", "--propagation", "private", "--", "sh", "-c", _HIDE, *cmd], env=env, **kw)


def _source_copy(tmp_path: Path) -> Path:
    """The repository's sources in ``tmp_path / "src"`` (no build outputs, no compiled modules)."""
    dst = tmp_path / "src"
    shutil.copytree(REPO, dst, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "_build", "__pycache__", "*.so", "_build.json", "*.egg-info",
        ".pytest_cache"))
    return dst


def test_the_loop_builds_where_no_jpeg_header_is_installed(tmp_path):
    pytest.importorskip("setuptools", minversion="77", reason="PEP 639 metadata needs setuptools 77 (test-core)")
    src = _source_copy(tmp_path)
    proc = hidden([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
                   "--build-temp", str(tmp_path / "tmp")], cwd=src, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list((tmp_path / "lib" / "wsitool").glob("_jpegloop.*.so")), proc.stderr[-2000:]
    assert json.loads((tmp_path / "lib" / "wsitool" / "_build.json").read_text()) == {"skipped": {}}
    assert not (src / "wsitool" / "_build.json").exists()  # (a build elsewhere leaves the sources alone)


_STATUS = textwrap.dedent("""
    import hashlib, json, sys
    import wsitool
    from wsitool.codec import jpegloop, libjpeg
    if len(sys.argv) > 2:  # only these candidates
        libjpeg.candidates = lambda: sys.argv[2:]
    from wsitool.slide import pyramid_levels
    with wsitool.open_slide(sys.argv[1]) as slide:
        rgb = slide.read_region((100, 80), 0, (700, 500), mode="rgb")
        decoder = "libjpeg-turbo" if jpegloop.libjpeg_decoder(pyramid_levels(slide)[0]) else "other"
    print(json.dumps({"status": jpegloop.status(), "library": jpegloop.library(), "decoder": decoder,
                      "module": jpegloop._load().__file__ if jpegloop._load() else None,
                      "pixels": hashlib.sha256(rgb.tobytes()).hexdigest()}))
""")


def _status(*args: str, env: dict | None = None, run=subprocess.run, cwd: Path = REPO) -> dict:
    proc = run([sys.executable, "-c", _STATUS, str(SAMPLE), *args], cwd=cwd, env=env or dict(os.environ),
               capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def default_read() -> dict:
    got = _status()
    if not got["status"].startswith("in use"):
        pytest.skip(f"the compiled loop is not in use here: {got['status']}")
    return got


def test_the_loop_loads_pillows_libjpeg_turbo_and_says_which(default_read):
    assert "pillow.libs" in default_read["library"] or ".dylibs" in default_read["library"]
    assert default_read["library"] in default_read["status"] and default_read["decoder"] == "libjpeg-turbo"


def test_the_systems_libjpeg_62_gives_the_same_pixels(default_read):
    system = glob.glob("/usr/lib/*-linux-gnu/libjpeg.so.62") + glob.glob("/usr/lib/libjpeg.so.62")
    if not system:
        pytest.skip("no system libjpeg.so.62 here")
    got = _status(env={**os.environ, "WSITOOL_LIBJPEG": system[0]})
    assert got["library"] == system[0] and got["pixels"] == default_read["pixels"]


def test_a_library_that_is_not_libjpeg_turbo_is_refused_saying_why(default_read):
    libz = (glob.glob("/usr/lib/*-linux-gnu/libz.so.1") + glob.glob("/lib/*-linux-gnu/libz.so.1"))
    if not libz:
        pytest.skip("no libz.so.1 to offer as a library that is not libjpeg")
    # named by the environment: refused, and the next candidate (Pillow's) taken
    got = _status(env={**os.environ, "WSITOOL_LIBJPEG": libz[0]})
    assert got["library"] == default_read["library"] and got["pixels"] == default_read["pixels"]
    # the only candidate: no loop, and the status says why, naming the library
    alone = _status(libz[0])
    assert alone["library"] is None and "no libjpeg-turbo of API 62 could be loaded" in alone["status"]
    assert libz[0] in alone["status"] and "jpeg_std_error" in alone["status"]
    assert alone["pixels"] == default_read["pixels"]  # (the Python path: the same pixels)


def test_a_wheel_carries_the_loop_and_uses_it_without_any_system_jpeg(tmp_path, default_read):
    """``pip wheel .`` (built where no JPEG header is installed), ``auditwheel show``: consistent
    with a manylinux tag, no library needed beyond the policy's; installed (``--target``) and run
    where no system libjpeg exists: the loop in use, through Pillow's libjpeg-turbo."""
    src = _source_copy(tmp_path)
    wheels = tmp_path / "wheels"
    built = hidden([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(wheels), str(src)], timeout=900)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.glob("wsitool-*.whl")
    if shutil.which("auditwheel") or (Path(sys.executable).parent / "auditwheel").exists():
        tool = shutil.which("auditwheel") or str(Path(sys.executable).parent / "auditwheel")
        show = subprocess.run([tool, "show", str(wheel)], capture_output=True, text=True, timeout=300)
        text = " ".join(show.stdout.split())
        assert show.returncode == 0 and "is consistent with the following platform tag" in text, show.stdout
        assert "manylinux" in text and "libjpeg" not in text, show.stdout
    target = tmp_path / "site"
    inst = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                           str(wheel)], capture_output=True, text=True, timeout=600)
    assert inst.returncode == 0, inst.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(target)}
    got = _status(env=env, run=hidden, cwd=tmp_path)
    assert got["module"].startswith(str(target)), got  # the wheel's own loop, not the repository's
    assert got["status"].startswith("in use") and got["decoder"] == "libjpeg-turbo", got
    assert got["pixels"] == default_read["pixels"]
