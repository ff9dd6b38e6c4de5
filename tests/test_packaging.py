"""Packaging: the build of the optional C extensions, the project metadata, the stubs, ``python -m wsitool``.

The builds run ``setup.py build_ext`` in this environment (setuptools 77 or
later, the ``test-core`` extra) into a temporary folder, with no network:
``WSITOOL_NVIMGCODEC_INCLUDE`` points the JPEG loop at a folder without
nvImageCodec's header (a platform without its wheel) or with one that does not
compile, and the build must still succeed with one line saying what was
skipped and why.
"""

from __future__ import annotations

import ast
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SKIP_LINE = "wsitool build: skipped optional extension"

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
markers = pytest.importorskip("packaging.markers", reason="packaging evaluates the environment markers")
requirements = pytest.importorskip("packaging.requirements")


def _build_ext(tmp_path: Path, include: Path | None) -> tuple[subprocess.CompletedProcess, set[str]]:
    """``setup.py build_ext`` into ``tmp_path``; returns the process and the names of the built modules."""
    pytest.importorskip("setuptools", minversion="77", reason="PEP 639 metadata needs setuptools 77 (test-core)")
    env = dict(os.environ)
    if include is None:
        env.pop("WSITOOL_NVIMGCODEC_INCLUDE", None)
    else:
        env["WSITOOL_NVIMGCODEC_INCLUDE"] = str(include)
    proc = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "tmp")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    built = {p.name.split(".")[0] for p in (tmp_path / "lib" / "wsitool").glob("_*.*") if p.suffix in (".so", ".pyd")}
    return proc, built


def _skip_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith(SKIP_LINE)]


@pytest.fixture(scope="module")
def pyproject() -> dict:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_build_without_the_header_skips_the_loop_in_one_line(tmp_path):
    empty = tmp_path / "no-header"
    empty.mkdir()
    proc, built = _build_ext(tmp_path, empty)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert built == {"_boxfilter"}  # the box filter needs no header: still built
    lines = _skip_lines(proc)
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "wsitool._jpegloop" in lines[0] and "no nvimgcodec.h" in lines[0] and "Python path" in lines[0]


def test_build_with_a_header_that_fails_skips_the_loop_in_one_line(tmp_path):
    bad = tmp_path / "bad-header"
    bad.mkdir()
    (bad / "nvimgcodec.h").write_text('#error "a header that does not compile"\n')
    proc, built = _build_ext(tmp_path, bad)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert built == {"_boxfilter"}
    lines = _skip_lines(proc)
    assert len(lines) == 1 and "wsitool._jpegloop" in lines[0], proc.stderr[-3000:]
    assert "the C compiler failed (CompileError, exit status" in lines[0]


def test_build_with_the_header_builds_both(tmp_path):
    pytest.importorskip("nvidia.nvimgcodec", reason="nvImageCodec (its header) is not installed here")
    if not any(shutil.which(cc) for cc in (os.environ.get("CC", "cc"), "gcc", "clang")):
        pytest.skip("no C compiler here")
    proc, built = _build_ext(tmp_path, None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert built == {"_boxfilter", "_jpegloop"} and _skip_lines(proc) == []


@pytest.mark.parametrize("name", ["_jpegloop", "_boxfilter"])
def test_stub_matches_the_compiled_module(name):
    stub = REPO / "wsitool" / f"{name}.pyi"
    tree = ast.parse(stub.read_text())
    declared = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            declared.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            declared.add(node.target.id)
    try:
        mod = importlib.import_module(f"wsitool.{name}")
    except ImportError:
        pytest.skip(f"wsitool.{name} is not built here")
    public = {n for n in dir(mod) if not n.startswith("__")}
    assert declared == public, (declared ^ public)


def test_license_metadata_is_pep_639(pyproject):
    project = pyproject["project"]
    assert project["license"] == "Apache-2.0"
    # wsitool's own license, and those of the libjpeg-turbo headers it is compiled against
    assert project["license-files"] == ["LICENSE", "third_party/libjpeg-turbo/LICENSE.md",
                                        "third_party/libjpeg-turbo/README.ijg"]
    assert all((REPO / f).is_file() for f in project["license-files"])
    assert (REPO / "LICENSE").read_text().split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]  # PEP 639: none
    assert project["authors"] == [{"name": "wsitool developers"}]
    assert {"Homepage", "Source", "Issues", "Changelog"} <= set(project["urls"])
    build = [requirements.Requirement(r) for r in pyproject["build-system"]["requires"]]
    setuptools = next(r for r in build if r.name == "setuptools")
    assert setuptools.specifier.contains("77") and not setuptools.specifier.contains("76.9")


# (sys_platform, platform_machine) -> whether nvidia-nvimgcodec-cu12 has a wheel there (PyPI, 0.9.0.20)
WHEELS = {("linux", "x86_64"): True, ("linux", "aarch64"): True, ("win32", "AMD64"): True,
          ("darwin", "arm64"): False, ("darwin", "x86_64"): False, ("win32", "ARM64"): False}


@pytest.mark.parametrize("where", ["dependencies", "build-system"])
def test_nvimgcodec_only_where_it_has_wheels(pyproject, where):
    reqs = pyproject["project"]["dependencies"] if where == "dependencies" else pyproject["build-system"]["requires"]
    nv = [requirements.Requirement(r) for r in reqs if r.startswith("nvidia-nvimgcodec-cu12")]
    assert len(nv) == 1 and nv[0].marker is not None
    for (plat, machine), wheel in WHEELS.items():
        env = {"sys_platform": plat, "platform_machine": machine}
        assert nv[0].marker.evaluate(env) is wheel, (plat, machine)


def test_test_extras_split(pyproject):
    extras = pyproject["project"]["optional-dependencies"]
    core = {requirements.Requirement(r).name for r in extras["test-core"]}
    full = {requirements.Requirement(r).name for r in extras["test"]}
    oracles = {"openslide-python", "openslide-bin", "tiffslide", "pyvips", "pyvips-binary", "selenium",
               "iiif-validator", "ome-types", "starlette", "uvicorn", "httpx"}
    assert "pytest" in core and not core & oracles
    assert "wsitool" in full and oracles <= full  # test = test-core (the self-reference) + the oracles
    assert "wsitool[test-core]" in extras["test"]
    assert "*.pyi" in pyproject["tool"]["setuptools"]["package-data"]["wsitool"]


def test_py_typed_marker_is_shipped(pyproject):
    """PEP 561: the marker is in the package and in its package data (wheels and sdists carry it)."""
    assert (REPO / "wsitool" / "py.typed").is_file()
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["wsitool"]


def test_python_m_wsitool_runs_the_cli():
    proc = subprocess.run([sys.executable, "-m", "wsitool", "--version"], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0 and proc.stdout.startswith("wsitool "), proc.stderr
    bad = subprocess.run([sys.executable, "-m", "wsitool", "info", str(REPO / "no-such-slide.svs")],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert bad.returncode == 9 and "no-such-slide.svs" in bad.stderr  # the CLI's exit codes, as the script
