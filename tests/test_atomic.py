"""wsitool.ground.outputs: exclusive partials, no-replace commits, the source rule, stale partials.

Issue 14 items 1, 2, 5 and 9 at the level of the one helper every writer uses.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from wsitool.errors import OutputExistsError, OutputIsSourceError, WsiError, printable
from wsitool.ground import outputs as atomic
from wsitool.ground import partials


def _dead_pid() -> int:
    """The id of a process that has just exited (not reused this soon)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _host() -> str:
    return partials._host()


def test_partial_name_carries_host_pid_and_random_token(tmp_path):
    a, b = atomic.partial_name(tmp_path / "x.png"), atomic.partial_name(tmp_path / "x.png")
    assert a != b and a.parent == tmp_path
    m = partials._PARTIAL_RE.match(a.name)
    assert m and m.group("name") == "x.png" and m.group("host") == _host()
    assert int(m.group("pid")) == os.getpid() and len(m.group("token")) == 16
    assert atomic.is_partial_name(a.name) and not atomic.is_partial_name("x.png")


def test_create_file_never_opens_a_planted_link(tmp_path, monkeypatch):
    """A symlink planted at the next temporary name is skipped (O_EXCL|O_NOFOLLOW), not written through."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"VICTIM")
    tokens = iter(["0" * 16, "1" * 16, "2" * 16])
    monkeypatch.setattr(partials.secrets, "token_hex", lambda n: next(tokens))
    final = tmp_path / "out.bin"
    planted = final.with_name(f".out.bin.partial-{_host()}-{os.getpid()}-{'0' * 16}")
    planted.symlink_to(victim)
    partial, fh = atomic.open_file(final)
    with partial:
        with fh:
            fh.write(b"DATA")
        partial.commit()
    assert victim.read_bytes() == b"VICTIM"
    assert final.read_bytes() == b"DATA" and not final.is_symlink()
    assert planted.is_symlink()  # not ours: left alone


def test_create_dir_is_exclusive(tmp_path, monkeypatch):
    monkeypatch.setattr(partials.secrets, "token_hex", lambda n: "a" * 16)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / f".x.zarr.partial-{_host()}-{os.getpid()}-{'a' * 16}").symlink_to(target)
    with pytest.raises(FileExistsError):
        atomic.create_dir(tmp_path / "x.zarr")  # every try hits the planted name: refused
    assert list(target.iterdir()) == []


def test_check_output_source_rule(tmp_path):
    src = tmp_path / "slide.tiff"
    src.write_bytes(b"S")
    link = tmp_path / "link.tiff"
    link.symlink_to(src)
    hard = tmp_path / "hard.tiff"
    os.link(src, hard)
    for out in (src, link, hard):
        for overwrite in (False, True):
            with pytest.raises(OutputIsSourceError) as info:
                atomic.check_output(out, [src], overwrite)
            assert isinstance(info.value, ValueError) and isinstance(info.value, WsiError)
            assert str(out) in str(info.value)
    other = tmp_path / "other.png"
    other.write_bytes(b"O")
    with pytest.raises(OutputExistsError) as info:
        atomic.check_output(other, [src], False)
    assert isinstance(info.value, FileExistsError) and info.value.filename == str(other)
    assert str(info.value) == f"{other}: already exists (pass overwrite=True to replace it)"
    atomic.check_output(other, [src], True)
    atomic.check_output(tmp_path / "new.png", [src], False)
    with pytest.raises(IsADirectoryError):
        atomic.check_output(tmp_path, [src], True)
    with pytest.raises(FileNotFoundError) as info:
        atomic.check_output(tmp_path / "nope" / "x.png", [src], False)
    assert info.value.filename == str(tmp_path / "nope" / "x.png")


def test_errors_pickle_for_dask(tmp_path):
    import pickle

    for exc in (OutputExistsError(tmp_path / "a"), OutputIsSourceError(tmp_path / "a", tmp_path / "b")):
        again = pickle.loads(pickle.dumps(exc))
        assert type(again) is type(exc) and str(again) == str(exc)


def test_commit_without_overwrite_never_replaces(tmp_path):
    final = tmp_path / "f"
    partial, fh = atomic.open_file(final)
    with fh:
        fh.write(b"new")
    final.write_bytes(b"appeared meanwhile")
    with pytest.raises(OutputExistsError):
        partial.commit(overwrite=False)
    assert final.read_bytes() == b"appeared meanwhile"
    assert not partial.path.exists() and partial.path not in atomic.live_partials()


def test_commit_dir_over_dir_with_overwrite(tmp_path):
    final = tmp_path / "store.zarr"
    final.mkdir()
    (final / "old").write_text("old")
    p = atomic.create_dir(final)
    (p.path / "new").write_text("new")
    p.commit(overwrite=True)
    assert sorted(x.name for x in final.iterdir()) == ["new"]
    assert [x.name for x in tmp_path.iterdir()] == ["store.zarr"]


def test_commit_never_replaces_a_source(tmp_path):
    src = tmp_path / "s.tiff"
    src.write_bytes(b"SOURCE")
    link = tmp_path / "out.tiff"
    link.symlink_to(src)
    p, fh = atomic.open_file(link, sources=[src])
    with fh:
        fh.write(b"x")
    with pytest.raises(OutputIsSourceError):
        p.commit(overwrite=True)
    assert src.read_bytes() == b"SOURCE" and link.is_symlink()


def test_errors_name_the_users_path_not_the_partial(tmp_path, monkeypatch):
    """Item 9: a disk-full write (an OSError without a file name) names the output."""
    from wsitool.export import write_image

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "save", full)
    out = tmp_path / "x.npy"
    with pytest.raises(OSError) as info:
        write_image(out, np.zeros((2, 2, 3), np.uint8))
    assert info.value.filename == str(out) and info.value.errno == errno.ENOSPC
    assert ".partial" not in str(info.value)
    assert os.listdir(tmp_path) == []


def test_short_write_without_errno_names_the_output(tmp_path, monkeypatch):
    """numpy's full-disk ``OSError("N requested and M written")`` has no errno: the error still
    names the output (the CLI printed 'wsitool: error: 16000000 requested and 1048448 written')."""
    from wsitool.export import write_image

    def short(*a, **k):
        raise OSError("16000000 requested and 1048448 written")

    monkeypatch.setattr(np, "save", short)
    out = tmp_path / "x.npy"
    with pytest.raises(OSError) as info:
        write_image(out, np.zeros((2, 2, 3), np.uint8))
    assert info.value.filename == str(out)
    assert info.value.strerror == "16000000 requested and 1048448 written"
    assert os.listdir(tmp_path) == []


def test_output_that_is_a_folder_names_it(tmp_path):
    from wsitool.export import write_image

    out = tmp_path / "dir.png"
    out.mkdir()
    with pytest.raises(IsADirectoryError) as info:
        write_image(out, np.zeros((2, 2, 3), np.uint8), overwrite=True)
    assert info.value.filename == str(out) and ".partial" not in str(info.value)


def test_remove_live_partials(tmp_path):
    p1, fd = atomic.create_file(tmp_path / "a")
    os.close(fd)
    p2 = atomic.create_dir(tmp_path / "b")
    (p2.path / "inner").write_text("x")
    assert {p1.path, p2.path} <= set(atomic.live_partials())
    assert atomic.remove_live_partials() == 2  # nothing else of this test is live
    assert os.listdir(tmp_path) == []
    assert not {p1.path, p2.path} & set(atomic.live_partials())


def test_registry_is_thread_safe(tmp_path):
    def work(k):
        for i in range(30):
            p, fd = atomic.create_file(tmp_path / f"t{k}-{i}")
            os.close(fd)
            p.abort()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    atomic.remove_live_partials()
    for t in threads:
        t.join()
    assert not [p for p in atomic.live_partials() if p.parent == tmp_path]


def test_clean_stale_partials_only_this_hosts_dead_processes(tmp_path):
    dead = _dead_pid()
    host = _host()
    stale_file = tmp_path / f".a.tiff.partial-{host}-{dead}-{'1' * 16}"
    stale_file.write_bytes(b"x" * 100)
    stale_dir = tmp_path / f".b.dzi.partial-{host}-{dead}-{'2' * 16}"
    (stale_dir / "b_files" / "0").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("keep")
    stale_link = tmp_path / f".c.npz.partial-{host}-{dead}-{'3' * 16}"
    stale_link.symlink_to(victim)
    other_host = tmp_path / f".a.tiff.partial-{host}x-{dead}-{'4' * 16}"
    other_host.write_bytes(b"x")
    live = tmp_path / f".a.tiff.partial-{host}-{os.getpid()}-{'5' * 16}"
    live.write_bytes(b"x")
    legacy = tmp_path / f".a.tiff.partial-{dead}"
    legacy.write_bytes(b"x")
    removed = atomic.clean_stale_partials(tmp_path)
    assert sorted(removed) == sorted([stale_file, stale_dir, stale_link])
    assert (victim / "keep").read_text() == "keep"  # the link was removed, not followed
    for kept in (other_host, live, legacy, victim):
        assert kept.exists()


def test_anonymous_file_has_no_name(tmp_path):
    with atomic.anonymous_file(tmp_path, tmp_path / "x.tiff") as fh:
        fh.write(b"spill")
        fh.seek(0)
        assert fh.read() == b"spill"
        assert os.listdir(tmp_path) == []


def test_printable_escapes_terminal_controls():
    assert printable("a\x1b]0;pwn\x07b") == "a\\x1b]0;pwn\\x07b"
    assert printable("l1\nl2\r\x1b[2K") == "l1\\nl2\\r\\x1b[2K"
    assert printable("\u202egnp.exe") == "\\u202egnp.exe"
    assert printable("plain [x] é\\") == "plain [x] é\\"


def test_no_module_builds_its_own_temporary_names():
    """Item 2: wsitool.ground.outputs (with its partial names, wsitool.ground.partials) is the one
    place that makes temporary names and opens outputs."""
    import re
    from pathlib import Path

    import wsitool

    pkg = Path(wsitool.__file__).parent
    bad = re.compile(r"\.partial-|tempfile\.(TemporaryFile|mkstemp|NamedTemporaryFile)|"
                     r"open\([^)]*['\"]w|O_CREAT|\.write_text\(|\.write_bytes\(")
    allowed = (
        "tmp_files", "tmp_dzi",  # inside the DZI writer's own exclusive partial folder
        "self._zip.open(",  # a member of the npz partial, not a file
        "open(trace_path",  # stress: the child's stderr in its private mkdtemp folder
        'os.fdopen(cfg["fd"]',  # stress worker: a pipe
        "os.fdopen(write_end",  # serve: the start-up check's child writes its result into a pipe
        "atomic.write_bytes(",  # through the helper
        "tarfile.open(fileobj=fh",  # patches: a tar stream into the file object atomic.open_file made
    )
    offenders = []
    for py in sorted(pkg.rglob("*.py")):  # every module, sub-packages included
        if py.relative_to(pkg).as_posix() in ("ground/outputs.py", "ground/partials.py"):
            continue
        for n, line in enumerate(py.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if bad.search(code) and not any(ok in code for ok in allowed):
                offenders.append(f"{py.relative_to(pkg)}:{n}: {line.strip()}")
    assert not offenders, offenders


def test_atomic_imports_only_stdlib_and_errors():
    import ast
    from pathlib import Path

    for module, own in ((atomic, {"errors", None, "partials"}), (partials, set())):
        tree = ast.parse(Path(module.__file__).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.module in own, (module.__name__, node.module)
                assert node.module is not None or [a.name for a in node.names] == ["partials"]
            elif isinstance(node, ast.ImportFrom):
                assert node.module.split(".")[0] in sys.stdlib_module_names | {"__future__"}
            elif isinstance(node, ast.Import):
                for a in node.names:
                    assert a.name.split(".")[0] in sys.stdlib_module_names


def test_check_output_refuses_a_folder_for_a_file_and_an_unwritable_folder(tmp_path, monkeypatch):
    """A folder where a file goes is refused with or without overwrite (never "already exists:
    add --overwrite", which could not help), and a folder this user cannot write in before any work."""
    (tmp_path / "d").mkdir()
    for overwrite in (False, True):
        with pytest.raises(IsADirectoryError) as info:
            atomic.check_output(tmp_path / "d", overwrite=overwrite)
        assert info.value.filename == str(tmp_path / "d")
    atomic.check_output(tmp_path / "d", kind="dir", overwrite=True)  # a folder for a folder: fine
    real_access = os.access
    monkeypatch.setattr(atomic.os, "access", lambda p, mode: False if os.fspath(p) == os.fspath(tmp_path)
                        else real_access(p, mode))
    with pytest.raises(PermissionError) as info:
        atomic.check_output(tmp_path / "x.png")
    assert info.value.filename == str(tmp_path / "x.png") and "not writable" in info.value.strerror
